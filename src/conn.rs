//! crossbar's own connection layer, in the design card's shape: one accept thread hands sockets to a
//! fixed pool of workers through a bounded queue, and each worker serves one connection at a time.
//!
//! Owns: accepting (errors logged once per burst, brief backoff, the listener never dies), open
//! connections and bodies being read per peer (`peers`: over a cap → `503 busy`, closed), the bounded accept
//! queue (full → `503 busy` with `Retry-After`, then close), request heads and bodies under limits
//! and deadlines (`head`, `body`, `inbound`), keep-alive and pipelining, reading slow heads and
//! holding idle keep-alive connections off the workers (`park`), and answering what is refused before a handler
//! sees it (431, 400, 408, 503 — a log line and a counter, no accounting row). Must not: know about
//! routes, leases or upstreams (handlers do), hold a lock across socket I/O, or size an allocation by
//! a number a client sent.

mod accept;
mod awaited;
mod body;
mod deadline;
mod head;
mod headers;
mod inbound;
mod park;
mod peers;
mod pool;
mod request;
mod serve;
mod tail;

pub mod fuzz;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Duration;

pub use body::{read as read_body, BodyError, BodyTiming};
pub use head::{parse as parse_head, BodyKind, Head, HeadError, MAX_HEAD, MAX_HEADERS};
pub use headers::Headers;
pub use inbound::{Inbound, Wire};
/// What counts as one client address: an IPv4 address, or an IPv6 /64.
pub(crate) use peers::key as peer_key;
pub use pool::{Pool, Refused, Service};
pub use request::Request;
pub use tail::Tail;

/// Time limits of one listener (config keys; see crossbar.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The whole head must arrive within this (`client_header_timeout`).
    pub header_timeout: Duration,
    /// Every window this long must bring its share of a body (`client_body_timeout`).
    pub body_timeout: Duration,
    /// Bytes per second a body must at least arrive at, judged per window (`client_body_min_rate`).
    pub body_min_rate: u64,
    /// Bytes all request bodies being received may hold together; past it, `503 busy`
    /// (`client_body_buffer_mib`).
    pub body_buffer: usize,
    /// An idle keep-alive connection is closed after this (`keepalive_idle`).
    pub keepalive_idle: Duration,
    /// A client that takes nothing from its socket this long loses it (`client_write_timeout`).
    pub write_timeout: Duration,
    /// Accepted connections waiting for a worker; beyond it, `503 busy` (`accept_queue`).
    pub accept_queue: usize,
    /// Open connections one peer address (an IPv6 /64) may hold; beyond it, `503 busy` and
    /// closed at once (`max_connections_per_peer`).
    pub max_per_peer: usize,
    /// Requests from one peer address whose body a worker waits for at once; beyond it, `503
    /// busy` and closed (`max_body_readers_per_peer`). A body whole with its head is not counted.
    pub max_bodies_per_peer: usize,
}

/// A listener's connections, for tests and operators: all open ones (per-peer accounting), and
/// those the poller holds, as of its last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub open: usize,
    /// Part of a head received, the rest awaited off the workers.
    pub reading_head: usize,
    /// Waiting for the first byte of a (next) head off the workers.
    pub idle: usize,
    /// Requests whose body is awaited, on a worker or off the workers (all peers).
    pub reading_body: usize,
    /// Bytes the bodies being received hold (`client_body_buffer_mib`).
    pub body_bytes: usize,
    /// Requests whose body the poller reads, off the workers.
    pub bodies_off_workers: usize,
}

impl Settings {
    pub fn body_timing(&self) -> BodyTiming {
        BodyTiming {
            base: self.body_timeout,
            min_rate: self.body_min_rate,
        }
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            body_min_rate: 64 << 10,
            body_buffer: 256 << 20,
            keepalive_idle: Duration::from_secs(15),
            write_timeout: Duration::from_secs(60),
            accept_queue: 128,
            max_per_peer: 64,
            max_bodies_per_peer: 8,
        }
    }
}

/// True when the peer has closed or broken its side of `sock`. Bytes waiting (a pipelined request)
/// mean it is still there. Never blocks: one `recv(MSG_PEEK | MSG_DONTWAIT)`, whatever the socket's
/// mode — toggling `O_NONBLOCK` around a plain peek cost two more system calls per look (issue 26).
pub fn peer_gone(sock: &TcpStream) -> bool {
    let mut b = [std::mem::MaybeUninit::<u8>::uninit()];
    let peeked = socket2::SockRef::from(sock).recv_with_flags(&mut b, PEEK_NOW);
    match peeked {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    }
}

const PEEK_NOW: libc::c_int = libc::MSG_PEEK | libc::MSG_DONTWAIT;
