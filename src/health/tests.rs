//! Health table stories: start-up, polls, forward failures, reloads, the loaded-model rule.

use super::*;

fn host(name: &str, ctx: Option<u64>, models: &[&str]) -> config::Host {
    config::Host {
        name: name.into(),
        url: format!("http://{name}.invalid:8080"),
        weight: 1,
        api_key: None,
        ctx,
        kv_tokens: None,
        slot_prompt_similarity: Some(0.1),
        exclusive: false,
        ram_cache: None,
        implied: false,
        models: models.iter().map(|m| (m.to_string(), Some(1))).collect(),
        upstream: BTreeMap::new(),
    }
}

fn hosts(list: &[config::Host]) -> BTreeMap<String, config::Host> {
    list.iter().map(|h| (h.name.clone(), h.clone())).collect()
}

fn up(ctx: Option<u64>, slots: Option<u64>, loaded: &[&str]) -> Poll {
    Poll::Up {
        per_slot_ctx: ctx,
        total_slots: slots,
        loaded: loaded.iter().map(|s| s.to_string()).collect(),
        router: false,
        models: Vec::new(),
        max_instances: None,
        build: None,
        ctx_train: None,
    }
}

fn unreachable() -> DownReason {
    DownReason::Unreachable {
        path: "/health".into(),
        error: "Connection Failed: refused".into(),
    }
}

fn loading() -> DownReason {
    DownReason::Loading {
        path: "/health".into(),
    }
}

fn forward_failed() -> DownReason {
    DownReason::ForwardFailed {
        path: "/v1/chat/completions".into(),
        error: "Network Error: reset".into(),
    }
}

#[track_caller]
fn check_state(health: &Health, name: &str, healthy: bool, reason: Option<DownReason>, since: i64) {
    let status = health.get(name).expect("host is in the table");
    assert_eq!(
        (status.healthy, status.reason.clone(), status.since),
        (healthy, reason, since),
        "(healthy, reason, since) of {name}"
    );
    assert_eq!(health.healthy(name), healthy);
}

#[test]
fn hosts_start_healthy_with_their_ctx_override_known() {
    let health = Health::new(&hosts(&[
        host("titan", None, &["q"]),
        host("mini", Some(4096), &["q"]),
    ]));
    check_state(&health, "titan", true, None, 0);
    check_state(&health, "mini", true, None, 0);
    assert_eq!(health.per_slot_ctx("titan"), None);
    assert_eq!(health.per_slot_ctx("mini"), Some(4096));
    assert_eq!(health.get("ghost"), None);
    assert!(!health.healthy("ghost"));
}

#[test]
fn polls_flip_a_host_and_only_flips_are_transitions() {
    let health = Health::new(&hosts(&[host("mini", None, &["q"])]));
    assert!(
        !health.apply("mini", up(Some(2048), Some(2), &["q"]), 100),
        "already up"
    );
    assert!(!health.apply("mini", up(Some(2048), Some(2), &["q"]), 200));
    check_state(&health, "mini", true, None, 0);
    assert_eq!(health.get("mini").unwrap().last_poll, 200);

    assert!(health.apply("mini", Poll::Down(unreachable()), 300));
    check_state(&health, "mini", false, Some(unreachable()), 300);
    assert!(
        !health.apply("mini", Poll::Down(unreachable()), 400),
        "still down"
    );
    check_state(&health, "mini", false, Some(unreachable()), 300);

    // A new reason is worth a line, but the host has been down since 300 all along.
    assert!(health.apply("mini", Poll::Down(loading()), 500));
    check_state(&health, "mini", false, Some(loading()), 300);

    assert!(health.apply("mini", up(Some(2048), Some(2), &["q"]), 600));
    check_state(&health, "mini", true, None, 600);
    assert_eq!(health.get("mini").unwrap().last_poll, 600);
}

#[test]
fn a_forward_failure_marks_down_at_once_and_the_next_good_poll_brings_it_back() {
    let health = Health::new(&hosts(&[host("mini", None, &["q"])]));
    health.apply("mini", up(Some(2048), Some(2), &["q"]), 100);
    assert!(health.is_loaded("mini", "q"));

    assert!(health.mark_down("mini", forward_failed(), 150));
    assert!(
        !health.mark_down("mini", forward_failed(), 160),
        "not a transition"
    );
    check_state(&health, "mini", false, Some(forward_failed()), 150);
    assert!(
        !health.is_loaded("mini", "q"),
        "a down host's loaded list is stale"
    );
    assert_eq!(
        health.get("mini").unwrap().last_poll,
        100,
        "a forward is not a poll"
    );

    assert!(health.apply("mini", up(Some(2048), Some(2), &["q"]), 200));
    check_state(&health, "mini", true, None, 200);
    assert!(!health.mark_down("ghost", forward_failed(), 200));
}

#[test]
fn the_config_ctx_override_wins_over_props() {
    let health = Health::new(&hosts(&[
        host("big", Some(8192), &["q"]),
        host("small", None, &["q"]),
    ]));
    health.apply("big", up(Some(2048), Some(4), &[]), 100);
    health.apply("small", up(Some(2048), Some(4), &[]), 100);
    assert_eq!(health.per_slot_ctx("big"), Some(8192));
    assert_eq!(health.per_slot_ctx("small"), Some(2048));
    assert_eq!(health.get("small").unwrap().total_slots, Some(4));

    // An older build without the field: unknown again, unless overridden.
    health.apply("big", up(None, None, &[]), 200);
    health.apply("small", up(None, None, &[]), 200);
    assert_eq!(health.per_slot_ctx("big"), Some(8192));
    assert_eq!(health.per_slot_ctx("small"), None);
}

#[test]
fn reload_keeps_kept_hosts_adds_new_ones_and_forgets_removed_ones() {
    let health = Health::new(&hosts(&[
        host("titan", None, &["q"]),
        host("mini", None, &["q"]),
    ]));
    health.apply("titan", Poll::Down(loading()), 100);
    health.apply("mini", up(Some(2048), None, &["q"]), 100);

    // mini gains an override, titan stays down, old is gone, new arrives healthy.
    health.set_hosts(&hosts(&[
        host("titan", None, &["q"]),
        host("mini", Some(1024), &["q"]),
        host("new", None, &["q"]),
    ]));
    check_state(&health, "titan", false, Some(loading()), 100);
    check_state(&health, "new", true, None, 0);
    assert_eq!(health.per_slot_ctx("mini"), Some(1024));

    // Dropping the override falls back to what the host reported.
    health.set_hosts(&hosts(&[host("mini", None, &["q"])]));
    assert_eq!(health.per_slot_ctx("mini"), Some(2048));
    assert_eq!(health.get("titan"), None);
    assert!(
        !health.apply("titan", up(None, None, &[]), 200),
        "a removed host stays removed"
    );
    assert_eq!(health.get("titan"), None);
}

#[test]
fn loaded_means_a_matching_id_or_alias_or_the_single_configured_model() {
    let health = Health::new(&hosts(&[
        host("single", None, &["qwen-coder"]),
        host("multi", None, &["qwen-coder", "llama"]),
    ]));
    // (host, reported loaded, asked model, expected)
    let cases: &[(&str, &[&str], &str, bool)] = &[
        (
            "single",
            &["/models/qwen2.5-coder-7b-q4.gguf"],
            "qwen-coder",
            true,
        ),
        (
            "single",
            &["/models/qwen2.5-coder-7b-q4.gguf"],
            "llama",
            false,
        ),
        ("single", &["a.gguf", "b.gguf"], "qwen-coder", false),
        ("single", &[], "qwen-coder", false),
        ("single", &["x.gguf", "qwen-coder"], "qwen-coder", true),
        ("multi", &["/models/qwen.gguf"], "qwen-coder", false),
        ("multi", &["llama", "qwen-coder"], "qwen-coder", true),
        ("multi", &["llama"], "llama", true),
        ("multi", &["llama"], "qwen-coder", false),
    ];
    for (i, &(name, loaded, model, want)) in cases.iter().enumerate() {
        health.apply(name, up(None, None, loaded), i as i64);
        assert_eq!(
            health.is_loaded(name, model),
            want,
            "{name} reports {loaded:?}, asked {model}"
        );
    }
    assert!(!health.is_loaded("ghost", "qwen-coder"));
}

#[test]
fn a_router_model_going_from_loaded_to_unloaded_is_counted_as_an_unload_issue_15() {
    let mut router_host = host("box", None, &["coder", "chat"]);
    router_host.upstream = BTreeMap::from([("chat".to_string(), "chat-7b".to_string())]);
    let health = Health::new(&hosts(&[router_host]));
    let model = |id: &str, state: &str| RouterModel {
        names: vec![id.to_string()],
        state: state.to_string(),
        per_slot_ctx: Some(2048),
        slots: 2,
    };
    let poll = |coder: &str, chat: &str| Poll::Up {
        per_slot_ctx: None,
        total_slots: None,
        loaded: Vec::new(),
        router: true,
        models: vec![model("coder", coder), model("chat-7b", chat)],
        max_instances: Some(1),
        build: None,
        ctx_train: None,
    };
    health.apply("box", poll("loaded", "unloaded"), 1);
    health.apply("box", poll("loaded", "unloaded"), 2);
    assert_eq!(health.unloads("box", "coder"), 0);
    health.apply("box", poll("unloaded", "loading"), 3);
    health.apply("box", poll("unloaded", "loaded"), 4);
    assert_eq!(health.unloads("box", "coder"), 1);
    health.apply("box", poll("loaded", "unloaded"), 5);
    assert_eq!(
        (
            health.unloads("box", "coder"),
            health.unloads("box", "chat")
        ),
        (1, 1)
    );
    assert_eq!(
        health.model_state("box", "chat").as_deref(),
        Some("unloaded")
    );
    assert_eq!(health.ctx_for("box", "chat"), Some(2048));
    assert_eq!(health.unloads("ghost", "coder"), 0);
}

/// Issue 15/11 (review): "host up" logged a host's loaded list whole, whatever its length.
#[test]
fn the_host_up_line_shows_a_few_short_names_and_counts_the_rest_issue_15() {
    let names: Vec<String> = (0..1000).map(|i| format!("m{i}")).collect();
    assert_eq!(shown_loaded(&names[..2]), "m0,m1");
    assert_eq!(shown_loaded(&[]), "");
    let shown = shown_loaded(&names);
    assert!(shown.starts_with("m0,m1,m2,"), "{shown}");
    assert!(shown.ends_with(",+992 more"), "{shown}");
    let long = vec!["é".repeat(1 << 20)];
    assert!(shown_loaded(&long).len() <= 64 + 3, "a name is cut");
}

/// Issue 24: a host is judged by what it did. Polls: down after `fall` failures in a row (at once
/// for an answer that says what is wrong, or before its first good poll), up after `rise` good
/// ones. Forwards that may have reached it: down after `fall` in a row, an answer between ends the
/// streak. Flips are counted by why.
#[test]
fn health_falls_and_rises_by_streaks_and_decisive_answers_act_at_once() {
    let h = Health::new(&hosts(&[host("titan", None, &["m"])]));
    h.set_thresholds(3, 2);
    // Never seen up: the first failed poll is enough.
    h.apply("titan", Poll::Down(unreachable()), 1);
    check_state(&h, "titan", false, Some(unreachable()), 1);
    // Down: one good poll is not enough, two are.
    h.apply("titan", up(None, None, &["m"]), 2);
    assert!(!h.healthy("titan"));
    h.apply("titan", up(None, None, &["m"]), 3);
    check_state(&h, "titan", true, None, 3);
    // Up: two silent polls leave it up, the third takes it down.
    h.apply("titan", Poll::Down(unreachable()), 4);
    h.apply("titan", Poll::Down(unreachable()), 5);
    assert!(h.healthy("titan"));
    h.apply("titan", Poll::Down(unreachable()), 6);
    check_state(&h, "titan", false, Some(unreachable()), 6);
    for t in [7, 8] {
        h.apply("titan", up(None, None, &["m"]), t);
    }
    assert!(h.healthy("titan"));
    // 503 loading (or a 401) says exactly what is wrong: at once.
    h.apply("titan", Poll::Down(loading()), 9);
    check_state(&h, "titan", false, Some(loading()), 9);
    for t in [10, 11] {
        h.apply("titan", up(None, None, &["m"]), t);
    }
    // Forwards that may have reached it: an answer between ends the streak.
    assert!(!h.request_failed("titan", forward_failed(), 12));
    assert!(!h.request_failed("titan", forward_failed(), 13));
    h.request_ok("titan");
    assert!(!h.request_failed("titan", forward_failed(), 14));
    assert!(!h.request_failed("titan", forward_failed(), 15));
    assert!(h.healthy("titan"));
    assert!(h.request_failed("titan", forward_failed(), 16));
    check_state(&h, "titan", false, Some(forward_failed()), 16);
    let flips: Vec<_> = (h.transitions().into_iter())
        .map(|((_, to, why), n)| (to, why, n))
        .collect();
    assert_eq!(
        flips,
        [
            ("down", "loading", 1),
            ("down", "request failures", 1),
            ("down", "unreachable", 2),
            ("up", "polls", 3)
        ]
    );
}
