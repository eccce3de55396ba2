//! Interactive transactions through the store's embedded API: private
//! views, commits as changesets, conflicts, bounds and bad input.

use tablix_store::{
    Collect, Principal, Statement, StatementResult, Store, StoreConfig, StoreError, TxKind,
    TxOutcome, Value,
};

use super::{rows, sql, stamp};

pub(crate) fn store_with(dir: &std::path::Path, f: impl FnOnce(&mut StoreConfig)) -> Store {
    let mut config = StoreConfig::new(dir.join("data"));
    f(&mut config);
    let store = Store::open(config).unwrap();
    store
        .apply_sql(
            stamp(1),
            sql(&[
                "CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, w TEXT)",
                "INSERT INTO kv VALUES (1, 'a', 'x'), (2, 'b', 'y'), (3, 'c', 'z')",
            ]),
        )
        .unwrap();
    store
}

pub(crate) fn value(r: &StatementResult) -> Vec<Vec<Value>> {
    match r {
        StatementResult::Rows(r) => r.values.clone(),
        other => panic!("expected rows, got {other:?}"),
    }
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

fn alice() -> Principal {
    Principal {
        name: "alice".into(),
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
        raw: false,
    }
}

#[test]
fn a_transaction_reads_its_own_writes_privately_and_commits_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |_| {});
    let root = Principal::root();
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("UPDATE kv SET v = 'A' WHERE k = 1").unwrap();
    tx.execute("INSERT INTO kv VALUES (4, 'd', 'w')").unwrap();
    tx.execute("DELETE FROM kv WHERE k = 3").unwrap();
    assert_eq!(
        value(&tx.execute("SELECT v FROM kv ORDER BY k").unwrap()),
        [[text("A")], [text("b")], [text("d")]]
    );
    // Nobody else sees them before COMMIT.
    assert_eq!(
        rows(&store, "SELECT v FROM kv ORDER BY k"),
        [[text("a")], [text("b")], [text("c")]]
    );
    // SQL shows each user their own open transactions, root every one.
    let alices = store.transaction(&alice(), TxKind::ReadOnly).unwrap();
    assert_eq!(
        value(
            &alices
                .execute("SELECT kind, owner FROM tablix_transactions")
                .unwrap()
        ),
        [[text("readonly"), text("alice")]]
    );
    assert_eq!(
        rows(&store, "SELECT count(*) FROM tablix_transactions"),
        [[Value::Integer(2)]]
    );
    alices.rollback().unwrap();
    assert_eq!(tx.commit().unwrap(), TxOutcome::Committed { rows: 3 });
    assert_eq!(
        rows(&store, "SELECT v FROM kv ORDER BY k"),
        [[text("A")], [text("b")], [text("d")]]
    );
    let s = store.tx_stats();
    assert_eq!((s.begun, s.committed, s.open), (2, 1, 0));
    assert_eq!(
        rows(
            &store,
            "SELECT begun, committed, rolled_back, open FROM tablix_transaction_stats"
        ),
        [[
            Value::Integer(2),
            Value::Integer(1),
            Value::Integer(1),
            Value::Integer(0)
        ]]
    );
}

#[test]
fn the_first_committer_wins_and_the_second_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |_| {});
    let root = Principal::root();
    let t1 = store.transaction(&root, TxKind::ReadWrite).unwrap();
    let t2 = store.transaction(&root, TxKind::ReadWrite).unwrap();
    t1.execute("UPDATE kv SET v = 'one' WHERE k = 1").unwrap();
    // T2 changes another column of the same row, and another row.
    t2.execute("UPDATE kv SET w = 'two' WHERE k = 1").unwrap();
    t2.execute("UPDATE kv SET v = 'two' WHERE k = 2").unwrap();
    assert!(t1.commit().unwrap().is_committed());
    match t2.commit().unwrap() {
        TxOutcome::Conflict(m) => assert!(
            m.contains("kv") && m.contains("run the transaction again"),
            "{m}"
        ),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        rows(&store, "SELECT v, w FROM kv WHERE k IN (1, 2) ORDER BY k"),
        [[text("one"), text("x")], [text("b"), text("y")]]
    );
    // A plain write is a committer too.
    let t3 = store.transaction(&root, TxKind::ReadWrite).unwrap();
    t3.execute("DELETE FROM kv WHERE k = 2").unwrap();
    store
        .apply_sql(stamp(2), sql(&["UPDATE kv SET w = 'plain' WHERE k = 2"]))
        .unwrap();
    assert!(matches!(t3.commit().unwrap(), TxOutcome::Conflict(_)));
    assert_eq!(store.tx_stats().conflicts, 2);
}

#[test]
fn rollback_leaves_nothing_and_a_dropped_handle_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |_| {});
    let root = Principal::root();
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("DELETE FROM kv").unwrap();
    tx.rollback().unwrap();
    {
        let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
        tx.execute("DELETE FROM kv").unwrap();
    }
    assert_eq!(
        rows(&store, "SELECT count(*) FROM kv"),
        [[Value::Integer(3)]]
    );
    let s = store.tx_stats();
    assert_eq!((s.rolled_back, s.open), (2, 0));
}

#[test]
fn read_only_transactions_keep_their_snapshot_and_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |_| {});
    let root = Principal::root();
    let ro = store.transaction(&root, TxKind::ReadOnly).unwrap();
    assert_eq!(
        value(&ro.execute("SELECT count(*) FROM kv").unwrap()),
        [[Value::Integer(3)]]
    );
    store.apply_sql(stamp(2), sql(&["DELETE FROM kv"])).unwrap();
    assert_eq!(
        value(&ro.execute("SELECT count(*) FROM kv").unwrap()),
        [[Value::Integer(3)]]
    );
    assert!(
        ro.execute("INSERT INTO kv VALUES (9, 'n', 'n')")
            .unwrap()
            .is_error()
    );
    assert!(ro.commit().unwrap().is_committed());
    assert_eq!(
        rows(&store, "SELECT count(*) FROM kv"),
        [[Value::Integer(0)]]
    );
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |c| {
        c.max_transactions = 2;
        c.tx_max_bytes = 8 * 4096;
    });
    let root = Principal::root();
    let limits = store.config().read_limits();
    let mut sink = Collect::new(limits.max_result_bytes);
    // No such transaction.
    let e = store
        .run_in(
            "feed",
            &root,
            &[Statement::new("SELECT 1")],
            &limits,
            &mut sink,
        )
        .unwrap_err();
    assert!(
        matches!(e, StoreError::NoTransaction(ref m) if m.contains("no open transaction")),
        "{e}"
    );
    // Another user's transaction does not exist for them.
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    let e = store
        .run_in(
            tx.id(),
            &alice(),
            &[Statement::new("SELECT 1")],
            &limits,
            &mut sink,
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::NoTransaction(_)), "{e}");
    assert!(store.commit(tx.id(), &alice()).is_err());
    assert!(store.rollback(tx.id(), &alice()).is_err());
    // Too many open.
    let other = store.begin(&root, TxKind::ReadOnly).unwrap();
    let e = store.begin(&root, TxKind::ReadWrite).unwrap_err();
    assert!(e.to_string().contains("--max-transactions"), "{e}");
    store.rollback(&other, &root).unwrap();
    // Schema changes and transaction control are refused inside; the
    // transaction goes on.
    match tx.execute("CREATE TABLE t2(x)").unwrap() {
        StatementResult::Error(m) => assert!(
            m.contains("not allowed inside an interactive transaction"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(tx.execute("BEGIN").unwrap().is_error());
    // Past the size bound: the statement fails, the transaction goes on.
    match tx
        .execute("UPDATE kv SET v = hex(zeroblob(3000)) || k")
        .unwrap()
    {
        StatementResult::Error(m) => assert!(m.contains("--tx-max-bytes"), "{m}"),
        StatementResult::Executed { .. } => {
            // Three rows fit: grow it until they do not.
            let r = tx
                .execute("WITH RECURSIVE n(i) AS (SELECT 10 UNION ALL SELECT i + 1 FROM n WHERE i < 400) INSERT INTO kv SELECT i, hex(zeroblob(500)), '' FROM n")
                .unwrap();
            assert!(
                matches!(r, StatementResult::Error(ref m) if m.contains("--tx-max-bytes")),
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(store.tx_stats().too_large >= 1);
    tx.execute("UPDATE kv SET v = 'small' WHERE k = 1").unwrap();
    assert!(tx.commit().unwrap().is_committed());
    assert_eq!(
        rows(&store, "SELECT v FROM kv WHERE k = 1"),
        [[text("small")]]
    );
    assert_eq!(
        rows(
            &store,
            "SELECT count(*) FROM sqlite_schema WHERE name = 't2'"
        ),
        [[Value::Integer(0)]]
    );
}

#[test]
fn idle_transactions_are_rolled_back_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |c| {
        c.tx_idle_timeout = std::time::Duration::from_millis(300);
    });
    let root = Principal::root();
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("DELETE FROM kv").unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.tx_stats().open > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let e = tx.execute("SELECT 1").unwrap_err();
    assert!(e.to_string().contains("--tx-idle-timeout"), "{e}");
    assert!(tx.commit().is_err());
    assert_eq!(store.tx_stats().idle_timeouts, 1);
    assert_eq!(
        rows(&store, "SELECT count(*) FROM kv"),
        [[Value::Integer(3)]]
    );
}

#[test]
fn foreign_keys_hold_across_commits_and_their_actions_and_triggers_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |_| {});
    store
        .apply_sql(
            stamp(2),
            sql(&[
                "CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT)",
                "CREATE TABLE child(id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parent(id), note TEXT)",
                "CREATE TABLE log(what TEXT)",
                "CREATE TRIGGER logged AFTER INSERT ON child BEGIN INSERT INTO log VALUES ('child ' || new.id); END",
                "INSERT INTO parent VALUES (1, 'one'), (2, 'two')",
                "INSERT INTO child VALUES (10, 1, 'a')",
            ]),
        )
        .unwrap();
    let root = Principal::root();
    // The changeset lists the child table first (touched first), its new
    // row naming a parent inserted after it: applied all the same.
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("UPDATE child SET note = 'b' WHERE id = 10")
        .unwrap();
    tx.execute("INSERT INTO parent VALUES (3, 'three')")
        .unwrap();
    tx.execute("INSERT INTO child VALUES (11, 3, 'c')").unwrap();
    assert!(tx.commit().unwrap().is_committed());
    assert_eq!(
        rows(&store, "SELECT what FROM log ORDER BY what"),
        [[text("child 10")], [text("child 11")]],
        "the trigger ran once, in the transaction"
    );
    // One deletes a parent, the other gives it a child: the second to
    // commit breaks the foreign key, a conflict.
    let t1 = store.transaction(&root, TxKind::ReadWrite).unwrap();
    let t2 = store.transaction(&root, TxKind::ReadWrite).unwrap();
    t1.execute("DELETE FROM parent WHERE id = 2").unwrap();
    t2.execute("INSERT INTO child VALUES (12, 2, 'd')").unwrap();
    assert!(t1.commit().unwrap().is_committed());
    match t2.commit().unwrap() {
        TxOutcome::Conflict(m) => assert!(m.contains("foreign key"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rows(&store, "SELECT count(*) FROM child WHERE id = 12"),
        [[Value::Integer(0)]]
    );
    // With a cascading key, the cascade's deletions travel in the
    // changeset and do not run twice.
    store
        .apply_sql(
            stamp(3),
            sql(&[
                "CREATE TABLE owner(id INTEGER PRIMARY KEY)",
                "CREATE TABLE owned(id INTEGER PRIMARY KEY, owner INTEGER REFERENCES owner(id) ON DELETE CASCADE)",
                "INSERT INTO owner VALUES (1), (2)",
                "INSERT INTO owned VALUES (1, 1), (2, 1), (3, 2)",
            ]),
        )
        .unwrap();
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("DELETE FROM owner WHERE id = 1").unwrap();
    assert_eq!(
        value(&tx.execute("SELECT count(*) FROM owned").unwrap()),
        [[Value::Integer(1)]]
    );
    assert_eq!(tx.commit().unwrap(), TxOutcome::Committed { rows: 3 });
    assert_eq!(rows(&store, "SELECT id FROM owned"), [[Value::Integer(3)]]);
    // And a row inserted by another meanwhile keeps the parent's delete
    // from passing unseen: the cascade does not run again at apply, so
    // the foreign key conflicts.
    let tx = store.transaction(&root, TxKind::ReadWrite).unwrap();
    tx.execute("DELETE FROM owner WHERE id = 2").unwrap();
    store
        .apply_sql(stamp(4), sql(&["INSERT INTO owned VALUES (4, 2)"]))
        .unwrap();
    assert!(matches!(tx.commit().unwrap(), TxOutcome::Conflict(_)));
    assert_eq!(
        rows(&store, "SELECT count(*) FROM owned"),
        [[Value::Integer(2)]]
    );
}

#[test]
fn as_many_transactions_as_may_be_open_at_once_reuse_their_connections() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), |c| c.max_transactions = 12);
    let root = Principal::root();
    let mut after_each_round = Vec::new();
    for round in 0..3 {
        let writers: Vec<_> = (0..10)
            .map(|_| store.transaction(&root, TxKind::ReadWrite).unwrap())
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|_| store.transaction(&root, TxKind::ReadOnly).unwrap())
            .collect();
        for (i, tx) in writers.into_iter().enumerate() {
            tx.execute(&format!("UPDATE kv SET w = 'r{round}t{i}' WHERE k = 1"))
                .unwrap();
            tx.commit().unwrap();
        }
        for tx in readers {
            tx.execute("SELECT count(*) FROM kv").unwrap();
            tx.commit().unwrap();
        }
        after_each_round.push(store.tx_stats().connections_opened);
    }
    // Ten views, the ten pins under them and two readers, opened once.
    assert_eq!(after_each_round, [22, 22, 22]);
    let opened: i64 = match &rows(
        &store,
        "SELECT connections_opened FROM tablix_transaction_stats",
    )[0][0]
    {
        Value::Integer(n) => *n,
        other => panic!("connections_opened is {other:?}"),
    };
    assert_eq!(opened, 22);
}
