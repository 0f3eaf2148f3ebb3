//! A pinned request is *unsettled* from the moment crossbar takes its slot until the host is seen
//! to have started it, and a request crossbar could not pin waits for every unsettled one on its
//! host+model before it is sent.
//!
//! Why: llama-server (b11434) launches tasks in the order its HTTP threads post them, and a
//! request's thread posts it only once its prompt is tokenized — milliseconds for a large one. An
//! unpinned request sent just after a pinned one can be launched first, and llama-server gives it
//! an idle slot of its own choosing: perhaps the slot the pinned request names, which is idle at
//! the host until its task runs. The pinned task then finds its slot at work and waits for it,
//! but first saves and reloads that slot's state under the running generation, corrupting it.
//!
//! A pinned request settles when:
//! - its answer's head comes ([`super::Claim::started`]): llama-server sends a stream's head
//!   as the slot starts on the prompt, a whole answer's with its end, an error's before any task;
//! - a `/slots` poll that started after it was taken shows its slot at work ([`Slots::saw`]);
//! - its end is told, whole or early.
//!
//! Nothing new is pinned while the unpinned request waits (it counts among the unpinned from the
//! moment it is taken), so the wait is for pins already sent: a stream's prompt is tokenized and
//! launched within milliseconds; a whole answer's wait ends with the next `/slots` poll, which the
//! waiter asks for (the poller keeps a second between polls).

use std::time::Instant;

use parking_lot::MutexGuard;

use super::{Slots, Table};

impl Slots {
    /// Waits until no request pinned on `host`+`model` is unsettled: `None` when none was (no
    /// wait), else whether they settled before `deadline`. Only for a request that took its place
    /// among the unpinned there. `counted` runs once the wait is counted, outside the lock: the
    /// caller asks for a `/slots` poll there, and the poll, seeing someone wait, is made.
    pub fn wait_settled(
        &self,
        (host, model): (&str, &str),
        deadline: Instant,
        counted: impl FnOnce(),
    ) -> Option<bool> {
        let key = (host.to_string(), model.to_string());
        let mut table = self.shared.lock();
        if !table.unsettled(&key) {
            return None;
        }
        table.count_waiting(&key, true);
        MutexGuard::unlocked(&mut table, counted);
        let settled = loop {
            if !table.unsettled(&key) {
                break true;
            }
            if self
                .shared
                .settled
                .wait_until(&mut table, deadline)
                .timed_out()
            {
                break !table.unsettled(&key);
            }
        };
        table.count_waiting(&key, false);
        Some(settled)
    }

    /// Requests on `host` waiting for pinned ones to settle.
    pub fn waiting(&self, host: &str) -> usize {
        let table = self.shared.lock();
        (table.pairs.iter())
            .filter(|((h, _), _)| h == host)
            .map(|(_, pair)| pair.waiting)
            .sum()
    }

    /// Whether a request pinned on `host`+`model` is unsettled.
    pub fn unsettled(&self, (host, model): (&str, &str)) -> bool {
        let key = (host.to_string(), model.to_string());
        self.shared.lock().unsettled(&key)
    }
}

impl Table {
    /// One more (`up`) or one fewer request waiting on `key`'s pins (none when the pair went:
    /// the mirror started over).
    fn count_waiting(&mut self, key: &(String, String), up: bool) {
        if let Some(pair) = self.pairs.get_mut(key) {
            pair.waiting = if up {
                pair.waiting.saturating_add(1)
            } else {
                pair.waiting.saturating_sub(1)
            };
        }
    }

    fn unsettled(&self, key: &(String, String)) -> bool {
        (self.pairs.get(key))
            .is_some_and(|pair| pair.slots.iter().any(|s| s.unsettled_since.is_some()))
    }
}
