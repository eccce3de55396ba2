//! S3-FIFO (Yang et al., SOSP 2023): new pages enter a small FIFO (a tenth
//! of the budget); a page referenced again while there moves to the main
//! FIFO when it reaches the small FIFO's head, others are evicted and their
//! keys remembered in a ghost FIFO; a page whose key is in the ghost goes
//! straight to main. Main evicts from its head, giving pages referenced
//! since their last pass (freq > 0) another round with freq - 1. One-time
//! pages of a scan never reach main, so a scan cannot flush the hot set.
//!
//! A page enters its FIFO at its first unpin: a new page is pinned, and
//! is parked (counted in its FIFO, linked nowhere) until then. A pinned
//! page that reaches a FIFO's head (pinned again by a hit) is parked too:
//! taken out of the FIFO until its last pin goes, then put back at the
//! tail, where rotating past it would have put it. A large write
//! transaction keeps its dirty pages pinned (SQLite unpins a page only
//! once it is clean), so without parking every allocation would walk past
//! the same thousands of pinned pages again; with it each pinned page is
//! passed once per pinning.
//!
//! `S3<true>` (`s3-lru`) keeps the small FIFO and the ghost but makes main
//! an LRU list: a hit on a main page unlinks it, its last unpin appends it,
//! and main's head is always an unpinned page to evict.
//!
//! Invariants: every live page belongs to exactly one of `small` (queue 1)
//! and `main` (queue 2), named by its `queue`: it is linked in that list,
//! or it is pinned and unlinked (parked, counted in `parked[q]`; an LRU
//! main's pinned pages are unlinked and not counted); every unpinned page
//! is linked; `freq <= 3`; the ghost remembers at most `capacity` keys,
//! none of them resident.
//!
//! Eviction takes a bounded number of steps: at most `MAX_ROUNDS`
//! referenced pages get another round per eviction (then the head goes
//! whatever its count), and a pinned page is parked at most once per
//! pinning, which the fetch that pinned it pays for.

#[cfg(any(debug_assertions, test))]
use super::sorted;
use super::{Evict, Policy};
use crate::list::{List, at};
use crate::slot::Slot;

const SMALL: u8 = 1;
const MAIN: u8 = 2;
const MAX_FREQ: u8 = 3;
/// The ghost remembers as many keys as the cache holds pages (the paper
/// sizes it like main). A quarter missed 1-3% less on the skewed rowid
/// lookups of `tablix bench pcache --suite hits`, but 20% more than
/// SQLite's cache on speedtest1 at its default cache size (against 3% more
/// with the whole budget) and 2% less at 200 pages (against 8% less).
const GHOST_SHARE: usize = 1;
/// Most referenced pages one eviction gives another round (moves from
/// small to main, or reinserts in main). Past it the FIFO's head goes
/// whatever its count: eviction is a bounded number of steps (besides
/// parking pinned pages, each at most once per pinning).
const MAX_ROUNDS: u32 = 32;

/// S3-FIFO's small FIFO and ghost in front of a main area that is either
/// the paper's FIFO with reinsertion (`LRU_MAIN = false`, [`S3Fifo`]) or an
/// LRU list (`LRU_MAIN = true`, [`S3Lru`]): a hit on a main page takes it
/// out of the list until its last pin goes, when it joins the tail, so
/// eviction pops main's head with no rounds at all.
#[derive(Default)]
pub struct S3<const LRU_MAIN: bool> {
    small: List,
    main: List,
    /// Parked (pinned, unlinked) pages per queue, indexed by `SMALL` and
    /// `MAIN` through `q()`, which the compiler sees is in bounds.
    parked: [u32; 4],
    ghost: Ghost,
}

/// Keys recently evicted from the small FIFO: a direct-mapped table of
/// `(key, when)`, where `when` counts insertions. A key is remembered while
/// fewer than `bound` keys were inserted after it and no later key took its
/// entry. Insert and lookup are one probe each, and nothing is allocated
/// after the table is made.
///
/// The table is made at the first insertion, not when the cache is sized:
/// most caches never evict (SQLite opens one for every ephemeral table, an
/// `IN (...)` list's or a subquery's, and sizes it at once), and a table for
/// SQLite's default cache is 32 KiB to allocate and zero.
#[derive(Default)]
struct Ghost {
    /// `(key, when)`; `when == 0` is an empty entry. Empty until the first
    /// insertion, or when memory for it could not be had.
    entries: Vec<(u32, u64)>,
    /// The table's size once made: a power of two.
    want: usize,
    /// Insertions so far.
    clock: u64,
    /// How many insertions a key is remembered for.
    bound: u64,
}

impl Ghost {
    /// Sizes the table for `bound` keys (four entries per key, so that few
    /// keys lose their entry to another). A table already made is made
    /// again at the new size now; otherwise at the first insertion.
    fn fit(&mut self, bound: usize) {
        self.bound = bound.max(1) as u64;
        self.want = (bound.max(4) * 4).next_power_of_two();
        if !self.entries.is_empty() && self.entries.len() != self.want {
            self.make();
        }
    }

    /// Makes the table at `want` entries, all empty. Memory is reserved
    /// fallibly: without it the ghost keeps its old table (or none, and
    /// remembers nothing).
    #[cold]
    fn make(&mut self) {
        let mut entries = Vec::new();
        if entries.try_reserve_exact(self.want).is_err() {
            if self.entries.is_empty() {
                // Not tried again at every eviction: the next sizing will.
                self.want = 0;
            }
            return;
        }
        entries.resize(self.want, (0, 0));
        self.entries = entries;
    }

    #[inline]
    fn slot(&self, key: u32) -> usize {
        (key.wrapping_mul(0x85EB_CA77).rotate_right(13) as usize) & (self.entries.len() - 1)
    }

    /// Whether `key` was remembered; forgets it.
    #[inline]
    fn take(&mut self, key: u32) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let i = self.slot(key);
        debug_assert!(i < self.entries.len());
        // SAFETY: `slot` masks by entries.len() - 1 (a power of two).
        let e = unsafe { self.entries.get_unchecked_mut(i) };
        let (k, when) = *e;
        if when == 0 || k != key {
            return false;
        }
        // Forgotten or not, the entry goes: the key is resident now.
        *e = (0, 0);
        self.clock - when < self.bound
    }

    #[inline]
    fn insert(&mut self, key: u32) {
        if self.entries.is_empty() {
            if self.want == 0 {
                return;
            }
            self.make();
            if self.entries.is_empty() {
                return;
            }
        }
        self.clock += 1;
        let i = self.slot(key);
        debug_assert!(i < self.entries.len());
        // SAFETY: as in `take`.
        *unsafe { self.entries.get_unchecked_mut(i) } = (key, self.clock);
    }

    #[cfg(any(debug_assertions, test))]
    fn remembers(&self, key: u32) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let (k, when) = self.entries[self.slot(key)];
        when != 0 && k == key && self.clock - when < self.bound
    }
}

/// S3-FIFO as the paper has it.
pub type S3Fifo = S3<false>;
/// S3-FIFO's admission with an LRU main area.
pub type S3Lru = S3<true>;

impl<const LRU_MAIN: bool> S3<LRU_MAIN> {
    #[inline]
    fn list(&mut self, q: u8) -> &mut List {
        if q == SMALL {
            &mut self.small
        } else {
            &mut self.main
        }
    }
}

/// A queue tag as an index of the per-queue counts.
#[inline(always)]
fn q(tag: u8) -> usize {
    tag as usize & 3
}

impl<const LRU_MAIN: bool> Evict for S3<LRU_MAIN> {
    const POLICY: Policy = if LRU_MAIN {
        Policy::S3Lru
    } else {
        Policy::S3Fifo
    };

    #[inline]
    fn admit(&mut self, slots: &mut [Slot], i: u32) {
        let key = at(slots, i).key;
        let tag = if self.ghost.take(key) { MAIN } else { SMALL };
        let s = at(slots, i);
        s.freq = 0;
        s.queue = tag;
        // A new page is pinned: it joins its FIFO's tail at its first
        // unpin, parked until then (an LRU main does not count its
        // pinned pages). Linked at once, it would reach the head still
        // pinned whenever it is pinned long (a write transaction's dirty
        // pages), and be parked there, passed twice per eviction.
        if !(LRU_MAIN && tag == MAIN) {
            self.parked[q(tag)] += 1;
        }
    }

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], i: u32) {
        let s = at(slots, i);
        let (tag, linked) = (s.queue, s.linked);
        if LRU_MAIN && tag == MAIN {
            if linked {
                self.main.unlink(slots, i);
            }
        } else if s.freq < MAX_FREQ {
            s.freq += 1;
        }
    }

    #[inline]
    fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        let s = at(slots, i);
        let (tag, linked) = (s.queue, s.linked);
        if !linked {
            if !(LRU_MAIN && tag == MAIN) {
                self.parked[q(tag)] -= 1;
            }
            self.list(tag).push_back(slots, i);
        }
    }

    #[inline]
    fn rekey(&mut self, _slots: &mut [Slot], _i: u32, new_key: u32) {
        self.ghost.take(new_key);
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.ghost.fit(capacity / GHOST_SHARE);
    }

    #[inline]
    fn remove(&mut self, slots: &mut [Slot], i: u32) {
        let s = at(slots, i);
        let (tag, linked) = (s.queue, s.linked);
        if linked {
            self.list(tag).unlink(slots, i);
        } else if !(LRU_MAIN && tag == MAIN) {
            self.parked[q(tag)] -= 1;
        }
    }

    #[inline(always)]
    fn victim(&mut self, slots: &mut [Slot], capacity: usize) -> Option<u32> {
        let small_target = (capacity / 10).max(1) as u32;
        let mut rounds = 0;
        loop {
            // Both FIFOs empty: every page is pinned (parked, or out of an
            // LRU main).
            if self.small.len == 0 && self.main.len == 0 {
                return None;
            }
            let last_round = rounds >= MAX_ROUNDS;
            // Parked pages still count towards their FIFO's share.
            let small_len = self.small.len + self.parked[q(SMALL)];
            if self.small.len > 0 && (small_len > small_target || self.main.len == 0) {
                let t = self.small.head;
                let s = at(slots, t);
                if s.pinned {
                    self.small.take_head(slots);
                    self.parked[q(SMALL)] += 1;
                } else if s.freq > 0 && !last_round {
                    s.freq = 0;
                    s.queue = MAIN;
                    self.small.take_head(slots);
                    self.main.push_back(slots, t);
                    rounds += 1;
                } else {
                    let key = s.key;
                    self.small.take_head(slots);
                    self.ghost.insert(key);
                    return Some(t);
                }
            } else {
                let t = self.main.head;
                let s = at(slots, t);
                if s.pinned {
                    // (Never with an LRU main: its pinned pages are unlinked.)
                    self.main.take_head(slots);
                    self.parked[q(MAIN)] += 1;
                } else if s.freq > 0 && !last_round && !LRU_MAIN {
                    s.freq -= 1;
                    self.main.rotate(slots);
                    rounds += 1;
                } else {
                    self.main.take_head(slots);
                    return Some(t);
                }
            }
        }
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
        for q in [SMALL, MAIN] {
            let parked_here = parked
                .iter()
                .filter(|&&i| slots[i as usize].queue == q)
                .count();
            // An LRU main's pinned pages are out of its list, not parked.
            let parked_here = if LRU_MAIN && q == MAIN {
                0
            } else {
                parked_here
            };
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
                !self.ghost.remembers(slots[i as usize].key),
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
    fn the_ghost_table_is_made_at_the_first_eviction_not_when_the_cache_is_sized() {
        let mut g = Ghost::default();
        g.fit(500);
        assert!(g.entries.is_empty(), "sized, nothing evicted yet");
        assert!(!g.take(7));
        g.fit(2000);
        assert!(g.entries.is_empty(), "sized again, still nothing evicted");
        g.insert(7);
        assert_eq!(g.entries.len(), 8192);
        assert!(g.remembers(7));
        assert!(g.take(7), "an evicted key is remembered");
        assert!(!g.take(7), "and forgotten once taken back");
        // A table in use follows the cache's size at once.
        g.insert(9);
        g.fit(100);
        assert_eq!(g.entries.len(), 512);
        assert!(!g.remembers(9), "a table made again starts empty");
    }

    #[test]
    fn a_cache_that_never_evicts_makes_no_ghost_table() {
        let (mut p, slots) = cache(50, 0);
        p.set_capacity(2000);
        p.check(&slots);
        assert!(p.ghost.entries.is_empty());
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

    #[test]
    fn an_eviction_gives_a_bounded_number_of_pages_another_round() {
        // 500 unpinned pages in main, each referenced three times since it
        // arrived: the paper's main would pass every one of them three
        // times before evicting; here one eviction passes at most
        // MAX_ROUNDS.
        let (mut p, mut slots) = cache(500, 0);
        for i in 0..500u32 {
            p.small.unlink(&mut slots, i);
            slots[i as usize].queue = MAIN;
            slots[i as usize].freq = MAX_FREQ;
            p.main.push_back(&mut slots, i);
        }
        p.check(&slots);
        let before: Vec<u8> = slots.iter().map(|s| s.freq).collect();
        let v = p.victim(&mut slots, 500).expect("a victim");
        slots[v as usize].live = false;
        let passed = slots
            .iter()
            .zip(&before)
            .filter(|(s, b)| s.freq != **b)
            .count();
        assert!(passed <= MAX_ROUNDS as usize, "{passed} pages went round");
        assert_eq!(v, MAX_ROUNDS, "the head after the rounds goes");
        p.check(&slots);
    }
}
