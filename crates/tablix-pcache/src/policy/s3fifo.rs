//! S3-FIFO (Yang et al., SOSP 2023): new pages enter a small FIFO (a tenth
//! of the budget); a page referenced again while there moves to the main
//! FIFO when it reaches the small FIFO's head, others are evicted and their
//! keys remembered in a ghost FIFO; a page whose key is in the ghost goes
//! straight to main. Main evicts from its head, giving pages referenced
//! since their last pass (freq > 0) another round with freq - 1. One-time
//! pages of a scan never reach main, so a scan cannot flush the hot set.
//!
//! A pinned page that reaches a FIFO's head is parked: taken out of the
//! FIFO until its last pin goes, then put back at the tail, where rotating
//! past it would have put it. A large write transaction keeps its dirty
//! pages pinned (SQLite unpins a page only once it is clean), so without
//! parking every allocation would walk past the same thousands of pinned
//! pages again; with it each pinned page is passed once per pinning.
//! Eviction skips a FIFO that holds no unpinned page at all.
//!
//! Invariants: every live page belongs to exactly one of `small` (queue 1)
//! and `main` (queue 2), named by its `queue`: it is linked in that FIFO,
//! or it is pinned and parked (linked in none); `parked[q]` counts the
//! parked pages of queue `q` and `unpinned[q]` its unpinned pages, all of
//! them linked; `freq <= 3`; the ghost holds at most `capacity / 4` keys,
//! none of them resident.

use std::collections::{HashMap, VecDeque};

#[cfg(any(debug_assertions, test))]
use super::sorted;
use super::{Evict, Policy};
use crate::list::List;
use crate::slot::Slot;

const SMALL: u8 = 1;
const MAIN: u8 = 2;
const MAX_FREQ: u8 = 3;
/// The ghost remembers a quarter of the budget's worth of keys. The paper
/// sizes it like main; measured on SQLite page traces (`tablix bench
/// pcache`), a quarter admits fewer lukewarm pages into main and misses
/// 2-3% less on skewed access, the same on uniform.
const GHOST_SHARE: usize = 4;

#[derive(Default)]
pub struct S3Fifo {
    small: List,
    main: List,
    /// Unpinned pages per queue, indexed by `SMALL` and `MAIN`.
    unpinned: [u32; 3],
    /// Parked (pinned, unlinked) pages per queue.
    parked: [u32; 3],
    ghost: Ghost,
}

/// Keys recently evicted from the small FIFO, oldest first.
#[derive(Default)]
struct Ghost {
    order: VecDeque<(u32, u64)>,
    /// key -> sequence number of its newest entry in `order`.
    keys: HashMap<u32, u64>,
    seq: u64,
}

impl Ghost {
    fn take(&mut self, key: u32) -> bool {
        self.keys.remove(&key).is_some()
    }

    /// Remembers `key`, forgetting the oldest beyond `bound`. Memory is
    /// reserved fallibly: under memory pressure the ghost just forgets.
    fn insert(&mut self, key: u32, bound: usize) {
        if self.keys.try_reserve(1).is_err() || self.order.try_reserve(1).is_err() {
            return;
        }
        self.seq += 1;
        self.keys.insert(key, self.seq);
        self.order.push_back((key, self.seq));
        while self.keys.len() > bound || self.order.len() > 2 * bound + 16 {
            let Some((k, s)) = self.order.pop_front() else {
                break;
            };
            if self.keys.get(&k) == Some(&s) {
                self.keys.remove(&k);
            }
        }
    }
}

impl S3Fifo {
    #[inline]
    fn list(&mut self, q: u8) -> &mut List {
        if q == SMALL {
            &mut self.small
        } else {
            &mut self.main
        }
    }
}

impl Evict for S3Fifo {
    const POLICY: Policy = Policy::S3Fifo;

    #[inline]
    fn admit(&mut self, slots: &mut [Slot], i: u32) {
        let key = slots[i as usize].key;
        slots[i as usize].freq = 0;
        let q = if self.ghost.take(key) { MAIN } else { SMALL };
        slots[i as usize].queue = q;
        self.list(q).push_back(slots, i);
    }

    fn touch(&mut self, slots: &mut [Slot], i: u32) {
        let s = &mut slots[i as usize];
        if !s.pinned {
            self.unpinned[s.queue as usize] -= 1;
        }
        if s.freq < MAX_FREQ {
            s.freq += 1;
        }
    }

    #[inline]
    fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        let q = slots[i as usize].queue;
        self.unpinned[q as usize] += 1;
        if !slots[i as usize].linked {
            self.parked[q as usize] -= 1;
            self.list(q).push_back(slots, i);
        }
    }

    #[inline]
    fn rekey(&mut self, _slots: &mut [Slot], _i: u32, new_key: u32) {
        self.ghost.take(new_key);
    }

    #[inline]
    fn remove(&mut self, slots: &mut [Slot], i: u32) {
        let q = slots[i as usize].queue;
        if !slots[i as usize].pinned {
            self.unpinned[q as usize] -= 1;
        }
        if slots[i as usize].linked {
            self.list(q).unlink(slots, i);
        } else {
            self.parked[q as usize] -= 1;
        }
    }

    #[inline]
    fn victim(&mut self, slots: &mut [Slot], capacity: usize) -> Option<u32> {
        let small_target = (capacity / 10).max(1) as u32;
        // Hard bound: every step either finds the victim, moves a page to
        // main, lowers a freq (at most 3 per page) or parks a pinned page.
        let mut budget = 8 * (self.small.len + self.main.len) as usize + 16;
        while budget > 0 {
            budget -= 1;
            let small_open = self.unpinned[SMALL as usize] > 0;
            let main_open = self.unpinned[MAIN as usize] > 0;
            if !small_open && !main_open {
                return None;
            }
            // Parked pages still count towards their FIFO's share.
            let small_len = self.small.len + self.parked[SMALL as usize];
            if small_open && (small_len > small_target || !main_open) {
                let t = self.small.pop_front(slots)?;
                let s = &mut slots[t as usize];
                if s.pinned {
                    self.parked[SMALL as usize] += 1;
                } else if s.freq > 0 {
                    s.freq = 0;
                    s.queue = MAIN;
                    self.main.push_back(slots, t);
                    self.unpinned[SMALL as usize] -= 1;
                    self.unpinned[MAIN as usize] += 1;
                } else {
                    self.unpinned[SMALL as usize] -= 1;
                    self.ghost.insert(s.key, (capacity / GHOST_SHARE).max(1));
                    return Some(t);
                }
            } else {
                let t = self.main.pop_front(slots)?;
                let s = &mut slots[t as usize];
                if s.pinned {
                    self.parked[MAIN as usize] += 1;
                } else if s.freq > 0 {
                    s.freq -= 1;
                    self.main.push_back(slots, t);
                } else {
                    self.unpinned[MAIN as usize] -= 1;
                    return Some(t);
                }
            }
        }
        None
    }

    #[cfg(any(debug_assertions, test))]
    fn check(&self, slots: &[Slot]) {
        let small = self.small.members(slots);
        let main = self.main.members(slots);
        for &i in &small {
            assert_eq!(slots[i as usize].queue, SMALL);
        }
        for &i in &main {
            assert_eq!(slots[i as usize].queue, MAIN);
        }
        let live: Vec<u32> = (0..slots.len() as u32)
            .filter(|&i| slots[i as usize].live)
            .collect();
        let parked: Vec<u32> = live
            .iter()
            .copied()
            .filter(|&i| !slots[i as usize].linked)
            .collect();
        for (q, members) in [(SMALL, &small), (MAIN, &main)] {
            let unpinned = members
                .iter()
                .filter(|&&i| !slots[i as usize].pinned)
                .count();
            assert_eq!(
                self.unpinned[q as usize] as usize, unpinned,
                "unpinned count of queue {q}"
            );
            let parked_here = parked
                .iter()
                .filter(|&&i| slots[i as usize].queue == q)
                .count();
            assert_eq!(
                self.parked[q as usize] as usize, parked_here,
                "parked count of queue {q}"
            );
        }
        for &i in &parked {
            assert!(slots[i as usize].pinned, "parked page {i} is unpinned");
        }
        let mut all = small;
        all.extend(main);
        all.extend(parked);
        assert_eq!(sorted(all), live);
        for &i in &live {
            assert!(slots[i as usize].freq <= MAX_FREQ);
            assert!(
                !self.ghost.keys.contains_key(&slots[i as usize].key),
                "resident key in ghost"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages `0..n` admitted, the first `pinned` of them still pinned.
    fn cache(n: u32, pinned: u32) -> (S3Fifo, Vec<Slot>) {
        let mut p = S3Fifo::default();
        let mut slots: Vec<Slot> = (0..n)
            .map(|key| Slot {
                key,
                live: true,
                pinned: true,
                ..Slot::default()
            })
            .collect();
        for i in 0..n {
            p.admit(&mut slots, i);
        }
        for i in pinned..n {
            slots[i as usize].pinned = false;
            p.unpin(&mut slots, i);
        }
        (p, slots)
    }

    #[test]
    fn pinned_pages_are_passed_once_per_pinning() {
        let (mut p, mut slots) = cache(1010, 1000);
        assert_eq!(p.victim(&mut slots, 1010), Some(1000));
        // The cache frees what the policy gives up.
        slots[1000].live = false;
        p.check(&slots);
        // Every pinned page was parked on the way: the FIFOs now hold only
        // the nine unpinned pages left, so the next victims pass nothing.
        assert_eq!(p.small.len + p.main.len, 9);
        assert_eq!(p.parked[SMALL as usize], 1000);
        assert_eq!(p.victim(&mut slots, 1010), Some(1001));
        slots[1001].live = false;
        assert_eq!(p.small.len, 8);
        // Unpinned, a parked page rejoins its FIFO at the tail.
        slots[7].pinned = false;
        p.unpin(&mut slots, 7);
        p.check(&slots);
        assert_eq!(p.small.tail, 7);
        assert_eq!(p.parked[SMALL as usize], 999);
        // A parked page can leave the cache (a truncation, a discard).
        p.remove(&mut slots, 8);
        slots[8].live = false;
        p.check(&slots);
        assert_eq!(p.parked[SMALL as usize], 998);
    }
}
