//! Open connections per peer address, so one client cannot take every connection a listener
//! holds (`max_connections_per_peer`). A connection counts from its accept until its socket is
//! closed, lingering close included; its [`PeerSlot`] gives the count back on `Drop`, so no path
//! (an error, a panic, an eviction) can leak one. The table has an entry only per peer with an
//! open connection, so it is bounded by the open connections themselves. Pure bookkeeping: no I/O.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// The per-peer counts of one listener.
#[derive(Debug)]
pub(super) struct Peers {
    max: usize,
    /// Invariant: every value is ≥ 1 and equals the live [`PeerSlot`]s with that key.
    open: parking_lot::Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection's place in its peer's count.
#[derive(Debug)]
pub(super) struct PeerSlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

impl Peers {
    pub(super) fn new(max: usize) -> Arc<Peers> {
        Arc::new(Peers {
            max: max.max(1),
            open: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// A slot for a new connection from `addr`, or `None` when that peer already holds `max`.
    pub(super) fn enter(self: &Arc<Peers>, addr: IpAddr) -> Option<PeerSlot> {
        let key = key(addr);
        let mut open = self.open.lock();
        let n = open.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        drop(open);
        Some(PeerSlot {
            peers: self.clone(),
            key,
        })
    }

    /// Open connections on the listener, all peers together.
    pub(super) fn total(&self) -> usize {
        self.open.lock().values().sum()
    }

    #[cfg(test)]
    fn peers(&self) -> usize {
        self.open.lock().len()
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock();
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// What counts as one peer: an IPv4 address, or an IPv6 /64 (one host may hold a whole /64, so a
/// single address would be no limit at all). IPv4-mapped IPv6 addresses count as their IPv4.
fn key(addr: IpAddr) -> IpAddr {
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
        let peers = Peers::new(2);
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
        let peers = Peers::new(4);
        let slots: Vec<_> = (0..50u8)
            .map(|i| peers.enter([10, 0, 1, i].into()).unwrap())
            .collect();
        assert_eq!(peers.peers(), 50);
        drop(slots);
        assert_eq!((peers.peers(), peers.total()), (0, 0));
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_ipv4_is_the_ipv4() {
        let peers = Peers::new(1);
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
}
