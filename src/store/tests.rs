//! Store tests: the schema's life (create, re-open, refuse newer, fail early), and round trips.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use rusqlite::Connection;

use super::schema::{migrate_with, MIGRATIONS};
use super::*;

mod requests;
mod reserve;

/// A database file in the system temp dir with a unique name, removed (with its WAL files) on drop.
#[derive(Debug)]
pub(crate) struct TempDb {
    pub(crate) path: PathBuf,
}

impl TempDb {
    pub(crate) fn new(tag: &str) -> TempDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = unix_ms(std::time::SystemTime::now());
        let name = format!(
            "crossbar-{tag}-{}-{nanos}-{}.db",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        TempDb {
            path: std::env::temp_dir().join(name),
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal", "-reserve"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    }
}

fn known() -> i64 {
    MIGRATIONS.len() as i64
}

fn lease(route: &str, fp: &str, host: &str, last_used: i64) -> LeaseRow {
    LeaseRow {
        route: route.into(),
        fp: fp.into(),
        model: "qwen".into(),
        host: host.into(),
        state: LeaseState::Active,
        created: 1_000,
        last_used,
    }
}

fn event(at: i64, reason: Reason, from: &str, to: &str) -> LeaseEvent {
    LeaseEvent {
        id: 0,
        at,
        route: "projA".into(),
        fp: "1a2b3c4d5e6f7a8b".into(),
        model: "qwen".into(),
        reason,
        from_host: from.into(),
        to_host: to.into(),
    }
}

fn request(started: i64, route: &str, status: u16) -> RequestRow {
    RequestRow {
        started,
        route: route.into(),
        fp: "ab".into(),
        model: "qwen".into(),
        host: "titan".into(),
        queued_ms: 1,
        ttfb_ms: 2,
        total_ms: 3,
        status,
        ..RequestRow::default()
    }
}

#[track_caller]
fn check_open_error(path: &Path) {
    match Store::open(path) {
        Err(e @ StoreError::Open { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(std::error::Error::source(&e).is_some());
        }
        other => panic!(
            "expected an open error for {}, got {other:?}",
            path.display()
        ),
    }
}

#[test]
fn a_new_file_gets_the_whole_schema_and_keeps_it_across_reopens() {
    let db = TempDb::new("reopen");
    {
        let store = Store::open(&db.path).unwrap();
        assert_eq!(store.schema_version().unwrap(), known());
        store
            .save_lease(&lease("projA", "fp1", "titan", 5))
            .unwrap();
    }
    // The second open runs the migrations again: nothing is re-created, nothing is lost.
    let store = Store::open(&db.path).unwrap();
    assert_eq!(store.schema_version().unwrap(), known());
    assert_eq!(
        store.list_leases().unwrap(),
        vec![lease("projA", "fp1", "titan", 5)]
    );
}

/// Issue 48: an upgrade from schema 3 to 6 left no line. Each migration applied to a database
/// that had a schema is logged, from and to, and how long; a new file's creation is not.
#[test]
fn each_migration_applied_to_an_existing_db_is_logged_issue_48() {
    crate::testlog::capture();
    let migrations = &[
        "CREATE TABLE a (x INTEGER);",
        "CREATE TABLE b (y INTEGER);",
        "CREATE TABLE c (z INTEGER);",
    ];
    let mut conn = Connection::open_in_memory().unwrap();
    let path = Path::new("old.db");
    migrate_with(path, &mut conn, &migrations[..1]).unwrap();
    assert!(
        crate::testlog::mine().is_empty(),
        "{:?}",
        crate::testlog::mine()
    );
    migrate_with(path, &mut conn, migrations).unwrap();
    migrate_with(path, &mut conn, migrations).unwrap();
    let lines = crate::testlog::mine();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, (from, to)) in lines.iter().zip([(1, 2), (2, 3)]) {
        let want = format!("INFO db migrated db=old.db from={from} to={to} ms=");
        assert!(line.starts_with(&want), "{line}");
    }
}

#[test]
fn migrations_run_twice_are_a_no_op() {
    // A migration that fails if it were ever run a second time.
    let migrations = &["CREATE TABLE a (x INTEGER);", "CREATE TABLE b (y INTEGER);"];
    let mut conn = Connection::open_in_memory().unwrap();
    let path = Path::new(":memory:");
    migrate_with(path, &mut conn, &migrations[..1]).unwrap();
    migrate_with(path, &mut conn, &migrations[..1]).unwrap();
    migrate_with(path, &mut conn, migrations).unwrap();
    migrate_with(path, &mut conn, migrations).unwrap();
    assert_eq!(user_version(&conn).unwrap(), 2);
}

#[test]
fn a_failing_migration_applies_nothing() {
    let migrations = &[
        "CREATE TABLE a (x INTEGER);",
        "CREATE TABLE b (y INTEGER); nonsense;",
    ];
    let mut conn = Connection::open_in_memory().unwrap();
    let err = migrate_with(Path::new("x.db"), &mut conn, migrations).unwrap_err();
    assert!(
        matches!(err, StoreError::Migrate { version: 2, .. }),
        "{err:?}"
    );
    assert_eq!(user_version(&conn).unwrap(), 0);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        tables, 0,
        "the first migration was rolled back with the second"
    );
}

#[test]
fn a_database_from_a_newer_crossbar_is_refused() {
    let db = TempDb::new("toonew");
    {
        let conn = Connection::open(&db.path).unwrap();
        conn.pragma_update(None, "user_version", known() + 3)
            .unwrap();
    }
    let err = Store::open(&db.path).unwrap_err();
    match &err {
        StoreError::TooNew {
            found, known: k, ..
        } => {
            assert_eq!((*found, *k), (known() + 3, known()));
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&db.path.display().to_string()), "{msg}");
    assert!(msg.contains(&format!("version {}", known() + 3)), "{msg}");
    assert!(msg.contains(&format!("version {}", known())), "{msg}");
    // Refusing did not touch the file.
    let conn = Connection::open(&db.path).unwrap();
    assert_eq!(user_version(&conn).unwrap(), known() + 3);
}

#[test]
fn a_path_that_cannot_be_opened_is_an_error_at_open() {
    let missing_dir =
        std::env::temp_dir().join(format!("crossbar-no-such-dir-{}", std::process::id()));
    check_open_error(&missing_dir.join("crossbar.db"));
    // A directory is not a database file.
    check_open_error(&std::env::temp_dir());
}

#[test]
fn the_file_is_in_wal_mode_and_readable_by_another_connection_while_open() {
    let db = TempDb::new("wal");
    let store = Store::open(&db.path).unwrap();
    store.save_lease(&lease("projA", "", "titan", 7)).unwrap();
    // What the sqlite3 shell would do: its own connection, reading while the store holds its own.
    let shell = Connection::open(&db.path).unwrap();
    let mode: String = shell
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let host: String = shell
        .query_row("SELECT host FROM leases WHERE route = 'projA'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(host, "titan");
    store.save_lease(&lease("projA", "", "mini", 8)).unwrap();
}

#[test]
fn leases_upsert_by_key_and_delete() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    store
        .save_lease(&lease("projA", "fp1", "titan", 5))
        .unwrap();
    store.save_lease(&lease("projA", "fp2", "mini", 6)).unwrap();
    store.save_lease(&lease("projA", "fp1", "mini", 9)).unwrap();
    let pin = LeaseRow {
        fp: "".into(),
        model: "".into(),
        state: LeaseState::Pinned,
        ..lease("projB", "", "titan", 1)
    };
    store.save_lease(&pin).unwrap();
    assert_eq!(
        store.list_leases().unwrap(),
        vec![
            lease("projA", "fp1", "mini", 9),
            lease("projA", "fp2", "mini", 6),
            pin.clone()
        ]
    );
    store.delete_lease("projA", "fp1", "qwen").unwrap();
    store.delete_lease("projA", "nope", "qwen").unwrap();
    assert_eq!(
        store.list_leases().unwrap(),
        vec![lease("projA", "fp2", "mini", 6), pin]
    );
}

#[test]
fn an_unknown_state_in_the_file_is_an_error_not_a_panic() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    store
        .save_lease(&lease("projA", "fp1", "titan", 5))
        .unwrap();
    Connection::open(&db.path)
        .unwrap()
        .execute("UPDATE leases SET state = 'frozen'", [])
        .unwrap();
    let err = store.list_leases().unwrap_err();
    assert!(matches!(err, StoreError::Sqlite(_)), "{err:?}");
}

#[test]
fn events_come_back_newest_first_with_their_ids() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    for ev in [
        event(10, Reason::New, "", "titan"),
        event(20, Reason::Unhealthy, "titan", "mini"),
        event(30, Reason::Removed, "mini", ""),
    ] {
        store.record_event(&ev).unwrap();
    }
    let got = store.recent_events(2).unwrap();
    let (c, b) = (got[0].id, got[1].id);
    assert!(b < c);
    let want = vec![
        LeaseEvent {
            id: c,
            ..event(30, Reason::Removed, "mini", "")
        },
        LeaseEvent {
            id: b,
            ..event(20, Reason::Unhealthy, "titan", "mini")
        },
    ];
    assert_eq!(got, want);
    assert_eq!(store.recent_events(100).unwrap().len(), 3);
    for r in Reason::ALL {
        store.record_event(&event(40, r, "", "")).unwrap();
        assert_eq!(store.recent_events(1).unwrap()[0].reason, r);
    }
}

#[test]
fn unix_ms_counts_milliseconds_from_the_epoch() {
    assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1_234)), 1_234);
    assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_millis(5)), -5);
}

/// Issue 16: the api column arrives by migration 3; rows written before it read as `""`.
#[test]
fn rows_from_before_the_api_column_survive_the_migration() {
    let db = TempDb::new("api-column");
    {
        let mut conn = Connection::open(&db.path).unwrap();
        migrate_with(&db.path, &mut conn, &MIGRATIONS[..1]).unwrap();
        conn.execute(
            "INSERT INTO requests (started, route, fp, model, host, queued_ms, ttfb_ms, total_ms,
               status, streamed, err) VALUES (1, 'projA', '', 'm', 'titan', 0, 0, 0, 200, 0, '')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&db.path).unwrap();
    assert_eq!(store.schema_version().unwrap(), known());
    let new = RequestRow {
        api: "messages".into(),
        ..request(2, "projA", 200)
    };
    store.record_request(&new).unwrap();
    let apis: Vec<String> = store
        .requests_since(0, None)
        .unwrap()
        .into_iter()
        .map(|r| r.api)
        .collect();
    assert_eq!(apis, ["", "messages"]);
}

/// Issue 26: a db made before migration 6 loses its index on `started` (half of a lone row's WAL
/// frames), and its rows read as before.
#[test]
fn a_db_from_before_migration_6_loses_the_index_on_started() {
    let db = TempDb::new("no-index");
    let index = |conn: &Connection| -> i64 {
        conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'requests_started'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    {
        let mut conn = Connection::open(&db.path).unwrap();
        migrate_with(&db.path, &mut conn, &MIGRATIONS[..5]).unwrap();
        assert_eq!(index(&conn), 1);
    }
    let store = Store::open(&db.path).unwrap();
    store.record_request(&request(7, "projA", 200)).unwrap();
    assert_eq!(index(&Connection::open(&db.path).unwrap()), 0);
    assert_eq!(store.requests_since(5, None).unwrap().len(), 1);
}
