//! The seed's policy (Ma, "SQLite Page Caching Algorithm", 2013): every
//! fetch increments a page's reference count `hist`, which wraps to 0 after
//! `MAX_HIST` as in the seed; unpinned pages are ordered by `hist`, least
//! referenced first, oldest first among equals; the first one is evicted.
//!
//! The seed kept one sorted list plus a `histLookup` index of the last node
//! of each count, and still walked the list when the index missed. Here each
//! count has its own FIFO list and a bitmap marks the non-empty ones, so
//! insertion is a push and eviction a find-first-set: O(1) always.
//!
//! Invariants: bucket `b` holds exactly the live unpinned pages whose `hist`
//! was `b` when they were unpinned (`queue == b`); bit `b` of `nonempty` is
//! set iff bucket `b` is non-empty.

use super::{Evict, Policy};
#[cfg(any(debug_assertions, test))]
use super::{sorted, unpinned};
use crate::list::List;
use crate::slot::Slot;

/// The seed measured 15 and 30; 15 was the faster.
pub const MAX_HIST: u8 = 15;

pub struct LfuHist {
    buckets: [List; MAX_HIST as usize + 1],
    nonempty: u32,
}

impl Default for LfuHist {
    fn default() -> Self {
        LfuHist {
            buckets: [List::new(); MAX_HIST as usize + 1],
            nonempty: 0,
        }
    }
}

impl LfuHist {
    #[inline]
    fn unlink(&mut self, slots: &mut [Slot], i: u32) {
        let b = slots[i as usize].queue as usize;
        self.buckets[b].unlink(slots, i);
        if self.buckets[b].is_empty() {
            self.nonempty &= !(1 << b);
        }
    }
}

impl Evict for LfuHist {
    const POLICY: Policy = Policy::LfuHist;

    #[inline]
    fn admit(&mut self, slots: &mut [Slot], i: u32) {
        slots[i as usize].freq = 0;
    }

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], i: u32) {
        if slots[i as usize].linked {
            self.unlink(slots, i);
        }
        let s = &mut slots[i as usize];
        s.freq = if s.freq >= MAX_HIST { 0 } else { s.freq + 1 };
    }

    #[inline]
    fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        let b = slots[i as usize].freq;
        slots[i as usize].queue = b;
        self.buckets[b as usize].push_back(slots, i);
        self.nonempty |= 1 << b;
    }

    #[inline]
    fn remove(&mut self, slots: &mut [Slot], i: u32) {
        if slots[i as usize].linked {
            self.unlink(slots, i);
        }
    }

    #[inline]
    fn victim(&mut self, slots: &mut [Slot], _capacity: usize) -> Option<u32> {
        if self.nonempty == 0 {
            return None;
        }
        let b = self.nonempty.trailing_zeros() as usize;
        let v = self.buckets[b].pop_front(slots);
        if self.buckets[b].is_empty() {
            self.nonempty &= !(1 << b);
        }
        v
    }

    #[cfg(any(debug_assertions, test))]
    fn check(&self, slots: &[Slot]) {
        let mut all = Vec::new();
        for (b, list) in self.buckets.iter().enumerate() {
            let members = list.members(slots);
            assert_eq!(
                self.nonempty & (1 << b) != 0,
                !members.is_empty(),
                "bitmap bit {b}"
            );
            for &i in &members {
                assert_eq!(
                    slots[i as usize].queue as usize, b,
                    "slot {i} in wrong bucket"
                );
            }
            all.extend(members);
        }
        assert_eq!(sorted(all), unpinned(slots));
    }
}
