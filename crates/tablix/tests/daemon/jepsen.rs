//! The Jepsen-style test with real daemons: three `tablix up` processes
//! form a cluster, clients run register reads, writes and compare-and-sets
//! and bank transfers through the HTTP API of every node, and a nemesis
//! kills a daemon with SIGKILL and starts it again, or stops one with
//! SIGSTOP and lets it go on, over and over (every other time the
//! leader). The register's history is checked with the
//! linearizability checker; every total the bank shows is the same; no
//! two nodes lead in one term; at the end every node holds the same state
//! and `tablix fsck` is clean on each.
//!
//! `TABLIX_JEPSEN_SECONDS` sets how long the workload runs (default 10;
//! `make jepsen` runs it for 60). The seed is fixed and printed;
//! `TABLIX_JEPSEN_SEED` replaces it (`make jepsen JEPSEN_ROUNDS=N` runs
//! N rounds, each with a seed of its own).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tablix_testkit::register::{History, Op, Ret, Rng, next_op};

use crate::Daemon;
use crate::cluster::{Node, eventually, leader};

const ACCOUNTS: i64 = 5;
const BALANCE: i64 = 100;

/// The API address of every node while it runs (`None` while it is
/// down: a client then waits instead of invoking anything).
type Addrs = Arc<Mutex<Vec<Option<String>>>>;

fn addr_of(addrs: &Addrs, i: usize) -> Option<String> {
    addrs.lock().unwrap()[i].clone()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(15)))
        .build()
        .into()
}

/// The answer's JSON, or `None` when there was none (refused, cut off,
/// not JSON).
fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Option<Value> {
    let mut response = r.ok()?;
    let text = response.body_mut().read_to_string().ok()?;
    serde_json::from_str(&text).ok()
}

/// Rows the first statement changed, or `None` when the outcome is not
/// known: any failure may have left the write applied.
fn executed(agent: &ureq::Agent, addr: &str, query: &str, body: Value) -> Option<u64> {
    let v = answer(
        agent
            .post(format!("http://{addr}/db/execute{query}"))
            .header("Content-Type", "application/json")
            .send(body.to_string()),
    )?;
    let first = &v["results"][0];
    if v.get("error").is_some() || first.get("error").is_some() {
        return None;
    }
    first["rows_affected"].as_u64()
}

/// The single integer a query answers at `level`, or `None` on failure.
fn read_integer(agent: &ureq::Agent, addr: &str, level: &str, q: &str) -> Option<i64> {
    let v = answer(
        agent
            .get(format!("http://{addr}/db/query"))
            .query("level", level)
            .query("q", q)
            .call(),
    )?;
    if v.get("error").is_some() || v["results"][0].get("error").is_some() {
        return None;
    }
    v["results"][0]["values"][0][0].as_i64()
}

/// The node's id and term when it says it leads.
fn leads(agent: &ureq::Agent, addr: &str) -> Option<(u64, u64)> {
    let v = answer(agent.get(format!("http://{addr}/status")).call())?;
    let raft = &v["store"]["raft"];
    if raft["state"] != "Leader" {
        return None;
    }
    Some((raft["term"].as_u64()?, v["cluster"]["id"].as_u64()?))
}

fn register_client(
    c: u64,
    seed: u64,
    deadline: Instant,
    addrs: Addrs,
    history: Arc<History>,
) -> u64 {
    let agent = agent();
    let mut rng = Rng(seed ^ (c + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let node = (c % 3) as usize;
    let mut thread = c << 32;
    let mut next_value = (c as i64 + 1) * 1_000_000;
    let mut unknown = 0;
    while Instant::now() < deadline {
        let Some(addr) = addr_of(&addrs, node) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let op = next_op(&mut rng, &mut next_value);
        let at = history.invoke(thread, op.clone());
        let ret = match &op {
            Op::Read => read_integer(
                &agent,
                &addr,
                "linearizable",
                "SELECT v FROM reg WHERE id = 1",
            )
            .map(Ret::ReadOk),
            Op::Write(v) => executed(
                &agent,
                &addr,
                "",
                json!([["UPDATE reg SET v = ? WHERE id = 1", v]]),
            )
            .map(|n| {
                assert_eq!(n, 1, "a write of the register changed {n} rows");
                Ret::WriteOk
            }),
            Op::Cas(old, new) => executed(
                &agent,
                &addr,
                "",
                json!([["UPDATE reg SET v = ? WHERE id = 1 AND v = ?", new, old]]),
            )
            .map(|n| if n == 1 { Ret::CasOk } else { Ret::CasFailed }),
        };
        match (ret, &op) {
            (Some(r), _) => history.returned(thread, r),
            (None, Op::Read) => history.read_failed(at),
            (None, _) => {
                // In flight for ever: the client goes on as a new thread.
                thread += 1;
                unknown += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(60)));
    }
    unknown
}

/// Transfers in one transaction each, and the bank's total read at every
/// level in turn: every total a node shows is of a committed state.
fn bank_client(c: u64, seed: u64, deadline: Instant, addrs: Addrs) -> Vec<i64> {
    let agent = agent();
    let mut rng = Rng(seed ^ (c + 101).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut totals = Vec::new();
    let levels = ["none", "weak", "linearizable"];
    let mut turn = 0;
    while Instant::now() < deadline {
        let Some(addr) = addr_of(&addrs, c as usize) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let from = 1 + rng.below(ACCOUNTS as u64) as i64;
        let to = 1 + rng.below(ACCOUNTS as u64) as i64;
        let amount = 1 + rng.below(20) as i64;
        let _ = executed(
            &agent,
            &addr,
            "?transaction",
            json!([
                [
                    "UPDATE acct SET bal = bal - ? WHERE id = ? AND bal >= ?",
                    amount,
                    from,
                    amount
                ],
                [
                    "UPDATE acct SET bal = bal + ? WHERE id = ? AND changes() = 1",
                    amount,
                    to
                ]
            ]),
        );
        turn += 1;
        if let Some(t) = read_integer(
            &agent,
            &addr,
            levels[turn % levels.len()],
            "SELECT sum(bal) FROM acct",
        ) {
            totals.push(t);
        }
    }
    totals
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn registers_stay_linearizable_and_the_bank_keeps_its_total_while_daemons_are_killed() {
    tablix_testkit::require::fuse(
        "registers_stay_linearizable_and_the_bank_keeps_its_total_while_daemons_are_killed",
    );
    let seconds: u64 = std::env::var("TABLIX_JEPSEN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed = tablix_testkit::register::seed_from_env(0x5EED_D1E5_2026);
    eprintln!("jepsen (daemons): seed {seed:#x}, {seconds} s of workload");
    let dir = tempfile::tempdir().unwrap();
    let nodes: Arc<Vec<Node>> = Arc::new(Node::three(dir.path()));
    let daemons: Arc<Mutex<Vec<Option<Daemon>>>> = Arc::new(Mutex::new(vec![
        Some(nodes[0].start(&["--bootstrap"])),
        Some(nodes[1].start(&["--join", &nodes[0].raft])),
        Some(nodes[2].start(&["--join", &nodes[0].raft])),
    ]));
    eventually("node 1 to lead all three", || {
        nodes.iter().all(|n| leader(&n.raft) == Some(1))
    });
    let addrs: Addrs = Arc::new(Mutex::new(
        daemons
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.as_ref().map(|d| d.addr.clone()))
            .collect(),
    ));
    let first = addr_of(&addrs, 0).unwrap();
    let setup = answer(
        agent()
            .post(format!("http://{first}/db/execute?transaction"))
            .header("Content-Type", "application/json")
            .send(
                json!([
                    "CREATE TABLE reg(id INTEGER PRIMARY KEY, v INTEGER)",
                    "INSERT INTO reg VALUES (1, 0)",
                    "CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER)",
                    [
                        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
                         INSERT INTO acct SELECT i, ? FROM n",
                        ACCOUNTS,
                        BALANCE
                    ]
                ])
                .to_string(),
            ),
    )
    .unwrap();
    assert!(setup.get("error").is_none(), "{setup}");

    let history: Arc<History> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let registers: Vec<_> = (0..4u64)
        .map(|c| {
            let (addrs, history) = (Arc::clone(&addrs), Arc::clone(&history));
            std::thread::spawn(move || register_client(c, seed, deadline, addrs, history))
        })
        .collect();
    let banks: Vec<_> = (0..3u64)
        .map(|c| {
            let addrs = Arc::clone(&addrs);
            std::thread::spawn(move || bank_client(c, seed, deadline, addrs))
        })
        .collect();

    // The nemesis, one daemon at a time (the leader every other round), so
    // that a majority is always there: SIGKILL and a restart after a
    // while, or, every third round, SIGSTOP and SIGCONT.
    let nemesis = {
        let (nodes, daemons, addrs) =
            (Arc::clone(&nodes), Arc::clone(&daemons), Arc::clone(&addrs));
        std::thread::spawn(move || {
            let mut rng = Rng(seed ^ 0xBAD);
            let (mut killed, mut paused) = (Vec::new(), Vec::new());
            let mut round = 0u64;
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(700 + rng.below(1000)));
                let victim = if round.is_multiple_of(2) {
                    nodes.iter().find_map(|n| leader(&n.raft))
                } else {
                    None
                }
                .map(|id| id as usize - 1)
                .unwrap_or_else(|| rng.below(3) as usize);
                if round % 3 == 2 {
                    // A pause instead: the node stops mid-flight (a leader
                    // that comes back still believing it leads), then goes
                    // on from where it was.
                    let signal = |sig| {
                        if let Some(d) = &daemons.lock().unwrap()[victim] {
                            d.signal(sig);
                        }
                    };
                    signal(nix::sys::signal::Signal::SIGSTOP);
                    paused.push(victim + 1);
                    std::thread::sleep(Duration::from_millis(500 + rng.below(1500)));
                    signal(nix::sys::signal::Signal::SIGCONT);
                } else {
                    addrs.lock().unwrap()[victim] = None;
                    let dead = daemons.lock().unwrap()[victim].take();
                    if let Some(mut d) = dead {
                        d.signal(nix::sys::signal::Signal::SIGKILL);
                        let _ = d.child.wait();
                        killed.push(victim + 1);
                    }
                    std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
                    let back = nodes[victim].start(&[]);
                    addrs.lock().unwrap()[victim] = Some(back.addr.clone());
                    daemons.lock().unwrap()[victim] = Some(back);
                }
                round += 1;
            }
            (killed, paused)
        })
    };
    // The monitor: which node says it leads in which term.
    let monitor = {
        let addrs = Arc::clone(&addrs);
        std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(1)))
                .build()
                .into();
            let mut seen: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
            let mut polls = [0u64; 3];
            while Instant::now() < deadline {
                for (i, polled) in polls.iter_mut().enumerate() {
                    let Some(addr) = addr_of(&addrs, i) else {
                        continue;
                    };
                    *polled += 1;
                    if let Some((term, id)) = leads(&agent, &addr) {
                        seen.entry(term).or_default().insert(id);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (seen, polls)
        })
    };

    let unknown: u64 = registers.into_iter().map(|t| t.join().unwrap()).sum();
    let totals: Vec<i64> = banks.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let (killed, paused) = nemesis.join().unwrap();
    let (leaders, polls) = monitor.join().unwrap();
    eprintln!(
        "jepsen (daemons): killed {killed:?}, paused {paused:?}; leaders by term {leaders:?} ({polls:?} polls)"
    );
    assert!(
        killed.len() >= 2,
        "the nemesis killed too few daemons: {killed:?}"
    );
    for (term, who) in &leaders {
        assert_eq!(
            who.len(),
            1,
            "term {term} had leaders {who:?} (seed {seed:#x})"
        );
    }

    // One last linearizable read through every node, all of them up.
    let agent = agent();
    for i in 0..3 {
        let thread = (100 + i as u64) << 32;
        history.invoke(thread, Op::Read);
        let addr = addr_of(&addrs, i).unwrap();
        let mut value = None;
        eventually("a linearizable read on every node", || {
            value = read_integer(
                &agent,
                &addr,
                "linearizable",
                "SELECT v FROM reg WHERE id = 1",
            );
            value.is_some()
        });
        history.returned(thread, Ret::ReadOk(value.unwrap()));
    }
    let checked = history
        .check(Duration::from_secs(60.max(5 * seconds)), seed, 20)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "jepsen (daemons): {} register operations, {} with a known outcome ({unknown} writes unknown), checked in {:?} by {}",
        checked.invoked, checked.returned, checked.took, checked.by
    );
    assert!(totals.len() > 10, "too few totals read: {}", totals.len());
    assert!(
        totals.iter().all(|t| *t == ACCOUNTS * BALANCE),
        "a read saw the bank's total change: {:?}",
        totals
            .iter()
            .filter(|t| **t != ACCOUNTS * BALANCE)
            .take(5)
            .collect::<Vec<_>>()
    );

    // Every node ends on the same state, and each is clean after it stops.
    let daemons = std::mem::take(&mut *daemons.lock().unwrap());
    let state = |d: &Daemon| {
        crate::rows(
            d,
            "SELECT id, bal FROM acct UNION ALL SELECT id, v FROM reg",
        )
    };
    eventually("every node on the same state", || {
        let states: Vec<_> = daemons.iter().flatten().map(state).collect();
        states.len() == 3 && states.windows(2).all(|w| w[0] == w[1])
    });
    for d in daemons.into_iter().flatten() {
        d.stop();
    }
    for n in nodes.iter() {
        let (code, out) = crate::fsck(&n.data, &[]);
        assert_eq!(code, Some(0), "fsck of node {}:\n{out}", n.id);
        assert!(out.contains("clean"), "{out}");
    }
}
