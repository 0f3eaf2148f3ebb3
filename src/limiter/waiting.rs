//! What requests waiting for a slot may hold, all host+model pairs together (issue 46). A
//! request in line holds a worker and its whole body: before, one client's whole bodies queued
//! for a busy host held every worker and the body budget for up to `queue_timeout`, and a small
//! request to an idle route was refused or waited for a worker. Now the line, across every
//! host+model, holds at most [`Waiting::total`] requests (a share of `workers`: the rest are kept
//! for requests that need no wait) and [`Waiting::bytes`] of bodies, and one client (its key, else
//! its address) at most [`Waiting::per_client`] and [`Waiting::bytes_per_client`] of those. A
//! request that would go over any of them is refused at once, naming the bound ([`Bound`]); one
//! that finds a free slot is never counted. Pure bookkeeping under the limiter's lock.

use std::fmt;

use crate::clientid::ClientId;
use crate::fasthash::HashMap;

/// The bounds on requests waiting for a slot (the config's `queue_max_total`,
/// `queue_max_per_client`, `queue_body_mib`, `queue_body_mib_per_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// Requests waiting, all clients together: each holds a worker.
    pub total: usize,
    /// Requests one client may have waiting.
    pub per_client: usize,
    /// Body bytes of the requests waiting, all clients together.
    pub bytes: usize,
    /// Body bytes one client's waiting requests may hold.
    pub bytes_per_client: usize,
}

impl Waiting {
    /// No bound beyond each host+model's `queue_max` (a limiter before its config is set).
    pub const UNBOUNDED: Waiting = Waiting {
        total: usize::MAX,
        per_client: usize::MAX,
        bytes: usize::MAX,
        bytes_per_client: usize::MAX,
    };
}

/// A request about to wait in line: whose it is, and the bytes its body holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiter {
    pub client: ClientId,
    pub bytes: usize,
}

/// Which bound refused a request that would have waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Total,
    PerClient,
    Bytes,
    BytesPerClient,
}

impl Bound {
    /// The config key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Bound::Total => "queue_max_total",
            Bound::PerClient => "queue_max_per_client",
            Bound::Bytes => "queue_body_mib",
            Bound::BytesPerClient => "queue_body_mib_per_client",
        }
    }

    /// What is full, as a client is told.
    pub fn what(self) -> &'static str {
        match self {
            Bound::Total => {
                "crossbar has as many requests waiting for a slot as it lets wait (the rest of \
                 its workers are kept for requests that need no wait)"
            }
            Bound::PerClient => {
                "this client (its key, else its address) has as many requests waiting for a \
                 slot as one client may"
            }
            Bound::Bytes => {
                "the requests waiting for a slot hold as many body bytes as crossbar lets them"
            }
            Bound::BytesPerClient => {
                "this client's requests waiting for a slot (its key, else its address) hold as \
                 many body bytes as one client's may"
            }
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// What the requests in line hold now.
///
/// Invariants: `count` and `bytes` are the sums over `by_client`; `by_client` has an entry only
/// for a client with a request in line (so it is bounded by the requests waiting); each waiter
/// is counted from [`Held::enter`] until its [`Held::leave`], exactly once.
#[derive(Debug, Default)]
pub(super) struct Held {
    count: usize,
    bytes: usize,
    by_client: HashMap<ClientId, (usize, usize)>,
}

impl Held {
    /// Counts `waiter` in line, unless that would take it over a bound of `limits`: that bound.
    /// A client's own bounds are checked first, so a client over its share learns it is its own.
    pub(super) fn enter(&mut self, limits: &Waiting, waiter: Waiter) -> Result<(), Bound> {
        let (n, bytes) = self
            .by_client
            .get(&waiter.client)
            .copied()
            .unwrap_or((0, 0));
        if n >= limits.per_client {
            return Err(Bound::PerClient);
        }
        if bytes.saturating_add(waiter.bytes) > limits.bytes_per_client {
            return Err(Bound::BytesPerClient);
        }
        if self.count >= limits.total {
            return Err(Bound::Total);
        }
        if self.bytes.saturating_add(waiter.bytes) > limits.bytes {
            return Err(Bound::Bytes);
        }
        self.count += 1;
        self.bytes += waiter.bytes;
        let entry = self.by_client.entry(waiter.client).or_insert((0, 0));
        *entry = (entry.0 + 1, entry.1 + waiter.bytes);
        Ok(())
    }

    /// `waiter`, counted by [`Held::enter`], leaves the line (with a slot or without).
    pub(super) fn leave(&mut self, waiter: Waiter) {
        self.count = self.count.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(waiter.bytes);
        if let Some((n, bytes)) = self.by_client.get_mut(&waiter.client) {
            *n = n.saturating_sub(1);
            *bytes = bytes.saturating_sub(waiter.bytes);
            if *n == 0 {
                self.by_client.remove(&waiter.client);
            }
        }
    }

    /// Requests in line and the bytes of their bodies, all clients together.
    pub(super) fn totals(&self) -> (usize, usize) {
        (self.count, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(client: &str, bytes: usize) -> Waiter {
        Waiter {
            client: ClientId::key(client),
            bytes,
        }
    }

    #[test]
    fn each_bound_refuses_the_one_past_it_and_names_itself_issue_46() {
        let limits = Waiting {
            total: 3,
            per_client: 2,
            bytes: 100,
            bytes_per_client: 60,
        };
        let mut held = Held::default();
        assert_eq!(held.enter(&limits, waiter("a", 30)), Ok(()));
        assert_eq!(
            held.enter(&limits, waiter("a", 31)),
            Err(Bound::BytesPerClient)
        );
        assert_eq!(held.enter(&limits, waiter("a", 30)), Ok(()));
        assert_eq!(held.enter(&limits, waiter("a", 0)), Err(Bound::PerClient));
        assert_eq!(held.enter(&limits, waiter("b", 41)), Err(Bound::Bytes));
        assert_eq!(held.enter(&limits, waiter("b", 40)), Ok(()));
        assert_eq!(held.enter(&limits, waiter("c", 0)), Err(Bound::Total));
        assert_eq!(held.totals(), (3, 100), "a refused one holds nothing");
        held.leave(waiter("a", 30));
        assert_eq!(held.enter(&limits, waiter("c", 0)), Ok(()));
        for w in [waiter("a", 30), waiter("b", 40), waiter("c", 0)] {
            held.leave(w);
        }
        assert_eq!(held.totals(), (0, 0));
        assert!(held.by_client.is_empty(), "no client is remembered");
        assert_eq!(
            Bound::BytesPerClient.to_string(),
            "queue_body_mib_per_client"
        );
    }
}
