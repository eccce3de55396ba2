//! Interactive transactions end to end: driven through `tablix sql` on a
//! pipe by a program that reads each answer before it writes the next,
//! over HTTP, and across kill -9.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value as Json, json};

use super::{BIN, Daemon, sql, text};

/// `tablix sql` with its standard input and output on pipes: lines go in
/// one at a time, and its output lines come back as they are written.
struct Piped {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Piped {
    fn start(data: &std::path::Path) -> Piped {
        let mut child = Command::new(BIN)
            .args(["sql", "--data", data.to_str().unwrap(), "-m", "list"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Piped {
            child,
            stdin,
            lines,
        }
    }

    fn write(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next line of output, which must come while the shell still
    /// waits for more input.
    fn read(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the shell answered nothing while its input stayed open")
    }

    /// Closes standard input and waits: exit status and standard error.
    fn finish(mut self) -> (bool, String) {
        drop(self.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn count(data: &std::path::Path, q: &str) -> String {
    text(&sql(data, &["-m", "list", q])).0.trim().to_string()
}

#[test]
fn a_program_drives_a_transaction_through_the_shell_on_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _d = Daemon::start(&data, &[]);
    assert!(
        sql(&data, &["CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)"])
            .status
            .success()
    );
    assert!(
        sql(&data, &["INSERT INTO t VALUES (1, 'one')"])
            .status
            .success()
    );

    // Each statement is answered as it arrives, inside the transaction.
    let mut p = Piped::start(&data);
    p.write("BEGIN;");
    p.write("INSERT INTO t VALUES (2, 'two');");
    p.write("SELECT count(*) FROM t;");
    assert_eq!(p.read(), "2");
    // Nobody else sees it yet.
    assert_eq!(count(&data, "SELECT count(*) FROM t"), "1");
    p.write("COMMIT;");
    let (ok, err) = p.finish();
    assert!(ok, "{err}");
    assert_eq!(count(&data, "SELECT count(*) FROM t"), "2");

    // Another writer changes the row first: the COMMIT is a conflict,
    // the batch fails and nothing of the transaction is applied.
    let mut p = Piped::start(&data);
    p.write("BEGIN;");
    p.write("UPDATE t SET v = 'mine' WHERE k = 1;");
    p.write("SELECT v FROM t WHERE k = 1;");
    assert_eq!(p.read(), "mine");
    assert!(
        sql(&data, &["UPDATE t SET v = 'theirs' WHERE k = 1"])
            .status
            .success()
    );
    p.write("COMMIT;");
    p.write("SELECT 'not reached';");
    let (ok, err) = p.finish();
    assert!(!ok);
    assert!(
        err.contains("conflict") && err.contains("rolled back"),
        "{err}"
    );
    assert_eq!(count(&data, "SELECT v FROM t WHERE k = 1"), "theirs");

    // Input that ends inside a transaction applies nothing of it.
    let mut p = Piped::start(&data);
    p.write("BEGIN;");
    p.write("DELETE FROM t;");
    let (ok, err) = p.finish();
    assert!(!ok);
    assert!(err.contains("BEGIN without COMMIT"), "{err}");
    assert_eq!(count(&data, "SELECT count(*) FROM t"), "2");
    assert_eq!(
        count(&data, "SELECT open FROM tablix_transaction_stats"),
        "0",
        "the shell rolled its transaction back"
    );
}

fn post(d: &Daemon, path: &str, body: Json) -> Json {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .post(format!("http://{}{path}", d.addr))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

#[test]
fn kill_9_with_open_transactions_keeps_only_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut d = Daemon::start(&data, &[]);
    post(
        &d,
        "/db/execute",
        json!(["CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)"]),
    );
    // Several transactions stay open with writes of their own; one
    // commits.
    let mut open = Vec::new();
    for n in 0..4 {
        let id = post(&d, "/db/request", json!(["BEGIN"]))["results"][0]["transaction"]
            .as_str()
            .unwrap()
            .to_string();
        let r = post(
            &d,
            &format!("/db/request?tx={id}"),
            json!([format!(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 200) INSERT INTO t SELECT {n} * 1000 + i, 'open' FROM s"
            )]),
        );
        assert_eq!(r["results"][0]["rows_affected"], json!(200), "{r}");
        open.push(id);
    }
    let id = post(&d, "/db/request", json!(["BEGIN"]))["results"][0]["transaction"]
        .as_str()
        .unwrap()
        .to_string();
    post(
        &d,
        &format!("/db/request?tx={id}"),
        json!(["INSERT INTO t VALUES (-1, 'committed')"]),
    );
    let r = post(&d, &format!("/db/request?tx={id}"), json!(["COMMIT"]));
    assert_eq!(r["results"][0]["committed"], json!(true), "{r}");
    d.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = d.child.wait();
    let d = Daemon::start(&data, &[]);
    assert_eq!(count(&data, "SELECT group_concat(v) FROM t"), "committed");
    // The transactions died with the daemon.
    let r = post(
        &d,
        &format!("/db/request?tx={}", open[0]),
        json!(["COMMIT"]),
    );
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no open transaction"),
        "{r}"
    );
    drop(d);
    let o = Command::new(BIN)
        .args(["fsck", "--data", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
}
