//! Lease table stories, with fake hosts, a fake chooser and an in-memory persister that can be
//! told to fail. `acquire` stories here; every other change in `operator`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::*;

mod lookup;
mod operator;

const HOUR: i64 = 3_600_000;

/// Every host healthy and not draining unless told otherwise.
#[derive(Default)]
struct FakeHosts {
    down: Mutex<BTreeSet<String>>,
    draining: Mutex<BTreeSet<String>>,
}

impl FakeHosts {
    fn down(&self, h: &str) {
        self.down.lock().insert(h.into());
    }
    fn up(&self, h: &str) {
        self.down.lock().remove(h);
    }
    fn drain(&self, h: &str) {
        self.draining.lock().insert(h.into());
    }
}

impl HostView for FakeHosts {
    fn healthy(&self, host: &str) -> bool {
        !self.down.lock().contains(host)
    }
    fn draining(&self, host: &str) -> bool {
        self.draining.lock().contains(host)
    }
}

/// Picks the preferred host when offered (a "better host"), else the first candidate.
#[derive(Default)]
struct FakeChooser {
    prefer: Mutex<Option<String>>,
}

impl FakeChooser {
    fn prefer(&self, h: &str) {
        *self.prefer.lock() = Some(h.into());
    }
}

impl Chooser for FakeChooser {
    fn choose(&self, candidates: &[Candidate], _model: &str) -> Option<String> {
        let prefer = self.prefer.lock().clone();
        match prefer {
            Some(p) if candidates.iter().any(|c| c.host == p) => Some(p),
            _ => candidates.first().map(|c| c.host.clone()),
        }
    }
}

/// Rows and events in memory; `fail` makes every write fail, `fail_events` only event writes.
#[derive(Default)]
struct MemPersister {
    rows: Mutex<BTreeMap<(String, String, String), LeaseRow>>,
    events: Mutex<Vec<LeaseEvent>>,
    fail: AtomicBool,
    fail_events: AtomicBool,
}

impl MemPersister {
    fn refuse() -> StoreError {
        StoreError::Sqlite(rusqlite::Error::InvalidQuery)
    }
    fn events(&self) -> Vec<(Reason, String, String)> {
        let evs = self.events.lock();
        evs.iter()
            .map(|e| (e.reason, e.from_host.clone(), e.to_host.clone()))
            .collect()
    }
    fn rows(&self) -> Vec<LeaseRow> {
        self.rows.lock().values().cloned().collect()
    }
}

impl Persister for MemPersister {
    fn save_lease(&self, row: &LeaseRow) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(MemPersister::refuse());
        }
        let k = (row.route.clone(), row.fp.clone(), row.model.clone());
        self.rows.lock().insert(k, row.clone());
        Ok(())
    }
    fn delete_lease(&self, route: &str, fp: &str, model: &str) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(MemPersister::refuse());
        }
        self.rows
            .lock()
            .remove(&(route.into(), fp.into(), model.into()));
        Ok(())
    }
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        Ok(self.rows())
    }
    fn record_event(&self, ev: &LeaseEvent) -> Result<i64, StoreError> {
        if self.fail.load(Ordering::SeqCst) || self.fail_events.load(Ordering::SeqCst) {
            return Err(MemPersister::refuse());
        }
        let mut evs = self.events.lock();
        evs.push(ev.clone());
        Ok(evs.len() as i64)
    }
}

struct Fix {
    table: Table,
    hosts: Arc<FakeHosts>,
    chooser: Arc<FakeChooser>,
    p: Arc<MemPersister>,
}

fn fix() -> Fix {
    let (hosts, chooser, p) = (
        Arc::default(),
        Arc::default(),
        Arc::<MemPersister>::default(),
    );
    let table = Table::new(
        p.clone(),
        Arc::clone(&hosts) as _,
        Arc::clone(&chooser) as _,
        idle(),
    )
    .unwrap();
    Fix {
        table,
        hosts,
        chooser,
        p,
    }
}

fn idle() -> Duration {
    Duration::from_secs(2 * 3600)
}

fn key(route: &str, fp: &str) -> Key {
    Key {
        route: route.into(),
        fp: fp.into(),
        model: "qwen".into(),
    }
}

fn both() -> Vec<String> {
    vec!["titan".into(), "mini".into()]
}

fn ev(reason: Reason, from: &str, to: &str) -> (Reason, String, String) {
    (reason, from.into(), to.into())
}

#[track_caller]
fn check(t: &Table, k: &Key, now: i64, host: &str, reused: bool) {
    let got = t.acquire(k, &both(), now).unwrap();
    assert_eq!(
        got,
        Acquired {
            host: host.into(),
            reused
        },
        "acquire {k:?} at {now}"
    );
}

/// The table's leases as (fp, host) pairs, for short assertions.
fn hosts_of(t: &Table) -> Vec<(String, String)> {
    t.snapshot()
        .into_iter()
        .map(|l| (format!("{}/{}", l.key.route, l.key.fp), l.host))
        .collect()
}

fn pairs(xs: &[(&str, &str)]) -> Vec<(String, String)> {
    xs.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn a_fingerprint_lease_inherits_the_route_lease() {
    let f = fix();
    f.chooser.prefer("mini");
    check(&f.table, &key("projA", ""), 0, "mini", false);
    // A better host appearing is never a reason: the new conversation follows the warm cache.
    f.chooser.prefer("titan");
    check(&f.table, &key("projA", "c1"), 10, "mini", true);
    check(&f.table, &key("projA", "c1"), 20, "mini", true);
    // A different model has no route lease to inherit.
    let other = Key {
        model: "llama".into(),
        ..key("projA", "c1")
    };
    assert_eq!(
        f.table.acquire(&other, &both(), 30).unwrap(),
        Acquired {
            host: "titan".into(),
            reused: false
        }
    );
    assert_eq!(hosts_of(&f.table).len(), 3);
}

#[test]
fn a_lease_on_an_unhealthy_host_moves_and_stays_moved_when_it_recovers() {
    let f = fix();
    let k = key("projA", "c1");
    check(&f.table, &k, 0, "titan", false);
    f.hosts.down("titan");
    check(&f.table, &k, 10, "mini", false);
    assert_eq!(
        f.p.events().last(),
        Some(&ev(Reason::Unhealthy, "titan", "mini"))
    );
    f.hosts.up("titan");
    check(&f.table, &k, 20, "mini", true);
    assert_eq!(f.p.events().len(), 2, "staying is not an event");
    let row = &f.p.rows()[0];
    assert_eq!(
        (row.host.as_str(), row.created, row.last_used),
        ("mini", 10, 20)
    );
}

#[test]
fn a_draining_host_serves_its_leases_but_gets_no_new_ones() {
    let f = fix();
    check(&f.table, &key("projA", ""), 0, "titan", false);
    check(&f.table, &key("projA", "c1"), 0, "titan", true);
    f.hosts.drain("titan");
    check(&f.table, &key("projA", "c1"), 10, "titan", true);
    check(&f.table, &key("projA", "c2"), 20, "mini", false);
    check(&f.table, &key("projA", ""), 30, "titan", true);
    f.hosts.drain("mini");
    let err = f
        .table
        .acquire(&key("projA", "c3"), &both(), 40)
        .unwrap_err();
    assert!(matches!(err, LeaseError::NoHost), "{err:?}");
}

#[test]
fn a_pinned_host_that_is_down_is_an_error_and_nothing_is_created() {
    let f = fix();
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    f.table.pin("projA", "titan", 0).unwrap();
    f.hosts.down("titan");
    let (rows, events) = (f.p.rows(), f.p.events());
    for fp in ["c1", "c2"] {
        let err = f.table.acquire(&key("projA", fp), &both(), 10).unwrap_err();
        assert!(
            matches!(&err, LeaseError::PinnedDown { host } if host == "titan"),
            "{err:?}"
        );
    }
    assert_eq!(hosts_of(&f.table), pairs(&[("projA/c1", "titan")]));
    assert_eq!((f.p.rows(), f.p.events()), (rows, events));
}

#[test]
fn no_usable_candidate_is_an_error_and_nothing_is_created() {
    let f = fix();
    f.hosts.down("titan");
    f.hosts.down("mini");
    let err = f
        .table
        .acquire(&key("projA", "c1"), &both(), 0)
        .unwrap_err();
    assert!(matches!(err, LeaseError::NoHost), "{err:?}");
    let err = f.table.acquire(&key("projA", "c1"), &[], 0).unwrap_err();
    assert!(matches!(err, LeaseError::NoHost), "{err:?}");
    assert!(f.table.snapshot().is_empty() && f.p.rows().is_empty() && f.p.events().is_empty());

    // A lease whose host is down and which has nowhere to go stays, waiting for its host.
    f.hosts.up("titan");
    check(&f.table, &key("projA", "c1"), 10, "titan", false);
    f.hosts.down("titan");
    let err = f
        .table
        .acquire(&key("projA", "c1"), &both(), 20)
        .unwrap_err();
    assert!(matches!(err, LeaseError::NoHost), "{err:?}");
    assert_eq!(hosts_of(&f.table), pairs(&[("projA/c1", "titan")]));
    assert_eq!(f.p.events(), vec![ev(Reason::New, "", "titan")]);
}

#[test]
fn a_persister_that_fails_leaves_memory_exactly_as_it_was() {
    let f = fix();
    check(&f.table, &key("projA", ""), 0, "titan", false);
    check(&f.table, &key("projA", "c1"), 0, "titan", true);
    check(&f.table, &key("projB", "c1"), 0, "titan", false);
    f.table.pin("projB", "titan", 0).unwrap();
    let (before, pins, rows) = (f.table.snapshot(), f.table.pins(), f.p.rows());
    let seen = f.table.inner.lock().seen.clone();

    f.p.fail.store(true, Ordering::SeqCst);
    let is_store = |r: Result<Acquired, LeaseError>| matches!(r, Err(LeaseError::Store(_)));
    assert!(
        is_store(f.table.acquire(&key("projA", "c1"), &both(), 10)),
        "touch"
    );
    assert!(
        is_store(f.table.acquire(&key("projA", "c2"), &both(), 10)),
        "inherit"
    );
    assert!(
        is_store(
            f.table
                .acquire(&key("projC", "c1"), &["gpu3".to_string()], 10)
        ),
        "new"
    );
    f.hosts.down("titan");
    assert!(
        is_store(f.table.acquire(&key("projA", "c1"), &both(), 10)),
        "unhealthy move"
    );
    f.hosts.up("titan");
    assert!(matches!(
        f.table.pin("projA", "mini", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.unpin("projB", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.release("projA", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.move_to(&key("projA", "c1"), "mini", 10),
        Err(LeaseError::Store(_))
    ));
    assert!(matches!(
        f.table.drop_host("titan", 10),
        Err(LeaseError::Store(_))
    ));
    assert_eq!(
        f.table.expire_idle(100 * HOUR),
        0,
        "a lease that cannot be deleted is kept"
    );

    assert_eq!(f.table.snapshot(), before);
    assert_eq!(f.table.pins(), pins);
    assert_eq!(f.p.rows(), rows);
    assert_eq!(
        f.table.inner.lock().seen,
        seen,
        "not even the candidates of a failed acquire"
    );
    assert_eq!(
        f.table
            .pin("projC", "gpu3", 10)
            .map_err(|e| e.to_string())
            .unwrap_err(),
        "unknown host gpu3"
    );

    // Back to normal, the table carries on from where it was.
    f.p.fail.store(false, Ordering::SeqCst);
    check(&f.table, &key("projA", "c1"), 20, "titan", true);
}

#[test]
fn an_event_that_cannot_be_recorded_does_not_undo_the_change() {
    let f = fix();
    f.p.fail_events.store(true, Ordering::SeqCst);
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
    assert_eq!(hosts_of(&f.table), pairs(&[("projA/c1", "titan")]));
    assert_eq!(f.p.rows().len(), 1, "memory and rows agree");
    assert!(f.p.events().is_empty());
}
