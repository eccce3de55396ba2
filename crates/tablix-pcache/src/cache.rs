//! One page cache instance: the key map, the page allocations and a policy.

use std::alloc::Layout;
use std::sync::Arc;

use crate::ffi::PcachePage;
use crate::policy::Evict;
use crate::slot::{NIL, Slot};
use crate::stats::{CacheStats, Counters};
use crate::table::Table;

/// The page budget before SQLite's first `xCachesize`.
const INITIAL_CAPACITY: usize = 100;

/// Most page allocations a cache keeps spare.
const SPARE_LIMIT: usize = 32;

/// A miss publishes the statistics once per this many misses (SQLite's
/// own cache counts nothing; publishing on every miss cost about a tenth of
/// the miss path).
const MISSES_PER_PUBLISH: u64 = 64;

/// Bytes of a new page's extra that are zeroed: the pager's first pointer.
const EXTRA_ZEROED: usize = 8;

/// Bytes before the page buffer: the `sqlite3_pcache_page` handed to SQLite
/// and the owning slot's index.
const HEADER: usize = 32;

/// Pinned pages of a `capacity`-page cache from which SQLite is asked to
/// spill (createFlag 1 refused), as SQLite's own cache does; never for a
/// cache that is not purgeable.
fn spill_at(capacity: usize, purgeable: bool) -> usize {
    if purgeable {
        (capacity * 9 / 10).max(1)
    } else {
        usize::MAX
    }
}

/// Resident pages from which a cache evicts: its capacity, or never for a
/// cache that is not purgeable.
fn evict_at(capacity: usize, purgeable: bool) -> usize {
    if purgeable { capacity } else { usize::MAX }
}

/// The slot that owns `page`.
///
/// # Safety
/// `page` must have been returned by a cache's `fetch` and not freed.
#[inline]
pub unsafe fn slot_of(page: *mut PcachePage) -> u32 {
    // SAFETY: guaranteed by the caller; the header layout is ours.
    unsafe {
        *(page
            .cast::<u8>()
            .add(std::mem::size_of::<PcachePage>())
            .cast::<u32>())
    }
}

/// A page cache as SQLite's `sqlite3_pcache_methods2` describes it.
///
/// Invariants (checked after every operation in debug builds):
/// 1. `map` maps each resident key to its live slot, and only those.
/// 2. `resident` counts live slots and `pinned` the pinned ones.
/// 3. A purgeable cache holds more than `capacity` pages only while pinned
///    pages force it to.
/// 4. Every live slot owns one allocation whose header names the slot.
/// 5. The policy's structures agree with the slots (see each policy).
/// 6. No live slot's key exceeds `max_key` (DESIGN.md's invariant 7).
pub struct Cache<P: Evict> {
    page_size: usize,
    extra_size: usize,
    purgeable: bool,
    capacity: usize,
    /// Pinned pages from which `createFlag = 1` is refused: 90% of
    /// `capacity`, at least 1 (`usize::MAX` unless purgeable).
    spill_at: usize,
    /// `capacity`, or `usize::MAX` unless purgeable: the fast paths
    /// compare with it alone.
    evict_at: usize,
    /// Whether a new page's extra starts with a whole word to zero (it
    /// does for every page size and extra SQLite uses).
    extra_word: bool,
    layout: Layout,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Page allocations kept for reuse after a page is discarded, so that
    /// delete-heavy work does not pay a free/malloc round trip per page.
    /// Bounded by `SPARE_LIMIT`.
    spare: Vec<*mut u8>,
    map: Table,
    /// A bound on the keys held (invariant 6), so that `truncate`, which
    /// SQLite calls at the end of every transaction with the database's
    /// length, finds nothing to discard without visiting every slot.
    max_key: u32,
    resident: usize,
    pinned: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
    policy: P,
    stats: Arc<CacheStats>,
}

// SAFETY: the raw page pointers are owned by the cache and only touched
// through `&mut self`; callers serialise access (a Mutex in methods.rs).
unsafe impl<P: Evict> Send for Cache<P> {}

impl<P: Evict> Cache<P> {
    /// None if the sizes cannot describe an allocation.
    pub fn new(page_size: usize, extra_size: usize, purgeable: bool) -> Option<Cache<P>> {
        let layout = Layout::from_size_align(HEADER + page_size + extra_size, 16).ok()?;
        let stats = CacheStats::register(P::POLICY, page_size, purgeable);
        Some(Cache {
            page_size,
            extra_size,
            purgeable,
            capacity: INITIAL_CAPACITY,
            spill_at: spill_at(INITIAL_CAPACITY, purgeable),
            evict_at: evict_at(INITIAL_CAPACITY, purgeable),
            extra_word: extra_size >= EXTRA_ZEROED && page_size.is_multiple_of(8),
            layout,
            slots: Vec::new(),
            free: Vec::new(),
            spare: Vec::new(),
            map: Table::new(),
            max_key: 0,
            resident: 0,
            pinned: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            policy: {
                let mut p = P::default();
                p.set_capacity(INITIAL_CAPACITY);
                p
            },
            stats,
        })
    }

    pub fn page_count(&self) -> usize {
        self.resident
    }

    fn page_ptr(&self, i: u32) -> *mut PcachePage {
        debug_assert!((i as usize) < self.slots.len());
        // SAFETY: callers pass live slots (in bounds).
        unsafe { self.slots.get_unchecked(i as usize) }.mem.cast()
    }

    /// Allocates a page for slot `i` (reusing a spare one when there is
    /// one); null on allocation failure.
    fn allocate(&mut self, i: u32) -> *mut u8 {
        let mem = match self.spare.pop() {
            Some(m) => m,
            // SAFETY: the layout has non-zero size.
            None => unsafe { std::alloc::alloc(self.layout) },
        };
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
        }
        self.zero_extra(mem);
        mem
    }

    /// Zeroes the start of a (re)created page's extra bytes: the pager
    /// tells a new page by its header's first pointer being null and
    /// initialises the rest itself (SQLite's pcache1 zeroes the same).
    #[inline]
    fn zero_extra(&self, mem: *mut u8) {
        // SAFETY: the allocation has `extra_size` bytes after the buffer,
        // which is 16-aligned and a multiple of 8 bytes long (SQLite's
        // page sizes are powers of two of at least 512).
        unsafe {
            let extra = mem.add(HEADER + self.page_size);
            if self.extra_word {
                extra.cast::<u64>().write(0);
            } else {
                std::ptr::write_bytes(extra, 0, self.extra_size.min(EXTRA_ZEROED));
            }
        }
    }

    /// `xFetch`.
    #[inline]
    pub fn fetch(&mut self, key: u32, create: i32) -> *mut PcachePage {
        match self.map.get(&self.slots, key) {
            Some(i) => self.hit(i),
            None => self.fetch_absent(key, create),
        }
    }

    /// The hot path: a resident page is pinned and returned.
    #[inline]
    fn hit(&mut self, i: u32) -> *mut PcachePage {
        self.hits += 1;
        self.policy.touch(&mut self.slots, i);
        debug_assert!((i as usize) < self.slots.len());
        // SAFETY: the table only holds in-bounds slot indices.
        let s = unsafe { self.slots.get_unchecked_mut(i as usize) };
        let page = s.mem.cast();
        if !s.pinned {
            s.pinned = true;
            self.pinned += 1;
        }
        if self.hits.is_multiple_of(1024) {
            self.publish();
        }
        #[cfg(debug_assertions)]
        self.check();
        page
    }

    /// The page is not resident: create it if asked to.
    #[cold]
    #[inline(never)]
    fn fetch_absent(&mut self, key: u32, create: i32) -> *mut PcachePage {
        let out = self.create(key, create);
        if self.misses.is_multiple_of(MISSES_PER_PUBLISH) {
            self.publish();
        }
        #[cfg(debug_assertions)]
        self.check();
        out
    }

    fn create(&mut self, key: u32, create: i32) -> *mut PcachePage {
        if create == 0 {
            return std::ptr::null_mut();
        }
        // Like SQLite's own cache: with createFlag 1, refuse while most of
        // the budget is pinned, so that SQLite spills dirty pages first.
        if create == 1 && self.pinned >= self.spill_at {
            return std::ptr::null_mut();
        }
        if !self.map.reserve_one(&mut self.slots) {
            return std::ptr::null_mut();
        }
        let mut recycled = None;
        if self.resident >= self.evict_at {
            recycled = self.policy.victim(&mut self.slots, self.capacity);
            if recycled.is_none() && create == 1 {
                return std::ptr::null_mut();
            }
        }
        let i = match recycled {
            Some(v) => {
                self.evictions += 1;
                self.map.remove(&mut self.slots, v);
                let mem = crate::list::at(&mut self.slots, v).mem;
                self.zero_extra(mem);
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
        self.misses += 1;
        debug_assert!((i as usize) < self.slots.len());
        // SAFETY: `i` is a victim the policy named or a slot just made.
        let s = unsafe { self.slots.get_unchecked_mut(i as usize) };
        s.key = key;
        s.live = true;
        s.pinned = true;
        s.freq = 0;
        self.pinned += 1;
        self.max_key = self.max_key.max(key);
        self.map.insert(&mut self.slots, i);
        self.policy.admit(&mut self.slots, i);
        self.page_ptr(i)
    }

    /// `xUnpin`. `i` must be a live slot (the index SQLite's page carries).
    #[inline]
    pub fn unpin(&mut self, i: u32, discard: bool) {
        assert!((i as usize) < self.slots.len(), "unpin of unknown slot {i}");
        if discard {
            return self.unpin_discard(i);
        }
        // SAFETY: bounds checked above.
        let s = unsafe { self.slots.get_unchecked_mut(i as usize) };
        if s.pinned {
            s.pinned = false;
            self.pinned -= 1;
        }
        self.policy.unpin(&mut self.slots, i);
        if self.resident > self.evict_at {
            self.over_budget();
        }
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Pages were kept over budget while pinned: evict what is unpinned.
    #[cold]
    #[inline(never)]
    fn over_budget(&mut self) {
        self.trim();
        self.publish();
    }

    #[cold]
    #[inline(never)]
    fn unpin_discard(&mut self, i: u32) {
        self.remove(i);
        self.publish();
    }

    /// `xRekey`: page `i` now holds `new`; a page already holding `new` is
    /// discarded.
    pub fn rekey(&mut self, i: u32, new: u32) {
        let old = self.slots[i as usize].key;
        if old != new {
            if let Some(j) = self.map.get(&self.slots, new) {
                self.remove(j);
            }
            self.map.remove(&mut self.slots, i);
            self.slots[i as usize].key = new;
            self.map.insert(&mut self.slots, i);
            self.policy.rekey(&mut self.slots, i, new);
            self.max_key = self.max_key.max(new);
        }
        self.publish();
    }

    /// `xTruncate`: discards every page whose key is `limit` or more,
    /// pinned or not.
    pub fn truncate(&mut self, limit: u32) {
        if self.resident == 0 || limit > self.max_key {
            // The end of a transaction: the statistics catch up.
            self.publish();
            return;
        }
        let doomed: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].live && self.slots[i as usize].key >= limit)
            .collect();
        for i in doomed {
            self.remove(i);
        }
        self.max_key = limit.saturating_sub(1);
        self.publish();
    }

    /// `xCachesize`.
    pub fn set_capacity(&mut self, pages: usize) {
        self.capacity = pages.max(1);
        self.spill_at = spill_at(self.capacity, self.purgeable);
        self.evict_at = evict_at(self.capacity, self.purgeable);
        self.policy.set_capacity(self.capacity);
        self.trim();
        self.publish();
    }

    /// `xShrink`: frees every unpinned page and every spare allocation.
    pub fn shrink(&mut self) {
        let idle: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].live && !self.slots[i as usize].pinned)
            .collect();
        for i in idle {
            self.remove(i);
        }
        for mem in self.spare.drain(..) {
            // SAFETY: allocated in `allocate` with `self.layout`.
            unsafe { std::alloc::dealloc(mem, self.layout) };
        }
        self.publish();
    }

    /// Evicts unpinned pages while a purgeable cache is over budget.
    fn trim(&mut self) {
        while self.resident > self.evict_at {
            match self.policy.victim(&mut self.slots, self.capacity) {
                Some(v) => {
                    self.evictions += 1;
                    self.map.remove(&mut self.slots, v);
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
        self.map.remove(&mut self.slots, i);
        self.free_slot(i);
    }

    /// Frees the allocation of slot `i`, already out of the map and policy.
    fn free_slot(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        let mem = std::mem::replace(&mut s.mem, std::ptr::null_mut());
        *s = Slot::default();
        self.resident -= 1;
        self.free.push(i);
        if self.spare.len() < SPARE_LIMIT && self.spare.try_reserve(1).is_ok() {
            self.spare.push(mem);
        } else {
            // SAFETY: `mem` came from `allocate` with this layout.
            unsafe { std::alloc::dealloc(mem, self.layout) };
        }
    }

    fn counters(&self) -> Counters {
        Counters {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            resident: self.resident,
            pinned: self.pinned,
            capacity: self.capacity,
        }
    }

    /// Publishes the counters to readers of statistics. Rare calls publish
    /// at once, and so does `truncate`, which SQLite calls at the end of
    /// every transaction; hits every 1024th hit and misses every
    /// `MISSES_PER_PUBLISH`th miss, so within a transaction the counters
    /// and gauges may trail by that much.
    fn publish(&self) {
        self.stats.publish(&self.counters());
        #[cfg(debug_assertions)]
        self.check();
    }

    /// Panics unless every invariant of the cache and its policy holds.
    #[cfg(any(debug_assertions, test))]
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
        let mut entries = self.map.entries(&self.slots);
        entries.sort_unstable_by_key(|e| e.1);
        assert_eq!(
            entries.iter().map(|e| e.1).collect::<Vec<_>>(),
            live,
            "table members"
        );
        for &i in &live {
            let s = &self.slots[i as usize];
            assert_eq!(
                self.map.get(&self.slots, s.key),
                Some(i),
                "table entry of slot {i}"
            );
            assert!(!s.mem.is_null());
            // SAFETY: a live slot's allocation starts with our header.
            assert_eq!(unsafe { slot_of(s.mem.cast()) }, i, "header of slot {i}");
            assert!(
                s.key <= self.max_key,
                "key {} of slot {i} over the bound",
                s.key
            );
        }
        assert_eq!(self.evict_at, evict_at(self.capacity, self.purgeable));
        assert_eq!(self.spill_at, spill_at(self.capacity, self.purgeable));
        if self.purgeable && self.resident > self.capacity {
            assert!(
                self.resident - self.capacity <= self.pinned,
                "over budget with unpinned pages to spare: {} resident, {} pinned, budget {}, policy {}",
                self.resident,
                self.pinned,
                self.capacity,
                P::POLICY
            );
        }
        self.policy.check(&self.slots);
    }

    #[cfg(test)]
    pub fn keys(&self) -> Vec<(u32, bool)> {
        let mut v: Vec<(u32, bool)> = self
            .map
            .entries(&self.slots)
            .iter()
            .map(|(k, i)| (*k, self.slots[*i as usize].pinned))
            .collect();
        v.sort_unstable();
        v
    }
}

impl<P: Evict> Drop for Cache<P> {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if !s.mem.is_null() {
                // SAFETY: allocated in `allocate` with `self.layout`.
                unsafe { std::alloc::dealloc(s.mem, self.layout) };
                s.mem = std::ptr::null_mut();
            }
        }
        for mem in self.spare.drain(..) {
            // SAFETY: as above.
            unsafe { std::alloc::dealloc(mem, self.layout) };
        }
        let mut last = self.counters();
        last.resident = 0;
        last.pinned = 0;
        self.stats.publish(&last);
        self.stats.retire();
    }
}
