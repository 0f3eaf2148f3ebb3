//! The upstream exchange: send the request to the leased host, then relay its answer to the client
//! chunk by chunk through the tee, recording the accounting row before the client can see the end.

use std::cell::Cell;
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Instant, SystemTime};

use ureq::{http, Body};

use crate::conn::Request;
use crate::health::{error_chain, DownReason};
use crate::limiter::Permit;
use crate::logfmt::val;
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};
use crate::tee::Tee;
use crate::upstream::Exchange;
use crate::wire::{self, BodyWriter, Framing, HeadOut};

use super::headers::response_headers;
use super::record::{client_gone, finish_row, record_then_send};
use super::send::send;
use super::{record, Incoming, Plan, ProxyError};

/// Upstream reads are copied in pieces of at most this size; each piece is flushed at once.
const READ_BUF: usize = 16 * 1024;

thread_local! {
    /// Each worker's read buffer, reused request after request: a fresh zeroed 16 KiB per request
    /// made glibc consolidate its heap every time (1 % of all CPU at 32 clients, issue 12).
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The relay's read buffer: the thread's spare, given back when dropped.
struct ReadBuf(Vec<u8>);

impl ReadBuf {
    fn take() -> ReadBuf {
        let mut buf = SPARE.take();
        buf.resize(READ_BUF, 0);
        ReadBuf(buf)
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        SPARE.set(std::mem::take(&mut self.0));
    }
}

/// An upstream answer whose head has arrived, with the slot it occupies (none for metadata).
pub(super) struct Answer {
    pub(super) response: http::Response<Body>,
    permit: Option<Permit>,
    /// The watch over the upstream connection, kept until the answer has been relayed.
    exchange: Exchange,
}

/// Sends the request upstream and waits for the response head. A connection or read failure before
/// the head marks the host down and becomes a 502 (the slot is freed before that answer goes out);
/// upstream error statuses are answers, not errors. While it waits, a `client` that leaves ends the
/// wait and closes the upstream connection (499, the host is not marked down).
pub(super) fn exchange(
    gw: &Gateway,
    incoming: &Incoming,
    plan: &Plan<'_>,
    permit: Option<Permit>,
    client: Option<std::sync::Arc<TcpStream>>,
    row: &mut RequestRow,
    clock: Instant,
) -> Result<Answer, ProxyError> {
    let exchange = Exchange::start(client);
    let agent = &gw.upstream.forwarding(&plan.host.name);
    let bodyless = plan.body.is_empty() && incoming.bodyless();
    // A listing crossbar renames is read whole before it is sent: a bound on its head and one on
    // its whole body, so a host trickling it cannot hold the worker read by read (issue 15).
    let whole = super::listing::renames(incoming, plan)
        .then(|| super::listing::deadline(gw.config().first_byte_timeout));
    let mut result = send(agent, &exchange, incoming, plan, bodyless, whole, false)?;
    // A pooled connection the host had closed (pooled connections are not probed: the request's
    // own write or first read finds it): once more on a fresh one.
    if result.is_err() && exchange.retryable() {
        log::debug!("retry on a fresh connection host={}", val(&plan.host.name));
        result = send(agent, &exchange, incoming, plan, bodyless, whole, true)?;
    }
    row.ttfb_ms = clock.elapsed().as_millis() as i64;
    match result {
        Ok(response) => {
            gw.health.request_ok(&plan.host.name);
            gw.metrics
                .observe_ttfb(&row.route, &plan.host.name, row.started, row.ttfb_ms);
            Ok(Answer {
                response,
                permit,
                exchange,
            })
        }
        Err(_) if exchange.client_left() => Err(ProxyError::ClientGone(
            "client gone while waiting for upstream",
        )),
        Err(err) if !counts_against_host(&err) => {
            gw.metrics.observe_forward_failure("client", "request");
            Err(ProxyError::BadRequest(err.to_string()))
        }
        Err(err) => {
            let host = plan.host.name.clone();
            let refused = !exchange.sent() && connect_failed(&err);
            host_failed(gw, plan, &row.model, refused, &error_chain(&err));
            log::warn!(
                "forward failed host={} connect={refused} error={}",
                val(&host),
                val(&err.to_string())
            );
            Err(ProxyError::Upstream {
                host,
                detail: err.to_string(),
                refused,
            })
        }
    }
}

/// What a failed forward says about its host (issue 24: health judged by what the host did). A
/// fresh connection refused or timed out: the host is down at once. A request that may have
/// reached it (a first-byte timeout, a malformed answer, a reset mid-answer): a 502 for that
/// request alone, one more in the host's failure streak, and an early health poll. Either way new
/// conversations avoid it until it answers again. A router loading the model (it was not loaded
/// when this request left) may take longer than `first_byte_timeout`: that is a slow load, not a
/// dead host (issue 15).
fn host_failed(gw: &Gateway, plan: &Plan<'_>, model: &str, refused: bool, error: &str) {
    let host = &plan.host.name;
    gw.holdings.failed(host);
    let kind = if refused { "connect" } else { "reached" };
    gw.metrics.observe_forward_failure("host", kind);
    let loading = (gw.health.model_state(host, model)).is_some_and(|state| state != "loaded");
    if loading {
        return;
    }
    let reason = DownReason::ForwardFailed {
        path: plan.rest.clone(),
        error: error.to_string(),
    };
    let now = unix_ms(SystemTime::now());
    if refused {
        gw.health.mark_down(host, reason, now);
    } else {
        gw.health.request_failed(host, reason, now);
        gw.health.poke(host);
    }
}

/// Failures that happen before a connection exists: nothing of the request reached the host.
fn connect_failed(err: &ureq::Error) -> bool {
    use std::io::ErrorKind as K;
    use ureq::Error as E;
    match err {
        E::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => true,
        E::HostNotFound | E::ConnectionFailed => true,
        E::Io(e) => matches!(
            e.kind(),
            K::ConnectionRefused | K::TimedOut | K::HostUnreachable | K::NetworkUnreachable
        ),
        _ => false,
    }
}

/// Every header of the request can be forwarded as is. Checked before a host is chosen (issue 24):
/// an HTTP library refuses such a header only once it is asked to send, and that refusal must not
/// look like the host's failure (issue 10), nor cost a lease or a slot.
pub(super) fn check_headers(incoming: &Incoming) -> Result<(), ProxyError> {
    for (name, value) in incoming.headers.iter() {
        forwardable(name, value)?;
    }
    Ok(())
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

/// Whether a failure before the response head is the host's (it cannot be reached, timed out, or
/// answered something that is not HTTP) rather than a request that could not be built. Only the
/// host's failures mark it down.
fn counts_against_host(err: &ureq::Error) -> bool {
    use ureq::Error as E;
    !matches!(err, E::Http(_) | E::BadUri(_) | E::InvalidProxyUrl)
}

/// Relays the upstream answer: head first, then every read as soon as it arrives. Once upstream
/// is done the row is written and the slot freed before the body's end goes out, so a client that
/// has the whole answer finds its row in the db and the host's slot free for its next turn.
///
/// An answer that breaks off (a read error, a body shorter than its `Content-Length`, an SSE stream
/// that ends before its API's last event: `[DONE]`, a native `stop`, `message_stop`,
/// `response.completed`) ends the client's body visibly broken: never as a
/// clean end, never left hanging. HTTP/1.1 clients therefore always get a chunked body (the bytes
/// inside are upstream's, unchanged), whose end can be spoiled; HTTP/1.0 clients see the
/// connection close where it broke.
pub(super) fn relay(
    gw: &Gateway,
    request: &mut Request<'_>,
    incoming: &Incoming,
    plan: &Plan<'_>,
    answer: Answer,
    row: &mut RequestRow,
    clock: Instant,
) {
    let Answer {
        response,
        permit,
        exchange,
    } = answer;
    row.status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| wire::text(v.as_bytes()).into_owned())
        .unwrap_or_default();
    row.streamed = content_type.starts_with("text/event-stream");
    // llama-server closes a connection after a streamed answer (shared/llama-server.md).
    exchange.set_poolable(!row.streamed);
    let framing = framing(incoming, row.status);
    let mut tee = Tee::for_api(&content_type, plan.api);
    // A whole answer (not streamed, its length known) comes with its head: the head waits for
    // its body and the last piece for the row, so the client gets it all in one write.
    let length = (!row.streamed)
        .then(|| response.headers().get("content-length"))
        .flatten()
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    // A whole answer's row is on its way from here: a commit under way may wait for it.
    let coming = length.map(|_| gw.store.row_coming());
    let head_out = if length.is_some() {
        HeadOut::WithBody
    } else {
        HeadOut::Now
    };
    // The head is written from upstream's headers where they lie, before its body is taken.
    let mut out = {
        let headers = response_headers(response.headers(), plan);
        match request.start(row.status, &headers, framing, head_out) {
            Ok(out) => out,
            Err(err) => return gone(gw, plan, row, clock, &err),
        }
    };
    let mut upstream = response.into_body().into_reader();
    let mut buf = ReadBuf::take();
    let buf = &mut buf.0[..];
    let (mut got, mut held) = (0u64, false);
    loop {
        if framing == Framing::Empty {
            break;
        }
        let n = match upstream.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            // A stream's head comes before prefill: a client that leaves during it is noticed here.
            Err(_) if exchange.client_left() => {
                super::pin::abandon(plan);
                finish_row(gw, row, clock, &tee);
                row.status = 499;
                row.err = "client gone while waiting for upstream".to_string();
                return record(gw, row);
            }
            Err(err) => return upstream_broke(gw, plan, row, clock, &tee, out, &err.to_string()),
        };
        let piece = &buf[..n];
        tee.feed(piece);
        got += n as u64;
        // The answer's last piece (all its declared length, or a stream's last event) is held
        // for its row and goes out with the body's end; every other piece goes out at once.
        // (Never two in a row: a host that sends on after its last event gets no buffer.)
        let last = !held && (length == Some(got) || (row.streamed && tee.finished()));
        held = last;
        let sent = if last {
            out.hold(piece)
        } else {
            out.write(piece)
        };
        if let Err(err) = sent {
            // Dropping `upstream` (on return) closes the upstream connection, so llama-server
            // cancels the generation and frees its slot.
            return gone(gw, plan, row, clock, &err);
        }
    }
    if let Some(detail) = cut_short(&tee) {
        return upstream_broke(gw, plan, row, clock, &tee, out, detail);
    }
    finish_row(gw, row, clock, &tee);
    // The host's slot and the key's turn are free before the client can send its next turn.
    super::learn(gw, plan, row);
    drop(permit);
    if let Some(key) = &plan._key {
        key.release();
    }
    // The end goes out once the row is in the db, sent by whoever commits it: a worker does not
    // sleep on the commit of a batch only to wake and write a few bytes (issue 26).
    let end = out.into_end();
    let tail = request.end_later(end);
    record_then_send(gw, row, coming, tail);
}

/// The client left mid-answer. Its slot on a pinning host is told before its row is written: a
/// client that sees the row finds the slot in doubt, never still pinnable.
fn gone(gw: &Gateway, plan: &Plan<'_>, row: &mut RequestRow, clock: Instant, err: &std::io::Error) {
    super::pin::abandon(plan);
    client_gone(gw, row, clock, err);
}

/// The client's framing: chunked for HTTP/1.1 (whatever upstream used, so a break can be shown),
/// close-delimited for HTTP/1.0 (the connection closes after the answer), none for HEAD, 1xx, 204
/// and 304.
fn framing(incoming: &Incoming, status: u16) -> Framing {
    if incoming.method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::Empty
    } else if incoming.http10 {
        Framing::UntilClose
    } else {
        Framing::Chunked
    }
}

/// Why an answer that upstream ended without a read error is still incomplete, if it is: an SSE
/// stream without its API's last event (see the tee). A stream ended by an error event is
/// complete: that is how llama-server ends a failed stream, and the row has the error.
fn cut_short(tee: &Tee) -> Option<&'static str> {
    (!tee.finished() && tee.upstream_error().is_none())
        .then_some("upstream ended the stream before its last event")
}

/// An answer that broke off mid-body: the client sees it broken, and the host's failure counts
/// as one that reached it (issue 24).
fn upstream_broke(
    gw: &Gateway,
    plan: &Plan<'_>,
    row: &mut RequestRow,
    clock: Instant,
    tee: &Tee,
    out: BodyWriter<'_>,
    detail: &str,
) {
    super::pin::abandon(plan);
    finish_row(gw, row, clock, tee);
    row.err = format!("upstream failed mid-body: {detail}");
    record(gw, row);
    host_failed(gw, plan, &row.model, false, detail);
    out.abort();
}
