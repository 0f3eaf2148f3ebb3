//! Read-only access: the admin API's and status page's reads while `serve` runs, and the whole of
//! `crossbar report` and `crossbar backup`.
//!
//! A reader opens the file read-only and never migrates it, so a newer crossbar's `report` cannot
//! change a file under an older running `serve`; a schema version it does not know is refused with
//! a message that says what to do. WAL lets it read while the writer thread commits.

use std::path::Path;

use parking_lot::Mutex;
use rusqlite::{params, Connection, OpenFlags};

use super::requests::{request_from_row, REQUEST_COLUMNS};
use super::schema::MIGRATIONS;
use super::{sql_limit, user_version, LeaseEvent, LeaseRow, RequestRow, StoreError};
use crate::fingerprint::Family;
use crate::holdings::Recent;

/// One read-only connection behind a mutex; every call is a short local read.
#[derive(Debug)]
pub struct Reader {
    conn: Mutex<Connection>,
}

impl Reader {
    /// Opens `path` read-only. A missing file, or a schema other than the one this crossbar
    /// writes, is an error that names the file and the versions.
    pub fn open(path: &Path) -> Result<Reader, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing(path.to_path_buf()));
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let open_err = |source| super::open_err(path, source);
        let conn = Connection::open_with_flags(path, flags).map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        let found = user_version(&conn).map_err(open_err)?;
        let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
        if found > known {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found,
                known,
            });
        }
        if found < known {
            return Err(StoreError::TooOld {
                path: path.to_path_buf(),
                found,
                known,
            });
        }
        Ok(Reader {
            conn: Mutex::new(conn),
        })
    }

    /// The schema version of the file (the number of migrations applied).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(user_version(&self.conn.lock())?)
    }

    /// All leases and pins, ordered by key.
    pub fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT route, fp, model, host, state, created, last_used FROM leases
             ORDER BY route, fp, model",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(LeaseRow {
                route: r.get(0)?,
                fp: r.get(1)?,
                model: r.get(2)?,
                host: r.get(3)?,
                state: r.get(4)?,
                created: r.get(5)?,
                last_used: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The latest `limit` events, newest first.
    pub fn recent_events(&self, limit: usize) -> Result<Vec<LeaseEvent>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT id, at, route, fp, model, reason, from_host, to_host FROM lease_events
             ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([sql_limit(limit)], |r| {
            Ok(LeaseEvent {
                id: r.get(0)?,
                at: r.get(1)?,
                route: r.get(2)?,
                fp: r.get(3)?,
                model: r.get(4)?,
                reason: r.get(5)?,
                from_host: r.get(6)?,
                to_host: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The latest `limit` accounting rows, newest first.
    pub fn recent_requests(&self, limit: usize) -> Result<Vec<RequestRow>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM requests ORDER BY id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([sql_limit(limit)], request_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Accounting rows that started at or after `since_ms`, of one route or all, oldest first.
    pub fn requests_since(
        &self,
        since_ms: i64,
        route: Option<&str>,
    ) -> Result<Vec<RequestRow>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM requests
             WHERE started >= ?1 AND (?2 IS NULL OR route = ?2)
             ORDER BY started, id"
        ))?;
        let rows = stmt.query_map(params![since_ms, route], request_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The newest `limit` answered rows that name a prompt family, oldest first, as the warm
    /// families hosts held (issue 23's rebuild at start). A first turn placed for its family
    /// carries its cached tokens: the family's measured size.
    pub fn recent_families(&self, limit: usize) -> Result<Vec<Recent>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT host, model, family, placed, cached_tokens FROM requests
             WHERE family != '' AND status < 400 AND host != ''
             ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([sql_limit(limit)], |r| {
            let family: String = r.get(2)?;
            let placed: String = r.get(3)?;
            let cached: Option<i64> = r.get(4)?;
            Ok(Family::parse_id(&family).map(|family| Recent {
                host: r.get(0).unwrap_or_default(),
                model: r.get(1).unwrap_or_default(),
                family,
                warm_first_cached: cached
                    .filter(|_| placed == "family")
                    .and_then(|c| u64::try_from(c).ok()),
            }))
        })?;
        let mut out: Vec<Recent> = rows
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        out.reverse();
        Ok(out)
    }

    /// Tokens (prompt plus completion) per client key since `since_ms`: each key's day so far,
    /// read once at start (issue 25's budgets are kept in memory).
    pub fn key_tokens_since(&self, since_ms: i64) -> Result<Vec<(String, u64)>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT key, sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0))
             FROM requests WHERE started >= ?1 AND key != '' GROUP BY key",
        )?;
        let rows = stmt.query_map([since_ms], |r| {
            let tokens: i64 = r.get(1)?;
            Ok((r.get::<_, String>(0)?, u64::try_from(tokens).unwrap_or(0)))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The connection, for `backup`.
    pub(super) fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        f(&self.conn.lock())
    }
}
