//! A browser's CORS preflight, answered by crossbar itself (issue 46): an `OPTIONS` carrying
//! `Origin` and `Access-Control-Request-Method` asks whether the page may send its real request,
//! and carries no credentials, so it can be neither keyed nor routed. Its answer says yes for
//! every path, as llama-server's own does (`Access-Control-Allow-Origin: *`), and names nothing:
//! no route, no model, no host. Its body is never read, no host is asked, nothing is held. Any
//! other `OPTIONS` is a request like the rest: keyed, routed, forwarded. Pure: no I/O.

use super::incoming::Incoming;

/// How long a browser may keep the answer, in seconds.
const MAX_AGE: &str = "600";

/// Whether the request is a CORS preflight.
pub(super) fn is_preflight(incoming: &Incoming) -> bool {
    incoming.method == "OPTIONS"
        && incoming.header("Origin").is_some()
        && incoming.header("Access-Control-Request-Method").is_some()
}

/// The preflight's answer headers (a 200 with no body, as llama-server's). The headers the page asks for are allowed by name,
/// when they are a plain list of names (a browser's always is): `*` would not cover
/// `Authorization`, which a client key comes in.
pub(super) fn answer(incoming: &Incoming) -> Vec<(&'static str, String)> {
    let asked = incoming
        .header("Access-Control-Request-Headers")
        .filter(|list| !list.is_empty() && list.bytes().all(listed))
        .unwrap_or("*");
    vec![
        ("Access-Control-Allow-Origin", "*".to_string()),
        (
            "Access-Control-Allow-Methods",
            "GET, POST, OPTIONS".to_string(),
        ),
        ("Access-Control-Allow-Headers", asked.to_string()),
        ("Access-Control-Max-Age", MAX_AGE.to_string()),
    ]
}

/// A byte of a list of header names: a token's, a comma or a space.
fn listed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~, ".contains(&b)
}
