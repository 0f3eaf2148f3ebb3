//! Requests crossbar could not pin, found in their slots by `/slots` polls (`polled.rs`).

use super::*;

/// A reading of the clock the mirror dates unpinned requests' ends by, after every earlier one.
fn later() -> i64 {
    let before = now_us();
    loop {
        let now = now_us();
        if now > before {
            return now;
        }
        std::hint::spin_loop();
    }
}

/// A `/slots` answer showing the slots `working` at work and the rest of `count` idle.
fn at_work(count: usize, working: &[usize]) -> Seen {
    Seen {
        idle: (0..count).filter(|id| !working.contains(id)).collect(),
        processing: working.to_vec(),
    }
}

/// A mirror with similarity off, polled, where conversations 1 and 2 have each had a first
/// turn: their slots, in that order.
fn two_conversations() -> (Slots, usize, usize) {
    let slots = Slots::default();
    slots.prepare_pair(HOST, 2, true, 10);
    slots.saw("h", 11, &idle(&[0, 1]));
    let mut own = [0; 2];
    for (i, conversation) in [1, 2].into_iter().enumerate() {
        let taken = slots.take(HOST, 2, Some(&want(conversation, true)), 20);
        own[i] = taken.index().expect("a first turn pinned");
        taken.finish(None);
    }
    assert_ne!(own[0], own[1]);
    (slots, own[0], own[1])
}

/// The gap a Messages request used to leave on a host with similarity off: every free slot
/// suspected of holding it, every returning conversation left to the host. Found at work in
/// one slot, it leaves the other to its conversation, even while it runs.
#[test]
fn with_similarity_off_an_unpinned_request_found_in_its_slot_leaves_the_others_pinned() {
    let (slots, a, b) = two_conversations();
    let messages = slots.take(HOST, 2, None, later());
    assert!(slots.of("h", "m").iter().all(|s| s.foreign && s.suspected));
    assert!(slots.to_poll("h"), "a poll is wanted to find it");
    slots.saw("h", later(), &at_work(2, &[b]));
    assert!(!slots.to_poll("h"));
    let mirror = slots.of("h", "m");
    assert!(!mirror[a].foreign && mirror[b].foreign && mirror[b].theirs);
    assert_eq!(slots.mirror("h", "m").unwrap().slots[b].state, "unpinned");
    let back = slots.take(HOST, 2, Some(&want(1, false)), 33);
    assert_eq!(
        back.index(),
        Some(a),
        "its own slot, while the other request runs"
    );
    back.finish(None);
    messages.finish(None);
    let mirror = slots.of("h", "m");
    assert!(
        !mirror[b].theirs && mirror[b].foreign,
        "taken, no longer running"
    );
    assert!(!mirror[a].foreign);
    assert_eq!(
        slots.take(HOST, 2, Some(&want(1, false)), 35).index(),
        Some(a)
    );
    // 2's slot holds the other request's state now: 2 is left to the host (and goes
    // unpinned, as a request of its own).
    assert_eq!(slots.take(HOST, 2, Some(&want(2, false)), 36).index(), None);
}

/// A poll that started before the request did saw another set of requests in flight.
#[test]
fn a_poll_that_started_before_the_request_finds_nothing() {
    let (slots, a, b) = two_conversations();
    let before = later();
    let messages = slots.take(HOST, 2, None, later());
    slots.saw("h", before, &at_work(2, &[b]));
    assert!(slots.to_poll("h"));
    assert_eq!(slots.take(HOST, 2, Some(&want(1, false)), 31).index(), None);
    // Nor one that started before another of them ended: the slot at work may be the
    // request gone.
    let started = later();
    slots.take(HOST, 2, None, later()).finish(None);
    slots.saw("h", started, &at_work(2, &[a]));
    assert!(slots.to_poll("h"));
    messages.finish(None);
}

/// Fewer slots at work than requests in flight: one is still queued at the host, or done there
/// with its end not yet told. Nothing is learnt; found together, all are.
#[test]
fn every_unpinned_request_in_flight_must_be_found_at_once() {
    let slots = Slots::default();
    slots.prepare_pair(HOST, 3, true, 10);
    slots.saw("h", 11, &idle(&[0, 1, 2]));
    let first = slots.take(HOST, 3, Some(&want(1, true)), 20);
    let own = first.index().expect("pinned");
    first.finish(None);
    let (u1, u2) = (slots.take(HOST, 3, None, 30), slots.take(HOST, 3, None, 30));
    let others: Vec<usize> = (0..3).filter(|&i| i != own).collect();
    let polled = later();
    slots.saw("h", polled, &at_work(3, &others[..1]));
    assert!(slots.to_poll("h"));
    // Ids past the mirror's slots are nobody's.
    slots.saw("h", polled, &at_work(3, &[others[0], 7, 300]));
    assert!(slots.to_poll("h"));
    slots.saw("h", polled, &at_work(3, &others));
    assert!(!slots.to_poll("h"));
    let mirror = slots.of("h", "m");
    assert!(!mirror[own].foreign);
    assert!(others
        .iter()
        .all(|&i| mirror[i].theirs && mirror[i].holder.is_none()));
    u1.finish(None);
    assert!(
        slots.of("h", "m")[others[0]].theirs,
        "which one ended is not known"
    );
    u2.finish(None);
    assert!(slots.of("h", "m").iter().all(|s| !s.theirs));
}

/// A request that ends before any poll found it may have taken any slot free since it
/// started, one freed meanwhile by a pinned request included.
#[test]
fn a_request_that_ends_unfound_leaves_every_free_slot_taken() {
    let (slots, a, b) = two_conversations();
    let running = slots.take(HOST, 2, Some(&want(1, false)), 30);
    assert_eq!(running.index(), Some(a));
    let messages = slots.take(HOST, 2, None, 31);
    let mirror = slots.of("h", "m");
    assert!(!mirror[a].foreign && mirror[b].suspected);
    running.finish(None);
    messages.finish(None);
    let mirror = slots.of("h", "m");
    assert!(mirror.iter().all(|s| s.foreign && !s.suspected));
    assert!(!slots.to_poll("h"));
    // A later poll has nothing to clear.
    slots.saw("h", later(), &at_work(2, &[]));
    assert_eq!(slots.take(HOST, 2, Some(&want(1, false)), 41).index(), None);
}

/// With llama-server's default similarity the same finding lets pinning resume while a
/// request crossbar could not pin runs, and what its slot held is no longer believed.
#[test]
fn with_similarity_on_a_found_request_lets_pinning_resume_on_the_other_slots() {
    let slots = polled(3);
    let a = slots.take(HOST, 3, Some(&want(1, true)), 20);
    let own = a.index().expect("pinned");
    a.finish(None);
    let b = slots.take(HOST, 3, Some(&want(2, true)), 21);
    let theirs = b.index().expect("pinned");
    b.finish(None);
    let messages = slots.take(HOST, 3, None, later());
    assert!(slots.to_poll("h"));
    slots.saw("h", later(), &at_work(3, &[theirs]));
    let mirror = slots.of("h", "m");
    assert!(mirror[theirs].theirs && mirror[theirs].holder.is_none());
    assert!(
        mirror.iter().all(|s| !s.foreign),
        "foreign is for similarity off"
    );
    let back = slots.take(HOST, 3, Some(&want(1, false)), 32);
    assert_eq!(back.index(), Some(own));
    back.finish(None);
    let other = slots.take(HOST, 3, Some(&want(2, false)), 33);
    assert!(other.index().is_some_and(|at| at != theirs));
    other.finish(None);
    messages.finish(None);
}

/// A slot in doubt may be at work for a client gone: the slots at work say nothing then.
#[test]
fn a_slot_in_doubt_keeps_unpinned_requests_unfound() {
    let (slots, a, b) = two_conversations();
    drop(slots.take(HOST, 2, Some(&want(1, false)), 30));
    let messages = slots.take(HOST, 2, None, later());
    slots.saw("h", later(), &at_work(2, &[a, b]));
    let mirror = slots.of("h", "m");
    assert!(mirror[a].doubtful_since.is_some() && !mirror[b].theirs);
    assert!(slots.to_poll("h"));
    messages.finish(None);
}
