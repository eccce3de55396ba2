//! The HTTP routes. Every handler first attributes its request to a
//! caller (`identity.rs`) and checks the caller's permission for it; user
//! SQL then runs as the caller's principal within the request's limits.
//! Reads stream their results; writes answer once their group committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use tablix_store::{
    Cancel, Limits, SqlCommand, Stamp, Stamped, Statement, Stop, Store, StoreError,
};
use tokio::sync::{mpsc, oneshot};

use crate::auth::AuthFile;
use crate::body::parse_statements;
use crate::encode::{Encoder, Out, Shape};
use crate::identity::{self, Caller, Peer, Refusal};
use crate::options::Options;

#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Largest request body accepted; larger ones get 413.
    pub body_limit: usize,
    /// Most requests served at once; more wait for a turn.
    pub max_requests: usize,
    /// This daemon's node, when it is one of a cluster.
    pub cluster: Option<tablix_raft::ClusterHandle>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            body_limit: 8 * 1024 * 1024,
            max_requests: 64,
            cluster: None,
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
    /// The Unix socket local clients use.
    pub socket: Option<String>,
    /// Where the file system is mounted.
    pub mount: Option<String>,
    /// Whether the TCP address speaks TLS.
    pub tls: bool,
}

pub(crate) struct App {
    pub(crate) store: Arc<Store>,
    pub(crate) info: ServerInfo,
    pub(crate) config: ApiConfig,
    auth: Arc<AuthFile>,
    started: Instant,
}

type Shared = State<Arc<App>>;

pub fn router(
    store: Arc<Store>,
    info: ServerInfo,
    config: ApiConfig,
    auth: Arc<AuthFile>,
) -> Router {
    let limit = config.body_limit;
    let max = config.max_requests.max(1);
    let app = Arc::new(App {
        store,
        info,
        config,
        auth,
        started: Instant::now(),
    });
    Router::new()
        .route("/db/execute", axum::routing::post(execute))
        .route("/db/query", get(query_get).post(query_post))
        .route("/db/request", get(request_get).post(request_post))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            crate::cluster::redirect,
        ))
        .route("/db/backup", get(crate::maintenance::backup))
        .route("/db/load", axum::routing::post(crate::maintenance::load))
        .route("/boot", axum::routing::post(crate::maintenance::boot))
        .route("/leader", get(crate::maintenance::leader))
        .route("/debug/vars", get(crate::maintenance::vars))
        .route(
            "/snapshot",
            axum::routing::post(crate::maintenance::snapshot),
        )
        .route("/reap", axum::routing::post(crate::maintenance::reap))
        .route("/status", get(status))
        .route("/readyz", get(readyz))
        .route("/nodes", get(crate::cluster::nodes))
        .route("/join", axum::routing::post(crate::cluster::join))
        .route(
            "/remove",
            axum::routing::delete(crate::cluster::remove).post(crate::cluster::remove),
        )
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(max))
        .layer(axum::middleware::map_response(version_header))
        .with_state(app)
}

/// rqlite's clients read the server's version from this header.
async fn version_header(mut r: Response) -> Response {
    r.headers_mut().insert(
        "x-rqlite-version",
        HeaderValue::from_static(concat!("tablix ", env!("CARGO_PKG_VERSION"))),
    );
    r
}

/// An error answered for the whole request.
pub(crate) struct Failure(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tablix\""),
            );
        }
        r
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        let status = match e {
            StoreError::Closed
            | StoreError::Busy(_)
            | StoreError::NoLeader(_)
            | StoreError::TooManyTransactions(_) => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::NoTransaction(_) => StatusCode::NOT_FOUND,
            StoreError::TransactionBusy(_) => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(status, e.to_string())
    }
}

/// The caller of a request, and its connection's hang-up signal.
pub(crate) struct Who(pub(crate) Caller, pub(crate) Option<Cancel>);

impl FromRequestParts<Arc<App>> for Who {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Who, Failure> {
        let peer = parts.extensions.get::<Peer>().ok_or_else(|| {
            Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the connection carries no peer".into(),
            )
        })?;
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let gone = parts
            .extensions
            .get::<crate::listen::ConnectionGone>()
            .map(|g| g.0.clone());
        identity::resolve(peer, authorization, &app.auth)
            .map(|c| Who(c, gone))
            .map_err(|Refusal::Unauthenticated(m)| Failure(StatusCode::UNAUTHORIZED, m))
    }
}

pub(crate) fn require(granted: bool, caller: &Caller, perm: &str) -> Result<(), Failure> {
    if granted {
        Ok(())
    } else {
        Err(Failure(
            StatusCode::FORBIDDEN,
            format!(
                "{} may not do this: it needs the permission {perm:?}",
                caller.principal.name
            ),
        ))
    }
}

fn options(pairs: &[(String, String)]) -> Result<Options, Failure> {
    Options::parse(pairs).map_err(|e| Failure(StatusCode::BAD_REQUEST, e))
}

fn statements(body: Result<Bytes, BytesRejection>) -> Result<Vec<Statement>, Failure> {
    let body = body.map_err(|r| Failure(r.status(), r.body_text()))?;
    parse_statements(&body).map_err(|e| Failure(StatusCode::BAD_REQUEST, e))
}

pub(crate) fn reply(r: Result<Response, Failure>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) fn json_response(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Sets the request's cancellation when dropped: dropped with the
/// handler's future (its client went away) or with the response body
/// (sent, or its client went away mid-stream).
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl App {
    /// A request's bounds: the daemon's, or tighter as it asks; cancelled
    /// when its connection's client goes away.
    pub(crate) fn limits(&self, o: &Options, write: bool, gone: Option<&Cancel>) -> Limits {
        let c = self.store.config();
        let mut limits = if write {
            c.write_limits()
        } else {
            c.read_limits()
        };
        if let Some(t) = o.db_timeout {
            limits.timeout = limits.timeout.min(t);
        }
        if let Some(g) = gone {
            limits.cancel = Cancel::linked(g);
        }
        limits
    }
}

async fn write(
    app: &Arc<App>,
    who: &Who,
    sts: Vec<Statement>,
    o: &Options,
    shape: Shape,
) -> Result<Response, Failure> {
    let caller = &who.0;
    require(caller.perms.execute, caller, "execute")?;
    if crate::maintenance::is_vacuum(&sts) {
        return crate::maintenance::vacuum(app, who).await;
    }
    let started = Instant::now();
    let limits = app.limits(o, true, who.1.as_ref());
    let _cancel = CancelOnDrop(limits.cancel.clone());
    let max = limits.max_result_bytes;
    let command = SqlCommand {
        statements: sts,
        transaction: o.transaction,
        principal: caller.principal.clone(),
    };
    let applied = app
        .store
        .submit_sql(Stamped::new(Stamp::now(), command), limits)
        .await?;
    let mut enc = Encoder::new(Vec::new(), o, shape, max);
    // The results were gathered within the bound already; an encoding
    // that still outgrows it ends with the statement's error.
    let _ = tablix_store::replay(&applied.statements, &mut enc);
    let chunks = enc
        .finish(started.elapsed().as_secs_f64())
        .map_err(|_| Failure(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed".into()))?;
    Ok(json_response(Body::from(chunks.concat())))
}

/// How a read's response begins.
enum Start {
    /// The whole body: the result fit in the first chunk (most reads), so
    /// the answer leaves in one piece, with no stream to wake for.
    Whole(Vec<u8>),
    /// Chunks follow on the channel.
    Streamed,
}

/// Chunks of a streamed response, sent as they are encoded. The first
/// chunk is held back: if nothing follows it, it is the whole body.
pub(crate) struct Channel {
    tx: mpsc::Sender<Vec<u8>>,
    /// Says how the response starts (Ok) or that it fails as a whole
    /// (Err), once: before the first chunk is sent.
    start: Option<oneshot::Sender<Result<Start, Failure>>>,
    /// The first chunk, while it may be the only one.
    held: Option<Vec<u8>>,
    /// When the request's time is up: a client that does not read by
    /// then is given up on.
    deadline: Instant,
    handle: tokio::runtime::Handle,
}

impl Channel {
    fn send(&mut self, chunk: Vec<u8>) -> Result<(), Stop> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let tx = self.tx.clone();
        match self
            .handle
            .block_on(tokio::time::timeout(left, tx.send(chunk)))
        {
            Ok(Ok(())) => Ok(()),
            _ => Err(Stop::Gone),
        }
    }

    /// The encoding ended: a response not begun yet leaves whole.
    fn end(&mut self) {
        if let Some(start) = self.start.take() {
            let _ = start.send(Ok(Start::Whole(self.held.take().unwrap_or_default())));
        }
    }
}

impl Out for Channel {
    fn emit(&mut self, chunk: Vec<u8>) -> Result<(), Stop> {
        if self.start.is_some() && self.held.is_none() {
            self.held = Some(chunk);
            return Ok(());
        }
        if let Some(start) = self.start.take() {
            let _ = start.send(Ok(Start::Streamed));
        }
        if let Some(first) = self.held.take() {
            self.send(first)?;
        }
        self.send(chunk)
    }
}

async fn read(
    app: &Arc<App>,
    who: &Who,
    sts: Vec<Statement>,
    o: &Options,
) -> Result<Response, Failure> {
    let caller = &who.0;
    require(caller.perms.query, caller, "query")?;
    crate::cluster::before_read(app, o).await?;
    let limits = app.limits(o, false, who.1.as_ref());
    let principal = caller.principal.clone();
    stream(app, o, Shape::Mixed, limits, move |store, limits, sink| {
        store.query_into(&principal, &sts, limits, sink)
    })
    .await
}

/// Runs `job` on a blocking thread, encoding the results it hands its
/// sink as they come: a result that fits in the first chunk is answered
/// whole, a larger one streamed. A job that fails before its first result
/// fails the request.
pub(crate) async fn stream(
    app: &Arc<App>,
    o: &Options,
    shape: Shape,
    limits: Limits,
    job: impl FnOnce(&Store, &Limits, &mut Encoder<Channel>) -> Result<(), StoreError> + Send + 'static,
) -> Result<Response, Failure> {
    let started = Instant::now();
    let cancel = CancelOnDrop(limits.cancel.clone());
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let (start_tx, start_rx) = oneshot::channel();
    let store = Arc::clone(&app.store);
    let o2 = o.clone();
    // Past its own limit the request is given a little longer to send
    // what it has.
    let deadline = Instant::now() + limits.timeout + Duration::from_secs(10);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let out = Channel {
            tx,
            start: Some(start_tx),
            held: None,
            deadline,
            handle,
        };
        let mut enc = Encoder::new(out, &o2, shape, limits.max_result_bytes);
        match job(&store, &limits, &mut enc) {
            Ok(()) => {
                if let Ok(mut out) = enc.finish(started.elapsed().as_secs_f64()) {
                    out.end();
                }
            }
            Err(e) if !enc.started() => {
                if let Some(start) = enc_start(enc) {
                    let _ = start.send(Err(Failure::from(e)));
                }
            }
            Err(e) => {
                tracing::warn!("a streamed query failed part way: {e}");
                // What was encoded goes out as a stream that ends short.
                let mut out = enc.into_out();
                if let Some(start) = out.start.take() {
                    let _ = start.send(Ok(Start::Streamed));
                }
                if let Some(first) = out.held.take() {
                    let _ = out.send(first);
                }
            }
        }
    });
    match start_rx.await {
        Ok(Ok(Start::Whole(body))) => return Ok(json_response(Body::from(body))),
        Ok(Ok(Start::Streamed)) => {}
        Ok(Err(f)) => return Err(f),
        Err(_) => {
            return Err(Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the query ended without a result".into(),
            ));
        }
    }
    let stream = futures_util::stream::unfold((rx, cancel), |(mut rx, cancel)| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(Bytes::from(chunk)), (rx, cancel)))
    });
    Ok(json_response(Body::from_stream(stream)))
}

/// The start signal of an encoder that never sent anything.
fn enc_start(enc: Encoder<Channel>) -> Option<oneshot::Sender<Result<Start, Failure>>> {
    enc.into_out().start
}

/// SQL text up to this many bytes is classified on the async worker.
const INLINE_CLASSIFY: usize = 4096;

async fn unified(
    app: &Arc<App>,
    who: &Who,
    sts: Vec<Statement>,
    o: &Options,
) -> Result<Response, Failure> {
    if let Some(r) = crate::transaction::serve(app, who, &sts, o, Shape::Mixed).await {
        return r;
    }
    let store = Arc::clone(&app.store);
    let principal = who.0.principal.clone();
    // Preparing a few short statements takes microseconds: done here, it
    // spares the request two thread switches. Long text is prepared off
    // the async workers.
    let short = sts.iter().map(|s| s.sql.len()).sum::<usize>() <= INLINE_CLASSIFY;
    let (sts, reads) = if short {
        let r = store.classify(&principal, &sts);
        (sts, r)
    } else {
        tokio::task::spawn_blocking(move || {
            let r = store.classify(&principal, &sts);
            (sts, r)
        })
        .await
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    };
    if reads? {
        read(app, who, sts, o).await
    } else {
        write(app, who, sts, o, Shape::Mixed).await
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
    who: Result<Who, Failure>,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let who = who?;
            let o = options(&q)?;
            let sts = statements(body)?;
            if let Some(r) = crate::transaction::serve(&app, &who, &sts, &o, Shape::Execute).await {
                return r;
            }
            write(&app, &who, sts, &o, Shape::Execute).await
        }
        .await,
    )
}

async fn query_get(
    State(app): Shared,
    who: Result<Who, Failure>,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    reply(
        async {
            let who = who?;
            let o = options(&q)?;
            let sts = q_statement(&o)?;
            if let Some(r) = crate::transaction::serve(&app, &who, &sts, &o, Shape::Mixed).await {
                return r;
            }
            read(&app, &who, sts, &o).await
        }
        .await,
    )
}

async fn query_post(
    State(app): Shared,
    who: Result<Who, Failure>,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let who = who?;
            let o = options(&q)?;
            let sts = statements(body)?;
            if let Some(r) = crate::transaction::serve(&app, &who, &sts, &o, Shape::Mixed).await {
                return r;
            }
            read(&app, &who, sts, &o).await
        }
        .await,
    )
}

async fn request_get(
    State(app): Shared,
    who: Result<Who, Failure>,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    reply(
        async {
            let who = who?;
            let o = options(&q)?;
            unified(&app, &who, q_statement(&o)?, &o).await
        }
        .await,
    )
}

async fn request_post(
    State(app): Shared,
    who: Result<Who, Failure>,
    Query(q): Query<Vec<(String, String)>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    reply(
        async {
            let who = who?;
            let o = options(&q)?;
            unified(&app, &who, statements(body)?, &o).await
        }
        .await,
    )
}

async fn status(State(app): Shared, who: Result<Who, Failure>) -> Response {
    reply((|| {
        let Who(caller, _) = who?;
        require(caller.perms.status, &caller, "status")?;
        let c = app.store.config();
        let mut out = json!({
            "tablix": app.info,
            "caller": {"name": caller.principal.name, "uid": caller.principal.uid, "raw": caller.principal.raw},
            "uptime_seconds": app.started.elapsed().as_secs_f64(),
            "store": {
                "data_dir": c.data_dir,
                "database": c.database_path(),
                "mode": c.durability.as_str(),
                "readers": c.readers,
                "max_batch": c.max_batch,
                "flush_interval_ms": c.flush_interval.as_millis() as u64,
                "read_timeout_ms": c.read_timeout.as_millis() as u64,
                "write_timeout_ms": c.write_timeout.as_millis() as u64,
                "max_result_bytes": c.max_result_bytes,
                "memory_limit": c.memory_limit,
                "wal_limit": c.wal_limit,
                "stats": app.store.stats(),
                // What rqlite's shell asks before a restore.
                "sqlite3": { "fk_constraints": "enabled", "version": rusqlite_version() },
            },
            "transactions": {
                "max_open": c.max_transactions,
                "idle_timeout_ms": c.tx_idle_timeout.as_millis() as u64,
                "max_duration_ms": c.tx_max_duration.as_millis() as u64,
                "max_bytes": c.tx_max_bytes,
                "stats": app.store.tx_stats(),
            },
            "http": {
                "addr": app.info.http_addr,
                "body_limit": app.config.body_limit,
                "max_requests": app.config.max_requests,
                "tls": app.info.tls,
                "auth": !app.auth.is_empty(),
            },
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
        });
        if let Some((raft, leader, cluster)) = crate::cluster::status_fields(&app) {
            out["store"]["raft"] = raft;
            out["store"]["leader"] = leader;
            out["cluster"] = cluster;
        }
        Ok(Json(out).into_response())
    })())
}

fn rusqlite_version() -> &'static str {
    tablix_store::sqlite_version()
}

/// Ready when the store takes Commands: answered without a reader, so a
/// busy daemon still says it is alive.
async fn readyz(State(app): Shared, who: Result<Who, Failure>) -> Response {
    let ready = who.and_then(|Who(caller, _)| require(caller.perms.ready, &caller, "ready"));
    if let Err(f) = ready {
        return f.into_response();
    }
    if app.store.is_open() {
        (StatusCode::OK, "[+]node ok\n[+]leader ok\n[+]store ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "[+]node ok\n[-]store unavailable\n",
        )
            .into_response()
    }
}
