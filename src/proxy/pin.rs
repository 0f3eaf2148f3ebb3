//! A request's slot on an `exclusive` host (`crate::slots`): taken once the request has its
//! limiter slot, saved to the host's RAM cache first when the mirror says so, named in the body
//! as `id_slot`, its end told with what the host counted.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::logfmt::val;
use crate::slots::{self, Claim, Tokens, Want};
use crate::state::Gateway;
use crate::store::RequestRow;

use super::plan::{LeaseUse, Plan};

/// A request's place on a pinning host, and where its `id_slot` sits in the body when pinned.
#[derive(Debug)]
pub(super) struct Pinned {
    taken: Claim,
    at: Option<Range<usize>>,
}

/// Takes the request of `plan` a slot when its host pins (with similarity off, only a
/// conversation's own slot: `slots::choose_own`), or a place among the unpinned when it
/// cannot be pinned: a host whose slots `/props` has not told (or a router), an API whose
/// `id_slot` llama-server drops (Messages) or that takes no lease (embeddings), a body that is
/// not one JSON object (a body naming its own slot was refused before: [`client_slot`]).
pub(super) fn pin(gw: &Gateway, plan: &mut Plan<'_>) {
    let host = plan.host;
    if !gw.pinning(host) {
        return;
    }
    // Slot ids past the host's own wrap around onto busy slots: the seats are never more than
    // the slots `/props` reports (`pinning` asks for them; a router, whose model swaps empty its
    // slots unseen, is never pinned).
    let count = gw.seats(&host.name, plan.model());
    let pinnable = plan.api.keeps_id_slot() && count > 0 && slots::pinnable(&plan.body);
    let want = plan
        .conversation()
        .filter(|_| pinnable)
        .map(|conversation| Want {
            conversation,
            family: plan.family.map(|f| f.id),
            family_bytes: plan.family.map_or(0, |f| f.bytes),
            first_turn: plan.lease == LeaseUse::New,
            bytes: plan.body.len() as u64,
        });
    let now = slots::now_us();
    let pair = (host.name.as_str(), plan.key.model.as_str());
    let mut taken = (gw.slots).take(pair, count.max(1), want.as_ref(), now);
    if let (true, Some(index)) = (taken.saves_first(), taken.index()) {
        let saved = gw.upstream.side().save_slot(host, index);
        gw.metrics.observe_slot_save(&host.name, saved.is_ok());
        match saved {
            Ok(()) => log::debug!("saved slot={index} host={}", host.name),
            // It may still be at work there: in doubt until a poll shows it idle, and this
            // request goes unpinned.
            Err(why) => {
                log::warn!(
                    "slot save failed host={} slot={index} err={}",
                    val(&host.name),
                    val(&why)
                );
                taken.abandon();
                taken = (gw.slots).take(pair, count.max(1), None, now);
            }
        }
    }
    let at = taken
        .index()
        .and_then(|index| slots::insert_id(&mut plan.body, index));
    gw.metrics.observe_slot_pin(&host.name, at.is_some());
    match taken.index() {
        Some(index) => log::debug!("pinned slot={index} host={}", host.name),
        // A slot in doubt is cleared by a `/slots` poll: one as soon as the poller may (a second
        // after its last), not an interval later.
        None if want.is_some() && gw.slots.doubtful(&host.name) => gw.health.poke(&host.name),
        None => {}
    }
    // In the plan before the wait, so that its end is told however the request ends.
    let unpinned = taken.index().is_none();
    plan.pin = Some(Pinned { taken, at });
    if unpinned {
        settle(gw, (&host.name, &plan.key.model));
    }
}

/// The 400 for a body that names its slot (`id_slot`), on every host, pinning or not (issue 46):
/// llama-server, asked for a busy slot by id, loads a state into it under the generation running
/// there and corrupts that other conversation's answer; and on a pinning host the client's
/// `id_slot` would override crossbar's and leave its slot mirror wrong.
pub(super) fn client_slot() -> super::ProxyError {
    super::ProxyError::BadRequest(
        "the body names id_slot: crossbar chooses the slot inside a host, and a slot named by a \
         client may be generating another conversation's answer; remove id_slot"
            .to_string(),
    )
}

/// Longest a request crossbar could not pin waits for the pinned ones sent before it to start
/// (`slots/settle.rs`); past it, it is sent and the risk is logged. A stream starts within
/// milliseconds and a `/slots` poll comes within about a second: only a host that stopped
/// answering both reaches it.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Holds a request crossbar could not pin until no pinned request on its host+model is unsettled:
/// llama-server might otherwise launch it first, into a pinned request's slot. Asks the poller
/// for a `/slots` poll, which settles a pin whose answer's head has not come (a whole answer).
fn settle(gw: &Gateway, pair: (&str, &str)) {
    let waited = Instant::now();
    let poll = || gw.health.poke(pair.0);
    let Some(settled) = gw.slots.wait_settled(pair, waited + SETTLE_WAIT, poll) else {
        return;
    };
    let took = waited.elapsed();
    gw.metrics.observe_settle_wait(pair.0, settled, took);
    let ms = took.as_millis();
    if settled {
        log::debug!(
            "unpinned request waited for pins to start host={} ms={ms}",
            pair.0
        );
    } else {
        log::warn!(
            "unpinned request sent beside a pinned one not seen started host={} ms={ms}",
            val(pair.0)
        );
    }
}

/// The host answered: a pinned request has started there (`slots/settle.rs`).
pub(super) fn started(plan: &Plan<'_>) {
    if let Some(pinned) = &plan.pin {
        pinned.taken.started();
    }
}

/// The request ended with its answer's end (the host has freed the slot): what it counted, from
/// the row of an answer that said.
pub(super) fn finish(plan: &Plan<'_>, row: &RequestRow) {
    if let Some(pinned) = &plan.pin {
        let tokens = |t: Option<i64>| t.and_then(|t| u64::try_from(t).ok());
        let counted = match (tokens(row.prompt_tokens), tokens(row.completion_tokens)) {
            (Some(prompt), completion) if row.err.is_empty() => Some(Tokens {
                prompt,
                completion: completion.unwrap_or(0),
            }),
            _ => None,
        };
        pinned.taken.finish(counted);
    }
}

/// The request ended early: its slot is told now, before its row is written (see
/// `slots::Claim::abandon`).
pub(super) fn abandon(plan: &Plan<'_>) {
    if let Some(pinned) = &plan.pin {
        pinned.taken.abandon();
    }
}

/// The body as it was before [`pin`], for a request placed again elsewhere after its host
/// refused the connection (nothing started there: its end is told, not left in doubt).
pub(super) fn unpin(plan: &mut Plan<'_>) {
    if let Some(Pinned { taken, at }) = plan.pin.take() {
        taken.finish(None);
        if let Some(at) = at {
            slots::remove_id(&mut plan.body, at);
        }
    }
}
