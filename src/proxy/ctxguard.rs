//! The context guard: a prompt that cannot fit the leased host's per-slot context moves to a host
//! where it fits, or is refused with 400 before anything is forwarded — instead of llama-server's
//! "exceeds the available context size" after a long wait.
//!
//! The estimate (seed 002: bytes / 4 × 1.2) is the cheap first look. Only when it says "does not
//! fit" is the host asked for the exact count (`count`), and the move-or-refuse decision is taken
//! on that; a host that cannot count, or is already counting for [`count::PER_HOST`] requests,
//! leaves the estimate in charge. A host whose context is unknown gets no guard.

use crate::config::Config;
use crate::lease::Key;
use crate::state::Gateway;

use super::incoming::Incoming;
use super::plan::Ctx;
use super::{count, ProxyError};

/// A move the guard made: the conversation's lease now points at `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Moved {
    pub from: String,
    pub to: String,
}

/// The prompt the guard judges: the request's endpoint and body, and its estimate.
pub(super) struct Prompt<'a> {
    pub rest: &'a str,
    pub body: &'a [u8],
    pub estimate: u64,
}

/// Tokens a body may need: bytes / 4 × 1.2. It errs high (about 1.6× the real count on English chat)
/// so a conversation moves before llama-server would refuse it, not after.
pub(super) fn estimate(incoming: &Incoming, body_len: usize) -> u64 {
    if incoming.bodyless() {
        0
    } else {
        (body_len as f64 / 4.0 * 1.2) as u64
    }
}

/// What llama-server accepts: a prompt of `tokens` fits a slot of `ctx` when it leaves at least one
/// position to generate into (it refuses `tokens >= ctx`; measured on b11434, see OPERATIONS.md).
pub(super) fn exact_fits(tokens: u64, ctx: u64) -> bool {
    tokens < ctx
}

/// Leaves the request alone when the leased host's limit for the model (a router's is per model)
/// is unknown or the prompt fits there (the
/// estimate, else the host's exact count); else moves the lease to the first candidate (in route
/// order) where it fits, preferring one with the model loaded, or refuses. A pinned route only
/// ever fits on its pin. Records the exact count in `row` when the leased host gave one.
pub(super) fn check(
    ctx: &mut Ctx<'_>,
    config: &Config,
    key: &Key,
    leased: &str,
    prompt: &Prompt<'_>,
) -> Result<Option<Moved>, ProxyError> {
    let (gw, now) = (ctx.gw, ctx.row.started);
    let estimate = prompt.estimate;
    let limit = match gw.health.ctx_for(leased, &key.model) {
        None => return Ok(None),
        Some(limit) if estimate <= limit => return Ok(None),
        Some(limit) => limit,
    };
    let exact = ask(gw, config, key, leased, prompt);
    ctx.row.ctx_exact = exact.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    if exact.is_some_and(|n| exact_fits(n, limit)) {
        return Ok(None);
    }
    let route = &config.routes[&key.route];
    let candidates: Vec<&str> = match gw.leases.pinned(&key.route) {
        Some(_) => Vec::new(),
        None => route
            .hosts
            .iter()
            .map(String::as_str)
            .filter(|h| *h != leased)
            .filter(|h| gw.health.healthy(h) && !gw.drains.contains(h))
            .collect(),
    };
    let fits = |host: &str| {
        let Some(ctx) = gw.health.ctx_for(host, &key.model) else {
            return false;
        };
        // The same model counts the same; another model (another tokenizer) is asked too.
        let count = match exact {
            Some(n) if same_model(gw, leased, host, &key.model) => Some(n),
            _ => ask(gw, config, key, host, prompt),
        };
        match count {
            Some(n) => exact_fits(n, ctx),
            None => estimate <= ctx,
        }
    };
    let fitting: Vec<&str> = candidates.into_iter().filter(|h| fits(h)).collect();
    let loaded = fitting.iter().find(|h| gw.health.is_loaded(h, &key.model));
    let serving = || fitting.iter().find(|h| config.serves(h, &key.model));
    if let Some(to) = loaded.or_else(serving) {
        let to = *to;
        gw.leases.move_to(key, to, now)?;
        return Ok(Some(Moved {
            from: leased.to_string(),
            to: to.to_string(),
        }));
    }
    let max = route
        .hosts
        .iter()
        .filter(|h| gw.health.healthy(h))
        .filter_map(|h| gw.health.ctx_for(h, &key.model))
        .max()
        .unwrap_or(0);
    Err(ProxyError::PromptTooLarge {
        estimate,
        exact,
        max,
    })
}

/// The exact count from `host`, unless it is a router without the model loaded (asking would
/// load it), [`count::PER_HOST`] requests are counting there already (no queueing: the estimate
/// judges at once), or it cannot answer. A router is told the model when the body names none.
fn ask(gw: &Gateway, config: &Config, key: &Key, host: &str, prompt: &Prompt<'_>) -> Option<u64> {
    if !gw.health.may_ask_about(host, &key.model) {
        return None;
    }
    let conf = config.hosts.get(host)?;
    // The body as this host would get it: a router is told the model, by the host's name for it.
    let upstream = conf.upstream_name(&key.model);
    let router = gw.health.get(host).is_some_and(|s| s.router);
    let model = (router || upstream != key.model).then_some(upstream);
    let side = gw.upstream.side();
    let deadline = std::time::Instant::now() + count::COUNT_TIMEOUT;
    let Some(_counting) = side.turn(host, deadline) else {
        log::debug!(
            "ctx count host={} estimate={} exact=- busy={}",
            crate::logfmt::val(host),
            prompt.estimate,
            crate::upstream::side::PER_HOST
        );
        return None;
    };
    let counted = count::exact(side, conf, prompt.rest, prompt.body, model, deadline);
    log::debug!(
        "ctx count host={} estimate={} exact={}",
        crate::logfmt::val(host),
        prompt.estimate,
        counted.map_or_else(|| "-".to_string(), |n| n.to_string())
    );
    counted
}

/// Whether two hosts run the same model file for `model` (so one's count holds for the other):
/// routers that both have it loaded, or single-model hosts reporting the same loaded names.
fn same_model(gw: &Gateway, a: &str, b: &str, model: &str) -> bool {
    let (Some(a), Some(b)) = (gw.health.get(a), gw.health.get(b)) else {
        return false;
    };
    if a.router || b.router {
        let has = |loaded: &[String]| loaded.iter().any(|m| m == model);
        return has(&a.loaded) && has(&b.loaded);
    }
    !a.loaded.is_empty() && a.loaded == b.loaded
}
