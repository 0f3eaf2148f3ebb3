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
