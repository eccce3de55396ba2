//! The newest entries of the log, kept decoded in memory.
//!
//! Openraft reads every entry back soon after it was appended: the state
//! machine to apply it, and on a leader each follower's replication
//! stream to send it. From the log each such read is a lock, two reads of
//! the file, a checksum and a decode; from here it is a clone.
//!
//! The entries held are always a suffix of the log: `[first, next)`, with
//! `next` the log's own next index (openraft's). Every change to the
//! log's end or start (append, truncate, purge, reset) changes this while
//! the log's lock is held, so a reader that finds its range here sees
//! what the log held at that moment. A read that starts before `first`
//! goes to the log. At most [`RecentEntries::MAX_BYTES`] of payload and
//! [`RecentEntries::MAX_ENTRIES`] entries are held; the oldest go first,
//! and an entry larger than the whole bound empties it.

use std::collections::VecDeque;

/// A suffix of the log, decoded.
#[derive(Debug)]
pub(crate) struct RecentEntries<E> {
    /// Openraft's index of the first entry held (`next` when none is).
    first: u64,
    /// Each entry and its payload's encoded size.
    entries: VecDeque<(E, usize)>,
    bytes: usize,
}

impl<E: Clone> RecentEntries<E> {
    /// Most payload bytes held.
    pub(crate) const MAX_BYTES: usize = 16 << 20;
    /// Most entries held.
    pub(crate) const MAX_ENTRIES: usize = 4096;

    /// Nothing held; the log's next index is `next`.
    pub(crate) fn empty_at(next: u64) -> RecentEntries<E> {
        RecentEntries {
            first: next,
            entries: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Holds nothing if the log's next index is not `next` (as this
    /// knows it): a change it was not told of.
    pub(crate) fn check(&mut self, next: u64) {
        if self.next() != next {
            *self = RecentEntries::empty_at(next);
        }
    }

    /// The log's next index, as this knows it.
    pub(crate) fn next(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// The log took `entry` at `index` (its next index), `bytes` long.
    pub(crate) fn push(&mut self, index: u64, entry: E, bytes: usize) {
        if index != self.next() || bytes > Self::MAX_BYTES {
            // Not the suffix this holds (or too large to hold): start over
            // after it.
            *self = RecentEntries::empty_at(index + 1);
            return;
        }
        self.entries.push_back((entry, bytes));
        self.bytes += bytes;
        while self.bytes > Self::MAX_BYTES || self.entries.len() > Self::MAX_ENTRIES {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, b)) = self.entries.pop_front() {
            self.bytes -= b;
            self.first += 1;
        }
    }

    /// The log dropped its entries from `index` on.
    pub(crate) fn truncate(&mut self, index: u64) {
        if index <= self.first {
            *self = RecentEntries::empty_at(index);
            return;
        }
        while self.next() > index {
            if let Some((_, b)) = self.entries.pop_back() {
                self.bytes -= b;
            }
        }
    }

    /// The log dropped its entries up to `index`, inclusive.
    pub(crate) fn purge(&mut self, index: u64) {
        while self.first <= index && !self.entries.is_empty() {
            self.pop_front();
        }
        if self.entries.is_empty() && self.first <= index {
            self.first = index + 1;
        }
    }

    /// Entries `[from, to)`, clamped to the log's end, stopping after the
    /// one whose payload brings the bytes to `bytes` or more, as the log
    /// would read them; `None` when the range starts before the entries
    /// held.
    pub(crate) fn read(&self, from: u64, to: u64, bytes: usize) -> Option<Vec<E>> {
        if from < self.first {
            return None;
        }
        let to = to.min(self.next());
        let mut out = Vec::new();
        let mut read = 0usize;
        for i in from..to.max(from) {
            if read >= bytes {
                break;
            }
            let (e, b) = self.entries.get((i - self.first) as usize)?;
            read = read.saturating_add(*b);
            out.push(e.clone());
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the log holds, as a plain list of (index, payload size).
    #[derive(Debug, Clone)]
    enum Op {
        Append(usize),
        Truncate(u64),
        Purge(u64),
        Read(u64, u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..(RecentEntries::<u64>::MAX_BYTES / 3)).prop_map(Op::Append),
            1 => Just(Op::Append(RecentEntries::<u64>::MAX_BYTES + 1)),
            1 => (0u64..40).prop_map(Op::Truncate),
            1 => (0u64..40).prop_map(Op::Purge),
            4 => (0u64..45, 0u64..45, 1usize..(RecentEntries::<u64>::MAX_BYTES / 2))
                .prop_map(|(a, b, c)| Op::Read(a, b, c)),
        ]
    }

    proptest! {
        // Every read it answers is what the log would answer.
        #[test]
        fn reads_it_answers_match_the_log(ops in proptest::collection::vec(op(), 1..80)) {
            // The log: first index and each entry's payload size.
            let mut first = 0u64;
            let mut log: Vec<usize> = Vec::new();
            let mut recent = RecentEntries::<u64>::empty_at(0);
            for op in ops {
                match op {
                    Op::Append(b) => {
                        let index = first + log.len() as u64;
                        log.push(b);
                        recent.push(index, index, b);
                    }
                    Op::Truncate(i) => {
                        if i >= first && i <= first + log.len() as u64 {
                            log.truncate((i - first) as usize);
                            recent.truncate(i);
                        }
                    }
                    Op::Purge(i) => {
                        let next = first + log.len() as u64;
                        if i >= first && i < next {
                            log.drain(..=((i - first) as usize));
                            first = i + 1;
                            recent.purge(i);
                        }
                    }
                    Op::Read(from, to, bytes) => {
                        let next = first + log.len() as u64;
                        let lo = from.max(first);
                        let hi = to.min(next);
                        let mut want = Vec::new();
                        let mut read = 0usize;
                        for i in lo..hi.max(lo) {
                            if read >= bytes {
                                break;
                            }
                            read = read.saturating_add(log[(i - first) as usize]);
                            want.push(i);
                        }
                        if let Some(got) = recent.read(from, to, bytes) {
                            prop_assert_eq!(got, want);
                        }
                    }
                }
                prop_assert_eq!(recent.next(), first + log.len() as u64);
                prop_assert!(recent.bytes <= RecentEntries::<u64>::MAX_BYTES);
            }
        }
    }

    #[test]
    fn the_newest_entries_are_read_from_memory_and_older_ones_are_not() {
        let mut r = RecentEntries::<u64>::empty_at(5);
        for i in 5..5 + RecentEntries::<u64>::MAX_ENTRIES as u64 + 10 {
            r.push(i, i, 1);
        }
        let next = r.next();
        assert_eq!(
            r.read(next - 3, u64::MAX, usize::MAX),
            Some(vec![next - 3, next - 2, next - 1])
        );
        assert_eq!(r.read(5, 8, usize::MAX), None, "evicted: read from the log");
        assert_eq!(
            r.read(next - 3, u64::MAX, 2),
            Some(vec![next - 3, next - 2])
        );
        r.truncate(next - 1);
        assert_eq!(
            r.read(next - 3, u64::MAX, usize::MAX),
            Some(vec![next - 3, next - 2])
        );
        // An entry out of order starts the suffix over after it.
        r.push(next + 7, 0, 1);
        assert_eq!(r.next(), next + 8);
        assert_eq!(r.read(next - 3, u64::MAX, usize::MAX), None);
    }
}
