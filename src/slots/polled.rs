//! What the mirror learns from requests it could not pin and from `/slots` polls.
//!
//! A request crossbar cannot pin (Messages, embeddings, a conversation it does not know) takes a
//! slot llama-server chooses. While it is in flight crossbar pins nothing there, since its slot
//! could be any. With similarity off it is the least recently used idle slot, whose occupant is
//! saved, so every free slot is suspected of no longer holding what crossbar left in it
//! (`foreign`), and returning conversations are left to the host.
//!
//! A `/slots` poll started while such requests are in flight shows the slots at work. Those at
//! work that crossbar did not pin are theirs; when there are as many as unpinned requests in
//! flight, every one is found. Their slots are surely taken: they hold nothing crossbar knows
//! (`foreign` with similarity off) and are not free to pin until the last of those requests ends.
//! Every other slot keeps what crossbar left in it, and pinning resumes on them while the
//! unpinned requests run. The host polls as soon as it may once such a request starts
//! (`proxy/pin.rs`). With similarity off, a request that ends unfound may have taken any slot
//! that was free: all of them are marked.

use super::{Pair, Slots};

impl Slots {
    /// A `/slots` poll of `host` that started at `started` ([`super::now_us`]) saw `seen`: the
    /// slots in doubt since before it that it shows idle are free again, and with similarity off
    /// the unpinned requests in flight may be found.
    pub fn saw(&self, host: &str, started: i64, seen: &super::Seen) {
        let mut table = self.table.lock();
        let mut pairs: Vec<&mut Pair> = (table.pairs.iter_mut())
            .filter(|((h, _), _)| h == host)
            .map(|(_, pair)| pair)
            .collect();
        for pair in &mut pairs {
            for &id in &seen.idle {
                if let Some(slot) = pair.slots.get_mut(id) {
                    if slot.doubtful_since.is_some_and(|since| since < started) {
                        slot.doubtful_since = None;
                    }
                }
            }
        }
        // One model's requests per slot: a host with several mirrored (never a pinning host
        // as configured today) cannot say whose slot is at work.
        if let [pair] = &mut pairs[..] {
            pair.found(started, &seen.processing);
        }
    }

    /// Whether any slot of `host` is in doubt (its poller then asks `/slots`).
    pub fn doubtful(&self, host: &str) -> bool {
        let table = self.table.lock();
        (table.pairs.iter())
            .filter(|((h, _), _)| h == host)
            .any(|(_, pair)| pair.slots.iter().any(|s| s.doubtful_since.is_some()))
    }

    /// Whether a `/slots` poll of `host` would tell the mirror something: a slot in doubt, or an
    /// unpinned request in flight not yet found.
    pub fn to_poll(&self, host: &str) -> bool {
        let table = self.table.lock();
        (table.pairs.iter())
            .filter(|((h, _), _)| h == host)
            .any(|(_, pair)| pair.unfound || pair.slots.iter().any(|s| s.doubtful_since.is_some()))
    }
}

impl Pair {
    /// A request crossbar could not pin starts, at `now` (read before the mirror's lock: the
    /// latest change is kept, so an end told meanwhile is not dated back).
    pub(super) fn unpinned_started(&mut self, now: i64) {
        (self.unpinned, self.unfound) = (self.unpinned + 1, true);
        self.unpinned_changed = self.unpinned_changed.max(now);
        if self.similarity_off {
            for slot in self.slots.iter_mut().filter(|s| !s.busy && !s.foreign) {
                (slot.foreign, slot.suspected) = (true, true);
            }
        }
    }

    /// A request crossbar could not pin ended (its end told, or dropped), at `now`.
    pub(super) fn unpinned_ended(&mut self, now: i64) {
        self.unpinned = self.unpinned.saturating_sub(1);
        self.unpinned_changed = self.unpinned_changed.max(now);
        if self.similarity_off && self.unfound {
            // It may have been one not found, in any slot free here since it started.
            for slot in self.slots.iter_mut().filter(|s| !s.busy) {
                (slot.foreign, slot.suspected) = (true, false);
            }
        }
        if self.unpinned == 0 {
            self.unfound = false;
            for slot in &mut self.slots {
                slot.theirs = false;
            }
        }
    }

    /// A poll that started at `started` saw the slots `processing` at work. The unpinned requests are found when no slot is in doubt (one left early could be at work
    /// anywhere), none started or ended since the poll did, and the slots at work that crossbar
    /// did not pin are as many as they are. A request still queued at the host, or one done
    /// there whose end crossbar has not yet been told, makes them fewer: nothing is learnt.
    fn found(&mut self, started: i64, processing: &[usize]) {
        if !self.unfound || self.unpinned_changed >= started {
            return;
        }
        if self.slots.iter().any(|s| s.doubtful_since.is_some()) {
            return;
        }
        let theirs = |id: usize| processing.contains(&id);
        let at_work = (self.slots.iter().enumerate())
            .filter(|&(id, s)| !s.busy && theirs(id))
            .count();
        if at_work != self.unpinned {
            return;
        }
        for (id, slot) in self.slots.iter_mut().enumerate() {
            if slot.busy {
                continue;
            }
            if theirs(id) {
                (slot.holder, slot.family) = (None, None);
                (slot.foreign, slot.suspected, slot.theirs) = (self.similarity_off, false, true);
            } else if slot.suspected {
                (slot.foreign, slot.suspected) = (false, false);
            }
        }
        self.unfound = false;
    }
}
