//! The replies of the Commands a node applied lately, by their stamp's
//! seed. A proposal sent again after a leader change (the old leader had
//! replicated it before it lost leadership, and the new one committed it)
//! is applied once; its second copy is answered `Repeated` by the store.
//! Every node applied the first copy, so the node answering the caller
//! looks up what it answered then and gives that instead.
//!
//! Kept for as many Commands as the store remembers proposals by their
//! seed (so a repeat the store recognises finds its reply), and within a
//! byte budget as large as the largest result the store produces: the
//! oldest go first when the replies kept would pass it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tablix_store::{CommandReply, REMEMBERED_PROPOSALS, StatementResult, Value};

/// Replies kept, at most: the store's window of remembered proposals.
const KEEP: usize = REMEMBERED_PROPOSALS;

/// Bytes of replies kept, at most (the store's default bound on one
/// Command's result bytes).
const BUDGET: usize = 64 << 20;

#[derive(Clone)]
pub struct RecentReplies {
    inner: Arc<Mutex<Inner>>,
}

impl Default for RecentReplies {
    fn default() -> Self {
        RecentReplies::with_bounds(KEEP, BUDGET)
    }
}

struct Inner {
    by_seed: HashMap<u64, (CommandReply, usize)>,
    order: VecDeque<u64>,
    bytes: usize,
    keep: usize,
    budget: usize,
}

/// About what a reply takes in memory, in bytes.
fn weight(reply: &CommandReply) -> usize {
    const FIXED: usize = 128;
    let value = |v: &Value| {
        16 + match v {
            Value::Text(t) => t.len(),
            Value::Blob(b) => b.len(),
            Value::Null | Value::Integer(_) | Value::Real(_) => 0,
        }
    };
    FIXED
        + match reply {
            CommandReply::Sql(r) => r
                .statements
                .iter()
                .map(|s| {
                    64 + match &s.result {
                        StatementResult::Rows(rows) => {
                            rows.columns.iter().map(|c| 24 + c.len()).sum::<usize>()
                                + rows.types.iter().map(|t| 24 + t.len()).sum::<usize>()
                                + rows
                                    .values
                                    .iter()
                                    .map(|row| 24 + row.iter().map(value).sum::<usize>())
                                    .sum::<usize>()
                        }
                        StatementResult::Error(e) => e.len(),
                        StatementResult::Executed { .. } => 0,
                    }
                })
                .sum(),
            CommandReply::Failed(e) => e.to_string().len(),
            CommandReply::Tx(
                tablix_store::TxOutcome::Conflict(m) | tablix_store::TxOutcome::Refused(m),
            ) => m.len(),
            CommandReply::Tx(tablix_store::TxOutcome::Committed { .. }) => 0,
            CommandReply::Fs(_) | CommandReply::AppliedBefore | CommandReply::Repeated => 0,
        }
}

impl RecentReplies {
    /// Kept replies at most `keep` and about `budget` bytes.
    fn with_bounds(keep: usize, budget: usize) -> RecentReplies {
        RecentReplies {
            inner: Arc::new(Mutex::new(Inner {
                by_seed: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                keep,
                budget,
            })),
        }
    }

    /// Keeps `reply`, the one the Command stamped with `seed` got. A reply
    /// that says the Command was applied before says nothing to keep; one
    /// larger than the whole budget is not kept either.
    pub fn record(&self, seed: u64, reply: &CommandReply) {
        if matches!(reply, CommandReply::AppliedBefore | CommandReply::Repeated) {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let size = weight(reply);
        if size > inner.budget {
            return;
        }
        match inner.by_seed.insert(seed, (reply.clone(), size)) {
            Some((_, was)) => inner.bytes -= was,
            None => inner.order.push_back(seed),
        }
        inner.bytes += size;
        while inner.order.len() > inner.keep || inner.bytes > inner.budget {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, was)) = inner.by_seed.remove(&old) {
                inner.bytes -= was;
            }
        }
    }

    /// What the Command stamped with `seed` was answered, if kept.
    pub fn get(&self, seed: u64) -> Option<CommandReply> {
        self.inner
            .lock()
            .ok()?
            .by_seed
            .get(&seed)
            .map(|(r, _)| r.clone())
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
    use tablix_store::{Rows, SqlReply, StatementOutcome};

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

    fn rows(n: usize, text: usize) -> CommandReply {
        CommandReply::Sql(SqlReply {
            statements: vec![StatementOutcome {
                result: StatementResult::Rows(Rows {
                    columns: vec!["v".into()],
                    types: vec!["text".into()],
                    values: (0..n)
                        .map(|_| vec![Value::Text("x".repeat(text))])
                        .collect(),
                }),
                seconds: 0.0,
            }],
            ..Default::default()
        })
    }

    #[test]
    fn a_repeat_gets_the_first_reply_while_it_is_kept() {
        let r = RecentReplies::with_bounds(16, 1 << 20);
        r.record(7, &executed(7));
        assert_eq!(r.resolve(7, CommandReply::Repeated), executed(7));
        assert_eq!(r.resolve(8, CommandReply::Repeated), CommandReply::Repeated);
        assert_eq!(r.resolve(7, executed(9)), executed(9));
        r.record(9, &CommandReply::Repeated);
        assert_eq!(r.get(9), None);
        // Rows a RETURNING gave are kept too.
        r.record(10, &rows(3, 5));
        assert_eq!(r.resolve(10, CommandReply::Repeated), rows(3, 5));
        for seed in 100..116 {
            r.record(seed, &executed(seed));
        }
        assert_eq!(r.get(7), None, "the oldest goes first");
        assert_eq!(r.get(10), None);
        assert_eq!(r.get(115), Some(executed(115)));
    }

    #[test]
    fn the_byte_budget_bounds_what_is_kept() {
        let r = RecentReplies::with_bounds(1000, 100_000);
        // Too large for the whole budget: not kept, nothing else lost.
        r.record(1, &executed(1));
        r.record(2, &rows(10, 200_000));
        assert_eq!(r.get(2), None);
        assert_eq!(r.get(1), Some(executed(1)));
        // Each about 40 KB: the third pushes the oldest out.
        r.record(3, &rows(1, 40_000));
        r.record(4, &rows(1, 40_000));
        assert_eq!(r.get(1), Some(executed(1)));
        r.record(5, &rows(1, 40_000));
        assert_eq!((r.get(1), r.get(3)), (None, None));
        assert_eq!(r.get(4), Some(rows(1, 40_000)));
        assert_eq!(r.get(5), Some(rows(1, 40_000)));
        let inner = r.inner.lock().unwrap();
        assert!(inner.bytes <= 100_000, "{}", inner.bytes);
        assert_eq!(
            inner.bytes,
            inner.by_seed.values().map(|(_, w)| w).sum::<usize>()
        );
    }
}
