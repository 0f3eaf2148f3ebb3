//! Changes that do not come from a request: an operator's pins and releases, idle expiry, and a
//! config reload dropping a host. Each is a sequence of write-through steps; if a step fails, the
//! error is returned and memory holds exactly the steps that were written.

use super::{chain, short, Key, LeaseError, Table};
use crate::logfmt::val;
use crate::store::{LeaseRow, LeaseState, Reason};

impl Table {
    /// Drops every lease (never a pin) unused for longer than the idle time; returns how many.
    /// A lease whose delete fails is kept, logged, and tried again next time.
    pub fn expire_idle(&self, now: i64) -> usize {
        let mut inner = self.inner.lock();
        let idle = i64::try_from(inner.idle.as_millis()).unwrap_or(i64::MAX);
        let stale: Vec<Key> = inner
            .leases
            .values()
            .filter(|l| now.saturating_sub(l.last_used) > idle)
            .map(|l| l.key.clone())
            .collect();
        let mut dropped = 0;
        for key in stale {
            match self.remove(&mut inner, &key) {
                Ok(Some(old)) => {
                    self.note(now, &key, Reason::Idle, &old.host, "");
                    dropped += 1;
                }
                Ok(None) => {}
                Err(e) => log::warn!(
                    "lease expiry failed route={} fp={} model={} error={}",
                    val(&key.route),
                    val(short(&key.fp)),
                    val(&key.model),
                    val(&chain(&e))
                ),
            }
        }
        dropped
    }

    /// Pins `route` to `host`: the next turn of every conversation of the route lands there.
    /// Leases of the route on other hosts are dropped; returns how many.
    pub fn pin(&self, route: &str, host: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.inner.lock();
        let known = inner.seen.get(route).is_some_and(|s| s.contains(host));
        if !known {
            return Err(LeaseError::UnknownHost {
                host: host.to_string(),
            });
        }
        let previous = inner.pins.get(route).cloned();
        if previous.as_deref() != Some(host) {
            let row = LeaseRow {
                route: route.to_string(),
                fp: String::new(),
                model: String::new(),
                host: host.to_string(),
                state: LeaseState::Pinned,
                created: now,
                last_used: now,
            };
            self.persister.save_lease(&row)?;
            inner.pins.insert(route.to_string(), host.to_string());
            self.note(
                now,
                &pin_key(route),
                Reason::Pin,
                previous.as_deref().unwrap_or(""),
                host,
            );
        }
        let elsewhere: Vec<Key> = inner
            .route_leases(route)
            .filter(|l| l.host != host)
            .map(|l| l.key.clone())
            .collect();
        for key in &elsewhere {
            if let Some(old) = self.remove(&mut inner, key)? {
                self.note(now, key, Reason::Pin, &old.host, host);
            }
        }
        Ok(elsewhere.len())
    }

    /// Removes the route's pin (its leases stay where they are); returns whether it was pinned.
    pub fn unpin(&self, route: &str, now: i64) -> Result<bool, LeaseError> {
        let mut inner = self.inner.lock();
        let Some(host) = inner.pins.get(route).cloned() else {
            return Ok(false);
        };
        self.persister.delete_lease(route, "", "")?;
        inner.pins.remove(route);
        self.note(now, &pin_key(route), Reason::Release, &host, "");
        Ok(true)
    }

    /// Drops every lease of `route` (the pin stays); returns how many.
    pub fn release(&self, route: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.inner.lock();
        let keys: Vec<Key> = inner.route_leases(route).map(|l| l.key.clone()).collect();
        for key in &keys {
            if let Some(old) = self.remove(&mut inner, key)? {
                self.note(now, key, Reason::Release, &old.host, "");
            }
        }
        Ok(keys.len())
    }

    /// A config reload removed `host`: its leases and any pin to it go (event `removed`), and it is
    /// no longer a known host for pins. Returns how many rows (leases and pins) were dropped.
    pub fn drop_host(&self, host: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.inner.lock();
        let pinned: Vec<String> = inner
            .pins
            .iter()
            .filter(|(_, h)| *h == host)
            .map(|(r, _)| r.clone())
            .collect();
        let leased: Vec<Key> = inner
            .leases
            .values()
            .filter(|l| l.host == host)
            .map(|l| l.key.clone())
            .collect();
        for route in &pinned {
            self.persister.delete_lease(route, "", "")?;
            inner.pins.remove(route);
            self.note(now, &pin_key(route), Reason::Removed, host, "");
        }
        for key in &leased {
            if self.remove(&mut inner, key)?.is_some() {
                self.note(now, key, Reason::Removed, host, "");
            }
        }
        for seen in inner.seen.values_mut() {
            seen.remove(host);
        }
        Ok(pinned.len() + leased.len())
    }
}

fn pin_key(route: &str) -> Key {
    Key {
        route: route.to_string(),
        fp: String::new(),
        model: String::new(),
    }
}
