//! A pinned request unsettled until the host is seen to have started it, and a request crossbar
//! could not pin held until none is (`slots/settle.rs`).

use std::time::{Duration, Instant};

use super::super::*;
use super::{polled, want, HOST};

/// Long enough never to be reached by a test that passes; a wait that ends early says why.
const NEVER: Duration = Duration::from_secs(30);

/// Takes a place among the unpinned on another thread and waits there for the pins to settle,
/// once the test sees it waiting.
fn waiter(slots: &Slots, deadline: Instant) -> std::thread::JoinHandle<bool> {
    let s = slots.clone();
    let handle = std::thread::spawn(move || {
        let unpinned = s.take(HOST, 2, None, 30);
        let settled = s.wait_settled(HOST, deadline, || {});
        unpinned.finish(None);
        settled.expect("it waited")
    });
    let started = Instant::now();
    while slots.waiting("h") == 0 {
        assert!(started.elapsed() < NEVER, "the waiter never waited");
        std::thread::yield_now();
    }
    handle
}

/// The attack the wait closes: a pinned request is on its way, not yet launched at the host; an
/// unpinned one sent now could be launched first, into the pinned one's slot. It is held until
/// the pinned one's answer's head comes.
#[test]
fn an_unpinned_request_waits_until_the_pin_sent_before_it_has_its_head() {
    let slots = polled(2);
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 20);
    assert!(pinned.index().is_some());
    assert!(slots.unsettled(HOST));
    let waiting = waiter(&slots, Instant::now() + NEVER);
    assert!(slots.wants_poll("h"), "a waiter asks for a /slots poll");
    pinned.started();
    assert!(waiting.join().unwrap(), "settled, not timed out");
    assert!(!slots.unsettled(HOST));
    assert_eq!(slots.waiting("h"), 0);
    // Settled is not free: the slot stays busy until the answer's end.
    assert!(slots.of("h", "m").iter().any(|s| s.busy));
    pinned.finish(None);
}

/// A whole answer's head comes with its end: a `/slots` poll settles it first, but only one that
/// started after the pin was taken and shows its slot at work.
#[test]
fn a_poll_started_after_the_pin_that_shows_its_slot_at_work_settles_it() {
    let slots = polled(2);
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let at = pinned.index().expect("pinned");
    let waiting = waiter(&slots, Instant::now() + NEVER);
    let busy = |ids: &[usize]| Polled {
        idle: Vec::new(),
        busy: ids.to_vec(),
        max_task: None,
    };
    slots.saw("h", 19, &busy(&[at]));
    assert!(
        slots.unsettled(HOST),
        "a poll started before the pin tells nothing of it"
    );
    slots.saw("h", 21, &busy(&[1 - at]));
    assert!(
        slots.unsettled(HOST),
        "another slot at work tells nothing of it"
    );
    slots.saw("h", 21, &super::idle(&[at]));
    assert!(slots.unsettled(HOST), "idle: not launched yet");
    slots.saw("h", 21, &busy(&[at]));
    assert!(waiting.join().unwrap());
    assert!(!slots.unsettled(HOST));
    pinned.finish(None);
}

/// A pin's end settles it, whole or early; an unpinned request's own end settles nothing.
#[test]
fn a_pin_settles_at_its_end_whole_or_early() {
    let slots = polled(2);
    let whole = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let waiting = waiter(&slots, Instant::now() + NEVER);
    whole.finish(None);
    assert!(waiting.join().unwrap());

    let early = slots.take(HOST, 2, Some(&want(2, true)), 40);
    assert!(early.index().is_some());
    let waiting = waiter(&slots, Instant::now() + NEVER);
    drop(early);
    assert!(waiting.join().unwrap());
    assert!(!slots.unsettled(HOST));
}

/// Every wait has its bound: a pin that never settles (a host that stopped answering) holds the
/// unpinned request until its deadline, no longer, and the count of waiters comes back down.
#[test]
fn an_unpinned_request_waits_no_longer_than_its_deadline() {
    let slots = polled(2);
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let started = Instant::now();
    let waiting = waiter(&slots, started + Duration::from_millis(50));
    assert!(!waiting.join().unwrap(), "timed out");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(slots.waiting("h"), 0);
    assert!(!slots.wants_poll("h"));
    pinned.finish(None);
}

/// With nothing pinned in flight the wait costs nothing, and while the unpinned request runs
/// nothing new is pinned: a waiter is never kept waiting by pins sent after it.
#[test]
fn with_no_pin_on_its_way_an_unpinned_request_goes_at_once_and_holds_new_pins_off() {
    let slots = polled(2);
    let unpinned = slots.take(HOST, 2, None, 20);
    assert_eq!(
        slots.wait_settled(HOST, Instant::now(), || {}),
        None,
        "no wait"
    );
    let next = slots.take(HOST, 2, Some(&want(1, true)), 21);
    assert_eq!(
        next.index(),
        None,
        "not pinned beside a request crossbar could not pin"
    );
    assert!(!slots.unsettled(HOST));
    next.finish(None);
    unpinned.finish(None);
}

/// The poll the waiter asks for is made: when it asks, it is already counted, so the poller
/// (which asks `/slots` only while someone waits or a slot is in doubt) does not skip it.
#[test]
fn a_waiter_is_counted_before_it_asks_for_a_poll() {
    let slots = polled(2);
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let unpinned = slots.take(HOST, 2, None, 21);
    assert!(!slots.wants_poll("h"));
    let mut asked = false;
    let deadline = Instant::now() + Duration::from_millis(1);
    let settled = slots.wait_settled(HOST, deadline, || asked = slots.wants_poll("h"));
    assert!(asked, "the poll it asked for would have been skipped");
    assert_eq!(settled, Some(false));
    unpinned.finish(None);
    pinned.finish(None);
}
