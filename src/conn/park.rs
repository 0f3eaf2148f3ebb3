//! Connections no worker holds: new and idle keep-alive connections whose next head has not
//! arrived whole, and closing connections lingering so an answer sent before unread request bytes
//! is not lost to a reset. One poller thread per listener reads them every few milliseconds with
//! non-blocking reads, collecting head bytes (up to 64 KiB) the way nginx and HAProxy do: a
//! connection goes back on the accept queue only once its head is complete, so a client dribbling
//! its head (slowloris) never holds a worker. A head not complete by its deadline is answered 408
//! here. It reads request bodies a worker gave up waiting for the same way (`awaited`): the request
//! goes back on the queue once its body is whole, or has failed. Everything held is capped;
//! nothing here blocks on a socket.

use std::io::{ErrorKind, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TrySendError};

use super::accept::busy;
use super::awaited::{Arrived, Awaiting};
use super::body::from_fill;
use super::head::{Head, HeadError};
use super::inbound::{Fill, READ_PIECE};
use super::peers::PeerSlot;
use super::pool::{refuse_head, Conn, Shared};
use super::MAX_HEAD;

/// How often held connections are looked at.
const TICK: Duration = Duration::from_millis(10);
/// Most connections held per listener; past it the one nearest its deadline is closed.
const MAX_PARKED: usize = 1024;
/// How long a closing connection's unread bytes are drained before it is closed anyway.
const LINGER: Duration = Duration::from_secs(2);
/// Reads per connection per tick (each up to 16 KiB): a head of 64 KiB fits in one tick.
const READS_PER_TICK: usize = 5;
/// Reads per body per tick: up to 1 MiB, 100 MB/s for a body the poller reads.
const BODY_READS_PER_TICK: usize = 64;

/// A connection the poller holds.
#[derive(Debug)]
pub(super) enum Parked {
    /// Waiting for its next head, or for the rest of it; back to the queue once it is whole.
    Conn(Conn),
    /// A request whose body is still coming: back on the queue once it is whole (or failed).
    Body(Box<Receiving>),
    /// Answered and half-closed; dropped at EOF or when the instant passes. Still counts for its
    /// peer.
    Linger(TcpStream, PeerSlot, Instant),
}

/// Hands a connection whose head has not arrived whole (or at all) to the poller.
pub(super) fn park(sh: &Shared, mut conn: Conn) {
    // The poller may answer on it (a refusal) or close it: the last answer's end goes first.
    if conn.settle() && conn.inb.wire().set_nonblocking(true).is_ok() {
        add(sh, Parked::Conn(conn));
    }
}

/// A request whose body the poller reads.
#[derive(Debug)]
pub(super) struct Receiving {
    conn: Conn,
    head: Head,
    wait: Awaiting,
    /// When its pace next wants more.
    by: Instant,
}

/// Hands a request whose body is still coming to the poller.
pub(super) fn body(sh: &Shared, conn: Conn, head: Head, wait: Awaiting) {
    if conn.inb.wire().set_nonblocking(true).is_ok() {
        let by = Instant::now() + sh.settings.body_timeout;
        let receiving = Receiving {
            conn,
            head,
            wait,
            by,
        };
        add(sh, Parked::Body(Box::new(receiving)));
    }
}

/// Closes a connection once its peer has read the answer: our side is shut for writing now (the
/// client sees the end), bytes it still sends are read and dropped for up to [`LINGER`].
pub(super) fn linger(sh: &Shared, conn: Conn) {
    let (inb, peer) = conn.into_parts();
    let sock = inb.into_wire();
    let _ = sock.shutdown(Shutdown::Write);
    if sock.set_nonblocking(true).is_ok() {
        add(sh, Parked::Linger(sock, peer, Instant::now() + LINGER));
    }
}

fn add(sh: &Shared, parked: Parked) {
    let mut list = sh.parked.lock();
    if list.len() >= MAX_PARKED {
        let oldest = list
            .iter()
            .enumerate()
            .min_by_key(|(_, p)| until(p))
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            list.swap_remove(i);
        }
    }
    list.push(parked);
    drop(list);
    let _ = sh.wake_poller.try_send(());
}

fn until(p: &Parked) -> Instant {
    match p {
        Parked::Conn(conn) => until_conn(conn),
        Parked::Body(receiving) => receiving.by,
        Parked::Linger(_, _, until) => *until,
    }
}

/// The poller thread: runs until the listener stops (the stop channel is dropped).
pub(super) fn poll(
    sh: &Shared,
    queue: &Sender<Conn>,
    stopped: &Receiver<()>,
    woken: &Receiver<()>,
) {
    let mut scratch = vec![0u8; 16 << 10];
    loop {
        let empty = sh.parked.lock().is_empty();
        if empty {
            select! {
                recv(woken) -> _ => {},
                recv(stopped) -> _ => return,
            }
        } else if stopped
            .recv_timeout(TICK)
            .is_err_and(|e| e.is_disconnected())
        {
            return;
        }
        let list = std::mem::take(&mut *sh.parked.lock());
        let now = Instant::now();
        let mut kept = Vec::new();
        for parked in list {
            match parked {
                Parked::Conn(conn) => {
                    if let Some(conn) = look(sh, conn, queue, now) {
                        kept.push(Parked::Conn(conn));
                    }
                }
                Parked::Body(receiving) => kept.extend(look_body(sh, receiving, queue, now)),
                Parked::Linger(mut sock, peer, until) => {
                    if until > now && drain(&mut sock, &mut scratch, 64) {
                        kept.push(Parked::Linger(sock, peer, until));
                    }
                }
            }
        }
        let mut list = sh.parked.lock();
        list.extend(kept);
        count(sh, &list);
    }
}

/// Publishes what the poller holds, for `Pool::counts` (lingering closes are not counted).
fn count(sh: &Shared, list: &[Parked]) {
    let (mut heads, mut idle, mut bodies) = (0, 0, 0);
    for parked in list {
        match parked {
            Parked::Conn(conn) if conn.arrived.is_some() => bodies += 1,
            Parked::Conn(conn) if conn.inb.pending().is_empty() => idle += 1,
            Parked::Conn(_) => heads += 1,
            Parked::Body(..) => bodies += 1,
            Parked::Linger(..) => {}
        }
    }
    sh.held.heads.store(heads, Ordering::Relaxed);
    sh.held.bodies.store(bodies, Ordering::Relaxed);
    sh.held.idle.store(idle, Ordering::Relaxed);
}

/// A held connection: reads what has arrived; back on the queue once its head is whole, answered
/// when its head is refused or late, dropped when the peer left or an idle one timed out;
/// otherwise returned to stay held.
fn look(sh: &Shared, mut conn: Conn, queue: &Sender<Conn>, now: Instant) -> Option<Conn> {
    if conn.arrived.is_some() {
        return hand(sh, conn, queue, now);
    }
    let mut ended = false;
    for _ in 0..READS_PER_TICK {
        if conn.inb.pending().len() >= MAX_HEAD {
            break;
        }
        match conn.inb.fill_now(MAX_HEAD) {
            Fill::Data => {
                // The first byte of a kept connection's next head starts its deadline.
                let timeout = sh.settings.header_timeout;
                conn.head_by.get_or_insert(now + timeout);
            }
            Fill::Timeout => break,
            Fill::Eof => {
                ended = true;
                break;
            }
            Fill::Failed(e) => {
                log::debug!(
                    "parked connection failed listener={} error={}",
                    sh.name(),
                    crate::logfmt::val(&e.to_string())
                );
                return None;
            }
        }
    }
    match conn.inb.head_ready(&mut conn.scanned) {
        // A whole head followed by EOF is still served (the answer may be read).
        Ok(Some(_)) => hand(sh, conn, queue, now),
        Ok(None) if ended && conn.inb.pending().is_empty() => None,
        Ok(None) | Err(_) if ended => {
            let ended = HeadError::Bad("connection ended inside the head".into());
            refuse_head(sh, conn, ended);
            None
        }
        Err(err) => {
            refuse_head(sh, conn, err);
            None
        }
        Ok(None) if until_conn(&conn) > now => Some(conn),
        // Nothing of a head by the deadline: closed quietly, as an idle connection is.
        Ok(None) if conn.inb.pending().is_empty() => None,
        Ok(None) => {
            refuse_head(sh, conn, HeadError::Timeout);
            None
        }
    }
}

/// A request whose body is still coming: reads what has arrived (up to
/// [`BODY_READS_PER_TICK`]) into it; back on the queue once the body is whole or has failed
/// (too large, malformed, behind its pace, over the budget, the client gone), for the handler to
/// answer; otherwise kept.
fn look_body(
    sh: &Shared,
    mut r: Box<Receiving>,
    queue: &Sender<Conn>,
    now: Instant,
) -> Option<Parked> {
    let mut reads = 0;
    let body = loop {
        r.by = match r.wait.step(&mut r.conn.inb, now) {
            Ok(Some(by)) => by,
            Ok(None) => break Ok(()),
            Err(err) => break Err(err),
        };
        if reads == BODY_READS_PER_TICK {
            return Some(Parked::Body(r));
        }
        reads += 1;
        match r.conn.inb.fill_now(READ_PIECE) {
            Fill::Data => {}
            Fill::Timeout => return Some(Parked::Body(r)),
            // The client left (or its connection broke): the handler records it.
            ended @ (Fill::Eof | Fill::Failed(_)) => break Err(from_fill(ended)),
        }
    };
    let Receiving {
        mut conn,
        head,
        wait,
        ..
    } = *r;
    let body = body.map(|()| wait.finish());
    // It waits for a worker as a whole head does: until `client_header_timeout` from now.
    conn.head_by = Some(now + sh.settings.header_timeout);
    conn.arrived = Some(Box::new(Arrived { head, body }));
    hand(sh, conn, queue, now).map(Parked::Conn)
}

fn until_conn(conn: &Conn) -> Instant {
    conn.head_by.unwrap_or(conn.idle_until)
}

/// A connection with a whole head goes back to the workers. With the queue full, a new one is
/// refused `503 busy` (as the accept thread would); a kept one waits for room until its deadline.
fn hand(sh: &Shared, conn: Conn, queue: &Sender<Conn>, now: Instant) -> Option<Conn> {
    if conn.inb.wire().set_nonblocking(false).is_err() {
        return None;
    }
    match queue.try_send(conn) {
        Ok(()) => None,
        Err(TrySendError::Full(conn)) if conn.fresh || until_conn(&conn) <= now => {
            busy(sh, conn);
            None
        }
        Err(TrySendError::Full(conn)) => {
            let _ = conn.inb.wire().set_nonblocking(true);
            Some(conn)
        }
        Err(TrySendError::Disconnected(_)) => None,
    }
}

/// Reads and drops what a closing connection's peer still sends, at most `reads` reads of
/// `scratch` on a non-blocking socket; false once the peer is done.
pub(super) fn drain(sock: &mut TcpStream, scratch: &mut [u8], reads: usize) -> bool {
    for _ in 0..reads {
        match sock.read(scratch) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}
