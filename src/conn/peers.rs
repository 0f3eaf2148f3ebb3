//! Per peer address, what one client holds, so it cannot take everything a listener has: open
//! connections (`max_connections_per_peer`) and workers waiting for its request bodies
//! (`max_body_readers_per_peer`). A connection counts from its accept until its socket is closed,
//! lingering close included; a body from its head until it is read (or the request ends). Each
//! count is an RAII slot ([`PeerSlot`], [`BodySlot`]) given back on `Drop`, so no path (an error,
//! a panic, a client gone, an eviction) can leak one. A table has an entry only per peer with a
//! live slot, so it is bounded by the open connections themselves. Pure bookkeeping: no I/O.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// The per-peer counts of one listener.
#[derive(Debug)]
pub(super) struct Peers {
    /// Open connections.
    open: Counts,
    /// Requests whose body a worker waits for.
    bodies: Counts,
}

/// One open connection's place in its peer's count.
#[derive(Debug)]
pub(super) struct PeerSlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

/// One request body's place in its peer's count of bodies being read.
#[derive(Debug)]
pub(super) struct BodySlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

/// One count per peer, capped.
#[derive(Debug)]
struct Counts {
    max: usize,
    /// Invariant: every value is ≥ 1 and equals the live slots with that key.
    by_peer: parking_lot::Mutex<HashMap<IpAddr, usize>>,
}

impl Peers {
    pub(super) fn new(max_open: usize, max_bodies: usize) -> Arc<Peers> {
        Arc::new(Peers {
            open: Counts::new(max_open),
            bodies: Counts::new(max_bodies),
        })
    }

    /// A slot for a new connection from `addr`, or `None` when that peer already holds its max.
    pub(super) fn enter(self: &Arc<Peers>, addr: IpAddr) -> Option<PeerSlot> {
        let key = key(addr);
        self.open.enter(key).then(|| PeerSlot {
            peers: self.clone(),
            key,
        })
    }

    /// Open connections on the listener, all peers together.
    pub(super) fn total(&self) -> usize {
        self.open.total()
    }

    /// Request bodies being read on the listener, all peers together.
    pub(super) fn bodies(&self) -> usize {
        self.bodies.total()
    }

    #[cfg(test)]
    fn peers(&self) -> usize {
        self.open.by_peer.lock().len() + self.bodies.by_peer.lock().len()
    }
}

impl PeerSlot {
    /// A slot for reading a request body on this connection, or `None` when its peer already has
    /// its max of bodies being read.
    pub(super) fn body(&self) -> Option<BodySlot> {
        self.peers.bodies.enter(self.key).then(|| BodySlot {
            peers: self.peers.clone(),
            key: self.key,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        self.peers.open.leave(self.key);
    }
}

impl Drop for BodySlot {
    fn drop(&mut self) {
        self.peers.bodies.leave(self.key);
    }
}

impl Counts {
    fn new(max: usize) -> Counts {
        Counts {
            max: max.max(1),
            by_peer: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Counts one more for `key`, unless it holds `max` already.
    fn enter(&self, key: IpAddr) -> bool {
        let mut by_peer = self.by_peer.lock();
        let n = by_peer.entry(key).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    fn leave(&self, key: IpAddr) {
        let mut by_peer = self.by_peer.lock();
        if let Some(n) = by_peer.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                by_peer.remove(&key);
            }
        }
    }

    fn total(&self) -> usize {
        self.by_peer.lock().values().sum()
    }
}

/// What counts as one peer: an IPv4 address, or an IPv6 /64 (one host may hold a whole /64, so a
/// single address would be no limit at all). IPv4-mapped IPv6 addresses count as their IPv4.
pub(crate) fn key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_max_slots_and_each_one_dropped_is_given_back() {
        let peers = Peers::new(2, 1);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let first = peers.enter(a).unwrap();
        let _second = peers.enter(a).unwrap();
        assert!(peers.enter(a).is_none(), "a third from the same peer");
        let _other = peers.enter(b).expect("another peer is not affected");
        assert_eq!(peers.total(), 3);
        drop(first);
        let _again = peers.enter(a).expect("a slot given back is usable");
        assert!(peers.enter(a).is_none());
    }

    #[test]
    fn the_table_forgets_a_peer_with_no_connection() {
        let peers = Peers::new(4, 1);
        let slots: Vec<_> = (0..50u8)
            .map(|i| peers.enter([10, 0, 1, i].into()).unwrap())
            .collect();
        assert_eq!(peers.peers(), 50);
        drop(slots);
        assert_eq!((peers.peers(), peers.total()), (0, 0));
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_ipv4_is_the_ipv4() {
        let peers = Peers::new(1, 1);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _slot = peers.enter(one).unwrap();
        assert!(peers.enter(same_64).is_none());
        assert!(peers.enter(next_64).is_some());
        let _v4 = peers.enter([192, 0, 2, 7].into()).unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(peers.enter(mapped).is_none());
    }

    #[test]
    fn bodies_being_read_are_capped_per_peer_and_given_back_on_drop() {
        let peers = Peers::new(8, 2);
        let a = peers.enter([10, 0, 0, 1].into()).unwrap();
        let a2 = peers.enter([10, 0, 0, 1].into()).unwrap();
        let b = peers.enter([10, 0, 0, 2].into()).unwrap();
        let first = a.body().unwrap();
        let _second = a2
            .body()
            .expect("two per peer, over any of its connections");
        assert!(a.body().is_none(), "a third body from the same peer");
        let _other = b.body().expect("another peer is not affected");
        assert_eq!(peers.bodies(), 3);
        drop(first);
        let again = a.body().expect("a slot given back is usable");
        // Dropping every slot leaves both tables empty.
        drop((a, a2, b, again, _second, _other));
        assert_eq!((peers.bodies(), peers.total(), peers.peers()), (0, 0, 0));
    }
}
