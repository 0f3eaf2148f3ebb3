//! Where new conversations land, and the affinity benchmark's arithmetic (its `figures` module is
//! compiled in here, so the numbers the benchmark reports are checked by the gate).

#[path = "../../benches/affinity/figures.rs"]
mod figures;

use crate::support::{chat, host, wait_until, Harness, HostSpec};
use figures::{figures, history_reprefilled, ratio, show_ratio, Floor, TurnFacts};

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

/// Issue 23: metadata takes no lease on any route (what `spread_new` did, now always).
#[test]
fn a_model_listing_neither_steers_new_conversations_nor_waits_for_a_slot() {
    let h = Harness::start(vec![host("a", 1), host("b", 1)], "queue_timeout = \"1s\"");
    let gw = h.server().gateway().clone();
    let models = h.get("/projA/v1/models");
    assert_eq!(models.status, 200, "{}", models.text());
    assert_eq!(models.header("X-Crossbar-Lease"), Some("none"));
    assert_eq!(models.header("X-Crossbar-Placement"), Some("none"));
    assert!(gw.leases.snapshot().is_empty(), "a listing holds no lease");
    // Had the listing left a route-level lease, both conversations would inherit its host.
    let first = h.post(CHAT, &chat("task one", 0, false));
    let second = h.post(CHAT, &chat("task two", 0, false));
    assert_ne!(
        first.header("X-Crossbar-Host"),
        second.header("X-Crossbar-Host"),
        "new conversations still spread"
    );

    // With every slot held by a stream, a listing is answered at once, not queued (it would get
    // 503 queue timeout after 1 s).
    for sim in ["a", "b"] {
        h.sim(sim).set_lockstep(true);
    }
    let mut streams: Vec<_> = ["task one", "task two"]
        .iter()
        .map(|t| h.open_chat(CHAT, &chat(t, 1, true)))
        .collect();
    wait_until("both slots are busy", || {
        gw.limiter.in_flight("a", "m") + gw.limiter.in_flight("b", "m") == 2
    });
    let models = h.get("/projA/v1/models");
    assert_eq!(models.status, 200, "{}", models.text());
    let row = h.rows().into_iter().last().expect("a row for the listing");
    assert_eq!((row.status, row.queued_ms), (200, 0));
    for sim in ["a", "b"] {
        h.sim(sim).set_lockstep(false);
    }
    for s in &mut streams {
        assert_eq!(s.read_answer().status, 200);
    }
}

fn turn(prev_prompt: u64, prompt_n: u64, cache_n: u64) -> TurnFacts {
    TurnFacts {
        ok: true,
        ttfb_ms: 10.0,
        prompt_n,
        cache_n,
        prev_prompt,
        ..TurnFacts::default()
    }
}

#[test]
fn history_re_prefilled_counts_only_tokens_sent_in_an_earlier_turn() {
    // (story, prev_prompt, prompt_n, cache_n, expected)
    let cases = [
        ("a first turn is all new", 0, 500, 0, 0),
        ("a warm cache re-prefills nothing", 500, 80, 540, 0),
        (
            "a cold host re-prefills the whole history",
            500,
            620,
            0,
            500,
        ),
        (
            "a partial hit re-prefills the rest of the history",
            500,
            420,
            200,
            300,
        ),
        (
            "a cache past the history leaves only new tokens",
            500,
            20,
            600,
            0,
        ),
    ];
    for (story, prev, prompt_n, cache_n, want) in cases {
        assert_eq!(
            history_reprefilled(&turn(prev, prompt_n, cache_n)),
            want,
            "{story}"
        );
    }
    let lost = TurnFacts {
        ok: false,
        ..turn(500, 620, 0)
    };
    assert_eq!(
        history_reprefilled(&lost),
        0,
        "a lost turn prefilled nothing it reports"
    );
}

#[test]
fn the_floor_counts_new_tokens_once_and_a_shared_system_prompt_once_in_all() {
    let sharer = |prev, prompt_n, cache_n| TurnFacts {
        shared_system: true,
        ..turn(prev, prompt_n, cache_n)
    };
    let turns = [
        // Two conversations share a 1,000-token system prompt: the second found it warm.
        sharer(0, 1100, 0),
        sharer(0, 150, 1000),
        // Their second turns append 200 each, one found cold (its history prefilled again).
        sharer(1100, 200, 1100),
        sharer(1150, 1350, 0),
        // A conversation of its own: 400, then 100 more.
        turn(0, 400, 0),
        turn(400, 100, 400),
    ];
    // 1,100 + 150 + 200 + 200 + 400 + 100, the shared prompt counted once.
    assert_eq!(Floor::of(&turns).tokens(), Some(2150));
    // Nobody found it warm: its size is unknown, and so is the floor, until another front end's
    // run of the same turns shows it.
    let spread = Floor::of(&[sharer(0, 1100, 0), sharer(0, 1150, 0)]);
    assert_eq!(spread.tokens(), None);
    assert_eq!(spread.with_shared(1000).tokens(), Some(2250 - 1000));
    // No sharers: every new token once.
    assert_eq!(Floor::of(&[turn(0, 400, 0)]).tokens(), Some(400));
}

#[test]
fn figures_sum_the_hosts_work_and_the_clients_view() {
    let turns = [
        turn(0, 500, 0),
        turn(500, 620, 0),
        TurnFacts {
            failed_attempts: 2,
            ttfb_ms: 30.0,
            ..turn(620, 100, 600)
        },
        TurnFacts {
            ok: false,
            failed_attempts: 6,
            ..TurnFacts::default()
        },
    ];
    let f = figures(&turns, 1300, 600, 2.0);
    assert_eq!((f.turns, f.lost_turns, f.failed_attempts), (4, 1, 8));
    assert_eq!(
        (f.prefilled, f.cached, f.history_reprefilled),
        (1300, 600, 500 + 20)
    );
    assert!((f.cached_share() - 600.0 / 1900.0).abs() < 1e-9);
    assert!((f.ttfb_mean_ms - 50.0 / 3.0).abs() < 1e-9);
    assert_eq!(f.ttfb_p95_ms, 30.0);
    assert!((f.turns_per_s - 1.5).abs() < 1e-9);
    assert_eq!(
        (
            show_ratio(ratio(3, 2)),
            show_ratio(ratio(0, 0)),
            show_ratio(ratio(1, 0))
        ),
        ("1.500".to_string(), "1.000".to_string(), "inf".to_string())
    );
}
