//! Issue 47: a host that picks slots by age (`-sps 0`) and has a RAM cache gives a returning
//! conversation its least recently used idle slot, which is not its own when nothing started
//! there since its answer, and reloads only what RAM holds. crossbar has such a host copy its
//! idle slots to RAM first (a stash, `proxy/stash.rs`) exactly then, so every turn finds its
//! history; never where the host picks slots by prompt or crossbar picks them.

use crossbar::sim::SimConfig;

use crate::support::{chat, host, request, wait_until, Harness, HostSpec, LEARNED};

const CHAT: &str = "/projA/v1/chat/completions";

/// Host `name`: two slots picked by age, a RAM cache; `config` as given (`LEARNED`: only its url).
fn by_age(name: &'static str, config: &'static str) -> HostSpec {
    HostSpec {
        sim: SimConfig {
            slots: 2,
            slot_prompt_similarity: 0.0,
            ram_cache_tokens: 100_000,
            ..SimConfig::default()
        },
        config,
        ..host(name, 2)
    }
}

/// Stashes the sim was sent: crossbar's only `/completion` besides the probe's.
fn completions(h: &Harness, name: &str) -> usize {
    (h.sim(name).requests().iter())
        .filter(|r| r.path == "/completion")
        .count()
}

/// Each answered row's prompt and cached tokens, in the order the turns were sent.
fn prompts(h: &Harness) -> Vec<(i64, i64)> {
    let mut rows = h.rows();
    rows.sort_by_key(|r| r.id);
    (rows.iter())
        .map(|r| (r.prompt_tokens.unwrap_or(0), r.cached_tokens.unwrap_or(0)))
        .collect()
}

#[test]
fn a_lone_conversation_on_a_host_that_picks_slots_by_age_gets_its_last_turn_back_issue_47() {
    let h = Harness::start(vec![by_age("a", LEARNED)], "");
    let gw = h.server().gateway().clone();
    wait_until("probed: similarity off, RAM on", || {
        gw.learned.similarity("a") == Some(false) && gw.learned.ram("a") == Some(true)
    });
    let probes = completions(&h, "a");
    let task = "my long task, with plenty to read. ".repeat(20);
    for turns in 0..4 {
        let answer = h.post(CHAT, &chat(&task, turns, false));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let turns = prompts(&h);
    assert_eq!(turns.len(), 4);
    // Each turn after the first finds all of the one before (one token is always evaluated).
    for pair in turns.windows(2) {
        let ((before, _), (_, cached)) = (pair[0], pair[1]);
        assert!(cached >= before - 1, "{turns:?}");
    }
    assert_eq!(
        completions(&h, "a") - probes,
        3,
        "one stash before each returning turn"
    );
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    let sent = r#"crossbar_slot_stashes_total{host="a",stashed="yes"} 3"#;
    assert!(metrics.text().contains(sent), "{}", metrics.text());
}

/// A turn sent after another conversation's request needs none: that request's start copied the
/// idle slot holding it.
#[test]
fn a_turn_after_another_conversations_start_needs_no_stash_issue_47() {
    let h = Harness::start(vec![by_age("a", "slot_prompt_similarity = 0")], "");
    let (mine, theirs) = (
        "my long task, with plenty to read. ".repeat(20),
        "their other task, nothing like mine at all. ".repeat(20),
    );
    for turns in 0..3 {
        for task in [&mine, &theirs] {
            let answer = h.post(CHAT, &chat(task, turns, false));
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
    }
    assert_eq!(completions(&h, "a"), 0);
    let turns = prompts(&h);
    // Mine and theirs take turns: each finds its own previous turn, two rows back.
    for (i, (_, cached)) in turns.iter().enumerate().skip(2) {
        assert!(*cached >= turns[i - 2].0 - 1, "{turns:?}");
    }
}

/// Where the host picks a slot by prompt, a returning conversation gets its own slot back and
/// a slot chosen so is not reloaded from RAM: a stash would only push it out. None is sent.
#[test]
fn no_stash_where_the_host_picks_slots_by_prompt_issue_47() {
    // Two slots, llama-server's default similarity, a RAM cache.
    let h = Harness::start(vec![crate::pinning::ram_host("a", false)], "");
    let task = "my long task, with plenty to read. ".repeat(20);
    for turns in 0..4 {
        let answer = h.post(CHAT, &chat(&task, turns, false));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(completions(&h, "a"), 0);
    let turns = prompts(&h);
    for pair in turns.windows(2) {
        assert!(pair[1].1 >= pair[0].0 - 1, "its own slot: {turns:?}");
    }
}
