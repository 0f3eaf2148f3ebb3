//! What a worker does with a connection: waits for its next head (parking it with the poller when
//! it idles while others wait), reads the head (a slow one goes to the poller), takes a body slot
//! for a body still to come, calls the handler, and then keeps the connection for the next
//! request, hands it to the poller (its body still coming: `awaited`), or closes it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::accept::per_peer_bodies;
use super::awaited::Arrived;
use super::head::{BodyKind, Head, HeadError};
use super::inbound::Fill;
use super::park;
use super::pool::{Conn, Refused, Shared};
use super::request::{refuse, Body, Request};
use super::MAX_HEAD;

/// How long an idle worker waits on its connection before looking at the accept queue again: a
/// connection waiting behind idle keep-alive ones is served within about this long.
const IDLE_STEP: Duration = Duration::from_millis(100);
/// The same wait when someone already waits in the queue as the answer goes out: a client that
/// sends its next request at once keeps its worker; one that pauses is parked for the newcomer.
/// Also the wait while the last answer's end is sent by another thread ([`super::Tail`]): the
/// worker looks again this soon to write what the client's socket could not take at once.
const BUSY_STEP: Duration = Duration::from_millis(2);
/// How long a worker waits for the rest of a head it has started to read before handing the
/// connection to the poller. A head sent in one write is whole at once; this only spares the
/// poller's tick to a head split over a few packets.
const HEAD_STEP: Duration = Duration::from_millis(50);

/// Serves one connection's requests until it closes, breaks, idles out or is parked.
pub(super) fn serve(sh: &Shared, conn: Conn) {
    let mut conn = conn;
    loop {
        let (head, body) = match conn.arrived.take() {
            Some(arrived) => {
                let Arrived { head, body } = *arrived;
                (head, Body::Arrived(body))
            }
            None => {
                conn = match wait_for_request(sh, conn) {
                    Some(conn) => conn,
                    None => return,
                };
                let head = match next_head(sh, &mut conn) {
                    Ok(head) => head,
                    Err(HeadError::Closed) => return,
                    // A slow head is read off the workers; the poller queues it again once whole.
                    Err(HeadError::Timeout)
                        if conn.head_by.is_some_and(|by| Instant::now() < by) =>
                    {
                        return park::park(sh, conn)
                    }
                    Err(err) => return refuse_head(sh, conn, err),
                };
                // A body still to come: one peer gets a few awaited at once, here or off the
                // workers.
                if !body_to_come(&head, conn.inb.pending()) {
                    (head, Body::ToRead(None))
                } else if let Some(slot) = conn.peer.body() {
                    (head, Body::ToRead(Some(slot)))
                } else {
                    return per_peer_bodies(sh, conn);
                }
            }
        };
        let stopping = sh.stopping.load(Ordering::SeqCst);
        let shared = (&sh.settings, &sh.budget, conn.addr);
        let handles = (&mut conn.watch, &mut conn.tail);
        let mut request = Request::new(head, &mut conn.inb, handles, shared, stopping, body);
        let served = catch_unwind(AssertUnwindSafe(|| (sh.service.handle)(&mut request)));
        // The body is still coming: the poller reads it, and the handler is called again.
        if served.is_ok() && request.body_later() {
            match request.into_later() {
                Some((head, wait)) => return park::body(sh, conn, head, wait),
                None => return,
            }
        }
        if served.is_err() || !request.answered() {
            log::error!(
                "request handler panicked or gave no answer listener={} answer=500_if_it_could",
                sh.service.name
            );
            if !request.answered() {
                let headers = [("Content-Type".to_string(), "application/json".to_string())];
                let body = super::request::internal_error(request.target());
                let _ = request.send(500, &headers, &body);
            }
        }
        if served.is_err() || !request.keep() {
            drop(request);
            return park::linger(sh, conn);
        }
        // An end committed on this thread is out already, or waits for what the socket could not
        // take at once: written now.
        if !conn.settle_now() {
            return;
        }
        conn.idle_until = Instant::now() + sh.settings.keepalive_idle;
    }
}

/// Reads the next head (its first byte has arrived), waiting [`HEAD_STEP`] at most: a head not
/// whole by then is `Timeout` while its deadline (`head_by`, kept) has not passed.
fn next_head(sh: &Shared, conn: &mut Conn) -> Result<Head, HeadError> {
    let now = Instant::now();
    let head_by = *conn.head_by.get_or_insert(now + sh.settings.header_timeout);
    let head = conn.inb.read_head(head_by.min(now + HEAD_STEP))?;
    conn.fresh = false;
    conn.head_by = None;
    conn.scanned = 0;
    Ok(head)
}

/// Whether a worker would wait for some of `head`'s body: all of it not yet received with the
/// head. Chunked bodies always count (their end is only known by decoding them).
fn body_to_come(head: &Head, pending: &[u8]) -> bool {
    match head.body {
        BodyKind::None => false,
        BodyKind::Length(n) => (pending.len() as u64) < n,
        BodyKind::Chunked => true,
    }
}

/// Waits for the first byte of the next head. `None` when the connection is done with: closed,
/// idle too long, the listener stopping, or parked because someone waits for a worker.
/// The last answer's end is out before the next request is served or the connection closed.
fn wait_for_request(sh: &Shared, mut conn: Conn) -> Option<Conn> {
    loop {
        if !conn.inb.pending().is_empty() {
            return conn.settle().then_some(conn);
        }
        let now = Instant::now();
        if now >= conn.idle_until || (sh.stopping.load(Ordering::SeqCst) && !conn.fresh) {
            conn.settle();
            return None;
        }
        let step = if sh.queue.is_empty() && conn.tail.is_none() {
            IDLE_STEP
        } else {
            BUSY_STEP
        };
        match conn.inb.fill(conn.idle_until.min(now + step), MAX_HEAD) {
            Fill::Data => return conn.settle().then_some(conn),
            Fill::Eof | Fill::Failed(_) => {
                // A client that shut its side may still read the end.
                conn.settle();
                return None;
            }
            Fill::Timeout if !sh.queue.is_empty() => {
                park::park(sh, conn);
                return None;
            }
            Fill::Timeout if !conn.settle_now() => return None,
            Fill::Timeout => {}
        }
    }
}

/// Answers a head that was refused (431, 400, 408), logs and counts it, and closes.
pub(super) fn refuse_head(sh: &Shared, conn: Conn, err: HeadError) {
    let (status, error, detail, reason) = match &err {
        HeadError::TooLarge => (431, "headers too large", None, Refused::HeadersTooLarge),
        HeadError::Bad(what) => (400, "bad request", Some(what.as_str()), Refused::BadRequest),
        HeadError::Timeout => (408, "request timeout", None, Refused::HeadTimeout),
        HeadError::Closed => return,
    };
    // Counted before the answer goes out, so a client that has the answer sees it counted.
    (sh.service.refused)(reason);
    let sock = conn.inb.wire();
    refuse(sock, status, error, detail, None);
    let peer = sock
        .peer_addr()
        .map_or_else(|_| "-".to_string(), |a| a.to_string());
    log::info!(
        "refused listener={} status={status} reason={} peer={peer} detail={}",
        sh.service.name,
        reason.as_str(),
        crate::logfmt::val(detail.unwrap_or("-"))
    );
    park::linger(sh, conn);
}
