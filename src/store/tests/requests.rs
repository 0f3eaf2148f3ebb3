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
