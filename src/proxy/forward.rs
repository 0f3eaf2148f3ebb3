//! The relay: an upstream answer copied to the client read by read through the tee, its last
//! piece held so it leaves with the row (`end.rs`). It moves bytes and says how it went
//! ([`Outcome`]); it never records, learns or frees anything itself.

use std::cell::Cell;
use std::io::{ErrorKind, Read};

use crate::conn::Request;
use crate::tee::Tee;
use crate::wire::{self, Framing, HeadOut};

use super::end::Outcome;
use super::exchange::Answer;
use super::headers::response_headers;
use super::incoming::Incoming;
use super::plan::{Ctx, Plan};

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

/// Relays the upstream answer: head first, then every read as soon as it arrives, the last piece
/// held for the row (the row is written and the slot freed before the body's end goes out, so a
/// client that has the whole answer finds its row in the db and the host's slot free for its
/// next turn).
///
/// An answer that breaks off (a read error, a body shorter than its `Content-Length` or its chunks
/// cut off, a close-delimited SSE stream that ends before its API's last event: `[DONE]`, a native
/// `stop`, `message_stop`, `response.completed`) ends the client's body visibly broken: never as
/// a clean end, never left hanging. HTTP/1.1 clients therefore always get a chunked body (the bytes inside are upstream's,
/// unchanged), whose end can be spoiled; HTTP/1.0 clients see the connection close where it broke.
pub(super) fn relay(
    ctx: &mut Ctx<'_>,
    request: &mut Request<'_>,
    plan: &Plan<'_>,
    answer: Answer,
) -> Outcome {
    let Answer { response, exchange } = answer;
    let row = &mut ctx.row;
    row.status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| wire::text(v.as_bytes()).into_owned())
        .unwrap_or_default();
    row.streamed = content_type.starts_with("text/event-stream");
    // llama-server closes a connection after a streamed answer (shared/llama-server.md).
    exchange.set_poolable(!row.streamed);
    let framing = framing(&ctx.incoming, row.status);
    let mut tee = Tee::for_api(&content_type, plan.api);
    // A whole answer (not streamed, its length known) comes with its head: the head waits for
    // its body and the last piece for the row, so the client gets it all in one write.
    let length = (!row.streamed)
        .then(|| response.headers().get("content-length"))
        .flatten()
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    // A whole answer's row is on its way from here: a commit under way may wait for it.
    let coming = length.map(|_| ctx.gw.store.row_coming());
    let head_out = if length.is_some() {
        HeadOut::WithBody
    } else {
        HeadOut::Now
    };
    let streamed = row.streamed;
    // Whether upstream's own framing says where the body ends (a length, or chunks): then the
    // body's end is the host's word that it is whole (issue 46), whatever events it carried.
    let framed = length.is_some()
        || (response.headers().get("transfer-encoding")).is_some_and(|v| {
            wire::text(v.as_bytes())
                .to_ascii_lowercase()
                .contains("chunked")
        });
    // The head is written from upstream's headers where they lie, before its body is taken.
    let mut out = {
        let headers = response_headers(response.headers(), plan);
        match request.start(row.status, &headers, framing, head_out) {
            Ok(out) => out,
            Err(err) => return gone(&err),
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
                ctx.read(&tee);
                return Outcome::Gone("client gone while waiting for upstream".to_string());
            }
            Err(err) => {
                ctx.read(&tee);
                let end = out.into_broken_end();
                return broke(request, end, err.to_string());
            }
        };
        let piece = &buf[..n];
        tee.feed(piece);
        got += n as u64;
        // The answer's last piece (all its declared length, or a stream's last event) is held
        // for its row and goes out with the body's end; every other piece goes out at once.
        // (Never two in a row: a host that sends on after its last event gets no buffer.)
        let last = !held && (length == Some(got) || (streamed && tee.finished()));
        held = last;
        let sent = if last {
            out.hold(piece)
        } else {
            out.write(piece)
        };
        if let Err(err) = sent {
            // Dropping `upstream` (on return) closes the upstream connection, so llama-server
            // cancels the generation and frees its slot. What it streamed so far counts.
            ctx.read(&tee);
            return gone(&err);
        }
    }
    ctx.read(&tee);
    if let Some(detail) = cut_short(&tee, framed) {
        let end = out.into_broken_end();
        return broke(request, end, detail.to_string());
    }
    // The end goes out once the row is in the db, sent by whoever commits it: a worker does not
    // sleep on the commit of a batch only to wake and write a few bytes (issue 26).
    let end = out.into_end();
    Outcome::Answered {
        end: request.end_later(end),
        coming,
    }
}

/// The client stopped taking the answer: it left, or read nothing for `client_write_timeout`.
/// Returning drops the upstream reader, which closes the upstream connection so llama-server
/// cancels the generation.
fn gone(err: &std::io::Error) -> Outcome {
    Outcome::Gone(
        if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            "client stalled".to_string()
        } else {
            format!("client gone: {err}")
        },
    )
}

/// The answer broke off mid-body: what the client has so far ends visibly broken (`end`: what
/// was held and a spoiled last chunk), once the row is in, and the break counts against the host
/// (issue 24).
fn broke(request: &mut Request<'_>, end: Vec<u8>, detail: String) -> Outcome {
    Outcome::Broke {
        detail,
        end: Some(request.end_later(end)),
    }
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

/// Why an answer that upstream ended without a read error is still incomplete, if it is: a
/// close-delimited SSE stream without its API's last event (see the tee), where the connection's
/// end is all there is to tell a whole stream from a broken one. A stream ended by an error event
/// is complete: that is how llama-server ends a failed stream, and the row has the error. A
/// stream whose own framing ended cleanly (llama-server's chunked end) is whole as the host sent
/// it, last event or not (issue 46: `"response_fields": ["content"]` on a streamed `/completion`
/// ends with `{"content":""}` and no `"stop": true`): relayed as it came, never the host's
/// failure.
fn cut_short(tee: &Tee, framed: bool) -> Option<&'static str> {
    (!framed && !tee.finished() && tee.upstream_error().is_none())
        .then_some("upstream ended the stream before its last event")
}
