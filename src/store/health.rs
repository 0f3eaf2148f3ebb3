//! Whether the database takes writes: the writer thread reports every commit here.
//!
//! A failure is logged once when a burst starts (with SQLite's own cause and what an operator can
//! do about it), counted while it lasts, and a line marks the recovery. `crossbar status`, the
//! status page and `/metrics` read [`StoreHealth::status`]. No I/O here beyond the log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rusqlite::ErrorCode;

use super::{unix_ms, StoreError};
use crate::logfmt::val;

/// What the writer thread last saw.
#[derive(Debug)]
pub struct StoreHealth {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// The disk filled: writes are refused, so the WAL stops growing, until the checkpoint thread
    /// has copied it back and reset it (`checkpoint`, `reserve`).
    reclaiming: AtomicBool,
    /// Checkpoint passes the checkpoint thread has made: what a test waits on to know the thread
    /// has looked again, instead of a guessed sleep.
    passes: AtomicU64,
}

/// Invariant: `failing` is `Some` from the first failed commit until the next successful one.
#[derive(Debug, Default)]
struct Inner {
    failing: Option<Failing>,
    write_errors: u64,
}

#[derive(Debug, Clone)]
struct Failing {
    since: i64,
    cause: String,
    /// The burst's failures include a full disk.
    full: bool,
    failed: u64,
    /// Writing commits in a row since the last failure.
    good: u32,
}

/// Writing commits in a row that end a failure burst. On a file system at the edge of full some
/// writes still fit (a page freed, the WAL restarted) between ones that do not; without this the
/// log would say "failing" and "recovered" several times a second.
const RECOVERED_AFTER: u32 = 10;

/// The store's state as status and metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    pub ok: bool,
    /// When the current failure burst started (unix ms); 0 when ok.
    pub since: i64,
    /// SQLite's message for the first failure of the burst; "" when ok.
    pub cause: String,
    /// Failed commits since start.
    pub write_errors: u64,
}

impl StoreHealth {
    pub(super) fn new(path: &Path) -> StoreHealth {
        StoreHealth {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner::default()),
            reclaiming: AtomicBool::new(false),
            passes: AtomicU64::new(0),
        }
    }

    /// One more checkpoint pass (the checkpoint thread, after each).
    pub(super) fn passed(&self) {
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Checkpoint passes so far.
    #[cfg(test)]
    pub(super) fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Whether commits are failing on a full disk now.
    pub(super) fn disk_full(&self) -> bool {
        self.inner.lock().failing.as_ref().is_some_and(|f| f.full)
    }

    /// Whether writes are held back while the WAL is copied back and reset.
    pub(super) fn reclaiming(&self) -> bool {
        self.reclaiming.load(Ordering::Relaxed)
    }

    pub(super) fn set_reclaiming(&self, on: bool) {
        self.reclaiming.store(on, Ordering::Relaxed);
    }

    pub fn status(&self) -> StoreStatus {
        let inner = self.inner.lock();
        match &inner.failing {
            Some(f) => StoreStatus {
                ok: false,
                since: f.since,
                cause: f.cause.clone(),
                write_errors: inner.write_errors,
            },
            None => StoreStatus {
                ok: true,
                since: 0,
                cause: String::new(),
                write_errors: inner.write_errors,
            },
        }
    }

    /// A commit succeeded. If it `wrote` anything and is the [`RECOVERED_AFTER`]th such in a row,
    /// it ends the failure burst, with one line.
    pub(super) fn committed(&self, wrote: bool) {
        if !wrote {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(f) = &mut inner.failing {
            f.good += 1;
            if f.good < RECOVERED_AFTER {
                return;
            }
        }
        let ended = inner.failing.take();
        drop(inner);
        // Logged with no lock held: a full log queue waits, and `status` must not wait with it.
        if let Some(f) = ended {
            let secs = (unix_ms(SystemTime::now()) - f.since).max(0) / 1000;
            log::info!(
                "store recovered db={} failed_writes={} after_s={secs}",
                val(&self.path.display().to_string()),
                f.failed
            );
        }
    }

    /// Turns a commit's result into the callers' answer, noting a failure.
    pub(super) fn outcome(&self, result: rusqlite::Result<bool>) -> Result<(), StoreError> {
        match result {
            Ok(wrote) => {
                self.committed(wrote);
                Ok(())
            }
            Err(err) => {
                self.failed(&err);
                Err(StoreError::Write(Arc::new(err)))
            }
        }
    }

    fn failed(&self, err: &rusqlite::Error) {
        let full = err.sqlite_error_code() == Some(ErrorCode::DiskFull);
        let mut inner = self.inner.lock();
        inner.write_errors += 1;
        if let Some(f) = &mut inner.failing {
            f.failed += 1;
            f.good = 0;
            f.full |= full;
            return;
        }
        let cause = err.to_string();
        inner.failing = Some(Failing {
            since: unix_ms(SystemTime::now()),
            cause: cause.clone(),
            full,
            failed: 1,
            good: 0,
        });
        drop(inner);
        log::error!(
            "store failing db={} cause={} hint={}; new conversations get 503 store unavailable and \
             accounting rows are lost until a write succeeds",
            val(&self.path.display().to_string()),
            val(&cause),
            val(hint(err))
        );
    }
}

/// What an operator can do about a write error.
fn hint(err: &rusqlite::Error) -> &'static str {
    match err.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => "free space on the file system that holds the db",
        Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            "make the db file and its directory writable by crossbar"
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            "another connection held a write lock on the db for 5 s (another process, or a sqlite3 \
             shell in a write transaction); end its transaction"
        }
        Some(ErrorCode::SystemIoFailure) => "check the disk and the kernel log for I/O errors",
        _ => "see the cause; crossbar retries with every write",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Issue 17: a burst of failed commits is one failure with its first cause; a commit ends it.
    #[test]
    fn a_failure_burst_keeps_its_first_cause_until_a_commit_succeeds() {
        crate::testlog::capture();
        let health = StoreHealth::new(Path::new("/var/lib/crossbar/crossbar.db"));
        assert!(health.status().ok);
        let full = || {
            Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                None,
            ))
        };
        let err = health.outcome(full()).unwrap_err();
        assert_eq!(err.to_string(), "store unavailable");
        let locked = Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        ));
        assert!(health.outcome(locked).is_err());
        let status = health.status();
        assert!(!status.ok);
        assert_eq!(status.write_errors, 2);
        assert!(status.cause.contains("full"), "{status:?}");
        assert!(health.outcome(Ok(false)).is_ok());
        assert!(
            !health.status().ok,
            "a commit that changed nothing proves nothing"
        );
        for _ in 1..RECOVERED_AFTER {
            assert!(health.outcome(Ok(true)).is_ok());
        }
        assert!(
            !health.status().ok,
            "not yet: writes at the edge of full flap"
        );
        assert!(health.outcome(Ok(true)).is_ok());
        let status = health.status();
        assert!(status.ok && status.cause.is_empty() && status.since == 0);
        assert_eq!(status.write_errors, 2, "the count is since start");
        // The log says it twice, not once per failed write: when the burst starts, and when it ends.
        let lines = crate::testlog::mine();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].starts_with(
                "ERROR store failing db=/var/lib/crossbar/crossbar.db cause=\"Error code 13: Insertion \
                 failed because database is full\" hint=\"free space on the file system that holds \
                 the db\"; new conversations get 503"
            ),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(
                "INFO store recovered db=/var/lib/crossbar/crossbar.db failed_writes=2 after_s="
            ),
            "{lines:?}"
        );
    }
}
