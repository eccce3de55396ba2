//! rqlite's maintenance endpoints: `/db/backup` (the user tables as a
//! SQLite file, or as SQL with `fmt=sql`), `/db/load` and `/boot` (user
//! tables from a SQLite file, replacing today's, or from SQL text, as one
//! transaction), `/leader`, `/debug/vars`, `/snapshot` and `/reap`, and
//! `VACUUM` sent as SQL.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tablix_store::{LoadError, SqlCommand, Stamp, Stamped, Statement, StatementResult, TxControl};
use tokio::sync::mpsc;

use crate::server::{App, Failure, Who, reply, require};

/// Bytes a streamed backup sends at a time.
const CHUNK: usize = 64 * 1024;

/// A `Write` whose bytes go to a response body as they come, in chunks;
/// a client gone makes writes fail.
struct BodyWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl BodyWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl Write for BodyWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A response body written by `job` on a blocking thread; a failure before
/// anything was written fails the response, one after it ends it short.
async fn streamed(
    content_type: &'static str,
    job: impl FnOnce(&mut BodyWriter) -> Result<(), Failure> + Send + 'static,
) -> Result<Response, Failure> {
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<(), Failure>>();
    tokio::task::spawn_blocking(move || {
        let mut w = BodyWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        let r = job(&mut w);
        match r {
            Ok(()) => {
                let _ = w.flush();
                let _ = first_tx.send(Ok(()));
            }
            Err(f) => {
                // The failure goes out as the response while nothing was
                // sent; after that the body ends short.
                let _ = first_tx.send(Err(f));
                let _ =
                    w.tx.blocking_send(Err(std::io::Error::other("the backup failed part way")));
            }
        }
    });
    // The first chunk, or the end, decides the status.
    let first = tokio::select! {
        chunk = rx.recv() => Some(chunk),
        done = first_rx => match done {
            Ok(Err(f)) => return Err(f),
            _ => None,
        },
    };
    let head = match first {
        Some(Some(Ok(bytes))) => Some(bytes),
        Some(Some(Err(e))) => {
            return Err(Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
        }
        _ => None,
    };
    let stream = futures_util::stream::unfold((head, rx), |(head, mut rx)| async move {
        if let Some(h) = head {
            return Some((Ok::<_, std::io::Error>(h), (None, rx)));
        }
        rx.recv().await.map(|c| (c, (None, rx)))
    });
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `GET /db/backup`: the user tables as a SQLite file, or (`fmt=sql`) as
/// SQL, from one snapshot taken while writes go on; `tables=a,b` for
/// some of them.
pub(crate) async fn backup(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    reply(
        async {
            let Who(caller, _) = who?;
            require(caller.perms.backup, &caller, "backup")?;
            if q.get("compress").is_some_and(|v| v != "false") {
                return Err(Failure(
                    StatusCode::BAD_REQUEST,
                    "compressed backups are not supported: leave out compress".into(),
                ));
            }
            let only: Vec<String> = q
                .get("tables")
                .map(|t| {
                    t.split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            let store = Arc::clone(&app.store);
            match q.get("fmt").map(String::as_str) {
                Some("sql") => {
                    streamed("text/plain; charset=utf-8", move |w| {
                        store.dump_sql(&only, w).map_err(Failure::from)
                    })
                    .await
                }
                None | Some("binary") | Some("") => {
                    streamed("application/octet-stream", move |w| {
                        let dir = store.config().data_dir.clone();
                        let file = tempfile::Builder::new()
                            .prefix(".backup-")
                            .tempfile_in(&dir)
                            .map_err(|e| {
                                Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                            })?;
                        store.backup_to(file.path(), &only).map_err(Failure::from)?;
                        let mut f = std::fs::File::open(file.path()).map_err(|e| {
                            Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                        })?;
                        std::io::copy(&mut f, w)
                            .map(|_| ())
                            .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
                    })
                    .await
                }
                Some(other) => Err(Failure(
                    StatusCode::BAD_REQUEST,
                    format!("unknown backup format {other:?}: expected sql or binary"),
                )),
            }
        }
        .await,
    )
}

/// What a SQLite file begins with.
fn is_sqlite(data: &[u8]) -> bool {
    data.starts_with(b"SQLite format 3\0")
}

/// The statements of a SQL text to load: its transaction control and the
/// foreign-key pragma a dump carries (the daemon's settings stay its own)
/// left out; the whole runs as one transaction anyway.
fn sql_to_load(text: &str) -> Vec<Statement> {
    tablix_vfs::split_statements(text)
        .into_iter()
        .filter(|s| TxControl::parse(s).is_none())
        .filter(|s| {
            let w: String = s
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect::<String>()
                .to_ascii_lowercase();
            !w.starts_with("pragmaforeign_keys")
        })
        .map(Statement::new)
        .collect()
}

/// Loads `body` (a SQLite file, or SQL text) as `who`, as one Command:
/// rqlite's shape, one result for the whole.
async fn load_body(app: &Arc<App>, who: &Who, body: Bytes) -> Result<serde_json::Value, Failure> {
    let caller = &who.0;
    require(caller.perms.load, caller, "load")?;
    let started = Instant::now();
    let statements = if is_sqlite(&body) {
        let store = Arc::clone(&app.store);
        tokio::task::spawn_blocking(move || -> Result<Vec<Statement>, Failure> {
            let dir = store.config().data_dir.clone();
            let mut file = tempfile::Builder::new()
                .prefix(".load-")
                .tempfile_in(&dir)
                .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            file.write_all(&body)
                .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            match store.load_statements(file.path()) {
                Ok(s) => Ok(s.into_iter().map(Statement::new).collect()),
                Err(e @ (LoadError::NotSqlite(_) | LoadError::SystemTables)) => {
                    Err(Failure(StatusCode::BAD_REQUEST, e.to_string()))
                }
                Err(LoadError::Store(e)) => Err(Failure::from(e)),
            }
        })
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??
    } else {
        let text = std::str::from_utf8(&body).map_err(|_| {
            Failure(
                StatusCode::BAD_REQUEST,
                "the body is neither a SQLite file nor UTF-8 SQL text".into(),
            )
        })?;
        sql_to_load(text)
    };
    if statements.is_empty() {
        return Ok(json!({ "results": [{}] }));
    }
    let command = SqlCommand {
        statements,
        transaction: true,
        principal: caller.principal.clone(),
    };
    let mut limits = app.store.config().write_limits();
    // A load is as large as its data: it has the read time limit, longer
    // than a write's.
    limits.timeout = limits.timeout.max(app.store.config().read_timeout);
    let applied = app
        .store
        .submit_sql(Stamped::new(Stamp::now(), command), limits)
        .await?;
    let mut result = json!({});
    let mut rows = 0u64;
    for (i, s) in applied.statements.iter().enumerate() {
        match &s.result {
            StatementResult::Error(e) => {
                result = json!({ "error": format!("{e} (statement {} of the load; nothing of it was applied)", i + 1) });
                break;
            }
            StatementResult::Executed {
                last_insert_id,
                rows_affected,
            } => {
                rows += rows_affected;
                result = json!({ "last_insert_id": last_insert_id, "rows_affected": rows });
            }
            StatementResult::Rows(_) => {}
        }
    }
    result["time"] = json!(started.elapsed().as_secs_f64());
    Ok(json!({ "results": [result] }))
}

/// `POST /db/load`: user tables from a SQLite file (replacing today's) or
/// from SQL text, in one transaction.
pub(crate) async fn load(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let who = who?;
            let body = body.map_err(|r| Failure(r.status(), r.body_text()))?;
            let out = load_body(&app, &who, body).await?;
            Ok(axum::Json(out).into_response())
        }
        .await,
    )
}

/// `POST /boot`: rqlite boots a node from a SQLite file; here the user
/// tables are replaced by the file's, as `/db/load` does.
pub(crate) async fn boot(
    State(app): State<Arc<App>>,
    who: Result<Who, Failure>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let who = who?;
            let body = body.map_err(|r| Failure(r.status(), r.body_text()))?;
            if !is_sqlite(&body) {
                return Err(Failure(
                    StatusCode::BAD_REQUEST,
                    "invalid SQLite data".into(),
                ));
            }
            let out = load_body(&app, &who, body).await?;
            match out["results"][0]["error"].as_str() {
                Some(e) => Err(Failure(StatusCode::BAD_REQUEST, e.to_string())),
                None => Ok(axum::Json(out).into_response()),
            }
        }
        .await,
    )
}

/// This daemon as rqlite describes a node, when it is not one of a
/// cluster: the only node, its own leader.
pub(crate) fn this_node(app: &App) -> serde_json::Value {
    let scheme = if app.info.tls { "https" } else { "http" };
    json!({
        "id": "1",
        "api_addr": format!("{scheme}://{}", app.info.http_addr),
        "addr": "",
        "voter": true,
        "reachable": true,
        "leader": true,
        "time": 0.0,
    })
}

/// `GET /leader`: the node that leads (this one, on a single daemon).
pub(crate) async fn leader(State(app): State<Arc<App>>, who: Result<Who, Failure>) -> Response {
    reply(
        async {
            let Who(caller, _) = who?;
            require(
                caller.perms.status || caller.perms.leader_ops,
                &caller,
                "leader-ops",
            )?;
            let Some(cluster) = app.config.cluster.clone() else {
                return Ok(axum::Json(this_node(&app)).into_response());
            };
            let nodes = cluster.nodes(false, Duration::from_secs(2)).await;
            match nodes.iter().find(|n| n.leader) {
                Some(n) => Ok(axum::Json(crate::cluster::node_json(n)).into_response()),
                None => Err(Failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no leader is known now".into(),
                )),
            }
        }
        .await,
    )
}

/// `GET /debug/vars`: the counters rqlite's expvar shows, tablix's.
pub(crate) async fn vars(State(app): State<Arc<App>>, who: Result<Who, Failure>) -> Response {
    reply((|| {
        let Who(caller, _) = who?;
        require(caller.perms.status, &caller, "status")?;
        Ok(axum::Json(json!({
            "cmdline": std::env::args().collect::<Vec<_>>(),
            "tablix": app.info,
            "store": app.store.stats(),
            "transactions": app.store.tx_stats(),
        }))
        .into_response())
    })())
}

/// `POST /snapshot`: makes everything acknowledged durable in the state
/// (flush, WAL synced); a cluster's Raft snapshots follow
/// `--snapshot-every`.
pub(crate) async fn snapshot(State(app): State<Arc<App>>, who: Result<Who, Failure>) -> Response {
    reply(
        async {
            let Who(caller, _) = who?;
            require(caller.perms.snapshot, &caller, "snapshot")?;
            app.store.flush().await?;
            Ok(StatusCode::OK.into_response())
        }
        .await,
    )
}

/// `POST /reap`: rqlite removes old snapshots and checkpoints WALs; tablix
/// keeps neither beyond what its own policy does.
pub(crate) async fn reap(State(app): State<Arc<App>>, who: Result<Who, Failure>) -> Response {
    reply(
        async {
            let Who(caller, _) = who?;
            require(caller.perms.snapshot, &caller, "snapshot")?;
            app.store.flush().await?;
            Ok(
                axum::Json(json!({ "snapshots_reaped": 0, "wals_checkpointed": 0 }))
                    .into_response(),
            )
        }
        .await,
    )
}

/// Whether `sts` is a lone `VACUUM` (of `main`).
pub(crate) fn is_vacuum(sts: &[Statement]) -> bool {
    let [one] = sts else {
        return false;
    };
    // Asked of every write: no allocation.
    let mut words = one.sql.trim().trim_end_matches(';').split_whitespace();
    let (first, second) = (words.next(), words.next());
    first.is_some_and(|v| v.eq_ignore_ascii_case("vacuum"))
        && second.is_none_or(|s| s.eq_ignore_ascii_case("main"))
        && words.next().is_none()
}

/// `VACUUM` sent as SQL: maintenance of the whole file (the file system's
/// rows included), so only for callers who may read raw state.
pub(crate) async fn vacuum(app: &Arc<App>, who: &Who) -> Result<Response, Failure> {
    let caller = &who.0;
    require(caller.perms.execute, caller, "execute")?;
    let started = Instant::now();
    let result = if caller.principal.raw {
        let store = Arc::clone(&app.store);
        match tokio::task::spawn_blocking(move || store.vacuum()).await {
            Ok(Ok(())) => json!({ "last_insert_id": 0, "rows_affected": 0 }),
            Ok(Err(e)) => json!({ "error": e.to_string() }),
            Err(e) => json!({ "error": e.to_string() }),
        }
    } else {
        json!({ "error": "VACUUM rewrites the whole database, the file system's rows included: only root or an API user granted raw may run it" })
    };
    let mut body = json!({ "results": [result] });
    body["time"] = json!(started.elapsed().as_secs_f64());
    Ok(axum::Json(body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_leave_out_transaction_control_and_the_foreign_key_pragma() {
        let text = "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(a);\nINSERT INTO t VALUES(1);\nCOMMIT;\nPRAGMA foreign_keys = ON;";
        let got: Vec<String> = sql_to_load(text).into_iter().map(|s| s.sql).collect();
        assert_eq!(got, vec!["CREATE TABLE t(a);", "INSERT INTO t VALUES(1);"]);
        assert!(is_sqlite(b"SQLite format 3\0rest"));
        assert!(!is_sqlite(b"CREATE TABLE"));
        assert!(is_vacuum(&[Statement::new("VACUUM")]));
        assert!(is_vacuum(&[Statement::new(" vacuum main; ")]));
        assert!(!is_vacuum(&[Statement::new("VACUUM INTO 'x.db'")]));
        assert!(!is_vacuum(&[Statement::new("VACUUM temp")]));
        assert!(!is_vacuum(&[Statement::new("VACUUM main INTO 'x.db'")]));
        assert!(!is_vacuum(&[Statement::new(
            "INSERT INTO vacuum VALUES (1)"
        )]));
        assert!(!is_vacuum(&[
            Statement::new("VACUUM"),
            Statement::new("SELECT 1")
        ]));
    }
}
