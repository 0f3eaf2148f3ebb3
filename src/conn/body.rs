//! Request bodies: read whole, under a byte limit the caller chooses and a deadline that grows with
//! the body (a base plus the time the bytes take at a minimum rate), so neither a huge declared
//! length nor one byte every 29 s can hold a worker. A declared length over the limit is refused
//! before a byte is read; no allocation is sized by what the client declared.

use std::io;
use std::time::{Duration, Instant};

use super::head::BodyKind;
use super::inbound::{Fill, Inbound, Wire};

/// Longest chunk-size or trailer line.
const MAX_CHUNK_LINE: usize = 4096;
/// Most trailer lines after the last chunk.
const MAX_TRAILERS: usize = 100;

/// How long a body may take: `base` plus its size at `min_rate` bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTiming {
    pub base: Duration,
    pub min_rate: u64,
}

impl BodyTiming {
    fn deadline(&self, start: Instant, bytes: u64) -> Instant {
        let rate = self.min_rate.max(1);
        start + self.base + Duration::from_millis(bytes.saturating_mul(1000) / rate)
    }
}

/// Why a body could not be had.
#[derive(Debug)]
pub enum BodyError {
    /// Over the caller's limit (declared or as sent): 413, and the rest is never read.
    TooLarge,
    /// Malformed chunked framing, or the connection ended inside the body: 400.
    Bad(String),
    /// Not complete by its deadline: 408.
    Timeout,
    Io(io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("body too large"),
            BodyError::Bad(what) => f.write_str(what),
            BodyError::Timeout => f.write_str("body not received in time"),
            BodyError::Io(err) => write!(f, "{err}"),
        }
    }
}

fn from_fill(fill: Fill) -> BodyError {
    match fill {
        Fill::Timeout => BodyError::Timeout,
        Fill::Eof => BodyError::Bad("connection ended inside the body".into()),
        Fill::Failed(err) => BodyError::Io(err),
        Fill::Data => BodyError::Bad("unexpected data".into()),
    }
}

/// Reads a whole body of `kind`, at most `max` bytes.
pub fn read<W: Wire>(
    inb: &mut Inbound<W>,
    kind: BodyKind,
    max: usize,
    timing: BodyTiming,
) -> Result<Vec<u8>, BodyError> {
    let start = Instant::now();
    match kind {
        BodyKind::None => Ok(Vec::new()),
        BodyKind::Length(n) if n > max as u64 => Err(BodyError::TooLarge),
        BodyKind::Length(n) => {
            let n = n as usize;
            let deadline = timing.deadline(start, n as u64);
            let mut body = Vec::with_capacity(n.min(64 << 10));
            while body.len() < n {
                let want = n - body.len();
                inb.take_into(&mut body, want, deadline)
                    .map_err(from_fill)?;
            }
            Ok(body)
        }
        BodyKind::Chunked => chunked(inb, max, |got| timing.deadline(start, got)),
    }
}

/// Decodes `Transfer-Encoding: chunked` strictly: hex sizes (extensions allowed and ignored),
/// CRLF after every line and every chunk, trailers bounded and dropped.
fn chunked<W: Wire>(
    inb: &mut Inbound<W>,
    max: usize,
    deadline: impl Fn(u64) -> Instant,
) -> Result<Vec<u8>, BodyError> {
    let bad = |what: &str| BodyError::Bad(format!("bad chunk: {what}"));
    let line_err = |e: Option<Fill>| e.map_or_else(|| bad("line too long or not CRLF"), from_fill);
    let mut body = Vec::new();
    loop {
        let when = deadline(body.len() as u64);
        let line = inb.line(MAX_CHUNK_LINE, when).map_err(line_err)?;
        let size_text = line.split(|&b| b == b';').next().unwrap_or_default();
        if size_text.is_empty()
            || size_text.len() > 16
            || !size_text.iter().all(u8::is_ascii_hexdigit)
        {
            return Err(bad("size is not hex"));
        }
        let text = std::str::from_utf8(size_text).map_err(|_| bad("size is not hex"))?;
        let size = u64::from_str_radix(text, 16).map_err(|_| bad("size is not hex"))?;
        if size == 0 {
            for _ in 0..=MAX_TRAILERS {
                let when = deadline(body.len() as u64);
                if inb.line(MAX_CHUNK_LINE, when).map_err(line_err)?.is_empty() {
                    return Ok(body);
                }
            }
            return Err(bad("too many trailer lines"));
        }
        if size > (max - body.len()) as u64 {
            return Err(BodyError::TooLarge);
        }
        let end = body.len() + size as usize;
        while body.len() < end {
            let when = deadline(body.len() as u64);
            let want = end - body.len();
            inb.take_into(&mut body, want, when).map_err(from_fill)?;
        }
        let when = deadline(body.len() as u64);
        if !inb.line(0, when).map_err(line_err)?.is_empty() {
            return Err(bad("no CRLF after the chunk's data"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> BodyTiming {
        BodyTiming {
            base: Duration::from_secs(5),
            min_rate: 1,
        }
    }

    fn read_all(bytes: &[u8], kind: BodyKind, max: usize) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
        let mut inb = Inbound::new(io::Cursor::new(bytes.to_vec()));
        let body = read(&mut inb, kind, max, timing())?;
        Ok((body, inb.pending().to_vec()))
    }

    #[test]
    fn chunked_bodies_decode_and_leave_the_next_request() {
        let (body, rest) = read_all(
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET /",
            BodyKind::Chunked,
            100,
        )
        .unwrap();
        assert_eq!(body, b"hello world");
        assert_eq!(rest, b"GET /");
    }

    #[test]
    fn bad_chunks_are_refused() {
        for bytes in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"\r\n",
            b"10000000000000000\r\n",
            b"5\r\nhel",
        ] {
            let got = read_all(bytes, BodyKind::Chunked, 100);
            assert!(matches!(got, Err(BodyError::Bad(_))), "{bytes:?}: {got:?}");
        }
    }

    #[test]
    fn over_the_limit_is_refused_by_declaration_or_by_count() {
        let got = read_all(b"", BodyKind::Length(101), 100);
        assert!(matches!(got, Err(BodyError::TooLarge)), "{got:?}");
        let got = read_all(b"ffffffff\r\n", BodyKind::Chunked, 100);
        assert!(matches!(got, Err(BodyError::TooLarge)), "{got:?}");
        let got = read_all(b"40\r\n", BodyKind::Chunked, 100);
        assert!(
            matches!(got, Err(BodyError::Bad(_))),
            "short, but within: {got:?}"
        );
        let (body, rest) = read_all(b"abcdefGET", BodyKind::Length(6), 100).unwrap();
        assert_eq!(
            (body.as_slice(), rest.as_slice()),
            (&b"abcdef"[..], &b"GET"[..])
        );
    }

    #[test]
    fn the_deadline_grows_with_the_body() {
        let t = BodyTiming {
            base: Duration::from_secs(10),
            min_rate: 1000,
        };
        let now = Instant::now();
        assert_eq!(t.deadline(now, 0), now + Duration::from_secs(10));
        assert_eq!(t.deadline(now, 5000), now + Duration::from_secs(15));
    }
}
