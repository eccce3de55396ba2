//! Key lookup: a chained hash table whose chains run through the slots
//! (`Slot::hnext`), as SQLite's pcache1 chains its page headers, so a
//! lookup touches the bucket array and then only the slots of its chain.
//!
//! Invariants: every live slot is in exactly the chain of bucket
//! `hash(key) & mask`, and no other slot is in any chain; every index in a
//! chain is less than the arena's length (so lookups skip bounds checks;
//! `entries` re-checks both in debug builds after every cache operation).

use crate::list::at;
use crate::slot::{NIL, Slot};

pub struct Table {
    heads: Vec<u32>,
    mask: u32,
    len: usize,
}

#[inline]
fn bucket(key: u32, mask: u32) -> usize {
    // Fibonacci hashing: page numbers are dense, so mix before masking.
    ((key.wrapping_mul(0x9E37_79B1) >> 7) & mask) as usize
}

impl Table {
    pub fn new() -> Table {
        Table {
            heads: vec![NIL; 64],
            mask: 63,
            len: 0,
        }
    }

    #[cfg(any(debug_assertions, test))]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn get(&self, slots: &[Slot], key: u32) -> Option<u32> {
        let b = bucket(key, self.mask);
        debug_assert!(b < self.heads.len());
        // SAFETY: `mask` is heads.len() - 1, so the bucket is in bounds.
        let mut i = unsafe { *self.heads.get_unchecked(b) };
        while i != NIL {
            debug_assert!((i as usize) < slots.len());
            // SAFETY: chain indices are in bounds (module invariant).
            let s = unsafe { slots.get_unchecked(i as usize) };
            if s.key == key {
                return Some(i);
            }
            i = s.hnext;
        }
        None
    }

    /// Makes room for one more entry (always true: a table that cannot
    /// grow still works, with longer chains).
    #[inline]
    pub fn reserve_one(&mut self, slots: &mut [Slot]) -> bool {
        if self.len < self.heads.len() {
            return true;
        }
        self.grow(slots)
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, slots: &mut [Slot]) -> bool {
        let n = self.heads.len() * 2;
        let mut heads = Vec::new();
        if heads.try_reserve_exact(n).is_err() {
            // A full table still works, with longer chains.
            return true;
        }
        heads.resize(n, NIL);
        let mask = (n - 1) as u32;
        for old in std::mem::take(&mut self.heads) {
            let mut i = old;
            while i != NIL {
                let next = slots[i as usize].hnext;
                let b = bucket(slots[i as usize].key, mask);
                slots[i as usize].hnext = heads[b];
                heads[b] = i;
                i = next;
            }
        }
        self.heads = heads;
        self.mask = mask;
        true
    }

    /// `heads[b]` for a bucket of `bucket(_, self.mask)`.
    #[inline(always)]
    fn head(&mut self, b: usize) -> &mut u32 {
        debug_assert!(b < self.heads.len());
        // SAFETY: `mask` is heads.len() - 1, so the bucket is in bounds.
        unsafe { self.heads.get_unchecked_mut(b) }
    }

    /// Adds slot `i` under its key, which must not be present. `i` names a
    /// live slot (the list module's invariant, which indexes the same way).
    #[inline]
    pub fn insert(&mut self, slots: &mut [Slot], i: u32) {
        let s = at(slots, i);
        let b = bucket(s.key, self.mask);
        let head = self.head(b);
        s.hnext = *head;
        *head = i;
        self.len += 1;
    }

    /// Removes slot `i` (found under its current key).
    #[inline]
    pub fn remove(&mut self, slots: &mut [Slot], i: u32) {
        let b = bucket(at(slots, i).key, self.mask);
        let mut cur = *self.head(b);
        let mut prev = NIL;
        while cur != NIL {
            let next = at(slots, cur).hnext;
            if cur == i {
                if prev == NIL {
                    *self.head(b) = next;
                } else {
                    at(slots, prev).hnext = next;
                }
                at(slots, i).hnext = NIL;
                self.len -= 1;
                return;
            }
            prev = cur;
            cur = next;
        }
        debug_assert!(false, "slot {i} not in its chain");
    }

    /// Every (key, slot) in the table (for checks).
    #[cfg(any(debug_assertions, test))]
    pub fn entries(&self, slots: &[Slot]) -> Vec<(u32, u32)> {
        let mut out = Vec::with_capacity(self.len);
        for (b, &h) in self.heads.iter().enumerate() {
            let mut i = h;
            while i != NIL {
                let k = slots[i as usize].key;
                assert_eq!(bucket(k, self.mask), b, "slot {i} in the wrong chain");
                out.push((k, i));
                i = slots[i as usize].hnext;
            }
        }
        assert_eq!(out.len(), self.len, "table length");
        out
    }
}
