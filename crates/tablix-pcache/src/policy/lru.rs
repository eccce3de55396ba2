//! True LRU over unpinned pages: a page joins the tail when its last pin is
//! released and leaves the list when fetched again; the head is evicted.
//!
//! Invariant: the list holds exactly the live, unpinned pages.

use super::{Evict, Policy};
#[cfg(any(debug_assertions, test))]
use super::{sorted, unpinned};
use crate::list::List;
use crate::slot::Slot;

#[derive(Default)]
pub struct Lru {
    list: List,
}

impl Evict for Lru {
    const POLICY: Policy = Policy::Lru;

    #[inline]
    fn admit(&mut self, _slots: &mut [Slot], _i: u32) {}

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], i: u32) {
        if slots[i as usize].linked {
            self.list.unlink(slots, i);
        }
    }

    #[inline]
    fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        self.list.push_back(slots, i);
    }

    #[inline]
    fn remove(&mut self, slots: &mut [Slot], i: u32) {
        if slots[i as usize].linked {
            self.list.unlink(slots, i);
        }
    }

    #[inline]
    fn victim(&mut self, slots: &mut [Slot], _capacity: usize) -> Option<u32> {
        self.list.pop_front(slots)
    }

    #[cfg(any(debug_assertions, test))]
    fn check(&self, slots: &[Slot]) {
        assert_eq!(sorted(self.list.members(slots)), unpinned(slots));
    }
}
