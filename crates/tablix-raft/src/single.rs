//! A cluster of one: openraft over the command log and the store, with
//! this node its only voter. Every Command goes through openraft's write
//! path (append, flush, commit, apply) exactly as it will in a cluster,
//! without peers to reach.
#![allow(
    clippy::result_large_err,
    reason = "openraft's network trait answers its RPCError"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{Config, Raft};
use tablix_log::{Log, LogConfig};
use tablix_store::{CommandReply, ReplicatedCommand, Stamped, Store};

use crate::types::{Node, NodeId, TypeConfig};
use crate::{LogStore, ProposeError, Proposer, ProposerConfig, StateMachine};

/// Why a cluster of one failed to start or to apply a Command.
#[derive(Debug, thiserror::Error)]
pub enum SingleNodeError {
    #[error("opening the command log: {0}")]
    Log(tablix_log::LogError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("openraft: {0}")]
    Raft(String),
}

// By hand, not `#[from]`: the message already holds the cause's, which
// must not come again as its source in a chain of causes.
impl From<tablix_log::LogError> for SingleNodeError {
    fn from(e: tablix_log::LogError) -> SingleNodeError {
        SingleNodeError::Log(e)
    }
}

/// No peers: any request to another node is refused.
#[derive(Clone, Copy)]
pub struct NoPeers;

fn unreachable<E: std::error::Error>(target: NodeId) -> RPCError<NodeId, Node, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
        "a cluster of one has no node {target}"
    ))))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeer;
    async fn new_client(&mut self, target: NodeId, _: &Node) -> NoPeer {
        NoPeer(target)
    }
}

/// The link to a peer a cluster of one does not have.
pub struct NoPeer(NodeId);

impl RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _: AppendEntriesRequest<TypeConfig>,
        _: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        Err(unreachable(self.0))
    }

    async fn install_snapshot(
        &mut self,
        _: InstallSnapshotRequest<TypeConfig>,
        _: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(unreachable(self.0))
    }

    async fn vote(
        &mut self,
        _: VoteRequest<NodeId>,
        _: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        Err(unreachable(self.0))
    }
}

/// This node's id in a cluster of one.
const ID: NodeId = 1;

/// openraft running a cluster of one over a store opened with
/// `LogKeeper::Replication`.
pub struct SingleNode {
    raft: Raft<TypeConfig>,
    proposer: Proposer,
}

impl SingleNode {
    /// Starts openraft with its log in `log_dir` and its snapshots in
    /// `snapshot_dir`, applying to `store`; makes this node the only
    /// voter the first time, and waits until it leads.
    pub async fn start(
        log_dir: &Path,
        snapshot_dir: &Path,
        store: Arc<Store>,
    ) -> Result<SingleNode, SingleNodeError> {
        Self::start_with(log_dir, snapshot_dir, store, ProposerConfig::default()).await
    }

    /// [`SingleNode::start`], batching proposals as `proposer` says.
    pub async fn start_with(
        log_dir: &Path,
        snapshot_dir: &Path,
        store: Arc<Store>,
        proposer: ProposerConfig,
    ) -> Result<SingleNode, SingleNodeError> {
        let (log, _) = Log::open(log_dir, LogConfig::default())?;
        let sm = StateMachine::new(store, snapshot_dir)?;
        let committing = sm.committing();
        let config = Config {
            cluster_name: "tablix".into(),
            election_timeout_min: 150,
            election_timeout_max: 300,
            heartbeat_interval: 50,
            ..Config::default()
        }
        .validate()
        .map_err(|e| SingleNodeError::Raft(e.to_string()))?;
        let raft = Raft::new(ID, Arc::new(config), NoPeers, LogStore::new(log), sm)
            .await
            .map_err(|e| SingleNodeError::Raft(e.to_string()))?;
        let voters: BTreeMap<NodeId, Node> = [(ID, Node::default())].into();
        if raft
            .is_initialized()
            .await
            .map_err(|e| SingleNodeError::Raft(e.to_string()))?
        {
            tracing::debug!("the cluster of one was initialized before");
        } else {
            raft.initialize(voters)
                .await
                .map_err(|e| SingleNodeError::Raft(e.to_string()))?;
        }
        raft.wait(Some(Duration::from_secs(10)))
            .current_leader(ID, "this node leads its cluster of one")
            .await
            .map_err(|e| SingleNodeError::Raft(e.to_string()))?;
        let proposer = Proposer::new(raft.clone(), proposer, committing);
        Ok(SingleNode { raft, proposer })
    }

    /// Proposes a Command: answered once the entry carrying it (with the
    /// Commands proposed beside it) is logged, committed and applied.
    pub async fn propose(
        &self,
        command: Stamped<ReplicatedCommand>,
    ) -> Result<CommandReply, ProposeError> {
        self.proposer.propose(command).await
    }

    /// The index of the last entry in this node's log (openraft's
    /// metrics: updated once an append is done).
    pub fn last_log_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_log_index
    }

    /// Stops openraft (the store stays open: its owner closes it).
    pub async fn shutdown(self) -> Result<(), SingleNodeError> {
        self.raft
            .shutdown()
            .await
            .map_err(|e| SingleNodeError::Raft(e.to_string()))
    }
}
