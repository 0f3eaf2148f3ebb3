//! Changes that do not come from a request: an operator's pins and releases, idle expiry, and a
//! config reload dropping a host. None holds the table's lock while the store commits (see
//! `write`): a pin row is committed, then put in memory; leases are dropped in batches of at most
//! [`DROP_BATCH`], each reserved, committed and forgotten, so a request for one of them waits and
//! every other request goes on. If a step fails its error is returned, memory holding exactly the
//! steps written. Operator changes take the table's operator lock for their whole length, so two
//! never interleave.

use std::time::Instant;

use super::write::{delete, describe, event, log_change, DROP_BATCH};
use super::{Key, LeaseError, Table};
use crate::logfmt::val;
use crate::store::{LeaseRow, LeaseState, Reason, Write};

impl Table {
    /// Drops every lease (never a pin) unused for longer than the idle time, oldest first, in
    /// batches of at most [`DROP_BATCH`]: each batch is reserved under the lock, committed with
    /// the lock released (a request for one of its leases waits; every other request goes on),
    /// then forgotten. Logs one summary line; returns how many were dropped.
    pub fn expire_idle(&self, now: i64) -> usize {
        let started = Instant::now();
        let (mut dropped, mut batches) = (0, 0);
        loop {
            let mut inner = self.lock();
            let idle = i64::try_from(inner.idle.as_millis()).unwrap_or(i64::MAX);
            let stale: Vec<(Key, String)> = (inner.by_use.iter())
                .take_while(|(used, _)| now.saturating_sub(*used) > idle)
                .filter(|(_, k)| !inner.pending.contains_key(&**k))
                .take(DROP_BATCH)
                .filter_map(|(_, k)| Some((Key::clone(k), inner.leases.get(k)?.host.clone())))
                .collect();
            if stale.is_empty() {
                break;
            }
            for (key, _) in &stale {
                inner.pending.insert(key.clone(), String::new());
            }
            drop(inner);
            let committed = self.drop_reserved(&stale, now, Reason::Idle, "");
            if let Err(err) = committed {
                log::warn!(
                    "lease expiry failed; kept for the next sweep leases={} error={}",
                    stale.len(),
                    val(&describe(&err))
                );
                break;
            }
            dropped += stale.len();
            batches += 1;
        }
        if dropped > 0 {
            log::info!(
                "leases expired count={dropped} batches={batches} ms={}",
                started.elapsed().as_millis()
            );
        }
        dropped
    }

    /// Pins `route` to `host`: the next turn of every conversation of the route lands there.
    /// Leases of the route on other hosts are dropped (after the pin is written); returns how many.
    pub fn pin(&self, route: &str, host: &str, now: i64) -> Result<usize, LeaseError> {
        let _operator = self.operator.lock();
        let inner = self.lock();
        let known = inner.seen.get(route).is_some_and(|s| s.contains(host));
        if !known {
            return Err(LeaseError::UnknownHost {
                host: host.to_string(),
            });
        }
        let previous = inner.pins.get(route).cloned();
        drop(inner);
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
            let from = previous.as_deref().unwrap_or("");
            let key = pin_key(route);
            let writes = vec![
                Write::SaveLease(row),
                Write::Event(event(now, &key, Reason::Pin, from, host)),
            ];
            self.commit_then(writes, |inner| {
                inner.pins.insert(route.to_string(), host.to_string());
            })?;
            log_change(&key, Reason::Pin, from, host);
        }
        let elsewhere = self.route_leases(route, |h| h != host);
        Ok(self.drop_leases(&elsewhere, |h| h != host, now, Reason::Pin, host)?)
    }

    /// Removes the route's pin (its leases stay where they are); returns whether it was pinned.
    pub fn unpin(&self, route: &str, now: i64) -> Result<bool, LeaseError> {
        let _operator = self.operator.lock();
        let Some(host) = self.lock().pins.get(route).cloned() else {
            return Ok(false);
        };
        self.unpin_written(&[route.to_string()], &host, now, Reason::Release)?;
        Ok(true)
    }

    /// Drops every lease of `route` (the pin stays); returns how many.
    pub fn release(&self, route: &str, now: i64) -> Result<usize, LeaseError> {
        let _operator = self.operator.lock();
        let keys = self.route_leases(route, |_| true);
        Ok(self.drop_leases(&keys, |_| true, now, Reason::Release, "")?)
    }

    /// A config reload removed `host`: its leases and any pin to it go (event `removed`), and it is
    /// no longer a known host for pins. Returns how many rows (leases and pins) were dropped.
    pub fn drop_host(&self, host: &str, now: i64) -> Result<usize, LeaseError> {
        let _operator = self.operator.lock();
        let mut inner = self.lock();
        // A write still landing on the host (or dropping a lease of it) is waited for first.
        self.settle(&mut inner, |inner| {
            (inner.pending.iter())
                .any(|(k, to)| to == host || inner.leases.get(k).is_some_and(|e| e.host == host))
        })?;
        let pinned: Vec<String> = (inner.pins.iter())
            .filter(|(_, h)| *h == host)
            .map(|(r, _)| r.clone())
            .collect();
        let leased: Vec<Key> = (inner.leases.iter())
            .filter(|(_, e)| e.host == host)
            .map(|(k, _)| Key::clone(k))
            .collect();
        drop(inner);
        if !pinned.is_empty() {
            self.unpin_written(&pinned, host, now, Reason::Removed)?;
        }
        let dropped = self.drop_leases(&leased, |h| h == host, now, Reason::Removed, "")?;
        for seen in self.lock().seen.values_mut() {
            seen.remove(host);
        }
        Ok(pinned.len() + dropped)
    }

    /// The leases of `route` whose host passes `keep`, as the table holds them now. A new lease
    /// still being written is not among them: it counts as made after this change (and a pin
    /// moves it at its next turn). Not waiting for the route to be quiet means a busy route can
    /// never starve an operator.
    fn route_leases(&self, route: &str, keep: impl Fn(&str) -> bool) -> Vec<Key> {
        let inner = self.lock();
        (inner.route_keys(route).into_iter())
            .filter(|k| inner.leases.get(k).is_some_and(|e| keep(&e.host)))
            .collect()
    }

    /// Deletes the pins of `routes` (all to `host`) with their events in one commit.
    fn unpin_written(
        &self,
        routes: &[String],
        host: &str,
        now: i64,
        reason: Reason,
    ) -> Result<(), LeaseError> {
        let keys: Vec<Key> = routes.iter().map(|r| pin_key(r)).collect();
        let writes = (keys.iter())
            .flat_map(|key| [delete(key), Write::Event(event(now, key, reason, host, ""))])
            .collect();
        self.commit_then(writes, |inner| {
            for route in routes {
                inner.pins.remove(route);
            }
        })?;
        for key in &keys {
            log_change(key, reason, host, "");
        }
        Ok(())
    }
}

fn pin_key(route: &str) -> Key {
    Key {
        route: route.to_string(),
        fp: String::new(),
        model: String::new(),
    }
}
