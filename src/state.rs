//! The gateway's shared state: what every worker, the admin API and the background threads see.
//!
//! [`Gateway`] owns the live config, the store, the lease table, the limiter, the health table and
//! the drain set, and adapts them to the lease table's `HostView` and `Chooser` traits. It holds no
//! sockets and starts no threads (that is `server`); its locks are never held across network I/O.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::fasthash::HashMap;
use crate::health::Health;
use crate::holdings::Holdings;
use crate::lease::{self, Key};
use crate::limiter::Limiter;
use crate::logfmt::val;
use crate::metrics::Metrics;
use crate::store::{unix_ms, LeaseRow, Store, StoreError, Ticket, Write};

mod view;
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
    pub sessions: crate::admin::Sessions,
    /// Wrong admin tokens per address (issue 46).
    pub admin_failures: crate::failures::Failures,
    /// What each pinning host's slots hold (`pin_slots`).
    pub slots: crate::slots::Slots,
    /// The prompt size of each conversation's previous turn, to notice a cache that went cold.
    last_prompt: Mutex<HashMap<Key, (i64, u64)>>,
    /// The pooled agents forwarded requests go through, one per host.
    upstream: crate::proxy::UpstreamPools,
    /// crossbar's own small upstream calls (the context guard's exact counts), bounded per host.
    counter: crate::proxy::Counter,
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
            for (model, parallel) in &host.models {
                limiter.set_capacity(&host.name, model, *parallel);
            }
        }
        let drains = Arc::new(Drains::default());
        let upstream = crate::proxy::UpstreamPools::new(&config);
        // The same settings (no redirects, connect and per-read timeouts) without the pool,
        // nothing watched: no client waits at the socket for a count.
        let counter = crate::proxy::Counter::new(ureq::Agent::new_with_config(
            crate::proxy::upstream_config(&config),
        ));
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
        let view = Arc::new(View {
            config: config.clone(),
            health: health.clone(),
            limiter: limiter.clone(),
            drains: drains.clone(),
            holdings: holdings.clone(),
        });
        let metrics = Arc::new(Metrics::default());
        let persister = Arc::new(Counted {
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
            sessions: crate::admin::Sessions::default(),
            admin_failures: crate::admin::throttle::guard(),
            slots: crate::slots::Slots::default(),
            last_prompt: Mutex::new(HashMap::default()),
            upstream,
            counter,
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
        for host in new.hosts.values() {
            for (model, parallel) in &host.models {
                self.limiter.set_capacity(&host.name, model, *parallel);
            }
        }
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

    /// crossbar's own small upstream calls (exact token counts) and how many are in flight.
    pub fn counter(&self) -> &crate::proxy::Counter {
        &self.counter
    }

    /// The pooled agent of `host`'s forwarded requests.
    pub fn upstream(&self, host: &str) -> ureq::Agent {
        self.upstream.get(host)
    }

    /// Remembers this turn's prompt size and returns the previous turn's, if any.
    /// With the prompt goes the host's unload count of the model then (see `Health::unloads`),
    /// so a cold turn can say whether a router swapped the model out in between.
    pub fn swap_last_prompt(&self, key: &Key, prompt: i64, unloads: u64) -> Option<(i64, u64)> {
        let mut last = self.last_prompt.lock();
        // A conversation's later turns find their entry: no copy of the key (three strings).
        if let Some(entry) = last.get_mut(key) {
            return Some(std::mem::replace(entry, (prompt, unloads)));
        }
        last.insert(key.clone(), (prompt, unloads))
    }

    /// What placement sees of `host`+`model` (issue 23): tokens its slots hold (its most recently
    /// used conversations, one per slot) against its capacity (0 when unknown).
    pub fn held(&self, host: &str, model: &str) -> (u64, u64) {
        let config = self.config();
        let parallel = config.parallel(host, model);
        let capacity = (config.hosts.get(host))
            .map_or(0, |h| view::capacity(&self.health, h, model, parallel));
        (self.leases.held_in_slots(model, host, parallel), capacity)
    }

    /// What crossbar believes `host`+`model`'s slots hold, when it pins there: `pin_slots`, and
    /// the slots `/props` reports known (none for a router).
    pub fn pinned_slots(
        &self,
        host: &crate::config::Host,
        model: &str,
    ) -> Option<crate::slots::Mirror> {
        let known = self.health.own_slots(&host.name).is_some();
        (host.pin_slots && known).then(|| self.slots.mirror(&host.name, model))?
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

/// Answered rows read back at start to rebuild the families hosts hold warm.
const RECENT_FAMILIES: usize = 20_000;

/// The store as the lease table's persister, counting lease events for `/metrics` on the way.
struct Counted {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
}

impl lease::Persister for Counted {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.store.list_leases()
    }

    fn submit(&self, writes: Vec<Write>) -> Ticket {
        self.count(&writes);
        self.store.submit(writes)
    }
}

impl Counted {
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
