//! The gateway's shared state: what every worker, the admin API and the background threads see.
//!
//! [`Gateway`] owns the live config and everything built from it — the store, the lease table,
//! the limiter, the health table, what hosts hold (`holdings`) and what crossbar learned of them
//! (`learn`), client keys, sign-in sessions, the slot mirror, and the llama-server client
//! (`upstream`: its pools and side calls, the only sockets here, used by the request path and the
//! poll hook) — and adapts them to the lease table's `HostView` and `Chooser` (`view.rs`).
//! `hosts.rs` says what a host is now and acts on each poll. It starts no threads (that is
//! `server`), holds no lock across network I/O, and imports nothing of `proxy` or `admin`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::fasthash::HashMap;
use crate::health::Health;
use crate::holdings::Holdings;
use crate::learn::Learned;
use crate::lease::{self, Key};
use crate::limiter::Limiter;
use crate::logfmt::val;
use crate::metrics::Metrics;
use crate::store::{unix_ms, LeaseRow, Store, StoreError, Ticket, Write};
use crate::upstream::Upstream;

mod hosts;
mod view;
pub use hosts::seats;
use view::View;

/// Everything a request needs, shared by all threads.
pub struct Gateway {
    config: Arc<RwLock<Arc<Config>>>,
    pub store: Arc<Store>,
    pub leases: lease::Table,
    pub limiter: Arc<Limiter>,
    pub health: Arc<Health>,
    pub drains: Arc<Drains>,
    pub metrics: Arc<Metrics>,
    /// What each host holds warm, what is on its way there, how fast it prefills (issue 23).
    pub holdings: Arc<Holdings>,
    /// Client keys' requests in flight, tokens today, failed attempts (issue 25).
    pub keys: Arc<crate::keys::Keys>,
    /// The status page's sign-in sessions (issue 27).
    pub sessions: crate::sessions::Sessions,
    /// Wrong admin tokens per address (issue 46).
    pub admin_failures: crate::failures::Failures,
    /// Requests answered before their route and key are known: counted, logged per burst.
    pub unrouted: crate::unrouted::Unrouted,
    /// What each pinning host's slots hold (`exclusive` hosts).
    pub slots: crate::slots::Slots,
    /// Each conversation's previous turn, to notice a cache that went cold.
    last_prompt: Mutex<HashMap<Key, Turn>>,
    /// The llama-server client: forwarding pools and crossbar's own side calls.
    pub upstream: Upstream,
    /// What crossbar learned of each host that it does not report (issue 47).
    pub learned: Arc<Learned>,
    /// What the poll hook remembers of each host between polls (`hosts.rs`).
    host_facts: Mutex<HashMap<String, hosts::Facts>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

/// Hosts an operator is draining: they keep their leases but get no new ones.
#[derive(Debug, Default)]
pub struct Drains(Mutex<BTreeSet<String>>);

impl Drains {
    pub fn contains(&self, host: &str) -> bool {
        self.0.lock().contains(host)
    }

    /// Returns whether anything changed.
    pub fn set(&self, host: &str, on: bool) -> bool {
        let mut set = self.0.lock();
        if on {
            set.insert(host.to_string())
        } else {
            set.remove(host)
        }
    }
}

impl Gateway {
    /// Builds the state from a validated config and an opened store, loading the leases.
    pub fn new(config: Config, store: Store) -> Result<Gateway, StoreError> {
        let store = Arc::new(store);
        let health = Arc::new(Health::new(&config.hosts));
        health.set_thresholds(config.health_fall, config.health_rise);
        let limiter = Arc::new(Limiter::new(config.queue_max, config.queue_timeout));
        limiter.set_waiting(config.waiting);
        for host in config.hosts.values() {
            for model in host.models.keys() {
                limiter.set_capacity(
                    &host.name,
                    model,
                    seats(&config, &health, &host.name, model),
                );
            }
        }
        let learned = Arc::new(Learned::default());
        learned.set_hosts(similarities(&config), unix_ms(SystemTime::now()));
        let drains = Arc::new(Drains::default());
        let upstream = Upstream::new(&config);
        let idle = config.lease_idle;
        let config = Arc::new(RwLock::new(Arc::new(config)));
        let holdings = Arc::new(Holdings::default());
        match store.recent_families(RECENT_FAMILIES) {
            Ok(rows) => holdings.rebuild(rows),
            Err(err) => log::warn!(
                "warm families not rebuilt error={}",
                val(&crate::logfmt::chain(&err))
            ),
        }
        let keys = Arc::new(crate::keys::Keys::default());
        let now = unix_ms(SystemTime::now());
        let midnight = now - now.rem_euclid(86_400_000);
        match store.key_tokens_since(midnight) {
            Ok(today) => keys.rebuild(today, now),
            Err(err) => log::warn!(
                "key budgets not rebuilt error={}",
                val(&crate::logfmt::chain(&err))
            ),
        }
        let slots = crate::slots::Slots::default();
        let view = Arc::new(View {
            config: config.clone(),
            health: health.clone(),
            limiter: limiter.clone(),
            drains: drains.clone(),
            holdings: holdings.clone(),
            learned: learned.clone(),
            slots: slots.clone(),
        });
        let metrics = Arc::new(Metrics::default());
        let persister = Arc::new(LeaseStore {
            store: store.clone(),
            metrics: metrics.clone(),
        });
        let leases = lease::Table::new(persister, view.clone(), view, idle)?;
        let (max, per_client) = (
            config.read().max_leases,
            config.read().max_leases_per_client,
        );
        leases.set_max_leases(max, per_client);
        // Hosts edited out of the config while crossbar was stopped: their stored leases and
        // pins go now, as a reload would have dropped them (a pin on one would 503 its route).
        let stored: BTreeSet<String> = leases
            .snapshot()
            .into_iter()
            .map(|l| l.host)
            .chain(leases.pins().into_iter().map(|(_, host)| host))
            .collect();
        let now = unix_ms(SystemTime::now());
        let current = config.read().clone();
        for gone in stored.iter().filter(|h| !current.hosts.contains_key(*h)) {
            drop_removed_host(&leases, gone, now);
        }
        for route in config.read().routes.values() {
            // Operators may pin a route to any of its hosts before it sees traffic.
            leases.add_candidates(&route.name, &route.hosts);
        }
        Ok(Gateway {
            config,
            store,
            leases,
            limiter,
            health,
            drains,
            metrics,
            holdings,
            keys,
            sessions: crate::sessions::Sessions::default(),
            unrouted: crate::unrouted::Unrouted::default(),
            // The admin listener's guard has the client keys' limits (issue 46).
            admin_failures: crate::failures::Failures::new(
                crate::keys::MAX_FAILURES,
                crate::keys::WINDOW_MS,
                crate::keys::PEERS,
            ),
            slots,
            last_prompt: Mutex::new(HashMap::default()),
            upstream,
            learned,
            host_facts: Mutex::new(HashMap::default()),
        })
    }

    /// The config in force now. Cheap: an `Arc` clone under a read lock.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().clone()
    }

    /// Puts a new config in force: hosts, routes, slots and timeouts change; leases on hosts that
    /// are gone are dropped with an event; a new `admin_token` ends every sign-in session.
    pub fn apply_config(&self, new: Config, now: i64) {
        let old = self.config();
        for gone in old.hosts.keys().filter(|h| !new.hosts.contains_key(*h)) {
            drop_removed_host(&self.leases, gone, now);
            self.drains.set(gone, false);
        }
        self.health.set_hosts(&new.hosts);
        self.health.set_thresholds(new.health_fall, new.health_rise);
        self.learned.set_hosts(similarities(&new), now);
        for host in new.hosts.values() {
            for model in host.models.keys() {
                let n = seats(&new, &self.health, &host.name, model);
                self.limiter.set_capacity(&host.name, model, n);
            }
        }
        (self.host_facts.lock()).retain(|h, _| new.hosts.contains_key(h));
        self.limiter.retain(|host, model| new.serves(host, model));
        self.holdings
            .retain_hosts(|host| new.hosts.contains_key(host));
        self.upstream
            .set_hosts(new.hosts.keys().map(String::as_str));
        self.limiter.set_queue(new.queue_max, new.queue_timeout);
        self.limiter.set_waiting(new.waiting);
        self.leases.set_idle(new.lease_idle);
        (self.leases).set_max_leases(new.max_leases, new.max_leases_per_client);
        for route in new.routes.values() {
            self.leases.add_candidates(&route.name, &route.hosts);
        }
        if new.admin_token != old.admin_token {
            // Sessions were opened with the old token; whoever holds it no longer may.
            self.sessions.clear();
        }
        *self.config.write() = Arc::new(new);
    }

    /// Remembers this turn and returns the conversation's previous one, if any.
    pub fn swap_last_turn(&self, key: &Key, turn: Turn) -> Option<Turn> {
        let mut last = self.last_prompt.lock();
        // A conversation's later turns find their entry: no copy of the key (three strings).
        if let Some(entry) = last.get_mut(key) {
            return Some(std::mem::replace(entry, turn));
        }
        last.insert(key.clone(), turn)
    }

    /// What placement sees of `host`+`model` (issue 23): tokens its slots hold (its most recently
    /// used conversations, one per slot) against its capacity (0 when unknown).
    pub fn held(&self, host: &str, model: &str) -> (u64, u64) {
        let config = self.config();
        let seats = seats(&config, &self.health, host, model);
        let capacity =
            (config.hosts.get(host)).map_or(0, |h| view::capacity(&self.health, h, model, seats));
        (self.leases.held_in_slots(model, host, seats), capacity)
    }

    /// What crossbar believes `host`+`model`'s slots hold, when it pins there ([`Gateway::pinning`]).
    pub fn pinned_slots(
        &self,
        host: &crate::config::Host,
        model: &str,
    ) -> Option<crate::slots::Mirror> {
        self.pinning(host)
            .then(|| self.slots.mirror(&host.name, model))?
    }

    /// Forgets prompt sizes of conversations that no longer hold a lease.
    pub fn prune_last_prompt(&self) {
        let known: Vec<Key> = self.last_prompt.lock().keys().cloned().collect();
        let gone: Vec<Key> = (known.into_iter())
            .filter(|k| !self.leases.contains(k))
            .collect();
        let mut last = self.last_prompt.lock();
        for key in &gone {
            last.remove(key);
        }
    }
}

/// One turn of a conversation, as its next turn compares with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Its prompt tokens.
    pub prompt: i64,
    /// The host's unload count of the model then (see `Health::unloads`): a cold turn can say
    /// whether a router swapped the model out in between.
    pub unloads: u64,
    /// Answers the host had given for the model by then (`Holdings::turns`), this one included.
    pub turns: u64,
}

/// Each host's configured similarity (on above 0) and RAM cache, `None` where the config leaves
/// them to the host.
fn similarities(config: &Config) -> impl Iterator<Item = (&str, (Option<bool>, Option<bool>))> {
    (config.hosts.values()).map(|h| {
        let similarity = h.slot_prompt_similarity.map(|s| s > 0.0);
        (h.name.as_str(), (similarity, h.ram_cache))
    })
}

/// Answered rows read back at start to rebuild the families hosts hold warm.
const RECENT_FAMILIES: usize = 20_000;

/// The store as the lease table's persister, counting lease events for `/metrics` on the way.
struct LeaseStore {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
}

impl lease::Persister for LeaseStore {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.store.list_leases()
    }

    fn submit(&self, writes: Vec<Write>) -> Ticket {
        self.count(&writes);
        self.store.submit(writes)
    }
}

impl LeaseStore {
    /// Counts lease events as they are queued (a failed commit is counted as a store error).
    fn count(&self, writes: &[Write]) {
        for write in writes {
            if let Write::Event(ev) = write {
                self.metrics.observe_lease_event(ev.reason.as_str());
            }
        }
    }
}

/// Drops the leases and pins of a host the config no longer has, with an event each and a line.
fn drop_removed_host(leases: &lease::Table, gone: &str, now: i64) {
    match leases.drop_host(gone, now) {
        Ok(n) => log::info!("host removed host={} leases_dropped={n}", val(gone)),
        Err(err) => log::error!(
            "host removed host={} error={}",
            val(gone),
            val(&err.to_string())
        ),
    }
}
