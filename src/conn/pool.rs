//! A listener's threads — the accept thread (`accept`), the poller (`park`) and the fixed workers
//! (`serve`) — and how they start and stop.
//!
//! The accept thread puts a socket on the bounded queue while the queue is empty, else hands it to
//! `park`'s poller, which queues it once its head is whole, so only whole requests wait for a
//! worker. A worker takes one and serves its requests one after another (keep-alive, pipelining).
//! A head not whole within 50 ms, a body not whole within 50 ms (`awaited`), and an idle
//! connection while someone waits in the queue go to the poller too: no worker waits on a slow
//! client. Stop: the stop channel is dropped and the accept thread woken by a connection to
//! itself; workers finish the connections already accepted, then exit.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError};

use super::accept::{accept, Burst};
use super::awaited::{Arrived, Budget};
use super::inbound::Inbound;
use super::park::{self, Parked};
use super::peers::{PeerSlot, Peers};
use super::request::Request;
pub(super) use super::serve::refuse_head;
use super::serve::serve;
use super::tail::Tail;
use super::{Counts, Settings};

/// What a listener serves, and where it counts what it refused.
pub struct Service {
    /// `clients` or `admin`, for thread names and log lines.
    pub name: &'static str,
    pub handle: Box<dyn Fn(&mut Request<'_>) + Send + Sync>,
    pub refused: Box<dyn Fn(Refused) + Send + Sync>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("name", &self.name).finish()
    }
}

/// Why a connection was answered before any handler saw a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 503: every worker busy and the accept queue full.
    Busy,
    /// 431: head over 64 KiB or 100 header lines.
    HeadersTooLarge,
    /// 400: malformed head or bad framing.
    BadRequest,
    /// 408: the head did not arrive within `client_header_timeout`.
    HeadTimeout,
    /// 503: the peer already holds `max_connections_per_peer` connections.
    PerPeer,
    /// 503: workers already wait for `max_body_readers_per_peer` bodies from the peer.
    PerPeerBodies,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Busy => "busy",
            Refused::HeadersTooLarge => "headers_too_large",
            Refused::BadRequest => "bad_request",
            Refused::HeadTimeout => "head_timeout",
            Refused::PerPeer => "per_peer",
            Refused::PerPeerBodies => "per_peer_bodies",
        }
    }
}

/// An accepted connection between requests.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) inb: Inbound<TcpStream>,
    /// Until when it may wait for the first byte of its next head.
    pub(super) idle_until: Instant,
    /// The deadline of the head being read: from the accept for a new connection, from its first
    /// byte for the next head on a kept one. `None` between requests.
    pub(super) head_by: Option<Instant>,
    /// How much of the pending bytes the poller has searched for the head's end.
    pub(super) scanned: usize,
    /// No request yet: the head's deadline counts from the accept.
    pub(super) fresh: bool,
    /// Its place in its peer's count, given back when the socket closes.
    pub(super) peer: PeerSlot,
    /// The client's address, as accepted (asked of the socket once, not per request).
    pub(super) addr: SocketAddr,
    /// A second handle on the socket for the requests that watch it ([`Request::socket`]), made
    /// once per connection rather than once per request.
    pub(super) watch: Option<Arc<TcpStream>>,
    /// The last answer's end, while another thread sends it ([`Tail`]).
    pub(super) tail: Option<Arc<Tail>>,
    /// A request whose body the poller read off the workers: its head and its body (or why
    /// not), for the handler to be called again with.
    pub(super) arrived: Option<Box<Arrived>>,
}

impl Conn {
    /// The socket and its place in its peer's count, the last answer's end sent first.
    pub(super) fn into_parts(mut self) -> (Inbound<TcpStream>, PeerSlot) {
        self.settle();
        (self.inb, self.peer)
    }

    /// Waits for the last answer's end to be out, if another thread sends it ([`Tail`]): before
    /// anything else is written to the connection or it is shut down. Whether the connection may
    /// go on (the end went out whole).
    pub(super) fn settle(&mut self) -> bool {
        match self.tail.take() {
            Some(tail) => tail.settle(self.inb.wire()),
            None => true,
        }
    }

    /// [`Conn::settle`] without waiting: `false` when the end failed to go out; a tail still
    /// waiting for its row stays.
    pub(super) fn settle_now(&mut self) -> bool {
        let Some(tail) = &self.tail else {
            return true;
        };
        match tail.try_settle(self.inb.wire()) {
            Some(ok) => {
                self.tail = None;
                ok
            }
            None => true,
        }
    }
}

/// The connections the poller holds, by kind, as of its last look.
#[derive(Debug, Default)]
pub(super) struct PollerCounts {
    /// Part of a head received.
    pub(super) heads: AtomicUsize,
    /// Waiting for the first byte of a (next) head.
    pub(super) idle: AtomicUsize,
    /// A request whose body is still coming (or, whole, waits for a worker).
    pub(super) bodies: AtomicUsize,
}

pub(super) struct Shared {
    pub(super) service: Service,
    pub(super) settings: Settings,
    pub(super) stopping: AtomicBool,
    pub(super) queue: Receiver<Conn>,
    pub(super) parked: parking_lot::Mutex<Vec<Parked>>,
    pub(super) wake_poller: Sender<()>,
    /// What the poller holds, as of its last look.
    pub(super) held: PollerCounts,
    pub(super) peers: Arc<Peers>,
    /// What the bodies being received may hold, all together (`client_body_buffer_mib`).
    pub(super) budget: Arc<Budget>,
    pub(super) busy_burst: Burst,
    pub(super) per_peer_burst: Burst,
    pub(super) bodies_burst: Burst,
}

/// A running listener: accept thread, poller and workers.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<Sender<()>>,
    accept: Option<JoinHandle<()>>,
    poller: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    exited: Receiver<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("service", &self.service)
            .finish()
    }
}

impl Pool {
    /// Starts serving `listener` with `workers` threads.
    pub fn start(
        listener: TcpListener,
        workers: usize,
        settings: Settings,
        service: Service,
    ) -> std::io::Result<Pool> {
        let addr = listener.local_addr()?;
        let (queue_tx, queue) = bounded(settings.accept_queue.max(1));
        let (stop, stopped) = bounded::<()>(0);
        let (wake_poller, woken) = bounded(1);
        let name = service.name;
        let shared = Arc::new(Shared {
            service,
            settings,
            stopping: AtomicBool::new(false),
            queue,
            parked: parking_lot::Mutex::new(Vec::new()),
            wake_poller,
            held: Default::default(),
            peers: Peers::new(settings.max_per_peer, settings.max_bodies_per_peer),
            budget: Budget::new(settings.body_buffer),
            busy_burst: Burst::default(),
            per_peer_burst: Burst::default(),
            bodies_burst: Burst::default(),
        });
        let (exit_tx, exited) = bounded(workers);
        let workers = (0..workers)
            .map(|i| {
                let (sh, stopped, done) = (shared.clone(), stopped.clone(), exit_tx.clone());
                spawn(format!("{name}-{i}"), move || {
                    work(&sh, &stopped);
                    let _ = done.send(());
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let (sh, tx) = (shared.clone(), queue_tx.clone());
        let poller = spawn(format!("{name}-idle"), move || {
            park::poll(&sh, &tx, &stopped, &woken)
        })?;
        let sh = shared.clone();
        let accept = spawn(format!("{name}-accept"), move || {
            accept(&sh, &listener, &queue_tx)
        })?;
        Ok(Pool {
            addr,
            shared,
            stop: Some(stop),
            accept: Some(accept),
            poller: Some(poller),
            workers,
            exited,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Open connections and what the poller holds of them (as of its last look).
    pub fn counts(&self) -> Counts {
        Counts {
            open: self.shared.peers.total(),
            reading_head: self.shared.held.heads.load(Ordering::Relaxed),
            idle: self.shared.held.idle.load(Ordering::Relaxed),
            reading_body: self.shared.peers.bodies(),
            body_bytes: self.shared.budget.used(),
            bodies_off_workers: self.shared.held.bodies.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, lets workers finish what was accepted until `deadline`, and joins every
    /// thread that ended. Returns how many workers were still busy at the deadline (left running).
    pub fn stop(mut self, deadline: Instant) -> usize {
        self.shared.stopping.store(true, Ordering::SeqCst);
        drop(self.stop.take());
        // Wakes the blocking accept; it sees `stopping` and returns.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                [127, 0, 0, 1].into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        for handle in [self.accept.take(), self.poller.take()]
            .into_iter()
            .flatten()
        {
            let _ = handle.join();
        }
        let mut running = self.workers.len();
        while running > 0 && self.exited.recv_deadline(deadline).is_ok() {
            running -= 1;
        }
        if running == 0 {
            for worker in self.workers.drain(..) {
                let _ = worker.join();
            }
        }
        running
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    thread::Builder::new().name(name).spawn(f)
}

fn work(sh: &Shared, stopped: &Receiver<()>) {
    loop {
        let conn = match sh.queue.try_recv() {
            Ok(conn) => conn,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => select! {
                recv(sh.queue) -> conn => match conn { Ok(conn) => conn, Err(_) => return },
                recv(stopped) -> _ => return,
            },
        };
        serve(sh, conn);
    }
}

impl Shared {
    pub(super) fn name(&self) -> &'static str {
        self.service.name
    }
}
