//! Waiting, briefly, for the clients the previous entry just answered.
//!
//! The proposer makes one entry of every proposal that arrived while the
//! previous entry was in openraft. Clients that wait for their answer
//! before proposing again (an HTTP client, a program's next `write(2)`
//! through a mount) come back a few hundred microseconds after it, by
//! when the next entry has left without them; they then wait for that
//! entry and its successor, and the clients split into halves that take
//! turns: 16 HTTP clients on three nodes rode entries of 8 on average. So
//! an entry that holds fewer proposals than it expects waits up to a bound
//! for the rest. It expects those the previous entry carried plus those
//! that were waiting when it was committed (the next entry may leave then,
//! `committing.rs`) or answered; a lone client is therefore never delayed
//! (its next proposal is all that is expected).
//!
//! A wait that runs out means the answered clients are slow to come back
//! (the machine is busy, or they were not waiting to propose again):
//! entries then go out as they are, and the next wait comes only after 1,
//! 2, 4 ... up to 64 entries (a wait that fills halves that count).
//!
//! The store's own group commit does not wait so: its groups take about
//! as long as a client's way back, and waiting there cost a daemon's 16
//! HTTP clients 8-29% of their inserts (two alternated rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The longest an entry waits by default. The 16 clients of
/// `tablix bench cluster` came back 180-280 us after their answers on a
/// two-core machine.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_micros(400);

/// Proposals sent to the batching task and not yet taken by it; the
/// sender adds, the task takes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Queued(Arc<AtomicUsize>);

impl Queued {
    /// One more proposal is on its way (call as it is sent: the channel
    /// has room for it).
    pub(crate) fn sent(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// A proposal announced by [`Queued::sent`] was taken.
    pub(crate) fn taken(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// Proposals sent and not yet taken.
    pub(crate) fn waiting(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// When entries skip their wait, after waits that ran out.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Entries to skip after the last wait ran out.
    skip: u32,
    /// Entries still to skip.
    left: u32,
}

/// The most entries skipped after waits that ran out.
const MAX_SKIP: u32 = 64;

impl Backoff {
    /// Whether this entry may wait (called once per entry that would).
    pub(crate) fn may_wait(&mut self) -> bool {
        if self.left == 0 {
            return true;
        }
        self.left -= 1;
        false
    }

    /// How the entry's wait ended: `filled` if every expected proposal came.
    pub(crate) fn waited(&mut self, filled: bool) {
        if filled {
            self.skip /= 2;
        } else {
            self.skip = (self.skip * 2).clamp(1, MAX_SKIP);
            self.left = self.skip;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

    /// Which of the next `n` entries may wait.
    fn next(b: &mut Backoff, n: usize) -> Vec<bool> {
        (0..n).map(|_| b.may_wait()).collect()
    }

    #[test]
    fn waits_that_run_out_are_skipped_for_twice_as_many_entries_each_time_up_to_64() {
        let mut b = Backoff::default();
        assert_eq!(next(&mut b, 3), [true; 3]);
        b.waited(false);
        assert_eq!(next(&mut b, 2), [false, true]);
        b.waited(false);
        assert_eq!(next(&mut b, 3), [false, false, true]);
        b.waited(false);
        assert_eq!(next(&mut b, 5), [false, false, false, false, true]);
        for _ in 0..10 {
            b.waited(false);
        }
        assert_eq!(next(&mut b, 64).iter().filter(|w| **w).count(), 0);
        assert!(b.may_wait());
    }

    #[test]
    fn a_wait_that_fills_halves_the_skip() {
        let mut b = Backoff::default();
        for _ in 0..3 {
            b.waited(false);
        }
        // Skipping 4 now; a filled wait halves it to 2, and the next wait
        // that runs out doubles that.
        assert_eq!(next(&mut b, 5), [false, false, false, false, true]);
        b.waited(true);
        b.waited(false);
        assert_eq!(next(&mut b, 5), [false, false, false, false, true]);
        // Three filled waits take 4 down to nothing: one that runs out
        // then starts at 1 again.
        b.waited(true);
        b.waited(true);
        b.waited(true);
        b.waited(false);
        assert_eq!(next(&mut b, 2), [false, true]);
    }
}
