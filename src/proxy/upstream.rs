//! The upstream client: a pooled ureq agent per host for forwarded requests ([`Pools`]), whose TCP
//! transport is watched while it waits for upstream. A request can wait minutes for its first byte (prefill);
//! if the client leaves meanwhile, the wait ends within [`GONE_CHECK`], the upstream connection
//! closes (llama-server cancels the task and frees its slot) and the request is recorded as 499.
//!
//! How: ureq 3's `Connector` lets crossbar wrap the transport it reads from, so the waiting worker
//! itself can look at its client between bounded waits — no thread per request, no second thread
//! reaching into a socket (ureq 2 had no such hook). The hook lives in ureq's `unversioned`
//! module, so the version is pinned to 3.5 in Cargo.toml. Which client to watch is the worker
//! thread's [`Exchange`] (a thread-local set for one request), because a pooled connection serves
//! many requests, one at a time, always on the thread that runs ureq's call.
//!
//! Connection reuse (issue 12): a connection goes back to the pool only after a complete answer
//! that was not streamed (llama-server closes after a streamed one while advertising keep-alive,
//! shared/llama-server.md) and idles at most [`IDLE_AGE`] (under llama-server's 5 s keep-alive).
//! It is not probed before reuse: a request whose reused connection turns out closed before any
//! byte of the answer is sent again, once, on a connection the pool does not give ([`send`] with
//! `fresh`: every pooled one may be dead after a host restart). [`send`] builds each attempt: the
//! forwarded headers, the host's key, and a listing's bounds. The context guard's count calls use
//! [`agent_config`] on one shared agent without the watch and without pooling.

use std::cell::RefCell;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ureq::config::Config as AgentConfig;
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};
use ureq::{Agent, Error};

use crate::config::Config;
use crate::conn::MAX_HEAD;
use crate::limiter::GONE_CHECK;

/// Longest an upstream connection idles in the pool: under llama-server's keep-alive (5 s), so
/// the server never closes one just as crossbar picks it up.
pub const IDLE_AGE: Duration = Duration::from_secs(2);

/// What crossbar may add to a client's head on its way upstream: the host's URL and key (each
/// bounded by the config's checks, [`crate::config::MAX_URL`] and [`crate::config::MAX_API_KEY`]) and the headers
/// the upstream client writes itself (Host, User-Agent, the body's length).
const ADDED: usize = 8 << 10;

/// The largest head crossbar writes upstream, and so the upstream client's output buffer (which
/// must hold a whole head): every head the connection layer accepts ([`MAX_HEAD`]) fits with what
/// crossbar adds. With ureq's 16 KiB buffer a 20 KB header failed as "output too small" and counted
/// against the host (issue 24). The buffer is allocated once per connection, on first use.
pub const HEAD_ROOM: usize = MAX_HEAD + ADDED;

/// The agent settings every upstream call uses: no redirects, a connect timeout, a generous
/// per-read timeout (the first byte waits for prefill), no overall timeout (so ureq resolves
/// names on the calling thread, never on a thread of its own), no idle connections, status codes
/// as answers. The count calls use these as they are; [`Pools`] adds a pool per host.
pub fn agent_config(config: &Config) -> AgentConfig {
    settings(config, 0)
}

/// [`agent_config`]'s settings with a pool of at most `idle` idle connections.
fn settings(config: &Config, idle: usize) -> AgentConfig {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(config.connect_timeout))
        .timeout_per_read(Some(config.first_byte_timeout))
        .timeout_per_write(Some(config.first_byte_timeout))
        .max_idle_connections(idle)
        .max_idle_connections_per_host(idle)
        .max_idle_age(IDLE_AGE)
        .allow_non_standard_methods(true)
        .no_delay(true)
        // Buffers belong to a connection. Input: one relayed read (16 KiB, as `forward` reads)
        // rather than ureq's 128 KiB. Output: any head crossbar accepted, whole.
        .input_buffer_size(16 << 10)
        .output_buffer_size(HEAD_ROOM)
        .user_agent(concat!("crossbar/", env!("CARGO_PKG_VERSION")))
        .build()
}

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
pub(super) struct Exchange(());

impl Exchange {
    /// Starts watching `client` (when given) for the request about to run on this thread.
    pub(super) fn start(client: Option<Arc<TcpStream>>) -> Exchange {
        let state = State {
            client,
            left: false,
            reused: true,
            sent: false,
            received: false,
            found_closed: false,
            poolable: None,
            hold_head: false,
        };
        EXCHANGE.with(|e| *e.borrow_mut() = Some(state));
        Exchange(())
    }

    /// Whether the wait for upstream ended because the client left.
    pub(super) fn client_left(&self) -> bool {
        with_state(|s| s.left).unwrap_or(false)
    }

    /// Whether the failed attempt may be sent again on a fresh connection: it ran on a pooled
    /// connection the host had already closed (a write refused with a reset or broken pipe, any
    /// other write failure before anything was written, or the connection ended or was reset
    /// before any byte of an answer), so the host acted on nothing of it
    /// (shared/llama-server.md). Resets the attempt.
    pub(super) fn retryable(&self) -> bool {
        with_state(|s| {
            let again = s.reused && s.found_closed && !s.received;
            s.reused = true;
            s.sent = false;
            s.received = false;
            s.found_closed = false;
            again
        })
        .unwrap_or(false)
    }

    /// Says that the attempt about to run sends a body after its head, so the head may wait for
    /// it (set before each attempt: the first write of the attempt takes it).
    pub(super) fn body_follows(&self, follows: bool) {
        with_state(|s| s.hold_head = follows);
    }

    /// Whether any byte of the last attempt reached the kernel: a failure before that never
    /// reached the host (a refused or timed-out connect).
    pub(super) fn sent(&self) -> bool {
        with_state(|s| s.sent).unwrap_or(false)
    }

    /// Says whether the answer may leave its connection in the pool (not when streamed).
    pub(super) fn set_poolable(&self, poolable: bool) {
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
struct Watch;

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
struct Watched<T> {
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
    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
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
        result
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
        with_state(|s| s.poolable.take()).flatten().unwrap_or(true)
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

mod literal;
mod pools;
mod send;
pub use pools::Pools;
pub(super) use send::send;

#[cfg(test)]
mod tests;
