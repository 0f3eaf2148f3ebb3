//! The llama-server client: every call crossbar makes to a host goes out through this module.
//!
//! - Forwarded requests: one pooled ureq agent per host ([`Pools`]) whose TCP transport is
//!   watched while it waits ([`Exchange`], `watch.rs`): a client that leaves during a long prefill
//!   ends the wait within [`GONE_CHECK`] and closes the upstream connection, so llama-server
//!   cancels the task. Connections are reused only after a whole answer that was not streamed
//!   (llama-server closes after a streamed one while advertising keep-alive) and idle at most
//!   [`IDLE_AGE`]; a reused one the host had closed is found by the request's own write or first
//!   read, and the request is sent again once on a fresh one ([`Exchange::retryable`]).
//! - Side calls (`side.rs`): crossbar's own small calls, each bounded as a whole — exact counts
//!   (at most [`side::PER_HOST`] requests counting on one host at once), slot saves, and the
//!   health polls' GETs on an agent of their own.
//!
//! What a request sends is built by the request path (`proxy/send.rs`) from its plan; this
//! module knows hosts and transports, never routes, leases or slots. It holds no lock across
//! network I/O but the per-host count bound's condvar wait, which waits for a turn, not a host.

use std::time::Duration;

use ureq::config::Config as AgentConfig;
use ureq::Agent;

use crate::config::Config;
use crate::conn::MAX_HEAD;
use crate::limiter::GONE_CHECK;

mod literal;
mod pools;
pub mod probe;
pub mod side;
mod watch;

pub use pools::Pools;
pub use side::{Answer, Side};
pub use watch::Exchange;

/// The llama-server client's shared parts: the forwarding pools and the side calls' agent.
#[derive(Debug)]
pub struct Upstream {
    pools: Pools,
    side: Side,
}

impl Upstream {
    pub fn new(config: &Config) -> Upstream {
        Upstream {
            pools: Pools::new(config),
            // The same settings (no redirects, connect and per-read timeouts) without the pool,
            // nothing watched: no client waits at the socket for a count or a save.
            side: Side::new(Agent::new_with_config(agent_config(config))),
        }
    }

    /// The pooled agent of `host`'s forwarded requests.
    pub fn forwarding(&self, host: &str) -> Agent {
        self.pools.get(host)
    }

    /// crossbar's own small calls to hosts.
    pub fn side(&self) -> &Side {
        &self.side
    }

    /// Keeps the pools of these hosts (a reload), dropping the others'.
    pub fn set_hosts<'a>(&self, hosts: impl Iterator<Item = &'a str>) {
        self.pools.set_hosts(hosts);
    }
}

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
