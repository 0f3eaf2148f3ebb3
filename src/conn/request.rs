//! [`Request`]: one request as a handler sees it — its head, its body on demand, a way to notice
//! that the client left, and its answer, written through `wire`. It decides whether the
//! connection may carry another request: only when the body was read whole, the answer finished
//! cleanly and the client allows it.

use std::io::{self, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::awaited::{Awaiting, Budget, BODY_STEP};
use super::body::{from_fill, BodyError};
use super::deadline::Deadlined;
use super::head::{BodyKind, Head};
use super::headers::Headers;
use super::inbound::{Fill, Inbound, READ_PIECE};
use super::peers::BodySlot;
use super::tail::Tail;
use super::Settings;
use crate::wire::{self, BodyWriter, Framing, HeadOut, HeaderLine, Persist, Tracked};

/// A request's body as its worker found it.
#[derive(Debug)]
pub(super) enum Body {
    /// To be read on the worker, with its place in its peer's count when some of it is still to
    /// come.
    ToRead(Option<BodySlot>),
    /// Read off the workers by the poller: whole, or why not.
    Arrived(Result<Vec<u8>, BodyError>),
}

/// One request on a connection, lent to a handler.
#[derive(Debug)]
pub struct Request<'c> {
    head: Head,
    inb: &'c mut Inbound<TcpStream>,
    watch: &'c mut Option<Arc<TcpStream>>,
    /// Where the connection keeps an answer's end sent by another thread.
    tail: &'c mut Option<Arc<Tail>>,
    settings: &'c Settings,
    budget: &'c Arc<Budget>,
    body_read: bool,
    /// Its peer's count of bodies being read, while this one's is awaited.
    reading: Option<BodySlot>,
    /// The body the poller read off the workers, whole or why not.
    arrived: Option<Result<Vec<u8>, BodyError>>,
    /// The body was not whole within [`BODY_STEP`]: the poller takes it from here.
    later: Option<Awaiting>,
    /// The client's address, as its connection was accepted.
    peer: SocketAddr,
    answered: bool,
    /// The connection closes after this answer: set when the answer starts without keep-alive,
    /// and by the answer's writer on a write error or an aborted body.
    close_after: AtomicBool,
    stopping: bool,
}

impl<'c> Request<'c> {
    pub(super) fn new(
        head: Head,
        inb: &'c mut Inbound<TcpStream>,
        (watch, tail): (&'c mut Option<Arc<TcpStream>>, &'c mut Option<Arc<Tail>>),
        (settings, budget, peer): (&'c Settings, &'c Arc<Budget>, SocketAddr),
        stopping: bool,
        body: Body,
    ) -> Request<'c> {
        let body_read = head.body == BodyKind::None;
        let (reading, arrived) = match body {
            Body::ToRead(slot) => (slot, None),
            Body::Arrived(body) => (None, Some(body)),
        };
        Request {
            head,
            inb,
            watch,
            tail,
            settings,
            budget,
            body_read,
            reading,
            arrived,
            later: None,
            peer,
            answered: false,
            close_after: AtomicBool::new(false),
            stopping,
        }
    }

    pub fn method(&self) -> &str {
        &self.head.method
    }

    /// Path and query as sent.
    pub fn target(&self) -> &str {
        &self.head.target
    }

    pub fn headers(&self) -> &Headers {
        &self.head.headers
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The headers, moved out for a handler that keeps them while it answers (none are left
    /// here). One whose body is still coming ([`Request::body_later`]) gives them back
    /// ([`Request::restore_headers`]): it is called again with this head.
    pub fn take_headers(&mut self) -> Headers {
        std::mem::take(&mut self.head.headers)
    }

    /// Puts back what [`Request::take_headers`] took.
    pub fn restore_headers(&mut self, headers: Headers) {
        self.head.headers = headers;
    }

    pub fn http10(&self) -> bool {
        self.head.http10
    }

    /// The client's address (as accepted: no system call).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        Some(self.peer)
    }

    /// The address the client connected to (this listener's own address as the client sees it).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inb.wire().local_addr().ok()
    }

    /// Reads the whole body, at most `max` bytes (else [`BodyError::TooLarge`], the rest unread and
    /// the connection closed after the answer). Answers `100 Continue` first if the client waits
    /// for it. A second call returns an empty body.
    ///
    /// A body not whole within [`BODY_STEP`] is [`BodyError::Later`]: the handler must return at
    /// once without answering; the poller reads the rest off the workers and the handler is called
    /// again, this call then returning the whole body (or why not) at once. So nothing a handler
    /// does before it may be seen by the client or kept.
    pub fn read_body(&mut self, max: usize) -> Result<Vec<u8>, BodyError> {
        if self.body_read {
            return Ok(Vec::new());
        }
        if let Some(arrived) = self.arrived.take() {
            let body = arrived?;
            self.body_read = true;
            return match body.len() > max {
                true => Err(BodyError::TooLarge),
                false => Ok(body),
            };
        }
        let timing = self.settings.body_timing();
        let slot = self.reading.take();
        let mut wait = Awaiting::new(self.head.body, max, timing, slot, self.budget)?;
        if self.head.expect_continue {
            let mut out = self.inb.wire();
            io::Write::write_all(&mut out, b"HTTP/1.1 100 Continue\r\n\r\n")
                .map_err(BodyError::Io)?;
        }
        let until = Instant::now() + BODY_STEP;
        loop {
            let now = Instant::now();
            let Some(by) = wait.step(self.inb, now)? else {
                self.body_read = true;
                return Ok(wait.finish());
            };
            if now >= until {
                self.later = Some(wait);
                return Err(BodyError::Later);
            }
            match self.inb.fill(by.min(until), READ_PIECE) {
                Fill::Data | Fill::Timeout => {}
                other => return Err(from_fill(other)),
            }
        }
    }

    /// Whether [`Request::read_body`] left the body to the poller ([`BodyError::Later`]): the
    /// handler returns without answering, and is called again with the whole body.
    pub fn body_later(&self) -> bool {
        self.later.is_some() && !self.answered
    }

    /// The head and the body still coming, for the poller.
    pub(super) fn into_later(self) -> Option<(Head, Awaiting)> {
        Some((self.head, self.later?))
    }

    /// Whether the client has gone: its side of the connection is closed or broken. Bytes it sent
    /// after this request (pipelining) mean it is still there. Never blocks.
    pub fn client_gone(&self) -> bool {
        super::peer_gone(self.inb.wire())
    }

    /// A second handle on the client's socket, for code that must watch it while this request
    /// waits elsewhere (the upstream exchange). `None` if the OS refuses one.
    pub fn socket(&mut self) -> Option<Arc<TcpStream>> {
        if self.watch.is_none() {
            *self.watch = self.inb.wire().try_clone().ok().map(Arc::new);
        }
        self.watch.clone()
    }

    /// Starts the answer (its head now, or with the body: [`HeadOut`]); the body follows through
    /// the returned writer.
    pub fn start(
        &mut self,
        status: u16,
        headers: &[impl HeaderLine],
        framing: Framing,
        head_out: HeadOut,
    ) -> io::Result<BodyWriter<'_>> {
        self.not_later()?;
        let persist = self.persist(framing);
        let http10 = self.head.http10;
        BodyWriter::start_tracked(
            Box::new(Deadlined::new(self.inb.wire(), self.settings.write_timeout)),
            Tracked {
                broken: &self.close_after,
                persist,
            },
            http10,
            status,
            headers,
            framing,
            head_out,
        )
    }

    /// Leaves the answer's end (the bytes of [`BodyWriter::into_end`]) to be sent by another
    /// thread through [`Tail::send`], once the request's row is committed (issue 26). The
    /// connection carries nothing else until it is out; the worker finishes what the client's
    /// socket could not take at once.
    pub fn end_later(&mut self, end: Vec<u8>) -> Arc<Tail> {
        let sock = self.socket();
        let tail = Arc::new(Tail::new(end, sock, self.settings.write_timeout));
        *self.tail = Some(tail.clone());
        tail
    }

    /// A whole answer with a fixed body (none for `HEAD`), in one write.
    pub fn send(
        &mut self,
        status: u16,
        headers: &[impl HeaderLine],
        body: &[u8],
    ) -> io::Result<()> {
        let answer = self.whole(status, headers, body)?;
        let sent = Deadlined::new(self.inb.wire(), self.settings.write_timeout).write_all(&answer);
        if sent.is_err() {
            self.close_after.store(true, Ordering::Relaxed);
        }
        sent
    }

    /// [`Request::send`] through [`Request::end_later`]: the whole answer goes out once the
    /// request's row is committed, sent by whoever commits it (issue 26).
    pub fn send_later(
        &mut self,
        status: u16,
        headers: &[impl HeaderLine],
        body: &[u8],
    ) -> io::Result<Arc<Tail>> {
        let answer = self.whole(status, headers, body)?;
        Ok(self.end_later(answer))
    }

    /// The bytes of a whole answer with a fixed body (none for `HEAD`); the request counts as
    /// answered.
    fn whole(
        &mut self,
        status: u16,
        headers: &[impl HeaderLine],
        body: &[u8],
    ) -> io::Result<Vec<u8>> {
        self.not_later()?;
        let head_only = self.head.method == "HEAD";
        let persist = self.persist(Framing::Length(body.len() as u64));
        let mut answer = Vec::new();
        wire::send_tracked(
            Box::new(&mut answer),
            Some(Tracked {
                broken: &self.close_after,
                persist,
            }),
            self.head.http10,
            head_only,
            status,
            headers,
            body,
        )?;
        Ok(answer)
    }

    /// A handler told [`BodyError::Later`] must not answer: its answer would come before the
    /// one it is called again for.
    fn not_later(&self) -> io::Result<()> {
        match self.later {
            Some(_) => Err(io::Error::other("the request's body is still coming")),
            None => Ok(()),
        }
    }

    /// What the answer's head says of the connection: `Keep-Alive` when it stays open, else
    /// `Connection: close` (which close-delimited framing writes itself). Marks it answered.
    fn persist(&mut self, framing: Framing) -> Persist {
        self.answered = true;
        if self.reusable() && framing != Framing::UntilClose {
            Persist::KeepAlive(self.settings.keepalive_idle.as_secs().max(1))
        } else {
            self.close_after.store(true, Ordering::Relaxed);
            Persist::Close
        }
    }

    /// Ends the request without an answer: the client has gone. The connection closes.
    pub fn abandon(&mut self) {
        self.answered = true;
        self.close_after.store(true, Ordering::Relaxed);
    }

    pub(super) fn answered(&self) -> bool {
        self.answered
    }

    /// Whether the connection can carry the next request once this answer is out.
    pub(super) fn keep(&self) -> bool {
        self.answered && self.reusable() && !self.close_after.load(Ordering::Relaxed)
    }

    fn reusable(&self) -> bool {
        self.head.keep_alive && self.body_read && !self.stopping
    }
}

/// `wire::send` for code that answers outside a handler (refusals before a head was parsed), in
/// OpenAI's envelope: no API is known before routing (issue 27).
pub(super) fn refuse(
    sock: &TcpStream,
    status: u16,
    error: &str,
    detail: Option<&str>,
    retry_after: Option<u64>,
) {
    let body = refusal(status, error, detail);
    let mut headers = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("Connection".to_string(), "close".to_string()),
    ];
    if let Some(secs) = retry_after {
        headers.push(("Retry-After".to_string(), secs.to_string()));
    }
    let _ = wire::send(
        Box::new(sock),
        false,
        false,
        status,
        &headers,
        body.as_bytes(),
    );
}

/// The body of a refusal before routing: `error` is its code, `detail` (or what the status means
/// here) says why.
fn refusal(status: u16, error: &str, detail: Option<&str>) -> String {
    let head = format!(
        "the request head is over {} KiB or {} header lines",
        super::MAX_HEAD >> 10,
        super::MAX_HEADERS
    );
    let why = match (status, detail) {
        (_, Some(detail)) => detail,
        (431, None) => &head,
        (408, None) => "the request head did not arrive in time (client_header_timeout)",
        (503, None) => {
            "every worker is busy and the accept queue is full; retry after Retry-After seconds"
        }
        _ => "refused before the request was read",
    };
    let mut fields = Vec::new();
    if let Some(detail) = detail {
        fields.push(("detail", detail.into()));
    }
    let message = format!("{error}: {why}");
    crate::envelope::body(
        crate::envelope::Shape::OpenAi,
        status,
        error,
        &message,
        fields,
    )
    .to_string()
}

/// The 500 for a request whose handler panicked or gave no answer, in the envelope of the API its
/// path names (issue 27).
pub(super) fn internal_error(target: &str) -> Vec<u8> {
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    let message = "internal error: crossbar failed to answer this request; its log says why";
    let shape = crate::envelope::Shape::of(path);
    let body = crate::envelope::body(shape, 500, "internal error", message, []);
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    #[test]
    fn issue27_a_refusal_before_routing_wears_openais_envelope() {
        let refusal = |status, error, detail| {
            serde_json::from_str::<Value>(&super::refusal(status, error, detail)).unwrap()
        };
        let busy = refusal(503, "busy", Some("too many connections from this address"));
        assert_eq!(
            busy,
            json!({"error": {"message": "busy: too many connections from this address",
                             "type": "overloaded_error", "code": "busy",
                             "detail": "too many connections from this address"}})
        );
        let large = refusal(431, "headers too large", None);
        assert_eq!(large["error"]["type"], "invalid_request_error");
        assert_eq!(
            large["error"]["message"],
            "headers too large: the request head is over 64 KiB or 100 header lines"
        );
        let late = refusal(408, "request timeout", None);
        assert_eq!(late["error"]["code"], "request timeout");
        assert!(late["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in time"));
    }
}
