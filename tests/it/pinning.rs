//! An `exclusive` host: crossbar names the slot of each request (`id_slot`), so that a
//! conversation whose slot went to a sibling gets its history back from the host's RAM cache
//! instead of taking its sibling's slot and prefilling it again. `settle.rs`: requests crossbar
//! cannot pin wait for the pins before them to start; `load.rs`: clients leaving under load.

use serde_json::{json, Value};

use crossbar::sim::SimConfig;

use crate::support::{host, wait_until, Harness, HostSpec};

pub(crate) const CHAT: &str = "/projA/v1/chat/completions";

/// A turn of a conversation on `system`: its task, then `turns` earlier exchanges.
pub(crate) fn turn(system: &str, task: &str, turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": task}),
    ];
    for i in 0..turns {
        messages.push(json!({"role": "assistant", "content": format!("step {i} of {task} done")}));
        messages.push(json!({"role": "user", "content": format!("output {i} of {task}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 4})
}

/// Host `name`: two slots, llama-server's default similarity, a RAM cache; `exclusive` or not.
pub(crate) fn ram_host(name: &'static str, pin: bool) -> HostSpec {
    HostSpec {
        sim: SimConfig {
            slots: 2,
            ram_cache_tokens: 100_000,
            ..SimConfig::default()
        },
        config: if pin { "exclusive = true" } else { "" },
        ..host(name, 2)
    }
}

/// crossbar in front of [`ram_host`] `a`, once its first `/slots` poll has cleared the doubt every
/// slot starts in (a crossbar before it may have left a generation running).
pub(crate) fn started(pin: bool) -> Harness {
    started_with(pin, "")
}

/// [`started`] with `extra` lines for the global config.
fn started_with(pin: bool, extra: &str) -> Harness {
    let h = Harness::start(vec![ram_host("a", pin)], extra);
    let gw = h.server().gateway().clone();
    wait_until("the first /slots poll", || !gw.slots.doubtful("a"));
    h
}

/// The host's `cache_n` for an answer: prompt tokens it did not prefill.
pub(crate) fn cached(answer: &crate::support::Answer) -> u64 {
    answer.json()["timings"]["cache_n"]
        .as_u64()
        .expect("timings")
}

/// `a` starts, an unrelated conversation takes the other slot, `a`'s sibling `b` starts (and
/// takes `a`'s slot, its prefix being there), then `a` comes back: the `cache_n` of that turn.
fn returning_turn(pin: bool) -> (u64, Vec<Option<i64>>) {
    let h = started(pin);
    let coder = "You are the coder. Use read_file and run_tests with care. ".repeat(40);
    // A's task is its own history beyond the shared prompt: about 100 tokens.
    let task = "Fix the parser: it fails on nested quotes in the config. ".repeat(7);
    for body in [
        turn(&coder, &task, 0),
        turn("You are a poet.", "a poem about rain", 0),
        turn(&coder, "write the docs", 0),
    ] {
        let answer = h.post(CHAT, &body);
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let back = h.post(CHAT, &turn(&coder, &task, 1));
    assert_eq!(back.status, 200, "{}", back.text());
    let slots = (h.sim("a").requests().iter())
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| serde_json::from_slice::<Value>(&r.body).expect("json")["id_slot"].as_i64())
        .collect();
    let metrics = crate::support::request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    let pins = r#"crossbar_slot_pins_total{host="a",pinned="yes"} 4"#;
    assert_eq!(metrics.text().contains(pins), pin, "{}", metrics.text());
    check_shown(&h, pin);
    (cached(&back), slots)
}

/// The status, `crossbar status` and the page show what crossbar believes the slots hold: both
/// free, each holding a family it last served — for a pinning host only.
fn check_shown(h: &Harness, pin: bool) {
    let admin = h.server().admin_addr();
    let status = crate::support::request(admin, "GET", "/admin/status", &[], b"").json();
    let shown = &status["hosts"][0]["models"][0]["pinned_slots"];
    if !pin {
        assert!(shown.is_null(), "{status:#}");
        return;
    }
    let slots = shown["slots"].as_array().expect("pinned_slots");
    assert_eq!(slots.len(), 2, "{status:#}");
    for (id, slot) in slots.iter().enumerate() {
        assert_eq!(slot["id"], id);
        assert_eq!(slot["state"], "free", "{status:#}");
        assert!(slot["tokens"].as_u64().unwrap() > 0, "{status:#}");
        assert!(
            slot["family"].as_str().is_some_and(|f| f.len() == 8),
            "{status:#}"
        );
    }
    assert_eq!(shown["unpinned"], 0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .current_dir(&h.dir)
        .args(["--admin", &format!("http://{admin}"), "status"])
        .output()
        .expect("the crossbar binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {out:?}");
    let family = slots[1]["family"].as_str().unwrap();
    assert!(
        (stdout.lines()).any(|l| l.starts_with("a ") && l.contains(" free ") && l.contains(family)),
        "{stdout}"
    );
    let page = crate::support::request(admin, "GET", "/", &[], b"").text();
    assert!(
        page.contains("pinned: 0 busy, 2 free, 0 in doubt"),
        "{page}"
    );
}

#[test]
fn a_conversation_whose_slot_went_to_a_sibling_gets_its_history_back_from_ram() {
    let (unpinned, sent) = returning_turn(false);
    assert_eq!(
        sent,
        [None, None, None, None],
        "nothing named without pin_slots"
    );
    let (pinned, sent) = returning_turn(true);
    // a on 0, the poem on 1, b on a's slot (its prefix is there, and a's copy is in RAM), a
    // back on the poem's slot: the poem is saved and a's history reloaded.
    assert_eq!(sent, [Some(0), Some(1), Some(0), Some(1)]);
    assert!(
        pinned > unpinned + 90,
        "pinned: {pinned} tokens cached, left to the host: {unpinned} (the shared prefix only)"
    );
}

/// With similarity off llama-server gives a returning conversation its least recently used
/// idle slot, not its own, and reloads only what its RAM cache holds; a slot asked for by id is
/// neither saved nor reloaded there. crossbar does not pin such a host, `exclusive` or not: it has
/// the host copy its idle slots to RAM before the turn that needs it (`stash.rs`), and the second
/// turn finds all of the first either way. Measured on real servers, pinning there lost to it
/// (docs/BENCHMARKS.md). The status says why it does not pin.
#[test]
fn with_similarity_off_an_exclusive_host_is_stashed_not_pinned_issue_47() {
    let second_turn = |exclusive: bool| {
        let h = Harness::start(
            vec![HostSpec {
                sim: SimConfig {
                    slots: 2,
                    ram_cache_tokens: 100_000,
                    slot_prompt_similarity: 0.0,
                    ..SimConfig::default()
                },
                config: if exclusive {
                    "exclusive = true\nslot_prompt_similarity = 0"
                } else {
                    "slot_prompt_similarity = 0"
                },
                ..host("a", 2)
            }],
            "",
        );
        let task = "Fix the parser: it fails on nested quotes in the config. ".repeat(7);
        let first = h.post(CHAT, &turn("You are the coder.", &task, 0));
        assert_eq!(first.status, 200, "{}", first.text());
        let back = h.post(CHAT, &turn("You are the coder.", &task, 1));
        assert_eq!(back.status, 200, "{}", back.text());
        let requests = h.sim("a").requests();
        let pinned = (requests.iter())
            .filter(|r| r.path.ends_with("/chat/completions"))
            .filter(|r| serde_json::from_slice::<Value>(&r.body).expect("json")["id_slot"].is_u64())
            .count();
        let stashes = (requests.iter())
            .filter(|r| r.path == "/completion")
            .count();
        let prompt = first.json()["usage"]["prompt_tokens"]
            .as_u64()
            .expect("usage");
        let status =
            crate::support::request(h.server().admin_addr(), "GET", "/admin/status", &[], b"")
                .json();
        let shown = status["hosts"][0]["learned"]["pinning"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (prompt, cached(&back), pinned, stashes, shown)
    };
    for exclusive in [false, true] {
        let (prompt, cached, pinned, stashes, shown) = second_turn(exclusive);
        assert_eq!(pinned, 0, "exclusive: {exclusive}");
        assert_eq!(
            stashes, 1,
            "the host copied its idle slots before the second turn"
        );
        assert!(
            cached >= prompt - 1,
            "{cached} of the first turn's {prompt}"
        );
        if exclusive {
            assert!(shown.contains("picks slots by age"), "{shown}");
        }
    }
}

/// The attack on pinning: a client leaves mid-answer. llama-server may still be generating in
/// its slot, and a request pinned there would have a state reloaded under that generation
/// (b11434). The slot is in doubt: the next request goes to the other slot, and only a
/// `/slots` poll that sees it idle frees it again.
#[test]
fn a_slot_left_mid_answer_is_not_pinned_again_until_the_host_shows_it_idle() {
    // No poll but the first and the one asked for at the end: a regular one between the early
    // end and the next turn (every second by default) would rightly free the slot, and on a
    // busy machine it sometimes came.
    let h = started_with(true, "health_interval = \"1h\"\n");
    let sim = h.sim("a");
    let gw = h.server().gateway().clone();
    sim.set_lockstep(true);
    let mut conn = crate::support::Conn::open(h.addr());
    let mut body = turn("You are the coder.", "going away", 0);
    (body["stream"], body["max_tokens"]) = (true.into(), 10_000.into());
    conn.send("POST", CHAT, &[], body.to_string().as_bytes());
    sim.release(1);
    conn.read_head();
    conn.read_chunk().expect("a first event");
    drop(conn);
    wait_until("crossbar records the client gone", || {
        h.rows().iter().any(|r| r.status == 499)
    });
    assert!(gw.slots.doubtful("a"));
    sim.set_lockstep(false);
    // Its own slot, were it free, is where its next turn would go.
    let next = h.post(CHAT, &turn("You are the coder.", "going away", 1));
    assert_eq!(next.status, 200, "{}", next.text());
    let pinned: Vec<Option<i64>> = (sim.requests().iter())
        .filter(|r| r.method == "POST")
        .map(|r| serde_json::from_slice::<Value>(&r.body).expect("json")["id_slot"].as_i64())
        .collect();
    assert_eq!(pinned.len(), 2);
    assert_eq!(next.header("X-Crossbar-Lease"), Some("reused"));
    assert_ne!(pinned[1], pinned[0], "not the slot left mid-answer");
    assert!(pinned[1].is_some());
    gw.health.poke("a");
    wait_until("a /slots poll sees the slot idle", || {
        !gw.slots.doubtful("a")
    });
}

/// Issue 47: pinning is a statement of fact about the host — `exclusive = true`, nothing but
/// crossbar talks to it —, off by default; the retired `pin_slots` still reads as it, with a
/// warning that names the new key.
#[test]
fn exclusive_is_off_by_default_and_pin_slots_reads_as_it_with_a_warning_issue_47() {
    let base = "listen = \"127.0.0.1:8080\"\n[hosts.a]\nurl = \"http://127.0.0.1:9\"\n\
                PIN[hosts.a.models.m]\nparallel = 2\n[routes.r]\nhosts = [\"a\"]\nmodel = \"m\"\n";
    let config = |pin: &str| crossbar::config::Config::from_toml(&base.replace("PIN", pin));
    let plain = config("").expect("valid");
    assert!(!plain.hosts["a"].exclusive && plain.warnings.is_empty());
    let on = config("exclusive = true\n").expect("valid");
    assert!(on.hosts["a"].exclusive && on.warnings.is_empty());
    let old = config("pin_slots = true\n").expect("valid");
    assert!(old.hosts["a"].exclusive, "read as exclusive");
    assert!(
        old.warnings.iter().any(|w| w.contains("exclusive = true")),
        "{:?}",
        old.warnings
    );
    let err = config("exclusive = \"yes\"\n").expect_err("not a bool");
    let text = format!("{err}");
    assert!(text.contains("hosts.a.exclusive"), "{text}");
}

mod load;
mod settle;
