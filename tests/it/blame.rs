//! Issue 24: only a host's own failures count against it. One slow request is that request's 502
//! and moves no lease; a streak of them takes a hung host down (while `/health` may still say 200);
//! a refused connection takes it down at once.

use crossbar::sim::Fault;

use crate::support::{chat, host, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

fn unhealthy_events(h: &Harness) -> usize {
    let events = h.db().recent_events(100).unwrap();
    events
        .iter()
        .filter(|e| e.reason.as_str() == "unhealthy")
        .count()
}

#[test]
fn one_slow_request_moves_no_lease_while_a_streak_takes_a_hung_host_down() {
    let h = Harness::start(
        vec![host("titan", 1), host("atlas", 1)],
        "health_interval = \"1h\"\nfirst_byte_timeout = \"200ms\"",
    );
    let gw = h.server().gateway().clone();
    let first = h.post(CHAT, &chat("long prefill", 0, false));
    let leased = first.header("X-Crossbar-Host").unwrap().to_string();
    h.sim(&leased).set_fault(Fault::Hang);
    // One request past first_byte_timeout: its own 502, nothing else.
    let slow = h.post(CHAT, &chat("long prefill", 1, false));
    assert_eq!(slow.status, 502, "{}", slow.text());
    assert!(
        gw.health.healthy(&leased),
        "one slow request is not a dead host"
    );
    assert_eq!(unhealthy_events(&h), 0);
    // health_fall (3) of them in a row with no answer between: the host is hung, down it goes.
    for turn in 2..4 {
        let slow = h.post(CHAT, &chat("long prefill", turn, false));
        assert_eq!(slow.status, 502, "{}", slow.text());
    }
    assert!(
        !gw.health.healthy(&leased),
        "a streak takes a hung host down"
    );
    h.sim(&leased).set_fault(Fault::None);
    let moved = h.post(CHAT, &chat("long prefill", 4, false));
    assert_eq!(moved.status, 200, "{}", moved.text());
    assert_ne!(moved.header("X-Crossbar-Host"), Some(leased.as_str()));
    assert_eq!(moved.header("X-Crossbar-Placement"), Some("unhealthy"));
    assert_eq!(unhealthy_events(&h), 1);
}

#[test]
fn an_answer_between_failures_ends_the_streak_and_a_refused_connect_is_down_at_once() {
    let h = Harness::start(
        vec![host("titan", 1)],
        "health_interval = \"1h\"\nfirst_byte_timeout = \"200ms\"\nhealth_fall = 2",
    );
    let gw = h.server().gateway().clone();
    for turn in 0..3 {
        h.sim("titan").set_fault(Fault::Hang);
        let slow = h.post(CHAT, &chat("flaky", turn, false));
        assert_eq!(slow.status, 502, "{}", slow.text());
        h.sim("titan").set_fault(Fault::None);
        let fine = h.post(CHAT, &chat("other", turn, false));
        assert_eq!(fine.status, 200, "{}", fine.text());
    }
    assert!(gw.health.healthy("titan"), "never two failures in a row");
    h.sim("titan").set_fault(Fault::Refuse);
    // Refused, the request would go to the next candidate; titan was the only one.
    let refused = h.post(CHAT, &chat("refused", 0, false));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(!gw.health.healthy("titan"), "down at once");
    let admin = h.server().admin_addr();
    let text = crate::support::request(admin, "GET", "/metrics", &[], b"").text();
    for line in [
        r#"crossbar_forward_failures_total{against="host",kind="reached"} 3"#,
        r#"crossbar_forward_failures_total{against="host",kind="connect"} 1"#,
        r#"crossbar_host_transitions_total{host="titan",to="down",why="unreachable"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[test]
fn a_refused_connection_sends_the_request_once_to_the_next_host() {
    let h = Harness::start(
        vec![host("titan", 1), host("atlas", 1)],
        "health_interval = \"1h\"",
    );
    let first = h.post(CHAT, &chat("moving", 0, false));
    let leased = first.header("X-Crossbar-Host").unwrap().to_string();
    h.sim(&leased).set_fault(Fault::Refuse);
    let next = h.post(CHAT, &chat("moving", 1, false));
    assert_eq!(next.status, 200, "{}", next.text());
    assert_ne!(next.header("X-Crossbar-Host"), Some(leased.as_str()));
    assert_eq!(next.header("X-Crossbar-Placement"), Some("unhealthy"));
    assert_eq!(unhealthy_events(&h), 1);
    let rows = h.rows();
    let last = rows.last().unwrap();
    assert_eq!((last.status, last.placed.as_str()), (200, "unhealthy"));
    assert_ne!(last.host, leased);
    // Both down: no third try, and the answer names why.
    let other = next.header("X-Crossbar-Host").unwrap().to_string();
    h.sim(&other).set_fault(Fault::Refuse);
    let none = h.post(CHAT, &chat("moving", 2, false));
    assert_eq!(none.status, 503, "{}", none.text());
    // A refusal says why of each host (issue 24), inside the error object (issue 27).
    let error = none.error();
    assert_eq!(error["code"], "no healthy host");
    for host in ["titan", "atlas"] {
        let why = error["hosts"][host].as_str().unwrap_or_default();
        assert!(
            why.starts_with("forward to /v1/chat/completions failed"),
            "{host}: {why}"
        );
    }
}
