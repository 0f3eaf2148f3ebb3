//! WAL checkpoints off the commit path: the writer's connection never checkpoints
//! (`wal_autocheckpoint = 0`); this thread runs a passive checkpoint on its own connection every
//! [`EVERY`], while the writer keeps committing (WAL lets both run at once). Once the WAL is all
//! copied back it sleeps until the writer's next commit ([`Nudge`]), at most [`IDLE_MAX`]: an idle
//! gateway's thread woke five times a second to copy nothing (issue 26's wake-ups).
//!
//! Before, SQLite's automatic checkpoint ran inside whichever commit crossed 1,000 WAL pages, and
//! every worker waiting on that group commit waited for the copy and its fsync with it (the p99 of a
//! commit wait was 12 ms at 32 writers, the max 20 ms). A passive checkpoint never waits for readers
//! or the writer; what it cannot copy now it copies next time.
//!
//! The WAL is reset (`TRUNCATE`) once it is over its limit and wholly copied back, waiting at most
//! [`RESET_WAIT`]: with a reader on an old snapshot it holds the write lock while it waits, and
//! every commit with it (5 s stalls in the drill, with SQLite's usual 5 s). When the disk fills, it gives up the db's reserve
//! (`reserve`) and holds writes back until the WAL is copied back and reset, then lets them go on
//! and takes the reserve again once they have gone through for a while.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use rusqlite::Connection;

use super::health::StoreHealth;
use super::reserve::Reserve;
use super::{open_err, StoreError};
use crate::logfmt::val;

/// How often the WAL is copied back into the database file.
const EVERY: Duration = Duration::from_millis(200);
/// Longest a WAL reset waits for the writer or a reader: long enough to fall between two commits
/// under steady load, short enough that the commits it holds up barely notice (5 s before).
const RESET_WAIT: Duration = Duration::from_millis(20);
/// How long after a reserve could not be written (no room) it is tried again.
const RETRY: Duration = Duration::from_secs(600);
/// Longest the thread sleeps with the WAL all copied back and no commit since: a safety net, as
/// every commit nudges it.
pub(super) const IDLE_MAX: Duration = Duration::from_secs(10);

/// The writer's word to the checkpoint thread that a commit wrote to the WAL. One word is kept
/// however many commits come, so a commit costs one look at a full channel while the thread
/// already knows, and a wake-up only when it sleeps idle.
#[derive(Debug, Clone)]
pub(super) struct Nudge(Sender<()>);

impl Nudge {
    pub(super) fn wrote(&self) {
        let _ = self.0.try_send(());
    }

    /// A nudge nobody hears, for a writer started without a checkpoint thread.
    #[cfg(test)]
    pub(super) fn nowhere() -> Nudge {
        Nudge(bounded(1).0)
    }
}

/// The checkpoint thread; dropping it stops and joins it.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What the checkpoint thread keeps between ticks.
struct Wal {
    conn: Connection,
    wal: PathBuf,
    limit: u64,
    health: Arc<StoreHealth>,
    reserve: Reserve,
    /// How long writes must have gone through (since the start, or since a full disk) before
    /// the reserve is taken.
    settle: Duration,
    /// When the reserve may be (re)taken.
    take_at: Instant,
}

impl Checkpointer {
    pub(super) fn start(
        path: &Path,
        bounds: super::Bounds,
        health: Arc<StoreHealth>,
        reserve: Reserve,
    ) -> Result<(Checkpointer, Nudge), StoreError> {
        let conn = Connection::open(path).map_err(|e| open_err(path, e))?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        // A passive checkpoint never waits; the reset waits at most this long for the writer or a
        // reader, holding the write lock meanwhile, then tries again next tick.
        conn.busy_timeout(RESET_WAIT)
            .map_err(|e| open_err(path, e))?;
        let mut state = Wal {
            conn,
            wal: PathBuf::from(wal),
            limit: bounds.wal,
            health,
            reserve,
            settle: bounds.settle,
            take_at: Instant::now() + bounds.settle,
        };
        let (stop, stopped) = bounded::<()>(0);
        let (nudge, wrote) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || loop {
                if let Err(RecvTimeoutError::Disconnected) = stopped.recv_timeout(EVERY) {
                    return;
                }
                // A commit after this look leaves its word for the idle wait below.
                let _ = wrote.try_recv();
                let now = Instant::now();
                let done = state.tick(now);
                state.health.passed();
                if !done {
                    continue;
                }
                crossbeam_channel::select! {
                    recv(stopped) -> _ => return,
                    recv(wrote) -> _ => {}
                    default(state.idle_for(now)) => {}
                }
            })
            .expect("the OS refused to start a thread");
        let checkpointer = Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        };
        Ok((checkpointer, Nudge(nudge)))
    }
}

impl Wal {
    /// One checkpoint and what follows it; true when nothing is left to do until the next
    /// commit: the WAL all copied back, no disk full being dealt with.
    fn tick(&mut self, now: Instant) -> bool {
        let copied = match self.checkpoint("PASSIVE") {
            Ok(copied) => copied,
            Err(err) => {
                let full = err.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
                if full {
                    self.reclaim();
                }
                // Any other failure is the writer's to report; this tries again next tick.
                log::debug!("wal checkpoint failed error={}", val(&err.to_string()));
                false
            }
        };
        if self.health.disk_full() {
            self.reclaim();
        }
        let reclaiming = self.health.reclaiming();
        if copied && (reclaiming || self.size() > self.limit) {
            let _ = self.checkpoint("TRUNCATE");
        }
        if reclaiming && self.size() == 0 {
            self.health.set_reclaiming(false);
            self.take_at = now + self.settle;
            log::info!("store wal copied back and reset; writes go on");
        }
        if !reclaiming && now >= self.take_at && !self.reserve.held() && self.health.status().ok {
            match self.reserve.take() {
                Ok(()) => log::debug!("store reserve taken"),
                Err(err) => {
                    self.take_at = now + RETRY;
                    log::warn!(
                        "store reserve not taken file={} error={}; a WAL that fills the disk will \
                         need space freed by hand",
                        val(&self.reserve.path().display().to_string()),
                        val(&err.to_string())
                    );
                }
            }
        }
        copied && !reclaiming
    }

    /// How long an idle thread sleeps without a commit: until the reserve is due, if it is not
    /// held, and never past [`IDLE_MAX`].
    fn idle_for(&self, now: Instant) -> Duration {
        let due = (!self.reserve.held()).then(|| self.take_at.saturating_duration_since(now));
        due.map_or(IDLE_MAX, |due| due.min(IDLE_MAX))
    }

    /// Runs a checkpoint in `mode`: true when the whole WAL is now in the db.
    fn checkpoint(&self, mode: &str) -> rusqlite::Result<bool> {
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        self.conn.query_row(&sql, [], |row| {
            let (busy, log, done): (i64, i64, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
            Ok(busy == 0 && log == done)
        })
    }

    /// The disk is full: while there is a reserve to give up, writes are held back so the WAL
    /// stops growing, and the reserve is given up so the WAL can be copied back into the db. With
    /// none (a disk full of something else) there is nothing to gain: writes fail as they come.
    fn reclaim(&mut self) {
        if self.health.reclaiming() || !self.reserve.held() {
            return;
        }
        self.health.set_reclaiming(true);
        let freed = self.reserve.release();
        log::warn!(
            "store disk full reserve_released={freed} wal_bytes={}; writes wait until the WAL is \
             copied back and reset (a reader left open on the db, such as a sqlite3 shell in a \
             transaction, delays it)",
            self.size()
        );
    }

    fn size(&self) -> u64 {
        std::fs::metadata(&self.wal).map_or(0, |m| m.len())
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
