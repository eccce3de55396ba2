//! A store whose log replication keeps: entries handed to it are applied
//! once, the last applied entry is recorded with them, and after a power
//! loss the state names exactly what it holds, never less than a
//! snapshot taken of it, and an installed snapshot stays installed.

use tablix_store::{
    EntryPayload, EntryReply, LogEntry, LogId, LogKeeper, Params, Principal, ReplicatedCommand,
    SqlCommand, Stamped, Statement, Store, StoreError, Value,
};

use crate::{Durability, faulty_store, stamp};

fn entry(index: u64, payload: EntryPayload) -> LogEntry {
    LogEntry {
        id: LogId { term: 1, index },
        payload,
    }
}

/// Entry `index`: insert `index` into `p`.
fn insert_entry(index: u64) -> LogEntry {
    entry(
        index,
        EntryPayload::Command(Stamped::new(
            stamp(index as i64),
            ReplicatedCommand::Sql(SqlCommand {
                statements: vec![Statement::with_params(
                    "INSERT INTO p(v) VALUES (?)",
                    Params::Positional(vec![Value::Integer(index as i64)]),
                )],
                transaction: false,
                principal: Principal::root(),
            }),
        )),
    )
}

fn create_entry(index: u64) -> LogEntry {
    entry(
        index,
        EntryPayload::Command(Stamped::new(
            stamp(0),
            ReplicatedCommand::Sql(crate::sql(&["CREATE TABLE p(id INTEGER PRIMARY KEY, v)"])),
        )),
    )
}

/// Opens the replicated store at `data` again, after the machine died.
fn reopen(data: &std::path::Path) -> Store {
    let mut config = tablix_store::StoreConfig::new(data);
    config.log_keeper = LogKeeper::Replication;
    Store::open(config).unwrap()
}

/// The values in `p`, in order.
fn values(store: &Store) -> Vec<i64> {
    let out = store
        .query(
            &Principal::root(),
            &[Statement::new("SELECT v FROM p ORDER BY v")],
        )
        .unwrap();
    match &out[0].result {
        tablix_store::StatementResult::Rows(r) => r
            .values
            .iter()
            .map(|row| match row[0] {
                Value::Integer(v) => v,
                ref other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn after_a_power_loss_the_state_names_exactly_the_entries_it_holds_and_no_fewer_than_its_snapshot()
{
    for cut in [0u64, 7, 30] {
        let (fault, dir, mut config) = faulty_store(Durability::Sync);
        config.log_keeper = LogKeeper::Replication;
        let snapshot = dir.path().join("snapshot.db");
        let store = Store::open(config.clone()).unwrap();
        let refused = store.apply_sql(stamp(1), crate::sql(&["CREATE TABLE q(x)"]));
        assert!(
            matches!(refused, Err(StoreError::NotProposer)),
            "{refused:?}"
        );
        let mut entries = vec![create_entry(1), entry(2, EntryPayload::Blank)];
        entries.extend((3..=40).map(insert_entry));
        let (first, rest) = entries.split_at(2 + cut as usize);
        let replies = store.apply_entries(first.to_vec()).wait().unwrap();
        assert_eq!(replies.len(), first.len());
        assert_eq!(replies[1], EntryReply::Recorded);
        let at_snapshot = store.snapshot_to(&snapshot).unwrap().applied.unwrap();
        assert_eq!(at_snapshot.index, 2 + cut);
        store.apply_entries(rest.to_vec()).wait().unwrap();
        fault.freeze();
        drop(store);
        fault.power_loss().unwrap();

        let store = reopen(dir.path());
        let applied = store.applied_state().unwrap().applied.unwrap();
        assert!(
            applied.index >= at_snapshot.index,
            "cut {cut}: the state went back to entry {} behind its snapshot at {}",
            applied.index,
            at_snapshot.index
        );
        let expected: Vec<i64> = (3..=applied.index as i64).collect();
        assert_eq!(values(&store), expected, "cut {cut}: applied {applied:?}");
        // What the state lacks comes again, and only that.
        let next: Vec<LogEntry> = (applied.index + 1..=40).map(insert_entry).collect();
        store.apply_entries(next).wait().unwrap();
        assert_eq!(values(&store), (3..=40).collect::<Vec<i64>>());
    }
}

#[test]
fn an_installed_snapshot_survives_a_power_loss_and_entries_continue_after_it() {
    // The snapshot, from a store of its own.
    let source_dir = tempfile::tempdir().unwrap();
    let snapshot = source_dir.path().join("snapshot.db");
    {
        let mut config = tablix_store::StoreConfig::new(source_dir.path().join("data"));
        config.log_keeper = LogKeeper::Replication;
        let source = Store::open(config).unwrap();
        let mut entries = vec![create_entry(1)];
        entries.extend((2..=10).map(insert_entry));
        source.apply_entries(entries).wait().unwrap();
        assert_eq!(
            source.snapshot_to(&snapshot).unwrap().applied,
            Some(LogId { term: 1, index: 10 })
        );
    }
    let (fault, dir, mut config) = faulty_store(Durability::Sync);
    config.log_keeper = LogKeeper::Replication;
    let store = Store::open(config.clone()).unwrap();
    let installed = store.install_snapshot(&snapshot).wait().unwrap();
    assert_eq!(installed.applied, Some(LogId { term: 1, index: 10 }));
    fault.freeze();
    drop(store);
    fault.power_loss().unwrap();
    let store = reopen(dir.path());
    assert_eq!(
        store.applied_state().unwrap().applied,
        Some(LogId { term: 1, index: 10 })
    );
    assert_eq!(values(&store), (2..=10).collect::<Vec<i64>>());
    // An entry the snapshot holds is refused; the next one applies.
    assert!(store.apply_entries(vec![insert_entry(10)]).wait().is_err());
    store.apply_entries(vec![insert_entry(11)]).wait().unwrap();
    assert_eq!(values(&store), (2..=11).collect::<Vec<i64>>());
}
