//! `crossbar backup FILE`: a consistent copy of the database, taken while `serve` runs, verified
//! before it gets its name.
//!
//! SQLite's online backup API copies every page in one step under one read snapshot (so steady
//! traffic cannot restart it forever); the lease and request counts are read in that same snapshot
//! and must match the copy's, and the copy must pass `integrity_check`. The copy is written beside
//! FILE as `FILE.partial` and renamed only once verified, so a failed backup never looks like one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::Connection;

use super::reader::Reader;
use super::{open_err, StoreError};

/// Attempts at the one-step copy when the source is momentarily locked (a checkpoint).
const ATTEMPTS: u32 = 50;
const RETRY: Duration = Duration::from_millis(100);

/// What a verified backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub path: PathBuf,
    pub schema: i64,
    pub leases: i64,
    pub requests: i64,
    pub integrity: String,
}

/// Copies `db` to `dest` (which must not exist) and verifies the copy.
pub fn backup(db: &Path, dest: &Path) -> Result<BackupReport, StoreError> {
    if dest.exists() {
        return Err(StoreError::BackupExists(dest.to_path_buf()));
    }
    let reader = Reader::open(db)?;
    let schema = reader.schema_version()?;
    let mut partial = dest.as_os_str().to_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = std::fs::remove_file(&partial);
    let fail = |detail: String| StoreError::BackupFailed {
        path: dest.to_path_buf(),
        detail,
    };
    let mut copy = Connection::open(&partial).map_err(|e| open_err(&partial, e))?;
    let (leases, requests) = reader.with_conn(|src| copy_pages(src, &mut copy))?;
    // One self-contained file: no -wal beside the copy.
    let _mode: String = copy.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
    let integrity: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    let copied = |table: &str| -> Result<i64, StoreError> {
        Ok(copy.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?)
    };
    let (copied_leases, copied_requests) = (copied("leases")?, copied("requests")?);
    let copied_schema = super::user_version(&copy)?;
    drop(copy);
    let verdict = if integrity != "ok" {
        Some(format!("integrity_check says {integrity:?}"))
    } else if (copied_leases, copied_requests) != (leases, requests) || copied_schema != schema {
        Some(format!(
            "the copy holds {copied_leases} leases and {copied_requests} requests (schema \
             {copied_schema}), the database held {leases} and {requests} (schema {schema})"
        ))
    } else {
        None
    };
    if let Some(detail) = verdict {
        let _ = std::fs::remove_file(&partial);
        return Err(fail(detail));
    }
    std::fs::rename(&partial, dest).map_err(|e| fail(format!("cannot rename the copy: {e}")))?;
    Ok(BackupReport {
        path: dest.to_path_buf(),
        schema,
        leases,
        requests,
        integrity,
    })
}

/// Copies every page in one step inside one read transaction, returning the lease and request
/// counts that transaction saw.
fn copy_pages(src: &Connection, copy: &mut Connection) -> Result<(i64, i64), StoreError> {
    let tx = src.unchecked_transaction()?;
    let leases: i64 = tx.query_row("SELECT count(*) FROM leases", [], |r| r.get(0))?;
    let requests: i64 = tx.query_row("SELECT count(*) FROM requests", [], |r| r.get(0))?;
    {
        let backup = Backup::new(&tx, copy)?;
        let mut attempts = 0;
        loop {
            match backup.step(-1)? {
                StepResult::Done => break,
                StepResult::More | StepResult::Busy | StepResult::Locked if attempts < ATTEMPTS => {
                    attempts += 1;
                    std::thread::sleep(RETRY);
                }
                other => {
                    return Err(StoreError::BackupFailed {
                        path: PathBuf::new(),
                        detail: format!("the source stayed busy ({other:?})"),
                    })
                }
            }
        }
    }
    tx.finish()?;
    Ok((leases, requests))
}
