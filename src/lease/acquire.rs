//! The lease decision (seed 000's four rules) and the write-through steps every change is made
//! of. A new or moved lease is decided under the lock, reserved (so a concurrent turn of the same
//! conversation waits for it and the chooser counts it), written with the lock released, and put
//! in memory once committed. Its event rides in the same commit. A reused lease's `last_used` is
//! changed in memory at once and written behind.

use std::time::{Duration, Instant};

use super::{lease_row, short, Acquired, Candidate, Inner, Key, LeaseError, Table};
use crate::logfmt::val;
use crate::store::{LeaseEvent, Reason, StoreError, Write};

/// Longest a request waits for another request's pending write on the same key.
const PENDING_WAIT: Duration = Duration::from_secs(30);
/// How far down the least-recently-used order eviction looks for a lease with nothing in flight.
const EVICT_SCAN: usize = 256;

/// What the rules decided under the lock.
enum Step {
    /// An existing lease serves; nothing to wait for.
    Done(Acquired),
    /// A lease to create or move: written first, then put in memory.
    Write {
        host: String,
        reason: Reason,
        from: String,
        reused: bool,
    },
}

impl Table {
    pub(super) fn acquire_inner(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
        inherit: bool,
    ) -> Result<Acquired, LeaseError> {
        let deadline = Instant::now() + PENDING_WAIT;
        let mut inner = self.lock();
        while inner.pending.contains_key(key) {
            if (self.shared.settled)
                .wait_until(&mut inner, deadline)
                .timed_out()
            {
                return Err(LeaseError::Store(StoreError::Stalled));
            }
        }
        let (host, reason, from, reused) =
            match self.decide(&mut inner, key, candidates, now, inherit)? {
                Step::Done(acquired) => return Ok(acquired),
                Step::Write {
                    host,
                    reason,
                    from,
                    reused,
                } => (host, reason, from, reused),
            };
        inner.pending.insert(key.clone(), host.clone());
        inner.count(&key.model, &host, 1);
        let ticket = self.persister.submit(vec![
            Write::SaveLease(lease_row(key, &host, now, now)),
            Write::Event(event(now, key, reason, &from, &host)),
        ]);
        drop(inner);
        let committed = ticket.wait();
        let mut inner = self.lock();
        inner.pending.remove(key);
        inner.count(&key.model, &host, -1);
        let result = match committed {
            Ok(()) => {
                inner.insert(key.clone(), host.clone(), now, now);
                log_change(key, reason, &from, &host);
                self.evict(&mut inner, now);
                Ok(Acquired { host, reused })
            }
            Err(err) => Err(LeaseError::Store(err)),
        };
        drop(inner);
        self.shared.settled.notify_all();
        result
    }

    /// Seed 000's rules in order, deciding without writing (a touch is written behind).
    fn decide(
        &self,
        inner: &mut Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
        inherit: bool,
    ) -> Result<Step, LeaseError> {
        // 1. A pin outranks everything, health included.
        if let Some(pin) = inner.pins.get(&key.route).cloned() {
            if !self.hosts.healthy(&pin) {
                return Err(LeaseError::PinnedDown { host: pin });
            }
            let from = match inner.leases.get(key) {
                Some(lease) if lease.host == pin => {
                    self.touch(inner, key, now);
                    return Ok(Step::Done(Acquired {
                        host: pin,
                        reused: true,
                    }));
                }
                Some(lease) => lease.host.clone(),
                None => String::new(),
            };
            let reason = if from.is_empty() {
                Reason::New
            } else {
                Reason::Pin
            };
            return Ok(Step::Write {
                host: pin,
                reason,
                from,
                reused: false,
            });
        }

        // 2. The key's own lease, on a healthy host (draining or not), stays put.
        let mut moving_from = None;
        if let Some(lease) = inner.leases.get(key) {
            if self.hosts.healthy(&lease.host) {
                let host = lease.host.clone();
                self.touch(inner, key, now);
                return Ok(Step::Done(Acquired { host, reused: true }));
            }
            moving_from = Some(lease.host.clone());
        }

        // 3. A new conversation follows its route's lease for the model: that cache is warm. A
        //    draining host gets no new leases, inherited ones included. Skipped when the route
        //    spreads new conversations instead.
        if inherit && moving_from.is_none() && !key.fp.is_empty() {
            let route_key = Key {
                route: key.route.clone(),
                fp: String::new(),
                model: key.model.clone(),
            };
            if let Some(parent) = inner.leases.get(&route_key) {
                if self.hosts.healthy(&parent.host) && !self.hosts.draining(&parent.host) {
                    return Ok(Step::Write {
                        host: parent.host.clone(),
                        reason: Reason::New,
                        from: String::new(),
                        reused: true,
                    });
                }
            }
        }

        // 4. Choose among usable candidates; nothing is created when there is none.
        let host = self.choose_locked(inner, key, candidates, moving_from.as_deref())?;
        Ok(Step::Write {
            host,
            reason: if moving_from.is_some() {
                Reason::Unhealthy
            } else {
                Reason::New
            },
            from: moving_from.unwrap_or_default(),
            reused: false,
        })
    }

    /// Where a request that holds no lease goes (metadata, see `proxy::route::is_metadata`): the
    /// route's pin (an error when it is down), else the key's own lease on a healthy host, else the
    /// chooser's pick. Reads only: nothing is created, touched or recorded.
    pub(super) fn lookup_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
    ) -> Result<String, LeaseError> {
        if let Some(pinned) = self.pinned_locked(inner, &key.route) {
            return pinned;
        }
        match inner.leases.get(key) {
            Some(lease) if self.hosts.healthy(&lease.host) => Ok(lease.host.clone()),
            _ => self.choose_locked(inner, key, candidates, None),
        }
    }

    /// The route's pin, when it has one: its host, or an error when that host is down (a pin
    /// outranks health: no silent move).
    fn pinned_locked(&self, inner: &Inner, route: &str) -> Option<Result<String, LeaseError>> {
        let pin = inner.pins.get(route)?;
        Some(if self.hosts.healthy(pin) {
            Ok(pin.clone())
        } else {
            Err(LeaseError::PinnedDown { host: pin.clone() })
        })
    }

    /// Where a stateless request goes (embeddings, rerank: no conversation, no lease): the
    /// route's pin (an error when it is down), else the chooser's pick — never a lease, not even
    /// the route-level one, so such requests spread over the hosts. Reads only.
    pub(super) fn place_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
    ) -> Result<String, LeaseError> {
        if let Some(pinned) = self.pinned_locked(inner, &key.route) {
            return pinned;
        }
        self.choose_locked(inner, key, candidates, None)
    }

    /// Rule 4's choice: the chooser's pick among healthy, non-draining candidates other than
    /// `excluded`, each offered with its lease count for the model (reservations included).
    fn choose_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
        excluded: Option<&str>,
    ) -> Result<String, LeaseError> {
        let usable: Vec<Candidate> = candidates
            .iter()
            .filter(|h| Some(h.as_str()) != excluded)
            .filter(|h| self.hosts.healthy(h) && !self.hosts.draining(h))
            .map(|h| Candidate {
                host: h.clone(),
                leases: inner.leases_of(&key.model, h),
                leased_models: inner.models_on(h),
            })
            .collect();
        match self.chooser.choose(&usable, &key.model) {
            Some(host) if usable.iter().any(|c| c.host == host) => Ok(host),
            Some(host) => {
                log::debug!(
                    "lease chooser picked a host it was not offered host={}",
                    val(&host)
                );
                Err(LeaseError::NoHost)
            }
            None => Err(LeaseError::NoHost),
        }
    }

    /// Writes `key`'s lease on `host` with its event and waits for the commit (lock held: for the
    /// rare changes that are not a request's first turn), then puts it in memory.
    pub(super) fn put(
        &self,
        inner: &mut Inner,
        key: &Key,
        host: &str,
        now: i64,
        reason: Reason,
        from: &str,
    ) -> Result<(), StoreError> {
        self.persister
            .submit(vec![
                Write::SaveLease(lease_row(key, host, now, now)),
                Write::Event(event(now, key, reason, from, host)),
            ])
            .wait()?;
        inner.insert(key.clone(), host.to_string(), now, now);
        log_change(key, reason, from, host);
        Ok(())
    }

    /// Deletes `key`'s lease (or pin row) with its event and waits (lock held), then forgets it.
    /// Returns the host it was on.
    pub(super) fn drop_written(
        &self,
        inner: &mut Inner,
        key: &Key,
        now: i64,
        reason: Reason,
        to: &str,
    ) -> Result<Option<String>, StoreError> {
        let Some(from) = inner.leases.get(key).map(|e| e.host.clone()) else {
            return Ok(None);
        };
        self.persister
            .submit(vec![
                delete(key),
                Write::Event(event(now, key, reason, &from, to)),
            ])
            .wait()?;
        inner.remove(key);
        log_change(key, reason, &from, to);
        Ok(Some(from))
    }

    /// A later `last_used` in memory now; [`Table::flush_touches`] writes it behind.
    fn touch(&self, inner: &mut Inner, key: &Key, now: i64) {
        inner.touch(key, now);
    }

    /// Over `max_leases`: drops the least recently used leases with no request in flight and no
    /// write pending (event `evicted`), written as one job nobody waits for: a lost delete only
    /// leaves a row that the next start loads and evicts again.
    fn evict(&self, inner: &mut Inner, now: i64) {
        let mut writes = Vec::new();
        while inner.leases.len() > inner.max_leases {
            let victim = (inner.by_use.iter())
                .take(EVICT_SCAN)
                .map(|(_, k)| k)
                .find(|k| {
                    !inner.pending.contains_key(&***k)
                        && inner.leases.get(&***k).is_some_and(|e| e.in_flight == 0)
                })
                .cloned();
            let Some(victim) = victim else {
                log::warn!(
                    "lease table over max_leases with no idle lease to evict leases={}",
                    inner.leases.len()
                );
                break;
            };
            if let Some(old) = inner.remove(&victim) {
                writes.push(delete(&victim));
                let ev = event(now, &victim, Reason::Evicted, &old.host, "");
                writes.push(Write::Event(ev));
                log_change(&victim, Reason::Evicted, &old.host, "");
            }
        }
        if !writes.is_empty() {
            drop(self.persister.submit(writes));
        }
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
