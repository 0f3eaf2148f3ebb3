//! A returning conversation sent to a sibling's slot it would keep whole: the slot is saved to
//! RAM first when the conversation's own state is there (`Claim::saves_first`).

use super::super::*;
use super::{polled, want, HOST, P};

/// What the host counted for an answer: the family prefix and a short history, so that a sibling
/// pinned to the slot keeps more than half of it.
const SHORT: Tokens = Tokens {
    prompt: P + 700,
    completion: 100,
};

/// Conversations 1, 2 and 3 of one family start one after another on a host of two slots: 1 in
/// one slot, 2 in the other (1's, kept whole, is not in RAM yet), 3 in 1's (copied to RAM while
/// idle, as 2 started). Each answered whole.
fn three_siblings() -> Slots {
    let slots = polled(2);
    for (conversation, at) in [(1, 0), (2, 1), (3, 0)] {
        let taken = slots.take(HOST, 2, Some(&want(conversation, true)), 20);
        assert_eq!(taken.index(), Some(at), "conversation {conversation}");
        assert!(!taken.saves_first(), "a first turn has no state of its own");
        taken.finish(Some(SHORT));
    }
    slots
}

#[test]
fn a_returning_conversation_whose_state_is_in_ram_has_a_siblings_slot_saved_first() {
    let slots = three_siblings();
    // 1 comes back: both slots are its siblings', each kept whole; 2's was copied to RAM as 3
    // started, so it goes first. Left alone, llama-server would keep 2's state in place and 1
    // would prefill its history again: the slot is saved first, and 1 reloads its own.
    let back = slots.take(HOST, 2, Some(&want(1, false)), 30);
    assert_eq!(back.index(), Some(1));
    assert!(back.saves_first());
    back.finish(Some(SHORT));
    // 2, whose slot that was, is in RAM now: back, it has 3's slot saved in its turn.
    let two = slots.take(HOST, 2, Some(&want(2, false)), 40);
    assert_eq!(two.index(), Some(0));
    assert!(two.saves_first());
}

#[test]
fn nothing_is_saved_first_for_its_own_slot_a_first_turn_or_a_state_not_in_ram() {
    let slots = three_siblings();
    // 3 back in its own slot: its state is there.
    let own = slots.take(HOST, 2, Some(&want(3, false)), 30);
    assert_eq!(own.index(), Some(0));
    assert!(!own.saves_first());
    own.finish(Some(SHORT));
    // A conversation crossbar never saw in RAM here (it moved from another host): saving the
    // slot would only move a sibling's state out of RAM and into this slot.
    let stranger = slots.take(HOST, 2, Some(&want(8, false)), 40);
    assert!(stranger.index().is_some());
    assert!(!stranger.saves_first());
}

#[test]
fn a_slot_not_kept_whole_is_not_saved_first() {
    // A sibling's slot holding more than twice the prefix: llama-server saves it itself. (One
    // slot, so that the sibling's is the only one free.)
    let slots = polled(1);
    let long = Tokens {
        prompt: P + 500,
        completion: 2 * P,
    };
    for conversation in [1, 2] {
        let taken = slots.take(HOST, 1, Some(&want(conversation, true)), 20);
        assert_eq!(taken.index(), Some(0), "conversation {conversation}");
        taken.finish(Some(long));
    }
    let back = slots.take(HOST, 1, Some(&want(1, false)), 30);
    assert_eq!(back.index(), Some(0));
    assert!(!back.saves_first());
    back.finish(Some(SHORT));
    // The same slot holding little past the prefix: now it is saved first.
    let two = slots.take(HOST, 1, Some(&want(2, false)), 40);
    assert_eq!(two.index(), Some(0));
    assert!(two.saves_first());
}

#[test]
fn the_conversations_believed_in_ram_are_bounded_and_a_saved_one_is_the_newest() {
    let mut pair = Pair::default();
    for conversation in 0..(MAX_IN_RAM as u64 + 10) {
        pair.saved(conversation);
    }
    assert_eq!(pair.in_ram.len(), MAX_IN_RAM);
    assert_eq!(pair.in_ram.front(), Some(&10), "the oldest went first");
    pair.saved(20);
    assert_eq!(pair.in_ram.len(), MAX_IN_RAM);
    assert_eq!(
        pair.in_ram.back(),
        Some(&20),
        "saved again, it is the newest"
    );
}
