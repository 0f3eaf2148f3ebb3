//! The watched transport of forwarded requests. A request can wait minutes for its first byte
//! (prefill); ureq 3's `Connector` lets crossbar wrap the transport it reads from, so the waiting
//! worker itself looks at its client between waits of at most [`GONE_CHECK`] — no thread per
//! request, no second thread reaching into a socket. The hook lives in ureq's `unversioned`
//! module (hence `~3.5` in Cargo.toml). Which client to watch is the worker thread's
//! [`Exchange`], a thread-local set for one request, because a pooled connection serves many
//! requests, one at a time, always on the thread that runs ureq's call.
//!
//! It also notes what the connection did (reused, sent, answered, found closed), which decides
//! whether a failed attempt may go again on a fresh connection, and holds a request's head to
//! send it in one write with its body. It never reads or writes a byte of its own.

use std::cell::RefCell;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};
use ureq::Error;

use super::GONE_CHECK;

thread_local! {
    static EXCHANGE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// The running request's view of its upstream connection, on this worker thread.
#[derive(Debug)]
struct State {
    client: Option<Arc<TcpStream>>,
    /// A wait for upstream ended because the client had gone.
    left: bool,
    /// The connection came from the pool (set when a transport is first used by this request).
    reused: bool,
    /// Some bytes of the request were handed to the kernel.
    sent: bool,
    /// Some bytes of the answer arrived.
    received: bool,
    /// The connection turned out closed (a failed write, an end or reset before any byte of
    /// the answer): the host had closed it while it idled, so it accepted nothing of the request.
    found_closed: bool,
    /// A write was refused as closed: nothing more is written, what the host may have answered
    /// before it closed is read, and the connection never goes back to the pool.
    write_failed: bool,
    /// `Some(false)` once the answer is known to be streamed: never pool that connection.
    poolable: Option<bool>,
    /// The next write is the request's head and a body follows: hold the head and send both
    /// in one write (see [`Watched::transmit_output`]).
    hold_head: bool,
}

/// One forwarded request's watch over its upstream connection: while it lives, this thread's
/// upstream waits look at `client` and note when it has gone. Dropping it ends the watch (and
/// releases the client socket's handle). Its state is the thread's (`EXCHANGE`), as the
/// transport that reads it runs on this thread.
#[derive(Debug)]
pub struct Exchange(());

impl Exchange {
    /// Starts watching `client` (when given) for the request about to run on this thread.
    pub fn start(client: Option<Arc<TcpStream>>) -> Exchange {
        let state = State {
            client,
            left: false,
            reused: true,
            sent: false,
            received: false,
            found_closed: false,
            write_failed: false,
            poolable: None,
            hold_head: false,
        };
        EXCHANGE.with(|e| *e.borrow_mut() = Some(state));
        Exchange(())
    }

    /// Whether the wait for upstream ended because the client left.
    pub fn client_left(&self) -> bool {
        with_state(|s| s.left).unwrap_or(false)
    }

    /// Whether the failed attempt may be sent again on a fresh connection: it ran on a pooled
    /// connection the host had already closed (a write refused with a reset or broken pipe, any
    /// other write failure before anything was written, or the connection ended or was reset
    /// before any byte of an answer), so the host acted on nothing of it
    /// (shared/llama-server.md). Resets the attempt.
    pub fn retryable(&self) -> bool {
        with_state(|s| {
            let again = s.reused && s.found_closed && !s.received;
            s.reused = true;
            s.sent = false;
            s.received = false;
            s.found_closed = false;
            s.write_failed = false;
            again
        })
        .unwrap_or(false)
    }

    /// Says that the attempt about to run sends a body after its head, so the head may wait for
    /// it (set before each attempt: the first write of the attempt takes it).
    pub fn body_follows(&self, follows: bool) {
        with_state(|s| s.hold_head = follows);
    }

    /// Whether any byte of the last attempt reached the kernel: a failure before that never
    /// reached the host (a refused or timed-out connect).
    pub fn sent(&self) -> bool {
        with_state(|s| s.sent).unwrap_or(false)
    }

    /// Says whether the answer may leave its connection in the pool (not when streamed).
    pub fn set_poolable(&self, poolable: bool) {
        with_state(|s| s.poolable = Some(poolable));
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        EXCHANGE.with(|e| e.borrow_mut().take());
    }
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    EXCHANGE.with(|e| e.borrow_mut().as_mut().map(f))
}

/// Wraps the TCP transport in a [`Watched`] one.
#[derive(Debug)]
pub(super) struct Watch;

impl<In: Transport> Connector<In> for Watch {
    type Out = Watched<In>;

    fn connect(
        &self,
        _: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        with_state(|s| s.reused = false);
        Ok(chained.map(|inner| Watched {
            inner,
            held: Vec::new(),
        }))
    }
}

/// A transport whose waits for input are cut into steps of at most [`GONE_CHECK`], with a look at
/// the running exchange's client between them. Everything else is the inner transport's.
#[derive(Debug)]
pub(super) struct Watched<T> {
    inner: T,
    /// A request head waiting for its body, to leave with it.
    held: Vec<u8>,
}

impl<T: Transport> Transport for Watched<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    /// ureq writes a request's head and its body in two writes; each is a loopback segment, and
    /// the host acknowledges the first on its own (8 segments per request against nginx's 6). The
    /// head of a request with a body is therefore held (copied, a few hundred bytes) and sent in
    /// one write with the body's first piece. Nothing waits for input with bytes held.
    ///
    /// A write the host refused as closed is not an error here (issue 46): a host that answers
    /// on a head alone and closes without reading the body (llama-server's 400 for a head it
    /// cannot read, its 503 while loading, its 401) resets the connection under the body's
    /// write, and its answer is in the socket, to be read. So the rest of the request is dropped
    /// and ureq goes on to read; a host that answered nothing is found there (an end or a reset
    /// before any byte), and its attempt is retryable as before.
    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        if with_state(|s| s.write_failed) == Some(true) {
            return Ok(());
        }
        if with_state(|s| std::mem::take(&mut s.hold_head)) == Some(true) {
            self.held.clear();
            (self.held).extend_from_slice(&self.inner.buffers().output()[..amount]);
            return Ok(());
        }
        let result = if self.held.is_empty() {
            self.inner.transmit_output(amount, timeout)
        } else {
            self.transmit_held(amount, timeout)
        };
        // A write the host refused as closed (a reset, a broken pipe) means it never got the
        // whole request, so it cannot have acted on it: retryable like a connection that ends
        // before any byte of the answer, even if the head had gone out.
        with_state(|s| match &result {
            Ok(()) => s.sent = true,
            Err(Error::Io(e)) if closed(e.kind()) => s.found_closed |= !s.received,
            Err(_) => s.found_closed |= !s.sent,
        });
        match result {
            Err(Error::Io(e)) if closed(e.kind()) => {
                log::debug!("upstream write refused as closed, reading its answer error={e}");
                with_state(|s| s.write_failed = true);
                self.held.clear();
                Ok(())
            }
            other => other,
        }
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        if !self.held.is_empty() {
            self.transmit_output(0, timeout)?;
        }
        let result = self.await_watched(timeout);
        with_state(|s| match &result {
            Ok(true) => s.received = true,
            Ok(false) => s.found_closed |= !s.received,
            Err(Error::Io(e)) if closed(e.kind()) => s.found_closed |= !s.received,
            Err(_) => {}
        });
        result
    }

    /// Asked when an answer ends (may it go back to the pool?) and before a pooled connection
    /// is reused. A streamed answer's connection never goes back; one whose answer ended
    /// cleanly does. Neither is probed: ureq's probe (a non-blocking read, three system calls)
    /// cost a tenth of crossbar's system calls per request, and a connection the host closed
    /// meanwhile is found anyway by the request's own write or first read, which sends it again
    /// on a fresh one ([`Exchange::retryable`]). Its age is ureq's to bound ([`IDLE_AGE`]).
    fn is_open(&mut self) -> bool {
        let state = with_state(|s| (s.poolable.take(), s.write_failed));
        match state {
            Some((_, true)) => false,
            Some((poolable, false)) => poolable.unwrap_or(true),
            None => true,
        }
    }
}

/// Errors that say the peer had closed the connection.
fn closed(kind: io::ErrorKind) -> bool {
    use io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
    )
}

impl<T: Transport> Watched<T> {
    /// Sends the held head and `amount` bytes of the output buffer, in as few writes as the
    /// output buffer allows (one, unless the head and that piece of body exceed it together).
    fn transmit_held(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        let mut pending = std::mem::take(&mut self.held);
        pending.extend_from_slice(&self.inner.buffers().output()[..amount]);
        let mut sent = 0;
        while sent < pending.len() {
            let out = self.inner.buffers().output();
            let n = (pending.len() - sent).min(out.len());
            if n == 0 {
                return Err(Error::Io(io::Error::other("no output buffer")));
            }
            out[..n].copy_from_slice(&pending[sent..sent + n]);
            self.inner.transmit_output(n, timeout)?;
            sent += n;
        }
        Ok(())
    }

    /// The inner wait, in steps of [`GONE_CHECK`] with a look at the exchange's client between.
    fn await_watched(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        let Some(Some(client)) = with_state(|s| s.client.clone()) else {
            return self.inner.await_input(timeout);
        };
        let limit = timeout
            .per_read
            .map_or(*timeout.after, |r| (*r).min(*timeout.after));
        let started = Instant::now();
        loop {
            let left = limit.saturating_sub(started.elapsed());
            let step = left.min(GONE_CHECK);
            let stepped = NextTimeout {
                after: step.into(),
                per_read: Some(step.into()),
                ..timeout
            };
            match self.inner.await_input(stepped) {
                Err(Error::Timeout(_)) if step < left => {
                    if crate::conn::peer_gone(&client) {
                        with_state(|s| s.left = true);
                        return Err(Error::Io(io::Error::other("client gone")));
                    }
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests;
