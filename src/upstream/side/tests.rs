//! The count bound: at most `PER_HOST` requests count on one host at once, the others wait for a
//! turn until their own deadline, and a turn comes back when dropped.

use std::time::{Duration, Instant};

use super::*;

impl Side {
    fn turn_now(&self, host: &str) -> Option<Turn<'_>> {
        self.turn(host, Instant::now())
    }
}

#[test]
fn a_request_waits_for_a_turn_until_its_deadline_then_goes_without() {
    let side = Side::new(ureq::Agent::new_with_defaults());
    let held: Vec<_> = (0..PER_HOST).map(|_| side.turn_now("a").unwrap()).collect();
    let started = Instant::now();
    assert!(side
        .turn("a", started + Duration::from_millis(20))
        .is_none());
    assert!(started.elapsed() >= Duration::from_millis(20));
    assert_eq!(side.waiting(), 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            side.turn("a", Instant::now() + Duration::from_secs(30))
                .is_some()
        });
        let give_up = Instant::now() + Duration::from_secs(10);
        while side.waiting() == 0 {
            assert!(Instant::now() < give_up, "the waiter never started waiting");
            std::thread::yield_now();
        }
        drop(held);
        assert!(waiter.join().unwrap(), "a returned turn wakes the waiter");
    });
}

#[test]
fn each_host_counts_for_at_most_per_host_requests_and_a_turn_comes_back_on_drop() {
    let side = Side::new(ureq::Agent::new_with_defaults());
    let mut held: Vec<_> = (0..PER_HOST)
        .map(|_| side.turn_now("a").expect("under the bound"))
        .collect();
    assert!(side.turn_now("a").is_none(), "at the bound");
    let other = side.turn_now("b").expect("another host has its own bound");
    held.pop();
    let again = side.turn_now("a").expect("a turn came back");
    assert!(side.turn_now("a").is_none());
    drop((again, other));
    assert_eq!(side.in_flight.lock().len(), 1, "b is gone, a holds one");
    drop(held);
    assert!(
        side.in_flight.lock().is_empty(),
        "no host is left without a call"
    );
}
