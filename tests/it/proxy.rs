//! The request path end to end: routing errors, leases, slots, streaming, accounting.

use crossbar::sim::{Fault, SimEvent};
use serde_json::json;

use crate::support::{
    chat, check_error, hold_slot, host, request, wait_event, wait_until, Conn, Harness,
};

const CHAT: &str = "/projA/v1/chat/completions";

#[test]
fn every_routing_error_has_its_status_and_json() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("hi", 0, false);
    check_error(&h.post("/v1/chat/completions", &body), 400, "missing route");
    check_error(
        &h.post("/nope/v1/chat/completions", &body),
        404,
        "unknown route",
    );
    check_error(&h.get("/projA/slots"), 404, "not found");
    check_error(&h.get("/projA/metrics"), 404, "not found");
    // Refused before their route is known, they are counted apart and keep no row (issue 46:
    // a stranger's flood of them filled the disk).
    assert!(h.rows().is_empty(), "{:#?}", h.rows());
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"").text();
    for (reason, n) in [("missing_route", 1), ("unknown_route", 1), ("not_found", 2)] {
        let line =
            format!("crossbar_refused_total{{listener=\"clients\",reason=\"{reason}\"}} {n}");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    assert!(h
        .sim("titan")
        .requests()
        .iter()
        .all(|r| !r.path.contains("chat")));
}

/// Issue 13: a newcomer's addressing mistakes each answer how to fix them, end to end.
#[test]
fn addressing_mistakes_answer_how_to_fix_them() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("hi", 0, false);
    let hint =
        |answer: &crate::support::Answer| answer.error()["hint"].as_str().unwrap_or("").to_string();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        let answer = h.post(path, &body);
        check_error(&answer, 400, "missing route");
        let hint = hint(&answer);
        assert!(hint.contains("routes: projA"), "{path}: {hint}");
        assert!(
            hint.contains("http://<gateway>/<route>/v1"),
            "{path}: {hint}"
        );
    }
    let answer = h.post("/projC/v1/chat/completions", &body);
    check_error(&answer, 404, "unknown route");
    assert!(hint(&answer).contains("\"projC\""), "{}", answer.text());
    assert!(hint(&answer).contains("routes: projA"), "{}", answer.text());
    let answer = h.post("/projA/chat/completions", &body);
    check_error(&answer, 404, "not found");
    assert!(
        hint(&answer).contains("base URL ends in /v1"),
        "{}",
        answer.text()
    );
    assert!(hint(&answer).contains("/projA/v1"), "{}", answer.text());
    assert!(h.sim("titan").requests().iter().all(|r| r.method != "POST"));
}

#[test]
fn header_and_path_naming_different_routes_conflict() {
    let second_route = "[routes.projB]\nhosts = [\"titan\"]\nmodel = \"m\"";
    let h = Harness::start(vec![host("titan", 1)], second_route);
    let body = chat("hi", 0, false);
    let answer = h.post_with(CHAT, &[("X-Crossbar-Route", "projA")], &body);
    assert_eq!(
        answer.status,
        200,
        "the same route twice is fine: {}",
        answer.text()
    );
    let answer = h.post_with(CHAT, &[("X-Crossbar-Route", "projB")], &body);
    check_error(&answer, 400, "conflicting route");
    check_error(
        &h.post_with("/v1/models", &[("X-Crossbar-Route", "nope")], &body),
        404,
        "unknown route",
    );
}

#[test]
fn the_route_header_takes_the_whole_path_as_the_rest() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let answer = h.post_with(
        "/v1/chat/completions",
        &[("X-Crossbar-Route", "projA")],
        &chat("hi", 0, false),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("X-Crossbar-Host"), Some("titan"));
    let seen = h.sim("titan").requests();
    let last = seen.iter().rfind(|r| r.method == "POST").unwrap();
    assert_eq!(last.path, "/v1/chat/completions");
    assert!(
        last.header("X-Crossbar-Route").is_none(),
        "crossbar's own headers stay home"
    );
}

#[test]
fn a_body_over_16_mib_is_refused_with_413() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let big = vec![b'x'; crossbar::proxy::MAX_BODY + 1];
    let answer = request(h.addr(), "POST", CHAT, &[], &big);
    check_error(&answer, 413, "body too large");
}

#[test]
fn a_conversation_gets_a_new_lease_then_reuses_it_with_cached_tokens() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    let first = h.post(CHAT, &chat("write a parser", 0, false));
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("X-Crossbar-Lease"), Some("new"));
    let leased = first.header("X-Crossbar-Host").unwrap().to_string();
    let second = h.post(CHAT, &chat("write a parser", 1, false));
    assert_eq!(second.header("X-Crossbar-Lease"), Some("reused"));
    assert_eq!(second.header("X-Crossbar-Host"), Some(leased.as_str()));
    let rows = h.rows();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].cached_tokens, Some(0));
    assert!(rows[1].cached_tokens.unwrap() > 0, "{:?}", rows[1]);
    assert_eq!(rows[0].fp, rows[1].fp);
    assert_eq!(rows[1].host, leased);
}

#[test]
fn two_new_conversations_spread_over_two_idle_hosts_by_free_slots() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    h.sim("titan").set_lockstep(true);
    h.sim("mini").set_lockstep(true);
    let mut a = h.open_chat(CHAT, &chat("conversation a", 0, true));
    let gw = h.server().gateway().clone();
    wait_until("a holds a slot", || {
        gw.limiter.in_flight("titan", "m") + gw.limiter.in_flight("mini", "m") == 1
    });
    let first = if gw.limiter.in_flight("titan", "m") == 1 {
        "titan"
    } else {
        "mini"
    };
    let mut b = h.open_chat(CHAT, &chat("conversation b", 0, true));
    wait_until("b holds a slot", || {
        gw.limiter.in_flight("titan", "m") + gw.limiter.in_flight("mini", "m") == 2
    });
    let hosts: Vec<String> = gw.leases.snapshot().into_iter().map(|l| l.host).collect();
    assert_eq!(hosts.len(), 2);
    assert_ne!(hosts[0], hosts[1], "both conversations went to {first}");
    h.sim("titan").set_lockstep(false);
    h.sim("mini").set_lockstep(false);
    assert_eq!(a.read_answer().status, 200);
    assert_eq!(b.read_answer().status, 200);
}

#[test]
fn a_full_queue_answers_503_with_retry_after_and_a_queued_request_counts_its_wait() {
    let h = Harness::start(vec![host("titan", 1)], "queue_max = 1");
    let sim = h.sim("titan");
    let gw = h.server().gateway().clone();
    let mut holder = hold_slot(&h, "titan");
    let mut waiter = h.open_chat(CHAT, &chat("waiter", 0, false));
    wait_until("the waiter is queued", || {
        gw.limiter.queued("titan", "m") == 1
    });
    // Its row counts whole milliseconds: a fast machine ran this story in one.
    let queued = std::time::Instant::now();
    wait_until("the waiter has waited a millisecond", || {
        queued.elapsed() >= std::time::Duration::from_millis(2)
    });
    let refused = h.post(CHAT, &chat("third", 0, false));
    check_error(&refused, 503, "queue full");
    assert!(
        refused
            .header("Retry-After")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    sim.set_lockstep(false);
    assert_eq!(holder.read_answer().status, 200);
    assert_eq!(waiter.read_answer().status, 200);
    let rows = h.rows();
    let waited = rows.iter().find(|r| r.status == 200 && r.queued_ms > 0);
    assert!(waited.is_some(), "no row shows a wait: {rows:#?}");
    assert!(rows
        .iter()
        .any(|r| r.status == 503 && r.err == "queue full"));
}

#[test]
fn a_wait_longer_than_queue_timeout_answers_503_queue_timeout() {
    let h = Harness::start(vec![host("titan", 1)], "queue_timeout = \"100ms\"");
    let mut holder = hold_slot(&h, "titan");
    let answer = h.post(CHAT, &chat("late", 0, false));
    check_error(&answer, 503, "queue timeout");
    assert!(answer.header("Retry-After").is_some());
    h.sim("titan").set_lockstep(false);
    assert_eq!(holder.read_answer().status, 200);
}

#[test]
fn usage_and_timings_are_recorded_from_streamed_and_plain_answers() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let plain = h.post(CHAT, &chat("plain", 0, false));
    let body = plain.json();
    let streamed = h.post(CHAT, &chat("streamed", 0, true));
    assert_eq!(streamed.header("Content-Type"), Some("text/event-stream"));
    assert!(
        streamed.text().ends_with("data: [DONE]\n\n"),
        "{}",
        streamed.text()
    );
    let mut with_usage = chat("with usage", 0, true);
    with_usage["stream_options"] = json!({"include_usage": true});
    h.post(CHAT, &with_usage);
    let native = h.post(
        "/projA/completion",
        &json!({"prompt": "once upon a time", "n_predict": 3, "stream": true}),
    );
    assert_eq!(native.status, 200);
    let rows = h.rows();
    assert_eq!(rows.len(), 4);
    assert_eq!(
        rows[0].prompt_tokens,
        body["usage"]["prompt_tokens"].as_i64()
    );
    assert_eq!(
        rows[0].completion_tokens,
        body["usage"]["completion_tokens"].as_i64()
    );
    assert!(!rows[0].streamed && rows[1].streamed && rows[2].streamed && rows[3].streamed);
    assert_eq!(rows[0].cached_tokens, Some(0), "a cold host caches nothing");
    for row in &rows {
        assert!(
            row.prompt_tokens.unwrap() > row.cached_tokens.unwrap(),
            "{row:?}"
        );
        assert!(row.completion_tokens.unwrap() > 0, "{row:?}");
        assert!(row.err.is_empty(), "{row:?}");
    }
    assert_eq!(rows[3].completion_tokens, Some(3));
}

#[test]
fn lock_step_streaming_proves_no_buffering() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let sim = h.sim("titan");
    sim.set_lockstep(true);
    let mut conn = h.open_chat(CHAT, &chat("tokens one by one", 0, true));
    sim.release(1);
    let (status, headers) = conn.read_head();
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "Transfer-Encoding" && v == "chunked"));
    let mut received = 0;
    loop {
        // Event k reaches the client while event k+1 is still held by the sim: were crossbar to
        // buffer, this read would wait forever.
        let chunk = conn.read_chunk().expect("the stream ended early");
        let text = String::from_utf8(chunk).unwrap();
        assert_eq!(
            text.matches("data: ").count(),
            1,
            "one event per chunk: {text:?}"
        );
        received += 1;
        if text.contains("[DONE]") {
            break;
        }
        sim.release(1);
    }
    assert!(
        conn.read_chunk().is_none(),
        "the last chunk ends the stream"
    );
    assert!(received >= 4, "{received}");
}

#[test]
fn a_client_leaving_mid_stream_frees_the_slot_and_closes_upstream() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let sim = h.sim("titan");
    sim.set_lockstep(true);
    let events = sim.events();
    let gw = h.server().gateway().clone();
    let mut conn = Conn::open(h.addr());
    let mut body = chat("going away", 0, true);
    body["max_tokens"] = 10_000.into();
    conn.send("POST", CHAT, &[], body.to_string().as_bytes());
    sim.release(1);
    conn.read_head();
    conn.read_chunk().unwrap();
    drop(conn);
    // The next events hit the closed client; crossbar then closes its upstream connection.
    sim.release(10_000);
    wait_event(&events, "the sim sees its connection close", |e| {
        matches!(e, SimEvent::ClientGone { .. })
    });
    wait_until("the slot is free", || {
        gw.limiter.in_flight("titan", "m") == 0
    });
    wait_until("the row is written", || {
        h.rows().iter().any(|r| r.status == 499)
    });
}

#[test]
fn two_requests_share_one_keep_alive_connection() {
    let h = Harness::start(vec![host("titan", 2)], "");
    let mut conn = Conn::open(h.addr());
    for stream in [true, false, true] {
        conn.send(
            "POST",
            CHAT,
            &[],
            chat("keep alive", 0, stream).to_string().as_bytes(),
        );
        let answer = conn.read_answer();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
}

#[test]
/// Issue 24: a refused connection takes the host down at once, and the request goes once to the
/// next candidate; with none, it is 503 `no healthy host` naming why.
fn an_upstream_that_refuses_is_down_at_once_and_its_lone_request_503_says_why() {
    let h = Harness::start(vec![host("titan", 1)], "health_interval = \"1h\"");
    h.sim("titan").set_fault(Fault::Refuse);
    for _ in 0..2 {
        let answer = h.post(CHAT, &chat("hello", 0, false));
        check_error(&answer, 503, "no healthy host");
        assert!(answer.header("Retry-After").is_some());
        let why = answer.error()["hosts"]["titan"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            why.starts_with("forward to /v1/chat/completions failed"),
            "{why}"
        );
    }
    let rows = h.rows();
    assert!(rows.iter().all(|r| r.status == 503), "{rows:?}");
}

#[test]
fn an_upstream_dying_mid_stream_ends_the_client_stream_broken() {
    let h = Harness::start(vec![host("titan", 1)], "");
    h.sim("titan")
        .set_fault(Fault::DieMidStream { after_events: 2 });
    let mut conn = h.open_chat(CHAT, &chat("fragile", 0, true));
    let (status, _) = conn.read_head();
    assert_eq!(status, 200);
    // Read until the malformed chunk line that marks the break; a clean end would be "0\r\n\r\n".
    let mut text = String::new();
    while !text.contains("!crossbar") {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut conn.reader, &mut line).unwrap();
        assert!(
            n > 0,
            "the connection closed without the break marker: {text:?}"
        );
        assert_ne!(line, "0\r\n", "the stream ended cleanly: {text:?}");
        text.push_str(&line);
    }
    wait_until("the row has the error", || {
        h.rows().iter().any(|r| r.err.contains("mid-body"))
    });
}

#[test]
fn a_client_holding_the_whole_answer_finds_the_slot_already_free() {
    // Issue 3: the slot was freed after the last bytes went out, so a quick next turn could see
    // its host busy and queue, or be sent elsewhere.
    let h = Harness::start(vec![host("titan", 1)], "");
    let gw = h.server().gateway().clone();
    // Many rounds, so that the old order (free after the last write) loses the race at least once.
    for round in 0..40 {
        let stream = round % 2 == 1;
        let answer = h.post(CHAT, &chat("next turn comes fast", round, stream));
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(gw.limiter.in_flight("titan", "m"), 0, "round {round}");
    }
}
