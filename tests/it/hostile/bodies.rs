//! Whole bodies waiting for a busy host (issue 46, finding 1). Before, a body's charge on the
//! body budget (`client_body_buffer_mib`) was kept until its request ended: 16 whole bodies of
//! 16 MiB sent once, no key, to a route whose host decodes slowly held the budget while they
//! waited for its slot, and 76 of 77 requests to an idle route got `503 busy` for 40 s. And each
//! request in line holds a worker: enough of them, and a request to an idle route waited for one.
//! Now a body gives its charge back once whole, and what waiting requests hold is bounded in all
//! (`queue_max_total`, a share of `workers`; `queue_body_mib`) and per client.

use serde_json::Value;

use crate::support::{
    chat, check_error, connect_from, host, request, wait_until, Answer, Conn, Harness, HostSpec,
};

/// Route `p` on host `slow` (one slot, its streams held by the test), route `q` on host `idle`;
/// `extra` global lines. Both take prompts of any size (`ctx`), so big bodies are not refused
/// for their context.
fn two_routes(extra: &str) -> Harness {
    let spec = |name| HostSpec {
        config: "ctx = 10000000",
        ..host(name, 1)
    };
    let routes = "\n[routes.p]\nhosts = [\"slow\"]\nmodel = \"m\"\n\
                  [routes.q]\nhosts = [\"idle\"]\nmodel = \"m\"\n";
    let h = Harness::start_with(vec![spec("slow"), spec("idle")], extra, routes);
    h.sim("slow").set_lockstep(true);
    h
}

/// A streamed chat turn exactly `bytes` long, padded in a field nobody reads.
fn body_of(bytes: usize, first: &str) -> Vec<u8> {
    let mut body: Value = chat(first, 0, true);
    body["pad"] = "".into();
    let pad = bytes - body.to_string().len();
    body["pad"] = "x".repeat(pad).into();
    let body = body.to_string().into_bytes();
    assert_eq!(body.len(), bytes);
    body
}

/// Sends `body` to route `p` from `from` on a connection of its own, answer unread.
fn to_slow_route(h: &Harness, from: [u8; 4], body: &[u8]) -> Conn {
    let mut conn = connect_from(from, h.addr());
    conn.send("POST", "/p/v1/chat/completions", &[], body);
    conn
}

/// A small request to the idle route, answered.
fn to_idle_route(h: &Harness) -> Answer {
    let body = chat("a small question", 0, false).to_string();
    request(
        h.addr(),
        "POST",
        "/q/v1/chat/completions",
        &[],
        body.as_bytes(),
    )
}

const ATTACKER: [u8; 4] = [127, 0, 0, 2];

#[test]
fn whole_bodies_waiting_for_a_busy_host_leave_an_idle_route_served_issue_46() {
    // One client may hold all the waiting places here, to show the bound on all of them.
    let h = two_routes("workers = 5\nclient_body_buffer_mib = 1\nqueue_max_per_client = 2");
    let gw = h.server().gateway().clone();
    let half = body_of(512 << 10, "the attacker");
    // One takes the slow host's slot, one waits: together the whole body budget.
    let _first = to_slow_route(&h, ATTACKER, &half);
    wait_until("the first has the slot", || {
        gw.limiter.in_flight("slow", "m") == 1
    });
    let _second = to_slow_route(&h, ATTACKER, &half);
    wait_until("the second waits", || gw.limiter.queued("slow", "m") == 1);
    let answer = to_idle_route(&h);
    assert_eq!(answer.status, 200, "{}", answer.text());
    // One more waits; the next, from anyone, would take more of the workers than waiting
    // requests may hold.
    let _third = to_slow_route(&h, ATTACKER, &half);
    wait_until("the third waits", || gw.limiter.queued("slow", "m") == 2);
    let answer = to_slow_route(&h, [127, 0, 0, 3], &half).read_answer();
    check_error(&answer, 503, "queue full");
    assert_eq!(
        answer.error()["bound"],
        "queue_max_total",
        "{}",
        answer.text()
    );
    assert_eq!(answer.header("Retry-After"), Some("1"));
    let answer = to_idle_route(&h);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(gw.limiter.waiting_held(), (2, 2 << 19));
    h.sim("slow").set_lockstep(false);
}

/// Each request in line holds a worker: queues on a busy route, from as many addresses as it
/// takes, may hold only `queue_max_total` of them (half of `workers` by default), and a small
/// request to an idle route finds one of the rest. Before, four waiters from four addresses held
/// all four workers and the idle route's request waited for one.
#[test]
fn queues_on_a_busy_route_leave_a_worker_for_an_idle_one_issue_46() {
    let h = two_routes("workers = 4");
    let gw = h.server().gateway().clone();
    let small = chat("one of many", 0, true).to_string().into_bytes();
    let mut held = vec![to_slow_route(&h, [127, 0, 0, 2], &small)];
    wait_until("the first has the slot", || {
        gw.limiter.in_flight("slow", "m") == 1
    });
    for (i, from) in [[127, 0, 0, 3], [127, 0, 0, 4]].into_iter().enumerate() {
        held.push(to_slow_route(&h, from, &small));
        wait_until("it waits", || gw.limiter.queued("slow", "m") == i + 1);
    }
    let answer = to_slow_route(&h, [127, 0, 0, 5], &small).read_answer();
    check_error(&answer, 503, "queue full");
    let answer = to_idle_route(&h);
    assert_eq!(answer.status, 200, "{}", answer.text());
    h.sim("slow").set_lockstep(false);
}

/// Per client, here an address: one client's whole bodies wait up to its share of the bytes,
/// and another client's still wait beside them.
#[test]
fn one_address_waits_within_its_share_of_the_bytes_and_another_still_waits_issue_46() {
    let h = two_routes("queue_body_mib_per_client = 1");
    let gw = h.server().gateway().clone();
    let big = body_of(600 << 10, "the attacker");
    let _first = to_slow_route(&h, ATTACKER, &big);
    wait_until("the first has the slot", || {
        gw.limiter.in_flight("slow", "m") == 1
    });
    let _second = to_slow_route(&h, ATTACKER, &big);
    wait_until("the second waits", || gw.limiter.queued("slow", "m") == 1);
    let answer = to_slow_route(&h, ATTACKER, &big).read_answer();
    check_error(&answer, 503, "queue full");
    assert_eq!(answer.error()["bound"], "queue_body_mib_per_client");
    let message = answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("queue_body_mib_per_client"), "{message}");
    let _other = to_slow_route(&h, [127, 0, 0, 3], &big);
    wait_until("another address waits", || {
        gw.limiter.queued("slow", "m") == 2
    });
    h.sim("slow").set_lockstep(false);
}
