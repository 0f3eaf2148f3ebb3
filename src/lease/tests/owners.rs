//! Issue 46: one client's new conversations evict its own leases, not everyone's. Before, about
//! 6,000 new conversations a second from one client reached `max_leases` in 16 s, and every other
//! client's conversation idle for 18 s came back `new`.

use super::*;
use crate::clientid::ClientId;

fn as_client(name: &str) -> Ask {
    Ask {
        client: ClientId::key(name),
        ..Ask::default()
    }
}

/// A new conversation of `client` at `now`; its hold, if `hold`.
fn new_turn(f: &Fix, client: &str, fp: &str, now: i64) -> Option<Hold> {
    let ask = as_client(client);
    let (got, held) = (f.table)
        .acquire_held(&key("projA", fp), &both(), now, &ask)
        .unwrap();
    assert!(!got.reused, "{fp} is new");
    held
}

fn fps(f: &Fix) -> Vec<String> {
    f.table.snapshot().into_iter().map(|l| l.key.fp).collect()
}

#[test]
fn a_flood_of_new_conversations_evicts_the_flooders_own_leases_issue_46() {
    let f = fix();
    f.table.set_max_leases(1_000, 3);
    for (i, fp) in ["v1", "v2"].into_iter().enumerate() {
        new_turn(&f, "victim", fp, i as i64);
    }
    // One of the flooder's is still answering: it stays, and the next oldest goes instead.
    let answering = new_turn(&f, "flood", "f0", 10);
    for i in 1..500 {
        new_turn(&f, "flood", &format!("f{i}"), 10 + i);
    }
    assert_eq!(fps(&f), ["f0", "f498", "f499", "v1", "v2"]);
    assert_eq!(f.table.owned_by(ClientId::key("flood")), 3);
    drop(answering);
    new_turn(&f, "flood", "f500", 600);
    assert_eq!(fps(&f), ["f498", "f499", "f500", "v1", "v2"]);
    // The victim's conversations are reused, where before the flood had evicted them.
    let back = f
        .table
        .acquire_held(&key("projA", "v1"), &both(), 700, &as_client("victim"));
    assert!(back.unwrap().0.reused);
    let evicted = (f.p.events().iter())
        .filter(|e| e.0 == Reason::Evicted)
        .count();
    assert_eq!(evicted, 497 + 1);
}

/// The cap counts a client's leases by their last use: a conversation it keeps using is not
/// the one that goes, and a lease moved for its host keeps its owner.
#[test]
fn a_clients_least_recently_used_lease_goes_and_a_move_keeps_its_owner_issue_46() {
    let f = fix();
    f.table.set_max_leases(1_000, 2);
    new_turn(&f, "a", "old", 0);
    new_turn(&f, "a", "newer", 1);
    // `old` is used again: `newer` is now the least recently used.
    let again = f
        .table
        .acquire_held(&key("projA", "old"), &both(), 2, &as_client("a"));
    assert!(again.unwrap().0.reused);
    // Its host goes down: the lease moves, still `a`'s.
    f.hosts.down("titan");
    let moved = f.table.acquire(&key("projA", "old"), &both(), 3).unwrap();
    assert_eq!(moved.host, "mini");
    f.hosts.up("titan");
    assert_eq!(f.table.owned_by(ClientId::key("a")), 2);
    new_turn(&f, "a", "third", 4);
    assert_eq!(fps(&f), ["old", "third"]);
}

/// A lease read back at start belongs to no one (who made it is not stored): it never counts
/// against a client, and no client's flood evicts it before the table is full.
#[test]
fn leases_read_back_at_start_count_for_no_client_issue_46() {
    let f = fix();
    f.table.set_max_leases(1_000, 1);
    new_turn(&f, "a", "before", 0);
    let table = Table::new(
        f.p.clone(),
        Arc::new(FakeHosts::default()),
        Arc::new(FakeChooser::default()),
        idle(),
    )
    .unwrap();
    table.set_max_leases(1_000, 1);
    let ask = as_client("a");
    for (i, fp) in ["x", "y"].into_iter().enumerate() {
        (table.acquire_held(&key("projA", fp), &both(), 10 + i as i64, &ask)).unwrap();
    }
    let fps: Vec<String> = table.snapshot().into_iter().map(|l| l.key.fp).collect();
    assert_eq!(fps, ["before", "y"]);
    assert_eq!(table.owned_by(ClientId::key("a")), 1);
}
