//! Stress test of the memory VFS's lock protocol: many reader and writer
//! threads on one database, each with its own connection. Every write
//! transaction moves money between accounts, so every snapshot a reader
//! sees must sum to the same total. No SQLITE_BUSY may reach this code, no
//! thread may hang, and both readers and writers must make progress.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tablix_vfs::{mem_lock_stats, register_mem_vfs, write_intent};

const ACCOUNTS: i64 = 64;
const TOTAL: i64 = ACCOUNTS * 1000;

fn open(name: &str) -> Connection {
    let c = Connection::open(format!("file:{name}?vfs=tablix-mem")).expect("open");
    c.execute_batch("PRAGMA journal_mode=MEMORY; PRAGMA cache_size=64")
        .expect("pragmas");
    c
}

/// A tiny deterministic generator so a failure can be replayed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn readers_and_writers_never_see_busy_never_deadlock_and_all_progress() {
    register_mem_vfs().expect("register");
    let name = "stress-bank";
    let setup = open(name);
    setup
        .execute_batch(
            "CREATE TABLE account(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE log(id INTEGER PRIMARY KEY, payload BLOB);",
        )
        .expect("schema");
    {
        let _i = write_intent(&setup, "main").expect("intent");
        let tx = setup.unchecked_transaction().expect("begin");
        for id in 0..ACCOUNTS {
            tx.execute("INSERT INTO account VALUES (?1, 1000)", [id])
                .expect("insert");
        }
        tx.commit().expect("commit");
    }

    let writers = 6;
    let readers = 6;
    let per_writer = 400u64;
    let seed = 0x5eed_u64;
    eprintln!("seed {seed:#x}: {writers} writers x {per_writer} transactions, {readers} readers");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let (done_tx, done_rx) = mpsc::channel::<Result<(String, u64), String>>();

    for w in 0..writers {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let run = || -> Result<(String, u64), String> {
                let c = open(name);
                let mut rng = seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                for _ in 0..per_writer {
                    let from = (next(&mut rng) % ACCOUNTS as u64) as i64;
                    let to = (next(&mut rng) % ACCOUNTS as u64) as i64;
                    let amount = (next(&mut rng) % 50) as i64;
                    let _intent = write_intent(&c, "main").map_err(|rc| format!("intent {rc}"))?;
                    c.execute_batch("BEGIN IMMEDIATE")
                        .map_err(|e| e.to_string())?;
                    c.execute(
                        "UPDATE account SET balance = balance - ?2 WHERE id = ?1",
                        [from, amount],
                    )
                    .map_err(|e| e.to_string())?;
                    c.execute(
                        "UPDATE account SET balance = balance + ?2 WHERE id = ?1",
                        [to, amount],
                    )
                    .map_err(|e| e.to_string())?;
                    // Enough data that some transactions spill pages.
                    c.execute("INSERT INTO log(payload) VALUES (zeroblob(2000))", [])
                        .map_err(|e| e.to_string())?;
                    c.execute(
                        "DELETE FROM log WHERE id < (SELECT max(id) - 50 FROM log)",
                        [],
                    )
                    .map_err(|e| e.to_string())?;
                    c.execute_batch("COMMIT").map_err(|e| e.to_string())?;
                }
                Ok((format!("writer {w}"), per_writer))
            };
            let _ = done.send(run());
        });
    }
    for r in 0..readers {
        let done = done_tx.clone();
        let (stop, reads) = (stop.clone(), reads.clone());
        std::thread::spawn(move || {
            let run = || -> Result<(String, u64), String> {
                let c = open(name);
                let mut mine = 0u64;
                while !stop.load(Ordering::Relaxed) || mine == 0 {
                    let sum: i64 = c
                        .query_row("SELECT sum(balance) FROM account", [], |row| row.get(0))
                        .map_err(|e| e.to_string())?;
                    if sum != TOTAL {
                        return Err(format!("reader {r} saw a torn snapshot: {sum}"));
                    }
                    mine += 1;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                Ok((format!("reader {r}"), mine))
            };
            let _ = done.send(run());
        });
    }
    drop(done_tx);

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut finished_writers = 0;
    let mut progress = Vec::new();
    while progress.len() < writers + readers {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(Ok((who, n))) => {
                if who.starts_with("writer") {
                    finished_writers += 1;
                    if finished_writers == writers {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                progress.push((who, n));
            }
            Ok(Err(e)) => panic!("seed {seed:#x}: {e}"),
            Err(_) => panic!(
                "seed {seed:#x}: no progress for 120 s (deadlock?); finished: {progress:?}; lock stats {:?}",
                mem_lock_stats(name)
            ),
        }
    }
    let stats = mem_lock_stats(name).expect("stats");
    let avg = |total: u64, n: u64| total.checked_div(n).unwrap_or(0) / 1000;
    eprintln!("progress: {progress:?}");
    eprintln!(
        "waits: shared {} (avg {} us, max {} us), exclusive {} (avg {} us, max {} us), \
         write intent {} (avg {} us, max {} us); write transactions {}, busy {}",
        stats.shared_waits,
        avg(stats.shared_wait_ns, stats.shared_waits),
        stats.shared_wait_max_ns / 1000,
        stats.exclusive_waits,
        avg(stats.exclusive_wait_ns, stats.exclusive_waits),
        stats.exclusive_wait_max_ns / 1000,
        stats.gate_waits,
        avg(stats.gate_wait_ns, stats.gate_waits),
        stats.gate_wait_max_ns / 1000,
        stats.transactions,
        stats.busy,
    );
    assert_eq!(stats.busy, 0, "SQLITE_BUSY was returned");
    assert!(
        stats.transactions > writers as u64 * per_writer,
        "every write transaction must have ended: {stats:?}"
    );
    assert!(
        progress.iter().all(|(_, n)| *n > 0),
        "a thread starved: {progress:?}"
    );
    let sum: i64 = setup
        .query_row("SELECT sum(balance) FROM account", [], |row| row.get(0))
        .expect("final sum");
    assert_eq!(sum, TOTAL);
}
