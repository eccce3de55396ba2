//! W-TinyLFU (Einziger, Friedman and Manes, 2017): a small LRU window
//! (1% of the budget) in front of a segmented LRU main area (80% protected,
//! the rest probation). A page leaving the window enters main only if a
//! count-min sketch of recent references says it is referenced more often
//! than main's next victim; the sketch halves its counters every
//! `10 x budget` references (a sweep of a few counters per reference), so
//! popularity ages. Every operation is a bounded number of steps: moves
//! between regions are at most two per call, and a budget lowered at once
//! is caught up with over the following calls. The window absorbs bursts;
//! admission keeps one-time pages (a scan) out of main.
//!
//! Lists hold unpinned pages only, in LRU order by unpin time; a pinned
//! page keeps its region (`queue`) and rejoins that region's list when
//! unpinned.
//!
//! Invariants: each list holds exactly the live unpinned pages tagged with
//! its region; `counts[r]` counts the live pages (pinned or not) tagged `r`;
//! sketch counters stay within 0..=15.

#[cfg(any(debug_assertions, test))]
use super::sorted;
use super::{Evict, Policy};
use crate::list::List;
use crate::slot::Slot;

const WINDOW: u8 = 0;
const PROBATION: u8 = 1;
const PROTECTED: u8 = 2;

#[derive(Default)]
pub struct TinyLfu {
    lists: [List; 3],
    counts: [usize; 3],
    sketch: Sketch,
    capacity: usize,
}

/// Count-min sketch of 4-bit counters, four rows.
#[derive(Default)]
struct Sketch {
    rows: Vec<u8>,
    mask: usize,
    additions: usize,
    sample: usize,
    /// Counters still to halve in the current aging sweep (from the end).
    aging: usize,
}

/// Counters halved per reference while aging: the sketch has 16 counters
/// per page of budget and ages every 10 references per page, so a sweep
/// ends within a fifth of the sample.
const AGE_STEP: usize = 8;

/// Most pages `rebalance` and `drain_window` move per call.
const MAX_MOVES: usize = 2;

const SEEDS: [u32; 4] = [0x9E37_79B1, 0x85EB_CA77, 0xC2B2_AE3D, 0x27D4_EB2F];

impl Sketch {
    /// Sizes the sketch for `capacity` pages (a power of two of at least
    /// 4 x capacity counters per row). Memory is reserved fallibly: without
    /// it the sketch stays small and merely less precise.
    fn fit(&mut self, capacity: usize) {
        let width = (capacity.max(16) * 4).next_power_of_two();
        if self.mask + 1 >= width && !self.rows.is_empty() {
            self.sample = 10 * capacity.max(16);
            return;
        }
        let mut rows = Vec::new();
        if rows.try_reserve_exact(width * 4).is_err() {
            return;
        }
        rows.resize(width * 4, 0);
        self.rows = rows;
        self.aging = 0;
        self.mask = width - 1;
        self.additions = 0;
        self.sample = 10 * capacity.max(16);
    }

    #[inline]
    fn index(&self, key: u32, row: usize) -> usize {
        row * (self.mask + 1) + ((key.wrapping_mul(SEEDS[row]) >> 8) as usize & self.mask)
    }

    fn increment(&mut self, key: u32) {
        if self.rows.is_empty() {
            self.fit(256);
            if self.rows.is_empty() {
                return;
            }
        }
        for row in 0..4 {
            let i = self.index(key, row);
            if self.rows[i] < 15 {
                self.rows[i] += 1;
            }
        }
        self.additions += 1;
        if self.additions >= self.sample {
            // Age every counter: by a sweep spread over the next references
            // (a few counters each), not all at once.
            self.aging = self.rows.len();
            self.additions /= 2;
        }
        if self.aging > 0 {
            let step = AGE_STEP.min(self.aging);
            let end = self.aging;
            for c in &mut self.rows[end - step..end] {
                *c >>= 1;
            }
            self.aging -= step;
        }
    }

    fn frequency(&self, key: u32) -> u8 {
        if self.rows.is_empty() {
            return 0;
        }
        (0..4)
            .map(|row| self.rows[self.index(key, row)])
            .min()
            .unwrap_or(0)
    }
}

impl TinyLfu {
    fn tag(&mut self, slots: &mut [Slot], i: u32, region: u8) {
        let old = slots[i as usize].queue;
        self.counts[old as usize] -= 1;
        self.counts[region as usize] += 1;
        slots[i as usize].queue = region;
    }

    /// Keeps protected within its share by demoting its least recent
    /// unpinned page to probation.
    fn rebalance(&mut self, slots: &mut [Slot], capacity: usize) {
        let main = capacity - Self::window_cap(capacity);
        let protected_cap = main * 4 / 5;
        // At most MAX_MOVES demotions per call: a lowered budget is
        // absorbed over the following evictions, each of bounded cost.
        for _ in 0..MAX_MOVES {
            if self.counts[PROTECTED as usize] <= protected_cap {
                break;
            }
            let Some(p) = self.lists[PROTECTED as usize].pop_front(slots) else {
                break;
            };
            self.tag(slots, p, PROBATION);
            self.lists[PROBATION as usize].push_back(slots, p);
        }
    }

    fn window_cap(capacity: usize) -> usize {
        (capacity / 100).max(1)
    }

    /// While main has room, the window's overflow moves into probation
    /// freely; once main is full, admission is decided in `victim`.
    fn drain_window(&mut self, slots: &mut [Slot]) {
        let window_cap = Self::window_cap(self.capacity);
        let main_cap = self.capacity - window_cap;
        for _ in 0..MAX_MOVES {
            if self.counts[WINDOW as usize] <= window_cap
                || self.counts[PROBATION as usize] + self.counts[PROTECTED as usize] >= main_cap
            {
                break;
            }
            let Some(p) = self.lists[WINDOW as usize].pop_front(slots) else {
                break;
            };
            self.tag(slots, p, PROBATION);
            self.lists[PROBATION as usize].push_back(slots, p);
        }
    }
}

impl Evict for TinyLfu {
    const POLICY: Policy = Policy::TinyLfu;

    #[inline]
    fn admit(&mut self, slots: &mut [Slot], i: u32) {
        self.sketch.increment(slots[i as usize].key);
        slots[i as usize].queue = WINDOW;
        self.counts[WINDOW as usize] += 1;
    }

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], i: u32) {
        let s = &slots[i as usize];
        let (key, region, linked) = (s.key, s.queue, s.linked);
        if linked {
            self.lists[region as usize].unlink(slots, i);
        }
        self.sketch.increment(key);
        if region == PROBATION {
            self.tag(slots, i, PROTECTED);
        }
    }

    #[inline]
    fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        let region = slots[i as usize].queue;
        self.lists[region as usize].push_back(slots, i);
        if region == WINDOW {
            self.drain_window(slots);
        }
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        self.sketch.fit(self.capacity);
    }

    fn remove(&mut self, slots: &mut [Slot], i: u32) {
        let region = slots[i as usize].queue;
        if slots[i as usize].linked {
            self.lists[region as usize].unlink(slots, i);
        }
        self.counts[region as usize] -= 1;
    }

    fn victim(&mut self, slots: &mut [Slot], capacity: usize) -> Option<u32> {
        self.rebalance(slots, capacity);
        let window_over = self.counts[WINDOW as usize] > Self::window_cap(capacity);
        if window_over && let Some(candidate) = self.lists[WINDOW as usize].pop_front(slots) {
            // The window's oldest page competes with main's next victim.
            let rival = self.lists[PROBATION as usize]
                .pop_front(slots)
                .map(|r| (r, PROBATION))
                .or_else(|| {
                    self.lists[PROTECTED as usize]
                        .pop_front(slots)
                        .map(|r| (r, PROTECTED))
                });
            let Some((rival, rival_region)) = rival else {
                self.counts[WINDOW as usize] -= 1;
                return Some(candidate);
            };
            let cf = self.sketch.frequency(slots[candidate as usize].key);
            let rf = self.sketch.frequency(slots[rival as usize].key);
            if cf > rf {
                self.tag(slots, candidate, PROBATION);
                self.lists[PROBATION as usize].push_back(slots, candidate);
                self.counts[rival_region as usize] -= 1;
                return Some(rival);
            }
            // The rival stays where it was, first in line.
            self.lists[rival_region as usize].push_front(slots, rival);
            self.counts[WINDOW as usize] -= 1;
            return Some(candidate);
        }
        for region in [PROBATION, PROTECTED, WINDOW] {
            if let Some(v) = self.lists[region as usize].pop_front(slots) {
                self.counts[region as usize] -= 1;
                return Some(v);
            }
        }
        None
    }

    #[cfg(any(debug_assertions, test))]
    fn check(&self, slots: &[Slot]) {
        let mut unpinned = Vec::new();
        for (r, list) in self.lists.iter().enumerate() {
            let members = list.members(slots);
            for &i in &members {
                assert_eq!(
                    slots[i as usize].queue as usize, r,
                    "slot {i} in the wrong list"
                );
            }
            unpinned.extend(members);
            let live = slots
                .iter()
                .filter(|s| s.live && s.queue as usize == r)
                .count();
            assert_eq!(self.counts[r], live, "count of region {r}");
        }
        assert_eq!(sorted(unpinned), super::unpinned(slots));
        assert!(self.sketch.rows.iter().all(|c| *c <= 15));
    }
}
