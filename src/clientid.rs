//! [`ClientId`]: who a request counts against where one client must not take what all share
//! (issue 46): its client key when keys are on, else its address (an IPv6 /64, as `conn/peers.rs`
//! counts peers). The limiter bounds what one client's requests waiting for a slot hold, and the
//! lease table how many conversations one client keeps. Only compared: a 64-bit hash keyed at
//! random per process (`fasthash`), so it names no key or address and no client can choose
//! another's. Pure.

use std::hash::BuildHasher;
use std::net::IpAddr;

/// One client, as the per-client bounds count it. `ClientId::default()` is no one in particular
/// (callers with no client: tests, crossbar's own calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u64);

impl ClientId {
    /// The client key named `name`.
    pub fn key(name: &str) -> ClientId {
        ClientId::of((0u8, name))
    }

    /// The address `ip`: an IPv4 address, or an IPv6 address's /64.
    pub fn addr(ip: IpAddr) -> ClientId {
        ClientId::of((1u8, crate::conn::peer_key(ip)))
    }

    /// The request's client: its key's name when it has one (keys on), else its address.
    pub fn of_request(key: &str, ip: IpAddr) -> ClientId {
        match key {
            "" => ClientId::addr(ip),
            name => ClientId::key(name),
        }
    }

    fn of(what: impl std::hash::Hash) -> ClientId {
        // Never 0: that is `default()`, no one.
        ClientId(crate::fasthash::Keyed::default().hash_one(what).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_and_an_address_are_one_client_each_and_an_ipv6_64_is_one() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ClientId::addr(a), ClientId::addr(same_64));
        assert_ne!(ClientId::addr(a), ClientId::addr(next_64));
        assert_eq!(ClientId::key("laptop"), ClientId::key("laptop"));
        assert_ne!(ClientId::key("laptop"), ClientId::key("desk"));
        let v4: IpAddr = [10, 0, 0, 1].into();
        assert_eq!(ClientId::of_request("", v4), ClientId::addr(v4));
        assert_eq!(ClientId::of_request("laptop", v4), ClientId::key("laptop"));
        assert_ne!(ClientId::key("laptop"), ClientId::default());
    }
}
