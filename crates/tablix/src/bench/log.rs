//! `tablix bench log`: where a command log should live and what making it
//! durable costs, measured before the log is built (issue: the store
//! becomes a log-driven state machine). Each placement appends groups of
//! stamped replicated Commands (a user's single-row insert, serialized as
//! the store would log it) and applies each group to a state database in
//! one transaction, the way the writer's group commit does; the baseline
//! is today's write path, the state's commit alone.
//!
//! A state applied from a durable log need not fsync its own commits: the
//! last applied index, written in the same transaction, says where replay
//! resumes after a crash. So the placements that keep the log apart run
//! the state at `synchronous=NORMAL` too, one fsync per group in all.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};
use tablix_store::{Principal, ReplicatedCommand, SqlCommand, Stamp, Stamped, Statement, Value};

use crate::cli::LogBenchArgs;

/// Where the log lives, and how the state's commits are synced.
#[derive(Clone, Copy)]
enum Placement {
    /// No log: the state's commit alone, fsync'ed (today's sync mode).
    None,
    /// A log table in the state database, in the same transaction.
    SameTransaction,
    /// A SQLite database of its own (WAL, synchronous=FULL), committed
    /// before the state's transaction, which is not fsync'ed.
    OwnDatabase,
    /// An append-only file, one write and one fdatasync per group, before
    /// the state's transaction, which is not fsync'ed.
    AppendFile,
    /// The same file, with the state's commit fsync'ed as well.
    AppendFileStateSynced,
    /// A file written full of zeros and synced before the run, then
    /// overwritten in place from its start (wrapping at its end), one
    /// write and one fdatasync per group: no append changes its size, as
    /// SQLite's WAL is reused after a checkpoint. State NORMAL.
    PreallocatedFile,
}

/// Size of the preallocated log file.
const PREALLOCATED_BYTES: u64 = 256 << 20;

impl Placement {
    const ALL: [Placement; 6] = [
        Placement::None,
        Placement::SameTransaction,
        Placement::OwnDatabase,
        Placement::AppendFile,
        Placement::AppendFileStateSynced,
        Placement::PreallocatedFile,
    ];

    fn name(self) -> &'static str {
        match self {
            Placement::None => "no log; state commit fsync'ed",
            Placement::SameTransaction => "log table in the state's transaction",
            Placement::OwnDatabase => "own SQLite file (FULL); state NORMAL",
            Placement::AppendFile => "append-only file, fdatasync; state NORMAL",
            Placement::AppendFileStateSynced => "append-only file, fdatasync; state FULL",
            Placement::PreallocatedFile => "preallocated file, fdatasync; state NORMAL",
        }
    }

    /// fsyncs per group, as this placement is written.
    fn fsyncs_per_group(self) -> u32 {
        match self {
            Placement::AppendFileStateSynced => 2,
            _ => 1,
        }
    }

    fn state_synced(self) -> bool {
        matches!(
            self,
            Placement::None | Placement::SameTransaction | Placement::AppendFileStateSynced
        )
    }
}

/// One log entry as the store would write it: index, term and the
/// serialized stamped Command.
fn entry(index: u64) -> anyhow::Result<Vec<u8>> {
    let command = ReplicatedCommand::Sql(SqlCommand {
        statements: vec![Statement::with_params(
            "INSERT INTO bench(v) VALUES (?)",
            tablix_store::Params::Positional(vec![Value::Integer(index as i64)]),
        )],
        transaction: false,
        principal: Principal::root(),
    });
    let stamped = Stamped::new(
        Stamp {
            unix_nanos: index as i64,
            seed: index,
        },
        command,
    );
    Ok(serde_json::to_vec(&stamped)?)
}

fn open_sqlite(path: &Path, synchronous: &str) -> anyhow::Result<Connection> {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    Ok(conn)
}

/// Runs one placement with groups of `batch` entries for `seconds`;
/// returns entries per second.
fn measure(dir: &Path, placement: Placement, batch: usize, seconds: f64) -> anyhow::Result<f64> {
    let state = open_sqlite(
        &dir.join("state.db"),
        if placement.state_synced() {
            "FULL"
        } else {
            "NORMAL"
        },
    )?;
    state.execute_batch(
        "CREATE TABLE bench(id INTEGER PRIMARY KEY, v INTEGER);
         CREATE TABLE applied(id INTEGER PRIMARY KEY CHECK (id = 1), idx INTEGER);
         INSERT INTO applied VALUES (1, 0);
         CREATE TABLE log(idx INTEGER PRIMARY KEY, term INTEGER, entry BLOB);",
    )?;
    let own = match placement {
        Placement::OwnDatabase => {
            let c = open_sqlite(&dir.join("log.db"), "FULL")?;
            c.execute_batch("CREATE TABLE log(idx INTEGER PRIMARY KEY, term INTEGER, entry BLOB)")?;
            Some(c)
        }
        _ => None,
    };
    let mut file: Option<File> = match placement {
        Placement::AppendFile | Placement::AppendFileStateSynced => {
            let path = dir.join("log.bin");
            let _ = std::fs::remove_file(&path);
            Some(OpenOptions::new().create(true).append(true).open(path)?)
        }
        Placement::PreallocatedFile => {
            let path = dir.join("log.bin");
            let mut f = File::create(path)?;
            let zeros = vec![0u8; 1 << 20];
            for _ in 0..PREALLOCATED_BYTES >> 20 {
                f.write_all(&zeros)?;
            }
            f.sync_all()?;
            Some(f)
        }
        _ => None,
    };
    let mut offset = 0u64;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut index = 0u64;
    let mut frame = Vec::new();
    while Instant::now() < deadline {
        let entries: Vec<(u64, Vec<u8>)> = (0..batch)
            .map(|i| {
                let idx = index + 1 + i as u64;
                entry(idx).map(|e| (idx, e))
            })
            .collect::<anyhow::Result<_>>()?;
        // The log first: durable before anything is applied.
        if let Some(c) = &own {
            let tx = c.unchecked_transaction()?;
            for (idx, e) in &entries {
                tx.prepare_cached("INSERT INTO log VALUES (?1, 1, ?2)")?
                    .execute(params![*idx as i64, e])?;
            }
            tx.commit()?;
        }
        if let Some(f) = file.as_mut() {
            frame.clear();
            for (idx, e) in &entries {
                frame.extend_from_slice(&idx.to_le_bytes());
                frame.extend_from_slice(&1u64.to_le_bytes());
                frame.extend_from_slice(&(e.len() as u32).to_le_bytes());
                frame.extend_from_slice(&crc32fast::hash(e).to_le_bytes());
                frame.extend_from_slice(e);
            }
            if matches!(placement, Placement::PreallocatedFile) {
                if offset + frame.len() as u64 > PREALLOCATED_BYTES {
                    offset = 0;
                }
                f.write_all_at(&frame, offset)?;
                offset += frame.len() as u64;
            } else {
                f.write_all(&frame)?;
            }
            f.sync_data()?;
        }
        // Then the state: the group's Commands and the last applied index
        // in one transaction.
        let tx = state.unchecked_transaction()?;
        for (idx, e) in &entries {
            if matches!(placement, Placement::SameTransaction) {
                tx.prepare_cached("INSERT INTO log VALUES (?1, 1, ?2)")?
                    .execute(params![*idx as i64, e])?;
            }
            tx.prepare_cached("INSERT INTO bench(v) VALUES (?1)")?
                .execute([*idx as i64])?;
        }
        if !matches!(placement, Placement::None) {
            tx.prepare_cached("UPDATE applied SET idx = ?1 WHERE id = 1")?
                .execute([(index + batch as u64) as i64])?;
        }
        tx.commit()?;
        index += batch as u64;
    }
    Ok(index as f64 / started.elapsed().as_secs_f64())
}

pub fn run(a: LogBenchArgs) -> anyhow::Result<ExitCode> {
    let dir = a
        .dir
        .unwrap_or_else(|| std::path::PathBuf::from("target/bench/log"));
    std::fs::create_dir_all(&dir)?;
    if a.batches.is_empty() || a.batches.contains(&0) {
        anyhow::bail!("--batches: give one or more group sizes, each at least 1");
    }
    let entry_bytes = entry(1)?.len();
    let mut results = vec![vec![Vec::new(); a.batches.len()]; Placement::ALL.len()];
    for round in 0..a.repeat {
        for (p, placement) in Placement::ALL.iter().enumerate() {
            for (b, &batch) in a.batches.iter().enumerate() {
                results[p][b].push(measure(&dir, *placement, batch, a.seconds)?);
            }
        }
        eprintln!("round {}/{} done", round + 1, a.repeat);
    }
    println!(
        "command log placement: entries of {entry_bytes} bytes (a stamped single-row insert), applied in groups; {} s per run, median of {} rounds, on {}",
        a.seconds,
        a.repeat,
        dir.display()
    );
    print!("{:<46} {:>7}", "placement", "fsyncs");
    for b in &a.batches {
        print!(" {:>14} {:>6}", format!("group {b}: /s"), "ratio");
    }
    println!();
    let base: Vec<f64> = (0..a.batches.len())
        .map(|b| super::median(results[0][b].clone()))
        .collect();
    for (p, placement) in Placement::ALL.iter().enumerate() {
        print!(
            "{:<46} {:>7}",
            placement.name(),
            format!("{}/group", placement.fsyncs_per_group())
        );
        for b in 0..a.batches.len() {
            let m = super::median(results[p][b].clone());
            print!(" {:>14.0} {:>6.2}", m, m / base[b]);
        }
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
