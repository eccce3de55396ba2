//! Intrusive doubly-linked lists threaded through the slot arena, so that
//! moving a page between lists is O(1) and allocates nothing.
//!
//! Invariant (checked by `members` in debug builds after every cache
//! operation): every index stored in a list (head, tail, prev, next) is
//! NIL or less than the arena's length, and every index a caller passes
//! names a live slot (taken from the table, a list, or a page header the
//! cache wrote). The hot paths index without bounds checks on the strength
//! of it.

use crate::slot::{NIL, Slot};

/// `slots[i]` for an index the list invariant guarantees is in bounds.
#[inline(always)]
pub(crate) fn at(slots: &mut [Slot], i: u32) -> &mut Slot {
    debug_assert!((i as usize) < slots.len(), "slot index {i} out of bounds");
    // SAFETY: list indices are in bounds (module invariant).
    unsafe { slots.get_unchecked_mut(i as usize) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    pub head: u32,
    pub tail: u32,
    pub len: u32,
}

impl Default for List {
    fn default() -> Self {
        List::new()
    }
}

impl List {
    pub const fn new() -> List {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `i` (which must be in no list) at the tail.
    #[inline]
    pub fn push_back(&mut self, slots: &mut [Slot], i: u32) {
        let tail = self.tail;
        let s = at(slots, i);
        debug_assert!(!s.linked, "slot {i} already linked");
        s.prev = tail;
        s.next = NIL;
        s.linked = true;
        if tail == NIL {
            self.head = i;
        } else {
            at(slots, tail).next = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// Puts `i` (which must be in no list) at the head.
    #[inline]
    pub fn push_front(&mut self, slots: &mut [Slot], i: u32) {
        let head = self.head;
        let s = at(slots, i);
        debug_assert!(!s.linked, "slot {i} already linked");
        s.prev = NIL;
        s.next = head;
        s.linked = true;
        if head == NIL {
            self.tail = i;
        } else {
            at(slots, head).prev = i;
        }
        self.head = i;
        self.len += 1;
    }

    /// Removes `i`, which must be in this list.
    #[inline]
    pub fn unlink(&mut self, slots: &mut [Slot], i: u32) {
        let (prev, next) = {
            let s = at(slots, i);
            debug_assert!(s.linked, "slot {i} not linked");
            s.linked = false;
            (s.prev, s.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            at(slots, prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            at(slots, next).prev = prev;
        }
        self.len -= 1;
    }

    /// Moves the head to the tail (a FIFO's page going round again).
    #[inline]
    pub fn rotate(&mut self, slots: &mut [Slot]) {
        let (h, t) = (self.head, self.tail);
        if h == t {
            return;
        }
        let next = at(slots, h).next;
        at(slots, next).prev = NIL;
        self.head = next;
        let s = at(slots, h);
        s.prev = t;
        s.next = NIL;
        at(slots, t).next = h;
        self.tail = h;
    }

    /// Unlinks the head, which must exist, and returns it.
    #[inline]
    pub fn take_head(&mut self, slots: &mut [Slot]) -> u32 {
        let h = self.head;
        debug_assert!(h != NIL, "take_head of an empty list");
        let s = at(slots, h);
        let next = s.next;
        s.linked = false;
        self.head = next;
        if next == NIL {
            self.tail = NIL;
        } else {
            at(slots, next).prev = NIL;
        }
        self.len -= 1;
        h
    }

    pub fn pop_front(&mut self, slots: &mut [Slot]) -> Option<u32> {
        let h = self.head;
        if h == NIL {
            return None;
        }
        self.unlink(slots, h);
        Some(h)
    }

    /// The members from head to tail (for invariant checks).
    #[cfg(any(debug_assertions, test))]
    pub fn members(&self, slots: &[Slot]) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len as usize);
        let mut i = self.head;
        let mut prev = NIL;
        while i != NIL {
            assert_eq!(slots[i as usize].prev, prev, "broken prev link at {i}");
            assert!(slots[i as usize].linked);
            out.push(i);
            prev = i;
            i = slots[i as usize].next;
            assert!(
                out.len() <= self.len as usize,
                "list longer than its length"
            );
        }
        assert_eq!(self.tail, prev, "tail mismatch");
        assert_eq!(out.len(), self.len as usize, "length mismatch");
        out
    }
}
