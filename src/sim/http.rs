//! The simulator's own minimal HTTP/1.1 wire layer: read one request (Content-Length or chunked body)
//! from a connection, write a JSON answer, or write an SSE stream with hand-made chunked framing and
//! one flush per event.
//!
//! It exists instead of tiny_http because the fake must close connections the way llama-server does:
//! after every streamed answer (the connection-reuse trap), mid-stream (`Fault::DieMidStream`) and
//! all at once (`Fault::Refuse`) — tiny_http keeps the socket inside its connection loop and its
//! threads cannot be joined. This module knows nothing about llama-server: no JSON, no routing.

use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;

/// Largest request body accepted (the gateway itself caps bodies at 16 MiB).
const MAX_BODY: usize = 64 << 20;
/// Longest request line or header line.
const MAX_LINE: usize = 64 << 10;
const MAX_HEADERS: usize = 128;

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
    /// Malformed request: answer 400 (or 413) and close.
    Bad(u16, &'static str),
    Io(io::Error),
}

/// Reads the next request; `Err(Closed)` on a clean end of the connection. `w` receives the
/// `100 Continue` a client asking for it (curl, for bodies over 1 KiB) waits for.
pub(super) fn read_request<R: BufRead>(r: &mut R, w: &TcpStream) -> Result<HttpRequest, ReadError> {
    let line = match read_line(r)? {
        Some(l) => l,
        None => return Err(ReadError::Closed),
    };
    let mut parts = line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if !m.is_empty() && t.starts_with('/') => (m, t, v),
        _ => return Err(ReadError::Bad(400, "bad request line")),
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(ReadError::Bad(400, "unsupported HTTP version")),
    };
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?.ok_or(ReadError::Closed)?;
        if line.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(ReadError::Bad(431, "too many headers"));
        }
        let (k, v) = line
            .split_once(':')
            .ok_or(ReadError::Bad(400, "bad header line"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let mut req = HttpRequest {
        method: method.to_string(),
        target: target.to_string(),
        headers,
        body: Vec::new(),
        keep_alive: false,
    };
    let conn = req.header("connection").unwrap_or("").to_ascii_lowercase();
    req.keep_alive = if http10 {
        conn.contains("keep-alive")
    } else {
        !conn.contains("close")
    };
    let expect = req.header("expect").unwrap_or("");
    if expect.eq_ignore_ascii_case("100-continue") && !http10 {
        let mut w = w;
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .and_then(|()| w.flush())
            .map_err(ReadError::Io)?;
    }
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        req.body = read_chunked(r)?;
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| ReadError::Bad(400, "bad content-length"))?;
        if len > MAX_BODY {
            return Err(ReadError::Bad(413, "body too large"));
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).map_err(ReadError::Io)?;
        req.body = body;
    }
    Ok(req)
}

fn read_chunked<R: BufRead>(r: &mut R) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?.ok_or(ReadError::Closed)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| ReadError::Bad(400, "bad chunk"))?;
        if body.len() + size > MAX_BODY {
            return Err(ReadError::Bad(413, "body too large"));
        }
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(r)?.ok_or(ReadError::Closed)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).map_err(ReadError::Io)?;
        let mut crlf = [0; 2];
        r.read_exact(&mut crlf).map_err(ReadError::Io)?;
    }
}

/// One CRLF- (or LF-) terminated line without its terminator; `None` at end of stream before any byte.
fn read_line<R: BufRead>(r: &mut R) -> Result<Option<String>, ReadError> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 2)
        .read_until(b'\n', &mut buf)
        .map_err(ReadError::Io)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(if n > MAX_LINE {
            ReadError::Bad(431, "line too long")
        } else {
            ReadError::Closed
        });
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| ReadError::Bad(400, "header is not UTF-8"))
}

pub(super) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes a complete answer with a Content-Length. Like llama-server it announces keep-alive.
pub(super) fn write_full(
    w: &TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    write_part(w, status, content_type, body, body.len(), keep_alive)
}

/// Writes the head of an answer with `body`'s full Content-Length, but only its first `sent` bytes
/// (`Fault::CutBody`; the caller then closes).
pub(super) fn write_part(
    mut w: &TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    sent: usize,
    keep_alive: bool,
) -> io::Result<()> {
    let conn = if keep_alive {
        "Keep-Alive: timeout=5, max=100"
    } else {
        "Connection: close"
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\nServer: llama.cpp\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\n{conn}\r\n\r\n",
        reason(status),
        body.len()
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(&body[..sent.min(body.len())]);
    w.write_all(&out)?;
    w.flush()
}

/// An SSE answer in progress: head written, events go out as one chunk each, flushed at once.
#[derive(Debug)]
pub(super) struct EventStream<'a> {
    sock: &'a TcpStream,
}

impl<'a> EventStream<'a> {
    /// Writes the head llama-server sends for streams. Note what it does *not* send: `Connection:
    /// close` — yet the connection is closed after the stream (see llama-server.md).
    pub fn start(sock: &'a TcpStream) -> io::Result<EventStream<'a>> {
        let head = "HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\n\
                    Transfer-Encoding: chunked\r\nX-Accel-Buffering: no\r\n\
                    Keep-Alive: timeout=5, max=100\r\n\r\n";
        let mut w = sock;
        w.write_all(head.as_bytes())?;
        w.flush()?;
        Ok(EventStream { sock })
    }

    /// Sends `data: <payload>\n\n` as one chunk.
    pub fn event(&mut self, payload: &str) -> io::Result<()> {
        let data = format!("data: {payload}\n\n");
        let chunk = format!("{:x}\r\n{data}\r\n", data.len());
        let mut w = self.sock;
        w.write_all(chunk.as_bytes())?;
        w.flush()
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
    /// the caller then closes).
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
    if sock.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let gone = match sock.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    let restored = sock.set_nonblocking(false).is_ok();
    gone || !restored
}
