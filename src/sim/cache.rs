//! The simulated prompt cache: slots that remember their last prompt (+ generated text) and a bounded
//! RAM cache of slot states, chosen the way llama-server (b11434) chooses: the idle slot with the
//! longest common prefix above `--slot-prompt-similarity` (0.10; 0 turns this off), else the least
//! recently used idle slot; and, as its default `--cache-idle-slots` does, a copy of every other idle
//! slot saved to the RAM cache each time a task starts.
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

/// Where a request landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Taken {
    pub slot: usize,
    /// Prompt tokens reused from the cache (never the whole prompt: one token is re-evaluated).
    pub cache_n: u64,
}

/// Slots and RAM cache of one simulated server.
///
/// Invariants: a busy slot is never chosen; `ram` never holds more than `ram_limit` tokens in total;
/// `tick` grows on every take and put back, so `last_used` orders slots and entries by recency.
#[derive(Debug)]
pub(super) struct Pool {
    slots: Vec<Slot>,
    ram: Vec<Entry>,
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

#[derive(Debug)]
struct Entry {
    text: Vec<u8>,
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
    /// With `use_cache == false` (`cache_prompt: false`) nothing is reused.
    pub fn try_take(&mut self, prompt: &[u8], use_cache: bool) -> Option<Taken> {
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
        let (id, update_cache) = match by_prefix {
            Some(i) => {
                let s = &self.slots[i];
                let keep = common_tokens(&s.cached, prompt) as f64 / tokens(s.cached.len()) as f64;
                (i, keep < 0.5)
            }
            None => (idle().min_by_key(|(_, s)| s.last_used)?.0, true),
        };
        self.tick += 1;
        let tick = self.tick;

        let mut text = std::mem::take(&mut self.slots[id].cached);
        let mut reused = common_tokens(&text, prompt);
        if update_cache && self.ram_limit > 0 {
            // An empty slot has nothing to save, but may still load a state from RAM.
            if !text.is_empty() {
                self.save(text.clone());
            }
            if let Some((i, n)) = self.best_in_ram(prompt) {
                if n > reused {
                    self.ram[i].last_used = tick;
                    text = self.ram[i].text.clone();
                    reused = n;
                }
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
        Some(Taken { slot: id, cache_n })
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

    fn best_in_ram(&self, prompt: &[u8]) -> Option<(usize, u64)> {
        self.ram
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_tokens(&e.text, prompt)))
            .max_by_key(|&(_, n)| n)
    }

    /// Stores an evicted slot state, dropping entries it subsumes and the least recently used ones
    /// beyond the token budget.
    fn save(&mut self, text: Vec<u8>) {
        let size = tokens(text.len());
        if text.is_empty() || size > self.ram_limit {
            return;
        }
        self.tick += 1;
        if let Some(e) = self.ram.iter_mut().find(|e| e.text.starts_with(&text)) {
            e.last_used = self.tick;
            return;
        }
        self.ram.retain(|e| !text.starts_with(&e.text));
        self.ram.push(Entry {
            text,
            last_used: self.tick,
        });
        while self.ram.iter().map(|e| tokens(e.text.len())).sum::<u64>() > self.ram_limit {
            let Some(lru) = (0..self.ram.len()).min_by_key(|&i| self.ram[i].last_used) else {
                break;
            };
            self.ram.remove(lru);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes a slot and immediately frees it holding the prompt; returns (slot, cache_n).
    #[track_caller]
    fn turn(pool: &mut Pool, prompt: &str) -> (usize, u64) {
        let t = pool
            .try_take(prompt.as_bytes(), true)
            .expect("an idle slot");
        pool.put_back(t.slot, prompt.as_bytes().to_vec());
        (t.slot, t.cache_n)
    }

    const A: &str = "user: tell me about the history of the roman empire please\n";
    const B: &str = "user: write a poem about a cat who sits on a warm mat all day\n";
    const C: &str = "user: explain how a jet engine works in great technical detail\n";
    /// Only the shared `user: ` is reused: the conversation itself was forgotten.
    const FORGOTTEN: u64 = 1;

    #[test]
    fn same_prompt_twice_reuses_all_but_one_token() {
        let mut pool = Pool::new(2, 0);
        assert_eq!(turn(&mut pool, A).1, 0);
        let (_, cache_n) = turn(&mut pool, A);
        assert_eq!(cache_n, tokens(A.len()) - 1);
    }

    #[test]
    fn a_second_conversation_takes_the_other_slot() {
        let mut pool = Pool::new(2, 0);
        let (slot_a, _) = turn(&mut pool, A);
        let (slot_b, _) = turn(&mut pool, B);
        assert_ne!(slot_a, slot_b);
        let longer = format!("{A}assistant: it fell\nuser: why?\n");
        let (slot, cache_n) = turn(&mut pool, &longer);
        assert_eq!(slot, slot_a);
        assert_eq!(cache_n, (A.len() / TOKEN_BYTES) as u64);
    }

    #[test]
    fn without_ram_cache_a_third_conversation_forgets_the_oldest() {
        let mut pool = Pool::new(2, 0);
        turn(&mut pool, A);
        turn(&mut pool, B);
        turn(&mut pool, C);
        assert_eq!(turn(&mut pool, A).1, FORGOTTEN);
    }

    #[test]
    fn ram_cache_restores_an_evicted_conversation() {
        let mut pool = Pool::new(2, 1000);
        turn(&mut pool, A);
        turn(&mut pool, B);
        turn(&mut pool, C);
        assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
    }

    #[test]
    fn ram_cache_is_bounded_and_drops_the_least_recent() {
        // Room for two prompts: saving C pushes out A, the least recently used.
        let room = tokens(A.len()) + tokens(B.len()) + 1;
        let mut pool = Pool::new(1, room);
        turn(&mut pool, A);
        turn(&mut pool, B);
        turn(&mut pool, C);
        assert_eq!(turn(&mut pool, A).1, FORGOTTEN);
        let mut pool = Pool::new(1, room);
        turn(&mut pool, A);
        turn(&mut pool, B);
        assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
    }

    #[test]
    fn busy_slots_are_not_taken_and_cache_prompt_false_reuses_nothing() {
        let mut pool = Pool::new(1, 0);
        turn(&mut pool, A);
        let t = pool.try_take(A.as_bytes(), false).expect("idle");
        assert_eq!(t.cache_n, 0);
        assert_eq!(pool.busy(), vec![true]);
        assert_eq!(pool.try_take(B.as_bytes(), true), None);
        pool.put_back(t.slot, Vec::new());
        assert!(pool.try_take(B.as_bytes(), true).is_some());
    }

    const SYS: &str = "system: you are a careful assistant who always answers in short sentences\n";

    /// Two conversations sharing [`SYS`], two turns each: `[a1, b1, a2, b2]`.
    fn siblings() -> [String; 4] {
        let a1 = format!("{SYS}user: rome?\n");
        let b1 = format!("{SYS}user: a poem\n");
        let a2 = format!("{a1}assistant: it fell\nuser: why?\n");
        let b2 = format!("{b1}assistant: roses\nuser: more\n");
        [a1, b1, a2, b2]
    }

    /// Measured on llama-server b11434 (4 slots): two conversations sharing a system prompt both
    /// land on the first one's slot (similarity beats an empty slot), and as more than half of the
    /// old state is kept nothing is saved: each turn gets back only the shared prefix.
    #[test]
    fn siblings_sharing_a_system_prompt_take_turns_losing_their_histories() {
        let [a1, b1, a2, b2] = siblings();
        let shared = (format!("{SYS}user: ").len() / TOKEN_BYTES) as u64;
        let mut pool = Pool::new(4, 100_000);
        let slot = turn(&mut pool, &a1).0;
        assert_eq!(turn(&mut pool, &b1), (slot, shared), "b takes a's slot");
        assert_eq!(turn(&mut pool, &a2), (slot, shared), "a's history is gone");
        assert_eq!(turn(&mut pool, &b2), (slot, shared), "and then b's");
    }

    /// With `--slot-prompt-similarity 0` (and the RAM cache) each turn finds its history again.
    #[test]
    fn without_similarity_each_turn_gets_its_history_back_from_ram() {
        let [a1, b1, a2, b2] = siblings();
        let mut pool = Pool::new(4, 100_000).with_similarity(0.0);
        turn(&mut pool, &a1);
        assert_eq!(turn(&mut pool, &b1).1, 0, "no prefix sharing across slots");
        // Whole tokens of the previous turn's text (what was generated is part of it in real use).
        assert_eq!(turn(&mut pool, &a2).1, (a1.len() / TOKEN_BYTES) as u64);
        assert_eq!(turn(&mut pool, &b2).1, (b1.len() / TOKEN_BYTES) as u64);
    }

    #[test]
    fn idle_slots_are_copied_to_ram_when_a_task_starts() {
        let mut pool = Pool::new(2, 1000);
        turn(&mut pool, A);
        turn(&mut pool, B);
        // A's slot was idle when B started: its copy is in RAM, so A survives two more prompts.
        turn(&mut pool, C);
        turn(&mut pool, &format!("{C}{C}"));
        assert_eq!(turn(&mut pool, A).1, tokens(A.len()) - 1);
    }
}
