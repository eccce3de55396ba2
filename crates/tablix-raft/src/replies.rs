//! The replies of the Commands a node applied lately, by their stamp's
//! seed. A proposal sent again after a leader change (the old leader had
//! replicated it before it lost leadership, and the new one committed it)
//! is applied once; its second copy is answered `Repeated` by the store.
//! Every node applied the first copy, so the node answering the caller
//! looks up what it answered then and gives that instead.
//!
//! Bounded by count; replies that carry result rows (a `RETURNING`) are
//! not kept, so their caller still hears the reply is lost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tablix_store::{CommandReply, StatementResult};

/// Replies kept, at most.
const KEEP: usize = 4096;

#[derive(Clone, Default)]
pub struct RecentReplies {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    by_seed: HashMap<u64, CommandReply>,
    order: VecDeque<u64>,
}

/// Whether a reply is worth keeping: one that says what a Command did,
/// small enough to hold thousands of.
fn keepable(reply: &CommandReply) -> bool {
    match reply {
        CommandReply::Fs(_) | CommandReply::Failed(_) => true,
        CommandReply::Sql(r) => r.statements.iter().all(|s| match &s.result {
            StatementResult::Rows(rows) => rows.values.is_empty(),
            _ => true,
        }),
        CommandReply::AppliedBefore | CommandReply::Repeated => false,
    }
}

impl RecentReplies {
    /// Keeps `reply`, the one the Command stamped with `seed` got.
    pub fn record(&self, seed: u64, reply: &CommandReply) {
        if !keepable(reply) {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if inner.by_seed.insert(seed, reply.clone()).is_none() {
            inner.order.push_back(seed);
        }
        while inner.order.len() > KEEP {
            if let Some(old) = inner.order.pop_front() {
                inner.by_seed.remove(&old);
            }
        }
    }

    /// What the Command stamped with `seed` was answered, if kept.
    pub fn get(&self, seed: u64) -> Option<CommandReply> {
        self.inner.lock().ok()?.by_seed.get(&seed).cloned()
    }

    /// `reply`, unless it says the Command was applied before: then the
    /// reply it got that time, if kept.
    pub fn resolve(&self, seed: u64, reply: CommandReply) -> CommandReply {
        match reply {
            CommandReply::Repeated => self.get(seed).unwrap_or(CommandReply::Repeated),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tablix_store::{SqlReply, StatementOutcome};

    fn executed(n: u64) -> CommandReply {
        CommandReply::Sql(SqlReply {
            statements: vec![StatementOutcome {
                result: StatementResult::Executed {
                    last_insert_id: n as i64,
                    rows_affected: 1,
                },
                seconds: 0.0,
            }],
            ..Default::default()
        })
    }

    #[test]
    fn a_repeat_gets_the_first_reply_while_it_is_kept() {
        let r = RecentReplies::default();
        r.record(7, &executed(7));
        assert_eq!(r.resolve(7, CommandReply::Repeated), executed(7));
        assert_eq!(r.resolve(8, CommandReply::Repeated), CommandReply::Repeated);
        assert_eq!(r.resolve(7, executed(9)), executed(9));
        r.record(9, &CommandReply::Repeated);
        assert_eq!(r.get(9), None);
        for seed in 100..100 + KEEP as u64 {
            r.record(seed, &executed(seed));
        }
        assert_eq!(r.get(7), None, "the oldest goes first");
        assert_eq!(
            r.get(100 + KEEP as u64 - 1),
            Some(executed(100 + KEEP as u64 - 1))
        );
    }
}
