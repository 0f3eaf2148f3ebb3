//! The accept thread of a listener: takes connections from the kernel, counts each against its
//! peer (`peers`; over `max_connections_per_peer` → `503 busy`, closed at once), and hands it to a
//! worker through the bounded queue while the queue is empty, else to the poller (`park`), which
//! queues it once its head is whole. A full queue is `503 busy`. Accept errors (EMFILE,
//! ECONNABORTED...) are logged once per burst and backed off; the thread never returns while the
//! pool runs. Refusals here are logged at most once a second ([`Burst`]).

use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};

use super::inbound::Inbound;
use super::park;
use super::pool::{Conn, Refused, Shared};
use super::request::refuse;

/// Longest pause after failed accepts (EMFILE and the like), doubling from 5 ms.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Refusals logged at most once a second, with how many there were since the last line.
#[derive(Debug, Default)]
pub(super) struct Burst {
    /// Refusals since the last line, and when that line was.
    state: parking_lot::Mutex<(u64, Option<Instant>)>,
}

impl Burst {
    /// Counts one; `Some(n)` when a line is due (`n` refusals since the last).
    pub(super) fn hit(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let (since_log, logged) = &mut *state;
        *since_log += 1;
        if logged.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        *logged = Some(Instant::now());
        Some(std::mem::take(since_log))
    }
}

pub(super) fn accept(sh: &Shared, listener: &TcpListener, queue: &Sender<Conn>) {
    let mut failures: u64 = 0;
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = listener.accept();
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (sock, from) = match accepted {
            Ok(accepted) => accepted,
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
        let Some(peer) = sh.peers.enter(from.ip()) else {
            per_peer(sh, sock, from.ip());
            continue;
        };
        let _ = sock.set_nodelay(true);
        let _ = sock.set_write_timeout(Some(sh.settings.write_timeout));
        let head_by = Instant::now() + sh.settings.header_timeout;
        let conn = Conn {
            inb: Inbound::new(sock),
            idle_until: head_by,
            head_by: Some(head_by),
            scanned: 0,
            fresh: true,
            peer,
            addr: from,
            watch: None,
            tail: None,
            arrived: None,
        };
        // Connections already wait for a worker: this one waits for its whole head off the
        // workers, so the queue holds only requests a worker can serve at once.
        if !sh.queue.is_empty() {
            park::park(sh, conn);
            continue;
        }
        match queue.try_send(conn) {
            Ok(()) => {}
            Err(TrySendError::Full(conn)) => busy(sh, conn),
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// `503 busy` to a connection no worker can take; logged at most once a second.
pub(super) fn busy(sh: &Shared, conn: Conn) {
    if let Some(n) = refuse_busy(sh, conn.inb.wire(), Refused::Busy, None, &sh.busy_burst) {
        log::warn!(
            "refused listener={} status=503 reason=busy connections={n}",
            sh.service.name
        );
    }
    park::linger(sh, conn);
}

/// `503 busy` to a request whose body would be one more than `max_body_readers_per_peer` being
/// read for its peer; the connection closes (lingering, so what it still sends is drained).
/// Logged at most once a second.
pub(super) fn per_peer_bodies(sh: &Shared, conn: Conn) {
    let sock = conn.inb.wire();
    let detail = Some("too many request bodies being sent from this address");
    if let Some(n) = refuse_busy(sh, sock, Refused::PerPeerBodies, detail, &sh.bodies_burst) {
        let peer = sock
            .peer_addr()
            .map_or_else(|_| "-".into(), |a| a.ip().to_string());
        log::warn!(
            "refused listener={} status=503 reason=per_peer_bodies peer={peer} max={} requests={n}",
            sh.service.name,
            sh.settings.max_bodies_per_peer
        );
    }
    park::linger(sh, conn);
}

/// `503 busy` to a connection from a peer that holds `max_connections_per_peer` already, and
/// closed at once: it never reaches the queue or the poller. What the peer already sent is read
/// first (once, without waiting) so the close does not reset the answer away. Logged at most once
/// a second.
fn per_peer(sh: &Shared, mut sock: TcpStream, ip: IpAddr) {
    let detail = Some("too many connections from this address");
    let due = refuse_busy(sh, &sock, Refused::PerPeer, detail, &sh.per_peer_burst);
    if sock.set_nonblocking(true).is_ok() {
        park::drain(&mut sock, &mut [0u8; 4096], 16);
    }
    let _ = sock.shutdown(std::net::Shutdown::Both);
    if let Some(n) = due {
        log::warn!(
            "refused listener={} status=503 reason=per_peer peer={ip} max={} connections={n}",
            sh.service.name,
            sh.settings.max_per_peer
        );
    }
}

/// `503 busy` (with `detail`) at once, counted as `reason`; the write gets 200 ms at most, as a
/// refusal is worth no longer wait. `Some(n)` when `burst` says a log line is due.
fn refuse_busy(
    sh: &Shared,
    sock: &TcpStream,
    reason: Refused,
    detail: Option<&str>,
    burst: &Burst,
) -> Option<u64> {
    let _ = sock.set_write_timeout(Some(Duration::from_millis(200)));
    (sh.service.refused)(reason);
    refuse(sock, 503, "busy", detail, Some(1));
    burst.hit()
}
