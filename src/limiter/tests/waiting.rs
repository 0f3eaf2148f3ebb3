//! Issue 46: what all the queues hold together, and one client's share of it. Before, each
//! host+model's `queue_max` was the only bound: queues on busy hosts held as many workers and
//! bodies as their bounds added up to, and one client could fill them all.

use super::*;
use crate::clientid::ClientId;

/// Mini/qwen and titan/qwen with one slot each, queues of 8, and `waiting` over them all.
fn bounded(waiting: Waiting) -> Arc<Limiter> {
    let lim = Arc::new(configured(8, LONG));
    lim.set_waiting(waiting);
    lim
}

/// A thread that waits for a slot of `host`/qwen as `client` with a body of `bytes`, reports
/// the outcome and holds the permit until `release` says.
fn wait_as(
    lim: &Arc<Limiter>,
    host: &'static str,
    (client, bytes): (&str, usize),
    release: Receiver<()>,
) -> (thread::JoinHandle<()>, Receiver<Result<(), LimitError>>) {
    let (lim, (tx, rx)) = (lim.clone(), unbounded());
    let waiter = Waiter {
        client: ClientId::key(client),
        bytes,
    };
    let handle =
        thread::spawn(
            move || match lim.acquire_unless(host, "qwen", waiter, || (), || false) {
                Ok((permit, _)) => {
                    let _ = tx.send(Ok(()));
                    let _ = release.recv();
                    drop(permit);
                }
                Err(err) => drop(tx.send(Err(err))),
            },
        );
    (handle, rx)
}

/// What `client` gets asking at once for `host`'s busy slot with a body of `bytes`.
#[track_caller]
fn refused(lim: &Limiter, host: &str, client: &str, bytes: usize) -> LimitError {
    let waiter = Waiter {
        client: ClientId::key(client),
        bytes,
    };
    match lim.acquire_unless(host, "qwen", waiter, || (), || false) {
        Ok(_) => panic!("{client} got a slot"),
        Err(err) => err,
    }
}

#[test]
fn a_client_past_its_share_of_the_line_is_refused_and_others_still_wait_issue_46() {
    let lim = bounded(Waiting {
        total: 3,
        per_client: 2,
        bytes: 1000,
        bytes_per_client: 600,
    });
    let (mini, _) = lim.acquire("mini", "qwen").unwrap();
    let (titan, _) = lim.acquire("titan", "qwen").unwrap();
    let (release_tx, release_rx) = unbounded::<()>();
    let mut waiting = Vec::new();
    // The flooder, on one host and then the other: its share is its share across all queues.
    for host in ["mini", "titan"] {
        waiting.push(wait_as(&lim, host, ("flood", 300), release_rx.clone()));
        crate::testwait::until("it waits", || lim.waiting_held().0 == waiting.len());
    }
    let per_client = LimitError::Waiting(Bound::PerClient);
    assert_eq!(refused(&lim, "mini", "flood", 0), per_client);
    assert_eq!(refused(&lim, "titan", "flood", 0), per_client);
    // Another client waits beside it, within the bytes all may hold.
    assert_eq!(
        refused(&lim, "mini", "other", 401),
        LimitError::Waiting(Bound::Bytes)
    );
    waiting.push(wait_as(&lim, "titan", ("other", 400), release_rx.clone()));
    crate::testwait::until("it waits", || lim.waiting_held() == (3, 1000));
    assert_eq!(
        refused(&lim, "mini", "third", 0),
        LimitError::Waiting(Bound::Total)
    );
    // A slot free is taken at once, whatever the line holds: nothing to bound.
    lim.set_capacity("mini", "other", 1);
    drop(lim.acquire("mini", "other").unwrap());
    // The line moves on: a request that leaves it with its slot gives back what it held.
    drop(mini);
    let (_, admitted) = &waiting[0];
    assert_eq!(admitted.recv_timeout(BOUND).unwrap(), Ok(()));
    assert_eq!(lim.waiting_held(), (2, 700));
    drop((titan, release_tx));
    for (handle, _) in waiting {
        handle.join().unwrap();
    }
    assert_eq!(lim.waiting_held(), (0, 0));
}

#[test]
fn one_body_past_a_clients_bytes_is_refused_when_it_would_wait_issue_46() {
    let lim = bounded(Waiting {
        total: 8,
        per_client: 8,
        bytes: 1 << 20,
        bytes_per_client: 1000,
    });
    let (held, _) = lim.acquire("mini", "qwen").unwrap();
    assert_eq!(
        refused(&lim, "mini", "big", 1001),
        LimitError::Waiting(Bound::BytesPerClient)
    );
    drop(held);
    // With a slot free it needs no wait, and nothing bounds it.
    let waiter = Waiter {
        client: ClientId::key("big"),
        bytes: 1 << 30,
    };
    assert!(lim
        .acquire_unless("mini", "qwen", waiter, || (), || false)
        .is_ok());
}

#[test]
fn every_way_out_of_the_line_gives_back_what_it_held_issue_46() {
    let one = Waiting {
        total: 1,
        per_client: 1,
        bytes: 100,
        bytes_per_client: 100,
    };
    let waiter = Waiter {
        client: ClientId::key("a"),
        bytes: 100,
    };
    // A timeout,
    let quick = configured(8, Duration::from_millis(50));
    quick.set_waiting(one);
    let _held = quick.acquire("mini", "qwen").unwrap();
    let timed_out = quick.acquire_unless("mini", "qwen", waiter, || (), || false);
    assert_eq!(timed_out.unwrap_err(), LimitError::Timeout);
    assert_eq!(quick.waiting_held(), (0, 0));
    // a client gone,
    let lim = bounded(one);
    let _held = lim.acquire("mini", "qwen").unwrap();
    let gone = lim.acquire_unless("mini", "qwen", waiter, || (), || true);
    assert_eq!(gone.unwrap_err(), LimitError::Gone);
    assert_eq!(lim.waiting_held(), (0, 0));
    // and a close for shutdown.
    let (_release_tx, release_rx) = unbounded::<()>();
    let (handle, outcome) = wait_as(&lim, "mini", ("a", 100), release_rx);
    crate::testwait::until("it waits", || lim.waiting_held().0 == 1);
    lim.close();
    assert_eq!(
        outcome.recv_timeout(BOUND).unwrap(),
        Err(LimitError::Closed)
    );
    handle.join().unwrap();
    assert_eq!(lim.waiting_held(), (0, 0));
}
