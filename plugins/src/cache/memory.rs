//! The in-process backend: a bounded `moka` cache weighed in bytes, with a time to live per
//! entry. Each gateway instance has its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use moka::policy::{EvictionPolicy, Expiry};
use moka::sync::Cache;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::IntGauge;

use plugin_sdk::FastState;

use super::config::EvictionChoice;
use super::key::CacheKey;
use super::store::{CacheStore, Entry, StoreError};

/// An entry with the time to live it was stored with.
struct Slot {
    entry: Entry,
    ttl: Duration,
}

/// Each entry expires `ttl` after it was (last) stored; reads do not extend it.
struct PerEntryTtl;

impl Expiry<[u8; 32], Arc<Slot>> for PerEntryTtl {
    fn expire_after_create(
        &self,
        _key: &[u8; 32],
        value: &Arc<Slot>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &[u8; 32],
        value: &Arc<Slot>,
        _updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

pub struct MemoryStore {
    cache: Cache<[u8; 32], Arc<Slot>, FastState>,
    max_bytes: u64,
}

impl MemoryStore {
    /// A store that keeps at most `max_bytes` of entries (as [`Entry::weight`] counts them).
    pub fn new(max_bytes: u64, eviction: EvictionChoice) -> MemoryStore {
        let policy = match eviction {
            EvictionChoice::TinyLfu => EvictionPolicy::tiny_lfu(),
            EvictionChoice::Lru => EvictionPolicy::lru(),
        };
        let cache = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_key: &[u8; 32], slot: &Arc<Slot>| {
                u32::try_from(slot.entry.weight()).unwrap_or(u32::MAX)
            })
            .expire_after(PerEntryTtl)
            .eviction_policy(policy)
            .build_with_hasher(FastState::default());
        MemoryStore { cache, max_bytes }
    }

    /// Applies pending evictions and expirations now (moka does it lazily); for tests and
    /// for an exact size.
    pub fn sync(&self) {
        self.cache.run_pending_tasks();
    }

    /// The `gw_cache_bytes` gauge: the bytes kept, measured when the metrics are scraped
    /// (pending evictions are applied first, so the value is exact then).
    pub fn size_metric(&self) -> Result<Box<dyn Collector>, String> {
        let gauge = IntGauge::new(
            "gw_cache_bytes",
            "Bytes of answers kept by the in-process cache",
        )
        .map_err(|e| e.to_string())?;
        Ok(Box::new(SizeMetric {
            cache: self.cache.clone(),
            gauge,
        }))
    }

    /// The weighed size of the entries kept (exact after [`MemoryStore::sync`]).
    pub fn bytes(&self) -> u64 {
        self.cache.weighted_size()
    }

    /// How many entries are kept (exact after [`MemoryStore::sync`]).
    pub fn entry_count(&self) -> u64 {
        self.cache.entry_count()
    }

    fn insert(&self, key: &CacheKey, entry: Entry, ttl: Duration) -> Result<(), StoreError> {
        if entry.weight() as u64 > self.max_bytes {
            return Err(StoreError(format!(
                "an entry of {} bytes cannot fit in a cache of {} bytes",
                entry.weight(),
                self.max_bytes
            )));
        }
        self.cache.insert(key.0, Arc::new(Slot { entry, ttl }));
        Ok(())
    }
}

#[async_trait]
impl CacheStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn get(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        Ok(self.cache.get(&key.0).map(|slot| slot.entry.clone()))
    }

    async fn put(&self, key: &CacheKey, entry: Entry, ttl: Duration) -> Result<(), StoreError> {
        self.insert(key, entry, ttl)
    }

    /// Memory stores are immediate: no task is spawned.
    fn put_detached(
        self: Arc<Self>,
        key: CacheKey,
        entry: Entry,
        ttl: Duration,
        done: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
    ) {
        done(self.insert(&key, entry, ttl));
    }
}

/// Reads the cache's size at each scrape.
struct SizeMetric {
    cache: Cache<[u8; 32], Arc<Slot>, FastState>,
    gauge: IntGauge,
}

impl Collector for SizeMetric {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.cache.run_pending_tasks();
        self.gauge
            .set(i64::try_from(self.cache.weighted_size()).unwrap_or(i64::MAX));
        self.gauge.collect()
    }
}
