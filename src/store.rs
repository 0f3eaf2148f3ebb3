//! The SQLite store: leases, lease events and per-request accounting rows (spec §6).
//!
//! This is the only module that touches rusqlite. It owns the schema (append-only migrations keyed
//! by `PRAGMA user_version`, in the manner of cargo's `util/sqlite.rs`) and the row types the rest of
//! the crate reads and writes. It makes no decisions: which lease lives where is `lease`'s business,
//! what a request row contains is the proxy's. It does no network I/O and holds its connection
//! lock only for its own SQL; every call is a short local-file read or write.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rusqlite::{params, Connection};

mod requests;
mod schema;
#[cfg(test)]
pub(crate) mod tests;

/// Whether a `leases` row is a conversation's lease or a route's pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// A lease taken by traffic; stored as `active`.
    Active,
    /// An operator's pin (`fp = model = ''`); stored as `pinned`.
    Pinned,
}

/// One row of the `leases` table. Times are unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub route: String,
    pub fp: String,
    pub model: String,
    pub host: String,
    pub state: LeaseState,
    pub created: i64,
    pub last_used: i64,
}

/// Why a lease event happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A lease was created.
    New,
    /// A lease left a host that was not healthy.
    Unhealthy,
    /// A lease expired after `lease_idle`.
    Idle,
    /// An operator released a route, or unpinned it.
    Release,
    /// An operator pinned a route.
    Pin,
    /// The context guard moved a conversation to a host where its prompt fits.
    Ctx,
    /// A config reload removed the lease's host.
    Removed,
}

/// One row of the `lease_events` table; `id` is 0 until stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEvent {
    pub id: i64,
    pub at: i64,
    pub route: String,
    pub fp: String,
    pub model: String,
    pub reason: Reason,
    pub from_host: String,
    pub to_host: String,
}

/// One row of the `requests` table; `id` is 0 until stored. Token counts are `None` when the
/// upstream did not report them (stored as NULL, never as 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestRow {
    pub id: i64,
    pub started: i64,
    pub route: String,
    /// The API the request spoke (`crate::api::Api::name`); `""` in rows older than the column.
    pub api: String,
    pub fp: String,
    pub model: String,
    pub host: String,
    pub queued_ms: i64,
    pub ttfb_ms: i64,
    pub total_ms: i64,
    pub status: u16,
    pub streamed: bool,
    pub prompt_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub err: String,
    /// The context guard's estimate of the prompt (bytes / 4 × 1.2); `None` when the guard did
    /// not look (metadata, or refused before).
    pub ctx_est: Option<i64>,
    /// The prompt's exact token count, when the guard asked a host for it (the estimate did not
    /// fit); `None` otherwise.
    pub ctx_exact: Option<i64>,
}

/// The database. Cheap calls on one connection behind a mutex; every call is a short local write
/// or read.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
}

/// Everything that can go wrong talking to the database.
#[derive(Debug)]
pub enum StoreError {
    /// The file could not be opened, set up or written at open.
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The file was written by a newer crossbar whose schema this one does not know.
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// A migration failed; nothing of it was applied.
    Migrate {
        path: PathBuf,
        version: usize,
        source: rusqlite::Error,
    },
    /// Any other SQLite failure.
    Sqlite(rusqlite::Error),
}

/// Milliseconds since the unix epoch (negative before it).
pub fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

impl Store {
    /// Opens (creating if missing) the database at `path`, sets WAL mode and runs migrations.
    /// A file that cannot be opened or written fails here, not at the first lease.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let conn = Connection::open(path).map_err(|source| open_err(path, source))?;
        Store::setup(path, conn)
    }

    /// A private database that lives as long as the `Store` (tests, `crossbar check`).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = Path::new(":memory:");
        let conn = Connection::open_in_memory().map_err(|source| open_err(path, source))?;
        Store::setup(path, conn)
    }

    /// The schema version of the open database (the number of migrations applied).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        let conn = self.conn.lock();
        Ok(user_version(&conn)?)
    }

    /// Inserts or replaces the lease keyed by `route`, `fp`, `model`.
    pub fn save_lease(&self, row: &LeaseRow) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "INSERT INTO leases (route, fp, model, host, state, created, last_used)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (route, fp, model) DO UPDATE SET
               host = excluded.host, state = excluded.state,
               created = excluded.created, last_used = excluded.last_used",
        )?;
        stmt.execute(params![
            row.route,
            row.fp,
            row.model,
            row.host,
            row.state,
            row.created,
            row.last_used
        ])?;
        Ok(())
    }

    /// Deletes one lease (or pin); deleting a missing one is not an error.
    pub fn delete_lease(&self, route: &str, fp: &str, model: &str) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        let mut stmt =
            conn.prepare_cached("DELETE FROM leases WHERE route = ?1 AND fp = ?2 AND model = ?3")?;
        stmt.execute(params![route, fp, model])?;
        Ok(())
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

    /// Appends an event (its `id` is ignored) and returns the id it was stored under.
    pub fn record_event(&self, ev: &LeaseEvent) -> Result<i64, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(
            "INSERT INTO lease_events (at, route, fp, model, reason, from_host, to_host)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        stmt.execute(params![
            ev.at,
            ev.route,
            ev.fp,
            ev.model,
            ev.reason,
            ev.from_host,
            ev.to_host
        ])?;
        Ok(conn.last_insert_rowid())
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

    fn setup(path: &Path, conn: Connection) -> Result<Store, StoreError> {
        let err = |source| open_err(path, source);
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        // In-memory databases answer "memory" and stay that way; files switch to WAL so that the
        // sqlite3 shell can read them while crossbar writes.
        let _mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        let mut conn = conn;
        schema::migrate(path, &mut conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }
}

fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn open_err(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        source,
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT user_version FROM pragma_user_version", [], |r| {
        r.get(0)
    })
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Pinned => "pinned",
        }
    }
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::New => "new",
            Reason::Unhealthy => "unhealthy",
            Reason::Idle => "idle",
            Reason::Release => "release",
            Reason::Pin => "pin",
            Reason::Ctx => "ctx",
            Reason::Removed => "removed",
        }
    }

    pub(crate) const ALL: [Reason; 7] = [
        Reason::New,
        Reason::Unhealthy,
        Reason::Idle,
        Reason::Release,
        Reason::Pin,
        Reason::Ctx,
        Reason::Removed,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Open { path, .. } => {
                write!(f, "cannot open or write database {}", path.display())
            }
            StoreError::TooNew { path, found, known } => write!(
                f,
                "database {} has schema version {found}, but this crossbar knows only up to \
                 version {known}; run a newer crossbar or point `db` at another file",
                path.display()
            ),
            StoreError::Migrate { path, version, .. } => {
                write!(
                    f,
                    "cannot migrate database {} to schema version {version}",
                    path.display()
                )
            }
            StoreError::Sqlite(_) => f.write_str("database error"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Open { source, .. } | StoreError::Migrate { source, .. } => Some(source),
            StoreError::Sqlite(e) => Some(e),
            StoreError::TooNew { .. } => None,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Sqlite(e)
    }
}
