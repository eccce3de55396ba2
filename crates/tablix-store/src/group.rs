//! Group commit: several Commands in one SQLite transaction, each in its
//! own savepoint, so that one fsync serves them all without coupling their
//! fates.

use rusqlite::Connection;

use crate::error::{SqliteFailure, StoreError};
use crate::outcome::Applied;

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

/// Applies `items` with `apply` in one transaction, each inside its own
/// SAVEPOINT, and commits. An item whose result says `rolled_back` is
/// rolled back alone and keeps its result; the others commit. An item that
/// ends the whole transaction itself (ON CONFLICT ROLLBACK, an interrupted
/// write) is excluded and the group applied again without it, which
/// leaves the state one-by-one application would.
///
/// Returns `Err` only when the group as a whole failed (BEGIN, SAVEPOINT
/// or COMMIT, or SQLite failing under an item, `StoreError::Failed`): then
/// nothing of it is applied.
pub(crate) fn commit<T>(
    conn: &Connection,
    items: &[T],
    mut apply: impl FnMut(&T) -> Result<Applied, StoreError>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    commit_prefix(conn, items, usize::MAX, |item| apply(item).map(|a| (a, 0)))
}

/// [`commit`] for items whose results cost memory until the group is
/// answered: `apply` also returns what an item's result costs. The group
/// ends before the first item that would take the results held past
/// `budget` (that item is rolled back, not answered); the caller applies
/// the rest as a new group. The first item always fits, so every call
/// makes progress, and the results held never exceed `budget` plus one
/// item's own.
///
/// Returns the results of a prefix of `items`, never empty unless `items`
/// is.
pub(crate) fn commit_prefix<T>(
    conn: &Connection,
    items: &[T],
    budget: usize,
    mut apply: impl FnMut(&T) -> Result<(Applied, usize), StoreError>,
) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
    // Items that ended the whole transaction, with their results and
    // costs; they stay out of the retried group.
    let mut excluded: Vec<Option<(Result<Applied, StoreError>, usize)>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    'attempt: loop {
        batch_sql(conn, BEGIN_WRITE)?;
        let mut results = Vec::with_capacity(items.len());
        let mut held = 0usize;
        for (i, item) in items.iter().enumerate() {
            let fits = |cost: usize| held == 0 || held.saturating_add(cost) <= budget;
            if let Some((r, cost)) = &excluded[i] {
                if !fits(*cost) {
                    break;
                }
                held = held.saturating_add(*cost);
                results.push(match r {
                    Ok(a) => Ok(a.clone()),
                    Err(e) => Err(e.duplicate()),
                });
                continue;
            }
            batch_sql(conn, "SAVEPOINT tablix_command")?;
            let r = apply(item);
            if let Err(e @ StoreError::Failed(_)) = r {
                // The node failed, not the item: no item of the group is
                // answered as if it had been applied or refused.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                return Err(e);
            }
            let cost = r.as_ref().map_or(0, |(_, cost)| *cost);
            if conn.is_autocommit() {
                let r = r.map(|(mut a, _)| {
                    a.rolled_back = true;
                    a
                });
                excluded[i] = Some((r, cost));
                continue 'attempt;
            }
            if !fits(cost) {
                batch_sql(conn, "ROLLBACK TO tablix_command")?;
                batch_sql(conn, "RELEASE tablix_command")?;
                break;
            }
            held = held.saturating_add(cost);
            let r = r.map(|(a, _)| a);
            let failed = r.as_ref().map_or(true, |a| a.rolled_back);
            if failed {
                batch_sql(conn, "ROLLBACK TO tablix_command")?;
            }
            batch_sql(conn, "RELEASE tablix_command")?;
            results.push(r);
        }
        batch_sql(conn, "COMMIT")?;
        return Ok(results);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One Command of the test: statements, and whether they are one
    /// transaction (the first error rolls the Command back).
    type Item = (Vec<String>, bool);

    fn apply_one(conn: &Connection, item: &Item) -> Result<Applied, StoreError> {
        let mut a = Applied::default();
        for sql in &item.0 {
            let failed = conn.execute_batch(sql).is_err();
            if failed && item.1 {
                a.rolled_back = true;
                break;
            }
            if conn.is_autocommit() {
                a.rolled_back = true;
                break;
            }
        }
        Ok(a)
    }

    fn table() -> Connection {
        let c = Connection::open_in_memory().expect("memory db");
        c.execute_batch("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT UNIQUE)")
            .expect("table");
        c
    }

    fn dump(c: &Connection) -> Vec<(i64, Option<String>)> {
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Group commit (any grouping) ends in the same state, with the
        /// same per-Command outcomes, as applying the Commands one by one,
        /// also when a statement ends the whole transaction.
        #[test]
        fn group_commit_matches_one_by_one(
            items in prop::collection::vec((prop::collection::vec(statement(), 1..4), any::<bool>()), 1..24),
            cut in prop::collection::vec(1usize..8, 1..8),
        ) {
            let grouped = table();
            let single = table();
            let mut g = Vec::new();
            let mut rest: &[Item] = &items;
            let mut sizes = cut.iter().cycle();
            while !rest.is_empty() {
                let n = sizes.next().copied().unwrap_or(1).min(rest.len());
                g.extend(commit(&grouped, &rest[..n], |i| apply_one(&grouped, i)).expect("group"));
                rest = &rest[n..];
            }
            let mut s = Vec::new();
            for i in &items {
                s.extend(commit(&single, std::slice::from_ref(i), |i| apply_one(&single, i)).expect("single"));
            }
            let view = |r: &Result<Applied, StoreError>| r.as_ref().map(|a| a.rolled_back).map_err(|e| e.to_string());
            prop_assert_eq!(g.iter().map(view).collect::<Vec<_>>(), s.iter().map(view).collect::<Vec<_>>());
            prop_assert_eq!(dump(&grouped), dump(&single));
        }

        /// A group that ends early where results outgrow the budget, the
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
            let grouped = table();
            let single = table();
            let mut g = Vec::new();
            let mut rest: &[(Vec<String>, bool, usize)] = &items;
            while !rest.is_empty() {
                let mut held = 0usize;
                let results = commit_prefix(&grouped, rest, budget, |(sql, tx, cost)| {
                    apply_one(&grouped, &(sql.clone(), *tx)).map(|a| (a, *cost))
                })
                .expect("group");
                prop_assert!(!results.is_empty(), "a group made no progress");
                for (_, _, cost) in &rest[..results.len()] {
                    prop_assert!(held == 0 || held + cost <= budget, "group held more than its budget");
                    held += cost;
                }
                rest = &rest[results.len()..];
                g.extend(results);
            }
            let mut s = Vec::new();
            for (sql, tx, _) in &items {
                let item = (sql.clone(), *tx);
                s.extend(commit(&single, std::slice::from_ref(&item), |i| apply_one(&single, i)).expect("single"));
            }
            let view = |r: &Result<Applied, StoreError>| r.as_ref().map(|a| a.rolled_back).map_err(|e| e.to_string());
            prop_assert_eq!(g.iter().map(view).collect::<Vec<_>>(), s.iter().map(view).collect::<Vec<_>>());
            prop_assert_eq!(dump(&grouped), dump(&single));
        }
    }
}
