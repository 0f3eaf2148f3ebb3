//! The host health table: who is up, why a host is down, its per-slot context and loaded models.
//!
//! [`Health`] is written by the poller ([`Poller`], one thread per host, in `health/poll.rs`) and
//! by the proxy from what its forwards met; everyone else reads it. Health is judged by what the
//! host did (issue 24): a host goes down after `health_fall` failed polls in a row (at once for an
//! answer that says exactly what is wrong: a 4xx such as 401 from `/props`, or 503 loading; and
//! at once before its first good poll), or after `health_fall` forwards in a row that may have
//! reached it and failed ([`Health::request_failed`]), or at once when a fresh connection to it is
//! refused or times out ([`Health::mark_down`]); it comes back after `health_rise` good polls. A
//! failed forward asks for an early poll ([`Health::poke`]). Updates take
//! `now` as a parameter and log only transitions. The table itself does no I/O, and no lock is
//! held while a host is polled: a poll result is computed first, then applied in one short step.

use std::collections::BTreeMap;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::config;
use crate::fasthash::HashMap;
use crate::logfmt::val;
use entry::{shown_loaded, Entry};

mod answers;
mod entry;
mod poll;
mod reason;
mod router;

pub use poll::{parse_models, parse_props, poll_host, ParseError, Poller, Seen, Watch};
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
    /// `/props` `build_info`, when it says.
    pub build: Option<String>,
    /// A single-model host's training context (`/v1/models` `meta.n_ctx_train`), when it says.
    pub ctx_train: Option<u64>,
    /// Times the host came back up after being down (a restart, perhaps: issue 47).
    pub ups: u64,
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
        build: Option<String>,
        ctx_train: Option<u64>,
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
                hosts: HashMap::default(),
                fall: 1,
                rise: 1,
                transitions: BTreeMap::new(),
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
            entry.status.per_slot_ctx = host.ctx.or(entry.polled_ctx);
        }
    }

    /// `health_fall` and `health_rise` (each at least 1): how many failures in a row take a host
    /// down, how many good polls bring it back.
    pub fn set_thresholds(&self, fall: u32, rise: u32) {
        let mut inner = self.inner.lock();
        (inner.fall, inner.rise) = (fall.max(1), rise.max(1));
    }

    /// Where [`Health::poke`] reaches `host`'s poller (set by the poller when it starts).
    pub fn set_poke(&self, host: &str, poke: Sender<()>) {
        if let Some(entry) = self.inner.lock().hosts.get_mut(host) {
            entry.poke = Some(poke);
        }
    }

    /// Asks `host`'s poller for a poll now: at most one waits (the poller keeps a second apart).
    pub fn poke(&self, host: &str) {
        if let Some(poke) = self
            .inner
            .lock()
            .hosts
            .get(host)
            .and_then(|e| e.poke.as_ref())
        {
            let _ = poke.try_send(());
        }
    }

    /// A forward that may have reached `host` failed (a first-byte timeout, a malformed answer, a
    /// reset mid-answer): the host goes down when `health_fall` of them come in a row with no
    /// answered forward between. Returns whether it went down now.
    pub fn request_failed(&self, host: &str, reason: DownReason, now: i64) -> bool {
        let mut inner = self.inner.lock();
        let fall = inner.fall;
        let Some(entry) = inner.hosts.get_mut(host) else {
            return false;
        };
        entry.streak = entry.streak.saturating_add(1);
        let down = entry.status.healthy && entry.streak >= fall && entry.down(host, reason, now);
        if down {
            inner.count(host, "down", "request failures");
        }
        down
    }

    /// A forward to `host` was answered: its failure streak ends.
    pub fn request_ok(&self, host: &str) {
        if let Some(entry) = self.inner.lock().hosts.get_mut(host) {
            entry.streak = 0;
        }
    }

    /// Host flips since start: `(host, "up"|"down", why)` → count, why being a down reason's
    /// kind, `request failures` or `polls`.
    pub fn transitions(&self) -> Vec<((String, &'static str, &'static str), u64)> {
        let inner = self.inner.lock();
        (inner.transitions.iter())
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }

    pub fn get(&self, host: &str) -> Option<HostStatus> {
        self.inner.lock().hosts.get(host).map(|e| e.status.clone())
    }

    /// The slots `/props` reports for a single-model host; `None` for a router, or while unknown.
    /// The KV cache `host` shares among its slots, when it looks like llama-server's automatic
    /// `-np` (issue 47): four slots each reporting the model's training context, which is what
    /// one unified KV cache of that size looks like (an explicit `-np 4` divides the context
    /// among the slots). `/props` does not say it: a guess, which `kv_tokens` overrides.
    pub fn unified_guess(&self, host: &str) -> Option<u64> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        let status = &entry.status;
        let automatic = !status.router && status.total_slots == Some(router::AUTO_SLOTS);
        (entry.polled_ctx).filter(|ctx| automatic && status.ctx_train == Some(*ctx))
    }

    pub fn own_slots(&self, host: &str) -> Option<u64> {
        let inner = self.inner.lock();
        let status = &inner.hosts.get(host)?.status;
        status.total_slots.filter(|_| !status.router)
    }

    /// The slots `host` runs for configured `model`, as it says: a single-model host's
    /// `total_slots` (at most [`router::MAX_SLOTS`]), a router's from the model's own command
    /// line; `None` while unknown, or for a model a router does not list.
    pub fn slots_for(&self, host: &str, model: &str) -> Option<u64> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        if entry.status.router {
            return entry.router_model(model).map(|m| m.slots);
        }
        (entry.status.total_slots).map(|n| n.clamp(1, router::MAX_SLOTS))
    }

    /// Whether `host` serves configured `model`, as far as it has said: a single-model host serves
    /// whatever its route names (it ignores a body's `model`), a router what it lists; `None`
    /// while it has not answered a poll.
    pub fn serves(&self, host: &str, model: &str) -> Option<bool> {
        let inner = self.inner.lock();
        let entry = inner.hosts.get(host)?;
        if !entry.ever_up {
            return None;
        }
        Some(!entry.status.router || entry.router_model(model).is_some())
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

    /// A fresh connection to `host` was refused or timed out: the host is down at once, until
    /// `health_rise` good polls. Returns whether this was a transition (and so was logged).
    pub fn mark_down(&self, host: &str, reason: DownReason, now: i64) -> bool {
        let mut inner = self.inner.lock();
        let Some(entry) = inner.hosts.get_mut(host) else {
            return false;
        };
        let was_up = entry.status.healthy;
        entry.good_polls = 0;
        let changed = entry.down(host, reason, now);
        if was_up && changed {
            inner.count(host, "down", "unreachable");
        }
        changed
    }

    /// Applies a poll result. Returns whether the host flipped up or down, or changed its down
    /// reason (only those are logged). Unknown hosts (removed by a reload) are ignored.
    pub fn apply(&self, host: &str, poll: Poll, now: i64) -> bool {
        let mut inner = self.inner.lock();
        let (fall, rise) = (inner.fall, inner.rise);
        let Some(entry) = inner.hosts.get_mut(host) else {
            return false;
        };
        let first = entry.status.last_poll == 0;
        entry.status.last_poll = now;
        match poll {
            Poll::Down(reason) => {
                entry.good_polls = 0;
                entry.failed_polls = entry.failed_polls.saturating_add(1);
                // An answer that says what is wrong, a host never seen up, one already down: at
                // once. A poll that timed out or failed with a 5xx: after `fall` in a row.
                let now_down = !entry.status.healthy
                    || !entry.ever_up
                    || decisive(&reason)
                    || entry.failed_polls >= fall;
                if !now_down {
                    log::debug!(
                        "poll failed host={} failed_polls={} reason={}",
                        val(host),
                        entry.failed_polls,
                        val(&reason.to_string())
                    );
                    return false;
                }
                let was_up = entry.status.healthy;
                let changed = entry.down(host, reason, now);
                if was_up && changed {
                    let kind = entry
                        .status
                        .reason
                        .as_ref()
                        .map_or("polls", DownReason::kind);
                    inner.count(host, "down", kind);
                }
                changed
            }
            Poll::Up {
                per_slot_ctx,
                total_slots,
                loaded,
                router,
                models,
                max_instances,
                build,
                ctx_train,
            } => {
                entry.status.build = build;
                entry.status.ctx_train = ctx_train;
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
                entry.failed_polls = 0;
                entry.good_polls = entry.good_polls.saturating_add(1);
                // Down hosts come back after `rise` good polls in a row.
                if !status.healthy && entry.good_polls < rise {
                    return false;
                }
                let back = entry.ever_up;
                entry.ever_up = true;
                let flipped = !status.healthy;
                status.healthy = true;
                status.reason = None;
                entry.streak = 0;
                if flipped {
                    status.since = now;
                    // Down and up again after it had been up: it may have restarted.
                    status.ups += u64::from(back);
                }
                // Every host's first poll says what it found, so the start of the log shows each
                // host's state, slots and context; later only flips are logged.
                if first || flipped {
                    let known = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
                    log::info!(
                        "host up host={host} ctx={} slots={} loaded={}",
                        known(status.per_slot_ctx),
                        known(status.total_slots),
                        val(&shown_loaded(&status.loaded))
                    );
                }
                if flipped {
                    inner.count(host, "up", "polls");
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
    /// `health_fall`, `health_rise`.
    fall: u32,
    rise: u32,
    /// Flips since start, by host (configured names), direction and why: a few entries per host.
    transitions: BTreeMap<(String, &'static str, &'static str), u64>,
}

impl Inner {
    fn count(&mut self, host: &str, to: &'static str, why: &'static str) {
        *self
            .transitions
            .entry((host.to_string(), to, why))
            .or_default() += 1;
    }
}

/// A poll answer that says exactly what is wrong takes effect at once: a 4xx (401 from `/props`:
/// check `api_key`) or 503 loading. Silence, a 5xx or a malformed answer may be a passing fault.
fn decisive(reason: &DownReason) -> bool {
    match reason {
        DownReason::Loading { .. } => true,
        DownReason::Status { status, .. } => (400..500).contains(status),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
