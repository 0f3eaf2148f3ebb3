//! The accept thread and the fixed workers of one listener, and how they stop.
//!
//! The accept thread puts each socket on a bounded queue (full → `503 busy`). A worker takes one,
//! serves its requests one after another (keep-alive, pipelining) and, while the connection is idle
//! and someone waits in the queue, parks it with `park`'s poller, which queues it again when its
//! next request starts to arrive. Stop: the stop channel is dropped and the accept thread woken by a
//! connection to itself; workers finish the connections already accepted, then exit.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError, TrySendError};

use super::head::HeadError;
use super::inbound::{Fill, Inbound};
use super::park::{self, Parked};
use super::request::{refuse, Request};
use super::{Settings, MAX_HEAD};

/// How long an idle worker waits on its connection before looking at the accept queue again: a
/// connection waiting behind idle keep-alive ones is served within about this long.
const IDLE_STEP: Duration = Duration::from_millis(100);
/// Longest pause after failed accepts (EMFILE and the like), doubling from 5 ms.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

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
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Busy => "busy",
            Refused::HeadersTooLarge => "headers_too_large",
            Refused::BadRequest => "bad_request",
            Refused::HeadTimeout => "head_timeout",
        }
    }
}

/// An accepted connection between requests.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) inb: Inbound<TcpStream>,
    /// Until when it may wait for the first byte of its next head.
    pub(super) idle_until: Instant,
    /// No request yet: the head's deadline counts from the accept.
    fresh: bool,
}

pub(super) struct Shared {
    service: Service,
    pub(super) settings: Settings,
    stopping: AtomicBool,
    pub(super) queue: Receiver<Conn>,
    pub(super) parked: parking_lot::Mutex<Vec<Parked>>,
    pub(super) wake_poller: Sender<()>,
    busy_since_log: AtomicU64,
    busy_logged: parking_lot::Mutex<Option<Instant>>,
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
            busy_since_log: AtomicU64::new(0),
            busy_logged: parking_lot::Mutex::new(None),
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

fn accept(sh: &Shared, listener: &TcpListener, queue: &Sender<Conn>) {
    let mut failures: u64 = 0;
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = listener.accept();
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let sock = match accepted {
            Ok((sock, _)) => sock,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                if failures == 0 {
                    log::warn!(
                        "accept failed listener={} error={} backoff_ms={}",
                        sh.service.name,
                        crate::logfmt::val(&err.to_string()),
                        backoff.as_millis()
                    );
                }
                failures += 1;
                thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if failures > 0 {
            log::warn!(
                "accept works again listener={} failed_accepts={failures}",
                sh.service.name
            );
            failures = 0;
            backoff = Duration::from_millis(5);
        }
        let _ = sock.set_nodelay(true);
        let _ = sock.set_write_timeout(Some(sh.settings.write_timeout));
        let conn = Conn {
            inb: Inbound::new(sock),
            idle_until: Instant::now() + sh.settings.header_timeout,
            fresh: true,
        };
        match queue.try_send(conn) {
            Ok(()) => {}
            Err(TrySendError::Full(conn)) => busy(sh, conn),
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// `503 busy` to a connection no worker can take; logged at most once a second.
fn busy(sh: &Shared, conn: Conn) {
    let sock = conn.inb.wire();
    let _ = sock.set_write_timeout(Some(Duration::from_millis(200)));
    (sh.service.refused)(Refused::Busy);
    refuse(sock, 503, "busy", None, Some(1));
    let n = sh.busy_since_log.fetch_add(1, Ordering::Relaxed) + 1;
    let mut logged = sh.busy_logged.lock();
    if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
        *logged = Some(Instant::now());
        drop(logged);
        sh.busy_since_log.store(0, Ordering::Relaxed);
        log::warn!(
            "refused listener={} status=503 reason=busy connections={n}",
            sh.service.name
        );
    }
    park::linger(sh, conn.inb);
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

/// Serves one connection's requests until it closes, breaks, idles out or is parked.
fn serve(sh: &Shared, conn: Conn) {
    let mut conn = conn;
    loop {
        conn = match wait_for_request(sh, conn) {
            Some(conn) => conn,
            None => return,
        };
        let deadline = if conn.fresh {
            conn.idle_until
        } else {
            Instant::now() + sh.settings.header_timeout
        };
        conn.fresh = false;
        let head = match conn.inb.read_head(deadline) {
            Ok(head) => head,
            Err(HeadError::Closed) => return,
            Err(err) => return refuse_head(sh, conn, err),
        };
        let stopping = sh.stopping.load(Ordering::SeqCst);
        let mut request = Request::new(head, &mut conn.inb, &sh.settings, stopping);
        let served = catch_unwind(AssertUnwindSafe(|| (sh.service.handle)(&mut request)));
        if served.is_err() || !request.answered() {
            log::error!(
                "request handler panicked or gave no answer listener={} answer=500_if_it_could",
                sh.service.name
            );
            if !request.answered() {
                let headers = [("Content-Type".to_string(), "application/json".to_string())];
                let _ = request.send(500, &headers, br#"{"error":"internal error"}"#);
            }
        }
        if served.is_err() || !request.keep() {
            drop(request);
            return park::linger(sh, conn.inb);
        }
        conn.idle_until = Instant::now() + sh.settings.keepalive_idle;
    }
}

/// Waits for the first byte of the next head. `None` when the connection is done with: closed,
/// idle too long, the listener stopping, or parked because someone waits for a worker.
fn wait_for_request(sh: &Shared, mut conn: Conn) -> Option<Conn> {
    loop {
        if !conn.inb.pending().is_empty() {
            return Some(conn);
        }
        let now = Instant::now();
        if now >= conn.idle_until || (sh.stopping.load(Ordering::SeqCst) && !conn.fresh) {
            return None;
        }
        match conn
            .inb
            .fill(conn.idle_until.min(now + IDLE_STEP), MAX_HEAD)
        {
            Fill::Data => return Some(conn),
            Fill::Eof | Fill::Failed(_) => return None,
            Fill::Timeout if !sh.queue.is_empty() => {
                park::park(sh, conn);
                return None;
            }
            Fill::Timeout => {}
        }
    }
}

/// Answers a head that was refused (431, 400, 408), logs and counts it, and closes.
fn refuse_head(sh: &Shared, conn: Conn, err: HeadError) {
    let (status, error, detail, reason) = match &err {
        HeadError::TooLarge => (431, "headers too large", None, Refused::HeadersTooLarge),
        HeadError::Bad(what) => (400, "bad request", Some(what.as_str()), Refused::BadRequest),
        HeadError::Timeout => (408, "request timeout", None, Refused::HeadTimeout),
        HeadError::Closed => return,
    };
    // Counted before the answer goes out, so a client that has the answer sees it counted.
    (sh.service.refused)(reason);
    let sock = conn.inb.wire();
    refuse(sock, status, error, detail, None);
    let peer = sock
        .peer_addr()
        .map_or_else(|_| "-".to_string(), |a| a.to_string());
    log::info!(
        "refused listener={} status={status} reason={} peer={peer} detail={}",
        sh.service.name,
        reason.as_str(),
        crate::logfmt::val(detail.unwrap_or("-"))
    );
    park::linger(sh, conn.inb);
}

impl Shared {
    pub(super) fn name(&self) -> &'static str {
        self.service.name
    }
}
