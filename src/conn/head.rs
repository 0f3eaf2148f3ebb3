//! The request head: read from a connection under a byte limit and a deadline, parsed by
//! `httparse`, then checked for framing the way a proxy must (RFC 9112 §6, hyper's h1 server role):
//! one `Content-Length` of digits only, `Transfer-Encoding: chunked` and nothing else, never both.
//! Pure apart from [`Inbound::read_head`]; [`parse`] is what the mutation runner feeds.

use std::time::Instant;

use super::headers::Headers;
use super::inbound::{Fill, Inbound, Wire};

/// Largest request head (request line, headers and the blank line).
pub const MAX_HEAD: usize = 64 << 10;
/// Most header lines in a head.
pub const MAX_HEADERS: usize = 100;

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
}

/// A parsed, checked request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// Path and query, as sent (origin form: starts with `/`).
    pub target: String,
    pub http10: bool,
    /// Names and values as sent; a value with bytes that are not UTF-8 is kept lossily (crossbar
    /// refuses to forward non-ASCII values anyway).
    pub headers: Headers,
    pub body: BodyKind,
    /// The client allows another request on this connection (HTTP/1.1 without `close`).
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before its body.
    pub expect_continue: bool,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// Why no head could be had.
#[derive(Debug)]
pub enum HeadError {
    /// The connection ended (or failed) before the first byte of a head: nothing to answer.
    Closed,
    /// Over [`MAX_HEAD`] bytes or [`MAX_HEADERS`] lines: 431.
    TooLarge,
    /// Malformed or badly framed: 400 with what was wrong.
    Bad(String),
    /// The head was not complete by its deadline: 408.
    Timeout,
}

impl<W: Wire> Inbound<W> {
    /// Reads the next head. Blank lines before a request line are skipped (RFC 9112 §2.2). The
    /// head must be complete by `deadline`; each read waits at most until then.
    pub fn read_head(&mut self, deadline: Instant) -> Result<Head, HeadError> {
        let mut scanned = 0;
        let mut started = false;
        loop {
            if let Some(end) = self.head_ready(&mut scanned)? {
                let head = parse(&self.pending()[..end]);
                self.consume(end);
                return head;
            }
            started |= !self.pending().is_empty();
            match self.fill(deadline, MAX_HEAD) {
                Fill::Data => {}
                Fill::Eof | Fill::Failed(_) if !started => return Err(HeadError::Closed),
                Fill::Eof | Fill::Failed(_) => {
                    return Err(HeadError::Bad("connection ended inside the head".into()))
                }
                Fill::Timeout => return Err(HeadError::Timeout),
            }
        }
    }

    /// Where a whole pending head ends, without reading: blank lines before it are dropped first
    /// (RFC 9112 §2.2). `scanned` is how much of the pending bytes earlier calls searched (so a
    /// head arriving a byte at a time is scanned once); over [`MAX_HEAD`] without its end is
    /// [`HeadError::TooLarge`]. The poller calls it too, to collect heads off the workers.
    pub(super) fn head_ready(&mut self, scanned: &mut usize) -> Result<Option<usize>, HeadError> {
        let before = self.pending().len();
        self.skip_leading_newlines();
        if self.pending().len() != before {
            *scanned = 0;
        }
        let pending = self.pending();
        if let Some(end) = head_end(pending, *scanned) {
            return Ok(Some(end));
        }
        *scanned = pending.len();
        if pending.len() >= MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        Ok(None)
    }
}

/// The end (exclusive) of a head in `bytes`: just past the first empty line. `from` is how much was
/// already searched, so a head arriving a byte at a time is scanned once, not once per byte.
fn head_end(bytes: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    let mut i = start;
    while i < bytes.len() {
        if bytes[i] == b'\n' {
            if bytes.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if bytes.get(i + 1) == Some(&b'\r') && bytes.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// Parses one complete head (up to and including its empty line) and checks its framing.
pub fn parse(bytes: &[u8]) -> Result<Head, HeadError> {
    let bad = |what: &str| Err(HeadError::Bad(what.to_string()));
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(n)) if n == bytes.len() => {}
        Ok(_) => return bad("incomplete head"),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(err) => return Err(HeadError::Bad(format!("malformed head: {err}"))),
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return bad("incomplete request line");
    };
    if !target.starts_with('/') {
        return bad("request target must be a path");
    }
    let mut headers = Headers::with_capacity(req.headers.len(), bytes.len());
    for h in req.headers.iter() {
        headers.push(h.name, crate::wire::text(h.value).trim());
    }
    let mut head = Head {
        method: method.to_string(),
        target: target.to_string(),
        http10: version == 0,
        headers,
        body: BodyKind::None,
        keep_alive: false,
        expect_continue: false,
    };
    // RFC 9112 §3.2: an HTTP/1.1 request carries exactly one Host (nginx: 400 otherwise).
    let hosts = head.headers.all("Host").count();
    match (head.http10, hosts) {
        (false, 0) => return bad("an HTTP/1.1 request needs a Host header"),
        (_, 2..) => return bad("two Host headers"),
        _ => {}
    }
    head.body = framing(&head.headers, head.http10)?;
    let tokens = crate::wire::connection_tokens(head.header("Connection"));
    head.keep_alive = !head.http10 && !tokens.iter().any(|t| t.eq_ignore_ascii_case("close"));
    head.expect_continue = !head.http10
        && head
            .header("Expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    Ok(head)
}

/// The body's framing, strictly: `Transfer-Encoding` must be exactly `chunked` (once, in HTTP/1.1,
/// without a `Content-Length`); every `Content-Length` must be digits only and all must agree.
fn framing(headers: &Headers, http10: bool) -> Result<BodyKind, HeadError> {
    let bad = |what: &str| Err(HeadError::Bad(what.to_string()));
    let mut length: Option<u64> = None;
    for value in headers.all("Content-Length") {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return bad("Content-Length must be digits only");
        }
        // Digits only, so the one failure left is a number past u64: far over any limit.
        let n = value.parse::<u64>().unwrap_or(u64::MAX);
        if length.is_some_and(|l| l != n) {
            return bad("two different Content-Length headers");
        }
        length = Some(n);
    }
    let codings: Vec<&str> = headers.all("Transfer-Encoding").collect();
    match (codings.as_slice(), length) {
        ([], None) => Ok(BodyKind::None),
        ([], Some(n)) => Ok(BodyKind::Length(n)),
        (_, Some(_)) => bad("Content-Length together with Transfer-Encoding"),
        (_, None) if http10 => bad("Transfer-Encoding in an HTTP/1.0 request"),
        ([one], None) if one.eq_ignore_ascii_case("chunked") => Ok(BodyKind::Chunked),
        _ => bad("transfer coding other than chunked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn ok(text: &str) -> Head {
        parse(text.as_bytes()).unwrap_or_else(|e| panic!("{text:?}: {e:?}"))
    }

    #[track_caller]
    fn refused(text: &str, status: u16) {
        match (parse(text.as_bytes()), status) {
            (Err(HeadError::Bad(_)), 400) | (Err(HeadError::TooLarge), 431) => {}
            (got, _) => panic!("{text:?}: expected {status}, got {got:?}"),
        }
    }

    #[test]
    fn a_plain_head_parses_with_its_framing() {
        let h = ok("POST /a/v1/x?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(
            (h.method.as_str(), h.target.as_str()),
            ("POST", "/a/v1/x?q=1")
        );
        assert_eq!(h.body, BodyKind::Length(12));
        assert!(h.keep_alive && !h.http10 && !h.expect_continue);
        let h = ok("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(h.body, BodyKind::Chunked);
        assert!(h.expect_continue);
        let h = ok("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(h.http10 && !h.keep_alive && h.body == BodyKind::None);
        let h = ok("GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n");
        assert!(!h.keep_alive);
        assert_eq!(
            ok("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").body,
            BodyKind::Length(5)
        );
    }

    #[test]
    fn bad_framing_is_refused() {
        for text in [
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x5\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nBad(Name): v\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\nNo colon\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            // Issue 24: one Host, exactly, in HTTP/1.1 (HTTP/1.0 may leave it out).
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n",
        ] {
            refused(text, 400);
        }
        ok("GET / HTTP/1.0\r\n\r\n");
    }

    #[test]
    fn more_than_100_header_lines_is_431() {
        let mut text = "GET / HTTP/1.1\r\nHost: h\r\n".to_string();
        for i in 0..101 {
            text.push_str(&format!("X-{i}: v\r\n"));
        }
        text.push_str("\r\n");
        refused(&text, 431);
    }

    #[test]
    fn a_huge_content_length_is_a_number_not_a_parse_error() {
        let h =
            ok("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000000000000000000000\r\n\r\n");
        assert_eq!(h.body, BodyKind::Length(u64::MAX));
    }

    #[test]
    fn the_end_of_a_head_is_found_at_every_split() {
        let text = b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest";
        for split in 0..text.len() {
            let first = head_end(&text[..split], 0);
            let end = first.or_else(|| head_end(text, split));
            assert_eq!(end, Some(text.len() - 4), "split {split}");
        }
        assert_eq!(head_end(b"GET / HTTP/1.0\n\nx", 0), Some(16));
    }
}
