//! Node-to-node traffic: openraft's RPCs, forwarded proposals and
//! membership requests as HTTP POSTs of postcard bodies to another node's
//! raft service (`service.rs` answers them), over pooled keep-alive
//! connections with Nagle off, each request bounded by openraft's
//! time-to-live for it.
#![allow(
    clippy::result_large_err,
    reason = "openraft's network trait answers its RPCError"
)]

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cluster_id::{self, ClusterIdentity};
use crate::tls::NodeTls;
use crate::types::{Node, NodeId, TypeConfig};

/// The paths of a node's raft service.
pub(crate) mod path {
    pub const APPEND: &str = "/raft/append";
    pub const VOTE: &str = "/raft/vote";
    pub const SNAPSHOT: &str = "/raft/snapshot";
    pub const PROPOSE: &str = "/raft/propose";
    pub const READ_INDEX: &str = "/raft/read-index";
    pub const JOIN: &str = "/raft/join";
    pub const REMOVE: &str = "/raft/remove";
    pub const TRANSFER: &str = "/raft/transfer-leader";
    pub const HOLD: &str = "/raft/hold-elections";
    pub const WELCOME: &str = "/raft/welcome";
    pub const STATUS: &str = "/raft/status";
}

/// Largest answer read from a peer.
const MAX_ANSWER: usize = 256 << 20;

/// How long connecting to a peer may take.
const CONNECT: Duration = Duration::from_secs(2);

/// Why a request to a peer got no answer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached: nothing was delivered.
    #[error("node at {addr} is unreachable: {message}")]
    Unreachable { addr: String, message: String },
    /// The request may have been delivered, but no answer came back in
    /// time or it could not be read.
    #[error("no answer from node at {addr}: {message}")]
    NoAnswer { addr: String, message: String },
    #[error("node at {addr} answered HTTP {status}: {message}")]
    Refused {
        addr: String,
        status: u16,
        message: String,
    },
    #[error("encoding a request: {0}")]
    Encode(String),
}

/// The HTTP client: a node with TLS calls only nodes with TLS.
#[derive(Clone)]
enum Http {
    Plain(Client<HttpConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Http {
    fn scheme(&self) -> &'static str {
        match self {
            Http::Plain(_) => "http",
            Http::Tls(_) => "https",
        }
    }

    fn request(&self, request: Request<Full<Bytes>>) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            Http::Plain(c) => c.request(request),
            Http::Tls(c) => c.request(request),
        }
    }
}

/// An HTTP client for nodes' raft services, over mutual TLS when it has a
/// TLS identity. Clones share its pool of connections, and the addresses
/// it is cut off from.
#[derive(Clone)]
pub struct Transport {
    client: Http,
    /// The cluster id sent with every request, once this side has one.
    identity: ClusterIdentity,
    /// The apply version a node sends, with its cluster id or before it
    /// has one.
    apply: u32,
    /// Addresses this node acts as if it could not reach (a partition,
    /// injected by tests with [`Transport::cut_off`]).
    cut: std::sync::Arc<std::sync::RwLock<std::collections::HashSet<String>>>,
    /// Faults injected into every request (tests), with the state of the
    /// generator that decides each request's fate.
    faults: std::sync::Arc<std::sync::Mutex<Option<(Faults, u64)>>>,
    /// When each node last answered one of openraft's RPCs (heartbeats
    /// included): the leader's measure of which nodes it can reach.
    answered: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<NodeId, Instant>>>,
}

/// Faults a test injects into a transport: each request independently
/// may be held back, lost before delivery, delivered with its answer
/// lost, or delivered twice. Decided by a generator from `seed`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Chance a request is lost before it is delivered.
    pub drop_request: f64,
    /// Chance the answer to a delivered request is lost.
    pub drop_answer: f64,
    /// Chance a request is delivered a second time, up to `max_delay`
    /// later (the copy's answer is ignored).
    pub duplicate: f64,
    /// Every request is held back a random time up to this, so requests
    /// overtake one another.
    pub max_delay: Duration,
    pub seed: u64,
}

/// The fate of one request.
#[derive(Default)]
struct Fate {
    delay: Duration,
    drop_request: bool,
    drop_answer: bool,
    duplicate_after: Option<Duration>,
}

impl Default for Transport {
    fn default() -> Self {
        Transport::new()
    }
}

impl Transport {
    /// A plain-HTTP client that sends no cluster id (tools).
    pub fn new() -> Transport {
        Transport::with(None, ClusterIdentity::none())
    }

    /// A client that calls over mutual TLS with `tls` (plain HTTP
    /// without), sending `identity`'s cluster id once it has one.
    pub fn with(tls: Option<&NodeTls>, identity: ClusterIdentity) -> Transport {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(90));
        let client = match tls {
            None => Http::Plain(builder.build(http)),
            Some(tls) => {
                http.enforce_http(false);
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config((*tls.client).clone())
                    .https_only()
                    .enable_http1()
                    .wrap_connector(http);
                Http::Tls(builder.build(connector))
            }
        };
        Transport {
            client,
            identity,
            apply: tablix_store::APPLY_VERSION,
            cut: Default::default(),
            faults: Default::default(),
            answered: Default::default(),
        }
    }

    /// The same client, claiming to apply entries as `version` (tests: a
    /// node of another build).
    pub fn applying(mut self, version: u32) -> Transport {
        self.apply = version;
        self
    }

    /// When `node` last answered an RPC of openraft's sent through this
    /// transport (or its clones), if ever.
    pub fn last_answer(&self, node: NodeId) -> Option<Instant> {
        self.answered.lock().ok()?.get(&node).copied()
    }

    /// From now on every request to `addr` fails as if the network
    /// between them were down (nothing is sent): partitions in tests.
    pub fn cut_off(&self, addr: &str) {
        if let Ok(mut cut) = self.cut.write() {
            cut.insert(addr.to_string());
        }
    }

    /// Undoes every [`Transport::cut_off`] and [`Transport::inject`].
    pub fn heal(&self) {
        if let Ok(mut cut) = self.cut.write() {
            cut.clear();
        }
        if let Ok(mut f) = self.faults.lock() {
            *f = None;
        }
    }

    /// From now on requests this transport sends meet `faults` (tests:
    /// a lossy, slow, duplicating, reordering network).
    pub fn inject(&self, faults: Faults) {
        if let Ok(mut f) = self.faults.lock() {
            *f = Some((faults, faults.seed | 1));
        }
    }

    /// What happens to the next request.
    fn fate(&self) -> Fate {
        let Ok(mut guard) = self.faults.lock() else {
            return Fate::default();
        };
        let Some((faults, rng)) = guard.as_mut() else {
            return Fate::default();
        };
        let mut roll = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let max = faults.max_delay.as_secs_f64();
        Fate {
            delay: Duration::from_secs_f64(max * roll()),
            drop_request: roll() < faults.drop_request,
            drop_answer: roll() < faults.drop_answer,
            duplicate_after: (roll() < faults.duplicate)
                .then(|| Duration::from_secs_f64(max * roll())),
        }
    }

    fn is_cut(&self, addr: &str) -> bool {
        self.cut.read().map(|c| c.contains(addr)).unwrap_or(false)
    }

    /// Sends one request and reads its answer whole, within `ttl`:
    /// the status and the body.
    async fn exchange(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        ttl: Duration,
    ) -> Result<Bytes, TransportError> {
        let no_answer = |message: String| TransportError::NoAnswer {
            addr: addr.to_string(),
            message,
        };
        if self.is_cut(addr) {
            return Err(TransportError::Unreachable {
                addr: addr.to_string(),
                message: "cut off (a partition)".into(),
            });
        }
        let body = Bytes::from(body);
        let build = |body: Bytes| {
            let mut request = Request::builder()
                .method(method.clone())
                .uri(format!("{}://{addr}{path}", self.client.scheme()))
                .header(CONTENT_TYPE, "application/octet-stream");
            let id = self.identity.get();
            if id.is_some() || self.identity.is_node() {
                request = request.header(cluster_id::APPLY_HEADER, self.apply);
            }
            if let Some(id) = id {
                request = request.header(cluster_id::HEADER, id);
            }
            request
                .body(Full::new(body))
                .map_err(|e| TransportError::Encode(e.to_string()))
        };
        let fate = self.fate();
        if !fate.delay.is_zero() {
            tokio::time::sleep(fate.delay).await;
        }
        if fate.drop_request {
            return Err(TransportError::Unreachable {
                addr: addr.to_string(),
                message: "the request was dropped (an injected fault)".into(),
            });
        }
        if let Some(after) = fate.duplicate_after {
            // The copy arrives later, maybe after requests sent since;
            // its answer goes nowhere.
            let copy = build(body.clone())?;
            let client = self.client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if let Ok(r) = client.request(copy).await {
                    let _ = r.into_body().collect().await;
                }
            });
        }
        let request = build(body)?;
        let deadline = Instant::now() + ttl;
        let response = match tokio::time::timeout(ttl, self.client.request(request)).await {
            Err(_) => return Err(no_answer(format!("nothing within {ttl:?}"))),
            Ok(Err(e)) if e.is_connect() => {
                return Err(TransportError::Unreachable {
                    addr: addr.to_string(),
                    message: connect_reason(&e),
                });
            }
            Ok(Err(e)) => return Err(no_answer(e.to_string())),
            Ok(Ok(r)) => r,
        };
        let status = response.status().as_u16();
        let left = deadline.saturating_duration_since(Instant::now());
        let body = match tokio::time::timeout(
            left,
            Limited::new(response.into_body(), MAX_ANSWER).collect(),
        )
        .await
        {
            Err(_) => return Err(no_answer(format!("the answer took over {ttl:?}"))),
            Ok(Err(e)) => return Err(no_answer(e.to_string())),
            Ok(Ok(b)) => b.to_bytes(),
        };
        if fate.drop_answer {
            return Err(no_answer(
                "the answer was dropped (an injected fault)".into(),
            ));
        }
        if status != 200 {
            return Err(TransportError::Refused {
                addr: addr.to_string(),
                status,
                message: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(body)
    }

    /// POSTs `body` to `path` of the node at `addr` (`host:port`) and
    /// decodes its answer, within `ttl`.
    pub async fn call<Q, A>(
        &self,
        addr: &str,
        path: &str,
        body: &Q,
        ttl: Duration,
    ) -> Result<A, TransportError>
    where
        Q: Serialize + ?Sized,
        A: DeserializeOwned,
    {
        let bytes = postcard::to_stdvec(body).map_err(|e| TransportError::Encode(e.to_string()))?;
        let answer = self.exchange(Method::POST, addr, path, bytes, ttl).await?;
        postcard::from_bytes(&answer).map_err(|e| TransportError::NoAnswer {
            addr: addr.to_string(),
            message: format!("an answer this node cannot read: {e}"),
        })
    }

    /// Asks the node whose raft service is at `addr` to add a node (it
    /// sends the request on to the leader): the leader's answer.
    pub async fn join(
        &self,
        addr: &str,
        request: &crate::JoinRequest,
        ttl: Duration,
    ) -> Result<Result<(), String>, TransportError> {
        self.call(addr, path::JOIN, request, ttl).await
    }

    /// Asks the node whose raft service is at `addr` to remove node `id`.
    pub async fn remove(
        &self,
        addr: &str,
        id: NodeId,
        ttl: Duration,
    ) -> Result<Result<(), String>, TransportError> {
        self.call(addr, path::REMOVE, &crate::RemoveRequest { id }, ttl)
            .await
    }

    /// Asks the node whose raft service is at `addr` to hand leadership
    /// to node `id` (it sends the request on to the leader).
    pub async fn transfer_leader(
        &self,
        addr: &str,
        id: NodeId,
        ttl: Duration,
    ) -> Result<Result<(), String>, TransportError> {
        self.call(addr, path::TRANSFER, &id, ttl).await
    }

    /// The status of the node whose raft service is at `addr`.
    pub async fn status(
        &self,
        addr: &str,
        ttl: Duration,
    ) -> Result<crate::ClusterStatus, TransportError> {
        let answer = self
            .exchange(Method::GET, addr, path::STATUS, Vec::new(), ttl)
            .await?;
        serde_json::from_slice(&answer).map_err(|e| TransportError::NoAnswer {
            addr: addr.to_string(),
            message: format!("not a raft service's status: {e}"),
        })
    }
}

/// The innermost cause of a failed connection ("Connection refused").
fn connect_reason(e: &hyper_util::client::legacy::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Openraft's network: a `Peer` per target node, at the address its
/// membership records.
#[derive(Clone, Default)]
pub struct Network {
    transport: Transport,
}

impl Network {
    /// A network that sends through `transport` (and shares its pool and
    /// its partitions).
    pub fn over(transport: Transport) -> Network {
        Network { transport }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;
    async fn new_client(&mut self, target: NodeId, node: &Node) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
        }
    }
}

/// The link to one peer.
pub struct Peer {
    target: NodeId,
    addr: String,
    transport: Transport,
}

impl Peer {
    async fn rpc<Q, A, E>(
        &self,
        action: RPCTypes,
        path: &str,
        request: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Q: Serialize,
        A: DeserializeOwned + Send + 'static,
        E: std::error::Error + DeserializeOwned + Send + 'static,
    {
        let ttl = option.hard_ttl();
        let answer: Result<A, RaftError<NodeId, E>> = self
            .transport
            .call(&self.addr, path, request, ttl)
            .await
            .inspect(|_| {
                if let Ok(mut answered) = self.transport.answered.lock() {
                    answered.insert(self.target, Instant::now());
                }
            })
            .map_err(|e| match e {
                TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                TransportError::NoAnswer { .. } => RPCError::Timeout(Timeout {
                    action,
                    id: 0,
                    target: self.target,
                    timeout: ttl,
                }),
                other => RPCError::Network(NetworkError::new(&other)),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.rpc(RPCTypes::AppendEntries, path::APPEND, &request, &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.rpc(RPCTypes::InstallSnapshot, path::SNAPSHOT, &request, &option)
            .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.rpc(RPCTypes::Vote, path::VOTE, &request, &option)
            .await
    }
}
