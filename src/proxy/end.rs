//! Where every request ends, whatever happened to it. [`end`] takes the request's [`Outcome`] and,
//! in one fixed order:
//!
//! 1. tells its pinned slot (finished with what the host counted, or abandoned: in doubt), before
//!    the row, so a client that sees the row never finds its slot still pinnable;
//! 2. teaches placement what the answer showed: the host's prefill speed, whether it is failing,
//!    the family now warm there, what the conversation holds;
//! 3. gives back the limiter slot and the key's turn, charging the key what the request spent in
//!    place of what it reserved (issue 46), before the client can send its next turn;
//! 4. fills in how it ended (status, error, total time) and records the row, sending what waited
//!    for it (an answer's end, a refusal) once it is committed — except for a request answered
//!    before its route and key are known (a refusal, a browser's preflight), which is counted and
//!    logged per burst, never stored (issue 46, `record::refuse`);
//! 5. writes the request's one log line.
//!
//! `forward.rs` and `listing.rs` move bytes and return an outcome; nothing else records a row,
//! frees a slot or learns from an answer.

use std::sync::Arc;

use crate::conn::{Request, Tail};
use crate::lease::Placed;
use crate::store::Coming;

use super::blame::host_failed;
use super::pin;
use super::plan::{Ctx, LeaseUse, Plan};
use super::record::{log_request, preflight, record, record_then_send, refuse, spent};
use super::ProxyError;

/// How a request ended.
pub(super) enum Outcome {
    /// The host's answer was relayed whole; its `end` goes out once the row is in. `coming` is
    /// the row's announcement when the whole answer arrived with its length.
    Answered {
        end: Arc<Tail>,
        coming: Option<Coming>,
    },
    /// The host's answer broke off mid-body: the host's failure. What the client has so far ends
    /// visibly broken (`end`) once the row is in.
    Broke {
        detail: String,
        end: Option<Arc<Tail>>,
    },
    /// The client left, or stopped reading: nobody to answer.
    Gone(String),
    /// crossbar answers with its own error; nothing of a host's answer went out.
    Refused(ProxyError),
    /// A browser's CORS preflight, answered by crossbar itself (issue 46): no key, route, body,
    /// host or plan.
    Preflight,
}

/// Ends the request: see the module's order. `plan` is `None` for a request refused before it
/// had one (or whose second placement failed).
pub(super) fn end(
    ctx: &mut Ctx<'_>,
    request: &mut Request<'_>,
    mut plan: Option<Plan<'_>>,
    outcome: Outcome,
) {
    let gw = ctx.gw;
    if let Some(plan) = &plan {
        match &outcome {
            Outcome::Answered { .. } => pin::finish(plan, &ctx.row),
            _ => pin::abandon(plan),
        }
    }
    if let Some((tokens, us)) = ctx.prefill {
        gw.metrics.observe_prefill(&ctx.row.host, tokens, us);
        gw.holdings.prefilled(&ctx.row.host, tokens, us);
    }
    if let Some(plan) = &mut plan {
        match &outcome {
            Outcome::Answered { .. } => learn(ctx, plan),
            Outcome::Broke { detail, .. } => {
                let pair = (plan.host.name.as_str(), plan.model());
                host_failed(gw, pair, &plan.rest, false, detail);
            }
            Outcome::Gone(_) | Outcome::Refused(_) | Outcome::Preflight => {}
        }
        drop(plan.permit.take());
        if let Some(key) = &plan.admitted {
            key.settle(spent(&ctx.row, key.reserved()), ctx.row.started);
        }
    }
    let row = &mut ctx.row;
    match outcome {
        Outcome::Answered { end, coming } => {
            row.total_ms = ctx.clock.elapsed().as_millis() as i64;
            record_then_send(gw, row, coming, end);
        }
        Outcome::Broke { detail, end } => {
            row.total_ms = ctx.clock.elapsed().as_millis() as i64;
            row.err = format!("upstream failed mid-body: {detail}");
            match end {
                Some(end) => record_then_send(gw, row, None, end),
                None => record(gw, row),
            }
        }
        Outcome::Gone(why) => {
            row.total_ms = ctx.clock.elapsed().as_millis() as i64;
            row.status = 499;
            row.err = why;
            record(gw, row);
            request.abandon();
        }
        // A refusal has its own log line, with no lease in play.
        Outcome::Refused(err) => return refuse(ctx, request, err),
        Outcome::Preflight => return preflight(ctx, request),
    }
    let Some(plan) = &plan else { return };
    log_request(&ctx.row, plan.lease.as_str());
    if plan.slot && plan.lease != LeaseUse::Stateless {
        compare_turns(ctx, plan);
    }
}

/// A cold turn: its prompt found less than half of its previous turn's prompt cached.
fn cold(cached: i64, previous: i64) -> bool {
    cached.saturating_mul(2) < previous
}

/// Previous prompts shorter than this say nothing of a cache (a few words of chat).
const MIN_COLD: i64 = 64;

/// What a turn's answer says against the conversation's previous turn (issue 47). A reused
/// lease that came back cold lost its cache on its host: it is placed again at its next turn
/// (`lease::Hold::went_cold`), the host counts one more cold answer (oversubscribed, if they
/// repeat), and whether its slot had gone to others since is evidence about the host's RAM cache
/// (`learn`). Kept for the next turn: this one's prompt, and where the host's counts stood.
fn compare_turns(ctx: &Ctx<'_>, plan: &Plan<'_>) {
    let (gw, row) = (ctx.gw, &ctx.row);
    let (Some(prompt), Some(cached)) = (row.prompt_tokens, row.cached_tokens) else {
        return;
    };
    let (host, model) = (row.host.as_str(), plan.model());
    let turn = crate::state::Turn {
        prompt,
        unloads: gw.health.unloads(host, model),
        turns: gw.holdings.turns(host, model),
    };
    let previous = gw.swap_last_turn(&plan.key, turn);
    let reused = plan.lease == LeaseUse::Reused;
    let (true, Some(previous)) = (reused && row.err.is_empty(), previous) else {
        return;
    };
    if previous.prompt < MIN_COLD {
        return;
    }
    let warm = !cold(cached, previous.prompt);
    // Other conversations' answers there since its last turn, as many as the host has seats:
    // its slot went to one of them.
    let others = turn.turns.saturating_sub(previous.turns + 1);
    let displaced = others >= gw.seats(host, model).max(1) as u64;
    // (A lease without a fingerprint counts as one conversation, whichever it is.)
    let conversation = plan.conversation().unwrap_or(0);
    gw.answered(
        host,
        crate::learn::Answered {
            displaced,
            warm,
            conversation,
        },
    );
    if warm {
        return;
    }
    if let Some(hold) = &plan.hold {
        hold.went_cold();
    }
    // A router that unloaded the model between the turns (`--models-max` swapped another in)
    // dropped its cache: say so, it is the operator's fix, not a placement's.
    let swap = if turn.unloads > previous.unloads {
        " cause=\"model unloaded by the host between turns (router swap)\""
    } else {
        ""
    };
    log::warn!(
        "cold cache on a reused lease route={} host={} fp={} cached={cached} previous_prompt={}{swap}: \
         placed again at its next turn",
        crate::logfmt::val(&row.route),
        crate::logfmt::val(host),
        crate::logfmt::val(crate::fingerprint::short(&row.fp)),
        previous.prompt
    );
}

/// What a request the host answered whole teaches placement, before the answer's end goes out (a
/// client's next turn finds it learned): the host is not failing; after a 2xx, its family is warm
/// there, a warm first turn sizes the family, and the conversation holds its prompt plus
/// completion there.
fn learn(ctx: &Ctx<'_>, plan: &Plan<'_>) {
    if !plan.slot {
        return;
    }
    let row = &ctx.row;
    let ok = (200..300).contains(&row.status) && row.err.is_empty();
    let served = crate::holdings::Served {
        ok,
        family: plan.family,
        warm_first_turn: plan.placed == Placed::Family,
        cached: row.cached_tokens.and_then(|c| u64::try_from(c).ok()),
        conversation: plan.conversation(),
    };
    ctx.gw
        .holdings
        .served(&plan.host.name, plan.model(), served);
    if let (true, Some(hold)) = (ok, &plan.hold) {
        let held = row.prompt_tokens.unwrap_or(0) + row.completion_tokens.unwrap_or(0);
        hold.set_held(u64::try_from(held).unwrap_or(0), plan.family.map(|f| f.id));
    }
}
