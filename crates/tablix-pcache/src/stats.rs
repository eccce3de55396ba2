//! Per-cache statistics, readable while the caches run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::policy::Policy;

/// A cache's own counters, kept in plain fields by the cache.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub resident: usize,
    pub pinned: usize,
    pub capacity: usize,
}

/// Counters of one cache. Updated by the cache, read by anyone.
pub struct CacheStats {
    pub id: u64,
    pub policy: Policy,
    pub page_size: usize,
    pub purgeable: bool,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    resident: AtomicU64,
    pinned: AtomicU64,
    capacity: AtomicU64,
    retired: AtomicBool,
}

/// A copy of one cache's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub id: u64,
    pub policy: Policy,
    pub page_size: usize,
    pub purgeable: bool,
    /// Fetches that found the page.
    pub hits: u64,
    /// Fetches that had to create the page (the caller then reads it).
    pub misses: u64,
    /// Unpinned pages dropped or recycled to make room.
    pub evictions: u64,
    pub resident: u64,
    pub pinned: u64,
    pub capacity: u64,
}

static REGISTRY: Mutex<Vec<Arc<CacheStats>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Counters of caches already destroyed, so totals survive them.
static RETIRED: Mutex<[u64; 3]> = Mutex::new([0; 3]);

impl CacheStats {
    pub(crate) fn register(policy: Policy, page_size: usize, purgeable: bool) -> Arc<CacheStats> {
        let s = Arc::new(CacheStats {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            policy,
            page_size,
            purgeable,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            retired: AtomicBool::new(false),
        });
        if let Ok(mut r) = REGISTRY.lock() {
            // Registration is best effort: a cache works without it.
            if r.try_reserve(1).is_ok() {
                r.push(Arc::clone(&s));
            }
        }
        s
    }

    /// Publishes the owning cache's counters. Only that cache writes them,
    /// so plain stores suffice (no read-modify-write on the hot path).
    #[inline]
    pub(crate) fn publish(&self, c: &Counters) {
        self.hits.store(c.hits, Ordering::Relaxed);
        self.misses.store(c.misses, Ordering::Relaxed);
        self.evictions.store(c.evictions, Ordering::Relaxed);
        self.resident.store(c.resident as u64, Ordering::Relaxed);
        self.pinned.store(c.pinned as u64, Ordering::Relaxed);
        self.capacity.store(c.capacity as u64, Ordering::Relaxed);
    }

    pub(crate) fn retire(&self) {
        if self.retired.swap(true, Ordering::Relaxed) {
            return;
        }
        let s = self.snapshot();
        if let Ok(mut t) = RETIRED.lock() {
            t[0] += s.hits;
            t[1] += s.misses;
            t[2] += s.evictions;
        }
        if let Ok(mut r) = REGISTRY.lock() {
            r.retain(|c| c.id != self.id);
        }
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            id: self.id,
            policy: self.policy,
            page_size: self.page_size,
            purgeable: self.purgeable,
            hits: g(&self.hits),
            misses: g(&self.misses),
            evictions: g(&self.evictions),
            resident: g(&self.resident),
            pinned: g(&self.pinned),
            capacity: g(&self.capacity),
        }
    }
}

/// The counters of every live tablix page cache in this process.
pub fn caches() -> Vec<StatsSnapshot> {
    REGISTRY
        .lock()
        .map(|r| r.iter().map(|c| c.snapshot()).collect())
        .unwrap_or_default()
}

/// Hits, misses and evictions of every cache this process has had, live or
/// destroyed.
pub fn totals() -> (u64, u64, u64) {
    let mut t = RETIRED.lock().map(|t| *t).unwrap_or_default();
    for c in caches() {
        t[0] += c.hits;
        t[1] += c.misses;
        t[2] += c.evictions;
    }
    (t[0], t[1], t[2])
}
