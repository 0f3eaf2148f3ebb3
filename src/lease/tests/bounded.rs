//! Issue 12: writes without the lock (a reservation holds the key), the lease cap, batched expiry.

use std::thread;

use crossbeam_channel::{unbounded, Receiver, Sender};

use super::*;

/// Where the test answers a pending commit.
type Answer = Sender<Result<(), StoreError>>;

/// Answers the first submission only when the test says so; every other one at once.
struct Gated {
    mem: MemPersister,
    first: Mutex<Option<Sender<Answer>>>,
    sizes: Mutex<Vec<usize>>,
}

impl Persister for Gated {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.mem.list_leases()
    }
    fn submit(&self, writes: Vec<Write>) -> Ticket {
        self.sizes.lock().push(writes.len());
        let result = self.mem.apply(&writes);
        match self.first.lock().take() {
            Some(gate) => {
                let (answer, ticket) = Ticket::promise();
                gate.send(answer).unwrap();
                ticket
            }
            None => Ticket::ready(result),
        }
    }
}

fn gated() -> (Table, Arc<Gated>, Receiver<Answer>) {
    let (tx, rx) = unbounded();
    let p = Arc::new(Gated {
        mem: MemPersister::default(),
        first: Mutex::new(Some(tx)),
        sizes: Mutex::new(Vec::new()),
    });
    let table = Table::new(
        p.clone(),
        Arc::new(FakeHosts::default()),
        Arc::new(FakeChooser::default()),
        idle(),
    )
    .unwrap();
    (table, p, rx)
}

#[test]
fn issue12_a_pending_lease_holds_its_key_but_not_the_table() {
    let (table, p, gate) = gated();
    let k = key("projA", "c1");
    thread::scope(|s| {
        let first = s.spawn(|| table.acquire(&k, &both(), 0).unwrap());
        let answer = gate.recv().unwrap();
        // The first turn's write is pending: the table is free for others...
        check(&table, &key("projA", "c2"), 1, "titan", false);
        // ...and counts the reservation.
        assert_eq!(table.per_host().get("titan"), Some(&2));
        let second = s.spawn(|| table.acquire(&k, &both(), 2).unwrap());
        answer.send(Ok(())).unwrap();
        let (a, b) = (first.join().unwrap(), second.join().unwrap());
        assert_eq!((a.host.as_str(), a.reused), ("titan", false));
        assert_eq!((b.host.as_str(), b.reused), ("titan", true));
    });
    let news = p.mem.events().iter().filter(|e| e.0 == Reason::New).count();
    assert_eq!(news, 2, "one lease for c1, one for c2");
    assert_eq!(table.len(), 2);
}

#[test]
fn issue12_a_failed_pending_write_leaves_nothing_behind() {
    let (table, _p, gate) = gated();
    let k = key("projA", "c1");
    thread::scope(|s| {
        let first = s.spawn(|| table.acquire(&k, &both(), 0));
        gate.recv().unwrap().send(Err(StoreError::Stalled)).unwrap();
        assert!(matches!(first.join().unwrap(), Err(LeaseError::Store(_))));
    });
    assert!(table.is_empty());
    assert_eq!(table.per_host().get("titan"), Some(&0));
}

#[test]
fn issue12_over_max_leases_the_least_recently_used_idle_lease_is_evicted() {
    let f = fix();
    f.table.set_max_leases(3, 3);
    for (i, fp) in ["a", "b", "c"].into_iter().enumerate() {
        f.table.acquire(&key("p", fp), &both(), i as i64).unwrap();
    }
    // Held at its own time: the touch leaves it the oldest.
    let (_, held) = f
        .table
        .acquire_held(&key("p", "a"), &both(), 0, &Ask::default())
        .unwrap();
    f.table.acquire(&key("p", "d"), &both(), 10).unwrap();
    let fps: Vec<String> = f.table.snapshot().into_iter().map(|l| l.key.fp).collect();
    assert_eq!(
        fps,
        ["a", "c", "d"],
        "a is in flight, b was the oldest idle one"
    );
    drop(held);
    f.table.acquire(&key("p", "b2"), &both(), 11).unwrap();
    let fps: Vec<String> = f.table.snapshot().into_iter().map(|l| l.key.fp).collect();
    assert_eq!(fps, ["b2", "c", "d"]);
    let evicted = (f.p.events().into_iter())
        .filter(|e| e.0 == Reason::Evicted)
        .count();
    assert_eq!(evicted, 2);
    assert_eq!(f.p.rows().len(), 3, "the evictions reached the store");
}

#[test]
fn issue12_the_idle_sweep_commits_in_batches_of_at_most_a_thousand() {
    let (table, p) = ungated();
    for i in 0..2_500 {
        table
            .acquire(&key("p", &format!("{i}")), &both(), i)
            .unwrap();
    }
    table
        .acquire(&key("p", "fresh"), &both(), 100 * HOUR)
        .unwrap();
    p.sizes.lock().clear();
    assert_eq!(table.expire_idle(100 * HOUR), 2_500);
    assert_eq!(
        *p.sizes.lock(),
        vec![2_000, 2_000, 1_000],
        "delete + event each"
    );
    assert_eq!(table.len(), 1);
    assert_eq!(table.per_host().get("titan"), Some(&1));
}

/// Issue 12: the per-host counts the chooser reads are kept as leases come and go, not counted
/// from the table; after any mix of new leases, reuses, moves away from a down host, releases,
/// host drops, evictions and idle sweeps they still equal a count of the leases themselves. So
/// does each client's own index (issue 46).
#[test]
fn issue12_the_kept_per_host_counts_always_equal_a_recount() {
    let f = fix();
    let mut rng = fastrand::Rng::with_seed(7);
    f.table.set_max_leases(40, 15);
    f.table.set_idle(Duration::from_secs(20));
    for step in 0..3_000i64 {
        let now = step * 1000;
        let k = key(
            ["projA", "projB"][rng.usize(..2)],
            &format!("c{}", rng.usize(..80)),
        );
        match rng.usize(..20) {
            0 => f.hosts.down("titan"),
            1 => f.hosts.up("titan"),
            2 => drop(f.table.release("projB", now)),
            3 => drop(f.table.drop_host("mini", now)),
            4 => drop(f.table.expire_idle(now)),
            _ => {
                let client = crate::clientid::ClientId::key(["a", "b", "c"][rng.usize(..3)]);
                let ask = Ask {
                    client,
                    ..Ask::default()
                };
                drop(f.table.acquire_held(&k, &both(), now, &ask));
            }
        }
        assert!(f.table.lock().owned_is_kept(), "after step {step}");
        let mut recount = BTreeMap::new();
        for lease in f.table.snapshot() {
            *recount.entry(lease.host).or_insert(0) += 1;
        }
        let kept: BTreeMap<String, usize> = (f.table.per_host().into_iter())
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(kept, recount, "after step {step}");
    }
    // Every way a lease comes or goes happened along the way.
    let events = f.p.events();
    for reason in [
        Reason::New,
        Reason::Unhealthy,
        Reason::Release,
        Reason::Removed,
        Reason::Evicted,
        Reason::Idle,
    ] {
        assert!(events.iter().any(|e| e.0 == reason), "no {reason} event");
    }
}

/// A gated table whose submissions all answer at once until [`arm`] gates the next one.
fn ungated() -> (Table, Arc<Gated>) {
    let (table, p, _gate) = gated();
    *p.first.lock() = None;
    (table, p)
}

/// Gates the next submission of `p`.
fn arm(p: &Gated) -> Receiver<Answer> {
    let (tx, rx) = unbounded();
    *p.first.lock() = Some(tx);
    rx
}

#[test]
fn issue12_a_context_move_commits_with_the_table_free_and_holds_its_key() {
    let (table, p) = ungated();
    let k = key("projA", "c1");
    check(&table, &k, 0, "titan", false);
    let gate = arm(&p);
    thread::scope(|s| {
        let mover = s.spawn(|| table.move_to(&k, "mini", 10));
        let answer = gate.recv().unwrap();
        // The move is pending: other conversations are served, and the chooser sees it on mini.
        check(&table, &key("projA", "c2"), 11, "titan", false);
        assert_eq!(table.per_host().get("mini"), Some(&1));
        // The same conversation's next turn waits for the move, then follows it.
        let next = s.spawn(|| table.acquire(&k, &both(), 12).unwrap());
        answer.send(Ok(())).unwrap();
        mover.join().unwrap().unwrap();
        let next = next.join().unwrap();
        assert_eq!((next.host.as_str(), next.reused), ("mini", true));
    });
    assert_eq!(table.per_host().get("mini"), Some(&1));
    assert!(p.mem.events().contains(&ev(Reason::Ctx, "titan", "mini")));
}

#[test]
fn issue12_an_operators_pin_and_release_commit_with_the_table_free() {
    let (table, p) = ungated();
    for fp in ["c1", "c2"] {
        check(&table, &key("projA", fp), 0, "titan", false);
    }
    let gate = arm(&p);
    thread::scope(|s| {
        let pin = s.spawn(|| table.pin("projA", "mini", 10));
        let answer = gate.recv().unwrap();
        check(&table, &key("projB", "c1"), 11, "titan", false);
        assert_eq!(table.pinned("projA"), None, "in memory only once committed");
        answer.send(Ok(())).unwrap();
        assert_eq!(pin.join().unwrap().unwrap(), 2, "both leases were on titan");
    });
    assert_eq!(table.pinned("projA").as_deref(), Some("mini"));

    check(&table, &key("projB", "c2"), 20, "titan", false);
    let gate = arm(&p);
    thread::scope(|s| {
        let release = s.spawn(|| table.release("projB", 30));
        let answer = gate.recv().unwrap();
        // Another route is served; a released conversation waits for the release...
        check(&table, &key("projA", "c3"), 31, "mini", false);
        let again = s.spawn(|| table.acquire(&key("projB", "c1"), &both(), 32).unwrap());
        answer.send(Ok(())).unwrap();
        assert_eq!(release.join().unwrap().unwrap(), 2);
        // ...and then starts afresh.
        assert!(!again.join().unwrap().reused);
    });
    assert_eq!(
        hosts_of(&table),
        pairs(&[("projA/c3", "mini"), ("projB/c1", "titan")])
    );
}

#[test]
fn issue12_a_removed_host_waits_for_a_lease_still_landing_on_it() {
    let (table, p, gate) = gated();
    let k = key("projA", "c1");
    thread::scope(|s| {
        let first = s.spawn(|| table.acquire(&k, &both(), 0).unwrap());
        let answer = gate.recv().unwrap();
        let drop_host = s.spawn(|| table.drop_host("titan", 1));
        answer.send(Ok(())).unwrap();
        assert_eq!(first.join().unwrap().host, "titan");
        assert_eq!(
            drop_host.join().unwrap().unwrap(),
            1,
            "the new lease went too"
        );
    });
    assert!(table.is_empty());
    assert_eq!(
        p.mem.events().last(),
        Some(&ev(Reason::Removed, "titan", ""))
    );
}

#[test]
fn issue12_a_sweep_logs_one_summary_line_not_one_per_lease() {
    crate::testlog::capture();
    let f = fix();
    for i in 0..2_500 {
        f.table
            .acquire(&key("p", &format!("{i}")), &both(), i)
            .unwrap();
    }
    assert_eq!(f.table.expire_idle(100 * HOUR), 2_500);
    let lines = crate::testlog::mine();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("INFO leases expired count=2500 batches=3 ms="),
        "{lines:?}"
    );
}

/// A release takes the leases the table holds; a first turn still being written counts as made
/// after it, so a busy route can never keep an operator waiting.
#[test]
fn issue12_a_release_does_not_wait_for_new_conversations_being_written() {
    let (table, p) = ungated();
    check(&table, &key("projA", "c1"), 0, "titan", false);
    let gate = arm(&p);
    thread::scope(|s| {
        let first_turn = s.spawn(|| table.acquire(&key("projA", "c2"), &both(), 1).unwrap());
        let answer = gate.recv().unwrap();
        assert_eq!(table.release("projA", 2).unwrap(), 1, "c1 only");
        answer.send(Ok(())).unwrap();
        assert_eq!(first_turn.join().unwrap().host, "titan");
    });
    assert_eq!(hosts_of(&table), pairs(&[("projA/c2", "titan")]));
}
