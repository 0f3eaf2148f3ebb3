//! What one client may take of what all clients share, and what requests waiting for a slot may
//! hold in all (issue 46): `queue_max_total`, `queue_max_per_client`, `queue_body_mib`,
//! `queue_body_mib_per_client` (the limiter's [`Waiting`]) and `max_leases_per_client`. A client
//! is its key when keys are on, else its address. Each default follows from the key it shares
//! (half of `workers` may wait, half of those be one client's; a tenth of `max_leases` one
//! client's), and every problem is named by its key.

use std::collections::BTreeMap;

use super::raw::RawConfig;
use super::validate::at_least_one;
use super::{Host, Problem};
use crate::limiter::Waiting;

/// Most MiB a byte bound may name (1 TiB), as `client_body_buffer_mib`.
const MAX_MIB: u64 = 1 << 20;

/// The keys of the file these come from, taken before the rest of it is moved.
#[derive(Clone, Copy)]
pub(super) struct RawShares {
    queue_max_total: Option<usize>,
    queue_max_per_client: Option<usize>,
    queue_body_mib: Option<u64>,
    queue_body_mib_per_client: Option<u64>,
    max_leases_per_client: Option<usize>,
}

impl RawShares {
    pub(super) fn of(raw: &RawConfig) -> RawShares {
        RawShares {
            queue_max_total: raw.queue_max_total,
            queue_max_per_client: raw.queue_max_per_client,
            queue_body_mib: raw.queue_body_mib,
            queue_body_mib_per_client: raw.queue_body_mib_per_client,
            max_leases_per_client: raw.max_leases_per_client,
        }
    }
}

/// The validated shares.
pub(super) struct Shares {
    pub(super) waiting: Waiting,
    pub(super) max_leases_per_client: usize,
}

pub(super) fn validate_shares(
    raw: RawShares,
    (workers, max_leases): (usize, usize),
    hosts: &BTreeMap<String, Host>,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
) -> Shares {
    let total = at_least_one(
        "queue_max_total",
        raw.queue_max_total,
        (workers / 2).max(1),
        "",
        problems,
    );
    if raw.queue_max_total.is_some() && workers > 1 && total >= workers {
        problems.push(Problem::new(
            "queue_max_total",
            format!(
                "must be less than workers ({workers}): each request waiting for a slot holds a \
                 worker, and the rest serve requests that need no wait"
            ),
        ));
    }
    let per_client = at_least_one(
        "queue_max_per_client",
        raw.queue_max_per_client,
        (total / 2).max(1),
        "",
        problems,
    );
    if per_client > total {
        problems.push(Problem::new(
            "queue_max_per_client",
            format!("must be at most queue_max_total ({total})"),
        ));
    }
    let body_mib = mib("queue_body_mib", raw.queue_body_mib, 256, problems);
    let body_mib_per_client = mib(
        "queue_body_mib_per_client",
        raw.queue_body_mib_per_client,
        (body_mib / 2).max(1),
        problems,
    );
    if body_mib_per_client > body_mib {
        problems.push(Problem::new(
            "queue_body_mib_per_client",
            format!("must be at most queue_body_mib ({body_mib})"),
        ));
    }
    let max_leases_per_client = at_least_one(
        "max_leases_per_client",
        raw.max_leases_per_client,
        (max_leases / 10).max(1),
        "",
        problems,
    );
    if max_leases_per_client > max_leases {
        problems.push(Problem::new(
            "max_leases_per_client",
            format!("must be at most max_leases ({max_leases})"),
        ));
    }
    // A host that has not said its slots counts one each, as crossbar starts it (issue 47).
    let slots: usize = (hosts.values())
        .flat_map(|h| h.models.values())
        .map(|p| p.unwrap_or(1))
        .sum();
    if slots.saturating_add(total) >= workers {
        warnings.push(format!(
            "workers ({workers}) is not more than the hosts' slots ({slots}) plus \
             queue_max_total ({total}): with every slot busy and that many requests waiting, a \
             request to an idle route waits for a worker; raise workers"
        ));
    }
    let bytes = |mib: u64| usize::try_from(mib.min(MAX_MIB) << 20).unwrap_or(usize::MAX);
    Shares {
        waiting: Waiting {
            total,
            per_client,
            bytes: bytes(body_mib),
            bytes_per_client: bytes(body_mib_per_client),
        },
        max_leases_per_client,
    }
}

/// A size in MiB: at least 1, at most [`MAX_MIB`].
fn mib(key: &str, value: Option<u64>, default: u64, problems: &mut Vec<Problem>) -> u64 {
    let mib = at_least_one(key, value, default, " (MiB)", problems);
    if mib > MAX_MIB {
        problems.push(Problem::new(key, "must be at most 1048576 (1 TiB)"));
    }
    mib.min(MAX_MIB)
}
