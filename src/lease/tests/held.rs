//! Issue 23's held tokens: what a host's slots hold is its newest conversations, one per slot,
//! not every lease it still keeps.

use super::*;

/// A conversation's turn at `now` on whatever host the fake chooser gives it, answered with a
/// prompt plus completion of `tokens`.
fn turn(f: &Fix, fp: &str, now: i64, tokens: u64) {
    let (_, hold) = (f.table)
        .acquire_held(&key("projA", fp), &both(), now, &Ask::default())
        .unwrap();
    hold.expect("a conversation's request holds its lease")
        .set_held(tokens, None);
}

/// `(host, held tokens newest first)` of the last choice's candidates.
fn offered(f: &Fix) -> Vec<(String, Vec<u64>)> {
    (f.chooser.offered.lock().iter())
        .map(|c| {
            (
                c.host.clone(),
                c.held_newest.iter().map(|h| h.tokens).collect(),
            )
        })
        .collect()
}

#[test]
fn a_new_conversation_is_offered_each_hosts_conversations_newest_first() {
    let f = fix();
    f.chooser.prefer("titan");
    // The listing's route-level lease holds no conversation.
    check(&f.table, &key("projA", ""), 0, "titan", false);
    turn(&f, "old", 10, 9_000);
    turn(&f, "mid", 20, 5_000);
    turn(&f, "new", 30, 7_000);
    f.table.acquire(&key("projA", "next"), &both(), 40).unwrap();
    assert_eq!(
        offered(&f),
        pairs::<[u64]>(&[("titan", &[7_000, 5_000, 9_000]), ("mini", &[])])
    );
    // "old" speaks again and holds more: first again. "next" (placed, not yet answered) holds 0.
    turn(&f, "old", 50, 12_000);
    f.table
        .acquire(&key("projA", "later"), &both(), 60)
        .unwrap();
    assert_eq!(
        offered(&f),
        pairs::<[u64]>(&[("titan", &[12_000, 0, 7_000, 5_000]), ("mini", &[])])
    );
    // A conversation that moves takes its place on its new host, and leaves the old one.
    f.hosts.down("titan");
    turn(&f, "mid", 70, 6_000);
    f.hosts.up("titan");
    f.table
        .acquire(&key("projA", "after"), &both(), 80)
        .unwrap();
    let got = offered(&f);
    assert_eq!(got[0], ("titan".to_string(), vec![0, 12_000, 0, 7_000]));
    assert_eq!(got[1].0, "mini");
    assert_eq!(got[1].1.len(), 1, "mid moved, its held tokens start again");
}

#[test]
fn what_a_hosts_slots_hold_is_its_newest_conversation_per_slot() {
    let f = fix();
    f.chooser.prefer("titan");
    for (i, tokens) in [30_000, 20_000, 4_000, 3_000].into_iter().enumerate() {
        turn(&f, &format!("c{i}"), 10 * i as i64, tokens);
    }
    // Two slots hold the two newest; every lease together would be 57,000.
    assert_eq!(f.table.held_in_slots("qwen", "titan", 2), 7_000);
    assert_eq!(f.table.held_in_slots("qwen", "titan", 8), 57_000);
    assert_eq!(f.table.held_in_slots("qwen", "mini", 2), 0);
}

#[test]
fn a_conversation_is_offered_with_its_family_and_its_last_use() {
    let f = fix();
    f.chooser.prefer("titan");
    let family = |id| crate::fingerprint::Family { id, bytes: 4_000 };
    let ask = |id| Ask {
        family: Some(family(id)),
        ..Ask::default()
    };
    // Placed with its family: listed with it before any answer.
    (f.table)
        .acquire_held(&key("projA", "main"), &both(), 10, &ask(7))
        .unwrap();
    // Placed without one (a lease read back at start knows none); its answer names it.
    let (_, hold) = (f.table)
        .acquire_held(&key("projA", "sub"), &both(), 20, &Ask::default())
        .unwrap();
    hold.unwrap().set_held(3_000, Some(9));
    // An answer that names no family (a body with none) keeps the one it had.
    let (_, hold) = (f.table)
        .acquire_held(&key("projA", "main"), &both(), 30, &Ask::default())
        .unwrap();
    hold.unwrap().set_held(5_000, None);
    f.table.acquire(&key("projA", "next"), &both(), 40).unwrap();
    let titan = (f.chooser.offered.lock().iter())
        .find(|c| c.host == "titan")
        .map(|c| c.held_newest.clone())
        .unwrap();
    let held = |tokens, family, last_used| Resident {
        tokens,
        family,
        last_used,
    };
    assert_eq!(titan, [held(5_000, Some(7), 30), held(3_000, Some(9), 20)]);
}
