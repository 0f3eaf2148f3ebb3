//! How every change reaches the store before memory (write-through, seed 000) without the
//! table's lock held while the store commits (issue 12).
//!
//! A change first waits until no other write is pending on the keys it touches, then reserves
//! them under the lock, queues its writes (a change and its event in one commit), releases the
//! lock and waits for the commit. Another request for a reserved key waits on `settled`; every
//! other request goes on. Once committed the change is put in memory and the reservation lifted
//! under one turn of the lock, so nobody sees the one without the other. A failed commit lifts
//! the reservation and changes nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::{lease_row, short, Inner, Key, Table};
use crate::clientid::ClientId;
use crate::logfmt::val;
use crate::store::{LeaseEvent, Reason, StoreError, Write};

/// Longest a change waits for another's pending write on the same keys.
const PENDING_WAIT: Duration = Duration::from_secs(30);
/// How far down the least-recently-used order eviction looks for a lease with nothing in flight.
const EVICT_SCAN: usize = 256;
/// Most leases dropped in one transaction (idle sweep, release, a removed host).
pub const DROP_BATCH: usize = 1_000;
/// Leases forgotten from memory per turn of the lock after a batch committed.
const FORGET_CHUNK: usize = 100;

type Guard<'a> = MutexGuard<'a, Inner>;

impl Table {
    /// Waits, the lock released meanwhile, while `blocked` says a pending write is in the way.
    /// Fails after [`PENDING_WAIT`]. A request asks about its own key (one hash lookup); only
    /// operators look through every pending write.
    pub(super) fn settle(
        &self,
        inner: &mut Guard<'_>,
        blocked: impl Fn(&Inner) -> bool,
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + PENDING_WAIT;
        while blocked(inner) {
            if (self.shared.settled)
                .wait_until(inner, deadline)
                .timed_out()
            {
                return Err(StoreError::Stalled);
            }
        }
        Ok(())
    }

    /// Until no write is pending on `key`.
    pub(super) fn settle_key(&self, inner: &mut Guard<'_>, key: &Key) -> Result<(), StoreError> {
        self.settle(inner, |inner| inner.pending.contains_key(key))
    }

    /// Puts `key`'s lease where `change` says, with its event: the key reserved and counted on
    /// the new host while the lock is released for the commit, then in memory, where `then` runs
    /// in the same turn of the lock once it is committed. A new lease is `change.owner`'s, a moved
    /// one keeps its own. The caller has settled the key. Over `max_leases_per_client`, the
    /// owner's own least recently used idle lease goes; over `max_leases`, the oldest idle lease.
    pub(super) fn put_reserved(
        &self,
        mut inner: Guard<'_>,
        key: &Key,
        change: Change<'_>,
        now: i64,
        then: impl FnOnce(&mut Inner),
    ) -> Result<(), StoreError> {
        let Change {
            to: host,
            reason,
            from,
            owner,
        } = change;
        inner.pending.insert(key.clone(), host.to_string());
        inner.count(&key.model, host, 1);
        let ticket = self.persister.submit(vec![
            Write::SaveLease(lease_row(key, host, now, now)),
            Write::Event(event(now, key, reason, from, host)),
        ]);
        drop(inner);
        let committed = ticket.wait();
        let mut inner = self.lock();
        inner.pending.remove(key);
        inner.count(&key.model, host, -1);
        if committed.is_ok() {
            inner.insert(key.clone(), host.to_string(), (now, now), owner);
            log_change(key, reason, from, host);
            then(&mut inner);
            let owner = inner.leases.get(key).map_or(owner, |e| e.owner);
            self.evict(&mut inner, now, owner);
        }
        drop(inner);
        self.shared.settled.notify_all();
        committed
    }

    /// Drops the leases of `batch` — `(key, host)`, reserved by the caller as pending with host
    /// "" — in one commit with the lock released, then forgets them in small chunks (the lock
    /// free between them: a request never waits behind a thousand removals) and lifts the
    /// reservations. A failed commit lifts them and forgets nothing.
    pub(super) fn drop_reserved(
        &self,
        batch: &[(Key, String)],
        now: i64,
        reason: Reason,
        to: &str,
    ) -> Result<(), StoreError> {
        let mut writes = Vec::with_capacity(batch.len() * 2);
        for (key, host) in batch {
            writes.push(delete(key));
            writes.push(Write::Event(event(now, key, reason, host, to)));
        }
        let committed = self.persister.submit(writes).wait();
        for chunk in batch.chunks(FORGET_CHUNK) {
            let mut inner = self.lock();
            for (key, host) in chunk {
                inner.pending.remove(key);
                if committed.is_ok() {
                    inner.remove(key);
                    log_change(key, reason, host, to);
                }
            }
            drop(inner);
            self.shared.settled.notify_all();
        }
        committed
    }

    /// Drops the leases of `keys` still on a host `on` accepts when their turn comes, in
    /// batches of at most [`DROP_BATCH`], each settled, reserved and committed on its own; stops
    /// at the first failed commit, memory then holding exactly the batches written. Returns how
    /// many were dropped.
    pub(super) fn drop_leases(
        &self,
        keys: &[Key],
        on: impl Fn(&str) -> bool,
        now: i64,
        reason: Reason,
        to: &str,
    ) -> Result<usize, StoreError> {
        let mut dropped = 0;
        for keys in keys.chunks(DROP_BATCH) {
            let mut inner = self.lock();
            self.settle(&mut inner, |inner| {
                keys.iter().any(|k| inner.pending.contains_key(k))
            })?;
            let batch: Vec<(Key, String)> = (keys.iter())
                .filter_map(|k| Some((k.clone(), inner.leases.get(k)?.host.clone())))
                .filter(|(_, host)| on(host))
                .collect();
            for (key, _) in &batch {
                inner.pending.insert(key.clone(), String::new());
            }
            drop(inner);
            self.drop_reserved(&batch, now, reason, to)?;
            dropped += batch.len();
        }
        Ok(dropped)
    }

    /// Writes an operator's change that reserves no lease (a pin row) and waits for its commit
    /// with the lock released; `apply` puts it in memory, under the lock, once committed.
    pub(super) fn commit_then(
        &self,
        writes: Vec<Write>,
        apply: impl FnOnce(&mut Inner),
    ) -> Result<(), StoreError> {
        self.persister.submit(writes).wait()?;
        apply(&mut self.lock());
        Ok(())
    }

    /// Over `max_leases_per_client` for `owner`, then over `max_leases`: drops the least
    /// recently used leases with no request in flight and no write pending (event `evicted`) —
    /// `owner`'s own first, so a client making conversations by the thousand evicts its own, not
    /// everyone's (issue 46) — written as one job nobody waits for: a lost delete only leaves a
    /// row that the next start loads and evicts again.
    fn evict(&self, inner: &mut Inner, now: i64, owner: ClientId) {
        let mut writes = Vec::new();
        while inner.owned_by(owner) > inner.max_per_client {
            let Some(victim) = idle_victim(inner, inner.owned.get(&owner)) else {
                log::warn!(
                    "a client is over max_leases_per_client with no idle lease to evict leases={}",
                    inner.owned_by(owner)
                );
                break;
            };
            evict_one(inner, &victim, now, &mut writes);
        }
        while inner.leases.len() > inner.max_leases {
            let Some(victim) = idle_victim(inner, Some(&inner.by_use)) else {
                log::warn!(
                    "lease table over max_leases with no idle lease to evict leases={}",
                    inner.leases.len()
                );
                break;
            };
            evict_one(inner, &victim, now, &mut writes);
        }
        if !writes.is_empty() {
            drop(self.persister.submit(writes));
        }
    }
}

/// A lease put on `to`, new (`from` is "") or moved from `from`, for `reason`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Change<'a> {
    pub(super) to: &'a str,
    pub(super) reason: Reason,
    pub(super) from: &'a str,
    /// Whose request made the lease (a new one): its key, else its address.
    pub(super) owner: ClientId,
}

/// The least recently used lease of `by_use` with no request in flight and no write pending,
/// among the first [`EVICT_SCAN`].
fn idle_victim(inner: &Inner, by_use: Option<&BTreeSet<(i64, Arc<Key>)>>) -> Option<Arc<Key>> {
    (by_use?.iter())
        .take(EVICT_SCAN)
        .map(|(_, k)| k)
        .find(|k| {
            !inner.pending.contains_key(&***k)
                && inner.leases.get(&***k).is_some_and(|e| e.in_flight == 0)
        })
        .cloned()
}

/// Takes `victim` out of memory, its delete and event added to `writes`.
fn evict_one(inner: &mut Inner, victim: &Key, now: i64, writes: &mut Vec<Write>) {
    if let Some(old) = inner.remove(victim) {
        writes.push(delete(victim));
        let ev = event(now, victim, Reason::Evicted, &old.host, "");
        writes.push(Write::Event(ev));
        log_change(victim, Reason::Evicted, &old.host, "");
    }
}

pub(super) fn delete(key: &Key) -> Write {
    Write::DeleteLease {
        route: key.route.clone(),
        fp: key.fp.clone(),
        model: key.model.clone(),
    }
}

pub(super) fn event(at: i64, key: &Key, reason: Reason, from: &str, to: &str) -> LeaseEvent {
    LeaseEvent {
        id: 0,
        at,
        route: key.route.clone(),
        fp: key.fp.clone(),
        model: key.model.clone(),
        reason,
        from_host: from.to_string(),
        to_host: to.to_string(),
    }
}

/// The log line of a change already committed: debug for routine ones (new, idle, evicted: the
/// sweep and the cap log a summary), info for the rest.
pub(super) fn log_change(key: &Key, reason: Reason, from: &str, to: &str) {
    let routine = matches!(reason, Reason::New | Reason::Idle | Reason::Evicted);
    if routine && !log::log_enabled!(log::Level::Debug) {
        // A sweep logs a thousand of these under the lock: not even formatted unless wanted.
        return;
    }
    let is_pin = key.fp.is_empty() && key.model.is_empty();
    let verb = match (is_pin, from.is_empty(), to.is_empty()) {
        (true, _, false) => "pin set",
        (true, _, true) => "pin removed",
        (false, true, _) => "lease new",
        (false, false, false) => "lease moved",
        (false, false, true) => "lease dropped",
    };
    let line = format!(
        "{verb} route={} fp={} model={} from={} to={} reason={reason}",
        val(&key.route),
        val(short(&key.fp)),
        val(or_dash(&key.model)),
        val(or_dash(from)),
        val(or_dash(to)),
    );
    if routine {
        log::debug!("{line}");
    } else {
        log::info!("{line}");
    }
}

/// A failed write as one log value.
pub(super) fn describe(err: &StoreError) -> String {
    crate::logfmt::chain(err)
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}
