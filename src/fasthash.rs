//! The hasher of crossbar's hot in-memory tables (issue 26): std's SipHash cost 6 % of crossbar's
//! instructions per request, about a hundred lookups keyed by hosts, models and lease keys.
//! These tables hash with aHash instead, keyed at random once per process, so a client who
//! chooses the bodies that name conversations still cannot choose their buckets.

use std::hash::BuildHasher;
use std::sync::OnceLock;

/// A `HashMap` hashed by [`Keyed`]; made with `default()`, as `new()` is std's hasher's alone.
pub type HashMap<K, V> = std::collections::HashMap<K, V, Keyed>;

/// A `HashSet` hashed by [`Keyed`].
pub type HashSet<K> = std::collections::HashSet<K, Keyed>;

/// aHash with the process's random keys.
#[derive(Clone, Debug)]
pub struct Keyed(ahash::RandomState);

impl Default for Keyed {
    fn default() -> Keyed {
        static SEEDS: OnceLock<[u64; 4]> = OnceLock::new();
        // std's `RandomState` is keyed from the OS's randomness: four of its hashes are four
        // random keys, with no second source of randomness to trust.
        let [a, b, c, d] = *SEEDS.get_or_init(|| {
            let std = std::hash::RandomState::new();
            [0u8, 1, 2, 3].map(|i| std.hash_one(i))
        });
        Keyed(ahash::RandomState::with_seeds(a, b, c, d))
    }
}

impl BuildHasher for Keyed {
    type Hasher = ahash::AHasher;

    fn build_hasher(&self) -> ahash::AHasher {
        self.0.build_hasher()
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::Keyed;

    #[test]
    fn tables_of_one_process_agree_and_its_keys_are_not_zero() {
        let (one, two) = (Keyed::default(), Keyed::default());
        assert_eq!(one.hash_one("route/m/abc"), two.hash_one("route/m/abc"));
        assert_ne!(one.hash_one("route/m/abc"), one.hash_one("route/m/abd"));
        // The keys came from std's random ones, not from nowhere: a table keyed with zeros
        // (what a lost seed would leave) hashes differently.
        let zero = ahash::RandomState::with_seeds(0, 0, 0, 0);
        assert_ne!(one.hash_one("route/m/abc"), zero.hash_one("route/m/abc"));
    }
}
