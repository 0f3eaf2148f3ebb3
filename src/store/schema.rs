//! The schema as an append-only list of migrations, keyed by `PRAGMA user_version`.
//!
//! Never edit or reorder an entry once released: add a new one at the end. Entry `i` takes a
//! database from version `i` to `i + 1`. Also how the enum columns are spelled when read and
//! written (their `as_str`).

use std::path::Path;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, TransactionBehavior};

use super::{open_err, user_version, LeaseState, Reason, StoreError};

/// Every schema change, oldest first.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: leases (and pins, fp = model = ''), lease events, accounting rows. Times are unix ms.
    "CREATE TABLE leases (
        route     TEXT NOT NULL,
        fp        TEXT NOT NULL,
        model     TEXT NOT NULL,
        host      TEXT NOT NULL,
        state     TEXT NOT NULL,
        created   INTEGER NOT NULL,
        last_used INTEGER NOT NULL,
        PRIMARY KEY (route, fp, model)
    );
    CREATE TABLE lease_events (
        id        INTEGER PRIMARY KEY,
        at        INTEGER NOT NULL,
        route     TEXT NOT NULL,
        fp        TEXT NOT NULL,
        model     TEXT NOT NULL,
        reason    TEXT NOT NULL,
        from_host TEXT NOT NULL,
        to_host   TEXT NOT NULL
    );
    CREATE INDEX lease_events_at ON lease_events (at);
    CREATE INDEX lease_events_route ON lease_events (route, at);
    CREATE TABLE requests (
        id                INTEGER PRIMARY KEY,
        started           INTEGER NOT NULL,
        route             TEXT NOT NULL,
        fp                TEXT NOT NULL,
        model             TEXT NOT NULL,
        host              TEXT NOT NULL,
        queued_ms         INTEGER NOT NULL,
        ttfb_ms           INTEGER NOT NULL,
        total_ms          INTEGER NOT NULL,
        status            INTEGER NOT NULL,
        streamed          INTEGER NOT NULL,
        prompt_tokens     INTEGER,
        cached_tokens     INTEGER,
        completion_tokens INTEGER,
        err               TEXT NOT NULL
    );
    CREATE INDEX requests_started ON requests (started);",
    // 2: the context guard's estimate and, when it asked the host, the exact prompt count.
    "ALTER TABLE requests ADD COLUMN ctx_est INTEGER;
    ALTER TABLE requests ADD COLUMN ctx_exact INTEGER;",
    // 3: the API each request spoke (chat, messages, responses, completion, stateless, other).
    "ALTER TABLE requests ADD COLUMN api TEXT NOT NULL DEFAULT '';",
    // 4: issue 23's placement: the request's prompt family (8 hex, '' for none) and why it went
    //    where it went (sticky, family, inherit, least-loaded, ctx, busy, unhealthy, pinned, none).
    "ALTER TABLE requests ADD COLUMN family TEXT NOT NULL DEFAULT '';
    ALTER TABLE requests ADD COLUMN placed TEXT NOT NULL DEFAULT '';",
    // 5: issue 25's client keys: the configured name of the key a request came with ('' when
    //    keys are off, or none was needed).
    "ALTER TABLE requests ADD COLUMN key TEXT NOT NULL DEFAULT '';",
    // 6: issue 26: no index on `started`. It was half of every row's WAL frames (two pages per
    //    lone row instead of one) and a fifth of crossbar's CPU per request at one client. The
    //    prune reads the first rows by id instead; a report and the key budgets at start read the
    //    whole table, about 0.1 s per million rows.
    "DROP INDEX IF EXISTS requests_started;",
];

/// Brings the database up to `MIGRATIONS.len()` in one transaction; a no-op when it is already
/// there. Always writes `user_version`, so a file that cannot be written fails here, at open.
/// Once committed, each migration applied is logged with how long it took (issue 48: an upgrade
/// was silent).
pub(super) fn migrate(path: &Path, conn: &mut Connection) -> Result<(), StoreError> {
    migrate_with(path, conn, MIGRATIONS)
}

pub(super) fn migrate_with(
    path: &Path,
    conn: &mut Connection,
    migrations: &[&str],
) -> Result<(), StoreError> {
    let err = |source| open_err(path, source);
    let known = migrations.len();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    let found = user_version(&tx).map_err(err)?;
    let applied = usize::try_from(found).unwrap_or(0);
    if applied > known {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
            known: i64::try_from(known).unwrap_or(i64::MAX),
        });
    }
    let mut took = Vec::new();
    for (i, sql) in migrations.iter().enumerate().skip(applied) {
        let clock = std::time::Instant::now();
        tx.execute_batch(sql)
            .map_err(|source| StoreError::Migrate {
                path: path.to_path_buf(),
                version: i + 1,
                source,
            })?;
        took.push((i, clock.elapsed()));
    }
    tx.pragma_update(None, "user_version", known).map_err(err)?;
    tx.commit().map_err(err)?;
    // A new file's creation is not an upgrade: only a database that had a schema is told of.
    if applied > 0 {
        for (i, took) in took {
            log::info!(
                "db migrated db={} from={i} to={} ms={:.1}",
                crate::logfmt::val(&path.display().to_string()),
                i + 1,
                took.as_secs_f64() * 1000.0
            );
        }
    }
    Ok(())
}

impl ToSql for LeaseState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for LeaseState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value.as_str()? {
            "active" => Ok(LeaseState::Active),
            "pinned" => Ok(LeaseState::Pinned),
            other => Err(FromSqlError::Other(
                format!("unknown lease state {other:?}").into(),
            )),
        }
    }
}

impl ToSql for Reason {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for Reason {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let s = value.as_str()?;
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| FromSqlError::Other(format!("unknown lease event reason {s:?}").into()))
    }
}
