//! The table's read side and bookkeeping outside the acquire rules: flushing touches to the store, counts and copies for the admin API, status page and metrics.
//! None of these walks the table on a request's behalf except `snapshot` (admin and page only).

use std::collections::BTreeMap;

use super::{Key, Lease, Table};
use crate::store::Write;

impl Table {
    /// Writes the `last_used` of every lease touched since the last flush, as one job nobody
    /// waits for (issue 12: touches are written behind; a crash loses at most the touches since
    /// the last flush, which only makes those leases look idle a little early). Called by the
    /// sweeper thread every tick and once at stop. Returns how many were queued.
    pub fn flush_touches(&self) -> usize {
        let mut inner = self.lock();
        let touched = std::mem::take(&mut inner.touched);
        let writes: Vec<Write> = (touched.iter())
            .filter_map(|k| {
                Some(Write::Touch {
                    route: k.route.clone(),
                    fp: k.fp.clone(),
                    model: k.model.clone(),
                    last_used: inner.leases.get(k)?.last_used,
                })
            })
            .collect();
        drop(inner);
        let n = writes.len();
        if n > 0 {
            // Not waited for: the store logs a failure once per burst.
            drop(self.persister.submit(writes));
        }
        n
    }

    /// Whether `key` holds a lease.
    pub fn contains(&self, key: &Key) -> bool {
        self.lock().leases.contains_key(key)
    }

    /// How many leases the table holds.
    pub fn len(&self) -> usize {
        self.lock().leases.len()
    }

    /// Whether the table holds no lease.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leases per host (all models, reservations included), from the maintained counts.
    pub fn per_host(&self) -> BTreeMap<String, usize> {
        let inner = self.lock();
        let mut out = BTreeMap::new();
        for (host, n) in inner.counts.values().flatten() {
            *out.entry(host.clone()).or_insert(0) += n;
        }
        out
    }

    /// Tokens the `slots` most recently used conversations of `model` on `host` hold: what its
    /// slots hold.
    pub fn held_in_slots(&self, model: &str, host: &str, slots: usize) -> u64 {
        (self.lock().held_newest(model, host))
            .take(slots)
            .map(|h| h.tokens)
            .sum()
    }

    /// Copies of every lease, sorted by key; pins are not leases and are not included.
    pub fn snapshot(&self) -> Vec<Lease> {
        let inner = self.lock();
        let mut all: Vec<Lease> = (inner.leases.iter())
            .map(|(k, e)| Lease {
                key: Key::clone(k),
                host: e.host.clone(),
                created: e.created,
                last_used: e.last_used,
            })
            .collect();
        drop(inner);
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }
}
