//! Each host's conversations by recency, for what its slots hold (issue 23).
//!
//! llama-server keeps one conversation's cache per slot, so what a host's KV cache holds is about
//! its most recently used conversations, one per slot, not every lease it still has: a lease
//! lives `lease_idle` (30 minutes by default) after its conversation stopped, long after its slot
//! went to another. Counting every live lease as held made every host look full within minutes
//! of agent traffic, and a full host counts a family cold: placement lost its family signal (the
//! agents benchmark with `-sps 0` placed 3 of 24 new conversations by family).
//!
//! Route-level leases (no fingerprint: model listings) hold no conversation and are not listed.
//! Bounded: one entry per lease (the table caps leases). Pure bookkeeping: no clock, no I/O.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Key;
use crate::fasthash::HashMap;

type Uses = BTreeSet<(i64, Arc<Key>)>;

/// Invariant: `by_host[model][host]` holds `(last_used, key)` for exactly the conversation
/// leases (non-empty fingerprint) of `model` on `host`.
#[derive(Debug, Default)]
pub(super) struct Recent {
    by_host: HashMap<String, HashMap<String, Uses>>,
}

impl Recent {
    /// A lease of `key` on `host`, last used at `last_used`, came into the table.
    pub(super) fn add(&mut self, key: &Arc<Key>, host: &str, last_used: i64) {
        if key.fp.is_empty() {
            return;
        }
        let hosts = match self.by_host.get_mut(&key.model) {
            Some(hosts) => hosts,
            None => self.by_host.entry(key.model.clone()).or_default(),
        };
        let uses = match hosts.get_mut(host) {
            Some(uses) => uses,
            None => hosts.entry(host.to_string()).or_default(),
        };
        uses.insert((last_used, key.clone()));
    }

    /// The lease of `key` on `host`, last used at `last_used`, left the table.
    pub(super) fn remove(&mut self, key: &Arc<Key>, host: &str, last_used: i64) {
        let Some(hosts) = self.by_host.get_mut(&key.model) else {
            return;
        };
        let emptied = hosts.get_mut(host).is_some_and(|uses| {
            uses.remove(&(last_used, key.clone()));
            uses.is_empty()
        });
        if emptied {
            hosts.remove(host);
        }
    }

    /// The conversations of `model` on `host`, most recently used first.
    pub(super) fn newest_first<'a>(
        &'a self,
        model: &str,
        host: &str,
    ) -> impl Iterator<Item = &'a Arc<Key>> + 'a {
        let uses = self.by_host.get(model).and_then(|hosts| hosts.get(host));
        uses.into_iter()
            .flat_map(|u| u.iter().rev().map(|(_, k)| k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(fp: &str) -> Arc<Key> {
        Arc::new(Key {
            route: "r".to_string(),
            fp: fp.to_string(),
            model: "m".to_string(),
        })
    }

    fn fps(r: &Recent, host: &str) -> Vec<String> {
        r.newest_first("m", host).map(|k| k.fp.clone()).collect()
    }

    #[test]
    fn a_hosts_conversations_come_newest_first_and_leave_with_their_lease() {
        let mut r = Recent::default();
        let (a, b, c) = (key("a"), key("b"), key("c"));
        r.add(&a, "h1", 10);
        r.add(&b, "h1", 30);
        r.add(&c, "h2", 20);
        r.add(&key(""), "h1", 99);
        assert_eq!(
            fps(&r, "h1"),
            ["b", "a"],
            "a listing's lease is no conversation"
        );
        assert_eq!(fps(&r, "h2"), ["c"]);
        r.remove(&b, "h1", 30);
        r.add(&b, "h1", 40);
        r.remove(&a, "h1", 10);
        r.add(&a, "h1", 50);
        assert_eq!(fps(&r, "h1"), ["a", "b"], "used again, first again");
        r.remove(&a, "h1", 50);
        r.remove(&b, "h1", 40);
        assert!(fps(&r, "h1").is_empty());
        assert!(r.newest_first("other", "h2").next().is_none());
        assert_eq!(r.by_host["m"].len(), 1, "an emptied host is forgotten");
    }
}
