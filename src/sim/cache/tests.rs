use super::*;

/// Takes a slot and immediately frees it holding the prompt; returns (slot, cache_n).
#[track_caller]
fn turn(pool: &mut Pool, prompt: &str) -> (usize, u64) {
    let t = pool
        .try_take(prompt.as_bytes(), true, None)
        .expect("an idle slot");
    pool.put_back(t.slot, prompt.as_bytes().to_vec());
    (t.slot, t.cache_n)
}

const A: &str = "user: tell me about the history of the roman empire please\n";
const B: &str = "user: write a poem about a cat who sits on a warm mat all day\n";
const C: &str = "user: explain how a jet engine works in great technical detail\n";
/// Only the shared `user: ` is reused: the conversation itself was forgotten.
const FORGOTTEN: u64 = 1;

#[test]
fn same_prompt_twice_reuses_all_but_one_token() {
    let mut pool = Pool::new(2, 0);
    assert_eq!(turn(&mut pool, A).1, 0);
    let (_, cache_n) = turn(&mut pool, A);
    assert_eq!(cache_n, tokens(A.len()) - 1);
}

#[test]
fn a_second_conversation_takes_the_other_slot() {
    let mut pool = Pool::new(2, 0);
    let (slot_a, _) = turn(&mut pool, A);
    let (slot_b, _) = turn(&mut pool, B);
    assert_ne!(slot_a, slot_b);
    let longer = format!("{A}assistant: it fell\nuser: why?\n");
    let (slot, cache_n) = turn(&mut pool, &longer);
    assert_eq!(slot, slot_a);
    assert_eq!(cache_n, (A.len() / TOKEN_BYTES) as u64);
}

#[test]
fn without_ram_cache_a_third_conversation_forgets_the_oldest() {
    let mut pool = Pool::new(2, 0);
    turn(&mut pool, A);
    turn(&mut pool, B);
    turn(&mut pool, C);
    assert_eq!(turn(&mut pool, A).1, FORGOTTEN);
}

#[test]
fn ram_cache_restores_an_evicted_conversation() {
    let mut pool = Pool::new(2, 1000);
    turn(&mut pool, A);
    turn(&mut pool, B);
    turn(&mut pool, C);
    assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
}

#[test]
fn ram_cache_is_bounded_and_drops_the_oldest() {
    // Room for two prompts: saving C pushes out A, the first saved.
    let room = tokens(A.len()) + tokens(B.len()) + 1;
    let mut pool = Pool::new(1, room);
    turn(&mut pool, A);
    turn(&mut pool, B);
    turn(&mut pool, C);
    assert_eq!(turn(&mut pool, A).1, FORGOTTEN);
    let mut pool = Pool::new(1, room);
    turn(&mut pool, A);
    turn(&mut pool, B);
    assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
}

#[test]
fn busy_slots_are_not_taken_and_cache_prompt_false_reuses_nothing() {
    let mut pool = Pool::new(1, 0);
    turn(&mut pool, A);
    let t = pool.try_take(A.as_bytes(), false, None).expect("idle");
    assert_eq!(t.cache_n, 0);
    assert_eq!(pool.busy(), vec![true]);
    assert_eq!(pool.try_take(B.as_bytes(), true, None), None);
    pool.put_back(t.slot, Vec::new());
    assert!(pool.try_take(B.as_bytes(), true, None).is_some());
}

const SYS: &str = "system: you are a careful assistant who always answers in short sentences\n";

/// Two conversations sharing [`SYS`], two turns each: `[a1, b1, a2, b2]`.
fn siblings() -> [String; 4] {
    let a1 = format!("{SYS}user: rome?\n");
    let b1 = format!("{SYS}user: a poem\n");
    let a2 = format!("{a1}assistant: it fell\nuser: why?\n");
    let b2 = format!("{b1}assistant: roses\nuser: more\n");
    [a1, b1, a2, b2]
}

/// Measured on llama-server b11434 (4 slots): two conversations sharing a system prompt both
/// land on the first one's slot (similarity beats an empty slot), and as more than half of the
/// old state is kept nothing is saved: each turn gets back only the shared prefix.
#[test]
fn siblings_sharing_a_system_prompt_take_turns_losing_their_histories() {
    let [a1, b1, a2, b2] = siblings();
    let shared = (format!("{SYS}user: ").len() / TOKEN_BYTES) as u64;
    let mut pool = Pool::new(4, 100_000);
    let slot = turn(&mut pool, &a1).0;
    assert_eq!(turn(&mut pool, &b1), (slot, shared), "b takes a's slot");
    assert_eq!(turn(&mut pool, &a2), (slot, shared), "a's history is gone");
    assert_eq!(turn(&mut pool, &b2), (slot, shared), "and then b's");
}

/// With `--slot-prompt-similarity 0` (and the RAM cache) each turn finds its history again.
#[test]
fn without_similarity_each_turn_gets_its_history_back_from_ram() {
    let [a1, b1, a2, b2] = siblings();
    let mut pool = Pool::new(4, 100_000).with_similarity(0.0);
    turn(&mut pool, &a1);
    assert_eq!(turn(&mut pool, &b1).1, 0, "no prefix sharing across slots");
    // Whole tokens of the previous turn's text (what was generated is part of it in real use).
    assert_eq!(turn(&mut pool, &a2).1, (a1.len() / TOKEN_BYTES) as u64);
    assert_eq!(turn(&mut pool, &b2).1, (b1.len() / TOKEN_BYTES) as u64);
}

/// Takes slot `at` by `id_slot` and frees it holding the prompt; returns `cache_n`.
#[track_caller]
fn pinned_turn(pool: &mut Pool, at: usize, prompt: &str) -> u64 {
    let t = (pool.try_take(prompt.as_bytes(), true, Some(at))).expect("the slot idle");
    assert_eq!(t.slot, at % pool.slots.len());
    pool.put_back(t.slot, prompt.as_bytes().to_vec());
    t.cache_n
}

/// The case slot pinning is for: a's slot went to its sibling b while a's history was saved
/// in RAM. Left to itself a takes its sibling's slot back and gets only the shared part;
/// pinned to the other slot, which holds something unrelated, it has its history reloaded.
#[test]
fn a_conversation_pinned_away_from_its_sibling_gets_its_history_back() {
    let [a1, b1, a2, _] = siblings();
    let setup = || {
        let mut pool = Pool::new(2, 100_000);
        // Of two slots never used, llama-server takes the last.
        assert_eq!(turn(&mut pool, &a1).0, 1);
        assert_eq!(turn(&mut pool, B).0, 0, "a's slot is idle: copied to RAM");
        assert_eq!(turn(&mut pool, &b1).0, 1, "b takes its sibling's slot");
        pool
    };
    let shared = (format!("{SYS}user: ").len() / TOKEN_BYTES) as u64;
    assert_eq!(turn(&mut setup(), &a2), (1, shared));
    let whole = (a1.len() / TOKEN_BYTES) as u64;
    assert_eq!(pinned_turn(&mut setup(), 0, &a2), whole);
    assert_eq!(pinned_turn(&mut setup(), 2, &a2), whole, "ids wrap around");
}

#[test]
fn a_pinned_slot_that_is_busy_waits_and_an_empty_one_loads_nothing() {
    let mut pool = Pool::new(2, 100_000);
    let t = pool.try_take(A.as_bytes(), true, Some(0)).expect("idle");
    assert_eq!(
        pool.try_take(B.as_bytes(), true, Some(0)),
        None,
        "slot 1 is idle"
    );
    pool.put_back(t.slot, A.as_bytes().to_vec());
    turn(&mut pool, B);
    // A is in RAM (copied while idle), but an empty slot asked for by id never looks there.
    let mut empty = Pool::new(3, 100_000);
    assert_eq!(turn(&mut empty, A).0, 2);
    assert_eq!(turn(&mut empty, B).0, 1);
    assert_eq!(pinned_turn(&mut empty, 0, A), 0);
}

#[test]
fn with_similarity_off_a_pinned_slot_is_never_saved_or_reloaded() {
    let mut pool = Pool::new(2, 100_000).with_similarity(0.0);
    pinned_turn(&mut pool, 0, A);
    pinned_turn(&mut pool, 1, B);
    pinned_turn(&mut pool, 0, C);
    pinned_turn(&mut pool, 1, C);
    // A was copied to RAM while idle, and is never reloaded into a slot asked for by id.
    assert_eq!(pinned_turn(&mut pool, 0, A), FORGOTTEN);
}

#[test]
fn idle_slots_are_copied_to_ram_when_a_task_starts() {
    let mut pool = Pool::new(2, 1000);
    turn(&mut pool, A);
    turn(&mut pool, B);
    // A's slot was idle when B started: its copy is in RAM, so A survives two more prompts.
    turn(&mut pool, C);
    turn(&mut pool, &format!("{C}{C}"));
    assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
}

#[test]
fn a_state_loaded_from_ram_leaves_it() {
    let mut pool = Pool::new(1, 1000);
    turn(&mut pool, A);
    turn(&mut pool, B); // RAM: A
    turn(&mut pool, A); // A loaded back into the slot, B saved
    assert_eq!(pool.ram, vec![B.as_bytes().to_vec()]);
}

#[test]
fn a_state_saved_again_is_not_made_newer() {
    // Room for all three but one token: saving C drops the oldest, A, though A was saved again
    // after B (it was held already), where a least-recently-used cache would drop B.
    let room = tokens(A.len()) + tokens(B.len()) + tokens(C.len()) - 1;
    let mut pool = Pool::new(1, room);
    for text in [A, B, A, C] {
        pool.save(text.as_bytes().to_vec());
    }
    assert_eq!(pool.ram, vec![B.as_bytes().to_vec(), C.as_bytes().to_vec()]);
}

#[test]
fn a_saved_state_is_loaded_only_when_it_beats_the_slot_on_both_counts() {
    let mut pool = Pool::new(1, 100_000);
    let long = format!(
        "{A}{}",
        "assistant: a long answer about roads and legions\n".repeat(20)
    );
    turn(&mut pool, &long);
    // RAM: long. A prompt sharing only A with it keeps under a quarter of it: not loaded, so only
    // the slot's own `user: ` is reused.
    turn(&mut pool, B);
    let (_, cache_n) = turn(&mut pool, &format!("{A}user: and the greeks?\n"));
    assert_eq!(cache_n, FORGOTTEN);
    // The whole saved state continued is loaded.
    let (_, cache_n) = turn(&mut pool, &format!("{long}user: and then?\n"));
    assert_eq!(cache_n, (long.len() / TOKEN_BYTES) as u64);
}
