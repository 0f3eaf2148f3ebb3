//! A guard against guessing a secret, per address (an IPv6 /64, as `conn/peers.rs` counts
//! peers): more than `max` failures within a window and the address is refused for that window,
//! even with the right secret. The shape of the client keys' guard (`keys.rs`, issue 25); the
//! admin token's sign-in and bearer checks use it (issue 46: they took 9,000 guesses a second).
//! Bounded: at most `peers` addresses are remembered, the one quiet longest forgotten first, and
//! each keeps at most `max + 1` failure times. Pure bookkeeping: no I/O, no clock (`now` is unix
//! ms, a parameter); the caller logs what [`Failures::failed`] says happened.

use std::collections::VecDeque;
use std::net::IpAddr;

use parking_lot::Mutex;

use crate::fasthash::HashMap;

/// Recent failures per address.
#[derive(Debug)]
pub struct Failures {
    max: usize,
    window_ms: i64,
    peers: usize,
    /// Invariant: at most `peers` entries, each with failure times within `window_ms` of its
    /// last, oldest first, at most `max + 1` of them.
    inner: Mutex<HashMap<IpAddr, Peer>>,
}

#[derive(Debug, Default)]
struct Peer {
    failures: VecDeque<i64>,
    blocked_until: i64,
}

/// What one more failure did, for the caller's log line (once per burst, not per guess).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The first of a burst from this address.
    First,
    /// The one past the limit: the address is refused from now on, for a window.
    Blocked { failed: usize },
    /// Any other.
    Counted,
}

impl Failures {
    /// More than `max` failures within `window_ms` block an address for `window_ms`; at most
    /// `peers` addresses are remembered.
    pub fn new(max: usize, window_ms: i64, peers: usize) -> Failures {
        Failures {
            max,
            window_ms,
            peers: peers.max(1),
            inner: Mutex::new(HashMap::default()),
        }
    }

    /// Seconds `peer` must wait, when it is refused at `now`; `None` when it is not.
    pub fn blocked(&self, peer: IpAddr, now: i64) -> Option<u64> {
        let until = self
            .inner
            .lock()
            .get(&key(peer))
            .map_or(0, |p| p.blocked_until);
        (until > now).then(|| ((until - now) as u64).div_ceil(1000))
    }

    /// Counts a failure from `peer` at `now`.
    pub fn failed(&self, peer: IpAddr, now: i64) -> Failed {
        let peer = key(peer);
        let mut inner = self.inner.lock();
        if !inner.contains_key(&peer) && inner.len() >= self.peers {
            let quiet = (inner.iter())
                .min_by_key(|(_, p)| p.failures.back().copied().unwrap_or(0))
                .map(|(ip, _)| *ip);
            if let Some(ip) = quiet {
                inner.remove(&ip);
            }
        }
        let entry = inner.entry(peer).or_default();
        while (entry.failures.front()).is_some_and(|t| now - t > self.window_ms) {
            entry.failures.pop_front();
        }
        let first = entry.failures.is_empty();
        if entry.failures.len() <= self.max {
            entry.failures.push_back(now);
        }
        if entry.failures.len() > self.max && entry.blocked_until <= now {
            entry.blocked_until = now + self.window_ms;
            return Failed::Blocked {
                failed: entry.failures.len(),
            };
        }
        if first {
            Failed::First
        } else {
            Failed::Counted
        }
    }
}

/// What counts as one address.
fn key(peer: IpAddr) -> IpAddr {
    crate::conn::peer_key(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_limit_an_address_is_refused_for_a_window_and_others_are_not() {
        let guard = Failures::new(3, 60_000, 16);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8::2".parse().unwrap();
        let b: IpAddr = [10, 0, 0, 2].into();
        assert_eq!(guard.failed(a, 0), Failed::First);
        assert_eq!(
            guard.failed(same_64, 1),
            Failed::Counted,
            "one /64, one address"
        );
        assert_eq!(guard.failed(a, 2), Failed::Counted);
        assert_eq!(guard.blocked(a, 3), None);
        assert_eq!(guard.failed(a, 3), Failed::Blocked { failed: 4 });
        assert_eq!(guard.blocked(same_64, 4), Some(60));
        assert_eq!(guard.blocked(b, 4), None);
        assert_eq!(guard.blocked(a, 60_003), None, "a window later");
        // Old failures leave the window: a burst a window later starts over.
        assert_eq!(guard.failed(a, 200_000), Failed::First);
    }

    #[test]
    fn the_table_keeps_at_most_its_addresses() {
        let guard = Failures::new(3, 60_000, 4);
        for i in 0..100u8 {
            guard.failed([10, 0, 1, i].into(), i64::from(i));
        }
        assert_eq!(guard.inner.lock().len(), 4);
        for _ in 0..1000 {
            guard.failed([10, 0, 0, 1].into(), 500);
        }
        let inner = guard.inner.lock();
        assert!(inner.values().all(|p| p.failures.len() <= 4));
    }
}
