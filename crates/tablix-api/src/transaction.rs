//! Interactive transactions over HTTP, in rqlite's manner. A request whose
//! first statement is `BEGIN` (or `BEGIN READONLY`) opens one, answered
//! with its id as that statement's result, and runs the rest of its
//! statements inside it; a request carrying `?tx=ID` runs its statements
//! inside that one; a request whose last statement is `COMMIT` (or `END`)
//! or `ROLLBACK` ends the transaction once the others ran. So a client
//! may begin, read, think, and write and commit in two requests, or send
//! one statement per request. The same on `/db/execute`, `/db/query` and
//! `/db/request`, answered in their shapes.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;
use tablix_store::{Statement, StoreError, TxControl, TxKind, TxOutcome};

use crate::encode::Shape;
use crate::options::Options;
use crate::server::{App, Failure, Who, require, stream};

/// What a request asks of interactive transactions.
struct Asked {
    /// Begin one first (no `?tx`).
    begin: Option<TxKind>,
    /// The open one named by `?tx`.
    id: Option<String>,
    /// The statements to run inside it.
    statements: Vec<Statement>,
    /// End it last: commit (true) or roll back.
    end: Option<bool>,
}

fn control(st: &Statement) -> Option<TxControl> {
    match st.params {
        tablix_store::Params::None => TxControl::parse(&st.sql),
        _ => None,
    }
}

/// What `sts` with `o` ask of interactive transactions; None if nothing.
fn asked(o: &Options, sts: &[Statement]) -> Result<Option<Asked>, Failure> {
    let bad = |m: String| Failure(StatusCode::BAD_REQUEST, m);
    let mut rest: &[Statement] = sts;
    let mut begin = None;
    if let Some(TxControl::Begin(kind)) = rest.first().and_then(control) {
        if let Some(id) = &o.tx {
            return Err(bad(format!(
                "transaction {id} is open already: COMMIT or ROLLBACK it (as a request with ?tx={id}) before beginning another"
            )));
        }
        begin = Some(kind);
        rest = &rest[1..];
    }
    let mut end = None;
    if let Some(c @ (TxControl::Commit | TxControl::Rollback)) = rest.last().and_then(control) {
        if begin.is_none() && o.tx.is_none() {
            return Err(bad(
                "no transaction named: send COMMIT or ROLLBACK with ?tx=ID, the id BEGIN answered"
                    .into(),
            ));
        }
        end = Some(c == TxControl::Commit);
        rest = &rest[..rest.len() - 1];
    }
    if begin.is_none() && o.tx.is_none() {
        return Ok(None);
    }
    if rest.iter().any(|s| control(s).is_some()) {
        return Err(bad(
            "inside a transaction, BEGIN may come only first and COMMIT, END or ROLLBACK only last in a request".into(),
        ));
    }
    Ok(Some(Asked {
        begin,
        id: o.tx.clone(),
        statements: rest.to_vec(),
        end,
    }))
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
    match asked(o, sts) {
        Ok(Some(a)) => Some(run(app, who, a, o, shape).await),
        Ok(None) => None,
        Err(f) => Some(Err(f)),
    }
}

async fn run(
    app: &Arc<App>,
    who: &Who,
    a: Asked,
    o: &Options,
    shape: Shape,
) -> Result<Response, Failure> {
    let caller = &who.0;
    match a.begin {
        Some(TxKind::ReadWrite) => require(caller.perms.execute, caller, "execute")?,
        Some(TxKind::ReadOnly) => require(caller.perms.query, caller, "query")?,
        None => require(caller.perms.query || caller.perms.execute, caller, "query")?,
    }
    if a.begin.is_some() {
        // On a cluster node the snapshot is the node's state: a level
        // above `none` waits for it as a read would.
        crate::cluster::before_read(app, o).await?;
    }
    // Statements in a transaction never hold the writer: they are bound
    // as reads are.
    let limits = app.limits(o, false, who.1.as_ref());
    let principal = caller.principal.clone();
    stream(app, o, shape, limits, move |store, limits, enc| {
        let id = match (a.begin, a.id) {
            (Some(kind), _) => {
                let started = std::time::Instant::now();
                let id = store.begin(&principal, kind)?;
                // An answer that cannot be encoded is a client gone: the
                // transaction it began ends at once.
                let encoded = enc
                    .fields(&[
                        ("transaction", json!(id)),
                        ("readonly", json!(kind == TxKind::ReadOnly)),
                    ])
                    .and_then(|()| {
                        tablix_store::Sink::end_statement(enc, started.elapsed().as_secs_f64())
                    });
                if encoded.is_err() {
                    let _ = store.rollback(&id, &principal);
                    return Ok(());
                }
                id
            }
            (None, Some(id)) => id,
            (None, None) => return Ok(()),
        };
        if !a.statements.is_empty() {
            store.run_in(&id, &principal, &a.statements, limits, enc)?;
        }
        let Some(commit) = a.end else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let fields = if commit {
            match store.commit(&id, &principal) {
                Ok(TxOutcome::Committed { rows }) => {
                    vec![("committed", json!(true)), ("rows_affected", json!(rows))]
                }
                Ok(TxOutcome::Conflict(m)) => vec![("error", json!(m)), ("conflict", json!(true))],
                Ok(TxOutcome::Refused(m)) => vec![("error", json!(m))],
                Err(e) => return ended(enc, e, started),
            }
        } else {
            match store.rollback(&id, &principal) {
                Ok(()) => vec![("rolled_back", json!(true))],
                Err(e) => return ended(enc, e, started),
            }
        };
        let _ = enc
            .fields(&fields)
            .and_then(|()| tablix_store::Sink::end_statement(enc, started.elapsed().as_secs_f64()));
        Ok(())
    })
    .await
}

/// The end of a transaction that failed: a request that answered nothing
/// yet fails whole (a transaction that is not open is 404); one that did
/// answers the failure as the last statement's result.
fn ended(
    enc: &mut crate::encode::Encoder<crate::server::Channel>,
    e: StoreError,
    started: std::time::Instant,
) -> Result<(), StoreError> {
    if !enc.started() && enc.statements() == 0 {
        return Err(e);
    }
    let _ = enc
        .fields(&[("error", json!(e.to_string()))])
        .and_then(|()| tablix_store::Sink::end_statement(enc, started.elapsed().as_secs_f64()));
    Ok(())
}
