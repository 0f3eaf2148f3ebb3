//! `replies_kept`: whether a conversation's next turn finds its last reply in the slot.

use super::*;

/// Turn 1, then turn 2 (its answer sent back and a new question): the prompt tokens of turn
/// 1, and what turn 2 found cached and prefilled.
fn two_turns(replies_kept: bool) -> (u64, u64, u64) {
    let sim = Sim::start(SimConfig {
        replies_kept,
        ..SimConfig::default()
    });
    let (_, first) = json_of(post(
        &sim,
        "/v1/chat/completions",
        &json!({"messages": convo("What is a slot?"), "max_tokens": 8}),
    ));
    let mut messages = convo("What is a slot?");
    let turn2 = messages.as_array_mut().expect("array");
    turn2.push(json!({"role": "assistant", "content": first["choices"][0]["message"]["content"]}));
    turn2.push(json!({"role": "user", "content": "And a prompt cache?"}));
    let (_, second) = json_of(post(
        &sim,
        "/v1/chat/completions",
        &json!({"messages": turn2, "max_tokens": 2}),
    ));
    let n = |v: &Value, at: &str| v.pointer(at).and_then(Value::as_u64).expect(at);
    (
        n(&first, "/usage/prompt_tokens"),
        n(&second, "/timings/cache_n"),
        n(&second, "/timings/prompt_n"),
    )
}

#[test]
fn a_reply_not_kept_is_prefilled_again_on_the_next_turn() {
    let (prompt, cached, prefilled) = two_turns(true);
    assert!(
        cached > prompt,
        "the reply found in the slot: {cached} of {prompt}"
    );
    let (prompt_off, cached_off, prefilled_off) = two_turns(false);
    assert_eq!(prompt_off, prompt);
    assert!(
        cached_off <= prompt,
        "only turn 1's prompt found: {cached_off}"
    );
    // The eight tokens of the reply, prefilled again.
    assert_eq!(prefilled_off, prefilled + (cached - cached_off));
    assert!(cached - cached_off >= 8, "{cached} against {cached_off}");
}
