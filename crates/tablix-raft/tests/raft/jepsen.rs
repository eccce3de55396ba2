//! A Jepsen-style test on three nodes with real sockets: clients on every
//! node run register reads, writes and compare-and-sets and bank
//! transfers while a nemesis partitions one node from the others, or
//! makes the network lose, double and reorder requests, and heals, again
//! and again. The register's history is checked with a
//! linearizability checker (`consistency_model`'s, extracted from
//! stateright); every read of the bank's total sees the same total; at the
//! end every node holds the same state.
//!
//! `TABLIX_JEPSEN_SECONDS` sets how long the workload runs (default 3;
//! `make jepsen` runs it for 60). The seed is fixed and printed;
//! `TABLIX_JEPSEN_SEED` replaces it (`make jepsen JEPSEN_ROUNDS=N` runs
//! N rounds, each with a seed of its own).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tablix_raft::{ClusterNode, ReadBarrier};
use tablix_store::{
    CommandReply, Params, Principal, ReplicatedCommand, SqlCommand, Stamp, Stamped, Statement,
    StatementResult, Store, Value,
};
use tablix_testkit::register::{History, Op, Ret, Rng, next_op};

use super::network::{eventually, form, start_impatient, stop};
use super::{rows, runtime};

fn sql(statements: &[(&str, Vec<Value>)], transaction: bool) -> Stamped<ReplicatedCommand> {
    Stamped::new(
        Stamp::now(),
        ReplicatedCommand::Sql(SqlCommand {
            statements: statements
                .iter()
                .map(|(s, p)| Statement::with_params(*s, Params::Positional(p.clone())))
                .collect(),
            transaction,
            principal: Principal::root(),
        }),
    )
}

/// Rows changed by the first statement of an applied write, or `None`
/// when the outcome is unknown (an error: it may have been applied).
fn changed(reply: Result<CommandReply, tablix_store::StoreError>) -> Option<u64> {
    match reply {
        Ok(CommandReply::Sql(r)) => match &r.statements[0].result {
            StatementResult::Executed { rows_affected, .. } => Some(*rows_affected),
            other => panic!("a write answered {other:?}"),
        },
        Ok(other) => panic!("a write answered {other:?}"),
        Err(_) => None,
    }
}

fn one_integer(store: &Store, q: &str) -> i64 {
    match rows(store, q)[0][0] {
        Value::Integer(v) => v,
        ref other => panic!("{q}: {other:?}"),
    }
}

/// How long the linearizability checker may search before the history is
/// taken as not linearizable, at least (five seconds per second of
/// workload otherwise): a linearizable history of the default length is
/// checked in milliseconds.
const CHECK_LIMIT: Duration = Duration::from_secs(60);

const ACCOUNTS: i64 = 5;
const BALANCE: i64 = 100;

#[test]
fn registers_stay_linearizable_and_the_bank_keeps_its_total_under_partitions() {
    let seconds: u64 = std::env::var("TABLIX_JEPSEN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed = tablix_testkit::register::seed_from_env(0x5EED_1DEA_2026);
    eprintln!("jepsen: seed {seed:#x}, {seconds} s of workload");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    runtime().block_on(async {
        let nodes = form(3, |id, how| start_impatient(id, dirs[id as usize - 1].path(), how)).await;
        let setup = nodes[0]
            .0
            .propose(sql(
                &[
                    ("CREATE TABLE reg(id INTEGER PRIMARY KEY, v INTEGER)", vec![]),
                    ("INSERT INTO reg VALUES (1, 0)", vec![]),
                    ("CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER)", vec![]),
                    (
                        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
                         INSERT INTO acct SELECT i, ?2 FROM n",
                        vec![Value::Integer(ACCOUNTS), Value::Integer(BALANCE)],
                    ),
                ],
                true,
            ))
            .await;
        assert!(matches!(setup, Ok(CommandReply::Sql(_))), "{setup:?}");

        let nodes: Arc<Vec<(ClusterNode, Arc<Store>)>> = Arc::new(nodes);
        let history: Arc<History> = Arc::default();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();

        // Register clients on every node. A client whose operation has no
        // known outcome leaves it in flight and goes on as a new thread.
        for c in 0..4u64 {
            let (nodes, history) = (Arc::clone(&nodes), Arc::clone(&history));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed ^ (c + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let (node, store) = &nodes[(c % 3) as usize];
                let mut thread = c << 32;
                let mut next_value = (c as i64 + 1) * 1_000_000;
                while Instant::now() < deadline {
                    let op = next_op(&mut rng, &mut next_value);
                    let at = history.invoke(thread, op.clone());
                    let ret = match &op {
                        Op::Read => match node.handle().read_barrier(ReadBarrier::Quorum).await {
                            Ok(()) => Some(Ret::ReadOk(one_integer(
                                store,
                                "SELECT v FROM reg WHERE id = 1",
                            ))),
                            Err(_) => None,
                        },
                        Op::Write(v) => changed(
                            node.propose(sql(
                                &[("UPDATE reg SET v = ?1 WHERE id = 1", vec![Value::Integer(*v)])],
                                false,
                            ))
                            .await,
                        )
                        .map(|n| {
                            assert_eq!(n, 1);
                            Ret::WriteOk
                        }),
                        Op::Cas(old, new) => changed(
                            node.propose(sql(
                                &[(
                                    "UPDATE reg SET v = ?2 WHERE id = 1 AND v = ?1",
                                    vec![Value::Integer(*old), Value::Integer(*new)],
                                )],
                                false,
                            ))
                            .await,
                        )
                        .map(|n| if n == 1 { Ret::CasOk } else { Ret::CasFailed }),
                    };
                    match (ret, &op) {
                        (Some(r), _) => history.returned(thread, r),
                        (None, Op::Read) => history.read_failed(at),
                        (None, _) => thread += 1,
                    }
                    // A think time: the checker's work grows fast with the
                    // history's length.
                    tokio::time::sleep(Duration::from_millis(20 + rng.below(60))).await;
                }
            }));
        }

        // Bank clients, one per node: transfers in one transaction each,
        // and totals read at every level.
        let totals: Arc<Mutex<Vec<i64>>> = Arc::default();
        for c in 0..3u64 {
            let (nodes, totals) = (Arc::clone(&nodes), Arc::clone(&totals));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed ^ (c + 101).wrapping_mul(0xD1B5_4A32_D192_ED03));
                let (node, store) = &nodes[c as usize];
                while Instant::now() < deadline {
                    let from = 1 + rng.below(ACCOUNTS as u64) as i64;
                    let to = 1 + rng.below(ACCOUNTS as u64) as i64;
                    let amount = 1 + rng.below(20) as i64;
                    let _ = node
                        .propose(sql(
                            &[
                                (
                                    "UPDATE acct SET bal = bal - ?2 WHERE id = ?1 AND bal >= ?2",
                                    vec![Value::Integer(from), Value::Integer(amount)],
                                ),
                                (
                                    "UPDATE acct SET bal = bal + ?2 WHERE id = ?1 AND changes() = 1",
                                    vec![Value::Integer(to), Value::Integer(amount)],
                                ),
                            ],
                            true,
                        ))
                        .await;
                    // Every state a node holds is a committed one.
                    totals
                        .lock()
                        .unwrap()
                        .push(one_integer(store, "SELECT sum(bal) FROM acct"));
                }
            }));
        }

        // The nemesis: one node at a time cut off from the others, then
        // healed.
        let nemesis = {
            let nodes = Arc::clone(&nodes);
            tokio::spawn(async move {
                let mut rng = Rng(seed ^ 0xBAD);
                let mut round = 0u64;
                while Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    round += 1;
                    if round.is_multiple_of(2) {
                        // Every other round a lossy network instead: requests
                        // and answers lost, doubled, and overtaking.
                        for (i, (n, _)) in nodes.iter().enumerate() {
                            n.transport().inject(tablix_raft::Faults {
                                drop_request: 0.05,
                                drop_answer: 0.05,
                                duplicate: 0.1,
                                max_delay: Duration::from_millis(15),
                                seed: seed ^ (round << 8) ^ i as u64,
                            });
                        }
                    } else {
                        let victim = rng.below(3) as usize;
                        let addr = |i: usize| nodes[i].0.addr().to_string();
                        for other in (0..3).filter(|o| *o != victim) {
                            nodes[victim].0.transport().cut_off(&addr(other));
                            nodes[other].0.transport().cut_off(&addr(victim));
                        }
                    }
                    // Sometimes past the leader wait (2 s): operations
                    // there fail with no known outcome.
                    tokio::time::sleep(Duration::from_millis(700 + rng.below(2000))).await;
                    for (n, _) in nodes.iter() {
                        n.transport().heal();
                    }
                }
            })
        };
        // A monitor: which node leads in which term, as each node says of
        // itself. Raft allows one leader a term, whatever the faults.
        let leaders = {
            let nodes = Arc::clone(&nodes);
            tokio::spawn(async move {
                let mut seen: std::collections::BTreeMap<u64, std::collections::BTreeSet<u64>> =
                    Default::default();
                while Instant::now() < deadline {
                    for (n, _) in nodes.iter() {
                        let m = n.raft().metrics().borrow().clone();
                        if m.state == openraft::ServerState::Leader {
                            seen.entry(m.current_term).or_default().insert(m.id);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            })
        };
        for t in tasks {
            t.await.unwrap();
        }
        nemesis.await.unwrap();
        let leaders = leaders.await.unwrap();
        eprintln!("jepsen: leaders by term {leaders:?}");
        for (term, who) in &leaders {
            assert_eq!(who.len(), 1, "term {term} had leaders {who:?} (seed {seed:#x})");
        }
        for (n, _) in nodes.iter() {
            n.transport().heal();
        }

        // One last read on every node, after everything healed.
        for (i, (node, store)) in nodes.iter().enumerate() {
            let thread = (100 + i as u64) << 32;
            history.invoke(thread, Op::Read);
            let mut done = false;
            for _ in 0..100 {
                if node.handle().read_barrier(ReadBarrier::Quorum).await.is_ok() {
                    let v = one_integer(store, "SELECT v FROM reg WHERE id = 1");
                    history.returned(thread, Ret::ReadOk(v));
                    done = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(done, "node {} served no linearizable read after healing", i + 1);
        }

        let limit = CHECK_LIMIT.max(Duration::from_secs(5 * seconds));
        let checked = history
            .check(limit, seed, 20)
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "jepsen: {} register operations, {} with a known outcome, checked in {:?} by {}",
            checked.invoked, checked.returned, checked.took, checked.by
        );

        let totals = std::mem::take(&mut *totals.lock().unwrap());
        assert!(!totals.is_empty());
        assert!(
            totals.iter().all(|t| *t == ACCOUNTS * BALANCE),
            "a read saw the bank's total change: {:?}",
            totals.iter().filter(|t| **t != ACCOUNTS * BALANCE).take(5).collect::<Vec<_>>()
        );
        // Every node ends on the same state.
        let nodes = Arc::try_unwrap(nodes).unwrap_or_else(|_| panic!("a task still holds the nodes"));
        let last = nodes[0].0.raft().metrics().borrow().last_applied;
        for (n, store) in &nodes {
            eventually("every node applied the same entries", || {
                n.raft().metrics().borrow().last_applied >= last
            })
            .await;
            assert_eq!(one_integer(store, "SELECT sum(bal) FROM acct"), ACCOUNTS * BALANCE);
        }
        let states: Vec<Vec<Vec<Value>>> = nodes
            .iter()
            .map(|(_, s)| rows(s, "SELECT id, bal FROM acct UNION ALL SELECT id, v FROM reg"))
            .collect();
        assert!(states.windows(2).all(|w| w[0] == w[1]), "{states:?}");
        for (node, store) in nodes {
            stop(node, store).await;
        }
    });
}
