//! `lookup`: where a metadata request goes (it takes no lease and leaves no trace, so a polled
//! model list steers nothing, issue 23), and `place`, where a stateless request goes.

use super::*;

#[test]
fn a_lookup_follows_pin_then_lease_then_chooser_and_creates_nothing() {
    let f = fix();
    let meta = key("projA", "");
    f.chooser.prefer("mini");
    assert_eq!(
        f.table.lookup(&meta, &both(), 0).unwrap(),
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
    assert_eq!(f.table.lookup(&meta, &both(), 0).unwrap(), "titan");
    f.hosts.down("titan");
    assert_eq!(
        f.table.lookup(&meta, &both(), 0).unwrap(),
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
    assert_eq!(
        f.table.lookup(&key("projA", ""), &both(), 0).unwrap(),
        "mini"
    );
    f.hosts.down("mini");
    assert!(matches!(
        f.table.lookup(&key("projA", ""), &both(), 0),
        Err(LeaseError::PinnedDown { host }) if host == "mini"
    ));
    f.hosts.down("titan");
    assert!(matches!(
        f.table.lookup(&key("projB", ""), &both(), 0),
        Err(LeaseError::NoHost)
    ));
}

#[test]
fn a_stateless_request_goes_to_the_pin_or_the_choosers_pick_and_leaves_nothing() {
    let f = fix();
    let k = key("projA", "");
    let ask = Ask {
        prompt: 100,
        slot: true,
        ..Ask::default()
    };
    f.chooser.prefer("mini");
    let got = f.table.place(&k, &both(), 0, &ask).unwrap();
    assert_eq!(
        (got.host.as_str(), got.placed),
        ("mini", Placed::LeastLoaded)
    );
    assert_eq!(
        f.chooser.asks.lock().last(),
        Some(&ask),
        "the ask reaches the chooser"
    );
    assert!(f.table.snapshot().is_empty() && f.p.events.lock().is_empty());
    f.table.add_candidates("projA", &both());
    f.table.pin("projA", "titan", 1).unwrap();
    let got = f.table.place(&k, &both(), 2, &ask).unwrap();
    assert_eq!((got.host.as_str(), got.placed), ("titan", Placed::Pinned));
}
