//! The upstream client: one ureq agent per forwarded request, whose TCP transport is watched
//! while it waits for upstream. A request can wait minutes for its first byte (prefill); if the
//! client leaves meanwhile, the wait ends within [`GONE_CHECK`], the upstream connection closes
//! (llama-server cancels the task and frees its slot) and the request is recorded as 499.
//!
//! How: ureq 3's `Connector` lets crossbar wrap the transport it reads from, so the waiting worker
//! itself can look at its client between bounded waits — no thread per request, no second thread
//! reaching into a socket (ureq 2 had no such hook). The hook lives in ureq's `unversioned`
//! module, so the version is pinned to 3.5 in Cargo.toml. The context guard's count calls use the
//! same settings on one shared agent without the watch (`Gateway::agent`).

use std::io;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ureq::config::Config as AgentConfig;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, NextTimeout, TcpConnector, Transport,
};
use ureq::{Agent, Error};

use crate::config::Config;
use crate::limiter::GONE_CHECK;

/// The agent settings every upstream call uses: no redirects, a connect timeout, a generous
/// per-read timeout (the first byte waits for prefill), no overall timeout, no idle connections
/// (llama-server closes a connection after a streamed answer while advertising keep-alive, so a
/// pooled one may be dead; a fresh one costs one LAN round trip), status codes as answers.
pub fn agent_config(config: &Config) -> AgentConfig {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(config.connect_timeout))
        .timeout_per_read(Some(config.first_byte_timeout))
        .timeout_per_write(Some(config.first_byte_timeout))
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .allow_non_standard_methods(true)
        .no_delay(true)
        // A fresh connection per request: its buffers are allocated per request too, so they
        // are sized for one relayed read (16 KiB, as `forward` reads) rather than ureq's 128 KiB.
        .input_buffer_size(16 << 10)
        .output_buffer_size(16 << 10)
        .user_agent(concat!("crossbar/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// An agent for one request, watching `client` (when given) while it waits for upstream. `left`
/// is raised when the wait ended because the client left.
pub(super) fn agent(
    config: &AgentConfig,
    client: Option<TcpStream>,
    left: &Arc<AtomicBool>,
) -> Agent {
    let watch = Watch {
        client: client.map(Arc::new),
        left: Arc::clone(left),
    };
    Agent::with_parts(
        config.clone(),
        TcpConnector::default().chain(watch),
        DefaultResolver::default(),
    )
}

/// Wraps the TCP transport in a [`Watched`] one.
#[derive(Debug)]
struct Watch {
    client: Option<Arc<TcpStream>>,
    left: Arc<AtomicBool>,
}

impl<In: Transport> Connector<In> for Watch {
    type Out = Watched<In>;

    fn connect(
        &self,
        _: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        Ok(chained.map(|inner| Watched {
            inner,
            client: self.client.clone(),
            left: Arc::clone(&self.left),
        }))
    }
}

/// A transport whose waits for input are cut into steps of at most [`GONE_CHECK`], with a look at
/// the client between them. Everything else is the inner transport's.
#[derive(Debug)]
struct Watched<T> {
    inner: T,
    client: Option<Arc<TcpStream>>,
    left: Arc<AtomicBool>,
}

impl<T: Transport> Transport for Watched<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        let Some(client) = self.client.clone() else {
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
                        self.left.store(true, Ordering::Relaxed);
                        return Err(Error::Io(io::Error::other("client gone")));
                    }
                }
                other => return other,
            }
        }
    }

    /// Never reused: crossbar pools no upstream connections (see [`agent_config`]), and saying so
    /// here spares ureq's liveness probe (three syscalls) on every answer's end.
    fn is_open(&mut self) -> bool {
        false
    }
}
