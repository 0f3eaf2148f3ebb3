//! The SQLite store: leases, lease events and per-request accounting rows (spec §6).
//!
//! This is the only module that touches rusqlite. It owns the schema (append-only migrations keyed
//! by `PRAGMA user_version`, in the manner of cargo's `util/sqlite.rs`) and the row types the rest of
//! the crate reads and writes (`rows`). It makes no decisions: which lease lives where is `lease`'s business,
//! what a request row contains is the proxy's. It does no network I/O and holds its connection
//! lock only for its own SQL. Writes go through one writer (`writer`: the waiting caller's
//! thread or the writer thread), reads through a read-only connection (`reader`); `lock` keeps a second `serve` off the file, `backup` copies it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use rusqlite::Connection;

mod backup;
mod checkpoint;
mod health;
mod lock;
mod reader;
mod requests;
mod reserve;
mod rows;
mod schema;
mod write;
mod writer;

pub use backup::{backup, BackupReport};
use checkpoint::Checkpointer;
pub use health::{StoreHealth, StoreStatus};
pub use lock::{lock_path, DbLock, LockError};
pub use reader::Reader;
pub use rows::{LeaseEvent, LeaseRow, LeaseState, Reason, RequestRow};
pub use write::Write;
use writer::Writer;
pub use writer::{Coming, Then, Ticket};
#[cfg(test)]
pub(crate) mod tests;

/// The database as `serve` uses it: writes go to the one writer thread ([`Write`], [`Ticket`]),
/// reads to a separate read-only connection ([`Reader`]), so an admin read never waits behind a
/// commit and a commit never waits behind a page render.
#[derive(Debug)]
pub struct Store {
    reader: Reader,
    writer: Writer,
    /// Declared after the writer: the writer's last commits land before it stops.
    _checkpointer: Checkpointer,
    health: Arc<StoreHealth>,
}

/// Everything that can go wrong talking to the database.
#[derive(Debug)]
pub enum StoreError {
    /// The file could not be opened, set up or written at open.
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A reader was pointed at a file that does not exist.
    Missing(PathBuf),
    /// The file was written by a newer crossbar whose schema this one does not know.
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// A reader found a schema older than this crossbar's (only `serve` migrates).
    TooOld {
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
    /// The writer thread could not commit (disk full, read-only file, I/O error).
    Write(Arc<rusqlite::Error>),
    /// The writer thread did not answer in time.
    Stalled,
    /// The writer thread is gone (the store is shutting down).
    Stopped,
    /// `backup` will not overwrite a file.
    BackupExists(PathBuf),
    /// The copy could not be made or did not verify.
    BackupFailed { path: PathBuf, detail: String },
    /// Any other SQLite failure (reads).
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
    /// Opens (creating if missing) the database at `path`, sets WAL mode, runs migrations and
    /// starts the writer thread. A file that cannot be opened or written fails here, not at the
    /// first lease. Dropping the store commits what is queued and joins the writer.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with_wal_limit(path, WAL_LIMIT)
    }

    /// [`Store::open`] with the WAL kept under `wal_limit` bytes (issue 24): past it, the
    /// checkpoint thread copies the WAL back and truncates it, and a WAL the writer resets is cut
    /// back to the limit (`journal_size_limit`).
    pub fn open_with_wal_limit(path: &Path, wal_limit: u64) -> Result<Store, StoreError> {
        let bounds = Bounds {
            wal: wal_limit,
            ..Bounds::default()
        };
        Store::open_with(path, bounds)
    }

    /// [`Store::open`] with its WAL and disk bounds.
    pub(crate) fn open_with(path: &Path, bounds: Bounds) -> Result<Store, StoreError> {
        let wal_limit = bounds.wal;
        // The reserve's space is the db's to start on (a WAL that filled the disk is copied back
        // as the db opens); the checkpoint thread takes it again once writes have gone through
        // for a while.
        let reserve = reserve::Reserve::of(path, bounds.reserve);
        reserve.release();
        let conn = Connection::open(path).map_err(|source| open_err(path, source))?;
        let conn = setup(path, conn)?;
        // Checkpoints run on their own thread (`checkpoint`), never inside a group commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|source| open_err(path, source))?;
        conn.pragma_update(None, "journal_size_limit", wal_limit as i64)
            .map_err(|source| open_err(path, source))?;
        let health = Arc::new(StoreHealth::new(path));
        let (checkpointer, nudge) = Checkpointer::start(path, bounds, health.clone(), reserve)?;
        let writer = Writer::start(conn, health.clone(), nudge);
        Ok(Store {
            reader: Reader::open(path)?,
            writer,
            _checkpointer: checkpointer,
            health,
        })
    }

    /// Whether writes are going through, for status and metrics.
    pub fn status(&self) -> StoreStatus {
        self.health.status()
    }

    /// Queues `writes` (one job, after every earlier one); the ticket answers at its commit.
    pub fn submit(&self, writes: Vec<Write>) -> Ticket {
        self.writer.submit(writes)
    }

    /// Writes and waits: one lease (or pin) saved.
    pub fn save_lease(&self, row: &LeaseRow) -> Result<(), StoreError> {
        self.submit(vec![Write::SaveLease(row.clone())]).wait()
    }

    /// Writes and waits: one lease (or pin) deleted; deleting a missing one is not an error (the
    /// store's own tests).
    #[cfg(test)]
    pub fn delete_lease(&self, route: &str, fp: &str, model: &str) -> Result<(), StoreError> {
        let (route, fp, model) = (route.to_string(), fp.to_string(), model.to_string());
        self.submit(vec![Write::DeleteLease { route, fp, model }])
            .wait()
    }

    /// Writes and waits: one event appended (its `id` is ignored; the store's own tests).
    #[cfg(test)]
    pub fn record_event(&self, ev: &LeaseEvent) -> Result<(), StoreError> {
        self.submit(vec![Write::Event(ev.clone())]).wait()
    }

    /// Writes and waits: one accounting row appended (its `id` is ignored).
    pub fn record_request(&self, row: &RequestRow) -> Result<(), StoreError> {
        self.submit(vec![Write::Request(row.clone())]).wait()
    }

    /// Says that a request's row is on its way, so a commit just before it may wait for it and
    /// take both (group commit under load; a lone request never waits: `writer.rs`).
    pub fn row_coming(&self) -> Coming {
        self.writer.coming()
    }

    /// Writes one accounting row without waiting for it: `then` runs on the thread that commits
    /// it, right after the commit (this one when it is alone, else the writer thread), with its
    /// outcome. `coming` is the row's announcement, if it had one ([`Store::row_coming`]).
    pub fn record_then(&self, row: &RequestRow, coming: Option<Coming>, then: Then) {
        self.writer
            .leave(vec![Write::Request(row.clone())], then, coming);
    }

    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.reader.schema_version()
    }

    pub fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.reader.list_leases()
    }

    pub fn recent_events(&self, limit: usize) -> Result<Vec<LeaseEvent>, StoreError> {
        self.reader.recent_events(limit)
    }

    pub fn recent_requests(&self, limit: usize) -> Result<Vec<RequestRow>, StoreError> {
        self.reader.recent_requests(limit)
    }

    pub fn key_tokens_since(&self, since_ms: i64) -> Result<Vec<(String, u64)>, StoreError> {
        self.reader.key_tokens_since(since_ms)
    }

    pub fn recent_families(
        &self,
        limit: usize,
    ) -> Result<Vec<crate::holdings::Recent>, StoreError> {
        self.reader.recent_families(limit)
    }

    pub fn requests_since(
        &self,
        since_ms: i64,
        route: Option<&str>,
    ) -> Result<Vec<RequestRow>, StoreError> {
        self.reader.requests_since(since_ms, route)
    }
}

/// WAL (so readers and the sqlite3 shell read beside the writer), `synchronous=NORMAL`, a busy
/// timeout, then the migrations.
fn setup(path: &Path, conn: Connection) -> Result<Connection, StoreError> {
    let err = |source| open_err(path, source);
    conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
    let _mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(err)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(err)?;
    let mut conn = conn;
    schema::migrate(path, &mut conn)?;
    Ok(conn)
}

/// What the store keeps its files within (issue 24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// The WAL is reset once it is over this and copied back ([`WAL_LIMIT`]).
    pub(crate) wal: u64,
    /// Bytes kept in reserve beside the db for a WAL that fills the disk (`reserve::RESERVE`).
    pub(crate) reserve: u64,
    /// How long writes must go through before the reserve is taken (at start, after a full disk).
    pub(crate) settle: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            wal: WAL_LIMIT,
            reserve: reserve::RESERVE,
            settle: Duration::from_secs(60),
        }
    }
}

/// The WAL's bound (issue 24): 30,000 cheap requests in 12 s once left an 846 MB `-wal` that never
/// shrank. Past this the checkpoint thread truncates it (docs/OPERATIONS.md, "Bounded state").
pub const WAL_LIMIT: u64 = 64 << 20;

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

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Open { path, .. } => {
                write!(f, "cannot open or write database {}", path.display())
            }
            StoreError::Missing(path) => write!(
                f,
                "no database at {}: `crossbar serve` creates it (check `db` in the config)",
                path.display()
            ),
            StoreError::TooOld { path, found, known } => write!(
                f,
                "database {} has schema version {found}, this crossbar reads version {known}; \
                 readers never migrate: start this crossbar's `serve` on it once, or use the \
                 crossbar that wrote it",
                path.display()
            ),
            StoreError::Write(_) => f.write_str("store unavailable"),
            StoreError::Stalled => f.write_str("store unavailable: no commit within 30s"),
            StoreError::Stopped => f.write_str("store unavailable: the store is shutting down"),
            StoreError::BackupExists(path) => write!(
                f,
                "{} exists; backup never overwrites, name a new file",
                path.display()
            ),
            StoreError::BackupFailed { path, detail } => {
                write!(f, "backup to {} failed: {detail}", path.display())
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
            StoreError::Write(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Sqlite(e)
    }
}
