//! The host health table: who is up, why a host is down, its per-slot context and loaded models.
//!
//! [`Health`] is written by the poller ([`Poller`], one thread per host, in `health/poll.rs`) and
//! by the proxy when a forward fails ([`Health::mark_down`]); everyone else reads it. Updates take
//! `now` as a parameter and log only transitions. The table itself does no I/O, and no lock is
//! held while a host is polled: a poll result is computed first, then applied in one short step.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use parking_lot::Mutex;

use crate::config;

mod poll;

pub use poll::{agent, parse_models, parse_props, poll_host, ParseError, Poller};

/// Why a host is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    /// No answer: connection refused, reset or timed out.
    Unreachable,
    /// The host answered 503: llama-server is loading its model.
    Loading,
    /// An answer crossbar cannot use: unexpected status or malformed JSON.
    BadAnswer,
    /// A forward to the host failed before the response head.
    ForwardFailed,
}

impl DownReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DownReason::Unreachable => "unreachable",
            DownReason::Loading => "loading",
            DownReason::BadAnswer => "bad answer",
            DownReason::ForwardFailed => "forward failed",
        }
    }
}

impl fmt::Display for DownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What crossbar knows about one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    pub healthy: bool,
    /// Set exactly when `healthy` is false.
    pub reason: Option<DownReason>,
    /// Unix ms of the last up/down flip; 0 when the host never flipped since start.
    pub since: i64,
    /// The config's `ctx` override when set, else `/props` `default_generation_settings.n_ctx`;
    /// `None` while unknown.
    pub per_slot_ctx: Option<u64>,
    /// `/props` `total_slots`; `None` while unknown.
    pub total_slots: Option<u64>,
    /// Model ids and aliases the host reports loaded (emptied when it goes down).
    pub loaded: Vec<String>,
    /// Unix ms of the last poll applied; 0 before the first.
    pub last_poll: i64,
}

/// The outcome of polling one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    Up {
        per_slot_ctx: Option<u64>,
        total_slots: Option<u64>,
        loaded: Vec<String>,
    },
    Down(DownReason),
}

/// The shared health table. Share it behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Health {
    inner: Mutex<Inner>,
}

impl Health {
    /// Every host starts healthy (reason `None`) until a poll or a forward failure says otherwise.
    pub fn new(hosts: &BTreeMap<String, config::Host>) -> Health {
        let health = Health {
            inner: Mutex::new(Inner {
                hosts: HashMap::new(),
            }),
        };
        health.set_hosts(hosts);
        health
    }

    /// Reload: adds new hosts (healthy), forgets removed ones, keeps the status of kept hosts and
    /// takes their new `ctx` override and model list.
    pub fn set_hosts(&self, hosts: &BTreeMap<String, config::Host>) {
        let mut inner = self.inner.lock();
        inner.hosts.retain(|name, _| hosts.contains_key(name));
        for (name, host) in hosts {
            let entry = inner.hosts.entry(name.clone()).or_insert_with(Entry::fresh);
            entry.ctx_override = host.ctx;
            entry.models = host.models.keys().cloned().collect();
            entry.parallel = host.models.values().sum();
            entry.status.per_slot_ctx = host.ctx.or(entry.polled_ctx);
        }
    }

    pub fn get(&self, host: &str) -> Option<HostStatus> {
        self.inner.lock().hosts.get(host).map(|e| e.status.clone())
    }

    /// False for a host that is down or unknown.
    pub fn healthy(&self, host: &str) -> bool {
        self.inner
            .lock()
            .hosts
            .get(host)
            .is_some_and(|e| e.status.healthy)
    }

    pub fn per_slot_ctx(&self, host: &str) -> Option<u64> {
        self.inner
            .lock()
            .hosts
            .get(host)
            .and_then(|e| e.status.per_slot_ctx)
    }

    /// Whether `host` has `model` loaded: an id or alias it reports equals the model name, or the
    /// host configures that one model only and reports exactly one loaded.
    pub fn is_loaded(&self, host: &str, model: &str) -> bool {
        let inner = self.inner.lock();
        let Some(entry) = inner.hosts.get(host) else {
            return false;
        };
        let loaded = &entry.status.loaded;
        loaded.iter().any(|id| id == model)
            || (entry.models.len() == 1 && entry.models[0] == model && loaded.len() == 1)
    }

    /// A forward failed: the host is down at once, until the next good poll. Returns whether this
    /// was a transition (and so was logged).
    pub fn mark_down(&self, host: &str, reason: DownReason, now: i64) -> bool {
        let mut inner = self.inner.lock();
        let Some(entry) = inner.hosts.get_mut(host) else {
            return false;
        };
        entry.down(host, reason, now)
    }

    /// Applies a poll result. Returns whether the host flipped up or down, or changed its down
    /// reason (only those are logged). Unknown hosts (removed by a reload) are ignored.
    pub fn apply(&self, host: &str, poll: Poll, now: i64) -> bool {
        let mut inner = self.inner.lock();
        let Some(entry) = inner.hosts.get_mut(host) else {
            return false;
        };
        let first = entry.status.last_poll == 0;
        entry.status.last_poll = now;
        match poll {
            Poll::Down(reason) => entry.down(host, reason, now),
            Poll::Up {
                per_slot_ctx,
                total_slots,
                loaded,
            } => {
                entry.polled_ctx = per_slot_ctx;
                let status = &mut entry.status;
                status.per_slot_ctx = entry.ctx_override.or(per_slot_ctx);
                status.total_slots = total_slots;
                status.loaded = loaded;
                let flipped = !status.healthy;
                status.healthy = true;
                status.reason = None;
                if flipped {
                    status.since = now;
                }
                // Every host's first poll says what it found, so the start of the log shows each
                // host's state, slots and context; later only flips are logged.
                if first || flipped {
                    let known = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
                    log::info!(
                        "host up host={host} ctx={} slots={} parallel={} loaded={}",
                        known(status.per_slot_ctx),
                        known(status.total_slots),
                        entry.parallel,
                        crate::logfmt::val(&status.loaded.join(","))
                    );
                }
                flipped
            }
        }
    }
}

/// Invariants: `hosts` holds exactly the configured hosts; for each, `status.reason.is_some()`
/// iff `!status.healthy`, and `status.per_slot_ctx == ctx_override.or(polled_ctx)`.
#[derive(Debug)]
struct Inner {
    hosts: HashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    status: HostStatus,
    /// The config's `ctx` for this host.
    ctx_override: Option<u64>,
    /// The per-slot context the last good poll reported.
    polled_ctx: Option<u64>,
    /// The models the config lists for this host, sorted.
    models: Vec<String>,
    /// The slots the config gives this host, all models together.
    parallel: usize,
}

impl Entry {
    fn fresh() -> Entry {
        Entry {
            status: HostStatus {
                healthy: true,
                reason: None,
                since: 0,
                per_slot_ctx: None,
                total_slots: None,
                loaded: Vec::new(),
                last_poll: 0,
            },
            ctx_override: None,
            polled_ctx: None,
            models: Vec::new(),
            parallel: 0,
        }
    }

    /// Marks the entry down; logs and returns true when that changes what an operator sees.
    fn down(&mut self, host: &str, reason: DownReason, now: i64) -> bool {
        let status = &mut self.status;
        // A down host's loaded list is stale: it may come back having loaded something else.
        status.loaded.clear();
        if status.reason == Some(reason) {
            return false;
        }
        if status.healthy {
            status.healthy = false;
            status.since = now;
        }
        status.reason = Some(reason);
        log::info!(
            "host down host={host} reason={}",
            crate::logfmt::val(reason.as_str())
        );
        true
    }
}

#[cfg(test)]
mod tests;
