//! Key lookup: a chained hash table whose chains run through the slots
//! (`Slot::hnext`), as SQLite's pcache1 chains its page headers, so a
//! lookup touches the bucket array and then only the slots of its chain.
//!
//! Invariants: every live slot is in exactly the chain of bucket
//! `hash(key) & mask`, and no other slot is in any chain; every index in a
//! chain is less than the arena's length (so lookups skip bounds checks;
//! `entries` re-checks both in debug builds after every cache operation).

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
        // `mask` is heads.len() - 1, so the bucket is in bounds.
        let mut i = self.heads[bucket(key, self.mask)];
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

    /// Makes room for one more entry; false if memory is short.
    pub fn reserve_one(&mut self, slots: &mut [Slot]) -> bool {
        if self.len < self.heads.len() {
            return true;
        }
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

    /// Adds slot `i` under its key, which must not be present.
    #[inline]
    pub fn insert(&mut self, slots: &mut [Slot], i: u32) {
        let b = bucket(slots[i as usize].key, self.mask);
        slots[i as usize].hnext = self.heads[b];
        self.heads[b] = i;
        self.len += 1;
    }

    /// Removes slot `i` (found under its current key).
    pub fn remove(&mut self, slots: &mut [Slot], i: u32) {
        let b = bucket(slots[i as usize].key, self.mask);
        let mut at = self.heads[b];
        let mut prev = NIL;
        while at != NIL {
            if at == i {
                let next = slots[i as usize].hnext;
                if prev == NIL {
                    self.heads[b] = next;
                } else {
                    slots[prev as usize].hnext = next;
                }
                slots[i as usize].hnext = NIL;
                self.len -= 1;
                return;
            }
            prev = at;
            at = slots[at as usize].hnext;
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
