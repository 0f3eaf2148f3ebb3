//! The lease table's memory: the leases with their last-used index and per-host counts, the
//! reservations of pending writes, the touched set, pins and what hosts each route has seen. Pure
//! bookkeeping under the table's lock: no I/O, no clock, no calls out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::recent::Recent;
use super::Key;
use crate::clientid::ClientId;
use crate::fasthash::{HashMap, HashSet};

/// One lease as the table keeps it (the key is the map's).
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) host: String,
    pub(super) created: i64,
    pub(super) last_used: i64,
    /// Requests holding a [`super::Hold`] on this lease; only leases with none are evicted.
    pub(super) in_flight: u32,
    /// Tokens the lease holds on its host: its last prompt plus completion (0 until answered).
    pub(super) held: u64,
    /// When it last moved because its host was busy (unix ms; 0: never). Memory only.
    pub(super) busy_moved: i64,
    /// The prompt family it was placed with or last answered with (memory only: `None` for a
    /// lease read back at start, until its next answer).
    pub(super) family: Option<u32>,
    /// The client whose request made it (issue 46; memory only: no one, `ClientId::default()`,
    /// for a lease read back at start). A move keeps it.
    pub(super) owner: ClientId,
    /// Its last answer showed its host had lost its cache: its next turn is placed again
    /// (issue 47). Memory only.
    pub(super) cold: bool,
}

/// Invariants:
/// - `leases` and `pins` equal what the persister holds as of this table's committed writes.
/// - `leases` never holds a pin; a key's lease is on exactly one host.
/// - `by_use` holds `(last_used, key)` for exactly the entries of `leases`.
/// - `counts[model][host]` = leases of `model` on `host` plus pending reservations there.
/// - `held[model][host]` = the sum of `held` over the leases of `model` on `host`.
/// - `recent` holds the conversation leases of `leases` by host, at their `last_used`.
/// - `owned[c]` holds `(last_used, key)` for exactly the entries of `leases` owned by `c`, for
///   every client but no one; a client owning none has no entry.
/// - a key in `pending` has a write in flight; only its writer changes its entry.
/// - `seen[route]` holds every host that was a candidate for, or held a lease or pin of, `route`,
///   minus hosts dropped by [`super::Table::drop_host`]. It is knowledge, not persisted state.
pub(super) struct Inner {
    pub(super) leases: HashMap<Arc<Key>, Entry>,
    pub(super) by_use: BTreeSet<(i64, Arc<Key>)>,
    pub(super) counts: HashMap<String, HashMap<String, usize>>,
    pub(super) held: HashMap<String, HashMap<String, u64>>,
    pub(super) pending: HashMap<Key, String>,
    /// Leases whose `last_used` in memory is ahead of the db's, until the next flush.
    pub(super) touched: HashSet<Arc<Key>>,
    pub(super) pins: BTreeMap<String, String>,
    pub(super) seen: BTreeMap<String, BTreeSet<String>>,
    pub(super) idle: Duration,
    pub(super) max_leases: usize,
    /// Each host's conversation leases by recency (`recent`).
    pub(super) recent: Recent,
    /// Each client's leases, least recently used first (issue 46).
    pub(super) owned: HashMap<ClientId, BTreeSet<(i64, Arc<Key>)>>,
    /// Most leases one client keeps (`max_leases_per_client`).
    pub(super) max_per_client: usize,
}

impl Inner {
    pub(super) fn see(&mut self, route: &str, host: &str) {
        if !self.seen.get(route).is_some_and(|s| s.contains(host)) {
            self.seen
                .entry(route.to_string())
                .or_default()
                .insert(host.to_string());
        }
    }

    pub(super) fn see_all(&mut self, route: &str, hosts: &[String]) {
        for host in hosts {
            self.see(route, host);
        }
    }

    /// Puts a lease in memory (replacing the key's previous one, whose owner it keeps, else
    /// `owner`'s), keeping index and counts.
    pub(super) fn insert(
        &mut self,
        key: Key,
        host: String,
        (created, last_used): (i64, i64),
        owner: ClientId,
    ) {
        let owner = self.remove(&key).map_or(owner, |old| old.owner);
        let key = Arc::new(key);
        self.count(&key.model, &host, 1);
        self.by_use.insert((last_used, key.clone()));
        self.recent.add(&key, &host, last_used);
        if owner != ClientId::default() {
            let owned = self.owned.entry(owner).or_default();
            owned.insert((last_used, key.clone()));
        }
        let entry = Entry {
            host,
            created,
            last_used,
            in_flight: 0,
            held: 0,
            busy_moved: 0,
            family: None,
            owner,
            cold: false,
        };
        self.leases.insert(key, entry);
    }

    /// Whether `owned` holds exactly the owned leases at their last use (its invariant).
    #[cfg(test)]
    pub(super) fn owned_is_kept(&self) -> bool {
        let mut recount: HashMap<ClientId, BTreeSet<(i64, Arc<Key>)>> = HashMap::default();
        for (k, e) in self
            .leases
            .iter()
            .filter(|(_, e)| e.owner != ClientId::default())
        {
            recount
                .entry(e.owner)
                .or_default()
                .insert((e.last_used, k.clone()));
        }
        recount == self.owned
    }

    /// Leases `owner` keeps.
    pub(super) fn owned_by(&self, owner: ClientId) -> usize {
        self.owned.get(&owner).map_or(0, BTreeSet::len)
    }

    /// Sets the tokens `key`'s lease holds and its family, keeping the per-host sums.
    pub(super) fn set_held(&mut self, key: &Key, tokens: u64, family: Option<u32>) {
        let Some(entry) = self.leases.get_mut(key) else {
            return;
        };
        entry.family = family.or(entry.family);
        let before = std::mem::replace(&mut entry.held, tokens);
        let host = entry.host.clone();
        self.add_held(&key.model, &host, before, tokens);
    }

    fn add_held(&mut self, model: &str, host: &str, minus: u64, plus: u64) {
        if minus == plus {
            return;
        }
        let hosts = match self.held.get_mut(model) {
            Some(hosts) => hosts,
            None => self.held.entry(model.to_string()).or_default(),
        };
        let sum = match hosts.get_mut(host) {
            Some(sum) => sum,
            None => hosts.entry(host.to_string()).or_default(),
        };
        *sum = sum.saturating_sub(minus).saturating_add(plus);
    }

    /// Tokens the leases of `model` on `host` hold.
    pub(super) fn held_on(&self, model: &str, host: &str) -> u64 {
        (self.held.get(model))
            .and_then(|hosts| hosts.get(host))
            .copied()
            .unwrap_or(0)
    }

    /// What each conversation lease of `model` on `host` holds, most recently used first
    /// (`recent`): the first `slots` of them are what its slots hold.
    pub(super) fn held_newest<'a>(
        &'a self,
        model: &str,
        host: &str,
    ) -> impl Iterator<Item = super::Resident> + 'a {
        (self.recent.newest_first(model, host)).map(|k| {
            let entry = self.leases.get(k);
            super::Resident {
                tokens: entry.map_or(0, |e| e.held),
                family: entry.and_then(|e| e.family),
                last_used: entry.map_or(0, |e| e.last_used),
            }
        })
    }

    /// Takes a lease out of memory, keeping index and counts.
    pub(super) fn remove(&mut self, key: &Key) -> Option<Entry> {
        let (k, entry) = self.leases.remove_entry(key)?;
        self.touched.remove(&k);
        self.by_use.remove(&(entry.last_used, k.clone()));
        self.recent.remove(&k, &entry.host, entry.last_used);
        if let Some(owned) = self.owned.get_mut(&entry.owner) {
            owned.remove(&(entry.last_used, k.clone()));
            if owned.is_empty() {
                self.owned.remove(&entry.owner);
            }
        }
        self.count(&key.model, &entry.host, -1);
        self.add_held(&key.model, &entry.host, entry.held, 0);
        Some(entry)
    }

    /// One more request in flight on `key`'s lease (eviction passes it by); its key, for the
    /// [`super::Hold`] that gives it back.
    pub(super) fn hold(&mut self, key: &Key) -> Option<Arc<Key>> {
        let (k, _) = self.leases.get_key_value(key)?;
        let k = k.clone();
        self.leases.get_mut(key)?.in_flight += 1;
        Some(k)
    }

    /// Moves a lease's `last_used` forward (never back: `now`s may arrive out of order).
    pub(super) fn touch(&mut self, key: &Key, now: i64) -> Option<i64> {
        let (k, entry) = self.leases.get_key_value(key)?;
        let (k, before) = (k.clone(), entry.last_used);
        if now > before {
            self.by_use.remove(&(before, k.clone()));
            self.by_use.insert((now, k.clone()));
            if let Some(owned) = self.owned.get_mut(&entry.owner) {
                owned.remove(&(before, k.clone()));
                owned.insert((now, k.clone()));
            }
            self.recent.remove(&k, &entry.host, before);
            self.recent.add(&k, &entry.host, now);
            self.touched.insert(k);
            self.leases.get_mut(key)?.last_used = now;
        }
        Some(now.max(before))
    }

    pub(super) fn count(&mut self, model: &str, host: &str, delta: isize) {
        let hosts = match self.counts.get_mut(model) {
            Some(hosts) => hosts,
            None => self.counts.entry(model.to_string()).or_default(),
        };
        match hosts.get_mut(host) {
            Some(n) => *n = n.saturating_add_signed(delta),
            None if delta > 0 => {
                hosts.insert(host.to_string(), delta.unsigned_abs());
            }
            None => {}
        }
    }

    /// Leases (and reservations) of `model` on `host`.
    pub(super) fn leases_of(&self, model: &str, host: &str) -> usize {
        (self.counts.get(model))
            .and_then(|hosts| hosts.get(host))
            .copied()
            .unwrap_or(0)
    }

    /// The models `host` holds leases (or reservations) for, sorted: one look per model, not per
    /// lease.
    pub(super) fn models_on(&self, host: &str) -> Vec<String> {
        let mut models: Vec<String> = (self.counts.iter())
            .filter(|(_, hosts)| hosts.get(host).is_some_and(|n| *n > 0))
            .map(|(model, _)| model.clone())
            .collect();
        models.sort();
        models
    }

    pub(super) fn route_keys(&self, route: &str) -> Vec<Key> {
        (self.leases.keys())
            .filter(|k| k.route == route)
            .map(|k| Key::clone(k))
            .collect()
    }
}
