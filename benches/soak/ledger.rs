//! What the soak did and what it saw: the shared run state (stop flag, pause gate, crossbar's
//! current addresses, fault windows, the SIGKILL instant) and the ledger of every request sent,
//! from which the checks derive what crossbar must have recorded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};

/// How a request's accounting row is found in the db.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Corr {
    /// A conversation turn: its fingerprint, computed by crossbar's own `fingerprint::peek`.
    Fp(String),
    /// A deliberately broken request on this route: rows are counted per status on the route,
    /// because crossbar may refuse it before it has read the body that names the conversation.
    Route(&'static str),
    /// Bytes with no route at all: no row may exist for them.
    Nothing,
}

/// What the client saw.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A status line arrived. `complete`: the body was read to its proper end.
    Answered {
        status: u16,
        host: Option<String>,
        lease: Option<String>,
        complete: bool,
        /// Crossbar refused the request before routing it (431, 503 busy, 408, bad framing).
        pre_route: bool,
        /// A 400 from crossbar itself (no `X-Crossbar-Host`): before or after routing, the
        /// answer does not say, so its row may or may not exist (counted, see the note).
        own_400: bool,
    },
    /// The client left (mid-stream, while waiting for the head, or after stalling).
    Left,
    /// The connection could not be made: crossbar never saw the request.
    NoConnection,
    /// Sent on a reused keep-alive connection that the server closed without a byte (it may
    /// close idle connections, before reading what comes next). Retried on a fresh connection.
    Dropped,
    /// Sent, but the connection ended without a status line.
    Unanswered,
}

#[derive(Debug, Clone)]
pub struct Sent {
    pub corr: Corr,
    /// (conversation id, turn number from 1) for conversation turns.
    pub turn: Option<(u64, u32)>,
    /// The route of a conversation turn; for the other requests, what kind of request it was.
    pub route: &'static str,
    pub start: Instant,
    pub end: Instant,
    pub outcome: Outcome,
}

/// A fault on `host` (kill, hang, broken streams) from `start` until `end` (open while running).
#[derive(Debug, Clone)]
pub struct Window {
    pub host: String,
    /// Unix milliseconds, comparable with the rows' `started`.
    pub start_ms: i64,
    pub end_ms: Option<i64>,
}

/// State shared by the clients, the chaos thread, the monitor and the checks.
#[derive(Debug)]
pub struct Run {
    pub stop: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
    pub addrs: RwLock<(SocketAddr, SocketAddr)>,
    pub ledger: Mutex<Vec<Sent>>,
    pub host_faults: Mutex<Vec<Window>>,
    /// When the SIGKILL was sent, and when the killed process had been reaped.
    pub killed: Mutex<Option<(Instant, Instant)>>,
    pub sent: AtomicU64,
    /// crossbar's VmRSS at the last sample, KiB (for the progress lines).
    pub rss_kib: AtomicU64,
}

impl Run {
    pub fn new(client: SocketAddr, admin: SocketAddr) -> Run {
        Run {
            stop: AtomicBool::new(false),
            paused: Mutex::new(false),
            resumed: Condvar::new(),
            addrs: RwLock::new((client, admin)),
            ledger: Mutex::new(Vec::new()),
            host_faults: Mutex::new(Vec::new()),
            killed: Mutex::new(None),
            sent: AtomicU64::new(0),
            rss_kib: AtomicU64::new(0),
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn client(&self) -> SocketAddr {
        self.addrs.read().0
    }

    pub fn admin(&self) -> SocketAddr {
        self.addrs.read().1
    }

    /// Clients call this before each request: it blocks while the chaos thread restarts crossbar.
    pub fn wait_unpaused(&self) {
        let mut p = self.paused.lock();
        while *p && !self.stopping() {
            self.resumed.wait_for(&mut p, Duration::from_millis(200));
        }
    }

    pub fn set_paused(&self, on: bool) {
        *self.paused.lock() = on;
        self.resumed.notify_all();
    }

    pub fn record(&self, sent: Sent) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.ledger.lock().push(sent);
    }

    /// Whether `host` had a fault between `from_ms` and `to_ms` (unix ms; 2 s of slack either
    /// side: health polls and queued requests notice a fault a little late).
    pub fn host_faulted(&self, host: &str, from_ms: i64, to_ms: i64) -> bool {
        let grace = 2000;
        self.host_faults.lock().iter().any(|w| {
            let ended_before = match w.end_ms {
                None => false,
                Some(e) => e + grace < from_ms,
            };
            w.host == host && w.start_ms <= to_ms + grace && !ended_before
        })
    }

    /// Whether a request that lived from `start` to `end` was in flight at the SIGKILL, or could
    /// still have been pending in crossbar within `slack` after its client was done with it.
    pub fn at_kill(&self, start: Instant, end: Instant, slack: Duration) -> bool {
        self.killed
            .lock()
            .is_some_and(|(sent, reaped)| start <= reaped && end + slack >= sent)
    }
}

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
