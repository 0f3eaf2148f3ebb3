//! The attack under load: clients leaving mid-answer while others come back, and no request is
//! ever pinned to a slot still busy with an answer its client left.

use super::*;

/// The attack under load: four clients at once on a two-slot pinning host, every third turn
/// streamed and abandoned after its first event, Messages requests (unpinnable) among them. Not
/// one request may name a slot the host still has busy (on b11434 that corrupts the answer
/// running there; the sim counts it), and pinning must still happen. (A host with similarity off
/// is not pinned: `stash.rs`.)
#[test]
fn clients_leaving_mid_answer_under_load_never_get_a_busy_slot_pinned() {
    let sim = SimConfig {
        slots: 2,
        ram_cache_tokens: 100_000,
        // A host notices a client gone at its next token: 10 ms of a generation running on.
        decode_us_per_token: 10_000,
        ..SimConfig::default()
    };
    let spec = HostSpec {
        sim,
        config: "exclusive = true",
        ..host("a", 2)
    };
    // Four clients from one address, each may wait (issue 46's share per client).
    let h = Harness::start(vec![spec], "queue_max = 64\nqueue_max_per_client = 4");
    let gw = h.server().gateway().clone();
    wait_until("the first /slots poll", || !gw.slots.doubtful("a"));
    std::thread::scope(|scope| {
        for client in 0..4 {
            let h = &h;
            scope.spawn(move || {
                for turn_no in 0..9 {
                    let task = format!("client {client} task");
                    let mut body = turn("You are the coder, careful.", &task, turn_no);
                    body["max_tokens"] = 3.into();
                    if turn_no % 3 == 2 {
                        (body["stream"], body["max_tokens"]) = (true.into(), 1_000.into());
                        let mut conn = crate::support::Conn::open(h.addr());
                        conn.send("POST", CHAT, &[], body.to_string().as_bytes());
                        conn.read_head();
                        let _ = conn.read_chunk();
                    } else if turn_no % 3 == 1 {
                        let messages = json!({"model": "m", "max_tokens": 10,
                            "system": "You are the coder, careful.",
                            "messages": [{"role": "user", "content": task}]});
                        h.post("/projA/v1/messages", &messages);
                    } else {
                        let answer = h.post(CHAT, &body);
                        assert_eq!(answer.status, 200, "{}", answer.text());
                    }
                }
            });
        }
    });
    let sim = h.sim("a");
    let pinned = (sim.requests().iter())
        .filter(|r| r.method == "POST")
        .filter(|r| serde_json::from_slice::<Value>(&r.body).is_ok_and(|b| b["id_slot"].is_u64()))
        .count();
    assert_eq!(sim.stats().pinned_busy, 0, "{pinned} pinned");
    assert!(pinned >= 1, "no request pinned");
}
