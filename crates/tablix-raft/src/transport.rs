//! Node-to-node traffic: openraft's RPCs, forwarded proposals and
//! membership requests as HTTP POSTs of postcard bodies to another node's
//! raft address (`service.rs` answers them). A request runs on tokio's
//! blocking pool (the HTTP client is blocking) and is bounded by
//! openraft's time-to-live for it.
#![allow(
    clippy::result_large_err,
    reason = "openraft's network trait answers its RPCError"
)]

use std::time::Duration;

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

use crate::types::{Node, NodeId, TypeConfig};

/// The paths of a node's raft service.
pub(crate) mod path {
    pub const APPEND: &str = "/raft/append";
    pub const VOTE: &str = "/raft/vote";
    pub const SNAPSHOT: &str = "/raft/snapshot";
    pub const PROPOSE: &str = "/raft/propose";
    pub const JOIN: &str = "/raft/join";
    pub const REMOVE: &str = "/raft/remove";
    pub const STATUS: &str = "/raft/status";
}

/// Largest answer read from a peer.
const MAX_ANSWER: u64 = 256 << 20;

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

/// An HTTP client for a node's raft service.
#[derive(Clone)]
pub struct Transport {
    agent: ureq::Agent,
}

impl Default for Transport {
    fn default() -> Self {
        Transport::new()
    }
}

impl Transport {
    pub fn new() -> Transport {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(2)))
            .build()
            .into();
        Transport { agent }
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
        A: DeserializeOwned + Send + 'static,
    {
        let bytes = postcard::to_stdvec(body).map_err(|e| TransportError::Encode(e.to_string()))?;
        let agent = self.agent.clone();
        let addr = addr.to_string();
        let url = format!("http://{addr}{path}");
        tokio::task::spawn_blocking(move || {
            let unreachable = |e: &dyn std::fmt::Display| TransportError::Unreachable {
                addr: addr.clone(),
                message: e.to_string(),
            };
            let no_answer = |e: &dyn std::fmt::Display| TransportError::NoAnswer {
                addr: addr.clone(),
                message: e.to_string(),
            };
            let sent = agent
                .post(&url)
                .config()
                .timeout_global(Some(ttl))
                .build()
                .header("Content-Type", "application/octet-stream")
                .send(&bytes[..]);
            let mut response = match sent {
                Ok(r) => r,
                Err(e @ (ureq::Error::ConnectionFailed | ureq::Error::HostNotFound)) => {
                    return Err(unreachable(&e));
                }
                Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Err(unreachable(&e));
                }
                Err(e) => return Err(no_answer(&e)),
            };
            let status = response.status().as_u16();
            let body = response
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER)
                .read_to_vec()
                .map_err(|e| no_answer(&e))?;
            if status != 200 {
                return Err(TransportError::Refused {
                    addr: addr.clone(),
                    status,
                    message: String::from_utf8_lossy(&body).into_owned(),
                });
            }
            postcard::from_bytes(&body).map_err(|e| no_answer(&e))
        })
        .await
        .unwrap_or_else(|e| {
            Err(TransportError::NoAnswer {
                addr: String::new(),
                message: format!("the request's task failed: {e}"),
            })
        })
    }
}

impl Transport {
    /// The status of the node whose raft service is at `addr`.
    pub async fn status(
        &self,
        addr: &str,
        ttl: Duration,
    ) -> Result<crate::ClusterStatus, TransportError> {
        let agent = self.agent.clone();
        let addr = addr.to_string();
        tokio::task::spawn_blocking(move || {
            let fail = |e: &dyn std::fmt::Display| TransportError::Unreachable {
                addr: addr.clone(),
                message: e.to_string(),
            };
            let mut response = agent
                .get(&format!("http://{addr}{}", path::STATUS))
                .config()
                .timeout_global(Some(ttl))
                .build()
                .call()
                .map_err(|e| fail(&e))?;
            let body = response
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER)
                .read_to_vec()
                .map_err(|e| fail(&e))?;
            serde_json::from_slice(&body).map_err(|e| TransportError::NoAnswer {
                addr: addr.clone(),
                message: format!("not a raft service's status: {e}"),
            })
        })
        .await
        .unwrap_or_else(|e| {
            Err(TransportError::NoAnswer {
                addr: String::new(),
                message: format!("the request's task failed: {e}"),
            })
        })
    }
}

/// Openraft's network: a [`Peer`] per target node, at the address its
/// membership records.
#[derive(Clone, Default)]
pub struct Network {
    transport: Transport,
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
