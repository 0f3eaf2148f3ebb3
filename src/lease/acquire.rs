//! The lease decision (seed 000's four rules) and the write-through steps every change is made
//! of. Each step writes through the persister first and changes memory only if the write
//! succeeded; an event is the audit trail of a change already made, so an event that cannot be
//! written is logged, not returned (returning it would fail a request whose lease is in place).

use super::{chain, short, Acquired, Candidate, Inner, Key, Lease, LeaseError, Table};
use crate::logfmt::val;
use crate::store::{LeaseEvent, Reason, StoreError};

impl Table {
    pub(super) fn acquire_locked(
        &self,
        inner: &mut Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
        inherit: bool,
    ) -> Result<Acquired, LeaseError> {
        // 1. A pin outranks everything, health included.
        if let Some(pin) = inner.pins.get(&key.route).cloned() {
            if !self.hosts.healthy(&pin) {
                return Err(LeaseError::PinnedDown { host: pin });
            }
            let from = match inner.leases.get(key) {
                Some(lease) if lease.host == pin => {
                    self.touch(inner, key, now)?;
                    return Ok(Acquired {
                        host: pin,
                        reused: true,
                    });
                }
                Some(lease) => lease.host.clone(),
                None => String::new(),
            };
            self.put(inner, Lease::fresh(key, &pin, now))?;
            let reason = if from.is_empty() {
                Reason::New
            } else {
                Reason::Pin
            };
            self.note(now, key, reason, &from, &pin);
            return Ok(Acquired {
                host: pin,
                reused: false,
            });
        }

        // 2. The key's own lease, on a healthy host (draining or not), stays put.
        let mut moving_from = None;
        if let Some(lease) = inner.leases.get(key) {
            if self.hosts.healthy(&lease.host) {
                let host = lease.host.clone();
                self.touch(inner, key, now)?;
                return Ok(Acquired { host, reused: true });
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
                    let host = parent.host.clone();
                    self.put(inner, Lease::fresh(key, &host, now))?;
                    self.note(now, key, Reason::New, "", &host);
                    return Ok(Acquired { host, reused: true });
                }
            }
        }

        // 4. Choose among usable candidates; nothing is created when there is none.
        let host = self.choose_locked(inner, key, candidates, moving_from.as_deref())?;
        self.put(inner, Lease::fresh(key, &host, now))?;
        match moving_from {
            Some(from) => self.note(now, key, Reason::Unhealthy, &from, &host),
            None => self.note(now, key, Reason::New, "", &host),
        }
        Ok(Acquired {
            host,
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
        if let Some(pin) = inner.pins.get(&key.route) {
            if !self.hosts.healthy(pin) {
                return Err(LeaseError::PinnedDown { host: pin.clone() });
            }
            return Ok(pin.clone());
        }
        match inner.leases.get(key) {
            Some(lease) if self.hosts.healthy(&lease.host) => Ok(lease.host.clone()),
            _ => self.choose_locked(inner, key, candidates, None),
        }
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
        if let Some(pin) = inner.pins.get(&key.route) {
            if !self.hosts.healthy(pin) {
                return Err(LeaseError::PinnedDown { host: pin.clone() });
            }
            return Ok(pin.clone());
        }
        self.choose_locked(inner, key, candidates, None)
    }

    /// Rule 4's choice: the chooser's pick among healthy, non-draining candidates other than
    /// `excluded`, each offered with its lease count for the model.
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
            .map(|h| {
                let mut leased_models: Vec<String> = (inner.leases.values())
                    .filter(|l| l.host == *h)
                    .map(|l| l.key.model.clone())
                    .collect();
                leased_models.sort();
                leased_models.dedup();
                Candidate {
                    host: h.clone(),
                    leases: (inner.leases.values())
                        .filter(|l| l.host == *h && l.key.model == key.model)
                        .count(),
                    leased_models,
                }
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

    /// Saves `lease`, then puts it in memory (replacing the key's previous lease).
    pub(super) fn put(&self, inner: &mut Inner, lease: Lease) -> Result<(), StoreError> {
        self.persister.save_lease(&lease.row())?;
        inner.leases.insert(lease.key.clone(), lease);
        Ok(())
    }

    /// Deletes `key`'s lease, then forgets it; returns what it was.
    pub(super) fn remove(&self, inner: &mut Inner, key: &Key) -> Result<Option<Lease>, StoreError> {
        if !inner.leases.contains_key(key) {
            return Ok(None);
        }
        self.persister
            .delete_lease(&key.route, &key.fp, &key.model)?;
        Ok(inner.leases.remove(key))
    }

    /// Saves a later `last_used` for an existing lease (never an earlier one: concurrent requests
    /// may arrive with their `now`s out of order).
    fn touch(&self, inner: &mut Inner, key: &Key, now: i64) -> Result<(), StoreError> {
        let Some(lease) = inner.leases.get(key) else {
            return Ok(());
        };
        let touched = Lease {
            last_used: lease.last_used.max(now),
            ..lease.clone()
        };
        self.put(inner, touched)
    }

    /// Records and logs an event about a change already made.
    pub(super) fn note(&self, at: i64, key: &Key, reason: Reason, from: &str, to: &str) {
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
        if reason == Reason::New {
            log::debug!("{line}");
        } else {
            log::info!("{line}");
        }
        let ev = LeaseEvent {
            id: 0,
            at,
            route: key.route.clone(),
            fp: key.fp.clone(),
            model: key.model.clone(),
            reason,
            from_host: from.to_string(),
            to_host: to.to_string(),
        };
        if let Err(e) = self.persister.record_event(&ev) {
            log::warn!(
                "lease event not recorded route={} reason={reason} error={}",
                val(&key.route),
                val(&chain(&e))
            );
        }
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}
