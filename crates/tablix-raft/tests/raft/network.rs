//! Nodes on loopback with real sockets: bootstrap, join, writes through
//! any node (forwarded to the leader and visible on the node that took
//! them when they return), failover, restart, removal, and a new node
//! brought up by a snapshot after the log was compacted.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tablix_raft::{ClusterConfig, ClusterError, ClusterNode, ReadBarrier, Start};
use tablix_store::{LogKeeper, ReplicatedCommand, Stamp, Stamped, Store, StoreConfig, Value};

use super::{file, make_file, rows, runtime, sql};

const LOOPBACK: &str = "127.0.0.1:0";

fn stamped(n: i64, command: ReplicatedCommand) -> Stamped<ReplicatedCommand> {
    Stamped::new(
        Stamp {
            unix_nanos: 1_700_000_000_000_000_000 + n,
            seed: n as u64,
        },
        command,
    )
}

/// Starts node `id` with its data in `dir`, listening at `listen` (a free
/// loopback port without), its settings changed by `tune`; a node that
/// fails to start gives back its store.
pub(crate) async fn try_start_with(
    id: u64,
    dir: &Path,
    listen: Option<SocketAddr>,
    tune: impl FnOnce(&mut ClusterConfig),
) -> Result<(ClusterNode, Arc<Store>), (ClusterError, Arc<Store>)> {
    let mut config = StoreConfig::new(dir.join("data"));
    config.log_keeper = LogKeeper::Replication;
    let store = Arc::new(Store::open(config).unwrap());
    let listen = listen.unwrap_or_else(|| LOOPBACK.parse().unwrap());
    let mut cluster = ClusterConfig::new(id, listen, dir);
    tune(&mut cluster);
    match ClusterNode::start(cluster, Arc::clone(&store)).await {
        Ok(node) => Ok((node, store)),
        Err(e) => Err((e, store)),
    }
}

/// [`try_start_with`], which must succeed.
pub(crate) async fn start_with(
    id: u64,
    dir: &Path,
    listen: Option<SocketAddr>,
    tune: impl FnOnce(&mut ClusterConfig),
) -> (ClusterNode, Arc<Store>) {
    match try_start_with(id, dir, listen, tune).await {
        Ok(n) => n,
        Err((e, _)) => panic!("node {id} did not start: {e}"),
    }
}

/// Starts node `id` with its data in `dir`.
async fn start(id: u64, dir: &Path, how: Start, snapshot_every: u64) -> (ClusterNode, Arc<Store>) {
    start_with(id, dir, None, |c| {
        c.start = how;
        c.snapshot_every = snapshot_every;
        c.keep_behind_snapshot = 0;
    })
    .await
}

/// Starts node `id` with a short wait for a leader.
pub(crate) async fn start_impatient(id: u64, dir: &Path, how: Start) -> (ClusterNode, Arc<Store>) {
    start_with(id, dir, None, |c| {
        c.start = how;
        c.leader_wait = Duration::from_secs(2);
    })
    .await
}

/// Starts node `id` again where it ran before (same address).
async fn restart(id: u64, dir: &Path, addr: SocketAddr) -> (ClusterNode, Arc<Store>) {
    start_with(id, dir, Some(addr), |_| {}).await
}

/// Forms a cluster of `n` nodes started by `start(id, how)`: node 1
/// bootstraps it and leads, the others join through it.
pub(crate) async fn form<F, Fut>(n: u64, mut start: F) -> Vec<(ClusterNode, Arc<Store>)>
where
    F: FnMut(u64, Start) -> Fut,
    Fut: std::future::Future<Output = (ClusterNode, Arc<Store>)>,
{
    let first = start(1, Start::Bootstrap).await;
    eventually("node 1 to lead", || first.0.status().leader == Some(1)).await;
    let seed = first.0.addr().to_string();
    let mut nodes = vec![first];
    for id in 2..=n {
        nodes.push(start(id, Start::Join(seed.clone())).await);
    }
    for (node, _) in &nodes {
        eventually("every node to see every voter", || {
            node.status().members.iter().filter(|m| m.voter).count() == n as usize
        })
        .await;
    }
    nodes
}

/// Waits until `check` holds, for up to 20 s.
pub(crate) async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(store: &Store) -> i64 {
    match rows(store, "SELECT count(*) FROM t")[0][0] {
        Value::Integer(n) => n,
        ref other => panic!("{other:?}"),
    }
}

pub(crate) async fn stop(node: ClusterNode, store: Arc<Store>) {
    node.shutdown().await.unwrap();
    store.close().unwrap();
}

#[test]
fn three_nodes_take_writes_through_any_node_and_survive_losing_the_leader() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let mut nodes = form(3, |id, how| {
            start(id, dirs[id as usize - 1].path(), how, 5000)
        })
        .await;
        for (node, _) in &nodes {
            eventually("three voters everywhere", || {
                let s = node.status();
                s.members.iter().filter(|m| m.voter).count() == 3 && s.leader == Some(1)
            })
            .await;
        }
        // SQL through a follower's store: forwarded, and applied there
        // before it returns.
        let (_, follower) = &nodes[1];
        follower
            .submit_sql(
                Stamped::new(
                    Stamp::now(),
                    match sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]) {
                        ReplicatedCommand::Sql(s) => s,
                        _ => unreachable!(),
                    },
                ),
                follower.config().write_limits(),
            )
            .await
            .unwrap();
        assert_eq!(count(follower), 1, "the follower applied its own write");
        // After a write through another node, a read barrier of every
        // level makes the third node's state hold it before its read.
        for (n, barrier) in [ReadBarrier::Leader, ReadBarrier::Quorum, ReadBarrier::Log]
            .into_iter()
            .enumerate()
        {
            nodes[1]
                .0
                .propose(stamped(
                    100 + n as i64,
                    sql(&["INSERT INTO t VALUES (100)"]),
                ))
                .await
                .unwrap();
            nodes[2].0.handle().read_barrier(barrier).await.unwrap();
            assert_eq!(count(&nodes[2].1), 2 + n as i64, "{barrier:?}");
        }
        // The status numbers entries as the store does.
        for (node, store) in &nodes {
            eventually("the status's applied index is the state's", || {
                let held = store.applied_state().unwrap().applied.map(|l| l.index);
                node.status().applied_index == held
            })
            .await;
        }
        nodes[1]
            .0
            .propose(stamped(200, sql(&["DELETE FROM t WHERE x = 100"])))
            .await
            .unwrap();
        // A file made through another follower's store.
        let (_, other) = &nodes[2];
        let made = other
            .submit_fs(Stamped::new(
                Stamp::now(),
                match make_file("f") {
                    ReplicatedCommand::Fs(op) => op,
                    _ => unreachable!(),
                },
            ))
            .await
            .unwrap();
        let ino = match made {
            Ok(tablix_fs::FsReply::Attr(a)) => a.ino,
            other => panic!("{other:?}"),
        };
        other
            .submit_fs(Stamped::new(
                Stamp::now(),
                tablix_fs::FsOp::Write {
                    ino,
                    offset: 0,
                    data: b"written on node 3".to_vec(),
                    kill_suidgid: false,
                },
            ))
            .await
            .unwrap()
            .unwrap();
        for (_, store) in &nodes {
            eventually("the file on every node", || {
                store
                    .read(|c| tablix_fs::read::lookup(c, 1, b"f").is_ok())
                    .unwrap()
                    && file(store, "f") == b"written on node 3"
            })
            .await;
            eventually("the row on every node", || count(store) == 1).await;
        }

        // The leader goes; the others elect one and writes go on.
        let (leader, leader_store) = nodes.remove(0);
        let leader_addr = leader.addr();
        stop(leader, leader_store).await;
        let lost = Instant::now();
        let (survivor, survivor_store) = &nodes[0];
        survivor
            .propose(stamped(10, sql(&["INSERT INTO t VALUES (2)"])))
            .await
            .unwrap();
        let failover = lost.elapsed();
        assert!(
            failover < Duration::from_secs(10),
            "the first write after losing the leader took {failover:?}"
        );
        assert_eq!(count(survivor_store), 2);
        let new_leader = survivor.status().leader.unwrap();
        assert_ne!(new_leader, 1);

        // The old leader comes back and catches up.
        let back = restart(1, dirs[0].path(), leader_addr).await;
        eventually("node 1 caught up", || count(&back.1) == 2).await;
        nodes.push(back);

        // Every node mounts; a removed node's mount goes with it, so no
        // unlinked file waits for its kernel.
        for id in 1..=3u64 {
            nodes[0]
                .1
                .submit_fs(Stamped::new(
                    Stamp::now(),
                    tablix_fs::FsOp::MountNode {
                        uid: 0,
                        gid: 0,
                        node: id,
                    },
                ))
                .await
                .unwrap()
                .unwrap();
        }
        let mounted = |store: &Store| {
            store
                .read(|c| {
                    let mut st = c
                        .prepare("SELECT node FROM tablix_mount ORDER BY node")
                        .unwrap();
                    st.query_map([], |r| r.get::<_, i64>(0))
                        .unwrap()
                        .map(|r| r.unwrap())
                        .collect::<Vec<i64>>()
                })
                .unwrap()
        };
        // Removing a node (a follower: a leader removing itself is
        // another test's): the others keep going without it.
        let (n1, _) = &nodes[0];
        let leader = n1.status().leader.unwrap();
        let gone = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
        n1.remove(gone).await.unwrap();
        let left: Vec<i64> = [1, 2, 3]
            .into_iter()
            .filter(|&id| id != gone as i64)
            .collect();
        for (node, store) in nodes.iter().filter(|(n, _)| n.id() != gone) {
            eventually("the node gone", || {
                node.status().members.iter().all(|m| m.id != gone)
            })
            .await;
            eventually("its mount gone", || mounted(store) == left).await;
        }
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

#[test]
fn a_node_joining_after_compaction_is_brought_up_by_a_snapshot() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let (a, a_store) = start(1, dirs[0].path(), Start::Bootstrap, 10).await;
        eventually("node 1 to lead", || a.status().leader == Some(1)).await;
        a.propose(stamped(0, sql(&["CREATE TABLE t(x)"])))
            .await
            .unwrap();
        for n in 1..=40 {
            a.propose(stamped(n, sql(&[&format!("INSERT INTO t VALUES ({n})")])))
                .await
                .unwrap();
        }
        eventually("a snapshot and a purged log", || {
            a.status().snapshot_index.is_some_and(|i| i >= 20)
        })
        .await;
        let (b, b_store) = start(2, dirs[1].path(), Start::Join(a.addr().to_string()), 5000).await;
        eventually("node 2 holds every row", || count(&b_store) == 40).await;
        assert!(
            b.status().snapshot_index.is_some(),
            "node 2 was brought up by a snapshot: {:?}",
            b.status()
        );
        assert_eq!(
            rows(&b_store, "SELECT sum(x) FROM t"),
            vec![vec![Value::Integer((1..=40).sum())]]
        );
        // Removing the last voter is refused.
        b.remove(2).await.unwrap();
        let refused = a.remove(1).await.unwrap_err().to_string();
        assert!(refused.contains("last voter"), "{refused}");
        stop(b, b_store).await;
        stop(a, a_store).await;
    });
}

#[test]
fn joining_through_an_address_where_no_node_listens_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let mut config = StoreConfig::new(dir.path().join("data"));
        config.log_keeper = LogKeeper::Replication;
        let store = Arc::new(Store::open(config).unwrap());
        // A port nothing listens on: bound, then released.
        let free = std::net::TcpListener::bind(LOOPBACK)
            .unwrap()
            .local_addr()
            .unwrap();
        let mut cluster = ClusterConfig::new(7, LOOPBACK.parse().unwrap(), dir.path());
        cluster.start = Start::Join(free.to_string());
        cluster.join_wait = Duration::from_secs(2);
        let started = Instant::now();
        let e = ClusterNode::start(cluster, Arc::clone(&store)).await;
        let e = match e {
            Err(e) => e.to_string(),
            Ok(_) => panic!("joined through {free}"),
        };
        assert!(
            e.contains(&free.to_string()) && e.contains("unreachable"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        store.close().unwrap();
    });
}

#[test]
fn a_partitioned_minority_takes_no_write_and_serves_no_linearizable_read() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let nodes = form(3, |id, how| {
            start_impatient(id, dirs[id as usize - 1].path(), how)
        })
        .await;
        nodes[0]
            .0
            .propose(stamped(
                1,
                sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]),
            ))
            .await
            .unwrap();
        // {1} | {2, 3}: the leader alone on its side.
        let addr = |i: usize| nodes[i].0.addr().to_string();
        nodes[0].0.transport().cut_off(&addr(1));
        nodes[0].0.transport().cut_off(&addr(2));
        nodes[1].0.transport().cut_off(&addr(0));
        nodes[2].0.transport().cut_off(&addr(0));

        // The minority: a write fails within the bounded wait, and a
        // linearizable read is refused.
        let asked = Instant::now();
        let refused = nodes[0]
            .0
            .propose(stamped(50, sql(&["INSERT INTO t VALUES (50)"])))
            .await;
        assert!(refused.is_err(), "the minority took a write: {refused:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "{:?}",
            asked.elapsed()
        );
        let read = nodes[0].0.handle().read_barrier(ReadBarrier::Quorum).await;
        assert!(read.is_err(), "the minority served a linearizable read");

        // The majority elects a leader of its own and takes writes.
        eventually("a leader in the majority", || {
            matches!(nodes[1].0.status().leader, Some(2 | 3))
        })
        .await;
        nodes[1]
            .0
            .propose(stamped(51, sql(&["INSERT INTO t VALUES (51)"])))
            .await
            .unwrap();
        nodes[2]
            .0
            .handle()
            .read_barrier(ReadBarrier::Quorum)
            .await
            .unwrap();
        assert_eq!(count(&nodes[2].1), 2);

        // Healed: the old leader follows, and the write it could not
        // commit is gone; every node holds the same rows.
        for (n, _) in &nodes {
            n.transport().heal();
        }
        for (n, store) in &nodes {
            eventually("every node on the majority's rows", || {
                matches!(n.status().leader, Some(2 | 3))
                    && rows(store, "SELECT x FROM t ORDER BY x")
                        == vec![vec![Value::Integer(1)], vec![Value::Integer(51)]]
            })
            .await;
        }
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

#[test]
fn five_nodes_hand_leadership_to_the_node_asked_and_go_on_taking_writes() {
    let dirs: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let nodes = form(5, |id, how| {
            start(id, dirs[id as usize - 1].path(), how, 5000)
        })
        .await;
        let learner = start(6, dirs[5].path(), Start::Resume, 5000).await;
        nodes[0]
            .0
            .add(6, &learner.0.addr().to_string(), false)
            .await
            .unwrap();
        for (n, _) in &nodes {
            eventually("five voters and a learner", || {
                let s = n.status();
                s.members.iter().filter(|m| m.voter).count() == 5 && s.members.len() == 6
            })
            .await;
        }
        nodes[1]
            .0
            .propose(stamped(1, sql(&["CREATE TABLE t(x)"])))
            .await
            .unwrap();
        let mut written = 0;
        // Asked through a follower, then through the leader.
        for (asked, target) in [(2usize, 5u64), (4, 2), (1, 4)] {
            let began = Instant::now();
            nodes[asked].0.transfer_leader(target).await.unwrap();
            eprintln!("leadership to node {target} in {:?}", began.elapsed());
            for (n, _) in &nodes {
                eventually("every node to know the new leader", || {
                    n.status().leader == Some(target)
                })
                .await;
            }
            // Writes go on through every node.
            for (i, (n, _)) in nodes.iter().enumerate() {
                written += 1;
                n.propose(stamped(
                    100 + written,
                    sql(&[&format!("INSERT INTO t VALUES ({i})")]),
                ))
                .await
                .unwrap();
            }
        }
        let refused = nodes[0].0.transfer_leader(6).await.unwrap_err().to_string();
        assert!(refused.contains("learner"), "{refused}");
        let refused = nodes[0].0.transfer_leader(9).await.unwrap_err().to_string();
        assert!(refused.contains("not a member"), "{refused}");
        assert_eq!(nodes[0].0.status().leader, Some(4));
        for (_, store) in nodes.iter().chain(std::iter::once(&learner)) {
            eventually("every row on every node", || count(store) == written).await;
        }
        stop(learner.0, learner.1).await;
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

#[test]
fn a_learner_is_promoted_and_the_whole_cluster_restarts_with_its_state() {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let mut nodes = form(3, |id, how| {
            start(id, dirs[id as usize - 1].path(), how, 20)
        })
        .await;
        // Node 4 comes in as a learner: it gets the log, votes in nothing.
        nodes.push(start(4, dirs[3].path(), Start::Resume, 20).await);
        let learner_addr = nodes[3].0.addr().to_string();
        nodes[1].0.add(4, &learner_addr, false).await.unwrap();
        nodes[0]
            .0
            .propose(stamped(1, sql(&["CREATE TABLE t(x)"])))
            .await
            .unwrap();
        for n in 1..=30 {
            nodes[(n % 4) as usize]
                .0
                .propose(stamped(
                    10 + n,
                    sql(&[&format!("INSERT INTO t VALUES ({n})")]),
                ))
                .await
                .unwrap();
        }
        let voters = |n: &ClusterNode| n.status().members.iter().filter(|m| m.voter).count();
        assert_eq!(voters(&nodes[0].0), 3);
        eventually("the learner has every row", || count(&nodes[3].1) == 30).await;
        // Promoted: the same request as a voter.
        nodes[2].0.add(4, &learner_addr, true).await.unwrap();
        for (n, _) in &nodes {
            eventually("four voters everywhere", || voters(n) == 4).await;
        }
        // Every node stops; every node starts again from its own data.
        let addrs: Vec<SocketAddr> = nodes.iter().map(|(n, _)| n.addr()).collect();
        for (node, store) in nodes.drain(..) {
            stop(node, store).await;
        }
        for (i, addr) in addrs.iter().enumerate() {
            nodes.push(restart(i as u64 + 1, dirs[i].path(), *addr).await);
        }
        for (n, store) in &nodes {
            eventually("a leader and four voters after the restart", || {
                n.status().leader.is_some() && voters(n) == 4
            })
            .await;
            assert_eq!(count(store), 30);
        }
        nodes[3]
            .0
            .propose(stamped(100, sql(&["INSERT INTO t VALUES (31)"])))
            .await
            .unwrap();
        for (_, store) in &nodes {
            eventually("the write after the restart everywhere", || {
                count(store) == 31
            })
            .await;
        }
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

#[test]
fn a_proposal_sent_twice_is_applied_once_and_both_senders_get_its_reply() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let (a, a_store) = start(1, dirs[0].path(), Start::Bootstrap, 5000).await;
        eventually("node 1 to lead", || a.status().leader == Some(1)).await;
        let (b, b_store) = start(2, dirs[1].path(), Start::Join(a.addr().to_string()), 5000).await;
        a.propose(stamped(1, sql(&["CREATE TABLE t(x)"])))
            .await
            .unwrap();
        // What a new leader sees when the old one had replicated a
        // proposal that its sender then sent again: the same stamp twice.
        let once = stamped(2, sql(&["INSERT INTO t VALUES (42)"]));
        let first = a.propose(once.clone()).await.unwrap();
        let again = a.propose(once.clone()).await.unwrap();
        let through_b = b.propose(once).await.unwrap();
        match &first {
            tablix_store::CommandReply::Sql(r) => assert_eq!(
                r.statements[0].result,
                tablix_store::StatementResult::Executed {
                    last_insert_id: 1,
                    rows_affected: 1
                }
            ),
            other => panic!("{other:?}"),
        }
        // Node 2's reply is its own application's: the same result, its
        // own timing.
        let result = |r: &tablix_store::CommandReply| match r {
            tablix_store::CommandReply::Sql(r) => r.statements[0].result.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(again, first);
        assert_eq!(result(&through_b), result(&first));
        assert_eq!(count(&a_store), 1);
        eventually("node 2 applied it once", || count(&b_store) == 1).await;
        stop(b, b_store).await;
        stop(a, a_store).await;
    });
}

#[test]
fn interactive_transactions_on_followers_commit_through_the_leader_with_one_verdict_everywhere() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let nodes = form(3, |id, how| {
            start(id, dirs[id as usize - 1].path(), how, 5000)
        })
        .await;
        nodes[0]
            .0
            .propose(stamped(
                1,
                sql(&[
                    "CREATE TABLE acct(id INTEGER PRIMARY KEY, balance INTEGER)",
                    "INSERT INTO acct VALUES (1, 100), (2, 100)",
                ]),
            ))
            .await
            .unwrap();
        for (node, _) in &nodes {
            node.handle()
                .read_barrier(ReadBarrier::Leader)
                .await
                .unwrap();
        }
        // Two transactions, on two followers, change the same row; each
        // reads its own node's snapshot. The first to commit wins on every
        // node; the second conflicts everywhere.
        let (s2, s3) = (Arc::clone(&nodes[1].1), Arc::clone(&nodes[2].1));
        let outcomes = tokio::task::spawn_blocking(move || {
            let root = tablix_store::Principal::root();
            let t2 = s2
                .transaction(&root, tablix_store::TxKind::ReadWrite)
                .unwrap();
            let t3 = s3
                .transaction(&root, tablix_store::TxKind::ReadWrite)
                .unwrap();
            t2.execute("UPDATE acct SET balance = balance - 10 WHERE id = 1")
                .unwrap();
            t3.execute("UPDATE acct SET balance = balance + 10 WHERE id = 1")
                .unwrap();
            // A random value is taken once, where the statement ran.
            t2.execute("INSERT INTO acct VALUES (3, abs(random()) % 1000 + 1000)")
                .unwrap();
            (t2.commit().unwrap(), t3.commit().unwrap())
        })
        .await
        .unwrap();
        assert!(outcomes.0.is_committed(), "{outcomes:?}");
        assert!(
            matches!(outcomes.1, tablix_store::TxOutcome::Conflict(_)),
            "{outcomes:?}"
        );
        for (node, _) in &nodes {
            node.handle()
                .read_barrier(ReadBarrier::Leader)
                .await
                .unwrap();
        }
        let want = rows(&nodes[0].1, "SELECT id, balance FROM acct ORDER BY id");
        assert_eq!(want[0], vec![Value::Integer(1), Value::Integer(90)]);
        assert_eq!(want.len(), 3);
        for (_, store) in &nodes[1..] {
            assert_eq!(
                rows(store, "SELECT id, balance FROM acct ORDER BY id"),
                want
            );
        }
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}
