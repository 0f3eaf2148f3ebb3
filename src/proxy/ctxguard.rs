//! The context guard: a prompt that cannot fit the leased host's per-slot context moves to a host
//! where it fits, or is refused with 400 before anything is forwarded — instead of llama-server's
//! "exceeds the available context size" after a long wait.

use crate::config::Config;
use crate::lease::Key;
use crate::state::Gateway;

use super::{Incoming, ProxyError};

/// A move the guard made: the conversation's lease now points at `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Moved {
    pub from: String,
    pub to: String,
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

/// Leaves the request alone when the leased host's limit is unknown or the estimate fits; else moves
/// the lease to the first candidate (in route order) that fits, preferring one with the model loaded,
/// or refuses. A pinned route only ever fits on its pin.
pub(super) fn check(
    gw: &Gateway,
    config: &Config,
    key: &Key,
    leased: &str,
    estimate: u64,
    now: i64,
) -> Result<Option<Moved>, ProxyError> {
    match gw.health.per_slot_ctx(leased) {
        None => return Ok(None),
        Some(limit) if estimate <= limit => return Ok(None),
        Some(_) => {}
    }
    let route = &config.routes[&key.route];
    let candidates: Vec<&String> = match gw.leases.pinned(&key.route) {
        Some(_) => Vec::new(),
        None => route
            .hosts
            .iter()
            .filter(|h| h.as_str() != leased)
            .collect(),
    };
    let fits = |host: &str| {
        gw.health.healthy(host)
            && !gw.drains.contains(host)
            && gw
                .health
                .per_slot_ctx(host)
                .is_some_and(|ctx| ctx >= estimate)
    };
    let fitting: Vec<&str> = candidates
        .iter()
        .map(|h| h.as_str())
        .filter(|h| fits(h))
        .collect();
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
        .filter_map(|h| gw.health.per_slot_ctx(h))
        .max()
        .unwrap_or(0);
    Err(ProxyError::PromptTooLarge { estimate, max })
}
