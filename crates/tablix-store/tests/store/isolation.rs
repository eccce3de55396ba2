//! The Hermitage isolation tests (github.com/ept/hermitage), run against
//! interactive transactions. tablix promises snapshot isolation with
//! write conflicts decided by row: each test asserts exactly what that
//! level prevents (G0, G1a, G1b, G1c, OTV, PMP, P4, G-single) and what it
//! allows (G2-item, write skew; G2, anti-dependency cycles).

use tablix_store::{
    Principal, Statement, StatementResult, Store, StoreConfig, Transaction, TxKind, TxOutcome,
    Value,
};

use super::{rows, sql, stamp};

/// Hermitage's table: `test(id, value)` holding (1, 10) and (2, 20).
fn hermitage() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("data"))).unwrap();
    store
        .apply_sql(
            stamp(1),
            sql(&[
                "CREATE TABLE test(id INTEGER PRIMARY KEY, value INTEGER)",
                "INSERT INTO test VALUES (1, 10), (2, 20)",
            ]),
        )
        .unwrap();
    (dir, store)
}

fn begin(store: &Store) -> Transaction<'_> {
    store
        .transaction(&Principal::root(), TxKind::ReadWrite)
        .unwrap()
}

/// Runs a statement, which must succeed; returns its rows as (id, value).
fn run(tx: &Transaction<'_>, q: &str) -> Vec<(i64, i64)> {
    let out = tx.run(&[Statement::new(q)]).unwrap();
    match &out[0].result {
        StatementResult::Rows(r) => r
            .values
            .iter()
            .map(|row| match row.as_slice() {
                [Value::Integer(a), Value::Integer(b)] => (*a, *b),
                other => panic!("{q}: {other:?}"),
            })
            .collect(),
        StatementResult::Executed { .. } => Vec::new(),
        StatementResult::Error(e) => panic!("{q}: {e}"),
    }
}

fn committed(tx: Transaction<'_>) {
    let o = tx.commit().unwrap();
    assert!(o.is_committed(), "expected a commit, got {o:?}");
}

fn conflicted(tx: Transaction<'_>) {
    let o = tx.commit().unwrap();
    assert!(
        matches!(o, TxOutcome::Conflict(_)),
        "expected a conflict, got {o:?}"
    );
}

fn table(store: &Store) -> Vec<Vec<Value>> {
    rows(store, "SELECT id, value FROM test ORDER BY id")
}

fn pairs(p: &[(i64, i64)]) -> Vec<Vec<Value>> {
    p.iter()
        .map(|(a, b)| vec![Value::Integer(*a), Value::Integer(*b)])
        .collect()
}

#[test]
fn g0_dirty_write_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 12 WHERE id = 1");
    run(&t1, "UPDATE test SET value = 21 WHERE id = 2");
    committed(t1);
    run(&t2, "UPDATE test SET value = 22 WHERE id = 2");
    conflicted(t2);
    assert_eq!(table(&store), pairs(&[(1, 11), (2, 21)]));
}

#[test]
fn g1a_aborted_read_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = 101 WHERE id = 1");
    assert_eq!(run(&t2, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    t1.rollback().unwrap();
    assert_eq!(run(&t2, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    committed(t2);
    assert_eq!(table(&store), pairs(&[(1, 10), (2, 20)]));
}

#[test]
fn g1b_intermediate_read_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = 101 WHERE id = 1");
    assert_eq!(run(&t2, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    committed(t1);
    assert_eq!(run(&t2, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    committed(t2);
}

#[test]
fn g1c_circular_information_flow_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 22 WHERE id = 2");
    assert_eq!(run(&t1, "SELECT * FROM test WHERE id = 2"), [(2, 20)]);
    assert_eq!(run(&t2, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    committed(t1);
    committed(t2);
    assert_eq!(table(&store), pairs(&[(1, 11), (2, 22)]));
}

#[test]
fn otv_observed_transaction_vanishes_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    run(&t1, "UPDATE test SET value = 19 WHERE id = 2");
    run(&t2, "UPDATE test SET value = 12 WHERE id = 1");
    committed(t1);
    let t3 = begin(&store);
    assert_eq!(run(&t3, "SELECT * FROM test WHERE id = 1"), [(1, 11)]);
    run(&t2, "UPDATE test SET value = 18 WHERE id = 2");
    assert_eq!(run(&t3, "SELECT * FROM test WHERE id = 2"), [(2, 19)]);
    conflicted(t2);
    assert_eq!(run(&t3, "SELECT * FROM test"), [(1, 11), (2, 19)]);
    committed(t3);
}

#[test]
fn pmp_predicate_many_preceders_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(run(&t1, "SELECT * FROM test WHERE value = 30"), []);
    run(&t2, "INSERT INTO test VALUES (3, 30)");
    committed(t2);
    assert_eq!(run(&t1, "SELECT * FROM test WHERE value % 3 = 0"), []);
    committed(t1);
}

#[test]
fn pmp_for_write_predicates_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    run(&t1, "UPDATE test SET value = value + 10");
    assert_eq!(run(&t2, "SELECT * FROM test WHERE value = 20"), [(2, 20)]);
    committed(t1);
    run(&t2, "DELETE FROM test WHERE value = 20");
    conflicted(t2);
    assert_eq!(table(&store), pairs(&[(1, 20), (2, 30)]));
}

#[test]
fn p4_lost_update_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(run(&t1, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    assert_eq!(run(&t2, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 11 WHERE id = 1");
    committed(t1);
    conflicted(t2);
    assert_eq!(table(&store), pairs(&[(1, 11), (2, 20)]));
}

#[test]
fn g_single_read_skew_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(run(&t1, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    assert_eq!(run(&t2, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    assert_eq!(run(&t2, "SELECT * FROM test WHERE id = 2"), [(2, 20)]);
    run(&t2, "UPDATE test SET value = 12 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 18 WHERE id = 2");
    committed(t2);
    assert_eq!(run(&t1, "SELECT * FROM test WHERE id = 2"), [(2, 20)]);
    committed(t1);
}

#[test]
fn g_single_read_skew_with_a_write_predicate_is_prevented() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(run(&t1, "SELECT * FROM test WHERE id = 1"), [(1, 10)]);
    run(&t2, "UPDATE test SET value = 12 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 18 WHERE id = 2");
    committed(t2);
    run(&t1, "DELETE FROM test WHERE value = 20");
    conflicted(t1);
    assert_eq!(table(&store), pairs(&[(1, 12), (2, 18)]));
}

/// Snapshot isolation allows write skew: both commit, and the invariant
/// the two meant to keep (at most one of them changes) is broken.
#[test]
fn g2_item_write_skew_is_allowed() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(
        run(&t1, "SELECT * FROM test WHERE id IN (1, 2)"),
        [(1, 10), (2, 20)]
    );
    assert_eq!(
        run(&t2, "SELECT * FROM test WHERE id IN (1, 2)"),
        [(1, 10), (2, 20)]
    );
    run(&t1, "UPDATE test SET value = 11 WHERE id = 1");
    run(&t2, "UPDATE test SET value = 21 WHERE id = 2");
    committed(t1);
    committed(t2);
    assert_eq!(table(&store), pairs(&[(1, 11), (2, 21)]));
}

/// Snapshot isolation allows anti-dependency cycles: each inserts what
/// the other's predicate would have found.
#[test]
fn g2_anti_dependency_cycles_are_allowed() {
    let (_d, store) = hermitage();
    let (t1, t2) = (begin(&store), begin(&store));
    assert_eq!(run(&t1, "SELECT * FROM test WHERE value % 3 = 0"), []);
    assert_eq!(run(&t2, "SELECT * FROM test WHERE value % 3 = 0"), []);
    run(&t1, "INSERT INTO test VALUES (3, 30)");
    run(&t2, "INSERT INTO test VALUES (4, 42)");
    committed(t1);
    committed(t2);
    assert_eq!(table(&store), pairs(&[(1, 10), (2, 20), (3, 30), (4, 42)]));
}

/// Read-only transactions see one snapshot across requests while
/// read/write ones commit beside them (the seed's BEGIN READONLY).
#[test]
fn read_only_snapshots_see_no_commit_made_after_them() {
    let (_d, store) = hermitage();
    let ro = store
        .transaction(&Principal::root(), TxKind::ReadOnly)
        .unwrap();
    assert_eq!(run(&ro, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    let t1 = begin(&store);
    run(&t1, "UPDATE test SET value = value * 2");
    committed(t1);
    assert_eq!(run(&ro, "SELECT * FROM test"), [(1, 10), (2, 20)]);
    committed(ro);
}
