//! The `tablix` binary end to end: a real daemon on an ephemeral 127.0.0.1
//! port, driven by `tablix sql` and plain HTTP.
#![allow(clippy::unwrap_used)]

mod cluster;
mod hardening;
mod jepsen;
mod transactions;

use std::collections::BTreeSet;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tablix_testkit::command::{COMMAND_LIMIT, Limited, output_within, wait_for_exit};

const BIN: &str = env!("CARGO_BIN_EXE_tablix");

struct Daemon {
    child: Child,
    addr: String,
    data: std::path::PathBuf,
    /// What the daemon writes to its standard error, read as it comes:
    /// a daemon that logs more than a pipe holds never blocks on it.
    log: Arc<Mutex<Vec<u8>>>,
    drain: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    fn start(data: &Path, extra: &[&str]) -> Daemon {
        match Daemon::try_start(data, extra) {
            Ok(d) => d,
            Err(e) => panic!("daemon did not start: {e}"),
        }
    }

    fn try_start(data: &Path, extra: &[&str]) -> Result<Daemon, String> {
        Daemon::try_start_env(data, extra, &[])
    }

    /// A daemon with extra environment variables (`TABLIX_KILL_AT`).
    fn start_env(data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        match Daemon::try_start_env(data, extra, env) {
            Ok(d) => d,
            Err(e) => panic!("daemon did not start: {e}"),
        }
    }

    fn try_start_env(data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Daemon, String> {
        let mut cmd = Command::new(BIN);
        cmd.arg("up");
        // Its standard error is a pipe nobody reads until the end: warnings
        // only, unless the test says otherwise.
        cmd.env("TABLIX_LOG", "warn");
        cmd.envs(env.iter().copied());
        if !extra.contains(&"--http") {
            cmd.args(["--http", "127.0.0.1:0"]);
        }
        let mut child = cmd
            .arg("--data")
            .arg(data)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let drain = {
            let (mut stderr, log) = (child.stderr.take().unwrap(), Arc::clone(&log));
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = std::io::Read::read(&mut stderr, &mut buf) {
                    log.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            })
        };
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        match line.split_whitespace().find_map(|w| {
            w.strip_prefix("http=http://")
                .or_else(|| w.strip_prefix("http=https://"))
        }) {
            Some(addr) => Ok(Daemon {
                addr: addr.to_string(),
                data: data.to_path_buf(),
                child,
                log,
                drain: Some(drain),
            }),
            None => {
                let mut failed = Daemon {
                    addr: String::new(),
                    data: data.to_path_buf(),
                    child,
                    log,
                    drain: Some(drain),
                };
                let _ = failed.child.wait();
                Err(failed.log())
            }
        }
    }

    /// What the daemon logged so far; all of it once it has exited.
    fn log(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_some()
            && let Some(drain) = self.drain.take()
        {
            let _ = drain.join();
        }
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    /// Ends the daemon with SIGKILL: its own at its `TABLIX_KILL_AT`
    /// point (within 60 s, or the test fails) when it `kills_itself`,
    /// else the test's after 1.5 s.
    fn die(&mut self, kills_itself: bool) {
        if kills_itself {
            let status = wait_for_exit(&mut self.child, Duration::from_secs(60))
                .expect("the daemon never reached its TABLIX_KILL_AT point");
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9),
                "{status}"
            );
        } else {
            std::thread::sleep(Duration::from_millis(1500));
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// SIGTERM, wait for a clean exit (within 60 s) and return what it
    /// logged.
    fn stop_with_log(mut self) -> String {
        self.signal(Signal::SIGTERM);
        let status = wait_for_exit(&mut self.child, Duration::from_secs(60));
        let log = self.log();
        match status {
            Some(status) if status.success() => log,
            Some(status) => panic!("daemon exited with {status}; it logged:\n{log}"),
            None => panic!("daemon still running 60 s after SIGTERM; it logged:\n{log}"),
        }
    }

    /// SIGTERM and wait for a clean exit.
    fn stop(self) {
        self.stop_with_log();
    }

    fn post(&self, path: &str, body: &str) -> serde_json::Value {
        let agent = crate::http();
        let mut r = agent
            .post(format!("http://{}{path}", self.addr))
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    }
}

impl Drop for Daemon {
    /// A daemon still running when its test ends (a failed assertion) is
    /// killed, and what it logged is shown with the failure. A failed
    /// test's mounts are detached, so that no dead mount outlives it.
    fn drop(&mut self) {
        let running = self.child.try_wait().ok().flatten().is_none();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            detach_mounts_of(&self.data);
        }
        if running && std::thread::panicking() {
            let log = self.log();
            let tail = &log[log.floor_char_boundary(log.len().saturating_sub(16 * 1024))..];
            eprintln!(
                "daemon {} (pid {}) was still running; the end of its log:\n{tail}",
                self.addr,
                self.child.id()
            );
        }
    }
}

/// Detaches what is mounted from `data` (the daemon names its mounts
/// after its data directory).
fn detach_mounts_of(data: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in info.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        if fs.split(' ').nth(1) == data.to_str()
            && let Some(point) = mount.split(' ').nth(4)
        {
            let _ = Command::new("umount").args(["-l", point]).output_limited();
        }
    }
}

/// An HTTP client whose every request fails after a minute, instead of
/// waiting forever on a daemon that stopped answering.
fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

fn tablix(args: &[&str], stdin: &str) -> Output {
    output_within(Command::new(BIN).args(args), stdin.as_bytes())
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn sql(data: &Path, args: &[&str]) -> Output {
    let mut all = vec!["sql", "--data", data.to_str().unwrap()];
    all.extend_from_slice(args);
    tablix(&all, "")
}

#[test]
fn up_serves_sql_and_stops_cleanly_keeping_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start(&data, &[]);
    assert!(data.join("daemon.json").exists());
    let o = sql(
        &data,
        &[
            "CREATE TABLE foo(id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO foo(name) VALUES ('fiona'), ('declan')",
        ],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let o = sql(
        &data,
        &[
            "-m",
            "csv",
            "--headers",
            "SELECT id, name FROM foo ORDER BY id",
        ],
    );
    assert_eq!(text(&o).0, "id,name\n1,fiona\n2,declan\n");
    // The daemon records itself in the memory database.
    let o = sql(&data, &["-m", "list", "SELECT mode FROM daemon"]);
    assert_eq!(text(&o).0, "sync\n");
    d.stop();
    assert!(
        !data.join("daemon.json").exists(),
        "daemon.json left after a clean stop"
    );
    let d = Daemon::start(&data, &["--mode", "async"]);
    let o = sql(
        &data,
        &[
            "-m",
            "list",
            "SELECT count(*) FROM foo",
            "SELECT mode FROM daemon",
        ],
    );
    assert_eq!(text(&o).0, "2\nasync\n");
    d.stop();
}

#[test]
fn a_second_daemon_and_a_busy_address_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &[]);
    let err = Daemon::try_start(dir.path(), &[]).err().unwrap();
    assert!(
        err.contains("is in use by another tablix daemon (pid"),
        "{err}"
    );
    let other = tempfile::tempdir().unwrap();
    let o = tablix(
        &[
            "up",
            "--data",
            other.path().to_str().unwrap(),
            "--http",
            &d.addr,
        ],
        "",
    );
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains(&format!("cannot listen on {}", d.addr)),
        "{:?}",
        text(&o)
    );
    // The refused daemon released its own data directory.
    drop(Daemon::start(other.path(), &[]));
    d.stop();
}

#[test]
fn sql_without_a_daemon_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let o = sql(dir.path(), &["SELECT 1"]);
    assert!(!o.status.success());
    let (_, err) = text(&o);
    assert!(
        err.contains("no tablix daemon is running") && err.contains("tablix up"),
        "{err}"
    );
    // The socket left by a killed daemon.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("tablix.sock")).unwrap());
    let o = sql(dir.path(), &["SELECT 1"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("no tablix daemon is answering") && err.contains("tablix up"),
        "{err}"
    );
}

#[test]
fn bad_flags_and_paths_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let o = tablix(&["up", "--mode", "fast"], "");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("invalid value 'fast'"),
        "{:?}",
        text(&o)
    );
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let bad = dir.path().join("file/data");
    let o = tablix(
        &[
            "up",
            "--http",
            "127.0.0.1:0",
            "--data",
            bad.to_str().unwrap(),
        ],
        "",
    );
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(err.contains("cannot create data directory"), "{err}");
    // The cause is told once, not again as the error's source.
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
    let o = tablix(
        &[
            "up",
            "--http",
            "127.0.0.1:0",
            "--data",
            dir.path().to_str().unwrap(),
            "/nonexistent/mnt",
        ],
        "",
    );
    assert!(!o.status.success());
    assert!(text(&o).1.contains("does not exist"), "{:?}", text(&o));
    let o = tablix(
        &["sql", "--addr", "127.0.0.1:1", "-m", "yaml", "SELECT 1"],
        "",
    );
    assert!(text(&o).1.contains("unknown mode"), "{:?}", text(&o));
}

#[test]
fn the_shell_runs_batches_files_transactions_and_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start(&data, &[]);
    let data_s = data.to_str().unwrap();
    // Standard input: statements spanning lines, a dot-command, a
    // transaction that the shell sends as one request.
    let script = "CREATE TABLE t(\n  k INTEGER PRIMARY KEY,\n  v TEXT, b BLOB, r REAL);\n.mode line\nBEGIN;\nINSERT INTO t VALUES (1, 'a;b', X'00ff', 1.5);\nINSERT INTO t VALUES (2, 'it''s', NULL, 2.0);\nCOMMIT;\nSELECT v FROM t WHERE k = 2;\n";
    let o = tablix(&["sql", "--data", data_s], script);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(text(&o).0, "v = it's\n");
    // A failing transaction leaves nothing behind and fails the batch.
    let o = tablix(
        &["sql", "--data", data_s],
        "BEGIN;\nINSERT INTO t VALUES (3, 'c', NULL, 0);\nINSERT INTO t VALUES (1, 'dup', NULL, 0);\nCOMMIT;\nSELECT 'not reached';\n",
    );
    assert!(!o.status.success());
    let (out, err) = text(&o);
    assert!(
        err.contains("UNIQUE constraint failed") && err.contains("rolled back"),
        "{err}"
    );
    assert!(!out.contains("not reached"));
    let o = sql(&data, &["-m", "list", "SELECT count(*) FROM t"]);
    assert_eq!(text(&o).0, "2\n");
    // -f FILE, and .read from it.
    let file = dir.path().join("more.sql");
    std::fs::write(
        &file,
        "INSERT INTO t(k, v) VALUES (10, 'from file');\n.mode csv\nSELECT v FROM t WHERE k = 10;\n",
    )
    .unwrap();
    let o = sql(&data, &["-f", file.to_str().unwrap()]);
    assert_eq!(text(&o).0, "from file\n", "{:?}", text(&o));
    // A file's consecutive writes travel in groups (128 at most): one
    // failing in the middle of a group leaves what running one statement
    // at a time leaves, and the error names its own line.
    let mut script = String::from("CREATE TABLE g(k INTEGER PRIMARY KEY);\n");
    for k in 1..=200 {
        script.push_str(&format!("INSERT INTO g VALUES ({k});\n"));
    }
    script.push_str("INSERT INTO g VALUES (150);\nINSERT INTO g VALUES (999);\n");
    std::fs::write(&file, &script).unwrap();
    let o = sql(&data, &["-f", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        text(&o)
            .1
            .contains("near line 202: UNIQUE constraint failed"),
        "{:?}",
        text(&o)
    );
    let o = sql(&data, &["-m", "list", "SELECT count(*), max(k) FROM g"]);
    assert_eq!(text(&o).0, "200|200\n");
    // Queries travel in groups too: answers in order, each after the
    // writes before it, and none after the first error.
    std::fs::write(
        &file,
        ".mode list\nSELECT count(*) FROM g;\nDELETE FROM g WHERE k > 100;\nSELECT count(*) FROM g;\nVALUES (1);\nSELECT * FROM nowhere;\nSELECT 'not reached';\n",
    )
    .unwrap();
    let o = sql(&data, &["-f", file.to_str().unwrap()]);
    assert!(!o.status.success());
    let (out, err) = text(&o);
    assert_eq!(out, "200\n100\n1\n", "{err}");
    assert!(err.contains("near line 6: no such table: nowhere"), "{err}");
    let o = sql(&data, &["-m", "json", "SELECT k, b FROM t WHERE k = 1"]);
    assert_eq!(text(&o).0, "[{\"k\":1,\"b\":\"00ff\"}]\n");
    // .dump restores into another daemon and dumps the same again.
    let dump = text(&sql(&data, &[".dump"])).0;
    assert!(
        dump.contains("INSERT INTO \"t\" VALUES(1,'a;b',X'00ff',1.5);"),
        "{dump}"
    );
    assert!(!dump.contains("tablix_meta"), "{dump}");
    let data2 = dir.path().join("data2");
    let d2 = Daemon::start(&data2, &[]);
    let o = tablix(&["sql", "--data", data2.to_str().unwrap()], &dump);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(text(&sql(&data2, &[".dump"])).0, dump);
    // A bad dot-command fails a batch; --addr names a daemon directly.
    let o = tablix(&["sql", "--addr", &d2.addr, ".frobnicate"], "");
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("unknown command: .frobnicate"),
        "{:?}",
        text(&o)
    );
    // Output closed early by its reader ends the shell quietly, with the
    // status SIGPIPE gives.
    let o = output_within(
        Command::new("bash").args([
            "-c",
            &format!(
                "set -o pipefail; {BIN} sql --data {data_s} -m list \"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) SELECT i FROM n\" | head -1"
            ),
        ]),
        b"",
    );
    let (out, err) = text(&o);
    assert_eq!((out.as_str(), o.status.code()), ("1\n", Some(141)), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    d2.stop();
    d.stop();
}

/// Four clients write acknowledged rows (and bump a counter that is not
/// idempotent) until the daemon dies: killed after 1.5 s, or, when it
/// `kills_itself`, on its own. Returns the acknowledged ids.
fn acked_writes_until_death(mut d: Daemon, kills_itself: bool) -> BTreeSet<i64> {
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    // Ids of one run never repeat another's on the same table.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        % 1_000_000
        * 10_000_000_000;
    for w in 0..4u64 {
        let (acked, stop, addr) = (acked.clone(), stop.clone(), d.addr.clone());
        writers.push(std::thread::spawn(move || {
            let agent = crate::http();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = run + w * 1_000_000_000 + i;
                // The counter is not idempotent: a Command applied twice
                // (replayed from the log over a state that held it) shows.
                let body = format!(
                    r#"[["INSERT INTO acked VALUES (?, ?)", {id}, "{}"], "UPDATE applied SET n = n + 1"]"#,
                    "x".repeat(200)
                );
                let ok = agent
                    .post(format!("http://{addr}/db/execute"))
                    .header("Content-Type", "application/json")
                    .send(body)
                    .ok()
                    .and_then(|mut r| r.body_mut().read_to_string().ok())
                    .is_some_and(|t| t.contains("\"rows_affected\":1"));
                if ok {
                    acked.lock().unwrap().insert(id as i64);
                } else {
                    break;
                }
                i += 1;
            }
        }));
    }
    d.die(kills_itself);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    drop(d);
    acked.lock().unwrap().clone()
}

/// Restarts the daemon on `data` and checks that every acknowledged row is
/// there and every logged Command was applied exactly once.
fn every_acked_write_applied_once(data: &Path, acked: &BTreeSet<i64>) {
    let d = Daemon::start(data, &[]);
    let j = d.post(
        "/db/query",
        r#"["PRAGMA integrity_check", "SELECT id FROM acked", "SELECT n = (SELECT count(*) FROM acked) FROM applied"]"#,
    );
    assert_eq!(j["results"][0]["values"], serde_json::json!([["ok"]]));
    assert_eq!(
        j["results"][2]["values"],
        serde_json::json!([[1]]),
        "a Command was applied more or less than once"
    );
    let stored: BTreeSet<i64> = j["results"][1]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_i64().unwrap())
        .collect();
    let lost: Vec<_> = acked.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    d.stop();
}

fn counted_tables(data: &Path) {
    let d = Daemon::start(data, &[]);
    d.post(
        "/db/execute",
        r#"["CREATE TABLE acked(id INTEGER PRIMARY KEY, pad TEXT)", "CREATE TABLE applied(n INTEGER)", "INSERT INTO applied VALUES (0)"]"#,
    );
    d.stop();
}

#[test]
fn kill_9_during_acknowledged_sync_writes_applies_each_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    counted_tables(&data);
    let d = Daemon::start(&data, &["--mode", "sync"]);
    let acked = acked_writes_until_death(d, false);
    assert!(
        acked.len() > 50,
        "too few writes to be meaningful: {}",
        acked.len()
    );
    every_acked_write_applied_once(&data, &acked);
}

#[test]
fn kill_9_at_each_point_of_the_write_path_applies_every_logged_command_once() {
    for point in ["appended", "synced", "applied", "committed"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        counted_tables(&data);
        let kill_at = format!("{point}:40");
        let d = Daemon::start_env(&data, &["--mode", "sync"], &[("TABLIX_KILL_AT", &kill_at)]);
        let acked = acked_writes_until_death(d, true);
        assert!(
            acked.len() >= 30,
            "{point}: only {} acknowledged",
            acked.len()
        );
        // Before the restart, fsck sees the log and the state: entries
        // synced and not committed are still to apply.
        let (code, out) = fsck(&data, &["-n"]);
        assert_eq!(code, Some(0), "{point}: fsck:\n{out}");
        assert!(out.contains("command log: entries"), "{point}: {out}");
        let pending = out.contains("to apply at the next start");
        assert_eq!(
            pending,
            matches!(point, "synced" | "applied"),
            "{point}: logged and not applied?\n{out}"
        );
        every_acked_write_applied_once(&data, &acked);
        let (code, out) = fsck(&data, &["-n"]);
        assert_eq!(code, Some(0), "{point}: fsck after the restart:\n{out}");
        assert!(!out.contains("to apply"), "{point}: {out}");
    }
}

/// The last entry the state holds, as `tablix fsck -n` reports it.
fn state_applied(data: &Path) -> u64 {
    let (code, out) = fsck(data, &["-n"]);
    assert_eq!(code, Some(0), "{out}");
    let at = out.find("the state holds entries up to ").unwrap() + 30;
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Flips a payload byte of entry `index` in the log's segment files.
fn damage_entry(data: &Path, index: u64) {
    let mut key = 1u64.to_le_bytes().to_vec();
    key.extend_from_slice(&index.to_le_bytes());
    for item in std::fs::read_dir(data.join("log")).unwrap() {
        let path = item.unwrap().path();
        let mut b = std::fs::read(&path).unwrap();
        // term 1 and the index follow the CRC and length of a record.
        if let Some(at) = b.windows(16).position(|w| w == key) {
            b[at + 16 + 2] ^= 0x40;
            std::fs::write(&path, b).unwrap();
            return;
        }
    }
    panic!("no record of entry {index} in the log");
}

fn acked_rows_in(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM acked", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_damaged_command_log_is_refused_with_what_is_lost_and_fsck_cuts_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    counted_tables(&data);
    let killed = |n: u32| {
        let at = format!("committed:{n}");
        let d = Daemon::start_env(&data, &["--mode", "sync"], &[("TABLIX_KILL_AT", &at)]);
        acked_writes_until_death(d, true);
    };
    // The state as it was after a first run, kept aside; a second run
    // logs and applies more. With the kept state back, the log holds
    // entries the state lacks: what a crash leaves between sync and
    // commit, only more of them.
    killed(5);
    let first = state_applied(&data);
    let saved = dir.path().join("saved");
    std::fs::create_dir(&saved).unwrap();
    for f in ["tablix.db", "tablix.db-wal"] {
        std::fs::copy(data.join(f), saved.join(f)).unwrap();
    }
    killed(8);
    let second = state_applied(&data);
    assert!(second >= first + 8, "{first} {second}");
    for f in ["tablix.db", "tablix.db-wal"] {
        std::fs::copy(saved.join(f), data.join(f)).unwrap();
    }
    let _ = std::fs::remove_file(data.join("tablix.db-shm"));
    let bad = first + 3;
    damage_entry(&data, bad);
    // The daemon refuses, naming what cannot be applied and the way out.
    let err = match Daemon::try_start(&data, &[]) {
        Ok(_) => panic!("a daemon started on a damaged log"),
        Err(e) => e,
    };
    assert!(
        err.contains("command log is damaged")
            && err.contains(&format!("entry {bad} "))
            && err.contains(&format!("entries {bad}..={second}"))
            && err.contains("tablix fsck"),
        "{err}"
    );
    let (code, out) = fsck(&data, &["-n"]);
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("problem: command log:"), "{out}");
    let (code, out) = fsck(&data, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("repaired: cut the command log"), "{out}");
    let (code, out) = fsck(&data, &["-n"]);
    assert_eq!(code, Some(0), "{out}");
    // The two entries before the damage were applied, none after it; the
    // repair's own Command took the index the damaged entry had.
    assert_eq!(state_applied(&data), bad);
    every_acked_write_applied_once_or_cut(&data, acked_rows_in(&saved.join("tablix.db")) + 2);
    // Damage in entries the state already holds costs nothing: the log is
    // cut with a warning and the daemon starts.
    killed(4);
    let now = state_applied(&data);
    damage_entry(&data, now - 2);
    let d = Daemon::start(&data, &[]);
    let log = d.stop_with_log();
    assert!(log.contains("nothing is lost"), "{log}");
}

/// After a cut log: the counter still matches the rows (each Command
/// applied once), and the state holds `want` rows.
fn every_acked_write_applied_once_or_cut(data: &Path, want: i64) {
    let d = Daemon::start(data, &[]);
    let j = d.post(
        "/db/query",
        r#"["PRAGMA integrity_check", "SELECT count(*) FROM acked", "SELECT n = (SELECT count(*) FROM acked) FROM applied"]"#,
    );
    assert_eq!(j["results"][0]["values"], serde_json::json!([["ok"]]));
    assert_eq!(j["results"][1]["values"], serde_json::json!([[want]]));
    assert_eq!(j["results"][2]["values"], serde_json::json!([[1]]));
    d.stop();
}

#[test]
fn the_page_cache_policy_is_chosen_at_start_and_visible_in_sql() {
    let o = tablix(&["up", "--pcache", "arc"], "");
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o).1;
    assert!(
        err.contains("unknown page-cache policy \"arc\"")
            && err.contains("lru, lfu-hist, s3-fifo, s3-lru, w-tinylfu, sqlite"),
        "{err}"
    );
    for policy in ["lru", "lfu-hist", "s3-fifo", "s3-lru"] {
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start(dir.path(), &["--pcache", policy]);
        d.post(
            "/db/execute",
            r#"["CREATE TABLE t(x)", "INSERT INTO t VALUES (1), (2), (3)"]"#,
        );
        let j = d.post(
            "/db/query",
            r#"["SELECT DISTINCT policy FROM pcache_stats", "SELECT sum(hits) > 0, sum(misses) > 0 FROM pcache_stats"]"#,
        );
        assert_eq!(
            j["results"][0]["values"],
            serde_json::json!([[policy]]),
            "{j}"
        );
        assert_eq!(
            j["results"][1]["values"],
            serde_json::json!([[1, 1]]),
            "{j}"
        );
        let status: serde_json::Value = {
            let mut r = crate::http()
                .get(format!("http://{}/status", d.addr))
                .call()
                .unwrap();
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
        };
        assert_eq!(status["pcache"]["policy"], serde_json::json!(policy));
        assert!(!status["pcache"]["caches"].as_array().unwrap().is_empty());
        d.stop();
    }
    // SQLite's own cache: the table exists and is empty.
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--pcache", "sqlite"]);
    let j = d.post("/db/query", r#"["SELECT count(*) FROM pcache_stats"]"#);
    assert_eq!(j["results"][0]["values"], serde_json::json!([[0]]), "{j}");
    d.stop();
}

/// What a terminal shows of `raw`: control sequences and carriage
/// returns left out.
fn screen(raw: &[u8]) -> String {
    let raw = String::from_utf8_lossy(raw);
    let mut screen = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for n in chars.by_ref() {
                    if n.is_ascii_alphabetic() || n == '~' {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            screen.push(c);
        }
    }
    screen
}

/// Runs a statement that never ends in an interactive shell started with
/// `args`, types Ctrl-C, and checks that the prompt comes back and that
/// the daemon stops the statement while the shell runs on (`cancelled`
/// reads the daemon's count of statements it cancelled).
fn ctrl_c_stops_the_statement(args: &str, home: &Path, cancelled: &dyn Fn() -> u64) {
    let before = cancelled();
    let mut child = in_terminal(&format!("{BIN} sql {args}"), home);
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    writeln!(
        stdin,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n;"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // The terminal's interrupt character: SIGINT to the shell.
    stdin.write_all(b"\x03").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    writeln!(stdin, "SELECT 6 + 1;").unwrap();
    // The daemon stops the statement while the shell goes on (it checks
    // for departed clients every 200 ms), long before the statement's
    // 30 s time limit and before the shell exits (which would close any
    // connection it kept).
    let deadline = Instant::now() + Duration::from_secs(3);
    while cancelled() <= before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = cancelled() > before;
    writeln!(stdin, ".quit").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let screen = screen(&out.stdout);
    assert!(screen.contains("Interrupted"), "{args}: {screen}");
    assert!(
        screen.contains("| 6 + 1 |") && screen.contains("     7 |"),
        "{args}: the shell did not go on: {screen}"
    );
    assert!(stopped, "{args}: the statement was not stopped");
}

/// The daemon's count of statements it cancelled, from `/status` at `url`.
fn statements_cancelled(agent: &ureq::Agent, url: &str) -> u64 {
    let status: serde_json::Value = agent
        .get(format!("{url}/status"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    status["store"]["stats"]["statements_cancelled"]
        .as_u64()
        .unwrap_or_else(|| panic!("no statements_cancelled in {status}"))
}

#[test]
fn ctrl_c_in_the_shell_stops_the_statement_on_the_daemon_and_returns_to_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start(&data, &[]);
    let url = format!("http://{}", d.addr);
    let cancelled = || statements_cancelled(&http(), &url);
    // Over the Unix socket (--data) and over TCP (--addr).
    ctrl_c_stops_the_statement(
        &format!("--data {}", data.display()),
        dir.path(),
        &cancelled,
    );
    ctrl_c_stops_the_statement(&format!("--addr {}", d.addr), dir.path(), &cancelled);
    d.stop();

    // Over HTTPS.
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let (cert, key, ca) = cluster::certificates(&pki, &["api"]).remove(0);
    let data = dir.path().join("tls-data");
    let d = Daemon::start(
        &data,
        &[
            "--http-cert",
            cert.to_str().unwrap(),
            "--http-key",
            key.to_str().unwrap(),
        ],
    );
    let pem = std::fs::read(&ca).unwrap();
    let roots: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
                .build(),
        )
        .build()
        .into();
    let url = format!("https://{}", d.addr);
    let cancelled = || statements_cancelled(&agent, &url);
    ctrl_c_stops_the_statement(
        &format!("--addr {url} --ca-cert {}", ca.display()),
        dir.path(),
        &cancelled,
    );
    d.stop();
}

#[test]
fn the_interactive_shell_edits_continues_and_keeps_history() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &[]);
    let mut child = in_terminal(&format!("{BIN} sql --addr {}", d.addr), dir.path());
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    type_lines(
        &mut stdin,
        &[
            "CREATE TABLE t(x);",
            "INSERT INTO t",
            "VALUES (41);",
            "SELECT x + 1 AS y FROM t;",
            "SELEC 1;",
            ".quit",
        ],
        Duration::from_millis(300),
    );
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let screen = screen(&out.stdout);
    assert!(
        screen.contains("tablix> INSERT INTO t\n   ...> VALUES (41);"),
        "{screen}"
    );
    assert!(screen.contains("| 42 |"), "{screen}");
    assert!(
        screen.contains("Error: near \"SELEC\": syntax error"),
        "{screen}"
    );
    assert!(
        screen.contains("tablix> .quit"),
        "the shell did not go on after the error: {screen}"
    );
    let history = std::fs::read_to_string(dir.path().join(".tablix_history")).unwrap();
    assert!(history.contains("SELECT x + 1 AS y FROM t;"), "{history}");
    d.stop();
}

fn fsck(data: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let o = output_within(
        Command::new(BIN)
            .args(["fsck", "--data"])
            .arg(data)
            .args(extra),
        b"",
    );
    let (out, err) = text(&o);
    (o.status.code(), format!("{out}{err}"))
}

/// Writes files with fsync from several threads until the daemon dies:
/// killed after 1.5 s, or, when it `kills_itself`, on its own (within 60 s,
/// or the test fails); returns what was fsync'ed.
fn write_until_the_daemon_dies(
    mnt: &Path,
    daemon: Daemon,
    kills_itself: bool,
) -> Vec<(String, Vec<u8>)> {
    let synced = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for t in 0..3 {
        let (mnt, synced, stop) = (mnt.to_path_buf(), Arc::clone(&synced), Arc::clone(&stop));
        writers.push(std::thread::spawn(move || {
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("w{t}-{i}");
                let body: Vec<u8> = (0..(i * 7919 % 300_000) + 1)
                    .map(|b| (b * 31 + t * 7 + i) as u8)
                    .collect();
                let r = (|| -> std::io::Result<()> {
                    let mut f = std::fs::File::create(mnt.join(&name))?;
                    f.write_all(&body)?;
                    f.sync_all()
                })();
                match r {
                    Ok(()) => synced.lock().unwrap().push((name, body)),
                    Err(_) => break,
                }
            }
        }));
    }
    let mut daemon = daemon;
    daemon.die(kills_itself);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    synced.lock().unwrap().clone()
}

/// Writes with fsync until the daemon dies (killed by the test, or by
/// itself at `kill_at`, a `TABLIX_KILL_AT` value), then checks that every
/// fsync'ed byte is back after a restart.
fn crash_and_remount(mode: &str, kill_at: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap();
    let env: Vec<(&str, &str)> = kill_at.map(|k| ("TABLIX_KILL_AT", k)).into_iter().collect();
    let daemon = Daemon::start_env(&data, &["--mode", mode, mnt_s], &env);
    let synced = write_until_the_daemon_dies(&mnt, daemon, kill_at.is_some());
    assert!(
        synced.len() > 10,
        "too few writes before the crash: {}",
        synced.len()
    );
    let (code, out) = fsck(&data, &[]);
    assert_eq!(code, Some(0), "fsck after kill -9 in {mode} mode:\n{out}");
    assert!(out.contains("clean"), "{out}");
    // The stale mount is cleared and every fsync'ed byte is back.
    let daemon = Daemon::start(&data, &["--mode", mode, mnt_s]);
    for (name, body) in &synced {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == *body,
            "{name} differs after the crash ({} vs {} bytes)",
            got.len(),
            body.len()
        );
    }
    let log = daemon.stop_with_log();
    assert!(
        log.contains("cleared a stale mount"),
        "the restart says it cleared the stale mount:\n{log}"
    );
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(mnt_s),
        "the daemon unmounts when it stops"
    );
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn kill_9_during_fsynced_file_writes_keeps_every_byte_sync_mode() {
    tablix_testkit::require::fuse("kill_9_during_fsynced_file_writes_keeps_every_byte_sync_mode");
    crash_and_remount("sync", None);
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn kill_9_during_fsynced_file_writes_keeps_every_byte_async_mode() {
    tablix_testkit::require::fuse("kill_9_during_fsynced_file_writes_keeps_every_byte_async_mode");
    crash_and_remount("async", None);
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn kill_9_in_async_mode_after_an_acknowledged_unsynced_write_keeps_every_fsynced_byte() {
    tablix_testkit::require::fuse(
        "kill_9_in_async_mode_after_an_acknowledged_unsynced_write_keeps_every_fsynced_byte",
    );
    crash_and_remount("async", Some("pending-applied:150"));
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn kill_9_in_async_mode_during_a_flush_keeps_every_fsynced_byte() {
    tablix_testkit::require::fuse("kill_9_in_async_mode_during_a_flush_keeps_every_fsynced_byte");
    // Timed flushes count too: on a busy machine a dozen flushes came
    // before ten files were fsync'ed, too few for the check to mean much.
    crash_and_remount("async", Some("flush-synced:40"));
}

/// A temporary directory (dropped last) with a data directory path and an
/// empty mount point in it.
fn scratch_mount() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (dir, data, mnt)
}

/// A daemon in async mode with a flush interval of `interval_ms`.
fn async_daemon(data: &Path, mnt: &Path, interval_ms: u32) -> Daemon {
    let interval = interval_ms.to_string();
    let mnt = mnt.to_str().unwrap();
    Daemon::start(
        data,
        &["--mode", "async", "--flush-interval-ms", &interval, mnt],
    )
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn kill_9_in_async_mode_keeps_what_a_program_wrote_a_few_intervals_ago_to_a_file_it_holds_open() {
    tablix_testkit::require::fuse(
        "kill_9_in_async_mode_keeps_what_a_program_wrote_a_few_intervals_ago_to_a_file_it_holds_open",
    );
    let (_dir, data, mnt) = scratch_mount();
    let mnt_s = mnt.to_str().unwrap();
    let mut daemon = async_daemon(&data, &mnt, 100);
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    // Written, neither fsync'ed nor closed: the kernel's writeback cache
    // has it, and would send it to the daemon only after 30 s.
    let mut held = std::fs::File::create(mnt.join("held")).unwrap();
    held.write_all(&body).unwrap();
    // One helper serves every push while the file stays open.
    let daemon_pid = daemon.child.id();
    cluster::eventually("the daemon's push helper", || {
        !push_helpers_of(daemon_pid).is_empty()
    });
    let helpers = push_helpers_of(daemon_pid);
    assert_eq!(helpers.len(), 1, "push helpers: {helpers:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        push_helpers_of(daemon_pid),
        helpers,
        "the helper was replaced"
    );
    // SIGKILL after 1.5 s more, over 15 flush intervals after the write.
    daemon.die(false);
    drop(held);
    // The helper ends with the daemon, at the end of its requests (a
    // zombie until whoever inherited it reaps it).
    let stat = Path::new("/proc").join(helpers[0].to_string()).join("stat");
    let running = || {
        std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    };
    cluster::eventually("the push helper to end with its killed daemon", || {
        !running()
    });
    let daemon = Daemon::start(&data, &["--mode", "async", mnt_s]);
    let got = std::fs::read(mnt.join("held")).unwrap();
    assert!(
        got == body,
        "a write held open for over 15 flush intervals was lost with the daemon: {} of {} bytes came back",
        got.len(),
        body.len()
    );
    daemon.stop();
}

/// The processes whose parent is `parent` and that run as a push helper
/// (`tablix push-writeback`).
fn push_helpers_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (Ok(stat), Ok(cmdline)) = (
            std::fs::read_to_string(entry.path().join("stat")),
            std::fs::read(entry.path().join("cmdline")),
        ) else {
            continue;
        };
        // The parent is the second field after the command's ")".
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && cmdline.split(|b| *b == 0).any(|a| a == b"push-writeback") {
            found.push(pid);
        }
    }
    found
}

/// Ends the FUSE connection of the mount at `mnt` (its device number read
/// beforehand as `dev`), as `/sys/fs/fuse/connections/N/abort` does, so
/// that a test that found a daemon unable to die leaves no hung mount.
fn abort_fuse_connection(dev: u64) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(dir)
            .status();
    }
    let minor = nix::sys::stat::minor(dev);
    let _ = std::fs::write(dir.join(minor.to_string()).join("abort"), "1");
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_daemon_killed_while_the_kernel_writes_back_to_it_dies_and_its_mount_ends() {
    tablix_testkit::require::fuse(
        "a_daemon_killed_while_the_kernel_writes_back_to_it_dies_and_its_mount_ends",
    );
    let (_dir, data, mnt) = scratch_mount();
    let mnt_s = mnt.to_str().unwrap();
    // Pushes every 10 ms: the kill lands while the kernel writes back.
    let mut daemon = async_daemon(&data, &mnt, 20);
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(&mnt).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, stop) = (mnt.join("growing"), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(path).unwrap();
            let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
            let mut written = 0u64;
            // Dirty pages all the time, never synced, until the mount fails.
            while !stop.load(Ordering::Relaxed) && f.write_all(&chunk).is_ok() {
                written += 1;
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    daemon.signal(Signal::SIGKILL);
    let died = wait_for_exit(&mut daemon.child, Duration::from_secs(20));
    if died.is_none() {
        abort_fuse_connection(dev);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(
        died.is_some(),
        "a daemon killed while the kernel wrote its mount back did not die within 20 s (its mount's connection was then aborted)"
    );
    assert!(written > 0, "nothing was written before the kill");
    // The restarted daemon clears the stale mount and serves again.
    let daemon = Daemon::start(&data, &["--mode", "async", mnt_s]);
    std::fs::write(mnt.join("after"), b"served").unwrap();
    assert_eq!(std::fs::read(mnt.join("after")).unwrap(), b"served");
    daemon.stop();
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn fsck_reports_and_repairs_damage() {
    tablix_testkit::require::fuse("fsck_reports_and_repairs_damage");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let daemon = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/lost"), b"find me").unwrap();
    std::fs::write(mnt.join("counted"), vec![1u8; 100_000]).unwrap();
    // fsck refuses while the daemon runs.
    let (code, out) = fsck(&data, &[]);
    assert_ne!(code, Some(0));
    assert!(out.contains("stop it before running fsck"), "{out}");
    daemon.stop();
    assert_eq!(fsck(&data, &[]).0, Some(0));
    // Damage the rows directly.
    let db = rusqlite::Connection::open(data.join("tablix.db")).unwrap();
    db.execute_batch(
        "UPDATE tablix_inode SET nlink = 7 WHERE ino = (SELECT ino FROM tablix_dirent WHERE name = CAST('counted' AS BLOB));
         DELETE FROM tablix_dirent WHERE name = CAST('lost' AS BLOB);
         INSERT INTO tablix_dirent(parent, name, ino) VALUES (1, CAST('dangling' AS BLOB), 999999);
         UPDATE tablix_inode SET allocated = 5 WHERE ino = (SELECT ino FROM tablix_dirent WHERE name = CAST('counted' AS BLOB));",
    )
    .unwrap();
    drop(db);
    let (code, out) = fsck(&data, &["-n"]);
    assert_eq!(code, Some(4), "{out}");
    for want in [
        "nlink 7, expected 1",
        "names a missing inode",
        "no entry names it",
        "records 5 bytes allocated",
    ] {
        assert!(out.contains(want), "fsck -n must report {want:?}:\n{out}");
    }
    let (code, out) = fsck(&data, &[]);
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = fsck(&data, &[]);
    assert_eq!(code, Some(0), "a repaired file system checks clean:\n{out}");
    let daemon = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    let found: Vec<_> = std::fs::read_dir(mnt.join("lost+found")).unwrap().collect();
    assert_eq!(found.len(), 1);
    let path = found[0].as_ref().unwrap().path();
    assert_eq!(std::fs::read(path).unwrap(), b"find me");
    assert_eq!(
        std::fs::metadata(mnt.join("counted")).unwrap().len(),
        100_000
    );
    daemon.stop();
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn the_mount_helper_mounts_like_mount_8_and_umount_stops_the_daemon() {
    tablix_testkit::require::fuse(
        "the_mount_helper_mounts_like_mount_8_and_umount_stops_the_daemon",
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // mount(8) runs /sbin/mount.fuse.tablix SOURCE DIR -o OPTIONS.
    let helper = dir.path().join("mount.fuse.tablix");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let mount_helper = |options: &str| {
        Command::new(&helper)
            .arg(&data)
            .arg(&mnt)
            .args(["-o", options])
            .output_limited()
    };
    let o = mount_helper("rw,nosuid,mode=async,bogus");
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("unknown mount option \"bogus\""),
        "{:?}",
        text(&o)
    );
    let o = mount_helper("rw,noauto,mode=async");
    assert!(o.status.success(), "{:?}", text(&o));
    std::fs::write(mnt.join("via-fstab"), b"mounted by the helper").unwrap();
    let record = std::fs::read_to_string(data.join("daemon.json")).unwrap();
    assert!(record.contains("\"pid\""), "{record}");
    let status = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(status.success());
    // Mounted again at once, read-only: the helper waits for the stopping
    // daemon to let go of the directory, then remounts read-only.
    let o = mount_helper("ro");
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(
        std::fs::read(mnt.join("via-fstab")).unwrap(),
        b"mounted by the helper"
    );
    let e = std::fs::write(mnt.join("refused"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let status = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(status.success());
    // The daemon notices and exits, removing its record.
    let deadline = Instant::now() + Duration::from_secs(10);
    while data.join("daemon.json").exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not exit after umount"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let daemon = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(mnt.join("via-fstab")).unwrap(),
        b"mounted by the helper"
    );
    let o = sql(
        &data,
        &[
            "-m",
            "csv",
            "SELECT path, size FROM files WHERE type = 'file'",
        ],
    );
    assert_eq!(text(&o).0.trim(), "/via-fstab,21");
    // A second mount on the same point is refused clearly.
    let other = tempfile::tempdir().unwrap();
    let e = Daemon::try_start(other.path(), &[mnt.to_str().unwrap()])
        .err()
        .unwrap();
    assert!(e.contains("is busy"), "{e}");
    daemon.stop();
}

// ----- pipes, `tablix run` and the process table -----

/// Rows of a query on the daemon's SQL API.
fn rows(d: &Daemon, q: &str) -> Vec<Vec<serde_json::Value>> {
    let agent = crate::http();
    let mut r = agent
        .get(format!("http://{}/db/query", d.addr))
        .query("q", q)
        .call()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let result = &v["results"][0];
    assert!(result.get("error").is_none(), "{q}: {result}");
    result["values"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| r.as_array().cloned().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `q` until its first value satisfies `ok`, for up to 10 s.
/// Runs `command` on a terminal of its own (script(1)), so that the shell
/// runs its line editor, with `home` as HOME; its three streams are piped.
/// Types `lines` into a terminal session's input, `pause` after each so
/// the shell reads them one at a time.
fn type_lines(stdin: &mut impl Write, lines: &[&str], pause: Duration) {
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
        std::thread::sleep(pause);
    }
}

fn in_terminal(command: &str, home: &Path) -> Child {
    Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from bsdutils is needed for the terminal test")
}

fn wait_rows(
    d: &Daemon,
    q: &str,
    ok: impl Fn(&[Vec<serde_json::Value>]) -> bool,
) -> Vec<Vec<serde_json::Value>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = rows(d, q);
        if ok(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "timed out: {q} gave {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sh(script: &str) -> Output {
    output_within(Command::new("sh").arg("-c").arg(script), b"")
}

fn tablix_run(data: &Path, argv: &[&str]) -> Output {
    output_within(
        Command::new(BIN)
            .args(["run", "--data", data.to_str().unwrap(), "--"])
            .args(argv),
        b"",
    )
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn tablix_run_sends_every_pipe_through_the_database_with_unchanged_output() {
    tablix_testkit::require::fuse("tablix_run_sends_every_pipe_through_the_database");
    let tmp = tempfile::tempdir().unwrap();
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let d = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    let pipelines = [
        "seq 1000000 | sort -n | tail -1",
        "seq 20000 | sort -rn | head -3",
        "yes | head -2; echo after",
        "printf 'b\\na\\nc\\n' | sort | tr a-z A-Z | cat -n",
        "echo $(seq 3 | wc -l) lines",
        "seq 100000 | xargs -n 1000 echo | wc -l",
        "seq 50000 | gzip -c | gzip -dc | md5sum",
    ];
    for p in pipelines {
        let want = sh(p);
        let got = tablix_run(&data, &["sh", "-c", p]);
        assert_eq!(text(&got), text(&want), "{p}");
        assert_eq!(got.status.code(), want.status.code(), "{p}");
    }
    // bash's exit statuses and process substitution (a pipe reopened
    // through /dev/fd).
    let script = "yes | head -1 >/dev/null; echo ${PIPESTATUS[@]}; while read l; do echo \"<$l>\"; done < <(seq 3)";
    let want = output_within(Command::new("bash").arg("-c").arg(script), b"");
    let got = tablix_run(&data, &["bash", "-c", script]);
    assert_eq!(text(&got), text(&want));
    // An anonymous pipe opened again through /dev/fd/N never waits for
    // its other end (a FIFO's open would): diff of two substitutions, a
    // read of one, and a write to one whose reader is gone (SIGPIPE).
    for script in [
        "diff <(echo a) <(echo a) && echo same",
        "cat <(echo hi)",
        "exec 3> >(true); sleep 0.5; echo hi > /dev/fd/3; echo not reached",
    ] {
        let want = output_within(Command::new("bash").arg("-c").arg(script), b"");
        let got = tablix_run(&data, &["bash", "-c", script]);
        assert_eq!(text(&got).0, text(&want).0, "{script}");
        assert_eq!(got.status.code(), want.status.code(), "{script}");
    }
    // They really were tablix pipes, reported to programs as FIFOs.
    let got = tablix_run(
        &data,
        &[
            "sh",
            "-c",
            "seq 3 | readlink /proc/self/fd/0; seq 3 | stat -L -c %F /dev/stdin",
        ],
    );
    let (out, err) = text(&got);
    assert!(
        out.contains("/.tablix/pipes/anon-") && out.contains("fifo"),
        "{out} {err}"
    );
    // The kernel releases closed ends asynchronously: let the pipes of
    // the pipelines above go first.
    wait_rows(&d, "SELECT count(*) FROM pipes", |r| r[0][0] == 0);
    pipe_holders_follow_forks_closes_and_exits(&d, &data);
    d.stop();
}

/// Every process holding an end of a pipe is a row of `pid_pipe`, as
/// /proc/PID/fd shows it: the processes of a pipeline hold their ends and
/// the shell that made the pipe (and closed it) holds none; a process that
/// inherits an end and never closes anything holds it too; a holder that
/// exits is gone while the pipe lives on.
fn pipe_holders_follow_forks_closes_and_exits(d: &Daemon, data: &Path) {
    // The README's join: which processes hold which end of which pipe.
    let holders = "SELECT p.id, h.end, x.comm, h.pid FROM pipes p
         JOIN pid_pipe h ON h.pipe = p.id JOIN processes x ON x.pid = h.pid AND x.exit_ns IS NULL
         ORDER BY p.id, h.end";
    let shape = |r: &[Vec<serde_json::Value>]| -> Vec<(String, String)> {
        r.iter()
            .map(|row| {
                (
                    row[1].as_str().unwrap_or("").to_string(),
                    row[2].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    let sleeps = |ends: &[&str]| -> Vec<(String, String)> {
        ends.iter()
            .map(|e| (e.to_string(), "sleep".to_string()))
            .collect()
    };
    let cases: [(&str, &str, &[&str]); 3] = [
        // sh makes the pipe, forks both sides and closes its own ends.
        ("sh", "sleep 60 | sleep 60", &["read", "write"]),
        // Three stages: the middle one holds the first pipe's read end and
        // the second's write end.
        (
            "bash",
            "sleep 60 | sleep 60 | sleep 60",
            &["read", "write", "read", "write"],
        ),
        // The background sleep inherits fd 3 and closes nothing; bash
        // closes its copy after forking it.
        (
            "bash",
            "exec 3> >(sleep 60); sleep 60 & exec 3>&-; wait",
            &["read", "write"],
        ),
    ];
    for (shell, script, ends) in cases {
        let mut running = Command::new(BIN)
            .args([
                "run",
                "--data",
                data.to_str().unwrap(),
                "--",
                shell,
                "-c",
                script,
            ])
            // Its own process group, so that all of it can be stopped.
            .process_group(0)
            .spawn()
            .unwrap();
        let got = wait_rows(d, holders, |r| shape(r) == sleeps(ends));
        // Each pid is a live process whose /proc/PID/fd has that end.
        for row in &got {
            let pid = row[3].as_i64().unwrap();
            let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|l| l.display().to_string())
                .collect();
            assert!(
                fds.iter().any(|l| l.contains("/.tablix/pipes/anon-")),
                "{script}: process {pid} holds no tablix pipe: {fds:?}"
            );
        }
        if script.starts_with("sleep 60 | sleep 60 | sleep 60") {
            // The first sleep exits: the first pipe's write end goes with
            // it, the rest of the pipeline is still there.
            let first = got
                .iter()
                .find(|r| r[1] == "write" && r[0] == got[0][0])
                .unwrap();
            kill(
                Pid::from_raw(first[3].as_i64().unwrap() as i32),
                Signal::SIGKILL,
            )
            .unwrap();
            wait_rows(d, holders, |r| {
                shape(r) == sleeps(&["read", "read", "write"])
            });
        }
        kill(Pid::from_raw(-(running.id() as i32)), Signal::SIGKILL).unwrap();
        wait_for_exit(&mut running, COMMAND_LIMIT).expect("the pipeline outlived SIGKILL");
        wait_rows(d, "SELECT count(*) FROM pipes", |r| r[0][0] == 0);
        wait_rows(d, "SELECT count(*) FROM mem.pid_pipe", |r| r[0][0] == 0);
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn pipe_and_run_commands_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("nodaemon");
    let o = tablix_run(&data, &["true"]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("tablix is not running"),
        "{:?}",
        text(&o)
    );
    let o = tablix(
        &["pipe", "create", "--data", data.to_str().unwrap(), "p"],
        "",
    );
    assert!(
        text(&o).1.contains("tablix is not running"),
        "{:?}",
        text(&o)
    );
    for bad in ["a/b", "..", ""] {
        let o = tablix(
            &["pipe", "create", "--data", data.to_str().unwrap(), bad],
            "",
        );
        assert!(!o.status.success());
        assert!(
            text(&o).1.contains("invalid pipe name"),
            "{bad}: {:?}",
            text(&o)
        );
    }
    let o = tablix(&["pipe", "create", "--mode", "999", "p"], "");
    assert!(text(&o).1.contains("not an octal mode"), "{:?}", text(&o));
    // A daemon without a mount has no pipes to offer.
    let bare = tmp.path().join("bare");
    let d = Daemon::start(&bare, &[]);
    let o = tablix_run(&bare, &["true"]);
    assert!(
        text(&o).1.contains("has no file system mounted"),
        "{:?}",
        text(&o)
    );
    d.stop();
    tablix_testkit::require::fuse("pipe_and_run_commands_say_what_is_wrong");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let d = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    let create = |name: &str| {
        tablix(
            &["pipe", "create", "--data", data.to_str().unwrap(), name],
            "",
        )
    };
    let o = create("jobs");
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(
        text(&o).0.trim(),
        mnt.join(".tablix/pipes/jobs").to_str().unwrap()
    );
    let o = create("jobs");
    assert!(
        text(&o).1.contains("a pipe named \"jobs\" exists"),
        "{:?}",
        text(&o)
    );
    assert_eq!(
        rows(&d, "SELECT name, mode FROM pipes"),
        [[serde_json::json!("jobs"), serde_json::json!(0o600)]]
    );
    let o = tablix(
        &[
            "pipe",
            "create",
            "--data",
            data.to_str().unwrap(),
            "--capacity",
            "8192",
            "small",
        ],
        "",
    );
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(
        rows(&d, "SELECT capacity FROM pipes WHERE name = 'small'"),
        [[serde_json::json!(8192)]]
    );
    let remove = |name: &str| {
        tablix(
            &["pipe", "remove", "--data", data.to_str().unwrap(), name],
            "",
        )
    };
    assert!(remove("jobs").status.success());
    assert!(text(&remove("jobs")).1.contains("no pipe named \"jobs\""));
    d.stop();
}

#[test]
#[ignore = "needs root for the kernel's process events: make test runs it as root"]
fn the_process_table_follows_forks_execs_and_exits() {
    tablix_testkit::require::root(
        "the_process_table_follows_forks_execs_and_exits",
        "listen to the kernel's process events",
    );
    let tmp = tempfile::tempdir().unwrap();
    // The default history: other tests' processes, exiting meanwhile, do
    // not push out the rows this test waits for.
    let d = Daemon::start(&tmp.path().join("default"), &[]);
    let me = std::process::id();
    // Seeded from /proc: this test process is there, with its threads.
    let seeded = rows(
        &d,
        &format!("SELECT tgid, uid FROM processes WHERE pid = {me} AND exit_ns IS NULL"),
    );
    assert_eq!(seeded, [[serde_json::json!(me), serde_json::json!(0)]]);
    // fork + exit with a code.
    let child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
    let pid = child.id();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(3));
    let r = wait_rows(
        &d,
        &format!(
            "SELECT ppid, exit_code, exit_signal, exit_ns > start_ns FROM processes WHERE pid = {pid} ORDER BY id DESC LIMIT 1"
        ),
        |r| r.first().is_some_and(|row| row[1] == 3),
    );
    assert_eq!(r[0][0], me);
    assert_eq!(r[0][2], serde_json::Value::Null);
    assert_eq!(r[0][3], 1);
    // exec: the row follows the new program.
    let mut sleeper = Command::new("sh")
        .args(["-c", "exec sleep 30"])
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    // Waits for the state after the last exec event: an earlier event's
    // /proc read can land inside the second exec, after comm and exe have
    // changed and before the new arguments exist (cmdline reads empty),
    // and the exec event that follows corrects it.
    let r = wait_rows(
        &d,
        &format!("SELECT comm, exe, cmdline FROM processes WHERE pid = {pid} AND exit_ns IS NULL"),
        |r| {
            r.first()
                .is_some_and(|row| row[0] == "sleep" && row[2] == "sleep 30")
        },
    );
    assert!(
        r[0][1].as_str().is_some_and(|e| e.ends_with("/sleep")),
        "{r:?}"
    );
    assert_eq!(r[0][2], "sleep 30");
    // Killed by a signal.
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    wait_rows(
        &d,
        &format!("SELECT exit_signal FROM processes WHERE pid = {pid} ORDER BY id DESC LIMIT 1"),
        |r| r.first().is_some_and(|row| row[0] == 9),
    );
    // A change of user and group (setpriv changes them, then execs).
    let mut nobody = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "30",
        ])
        .spawn()
        .unwrap();
    let pid = nobody.id();
    wait_rows(
        &d,
        &format!(
            "SELECT uid, euid, gid, egid, comm FROM processes WHERE pid = {pid} AND exit_ns IS NULL"
        ),
        |r| {
            r.first()
                .is_some_and(|row| row[..4].iter().all(|v| *v == 65534) && row[4] == "sleep")
        },
    );
    nobody.kill().unwrap();
    nobody.wait().unwrap();
    // Threads share their process's descriptors: the seed's handler_id.
    let threads = rows(
        &d,
        &format!(
            "SELECT count(*) FROM pid_store WHERE handler_id = {} AND pid != handler_id",
            d.child.id()
        ),
    );
    assert!(
        threads[0][0].as_i64().unwrap() > 0,
        "the daemon's threads: {threads:?}"
    );
    let log = d.stop_with_log();
    assert!(!log.contains("polling /proc"), "{log}");
    // The history of exited processes is bounded.
    let d = Daemon::start(&tmp.path().join("bounded"), &["--process-history", "30"]);
    for _ in 0..40 {
        Command::new("true").status().unwrap();
    }
    wait_rows(
        &d,
        "SELECT count(*) FROM processes WHERE exit_ns IS NOT NULL",
        |r| r[0][0] == 30,
    );
    d.stop();
}

#[test]
fn without_the_kernel_connector_the_process_table_polls_proc_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = Daemon::start_env(
        &data,
        &["--process-poll-ms", "50"],
        &[("TABLIX_PROCESS_POLL", "1")],
    );
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id();
    wait_rows(
        &d,
        &format!("SELECT comm FROM processes WHERE pid = {pid} AND exit_ns IS NULL"),
        |r| r.first().is_some_and(|row| row[0] == "sleep"),
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    // Polling sees the exit, not its status.
    let r = wait_rows(
        &d,
        &format!(
            "SELECT exit_code, exit_signal FROM processes WHERE pid = {pid} AND exit_ns IS NOT NULL"
        ),
        |r| !r.is_empty(),
    );
    assert_eq!(r[0], [serde_json::Value::Null, serde_json::Value::Null]);
    let err = d.stop_with_log();
    assert!(err.contains("polling /proc every 50 ms"), "{err}");
    // As another user the daemon still starts and says where the process
    // table comes from: kernel events where the kernel allows unprivileged
    // listeners (Linux 6.6 and later), else polling, with the reason.
    if tablix_testkit::require::is_root() {
        let bin_dir = tempfile::tempdir().unwrap();
        let exe = bin_dir.path().join("tablix");
        std::fs::copy(BIN, &exe).unwrap();
        let world = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
        };
        world(bin_dir.path(), 0o755);
        world(tmp.path(), 0o777);
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe)
            .args(["up", "--http", "127.0.0.1:0", "--data"])
            .arg(tmp.path().join("nobody"))
            .current_dir(tmp.path())
            .env("TABLIX_LOG", "info")
            .env_remove("TABLIX_PROCESS_POLL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(line.starts_with("tablix ready"), "{line} {err}");
        assert!(
            err.contains("process table: following the kernel's process events")
                || err.contains("polling /proc every 1000 ms instead"),
            "{err}"
        );
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn under_tablix_run_sa_restart_decides_whether_an_interrupted_read_restarts() {
    tablix_testkit::require::fuse("sa_restart");
    let tmp = tempfile::tempdir().unwrap();
    let prog = tmp.path().join("sa_restart");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sa_restart.c");
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(&src)
        .output_limited();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let d = Daemon::start(&data, &[mnt.to_str().unwrap()]);
    // read(2) and the C library's stdio input, whose reads are its own.
    for call in ["read", "fgets", "getline", "fread", "getc"] {
        for (arg, want) in [
            ("restart", "read \"one two \", EOF after 1 alarm(s)"),
            ("norestart", "read \"one \", EINTR after 1 alarm(s)"),
        ] {
            let want = format!("{call}: {want}");
            let native = Command::new(&prog).args([arg, call]).output_limited();
            assert_eq!(text(&native).0.trim(), want, "kernel pipe, {arg}");
            let got = tablix_run(&data, &[prog.to_str().unwrap(), arg, call]);
            assert_eq!(
                text(&got).0.trim(),
                want,
                "tablix pipe, {arg}: {:?}",
                text(&got)
            );
        }
    }
    d.stop();
}

/// Whether process `pid` is gone or a zombie.
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_daemon_started_with_exit_with_parent_stops_when_its_parent_exits() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    // A shell starts the daemon, waits for it to be ready, says its pid
    // and exits: the daemon's parent is gone.
    let script = format!(
        "{BIN} up --exit-with-parent --http 127.0.0.1:0 --data '{}' > '{}' 2>&1 &
         pid=$!
         for i in $(seq 1 400); do grep -q 'tablix ready' '{}' && break; sleep 0.05; done
         echo $pid",
        data.display(),
        out.display(),
        out.display()
    );
    let shell = output_within(Command::new("sh").arg("-c").arg(&script), b"");
    let pid: i32 = String::from_utf8_lossy(&shell.stdout)
        .trim()
        .parse()
        .unwrap();
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        said.contains("tablix ready"),
        "the daemon did not start: {said}"
    );
    let until = Instant::now() + Duration::from_secs(30);
    while !exited(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone = exited(pid);
    if !gone {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(gone, "the daemon ran on after its parent exited");
}
