//! Telling the proposer that its entry is committed, before it is applied.
//!
//! Openraft answers `client_write` once the entry is applied on the
//! leader. The leader's state machine begins applying an entry only once
//! a majority holds it, so the moment its apply begins is the moment the
//! proposer may send the next entry: that entry is then logged and
//! replicated while this one is applied, and still no two entries are
//! being replicated at once (openraft 0.9 syncs each of those on its own).
//!
//! An entry is known by the stamp's seed of its first Command. The
//! proposer registers the seed before it proposes the entry and forgets it
//! once openraft answered; the state machine calls [`Committing::applying`]
//! with the first seed of every entry it is about to apply (a seed nobody
//! registered, as on a follower, is a lookup and nothing more). A seed
//! registered twice (a proposal sent again after a leader change) keeps
//! one registration: the entry that lost it frees its slot only when
//! answered, and the other's may be freed by the first copy's apply, so
//! at worst two entries are replicated at once for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Shared by a node's state machine and its proposer.
#[derive(Clone, Debug, Default)]
pub struct Committing {
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>,
}

impl Committing {
    /// Registers the entry whose first Command has `seed`: the receiver is
    /// told when the state machine begins applying it, and sees its sender
    /// dropped if [`Committing::forget`] comes first.
    pub(crate) fn expect(&self, seed: u64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(seed, tx);
        rx
    }

    /// Drops the registration of `seed`, if it is still there.
    pub(crate) fn forget(&self, seed: u64) {
        self.lock().remove(&seed);
    }

    /// The state machine is about to apply the entry whose first Command
    /// has `seed`.
    pub(crate) fn applying(&self, seed: u64) {
        let tx = self.lock().remove(&seed);
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<()>>> {
        // The map holds no invariant a panicking holder could break.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_registered_entry_is_told_and_only_once() {
        let c = Committing::default();
        let mut first = c.expect(1);
        let mut second = c.expect(2);
        c.applying(3);
        c.applying(1);
        assert_eq!(first.try_recv(), Ok(()));
        assert!(second.try_recv().is_err(), "entry 2 was not applied yet");
        c.forget(2);
        assert_eq!(
            second.try_recv(),
            Err(oneshot::error::TryRecvError::Closed),
            "a forgotten entry's receiver sees its sender dropped"
        );
        c.applying(1);
        assert!(c.lock().is_empty());
    }
}
