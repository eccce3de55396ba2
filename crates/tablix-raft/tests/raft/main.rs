//! The command log and the store as openraft's storage, checked by
//! openraft's own storage test suite, and end to end: committed entries
//! change the store, a snapshot carries the whole state to another node,
//! and both survive reopening.
#![allow(clippy::unwrap_used)]

mod cluster;
mod faults;
mod jepsen;
mod network;
mod trust;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{
    RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogId, StorageError,
    StoredMembership, Vote,
};
use tablix_log::{Log, LogConfig};
use tablix_raft::{LogStore, Node, NodeId, SingleNode, StateMachine, TypeConfig};
use tablix_store::{
    CommandReply, EntryReply, LogKeeper, Principal, ReplicatedCommand, SqlCommand, Stamp, Stamped,
    Statement, StatementResult, Store, StoreConfig, StoreError, Value,
};

/// A store whose log replication keeps, in `dir/data`.
fn open_store(dir: &Path) -> Arc<Store> {
    let mut config = StoreConfig::new(dir.join("data"));
    config.log_keeper = LogKeeper::Replication;
    Arc::new(Store::open(config).unwrap())
}

fn state_machine(dir: &Path) -> StateMachine {
    StateMachine::new(open_store(dir), dir.join("snapshots")).unwrap()
}

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachine, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().unwrap();
        let small = LogConfig {
            segment_bytes: 4096,
            ..LogConfig::default()
        };
        let (log, _) = Log::open(&dir.path().join("log"), small).unwrap();
        let sm = state_machine(dir.path());
        Ok((dir, LogStore::new(log), sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_command_log_and_the_store() {
    Suite::test_all(OnDisk).unwrap();
}

fn id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn members(term: u64, index: u64, voters: &[NodeId]) -> Entry<TypeConfig> {
    let nodes: BTreeMap<NodeId, Node> = voters
        .iter()
        .map(|n| (*n, Node::new(format!("127.0.0.1:{}", 4000 + n))))
        .collect();
    let set: BTreeSet<NodeId> = voters.iter().copied().collect();
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![set], nodes)),
    }
}

/// The reply of an entry's one Command.
fn only(reply: &EntryReply) -> &CommandReply {
    match reply {
        EntryReply::Commands(v) if v.len() == 1 => &v[0],
        other => panic!("{other:?}"),
    }
}

fn command(term: u64, index: u64, command: ReplicatedCommand) -> Entry<TypeConfig> {
    Entry {
        log_id: id(term, index),
        payload: EntryPayload::Normal(vec![Stamped::new(
            Stamp {
                unix_nanos: 1_700_000_000_000_000_000 + index as i64,
                seed: index,
            },
            command,
        )]),
    }
}

fn sql(statements: &[&str]) -> ReplicatedCommand {
    ReplicatedCommand::Sql(SqlCommand {
        statements: statements.iter().map(|s| Statement::new(*s)).collect(),
        transaction: false,
        principal: Principal::root(),
    })
}

/// Makes regular file `name` in the root directory, owned by root.
fn make_file(name: &str) -> ReplicatedCommand {
    ReplicatedCommand::Fs(tablix_fs::FsOp::MakeNode {
        parent: 1,
        name: name.into(),
        mode: libc::S_IFREG | 0o644,
        rdev: 0,
        uid: 0,
        gid: 0,
    })
}

/// A cluster of one in `dir`, applying to `store`.
async fn single_node(dir: &Path, store: &Arc<Store>) -> SingleNode {
    single_node_with(dir, store, tablix_raft::ProposerConfig::default()).await
}

/// [`single_node`], batching proposals as `proposer` says.
async fn single_node_with(
    dir: &Path,
    store: &Arc<Store>,
    proposer: tablix_raft::ProposerConfig,
) -> SingleNode {
    SingleNode::start_with(
        &dir.join("raft-log"),
        &dir.join("snapshots"),
        Arc::clone(store),
        proposer,
    )
    .await
    .unwrap()
}

fn rows(store: &Store, q: &str) -> Vec<Vec<Value>> {
    match &store
        .query(&Principal::root(), &[Statement::new(q)])
        .unwrap()[0]
        .result
    {
        StatementResult::Rows(r) => r.values.clone(),
        other => panic!("{q}: {other:?}"),
    }
}

/// The contents of file `name` in the root directory of `store`'s file
/// system.
fn file(store: &Store, name: &str) -> Vec<u8> {
    store
        .read(|c| {
            let attr = tablix_fs::read::lookup(c, 1, name.as_bytes()).unwrap();
            tablix_fs::read::read(c, attr.ino, 0, 1 << 20).unwrap()
        })
        .unwrap()
}

/// A runtime on the test's own thread, for storage calls alone.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// The raft log store over the command log in `dir`.
fn open_log_store(dir: &std::path::Path) -> LogStore<TypeConfig> {
    let (log, _) = Log::open(dir, LogConfig::default()).unwrap();
    LogStore::<TypeConfig>::new(log)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn committed_entries_change_the_store_and_a_snapshot_carries_all_of_it_to_another_node() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    runtime().block_on(async {
        let mut a = state_machine(a_dir.path());
        let replies = a
            .apply([
                blank(1, 0),
                members(1, 1, &[1, 2, 3]),
                command(
                    1,
                    2,
                    sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]),
                ),
                command(1, 3, make_file("f")),
            ])
            .await
            .unwrap();
        assert_eq!(replies.len(), 4, "{replies:?}");
        assert_eq!(replies[..2], [EntryReply::Recorded, EntryReply::Recorded]);
        let ino = match only(&replies[3]) {
            CommandReply::Fs(Ok(tablix_fs::FsReply::Attr(attr))) => attr.ino,
            other => panic!("making a file answered {other:?}"),
        };
        let replies = a
            .apply([
                command(
                    2,
                    4,
                    ReplicatedCommand::Fs(tablix_fs::FsOp::Write {
                        ino,
                        offset: 0,
                        data: b"replicated bytes".to_vec(),
                        kill_suidgid: false,
                    }),
                ),
                // A statement that fails is the Command's result, the
                // same on every node; the entry is applied all the same.
                command(
                    2,
                    5,
                    sql(&["INSERT INTO t VALUES (2)", "INSERT INTO nowhere VALUES (1)"]),
                ),
            ])
            .await
            .unwrap();
        assert_eq!(
            only(&replies[0]),
            &CommandReply::Fs(Ok(tablix_fs::FsReply::Written(16)))
        );
        match only(&replies[1]) {
            CommandReply::Sql(reply) => assert!(reply.statements[1].result.is_error(), "{reply:?}"),
            other => panic!("{other:?}"),
        }
        let applied = a.applied_state().await.unwrap();
        assert_eq!(applied.0, Some(id(2, 5)));
        assert_eq!(applied.1.log_id(), &Some(id(1, 1)));
        assert_eq!(
            applied.1.voter_ids().collect::<Vec<_>>(),
            vec![1, 2, 3],
            "{applied:?}"
        );

        let built = a
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(built.meta.last_log_id, Some(id(2, 5)));
        assert_eq!(built.meta.last_membership, applied.1);
        // Writes go on after the snapshot; it keeps what it held.
        a.apply([command(2, 6, sql(&["INSERT INTO t VALUES (99)"]))])
            .await
            .unwrap();

        // Node B receives the bytes as a follower would, then installs.
        let mut b = state_machine(b_dir.path());
        let mut receiving = b.begin_receiving_snapshot().await.unwrap();
        let mut from = *built.snapshot;
        tokio::io::copy(&mut from, &mut *receiving).await.unwrap();
        b.install_snapshot(&built.meta, receiving).await.unwrap();
        assert_eq!(b.applied_state().await.unwrap(), applied);
        let current = b.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
        assert_eq!(
            rows(b.store(), "SELECT x FROM t ORDER BY x"),
            vec![vec![Value::Integer(1)], vec![Value::Integer(2)]]
        );
        assert_eq!(file(b.store(), "f"), b"replicated bytes");

        // B goes on from the snapshot's last entry, and never applies an
        // entry twice.
        b.apply([command(2, 6, sql(&["INSERT INTO t VALUES (3)"]))])
            .await
            .unwrap();
        assert_eq!(
            rows(b.store(), "SELECT count(*) FROM t"),
            vec![vec![Value::Integer(3)]]
        );
        let again = b
            .apply([command(2, 5, sql(&["INSERT INTO t VALUES (4)"]))])
            .await;
        assert!(again.is_err(), "an entry was applied twice: {again:?}");
        assert_eq!(
            rows(b.store(), "SELECT count(*) FROM t"),
            vec![vec![Value::Integer(3)]]
        );
        assert_eq!(b.applied_state().await.unwrap().0, Some(id(2, 6)));
    });
}

#[test]
fn a_replicated_store_refuses_proposals_and_keeps_what_it_applied_across_reopening() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let mut sm = state_machine(dir.path());
        let refused = sm
            .store()
            .submit_sql(
                Stamped::new(
                    Stamp {
                        unix_nanos: 0,
                        seed: 0,
                    },
                    SqlCommand {
                        statements: vec![Statement::new("CREATE TABLE t(x)")],
                        transaction: false,
                        principal: Principal::root(),
                    },
                ),
                sm.store().config().write_limits(),
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::NotProposer)),
            "{refused:?}"
        );
        sm.apply([
            members(1, 0, &[7]),
            command(
                1,
                1,
                sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]),
            ),
        ])
        .await
        .unwrap();
        let before = sm.applied_state().await.unwrap();
        assert_eq!(before.0, Some(id(1, 1)));
        let store = Arc::clone(sm.store());
        drop(sm);
        store.close().unwrap();
        drop(store);
        let mut sm = state_machine(dir.path());
        assert_eq!(sm.applied_state().await.unwrap(), before);
        assert_eq!(
            rows(sm.store(), "SELECT x FROM t"),
            vec![vec![Value::Integer(1)]]
        );
        // Nothing is applied twice: the next entry must follow.
        assert!(
            sm.apply([command(1, 1, sql(&["INSERT INTO t VALUES (1)"]))])
                .await
                .is_err()
        );
        assert_eq!(
            rows(sm.store(), "SELECT x FROM t"),
            vec![vec![Value::Integer(1)]]
        );
    });
}

#[test]
fn a_snapshot_that_is_not_a_tablix_database_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let mut sm = state_machine(dir.path());
        sm.apply([command(
            1,
            0,
            sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]),
        )])
        .await
        .unwrap();
        let before = sm.applied_state().await.unwrap();
        let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut *receiving, b"not a database at all")
            .await
            .unwrap();
        let meta = openraft::SnapshotMeta {
            last_log_id: Some(id(5, 50)),
            last_membership: StoredMembership::default(),
            snapshot_id: "bogus".into(),
        };
        let e = sm.install_snapshot(&meta, receiving).await.unwrap_err();
        assert!(e.to_string().contains("snapshot"), "{e}");
        assert_eq!(sm.applied_state().await.unwrap(), before);
        assert_eq!(
            rows(sm.store(), "SELECT x FROM t"),
            vec![vec![Value::Integer(1)]]
        );
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
    });
}

#[test]
fn entries_and_the_vote_read_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    current_thread().block_on(async {
        let mut store = open_log_store(dir.path());
        let entries: Vec<_> = (0..50).map(|i| blank(1 + i / 20, i)).collect();
        store.blocking_append(entries.clone()).await.unwrap();
        store.save_vote(&Vote::new(3, 7)).await.unwrap();
        store.purge(id(1, 9)).await.unwrap();
        drop(store);
        let mut store = open_log_store(dir.path());
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(*entries[49].get_log_id()));
        // Purging is logical: a reopened log may start earlier, not later.
        let first = state.last_purged_log_id.map_or(0, |p| p.index + 1);
        assert!(first <= 10, "{state:?}");
        let read = store.try_get_log_entries(10..50).await.unwrap();
        assert_eq!(read, entries[10..50].to_vec());
    });
}

#[test]
fn entries_read_back_from_memory_are_the_log_s_after_truncations_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    current_thread().block_on(async {
        let mut store = open_log_store(dir.path());
        let mut reader = store.get_log_reader().await;
        let first: Vec<_> = (0..30).map(|i| blank(1, i)).collect();
        store.blocking_append(first.clone()).await.unwrap();
        // A conflict from entry 20 on, as a new leader's append makes one.
        store.truncate(id(1, 20)).await.unwrap();
        let read = reader.try_get_log_entries(15..100).await.unwrap();
        assert_eq!(read, first[15..20].to_vec(), "truncated entries are gone");
        let second: Vec<_> = (20..25).map(|i| blank(2, i)).collect();
        store.blocking_append(second.clone()).await.unwrap();
        store.purge(id(1, 4)).await.unwrap();
        let read = reader.try_get_log_entries(5..7).await.unwrap();
        assert_eq!(read, first[5..7].to_vec());
        // An append that replaces entries itself (openraft may hand a
        // follower entries the log holds in another term).
        let third: Vec<_> = (23..27).map(|i| blank(3, i)).collect();
        store.blocking_append(third.clone()).await.unwrap();
        let mut want: Vec<_> = first[5..20].to_vec();
        want.extend_from_slice(&second[..3]);
        want.extend_from_slice(&third);
        let live = reader.try_get_log_entries(5..100).await.unwrap();
        assert_eq!(live, want);
        let bounded = reader.limited_get_log_entries(18, 27).await.unwrap();
        assert_eq!(bounded, want[13..].to_vec());
        drop((store, reader));
        let mut reopened = open_log_store(dir.path());
        let read = reopened.try_get_log_entries(5..100).await.unwrap();
        assert_eq!(read, want, "what memory served is what the log holds");
    });
}

#[test]
fn a_replication_request_carries_entries_up_to_a_mebibyte_and_at_least_one() {
    let dir = tempfile::tempdir().unwrap();
    current_thread().block_on(async {
        let mut store = open_log_store(dir.path());
        // Entries 0-9 small, 10-14 of 600 KiB each, 15 of 3 MiB.
        let mut entries: Vec<_> = (0..10).map(|i| blank(1, i)).collect();
        for i in 10..15 {
            entries.push(command(
                1,
                i,
                sql(&[&format!("SELECT '{}'", "x".repeat(600 << 10))]),
            ));
        }
        entries.push(command(
            1,
            15,
            sql(&[&format!("SELECT '{}'", "y".repeat(3 << 20))]),
        ));
        store.blocking_append(entries.clone()).await.unwrap();
        let mut reader = store.get_log_reader().await;
        // Small entries all go in one request.
        let read = reader.limited_get_log_entries(0, 10).await.unwrap();
        assert_eq!(read, entries[0..10].to_vec());
        // Large ones stop at the entry that passes 1 MiB.
        let read = reader.limited_get_log_entries(10, 16).await.unwrap();
        assert_eq!(read, entries[10..12].to_vec());
        // One larger than the bound still goes, alone.
        let read = reader.limited_get_log_entries(15, 16).await.unwrap();
        assert_eq!(read, entries[15..16].to_vec());
        // Reading for anything else is not bounded.
        let read = reader.try_get_log_entries(0..16).await.unwrap();
        assert_eq!(read, entries);
    });
}

#[test]
fn a_cluster_of_one_applies_proposals_once_and_goes_on_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let store = open_store(dir.path());
        let node = single_node(dir.path(), &store).await;
        let stamp = Stamp {
            unix_nanos: 1,
            seed: 1,
        };
        let reply = node
            .propose(Stamped::new(
                stamp,
                sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (random())"]),
            ))
            .await
            .unwrap();
        assert!(matches!(reply, CommandReply::Sql(_)), "{reply:?}");
        let before = rows(&store, "SELECT x FROM t");
        node.shutdown().await.unwrap();
        store.close().unwrap();
        drop(store);

        let store = open_store(dir.path());
        let node = single_node(dir.path(), &store).await;
        // Nothing applied twice at the restart, and the stamp's random()
        // stayed what it was.
        assert_eq!(rows(&store, "SELECT x FROM t"), before);
        // A proposal of its own stamp (one of the same seed would be taken
        // for the first sent again).
        let second = Stamp {
            unix_nanos: 2,
            seed: 2,
        };
        node.propose(Stamped::new(second, sql(&["INSERT INTO t VALUES (2)"])))
            .await
            .unwrap();
        assert_eq!(
            rows(&store, "SELECT count(*) FROM t"),
            vec![vec![Value::Integer(2)]]
        );
        node.shutdown().await.unwrap();
    });
}

#[test]
fn concurrent_proposals_share_entries_and_each_gets_its_own_reply() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let store = open_store(dir.path());
        let node = Arc::new(single_node(dir.path(), &store).await);
        let stamp = Stamp {
            unix_nanos: 1,
            seed: 1,
        };
        node.propose(Stamped::new(
            stamp,
            sql(&["CREATE TABLE t(id INTEGER PRIMARY KEY)"]),
        ))
        .await
        .unwrap();
        let before = store.applied_state().unwrap().applied.unwrap().index;
        const CLIENTS: i64 = 64;
        let mut clients = tokio::task::JoinSet::new();
        for n in 1..=CLIENTS {
            let node = Arc::clone(&node);
            clients.spawn(async move {
                let own = Stamp {
                    unix_nanos: 1,
                    seed: 1 + n as u64,
                };
                let reply = node
                    .propose(Stamped::new(
                        own,
                        sql(&[&format!("INSERT INTO t(id) VALUES ({n})")]),
                    ))
                    .await
                    .unwrap();
                (n, reply)
            });
        }
        while let Some(done) = clients.join_next().await {
            let (n, reply) = done.unwrap();
            match reply {
                CommandReply::Sql(r) => assert_eq!(
                    r.statements[0].result,
                    StatementResult::Executed {
                        last_insert_id: n,
                        rows_affected: 1
                    },
                    "client {n} got another's reply"
                ),
                other => panic!("client {n}: {other:?}"),
            }
        }
        let entries = store.applied_state().unwrap().applied.unwrap().index - before;
        assert!(
            entries < CLIENTS as u64 / 2,
            "{CLIENTS} concurrent proposals took {entries} entries"
        );
        assert_eq!(
            rows(&store, "SELECT count(*) FROM t"),
            vec![vec![Value::Integer(CLIENTS)]]
        );
        shut(node).await;
    });
}

/// A cluster of one in `dir` whose entries wait up to `gather` for the
/// proposals they expect.
async fn gathering_node(dir: &Path, store: &Arc<Store>, gather: Duration) -> Arc<SingleNode> {
    let config = tablix_raft::ProposerConfig {
        gather,
        ..tablix_raft::ProposerConfig::default()
    };
    Arc::new(single_node_with(dir, store, config).await)
}

/// Proposes `statement` with a stamp of its own.
async fn propose_sql(node: &SingleNode, seed: u64, statement: &str) {
    let stamp = Stamp {
        unix_nanos: 1,
        seed,
    };
    node.propose(Stamped::new(stamp, sql(&[statement])))
        .await
        .unwrap();
}

/// Stops `node`, which no client may still hold.
async fn shut(node: Arc<SingleNode>) {
    match Arc::try_unwrap(node) {
        Ok(node) => node.shutdown().await.unwrap(),
        Err(_) => panic!("a client still holds the node"),
    }
}

#[test]
fn an_entry_waits_for_the_clients_the_last_one_answered_and_a_lone_client_never_waits() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let store = open_store(dir.path());
        // A wait far longer than the whole run: a lone client's proposal
        // that waited for more would time the run out.
        let node = gathering_node(dir.path(), &store, Duration::from_secs(60)).await;
        propose_sql(&node, 1, "CREATE TABLE t(x)").await;
        let lone = async {
            for i in 0..20 {
                propose_sql(&node, 2 + i, &format!("INSERT INTO t VALUES ({i})")).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), lone)
            .await
            .expect("a lone client's proposals waited for others");
        shut(node).await;

        // Eight clients that each pause after their answer before proposing
        // again: without waiting for them, entries leave with whoever
        // happened to be back. (When the first client is done, the entry
        // that expected it waits out its second.) They start together,
        // after one proposal each: clients that start one by one ride
        // entries of their own until the waits gather them.
        let node = gathering_node(dir.path(), &store, Duration::from_secs(1)).await;
        const CLIENTS: u64 = 8;
        const ROUNDS: u64 = 25;
        let started = Arc::new(tokio::sync::Barrier::new(CLIENTS as usize + 1));
        let mut clients = tokio::task::JoinSet::new();
        for c in 0..CLIENTS {
            let node = Arc::clone(&node);
            let started = Arc::clone(&started);
            clients.spawn(async move {
                propose_sql(&node, 50 + c, &format!("INSERT INTO t VALUES ({c})")).await;
                started.wait().await;
                started.wait().await;
                for r in 0..ROUNDS {
                    let seed = 100 + c * ROUNDS + r;
                    propose_sql(&node, seed, &format!("INSERT INTO t VALUES ({c})")).await;
                    let pause = 1 + (c + r) % 3;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            });
        }
        started.wait().await;
        let before = store.applied_state().unwrap().applied.unwrap().index;
        started.wait().await;
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
        let entries = store.applied_state().unwrap().applied.unwrap().index - before;
        assert!(
            entries <= ROUNDS + 10,
            "{CLIENTS} clients' {ROUNDS} rounds took {entries} entries"
        );
        assert_eq!(
            rows(&store, "SELECT count(*) FROM t"),
            vec![vec![Value::Integer((20 + CLIENTS * (ROUNDS + 1)) as i64)]]
        );
        shut(node).await;
    });
}

#[test]
fn the_next_entry_is_logged_while_a_committed_one_is_still_applied() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let store = open_store(dir.path());
        let node = Arc::new(single_node(dir.path(), &store).await);
        propose_sql(&node, 1, "CREATE TABLE t(x)").await;
        let first = node.last_log_index().unwrap() + 1;
        // An entry whose apply keeps the store's writer busy for most of a
        // second (a debug build; longer under load).
        let slow = tokio::spawn({
            let node = Arc::clone(&node);
            async move {
                propose_sql(
                    &node,
                    2,
                    "INSERT INTO t SELECT count(*) FROM (WITH RECURSIVE c(x) AS \
                     (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000000) SELECT x FROM c)",
                )
                .await
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while node.last_log_index() < Some(first) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the slow entry was never logged"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A cluster of one commits an entry once its log holds it; give its
        // apply a moment to begin.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = tokio::spawn({
            let node = Arc::clone(&node);
            async move { propose_sql(&node, 3, "INSERT INTO t VALUES (-1)").await }
        });
        while node.last_log_index() < Some(first + 1) {
            assert!(
                !slow.is_finished(),
                "the next entry was logged only once the slow one was answered"
            );
            assert!(
                tokio::time::Instant::now() < deadline,
                "the next entry was never logged"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            !slow.is_finished(),
            "the slow entry was answered before the next was logged: make it slower"
        );
        slow.await.unwrap();
        quick.await.unwrap();
        assert_eq!(
            rows(&store, "SELECT count(*) FROM t"),
            vec![vec![Value::Integer(2)]]
        );
        shut(node).await;
    });
}
