//! What each host holds, as placing a new conversation needs it (issue 23): the prompt families
//! warm there, the new conversations on their way there, its measured prefill speed and whether
//! its forwards are failing; and, across hosts, how many tokens each family's preamble is.
//!
//! Kept per host+model in memory, every table bounded: at most [`WARM_CAP`] families per
//! host+model (least recently served forgotten first), [`FAMILY_CAP`] family sizes, [`ARRIVING_CAP`]
//! arrivals per host+model (each forgotten after [`ARRIVAL_TTL`]), [`PREFILLS`] prefills per host.
//! Entries exist only for host+model pairs a route offered for a model it serves, so nothing a
//! client names grows them. Rebuilt at start from recent rows ([`Holdings::rebuild`]).
//!
//! Pure bookkeeping under one lock: no I/O, no clock (`now` is a parameter), no calls out. The lease
//! table's chooser reads and writes it with the table's lock held (lock order: lease table, then
//! limiter, then this), so a burst of new conversations is placed one after another, each seeing
//! the ones before it as warm families and arrivals.

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::fasthash::HashMap;
use crate::fingerprint::Family;

/// Most families remembered warm per host+model.
pub const WARM_CAP: usize = 256;
/// Most family sizes remembered.
pub const FAMILY_CAP: usize = 4096;
/// Most arrivals counted per host+model.
pub const ARRIVING_CAP: usize = 1024;
/// An arrival that never reached its slot (its lease write failed, its request was refused) is
/// forgotten after this long, unix ms.
pub const ARRIVAL_TTL: i64 = 10_000;
/// Most conversations remembered per host+model as ended since the last request was sent (more
/// than a host has slots only when answers outpace requests).
pub const UNSAVED_CAP: usize = 64;
/// Prefills kept per host for its speed.
pub const PREFILLS: usize = 32;
/// Shorter prefills say more about per-request overhead than about a host's speed. llama-server
/// evaluates a prompt in batches of 512 tokens (`--ubatch-size`): a shorter one runs a partial
/// batch and measures slower per token, so a host serving continuing turns (a few hundred new
/// tokens each) looked slower than one prefilling first turns (issue 23, real servers).
pub const MIN_PREFILL: u64 = 512;
/// A host's prefill speed counts for placement once this many prefills measured it; until then
/// it is unmeasured (the route's median, or all the candidates' prefills pooled). Its first prefills ran while the other hosts were idle
/// or it was, and one of them stood for its speed: three identical real llama-servers measured
/// 9,505 against 1,402 tokens/s, and the "fast" one took every new conversation from the sixth
/// on, 20 of 24 (issue 23's agents benchmark, with llama-server's defaults: 1.57 of the oracle's
/// prefill).
pub const MIN_SPEED_SAMPLES: usize = 8;
/// A warm first turn that found fewer of its family's tokens than this (or than a quarter of the
/// family's bytes ÷ 4) missed: the host did not hold the family yet, which says nothing of its
/// size. llama-server with `--slot-prompt-similarity 0` gives a new conversation an empty slot and
/// finds a sibling's prompt only once it is in the RAM cache, where an idle slot is copied when
/// the next task starts; taken as a size, one such miss made the family worth 0 for good and its
/// conversations were placed by load alone (the chat workload's `sps0`, 1.10 of the oracle).
pub const MIN_FAMILY_HIT: u64 = 64;

/// What placement knows about one host+model, for one request's family.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Facts {
    /// Tokens of the request's family prefix the host holds warm (0: none, or no family).
    pub family_tokens: u64,
    /// The family's size in tokens, warm there or not (0: no family).
    pub family_size: u64,
    /// New conversations placed there that have not taken a slot yet.
    pub arriving: usize,
    /// Measured prefill speed, tokens per second, once [`MIN_SPEED_SAMPLES`] prefills measured it.
    pub prefill_tps: Option<f64>,
    /// Its forwarded requests have been failing since its last success.
    pub failing: bool,
}

/// One recent answered row with a family, for [`Holdings::rebuild`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    pub host: String,
    pub model: String,
    pub family: u32,
    /// Its cached tokens, when it was a first turn placed for its family.
    pub warm_first_cached: Option<u64>,
}

/// The shared memory of what hosts hold. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Holdings {
    inner: Mutex<Inner>,
}

/// Invariants: `pairs[host][model].warm.len() <= WARM_CAP`, `.arriving.len() <= ARRIVING_CAP`
/// (oldest first), `hosts[h].prefills.len() <= PREFILLS`, `families.len() <= FAMILY_CAP`; `tick`
/// grows with every use, so a smaller stamp is a less recent use.
#[derive(Debug, Default)]
struct Inner {
    pairs: HashMap<String, HashMap<String, Pair>>,
    hosts: HashMap<String, HostFacts>,
    families: HashMap<u32, Size>,
    tick: u64,
}

#[derive(Debug, Default)]
struct Pair {
    /// Family id → the tick of its last placement or answer here.
    warm: HashMap<u32, u64>,
    /// When each arrival was placed, oldest first.
    arriving: VecDeque<i64>,
    /// Answers the host gave for this model (issue 47: how many turns took its slots since a
    /// conversation's last one).
    turns: u64,
    /// Conversations (`slots::conversation`) whose answer ended here since crossbar last sent
    /// the host a request, oldest first, at most [`UNSAVED_CAP`]: each one's newest state is in an
    /// idle slot that the host has not copied to its RAM cache yet (it copies idle slots as a
    /// task starts). `proxy/stash.rs` has it copy them before such a conversation's next turn.
    unsaved: Vec<u64>,
}

#[derive(Debug, Default)]
struct HostFacts {
    /// `(tokens, microseconds)` of recent prefills of at least [`MIN_PREFILL`] tokens.
    prefills: VecDeque<(u64, u64)>,
    failing: bool,
}

#[derive(Debug, Clone, Copy)]
struct Size {
    /// The smallest first-turn `cache_n` seen where the family was warm.
    cached: Option<u64>,
    bytes: u64,
    stamp: u64,
}

/// How one request the host answered went, for [`Holdings::served`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    /// A whole 2xx answer; anything else only says the host is not failing.
    pub ok: bool,
    pub family: Option<Family>,
    /// A first turn placed where its family was warm: its `cache_n` measures the family.
    pub warm_first_turn: bool,
    pub cached: Option<u64>,
    /// The conversation it answered (`slots::conversation`), if it was one.
    pub conversation: Option<u64>,
}

impl Holdings {
    /// [`Facts`] of `host`+`model` for a request of `family`, arrivals older than
    /// [`ARRIVAL_TTL`] forgotten first.
    pub fn facts(&self, host: &str, model: &str, family: Option<Family>, now: i64) -> Facts {
        let mut inner = self.inner.lock();
        let size = family.map_or(0, |f| inner.family_tokens(f));
        let host_facts = inner.hosts.get(host);
        let prefill_tps = (host_facts)
            .filter(|h| h.prefills.len() >= MIN_SPEED_SAMPLES)
            .and_then(HostFacts::tps);
        let failing = host_facts.is_some_and(|h| h.failing);
        let Some(pair) = inner.pairs.get_mut(host).and_then(|m| m.get_mut(model)) else {
            return Facts {
                family_size: size,
                prefill_tps,
                failing,
                ..Facts::default()
            };
        };
        while pair.arriving.front().is_some_and(|t| now - t > ARRIVAL_TTL) {
            pair.arriving.pop_front();
        }
        let warm = family.and_then(|f| pair.warm.get(&f.id));
        Facts {
            family_tokens: if warm.is_some() { size } else { 0 },
            family_size: size,
            arriving: pair.arriving.len(),
            prefill_tps,
            failing,
        }
    }

    /// A new conversation (or a stateless request) was placed on `host`: its family counts as warm
    /// there from now on, and it counts as arriving until it takes its slot or its place in line
    /// ([`Holdings::arrived`]). `slot` is false for a request that will take none.
    pub fn placed(&self, host: &str, model: &str, family: Option<Family>, slot: bool, now: i64) {
        let mut inner = self.inner.lock();
        let tick = inner.next_tick();
        if let Some(f) = family {
            inner.remember_size(f, tick);
        }
        let pair = inner.pair(host, model);
        if let Some(f) = family {
            warm(pair, f.id, tick);
        }
        if slot {
            if pair.arriving.len() == ARRIVING_CAP {
                pair.arriving.pop_front();
            }
            pair.arriving.push_back(now);
        }
    }

    /// One request placed on `host`+`model` took its slot or its place in line (or gave up
    /// before): it no longer counts as arriving.
    pub fn arrived(&self, host: &str, model: &str) {
        let mut inner = self.inner.lock();
        if let Some(pair) = inner.pairs.get_mut(host).and_then(|m| m.get_mut(model)) {
            pair.arriving.pop_front();
        }
    }

    /// A request on `host`+`model` was answered by the host: the host is not failing; after a
    /// whole 2xx answer its family is warm there, and a warm first turn's `cache_n` may lower the
    /// family's size.
    pub fn served(&self, host: &str, model: &str, served: Served) {
        let mut inner = self.inner.lock();
        let tick = inner.next_tick();
        inner.host(host).failing = false;
        let pair = inner.pair(host, model);
        pair.turns += 1;
        if let Some(conversation) = served.conversation {
            if pair.unsaved.len() == UNSAVED_CAP {
                pair.unsaved.remove(0);
            }
            pair.unsaved.push(conversation);
        }
        let (true, Some(family)) = (served.ok, served.family) else {
            return;
        };
        inner.remember_size(family, tick);
        if let (true, Some(cached)) = (served.warm_first_turn, served.cached) {
            if let Some(size) = inner.families.get_mut(&family.id) {
                size.measured(cached);
            }
        }
        warm(inner.pair(host, model), family.id, tick);
    }

    /// A request of `conversation` is being sent to `host` for `model`, so the host will copy its
    /// idle slots to its RAM cache as the task starts: returns whether that conversation's answer
    /// ended there since the last request was sent (its newest state has no copy yet).
    pub fn launch(&self, host: &str, model: &str, conversation: Option<u64>) -> bool {
        let mut inner = self.inner.lock();
        let Some(pair) = inner.pairs.get_mut(host).and_then(|m| m.get_mut(model)) else {
            return false;
        };
        // Cleared, not taken: the list keeps its room for the next answers.
        let unsaved = conversation.is_some_and(|c| pair.unsaved.contains(&c));
        pair.unsaved.clear();
        unsaved
    }

    /// Answers `host` gave for `model` so far.
    pub fn turns(&self, host: &str, model: &str) -> u64 {
        let inner = self.inner.lock();
        (inner.pairs.get(host).and_then(|m| m.get(model))).map_or(0, |p| p.turns)
    }

    /// A prefill of `tokens` took `us` microseconds on `host` (an answer's `timings`): it counts
    /// towards the host's speed when it is long enough to say something.
    pub fn prefilled(&self, host: &str, tokens: u64, us: u64) {
        if tokens < MIN_PREFILL || us == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        let prefills = &mut inner.host(host).prefills;
        if prefills.len() == PREFILLS {
            prefills.pop_front();
        }
        prefills.push_back((tokens, us));
    }

    /// A forward to `host` failed in a way that may be the host's: it ranks last among new
    /// placements until it answers again.
    pub fn failed(&self, host: &str) {
        self.inner.lock().host(host).failing = true;
    }

    /// The families warm on `host`+`model`, most recently used first, with their sizes in tokens.
    pub fn warm_on(&self, host: &str, model: &str) -> Vec<(Family, u64)> {
        let inner = self.inner.lock();
        let Some(pair) = inner.pairs.get(host).and_then(|m| m.get(model)) else {
            return Vec::new();
        };
        let mut warm: Vec<(u64, u32)> = pair.warm.iter().map(|(id, tick)| (*tick, *id)).collect();
        warm.sort_unstable_by(|a, b| b.cmp(a));
        (warm.into_iter())
            .map(|(_, id)| {
                let bytes = inner.families.get(&id).map_or(0, |s| s.bytes);
                let family = Family { id, bytes };
                (family, inner.family_tokens_of(id).unwrap_or(bytes / 4))
            })
            .collect()
    }

    /// The measured prefill speed of `host`, tokens per second.
    pub fn prefill_tps(&self, host: &str) -> Option<f64> {
        self.inner.lock().hosts.get(host).and_then(HostFacts::tps)
    }

    /// The prefill speed of `hosts` together, from every prefill each has kept however few:
    /// the scale of a route's speed before any one host is measured apart.
    pub fn pooled_tps<'h>(&self, hosts: impl IntoIterator<Item = &'h str>) -> Option<f64> {
        let inner = self.inner.lock();
        speed(
            (hosts.into_iter())
                .filter_map(|h| inner.hosts.get(h))
                .flat_map(|h| h.prefills.iter()),
        )
    }

    /// Rebuilds warm families and family sizes from recent rows, oldest first (at start: what the
    /// hosts held before a restart is still in their caches).
    pub fn rebuild(&self, rows: impl IntoIterator<Item = Recent>) {
        let mut inner = self.inner.lock();
        for row in rows {
            let tick = inner.next_tick();
            let family = Family {
                id: row.family,
                bytes: 0,
            };
            inner.remember_size(family, tick);
            if let (Some(cached), Some(size)) =
                (row.warm_first_cached, inner.families.get_mut(&row.family))
            {
                size.measured(cached);
            }
            warm(inner.pair(&row.host, &row.model), row.family, tick);
        }
    }

    /// Forgets what `host` holds warm (it restarted, issue 47): its families are cold there until
    /// it serves them again. Its measured speed stays: the same box prefills as fast.
    pub fn forget_host(&self, host: &str) {
        self.inner.lock().pairs.remove(host);
    }

    /// Forgets hosts the config no longer has.
    pub fn retain_hosts(&self, keep: impl Fn(&str) -> bool) {
        let mut inner = self.inner.lock();
        inner.pairs.retain(|h, _| keep(h));
        inner.hosts.retain(|h, _| keep(h));
    }
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn host(&mut self, host: &str) -> &mut HostFacts {
        if !self.hosts.contains_key(host) {
            self.hosts.insert(host.to_string(), HostFacts::default());
        }
        self.hosts.get_mut(host).expect("inserted above")
    }

    fn pair(&mut self, host: &str, model: &str) -> &mut Pair {
        // Looked up before inserting so the common case allocates nothing.
        if !self.pairs.contains_key(host) {
            self.pairs.insert(host.to_string(), HashMap::default());
        }
        let models = self.pairs.get_mut(host).expect("inserted above");
        if !models.contains_key(model) {
            models.insert(model.to_string(), Pair::default());
        }
        models.get_mut(model).expect("inserted above")
    }

    fn family_tokens_of(&self, id: u32) -> Option<u64> {
        let size = self.families.get(&id)?;
        Some(size.cached.unwrap_or(size.bytes / 4))
    }

    /// A family's size in tokens: its smallest warm first-turn `cache_n`, else its bytes ÷ 4.
    fn family_tokens(&self, family: Family) -> u64 {
        self.family_tokens_of(family.id).unwrap_or(family.bytes / 4)
    }

    fn remember_size(&mut self, family: Family, tick: u64) {
        if let Some(size) = self.families.get_mut(&family.id) {
            size.stamp = tick;
            // A size rebuilt from rows learns its bytes from the family's next request.
            size.bytes = size.bytes.max(family.bytes);
            return;
        }
        if self.families.len() >= FAMILY_CAP {
            evict_oldest(&mut self.families, |s| s.stamp);
        }
        let size = Size {
            cached: None,
            bytes: family.bytes,
            stamp: tick,
        };
        self.families.insert(family.id, size);
    }
}

/// Marks `id` warm in `pair` at `tick`, forgetting the least recently used family past the cap.
fn warm(pair: &mut Pair, id: u32, tick: u64) {
    if !pair.warm.contains_key(&id) && pair.warm.len() >= WARM_CAP {
        evict_oldest(&mut pair.warm, |t| *t);
    }
    pair.warm.insert(id, tick);
}

/// Removes the entry with the smallest stamp (a scan: only when a full table takes a new entry).
fn evict_oldest<V>(map: &mut HashMap<u32, V>, stamp: impl Fn(&V) -> u64) {
    let oldest = map.iter().min_by_key(|(_, v)| stamp(v)).map(|(k, _)| *k);
    if let Some(k) = oldest {
        map.remove(&k);
    }
}

impl Size {
    /// A warm first turn found `cached` tokens: the smallest hit is the family's size, a miss
    /// ([`MIN_FAMILY_HIT`]) is not a size. (Rebuilt from rows, the bytes are not known yet: only
    /// the fixed floor applies.)
    fn measured(&mut self, cached: u64) {
        if cached < MIN_FAMILY_HIT.max(self.bytes / 16) {
            return;
        }
        self.cached = Some(self.cached.map_or(cached, |c| c.min(cached)));
    }
}

impl HostFacts {
    fn tps(&self) -> Option<f64> {
        speed(&self.prefills)
    }
}

/// Tokens per second over `(tokens, microseconds)` prefills; `None` without any.
fn speed<'p>(prefills: impl IntoIterator<Item = &'p (u64, u64)>) -> Option<f64> {
    let (tokens, us) = (prefills.into_iter()).fold((0u64, 0u64), |(t, u), (a, b)| (t + a, u + b));
    (us > 0).then(|| tokens as f64 * 1e6 / us as f64)
}

mod arrival;

pub use arrival::Arrival;

#[cfg(test)]
mod tests;
