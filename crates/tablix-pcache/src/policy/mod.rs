//! Eviction policies. Each keeps its own lists threaded through the slot
//! arena and answers one question: which unpinned page goes next.

mod lfu_hist;
mod lru;
mod s3fifo;
mod tinylfu;

use crate::slot::Slot;

pub use lfu_hist::LfuHist;
pub use lru::Lru;
pub use s3fifo::{S3Fifo, S3Lru};
pub use tinylfu::TinyLfu;

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
    /// S3-FIFO's probationary FIFO and ghost in front of an LRU main area:
    /// scan-resistant, and eviction never goes round.
    S3Lru,
    /// W-TinyLFU: an LRU window, a segmented LRU main area and admission by
    /// a frequency sketch; scan-resistant and frequency-aware.
    TinyLfu,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::Lru,
        Policy::LfuHist,
        Policy::S3Fifo,
        Policy::S3Lru,
        Policy::TinyLfu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::LfuHist => "lfu-hist",
            Policy::S3Fifo => "s3-fifo",
            Policy::S3Lru => "s3-lru",
            Policy::TinyLfu => "w-tinylfu",
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

/// An eviction policy. Each cache is monomorphised over its policy, so the
/// hot path has no dispatch and inlines the policy's few instructions.
pub trait Evict: Default + Send + 'static {
    const POLICY: Policy;

    /// A new page entered the cache, pinned.
    fn admit(&mut self, slots: &mut [Slot], i: u32);

    /// A resident page was fetched (it is pinned after this).
    fn touch(&mut self, slots: &mut [Slot], i: u32);

    /// A page's last pin was released.
    fn unpin(&mut self, slots: &mut [Slot], i: u32);

    /// A page leaves the cache (discarded, truncated or rekeyed over).
    fn remove(&mut self, slots: &mut [Slot], i: u32);

    /// The cache's page budget changed (also called once at creation).
    fn set_capacity(&mut self, _capacity: usize) {}

    /// Page `i` now answers to `new_key`.
    fn rekey(&mut self, _slots: &mut [Slot], _i: u32, _new_key: u32) {}

    /// Picks an unpinned page to evict and forgets it, or None when every
    /// page is pinned. `capacity` is the cache's page budget.
    fn victim(&mut self, slots: &mut [Slot], capacity: usize) -> Option<u32>;

    /// Panics unless the policy's structures agree with the slots.
    #[cfg(any(debug_assertions, test))]
    fn check(&self, slots: &[Slot]);
}

/// Live slots that are not pinned, in index order (for invariant checks).
#[cfg(any(debug_assertions, test))]
pub(crate) fn unpinned(slots: &[Slot]) -> Vec<u32> {
    (0..slots.len() as u32)
        .filter(|&i| slots[i as usize].live && !slots[i as usize].pinned)
        .collect()
}

#[cfg(any(debug_assertions, test))]
pub(crate) fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}
