//! The seat table: capacity raised and lowered, pairs the config never named, a reload's pairs
//! forgotten once idle, the snapshot, the load placement reads, and the probe's hold on a host's
//! idle seats.

use super::*;

#[test]
fn raising_capacity_admits_waiters_at_once() {
    let lim = Arc::new(Limiter::new(8, LONG));
    lim.set_capacity("mini", "qwen", 1);
    let (_holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (keep_tx, release_rx) = unbounded::<()>();
    let (a, a_rx) = waiter(&lim, 1, release_rx.clone());
    crate::testwait::until("the first waiter to queue", || {
        lim.queued("mini", "qwen") == 1
    });
    let (b, b_rx) = waiter(&lim, 2, release_rx.clone());
    crate::testwait::until("the second waiter to queue", || {
        lim.queued("mini", "qwen") == 2
    });
    let (c, c_rx) = waiter(&lim, 3, release_rx);
    crate::testwait::until("the third waiter to queue", || {
        lim.queued("mini", "qwen") == 3
    });

    // Two more slots: the first two in line get in, the third keeps waiting.
    lim.set_capacity("mini", "qwen", 3);
    assert_eq!(a_rx.recv_timeout(BOUND).unwrap(), (1, Ok(())));
    assert_eq!(b_rx.recv_timeout(BOUND).unwrap(), (2, Ok(())));
    check_counts(&lim, 3, 1);
    assert!(c_rx.try_recv().is_err());

    lim.close();
    assert_eq!(
        c_rx.recv_timeout(BOUND).unwrap(),
        (3, Err(LimitError::Closed))
    );
    drop(keep_tx);
    for handle in [a, b, c] {
        handle.join().unwrap();
    }
}

#[test]
fn lowering_capacity_lets_running_requests_finish() {
    let lim = Limiter::new(0, LONG);
    lim.set_capacity("mini", "qwen", 2);
    let (p1, _) = lim.acquire("mini", "qwen").unwrap();
    let (p2, _) = lim.acquire("mini", "qwen").unwrap();
    lim.set_capacity("mini", "qwen", 1);
    check_counts(&lim, 2, 0);
    drop(p1);
    assert_eq!(
        lim.acquire("mini", "qwen").unwrap_err(),
        LimitError::QueueFull
    );
    drop(p2);
    assert!(lim.acquire("mini", "qwen").is_ok());
}

/// Review finding: a slot was created (with one default slot) for any host+model asked for, so
/// clients cycling model names grew the table, and the metrics scraped from it, without bound.
#[test]
fn an_unconfigured_host_model_is_refused_and_not_remembered() {
    let lim = configured(0, LONG);
    let before = lim.snapshot();
    for model in ["ghost-1", "ghost-2", "qwen "] {
        assert_eq!(
            lim.acquire("mini", model).unwrap_err(),
            LimitError::NotConfigured
        );
    }
    assert_eq!(
        lim.acquire("ghost", "qwen").unwrap_err(),
        LimitError::NotConfigured
    );
    assert_eq!(
        (lim.in_flight("ghost", "qwen"), lim.queued("ghost", "qwen")),
        (0, 0)
    );
    assert_eq!(lim.snapshot(), before);
}

#[test]
fn retain_forgets_idle_pairs_and_keeps_busy_ones_until_idle() {
    let lim = configured(4, LONG);
    let (holder, _) = lim.acquire("titan", "qwen").unwrap();
    let configured_now = |host: &str, model: &str| (host, model) == ("mini", "qwen");
    lim.retain(configured_now);
    let pairs = |lim: &Limiter| -> Vec<(String, String)> {
        lim.snapshot()
            .into_iter()
            .map(|s| (s.host, s.model))
            .collect()
    };
    assert_eq!(
        pairs(&lim),
        vec![
            ("mini".into(), "qwen".into()),
            ("titan".into(), "qwen".into())
        ],
        "titan/qwen is busy, so it stays"
    );
    drop(holder);
    lim.retain(configured_now);
    assert_eq!(pairs(&lim), vec![("mini".into(), "qwen".into())]);
    assert_eq!(
        lim.acquire("titan", "qwen").unwrap_err(),
        LimitError::NotConfigured
    );
}

#[test]
fn snapshot_is_sorted_and_counts_waiters() {
    let lim = Arc::new(Limiter::new(4, LONG));
    lim.set_capacity("titan", "qwen", 2);
    lim.set_capacity("mini", "qwen", 1);
    lim.set_capacity("mini", "llama", 1);
    let (holder, _) = lim.acquire("mini", "qwen").unwrap();
    let (keep_tx, release_rx) = unbounded::<()>();
    let (handle, admitted) = waiter(&lim, 1, release_rx);
    crate::testwait::until("the waiter to queue", || lim.queued("mini", "qwen") == 1);

    let stats = |host: &str, model: &str, parallel, in_flight, queued| SeatStats {
        host: host.into(),
        model: model.into(),
        parallel,
        in_flight,
        queued,
    };
    assert_eq!(
        lim.snapshot(),
        vec![
            stats("mini", "llama", 1, 0, 0),
            stats("mini", "qwen", 1, 1, 1),
            stats("titan", "qwen", 2, 0, 0),
        ]
    );
    drop(holder);
    assert_eq!(admitted.recv_timeout(BOUND).unwrap(), (1, Ok(())));
    drop(keep_tx);
    handle.join().unwrap();
}

#[test]
fn load_reports_slots_and_the_mean_hold_of_permits() {
    let l = Limiter::new(4, Duration::from_secs(1));
    l.set_capacity("h", "m", 2);
    assert_eq!(l.load("h", "m").hold_ms, None);
    assert_eq!(l.load("nowhere", "m").parallel, 0);
    let (a, _) = l.acquire("h", "m").unwrap();
    let load = l.load("h", "m");
    assert_eq!((load.parallel, load.in_flight, load.queued), (2, 1, 0));
    drop(a);
    let first = l.load("h", "m").hold_ms.expect("a hold was measured");
    assert!((0.0..1000.0).contains(&first), "{first}");
    assert_eq!(mean_hold(None, 100.0), 100.0);
    assert_eq!(mean_hold(Some(100.0), 200.0), 120.0);
}

/// Issue 47: the probe holds every seat of a host, only while none is in use and nobody waits;
/// requests that come meanwhile wait their turn, and the hold folds nothing into the mean hold
/// placement reads.
#[test]
fn the_probes_hold_takes_a_hosts_idle_seats_and_folds_nothing_into_its_mean_hold_issue_47() {
    let lim = configured(4, LONG);
    lim.set_capacity("mini", "qwen", 2);
    let (busy, _) = lim.acquire("mini", "qwen").unwrap();
    assert!(lim.hold_idle("mini").is_none(), "a seat is in use");
    drop(busy);
    let mean = lim.load("mini", "qwen").hold_ms;
    let held = lim.hold_idle("mini").expect("every seat is idle");
    assert_eq!(lim.in_flight_on("mini"), 3, "both models' seats, 2 + 1");
    assert!(lim.hold_idle("mini").is_none(), "held already");
    assert_eq!(
        lim.in_flight_on("titan"),
        0,
        "another host's seats are its own"
    );
    drop(held);
    assert_eq!(lim.in_flight_on("mini"), 0);
    assert_eq!(
        lim.load("mini", "qwen").hold_ms,
        mean,
        "the hold is not a request's"
    );
}
