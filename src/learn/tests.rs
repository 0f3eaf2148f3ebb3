//! The probe and the passive checks as stories: what was sent, what came back, what crossbar
//! concludes. The two-slot figures are what four real llama-server b11434 (`-np 2`, the tiny
//! model) answered to the probe's steps: defaults, `-sps 0`, `--cache-ram 0`, and both.

use super::*;

fn step(slot: u64, cached: u64) -> Step {
    Step {
        slot: Some(slot),
        cached,
    }
}

/// Two slots: (the choice step, the RAM step, the prompts' tokens) → (similarity, RAM).
#[track_caller]
fn two_slots(choice: Step, ram: Step, want: (Option<bool>, Option<bool>)) {
    let answers = ProbeAnswers::Slots {
        choice,
        ram,
        tokens: 101,
    };
    assert_eq!(read_probe(&answers), want, "{answers:?}");
}

#[test]
fn the_probe_tells_the_four_ways_a_host_can_run_apart() {
    // Defaults: P plus a few words went to slot 1, which held P (similarity); after an unrelated
    // prompt took slot 0, Q plus a few words pinned there found Q in RAM.
    two_slots(step(1, 105), step(0, 97), (Some(true), Some(true)));
    // --cache-ram 0: the same choice, and Q was gone.
    two_slots(step(1, 105), step(0, 1), (Some(true), Some(false)));
    // -sps 0: the least recently used slot (0, holding Q) took P plus a few words, finding 4
    // tokens; then Q plus a few words, left to the host, came back from RAM.
    two_slots(step(0, 4), step(1, 101), (Some(false), Some(true)));
    // -sps 0 --cache-ram 0: the same choice, and nothing came back.
    two_slots(step(0, 4), step(1, 4), (Some(false), Some(false)));
}

#[test]
fn a_probe_disturbed_by_another_client_concludes_nothing() {
    // Slot 1 but cold: another client's task took the slot between the steps.
    two_slots(step(1, 3), step(0, 97), (None, None));
    // A slot the probe never used: someone else holds the others.
    two_slots(step(3, 0), step(0, 97), (None, None));
    two_slots(Step::default(), step(0, 97), (None, None));
}

#[test]
fn one_slot_tells_the_ram_cache_and_the_similarity_only_where_it_matters() {
    let one = |ram: u64, sibling: u64| {
        read_probe(&ProbeAnswers::OneSlot {
            ram: step(0, ram),
            sibling: step(0, sibling),
            tokens: 120,
            family: 100,
        })
    };
    // RAM cache, similarity off: the sibling's predecessor was saved before it took the slot,
    // and came back whole.
    assert_eq!(one(118, 119), (Some(false), Some(true)));
    // RAM cache, similarity on: only the shared family was left in the slot.
    assert_eq!(one(118, 100), (Some(true), Some(true)));
    // No RAM cache: the two behave alike; the similarity changes nothing on one slot.
    assert_eq!(one(1, 100), (None, Some(false)));
}

fn learned(configured: Option<bool>) -> Learned {
    let learned = Learned::default();
    learned.set_hosts([("h", (configured, None))].into_iter(), 1);
    learned
}

#[test]
fn a_probe_is_due_at_first_contact_and_again_for_a_new_build_or_a_restart() {
    let l = learned(None);
    assert!(l.polled("h", Some("b1-aaa")), "first contact");
    l.probed("h", Some((Some(false), Some(true))), 10);
    assert!(
        !l.polled("h", Some("b1-aaa")),
        "the same build: nothing to ask"
    );
    assert_eq!((l.similarity("h"), l.ram("h")), (Some(false), Some(true)));
    assert!(
        l.polled("h", Some("b2-bbb")),
        "an upgrade may change either"
    );
    l.probed("h", Some((Some(false), Some(true))), 20);
    l.restarted("h");
    assert!(l.polled("h", Some("b2-bbb")), "a restart is asked again");
    // A probe that could not finish leaves it due and the beliefs as they were.
    l.probed("h", None, 30);
    assert!(l.polled("h", Some("b2-bbb")));
    assert_eq!(l.ram("h"), Some(true));
}

#[test]
fn a_configured_similarity_wins_and_the_probe_against_it_is_a_warning() {
    let l = learned(Some(false));
    assert_eq!(
        l.similarity("h"),
        Some(false),
        "the config, before any probe"
    );
    l.probed("h", Some((Some(true), Some(true))), 10);
    assert_eq!(l.similarity("h"), Some(false), "the config still wins");
    assert_eq!(l.get("h").unwrap().similarity.source, Source::Config);
    let notes = l.notes("h");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("hosts.h.slot_prompt_similarity"),
        "{notes:?}"
    );
    // Agreeing evidence says nothing.
    let agreed = learned(Some(true));
    agreed.probed("h", Some((Some(true), Some(false))), 10);
    assert!(agreed.notes("h").is_empty());
}

#[test]
fn conversations_restored_after_losing_their_slot_revise_a_probe_that_found_no_ram_cache() {
    let l = learned(None);
    l.probed("h", Some((Some(false), Some(false))), 10);
    let restored = Answered {
        displaced: true,
        warm: true,
        conversation: 1,
    };
    for at in 0..REVISE_AFTER as i64 - 1 {
        l.answered("h", restored, 20 + at);
        assert_eq!(l.ram("h"), Some(false), "not yet");
    }
    l.answered("h", restored, 30);
    let host = l.get("h").unwrap();
    assert_eq!(
        (host.ram.value, host.ram.source),
        (Some(true), Source::Seen)
    );
    // A warm turn that never lost its slot says nothing of RAM.
    let l = learned(None);
    l.probed("h", Some((Some(false), Some(false))), 10);
    for at in 0..10 {
        let kept = Answered {
            displaced: false,
            warm: true,
            conversation: 1,
        };
        l.answered("h", kept, 20 + at);
    }
    assert_eq!(l.ram("h"), Some(false));
}

#[test]
fn cold_answers_count_for_a_while_and_a_restart_forgets_them() {
    let l = learned(None);
    let cold = Answered {
        displaced: false,
        warm: false,
        conversation: 1,
    };
    l.answered("h", cold, 1_000);
    l.answered("h", cold, 2_000);
    assert_eq!(l.get("h").unwrap().recent_colds(2_000), 2);
    assert_eq!(
        l.get("h").unwrap().recent_colds(2_000 + COLD_WINDOW_MS),
        1,
        "the first one is old by then"
    );
    for at in 0..100 {
        l.answered("h", cold, 3_000 + at);
    }
    assert_eq!(l.get("h").unwrap().colds.len(), COLDS_KEPT, "bounded");
    l.restarted("h");
    assert_eq!(l.get("h").unwrap().recent_colds(4_000), 0);
}

/// A host restarted between two polls is seen by what comes back: conversations whose slots
/// nothing took, each cold, none warm between. Displaced ones are explained (oversubscribed
/// slots, a small RAM cache), and one conversation cold again and again is one.
#[test]
fn conversations_cold_with_their_slots_untouched_say_the_host_restarted() {
    let l = learned(None);
    let turn = |conversation, displaced, warm| Answered {
        displaced,
        warm,
        conversation,
    };
    assert!(!l.answered("h", turn(1, false, false), 1));
    assert!(!l.answered("h", turn(1, false, false), 2), "the same one");
    assert!(!l.answered("h", turn(2, true, false), 3), "explained");
    assert!(!l.answered("h", turn(3, false, false), 4));
    assert!(
        !l.answered("h", turn(4, false, true), 5),
        "a warm one: nothing lost"
    );
    for (conversation, at) in [(5, 6), (6, 7)] {
        assert!(!l.answered("h", turn(conversation, false, false), at));
    }
    assert!(l.answered("h", turn(7, false, false), 8), "three in a row");
    l.restarted("h");
    assert!(
        !l.answered("h", turn(8, false, false), 9),
        "counted from the restart"
    );
}

#[test]
fn an_exclusive_host_is_pinned_again_only_after_a_quiet_while() {
    let l = learned(None);
    assert!(l.get("h").unwrap().quiet(0));
    l.foreign("h", 1_000);
    assert!(!l.get("h").unwrap().quiet(1_000 + QUIET_MS));
    assert!(l.get("h").unwrap().quiet(1_001 + QUIET_MS));
}

#[test]
fn a_reload_keeps_what_was_learned_of_kept_hosts_and_forgets_removed_ones() {
    let l = learned(None);
    l.probed("h", Some((Some(true), Some(true))), 10);
    l.set_hosts(
        [("h", (None, None)), ("new", (Some(false), None))].into_iter(),
        20,
    );
    assert_eq!(l.similarity("h"), Some(true));
    assert_eq!(l.similarity("new"), Some(false));
    l.set_hosts([("new", (None, None))].into_iter(), 30);
    assert!(l.get("h").is_none());
    assert_eq!(
        l.similarity("new"),
        None,
        "the config no longer says: asked again"
    );
    assert!(l.polled("new", None));
}
