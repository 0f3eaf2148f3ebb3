//! The simulator's wire: requests are read with crossbar's own head parser and body readers
//! (`conn`), answers are written with crossbar's writer (`wire`), so the project has one HTTP
//! parser. What stays here is what only a fake llama-server needs: its connection handling (it
//! closes after every stream, mid-stream and all at once on demand, as `Fault`s ask) and the raw
//! half-chunk a fault writes. This module knows nothing about llama-server: no JSON, no routing.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::conn::{self, BodyError, BodyTiming, HeadError, Inbound};
use crate::wire::{BodyWriter, Framing};

/// Largest request body accepted (the gateway itself caps bodies at 16 MiB).
const MAX_BODY: usize = 64 << 20;
/// How long a connection may sit idle or take over a request before the sim drops it.
const PATIENCE: Duration = Duration::from_secs(600);

/// One parsed request.
#[derive(Debug, Clone)]
pub(super) struct HttpRequest {
    pub method: String,
    /// Path plus query, as sent.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The client allows another request on this connection (HTTP/1.1 without `Connection: close`).
    pub keep_alive: bool,
}

impl HttpRequest {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// Value of a query parameter (no percent-decoding: the simulator only needs plain values).
    pub fn query(&self, key: &str) -> Option<&str> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&').find_map(|kv| match kv.split_once('=') {
            Some((k, v)) if k == key => Some(v),
            None if kv == key => Some(""),
            _ => None,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        crate::wire::header(&self.headers, name)
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The client closed the connection between requests.
    Closed,
    /// Malformed request: answer 400 (or 413, 431) and close.
    Bad(u16, String),
    Io(io::Error),
}

/// What cpp-httplib, llama-server's HTTP library, reads of a head (b11434): a header line of at
/// most this many bytes, CRLF included, and at most [`MAX_LINES`] of them (past either: 400, the
/// connection closed, the body unread); a request line of at most [`MAX_REQUEST_LINE`] bytes
/// (past it: closed without a word).
const MAX_LINE: usize = 8192;
const MAX_LINES: usize = 100;
const MAX_REQUEST_LINE: usize = 32768;

/// Reads the next request; `Err(Closed)` on a clean end of the connection. `w` receives the
/// `100 Continue` a client asking for it (curl, for bodies over 1 KiB) waits for. A head past
/// cpp-httplib's bounds, or one `early` answers from its method and path alone (`Some((status,
/// message))`), is `Bad` before a byte of its body is read, as llama-server's are.
pub(super) fn read_request(
    inb: &mut Inbound<TcpStream>,
    w: &TcpStream,
    early: impl FnOnce(&str, &str) -> Option<(u16, String)>,
) -> Result<HttpRequest, ReadError> {
    let head = match inb.read_head(Instant::now() + PATIENCE) {
        Ok(head) => head,
        Err(HeadError::Closed | HeadError::Timeout) => return Err(ReadError::Closed),
        // Over `MAX_LINES` lines (crossbar's parser stops at the same count) or 64 KiB.
        Err(HeadError::TooLarge) => return Err(ReadError::Bad(400, "head too large".into())),
        Err(HeadError::Bad(what)) => return Err(ReadError::Bad(400, what)),
    };
    if head.method.len() + head.target.len() + 12 > MAX_REQUEST_LINE {
        return Err(ReadError::Closed);
    }
    let lines = head.headers.iter().count();
    let long = (head.headers.iter()).any(|(name, value)| name.len() + value.len() + 4 > MAX_LINE);
    if long || lines > MAX_LINES {
        return Err(ReadError::Bad(400, "invalid headers".into()));
    }
    let path = head.target.split('?').next().unwrap_or("");
    if let Some((status, message)) = early(&head.method, path) {
        return Err(ReadError::Bad(status, message));
    }
    let conn = head.header("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if head.http10 {
        conn.contains("keep-alive")
    } else {
        head.keep_alive
    };
    if head.expect_continue {
        let mut w = w;
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .and_then(|()| w.flush())
            .map_err(ReadError::Io)?;
    }
    let timing = BodyTiming {
        base: PATIENCE,
        min_rate: 1,
    };
    let body = conn::read_body(inb, head.body, MAX_BODY, timing).map_err(|err| match err {
        BodyError::TooLarge => ReadError::Bad(413, "body too large".into()),
        BodyError::Bad(what) => ReadError::Bad(400, what),
        // The blocking read neither charges a budget nor leaves a body for later.
        BodyError::Timeout | BodyError::Gone | BodyError::Busy | BodyError::Later => {
            ReadError::Closed
        }
        BodyError::Io(err) => ReadError::Io(err),
    })?;
    Ok(HttpRequest {
        method: head.method,
        target: head.target,
        headers: (head.headers.iter())
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
        body,
        keep_alive,
    })
}

/// Writes a complete answer with a Content-Length. Like llama-server it announces keep-alive.
pub(super) fn write_full(
    w: &TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let headers = answer_headers(content_type, keep_alive);
    crate::wire::send(Box::new(w), false, false, status, &headers, body)
}

fn answer_headers(content_type: &str, keep_alive: bool) -> Vec<(String, String)> {
    vec![
        ("Server".to_string(), "llama.cpp".to_string()),
        ("Content-Type".to_string(), content_type.to_string()),
        if keep_alive {
            ("Keep-Alive".to_string(), "timeout=5, max=100".to_string())
        } else {
            ("Connection".to_string(), "close".to_string())
        },
    ]
}

/// Writes the head of an answer with `body`'s full Content-Length, but only its first `sent` bytes
/// (`Fault::CutBody`; the caller then closes).
pub(super) fn write_part(
    w: &TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    sent: usize,
    keep_alive: bool,
) -> io::Result<()> {
    let headers = answer_headers(content_type, keep_alive);
    let framing = Framing::Length(body.len() as u64);
    let mut out = BodyWriter::start(Box::new(w), false, status, &headers, framing)?;
    out.write(&body[..sent.min(body.len())])
}

/// An SSE answer in progress: head written, events go out as one chunk each, flushed at once.
#[derive(Debug)]
pub(super) struct EventStream<'a> {
    sock: &'a TcpStream,
    out: BodyWriter<'a>,
}

impl<'a> EventStream<'a> {
    /// Writes the head llama-server sends for streams. Note what it does *not* send: `Connection:
    /// close` — yet the connection is closed after the stream (see llama-server.md).
    pub fn start(sock: &'a TcpStream) -> io::Result<EventStream<'a>> {
        let headers: Vec<(String, String)> = [
            ("Server", "llama.cpp"),
            ("Content-Type", "text/event-stream"),
            ("X-Accel-Buffering", "no"),
            ("Keep-Alive", "timeout=5, max=100"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let out = BodyWriter::start(Box::new(sock), false, 200, &headers, Framing::Chunked)?;
        Ok(EventStream { sock, out })
    }

    /// Sends `data: <payload>\n\n` as one chunk.
    pub fn event(&mut self, payload: &str) -> io::Result<()> {
        self.out.write(format!("data: {payload}\n\n").as_bytes())
    }

    /// Sends `event: <name>\ndata: <payload>\n\n` as one chunk (Messages, Responses).
    pub fn named(&mut self, name: &str, payload: &str) -> io::Result<()> {
        let data = format!("event: {name}\ndata: {payload}\n\n");
        let chunk = format!("{:x}\r\n{data}\r\n", data.len());
        let mut w = self.sock;
        w.write_all(chunk.as_bytes())?;
        w.flush()
    }

    /// Sends the size line of `data: <payload>\n\n`'s chunk and half its bytes (`Fault::CutMidChunk`;
    /// the caller then closes). The fault's own bytes, written raw.
    pub fn half_event(&mut self, payload: &str) -> io::Result<()> {
        let data = format!("data: {payload}\n\n");
        let chunk = format!("{:x}\r\n{}", data.len(), &data[..data.len() / 2]);
        let mut w = self.sock;
        w.write_all(chunk.as_bytes())?;
        w.flush()
    }

    /// Ends the chunked body.
    pub fn finish(&mut self) -> io::Result<()> {
        let mut w = self.sock;
        w.write_all(b"0\r\n\r\n")?;
        w.flush()
    }
}

/// True when the peer has closed its side (what llama-server polls to cancel a task). Any bytes the
/// client sent after its request (pipelining) count as "still there".
pub(super) fn peer_gone(sock: &TcpStream) -> bool {
    conn::peer_gone(sock)
}
