//! Stories of a `spread_new` route: `lookup`, where a request that takes no lease goes (it leaves
//! no trace), and `acquire_spread`, which never inherits the route-level lease.

use super::*;

#[test]
fn a_lookup_follows_pin_then_lease_then_chooser_and_creates_nothing() {
    let f = fix();
    let meta = key("projA", "");
    f.chooser.prefer("mini");
    assert_eq!(
        f.table.lookup(&meta, &both()).unwrap(),
        "mini",
        "the chooser's pick"
    );
    assert!(f.table.snapshot().is_empty(), "a lookup creates no lease");
    assert!(f.p.events.lock().is_empty(), "nor an event");

    // A new conversation after a lookup is chosen afresh: nothing to inherit.
    f.chooser.prefer("titan");
    check(&f.table, &key("projA", "c1"), 10, "titan", false);

    // An existing route-level lease answers while its host is healthy.
    check(&f.table, &meta, 20, "titan", false);
    f.chooser.prefer("mini");
    assert_eq!(f.table.lookup(&meta, &both()).unwrap(), "titan");
    f.hosts.down("titan");
    assert_eq!(
        f.table.lookup(&meta, &both()).unwrap(),
        "mini",
        "not a dead host"
    );
    assert_eq!(
        hosts_of(&f.table),
        pairs(&[("projA/", "titan"), ("projA/c1", "titan")]),
        "the lease did not move"
    );
}

#[test]
fn a_lookup_on_a_pinned_route_goes_to_the_pin_or_fails_like_acquire() {
    let f = fix();
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    f.table.pin("projA", "mini", 10).unwrap();
    assert_eq!(f.table.lookup(&key("projA", ""), &both()).unwrap(), "mini");
    f.hosts.down("mini");
    assert!(matches!(
        f.table.lookup(&key("projA", ""), &both()),
        Err(LeaseError::PinnedDown { host }) if host == "mini"
    ));
    f.hosts.down("titan");
    assert!(matches!(
        f.table.lookup(&key("projB", ""), &both()),
        Err(LeaseError::NoHost)
    ));
}

#[test]
fn a_spreading_route_chooses_for_new_conversations_despite_the_route_lease_issue_11() {
    let f = fix();
    f.chooser.prefer("mini");
    check(&f.table, &key("projA", ""), 0, "mini", false);
    f.chooser.prefer("titan");
    let spread = f.table.acquire_spread(&key("projA", "c1"), &both(), 10);
    let want = Acquired {
        host: "titan".into(),
        reused: false,
    };
    assert_eq!(spread.unwrap(), want);
    // The conversation's own lease still holds on its next turn, whatever the chooser prefers.
    f.chooser.prefer("mini");
    let next = f.table.acquire_spread(&key("projA", "c1"), &both(), 20);
    assert_eq!(next.unwrap().host, "titan");
}
