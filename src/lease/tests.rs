//! Lease table stories, with fake hosts, a fake chooser and an in-memory persister that can be
//! told to fail. `acquire` stories here; every other change in `operator`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::*;
use crate::store::LeaseEvent;

mod bounded;
mod busy;
mod failures;
mod held;
mod lookup;
mod operator;
mod owners;

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

/// Picks the preferred host when offered (a "better host": it stands for load), else the
/// inherited one (the real chooser's tie-breaker), else the first candidate. `busy` names the
/// host a conversation should leave for, when offered.
#[derive(Default)]
struct FakeChooser {
    prefer: Mutex<Option<String>>,
    busy: Mutex<Option<String>>,
    /// The asks the table passed, in order.
    asks: Mutex<Vec<Ask>>,
    /// The candidates of the last choice, as offered.
    offered: Mutex<Vec<Candidate>>,
}

impl FakeChooser {
    fn prefer(&self, h: &str) {
        *self.prefer.lock() = Some(h.into());
    }
    fn no_preference(&self) {
        *self.prefer.lock() = None;
    }
    fn leave_for(&self, h: Option<&str>) {
        *self.busy.lock() = h.map(str::to_string);
    }
}

impl Chooser for FakeChooser {
    fn choose(
        &self,
        candidates: &[Candidate],
        _model: &str,
        ask: &Ask,
        _now: i64,
    ) -> Option<(String, Placed)> {
        self.asks.lock().push(*ask);
        *self.offered.lock() = candidates.to_vec();
        let prefer = self.prefer.lock().clone();
        match prefer {
            Some(p) if candidates.iter().any(|c| c.host == p) => Some((p, Placed::LeastLoaded)),
            _ => match candidates.iter().find(|c| c.inherited) {
                Some(c) => Some((c.host.clone(), Placed::Inherit)),
                None => candidates
                    .first()
                    .map(|c| (c.host.clone(), Placed::LeastLoaded)),
            },
        }
    }

    fn busy_move(
        &self,
        _current: &Candidate,
        others: &[Candidate],
        _model: &str,
        _ask: &Ask,
        _now: i64,
    ) -> Option<String> {
        let to = self.busy.lock().clone()?;
        others.iter().any(|c| c.host == to).then_some(to)
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

impl MemPersister {
    /// All or nothing, as one commit of the writer thread is.
    fn apply(&self, writes: &[Write]) -> Result<(), StoreError> {
        let has_event = writes.iter().any(|w| matches!(w, Write::Event(_)));
        if self.fail.load(Ordering::SeqCst)
            || (has_event && self.fail_events.load(Ordering::SeqCst))
        {
            return Err(MemPersister::refuse());
        }
        let mut rows = self.rows.lock();
        for write in writes {
            match write {
                Write::SaveLease(row) => {
                    let k = (row.route.clone(), row.fp.clone(), row.model.clone());
                    rows.insert(k, row.clone());
                }
                Write::DeleteLease { route, fp, model } => {
                    rows.remove(&(route.clone(), fp.clone(), model.clone()));
                }
                Write::Touch {
                    route,
                    fp,
                    model,
                    last_used,
                } => {
                    let k = (route.clone(), fp.clone(), model.clone());
                    if let Some(row) = rows.get_mut(&k) {
                        row.last_used = row.last_used.max(*last_used);
                    }
                }
                Write::Event(ev) => self.events.lock().push(ev.clone()),
                other => panic!("the lease table wrote {other:?}"),
            }
        }
        Ok(())
    }
}

impl Persister for MemPersister {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        Ok(self.rows())
    }
    fn submit(&self, writes: Vec<Write>) -> Ticket {
        Ticket::ready(self.apply(&writes))
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
        (got.host.as_str(), got.reused),
        (host, reused),
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

/// Owned copies of `(name, value)` pairs, for short assertions: `&str`s or slices.
fn pairs<V: ToOwned + ?Sized>(xs: &[(&str, &V)]) -> Vec<(String, V::Owned)> {
    xs.iter()
        .map(|(a, b)| (a.to_string(), (*b).to_owned()))
        .collect()
}

/// Issue 23 over seed 000 rule 3: the route-level lease's host is offered to the chooser as
/// inherited, a preference it weighs against load; a new conversation there is still `new`.
#[test]
fn a_new_conversation_is_offered_its_route_lease_host_as_a_preference() {
    let f = fix();
    f.chooser.prefer("mini");
    check(&f.table, &key("projA", ""), 0, "mini", false);
    // Nothing else to weigh: the fake chooser takes the inherited host, and says so.
    f.chooser.no_preference();
    let first = f.table.acquire(&key("projA", "c1"), &both(), 10).unwrap();
    let want = Acquired {
        host: "mini".into(),
        reused: false,
        placed: Placed::Inherit,
    };
    assert_eq!(first, want);
    let next = f.table.acquire(&key("projA", "c1"), &both(), 20).unwrap();
    assert_eq!((next.reused, next.placed), (true, Placed::Sticky));
    // Load (the chooser's preference) beats the inherited host for the next conversation.
    f.chooser.prefer("titan");
    let second = f.table.acquire(&key("projA", "c2"), &both(), 30).unwrap();
    assert_eq!(
        (second.host.as_str(), second.placed),
        ("titan", Placed::LeastLoaded)
    );
    // A different model has no route lease to inherit.
    f.chooser.no_preference();
    let other = Key {
        model: "llama".into(),
        ..key("projA", "c1")
    };
    let got = f.table.acquire(&other, &both(), 40).unwrap();
    assert_eq!(
        (got.host.as_str(), got.placed),
        ("titan", Placed::LeastLoaded)
    );
    assert_eq!(hosts_of(&f.table).len(), 4);
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
    f.table.flush_touches();
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
    check(&f.table, &key("projA", "c1"), 0, "titan", false);
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
