//! The HTTP routes.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use tablix_store::{Command, Stamp, Stamped, Statement, Store, StoreError};

use crate::body::parse_statements;
use crate::options::Options;
use crate::render::{Shape, results};

#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Largest request body accepted; larger ones get 413.
    pub body_limit: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            body_limit: 8 * 1024 * 1024,
        }
    }
}

/// What `/status` reports about the daemon beyond the store's own
/// configuration (data directory, mode), which it reads from the store.
#[derive(Clone, Debug, Serialize)]
pub struct ServerInfo {
    pub version: String,
    pub pid: u32,
    pub http_addr: String,
    /// The page-cache policy installed, or "sqlite" for SQLite's own.
    pub pcache: String,
}

struct App {
    store: Arc<Store>,
    info: ServerInfo,
    config: ApiConfig,
    started: Instant,
}

type Shared = State<Arc<App>>;

pub fn router(store: Arc<Store>, info: ServerInfo, config: ApiConfig) -> Router {
    let limit = config.body_limit;
    let app = Arc::new(App {
        store,
        info,
        config,
        started: Instant::now(),
    });
    Router::new()
        .route("/db/execute", axum::routing::post(execute))
        .route("/db/query", get(query_get).post(query_post))
        .route("/db/request", get(request_get).post(request_post))
        .route("/status", get(status))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// An error answered for the whole request.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        let status = match e {
            StoreError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(status, e.to_string())
    }
}

fn options(pairs: &[(String, String)]) -> Result<Options, Failure> {
    Options::parse(pairs).map_err(|e| Failure(StatusCode::BAD_REQUEST, e))
}

fn statements(body: Result<Bytes, BytesRejection>) -> Result<Vec<Statement>, Failure> {
    let body = body.map_err(|r| Failure(r.status(), r.body_text()))?;
    parse_statements(&body).map_err(|e| Failure(StatusCode::BAD_REQUEST, e))
}

fn respond(json: serde_json::Value, o: &Options) -> Response {
    let text = if o.pretty {
        serde_json::to_string_pretty(&json)
    } else {
        serde_json::to_string(&json)
    };
    match text {
        Ok(t) => ([(header::CONTENT_TYPE, "application/json")], t).into_response(),
        Err(e) => Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn reply(r: Result<Response, Failure>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn write(
    app: &App,
    sts: Vec<Statement>,
    o: &Options,
    shape: Shape,
) -> Result<Response, Failure> {
    let started = Instant::now();
    let command = Command::Sql {
        statements: sts,
        transaction: o.transaction,
    };
    let applied = app
        .store
        .submit(Stamped::new(Stamp::now(), command))
        .await?;
    Ok(respond(
        results(
            &applied.statements,
            shape,
            o,
            started.elapsed().as_secs_f64(),
        ),
        o,
    ))
}

async fn read(app: &Arc<App>, sts: Vec<Statement>, o: &Options) -> Result<Response, Failure> {
    let started = Instant::now();
    let store = Arc::clone(&app.store);
    let outcomes = tokio::task::spawn_blocking(move || store.query(&sts))
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(respond(
        results(&outcomes, Shape::Mixed, o, started.elapsed().as_secs_f64()),
        o,
    ))
}

async fn unified(app: &Arc<App>, sts: Vec<Statement>, o: &Options) -> Result<Response, Failure> {
    let started = Instant::now();
    let store = Arc::clone(&app.store);
    let (sts, read) = tokio::task::spawn_blocking(move || {
        let r = store.query_if_read_only(&sts);
        (sts, r)
    })
    .await
    .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match read? {
        Some(outcomes) => Ok(respond(
            results(&outcomes, Shape::Mixed, o, started.elapsed().as_secs_f64()),
            o,
        )),
        None => write(app, sts, o, Shape::Mixed).await,
    }
}

fn q_statement(o: &Options) -> Result<Vec<Statement>, Failure> {
    match &o.q {
        Some(q) => Ok(vec![Statement::new(q.clone())]),
        None => Err(Failure(
            StatusCode::BAD_REQUEST,
            "missing q: pass the SQL as ?q=... or POST a JSON array of statements".into(),
        )),
    }
}

async fn execute(
    State(app): Shared,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let o = options(&q)?;
            let sts = statements(body)?;
            write(&app, sts, &o, Shape::Execute).await
        }
        .await,
    )
}

async fn query_get(State(app): Shared, Query(q): Query<Vec<(String, String)>>) -> Response {
    reply(
        async {
            let o = options(&q)?;
            read(&app, q_statement(&o)?, &o).await
        }
        .await,
    )
}

async fn query_post(
    State(app): Shared,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let o = options(&q)?;
            read(&app, statements(body)?, &o).await
        }
        .await,
    )
}

async fn request_get(State(app): Shared, Query(q): Query<Vec<(String, String)>>) -> Response {
    reply(
        async {
            let o = options(&q)?;
            unified(&app, q_statement(&o)?, &o).await
        }
        .await,
    )
}

async fn request_post(
    State(app): Shared,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let o = options(&q)?;
            unified(&app, statements(body)?, &o).await
        }
        .await,
    )
}

async fn status(State(app): Shared) -> Response {
    let c = app.store.config();
    Json(json!({
        "tablix": app.info,
        "uptime_seconds": app.started.elapsed().as_secs_f64(),
        "store": {
            "data_dir": c.data_dir,
            "database": c.database_path(),
            "mode": c.durability.as_str(),
            "readers": c.readers,
            "max_batch": c.max_batch,
            "flush_interval_ms": c.flush_interval.as_millis() as u64,
            "stats": app.store.stats(),
        },
        "http": { "addr": app.info.http_addr, "body_limit": app.config.body_limit },
        "pcache": {
            "policy": app.info.pcache,
            "caches": tablix_pcache::caches().iter().map(|c| json!({
                "cache_id": c.id,
                "policy": c.policy.name(),
                "page_size": c.page_size,
                "purgeable": c.purgeable,
                "capacity": c.capacity,
                "resident": c.resident,
                "pinned": c.pinned,
                "hits": c.hits,
                "misses": c.misses,
                "evictions": c.evictions,
            })).collect::<Vec<_>>(),
        },
    }))
    .into_response()
}

async fn readyz(State(app): Shared) -> Response {
    let store = Arc::clone(&app.store);
    let probe =
        tokio::task::spawn_blocking(move || store.query(&[Statement::new("SELECT 1")])).await;
    match probe {
        Ok(Ok(_)) => (StatusCode::OK, "[+]node ok\n[+]leader ok\n[+]store ok\n").into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "[+]node ok\n[-]store unavailable\n",
        )
            .into_response(),
    }
}
