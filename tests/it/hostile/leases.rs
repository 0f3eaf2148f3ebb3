//! One client's conversations against everyone's (issue 46): a flood of new conversations evicts
//! the flooder's own leases, not everyone's.

use crate::support::{chat, connect_from, host, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// One turn of conversation `session` from the loopback address `from`: its `X-Crossbar-Lease`.
fn turn_from(h: &Harness, from: [u8; 4], session: &str) -> String {
    let mut conn = connect_from(from, h.addr());
    let body = chat("hello", 0, false).to_string();
    conn.send("POST", CHAT, &[("X-Session-Id", session)], body.as_bytes());
    let answer = conn.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
        .header("X-Crossbar-Lease")
        .unwrap_or_default()
        .to_string()
}

/// Before: one client's new conversations filled `max_leases` and the table evicted the least
/// recently used lease, anyone's: a conversation idle a few seconds came back `new`.
#[test]
fn a_flood_of_new_conversations_from_one_address_evicts_its_own_leases_issue_46() {
    let h = Harness::start(
        vec![host("titan", 2)],
        "max_leases = 40\nmax_leases_per_client = 10",
    );
    let victim = [127, 0, 0, 1];
    assert_eq!(turn_from(&h, victim, "victim"), "new");
    for i in 0..60 {
        turn_from(&h, [127, 0, 0, 2], &format!("flood-{i}"));
    }
    assert_eq!(turn_from(&h, victim, "victim"), "reused");
    let gw = h.server().gateway().clone();
    assert_eq!(gw.leases.len(), 11, "the flooder's 10 and the victim's");
}

const ALICE: &str = "cb-alice-0123456789abcdef";
const BOB: &str = "cb-bob-fedcba9876543210";

/// A turn with `key` (and a session id, if any): its `X-Crossbar-Lease` and host.
fn keyed_turn(h: &Harness, key: &str, session: Option<&str>, first: &str) -> (String, String) {
    let bearer = format!("Bearer {key}");
    let mut headers = vec![("Authorization", bearer.as_str())];
    if let Some(session) = session {
        headers.push(("X-Session-Id", session));
    }
    let answer = h.post_with(CHAT, &headers, &chat(first, 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let header = |name| answer.header(name).unwrap_or_default().to_string();
    (header("X-Crossbar-Lease"), header("X-Crossbar-Host"))
}

/// Before: leases were shared across keys, so key B sending key A's `X-Session-Id` rode (or,
/// its host down, moved) A's lease, and `X-Crossbar-Lease: reused` told B that A had recently
/// sent a given prompt. With keys, a conversation is its key's own.
#[test]
fn a_key_neither_rides_nor_learns_of_another_keys_conversations_issue_46() {
    let hash = crate::keys::hash;
    let keys = format!(
        "[keys.alice]\nhash = \"{}\"\n[keys.bob]\nhash = \"{}\"\n",
        hash(ALICE),
        hash(BOB)
    );
    let h = Harness::start(vec![host("titan", 2), host("mini", 2)], &keys);
    let (lease, alices) = keyed_turn(&h, ALICE, Some("shared-id"), "alice's task");
    assert_eq!(lease, "new");
    assert_eq!(keyed_turn(&h, BOB, Some("shared-id"), "bob's").0, "new");
    assert_eq!(keyed_turn(&h, ALICE, None, "a prompt alice sent").0, "new");
    assert_eq!(keyed_turn(&h, BOB, None, "a prompt alice sent").0, "new");
    // Bob's turns touched nothing of alice's: her conversation is where it was.
    let (lease, host) = keyed_turn(&h, ALICE, Some("shared-id"), "alice's task");
    assert_eq!((lease.as_str(), host), ("reused", alices));
    assert_eq!(
        keyed_turn(&h, ALICE, None, "a prompt alice sent").0,
        "reused"
    );
    let fps: std::collections::BTreeSet<String> = h.rows().into_iter().map(|r| r.fp).collect();
    assert_eq!(fps.len(), 4, "four conversations: {fps:?}");
}
