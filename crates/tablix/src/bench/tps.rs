//! The seed's TPS benchmark (SQLite's server-process-edition, seed 002):
//! `t1(a INTEGER PRIMARY KEY, b BLOB(16), c BLOB(16), d BLOB(400))` with
//! indexes on b and c; read/write transactions of five REPLACEs at random
//! keys, read-only transactions of five range reads; rw clients 1..4 and
//! ro clients 0..1, through tablix's embedded API and its HTTP API,
//! against stock SQLite with one writer (WAL; synchronous OFF and FULL)
//! in the same run. tablix's writes are durable as stock's FULL (sync
//! mode: the command log is synced before a commit is answered).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rusqlite::Connection;
use tablix_store::{
    Principal, SqlCommand, Stamp, Statement, StatementResult, Store, StoreConfig, TxKind, TxOutcome,
};

use super::{load, median};
use crate::cli::{TpsBenchArgs, TpsStockArgs};

const SCHEMA: &str = "CREATE TABLE t1(a INTEGER PRIMARY KEY, b BLOB(16), c BLOB(16), d BLOB(400));
CREATE INDEX i1 ON t1(b);
CREATE INDEX i2 ON t1(c);";

/// Rows loaded per statement.
const LOAD_CHUNK: u64 = 50_000;

fn load_sql(from: u64, to: u64) -> String {
    format!(
        "WITH RECURSIVE n(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM n WHERE i < {to})
         INSERT INTO t1 SELECT i, randomblob(16), randomblob(16), randomblob(400) FROM n"
    )
}

/// A read/write transaction's statements: the seed's five REPLACEs.
fn replace_sql(rows: u64) -> String {
    format!(
        "REPLACE INTO t1 VALUES(abs(random() % {rows}), randomblob(16), randomblob(16), randomblob(400))"
    )
}

/// A read-only transaction's statements: the seed's five range reads.
fn range_sql(rows: u64) -> String {
    format!("SELECT * FROM t1 WHERE a>abs((random()%{rows})) LIMIT 10")
}

/// What one configuration achieved, per second.
#[derive(Clone, Copy, Default)]
struct Rates {
    rw: f64,
    ro: f64,
    /// Commits refused as conflicts, per attempted read/write transaction.
    conflict_rate: f64,
}

/// Counters shared by a configuration's client threads.
#[derive(Default)]
struct Tally {
    rw: AtomicU64,
    ro: AtomicU64,
    conflicts: AtomicU64,
    failures: AtomicU64,
    first_failure: std::sync::Mutex<Option<String>>,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut f) = self.first_failure.lock() {
            f.get_or_insert(why);
        }
    }

    fn rates(&self, seconds: f64) -> anyhow::Result<Rates> {
        let failures = self.failures.load(Ordering::Relaxed);
        if failures > 0 {
            let first = self
                .first_failure
                .lock()
                .ok()
                .and_then(|f| f.clone())
                .unwrap_or_default();
            bail!("{failures} transactions failed; the first: {first}");
        }
        let rw = self.rw.load(Ordering::Relaxed) as f64;
        let conflicts = self.conflicts.load(Ordering::Relaxed) as f64;
        Ok(Rates {
            rw: rw / seconds,
            ro: self.ro.load(Ordering::Relaxed) as f64 / seconds,
            conflict_rate: if rw + conflicts > 0.0 {
                conflicts / (rw + conflicts)
            } else {
                0.0
            },
        })
    }
}

/// Runs `rw` and `ro` client threads for `seconds`; each calls its
/// function until stopped.
fn clients(
    rw: usize,
    ro: usize,
    seconds: f64,
    tally: &Arc<Tally>,
    rw_client: impl Fn(usize, &AtomicBool, &Tally) + Send + Sync + 'static,
    ro_client: impl Fn(usize, &AtomicBool, &Tally) + Send + Sync + 'static,
) -> anyhow::Result<Rates> {
    let stop = Arc::new(AtomicBool::new(false));
    let rw_client = Arc::new(rw_client);
    let ro_client = Arc::new(ro_client);
    let mut threads = Vec::new();
    for i in 0..rw + ro {
        let (stop, tally) = (Arc::clone(&stop), Arc::clone(tally));
        let (rwc, roc) = (Arc::clone(&rw_client), Arc::clone(&ro_client));
        threads.push(std::thread::spawn(move || {
            if i < rw {
                rwc(i, &stop, &tally)
            } else {
                roc(i, &stop, &tally)
            }
        }));
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    tally.rates(started.elapsed().as_secs_f64())
}

/// Stock SQLite: one connection per client, WAL, `synchronous` as given;
/// a read/write transaction is BEGIN IMMEDIATE, five REPLACEs, COMMIT.
fn stock(
    path: &Path,
    rows: u64,
    sync: &'static str,
    rw: usize,
    ro: usize,
    seconds: f64,
) -> anyhow::Result<Rates> {
    let tally = Arc::new(Tally::default());
    let p1 = path.to_path_buf();
    let p2 = path.to_path_buf();
    let open = |p: &Path, sync: &str| -> rusqlite::Result<Connection> {
        let c = Connection::open(p)?;
        c.busy_timeout(Duration::from_secs(30))?;
        c.pragma_update(None, "synchronous", sync)?;
        Ok(c)
    };
    clients(
        rw,
        ro,
        seconds,
        &tally,
        move |_, stop, tally| {
            let c = match open(&p1, sync) {
                Ok(c) => c,
                Err(e) => return tally.fail(e.to_string()),
            };
            let sql = replace_sql(rows);
            while !stop.load(Ordering::Relaxed) {
                let r = (|| {
                    c.execute_batch("BEGIN IMMEDIATE")?;
                    let mut st = c.prepare_cached(&sql)?;
                    for _ in 0..5 {
                        st.execute([])?;
                    }
                    drop(st);
                    c.execute_batch("COMMIT")
                })();
                match r {
                    Ok(()) => {
                        tally.rw.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let _ = c.execute_batch("ROLLBACK");
                        tally.fail(e.to_string());
                    }
                }
            }
        },
        move |_, stop, tally| {
            let c = match open(&p2, sync) {
                Ok(c) => c,
                Err(e) => return tally.fail(e.to_string()),
            };
            let sql = range_sql(rows);
            while !stop.load(Ordering::Relaxed) {
                let r = (|| {
                    c.execute_batch("BEGIN")?;
                    let mut st = c.prepare_cached(&sql)?;
                    for _ in 0..5 {
                        let n = st.query_map([], |_| Ok(()))?.count();
                        std::hint::black_box(n);
                    }
                    drop(st);
                    c.execute_batch("COMMIT")
                })();
                match r {
                    Ok(()) => {
                        tally.ro.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let _ = c.execute_batch("ROLLBACK");
                        tally.fail(e.to_string());
                    }
                }
            }
        },
    )
}

/// `bench tps-stock`: one stock run in this process, its rates printed as
/// JSON. It runs apart so that stock SQLite keeps SQLite's own page
/// cache while the embedded runs use the daemon's.
pub fn stock_worker(a: TpsStockArgs) -> anyhow::Result<ExitCode> {
    let sync = match a.sync.as_str() {
        "OFF" => "OFF",
        "FULL" => "FULL",
        other => bail!("--sync takes OFF or FULL, not {other:?}"),
    };
    let r = stock(&a.path, a.rows, sync, 1, 0, a.seconds)?;
    println!(
        "{}",
        serde_json::json!({"rw": r.rw, "ro": r.ro, "conflict_rate": r.conflict_rate})
    );
    Ok(ExitCode::SUCCESS)
}

/// A stock run in a process of its own (`stock_worker`).
fn stock_apart(path: &Path, rows: u64, sync: &str, seconds: f64) -> anyhow::Result<Rates> {
    let v = super::in_child(
        "tps-stock",
        &[
            "--sync".into(),
            sync.into(),
            "--path".into(),
            path.display().to_string(),
            "--rows".into(),
            rows.to_string(),
            "--seconds".into(),
            seconds.to_string(),
        ],
    )?;
    let field = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("the stock SQLite run's answer has no {k}: {v}"))
    };
    Ok(Rates {
        rw: field("rw")?,
        ro: field("ro")?,
        conflict_rate: field("conflict_rate")?,
    })
}

/// tablix's embedded API: each client begins, runs its five statements
/// one request at a time, and commits.
fn embedded(
    store: &Arc<Store>,
    rows: u64,
    rw: usize,
    ro: usize,
    seconds: f64,
) -> anyhow::Result<Rates> {
    let tally = Arc::new(Tally::default());
    let (s1, s2) = (Arc::clone(store), Arc::clone(store));
    clients(
        rw,
        ro,
        seconds,
        &tally,
        move |_, stop, tally| {
            let root = Principal::root();
            let st = [Statement::new(replace_sql(rows))];
            while !stop.load(Ordering::Relaxed) {
                let r = (|| {
                    let tx = s1.transaction(&root, TxKind::ReadWrite)?;
                    for _ in 0..5 {
                        if let Some(e) = tx.run(&st)?.iter().find(|o| o.result.is_error()) {
                            anyhow::bail!("{:?}", e.result);
                        }
                    }
                    Ok(tx.commit()?)
                })();
                match r {
                    Ok(TxOutcome::Committed { .. }) => {
                        tally.rw.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(TxOutcome::Conflict(_)) => {
                        tally.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(other) => tally.fail(format!("{other:?}")),
                    Err(e) => tally.fail(e.to_string()),
                }
            }
        },
        move |_, stop, tally| {
            let root = Principal::root();
            let st = [Statement::new(range_sql(rows))];
            while !stop.load(Ordering::Relaxed) {
                let r = (|| {
                    let tx = s2.transaction(&root, TxKind::ReadOnly)?;
                    for _ in 0..5 {
                        match &tx.run(&st)?[0].result {
                            StatementResult::Rows(r) => {
                                std::hint::black_box(r.values.len());
                            }
                            other => anyhow::bail!("{other:?}"),
                        }
                    }
                    tx.commit()?;
                    Ok(())
                })();
                match r {
                    Ok(()) => {
                        tally.ro.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.fail(e.to_string()),
                }
            }
        },
    )
}

/// A daemon of this build, without a mount, for the HTTP figures.
struct HttpDaemon {
    child: std::process::Child,
    addr: String,
}

impl Drop for HttpDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn start_daemon(data: &Path) -> anyhow::Result<HttpDaemon> {
    let exe = std::env::current_exe()?;
    let (child, addr) = super::daemon::spawn_ready(
        std::process::Command::new(exe)
            .args([
                "up",
                "--mode",
                "sync",
                "--http",
                "127.0.0.1:0",
                "--write-timeout",
                "300s",
                "--max-transactions",
                "256",
                "--data",
            ])
            .arg(data)
            .env("TABLIX_LOG", "warn")
            .stderr(std::process::Stdio::inherit()),
    )?;
    Ok(HttpDaemon { child, addr })
}

/// Whether an answer's results report an error other than a conflict.
fn failed(json: &serde_json::Value) -> Option<&str> {
    json["results"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|r| r["error"].as_str())
        .filter(|_| json["results"][0]["conflict"] != serde_json::Value::Bool(true))
}

/// Posts `statements` to `path` on `conn`; the answer's results, failing
/// on an answer that is not 200 or reports an error other than a conflict.
async fn post_on(
    conn: &mut load::Conn,
    path: &str,
    statements: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let (status, body) = conn.post(path, serde_json::to_string(statements)?).await?;
    let json: serde_json::Value = serde_json::from_slice(&body).with_context(|| {
        format!(
            "HTTP {status}, not JSON: {}",
            String::from_utf8_lossy(&body)
        )
    })?;
    if let Some(e) = failed(&json) {
        bail!("{e}");
    }
    if status != 200 {
        bail!("HTTP {status}: {json}");
    }
    Ok(json)
}

fn tx_of(json: &serde_json::Value) -> anyhow::Result<String> {
    json["results"][0]["transaction"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("BEGIN answered no transaction: {json}"))
}

/// How a client over HTTP sends a transaction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Requests {
    /// BEGIN, each statement, COMMIT: one request each (seven).
    PerStatement,
    /// BEGIN with the statements, then COMMIT: two requests.
    Two,
}

/// The HTTP API: each client begins, runs its five statements and
/// commits, in requests as `shape` says, on a keep-alive connection; the
/// clients share one thread's event loop (`load.rs`), so that they take
/// as little as they can of the two cores the daemon runs on.
fn over_http(
    addr: &str,
    rows: u64,
    rw: usize,
    ro: usize,
    seconds: f64,
    shape: Requests,
) -> anyhow::Result<Rates> {
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    load::on_one_thread(rw + ro, |i| {
        let tally = Arc::clone(&tally);
        let mut conn = load::Conn::new(addr);
        async move {
            let (begin, sql) = if i < rw {
                ("BEGIN", replace_sql(rows))
            } else {
                ("BEGIN READONLY", range_sql(rows))
            };
            while Instant::now() < until {
                match http_transaction(&mut conn, shape, begin, &sql).await {
                    Ok(_) if i >= rw => {
                        tally.ro.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(done) if done["results"][0]["committed"] == true => {
                        tally.rw.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        tally.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.fail(format!("{e:#}")),
                }
            }
            Ok(())
        }
    })?;
    tally.rates(started.elapsed().as_secs_f64())
}

/// One transaction over HTTP: `begin`, `sql` five times, COMMIT, in
/// requests as `shape` says. Returns the COMMIT's answer.
async fn http_transaction(
    conn: &mut load::Conn,
    shape: Requests,
    begin: &str,
    sql: &str,
) -> anyhow::Result<serde_json::Value> {
    const PATH: &str = "/db/request";
    let id = match shape {
        Requests::PerStatement => {
            let id = tx_of(&post_on(conn, PATH, &[begin]).await?)?;
            let path = format!("{PATH}?tx={id}");
            for _ in 0..5 {
                post_on(conn, &path, &[sql]).await?;
            }
            id
        }
        Requests::Two => tx_of(&post_on(conn, PATH, &[begin, sql, sql, sql, sql, sql]).await?)?,
    };
    post_on(conn, &format!("{PATH}?tx={id}"), &["COMMIT"]).await
}

/// Creates the seed's table with `rows` rows through a daemon's API.
fn load_http(addr: &str, rows: u64) -> anyhow::Result<()> {
    const PATH: &str = "/db/execute?transaction";
    load::on_one_thread(1, |_| {
        let mut conn = load::Conn::new(addr);
        async move {
            let schema: Vec<&str> = SCHEMA.split(';').filter(|s| !s.trim().is_empty()).collect();
            post_on(&mut conn, PATH, &schema).await?;
            let mut from = 1;
            while from <= rows {
                let to = (from + LOAD_CHUNK - 1).min(rows);
                post_on(&mut conn, PATH, &[&load_sql(from, to)]).await?;
                from = to + 1;
            }
            Ok(())
        }
    })?;
    Ok(())
}

/// Creates the seed's table with `rows` rows in a stock database.
fn load_stock(path: &Path, rows: u64) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let c = Connection::open(path)?;
    c.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    c.pragma_update(None, "synchronous", "OFF")?;
    c.execute_batch(SCHEMA)?;
    let mut from = 1;
    while from <= rows {
        let to = (from + LOAD_CHUNK - 1).min(rows);
        c.execute_batch(&load_sql(from, to))?;
        from = to + 1;
    }
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    Ok(())
}

/// Creates the seed's table with `rows` rows through a store.
fn load_store(store: &Store, rows: u64) -> anyhow::Result<()> {
    let root = Principal::root();
    let command = |sql: &str| SqlCommand {
        statements: sql
            .split(';')
            .filter(|s| !s.trim().is_empty())
            .map(Statement::new)
            .collect(),
        transaction: true,
        principal: root.clone(),
    };
    let check = |r: tablix_store::SqlReply| -> anyhow::Result<()> {
        if let Some(e) = r.statements.iter().find(|s| s.result.is_error()) {
            bail!("loading the table: {:?}", e.result);
        }
        Ok(())
    };
    check(store.apply_sql(Stamp::now(), command(SCHEMA))?)?;
    let mut from = 1;
    while from <= rows {
        let to = (from + LOAD_CHUNK - 1).min(rows);
        check(store.apply_sql(Stamp::now(), command(&load_sql(from, to)))?)?;
        from = to + 1;
    }
    Ok(())
}

struct Row {
    what: String,
    clients: usize,
    rates: Rates,
}

pub fn run(a: TpsBenchArgs) -> anyhow::Result<ExitCode> {
    if a.rows == 0 || a.repeat == 0 || a.rw.contains(&0) || a.http_rw.contains(&0) {
        bail!("--rows, --repeat and every --rw and --http-rw count must be positive");
    }
    // Before anything opens SQLite here: the embedded runs use the page
    // cache the daemon does (on SQLite's own, a commit of the store's
    // large writer caches may walk the whole cache: the store's DESIGN).
    a.pcache.install()?;
    let dir: PathBuf = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/dev/shm/tablix-bench-tps"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let stock_path = dir.join("stock.db");
    eprintln!(
        "loading {} rows into stock SQLite and into tablix ({})",
        a.rows,
        dir.display()
    );
    load_stock(&stock_path, a.rows)?;
    let data = dir.join("tablix-data");
    let _ = std::fs::remove_dir_all(&data);
    let mut config = StoreConfig::new(&data);
    config.write_timeout = Duration::from_secs(300);
    config.max_transactions = 256;
    let store = Arc::new(Store::open(config)?);
    load_store(&store, a.rows)?;
    let daemon_data = dir.join("tablix-daemon");
    let _ = std::fs::remove_dir_all(&daemon_data);
    let daemon = start_daemon(&daemon_data)?;
    load_http(&daemon.addr, a.rows)?;

    let mut table: Vec<(String, usize, Vec<Rates>)> = Vec::new();
    let mut add = |what: String, clients: usize, r: Rates| match table
        .iter_mut()
        .find(|(w, c, _)| *w == what && *c == clients)
    {
        Some((_, _, v)) => v.push(r),
        None => table.push((what, clients, vec![r])),
    };
    for round in 0..a.repeat {
        for sync in ["OFF", "FULL"] {
            let r = stock_apart(&stock_path, a.rows, sync, a.seconds)?;
            add(
                format!("stock SQLite, synchronous={sync}, rw:1, ro:0"),
                1,
                r,
            );
        }
        for &ro in &a.ro {
            for &rw in &a.rw {
                let r = embedded(&store, a.rows, rw, ro, a.seconds)?;
                add(
                    format!("tablix embedded ({}), rw:{rw}, ro:{ro}", a.pcache.name()),
                    rw,
                    r,
                );
            }
            for &rw in &a.http_rw {
                for (shape, how) in [
                    (Requests::PerStatement, "a request per statement"),
                    (Requests::Two, "BEGIN with the statements, then COMMIT"),
                ] {
                    let r = over_http(&daemon.addr, a.rows, rw, ro, a.seconds, shape)?;
                    add(format!("tablix over HTTP ({how}), rw:{rw}, ro:{ro}"), rw, r);
                }
            }
        }
        eprintln!("round {}/{} done", round + 1, a.repeat);
    }
    drop(store);
    drop(daemon);
    let rows: Vec<Row> = table
        .into_iter()
        .map(|(what, clients, runs)| Row {
            what,
            clients,
            rates: Rates {
                rw: median(runs.iter().map(|r| r.rw).collect()),
                ro: median(runs.iter().map(|r| r.ro).collect()),
                conflict_rate: median(runs.iter().map(|r| r.conflict_rate).collect()),
            },
        })
        .collect();
    let base_of = |sync: &str| {
        rows.iter()
            .find(|r| r.what.contains(sync))
            .map_or(f64::NAN, |r| r.rates.rw)
    };
    let (base, base_full) = (base_of("synchronous=OFF"), base_of("synchronous=FULL"));
    println!(
        "\nTPS, the seed's benchmark ({} rows, {} s per run, median of {}; tablix stores its data in {}):\n",
        a.rows,
        a.seconds,
        a.repeat,
        dir.display()
    );
    println!(
        "| configuration | TPS per client | TPS total (read-only) | conflicts | vs stock rw:1 OFF | vs stock rw:1 FULL |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        let ro = if r.rates.ro > 0.0 {
            format!(" ({:.0})", r.rates.ro)
        } else {
            String::new()
        };
        println!(
            "| {} | {:.0} | {:.0}{} | {:.1}% | {:.2} | {:.2} |",
            r.what,
            r.rates.rw / r.clients as f64,
            r.rates.rw,
            ro,
            r.rates.conflict_rate * 100.0,
            r.rates.rw / base,
            r.rates.rw / base_full
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_is_counted_apart_and_any_other_error_fails_the_run() {
        let ok: serde_json::Value =
            serde_json::from_str(r#"{"results":[{"committed":true}]}"#).unwrap();
        let conflict: serde_json::Value = serde_json::from_str(
            r#"{"results":[{"error":"conflict: row changed","conflict":true}]}"#,
        )
        .unwrap();
        let error: serde_json::Value = serde_json::from_str(
            r#"{"results":[{"rows_affected":1},{"error":"no such table: t1"}]}"#,
        )
        .unwrap();
        assert_eq!(failed(&ok), None);
        assert_eq!(failed(&conflict), None);
        assert_eq!(failed(&error), Some("no such table: t1"));
    }

    #[test]
    fn a_stock_run_takes_only_off_or_full() {
        let dir = tempfile::tempdir().unwrap();
        let e = stock_worker(TpsStockArgs {
            path: dir.path().join("stock.db"),
            rows: 10,
            sync: "NORMAL".into(),
            seconds: 0.1,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("OFF or FULL") && e.contains("NORMAL"), "{e}");
        assert!(
            !dir.path().join("stock.db").exists(),
            "a refused run opened the database"
        );
    }
}
