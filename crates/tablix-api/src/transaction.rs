//! Interactive transactions over HTTP, in rqlite's manner: a request
//! whose one statement is `BEGIN` (or `BEGIN READONLY`) opens one and is
//! answered with its id; requests carrying `?tx=ID` run their statements
//! inside it, one request at a time, each answered as any other; a request
//! of `COMMIT` (or `END`) or `ROLLBACK` with `?tx=ID` ends it. The same on
//! `/db/execute`, `/db/query` and `/db/request`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::json;
use tablix_store::{Statement, TxControl, TxKind, TxOutcome};

use crate::encode::Shape;
use crate::options::Options;
use crate::server::{App, Failure, Who, json_response, require, stream};

/// The header that names a transaction BEGIN opened.
const TX_HEADER: &str = "x-tablix-transaction";

/// What a request asks of interactive transactions, if anything.
enum Asked {
    Begin(TxKind),
    Commit(String),
    Rollback(String),
    Run(String),
}

fn asked(o: &Options, sts: &[Statement]) -> Result<Option<Asked>, Failure> {
    let control = match sts {
        [one] if matches!(one.params, tablix_store::Params::None) => TxControl::parse(&one.sql),
        _ => None,
    };
    let bad = |m: String| Failure(StatusCode::BAD_REQUEST, m);
    Ok(match (control, &o.tx) {
        (None, None) => None,
        (None, Some(id)) => Some(Asked::Run(id.clone())),
        (Some(TxControl::Begin(kind)), None) => Some(Asked::Begin(kind)),
        (Some(TxControl::Begin(_)), Some(id)) => {
            return Err(bad(format!(
                "transaction {id} is open already: COMMIT or ROLLBACK it (as a request with ?tx={id}) before beginning another"
            )));
        }
        (Some(TxControl::Commit), Some(id)) => Some(Asked::Commit(id.clone())),
        (Some(TxControl::Rollback), Some(id)) => Some(Asked::Rollback(id.clone())),
        (Some(TxControl::Commit | TxControl::Rollback), None) => {
            return Err(bad(
                "no transaction named: send COMMIT or ROLLBACK with ?tx=ID, the id BEGIN answered"
                    .into(),
            ));
        }
    })
}

/// Serves the request if it asks something of interactive transactions;
/// None leaves it to the ordinary handlers.
pub(crate) async fn serve(
    app: &Arc<App>,
    who: &Who,
    sts: &[Statement],
    o: &Options,
    shape: Shape,
) -> Option<Result<Response, Failure>> {
    let asked = match asked(o, sts) {
        Ok(Some(a)) => a,
        Ok(None) => return None,
        Err(f) => return Some(Err(f)),
    };
    Some(match asked {
        Asked::Begin(kind) => begin(app, who, kind, o).await,
        Asked::Run(id) => run(app, who, id, sts.to_vec(), o, shape).await,
        Asked::Commit(id) => commit(app, who, id, o).await,
        Asked::Rollback(id) => rollback(app, who, id, o).await,
    })
}

/// A transaction's permission: executing for one that writes, querying
/// for a read-only one.
fn permitted(who: &Who, kind: TxKind) -> Result<(), Failure> {
    let caller = &who.0;
    match kind {
        TxKind::ReadWrite => require(caller.perms.execute, caller, "execute"),
        TxKind::ReadOnly => require(caller.perms.query, caller, "query"),
    }
}

/// Runs blocking store work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, tablix_store::StoreError> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(Failure::from)
}

fn answer(o: &Options, started: Instant, result: serde_json::Value) -> Response {
    let mut body = json!({ "results": [result] });
    if o.timings {
        body["time"] = json!(started.elapsed().as_secs_f64());
    }
    let text = if o.pretty {
        serde_json::to_string_pretty(&body)
    } else {
        serde_json::to_string(&body)
    };
    json_response(Body::from(text.unwrap_or_default()))
}

async fn begin(app: &Arc<App>, who: &Who, kind: TxKind, o: &Options) -> Result<Response, Failure> {
    permitted(who, kind)?;
    let started = Instant::now();
    // On a cluster node the snapshot is the node's state: a level above
    // `none` waits for it as a read would.
    crate::cluster::before_read(app, o).await?;
    let store = Arc::clone(&app.store);
    let principal = who.0.principal.clone();
    let id = blocking(move || store.begin(&principal, kind)).await?;
    let mut r = answer(
        o,
        started,
        json!({ "transaction": id, "readonly": kind == TxKind::ReadOnly }),
    );
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert(TX_HEADER, v);
    }
    Ok(r)
}

async fn run(
    app: &Arc<App>,
    who: &Who,
    id: String,
    sts: Vec<Statement>,
    o: &Options,
    shape: Shape,
) -> Result<Response, Failure> {
    require(who.0.perms.query || who.0.perms.execute, &who.0, "query")?;
    // Statements in a transaction never hold the writer: they are bound
    // as reads are.
    let limits = app.limits(o, false, who.1.as_ref());
    let principal = who.0.principal.clone();
    stream(app, o, shape, limits, move |store, limits, sink| {
        store.run_in(&id, &principal, &sts, limits, sink)
    })
    .await
}

async fn commit(app: &Arc<App>, who: &Who, id: String, o: &Options) -> Result<Response, Failure> {
    let started = Instant::now();
    let store = Arc::clone(&app.store);
    let principal = who.0.principal.clone();
    let outcome = blocking(move || store.commit(&id, &principal)).await?;
    Ok(answer(
        o,
        started,
        match outcome {
            TxOutcome::Committed { rows } => json!({ "committed": true, "rows_affected": rows }),
            TxOutcome::Conflict(m) => json!({ "error": m, "conflict": true }),
            TxOutcome::Refused(m) => json!({ "error": m }),
        },
    ))
}

async fn rollback(app: &Arc<App>, who: &Who, id: String, o: &Options) -> Result<Response, Failure> {
    let started = Instant::now();
    let store = Arc::clone(&app.store);
    let principal = who.0.principal.clone();
    blocking(move || store.rollback(&id, &principal)).await?;
    Ok(answer(o, started, json!({ "rolled_back": true })))
}
