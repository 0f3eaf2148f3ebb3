//! A request crossbar cannot pin (Messages) on a host with similarity off: found at work in its
//! slot by a `/slots` poll, it no longer keeps the other conversations from their own slots.

use serde_json::{json, Value};

use crossbar::sim::SimConfig;

use super::{cached, take_turns, turn, CHAT};
use crate::support::{host, wait_until, Conn, Harness, HostSpec};

/// A streamed Messages answer of `max_tokens` under way on `h`'s host `a`, once a `/slots` poll
/// has found it at work: the client's connection, to drop when done.
fn messages_found(h: &Harness, max_tokens: u64) -> Conn {
    let messages = json!({"model": "m", "max_tokens": max_tokens, "stream": true,
        "system": "You are a poet.", "messages": [{"role": "user", "content": "rain"}]});
    let mut conn = Conn::open(h.addr());
    let body = messages.to_string();
    conn.send("POST", "/projA/v1/messages", &[], body.as_bytes());
    assert_eq!(conn.read_head().0, 200);
    conn.read_chunk().expect("a first event");
    let gw = h.server().gateway().clone();
    wait_until("a /slots poll finds the Messages request at work", || {
        !gw.slots.to_poll("a")
    });
    conn
}

#[test]
fn a_messages_request_found_in_its_slot_leaves_the_other_conversation_its_own() {
    let spec = HostSpec {
        sim: SimConfig {
            slots: 2,
            ram_cache_tokens: 100_000,
            slot_prompt_similarity: 0.0,
            // The Messages answer below runs on for seconds: 500 tokens at 20 ms.
            decode_us_per_token: 20_000,
            ..SimConfig::default()
        },
        config: "pin_slots = true\nslot_prompt_similarity = 0",
        ..host("a", 2)
    };
    let h = Harness::start(vec![spec], "");
    let gw = h.server().gateway().clone();
    wait_until("the first /slots poll", || !gw.slots.doubtful("a"));
    let tasks = [
        "Fix the parser: it fails on nested quotes in the config. ".repeat(7),
        "Write the docs of the parser and its config, with examples. ".repeat(7),
    ];
    for task in &tasks {
        let mut body = turn("You are the coder.", task, 0);
        body["max_tokens"] = 2.into();
        let first = h.post(CHAT, &body);
        assert_eq!(first.status, 200, "{}", first.text());
    }
    let conn = messages_found(&h, 500);
    let admin = h.server().admin_addr();
    let status = crate::support::request(admin, "GET", "/admin/status", &[], b"").json();
    let shown = &status["hosts"][0]["models"][0]["pinned_slots"];
    let states: Vec<&str> = (shown["slots"].as_array().expect("pinned_slots").iter())
        .map(|s| s["state"].as_str().unwrap_or(""))
        .collect();
    let theirs = states.iter().position(|s| *s == "unpinned");
    let theirs = theirs.unwrap_or_else(|| panic!("no slot shown unpinned: {status:#}"));
    assert_eq!(shown["unpinned"], 1, "{status:#}");
    // Each conversation's first turn was pinned; the one whose slot the Messages request took
    // has none of its own left, the other comes back to its own while that request runs.
    let firsts: Vec<i64> = (h.sim("a").requests().iter())
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| serde_json::from_slice::<Value>(&r.body).expect("json")["id_slot"].as_i64())
        .map(|slot| slot.expect("a first turn pinned"))
        .collect();
    let kept = firsts
        .iter()
        .position(|&slot| slot != theirs as i64)
        .expect("one conversation's slot was left");
    let back = h.post(CHAT, &turn("You are the coder.", &tasks[kept], 1));
    assert_eq!(back.status, 200, "{}", back.text());
    let sent = h.sim("a").requests();
    let last = serde_json::from_slice::<Value>(&sent.last().expect("sent").body).expect("json");
    assert_eq!(last["id_slot"].as_i64(), Some(firsts[kept]), "{last}");
    assert!(
        cached(&back) > 100,
        "its history was there: {} cached",
        cached(&back)
    );
    drop(conn);
}

/// The attack on pinning beside a found request: while a long Messages answer runs in one slot,
/// two clients take turns on the other, one leaving every third answer after its first event.
/// Pins go on while the Messages request runs, and not one names a slot the host has busy —
/// with similarity off and on.
#[test]
fn clients_leaving_beside_a_found_request_never_get_a_busy_slot_pinned() {
    for similarity_off in [true, false] {
        let mut sim = SimConfig {
            slots: 2,
            ram_cache_tokens: 100_000,
            decode_us_per_token: 10_000,
            ..SimConfig::default()
        };
        let mut config = "pin_slots = true";
        if similarity_off {
            sim.slot_prompt_similarity = 0.0;
            config = "pin_slots = true\nslot_prompt_similarity = 0";
        }
        let spec = HostSpec {
            sim,
            config,
            ..host("a", 2)
        };
        let h = Harness::start(vec![spec], "queue_max = 64");
        let gw = h.server().gateway().clone();
        wait_until("the first /slots poll", || !gw.slots.doubtful("a"));
        let mut conn = messages_found(&h, 1000);
        let before = h.sim("a").requests().len();
        take_turns(&h, 2, 6, false);
        let sim = h.sim("a");
        let pinned = (sim.requests()[before..].iter())
            .filter(|r| {
                serde_json::from_slice::<Value>(&r.body).is_ok_and(|b| b["id_slot"].is_u64())
            })
            .count();
        assert!(
            conn.read_chunk().is_some(),
            "the Messages answer still runs"
        );
        assert_eq!(
            sim.stats().pinned_busy,
            0,
            "{pinned} pinned, similarity off: {similarity_off}"
        );
        assert!(
            pinned >= 1,
            "nothing pinned beside it, similarity off: {similarity_off}"
        );
        drop(conn);
    }
}
