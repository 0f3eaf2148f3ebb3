//! Guessing the admin token (issue 46): the sign-in form and the admin API's `Authorization:
//! Bearer` took 9,000 guesses a second. A wrong token presented either way counts against the
//! address (an IPv6 /64), as failed client keys do (`crate::failures`, the keys' guard's shape):
//! past 10 in a minute every admin request from it but `/livez` and `/readyz` is 429 for a
//! minute, the right token included. Logged once per burst, with the address, never the token.
//! A request with no token (a browser before signing in) is no guess and counts for nothing.

use std::net::IpAddr;
use std::time::SystemTime;

use super::Answer;
use crate::conn::Request;
use crate::failures::Failed;
use crate::logfmt::val;
use crate::state::Gateway;

/// 429 with `Retry-After` for an address refused for its failed tokens.
pub(super) fn refused(gw: &Gateway, request: &Request<'_>) -> Option<Answer> {
    let retry_after = gw.admin_failures.blocked(peer(request), now())?;
    let mut answer = Answer::error(
        429,
        "too many wrong admin tokens from this address; retry after Retry-After seconds",
    );
    answer
        .headers
        .push(("Retry-After", retry_after.to_string()));
    Some(answer)
}

/// A wrong admin token was presented.
pub(super) fn failed(gw: &Gateway, request: &Request<'_>) {
    let peer = peer(request);
    match gw.admin_failures.failed(peer, now()) {
        Failed::First => log::warn!("admin token refused peer={}", val(&peer.to_string())),
        Failed::Blocked { failed } => log::warn!(
            "admin token failures peer={} failed={failed} blocked_s=60",
            val(&peer.to_string())
        ),
        Failed::Counted => {}
    }
}

fn peer(request: &Request<'_>) -> IpAddr {
    let ip = (request.peer_addr()).map_or([0, 0, 0, 0].into(), |a| a.ip());
    crate::conn::peer_key(ip)
}

fn now() -> i64 {
    crate::store::unix_ms(SystemTime::now())
}
