//! Changes that do not come from a request: an operator's pins and releases, idle expiry, and a
//! config reload dropping a host. Operator changes are rare: each step is written and committed
//! with the lock held, and if a step fails the error is returned with memory holding exactly the
//! steps that were written. Idle expiry touches many leases, so it works in batches with the lock
//! released while each batch commits.

use std::time::Instant;

use super::acquire::{delete, describe, event, log_change};
use super::{Key, LeaseError, Table};
use crate::logfmt::val;
use crate::store::{LeaseRow, LeaseState, Reason, Write};

/// Most leases expired in one transaction; the lock is free between batches.
pub const SWEEP_BATCH: usize = 1_000;
/// Leases forgotten from memory per turn of the lock after a batch committed.
const FORGET_CHUNK: usize = 100;

impl Table {
    /// Drops every lease (never a pin) unused for longer than the idle time, oldest first, in
    /// batches of at most [`SWEEP_BATCH`]: each batch is reserved under the lock, committed with
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
                .take(SWEEP_BATCH)
                .filter_map(|(_, k)| Some((Key::clone(k), inner.leases.get(k)?.host.clone())))
                .collect();
            if stale.is_empty() {
                break;
            }
            for (key, _) in &stale {
                inner.pending.insert(key.clone(), String::new());
            }
            drop(inner);
            // Reserved keys are written by nobody else, so their writes may be built and queued
            // with the lock free.
            let mut writes = Vec::with_capacity(stale.len() * 2);
            for (key, host) in &stale {
                writes.push(delete(key));
                writes.push(Write::Event(event(now, key, Reason::Idle, host, "")));
            }
            let committed = self.persister.submit(writes).wait();
            // Forgotten in small chunks, the lock free between them: a request never waits
            // behind a thousand removals.
            for chunk in stale.chunks(FORGET_CHUNK) {
                let mut inner = self.lock();
                for (key, host) in chunk {
                    inner.pending.remove(key);
                    if committed.is_ok() {
                        inner.remove(key);
                        log_change(key, Reason::Idle, host, "");
                    }
                }
                drop(inner);
                self.shared.settled.notify_all();
            }
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
    /// Leases of the route on other hosts are dropped; returns how many.
    pub fn pin(&self, route: &str, host: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.lock();
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
            let from = previous.as_deref().unwrap_or("");
            let key = pin_key(route);
            self.persister
                .submit(vec![
                    Write::SaveLease(row),
                    Write::Event(event(now, &key, Reason::Pin, from, host)),
                ])
                .wait()?;
            inner.pins.insert(route.to_string(), host.to_string());
            log_change(&key, Reason::Pin, from, host);
        }
        let elsewhere: Vec<Key> = (inner.route_keys(route).into_iter())
            .filter(|k| inner.leases.get(k).is_some_and(|e| e.host != host))
            .collect();
        for key in &elsewhere {
            self.drop_written(&mut inner, key, now, Reason::Pin, host)?;
        }
        Ok(elsewhere.len())
    }

    /// Removes the route's pin (its leases stay where they are); returns whether it was pinned.
    pub fn unpin(&self, route: &str, now: i64) -> Result<bool, LeaseError> {
        let mut inner = self.lock();
        let Some(host) = inner.pins.get(route).cloned() else {
            return Ok(false);
        };
        let key = pin_key(route);
        self.unpin_written(&mut inner, &key, &host, now, Reason::Release)?;
        Ok(true)
    }

    /// Drops every lease of `route` (the pin stays); returns how many.
    pub fn release(&self, route: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.lock();
        let keys = inner.route_keys(route);
        for key in &keys {
            self.drop_written(&mut inner, key, now, Reason::Release, "")?;
        }
        Ok(keys.len())
    }

    /// A config reload removed `host`: its leases and any pin to it go (event `removed`), and it is
    /// no longer a known host for pins. Returns how many rows (leases and pins) were dropped.
    pub fn drop_host(&self, host: &str, now: i64) -> Result<usize, LeaseError> {
        let mut inner = self.lock();
        let pinned: Vec<String> = inner
            .pins
            .iter()
            .filter(|(_, h)| *h == host)
            .map(|(r, _)| r.clone())
            .collect();
        let leased: Vec<Key> = (inner.leases.iter())
            .filter(|(_, e)| e.host == host)
            .map(|(k, _)| Key::clone(k))
            .collect();
        for route in &pinned {
            self.unpin_written(&mut inner, &pin_key(route), host, now, Reason::Removed)?;
        }
        for key in &leased {
            self.drop_written(&mut inner, key, now, Reason::Removed, "")?;
        }
        for seen in inner.seen.values_mut() {
            seen.remove(host);
        }
        Ok(pinned.len() + leased.len())
    }

    fn unpin_written(
        &self,
        inner: &mut super::Inner,
        key: &Key,
        host: &str,
        now: i64,
        reason: Reason,
    ) -> Result<(), LeaseError> {
        self.persister
            .submit(vec![
                delete(key),
                Write::Event(event(now, key, reason, host, "")),
            ])
            .wait()?;
        inner.pins.remove(&key.route);
        log_change(key, reason, host, "");
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
