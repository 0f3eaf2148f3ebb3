//! A returning conversation that finds only its siblings' slots free on a pinning host: crossbar
//! has the host save one of them to its RAM cache first (a three-token request pinned there), so
//! that the conversation reloads its own state instead of prefilling its history again.

use serde_json::Value;

use crate::pinning::{cached, started, turn, CHAT};
use crate::support::{Answer, Harness};

/// Three conversations of one family on the two slots: `a` starts, then `b` (the other slot),
/// then `c` (in `a`'s slot, the family's prefix there, `a`'s state copied to RAM while idle),
/// then `a` comes back and finds only `b`'s and `c`'s slots free. `a`'s first answer and its
/// return.
fn three_siblings(h: &Harness) -> (Answer, Answer) {
    let coder = "You are the coder. Use read_file and run_tests with care. ".repeat(40);
    let task = |what: &str| format!("Fix the {what}: it fails on nested quotes. ").repeat(7);
    let post = |body: &Value| {
        let answer = h.post(CHAT, body);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer
    };
    let first = post(&turn(&coder, &task("parser"), 0));
    post(&turn(&coder, &task("lexer"), 0));
    post(&turn(&coder, &task("printer"), 0));
    let back = post(&turn(&coder, &task("parser"), 1));
    (first, back)
}

/// The `id_slot` of every request the host got, by path (the slot saves are `/completion`).
fn slots_asked(h: &Harness) -> Vec<(String, Option<i64>)> {
    (h.sim("a").requests().iter())
        .filter(|r| r.method == "POST")
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).expect("json");
            (r.path.clone(), body["id_slot"].as_i64())
        })
        .collect()
}

#[test]
fn a_returning_conversation_finding_only_siblings_slots_free_gets_its_own_state_back() {
    let h = started(true);
    let (first, back) = three_siblings(&h);
    let asked = slots_asked(&h);
    // a, b, c on slots 0, 1, 0; then the save of b's slot and a's return there.
    let want = [
        (CHAT, Some(0)),
        (CHAT, Some(1)),
        (CHAT, Some(0)),
        ("/completion", Some(1)),
        (CHAT, Some(1)),
    ];
    let want: Vec<(String, Option<i64>)> = want
        .iter()
        .map(|(p, s)| (p.replace("/projA", ""), *s))
        .collect();
    assert_eq!(asked, want);
    // Its whole first prompt came back from RAM (one token is always evaluated again).
    let prompt = |a: &Answer| a.json()["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(
        cached(&back) >= prompt(&first) - 1,
        "{} {}",
        back.text(),
        first.text()
    );
    let metrics = crate::support::request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    let saves = r#"crossbar_slot_saves_total{host="a",saved="yes"} 1"#;
    assert!(metrics.text().contains(saves), "{}", metrics.text());
}

/// A host that breaks off the save: the slot may still be at work there, so the conversation goes
/// unpinned (the host places it) rather than pinned to a slot in doubt, and its answer is whole.
#[test]
fn a_save_the_host_breaks_off_sends_the_conversation_unpinned() {
    let h = started(true);
    let coder = "You are the coder. Use read_file and run_tests with care. ".repeat(40);
    let task = |what: &str| format!("Fix the {what}: it fails on nested quotes. ").repeat(7);
    for what in ["parser", "lexer", "printer"] {
        let answer = h.post(CHAT, &turn(&coder, &task(what), 0));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // Whole answers are cut after their head; streams are not.
    h.sim("a")
        .set_fault(crossbar::sim::Fault::CutBody { after_bytes: 3 });
    let mut back = turn(&coder, &task("parser"), 1);
    back["stream"] = true.into();
    let answer = h.post(CHAT, &back);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("[DONE]"), "{}", answer.text());
    let asked = slots_asked(&h);
    assert_eq!(asked[3], ("/completion".to_string(), Some(1)), "{asked:?}");
    assert_eq!(
        asked[4],
        ("/v1/chat/completions".to_string(), None),
        "{asked:?}"
    );
    let metrics = crate::support::request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    let text = metrics.text();
    for line in [
        r#"crossbar_slot_saves_total{host="a",saved="no"} 1"#,
        r#"crossbar_slot_pins_total{host="a",pinned="no"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}
