//! Stories of every change other than `acquire`: pins, releases, idle expiry, the context guard's
//! move, a host dropped by a config reload, and a restart reloading the table from a SQLite file.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::store::tests::TempDb;

#[test]
fn pin_then_unpin() {
    let f = fix();
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    assert_eq!(
        f.table.pin("projA", "mini", 10).unwrap(),
        1,
        "the lease on titan is dropped"
    );
    assert_eq!(f.table.pinned("projA").as_deref(), Some("mini"));
    assert_eq!(f.table.pins(), pairs(&[("projA", "mini")]));
    check(&f.table, &key("projA", "c1"), 20, "mini", false);
    check(&f.table, &key("projA", "c2"), 30, "mini", false);
    check(&f.table, &key("projA", "c2"), 40, "mini", true);
    assert_eq!(
        f.p.rows()
            .iter()
            .filter(|r| r.state == LeaseState::Pinned)
            .count(),
        1
    );

    assert!(f.table.unpin("projA", 50).unwrap());
    assert_eq!(f.table.pinned("projA"), None);
    assert!(
        f.p.rows().iter().all(|r| r.state == LeaseState::Active),
        "pin row deleted"
    );
    // The leases stay where the pin put them, even though the chooser would pick titan.
    check(&f.table, &key("projA", "c1"), 60, "mini", true);
    assert!(!f.table.unpin("projA", 70).unwrap(), "not pinned any more");
    assert_eq!(
        f.p.events(),
        vec![
            ev(Reason::New, "", "titan"),
            ev(Reason::Pin, "", "mini"),
            ev(Reason::Pin, "titan", "mini"),
            ev(Reason::New, "", "mini"),
            ev(Reason::New, "", "mini"),
            ev(Reason::Release, "mini", ""),
        ]
    );
}

#[test]
fn idle_expiry_leaves_pins_alone() {
    let f = fix();
    check(&f.table, &key("projA", "old"), 0, "titan", false);
    check(&f.table, &key("projB", "c1"), 0, "titan", false);
    f.table.pin("projB", "titan", 0).unwrap();
    check(&f.table, &key("projA", "recent"), HOUR, "titan", false);
    check(&f.table, &key("projA", "exact"), 0, "titan", false);
    check(&f.table, &key("projA", "exact"), 1, "titan", true);

    // Idle for exactly `lease_idle` is not yet expired.
    assert_eq!(f.table.expire_idle(2 * HOUR + 1), 2, "old and projB/c1 go");
    assert_eq!(
        hosts_of(&f.table),
        pairs(&[("projA/exact", "titan"), ("projA/recent", "titan")])
    );
    assert_eq!(f.table.pins(), pairs(&[("projB", "titan")]));
    assert!(f.p.rows().iter().any(|r| r.state == LeaseState::Pinned));
    assert_eq!(
        f.p.events().iter().filter(|e| e.0 == Reason::Idle).count(),
        2
    );

    f.table.set_idle(Duration::from_millis(10));
    assert_eq!(f.table.expire_idle(HOUR + 11), 2);
    assert_eq!(f.table.pins(), pairs(&[("projB", "titan")]));
}

#[test]
fn release_keeps_the_pin() {
    let f = fix();
    check(&f.table, &key("projB", "x"), 0, "titan", false);
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    f.table.pin("projA", "mini", 0).unwrap();
    check(&f.table, &key("projA", "c1"), 1, "mini", false);
    check(&f.table, &key("projA", "c2"), 2, "mini", false);
    assert_eq!(f.table.release("projA", 3).unwrap(), 2);
    assert_eq!(f.table.pinned("projA").as_deref(), Some("mini"));
    assert_eq!(
        hosts_of(&f.table),
        pairs(&[("projB/x", "titan")]),
        "other routes untouched"
    );
    check(&f.table, &key("projA", "c1"), 4, "mini", false);
}

#[test]
fn a_pin_to_a_never_seen_host_is_an_unknown_host() {
    let f = fix();
    let err = f.table.pin("projA", "titan", 0).unwrap_err();
    assert!(
        matches!(&err, LeaseError::UnknownHost { host } if host == "titan"),
        "{err:?}"
    );
    // Seen on another route does not count for this one.
    f.table
        .acquire(&key("projB", ""), &["gpu3".to_string()], 0)
        .unwrap();
    let err = f.table.pin("projA", "gpu3", 0).unwrap_err();
    assert!(matches!(err, LeaseError::UnknownHost { .. }), "{err:?}");
    assert!(f.table.pins().is_empty());
    // A candidate that was offered but never chosen is known.
    check(&f.table, &key("projA", ""), 0, "titan", false);
    assert_eq!(f.table.pin("projA", "mini", 0).unwrap(), 1);
    // So are a config's candidates announced before any traffic.
    f.table.add_candidates("projC", &["gpu9".to_string()]);
    assert_eq!(f.table.pin("projC", "gpu9", 0).unwrap(), 0);
}

#[test]
fn a_host_removed_from_the_config_takes_its_leases_and_pins_with_it() {
    let f = fix();
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    f.hosts.down("titan");
    check(&f.table, &key("projA", "c2"), 0, "mini", false);
    f.hosts.up("titan");
    check(&f.table, &key("projB", "c1"), 0, "titan", false);
    f.table.pin("projB", "titan", 0).unwrap();
    assert_eq!(
        f.table.drop_host("titan", 10).unwrap(),
        3,
        "two leases and one pin"
    );
    assert_eq!(hosts_of(&f.table), pairs(&[("projA/c2", "mini")]));
    assert!(f.table.pins().is_empty());
    assert_eq!(
        f.p.events()
            .iter()
            .filter(|e| e.0 == Reason::Removed)
            .count(),
        3
    );
    let err = f.table.pin("projA", "titan", 20).unwrap_err();
    assert!(matches!(err, LeaseError::UnknownHost { .. }), "{err:?}");
}

#[test]
fn a_table_reloaded_from_a_sqlite_file_carries_on_where_it_was() {
    let db = TempDb::new("lease-reload");
    let hosts = Arc::new(FakeHosts::default());
    let chooser = Arc::new(FakeChooser::default());
    let open = || {
        let store = Arc::new(Store::open(&db.path).unwrap());
        Table::new(
            store,
            Arc::clone(&hosts) as _,
            Arc::clone(&chooser) as _,
            idle(),
        )
        .unwrap()
    };
    let (snapshot, pins, seen) = {
        let t = open();
        check(&t, &key("projA", ""), 0, "titan", false);
        check(&t, &key("projA", "c1"), 5, "titan", false);
        hosts.down("titan");
        check(&t, &key("projA", "c2"), 7, "mini", false);
        hosts.up("titan");
        t.acquire(&key("projB", "c1"), &["titan".to_string()], 9)
            .unwrap();
        t.pin("projB", "titan", 9).unwrap();
        t.acquire(&key("projC", "c1"), &["gpu3".to_string()], 11)
            .unwrap();
        t.pin("projC", "gpu3", 12).unwrap();
        let seen = t.lock().seen.clone();
        (t.snapshot(), t.pins(), seen)
    };
    let t = open();
    assert_eq!(t.snapshot(), snapshot);
    assert_eq!(t.pins(), pins);
    assert_eq!(t.lock().seen, seen);
    // And it behaves the same: the reloaded leases are reused, a better host is ignored.
    chooser.prefer("mini");
    check(&t, &key("projA", "c1"), 20, "titan", true);
    assert_eq!(t.pin("projA", "mini", 21).unwrap(), 2);
    let events = Store::open(&db.path).unwrap().recent_events(1).unwrap();
    assert_eq!(
        (events[0].reason, events[0].from_host.as_str()),
        (Reason::Pin, "titan")
    );
}

#[test]
fn the_context_guard_moves_a_lease_and_it_stays_moved() {
    let f = fix();
    let k = key("projA", "c1");
    check(&f.table, &k, 0, "titan", false);
    f.table.move_to(&k, "mini", 10).unwrap();
    check(&f.table, &k, 20, "mini", true);
    f.table.move_to(&key("projA", "c2"), "mini", 30).unwrap();
    assert_eq!(
        f.p.events(),
        vec![
            ev(Reason::New, "", "titan"),
            ev(Reason::Ctx, "titan", "mini"),
            ev(Reason::Ctx, "", "mini")
        ]
    );
    assert_eq!(
        hosts_of(&f.table),
        pairs(&[("projA/c1", "mini"), ("projA/c2", "mini")])
    );
}
