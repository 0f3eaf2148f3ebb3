//! Issue 24's disk-full drill: a WAL grown until its disk was full (a reader left open kept it from
//! being reset) could not be copied back, since the copy grows the db, so crossbar never recovered
//! by itself and could not start again on that disk. The reserve beside the db is given up then,
//! writes wait until the WAL is copied back and reset, and the reserve is taken again.

use super::*;

fn size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn suffixed(db: &TempDb, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", db.path.display()))
}

fn disk_full() -> rusqlite::Result<bool> {
    Err(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
        None,
    ))
}

fn small() -> Bounds {
    Bounds {
        reserve: 64 << 10,
        settle: Duration::from_millis(100),
        ..Bounds::default()
    }
}

#[test]
fn a_full_disk_gives_the_reserve_up_until_the_wal_is_reset_then_takes_it_again() {
    let db = TempDb::new("reserve");
    let (reserve, wal) = (suffixed(&db, "-reserve"), suffixed(&db, "-wal"));
    let store = Store::open_with(&db.path, small()).unwrap();
    crate::testwait::until("the reserve is taken once writes have gone through", || {
        size(&reserve) == Some(64 << 10)
    });
    store.record_request(&request(1, "projA", 200)).unwrap();
    // A commit fails on a full disk, as SQLite says it, and the checkpoint thread hears of it.
    assert!(store.health.outcome(disk_full()).is_err());
    store.writer.nudge_checkpoint();
    crate::testwait::until("the reserve is given up and the WAL reset", || {
        size(&reserve).is_none() && !store.health.reclaiming() && size(&wal) == Some(0)
    });
    // Writes go on; once they have gone through for a while the reserve is taken again.
    for i in 0..12 {
        store
            .record_request(&request(10 + i, "projA", 200))
            .unwrap();
    }
    assert!(store.status().ok);
    crate::testwait::until("the reserve is taken again", || {
        size(&reserve) == Some(64 << 10)
    });
    assert_eq!(
        store.recent_requests(100).unwrap().len(),
        13,
        "nothing lost"
    );
}

/// While the WAL is copied back, nothing is written (else the WAL would grow into the space the
/// copy needs); a reader left open delays the reset, and writes with it, until it ends.
#[test]
fn writes_wait_for_the_wal_to_be_reset_and_a_reader_left_open_delays_it() {
    let db = TempDb::new("reclaim");
    let store = Store::open_with(&db.path, small()).unwrap();
    crate::testwait::until("the reserve is taken", || {
        size(&suffixed(&db, "-reserve")).is_some()
    });
    store.record_request(&request(1, "projA", 200)).unwrap();
    let reader = Connection::open(&db.path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM requests", [], |r| r.get(0))
        .unwrap();
    store.record_request(&request(2, "projA", 200)).unwrap();
    assert!(store.health.outcome(disk_full()).is_err());
    store.writer.nudge_checkpoint();
    crate::testwait::until("writes are held back", || store.health.reclaiming());
    let refused = store.record_request(&request(3, "projA", 200));
    assert!(refused.is_err(), "{refused:?}");
    // Three passes of the checkpoint thread, each trying the reset while the reader holds on.
    let passes = store.health.passes();
    crate::testwait::until("three more checkpoint passes", || {
        store.health.passes() >= passes + 3
    });
    assert!(store.health.reclaiming(), "the reader still holds the WAL");
    reader.execute_batch("COMMIT").unwrap();
    crate::testwait::until("the WAL is reset once the reader ends", || {
        !store.health.reclaiming()
    });
    store.record_request(&request(4, "projA", 200)).unwrap();
    let starts: Vec<i64> = (store.recent_requests(10).unwrap().iter())
        .map(|r| r.started)
        .collect();
    assert_eq!(starts, [4, 2, 1]);
}
