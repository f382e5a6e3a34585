//! The prefix cache: engine states after a shared prefix, kept across
//! requests, keyed by the state hash and weighed in bytes.
//!
//! Built on moka with LRU eviction. Weights are counted in KiB rounded up,
//! so the bytes held never exceed the budget; an entry larger than the whole
//! budget is never stored. A budget of 0 turns the cache off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use sha2::{Digest, Sha256};

use crate::metrics::Metrics;

/// The key of a state: SHA-256 of the model identity, the tokenizer
/// identity, the padding policy and the prefix token ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateHash(pub [u8; 32]);

impl StateHash {
    pub fn new(model: &str, tokenizer: &str, padding: &str, prefix: &[u32]) -> Self {
        let mut h = Sha256::new();
        for part in [model, tokenizer, padding] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.update((prefix.len() as u64).to_le_bytes());
        for id in prefix {
            h.update(id.to_le_bytes());
        }
        StateHash(h.finalize().into())
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What the cache holds must say how large it is.
pub trait Weighed {
    fn nbytes(&self) -> usize;
}

pub struct PrefixCache<V: Weighed + Send + Sync + 'static> {
    cache: Option<Cache<StateHash, Arc<V>>>,
    budget_bytes: u64,
    held: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

fn kib(bytes: usize) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as usize) as u32
}

impl<V: Weighed + Send + Sync + 'static> PrefixCache<V> {
    pub fn new(budget_mib: u64, metrics: Arc<Metrics>) -> Self {
        metrics.prefix_cache_capacity.set((budget_mib << 20) as i64);
        let held = Arc::new(AtomicU64::new(0));
        let cache = (budget_mib > 0).then(|| {
            let (held, m) = (held.clone(), metrics.clone());
            Cache::builder()
                .max_capacity(budget_mib * 1024)
                .weigher(|_: &StateHash, v: &Arc<V>| kib(v.nbytes()))
                .eviction_policy(EvictionPolicy::lru())
                .eviction_listener(move |_, v: Arc<V>, cause| {
                    held.fetch_sub(v.nbytes() as u64, Ordering::Relaxed);
                    if cause == RemovalCause::Size {
                        m.prefix_cache_evictions.inc();
                    }
                })
                .build()
        });
        PrefixCache {
            cache,
            budget_bytes: budget_mib << 20,
            held,
            metrics,
        }
    }

    pub fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// The state for `key`, counting a hit or a miss.
    pub fn get(&self, key: &StateHash) -> Option<Arc<V>> {
        let found = self.cache.as_ref().and_then(|c| c.get(key));
        match found {
            Some(_) => self.metrics.prefix_cache_hits.inc(),
            None => self.metrics.prefix_cache_misses.inc(),
        }
        found
    }

    /// The state for `key` without counting a hit or a miss (the metrics
    /// count decisions' state look-ups; completions look up prompts).
    pub fn peek(&self, key: &StateHash) -> Option<Arc<V>> {
        self.cache.as_ref().and_then(|c| c.get(key))
    }

    /// Keeps `value` unless it alone is over the budget; returns whether it
    /// was stored. Evictions happen before this returns.
    pub fn insert(&self, key: StateHash, value: Arc<V>) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let bytes = value.nbytes();
        if u64::from(kib(bytes)) * 1024 > self.budget_bytes {
            return false;
        }
        self.held.fetch_add(bytes as u64, Ordering::Relaxed);
        cache.insert(key, value);
        cache.run_pending_tasks();
        self.publish();
        true
    }

    /// Bytes of the states held.
    pub fn bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn entries(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.entry_count())
    }

    fn publish(&self) {
        self.metrics.prefix_cache_bytes.set(self.bytes() as i64);
        self.metrics.prefix_cache_entries.set(self.entries() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Blob(usize);
    impl Weighed for Blob {
        fn nbytes(&self) -> usize {
            self.0
        }
    }

    fn key(i: u32) -> StateHash {
        StateHash::new("m", "t", "none", &[i])
    }

    #[test]
    fn the_hash_covers_every_part() {
        let base = StateHash::new("m", "t", "none", &[1, 2]);
        assert_eq!(base, StateHash::new("m", "t", "none", &[1, 2]));
        assert_ne!(base, StateHash::new("m2", "t", "none", &[1, 2]));
        assert_ne!(base, StateHash::new("m", "t2", "none", &[1, 2]));
        assert_ne!(base, StateHash::new("m", "t", "block", &[1, 2]));
        assert_ne!(base, StateHash::new("m", "t", "none", &[1, 2, 3]));
        assert_eq!(base.hex().len(), 64);
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let metrics = Arc::new(Metrics::new());
        let cache = PrefixCache::new(1, metrics.clone());
        // Larger than the whole budget: never stored.
        assert!(!cache.insert(key(0), Arc::new(Blob(2 << 20))));
        assert_eq!(cache.entries(), 0);
        for i in 1..=10 {
            assert!(cache.insert(key(i), Arc::new(Blob(300 << 10))));
            assert!(cache.bytes() <= 1 << 20, "{} bytes held", cache.bytes());
        }
        assert_eq!(cache.entries(), 3);
        assert!(metrics.prefix_cache_evictions.get() >= 7);
        // The most recent states are the ones kept.
        assert!(cache.get(&key(10)).is_some());
        assert!(cache.get(&key(1)).is_none());
        assert_eq!(metrics.prefix_cache_hits.get(), 1);
        assert_eq!(metrics.prefix_cache_misses.get(), 1);
    }

    #[test]
    fn a_zero_budget_turns_it_off() {
        let cache = PrefixCache::new(0, Arc::new(Metrics::new()));
        assert!(!cache.enabled());
        assert!(!cache.insert(key(1), Arc::new(Blob(10))));
        assert!(cache.get(&key(1)).is_none());
    }
}
