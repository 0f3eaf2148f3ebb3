//! One database, one gateway: `serve` holds an exclusive lock on `<db>.lock` for its whole life.
//!
//! The lock is the kernel's (`flock` through std's `File::try_lock`), so it goes away with the
//! process however it ends — a SIGKILL never leaves a stale lock behind. The file holds the
//! holder's pid, for the refusal message only. Readers (`report`, `backup`, the sqlite3 shell) do
//! not take it: WAL lets them read beside the writer.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct DbLock {
    _file: File,
}

/// Why the lock could not be taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it; `pid` is what that process wrote, if readable.
    Held { db: PathBuf, pid: Option<u32> },
    /// The lock file could not be created or locked.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The lock file next to `db`: `crossbar.db` → `crossbar.db.lock`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

impl DbLock {
    /// Takes the lock for `db` without waiting, and writes this process's pid into it.
    pub fn acquire(db: &Path) -> Result<DbLock, LockError> {
        let path = lock_path(db);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    db: db.to_path_buf(),
                    pid: read_pid(&mut file),
                })
            }
            Err(TryLockError::Error(err)) => return Err(io(err)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(DbLock { _file: file })
    }

    /// Who holds the lock of `db` right now, without keeping it: `None` when nobody does (or
    /// the lock file cannot be opened). For `crossbar check`, which must work beside `serve`.
    pub fn holder(db: &Path) -> Option<Option<u32>> {
        let mut file = File::open(lock_path(db)).ok()?;
        match file.try_lock_shared() {
            Ok(()) => None,
            Err(TryLockError::WouldBlock) => Some(read_pid(&mut file)),
            Err(TryLockError::Error(_)) => None,
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { db, pid } => {
                write!(f, "database {} is in use by another crossbar", db.display())?;
                match pid {
                    Some(pid) => write!(f, " (pid {pid})"),
                    None => Ok(()),
                }
            }
            LockError::Io { path, .. } => write!(f, "cannot lock {}", path.display()),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Io { source, .. } => Some(source),
            LockError::Held { .. } => None,
        }
    }
}
