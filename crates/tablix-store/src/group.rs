//! Group commit: several Commands in one SQLite transaction, each in its
//! own savepoint, so that one fsync serves them all without coupling their
//! fates.

use rusqlite::Connection;

use crate::command::Stamped;
use crate::error::{SqliteFailure, StoreError};
use crate::state_machine::Grouped;

/// How a writer begins a transaction. Deferred, not IMMEDIATE: the
/// persistent database's writers take turns (the store's write turn), so
/// a first write never finds another; IMMEDIATE would also take RESERVED
/// on an attached memory database.
pub(crate) const BEGIN_WRITE: &str = "BEGIN";

/// Runs one of a writer's own transaction-control statements, kept
/// prepared: every Command runs two or three of them.
pub(crate) fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Runs transaction-control SQL; on failure rolls the group back.
fn batch_sql(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    control(conn, sql).map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        StoreError::Commit(SqliteFailure::of(&e))
    })
}

/// Applies `items` with `machine` in one transaction on its connection,
/// each inside its own SAVEPOINT (a lone item in none), and commits. An
/// item whose reply refuses it is rolled back alone and keeps its reply;
/// the others commit. An item that ends the whole transaction itself (ON
/// CONFLICT ROLLBACK, an interrupted write) is excluded and the group
/// applied again without it, which leaves the state one-by-one
/// application would.
///
/// Replies cost memory until the group is answered
/// ([`Grouped::reply_bytes`]): the group ends before the first item
/// that would take the replies held past `budget` (that item is rolled
/// back, not answered); the caller applies the rest as a new group. The
/// first item always fits, so every call makes progress, and the replies
/// held never exceed `budget` plus one item's own.
///
/// Before COMMIT, `mark` is called with the number of items the group
/// applied (or refused), inside the transaction: the store records there
/// the last log entry the group holds.
///
/// Returns the replies of a prefix of `items`, never empty unless `items`
/// is; `Err` only when the group as a whole failed (BEGIN, SAVEPOINT,
/// `mark` or COMMIT, or the node failing under an item,
/// `StoreError::Failed`): then nothing of it is applied.
pub(crate) fn commit<M: Grouped>(
    machine: &M,
    items: &[(&Stamped<M::Op>, &M::Bounds)],
    budget: usize,
    mark: impl Fn(&Connection, usize) -> rusqlite::Result<()>,
) -> Result<Vec<Result<M::Reply, StoreError>>, StoreError> {
    let conn = machine.connection();
    // Items that ended the whole transaction, with their replies; they
    // stay out of the retried group.
    let mut excluded: Vec<Option<Result<M::Reply, StoreError>>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    let cost = |r: &Result<M::Reply, StoreError>| r.as_ref().map_or(0, M::reply_bytes);
    'attempt: loop {
        batch_sql(conn, BEGIN_WRITE)?;
        let mut results = Vec::with_capacity(items.len());
        let mut held = 0usize;
        for (i, (item, bounds)) in items.iter().enumerate() {
            let fits = |cost: usize| held == 0 || held.saturating_add(cost) <= budget;
            if let Some(r) = &excluded[i] {
                if !fits(cost(r)) {
                    break;
                }
                held = held.saturating_add(cost(r));
                results.push(match r {
                    Ok(a) => Ok(a.clone()),
                    Err(e) => Err(e.duplicate()),
                });
                continue;
            }
            // A group of one needs no savepoint: the transaction is the
            // item's, and an item it refuses is rolled back with it and
            // excluded, as one that ended the transaction itself is. A
            // savepoint's journal copies every page the item changes.
            let alone = items.len() == 1;
            if !alone {
                batch_sql(conn, "SAVEPOINT tablix_command")?;
            }
            let r = machine.apply(item.stamp, &item.command, bounds);
            if let Err(e @ StoreError::Failed(_)) = r {
                // The node failed, not the item: no item of the group is
                // answered as if it had been applied or refused.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                return Err(e);
            }
            if conn.is_autocommit() {
                excluded[i] = Some(r.map(M::ended));
                continue 'attempt;
            }
            if alone {
                if r.as_ref().map_or(true, M::refused) {
                    batch_sql(conn, "ROLLBACK")?;
                    excluded[i] = Some(r);
                    continue 'attempt;
                }
                held = held.saturating_add(cost(&r));
                results.push(r);
                continue;
            }
            if !fits(cost(&r)) {
                batch_sql(conn, "ROLLBACK TO tablix_command")?;
                batch_sql(conn, "RELEASE tablix_command")?;
                break;
            }
            held = held.saturating_add(cost(&r));
            if r.as_ref().map_or(true, M::refused) {
                batch_sql(conn, "ROLLBACK TO tablix_command")?;
            }
            batch_sql(conn, "RELEASE tablix_command")?;
            results.push(r);
        }
        if let Err(e) = mark(conn, results.len()) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(StoreError::Commit(SqliteFailure::of(&e)));
        }
        batch_sql(conn, "COMMIT")?;
        return Ok(results);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::command::Stamp;
    use crate::state_machine::StateMachine;

    /// One Command of the test: statements, whether they are one
    /// transaction (the first error rolls the Command back), and what its
    /// reply costs.
    type Item = (Vec<String>, bool, usize);

    /// A state machine of plain SQL on one table; its reply is whether
    /// the Command was rolled back, and its cost.
    struct Machine(Connection);

    impl StateMachine for Machine {
        type Op = Item;
        type Reply = (bool, usize);
        type Bounds = ();

        fn connection(&self) -> &Connection {
            &self.0
        }

        fn apply(&self, _: Stamp, item: &Item, _: &()) -> Result<(bool, usize), StoreError> {
            for sql in &item.0 {
                let failed = self.0.execute_batch(sql).is_err();
                if (failed && item.1) || self.0.is_autocommit() {
                    return Ok((true, item.2));
                }
            }
            Ok((false, item.2))
        }

        fn refused(reply: &(bool, usize)) -> bool {
            reply.0
        }
    }

    impl Grouped for Machine {
        fn ended(reply: (bool, usize)) -> (bool, usize) {
            (true, reply.1)
        }

        fn reply_bytes(reply: &(bool, usize)) -> usize {
            reply.1
        }
    }

    fn table() -> Machine {
        let c = Connection::open_in_memory().expect("memory db");
        c.execute_batch("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT UNIQUE)")
            .expect("table");
        Machine(c)
    }

    fn stamped(items: &[Item]) -> Vec<Stamped<Item>> {
        let stamp = Stamp {
            unix_nanos: 0,
            seed: 0,
        };
        items
            .iter()
            .map(|i| Stamped::new(stamp, i.clone()))
            .collect()
    }

    /// Applies `items` as one group within `budget`.
    fn group(
        m: &Machine,
        items: &[Stamped<Item>],
        budget: usize,
    ) -> Vec<Result<(bool, usize), StoreError>> {
        let refs: Vec<(&Stamped<Item>, &())> = items.iter().map(|i| (i, &())).collect();
        commit(m, &refs, budget, |_, _| Ok(())).expect("group")
    }

    fn dump(m: &Machine) -> Vec<(i64, Option<String>)> {
        let c = &m.0;
        let mut st = c.prepare("SELECT k, v FROM t ORDER BY k").expect("select");
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows")
    }

    fn statement() -> impl Strategy<Value = String> {
        let key = 0i64..6;
        let val = prop::sample::select(vec!["a", "b", "c"]);
        prop_oneof![
            (key.clone(), val.clone())
                .prop_map(|(k, v)| format!("INSERT INTO t VALUES ({k}, '{v}')")),
            (key.clone(), val.clone())
                .prop_map(|(k, v)| format!("INSERT OR ROLLBACK INTO t VALUES ({k}, '{v}')")),
            (key.clone(), val).prop_map(|(k, v)| format!("UPDATE t SET v = '{v}' WHERE k = {k}")),
            key.prop_map(|k| format!("DELETE FROM t WHERE k = {k}")),
            Just("INSERT INTO nowhere VALUES (1)".to_string()),
        ]
    }

    /// The per-Command outcomes of replies, comparable across runs.
    fn view(r: &Result<(bool, usize), StoreError>) -> Result<bool, String> {
        r.as_ref().map(|a| a.0).map_err(|e| e.to_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Group commit (any grouping) ends in the same state, with the
        /// same per-Command outcomes, as applying the Commands one by one,
        /// also when a statement ends the whole transaction.
        #[test]
        fn group_commit_matches_one_by_one(
            items in prop::collection::vec((prop::collection::vec(statement(), 1..4), any::<bool>(), Just(0usize)), 1..24),
            cut in prop::collection::vec(1usize..8, 1..8),
        ) {
            let items = stamped(&items);
            let grouped = table();
            let single = table();
            let mut g = Vec::new();
            let mut rest: &[Stamped<Item>] = &items;
            let mut sizes = cut.iter().cycle();
            while !rest.is_empty() {
                let n = sizes.next().copied().unwrap_or(1).min(rest.len());
                g.extend(group(&grouped, &rest[..n], usize::MAX));
                rest = &rest[n..];
            }
            let mut s = Vec::new();
            for i in &items {
                s.extend(group(&single, std::slice::from_ref(i), usize::MAX));
            }
            prop_assert_eq!(g.iter().map(view).collect::<Vec<_>>(), s.iter().map(view).collect::<Vec<_>>());
            prop_assert_eq!(dump(&grouped), dump(&single));
        }

        /// A group that ends early where replies outgrow the budget, the
        /// rest applied as following groups, still ends as one-by-one
        /// application does; every group makes progress and holds at most
        /// the budget plus one item's cost.
        #[test]
        fn budgeted_groups_match_one_by_one(
            items in prop::collection::vec(
                (prop::collection::vec(statement(), 1..4), any::<bool>(), 0usize..10),
                1..24,
            ),
            budget in 0usize..20,
        ) {
            let items = stamped(&items);
            let grouped = table();
            let single = table();
            let mut g = Vec::new();
            let mut rest: &[Stamped<Item>] = &items;
            while !rest.is_empty() {
                let mut held = 0usize;
                let results = group(&grouped, rest, budget);
                prop_assert!(!results.is_empty(), "a group made no progress");
                for item in &rest[..results.len()] {
                    let cost = item.command.2;
                    prop_assert!(held == 0 || held + cost <= budget, "group held more than its budget");
                    held += cost;
                }
                rest = &rest[results.len()..];
                g.extend(results);
            }
            let mut s = Vec::new();
            for i in &items {
                s.extend(group(&single, std::slice::from_ref(i), usize::MAX));
            }
            prop_assert_eq!(g.iter().map(view).collect::<Vec<_>>(), s.iter().map(view).collect::<Vec<_>>());
            prop_assert_eq!(dump(&grouped), dump(&single));
        }
    }
}
