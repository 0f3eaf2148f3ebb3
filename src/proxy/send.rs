//! One attempt at the upstream request: the forwarded headers (hop-by-hop, crossbar's own and the
//! client's keys and cookie left home), the host's key, the head's size checked against what the
//! upstream client can write and its request line against what llama-server reads, and a
//! listing's bounds; and the check, made before a host is chosen, that every header the client
//! sent can be forwarded at all, in a head the host can read (issue 46).

use std::time::Duration;

use ureq::{http, Body};

use super::incoming::Incoming;
use super::plan::Plan;
use super::ProxyError;
use crate::upstream::{Exchange, HEAD_ROOM};
use crate::wire;

/// Which connection an attempt may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    /// Any, a pooled one first.
    Pooled,
    /// The retry after a pooled connection turned out closed: none the pool gives (after a host
    /// restart every pooled one is dead, not only the first one tried).
    Fresh,
}

/// One attempt: the request of `plan` with its body. A request that cannot be written is the
/// client's error, found before a byte is sent: a head over [`HEAD_ROOM`] (431), a request line
/// over [`HOST_REQUEST_LINE`] (414), or one the HTTP library refuses (400). A model listing to rename is bounded as a whole (`plan.listing`).
pub(super) fn send(
    agent: &ureq::Agent,
    exchange: &Exchange,
    incoming: &Incoming,
    plan: &Plan<'_>,
    attempt: Attempt,
) -> Result<Result<http::Response<Body>, ureq::Error>, ProxyError> {
    let bodyless = plan.body.is_empty() && incoming.bodyless();
    let (whole, fresh) = (plan.listing, attempt == Attempt::Fresh);
    let url = [plan.host.url.as_str(), &plan.rest, &incoming.query].concat();
    // "METHOD url HTTP/1.1\r\n", each "name: value\r\n", the blank line; ureq's own headers
    // are within `ADDED`.
    let mut head = incoming.method.len() + url.len() + 13;
    let mut request = http::Request::builder()
        .method(incoming.method.as_str())
        .uri(url.as_str());
    let tokens = wire::connection_tokens(incoming.header("Connection"));
    let host_key = plan.host.api_key.is_some();
    for (name, value) in incoming.headers.iter() {
        if stays_home(name, &tokens, plan.keyed, host_key) {
            continue;
        }
        // The status page's sign-in cookie stays home: cookies are not port-scoped (issue 27).
        let value = if name.eq_ignore_ascii_case("cookie") {
            match crate::sessions::strip_cookie(value) {
                Some(rest) => rest,
                None => continue,
            }
        } else {
            std::borrow::Cow::Borrowed(value)
        };
        head += name.len() + value.len() + 4;
        request = request.header(name, value.as_ref());
    }
    if let Some(key) = &plan.host.api_key {
        head += key.len() + 24;
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    if head > HEAD_ROOM {
        return Err(ProxyError::HeadTooLarge(
            "over what crossbar writes upstream",
        ));
    }
    // The request line as ureq writes it ("METHOD path?query HTTP/1.1\r\n"); the URL's scheme
    // and authority make it a little over, never under.
    if incoming.method.len() + url.len() + 12 > HOST_REQUEST_LINE {
        return Err(ProxyError::UriTooLong);
    }
    let bad = |err: http::Error| ProxyError::BadRequest(err.to_string());
    exchange.body_follows(!plan.body.is_empty());
    Ok(if bodyless {
        agent.run(configured(
            agent,
            request.body(()).map_err(bad)?,
            whole,
            fresh,
        ))
    } else {
        let body = request.body(plan.body.as_slice()).map_err(bad)?;
        agent.run(configured(agent, body, whole, fresh))
    })
}

/// `request` with what this attempt needs beyond the agent's settings:
/// - `whole` (a listing read whole): at most that long for the head, and that long for the body.
///   Not ureq's global timeout, under which it resolves the host's name on a thread of its own
///   (`upstream.rs`: the agent has no overall timeout for that reason).
/// - `fresh` (the retry): an idle age of zero, so the pool hands out none of its connections to
///   the host. After a host restart every one of them is dead, not only the first one tried.
fn configured<S: ureq::AsSendBody>(
    agent: &ureq::Agent,
    request: http::Request<S>,
    whole: Option<Duration>,
    fresh: bool,
) -> http::Request<S> {
    if whole.is_none() && !fresh {
        return request;
    }
    let mut config = agent.configure_request(request);
    if let Some(limit) = whole {
        config = config
            .timeout_recv_response(Some(limit))
            .timeout_recv_body(Some(limit));
    }
    if fresh {
        config = config.max_idle_age(Duration::ZERO);
    }
    config.build()
}

/// What llama-server (cpp-httplib, b11434) reads of a request head: header lines of at most
/// [`HOST_LINE`] bytes, CRLF included, at most [`HOST_LINES`] of them, and a request line of at
/// most [`HOST_REQUEST_LINE`] bytes. Past the first two it answers 400 and closes without reading
/// the body, so a large body's write fails; past the third it closes without a word. Either way
/// the client's head, not the host, is at fault (issue 46).
pub(super) const HOST_LINE: usize = 8192;
pub(super) const HOST_LINES: usize = 100;
pub(super) const HOST_REQUEST_LINE: usize = 32768;
/// Header lines crossbar may add to the client's: the upstream client's Host, Content-Length,
/// User-Agent and Accept, and the host's Authorization.
const ADDED_LINES: usize = 5;

/// Every header of the request can be forwarded as is, and the host can read the head it goes
/// out in. Checked before a host is chosen (issue 24): an HTTP library refuses such a header only
/// once it is asked to send, and that refusal must not look like the host's failure (issue 10),
/// nor cost a lease or a slot. The lines counted are those that may go upstream (a client's key
/// the host's own may replace counts: the bound holds for every host).
pub(super) fn check_headers(incoming: &Incoming, keyed: bool) -> Result<(), ProxyError> {
    let tokens = wire::connection_tokens(incoming.header("Connection"));
    let mut lines = ADDED_LINES;
    for (name, value) in incoming.headers.iter() {
        forwardable(name, value)?;
        if stays_home(name, &tokens, keyed, false) {
            continue;
        }
        // "name: value\r\n", as the upstream client writes it.
        if name.len() + value.len() + 4 > HOST_LINE {
            return Err(ProxyError::HeadTooLarge(
                "a header line over 8,192 bytes, the most llama-server reads",
            ));
        }
        lines += 1;
    }
    if lines > HOST_LINES {
        return Err(ProxyError::HeadTooLarge(
            "more header lines than the 100 llama-server reads, with the few crossbar adds",
        ));
    }
    Ok(())
}

/// Whether a client's header stays home: hop-by-hop and framing ones, `Expect`, `Accept-Encoding`
/// (the tee must read the answer's tokens, and on a LAN an uncompressed answer costs nothing),
/// crossbar's own, and a client's key where keys are on (issue 25: no client key ever goes
/// upstream) or the host's own key (`host_key`) replaces it.
fn stays_home(name: &str, tokens: &[&str], keyed: bool, host_key: bool) -> bool {
    let ours = name.len() > 11 && name[..11].eq_ignore_ascii_case("x-crossbar-");
    let replaced = (keyed && crate::keys::is_key_header(name))
        || host_key
            && (name.eq_ignore_ascii_case("authorization")
                || name.eq_ignore_ascii_case("x-api-key"));
    let skipped = ["expect", "accept-encoding"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h));
    wire::is_hop_by_hop(name, tokens) || skipped || ours || replaced
}

/// A header that can be sent as is: a token for a name, visible ASCII, space and tab for a value
/// (RFC 9110 §5.5 without obs-text). Anything else is the client's 400.
fn forwardable(name: &str, value: &str) -> Result<(), ProxyError> {
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    if name.is_empty() || !name.as_bytes().iter().all(tchar) {
        return Err(ProxyError::BadRequest(format!(
            "header name {name:?} is not a token"
        )));
    }
    if !value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(ProxyError::BadRequest(format!(
            "header {name} holds a byte that cannot be forwarded"
        )));
    }
    Ok(())
}
