//! Accounting rows: round trips, NULL token counts, and reads by time and route.

use super::*;

#[test]
fn requests_round_trip_and_unknown_tokens_stay_null() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    let full = RequestRow {
        streamed: true,
        prompt_tokens: Some(18_211),
        cached_tokens: Some(18_102),
        completion_tokens: Some(412),
        ..request(100, "projA", 200)
    };
    let bare = RequestRow {
        err: "upstream error".into(),
        ..request(200, "projB", 502)
    };
    store.record_request(&full).unwrap();
    store.record_request(&bare).unwrap();
    let ids: Vec<i64> = store
        .recent_requests(10)
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    let (id2, id1) = (ids[0], ids[1]);
    assert!(id1 < id2);
    assert_eq!(
        store.recent_requests(10).unwrap(),
        vec![
            RequestRow {
                id: id2,
                ..bare.clone()
            },
            RequestRow {
                id: id1,
                ..full.clone()
            }
        ]
    );
    let nulls: i64 = Connection::open(&db.path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM requests WHERE prompt_tokens IS NULL
               AND cached_tokens IS NULL AND completion_tokens IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(nulls, 1, "unknown token counts are stored as NULL, not 0");
}

#[test]
fn requests_since_filters_by_time_and_route_oldest_first() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    // Inserted out of time order: rows are written when requests end, not when they start.
    for row in [
        request(300, "projA", 200),
        request(100, "projA", 200),
        request(200, "projB", 200),
        request(250, "projA", 500),
    ] {
        store.record_request(&row).unwrap();
    }
    let started = |rows: Vec<RequestRow>| rows.iter().map(|r| r.started).collect::<Vec<_>>();
    assert_eq!(
        started(store.requests_since(200, None).unwrap()),
        vec![200, 250, 300]
    );
    assert_eq!(
        started(store.requests_since(200, Some("projA")).unwrap()),
        vec![250, 300]
    );
    assert_eq!(
        started(store.requests_since(0, Some("nope")).unwrap()),
        Vec::<i64>::new()
    );
    assert_eq!(started(store.recent_requests(2).unwrap()), vec![250, 200]);
}

/// Issue 12: `keep_requests` / `keep_events` prune in small batches: a round deletes at most its
/// limit and never a row as recent as its cutoff. Events go oldest first; accounting rows in the
/// order they were recorded (issue 26: no index on `started`): a round looks at the first rows
/// recorded, as many as its limit, and deletes those old enough.
#[test]
fn issue12_a_prune_round_deletes_at_most_its_limit_of_the_oldest_rows_before_the_cutoff() {
    let db = TempDb::new("prune");
    let store = Store::open(&db.path).unwrap();
    for started in [50, 10, 40, 20, 30, 100, 60, 200] {
        store
            .record_request(&request(started, "projA", 200))
            .unwrap();
        let ev = event(started, Reason::New, "", "titan");
        store.record_event(&ev).unwrap();
    }
    let prune = |before, limit| {
        let writes = vec![
            Write::PruneRequests { before, limit },
            Write::PruneEvents { before, limit },
        ];
        store.submit(writes).wait().unwrap();
        let rows: Vec<i64> = (store.requests_since(0, None).unwrap())
            .iter()
            .map(|r| r.started)
            .collect();
        let mut events: Vec<i64> = (store.recent_events(100).unwrap())
            .iter()
            .map(|e| e.at)
            .collect();
        events.sort_unstable();
        (rows, events)
    };
    let (rows, events) = prune(100, 2);
    assert_eq!(
        rows,
        [20, 30, 40, 60, 100, 200],
        "the first two recorded went"
    );
    assert_eq!(
        events,
        [30, 40, 50, 60, 100, 200],
        "the two oldest events went"
    );
    let (rows, events) = prune(100, 4);
    assert_eq!(
        rows,
        [60, 100, 200],
        "of the first four recorded, the cutoff's own row stays"
    );
    assert_eq!(events, [100, 200]);
    let (rows, events) = prune(100, 500);
    assert_eq!(
        rows,
        [100, 200],
        "60, recorded after 100, goes once among the first"
    );
    assert_eq!(events, [100, 200]);
}

/// Issue 23: a restart rebuilds what hosts hold warm from the newest answered rows that name a
/// family, oldest first; a warm first turn's cached tokens measure its family; failures, rows
/// without a family and malformed family columns are left out.
#[test]
fn recent_families_are_the_newest_answered_rows_with_a_family_oldest_first() {
    let db = TempDb::new("rows");
    let store = Store::open(&db.path).unwrap();
    let row = |started, host: &str, family: &str, placed: &str, status, cached| RequestRow {
        host: host.into(),
        model: "m".into(),
        family: family.into(),
        placed: placed.into(),
        cached_tokens: cached,
        ..request(started, "projA", status)
    };
    for r in [
        row(1, "a", "0000000a", "least-loaded", 200, Some(0)),
        row(2, "b", "0000000a", "family", 200, Some(900)),
        row(3, "b", "", "sticky", 200, Some(50)),
        row(4, "a", "0000000b", "family", 502, Some(0)),
        row(5, "a", "not-hex!", "family", 200, Some(1)),
        row(6, "a", "0000000c", "sticky", 200, Some(70)),
    ] {
        store.record_request(&r).unwrap();
    }
    let got: Vec<(String, u32, Option<u64>)> = store
        .recent_families(10)
        .unwrap()
        .into_iter()
        .map(|r| (r.host, r.family, r.warm_first_cached))
        .collect();
    let want = [
        ("a".to_string(), 10, None),
        ("b".to_string(), 10, Some(900)),
        ("a".to_string(), 12, None),
    ];
    assert_eq!(got, want);
    let newest: Vec<u32> = (store.recent_families(2).unwrap().iter())
        .map(|r| r.family)
        .collect();
    assert_eq!(newest, [12], "the newest two rows, one malformed");
}

/// Issue 24: a flood of cheap requests grew a WAL to 846 MB that never shrank. Past its limit the
/// checkpoint thread truncates it, so once the flood passes the WAL is back under the limit.
#[test]
fn the_wal_is_cut_back_under_its_limit_after_a_flood_of_rows() {
    let db = TempDb::new("wal");
    let limit = 256 << 10;
    let store = Store::open_with_wal_limit(&db.path, limit).unwrap();
    let wal = std::path::PathBuf::from(format!("{}-wal", db.path.display()));
    let mut biggest = 0;
    for i in 0..2_000 {
        let row = RequestRow {
            err: format!("{i:04} {}", "x".repeat(2_000)),
            ..request(i, "projA", 200)
        };
        store.record_request(&row).unwrap();
        biggest = biggest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    assert!(
        biggest > limit,
        "the flood must pass the limit to test it: {biggest}"
    );
    crate::testwait::until("the WAL back under its limit", || {
        std::fs::metadata(&wal).map_or(0, |m| m.len()) <= limit
    });
    assert_eq!(
        store.recent_requests(5_000).unwrap().len(),
        2_000,
        "nothing lost"
    );
}

/// Issue 26's wake-ups: once the WAL is all copied back, the checkpoint thread sleeps until the
/// next commit (idle, it woke five times a second to copy nothing). Each commit wakes it, so each
/// row is still copied back and the WAL reset within a tick, not after the idle safety net.
#[test]
fn an_idle_checkpoint_thread_is_woken_by_each_commit() {
    let db = TempDb::new("idle");
    // A limit of one byte: every checkpoint that copies the whole WAL back also resets it.
    let store = Store::open_with_wal_limit(&db.path, 1).unwrap();
    let wal = std::path::PathBuf::from(format!("{}-wal", db.path.display()));
    let wal_size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    // Sooner than the idle thread's safety net would copy it back unwoken.
    let bound = crate::store::checkpoint::IDLE_MAX / 2;
    for i in 0..3 {
        store.record_request(&request(i, "projA", 200)).unwrap();
        let what = format!("row {i} copied back: the idle checkpoint thread woken");
        crate::testwait::within(bound, &what, || wal_size() == 0);
    }
    assert_eq!(store.recent_requests(10).unwrap().len(), 3, "nothing lost");
}
