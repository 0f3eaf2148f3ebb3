//! The read side of a connection: one bounded buffer of bytes received but not yet consumed, filled
//! by reads that never wait past a deadline. Heads and bodies are parsed out of it (`head`, `body`);
//! bytes after a request (a pipelined next one) stay for the next parse.
//!
//! [`Wire`] is what a connection must offer: a `TcpStream`, or in the mutation runner and unit tests
//! an in-memory source, so the parsers under test are exactly the ones serving sockets.

use std::io::{self, ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes asked of the socket per read.
pub(super) const READ_PIECE: usize = 16 << 10;
/// A buffer grown past this (a pipelined burst, a long head) is let go once it is empty.
const KEEP: usize = 64 << 10;

/// A byte source whose reads can be bounded in time.
pub trait Wire: Read {
    /// Bounds the next reads to `timeout` (never zero).
    fn read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl Wire for TcpStream {
    fn read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(timeout))
    }
}

impl Wire for io::Cursor<Vec<u8>> {
    fn read_timeout(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// What one [`Inbound::fill`] got.
#[derive(Debug)]
pub enum Fill {
    /// At least one new byte is pending.
    Data,
    /// The peer closed its side.
    Eof,
    /// The deadline passed first.
    Timeout,
    Failed(io::Error),
}

/// A connection's read side: the wire and the bytes read from it but not yet consumed.
#[derive(Debug)]
pub struct Inbound<W> {
    wire: W,
    /// `buf[..end]` was read: `buf[..pos]` consumed, `buf[pos..end]` pending. `buf[end..]` is room
    /// for the next read, zeroed once when the buffer grew to it, not per read.
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// The read timeout last set on the wire (nothing else sets one).
    timeout: Option<Duration>,
}

impl<W: Wire> Inbound<W> {
    pub fn new(wire: W) -> Inbound<W> {
        Inbound {
            wire,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            timeout: None,
        }
    }

    pub fn wire(&self) -> &W {
        &self.wire
    }

    /// The wire back; pending bytes are dropped.
    pub fn into_wire(self) -> W {
        self.wire
    }

    /// Bytes received and not consumed yet.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
            if self.buf.len() > KEEP {
                self.buf = Vec::new();
            }
        }
    }

    /// Bytes as if they had been read, for tests of the parsers.
    #[cfg(test)]
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.truncate(self.end);
        self.buf.extend_from_slice(bytes);
        self.end = self.buf.len();
    }

    /// One read into the room after the pending bytes (moved to the front first): at most
    /// [`READ_PIECE`], and never more than `cap` pending bytes plus one read.
    fn read_once(&mut self, cap: usize) -> io::Result<usize> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let room = READ_PIECE.min(cap.saturating_sub(self.end).max(1));
        if self.buf.len() < self.end + room {
            self.buf.resize(self.end + room, 0);
        }
        let n = self.wire.read(&mut self.buf[self.end..self.end + room])?;
        self.end += n;
        Ok(n)
    }

    /// Drops empty lines before a request line (a client may send a CRLF after a body).
    pub fn skip_leading_newlines(&mut self) {
        let n = self
            .pending()
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        self.consume(n);
    }

    /// Reads once more into the buffer, waiting at most until `deadline`; the buffer never holds
    /// more than `cap` pending bytes plus one read.
    pub fn fill(&mut self, deadline: Instant, cap: usize) -> Fill {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Fill::Timeout;
            }
            // The timeout already set is kept when it ends no later than the deadline and at
            // most an eighth before it: one system call fewer per request, and a read that
            // returns early only loops.
            let kept = self
                .timeout
                .is_some_and(|t| t <= left && t >= left - left / 8);
            if !kept {
                if let Err(err) = self.wire.read_timeout(left) {
                    return Fill::Failed(err);
                }
                self.timeout = Some(left);
            }
            match self.read_once(cap) {
                Ok(0) => return Fill::Eof,
                Ok(_) => return Fill::Data,
                Err(err) if err.kind() == ErrorKind::Interrupted => {}
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return Fill::Timeout;
                    }
                }
                Err(err) => return Fill::Failed(err),
            }
        }
    }

    /// One read on a non-blocking wire: `Timeout` when nothing was waiting. Same bound as
    /// [`Inbound::fill`].
    pub fn fill_now(&mut self, cap: usize) -> Fill {
        loop {
            return match self.read_once(cap) {
                Ok(0) => Fill::Eof,
                Ok(_) => Fill::Data,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    Fill::Timeout
                }
                Err(err) => Fill::Failed(err),
            };
        }
    }
}
