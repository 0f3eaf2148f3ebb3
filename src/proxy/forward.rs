//! The upstream exchange: send the request to the leased host, then relay its answer to the client
//! chunk by chunk through the tee, recording the accounting row before the client can see the end.

use std::io::{ErrorKind, Read};
use std::time::{Instant, SystemTime};

use crate::health::DownReason;
use crate::limiter::Permit;
use crate::logfmt::val;
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};
use crate::tee::Tee;
use crate::wire::{self, BodyWriter, Framing};

use super::{record, Incoming, Plan, ProxyError, CTX_HEADER, HOST_HEADER, LEASE_HEADER};

/// Upstream reads are copied in pieces of at most this size; each piece is flushed at once.
const READ_BUF: usize = 16 * 1024;

/// An upstream answer whose head has arrived, with the slot it occupies (none for metadata).
pub(super) struct Answer {
    response: ureq::Response,
    permit: Option<Permit>,
}

/// Sends the request upstream and waits for the response head. A connection or read failure before
/// the head marks the host down and becomes a 502 (the slot is freed before that answer goes out);
/// upstream error statuses are answers, not errors.
pub(super) fn exchange(
    gw: &Gateway,
    incoming: &Incoming,
    plan: &Plan<'_>,
    permit: Option<Permit>,
    row: &mut RequestRow,
    clock: Instant,
) -> Result<Answer, ProxyError> {
    let url = format!("{}{}{}", plan.host.url, plan.rest, incoming.query);
    let mut request = gw.agent().request(&incoming.method, &url);
    let tokens = wire::connection_tokens(incoming.header("Connection"));
    for (name, value) in &incoming.headers {
        let ours = name.len() > 11 && name[..11].eq_ignore_ascii_case("x-crossbar-");
        let replaced = plan.host.api_key.is_some()
            && (name.eq_ignore_ascii_case("authorization")
                || name.eq_ignore_ascii_case("x-api-key"));
        // Accept-Encoding stays home: the tee must read the answer's tokens, and on a LAN an
        // uncompressed answer costs nothing.
        let skipped = ["expect", "accept-encoding"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h));
        if wire::is_hop_by_hop(name, &tokens) || skipped || ours || replaced {
            continue;
        }
        request = request.set(name, value);
    }
    if let Some(key) = &plan.host.api_key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    let result = if plan.body.is_empty() && incoming.bodyless() {
        request.call()
    } else {
        request.send_bytes(&plan.body)
    };
    row.ttfb_ms = clock.elapsed().as_millis() as i64;
    match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => Ok(Answer { response, permit }),
        Err(ureq::Error::Transport(err)) => {
            let host = plan.host.name.clone();
            gw.health
                .mark_down(&host, DownReason::ForwardFailed, unix_ms(SystemTime::now()));
            log::warn!(
                "forward failed host={} error={}",
                val(&host),
                val(&err.to_string())
            );
            Err(ProxyError::Upstream {
                host,
                detail: err.to_string(),
            })
        }
    }
}

/// Relays the upstream answer: head first, then every read as soon as it arrives. Once upstream
/// is done the row is written and the slot freed before the body's end goes out, so a client that
/// has the whole answer finds its row in the db and the host's slot free for its next turn.
///
/// An answer that breaks off (a read error, a body shorter than its `Content-Length`, an SSE stream
/// that ends before its API's last event: `[DONE]`, a native `stop`, `message_stop`,
/// `response.completed`) ends the client's body visibly broken: never as a
/// clean end, never left hanging. HTTP/1.1 clients therefore always get a chunked body (the bytes
/// inside are upstream's, unchanged), whose end can be spoiled. See [`framing`] for HTTP/1.0.
pub(super) fn relay(
    gw: &Gateway,
    request: tiny_http::Request,
    incoming: &Incoming,
    plan: &Plan<'_>,
    answer: Answer,
    row: &mut RequestRow,
    clock: Instant,
) {
    let Answer { response, permit } = answer;
    row.status = response.status();
    let content_type = response.header("Content-Type").unwrap_or("").to_string();
    row.streamed = content_type.starts_with("text/event-stream");
    let framing = framing(incoming, &response);
    let headers = response_headers(&response, plan);
    let mut tee = Tee::for_api(&content_type, plan.api);
    let mut upstream = response.into_reader();
    let framing = match framing {
        Out::Chunked => Framing::Chunked,
        Out::UntilClose => Framing::UntilClose,
        Out::Empty => Framing::Empty,
        Out::Held => {
            let held = read_held(upstream, &mut tee);
            finish_row(row, clock, &tee);
            drop(permit);
            return send_held(gw, request, plan, headers, held, row);
        }
    };
    let mut out = match BodyWriter::start(
        request.into_writer(),
        incoming.http10,
        row.status,
        &headers,
        framing,
    ) {
        Ok(out) => out,
        Err(err) => return client_gone(gw, row, clock, &err),
    };
    let mut buf = vec![0u8; READ_BUF];
    loop {
        if framing == Framing::Empty {
            break;
        }
        let n = match upstream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return upstream_broke(gw, row, clock, &tee, out, &err.to_string()),
        };
        let piece = &buf[..n];
        tee.feed(piece);
        if let Err(err) = out.write(piece) {
            // Dropping `upstream` (on return) closes the upstream connection, so llama-server
            // cancels the generation and frees its slot.
            return client_gone(gw, row, clock, &err);
        }
    }
    if let Some(detail) = cut_short(&tee) {
        return upstream_broke(gw, row, clock, &tee, out, detail);
    }
    finish_row(row, clock, &tee);
    record(gw, row);
    drop(permit);
    if let Err(err) = out.finish() {
        log::debug!("client went away before the end of the body: {err}");
    }
}

/// Largest answer held whole for an HTTP/1.0 keep-alive client (see [`framing`]).
const HELD_MAX: u64 = 64 << 20;

/// How the client's body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// HTTP/1.1: chunked, whatever upstream used.
    Chunked,
    /// HTTP/1.0 without keep-alive: tiny_http closes the connection after the answer.
    UntilClose,
    /// HTTP/1.0 with `Connection: keep-alive`: tiny_http keeps the connection and crossbar has no
    /// way to close it, so neither a close-delimited body (the client would wait for a close that
    /// never comes) nor a length that may prove false will do: the answer is read whole first, then
    /// sent with its length, or replaced by a 502 if it broke off.
    Held,
    /// HEAD, 1xx, 204, 304: no body.
    Empty,
}

/// The client's framing: see [`Out`].
fn framing(incoming: &Incoming, response: &ureq::Response) -> Out {
    let status = response.status();
    if incoming.method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status) {
        return Out::Empty;
    }
    if !incoming.http10 {
        return Out::Chunked;
    }
    let tokens = wire::connection_tokens(incoming.header("Connection"));
    let has = |t: &str| tokens.iter().any(|k| k == t);
    // tiny_http's own rule for keeping an HTTP/1.0 connection.
    if has("keep-alive") && !has("close") {
        Out::Held
    } else {
        Out::UntilClose
    }
}

/// Why an answer that upstream ended without a read error is still incomplete, if it is: an SSE
/// stream without its API's last event (see the tee). A stream ended by an error event is
/// complete: that is how llama-server ends a failed stream, and the row has the error.
fn cut_short(tee: &Tee) -> Option<&'static str> {
    (!tee.finished() && tee.upstream_error().is_none())
        .then_some("upstream ended the stream before its last event")
}

/// [`Out::Held`]: the whole answer, or why it broke off.
fn read_held(upstream: Box<dyn Read + Send + Sync>, tee: &mut Tee) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let read = upstream.take(HELD_MAX + 1).read_to_end(&mut body);
    tee.feed(&body);
    read.map_err(|err| err.to_string())?;
    if body.len() as u64 > HELD_MAX {
        return Err(format!(
            "answer over {HELD_MAX} bytes for an HTTP/1.0 keep-alive client"
        ));
    }
    match cut_short(tee) {
        Some(detail) => Err(detail.to_string()),
        None => Ok(body),
    }
}

/// [`Out::Held`]: records the row, then sends the answer with its length, or a 502 with crossbar's
/// `upstream error` body if it broke off. The connection stays open, as the client asked.
fn send_held(
    gw: &Gateway,
    request: tiny_http::Request,
    plan: &Plan<'_>,
    mut headers: Vec<(String, String)>,
    held: Result<Vec<u8>, String>,
    row: &mut RequestRow,
) {
    let body = match held {
        Ok(body) => body,
        Err(detail) => {
            row.err = format!("upstream failed mid-body: {detail}");
            row.status = 502;
            let host = plan.host.name.clone();
            headers = vec![
                ("Content-Type".to_string(), "application/json".to_string()),
                (HOST_HEADER.to_string(), host.clone()),
            ];
            ProxyError::Upstream { host, detail }
                .body()
                .to_string()
                .into_bytes()
        }
    };
    headers.push(("Connection".to_string(), "keep-alive".to_string()));
    record(gw, row);
    if let Err(err) = wire::send(
        request.into_writer(),
        true,
        false,
        row.status,
        &headers,
        &body,
    ) {
        log::debug!("client went away before its held answer: {err}");
    }
}

/// Upstream headers minus hop-by-hop ones, plus crossbar's own.
fn response_headers(response: &ureq::Response, plan: &Plan<'_>) -> Vec<(String, String)> {
    let tokens = wire::connection_tokens(response.header("Connection"));
    let mut headers = Vec::new();
    for name in response.headers_names() {
        if wire::is_hop_by_hop(&name, &tokens) {
            continue;
        }
        for value in response.all(&name) {
            headers.push((canonical(&name), value.to_string()));
        }
    }
    headers.push((HOST_HEADER.to_string(), plan.host.name.clone()));
    headers.push((LEASE_HEADER.to_string(), plan.lease.as_str().to_string()));
    if let Some(moved) = &plan.ctx_moved {
        headers.push((CTX_HEADER.to_string(), moved.clone()));
    }
    headers
}

/// `content-type` → `Content-Type` (ureq lowercases names; clients don't care, people reading do).
fn canonical(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper { c.to_ascii_uppercase() } else { c });
        upper = c == '-';
    }
    out
}

fn finish_row(row: &mut RequestRow, clock: Instant, tee: &Tee) {
    let usage = tee.usage();
    row.prompt_tokens = usage.prompt_tokens;
    row.cached_tokens = usage.cached_tokens;
    row.completion_tokens = usage.completion_tokens;
    row.total_ms = clock.elapsed().as_millis() as i64;
    if let Some(err) = tee.upstream_error() {
        row.err = format!("upstream error event: {err}");
    }
}

fn client_gone(gw: &Gateway, row: &mut RequestRow, clock: Instant, err: &std::io::Error) {
    row.total_ms = clock.elapsed().as_millis() as i64;
    row.status = 499;
    row.err = format!("client went away: {err}");
    record(gw, row);
}

fn upstream_broke(
    gw: &Gateway,
    row: &mut RequestRow,
    clock: Instant,
    tee: &Tee,
    out: BodyWriter,
    detail: &str,
) {
    finish_row(row, clock, tee);
    row.err = format!("upstream failed mid-body: {detail}");
    record(gw, row);
    out.abort();
}
