//! An answer's end sent by another thread (issue 26): the last bytes of a body wait for the
//! request's accounting row, and whoever commits that row sends them ([`Tail::send`]), so the
//! worker does not sleep on the commit and wake again only to write a few bytes: it goes straight
//! to waiting for the connection's next request. The row is still in the db before the client has
//! the answer's last byte (seed 001).
//!
//! The committer never blocks on a client: it sends what the socket takes at once, and leaves
//! the rest (a client that reads slowly) to the connection's worker, which finishes it under
//! `client_write_timeout` once it looks ([`Tail::settle`]). The worker settles the tail before the
//! connection carries anything else: the next answer, a refusal, a shutdown.

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::deadline::Deadlined;

/// Longest a worker waits for the committer before it sends the end itself: the store's own
/// bound on a commit (a hung disk), after which the answer went out without its row before too.
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// Flags of the committer's send: never wait, never raise `SIGPIPE`.
const NOW: libc::c_int = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;

/// One answer's end, held until its row is committed.
#[derive(Debug)]
pub struct Tail {
    /// A second handle on the client's socket, for the committer's thread; without one the worker
    /// sends the end itself.
    sock: Option<Arc<TcpStream>>,
    state: Mutex<State>,
    settled: Condvar,
    /// The connection's `client_write_timeout`, for what the worker writes.
    write_timeout: Duration,
    /// When the worker stops waiting for the committer.
    wait_until: Instant,
}

#[derive(Debug)]
enum State {
    /// Waiting for the row's commit.
    Held(Vec<u8>),
    /// All of it is in the socket.
    Sent,
    /// Bytes for the worker to write (the socket took the rest, or there is no second handle).
    Rest(Vec<u8>),
    /// The client's socket refused it: the connection is done.
    Failed,
}

impl Tail {
    pub(super) fn new(end: Vec<u8>, sock: Option<Arc<TcpStream>>, write_timeout: Duration) -> Tail {
        Tail::waiting(end, sock, write_timeout, COMMIT_WAIT)
    }

    fn waiting(
        end: Vec<u8>,
        sock: Option<Arc<TcpStream>>,
        write_timeout: Duration,
        commit_wait: Duration,
    ) -> Tail {
        Tail {
            sock,
            state: Mutex::new(State::Held(end)),
            settled: Condvar::new(),
            write_timeout,
            wait_until: Instant::now() + commit_wait,
        }
    }

    /// Sends the end without blocking, on the committer's thread: once, after the row's commit
    /// (whatever its outcome: a row the store lost does not hold back the answer). The tail's own
    /// lock is held across the `send`, which cannot wait on the client (`MSG_DONTWAIT`): only this
    /// request's worker ever takes it besides, and it finds the end either held or settled.
    pub fn send(&self) {
        let mut state = self.state.lock();
        *state = match std::mem::replace(&mut *state, State::Sent) {
            State::Held(end) => match &self.sock {
                Some(sock) => send_now(sock, &end),
                None => State::Rest(end),
            },
            settled => settled,
        };
        drop(state);
        self.settled.notify_one();
    }

    /// The worker's look, without waiting: `Some(true)` once the whole end is out (writing what
    /// the committer left, under the write timeout), `Some(false)` when the client's socket failed,
    /// `None` while the row is not yet committed. Past [`COMMIT_WAIT`] the worker sends the end
    /// itself, as a waiter on a stuck commit answered before: the client is not kept waiting for
    /// a disk.
    pub(super) fn try_settle(&self, sock: &TcpStream) -> Option<bool> {
        let mut state = self.state.lock();
        match std::mem::replace(&mut *state, State::Failed) {
            State::Held(end) if Instant::now() >= self.wait_until => {
                drop(state);
                self.finish(sock, &end)
            }
            held @ State::Held(_) => {
                *state = held;
                None
            }
            State::Sent => {
                *state = State::Sent;
                Some(true)
            }
            State::Failed => Some(false),
            State::Rest(rest) => {
                drop(state);
                self.finish(sock, &rest)
            }
        }
    }

    /// The worker writes `bytes` (the state stands at `Failed` meanwhile: only the worker
    /// settles, and the committer sends nothing unless the end is held).
    fn finish(&self, sock: &TcpStream, bytes: &[u8]) -> Option<bool> {
        let sent = Deadlined::new(sock, self.write_timeout).write_all(bytes);
        *self.state.lock() = if sent.is_ok() {
            State::Sent
        } else {
            State::Failed
        };
        Some(sent.is_ok())
    }

    /// Waits for the committer (at most until [`COMMIT_WAIT`] after the end was held, then sends
    /// it itself) and finishes what it left: whether the whole end went out.
    pub(super) fn settle(&self, sock: &TcpStream) -> bool {
        let mut state = self.state.lock();
        while matches!(*state, State::Held(_)) {
            let timed_out = self
                .settled
                .wait_until(&mut state, self.wait_until)
                .timed_out();
            if let (true, State::Held(end)) = (timed_out, &mut *state) {
                *state = State::Rest(std::mem::take(end));
            }
        }
        drop(state);
        self.try_settle(sock).unwrap_or(false)
    }
}

/// What one non-blocking pass over `end` leaves.
fn send_now(sock: &TcpStream, end: &[u8]) -> State {
    let sock = socket2::SockRef::from(sock);
    let mut left = end;
    while !left.is_empty() {
        match sock.send_with_flags(left, NOW) {
            Ok(0) => return State::Failed,
            Ok(n) => left = &left[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return State::Rest(left.to_vec()),
            Err(_) => return State::Failed,
        }
    }
    State::Sent
}

#[cfg(test)]
mod tests;
