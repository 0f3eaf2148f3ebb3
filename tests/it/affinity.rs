//! Where new conversations land.

use crate::support::{chat, host, Harness, HostSpec};

const CHAT: &str = "/projA/v1/chat/completions";

#[test]
fn conversations_that_start_while_every_host_is_idle_spread_over_the_hosts() {
    // One at a time, so every host has all its slots free each time: only the lease count differs.
    let h = Harness::start(vec![host("a", 2), host("b", 2), host("c", 2)], "");
    let mut placed = Vec::new();
    for conv in 0..6 {
        let answer = h.post(CHAT, &chat(&format!("task {conv}"), 0, false));
        assert_eq!(answer.status, 200, "{}", answer.text());
        placed.push(answer.header("X-Crossbar-Host").unwrap_or("?").to_string());
    }
    assert_eq!(placed, ["a", "b", "c", "a", "b", "c"]);
    // And each keeps its host on its next turn.
    for (conv, first) in placed.iter().enumerate() {
        let answer = h.post(CHAT, &chat(&format!("task {conv}"), 1, false));
        assert_eq!(answer.header("X-Crossbar-Host"), Some(first.as_str()));
        assert_eq!(answer.header("X-Crossbar-Lease"), Some("reused"));
    }
}

#[test]
fn a_heavier_host_takes_more_conversations_in_proportion() {
    let big = HostSpec {
        weight: 2,
        ..host("big", 2)
    };
    let h = Harness::start(vec![big, host("small", 2)], "");
    let placed: Vec<String> = (0..6)
        .map(|conv| {
            let answer = h.post(CHAT, &chat(&format!("task {conv}"), 0, false));
            answer.header("X-Crossbar-Host").unwrap_or("?").to_string()
        })
        .collect();
    let big = placed.iter().filter(|p| *p == "big").count();
    assert_eq!(
        big, 4,
        "weight 2 against 1 holds twice the leases: {placed:?}"
    );
}
