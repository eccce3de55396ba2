//! Three nodes over a network that loses requests and answers, delivers
//! some twice, and holds each back a random time so that they overtake
//! one another. Clients insert rows through every node, sending a write
//! again (same stamp) until it is acknowledged, and every acknowledgement
//! carries the row its `RETURNING` gave the first time; at the end every
//! node holds every acknowledged row exactly once and the same state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tablix_raft::{ClusterNode, Faults, Start};
use tablix_store::{CommandReply, Rows, Stamp, Stamped, StatementResult, Store, Value};

use super::network::{eventually, form, start_impatient, start_with, stop};
use super::{rows, runtime, sql};

const CLIENTS: i64 = 3;
const WRITES: i64 = 30;

#[test]
fn a_lossy_duplicating_reordering_network_loses_and_doubles_no_acknowledged_write() {
    let seed: u64 = 0xFA17_2026;
    eprintln!("faults: seed {seed:#x}");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let nodes = form(3, |id, how| {
            start_impatient(id, dirs[id as usize - 1].path(), how)
        })
        .await;
        // No unique key: a write applied twice would show as two rows.
        nodes[0]
            .0
            .propose(Stamped::new(
                Stamp::now(),
                sql(&["CREATE TABLE t(k INTEGER)"]),
            ))
            .await
            .unwrap();
        for (i, (n, _)) in nodes.iter().enumerate() {
            n.transport().inject(Faults {
                drop_request: 0.1,
                drop_answer: 0.1,
                duplicate: 0.2,
                max_delay: Duration::from_millis(20),
                seed: seed + i as u64,
            });
        }

        let nodes: Arc<Vec<(ClusterNode, Arc<Store>)>> = Arc::new(nodes);
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let nodes = Arc::clone(&nodes);
            clients.push(tokio::spawn(async move {
                let (node, _) = &nodes[c as usize % nodes.len()];
                let mut acknowledged = Vec::new();
                let mut attempts = 0u64;
                for i in 0..WRITES {
                    let k = c * 1000 + i;
                    // One stamp per write, kept across attempts: the
                    // store knows a write sent again by its seed.
                    let write = Stamped::new(
                        Stamp {
                            unix_nanos: 1_700_000_000_000_000_000 + k,
                            seed: 0xFA00_0000 + k as u64,
                        },
                        sql(&[&format!("INSERT INTO t VALUES ({k}) RETURNING k")]),
                    );
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        attempts += 1;
                        match node.propose(write.clone()).await {
                            // A write sent again that was applied the first
                            // time gets the first time's reply, its row.
                            Ok(CommandReply::Sql(r)) => {
                                assert_eq!(
                                    r.statements[0].result,
                                    StatementResult::Rows(Rows {
                                        columns: vec!["k".into()],
                                        types: vec!["integer".into()],
                                        values: vec![vec![Value::Integer(k)]],
                                    }),
                                    "insert {k} (seed {seed:#x})"
                                );
                                acknowledged.push(k);
                                break;
                            }
                            Ok(other) => panic!("insert {k} answered {other:?}"),
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                }
                (acknowledged, attempts)
            }));
        }
        let mut acknowledged = Vec::new();
        let mut attempts = 0;
        for c in clients {
            let (a, n) = c.await.unwrap();
            acknowledged.extend(a);
            attempts += n;
        }
        eprintln!(
            "faults: {} of {} writes acknowledged in {attempts} attempts",
            acknowledged.len(),
            CLIENTS * WRITES
        );
        assert!(
            acknowledged.len() as i64 > CLIENTS * WRITES / 2,
            "too few writes got through (seed {seed:#x})"
        );
        for (n, _) in nodes.iter() {
            n.transport().heal();
        }
        // Once healed, every node catches up with the leader's log.
        let leader = nodes[0].0.status().leader.unwrap();
        let last = nodes[leader as usize - 1]
            .0
            .raft()
            .metrics()
            .borrow()
            .last_applied;
        for (n, _) in nodes.iter() {
            eventually("every node applied the leader's entries", || {
                n.raft().metrics().borrow().last_applied >= last
            })
            .await;
        }
        let states: Vec<Vec<Vec<Value>>> = nodes
            .iter()
            .map(|(_, s)| rows(s, "SELECT k, count(*) FROM t GROUP BY k ORDER BY k"))
            .collect();
        assert!(
            states.windows(2).all(|w| w[0] == w[1]),
            "the nodes differ (seed {seed:#x})"
        );
        for row in &states[0] {
            assert_eq!(
                row[1],
                Value::Integer(1),
                "applied twice: {row:?} (seed {seed:#x})"
            );
        }
        let held: Vec<i64> = states[0]
            .iter()
            .map(|r| match r[0] {
                Value::Integer(k) => k,
                ref other => panic!("{other:?}"),
            })
            .collect();
        for k in &acknowledged {
            assert!(
                held.contains(k),
                "acknowledged write {k} is missing (seed {seed:#x})"
            );
        }
        let nodes = Arc::try_unwrap(nodes).unwrap_or_else(|_| panic!("a client holds the nodes"));
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}

/// Starts node `id` with snapshots every `every` entries, sent in chunks
/// of `chunk` bytes.
async fn start_small(
    id: u64,
    dir: &std::path::Path,
    how: Start,
    every: u64,
    chunk: u64,
    addr: Option<std::net::SocketAddr>,
) -> (ClusterNode, Arc<Store>) {
    start_with(id, dir, addr, |c| {
        c.start = how;
        c.snapshot_every = every;
        c.keep_behind_snapshot = 0;
        c.snapshot_chunk_bytes = chunk;
    })
    .await
}

/// Rows of `t` (none while the node has not the table yet).
fn count(store: &Store) -> i64 {
    let answer = store
        .query(
            &tablix_store::Principal::root(),
            &[tablix_store::Statement::new("SELECT count(*) FROM t")],
        )
        .unwrap();
    match &answer[0].result {
        tablix_store::StatementResult::Rows(r) => match r.values[0][0] {
            Value::Integer(n) => n,
            ref other => panic!("{other:?}"),
        },
        _ => 0,
    }
}

async fn insert(node: &ClusterNode, n: i64) {
    node.propose(Stamped::new(
        Stamp {
            unix_nanos: 1_700_000_000_000_000_000 + n,
            seed: 0x5_0000 + n as u64,
        },
        sql(&[&format!("INSERT INTO t VALUES ({n}, zeroblob(2000))")]),
    ))
    .await
    .unwrap();
}

#[test]
fn a_snapshot_whose_chunks_are_lost_on_the_way_is_sent_again_until_installed() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let (a, a_store) = start_small(1, dirs[0].path(), Start::Bootstrap, 10, 4096, None).await;
        eventually("node 1 to lead", || a.status().leader == Some(1)).await;
        a.propose(Stamped::new(Stamp::now(), sql(&["CREATE TABLE t(k, pad)"])))
            .await
            .unwrap();
        for n in 1..=60 {
            insert(&a, n).await;
        }
        eventually("a snapshot and a purged log", || {
            a.status().snapshot_index.is_some_and(|i| i >= 50)
        })
        .await;
        // The snapshot (over 120 KB) goes in 4 KiB chunks, a fifth of
        // them or their answers lost.
        a.transport().inject(Faults {
            drop_request: 0.1,
            drop_answer: 0.1,
            duplicate: 0.05,
            max_delay: Duration::from_millis(5),
            seed: 0x5A95,
        });
        let (b, b_store) = start_small(
            2,
            dirs[1].path(),
            Start::Join(a.addr().to_string()),
            5000,
            4096,
            None,
        )
        .await;
        eventually("node 2 holds every row", || count(&b_store) == 60).await;
        assert!(b.status().snapshot_index.is_some(), "{:?}", b.status());
        a.transport().heal();
        insert(&a, 61).await;
        eventually("node 2 goes on from the snapshot", || count(&b_store) == 61).await;
        stop(b, b_store).await;
        stop(a, a_store).await;
    });
}

#[test]
fn a_node_restarted_with_its_data_directory_wiped_is_brought_back_by_the_cluster() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let mut nodes = form(3, |id, how| {
            start_small(id, dirs[id as usize - 1].path(), how, 20, 1 << 20, None)
        })
        .await;
        let seed = nodes[0].0.addr().to_string();
        nodes[0]
            .0
            .propose(Stamped::new(Stamp::now(), sql(&["CREATE TABLE t(k, pad)"])))
            .await
            .unwrap();
        for n in 1..=30 {
            insert(&nodes[0].0, n).await;
        }
        eventually("node 3 has every row", || count(&nodes[2].1) == 30).await;
        let (node3, store3) = nodes.pop().unwrap();
        let addr3 = node3.addr();
        stop(node3, store3).await;
        // Its disk is replaced: nothing of it is left.
        std::fs::remove_dir_all(dirs[2].path()).unwrap();
        std::fs::create_dir_all(dirs[2].path()).unwrap();
        for n in 31..=50 {
            insert(&nodes[0].0, n).await;
        }
        // Started again at its address as if nothing happened, it takes
        // nothing from the leader (its empty log must not count for
        // entries it acknowledged before) and the cluster goes on.
        let lost = start_small(3, dirs[2].path(), Start::Resume, 20, 1 << 20, Some(addr3)).await;
        insert(&nodes[0].0, 51).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(count(&lost.1), 0);
        assert_eq!(lost.0.status().cluster_id, None);
        stop(lost.0, lost.1).await;
        // Started with --join, it is removed and added anew: a snapshot,
        // then the log, and it is a voter again.
        let back = start_small(
            3,
            dirs[2].path(),
            Start::Join(seed.clone()),
            20,
            1 << 20,
            Some(addr3),
        )
        .await;
        eventually("the wiped node caught up", || count(&back.1) == 51).await;
        assert_eq!(back.0.status().cluster_id, nodes[0].0.status().cluster_id);
        insert(&nodes[0].0, 52).await;
        eventually("and goes on", || count(&back.1) == 52).await;
        for (n, _) in &nodes {
            eventually("three voters again", || {
                let s = n.status();
                s.members.iter().filter(|m| m.voter).count() == 3
            })
            .await;
        }
        let leader_rows = count(&nodes[0].1);
        assert_eq!(leader_rows, 52, "an acknowledged write is missing");
        stop(back.0, back.1).await;
        for (n, s) in nodes {
            stop(n, s).await;
        }
    });
}

#[test]
#[ignore = "needs root to mount a tmpfs: make test runs it as root"]
fn a_follower_whose_disk_fills_stops_says_so_and_catches_up_once_it_has_room() {
    const TEST: &str = "a_follower_whose_disk_fills_stops_says_so_and_catches_up_once_it_has_room";
    let disk = tablix_testkit::TinyDisk::mount(TEST, "6m");
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    const ROWS: i64 = 150;
    runtime().block_on(async {
        // Nodes 1 and 2 on ordinary disks, node 3 on the small one.
        let mut nodes = form(3, |id, how| {
            let dir = if id == 3 {
                disk.path()
            } else {
                dirs[id as usize - 1].path()
            };
            start_small(id, dir, how, 5000, 1 << 20, None)
        })
        .await;
        let (small, small_store) = nodes.pop().unwrap();
        let small_addr = small.addr();
        nodes[0]
            .0
            .propose(Stamped::new(Stamp::now(), sql(&["CREATE TABLE t(k, pad)"])))
            .await
            .unwrap();
        // 150 rows of 64 KiB: over 9 MB, more than node 3's disk holds.
        // The other two are a majority: every write is acknowledged.
        for n in 1..=ROWS {
            nodes[0]
                .0
                .propose(Stamped::new(
                    Stamp {
                        unix_nanos: 1_700_000_000_000_000_000 + n,
                        seed: 0xD15C_0000 + n as u64,
                    },
                    sql(&[&format!("INSERT INTO t VALUES ({n}, randomblob(65536))")]),
                ))
                .await
                .unwrap();
        }
        // Node 3 stopped applying and says so, holding a prefix of what
        // the others hold: never anything else.
        eventually("node 3 to stop", || {
            small.raft().metrics().borrow().running_state.is_err()
        })
        .await;
        let stopped = small.status().stopped.unwrap_or_default();
        assert!(!stopped.is_empty(), "node 3 does not say it stopped");
        eprintln!("node 3 says: {stopped}");
        let held = count(&small_store);
        eprintln!("node 3 stopped at row {held} of {ROWS}");
        assert!(held < ROWS, "node 3 held every row on a full disk");
        let prefix = |s: &Store, upto: i64| {
            rows(
                s,
                &format!("SELECT k, hex(pad) FROM t WHERE k <= {upto} ORDER BY rowid"),
            )
        };
        assert_eq!(prefix(&small_store, held), prefix(&nodes[0].1, held));
        let _ = small.shutdown().await;
        let _ = small_store.close();
        drop(small_store);
        // Given room, it comes back and catches up.
        disk.resize("64m");
        let (back, back_store) = start_small(
            3,
            disk.path(),
            Start::Resume,
            5000,
            1 << 20,
            Some(small_addr),
        )
        .await;
        eventually("node 3 caught up", || count(&back_store) == ROWS).await;
        assert_eq!(prefix(&back_store, ROWS), prefix(&nodes[0].1, ROWS));
        stop(back, back_store).await;
        for (n, s) in nodes {
            stop(n, s).await;
        }
    });
}
