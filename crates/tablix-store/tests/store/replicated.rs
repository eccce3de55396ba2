//! A store whose log replication keeps: entries handed to it are applied
//! once, the last applied entry is recorded with them, and after a power
//! loss the state names exactly what it holds, never less than a
//! snapshot taken of it, and an installed snapshot stays installed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tablix_fs::{FsOp, FsReply, ROOT};
use tablix_store::{
    CommandReply, EntryPayload, EntryReply, LogEntry, LogId, LogKeeper, Params, Principal,
    ReplicatedCommand, SqlCommand, Stamped, Statement, Store, StoreError, Value, WritePoint,
    WriteProbe,
};

use crate::{Durability, faulty_store, stamp};

fn entry(index: u64, payload: EntryPayload) -> LogEntry {
    LogEntry {
        id: LogId { term: 1, index },
        payload,
    }
}

/// Inserts `v` into `p`.
fn insert(v: i64) -> Stamped<ReplicatedCommand> {
    Stamped::new(
        stamp(v),
        ReplicatedCommand::Sql(SqlCommand {
            statements: vec![Statement::with_params(
                "INSERT INTO p(v) VALUES (?)",
                Params::Positional(vec![Value::Integer(v)]),
            )],
            transaction: false,
            principal: Principal::root(),
        }),
    )
}

/// Entry `index`: insert `index` into `p`.
fn insert_entry(index: u64) -> LogEntry {
    entry(index, EntryPayload::Commands(vec![insert(index as i64)]))
}

fn create_entry(index: u64) -> LogEntry {
    entry(
        index,
        EntryPayload::Commands(vec![Stamped::new(
            stamp(-1000),
            ReplicatedCommand::Sql(crate::sql(&["CREATE TABLE p(id INTEGER PRIMARY KEY, v)"])),
        )]),
    )
}

/// Mounts the file system, as stamp `n`.
fn mount_command(n: i64) -> Stamped<ReplicatedCommand> {
    Stamped::new(
        stamp(n),
        ReplicatedCommand::Fs(FsOp::Mount { uid: 0, gid: 0 }),
    )
}

/// Makes the regular file `name` in the root, as stamp `n`.
fn make_file(n: i64, name: &[u8]) -> Stamped<ReplicatedCommand> {
    Stamped::new(
        stamp(n),
        ReplicatedCommand::Fs(FsOp::MakeNode {
            parent: ROOT,
            name: name.to_vec(),
            mode: libc::S_IFREG | 0o644,
            rdev: 0,
            uid: 0,
            gid: 0,
        }),
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

#[test]
fn an_entry_of_several_commands_answers_each_in_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = tablix_store::StoreConfig::new(dir.path());
    config.log_keeper = LogKeeper::Replication;
    let store = Store::open(config).unwrap();
    let mount = mount_command(-1);
    let file = make_file(-2, b"f");
    let bad = Stamped::new(
        stamp(-3),
        ReplicatedCommand::Sql(crate::sql(&["INSERT INTO nowhere VALUES (1)"])),
    );
    let entries = vec![
        create_entry(1),
        entry(
            2,
            EntryPayload::Commands(vec![insert(1), mount, file, bad, insert(2)]),
        ),
        entry(3, EntryPayload::Commands(Vec::new())),
    ];
    let replies = store.apply_entries(entries).wait().unwrap();
    assert_eq!(replies.len(), 3);
    let EntryReply::Commands(batch) = &replies[1] else {
        panic!("{:?}", replies[1]);
    };
    assert_eq!(batch.len(), 5, "{batch:?}");
    assert!(
        matches!(batch[0], CommandReply::Sql(ref r) if !r.rolled_back),
        "{batch:?}"
    );
    assert!(matches!(batch[1], CommandReply::Fs(Ok(_))), "{batch:?}");
    assert!(
        matches!(batch[2], CommandReply::Fs(Ok(FsReply::Attr(_)))),
        "{batch:?}"
    );
    assert!(
        matches!(batch[3], CommandReply::Sql(ref r) if r.statements[0].result.is_error()),
        "{batch:?}"
    );
    assert!(matches!(batch[4], CommandReply::Sql(_)), "{batch:?}");
    assert_eq!(replies[2], EntryReply::Recorded);
    assert_eq!(values(&store), vec![1, 2]);
    assert_eq!(
        store.applied_state().unwrap().applied,
        Some(LogId { term: 1, index: 3 })
    );
}

#[test]
fn a_power_loss_inside_an_entry_of_many_commands_applies_each_command_once() {
    // Entry 2 holds more Commands than one transaction applies: its
    // first part commits with entry 1, and the machine dies in the group
    // commit of the rest.
    const MANY: i64 = 300;
    let (fault, dir, mut config) = faulty_store(Durability::Sync);
    let fault = Arc::new(fault);
    config.log_keeper = LogKeeper::Replication;
    // A checkpoint after every commit: each group's state is durable (a
    // replicated store's state otherwise lags its log, which has it all).
    config.wal_limit = 8192;
    let groups = Arc::new(AtomicUsize::new(0));
    config.write_probe = {
        let fault = Arc::clone(&fault);
        let groups = Arc::clone(&groups);
        WriteProbe::new(move |p| {
            if p == WritePoint::Applied && groups.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                fault.freeze();
            }
        })
    };
    let many = || entry(2, EntryPayload::Commands((0..MANY).map(insert).collect()));
    let store = Store::open(config).unwrap();
    store
        .apply_entries(vec![create_entry(1), many()])
        .wait()
        .unwrap();
    assert_eq!(
        groups.load(Ordering::SeqCst),
        2,
        "entries 1 and 2 took two groups"
    );
    drop(store);
    fault.power_loss().unwrap();

    let store = reopen(dir.path());
    let held = values(&store);
    assert!(
        !held.is_empty() && (held.len() as i64) < MANY,
        "the first group of entry 2 is durable, the second is not: {} values",
        held.len()
    );
    assert_eq!(held, (0..held.len() as i64).collect::<Vec<i64>>());
    assert_eq!(
        store.applied_state().unwrap().applied,
        Some(LogId { term: 1, index: 1 }),
        "entry 2 is not wholly applied"
    );
    // Replication hands entry 2 over again: what the state holds of it is
    // not applied twice, the rest is applied.
    let replies = store.apply_entries(vec![many()]).wait().unwrap();
    let EntryReply::Commands(batch) = &replies[0] else {
        panic!("{:?}", replies[0]);
    };
    let before = batch
        .iter()
        .filter(|r| **r == CommandReply::AppliedBefore)
        .count();
    assert_eq!(before, held.len(), "{batch:?}");
    assert_eq!(batch.len(), MANY as usize);
    assert_eq!(values(&store), (0..MANY).collect::<Vec<i64>>());
    assert_eq!(
        store.applied_state().unwrap().applied,
        Some(LogId { term: 1, index: 2 })
    );
    drop(store);
    // And the record of the part is gone with the entry's completion.
    let store = reopen(dir.path());
    store
        .apply_entries(vec![entry(3, EntryPayload::Commands(vec![insert(MANY)]))])
        .wait()
        .unwrap();
    assert_eq!(values(&store), (0..=MANY).collect::<Vec<i64>>());
}

#[test]
fn a_proposal_sent_again_in_a_later_entry_is_not_applied_twice() {
    // A deposed leader had replicated entry 2; the forwarder, told "not
    // leader", sent the same proposal (same stamp) to the new leader,
    // which logged it again as entry 4.
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let mut config = tablix_store::StoreConfig::new(dir.path());
        config.log_keeper = LogKeeper::Replication;
        Store::open(config).unwrap()
    };
    let store = open();
    let replies = store
        .apply_entries(vec![
            create_entry(1),
            insert_entry(2),
            insert_entry(3),
            entry(4, EntryPayload::Commands(vec![insert(2), insert(4)])),
        ])
        .wait()
        .unwrap();
    let EntryReply::Commands(last) = &replies[3] else {
        panic!("{:?}", replies[3]);
    };
    assert_eq!(last[0], CommandReply::Repeated, "{last:?}");
    assert!(matches!(last[1], CommandReply::Sql(_)), "{last:?}");
    assert_eq!(values(&store), vec![2, 3, 4]);
    drop(store);
    // Remembered across a restart, and within one entry too.
    let store = open();
    let replies = store
        .apply_entries(vec![entry(
            5,
            EntryPayload::Commands(vec![insert(3), insert(5), insert(5)]),
        )])
        .wait()
        .unwrap();
    assert_eq!(
        replies[0],
        EntryReply::Commands(vec![
            CommandReply::Repeated,
            match &replies[0] {
                EntryReply::Commands(v) => v[1].clone(),
                other => panic!("{other:?}"),
            },
            CommandReply::Repeated,
        ])
    );
    assert_eq!(values(&store), vec![2, 3, 4, 5]);
    assert_eq!(
        store.applied_state().unwrap().applied,
        Some(LogId { term: 1, index: 5 })
    );
}

#[test]
fn a_state_of_the_stores_own_log_is_adopted_once_as_a_clusters_first_and_entries_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    // An empty state adopts nothing.
    assert!(reopen(dir.path()).adopt_membership(b"m").is_err());
    {
        let store = Store::open(tablix_store::StoreConfig::new(dir.path())).unwrap();
        store
            .apply_sql(
                stamp(1),
                crate::sql(&["CREATE TABLE p(id INTEGER PRIMARY KEY, v)"]),
            )
            .unwrap();
        store.close().unwrap();
    }
    let store = reopen(dir.path());
    let own = store.applied_state().unwrap();
    assert_eq!(own.membership, None);
    let last = own.applied.expect("the own log's entries");
    assert_eq!(store.adopt_membership(b"m").unwrap(), last);
    let adopted = store.applied_state().unwrap();
    assert_eq!(
        (adopted.applied, adopted.membership.as_deref()),
        (Some(last), Some(&b"m"[..]))
    );
    // A cluster's state is never adopted again.
    assert!(store.adopt_membership(b"n").is_err());
    assert_eq!(
        store.applied_state().unwrap().membership.as_deref(),
        Some(&b"m"[..])
    );
    store
        .apply_entries(vec![insert_entry(last.index + 1)])
        .wait()
        .unwrap();
    assert_eq!(values(&store), vec![last.index as i64 + 1]);
}

#[test]
fn the_watcher_is_told_of_applied_file_changes_but_those_its_mount_claims() {
    let dir = tempfile::tempdir().unwrap();
    let store = reopen(dir.path());
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let theirs = stamp(-2).seed;
    // The mount claims every Command but `theirs` (made elsewhere).
    store.watch_fs(tx, move |seed| seed != theirs);
    store
        .apply_entries(vec![entry(
            1,
            EntryPayload::Commands(vec![
                mount_command(-1),
                make_file(-2, b"theirs"),
                make_file(-3, b"ours"),
            ]),
        )])
        .wait()
        .unwrap();
    let told: Vec<u64> = rx.try_iter().map(|n| n.seed).collect();
    assert_eq!(told, vec![theirs]);
}

#[test]
fn a_snapshot_copied_in_steps_while_entries_apply_holds_one_committed_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = tablix_store::StoreConfig::new(dir.path().join("data"));
    config.log_keeper = LogKeeper::Replication;
    let store = Arc::new(Store::open(config).unwrap());
    // Some megabytes, so that the copy takes many steps.
    let fill = entry(
        2,
        EntryPayload::Commands(vec![Stamped::new(
            stamp(-2000),
            ReplicatedCommand::Sql(crate::sql(&[
                "CREATE TABLE fill(b)",
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000) \
                 INSERT INTO fill SELECT randomblob(4000) FROM c",
            ])),
        )]),
    );
    store
        .apply_entries(vec![create_entry(1), fill])
        .wait()
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut index = 3;
            while !stop.load(Ordering::Relaxed) {
                store
                    .apply_entries(vec![insert_entry(index)])
                    .wait()
                    .unwrap();
                index += 1;
            }
            index - 1
        })
    };
    while store.applied_state().unwrap().applied.unwrap().index < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut states = Vec::new();
    for round in 0..3 {
        let path = dir.path().join(format!("snapshot-{round}.db"));
        let held = store.snapshot_to(&path).unwrap().applied.unwrap().index;
        let copy = rusqlite::Connection::open(&path).unwrap();
        let rows: Vec<i64> = copy
            .prepare("SELECT v FROM p ORDER BY v")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let filled: i64 = copy
            .query_row("SELECT count(*) FROM fill", [], |r| r.get(0))
            .unwrap();
        assert_eq!(filled, 4000, "round {round}");
        assert_eq!(
            rows,
            (3..=held as i64).collect::<Vec<i64>>(),
            "round {round}: the snapshot names entry {held} but holds other rows"
        );
        states.push(held);
    }
    stop.store(true, Ordering::Relaxed);
    let last = writer.join().unwrap();
    assert!(
        states.iter().all(|&held| held >= 10 && held < last),
        "the snapshots were not taken while entries were applied: {states:?}, last {last}"
    );
}

#[test]
fn a_state_applied_by_another_version_is_refused_to_a_cluster_and_taken_by_a_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let config = |keeper| {
        let mut c = tablix_store::StoreConfig::new(dir.path());
        c.log_keeper = keeper;
        c
    };
    let store = Store::open(config(LogKeeper::Replication)).unwrap();
    store.apply_entries(vec![create_entry(1)]).wait().unwrap();
    drop(store);
    let set_version = |v: u32| {
        let db = rusqlite::Connection::open(dir.path().join("tablix.db")).unwrap();
        db.execute(
            "UPDATE tablix_meta SET value = ?1 WHERE key = 'apply_version'",
            [v],
        )
        .unwrap()
    };
    let other = tablix_store::APPLY_VERSION + 1;
    assert_eq!(set_version(other), 1, "the state recorded no apply version");
    let refused = match Store::open(config(LogKeeper::Replication)) {
        Ok(_) => panic!("a cluster's node opened a state of apply version {other}"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains(&format!("version {other}"))
            && refused.contains(&format!("version {}", tablix_store::APPLY_VERSION)),
        "{refused}"
    );
    // A single node applies its own log: the build that opens it takes
    // the state, and records its own version.
    let store = Store::open(config(LogKeeper::Store)).unwrap();
    drop(store);
    let recorded: u32 = rusqlite::Connection::open(dir.path().join("tablix.db"))
        .unwrap()
        .query_row(
            "SELECT value FROM tablix_meta WHERE key = 'apply_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(recorded, tablix_store::APPLY_VERSION);
    Store::open(config(LogKeeper::Replication)).unwrap();
}
