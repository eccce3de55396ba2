//! Three nodes over a network that loses requests and answers, delivers
//! some twice, and holds each back a random time so that they overtake
//! one another. Clients insert rows through every node, sending a write
//! again (same stamp) until it is acknowledged; at the end every node
//! holds every acknowledged row exactly once and the same state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tablix_raft::{ClusterNode, Faults, Start};
use tablix_store::{CommandReply, Stamp, Stamped, Store, Value};

use super::network::{eventually, start_impatient, stop};
use super::{rows, runtime, sql};

const CLIENTS: i64 = 3;
const WRITES: i64 = 30;

#[test]
fn a_lossy_duplicating_reordering_network_loses_and_doubles_no_acknowledged_write() {
    let seed: u64 = 0xFA17_2026;
    eprintln!("faults: seed {seed:#x}");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let first = start_impatient(1, dirs[0].path(), Start::Bootstrap).await;
        eventually("node 1 to lead", || first.0.status().leader == Some(1)).await;
        let join = first.0.addr().to_string();
        let mut nodes = vec![first];
        for id in 2..=3u64 {
            nodes.push(
                start_impatient(id, dirs[id as usize - 1].path(), Start::Join(join.clone())).await,
            );
        }
        for (n, _) in &nodes {
            eventually("three voters", || {
                n.status().members.iter().filter(|m| m.voter).count() == 3
            })
            .await;
        }
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
                        sql(&[&format!("INSERT INTO t VALUES ({k})")]),
                    );
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline {
                        attempts += 1;
                        match node.propose(write.clone()).await {
                            Ok(CommandReply::Sql(_) | CommandReply::Repeated) => {
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
