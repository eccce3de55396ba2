//! Telling the proposer that its entry is committed, before it is applied,
//! and then that it is applied, with its replies.
//!
//! Openraft answers `client_write` once the entry is applied on the
//! leader. The leader's state machine begins applying an entry only once
//! a majority holds it, so the moment its apply begins is the moment the
//! proposer may send the next entry: that entry is then logged and
//! replicated while this one is applied, and still no two entries are
//! being replicated at once (openraft 0.9 syncs each of those on its own).
//! The moment its apply ends is when its clients may be answered: the
//! state machine hands the proposer the replies itself, instead of
//! openraft's core passing them on to `client_write` (one task and one
//! wake-up fewer on the way of every write).
//!
//! An entry is known by the stamp's seed of its first Command. The
//! proposer registers the entry's seeds before it proposes it and forgets
//! them once openraft answered; the state machine calls
//! [`Committing::applying`] with the first seed of every entry it is about
//! to apply and [`Committing::applied`] with every entry's seeds and
//! replies once applied (a seed nobody registered, as on a follower, is a
//! lookup and nothing more). Replies go to a registration only when its
//! seeds are the entry's, in order: they answer exactly the Commands it
//! proposed. A seed registered twice (a proposal sent again after a
//! leader change) keeps one registration: the entry that lost it frees
//! its slot and answers only when openraft answers, and the other's may
//! be freed and answered by the first copy's apply (the same Commands,
//! applied there), so at worst two entries are replicated at once for a
//! while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tablix_store::CommandReply;
use tokio::sync::oneshot;

/// An applied entry's index (openraft's) and its Commands' replies.
#[derive(Debug, PartialEq)]
pub(crate) struct Applied {
    pub(crate) index: u64,
    pub(crate) replies: Vec<CommandReply>,
}

/// What the proposer of one entry is told.
pub(crate) struct Expected {
    /// Sent when the entry's apply begins (it is committed).
    pub(crate) committed: oneshot::Receiver<()>,
    /// Sent when it is applied.
    pub(crate) applied: oneshot::Receiver<Applied>,
}

#[derive(Debug)]
struct Registration {
    seeds: Vec<u64>,
    committed: Option<oneshot::Sender<()>>,
    applied: oneshot::Sender<Applied>,
}

/// Shared by a node's state machine and its proposer.
#[derive(Clone, Debug, Default)]
pub struct Committing {
    waiting: Arc<Mutex<HashMap<u64, Registration>>>,
}

impl Committing {
    /// Registers the entry of the Commands with `seeds` (not empty), known
    /// by the first: the receivers are told when the state machine begins
    /// applying it and when it applied it, and see their senders dropped
    /// if [`Committing::forget`] comes first.
    pub(crate) fn expect(&self, seeds: Vec<u64>) -> Expected {
        let (committed_tx, committed) = oneshot::channel();
        let (applied_tx, applied) = oneshot::channel();
        if let Some(&first) = seeds.first() {
            self.lock().insert(
                first,
                Registration {
                    seeds,
                    committed: Some(committed_tx),
                    applied: applied_tx,
                },
            );
        }
        Expected { committed, applied }
    }

    /// Drops the registration of the entry first `seed`, if it is still
    /// there.
    pub(crate) fn forget(&self, seed: u64) {
        self.lock().remove(&seed);
    }

    /// The state machine is about to apply the entry whose first Command
    /// has `seed`.
    pub(crate) fn applying(&self, seed: u64) {
        let tx = self.lock().get_mut(&seed).and_then(|r| r.committed.take());
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
    }

    /// The state machine applied the entry at `index` of the Commands
    /// with `seeds`, which answered `replies`: a registration of exactly
    /// those seeds is handed them and ends.
    pub(crate) fn applied(&self, seeds: &[u64], index: u64, replies: &[CommandReply]) {
        let Some(first) = seeds.first() else { return };
        let registration = {
            let mut waiting = self.lock();
            match waiting.get(first) {
                Some(r) if r.seeds == seeds && replies.len() == seeds.len() => {
                    waiting.remove(first)
                }
                _ => None,
            }
        };
        if let Some(r) = registration {
            let _ = r.applied.send(Applied {
                index,
                replies: replies.to_vec(),
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Registration>> {
        // The map holds no invariant a panicking holder could break.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot::error::TryRecvError;

    fn reply(s: &str) -> CommandReply {
        CommandReply::Failed(s.into())
    }

    #[tokio::test]
    async fn only_the_registered_entry_is_told_and_only_once() {
        let c = Committing::default();
        let mut first = c.expect(vec![1, 4]);
        let mut second = c.expect(vec![2]);
        c.applying(3);
        c.applying(1);
        assert_eq!(first.committed.try_recv(), Ok(()));
        assert_eq!(second.committed.try_recv(), Err(TryRecvError::Empty));
        c.applying(1);
        c.applied(&[1], 7, &[reply("a")]);
        c.applied(&[1, 5], 7, &[reply("a"), reply("b")]);
        c.applied(&[1, 4], 7, &[reply("a")]);
        assert_eq!(
            first.applied.try_recv(),
            Err(TryRecvError::Empty),
            "replies go only to a registration of the entry's seeds, one each"
        );
        c.applied(&[1, 4], 7, &[reply("a"), reply("b")]);
        assert_eq!(
            first.applied.try_recv(),
            Ok(Applied {
                index: 7,
                replies: vec![reply("a"), reply("b")]
            })
        );
        c.forget(2);
        assert_eq!(
            second.committed.try_recv(),
            Err(TryRecvError::Closed),
            "a forgotten entry's receivers see their senders dropped"
        );
        assert_eq!(second.applied.try_recv(), Err(TryRecvError::Closed));
        assert!(c.lock().is_empty());
    }
}
