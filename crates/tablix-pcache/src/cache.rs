//! One page cache instance: the key map, the page allocations and a policy.

use std::alloc::Layout;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::ffi::PcachePage;
use crate::policy::{Policy, State};
use crate::slot::{NIL, Slot};
use crate::stats::CacheStats;

/// Multiplicative hashing of page numbers: one multiply, good high bits.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Bytes before the page buffer: the `sqlite3_pcache_page` handed to SQLite
/// and the owning slot's index.
const HEADER: usize = 32;

/// A page cache as SQLite's `sqlite3_pcache_methods2` describes it.
///
/// Invariants (checked after every operation in debug builds):
/// 1. `map` maps each resident key to its live slot, and only those.
/// 2. `resident` counts live slots and `pinned` the pinned ones.
/// 3. A purgeable cache holds more than `capacity` pages only while pinned
///    pages force it to.
/// 4. Every live slot owns one allocation whose header names the slot.
/// 5. The policy's structures agree with the slots (see each policy).
pub struct Cache {
    page_size: usize,
    extra_size: usize,
    purgeable: bool,
    capacity: usize,
    layout: Layout,
    slots: Vec<Slot>,
    free: Vec<u32>,
    map: HashMap<u32, u32, BuildHasherDefault<KeyHasher>>,
    resident: usize,
    pinned: usize,
    policy: State,
    stats: Arc<CacheStats>,
}

// SAFETY: the raw page pointers are owned by the cache and only touched
// through `&mut self`; callers serialise access (a Mutex in methods.rs).
unsafe impl Send for Cache {}

impl Cache {
    /// None if the sizes cannot describe an allocation.
    pub fn new(
        page_size: usize,
        extra_size: usize,
        purgeable: bool,
        policy: Policy,
    ) -> Option<Cache> {
        let layout = Layout::from_size_align(HEADER + page_size + extra_size, 16).ok()?;
        let stats = CacheStats::register(policy, page_size, purgeable);
        Some(Cache {
            page_size,
            extra_size,
            purgeable,
            capacity: 100,
            layout,
            slots: Vec::new(),
            free: Vec::new(),
            map: HashMap::default(),
            resident: 0,
            pinned: 0,
            policy: State::new(policy),
            stats,
        })
    }

    pub fn stats(&self) -> &Arc<CacheStats> {
        &self.stats
    }

    pub fn page_count(&self) -> usize {
        self.resident
    }

    fn page_ptr(&self, i: u32) -> *mut PcachePage {
        self.slots[i as usize].mem.cast()
    }

    /// The slot that owns `page`.
    ///
    /// # Safety
    /// `page` must have been returned by this cache's `fetch` and not freed.
    pub unsafe fn slot_of(page: *mut PcachePage) -> u32 {
        // SAFETY: guaranteed by the caller; the header layout is ours.
        unsafe {
            *(page
                .cast::<u8>()
                .add(std::mem::size_of::<PcachePage>())
                .cast::<u32>())
        }
    }

    /// Allocates a page for slot `i`; null on allocation failure.
    fn allocate(&self, i: u32) -> *mut u8 {
        // SAFETY: the layout has non-zero size.
        let mem = unsafe { std::alloc::alloc(self.layout) };
        if mem.is_null() {
            return mem;
        }
        // SAFETY: `mem` spans HEADER + page + extra bytes, 16-aligned.
        unsafe {
            let buf = mem.add(HEADER);
            let extra = buf.add(self.page_size);
            std::ptr::write(
                mem.cast::<PcachePage>(),
                PcachePage {
                    buf: buf.cast(),
                    extra: extra.cast(),
                },
            );
            *(mem.add(std::mem::size_of::<PcachePage>()).cast::<u32>()) = i;
            std::ptr::write_bytes(extra, 0, self.extra_size);
        }
        mem
    }

    fn zero_extra(&self, i: u32) {
        let mem = self.slots[i as usize].mem;
        // SAFETY: a live slot's allocation has `extra_size` bytes after the
        // buffer.
        unsafe { std::ptr::write_bytes(mem.add(HEADER + self.page_size), 0, self.extra_size) };
    }

    /// `xFetch`.
    pub fn fetch(&mut self, key: u32, create: i32) -> *mut PcachePage {
        let out = self.fetch_inner(key, create);
        self.publish();
        out
    }

    fn fetch_inner(&mut self, key: u32, create: i32) -> *mut PcachePage {
        if let Some(&i) = self.map.get(&key) {
            self.stats.hit();
            self.policy.touch(&mut self.slots, i);
            let s = &mut self.slots[i as usize];
            if !s.pinned {
                s.pinned = true;
                self.pinned += 1;
            }
            return self.page_ptr(i);
        }
        if create == 0 {
            return std::ptr::null_mut();
        }
        // Like SQLite's own cache: with createFlag 1, refuse while most of
        // the budget is pinned, so that SQLite spills dirty pages first.
        if create == 1 && self.purgeable && self.pinned >= (self.capacity * 9 / 10).max(1) {
            return std::ptr::null_mut();
        }
        if self.map.try_reserve(1).is_err() {
            return std::ptr::null_mut();
        }
        let mut recycled = None;
        if self.purgeable && self.resident >= self.capacity {
            recycled = self.policy.victim(&mut self.slots, self.capacity);
            if recycled.is_none() && create == 1 {
                return std::ptr::null_mut();
            }
        }
        let i = match recycled {
            Some(v) => {
                self.stats.eviction();
                let old = self.slots[v as usize].key;
                self.map.remove(&old);
                self.zero_extra(v);
                v
            }
            None => {
                let i = match self.free.pop() {
                    Some(i) => i,
                    None => {
                        if self.slots.try_reserve(1).is_err() || self.slots.len() >= NIL as usize {
                            return std::ptr::null_mut();
                        }
                        self.slots.push(Slot::default());
                        (self.slots.len() - 1) as u32
                    }
                };
                let mem = self.allocate(i);
                if mem.is_null() {
                    self.free.push(i);
                    return std::ptr::null_mut();
                }
                self.slots[i as usize].mem = mem;
                self.resident += 1;
                i
            }
        };
        self.stats.miss();
        let s = &mut self.slots[i as usize];
        s.key = key;
        s.live = true;
        s.pinned = true;
        s.freq = 0;
        self.pinned += 1;
        self.map.insert(key, i);
        self.policy.admit(&mut self.slots, i);
        self.page_ptr(i)
    }

    /// `xUnpin`.
    pub fn unpin(&mut self, i: u32, discard: bool) {
        if self.slots[i as usize].pinned {
            self.slots[i as usize].pinned = false;
            self.pinned -= 1;
        }
        if discard {
            self.remove(i);
        } else {
            self.policy.unpin(&mut self.slots, i);
            self.trim();
        }
        self.publish();
    }

    /// `xRekey`: page `i` now holds `new`; a page already holding `new` is
    /// discarded.
    pub fn rekey(&mut self, i: u32, new: u32) {
        let old = self.slots[i as usize].key;
        if old != new {
            if let Some(&j) = self.map.get(&new) {
                self.remove(j);
            }
            self.map.remove(&old);
            self.map.insert(new, i);
            self.slots[i as usize].key = new;
            self.policy.rekey(&mut self.slots, i, new);
        }
        self.publish();
    }

    /// `xTruncate`: discards every page whose key is `limit` or more,
    /// pinned or not.
    pub fn truncate(&mut self, limit: u32) {
        let doomed: Vec<u32> = self
            .map
            .iter()
            .filter(|(k, _)| **k >= limit)
            .map(|(_, i)| *i)
            .collect();
        for i in doomed {
            self.remove(i);
        }
        self.publish();
    }

    /// `xCachesize`.
    pub fn set_capacity(&mut self, pages: usize) {
        self.capacity = pages.max(1);
        self.trim();
        self.publish();
    }

    /// `xShrink`: frees every unpinned page.
    pub fn shrink(&mut self) {
        let idle: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].live && !self.slots[i as usize].pinned)
            .collect();
        for i in idle {
            self.remove(i);
        }
        self.publish();
    }

    /// Evicts unpinned pages while a purgeable cache is over budget.
    fn trim(&mut self) {
        while self.purgeable && self.resident > self.capacity {
            match self.policy.victim(&mut self.slots, self.capacity) {
                Some(v) => {
                    self.stats.eviction();
                    let key = self.slots[v as usize].key;
                    self.map.remove(&key);
                    self.free_slot(v);
                }
                None => break,
            }
        }
    }

    /// Removes a live page from the cache and frees it.
    fn remove(&mut self, i: u32) {
        self.policy.remove(&mut self.slots, i);
        let s = &mut self.slots[i as usize];
        if s.pinned {
            s.pinned = false;
            self.pinned -= 1;
        }
        let key = s.key;
        self.map.remove(&key);
        self.free_slot(i);
    }

    /// Frees the allocation of slot `i`, already out of the map and policy.
    fn free_slot(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        let mem = std::mem::replace(&mut s.mem, std::ptr::null_mut());
        *s = Slot::default();
        self.resident -= 1;
        self.free.push(i);
        // SAFETY: `mem` came from `allocate` with this layout.
        unsafe { std::alloc::dealloc(mem, self.layout) };
    }

    fn publish(&self) {
        self.stats
            .set_gauges(self.resident, self.pinned, self.capacity);
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Panics unless every invariant of the cache and its policy holds.
    pub fn check(&self) {
        let live: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].live)
            .collect();
        assert_eq!(live.len(), self.resident, "resident count");
        assert_eq!(self.map.len(), self.resident, "map size");
        let pinned = live
            .iter()
            .filter(|&&i| self.slots[i as usize].pinned)
            .count();
        assert_eq!(pinned, self.pinned, "pinned count");
        for &i in &live {
            let s = &self.slots[i as usize];
            assert_eq!(self.map.get(&s.key), Some(&i), "map entry of slot {i}");
            assert!(!s.mem.is_null());
            // SAFETY: a live slot's allocation starts with our header.
            assert_eq!(
                unsafe { Cache::slot_of(s.mem.cast()) },
                i,
                "header of slot {i}"
            );
        }
        if self.purgeable && self.resident > self.capacity {
            assert!(
                self.resident - self.capacity <= self.pinned,
                "over budget with unpinned pages to spare: {} resident, {} pinned, budget {}, policy {}",
                self.resident,
                self.pinned,
                self.capacity,
                self.stats.policy
            );
        }
        self.policy.check(&self.slots);
    }

    #[cfg(test)]
    pub fn keys(&self) -> Vec<(u32, bool)> {
        let mut v: Vec<(u32, bool)> = self
            .map
            .iter()
            .map(|(k, i)| (*k, self.slots[*i as usize].pinned))
            .collect();
        v.sort_unstable();
        v
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if !s.mem.is_null() {
                // SAFETY: allocated in `allocate` with `self.layout`.
                unsafe { std::alloc::dealloc(s.mem, self.layout) };
                s.mem = std::ptr::null_mut();
            }
        }
        self.stats.set_gauges(0, 0, self.capacity);
        self.stats.retire();
    }
}
