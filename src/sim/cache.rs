//! The simulated prompt cache: slots that remember their last prompt (+ generated text) and a bounded
//! RAM cache of slot states, chosen the way llama-server (b11434) chooses: the idle slot with the
//! longest common prefix above `--slot-prompt-similarity` (0.10; 0 turns this off), else the least
//! recently used idle slot; and, as its default `--cache-idle-slots` does, a copy of every other idle
//! slot saved to the RAM cache each time a task starts. The RAM cache is llama-server's
//! `server_prompt_cache` (server-task.cpp): oldest saved, first dropped; a state already held is not
//! saved again; a state loaded into a slot leaves it; and only a state that beats the slot's own on
//! both counts is loaded.
//!
//! Pure bookkeeping: no I/O, no clocks, no waiting — the caller holds the lock and waits for a slot.
//! Tokens are a deterministic stand-in for a tokenizer: 4 bytes of rendered prompt per token.

/// Bytes per simulated token.
pub(super) const TOKEN_BYTES: usize = 4;

/// Number of tokens in `bytes` bytes of rendered text.
pub(super) fn tokens(bytes: usize) -> u64 {
    bytes.div_ceil(TOKEN_BYTES) as u64
}

/// Tokens shared by two texts from their start (whole tokens only).
fn common_tokens(a: &[u8], b: &[u8]) -> u64 {
    (a.iter().zip(b).take_while(|(x, y)| x == y).count() / TOKEN_BYTES) as u64
}

/// `--slot-prompt-similarity` default.
pub(super) const SIMILARITY: f64 = 0.10;

/// A saved state keeping less than this share of itself is never loaded ("don't trash large
/// prompts", server-task.cpp).
const MIN_KEEP: f64 = 0.25;

/// Where a request landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Landed {
    pub slot: usize,
    /// Prompt tokens reused from the cache (never the whole prompt: one token is re-evaluated).
    pub cache_n: u64,
}

/// Slots and RAM cache of one simulated server.
///
/// Invariants: a busy slot is never chosen; `ram` never holds more than `ram_limit` tokens in total
/// and is in the order its states were saved; `tick` grows on every take and put back, so
/// `last_used` orders slots by recency.
#[derive(Debug)]
pub(super) struct Pool {
    slots: Vec<Slot>,
    /// Saved slot states (rendered text), oldest first.
    ram: Vec<Vec<u8>>,
    ram_limit: u64,
    /// Slot choice by common prefix needs more than this share of the prompt; 0 = LRU only.
    similarity: f64,
    tick: u64,
}

#[derive(Debug, Default)]
struct Slot {
    cached: Vec<u8>,
    busy: bool,
    last_used: u64,
}

impl Pool {
    pub fn new(slots: usize, ram_limit_tokens: u64) -> Pool {
        Pool {
            slots: (0..slots.max(1)).map(|_| Slot::default()).collect(),
            ram: Vec::new(),
            ram_limit: ram_limit_tokens,
            similarity: SIMILARITY,
            tick: 0,
        }
    }

    /// Sets `--slot-prompt-similarity` (0 disables choosing a slot by prefix).
    pub fn with_similarity(mut self, similarity: f64) -> Pool {
        self.similarity = similarity;
        self
    }

    /// Busy flag of every slot, by slot id.
    pub fn busy(&self) -> Vec<bool> {
        self.slots.iter().map(|s| s.busy).collect()
    }

    /// Forgets every cached prompt, in idle slots and in RAM: the model was unloaded (router mode).
    /// A busy slot keeps generating; what it leaves behind is the new model's.
    pub fn forget(&mut self) {
        for slot in self.slots.iter_mut().filter(|s| !s.busy) {
            slot.cached.clear();
        }
        self.ram.clear();
    }

    /// Takes an idle slot for `prompt`, or `None` when all are busy (the caller waits).
    /// With `use_cache == false` (`cache_prompt: false`) nothing is reused. `pinned` is the
    /// request's `id_slot` (taken modulo the slot count, as llama-server does): that slot or a
    /// wait for it.
    pub fn try_take(
        &mut self,
        prompt: &[u8],
        use_cache: bool,
        pinned: Option<usize>,
    ) -> Option<Landed> {
        let (id, update_cache) = match pinned {
            Some(at) => self.pinned(at % self.slots.len(), prompt)?,
            None => self.chosen(prompt)?,
        };
        let prompt_tokens = tokens(prompt.len());
        self.tick += 1;
        let tick = self.tick;

        let mut text = std::mem::take(&mut self.slots[id].cached);
        let mut reused = common_tokens(&text, prompt);
        if update_cache && self.ram_limit > 0 {
            // An empty slot has nothing to save, but may still load a state from RAM.
            if !text.is_empty() {
                self.save(text.clone());
            }
            if let Some(i) = self.better_in_ram(&text, prompt) {
                text = self.ram.remove(i);
                reused = common_tokens(&text, prompt);
            }
        }
        let slot = &mut self.slots[id];
        slot.cached = text;
        slot.busy = true;
        slot.last_used = tick;
        // `--cache-idle-slots`: the other idle slots' states are copied to RAM as the task starts.
        if self.ram_limit > 0 {
            let idle: Vec<Vec<u8>> = (self.slots.iter())
                .filter(|s| !s.busy && !s.cached.is_empty())
                .map(|s| s.cached.clone())
                .collect();
            for text in idle {
                self.save(text);
            }
        }
        let cache_n = if use_cache {
            reused.min(prompt_tokens.saturating_sub(1))
        } else {
            0
        };
        Some(Landed { slot: id, cache_n })
    }

    /// The slot llama-server chooses for `prompt` itself, and whether it saves and reloads.
    fn chosen(&self, prompt: &[u8]) -> Option<(usize, bool)> {
        let prompt_tokens = tokens(prompt.len());
        let idle = || self.slots.iter().enumerate().filter(|(_, s)| !s.busy);
        let similarity = self.similarity;
        let by_prefix = idle()
            .filter(|_| similarity > 0.0)
            .map(|(i, s)| (i, common_tokens(&s.cached, prompt)))
            .filter(|&(_, n)| n > 0 && n as f64 / prompt_tokens.max(1) as f64 > similarity)
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
            .map(|(i, _)| i);
        // As llama-server's get_available_slot: a slot chosen by similarity is saved to RAM only if
        // less than half of it survives; one chosen by LRU always is; RAM is searched after a save.
        Some(match by_prefix {
            Some(i) => (i, self.keeps_less_than_half(i, prompt)),
            // Of slots used equally long ago (never, at start) llama-server takes the last.
            None => (idle().rev().min_by_key(|(_, s)| s.last_used)?.0, true),
        })
    }

    /// Slot `at`, asked for by `id_slot`, unless it is busy. llama-server (b11434) runs its
    /// similarity check on that slot alone: one sharing more than the similarity share of the
    /// prompt is saved and reloaded when less than half of it survives, as above; any other
    /// holding something always is (its similarity counts as 0); an empty one never (0 / 0);
    /// and with similarity off nothing is ever saved or reloaded.
    fn pinned(&self, at: usize, prompt: &[u8]) -> Option<(usize, bool)> {
        let slot = &self.slots[at];
        if slot.busy {
            return None;
        }
        let common = common_tokens(&slot.cached, prompt);
        let similar =
            common > 0 && common as f64 / tokens(prompt.len()).max(1) as f64 > self.similarity;
        let update = self.similarity > 0.0
            && !slot.cached.is_empty()
            && (!similar || self.keeps_less_than_half(at, prompt));
        Some((at, update))
    }

    /// Whether less than half of what slot `at` holds survives `prompt`.
    fn keeps_less_than_half(&self, at: usize, prompt: &[u8]) -> bool {
        let s = &self.slots[at];
        (common_tokens(&s.cached, prompt) as f64 / tokens(s.cached.len()) as f64) < 0.5
    }

    /// Frees `slot`, which now holds `text` (prompt plus what was generated, even if cut short).
    pub fn put_back(&mut self, slot: usize, text: Vec<u8>) {
        self.tick += 1;
        if let Some(s) = self.slots.get_mut(slot) {
            s.cached = text;
            s.busy = false;
            s.last_used = self.tick;
        }
    }

    /// The saved state to load into a slot holding `held` for `prompt`, as llama-server's
    /// `server_prompt_cache::load` picks it: one that keeps at least a quarter of itself and beats
    /// the best so far (the slot's own state first; an empty slot is beaten by anything) both on
    /// the share of itself kept and on the share of the prompt covered. Ties go to the older.
    fn better_in_ram(&self, held: &[u8], prompt: &[u8]) -> Option<usize> {
        let share = |part: u64, whole: usize| part as f64 / tokens(whole).max(1) as f64;
        let own = common_tokens(held, prompt);
        let mut keep_best = if held.is_empty() {
            -1.0
        } else {
            share(own, held.len())
        };
        let mut sim_best = share(own, prompt.len());
        let mut best = None;
        for (i, saved) in self.ram.iter().enumerate() {
            let common = common_tokens(saved, prompt);
            let (keep, sim) = (share(common, saved.len()), share(common, prompt.len()));
            if keep >= MIN_KEEP && keep > keep_best && sim > sim_best {
                (keep_best, sim_best, best) = (keep, sim, Some(i));
            }
        }
        best
    }

    /// Saves a slot's state as `server_prompt_cache::alloc` does: not when a saved state already
    /// holds it (nor is that one refreshed) or it is over the whole budget; states it holds are
    /// dropped, then the oldest until it fits.
    fn save(&mut self, text: Vec<u8>) {
        let size = tokens(text.len());
        if text.is_empty() || size > self.ram_limit || self.ram.iter().any(|e| e.starts_with(&text))
        {
            return;
        }
        self.ram.retain(|e| !text.starts_with(e));
        while !self.ram.is_empty()
            && self.ram.iter().map(|e| tokens(e.len())).sum::<u64>() + size > self.ram_limit
        {
            self.ram.remove(0);
        }
        self.ram.push(text);
    }
}

#[cfg(test)]
mod tests;
