//! Issue 24: only a host's own failures count against it. One slow request is that request's 502
//! and moves no lease; a streak of them takes a hung host down (while `/health` may still say 200);
//! a refused connection takes it down at once.

use crossbar::sim::Fault;

use crate::support::{chat, host, wait_until, Harness};

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
    let refused = h.post(CHAT, &chat("refused", 0, false));
    assert_eq!(refused.status, 502, "{}", refused.text());
    wait_until("titan is down", || !gw.health.healthy("titan"));
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
