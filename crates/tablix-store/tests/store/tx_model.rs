//! Many interactive transactions interleaved at random against a serial
//! model of the same commits: every read a transaction makes is its
//! snapshot plus its own writes, every commit succeeds exactly when no
//! row it changes was changed since its snapshot (first committer wins),
//! and the final state is the committed transactions' writes applied in
//! commit order.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tablix_store::{
    Principal, Statement, StatementResult, Store, StoreConfig, TxKind, TxOutcome, Value,
};

use super::{rows, sql, stamp};

type State = BTreeMap<i64, i64>;

#[derive(Clone, Debug)]
enum Step {
    Begin(usize),
    Read(usize, i64),
    Write(usize, i64, i64),
    Delete(usize, i64),
    Commit(usize),
    Rollback(usize),
    /// A plain autocommit write beside the transactions.
    Plain(i64, i64),
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0usize..4;
    let key = 0i64..6;
    let val = 0i64..4;
    prop_oneof![
        2 => slot.clone().prop_map(Step::Begin),
        3 => (slot.clone(), key.clone()).prop_map(|(s, k)| Step::Read(s, k)),
        4 => (slot.clone(), key.clone(), val.clone()).prop_map(|(s, k, v)| Step::Write(s, k, v)),
        1 => (slot.clone(), key.clone()).prop_map(|(s, k)| Step::Delete(s, k)),
        2 => slot.clone().prop_map(Step::Commit),
        1 => slot.prop_map(Step::Rollback),
        1 => (key, val).prop_map(|(k, v)| Step::Plain(k, v)),
    ]
}

/// An open transaction of the model: its snapshot and its own writes.
struct ModelTx {
    snapshot: State,
    writes: BTreeMap<i64, Option<i64>>,
}

impl ModelTx {
    fn read(&self, k: i64) -> Option<i64> {
        match self.writes.get(&k) {
            Some(w) => *w,
            None => self.snapshot.get(&k).copied(),
        }
    }

    /// Keys whose value the transaction changed from its snapshot's (a
    /// write of the same value again changes nothing).
    fn changed(&self) -> Vec<(i64, Option<i64>)> {
        self.writes
            .iter()
            .filter(|(k, w)| self.snapshot.get(k).copied() != **w)
            .map(|(k, w)| (*k, *w))
            .collect()
    }
}

fn read(tx: &tablix_store::Transaction<'_>, k: i64) -> Option<i64> {
    let out = tx
        .run(&[Statement::new(format!("SELECT v FROM kv WHERE k = {k}"))])
        .unwrap();
    match &out[0].result {
        StatementResult::Rows(r) => match r.values.as_slice() {
            [] => None,
            [row] => match row.as_slice() {
                [Value::Integer(v)] => Some(*v),
                other => panic!("{other:?}"),
            },
            more => panic!("{more:?}"),
        },
        other => panic!("{other:?}"),
    }
}

fn ok(r: StatementResult) {
    assert!(!r.is_error(), "{r:?}");
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("data"))).unwrap();
    store
        .apply_sql(
            stamp(1),
            sql(&["CREATE TABLE kv(k INTEGER PRIMARY KEY, v INTEGER)"]),
        )
        .unwrap();
    let root = Principal::root();
    let mut current = State::new();
    let mut open: Vec<Option<(tablix_store::Transaction<'_>, ModelTx)>> =
        (0..4).map(|_| None).collect();
    let mut n = 1;
    for s in steps {
        match s.clone() {
            Step::Begin(i) => {
                if open[i].is_none() {
                    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
                    open[i] = Some((
                        tx,
                        ModelTx {
                            snapshot: current.clone(),
                            writes: BTreeMap::new(),
                        },
                    ));
                }
            }
            Step::Read(i, k) => {
                if let Some((tx, m)) = &open[i] {
                    prop_assert_eq!(read(tx, k), m.read(k), "read of {} in slot {}", k, i);
                }
            }
            Step::Write(i, k, v) => {
                if let Some((tx, m)) = &mut open[i] {
                    ok(tx
                        .execute(&format!("INSERT OR REPLACE INTO kv VALUES ({k}, {v})"))
                        .unwrap());
                    m.writes.insert(k, Some(v));
                }
            }
            Step::Delete(i, k) => {
                if let Some((tx, m)) = &mut open[i] {
                    ok(tx
                        .execute(&format!("DELETE FROM kv WHERE k = {k}"))
                        .unwrap());
                    m.writes.insert(k, None);
                }
            }
            Step::Commit(i) => {
                if let Some((tx, m)) = open[i].take() {
                    let changed = m.changed();
                    let conflict = changed
                        .iter()
                        .any(|(k, _)| current.get(k) != m.snapshot.get(k));
                    let outcome = tx.commit().unwrap();
                    prop_assert_eq!(
                        matches!(outcome, TxOutcome::Conflict(_)),
                        conflict,
                        "commit of slot {}: {:?}",
                        i,
                        outcome
                    );
                    if !conflict {
                        prop_assert!(outcome.is_committed(), "{:?}", outcome);
                        for (k, w) in changed {
                            match w {
                                Some(v) => current.insert(k, v),
                                None => current.remove(&k),
                            };
                        }
                    }
                }
            }
            Step::Rollback(i) => {
                if let Some((tx, _)) = open[i].take() {
                    tx.rollback().unwrap();
                }
            }
            Step::Plain(k, v) => {
                n += 1;
                let r = store
                    .apply_sql(
                        stamp(n),
                        sql(&[&format!("INSERT OR REPLACE INTO kv VALUES ({k}, {v})")]),
                    )
                    .unwrap();
                prop_assert!(!r.rolled_back);
                current.insert(k, v);
            }
        }
    }
    drop(open);
    let expected: Vec<Vec<Value>> = current
        .iter()
        .map(|(k, v)| vec![Value::Integer(*k), Value::Integer(*v)])
        .collect();
    prop_assert_eq!(rows(&store, "SELECT k, v FROM kv ORDER BY k"), expected);
    prop_assert_eq!(store.tx_stats().open, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn interleaved_transactions_match_a_serial_model(steps in prop::collection::vec(step(), 1..60)) {
        run(&steps)?;
    }
}
