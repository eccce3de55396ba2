//! The HTTP API against a real server on an ephemeral 127.0.0.1 port.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::{Value as Json, json};
use tablix_api::{ApiConfig, ServerInfo, router};
use tablix_store::{Store, StoreConfig};

struct Server {
    base: String,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

fn server(body_limit: usize) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(StoreConfig::new(dir.path())).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let info = ServerInfo {
        version: "test".into(),
        pid: std::process::id(),
        http_addr: addr.to_string(),
        pcache: "sqlite".into(),
    };
    let app = router(store, info, ApiConfig { body_limit });
    rt.spawn(async move { axum::serve(listener, app).await });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    Server {
        base: format!("http://{addr}"),
        agent,
        _dir: dir,
        _rt: rt,
    }
}

impl Server {
    fn post(&self, path: &str, body: &str) -> (u16, Json) {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
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
