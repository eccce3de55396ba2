//! The HTTP API against a real server on an ephemeral 127.0.0.1 port.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::{Value as Json, json};
use tablix_testkit::{self as testkit, ApiServer};

struct Server {
    base: String,
    agent: ureq::Agent,
    api: ApiServer,
}

/// How a test server is set up (the testkit's setup, with TLS as a flag:
/// a self-signed certificate for localhost that the client trusts).
#[derive(Default)]
struct Setup {
    body_limit: Option<usize>,
    auth: Option<&'static str>,
    tls: bool,
    readers: Option<usize>,
}

fn server(body_limit: usize) -> Server {
    start(Setup {
        body_limit: Some(body_limit),
        ..Setup::default()
    })
}

fn start(setup: Setup) -> Server {
    let mut agent = ureq::Agent::config_builder().http_status_as_error(false);
    let mut tls = None;
    if setup.tls {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = ureq::tls::Certificate::from_der(cert.cert.der()).to_owned();
        agent = agent.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&[der]))
                .build(),
        );
        tls = Some((cert.cert.pem(), cert.signing_key.serialize_pem()));
    }
    let api = ApiServer::start(testkit::Setup {
        body_limit: setup.body_limit,
        auth: setup.auth.map(String::from),
        tls,
        readers: setup.readers,
        socket: true,
    });
    let scheme = if setup.tls {
        "https://localhost"
    } else {
        "http://127.0.0.1"
    };
    Server {
        base: format!("{scheme}:{}", api.addr.port()),
        agent: agent.build().into(),
        api,
    }
}

impl Server {
    fn post(&self, path: &str, body: &str) -> (u16, Json) {
        self.post_as(None, path, body)
    }

    fn post_as(&self, user: Option<(&str, &str)>, path: &str, body: &str) -> (u16, Json) {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some((u, p)) = user {
            req = req.header("Authorization", basic(u, p));
        }
        let mut r = req.send(body).unwrap();
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut r = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[test]
fn execute_and_query_in_every_form() {
    let s = server(1 << 20);
    let (code, j) = s.post(
        "/db/execute",
        r#"["CREATE TABLE foo (id INTEGER NOT NULL PRIMARY KEY, name TEXT, age INTEGER)",
            "INSERT INTO foo(name, age) VALUES('fiona', 20)",
            ["INSERT INTO foo(name, age) VALUES(?, ?)", "declan", 25],
            ["INSERT INTO foo(name, age) VALUES(:name, :age)", {"name": "aoife", "age": 30}]]"#,
    );
    assert_eq!(code, 200);
    assert_eq!(
        j,
        json!({"results": [
            {"last_insert_id": 0, "rows_affected": 0},
            {"last_insert_id": 1, "rows_affected": 1},
            {"last_insert_id": 2, "rows_affected": 1},
            {"last_insert_id": 3, "rows_affected": 1}
        ]})
    );
    let (code, text) =
        s.get("/db/query?q=SELECT%20id%2C%20name%20FROM%20foo%20WHERE%20age%20%3E%2021");
    assert_eq!(code, 200);
    let j: Json = serde_json::from_str(&text).unwrap();
    assert_eq!(
        j,
        json!({"results": [{"columns": ["id", "name"], "types": ["integer", "text"], "values": [[2, "declan"], [3, "aoife"]]}]})
    );
    let (_, j) = s.post(
        "/db/query?associative&timings",
        r#"[["SELECT name FROM foo WHERE id = ?", 1]]"#,
    );
    assert_eq!(j["results"][0]["rows"], json!([{"name": "fiona"}]));
    assert_eq!(j["results"][0]["types"], json!({"name": "text"}));
    assert!(j["results"][0]["time"].as_f64().unwrap() >= 0.0);
    assert!(j["time"].as_f64().unwrap() >= 0.0);
}

#[test]
fn unified_endpoint_answers_reads_and_writes_in_their_shapes() {
    let s = server(1 << 20);
    let (_, j) = s.post(
        "/db/request",
        r#"["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)", "SELECT x FROM t", "INSERT INTO t VALUES (2) RETURNING x"]"#,
    );
    assert_eq!(
        j,
        json!({"results": [
            {"last_insert_id": 0, "rows_affected": 0},
            {"last_insert_id": 1, "rows_affected": 1},
            {"columns": ["x"], "types": ["integer"], "values": [[1]]},
            {"columns": ["x"], "types": ["integer"], "values": [[2]]}
        ]})
    );
    // A read-only request is served by the readers.
    let (_, j) = s.post("/db/request", r#"["SELECT count(*) AS n FROM t"]"#);
    assert_eq!(j["results"][0]["values"], json!([[2]]));
}

#[test]
fn transactions_roll_back_on_the_first_error() {
    let s = server(1 << 20);
    s.post("/db/execute", r#"["CREATE TABLE t(x UNIQUE)"]"#);
    let (code, j) = s.post(
        "/db/execute?transaction",
        r#"["INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)"]"#,
    );
    assert_eq!(code, 200);
    assert_eq!(j["results"].as_array().unwrap().len(), 2);
    assert_eq!(
        j["results"][1]["error"],
        json!("UNIQUE constraint failed: t.x")
    );
    let (_, j) = s.post("/db/query", r#"["SELECT count(*) FROM t"]"#);
    assert_eq!(j["results"][0]["values"], json!([[0]]));
}

#[test]
fn bad_input_gets_clear_errors() {
    let s = server(256);
    // Malformed SQL: a per-statement error, like rqlite.
    let (code, j) = s.post("/db/execute", r#"["CREAT TABLE t(x)"]"#);
    assert_eq!(code, 200);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("syntax error"),
        "{j}"
    );
    // Malformed JSON and unknown options: the whole request is refused.
    let (code, j) = s.post("/db/execute", r#"["CREATE"#);
    assert_eq!(code, 400);
    assert!(
        j["error"].as_str().unwrap().contains("not valid JSON"),
        "{j}"
    );
    let (code, j) = s.post("/db/execute?transactoin", r#"["SELECT 1"]"#);
    assert_eq!(code, 400);
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .contains("unknown option \"transactoin\""),
        "{j}"
    );
    // Unknown named parameter.
    let (_, j) = s.post("/db/query", r#"[["SELECT :a", {"a": 1, "b": 2}]]"#);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("unknown parameter \"b\""),
        "{j}"
    );
    // Too large.
    let big = format!(r#"["SELECT '{}'"]"#, "x".repeat(1000));
    let (code, j) = s.post("/db/execute", &big);
    assert_eq!(code, 413, "{j}");
    // A write through the query endpoint.
    let (_, j) = s.post("/db/query", r#"["CREATE TABLE t(x)"]"#);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("readonly"),
        "{j}"
    );
    // A write to a system table.
    let (_, j) = s.post("/db/execute", r#"["DELETE FROM tablix_meta"]"#);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("system table"),
        "{j}"
    );
    // GET /db/query without q.
    let (code, body) = s.get("/db/query");
    assert_eq!(code, 400);
    assert!(body.contains("missing q"), "{body}");
}

#[test]
fn status_and_readiness() {
    let s = server(1 << 20);
    s.post("/db/execute", r#"["CREATE TABLE t(x)"]"#);
    let (code, body) = s.get("/readyz");
    assert_eq!(code, 200);
    assert!(body.contains("[+]store ok"), "{body}");
    let (code, body) = s.get("/status?pretty");
    assert_eq!(code, 200);
    let j: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(j["store"]["mode"], json!("sync"));
    assert_eq!(j["store"]["stats"]["commands"], json!(1));
    assert_eq!(j["tablix"]["pid"], json!(std::process::id()));
}

const USERS: &str = r#"[
    {"username": "writer", "password": "w-secret", "perms": ["execute", "query", "status", "ready"]},
    {"username": "reader", "password": "r-secret", "perms": ["query"]},
    {"username": "admin", "password": "a-secret", "perms": ["all"], "uid": 0}
]"#;

#[test]
fn requests_are_attributed_and_permissions_checked() {
    let s = start(Setup {
        auth: Some(USERS),
        ..Setup::default()
    });
    // Loopback without credentials: the socket's owner (this test's user).
    let (code, j) = s.post("/db/query", r#"["SELECT count(*) FROM tablix_meta"]"#);
    assert_eq!(code, 200, "{j}");
    let me = nix::unistd::geteuid().as_raw();
    if me == 0 {
        assert!(
            j["results"][0]["values"].is_array(),
            "root reads raw state: {j}"
        );
    } else {
        assert!(
            j["results"][0]["error"].as_str().unwrap().contains("raw"),
            "{j}"
        );
    }
    let (code, body) = s.get("/status");
    assert_eq!(code, 200);
    let status: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(status["caller"]["uid"], json!(me));
    // API users get what their permissions allow.
    let (code, j) = s.post_as(
        Some(("reader", "r-secret")),
        "/db/execute",
        r#"["CREATE TABLE t(x)"]"#,
    );
    assert_eq!(code, 403, "{j}");
    assert!(j["error"].as_str().unwrap().contains("\"execute\""), "{j}");
    let (code, _) = s.post_as(
        Some(("writer", "w-secret")),
        "/db/execute",
        r#"["CREATE TABLE t(x)"]"#,
    );
    assert_eq!(code, 200);
    let (code, j) = s.post_as(
        Some(("reader", "r-secret")),
        "/db/query",
        r#"["SELECT count(*) FROM t"]"#,
    );
    assert_eq!((code, &j["results"][0]["values"]), (200, &json!([[0]])));
    // API users are nobody to the file system, and raw state is not theirs
    // unless granted.
    let (_, j) = s.post_as(
        Some(("writer", "w-secret")),
        "/db/query",
        r#"["SELECT * FROM tablix_inode"]"#,
    );
    assert!(
        j["results"][0]["error"].as_str().unwrap().contains("raw"),
        "{j}"
    );
    let (_, j) = s.post_as(
        Some(("admin", "a-secret")),
        "/db/query",
        r#"["SELECT count(*) FROM tablix_inode"]"#,
    );
    assert!(j["results"][0]["values"].is_array(), "{j}");
    // Wrong credentials are refused, whatever the transport.
    let (code, j) = s.post_as(Some(("writer", "nope")), "/db/query", r#"["SELECT 1"]"#);
    assert_eq!(code, 401, "{j}");
}

#[test]
fn tls_serves_the_same_api() {
    let s = start(Setup {
        tls: true,
        auth: Some(USERS),
        ..Setup::default()
    });
    let (code, j) = s.post_as(
        Some(("writer", "w-secret")),
        "/db/request",
        r#"["SELECT 40 + 2"]"#,
    );
    assert_eq!(code, 200, "{j}");
    assert_eq!(j["results"][0]["values"], json!([[42]]));
    // Plain HTTP to a TLS port gets nowhere.
    let plain = s.base.replace("https://localhost", "http://127.0.0.1");
    let r = ureq::Agent::new_with_defaults()
        .get(format!("{plain}/readyz"))
        .call();
    assert!(r.is_err());
}

#[test]
fn large_results_stream_and_are_bounded() {
    let s = server(1 << 20);
    s.post("/db/execute", r#"["CREATE TABLE big(b)", "INSERT INTO big SELECT randomblob(1000000) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20) SELECT x FROM c)"]"#);
    let (code, j) = s.post("/db/query?blob_array", r#"["SELECT b FROM big"]"#);
    assert_eq!(code, 200);
    let rows = j["results"][0]["values"].as_array().unwrap();
    // 20 MB of blobs as byte arrays is more than the default 64 MiB bound?
    // No: about 75 MB of JSON, so the result stops with an error.
    assert!(rows.len() < 20, "{} rows", rows.len());
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("larger than the limit"),
        "{}",
        j["results"][0]["error"]
    );
    // In base64 it fits and arrives whole.
    let (code, j) = s.post("/db/query", r#"["SELECT length(b), b FROM big"]"#);
    assert_eq!(code, 200);
    assert_eq!(j["results"][0]["values"].as_array().unwrap().len(), 20);
    assert!(j["results"][0].get("error").is_none());
}

#[test]
fn db_timeout_tightens_the_time_limit_and_readiness_needs_no_reader() {
    let s = start(Setup {
        readers: Some(1),
        ..Setup::default()
    });
    let runaway =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";
    let (code, j) = s.post("/db/query?db_timeout=300ms", &format!(r#"["{runaway}"]"#));
    assert_eq!(code, 200);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("time limit of 300 ms"),
        "{j}"
    );
    // The only reader busy: readiness still answers, and a write still goes
    // through /db/request.
    let busy = {
        let store = Arc::clone(&s.api.store);
        std::thread::spawn(move || {
            let mut l = store.config().read_limits();
            l.timeout = std::time::Duration::from_secs(3);
            store.query_into(
                &tablix_store::Principal::root(),
                &[tablix_store::Statement::new(runaway)],
                &l,
                &mut Discard,
            )
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, body) = s.get("/readyz");
    assert_eq!((code, body.contains("store ok")), (200, true));
    let (code, j) = s.post("/db/request", r#"["CREATE TABLE w(x)"]"#);
    assert_eq!(code, 200, "{j}");
    assert!(j["results"][0].get("error").is_none(), "{j}");
    busy.join().unwrap().unwrap();
}

struct Discard;

impl tablix_store::Sink for Discard {
    fn columns(&mut self, _: &[String]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn row(&mut self, _: &[tablix_store::Cell<'_>]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn end_rows(&mut self, _: &[String]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn executed(&mut self, _: i64, _: u64) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn error(&mut self, _: &str) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn end_statement(&mut self, _: f64) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
}

/// The id a BEGIN answered.
fn tx_id(j: &Json) -> String {
    j["results"][0]["transaction"]
        .as_str()
        .unwrap_or_else(|| panic!("no transaction in {j}"))
        .to_string()
}

#[test]
fn interactive_transactions_span_requests_and_the_first_committer_wins() {
    let s = server(1 << 20);
    let (code, _) = s.post(
        "/db/execute",
        r#"["CREATE TABLE acct(id INTEGER PRIMARY KEY, balance INTEGER)", "INSERT INTO acct VALUES (1, 100), (2, 100)"]"#,
    );
    assert_eq!(code, 200);
    // BEGIN answers an id; statements with ?tx=ID read the transaction's
    // own writes, which nobody else sees before COMMIT.
    let (code, j) = s.post("/db/request", r#"["BEGIN"]"#);
    assert_eq!(code, 200, "{j}");
    let a = tx_id(&j);
    assert_eq!(j["results"][0]["readonly"], json!(false));
    let (_, j) = s.post(
        &format!("/db/request?tx={a}"),
        r#"["UPDATE acct SET balance = balance - 30 WHERE id = 1", "SELECT balance FROM acct WHERE id = 1"]"#,
    );
    assert_eq!(j["results"][0]["rows_affected"], json!(1), "{j}");
    assert_eq!(j["results"][1]["values"], json!([[70]]), "{j}");
    let (_, j) = s.post("/db/query", r#"["SELECT balance FROM acct WHERE id = 1"]"#);
    assert_eq!(j["results"][0]["values"], json!([[100]]), "{j}");
    // A second transaction changes the same row and commits first.
    let (_, j) = s.post("/db/execute", r#"["BEGIN"]"#);
    let b = tx_id(&j);
    let (_, j) = s.post(
        &format!("/db/execute?tx={b}"),
        r#"["UPDATE acct SET balance = balance + 5 WHERE id = 1"]"#,
    );
    assert_eq!(j["results"][0]["rows_affected"], json!(1), "{j}");
    let (_, j) = s.post(&format!("/db/execute?tx={b}"), r#"["COMMIT"]"#);
    assert_eq!(j["results"][0]["committed"], json!(true), "{j}");
    let (code, j) = s.post(&format!("/db/request?tx={a}"), r#"["COMMIT"]"#);
    assert_eq!(code, 200);
    assert_eq!(j["results"][0]["conflict"], json!(true), "{j}");
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("conflict"),
        "{j}"
    );
    let (_, j) = s.post("/db/query", r#"["SELECT balance FROM acct ORDER BY id"]"#);
    assert_eq!(j["results"][0]["values"], json!([[105], [100]]), "{j}");
    // The transaction is gone after COMMIT; its id names nothing.
    let (code, j) = s.post(&format!("/db/request?tx={a}"), r#"["SELECT 1"]"#);
    assert_eq!(code, 404, "{j}");
    // BEGIN READONLY keeps its snapshot across requests.
    let (_, j) = s.post("/db/query", r#"["BEGIN READONLY"]"#);
    let r = tx_id(&j);
    assert_eq!(j["results"][0]["readonly"], json!(true));
    s.post("/db/execute", r#"["UPDATE acct SET balance = 0"]"#);
    let (_, j) = s.post(
        &format!("/db/query?tx={r}"),
        r#"["SELECT sum(balance) FROM acct"]"#,
    );
    assert_eq!(j["results"][0]["values"], json!([[205]]), "{j}");
    let (_, j) = s.post(&format!("/db/query?tx={r}"), r#"["END"]"#);
    assert_eq!(j["results"][0]["committed"], json!(true), "{j}");
    // Bad input: COMMIT without an id, BEGIN inside one, DDL inside one,
    // a rolled back transaction.
    let (code, j) = s.post("/db/execute", r#"["COMMIT"]"#);
    assert_eq!(code, 400);
    assert!(j["error"].as_str().unwrap().contains("?tx="), "{j}");
    let (_, j) = s.post("/db/execute", r#"["BEGIN"]"#);
    let c = tx_id(&j);
    let (code, _) = s.post(&format!("/db/execute?tx={c}"), r#"["BEGIN"]"#);
    assert_eq!(code, 400);
    let (_, j) = s.post(&format!("/db/execute?tx={c}"), r#"["CREATE TABLE t2(x)"]"#);
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("interactive transaction"),
        "{j}"
    );
    let (_, j) = s.post(&format!("/db/execute?tx={c}"), r#"["ROLLBACK"]"#);
    assert_eq!(j["results"][0]["rolled_back"], json!(true), "{j}");
    let (code, _) = s.post(&format!("/db/execute?tx={c}"), r#"["COMMIT"]"#);
    assert_eq!(code, 404);
    // BEGIN may lead a request and COMMIT end one: read in the first,
    // write and commit in the second; or all in one.
    let (_, j) = s.post(
        "/db/request",
        r#"["BEGIN", "SELECT balance FROM acct WHERE id = 2"]"#,
    );
    let d = tx_id(&j);
    assert_eq!(j["results"][1]["values"], json!([[0]]), "{j}");
    let (_, j) = s.post(
        &format!("/db/request?tx={d}"),
        r#"["UPDATE acct SET balance = 99 WHERE id = 2", "COMMIT"]"#,
    );
    assert_eq!(j["results"][0]["rows_affected"], json!(1), "{j}");
    assert_eq!(j["results"][1]["committed"], json!(true), "{j}");
    let (_, j) = s.post(
        "/db/execute",
        r#"["BEGIN", "INSERT INTO acct VALUES (3, 3)", "COMMIT"]"#,
    );
    assert_eq!(j["results"][2]["committed"], json!(true), "{j}");
    let (code, j) = s.post(
        "/db/execute",
        r#"["BEGIN", "INSERT INTO acct VALUES (4, 4)", "BEGIN"]"#,
    );
    assert_eq!(code, 400, "{j}");
    let (_, j) = s.post(
        "/db/query",
        r#"["SELECT id, balance FROM acct ORDER BY id"]"#,
    );
    assert_eq!(
        j["results"][0]["values"],
        json!([[1, 0], [2, 99], [3, 3]]),
        "{j}"
    );
    // /status counts them.
    let (_, body) = s.get("/status");
    let status: Json = serde_json::from_str(&body).unwrap();
    let t = &status["transactions"]["stats"];
    assert_eq!(
        (t["committed"].as_u64(), t["conflicts"].as_u64()),
        (Some(4), Some(1)),
        "{t}"
    );
    assert_eq!(t["open"], json!(0));
}

impl Server {
    fn get_bytes(&self, path: &str) -> (u16, Vec<u8>, Option<String>) {
        let mut r = self
            .agent
            .get(format!("{}{path}", self.base))
            .call()
            .unwrap();
        let version = r
            .headers()
            .get("x-rqlite-version")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        (
            r.status().as_u16(),
            r.body_mut()
                .with_config()
                .limit(1 << 30)
                .read_to_vec()
                .unwrap(),
            version,
        )
    }

    fn post_bytes(&self, path: &str, body: &[u8]) -> (u16, Json) {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.base))
            .send(body)
            .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }
}

#[test]
fn rqlite_maintenance_endpoints_back_up_load_and_describe_the_node() {
    let s = server(8 << 20);
    s.post(
        "/db/execute",
        r#"["CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO t(v) VALUES ('one'); INSERT INTO t(v) VALUES ('two')"]"#,
    );
    // Several statements in one element run, and answer as the last.
    let (_, j) = s.post("/db/request", r#"["SELECT 1 AS x; SELECT count(*) AS n FROM t", "INSERT INTO t(v) VALUES ('three'); SELECT 5"]"#);
    assert_eq!(j["results"][0]["columns"], json!(["n"]), "{j}");
    assert_eq!(j["results"][0]["values"], json!([[2]]), "{j}");
    assert!(j["results"][1].get("error").is_none(), "{j}");
    let (_, j) = s.post(
        "/db/execute",
        r#"["INSERT INTO t(v) VALUES ('x'); INSERT INTO nowhere VALUES (1)"]"#,
    );
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("nowhere"),
        "{j}"
    );
    // The version header rqlite's shell reads.
    let (code, _, version) = s.get_bytes("/status");
    assert_eq!(code, 200);
    assert!(version.unwrap().starts_with("tablix "));
    // A backup is a SQLite file of the user tables, or SQL.
    let (code, file, _) = s.get_bytes("/db/backup");
    assert_eq!(code, 200);
    assert!(file.starts_with(b"SQLite format 3\0"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.db");
    std::fs::write(&path, &file).unwrap();
    let b = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = b
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    let system: i64 = b
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'tablix%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!((n, system), (4, 0));
    drop(b);
    let (code, sql, _) = s.get_bytes("/db/backup?fmt=sql");
    assert_eq!(code, 200);
    let sql = String::from_utf8(sql).unwrap();
    assert!(
        sql.starts_with("BEGIN TRANSACTION;") && sql.contains("'three'"),
        "{sql}"
    );
    // Loading the file back replaces the user tables; SQL text loads as
    // one transaction.
    s.post(
        "/db/execute",
        r#"["DELETE FROM t", "CREATE TABLE extra(x)"]"#,
    );
    let (code, j) = s.post_bytes("/db/load", &file);
    assert_eq!(code, 200, "{j}");
    assert!(j["results"][0].get("error").is_none(), "{j}");
    let (_, j) = s.post(
        "/db/query",
        r#"["SELECT count(*) FROM t", "SELECT count(*) FROM sqlite_schema WHERE name = 'extra'"]"#,
    );
    assert_eq!(
        (&j["results"][0]["values"], &j["results"][1]["values"]),
        (&json!([[4]]), &json!([[0]])),
        "{j}"
    );
    let (_, j) = s.post_bytes(
        "/db/load",
        b"PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE u(a);\nINSERT INTO u VALUES(1);\nINSERT INTO u VALUES(2);\nCOMMIT;\n",
    );
    assert_eq!(j["results"][0]["rows_affected"], json!(2), "{j}");
    // A load that fails changes nothing.
    let (_, j) = s.post_bytes(
        "/db/load",
        b"INSERT INTO u VALUES(3);\nINSERT INTO missing VALUES(1);",
    );
    assert!(
        j["results"][0]["error"]
            .as_str()
            .unwrap()
            .contains("nothing of it was applied"),
        "{j}"
    );
    let (_, j) = s.post("/db/query", r#"["SELECT count(*) FROM u"]"#);
    assert_eq!(j["results"][0]["values"], json!([[2]]), "{j}");
    // A data directory's database is refused, as is garbage, for /boot.
    let own = dir.path().join("own.db");
    rusqlite::Connection::open(&own)
        .unwrap()
        .execute_batch("CREATE TABLE tablix_meta(key, value); CREATE TABLE t(k, v)")
        .unwrap();
    let data = std::fs::read(&own).unwrap();
    let (code, j) = s.post_bytes("/db/load", &data);
    assert_eq!(code, 400, "{j}");
    assert!(
        j["error"].as_str().unwrap().contains("tablix's own tables"),
        "{j}"
    );
    let (code, _) = s.post_bytes("/boot", b"not a database");
    assert_eq!(code, 400);
    let (code, j) = s.post_bytes("/boot", &file);
    assert_eq!(code, 200, "{j}");
    // A single daemon is its only node and its own leader.
    let (code, body) = s.get("/nodes?ver=2");
    let nodes: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, &nodes["nodes"][0]["leader"]),
        (200, &json!(true)),
        "{body}"
    );
    let (code, body) = s.get("/leader");
    assert_eq!(code, 200);
    assert!(body.contains("\"leader\":true"), "{body}");
    let (code, body) = s.get("/debug/vars");
    assert_eq!(code, 200);
    assert!(body.contains("\"transactions\""), "{body}");
    // VACUUM is maintenance of the whole file: root (this test's owner
    // of the socket may not be) or raw.
    let (_, j) = s.post("/db/execute", r#"["VACUUM"]"#);
    let me = nix::unistd::geteuid().as_raw();
    if me == 0 {
        assert!(j["results"][0].get("error").is_none(), "{j}");
    } else {
        assert!(
            j["results"][0]["error"].as_str().unwrap().contains("raw"),
            "{j}"
        );
    }
    let (_, j) = s.post("/db/query", r#"["SELECT count(*) FROM t"]"#);
    assert_eq!(j["results"][0]["values"], json!([[4]]), "{j}");
}
