//! A persister that fails: memory stays exactly as the store has it; a change and its event are
//! one commit.

use std::sync::atomic::Ordering;

use super::*;

#[test]
fn a_persister_that_fails_leaves_memory_exactly_as_it_was() {
    let f = fix();
    check(&f.table, &key("projA", ""), 0, "titan", false);
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    check(&f.table, &key("projB", "c1"), 0, "titan", false);
    f.table.pin("projB", "titan", 0).unwrap();
    let (before, pins, rows) = (f.table.snapshot(), f.table.pins(), f.p.rows());
    let seen = f.table.lock().seen.clone();

    f.p.fail.store(true, Ordering::SeqCst);
    let is_store = |r: Result<Acquired, LeaseError>| matches!(r, Err(LeaseError::Store(_)));
    assert!(
        is_store(f.table.acquire(&key("projA", "c2"), &both(), 10)),
        "inherit"
    );
    assert!(
        is_store(
            f.table
                .acquire(&key("projC", "c1"), &["gpu3".to_string()], 10)
        ),
        "new"
    );
    f.hosts.down("titan");
    assert!(
        is_store(f.table.acquire(&key("projA", "c1"), &both(), 10)),
        "unhealthy move"
    );
    f.hosts.up("titan");
    assert!(matches!(
        f.table.pin("projA", "mini", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.unpin("projB", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.release("projA", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.move_to(&key("projA", "c1"), "mini", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.drop_host("titan", 10),
        Err(LeaseError::Store(_))
    ));
    assert_eq!(
        f.table.expire_idle(100 * HOUR),
        0,
        "a lease that cannot be deleted is kept"
    );

    assert_eq!(f.table.snapshot(), before);
    assert_eq!(f.table.pins(), pins);
    assert_eq!(f.p.rows(), rows);
    assert_eq!(
        f.table.lock().seen,
        seen,
        "not even the candidates of a failed acquire"
    );
    assert_eq!(
        f.table
            .pin("projC", "gpu3", 10)
            .map_err(|e| e.to_string())
            .unwrap_err(),
        "unknown host gpu3"
    );

    // Issue 12: a reused lease's touch is written behind, so it is served while writes fail;
    // the lost touch only makes the lease look idle a moment early.
    check(&f.table, &key("projA", "c1"), 15, "titan", true);
    assert_eq!(f.p.rows(), rows);

    // Back to normal, the table carries on from where it was.
    f.p.fail.store(false, Ordering::SeqCst);
    check(&f.table, &key("projA", "c1"), 20, "titan", true);
    assert_eq!(f.table.flush_touches(), 1, "15 and 20 are one touch");
    let row = |fp: &str| f.p.rows().into_iter().find(|r| r.fp == fp).unwrap();
    assert_eq!(row("c1").last_used, 20, "the next touch is written");
}

#[test]
fn a_change_and_its_event_commit_together_or_not_at_all() {
    let f = fix();
    f.p.fail_events.store(true, Ordering::SeqCst);
    let err = f
        .table
        .acquire(&key("projA", "c1"), &both(), 0)
        .unwrap_err();
    assert!(matches!(err, LeaseError::Store(_)), "{err:?}");
    assert!(hosts_of(&f.table).is_empty());
    assert!(f.p.rows().is_empty(), "memory and rows agree");
    assert!(f.p.events().is_empty());
    f.p.fail_events.store(false, Ordering::SeqCst);
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    assert_eq!(f.p.events(), vec![ev(Reason::New, "", "titan")]);
}
