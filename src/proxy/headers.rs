//! The answer's headers: upstream's minus hop-by-hop ones, plus crossbar's own. Borrowed from the
//! upstream answer and the plan wherever they can be: an answer's head is written from them at
//! once, and copying each name and value was a tenth of a request's allocations (issue 26).

use std::borrow::Cow;

use ureq::http;

use super::plan::{Plan, CTX_HEADER, HOST_HEADER, LEASE_HEADER, PLACEMENT_HEADER};
use crate::wire;

/// One header line of an answer, borrowed where it can be.
pub(super) type Line<'a> = (Cow<'a, str>, Cow<'a, str>);

/// Upstream headers minus hop-by-hop ones, plus crossbar's own.
pub(super) fn response_headers<'a>(
    upstream: &'a http::HeaderMap,
    plan: &'a Plan<'_>,
) -> Vec<Line<'a>> {
    // Borrowed unless the value is not UTF-8 (a hostile host's odd bytes still name tokens).
    let connection = (upstream.get("connection")).map(|v| wire::text(v.as_bytes()));
    let tokens = wire::connection_tokens(connection.as_deref());
    let mut headers = Vec::with_capacity(upstream.len() + 4);
    for (name, value) in upstream {
        if wire::is_hop_by_hop(name.as_str(), &tokens) {
            continue;
        }
        headers.push((canonical(name.as_str()), wire::text(value.as_bytes())));
    }
    let own = |name: &'static str, value: &'a str| (Cow::Borrowed(name), Cow::Borrowed(value));
    headers.push(own(HOST_HEADER, &plan.host.name));
    headers.push(own(LEASE_HEADER, plan.lease.as_str()));
    headers.push(own(PLACEMENT_HEADER, plan.placed.as_str()));
    if let Some(moved) = &plan.ctx_moved {
        headers.push(own(CTX_HEADER, moved));
    }
    headers
}

/// Names llama-server and the usual front ends send, as people write them.
const KNOWN: &[&str] = &[
    "Content-Type",
    "Date",
    "Server",
    "Access-Control-Allow-Origin",
    "X-Accel-Buffering",
    "Cache-Control",
    "Vary",
    "Retry-After",
    "Content-Encoding",
    "ETag",
    "Last-Modified",
    "WWW-Authenticate",
];

/// `content-type` → `Content-Type` (ureq lowercases names; clients don't care, people reading
/// do): a known name borrowed, any other one capitalised after each `-`.
fn canonical(name: &str) -> Cow<'static, str> {
    if let Some(known) = KNOWN.iter().find(|k| k.eq_ignore_ascii_case(name)) {
        return Cow::Borrowed(known);
    }
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper { c.to_ascii_uppercase() } else { c });
        upper = c == '-';
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_written_as_people_write_them_known_ones_without_a_copy() {
        assert!(matches!(
            canonical("content-type"),
            Cow::Borrowed("Content-Type")
        ));
        assert!(matches!(
            canonical("www-authenticate"),
            Cow::Borrowed("WWW-Authenticate")
        ));
        assert_eq!(canonical("x-request-id"), "X-Request-Id");
        assert_eq!(canonical("slot-id"), "Slot-Id");
        assert_eq!(canonical(""), "");
    }
}
