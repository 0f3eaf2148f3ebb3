//! Writing HTTP answers to a socket: the status line and headers, then the body framed by crossbar
//! itself and flushed after every piece (a buffered writer would hold SSE events back). The
//! connection layer (`conn`) and the simulator both answer through here. It owns framing and hop-by-hop headers; it knows nothing about routes,
//! leases or upstreams. Only chunked and close-delimited bodies can end visibly broken
//! ([`BodyWriter::abort`]); a body with a `Content-Length` cannot, so it is used for bodies crossbar
//! holds whole.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

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
pub fn is_hop_by_hop(name: &str, connection_tokens: &[String]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || connection_tokens
            .iter()
            .any(|t| name.eq_ignore_ascii_case(t))
}

/// The header names listed in a `Connection` header value (`close` and `keep-alive` included).
pub fn connection_tokens(value: Option<&str>) -> Vec<String> {
    value
        .map(|v| {
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default()
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

/// A response being written to one client. Every write is flushed at once.
pub struct BodyWriter<'a> {
    out: Box<dyn Write + Send + 'a>,
    framing: Framing,
    /// Raised on a write error or an abort: the connection must not carry another request.
    broken: Option<&'a AtomicBool>,
    /// The chunk being framed, reused for every chunk.
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
    /// Writes the status line and headers. `headers` must not hold framing headers: they are
    /// derived from `framing`.
    pub fn start(
        out: Box<dyn Write + Send + 'a>,
        http10: bool,
        status: u16,
        headers: &[(String, String)],
        framing: Framing,
    ) -> io::Result<BodyWriter<'a>> {
        let mut writer = BodyWriter {
            out,
            framing,
            broken: None,
            piece: Vec::new(),
        };
        writer.head(http10, status, headers, &[])?;
        Ok(writer)
    }

    /// [`BodyWriter::start`], raising `broken` if any write fails or the body is aborted.
    pub fn start_tracked(
        out: Box<dyn Write + Send + 'a>,
        broken: &'a AtomicBool,
        http10: bool,
        status: u16,
        headers: &[(String, String)],
        framing: Framing,
    ) -> io::Result<BodyWriter<'a>> {
        let mut writer = BodyWriter::start(out, http10, status, headers, framing);
        if let Ok(w) = &mut writer {
            w.broken = Some(broken);
        } else {
            broken.store(true, Ordering::Relaxed);
        }
        writer
    }

    /// Writes the head, and `body` (a whole `Length` body) with it in the same write.
    fn head(
        &mut self,
        http10: bool,
        status: u16,
        headers: &[(String, String)],
        body: &[u8],
    ) -> io::Result<()> {
        let framing = self.framing;
        let mut head = Vec::with_capacity(256 + body.len());
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        write!(head, "{version} {status} {}\r\n", reason(status))?;
        for (name, value) in headers {
            write!(head, "{name}: {value}\r\n")?;
        }
        match framing {
            Framing::Length(n) => write!(head, "Content-Length: {n}\r\n")?,
            Framing::Chunked => head.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
            Framing::UntilClose => head.extend_from_slice(b"Connection: close\r\n"),
            Framing::Empty => {}
        }
        head.extend_from_slice(b"\r\n");
        head.extend_from_slice(body);
        // Sent at once, before a long prefill. Accepted sockets have Nagle off (see `conn`), so
        // this small write and the body's do not wait on each other's ACKs.
        let sent = self.out.write_all(&head).and_then(|()| self.out.flush());
        self.track(sent)
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

    /// Sends one piece of body and flushes it.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let result = self.write_piece(data);
        self.track(result)
    }

    fn write_piece(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() || self.framing == Framing::Empty {
            return Ok(());
        }
        match self.framing {
            Framing::Chunked => {
                // One write per chunk (size line, data, CRLF), built in a buffer kept between
                // chunks: no allocation per piece once it has grown to the largest read.
                self.piece.clear();
                write!(self.piece, "{:x}\r\n", data.len())?;
                self.piece.extend_from_slice(data);
                self.piece.extend_from_slice(b"\r\n");
                self.out.write_all(&self.piece)?;
            }
            _ => self.out.write_all(data)?,
        }
        self.out.flush()
    }

    /// Ends the body cleanly (the last chunk for chunked framing).
    pub fn finish(mut self) -> io::Result<()> {
        let mut end = || {
            if self.framing == Framing::Chunked {
                self.out.write_all(b"0\r\n\r\n")?;
            }
            self.out.flush()
        };
        let result = end();
        self.track(result)
    }

    /// Ends the body so that the client cannot mistake it for a complete answer: a chunked body gets
    /// a malformed chunk line instead of the last chunk, which every HTTP client reports as an error.
    /// A close-delimited body ends with the connection, closed when the writer is dropped here (the
    /// best HTTP/1.0 allows: the cut shows as truncated JSON or a stream without its last event).
    /// A `Length` body cannot be marked; see [`Framing::Length`].
    pub fn abort(mut self) {
        self.mark_broken();
        if self.framing == Framing::Chunked {
            // Not hex: the client's chunk parser fails and it drops the connection.
            let _ = self
                .out
                .write_all(b"!crossbar: upstream failed mid-body\r\n\r\n");
        }
        let _ = self.out.flush();
    }
}

/// Sends a whole response with a fixed body (none when `head_only`), head and body in one write.
pub fn send<'a>(
    out: Box<dyn Write + Send + 'a>,
    http10: bool,
    head_only: bool,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> io::Result<()> {
    send_tracked(out, None, http10, head_only, status, headers, body)
}

/// [`send`], raising `broken` if the write fails.
pub fn send_tracked<'a>(
    out: Box<dyn Write + Send + 'a>,
    broken: Option<&'a AtomicBool>,
    http10: bool,
    head_only: bool,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> io::Result<()> {
    let framing = if head_only {
        Framing::Empty
    } else {
        Framing::Length(body.len() as u64)
    };
    let mut writer = BodyWriter {
        out,
        framing,
        broken,
        piece: Vec::new(),
    };
    let body = if head_only { &[][..] } else { body };
    writer.head(http10, status, headers, body)
}

/// The standard reason phrase, or a neutral one for codes without a common phrase.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer whose bytes the test can read back after it was moved into a `BodyWriter`.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn chunked_body_frames_each_write_and_ends_with_the_last_chunk() {
        let sink = Sink::default();
        let hs = headers(&[("Content-Type", "text/event-stream")]);
        let mut w =
            BodyWriter::start(Box::new(sink.clone()), false, 200, &hs, Framing::Chunked).unwrap();
        w.write(b"data: 1\n\n").unwrap();
        assert!(
            sink.text().ends_with("9\r\ndata: 1\n\n\r\n"),
            "{}",
            sink.text()
        );
        w.write(b"").unwrap();
        w.write(b"data: [DONE]\n\n").unwrap();
        w.finish().unwrap();
        assert_eq!(
            sink.text(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
             9\r\ndata: 1\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        );
    }

    #[test]
    fn aborted_chunked_body_never_ends_with_the_last_chunk() {
        let sink = Sink::default();
        let mut w =
            BodyWriter::start(Box::new(sink.clone()), false, 200, &[], Framing::Chunked).unwrap();
        w.write(b"data: 1\n\n").unwrap();
        w.abort();
        assert!(!sink.text().contains("0\r\n\r\n"), "{}", sink.text());
        assert!(sink
            .text()
            .ends_with("!crossbar: upstream failed mid-body\r\n\r\n"));
    }

    #[test]
    fn fixed_body_carries_its_length_and_head_only_sends_none() {
        let sink = Sink::default();
        send(Box::new(sink.clone()), false, false, 404, &[], b"{}").unwrap();
        assert_eq!(
            sink.text(),
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"
        );
        let sink = Sink::default();
        send(Box::new(sink.clone()), true, true, 200, &[], b"{}").unwrap();
        assert_eq!(sink.text(), "HTTP/1.0 200 OK\r\n\r\n");
    }

    #[test]
    fn hop_by_hop_headers_include_those_named_by_connection() {
        let tokens = connection_tokens(Some("close, X-Private"));
        assert_eq!(tokens, ["close", "x-private"]);
        for name in [
            "Connection",
            "Keep-Alive",
            "Transfer-Encoding",
            "TE",
            "Upgrade",
            "X-Private",
        ] {
            assert!(is_hop_by_hop(name, &tokens), "{name}");
        }
        for name in ["Content-Type", "X-Accel-Buffering", "Authorization"] {
            assert!(!is_hop_by_hop(name, &tokens), "{name}");
        }
    }
}
