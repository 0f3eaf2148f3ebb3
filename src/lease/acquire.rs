//! The lease decision (seed 000's four rules) and the places a request without a lease goes. A
//! new or moved lease is decided under the lock and then written the way `write` writes every
//! change: reserved (so a concurrent turn of the same conversation waits for it and the chooser
//! counts it), committed with the lock released, put in memory. A reused lease's `last_used` is
//! changed in memory at once and written behind.

use std::sync::Arc;

use super::{Acquired, Candidate, Hold, Inner, Key, LeaseError, Table};
use crate::logfmt::val;
use crate::store::Reason;

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
    /// Seed 000's rules, then the write a new or moved lease needs. `candidates` are remembered
    /// as seen for the route in the same turn of the lock, unless a write failed; with `hold`,
    /// the request is marked in flight on its lease in that turn too (no moment unheld).
    pub(super) fn acquire_inner(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
        inherit: bool,
        hold: bool,
    ) -> Result<(Acquired, Option<Hold>), LeaseError> {
        let mut inner = self.lock();
        self.settle_key(&mut inner, key)?;
        let step = self.decide(&mut inner, key, candidates, now, inherit);
        if !matches!(step, Ok(Step::Write { .. })) {
            inner.see_all(&key.route, candidates);
        }
        let held = match step? {
            Step::Done(acquired) => {
                let held = if hold { inner.hold(key) } else { None };
                return Ok((acquired, self.hold_of(held)));
            }
            Step::Write {
                host,
                reason,
                from,
                reused,
            } => {
                let mut held = None;
                self.put_reserved(inner, key, &host, now, reason, &from, |inner| {
                    inner.see_all(&key.route, candidates);
                    if hold {
                        held = inner.hold(key);
                    }
                })?;
                (Acquired { host, reused }, held)
            }
        };
        Ok((held.0, self.hold_of(held.1)))
    }

    fn hold_of(&self, key: Option<Arc<Key>>) -> Option<Hold> {
        key.map(|key| Hold {
            shared: self.shared.clone(),
            key,
        })
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
                    inner.touch(key, now);
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
                inner.touch(key, now);
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
}
