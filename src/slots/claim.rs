//! What a request on a pinning host holds until its end is told: its slot (`Pin`), or a place
//! among the unpinned (`End`). Told once: finished with what the host counted, or abandoned (an
//! early end, the slot in doubt) explicitly or by a drop.

use std::cell::Cell;
use std::sync::Arc;

use super::{now_us, Pair, Shared, Tokens};

/// What a request on a pinning host got: a slot, or a place among the unpinned.
#[derive(Debug)]
pub enum Claim {
    Pinned(Pin),
    Unpinned(End),
}

impl Claim {
    /// The request ended with its answer's end: its slot is free, holding what the host
    /// `counted` when the answer said. Only the first call counts; a drop without one is an
    /// early end.
    pub fn finish(&self, counted: Option<Tokens>) {
        match self {
            Claim::Pinned(pin) => pin.finish(counted),
            Claim::Unpinned(end) => end.close(|pair, _| pair.unpinned -= 1),
        }
    }

    /// The request ended early (its client left, the host broke off): told now, before its row
    /// is written, so a client that sees the row finds the slot in doubt. A drop tells the same.
    pub fn abandon(&self) {
        match self {
            Claim::Pinned(pin) => pin.abandon(),
            Claim::Unpinned(end) => end.abandon(),
        }
    }

    /// The host answered (its answer's head came): a pinned request has started there, or was
    /// refused and never will (`settle.rs`).
    pub fn started(&self) {
        if let Claim::Pinned(pin) = self {
            let at = pin.at;
            pin.end.settle(|pair| {
                if let Some(slot) = pair.slots.get_mut(at) {
                    slot.unsettled_since = None;
                }
            });
        }
    }

    /// The slot's id, when pinned.
    pub fn index(&self) -> Option<usize> {
        match self {
            Claim::Pinned(pin) => Some(pin.at),
            Claim::Unpinned(_) => None,
        }
    }

    /// The slot must be saved to the host's RAM cache before the request is sent there: it holds
    /// a sibling's state that the request would keep whole (so llama-server would neither save it
    /// nor reload the request's own state), and the request's own state is in RAM.
    pub fn saves_first(&self) -> bool {
        matches!(self, Claim::Pinned(pin) if pin.save_first)
    }
}

/// A slot held for one request.
#[derive(Debug)]
pub struct Pin {
    end: End,
    at: usize,
    /// Its body's bytes.
    bytes: u64,
    /// See [`Claim::saves_first`].
    save_first: bool,
}

impl Pin {
    pub(super) fn new(end: End, at: usize, bytes: u64, save_first: bool) -> Pin {
        Pin {
            end,
            at,
            bytes,
            save_first,
        }
    }

    fn finish(&self, counted: Option<Tokens>) {
        let (at, bytes) = (self.at, self.bytes);
        self.end.close(|pair, tick| {
            if let Some(c) = counted {
                pair.counted(c.prompt, bytes);
            }
            if let Some(slot) = pair.slots.get_mut(at) {
                (slot.busy, slot.unsettled_since) = (false, None);
                slot.last_used = tick;
                if let Some(c) = counted {
                    slot.tokens = c.prompt.saturating_add(c.completion);
                }
            }
        });
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.abandon();
    }
}

impl Pin {
    /// An early end: llama-server may still be generating in the slot, so it is in doubt.
    fn abandon(&self) {
        let at = self.at;
        let now = now_us();
        self.end.close(|pair, tick| {
            if let Some(slot) = pair.slots.get_mut(at) {
                (slot.busy, slot.last_used, slot.unsettled_since) = (false, tick, None);
                slot.doubtful_since = Some(now);
            }
        });
    }
}

/// The end of one request on a pinning host, told once.
#[derive(Debug)]
pub struct End {
    shared: Arc<Shared>,
    key: (String, String),
    done: Cell<bool>,
}

impl End {
    pub(super) fn new(shared: Arc<Shared>, key: (String, String)) -> End {
        End {
            shared,
            key,
            done: Cell::new(false),
        }
    }

    /// Runs `f` on the request's pair (with a fresh tick) unless its end was told already, and
    /// wakes whoever waits for a pinned request to settle.
    fn close(&self, f: impl FnOnce(&mut Pair, u64)) {
        if self.done.replace(true) {
            return;
        }
        let mut table = self.shared.lock();
        table.tick += 1;
        let tick = table.tick;
        if let Some(pair) = table.pairs.get_mut(&self.key) {
            f(pair, tick);
        }
        drop(table);
        self.shared.settled.notify_all();
    }

    /// Runs `f` on the request's pair, before its end, and wakes whoever waits for a pinned
    /// request to settle.
    fn settle(&self, f: impl FnOnce(&mut Pair)) {
        if self.done.get() {
            return;
        }
        let mut table = self.shared.lock();
        if let Some(pair) = table.pairs.get_mut(&self.key) {
            f(pair);
        }
        drop(table);
        self.shared.settled.notify_all();
    }
}

impl Drop for End {
    /// (A pin's own drop ran first: its end is told already.)
    fn drop(&mut self) {
        self.abandon();
    }
}

impl End {
    /// An unpinned request that ended early: llama-server chose its slot and may still be busy
    /// there, so every slot not busy here is in doubt.
    fn abandon(&self) {
        let now = now_us();
        self.close(|pair, _| {
            pair.unpinned = pair.unpinned.saturating_sub(1);
            for slot in pair.slots.iter_mut().filter(|s| !s.busy) {
                slot.doubtful_since.get_or_insert(now);
            }
        });
    }
}
