//! Request bodies, decoded as their bytes arrive: [`Decoder`] takes what is pending on a
//! connection (a length, or chunked framing checked strictly) and says when the body is whole, so
//! the same code serves a worker that waits a moment and the poller that reads a slow body off the
//! workers (`awaited`). [`Pace`] is a body's deadline: so many bytes per `client_body_timeout`,
//! never the size the client declared (issue 24), so a body that keeps coming is never cut and one
//! that stalls is 408 one window later, whatever it declared. A declared length over the limit is
//! refused before a byte is read; no allocation is sized by what the client declared.

use std::io;
use std::time::{Duration, Instant};

use super::head::BodyKind;
use super::inbound::{Fill, Inbound, Wire, READ_PIECE};

/// Longest chunk-size or trailer line.
const MAX_CHUNK_LINE: usize = 4096;
/// Most trailer lines after the last chunk.
const MAX_TRAILERS: usize = 100;

/// How fast a body must come: at least `min_rate` bytes per second, judged over every window of
/// `base` (`client_body_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTiming {
    pub base: Duration,
    pub min_rate: u64,
}

/// Why a body could not be had.
#[derive(Debug)]
pub enum BodyError {
    /// Over the caller's limit (declared or as sent): 413, and the rest is never read.
    TooLarge,
    /// Malformed chunked framing: 400.
    Bad(String),
    /// The client closed its connection inside the body: it left (499).
    Gone,
    /// A window of `client_body_timeout` passed without its share of the body: 408.
    Timeout,
    /// The bodies still coming already hold `client_body_buffer_mib`: 503 busy.
    Busy,
    /// Not whole yet: the handler returns at once, the poller reads the rest off the workers and
    /// the handler is called again with the whole body (`Request::read_body`).
    Later,
    Io(io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("body too large"),
            BodyError::Bad(what) => f.write_str(what),
            BodyError::Timeout => f.write_str("body not received in time"),
            BodyError::Gone => f.write_str("the client closed its connection inside the body"),
            BodyError::Busy => f.write_str("too many request bodies being received"),
            BodyError::Later => f.write_str("body still coming"),
            BodyError::Io(err) => write!(f, "{err}"),
        }
    }
}

pub(super) fn from_fill(fill: Fill) -> BodyError {
    match fill {
        Fill::Timeout => BodyError::Timeout,
        Fill::Eof => BodyError::Gone,
        Fill::Failed(err) => BodyError::Io(err),
        Fill::Data => BodyError::Bad("unexpected data".into()),
    }
}

/// Reads a whole body of `kind`, at most `max` bytes, waiting on the wire as long as the body
/// keeps its pace (the simulator's and the mutation runner's way; the listeners' workers wait
/// only a moment: `Request::read_body`).
pub fn read<W: Wire>(
    inb: &mut Inbound<W>,
    kind: BodyKind,
    max: usize,
    timing: BodyTiming,
) -> Result<Vec<u8>, BodyError> {
    let mut decoder = Decoder::new(kind, max)?;
    let mut pace = Pace::new(timing, Instant::now(), kind);
    loop {
        if decoder.feed(inb)? {
            return Ok(decoder.into_body());
        }
        let by = pace.by(Instant::now(), decoder.got())?;
        match inb.fill(by, READ_PIECE) {
            Fill::Data | Fill::Timeout => {}
            other => return Err(from_fill(other)),
        }
    }
}

/// A body's deadline, judged by its progress: every window of `client_body_timeout` must bring
/// `client_body_min_rate` × the window's bytes (or the rest of a declared length). A window that
/// does starts the next one at once.
#[derive(Debug)]
pub(super) struct Pace {
    window: Duration,
    per_window: u64,
    declared: Option<u64>,
    /// The current window's start, and the bytes the body had then.
    start: Instant,
    at_start: u64,
}

impl Pace {
    pub(super) fn new(timing: BodyTiming, now: Instant, kind: BodyKind) -> Pace {
        let per_window = u128::from(timing.min_rate) * timing.base.as_millis() / 1000;
        Pace {
            window: timing.base,
            per_window: u64::try_from(per_window).unwrap_or(u64::MAX).max(1),
            declared: match kind {
                BodyKind::Length(n) => Some(n),
                BodyKind::None | BodyKind::Chunked => None,
            },
            start: now,
            at_start: 0,
        }
    }

    /// Until when the body, `got` bytes of it in at `now`, may take to make its current window's
    /// progress; `Timeout` once a window passed without it.
    pub(super) fn by(&mut self, now: Instant, got: u64) -> Result<Instant, BodyError> {
        let left = self
            .declared
            .map_or(u64::MAX, |n| n.saturating_sub(self.at_start));
        let need = self.per_window.min(left).max(1);
        if got.saturating_sub(self.at_start) >= need {
            (self.start, self.at_start) = (now, got);
        } else if now >= self.start + self.window {
            return Err(BodyError::Timeout);
        }
        Ok(self.start + self.window)
    }
}

/// Where a chunked body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, so many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: so many trailer lines read (dropped).
    Trailers(usize),
}

/// A body decoded from what has arrived, a piece at a time: bytes after its end stay pending for
/// the next request.
#[derive(Debug)]
pub(super) struct Decoder {
    kind: BodyKind,
    max: usize,
    body: Vec<u8>,
    chunked: Chunked,
}

impl Decoder {
    /// `TooLarge` when the declared length is over `max`, before a byte is read.
    pub(super) fn new(kind: BodyKind, max: usize) -> Result<Decoder, BodyError> {
        let first = match kind {
            BodyKind::Length(n) if n > max as u64 => return Err(BodyError::TooLarge),
            BodyKind::Length(n) => (n as usize).min(64 << 10),
            BodyKind::None | BodyKind::Chunked => 0,
        };
        Ok(Decoder {
            kind,
            max,
            body: Vec::with_capacity(first),
            chunked: Chunked::Size,
        })
    }

    /// Body bytes decoded so far.
    pub(super) fn got(&self) -> u64 {
        self.body.len() as u64
    }

    pub(super) fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// Takes what is pending on `inb` into the body; true once the body is whole.
    pub(super) fn feed<W: Wire>(&mut self, inb: &mut Inbound<W>) -> Result<bool, BodyError> {
        match self.kind {
            BodyKind::None => Ok(true),
            BodyKind::Length(n) => {
                let want = n as usize - self.body.len();
                let k = want.min(inb.pending().len());
                self.body.extend_from_slice(&inb.pending()[..k]);
                inb.consume(k);
                Ok(self.body.len() as u64 == n)
            }
            BodyKind::Chunked => self.chunks(inb),
        }
    }

    /// Decodes `Transfer-Encoding: chunked` strictly: hex sizes (extensions allowed and ignored),
    /// CRLF after every line and every chunk, trailers bounded and dropped.
    fn chunks<W: Wire>(&mut self, inb: &mut Inbound<W>) -> Result<bool, BodyError> {
        loop {
            match self.chunked {
                Chunked::Size => {
                    let Some((len, used)) = line(inb.pending(), MAX_CHUNK_LINE)? else {
                        return Ok(false);
                    };
                    let size = chunk_size(&inb.pending()[..len])?;
                    inb.consume(used);
                    if size > (self.max - self.body.len()) as u64 {
                        return Err(BodyError::TooLarge);
                    }
                    self.chunked = match size {
                        0 => Chunked::Trailers(0),
                        n => Chunked::Data(n),
                    };
                }
                Chunked::Data(left) => {
                    let k = (left as usize).min(inb.pending().len());
                    if k == 0 {
                        return Ok(false);
                    }
                    self.body.extend_from_slice(&inb.pending()[..k]);
                    inb.consume(k);
                    self.chunked = match left - k as u64 {
                        0 => Chunked::DataEnd,
                        n => Chunked::Data(n),
                    };
                }
                Chunked::DataEnd => match inb.pending() {
                    [b'\r', b'\n', ..] => {
                        inb.consume(2);
                        self.chunked = Chunked::Size;
                    }
                    [] | [b'\r'] => return Ok(false),
                    _ => return Err(bad("no CRLF after the chunk's data")),
                },
                Chunked::Trailers(n) => {
                    let Some((len, used)) = line(inb.pending(), MAX_CHUNK_LINE)? else {
                        return Ok(false);
                    };
                    inb.consume(used);
                    if len == 0 {
                        return Ok(true);
                    }
                    if n == MAX_TRAILERS {
                        return Err(bad("too many trailer lines"));
                    }
                    self.chunked = Chunked::Trailers(n + 1);
                }
            }
        }
    }
}

fn bad(what: &str) -> BodyError {
    BodyError::Bad(format!("bad chunk: {what}"))
}

/// The line at the start of `pending`: its length without CRLF and the bytes it takes with it, or
/// `None` while it has not all arrived. Over `max` bytes, or ending in a bare LF, is refused.
fn line(pending: &[u8], max: usize) -> Result<Option<(usize, usize)>, BodyError> {
    let look = &pending[..pending.len().min(max + 2)];
    match look.iter().position(|&b| b == b'\n') {
        Some(i) if i == 0 || look[i - 1] != b'\r' => Err(bad("line too long or not CRLF")),
        Some(i) => Ok(Some((i - 1, i + 1))),
        None if pending.len() > max + 1 => Err(bad("line too long or not CRLF")),
        None => Ok(None),
    }
}

/// A chunk-size line's size: hex digits, an extension after `;` ignored.
fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let text = line.split(|&b| b == b';').next().unwrap_or_default();
    if text.is_empty() || text.len() > 16 || !text.iter().all(u8::is_ascii_hexdigit) {
        return Err(bad("size is not hex"));
    }
    let text = std::str::from_utf8(text).map_err(|_| bad("size is not hex"))?;
    u64::from_str_radix(text, 16).map_err(|_| bad("size is not hex"))
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
        ] {
            let got = read_all(bytes, BodyKind::Chunked, 100);
            assert!(matches!(got, Err(BodyError::Bad(_))), "{bytes:?}: {got:?}");
        }
        // Cut off: the client left inside its body.
        let got = read_all(b"5\r\nhel", BodyKind::Chunked, 100);
        assert!(matches!(got, Err(BodyError::Gone)), "{got:?}");
    }

    #[test]
    fn over_the_limit_is_refused_by_declaration_or_by_count() {
        let got = read_all(b"", BodyKind::Length(101), 100);
        assert!(matches!(got, Err(BodyError::TooLarge)), "{got:?}");
        let got = read_all(b"ffffffff\r\n", BodyKind::Chunked, 100);
        assert!(matches!(got, Err(BodyError::TooLarge)), "{got:?}");
        let got = read_all(b"40\r\n", BodyKind::Chunked, 100);
        assert!(
            matches!(got, Err(BodyError::Gone)),
            "short, but within: {got:?}"
        );
        let (body, rest) = read_all(b"abcdefGET", BodyKind::Length(6), 100).unwrap();
        assert_eq!(
            (body.as_slice(), rest.as_slice()),
            (&b"abcdef"[..], &b"GET"[..])
        );
    }

    #[test]
    fn a_body_decodes_the_same_however_its_bytes_arrive() {
        let sent = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET /";
        for piece in [1, 2, 3, 7, sent.len()] {
            let mut inb = Inbound::new(io::Cursor::new(Vec::new()));
            let mut decoder = Decoder::new(BodyKind::Chunked, 100).unwrap();
            let (mut whole, mut pushed) = (false, 0);
            for bytes in sent.chunks(piece) {
                inb.push(bytes);
                pushed += bytes.len();
                if !whole {
                    whole = decoder.feed(&mut inb).unwrap();
                    // Whole exactly when the blank line after the trailers is in.
                    assert_eq!(whole, pushed >= sent.len() - 5, "pieces of {piece}");
                }
            }
            assert!(whole, "pieces of {piece}");
            assert_eq!(decoder.into_body(), b"hello world");
            assert_eq!(inb.pending(), b"GET /", "pieces of {piece}");
        }
    }

    #[test]
    fn the_pace_asks_for_bytes_per_window_never_the_declared_size() {
        let t = BodyTiming {
            base: Duration::from_secs(10),
            min_rate: 1000,
        };
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        // Declared 16 MiB and silent: 408 one window later, not after 16 MiB at the rate.
        let mut silent = Pace::new(t, start, BodyKind::Length(16 << 20));
        assert_eq!(silent.by(at(9), 0).unwrap(), at(10));
        assert!(matches!(silent.by(at(10), 0), Err(BodyError::Timeout)));
        // 10,000 bytes a window keeps a body going as long as it keeps coming.
        let mut steady = Pace::new(t, start, BodyKind::Chunked);
        for window in 1..=30 {
            let got = window * 10_000;
            assert_eq!(
                steady.by(at(window * 10 - 1), got).unwrap(),
                at(window * 10 + 9)
            );
        }
        // Short of it by the window's end is 408, however much came before.
        assert!(matches!(
            steady.by(at(309), 309_999),
            Err(BodyError::Timeout)
        ));
        // The rest of a declared length is all a window needs.
        let mut small = Pace::new(t, start, BodyKind::Length(20));
        assert_eq!(small.by(at(5), 20).unwrap(), at(15));
    }
}
