//! The host health table: who is up, why a host is down, its per-slot context and loaded models.
//!
//! [`Health`] is written by the poller ([`Poller`], one thread per host, in `health/poll.rs`) and
//! by the proxy when a forward fails ([`Health::mark_down`]); everyone else reads it. Updates take
//! `now` as a parameter and log only transitions. The table itself does no I/O, and no lock is
//! held while a host is polled: a poll result is computed first, then applied in one short step.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::config;
use crate::logfmt::val;

mod answers;
mod poll;
mod reason;
mod router;

pub use poll::{agent, parse_models, parse_props, poll_host, ParseError, Poller};
pub use reason::{error_chain, DownReason};
pub use router::RouterModel;

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
    /// The host is a llama-server in router mode (its model list carries a `status` per model):
    /// asking it about a model that is not loaded would load it.
    pub router: bool,
    /// A router's models with their state and per-slot context (empty for a single-model host).
    pub models: Vec<RouterModel>,
    /// A router's `max_instances` (`--models-max`): models it keeps loaded at once.
    pub max_instances: Option<u64>,
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
        router: bool,
        models: Vec<RouterModel>,
        max_instances: Option<u64>,
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
            entry.upstream = host.upstream.clone();
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

    /// The per-slot context a request for `model` gets on `host`: the config's `ctx` when set; on
    /// a router, that model's own (from its command line, see [`RouterModel`]); else the host's.
    /// `None` (and never 0) while unknown.
    pub fn ctx_for(&self, host: &str, model: &str) -> Option<u64> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        let ctx = match (entry.ctx_override, entry.status.router) {
            (Some(ctx), _) => Some(ctx),
            (None, true) => entry.router_model(model).and_then(|m| m.per_slot_ctx),
            (None, false) => entry.status.per_slot_ctx,
        };
        ctx.filter(|c| *c > 0)
    }

    /// Whether `host` has `model` loaded: an id or alias it reports equals the model's name there
    /// (its `upstream`, else its own), or the host is no router, configures that one model only
    /// and reports exactly one loaded.
    pub fn is_loaded(&self, host: &str, model: &str) -> bool {
        let inner = self.inner.lock();
        let Some(entry) = inner.hosts.get(host) else {
            return false;
        };
        let loaded = &entry.status.loaded;
        let name = entry.known_as(model);
        loaded.iter().any(|id| id == name)
            || (!entry.status.router
                && entry.models.len() == 1
                && entry.models[0] == model
                && loaded.len() == 1)
    }

    /// A router's word on `model`: `loaded`, `loading`, `unloaded`, `sleeping`...; `None` on a
    /// single-model host or for a model the router does not list.
    pub fn model_state(&self, host: &str, model: &str) -> Option<String> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        entry.router_model(model).map(|m| m.state.clone())
    }

    /// A router at its `--models-max`: the configured models it has loaded now (by their
    /// configured names). `None` when loading another model evicts nothing: a single-model host,
    /// a router below its maximum, or one whose maximum is unknown.
    pub fn full_router(&self, host: &str) -> Option<Vec<String>> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        let status = &entry.status;
        let max = status.max_instances.filter(|m| *m > 0)?;
        let loaded = status.models.iter().filter(|m| m.state == "loaded").count();
        if !status.router || (loaded as u64) < max {
            return None;
        }
        let configured = (entry.models.iter())
            .filter(|m| entry.router_model(m).is_some_and(|r| r.state == "loaded"))
            .cloned()
            .collect();
        Some(configured)
    }

    /// How often the polls saw a router unload `model` (evicted by `--models-max`, or unloaded
    /// by hand); 0 for a single-model host. A conversation whose turns straddle an unload lost its
    /// cache.
    pub fn unloads(&self, host: &str, model: &str) -> u64 {
        let inner = self.inner.lock();
        let Some(entry) = inner.hosts.get(host) else {
            return 0;
        };
        let id = entry.router_model(model).and_then(|m| m.names.first());
        id.and_then(|id| entry.unloads.get(id))
            .copied()
            .unwrap_or(0)
    }

    /// Whether `host` may be asked about `model` (a token count) without side effects: any
    /// single-model host, but a router only for a model it has loaded — asking it about another
    /// would load that model, and with `--models-max` evict one in use.
    pub fn may_ask_about(&self, host: &str, model: &str) -> bool {
        let router = {
            let inner = self.inner.lock();
            match inner.hosts.get(host) {
                Some(entry) => entry.status.router,
                None => return false,
            }
        };
        !router || self.is_loaded(host, model)
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
                router,
                models,
                max_instances,
            } => {
                entry.polled_ctx = per_slot_ctx;
                let status = &mut entry.status;
                status.per_slot_ctx = entry.ctx_override.or(per_slot_ctx);
                status.total_slots = total_slots;
                status.loaded = loaded;
                status.router = router;
                // A model that was loaded and is not any more was swapped out: its cache is gone.
                for old in status.models.iter().filter(|m| m.state == "loaded") {
                    let kept = (models.iter()).any(|m| m.names == old.names && m.state == "loaded");
                    let id = old.names.first().cloned().unwrap_or_default();
                    if !kept
                        && (entry.unloads.len() < MAX_UNLOAD_COUNTS
                            || entry.unloads.contains_key(&id))
                    {
                        *entry.unloads.entry(id).or_default() += 1;
                    }
                }
                status.models = models;
                status.max_instances = max_instances;
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
                        val(&shown_loaded(&status.loaded))
                    );
                }
                flipped
            }
        }
    }
}

/// The unload counts kept per host: a host's answers size nothing beyond this.
const MAX_UNLOAD_COUNTS: usize = 256;

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
    /// Configured model → the name the host knows it by, where they differ.
    upstream: BTreeMap<String, String>,
    /// A router's model id → how often polls saw it go from loaded to not loaded (at most
    /// [`MAX_UNLOAD_COUNTS`] ids).
    unloads: BTreeMap<String, u64>,
    /// The slots the config gives this host, all models together.
    parallel: usize,
}

impl Entry {
    /// The name this host knows configured `model` by.
    fn known_as<'a>(&'a self, model: &'a str) -> &'a str {
        self.upstream.get(model).map_or(model, String::as_str)
    }

    /// A router's entry for configured `model`.
    fn router_model(&self, model: &str) -> Option<&RouterModel> {
        let name = self.known_as(model);
        self.status.models.iter().find(|m| m.is_named(name))
    }

    fn fresh() -> Entry {
        Entry {
            status: HostStatus {
                healthy: true,
                reason: None,
                since: 0,
                per_slot_ctx: None,
                total_slots: None,
                loaded: Vec::new(),
                router: false,
                models: Vec::new(),
                max_instances: None,
                last_poll: 0,
            },
            ctx_override: None,
            polled_ctx: None,
            models: Vec::new(),
            upstream: BTreeMap::new(),
            unloads: BTreeMap::new(),
            parallel: 0,
        }
    }

    /// Marks the entry down; logs and returns true when that changes what an operator sees.
    fn down(&mut self, host: &str, reason: DownReason, now: i64) -> bool {
        let status = &mut self.status;
        // A down host's loaded list is stale: it may come back having loaded something else.
        status.loaded.clear();
        status.models.clear();
        if status.reason.as_ref() == Some(&reason) {
            return false;
        }
        if status.healthy {
            status.healthy = false;
            status.since = now;
        }
        log::info!(
            "host down host={} reason={}",
            val(host),
            val(&reason.to_string())
        );
        status.reason = Some(reason);
        true
    }
}

/// Names a log line shows of a host's loaded list.
const SHOWN_NAMES: usize = 8;
/// Bytes a log line shows of one name.
const SHOWN_NAME_BYTES: usize = 64;

/// The first [`SHOWN_NAMES`] of `names`, each cut to [`SHOWN_NAME_BYTES`] on a char boundary
/// (marked `...`), then `+N more`: a host's listing sizes no log line.
fn shown_loaded(names: &[String]) -> String {
    let mut shown: Vec<String> = (names.iter().take(SHOWN_NAMES))
        .map(|name| {
            let cut = crate::logfmt::cut(name, SHOWN_NAME_BYTES);
            let more = if cut.len() < name.len() { "..." } else { "" };
            format!("{cut}{more}")
        })
        .collect();
    if names.len() > SHOWN_NAMES {
        shown.push(format!("+{} more", names.len() - SHOWN_NAMES));
    }
    shown.join(",")
}

#[cfg(test)]
mod tests;
