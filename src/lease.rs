//! The sticky lease table: which host each conversation (route + fingerprint + model) is on.
//!
//! A lease moves only when its host is unhealthy, when it has been idle longer than `lease_idle`,
//! when an operator pins or releases its route, when the context guard moves it, or when a config
//! reload removes its host. A better host appearing is never a reason to move: a llama-server
//! prompt cache lives in one process. A pin outranks everything, health included: a pinned host
//! that is down is an error, never a silent move.
//!
//! The table does no I/O of its own and never looks at a clock (`now` is a parameter, unix ms).
//! Every change is queued to a [`Persister`] (the store's writer thread) and applied to memory only
//! after its commit, and nothing waits for a commit with the table's lock held (`write`): a change
//! holds a reservation for its keys meanwhile, so that a concurrent turn of the same conversation
//! waits for it and the chooser counts it. A reused lease's `last_used` is written behind (not waited for).
//! Per-host lease counts and a last-used index are kept as leases come and go, so no request walks
//! the whole table; `max_leases` bounds it (least recently used idle lease evicted). Health and
//! choice come in through [`HostView`] and [`Chooser`], which must answer from memory and must
//! never call back into the table (the table's lock is held while they run).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::fasthash::{HashMap, HashSet};
use crate::logfmt::val;
use crate::store::{LeaseRow, LeaseState, Reason, Store, StoreError, Ticket, Write};
use index::Inner;
pub use placed::{Ask, Placed};

mod acquire;
mod index;
mod operator;
mod placed;
mod recent;
#[cfg(test)]
mod tests;
mod view;
mod write;

/// What a lease is for. `model` is never empty for a real lease: the row `(route, "", "")` is the
/// route's pin in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub route: String,
    pub fp: String,
    pub model: String,
}

/// One conversation's lease. Times are unix ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: Key,
    pub host: String,
    pub created: i64,
    pub last_used: i64,
}

/// The answer to [`Table::acquire`]: the host, whether its cache should already be warm (the
/// conversation's own lease, reused), and why the request went there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub host: String,
    pub reused: bool,
    pub placed: Placed,
}

/// Why a lease could not be given or changed.
#[derive(Debug)]
pub enum LeaseError {
    /// No candidate is healthy, not draining and chosen; nothing was created.
    NoHost,
    /// The route is pinned to a host that is not healthy; nothing was created.
    PinnedDown { host: String },
    /// A pin names a host that never served nor was offered for the route.
    UnknownHost { host: String },
    /// The persister refused a write; memory holds what the database holds.
    Store(StoreError),
}

/// Where leases are written through to: the store's writer thread is the real one.
pub trait Persister: Send + Sync {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError>;
    /// Queues `writes` after every earlier submission; the ticket answers at their commit.
    fn submit(&self, writes: Vec<Write>) -> Ticket;
}

/// What the table needs to know about hosts, answered from memory.
pub trait HostView: Send + Sync {
    fn healthy(&self, host: &str) -> bool;
    fn draining(&self, host: &str) -> bool;
}

/// A host offered to the chooser for a new lease: healthy, not draining, a candidate of the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub host: String,
    /// Leases the host already holds for the same model (conversations whose caches it keeps).
    pub leases: usize,
    /// Tokens all those leases hold (each one's last prompt plus completion).
    pub leased: u64,
    /// What each of those conversations holds, most recently used first, at most
    /// [`HELD_NEWEST`]: the first `slots` of them are what the host's slots hold (`recent`).
    pub held_newest: Vec<Resident>,
    /// Every model the host holds a lease of (a router evicting one of them loses its caches).
    pub leased_models: Vec<String>,
    /// The route-level lease of the model is on this host (seed 000's rule 3, a preference now).
    pub inherited: bool,
}

/// One conversation on its host, as a [`Candidate`] lists it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// Its last prompt plus completion (0 until answered).
    pub tokens: u64,
    /// The id of its prompt family, when known.
    pub family: Option<u32>,
    /// When it was last used, unix ms.
    pub last_used: i64,
}

/// Most conversations per host a [`Candidate`] lists the held tokens of (a host's slots).
pub const HELD_NEWEST: usize = 64;

/// Picks hosts for new leases. Called with the table's lock held: it must answer from memory and
/// never call back into the table.
pub trait Chooser: Send + Sync {
    /// One of `candidates` for a new lease of `model`, and why; at `now` (unix ms).
    fn choose(
        &self,
        candidates: &[Candidate],
        model: &str,
        ask: &Ask,
        now: i64,
    ) -> Option<(String, Placed)>;

    /// Where a conversation on the busy host `current` should move, if waiting there costs more
    /// than starting over on one of `others`; `None` to stay.
    fn busy_move(
        &self,
        current: &Candidate,
        others: &[Candidate],
        model: &str,
        ask: &Ask,
        now: i64,
    ) -> Option<String>;
}

/// The lease table. Cheap to share behind an `Arc`; every method takes the one lock, and none
/// holds it while the store commits.
pub struct Table {
    persister: Arc<dyn Persister>,
    hosts: Arc<dyn HostView>,
    chooser: Arc<dyn Chooser>,
    shared: Arc<Shared>,
    /// Taken by an operator's change (pin, unpin, release, a removed host) for its whole length,
    /// so two of them never interleave their commits; requests never take it.
    operator: Mutex<()>,
}

/// The lock, and the condvar a request waits on while another holds its key's reservation.
struct Shared {
    inner: Mutex<Inner>,
    settled: Condvar,
}

/// A request's claim on its lease: while held, eviction passes the lease by.
pub struct Hold {
    shared: Arc<Shared>,
    key: Arc<Key>,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold").field("key", &self.key).finish()
    }
}

impl Hold {
    /// Records the tokens the held lease holds on its host now (its last prompt plus completion),
    /// which the chooser weighs against the host's capacity, and its prompt family (which the
    /// chooser keeps apart from its siblings where slots are picked by similarity).
    pub fn set_held(&self, tokens: u64, family: Option<u32>) {
        self.shared.inner.lock().set_held(&self.key, tokens, family);
    }

    /// The held lease's answer showed its host had lost its cache (issue 47): its next turn is
    /// placed again as if new ([`Placed::Cold`]).
    pub fn went_cold(&self) {
        if let Some(entry) = self.shared.inner.lock().leases.get_mut(&self.key) {
            entry.cold = true;
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(e) = self.shared.inner.lock().leases.get_mut(&self.key) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
    }
}

/// The default for `max_leases`.
pub const MAX_LEASES: usize = 100_000;

impl Table {
    /// Loads the persisted leases and pins. Rows with `fp == model == ""` and state pinned are pins;
    /// the hosts of stored leases and pins count as seen for their routes.
    pub fn new(
        persister: Arc<dyn Persister>,
        hosts: Arc<dyn HostView>,
        chooser: Arc<dyn Chooser>,
        idle: Duration,
    ) -> Result<Table, StoreError> {
        let mut inner = Inner {
            leases: HashMap::default(),
            by_use: BTreeSet::new(),
            counts: HashMap::default(),
            held: HashMap::default(),
            pending: HashMap::default(),
            touched: HashSet::default(),
            pins: BTreeMap::new(),
            seen: BTreeMap::new(),
            idle,
            max_leases: MAX_LEASES,
            recent: Default::default(),
            owned: HashMap::default(),
            max_per_client: MAX_LEASES,
        };
        for row in persister.list_leases()? {
            inner.see(&row.route, &row.host);
            if row.state == LeaseState::Pinned && row.fp.is_empty() && row.model.is_empty() {
                inner.pins.insert(row.route, row.host);
                continue;
            }
            if row.state == LeaseState::Pinned {
                log::warn!(
                    "odd lease row kept as a lease state=pinned route={} fp={} model={}",
                    val(&row.route),
                    val(short(&row.fp)),
                    val(&row.model)
                );
            }
            let key = Key {
                route: row.route,
                fp: row.fp,
                model: row.model,
            };
            // Owned by no one: who made it is not stored (issue 46's cap counts from start).
            let owner = crate::clientid::ClientId::default();
            inner.insert(key, row.host, (row.created, row.last_used), owner);
        }
        Ok(Table {
            persister,
            hosts,
            chooser,
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
                settled: Condvar::new(),
            }),
            operator: Mutex::new(()),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.shared.inner.lock()
    }

    /// The host for `key` (seed 000's rules, rule 3 as issue 23 has it): the route's pin; the
    /// key's own lease on a healthy host (draining still serves); else the chooser's pick among
    /// healthy, non-draining candidates, the route-level lease's host offered as inherited.
    /// `candidates` are remembered as seen for the route unless a write failed.
    pub fn acquire(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
    ) -> Result<Acquired, LeaseError> {
        Ok(self
            .acquire_inner(key, candidates, now, &Ask::default(), false)?
            .0)
    }

    /// [`Table::acquire`] for a request described by `ask`, marked in flight on its lease until
    /// the returned hold drops, in the same turn of the lock: the lease cannot be evicted between
    /// the two.
    pub fn acquire_held(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Result<(Acquired, Option<Hold>), LeaseError> {
        self.acquire_inner(key, candidates, now, ask, true)
    }

    /// The host for a request that takes no lease (metadata: model lists, health, tokenizer,
    /// counts): the pin, the key's own lease, or the chooser's pick — without creating or touching
    /// anything, so a chat UI polling its model list leaves no lease for new conversations to
    /// follow (issue 23).
    pub fn lookup(&self, key: &Key, candidates: &[String], now: i64) -> Result<String, LeaseError> {
        let inner = self.lock();
        self.lookup_locked(&inner, key, candidates, now)
    }

    /// Where a stateless request goes (embeddings, rerank): the pin, else the chooser's pick among
    /// the usable candidates; no lease is read, created or touched.
    pub fn place(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Result<Acquired, LeaseError> {
        let inner = self.lock();
        self.place_locked(&inner, key, candidates, now, ask)
    }

    /// The host `route` is pinned to, if any.
    pub fn pinned(&self, route: &str) -> Option<String> {
        self.lock().pins.get(route).cloned()
    }

    /// Every pin as `(route, host)`, sorted.
    pub fn pins(&self) -> Vec<(String, String)> {
        let inner = self.lock();
        inner
            .pins
            .iter()
            .map(|(r, h)| (r.clone(), h.clone()))
            .collect()
    }

    /// Re-leases `key` onto `host` (the context guard: the prompt no longer fits where it was).
    /// Records a `ctx` event from the previous host ("" if none); a lease already there stays as
    /// it is. Fails only on a write. Written like a new lease: the key reserved, the lock free.
    pub fn move_to(&self, key: &Key, host: &str, now: i64) -> Result<(), LeaseError> {
        let mut inner = self.lock();
        self.settle_key(&mut inner, key)?;
        let from = match inner.leases.get(key) {
            Some(lease) if lease.host == host => return Ok(()),
            Some(lease) => lease.host.clone(),
            None => String::new(),
        };
        let change = write::Change {
            to: host,
            reason: Reason::Ctx,
            from: &from,
            owner: crate::clientid::ClientId::default(),
        };
        self.put_reserved(inner, key, change, now, |inner| inner.see(&key.route, host))?;
        Ok(())
    }

    /// Remembers `hosts` as candidates of `route` (a config's route list, at start or reload), so
    /// an operator can pin to them before any traffic arrived.
    pub fn add_candidates(&self, route: &str, hosts: &[String]) {
        self.lock().see_all(route, hosts);
    }

    /// Changes the idle time used by [`Table::expire_idle`] (config reload).
    pub fn set_idle(&self, idle: Duration) {
        self.lock().idle = idle;
    }

    /// Changes the lease cap, in all and per client (config); the next new lease evicts down to
    /// them.
    pub fn set_max_leases(&self, max: usize, per_client: usize) {
        let mut inner = self.lock();
        inner.max_leases = max.max(1);
        inner.max_per_client = per_client.max(1);
    }

    /// Leases the client `owner` keeps (made by its requests since start).
    pub fn owned_by(&self, owner: crate::clientid::ClientId) -> usize {
        self.lock().owned_by(owner)
    }
}

fn lease_row(key: &Key, host: &str, created: i64, last_used: i64) -> LeaseRow {
    LeaseRow {
        route: key.route.clone(),
        fp: key.fp.clone(),
        model: key.model.clone(),
        host: host.to_string(),
        state: LeaseState::Active,
        created,
        last_used,
    }
}

/// The first 8 characters of a fingerprint, as log lines show it; `-` for the route-level one.
fn short(fp: &str) -> &str {
    match fp.char_indices().nth(8) {
        Some((i, _)) => &fp[..i],
        None if fp.is_empty() => "-",
        None => fp,
    }
}

impl Persister for Store {
    fn list_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        Store::list_leases(self)
    }
    fn submit(&self, writes: Vec<Write>) -> Ticket {
        Store::submit(self, writes)
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("Table")
            .field("leases", &inner.leases.len())
            .field("pins", &inner.pins)
            .field("idle", &inner.idle)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::NoHost => f.write_str("no usable host"),
            LeaseError::PinnedDown { host } => write!(f, "pinned host {host} is not healthy"),
            LeaseError::UnknownHost { host } => write!(f, "unknown host {host}"),
            LeaseError::Store(_) => f.write_str("cannot write the lease table"),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LeaseError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StoreError> for LeaseError {
    fn from(e: StoreError) -> LeaseError {
        LeaseError::Store(e)
    }
}
