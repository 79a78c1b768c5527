//! The byte-budgeted expert cache and its replacement policies.
//!
//! - [`CachePolicy::LfuDa`] (default): LFU with dynamic aging (Arlitt, Cherkasova, Dilley, Friedrich,
//!   Jin, "Evaluating content management techniques for Web proxy caches", 2000). Each entry's
//!   priority is `K = L + f`, with `f` its use count and `L` the priority of the last evicted
//!   entry; the lowest `K` is evicted, ties going to the least recently used. Unlike the
//!   original, use counts survive eviction: the key space (layers × experts) is small and
//!   fixed, so remembering every key's count costs a few KiB and lets an expert that was
//!   evicted during a burst of others come back with its history. Expert routing is
//!   skewed and fairly stable per layer (a few experts take a large share of tokens), so
//!   frequency is what should keep an expert; the aging term `L` lets experts that were hot long
//!   ago leave without touching every entry, and the recency tie-break makes equal-count entries
//!   behave as LRU. It is also seeded naturally: a persisted per-(layer, expert) heat count
//!   becomes an entry's starting `f` (see [`super::heat`]). Compared with ARC or S3-FIFO it
//!   needs no ghost lists, which matters little here: the key space (layers × experts) is small
//!   and known, and the heat file already remembers what ghost lists would.
//! - [`CachePolicy::Lru`]: plain least-recently-used, for comparison.
//! - [`CachePolicy::None`]: nothing is kept; every use is a read.

use std::collections::{BTreeSet, HashMap};

use super::streamer::UnitBytes;

/// Which replacement policy the expert cache uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// No cache: every expert use is read from disk.
    None,
    /// Least recently used.
    Lru,
    /// LFU with dynamic aging, seeded from the heat file.
    #[default]
    LfuDa,
}

impl std::str::FromStr for CachePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "lru" => Ok(Self::Lru),
            "lfu" | "lfu-da" | "lfuda" => Ok(Self::LfuDa),
            _ => Err(format!(
                "unknown cache policy '{s}' (expected lfu-da, lru or none)"
            )),
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Lru => "lru",
            Self::LfuDa => "lfu-da",
        })
    }
}

/// A cache key: (layer, expert id).
pub type Key = (u32, u32);

struct Entry {
    bytes: UnitBytes,
    prio: u64,
    tick: u64,
}

/// Experts kept in RAM within `budget` bytes (the sum of their buffers).
pub struct ExpertCache {
    policy: CachePolicy,
    budget: usize,
    used: usize,
    map: HashMap<Key, Entry>,
    /// (priority, last use tick, key), lowest evicted first.
    order: BTreeSet<(u64, u64, Key)>,
    /// LFU-DA's aging term `L`.
    age: u64,
    tick: u64,
    /// Use count of every key ever used, starting from the heat file's seed.
    freq: HashMap<Key, u64>,
}

impl ExpertCache {
    /// An empty cache of `budget` bytes; `seed` gives keys a starting use count (LFU-DA only).
    pub fn new(policy: CachePolicy, budget: usize, seed: HashMap<Key, u64>) -> Self {
        let budget = if policy == CachePolicy::None {
            0
        } else {
            budget
        };
        Self {
            policy,
            budget,
            used: 0,
            map: HashMap::new(),
            order: BTreeSet::new(),
            age: 0,
            tick: 0,
            freq: seed,
        }
    }

    /// The policy.
    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// Budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `key` is held (does not count as a use).
    pub fn contains(&self, key: Key) -> bool {
        self.map.contains_key(&key)
    }

    fn prio_of(&self, key: Key) -> u64 {
        match self.policy {
            CachePolicy::LfuDa => self.age + self.freq.get(&key).copied().unwrap_or(0),
            _ => 0,
        }
    }

    /// Records a use of `key` (hit or miss) and returns its bytes when held.
    pub fn hit(&mut self, key: Key) -> Option<&UnitBytes> {
        self.tick += 1;
        *self.freq.entry(key).or_insert(0) += 1;
        let prio = self.prio_of(key);
        let tick = self.tick;
        let e = self.map.get_mut(&key)?;
        self.order.remove(&(e.prio, e.tick, key));
        e.tick = tick;
        e.prio = prio;
        self.order.insert((e.prio, e.tick, key));
        Some(&self.map[&key].bytes)
    }

    /// The bytes of `key` when held, without counting a use.
    pub fn get(&self, key: Key) -> Option<&UnitBytes> {
        self.map.get(&key).map(|e| &e.bytes)
    }

    /// Sets the budget to `budget` bytes (0 whatever is asked under the `none` policy),
    /// evicting by the policy until what is held fits; returns the evicted buffers. Keys whose
    /// bytes a caller still borrows must not be held when it shrinks.
    pub fn set_budget(&mut self, budget: usize) -> Vec<UnitBytes> {
        self.budget = if self.policy == CachePolicy::None {
            0
        } else {
            budget
        };
        self.evict_until(self.budget)
    }

    /// Evicts the lowest entries until at most `limit` bytes are held.
    fn evict_until(&mut self, limit: usize) -> Vec<UnitBytes> {
        let mut out = Vec::new();
        while self.used > limit {
            let Some(&(p, t, k)) = self.order.iter().next() else {
                break;
            };
            self.order.remove(&(p, t, k));
            let e = self.map.remove(&k).expect("ordered key is held");
            self.used -= e.bytes.buffer_bytes();
            if self.policy == CachePolicy::LfuDa {
                self.age = p;
            }
            out.push(e.bytes);
        }
        out
    }

    /// Takes `key` out of the cache without counting a use or aging the others (a
    /// speculative draft's expert whose draft was rejected); returns its bytes when held.
    pub fn remove(&mut self, key: Key) -> Option<UnitBytes> {
        let e = self.map.remove(&key)?;
        self.order.remove(&(e.prio, e.tick, key));
        self.used -= e.bytes.buffer_bytes();
        Some(e.bytes)
    }

    /// Offers the bytes of a just-read `key` (its use already recorded by
    /// [`ExpertCache::hit`]). Returns the buffers that leave: the
    /// evicted entries', or `bytes` itself when the policy keeps nothing or it does not fit.
    pub fn admit(&mut self, key: Key, bytes: UnitBytes) -> Vec<UnitBytes> {
        let size = bytes.buffer_bytes();
        if size > self.budget || self.map.contains_key(&key) {
            return vec![bytes];
        }
        let out = self.evict_until(self.budget - size);
        self.tick += 1;
        let prio = self.prio_of(key);
        self.order.insert((prio, self.tick, key));
        self.map.insert(
            key,
            Entry {
                bytes,
                prio,
                tick: self.tick,
            },
        );
        self.used += size;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::streamer::UnitBytes;

    fn ub() -> UnitBytes {
        UnitBytes::empty(4096)
    }

    /// Runs `trace` through a cache of `cap` 4 KiB entries; returns the hit count.
    fn hits(policy: CachePolicy, cap: usize, trace: &[u32], seed: &[(u32, u64)]) -> usize {
        let seed = seed.iter().map(|&(e, n)| ((0, e), n)).collect();
        let mut c = ExpertCache::new(policy, cap * 4096, seed);
        let mut h = 0;
        for &e in trace {
            if c.hit((0, e)).is_some() {
                h += 1;
            } else {
                c.admit((0, e), ub());
            }
            assert!(c.used() <= c.budget());
        }
        h
    }

    #[test]
    fn a_lowered_budget_evicts_by_the_policy_and_a_raised_one_evicts_nothing() {
        let mut c = ExpertCache::new(CachePolicy::Lru, 3 * 4096, HashMap::new());
        for e in [1, 2, 3] {
            c.hit((0, e));
            c.admit((0, e), ub());
        }
        c.hit((0, 1));
        // 2 is the least recent, then 3
        assert_eq!(c.set_budget(4096 + 100).len(), 2);
        assert!(c.contains((0, 1)) && !c.contains((0, 2)) && !c.contains((0, 3)));
        assert_eq!((c.budget(), c.used()), (4096 + 100, 4096));
        assert!(c.set_budget(3 * 4096).is_empty());
        assert_eq!(c.budget(), 3 * 4096);
        let mut n = ExpertCache::new(CachePolicy::None, 4096, HashMap::new());
        assert!(n.set_budget(1 << 20).is_empty());
        assert_eq!(n.budget(), 0);
    }

    #[test]
    fn lru_evicts_the_least_recent() {
        // cap 2: 1 2 1 3 (evicts 2) 1 (hit) 2 (miss)
        assert_eq!(hits(CachePolicy::Lru, 2, &[1, 2, 1, 3, 1, 2], &[]), 2);
        assert_eq!(hits(CachePolicy::None, 2, &[1, 1, 1], &[]), 0);
    }

    #[test]
    fn lfu_da_keeps_the_frequent_expert_through_a_scan() {
        // expert 0 is used every other step, 1..=6 once each: LRU with 2 slots loses 0 to each
        // pair of newcomers; LFU-DA loses it once (while its count ties a newcomer's aged
        // priority) and then keeps it: hits at steps 3, 9 and 11 against LRU's 3 and 11.
        let trace = [0, 1, 0, 2, 3, 0, 4, 5, 0, 6, 0];
        assert_eq!(hits(CachePolicy::Lru, 2, &trace, &[]), 2);
        assert_eq!(hits(CachePolicy::LfuDa, 2, &trace, &[]), 3);
    }

    #[test]
    fn a_heat_seed_keeps_a_known_hot_expert_from_its_first_use() {
        // cap 2: unseeded, 9 is the oldest entry when 2 arrives and leaves; seeded as hot
        // (5 earlier uses), 1 leaves instead and the second use of 9 hits.
        let trace = [9, 1, 2, 9];
        assert_eq!(hits(CachePolicy::LfuDa, 2, &trace, &[]), 0);
        assert_eq!(hits(CachePolicy::Lru, 2, &trace, &[(9, 5)]), 0);
        assert_eq!(hits(CachePolicy::LfuDa, 2, &trace, &[(9, 5)]), 1);
    }

    #[test]
    fn policies_parse() {
        assert_eq!("lru".parse::<CachePolicy>(), Ok(CachePolicy::Lru));
        assert_eq!("none".parse::<CachePolicy>(), Ok(CachePolicy::None));
        assert_eq!("lfu-da".parse::<CachePolicy>(), Ok(CachePolicy::LfuDa));
        assert!("arc".parse::<CachePolicy>().is_err());
    }
}
