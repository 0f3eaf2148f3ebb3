//! Limiter stories: threads block in `acquire`, the test observes the queue through `queued()`
//! and learns of admissions over channels. No sleeps: every wait is on an event, with a bound.

use super::*;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;

const LONG: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(10);

#[track_caller]
fn check_counts(lim: &Limiter, in_flight: usize, queued: usize) {
    assert_eq!(
        (lim.in_flight("mini", "qwen"), lim.queued("mini", "qwen")),
        (in_flight, queued),
        "(in_flight, queued)"
    );
}

/// A limiter with one slot each for mini/qwen, mini/other and titan/qwen, as a config would give.
fn configured(queue_max: usize, timeout: Duration) -> Limiter {
    let lim = Limiter::new(queue_max, timeout);
    for (host, model) in [("mini", "qwen"), ("mini", "other"), ("titan", "qwen")] {
        lim.set_capacity(host, model, 1);
    }
    lim
}

type Outcome = (usize, Result<(), LimitError>);

/// Starts a thread that waits for a slot of mini/qwen, reports `id` with the outcome, then holds
/// the permit until told to let go (a message on `release`, or the channel closing).
fn waiter(
    lim: &Arc<Limiter>,
    id: usize,
    release: Receiver<()>,
) -> (thread::JoinHandle<()>, Receiver<Outcome>) {
    let (tx, rx) = unbounded();
    (waiter_to(lim, id, tx, release), rx)
}

/// Like [`waiter`], reporting on a channel the caller may share between waiters. The report is
/// sent while the permit is held, so reports arrive in admission order.
fn waiter_to(
    lim: &Arc<Limiter>,
    id: usize,
    tx: Sender<Outcome>,
    release: Receiver<()>,
) -> thread::JoinHandle<()> {
    let lim = Arc::clone(lim);
    thread::spawn(move || match lim.acquire("mini", "qwen") {
        Ok((permit, _waited)) => {
            let _ = tx.send((id, Ok(())));
            let _ = release.recv();
            drop(permit);
        }
        Err(err) => {
            let _ = tx.send((id, Err(err)));
        }
    })
}

#[test]
fn slot_is_freed_when_the_permit_drops() {
    // queue_max 0: a busy slot would answer QueueFull, so a second success proves the slot is free.
    let lim = Limiter::new(0, LONG);
    lim.set_capacity("mini", "qwen", 1);
    let (first, waited) = lim.acquire("mini", "qwen").unwrap();
    assert!(waited < LONG);
    check_counts(&lim, 1, 0);
    assert_eq!(
        lim.acquire("mini", "qwen").unwrap_err(),
        LimitError::QueueFull
    );
    drop(first);
    check_counts(&lim, 0, 0);
    let (_second, _) = lim.acquire("mini", "qwen").unwrap();
    check_counts(&lim, 1, 0);
}

#[test]
fn a_panic_while_holding_a_permit_frees_the_slot() {
    let lim = Arc::new(configured(0, LONG));
    let inner = Arc::clone(&lim);
    let joined = thread::spawn(move || {
        let (_permit, _) = inner.acquire("mini", "qwen").unwrap();
        panic!("request handler blew up");
    })
    .join();
    assert!(joined.is_err());
    check_counts(&lim, 0, 0);
    assert!(lim.acquire("mini", "qwen").is_ok());
}

#[test]
fn waiters_are_admitted_in_arrival_order() {
    let lim = Arc::new(Limiter::new(8, LONG));
    lim.set_capacity("mini", "qwen", 1);
    let (holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (done_tx, done_rx) = unbounded();
    let mut handles = Vec::new();
    for id in 0..5 {
        // Each waiter lets go as soon as it is admitted, so the slot passes down the line.
        let (release_tx, release_rx) = unbounded();
        drop(release_tx);
        handles.push(waiter_to(&lim, id, done_tx.clone(), release_rx));
        crate::testwait::until("the waiter to queue", || {
            lim.queued("mini", "qwen") == id + 1
        });
    }
    check_counts(&lim, 1, 5);
    drop(holder);
    let order: Vec<usize> = (0..5)
        .map(|_| {
            let (id, outcome) = done_rx.recv_timeout(BOUND).unwrap();
            assert_eq!(outcome, Ok(()));
            id
        })
        .collect();
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    for handle in handles {
        handle.join().unwrap();
    }
    check_counts(&lim, 0, 0);
}

#[test]
fn a_full_queue_refuses_at_once() {
    let lim = Arc::new(configured(1, LONG));
    let (holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (release_tx, release_rx) = unbounded();
    let (handle, admitted) = waiter(&lim, 1, release_rx);
    crate::testwait::until("the waiter to queue", || lim.queued("mini", "qwen") == 1);

    let started = Instant::now();
    assert_eq!(
        lim.acquire("mini", "qwen").unwrap_err(),
        LimitError::QueueFull
    );
    assert!(started.elapsed() < LONG / 2, "QueueFull must not wait");
    check_counts(&lim, 1, 1);

    // Another model on the same host has its own queue.
    assert!(lim.acquire("mini", "other").is_ok());

    drop(holder);
    assert_eq!(admitted.recv_timeout(BOUND).unwrap(), (1, Ok(())));
    check_counts(&lim, 1, 0);
    drop(release_tx);
    handle.join().unwrap();
    check_counts(&lim, 0, 0);
}

#[test]
fn a_waiter_times_out_and_leaves_the_queue() {
    let timeout = Duration::from_millis(50);
    let lim = configured(4, timeout);
    let (_holder, _) = lim.acquire("mini", "qwen").unwrap();
    let started = Instant::now();
    assert_eq!(
        lim.acquire("mini", "qwen").unwrap_err(),
        LimitError::Timeout
    );
    assert!(started.elapsed() >= timeout);
    check_counts(&lim, 1, 0);
}

#[test]
fn a_timed_out_front_waiter_lets_the_next_one_in() {
    // The front waiter has a short deadline, the one behind it a long one; a slot frees after the
    // front one gave up, and must go to the one behind.
    let lim = Arc::new(configured(4, Duration::from_millis(50)));
    let (holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (_keep_tx, release_rx) = unbounded::<()>();
    let (front, front_rx) = waiter(&lim, 1, release_rx.clone());
    crate::testwait::until("the front waiter to queue", || {
        lim.queued("mini", "qwen") == 1
    });
    lim.set_queue(4, LONG);
    let (back, back_rx) = waiter(&lim, 2, release_rx);
    assert_eq!(
        front_rx.recv_timeout(BOUND).unwrap(),
        (1, Err(LimitError::Timeout))
    );
    front.join().unwrap();
    check_counts(&lim, 1, 1);
    drop(holder);
    assert_eq!(back_rx.recv_timeout(BOUND).unwrap(), (2, Ok(())));
    drop(_keep_tx);
    back.join().unwrap();
}

#[test]
fn close_wakes_every_waiter_and_refuses_later_acquires() {
    let lim = Arc::new(configured(8, LONG));
    let (holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (_keep_tx, release_rx) = unbounded::<()>();
    let (a, a_rx) = waiter(&lim, 1, release_rx.clone());
    let (b, b_rx) = waiter(&lim, 2, release_rx);
    crate::testwait::until("both waiters to queue", || lim.queued("mini", "qwen") == 2);

    lim.close();
    assert_eq!(
        a_rx.recv_timeout(BOUND).unwrap(),
        (1, Err(LimitError::Closed))
    );
    assert_eq!(
        b_rx.recv_timeout(BOUND).unwrap(),
        (2, Err(LimitError::Closed))
    );
    a.join().unwrap();
    b.join().unwrap();
    check_counts(&lim, 1, 0);
    assert_eq!(lim.acquire("mini", "qwen").unwrap_err(), LimitError::Closed);
    assert_eq!(
        lim.acquire("titan", "qwen").unwrap_err(),
        LimitError::Closed
    );
    drop(holder);
    check_counts(&lim, 0, 0);
}

#[test]
fn permits_cross_threads_and_errors_read_well() {
    fn is_send<T: Send>() {}
    is_send::<Permit>();
    is_send::<Limiter>();
    assert_eq!(LimitError::QueueFull.to_string(), "queue full");
    assert_eq!(LimitError::Timeout.to_string(), "queue timeout");
    assert_eq!(LimitError::Closed.to_string(), "shutting down");
}

/// Issue 23: the load placement reads in one look, and how long permits were held (the first
/// hold sets the mean, later ones move it a fifth of the way).
#[test]
fn a_request_on_its_way_is_counted_once_as_it_enters() {
    // Each requester is counted as on its way (as the chooser's holdings count it) until the
    // limiter's `entered` hands it over to its slot or place in line. A reader that holds the
    // lock never sees it in both, so never more requests than there are requesters.
    const REQUESTERS: usize = 4;
    let lim = Arc::new(configured(REQUESTERS, LONG));
    let on_way = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Everyone starts together: a reader scheduled late on a busy machine would otherwise find
    // the requesters finished and read nothing.
    let start = Arc::new(Barrier::new(REQUESTERS + 1));
    let requesters: Vec<_> = (0..REQUESTERS)
        .map(|_| {
            let (lim, on_way, start) = (lim.clone(), on_way.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for _ in 0..2_000 {
                    on_way.fetch_add(1, Ordering::SeqCst);
                    let entered = || {
                        on_way.fetch_sub(1, Ordering::SeqCst);
                    };
                    let permit =
                        lim.acquire_unless("mini", "qwen", Waiter::default(), entered, || false);
                    drop(permit.expect("a slot within the timeout"));
                }
            })
        })
        .collect();
    let reader = {
        let (lim, on_way, done) = (lim.clone(), on_way.clone(), done.clone());
        thread::spawn(move || {
            let (mut most, mut reads) = (0, 0u64);
            start.wait();
            while reads == 0 || !done.load(Ordering::SeqCst) {
                let seen = lim.load_with("mini", "qwen", |load| {
                    load.in_flight + load.queued + on_way.load(Ordering::SeqCst)
                });
                (most, reads) = (most.max(seen), reads + 1);
            }
            (most, reads)
        })
    };
    for r in requesters {
        r.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let (most, reads) = reader.join().unwrap();
    assert!(reads > 0);
    assert!(
        most <= REQUESTERS,
        "{most} counted for {REQUESTERS} requesters"
    );
    check_counts(&lim, 0, 0);
}

mod table;
mod waiting;
