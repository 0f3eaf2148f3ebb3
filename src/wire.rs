//! Writing HTTP answers to a socket: the status line and headers, then the body framed by crossbar
//! itself and flushed after every piece (a buffered writer would hold SSE events back). The
//! connection layer (`conn`) and the simulator both answer through here. It owns framing and
//! hop-by-hop headers; it knows nothing about routes, leases or upstreams. Only chunked and
//! close-delimited bodies can end visibly broken ([`BodyWriter::abort`]); a body with a
//! `Content-Length` cannot, so it is used for bodies crossbar holds whole.

use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

mod reason;
pub use reason::reason;

/// Most of a `Content-Length` body the head's buffer is sized for (a relayed read is 16 KiB): a
/// declared length sizes nothing beyond it.
const HEAD_BODY: usize = 16 << 10;

/// Headers a proxy must not forward (RFC 9110 §7.6.1), plus framing headers crossbar rewrites.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
];

/// Whether a header is hop-by-hop (or framing) and so never copied across the proxy.
/// `connection_tokens` are the header names the message's own `Connection` header lists.
pub fn is_hop_by_hop(name: &str, connection_tokens: &[&str]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || connection_tokens
            .iter()
            .any(|t| name.eq_ignore_ascii_case(t))
}

/// The header names listed in a `Connection` header value (`close` and `keep-alive` included),
/// as written: compare them ignoring ASCII case.
pub fn connection_tokens(value: Option<&str>) -> Vec<&str> {
    (value.into_iter())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// A header value's bytes as text: borrowed when they are UTF-8, as nearly all are; otherwise each
/// odd byte becomes U+FFFD. `String::from_utf8_lossy` alone walks even valid bytes chunk by chunk,
/// about 230 instructions a header where this check takes a third (issue 26).
pub fn text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// One header line of an answer, its name and value owned or borrowed (`(String, String)`,
/// `(&str, Cow<str>)`...): building an answer's headers need copy nothing.
pub trait HeaderLine {
    fn name(&self) -> &str;
    fn value(&self) -> &str;
}

impl<N: AsRef<str>, V: AsRef<str>> HeaderLine for (N, V) {
    fn name(&self) -> &str {
        self.0.as_ref()
    }

    fn value(&self) -> &str {
        self.1.as_ref()
    }
}

/// What an answer's head says of its connection, beside its framing's own header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Nothing: the headers say it, if anyone does.
    Unsaid,
    /// `Keep-Alive: timeout=N`: the connection waits N seconds for the next request.
    KeepAlive(u64),
    /// `Connection: close` (a close-delimited body's framing says so already).
    Close,
}

/// How the connection layer follows an answer it writes: `broken` is raised when a write fails
/// or the body is aborted, and the head says `persist`.
#[derive(Debug, Clone, Copy)]
pub struct Tracked<'a> {
    pub broken: &'a AtomicBool,
    pub persist: Persist,
}

/// The first value of a header, by case-insensitive name, from a list of (name, value) pairs.
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// How the body that follows a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n`; the body is written as is. Cannot be aborted visibly: only for bodies
    /// already held whole.
    Length(u64),
    /// `Transfer-Encoding: chunked` (HTTP/1.1 clients).
    Chunked,
    /// HTTP/1.0 client: the end of the body is the end of the connection (the connection layer
    /// closes it after the answer).
    UntilClose,
    /// HEAD, 204, 304: no body at all.
    Empty,
}

/// When an answer's head leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOut {
    /// At once: a stream's head goes out before a long prefill.
    Now,
    /// With the first piece of body: for an answer whose body comes with its head, the client
    /// then wakes once, not once per write.
    WithBody,
}

/// A response being written to one client. Every write is flushed at once.
pub struct BodyWriter<'a> {
    out: Box<dyn Write + Send + 'a>,
    framing: Framing,
    /// Raised on a write error or an abort: the connection must not carry another request.
    broken: Option<&'a AtomicBool>,
    persist: Persist,
    /// Framed bytes not yet sent (a held head or last piece), then the chunk being framed: one
    /// buffer reused for every write.
    piece: Vec<u8>,
}

impl std::fmt::Debug for BodyWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyWriter")
            .field("framing", &self.framing)
            .finish()
    }
}

impl<'a> BodyWriter<'a> {
    fn new(out: Box<dyn Write + Send + 'a>, framing: Framing) -> BodyWriter<'a> {
        BodyWriter {
            out,
            framing,
            broken: None,
            persist: Persist::Unsaid,
            piece: Vec::new(),
        }
    }

    fn tracked(out: Box<dyn Write + Send + 'a>, framing: Framing, by: Option<Tracked<'a>>) -> Self {
        let mut writer = BodyWriter::new(out, framing);
        if let Some(by) = by {
            (writer.broken, writer.persist) = (Some(by.broken), by.persist);
        }
        writer
    }

    /// Writes the status line and headers. `headers` must not hold framing headers: they are
    /// derived from `framing`.
    pub fn start(
        out: Box<dyn Write + Send + 'a>,
        http10: bool,
        status: u16,
        headers: &[impl HeaderLine],
        framing: Framing,
    ) -> io::Result<BodyWriter<'a>> {
        let mut writer = BodyWriter::new(out, framing);
        writer.head(http10, status, headers, &[])?;
        Ok(writer)
    }

    /// [`BodyWriter::start`], followed `by` the connection layer ([`Tracked`]). With
    /// [`HeadOut::WithBody`] the head is held until the first piece of body is written (or held, or
    /// the body ends), and goes out in the same write.
    pub fn start_tracked(
        out: Box<dyn Write + Send + 'a>,
        by: Tracked<'a>,
        http10: bool,
        status: u16,
        headers: &[impl HeaderLine],
        framing: Framing,
        head_out: HeadOut,
    ) -> io::Result<BodyWriter<'a>> {
        let mut writer = BodyWriter::tracked(out, framing, Some(by));
        match head_out {
            HeadOut::Now => writer.head(http10, status, headers, &[])?,
            HeadOut::WithBody => writer.piece = writer.framed_head(http10, status, headers),
        }
        Ok(writer)
    }

    /// Writes the head, and `body` (a whole `Length` body) with it in the same write.
    fn head(
        &mut self,
        http10: bool,
        status: u16,
        headers: &[impl HeaderLine],
        body: &[u8],
    ) -> io::Result<()> {
        let mut head = self.framed_head(http10, status, headers);
        head.extend_from_slice(body);
        // Sent at once, before a long prefill. Accepted sockets have Nagle off (see `conn`), so
        // this small write and the body's do not wait on each other's ACKs.
        let sent = self.out.write_all(&head).and_then(|()| self.out.flush());
        self.track(sent)
    }

    /// The status line and headers, with the framing's and the connection's own.
    fn framed_head(&self, http10: bool, status: u16, headers: &[impl HeaderLine]) -> Vec<u8> {
        let framing = self.framing;
        // Sized once for the head and, when it goes out with the head, a short body: growing a
        // small buffer twice per answer was a realloc and a copy each (issue 26's profile).
        let lines: usize = (headers.iter())
            .map(|h| h.name().len() + h.value().len() + 4)
            .sum();
        let body = match framing {
            Framing::Length(n) => usize::try_from(n).unwrap_or(usize::MAX).min(HEAD_BODY),
            _ => 0,
        };
        let mut head = Vec::with_capacity(64 + lines + body);
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut digits = itoa::Buffer::new();
        put(
            &mut head,
            &[
                version,
                " ",
                digits.format(status),
                " ",
                reason(status),
                "\r\n",
            ],
        );
        for h in headers {
            put(&mut head, &[h.name(), ": ", h.value(), "\r\n"]);
        }
        match self.persist {
            Persist::KeepAlive(secs) => {
                put(
                    &mut head,
                    &["Keep-Alive: timeout=", digits.format(secs), "\r\n"],
                );
            }
            Persist::Close if framing != Framing::UntilClose => {
                head.extend_from_slice(b"Connection: close\r\n");
            }
            Persist::Close | Persist::Unsaid => {}
        }
        match framing {
            Framing::Length(n) => put(&mut head, &["Content-Length: ", digits.format(n), "\r\n"]),
            Framing::Chunked => head.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
            Framing::UntilClose => head.extend_from_slice(b"Connection: close\r\n"),
            Framing::Empty => {}
        }
        head.extend_from_slice(b"\r\n");
        head
    }

    fn track<T>(&self, result: io::Result<T>) -> io::Result<T> {
        if result.is_err() {
            self.mark_broken();
        }
        result
    }

    fn mark_broken(&self) {
        if let Some(flag) = self.broken {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Sends one piece of body (after whatever is held) and flushes it.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.frame(data)?;
        let result = self.send_framed();
        self.track(result)
    }

    /// Frames one piece of body without sending it: it goes out with the next write, or with the
    /// body's end. For an answer's last piece, which may wait for its row to be written.
    pub fn hold(&mut self, data: &[u8]) -> io::Result<()> {
        self.frame(data)
    }

    /// Appends `data`, framed, to the bytes waiting to be sent. One write per chunk (size line,
    /// data, CRLF), built in a buffer kept between chunks: no allocation per piece once it has
    /// grown to the largest read.
    fn frame(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() || self.framing == Framing::Empty {
            return Ok(());
        }
        if self.framing == Framing::Chunked {
            write!(self.piece, "{:x}\r\n", data.len())?;
            self.piece.extend_from_slice(data);
            self.piece.extend_from_slice(b"\r\n");
        } else {
            self.piece.extend_from_slice(data);
        }
        Ok(())
    }

    /// Sends the framed bytes in one write and flushes.
    fn send_framed(&mut self) -> io::Result<()> {
        if !self.piece.is_empty() {
            let sent = self.out.write_all(&self.piece);
            self.piece.clear();
            sent?;
        }
        self.out.flush()
    }

    /// Ends the body cleanly (the last chunk for chunked framing), in one write with whatever is
    /// held.
    pub fn finish(mut self) -> io::Result<()> {
        self.end();
        let result = self.send_framed();
        self.track(result)
    }

    /// Ends the body cleanly, as [`BodyWriter::finish`] does, but returns the bytes it would
    /// write (whatever is held, and the last chunk) for someone else to send: the connection
    /// layer's [`crate::conn::Tail`].
    pub fn into_end(mut self) -> Vec<u8> {
        self.end();
        std::mem::take(&mut self.piece)
    }

    /// Adds the body's clean end to what is held: the last chunk for chunked framing.
    fn end(&mut self) {
        if self.framing == Framing::Chunked {
            self.piece.extend_from_slice(b"0\r\n\r\n");
        }
    }

    /// Ends the body so that the client cannot mistake it for a complete answer: a chunked body gets
    /// a malformed chunk line instead of the last chunk, which every HTTP client reports as an error.
    /// A close-delimited body ends with the connection, closed when the writer is dropped here (the
    /// best HTTP/1.0 allows: the cut shows as truncated JSON or a stream without its last event).
    /// A `Length` body cannot be marked; see [`Framing::Length`].
    pub fn abort(mut self) {
        self.spoil();
        let _ = self.send_framed();
    }

    /// [`BodyWriter::abort`], but returns the bytes it would write (whatever is held, and the
    /// malformed chunk line) for someone else to send, as [`BodyWriter::into_end`] does for a
    /// clean end. The connection is marked to close after them.
    pub fn into_broken_end(mut self) -> Vec<u8> {
        self.spoil();
        std::mem::take(&mut self.piece)
    }

    /// Marks the body broken and adds its spoiled end to what is held: for chunked framing a
    /// chunk line that is not hex, which the client's chunk parser fails on.
    fn spoil(&mut self) {
        self.mark_broken();
        if self.framing == Framing::Chunked {
            (self.piece).extend_from_slice(b"!crossbar: upstream failed mid-body\r\n\r\n");
        }
    }
}

/// Sends a whole response with a fixed body (none when `head_only`), head and body in one write.
pub fn send<'a>(
    out: Box<dyn Write + Send + 'a>,
    http10: bool,
    head_only: bool,
    status: u16,
    headers: &[impl HeaderLine],
    body: &[u8],
) -> io::Result<()> {
    send_tracked(out, None, http10, head_only, status, headers, body)
}

/// [`send`], followed `by` the connection layer ([`Tracked`]).
pub fn send_tracked<'a>(
    out: Box<dyn Write + Send + 'a>,
    by: Option<Tracked<'a>>,
    http10: bool,
    head_only: bool,
    status: u16,
    headers: &[impl HeaderLine],
    body: &[u8],
) -> io::Result<()> {
    let framing = if head_only {
        Framing::Empty
    } else {
        Framing::Length(body.len() as u64)
    };
    let mut writer = BodyWriter::tracked(out, framing, by);
    let body = if head_only { &[][..] } else { body };
    writer.head(http10, status, headers, body)
}

/// Appends `parts` to `out` in order: a head's line written without the formatting machinery.
fn put(out: &mut Vec<u8>, parts: &[&str]) {
    for part in parts {
        out.extend_from_slice(part.as_bytes());
    }
}

#[cfg(test)]
mod tests;
