//! Eviction policies. Each keeps its own lists threaded through the slot
//! arena and answers one question: which unpinned page goes next.

mod lfu_hist;
mod lru;
mod s3fifo;

use crate::slot::Slot;

pub use lfu_hist::LfuHist;
pub use lru::Lru;
pub use s3fifo::S3Fifo;

/// The policies a cache can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Least recently unpinned first: the reference.
    Lru,
    /// The seed's policy: least referenced first, by a bounded counter.
    LfuHist,
    /// S3-FIFO: a small probationary FIFO, a main FIFO with reinsertion and
    /// a ghost queue; scan-resistant.
    S3Fifo,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Lru, Policy::LfuHist, Policy::S3Fifo];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::LfuHist => "lfu-hist",
            Policy::S3Fifo => "s3-fifo",
        }
    }

    /// The names of every policy, for error messages and help.
    pub fn names() -> String {
        Policy::ALL.map(Policy::name).join(", ")
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown page-cache policy {s:?}; valid policies: {}",
                    Policy::names()
                )
            })
    }
}

/// A running policy.
pub enum State {
    Lru(Lru),
    LfuHist(LfuHist),
    S3Fifo(S3Fifo),
}

macro_rules! dispatch {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            State::Lru($p) => $e,
            State::LfuHist($p) => $e,
            State::S3Fifo($p) => $e,
        }
    };
}

impl State {
    pub fn new(policy: Policy) -> State {
        match policy {
            Policy::Lru => State::Lru(Lru::default()),
            Policy::LfuHist => State::LfuHist(LfuHist::default()),
            Policy::S3Fifo => State::S3Fifo(S3Fifo::default()),
        }
    }

    /// A new page entered the cache, pinned.
    #[inline]
    pub fn admit(&mut self, slots: &mut [Slot], i: u32) {
        dispatch!(self, p => p.admit(slots, i))
    }

    /// A resident page was fetched (it is pinned after this).
    #[inline]
    pub fn touch(&mut self, slots: &mut [Slot], i: u32) {
        dispatch!(self, p => p.touch(slots, i))
    }

    /// A page's last pin was released.
    #[inline]
    pub fn unpin(&mut self, slots: &mut [Slot], i: u32) {
        dispatch!(self, p => p.unpin(slots, i))
    }

    /// A page leaves the cache (discarded, truncated or rekeyed over).
    #[inline]
    pub fn remove(&mut self, slots: &mut [Slot], i: u32) {
        dispatch!(self, p => p.remove(slots, i))
    }

    /// Page `i` now answers to `new_key`.
    #[inline]
    pub fn rekey(&mut self, slots: &mut [Slot], i: u32, new_key: u32) {
        if let State::S3Fifo(p) = self {
            p.rekey(slots, i, new_key);
        }
    }

    /// Picks an unpinned page to evict and forgets it, or None when every
    /// page is pinned. `capacity` is the cache's page budget.
    #[inline]
    pub fn victim(&mut self, slots: &mut [Slot], capacity: usize) -> Option<u32> {
        dispatch!(self, p => p.victim(slots, capacity))
    }

    /// Panics unless the policy's structures agree with the slots.
    pub fn check(&self, slots: &[Slot]) {
        dispatch!(self, p => p.check(slots))
    }
}

/// Live slots that are not pinned, in index order (for invariant checks).
pub(crate) fn unpinned(slots: &[Slot]) -> Vec<u32> {
    (0..slots.len() as u32)
        .filter(|&i| slots[i as usize].live && !slots[i as usize].pinned)
        .collect()
}

pub(crate) fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}
