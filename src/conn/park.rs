//! Connections no worker holds: idle keep-alive connections parked while others wait for a worker,
//! and closing connections lingering so an answer sent before unread request bytes is not lost to a
//! reset. One poller thread per listener looks at them every few milliseconds with non-blocking
//! reads; a parked connection whose next request starts to arrive goes back on the accept queue.
//! Both lists are capped; nothing here blocks on a socket.

use std::io::{ErrorKind, Read};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TrySendError};

use super::inbound::Inbound;
use super::pool::{Conn, Shared};

/// How often parked connections are looked at.
const TICK: Duration = Duration::from_millis(10);
/// Most connections parked or lingering per listener; past it the oldest is closed.
const MAX_PARKED: usize = 1024;
/// How long a closing connection's unread bytes are drained before it is closed anyway.
const LINGER: Duration = Duration::from_secs(2);

/// A connection the poller holds.
#[derive(Debug)]
pub(super) enum Parked {
    /// Idle between requests; back to the queue when bytes arrive.
    Idle(Conn),
    /// Answered and half-closed; dropped at EOF or when `until` passes.
    Linger(TcpStream, Instant),
}

/// Hands an idle connection to the poller.
pub(super) fn park(sh: &Shared, conn: Conn) {
    if conn.inb.wire().set_nonblocking(true).is_ok() {
        add(sh, Parked::Idle(conn));
    }
}

/// Closes a connection once its peer has read the answer: our side is shut for writing now (the
/// client sees the end), bytes it still sends are read and dropped for up to [`LINGER`].
pub(super) fn linger(sh: &Shared, inb: Inbound<TcpStream>) {
    let sock = inb.into_wire();
    let _ = sock.shutdown(Shutdown::Write);
    if sock.set_nonblocking(true).is_ok() {
        add(sh, Parked::Linger(sock, Instant::now() + LINGER));
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
        Parked::Idle(conn) => conn.idle_until,
        Parked::Linger(_, until) => *until,
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
            if until(&parked) <= now {
                continue;
            }
            match parked {
                Parked::Idle(conn) => {
                    if let Some(conn) = look(sh, conn, queue) {
                        kept.push(Parked::Idle(conn));
                    }
                }
                Parked::Linger(mut sock, until) => {
                    if drain(&mut sock, &mut scratch) {
                        kept.push(Parked::Linger(sock, until));
                    }
                }
            }
        }
        if !kept.is_empty() {
            sh.parked.lock().extend(kept);
        }
    }
}

/// An idle connection: back on the queue when its next request has started to arrive, dropped
/// when the peer left; otherwise returned to stay parked.
fn look(sh: &Shared, conn: Conn, queue: &Sender<Conn>) -> Option<Conn> {
    let mut b = [0u8; 1];
    match conn.inb.wire().peek(&mut b) {
        Ok(0) => None,
        Ok(_) => {
            if conn.inb.wire().set_nonblocking(false).is_err() {
                return None;
            }
            match queue.try_send(conn) {
                Ok(()) => None,
                Err(TrySendError::Full(conn)) => {
                    let _ = conn.inb.wire().set_nonblocking(true);
                    Some(conn)
                }
                Err(TrySendError::Disconnected(_)) => None,
            }
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Some(conn),
        Err(e) => {
            log::debug!(
                "parked connection failed listener={} error={}",
                sh.name(),
                crate::logfmt::val(&e.to_string())
            );
            None
        }
    }
}

/// Reads and drops what a closing connection's peer still sends; false once it is done.
fn drain(sock: &mut TcpStream, scratch: &mut [u8]) -> bool {
    for _ in 0..64 {
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
