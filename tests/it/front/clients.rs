//! Clients that misbehave with time: the accept queue when every worker is busy, idle keep-alive
//! connections, a client that leaves while queued, and one that stops reading its stream.

use std::net::Shutdown;
use std::time::{Duration, Instant};

use crossbar::sim::{SimConfig, SimEvent};

use super::{check_error, check_served, refused, CHAT};
use crate::support::{chat, hold_slot, host, wait_event, wait_until, Conn, Harness, HostSpec};

#[test]
fn a_full_accept_queue_is_503_busy_with_retry_after_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "workers = 1\naccept_queue = 1");
    let sim = h.sim("titan");
    // The one worker streams; the next connection waits in the queue; the one after is refused.
    let mut streaming = hold_slot(&h, "titan");
    let mut queued = h.open_chat(CHAT, &chat("queued", 0, false));
    let mut busy = None;
    wait_until("a connection is refused as busy", || {
        let mut conn = h.open_chat(CHAT, &chat("refused", 0, false));
        let answer = conn.read_answer();
        if answer.status == 503 {
            busy = Some(answer);
            true
        } else {
            false
        }
    });
    let busy = busy.unwrap();
    check_error(&busy, 503, "busy");
    assert_eq!(busy.header("Retry-After"), Some("1"));
    assert_eq!(refused(&h, "clients", "busy"), 1);
    sim.set_lockstep(false);
    assert_eq!(streaming.read_answer().status, 200);
    assert_eq!(queued.read_answer().status, 200);
    check_served(&h);
}

/// SDKs keep pools of idle connections: 64 of them arriving at once on 2 workers are all served
/// without each waiting out a worker's idle step (100 ms) behind the one before, and with all 64
/// kept open a new connection is still served promptly (the idle ones are parked off the workers).
#[test]
fn idle_keep_alive_connections_never_keep_a_new_one_waiting_issue_10() {
    let extra = "workers = 2\nmax_connections_per_peer = 100";
    let h = Harness::start(vec![host("titan", 4)], extra);
    let started = Instant::now();
    let mut idle: Vec<Conn> = (0..64)
        .map(|_| {
            let mut conn = Conn::open(h.addr());
            conn.send("GET", "/projA/v1/models", &[], b"");
            conn
        })
        .collect();
    for (i, conn) in idle.iter_mut().enumerate() {
        assert_eq!(conn.read_answer().status, 200, "idle connection {i}");
    }
    let all = started.elapsed();
    assert!(
        all < Duration::from_secs(2),
        "64 first requests took {all:?}"
    );
    let started = Instant::now();
    check_served(&h);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    // The parked ones still work.
    for conn in &mut idle[..4] {
        conn.send("GET", "/projA/v1/models", &[], b"");
        assert_eq!(conn.read_answer().status, 200);
    }
}

/// Seed 001 step 4: the wait ends when the client leaves, the row says 499, and the host never
/// sees the request.
#[test]
fn a_client_that_leaves_while_queued_is_never_forwarded_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let sim = h.sim("titan");
    let gw = h.server().gateway().clone();
    let mut holder = hold_slot(&h, "titan");
    let leaver = h.open_chat(CHAT, &chat("leaver", 0, false));
    wait_until("the leaver is queued", || {
        gw.limiter.queued("titan", "m") == 1
    });
    leave(leaver, "the leaver left the queue", || {
        gw.limiter.queued("titan", "m") == 0
    });
    // The queue count drops as the waiter leaves; its row is committed just after (by the
    // store's writer thread).
    wait_until("the leaver's row", || {
        h.rows().iter().any(|r| r.status == 499)
    });
    let rows = h.rows();
    let row = rows.last().expect("a 499 row");
    assert_eq!(
        (row.status, row.err.as_str()),
        (499, "client gone while queued"),
        "{row:?}"
    );
    sim.set_lockstep(false);
    assert_eq!(holder.read_answer().status, 200);
    let posts: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "only the holder was forwarded: {posts:#?}");
    check_served(&h);
}

/// A laptop going to sleep mid-stream: after `client_write_timeout` crossbar gives up, closes the
/// upstream connection (the host cancels the generation), frees the slot, and records 499.
#[test]
fn a_client_that_stops_reading_loses_its_stream_and_the_slot_is_freed_issue_10() {
    let roomy = HostSpec {
        sim: SimConfig {
            slots: 1,
            n_ctx: 4_000_000,
            ..SimConfig::default()
        },
        ..host("titan", 1)
    };
    let h = Harness::start(vec![roomy], "client_write_timeout = \"300ms\"");
    let events = h.sim("titan").events();
    let body = serde_json::json!({
        "model": "m", "stream": true, "max_tokens": 200_000,
        "messages": [{"role": "user", "content": "talk forever"}],
    });
    let sleeper = h.open_chat(CHAT, &body);
    wait_event(&events, "the host notices the client is gone", |e| {
        matches!(e, SimEvent::ClientGone { .. })
    });
    let gw = h.server().gateway().clone();
    wait_until("the slot is free", || {
        gw.limiter.in_flight("titan", "m") == 0
    });
    wait_until("the row is written", || {
        h.rows().iter().any(|r| r.status == 499)
    });
    let row = h.rows().into_iter().find(|r| r.status == 499).unwrap();
    assert_eq!(row.err, "client stalled", "{row:?}");
    drop(sleeper);
    check_served(&h);
}

/// Seed 001 step 4, second half: prefill can take minutes; a client that leaves while crossbar
/// waits for the host's first byte ends the wait within a second, and the slot is free again.
#[test]
fn a_client_that_leaves_before_the_first_byte_frees_the_slot_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let sim = h.sim("titan");
    let events = sim.events();
    sim.set_fault(crossbar::sim::Fault::Hang);
    let gw = h.server().gateway().clone();
    let leaver = h.open_chat(CHAT, &chat("a long prefill", 0, true));
    wait_event(
        &events,
        "the host has the request",
        |e| matches!(e, SimEvent::Request { path } if path.contains("chat")),
    );
    leave(leaver, "the slot is free", || {
        gw.limiter.in_flight("titan", "m") == 0
    });
    wait_until("the row is written", || {
        h.rows().iter().any(|r| r.status == 499)
    });
    let row = h.rows().into_iter().find(|r| r.status == 499).unwrap();
    assert_eq!(row.err, "client gone while waiting for upstream", "{row:?}");
    assert!(
        gw.health.healthy("titan"),
        "a client leaving is not the host's failure"
    );
    sim.set_fault(crossbar::sim::Fault::None);
    check_served(&h);
}

/// llama-server sends a stream's head before its prefill: a client that leaves after the head but
/// before the first event is noticed in the body's wait, recorded as 499 (not an upstream failure).
#[test]
fn a_client_that_leaves_after_the_head_but_before_any_event_is_a_499_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let sim = h.sim("titan");
    sim.set_lockstep(true);
    let gw = h.server().gateway().clone();
    let mut leaver = h.open_chat(CHAT, &chat("a long prefill", 0, true));
    assert_eq!(leaver.read_head().0, 200);
    leave(leaver, "the slot is free", || {
        gw.limiter.in_flight("titan", "m") == 0
    });
    // The slot is freed before the row is written, as at every request's end (issue 45).
    wait_until("the row is written", || {
        h.rows().iter().any(|r| r.status == 499)
    });
    let row = h.rows().pop().expect("a row");
    assert_eq!(
        (row.status, row.err.as_str()),
        (499, "client gone while waiting for upstream")
    );
    sim.set_lockstep(false);
    check_served(&h);
}

/// Closes `conn` as a client that leaves, then waits until `noticed` says crossbar saw it go:
/// within 1.5 s (it looks every 500 ms while it waits on the client's behalf).
fn leave(conn: Conn, what: &str, noticed: impl FnMut() -> bool) {
    let left = Instant::now();
    conn.reader.get_ref().shutdown(Shutdown::Both).unwrap();
    drop(conn);
    wait_until(what, noticed);
    let took = left.elapsed();
    assert!(took < Duration::from_millis(1500), "{what}: {took:?}");
}
