//! A request crossbar cannot pin (Messages) waits until the pinned requests sent before it have
//! started at the host: llama-server could otherwise launch it first, into a pinned one's slot.

use super::*;

/// The attack on the order of launches: a pinned turn is at the host but not yet launched there
/// (llama-server tokenizes a prompt before it posts its task), and a request crossbar cannot pin
/// (Messages), sharing its prompt, is sent now. Launched first, llama-server would give it the
/// pinned turn's slot (the longest shared prefix), and the pinned turn, asking for that slot,
/// would reload a state into it under the running generation (the sim counts it). crossbar holds
/// the unpinned request until the pinned one is seen started (here: its end, a whole answer).
#[test]
fn a_request_crossbar_cannot_pin_waits_until_the_pinned_one_before_it_has_started() {
    let h = started(true);
    let (sim, gw) = (h.sim("a"), h.server().gateway().clone());
    let system = "You are the coder, and a careful one.";
    assert_eq!(h.post(CHAT, &turn(system, "fix it", 0)).status, 200);
    let posts = || {
        (sim.requests().iter())
            .filter(|r| r.method == "POST")
            .count()
    };
    // The pinned turn waits before its slot; the unpinned stream, once at the host, holds its
    // slot until its events are let go.
    sim.hold_pinned(true);
    sim.set_lockstep(true);
    let early = std::thread::scope(|scope| {
        let h = &h;
        let pinned = scope.spawn(move || h.post(CHAT, &turn(system, "fix it", 1)));
        wait_until("the pinned turn at the host", || posts() == 2);
        let messages = json!({"model": "m", "max_tokens": 4, "stream": true, "system": system,
            "messages": [{"role": "user", "content": "fix it"}]});
        let unpinned = scope.spawn(move || h.post("/projA/v1/messages", &messages));
        wait_until("the unpinned request held, or at the host", || {
            gw.slots.waiting("a") == 1 || posts() == 3
        });
        let early = posts() == 3;
        sim.hold_pinned(false);
        if early {
            // What the hold prevents: launched first, it took the pinned turn's slot.
            wait_until("the pinned turn at its slot", || {
                sim.stats().pinned_busy > 0
            });
        }
        sim.set_lockstep(false);
        let (pinned, unpinned) = (pinned.join().unwrap(), unpinned.join().unwrap());
        assert_eq!(pinned.status, 200, "{}", pinned.text());
        assert_eq!(unpinned.status, 200, "{}", unpinned.text());
        early
    });
    assert_eq!(
        sim.stats().pinned_busy,
        0,
        "a pinned turn found its slot taken"
    );
    assert!(!early, "sent before the pinned turn started");
    let seen: Vec<Value> = (sim.requests().iter())
        .filter(|r| r.method == "POST")
        .map(|r| serde_json::from_slice(&r.body).expect("json"))
        .collect();
    assert!(seen[1]["id_slot"].is_u64(), "{}", seen[1]);
    assert_eq!(gw.slots.waiting("a"), 0);
    let metrics = crate::support::request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    let waits = r#"crossbar_slot_settle_waits_total{host="a",settled="yes"} 1"#;
    assert!(metrics.text().contains(waits), "{}", metrics.text());
}

/// A pinned stream settles with its head (llama-server sends it as the slot starts on the
/// prompt): the request crossbar could not pin goes then, while the stream still runs, not at its
/// end.
#[test]
fn a_request_crossbar_cannot_pin_goes_once_the_pinned_stream_before_it_has_its_head() {
    // No `/slots` poll but the first and the one the waiter asks for: the head alone settles.
    let h = started_with(true, "health_interval = \"1h\"\n");
    let (sim, gw) = (h.sim("a"), h.server().gateway().clone());
    let system = "You are the coder, and a careful one.";
    assert_eq!(h.post(CHAT, &turn(system, "fix it", 0)).status, 200);
    let count = |method: &str, path: &str| {
        (sim.requests().iter())
            .filter(|r| r.method == method && r.path == path)
            .count()
    };
    let posts = || count("POST", CHAT.trim_start_matches("/projA"));
    let polls = || count("GET", "/slots");
    sim.hold_pinned(true);
    sim.set_lockstep(true);
    std::thread::scope(|scope| {
        let h = &h;
        let mut body = turn(system, "fix it", 1);
        body["stream"] = true.into();
        let stream = scope.spawn(move || h.post(CHAT, &body));
        wait_until("the pinned stream at the host", || posts() == 2);
        let messages = json!({"model": "m", "max_tokens": 4, "system": system,
            "messages": [{"role": "user", "content": "fix it"}]});
        let before = polls();
        let unpinned = scope.spawn(move || h.post("/projA/v1/messages", &messages));
        wait_until("the unpinned request held", || gw.slots.waiting("a") == 1);
        // The poll it asked for sees the pinned stream's slot idle (not launched): still held.
        wait_until("the poll the waiter asked for", || polls() > before);
        let (after, held) = (polls(), gw.slots.waiting("a"));
        assert_eq!((posts(), held), (2, 1));
        sim.hold_pinned(false);
        let unpinned = unpinned.join().unwrap();
        assert_eq!(unpinned.status, 200, "{}", unpinned.text());
        assert!(!stream.is_finished(), "answered while the stream runs");
        assert!(
            !gw.slots.unsettled(("a", "m")),
            "settled by the head, not a timeout"
        );
        assert_eq!(polls(), after, "no poll settled it");
        sim.set_lockstep(false);
        assert_eq!(stream.join().unwrap().status, 200);
    });
    assert_eq!(sim.stats().pinned_busy, 0);
}
