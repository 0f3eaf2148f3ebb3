//! The soak's raw HTTP/1.1 client. It must be able to do what polite clients never do: leave
//! before the head, leave mid-body, stop reading with a tiny receive window, send bytes no parser
//! should accept. Every read has a size bound and a timeout; nothing here panics on an answer.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest silence accepted from crossbar before a request counts as unanswered.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest head or chunk-size line read.
const MAX_LINE: u64 = 64 << 10;
/// Largest body kept (long streams are read, counted and dropped past this).
const MAX_KEPT: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    length: Option<u64>,
    close: bool,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        let h = self
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name));
        h.map(|(_, v)| v.as_str())
    }
}

/// How a body ended.
#[derive(Debug)]
pub enum Body {
    /// Complete per its framing (last chunk, full length, or close for close-delimited bodies).
    Complete(Vec<u8>),
    /// Broken off: a bad chunk line, a short body, a reset.
    Broken,
    /// The client stopped reading after the byte budget it was given.
    Left,
}

/// One client connection, reused while the server keeps it.
#[derive(Debug)]
pub struct Conn {
    r: BufReader<TcpStream>,
    /// Requests already answered on this connection.
    pub used: u32,
    pub idle_since: Instant,
}

impl Conn {
    /// Connects with `READ_TIMEOUT` on reads and writes; `rcvbuf` shrinks the receive window
    /// (set before connecting, so the window is small from the handshake on).
    pub fn open(addr: SocketAddr, rcvbuf: Option<usize>) -> io::Result<Conn> {
        Conn::open_from(addr, rcvbuf, None)
    }

    /// [`Conn::open`] from the local address `from` (another loopback address: another peer).
    pub fn open_from(
        addr: SocketAddr,
        rcvbuf: Option<usize>,
        from: Option<std::net::IpAddr>,
    ) -> io::Result<Conn> {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        if let Some(n) = rcvbuf {
            s.set_recv_buffer_size(n)?;
        }
        if let Some(ip) = from {
            s.bind(&SocketAddr::new(ip, 0).into())?;
        }
        s.connect_timeout(&addr.into(), Duration::from_secs(3))?;
        let s: TcpStream = s.into();
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(READ_TIMEOUT))?;
        s.set_write_timeout(Some(READ_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::new(s),
            used: 0,
            idle_since: Instant::now(),
        })
    }

    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.r.get_mut().write_all(bytes)
    }

    pub fn set_read_timeout(&self, d: Duration) {
        let _ = self.r.get_ref().set_read_timeout(Some(d));
    }

    /// True when the server has already closed (or sent something unasked on) an idle connection.
    pub fn stale(&self) -> bool {
        let s = self.r.get_ref();
        if !self.r.buffer().is_empty() || s.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let stale = !matches!(s.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        let _ = s.set_nonblocking(false);
        stale
    }

    /// Reads the next non-1xx head. `Ok(None)`: the server closed before sending a byte.
    pub fn head(&mut self) -> io::Result<Option<Head>> {
        loop {
            let Some(line) = self.line()? else {
                return Ok(None);
            };
            let status: u16 = line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
            let mut head = Head {
                status,
                headers: Vec::new(),
                chunked: false,
                length: None,
                close: line.starts_with("HTTP/1.0"),
            };
            loop {
                let line = self.line()?.ok_or_else(|| bad("head cut short"))?;
                if line.is_empty() {
                    break;
                }
                let (k, v) = line.split_once(':').ok_or_else(|| bad("bad header line"))?;
                let (k, v) = (k.trim().to_string(), v.trim().to_string());
                match k.to_ascii_lowercase().as_str() {
                    "transfer-encoding" => {
                        head.chunked = v.to_ascii_lowercase().contains("chunked")
                    }
                    "content-length" => head.length = v.parse().ok(),
                    "connection" => head.close |= v.to_ascii_lowercase().contains("close"),
                    _ => {}
                }
                head.headers.push((k, v));
            }
            if !(100..200).contains(&status) {
                return Ok(Some(head));
            }
        }
    }

    /// Reads the body of `head` (to a `HEAD` or not: all callers send POST). Reading stops after
    /// `budget` body bytes when one is given (the client leaves: `Body::Left`).
    pub fn body(&mut self, head: &Head, budget: Option<usize>) -> Body {
        let mut kept = Vec::new();
        let mut seen = 0usize;
        let mut take = |piece: &[u8]| -> bool {
            seen += piece.len();
            if kept.len() < MAX_KEPT {
                kept.extend_from_slice(&piece[..piece.len().min(MAX_KEPT - kept.len())]);
            }
            budget.is_some_and(|b| seen >= b)
        };
        let mut buf = vec![0u8; 16 << 10];
        if head.chunked {
            loop {
                let size = match self.line() {
                    Ok(Some(l)) => l
                        .split(';')
                        .next()
                        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok()),
                    _ => None,
                };
                let Some(mut size) = size else {
                    return Body::Broken;
                };
                if size == 0 {
                    // Trailers end with an empty line.
                    while let Ok(Some(l)) = self.line() {
                        if l.is_empty() {
                            self.used += 1;
                            return Body::Complete(kept);
                        }
                    }
                    return Body::Broken;
                }
                while size > 0 {
                    let want = size.min(buf.len() as u64) as usize;
                    match self.r.read(&mut buf[..want]) {
                        Ok(0) | Err(_) => return Body::Broken,
                        Ok(n) => {
                            size -= n as u64;
                            if take(&buf[..n]) {
                                return Body::Left;
                            }
                        }
                    }
                }
                if !matches!(self.line(), Ok(Some(l)) if l.is_empty()) {
                    return Body::Broken;
                }
            }
        }
        let mut left = head.length.unwrap_or(u64::MAX);
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            match self.r.read(&mut buf[..want]) {
                Ok(0) if head.length.is_none() => return Body::Complete(kept),
                Ok(0) | Err(_) => return Body::Broken,
                Ok(n) => {
                    left -= n as u64;
                    if take(&buf[..n]) {
                        return Body::Left;
                    }
                }
            }
        }
        if !head.close {
            self.used += 1;
        }
        Body::Complete(kept)
    }

    /// Whether the connection can carry another request after `head`'s answer was read whole.
    pub fn reusable(&self, head: &Head) -> bool {
        !head.close && (head.chunked || head.length.is_some())
    }

    /// One CRLF- or LF-terminated line without its terminator; `None` at a clean EOF.
    fn line(&mut self) -> io::Result<Option<String>> {
        let mut raw = Vec::new();
        let n = (&mut self.r).take(MAX_LINE).read_until(b'\n', &mut raw)?;
        if n == 0 {
            return Ok(None);
        }
        if raw.last() != Some(&b'\n') {
            return Err(bad("line too long or cut short"));
        }
        while matches!(raw.last(), Some(b'\n' | b'\r')) {
            raw.pop();
        }
        Ok(Some(String::from_utf8_lossy(&raw).into_owned()))
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The client key every well-behaved soak client sends (crossbar's config names it `soak`).
pub const KEY: &str = "cb-soak-0123456789abcdef0123456789abcdef";
/// The `Authorization` line of [`KEY`], for heads written by hand.
pub const KEY_LINE: &str = "Authorization: Bearer cb-soak-0123456789abcdef0123456789abcdef\r\n";

/// A whole POST request with a JSON body, with [`KEY`] unless `extra` names a key itself.
pub fn post(path: &str, host: &str, extra: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !extra
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        head.push_str(KEY_LINE);
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// One admin call on a fresh connection: `(status, JSON body or Null)`.
pub fn admin(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> io::Result<(u16, serde_json::Value)> {
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut conn = Conn::open(addr, None)?;
    conn.set_read_timeout(Duration::from_secs(10));
    conn.send(req.as_bytes())?;
    let head = conn
        .head()?
        .ok_or_else(|| bad("admin closed without an answer"))?;
    let Body::Complete(bytes) = conn.body(&head, None) else {
        return Err(bad("admin answer broke off"));
    };
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Ok((head.status, json))
}

/// `GET /metrics` as text.
pub fn metrics(addr: SocketAddr) -> io::Result<String> {
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut conn = Conn::open(addr, None)?;
    conn.set_read_timeout(Duration::from_secs(10));
    conn.send(req.as_bytes())?;
    let head = conn.head()?.ok_or_else(|| bad("metrics: no answer"))?;
    match conn.body(&head, None) {
        Body::Complete(b) if head.status == 200 => Ok(String::from_utf8_lossy(&b).into_owned()),
        _ => Err(bad(format!("metrics: status {}", head.status))),
    }
}
