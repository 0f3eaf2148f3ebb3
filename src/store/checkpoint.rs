//! WAL checkpoints off the commit path: the writer's connection never checkpoints
//! (`wal_autocheckpoint = 0`); this thread runs a passive checkpoint on its own connection every
//! [`EVERY`], while the writer keeps committing (WAL lets both run at once).
//!
//! Before, SQLite's automatic checkpoint ran inside whichever commit crossed 1,000 WAL pages, and
//! every worker waiting on that group commit waited for the copy and its fsync with it (the p99 of a
//! commit wait was 12 ms at 32 writers, the max 20 ms). A passive checkpoint never waits for readers
//! or the writer; what it cannot copy now it copies next time.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use rusqlite::Connection;

use super::{open_err, StoreError};

/// How often the WAL is copied back into the database file.
const EVERY: Duration = Duration::from_millis(200);

/// The checkpoint thread; dropping it stops and joins it.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn start(path: &Path, wal_limit: u64) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path).map_err(|e| open_err(path, e))?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::path::PathBuf::from(wal);
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| open_err(path, e))?;
        let (stop, stopped) = bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || loop {
                match stopped.recv_timeout(EVERY) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
                let mode = if size > wal_limit {
                    "PRAGMA wal_checkpoint(TRUNCATE)"
                } else {
                    "PRAGMA wal_checkpoint(PASSIVE)"
                };
                // A failure (a full disk) is the writer's to report; this tries again next tick.
                if let Err(err) = conn.query_row(mode, [], |_| Ok(())) {
                    log::debug!(
                        "wal checkpoint failed error={}",
                        crate::logfmt::val(&err.to_string())
                    );
                }
            })
            .expect("the OS refused to start a thread");
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
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
