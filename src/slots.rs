//! Slot pinning (an `exclusive` host's, off by default): which of a host's slots each request
//! takes, sent to llama-server as the request's `id_slot`.
//!
//! Left to itself llama-server (b11434, `get_available_slot`) gives a request the idle slot whose
//! cached prompt shares the longest prefix with it, above `--slot-prompt-similarity`. A
//! conversation whose own slot went to someone else while it thought therefore lands on a
//! *sibling's* slot (one sharing its system prompt), and since more than half of that slot
//! survives, llama-server neither saves the sibling's state to its RAM cache nor reloads the
//! conversation's own from there: the conversation prefills its history again, and the sibling,
//! back next, does the same to it. Two siblings on one host wipe each other turn after turn.
//!
//! A slot asked for by id goes through the same check on that slot alone: one sharing little with
//! the prompt (similarity 0) is saved and the RAM cache searched for a better state, as a slot
//! chosen by least recent use always is. crossbar knows which conversation each slot last
//! served, so it sends a returning conversation whose own slot is gone to a slot whose occupant
//! gets saved — and its own history comes back from RAM.
//!
//! When only siblings' slots are free (three conversations of one family on two slots), a
//! returning conversation pinned to one would keep it whole and reload nothing. If its own state
//! is in RAM — crossbar remembers which conversations' states were copied or saved there — the
//! slot is saved first ([`Claim::saves_first`]): a request of one newline pinned there shares
//! only the start of text with the sibling's state, so llama-server saves that state and keeps
//! three tokens, and the conversation then reloads its own (`proxy/pin.rs` sends it).
//!
//! The mirror is exact about which slot each pinned request took; what the slot holds is
//! crossbar's belief: a request that went unpinned may have changed it. A wrong belief costs a
//! prefill. Which slots are *busy* must never be wrong: on b11434 a request pinned to a busy slot
//! waits for it, but first saves and reloads that slot's state under the generation running
//! there, and corrupts it. So a slot is free in the mirror only once its request ended with its
//! answer's end (llama-server releases a slot before that end goes out); one whose request ended
//! early (its client left, the host broke off) is in doubt — llama-server may still be generating
//! there — until a `/slots` poll started after it shows it idle (`saw`); and nothing is pinned
//! while a request crossbar could not pin (Messages, embeddings, a client's own `id_slot`) is in
//! flight on the host, since llama-server chose its slot. One left early makes every slot not
//! busy in doubt. Nor is a request crossbar could not pin sent while a pinned one is *unsettled*:
//! sent, but not yet seen started at the host (its answer's head, a `/slots` poll that shows its
//! slot at work, or its end). llama-server might otherwise launch the unpinned one first, into
//! the pinned one's slot, and the pin would then reload a state under its generation (`settle.rs`).
//! crossbar must be the host's only client. A host with similarity off is not pinned: there
//! llama-server never saves or reloads a slot asked for by id, and crossbar keeps each
//! conversation's last turn in its RAM cache instead (`proxy/stash.rs`), which measured better
//! (docs/BENCHMARKS.md). Pinning assumes the RAM cache (`--cache-ram`, on by default) and no
//! unified KV (an explicit `-np`: with unified KV idle slots are cleared, and an empty slot asked
//! for by id reloads nothing).

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};

mod body;
mod claim;
mod pick;
mod polled;
mod settle;
mod shown;

pub use body::{insert_id, pinnable, remove_id};
pub use claim::{Claim, End, Pin};
pub(crate) use pick::{choose, kept_whole};
pub use polled::{parse_slots, Polled};
pub use shown::{Mirror, Shown};

/// Most host+model pairs the mirror keeps (exclusive hosts times their models); past it
/// the mirror starts over, which costs nothing but a few better placements.
const MAX_PAIRS: usize = 1024;
/// Most slots mirrored per host+model.
pub const MAX_SLOTS: usize = 256;
/// Most conversations remembered per host+model as having their state in its RAM cache.
const MAX_IN_RAM: usize = 64;

/// A monotonic clock in µs (from its first reading): what dates a slot's doubt and a `/slots`
/// poll's start. Not the wall clock: stepped back between a poll's start and a request's early
/// end, it would date the end before the poll, and that poll — which may have seen the slot
/// still busy — would free it for a pin under a running generation.
pub fn now_us() -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    i64::try_from(epoch.elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// What crossbar believes each pinning host's slots hold. Cheap to share.
#[derive(Debug, Default, Clone)]
pub struct Slots {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    table: Mutex<Table>,
    /// A pinned request settled or ended: requests crossbar could not pin may be waiting for it.
    settled: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock()
    }
}

/// Invariants: `pairs.len() <= MAX_PAIRS`, every pair's `slots` at most `MAX_SLOTS` long; `tick`
/// grows on every take and end, so a smaller `last_used` is a less recent use.
#[derive(Debug, Default)]
struct Table {
    pairs: HashMap<(String, String), Pair>,
    tick: u64,
}

#[derive(Debug, Default)]
struct Pair {
    slots: Vec<Slot>,
    /// Requests in flight there that crossbar did not pin: while any is, it pins nothing.
    unpinned: usize,
    /// Of those, the ones waiting for the pinned requests sent before them to settle.
    waiting: usize,
    /// Prompt tokens the host counted for request bodies of `bytes` bytes, to size a family in
    /// its tokens (a body's bytes ÷ 4 undercounts by half on the tiny test model's tokenizer).
    tokens: u64,
    bytes: u64,
    /// Conversations whose last state crossbar believes is in the host's RAM cache, oldest
    /// first, at most [`MAX_IN_RAM`]: copied there while idle, or saved when their slot went to
    /// another. A belief: the cache drops its oldest states unseen.
    in_ram: VecDeque<u64>,
}

impl Pair {
    /// `bytes` of a request body in the host's tokens, by what it counted so far (÷ 4 before).
    fn tokens_of(&self, bytes: u64) -> u64 {
        if self.bytes == 0 {
            return bytes / 4;
        }
        (u128::from(bytes) * u128::from(self.tokens) / u128::from(self.bytes)) as u64
    }

    /// `conversation`'s last state is in RAM now.
    fn saved(&mut self, conversation: u64) {
        self.not_in_ram(conversation);
        if self.in_ram.len() >= MAX_IN_RAM {
            self.in_ram.pop_front();
        }
        self.in_ram.push_back(conversation);
    }

    /// `conversation`'s last state is not in RAM (overwritten unsaved, or loaded into a slot).
    fn not_in_ram(&mut self, conversation: u64) {
        self.in_ram.retain(|&c| c != conversation);
    }

    /// The host counted `tokens` prompt tokens for a body of `bytes` bytes. Halved past a GiB,
    /// so the measure follows the traffic.
    fn counted(&mut self, tokens: u64, bytes: u64) {
        self.tokens = self.tokens.saturating_add(tokens);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > 1 << 30 {
            (self.tokens, self.bytes) = (self.tokens / 2, self.bytes / 2);
        }
    }
}

/// One slot as crossbar last left it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Slot {
    /// The conversation it last served (`None`: not known since crossbar started).
    pub(crate) holder: Option<u64>,
    pub(crate) family: Option<u32>,
    /// Tokens it holds: the last request's prompt plus completion (its prompt estimate until it
    /// is answered).
    pub(crate) tokens: u64,
    pub(crate) busy: bool,
    /// Since when ([`now_us`]) llama-server may still be busy there: a request ended early. Never
    /// pinned until a `/slots` poll started later shows it idle.
    pub(crate) doubtful_since: Option<i64>,
    /// A pinned request taken here at this time ([`now_us`]) is not yet seen started at the host
    /// (`settle.rs`): nothing unpinned is sent meanwhile.
    pub(crate) unsettled_since: Option<i64>,
    /// Its state is in the host's RAM cache: llama-server's `--cache-idle-slots` (on with the
    /// RAM cache) copies every idle slot there each time a task starts.
    pub(crate) saved: bool,
    pub(crate) last_used: u64,
}

impl Slot {
    /// Holding nothing known, in doubt since `now`.
    fn doubtful(now: i64) -> Slot {
        Slot {
            doubtful_since: Some(now),
            ..Slot::default()
        }
    }

    fn free(&self) -> bool {
        !self.busy && self.doubtful_since.is_none()
    }
}

/// The request a slot is wanted for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Want {
    /// [`conversation`] of its lease key.
    pub conversation: u64,
    pub family: Option<u32>,
    /// Bytes of its family preamble, 0 without a family.
    pub family_bytes: u64,
    /// Its conversation is new on this host: no history of its own to get back.
    pub first_turn: bool,
    /// Bytes of its body.
    pub bytes: u64,
}

/// What the host counted for a request answered whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
}

/// A conversation's id in the mirror, from its lease fingerprint.
pub fn conversation(fp: &str) -> u64 {
    let mut h = DefaultHasher::new();
    fp.hash(&mut h);
    h.finish()
}

impl Slots {
    /// The slot of `host`+`model` (which has `count` slots) for `want` — a request crossbar can
    /// pin — or, when it cannot (`None`) or no slot is surely free, its place among the
    /// unpinned. Either way the request's end must be told ([`Claim::finish`]); dropped
    /// without, it ended early. `now` is [`now_us`].
    pub fn take(
        &self,
        (host, model): (&str, &str),
        count: usize,
        want: Option<&Want>,
        now: i64,
    ) -> Claim {
        let count = count.clamp(1, MAX_SLOTS);
        let mut table = self.shared.lock();
        let key = (host.to_string(), model.to_string());
        if !table.pairs.contains_key(&key) && table.pairs.len() >= MAX_PAIRS {
            table.pairs.clear();
        }
        table.tick += 1;
        let tick = table.tick;
        let pair = table.pairs.entry(key.clone()).or_default();
        if pair.slots.len() != count {
            // New, or the host's slot count changed (a config reload): nothing known holds, and
            // nothing is surely free until a poll says so.
            // (At start too: a crossbar before this one may have left a generation running.)
            pair.slots = vec![Slot::doubtful(now); count];
        }
        let at = want.filter(|_| pair.unpinned == 0).and_then(|want| {
            let family_tokens = pair.tokens_of(want.family_bytes);
            let at = choose(&pair.slots, want, family_tokens)?;
            Some((want, at, kept_whole(&pair.slots[at], want, family_tokens)))
        });
        let end = End::new(self.shared.clone(), key);
        let Some((want, at, kept)) = at else {
            pair.unpinned += 1;
            return Claim::Unpinned(end);
        };
        // A returning conversation whose state is in RAM, sent to a sibling's slot that would
        // keep it whole: the slot is saved first (`Claim::saves_first`), so that the conversation
        // reloads its own state rather than prefilling its history again.
        let before = &pair.slots[at];
        let save_first = kept
            && !want.first_turn
            && before.holder != Some(want.conversation)
            && pair.in_ram.contains(&want.conversation);
        // What the slot held stays in RAM when it was copied there, or when llama-server saves it
        // as this request takes it (less than half of it kept), or crossbar saves it first.
        match before.holder {
            Some(held) if before.saved || !kept || save_first => pair.saved(held),
            Some(held) => pair.not_in_ram(held),
            None => {}
        }
        // This conversation's state now lives in the slot (a state loaded from RAM leaves it).
        pair.not_in_ram(want.conversation);
        // `--cache-idle-slots`: as this task starts, every other idle slot is copied to RAM.
        let copied: Vec<u64> = (pair.slots.iter_mut().enumerate())
            .filter(|(i, s)| *i != at && !s.busy)
            .filter_map(|(_, slot)| {
                slot.saved = true;
                slot.holder
            })
            .collect();
        copied.into_iter().for_each(|held| pair.saved(held));
        pair.slots[at] = Slot {
            holder: Some(want.conversation),
            family: want.family,
            tokens: pair.tokens_of(want.bytes),
            busy: true,
            doubtful_since: None,
            unsettled_since: Some(now),
            saved: false,
            last_used: tick,
        };
        Claim::Pinned(Pin::new(end, at, want.bytes, save_first))
    }

    /// Forgets the mirror of every model of `host` (it restarted, or the probe filled its
    /// slots): made again, every slot in doubt, at its next poll.
    pub fn forget_host(&self, host: &str) {
        let mut table = self.shared.lock();
        table.pairs.retain(|(h, _), _| h != host);
    }

    /// Makes the mirror of a pinning host's model when it has none yet, `count` slots each in
    /// doubt from `now` until a `/slots` poll started later shows it idle.
    pub(crate) fn prepare_pair(&self, (host, model): (&str, &str), count: usize, now: i64) {
        let mut table = self.shared.lock();
        let key = (host.to_string(), model.to_string());
        if !table.pairs.contains_key(&key) && table.pairs.len() >= MAX_PAIRS {
            return;
        }
        let count = count.clamp(1, MAX_SLOTS);
        let pair = table.pairs.entry(key).or_insert_with(|| Pair {
            slots: vec![Slot::doubtful(now); count],
            ..Pair::default()
        });
        if pair.slots.len() != count {
            // The host's slots are known now, or changed: nothing known holds.
            pair.slots = vec![Slot::doubtful(now); count];
        }
    }

    /// A `/slots` poll of `host` that started at `started` ([`now_us`]) saw what `seen` says: the
    /// idle slots in doubt since before it are free again, and a pinned request taken before it
    /// whose slot is at work has started there (settled).
    pub fn saw(&self, host: &str, started: i64, seen: &Polled) {
        let marks = |ids: &[usize]| {
            let mut marked = [false; MAX_SLOTS];
            ids.iter()
                .filter(|&&id| id < MAX_SLOTS)
                .for_each(|&id| marked[id] = true);
            marked
        };
        let (idle, busy) = (marks(&seen.idle), marks(&seen.busy));
        let mut table = self.shared.lock();
        let mut settled = false;
        for (_, pair) in table.pairs.iter_mut().filter(|((h, _), _)| h == host) {
            for (id, slot) in pair.slots.iter_mut().enumerate() {
                if idle[id] && slot.doubtful_since.is_some_and(|t| t < started) {
                    slot.doubtful_since = None;
                }
                if busy[id] && slot.unsettled_since.is_some_and(|t| t < started) {
                    (slot.unsettled_since, settled) = (None, true);
                }
            }
        }
        drop(table);
        if settled {
            self.shared.settled.notify_all();
        }
    }

    /// Whether a request for `host`+`model` that can be pinned would be now: its mirror is made,
    /// no slot is in doubt, and no request there goes unpinned (while one does, none is pinned:
    /// [`Slots::take`]). Placement reads it (issue 47): a family gathers on a host whose slots are
    /// picked by similarity only while its siblings keep their slots there.
    pub fn pins_now(&self, host: &str, model: &str) -> bool {
        let table = self.shared.lock();
        (table.pairs.get(&(host.to_string(), model.to_string()))).is_some_and(|pair| {
            pair.unpinned == 0 && pair.slots.iter().all(|s| s.doubtful_since.is_none())
        })
    }

    /// Whether any slot of `host` is in doubt.
    pub fn doubtful(&self, host: &str) -> bool {
        let table = self.shared.lock();
        (table.pairs.iter())
            .filter(|((h, _), _)| h == host)
            .any(|(_, pair)| pair.slots.iter().any(|s| s.doubtful_since.is_some()))
    }

    /// Whether a `/slots` poll of `host` would tell something wanted: a slot is in doubt, or a
    /// request waits for a pinned one to settle.
    pub fn wants_poll(&self, host: &str) -> bool {
        let table = self.shared.lock();
        (table.pairs.iter())
            .filter(|((h, _), _)| h == host)
            .any(|(_, pair)| {
                pair.waiting > 0 || pair.slots.iter().any(|s| s.doubtful_since.is_some())
            })
    }

    /// The mirror of `host`+`model`, for tests.
    #[cfg(test)]
    pub(crate) fn of(&self, host: &str, model: &str) -> Vec<Slot> {
        let key = (host.to_string(), model.to_string());
        let table = self.shared.lock();
        table
            .pairs
            .get(&key)
            .map(|p| p.slots.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
