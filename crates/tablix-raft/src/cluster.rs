//! A node of a cluster: openraft over the command log and the store, its
//! raft service on a TCP address (`service.rs`), peers reached through
//! [`Network`]. The store's proposals go through [`Forwarder`]: to the
//! local [`Proposer`] while this node leads, to the leader's service
//! otherwise, and are answered once this node has applied them, so a
//! write through any node is visible there when it returns.
#![allow(
    clippy::result_large_err,
    reason = "openraft's errors are large; they are turned into strings here"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{ChangeMembers, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tablix_log::{Log, LogConfig};
use tablix_store::{
    CommandReply, Propose, ProposeAnswer, ReplicatedCommand, Stamped, Store, StoreError,
};

use crate::cluster_id::{self, ClusterIdentity, IdentityError};
use crate::proposer::{Committed, ProposeError, Proposer, ProposerConfig};
use crate::tls::NodeTls;
use crate::transport::{Network, Transport, TransportError, path};
use crate::types::{Node, NodeId, TypeConfig};
use crate::{LogStore, StateMachine};

/// How long a membership change may take (adding a node waits until it
/// caught up).
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(60);

/// How long a leadership transfer may take: the target catching up, the
/// followers' leases running out (the longest election timeout), and an
/// election.
const TRANSFER_WAIT: Duration = Duration::from_secs(10);

/// Most times a welcome that got no answer is sent.
const WELCOME_TRIES: u32 = 3;

/// Where in a data directory a node keeps its raft log.
pub const LOG_DIR: &str = "raft-log";
/// Where in a data directory a node keeps its snapshots.
pub const SNAPSHOT_DIR: &str = "snapshots";

/// How a node comes up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// It was a member before (its log says so), or waits to be added.
    Resume,
    /// It founds a cluster of which it is the only voter (ignored when
    /// its log says it is a member already).
    Bootstrap,
    /// It asks the member at this raft address to add it as a voter
    /// (ignored when its log says it is a member already).
    Join(String),
}

/// A node's settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub id: NodeId,
    /// Where the raft service listens (port 0 picks a free one).
    pub listen: SocketAddr,
    /// The address peers reach the service at (default: the bound one).
    pub advertise: Option<String>,
    pub log_dir: PathBuf,
    pub snapshot_dir: PathBuf,
    /// The file that keeps the id of the cluster this node belongs to.
    pub identity_file: PathBuf,
    /// Mutual TLS for node-to-node traffic (plain HTTP without).
    pub tls: Option<NodeTls>,
    pub start: Start,
    /// How long a proposal waits for a leader to be reachable before it
    /// fails.
    pub leader_wait: Duration,
    /// How long joining retries while the member asked has no leader or
    /// cannot be reached.
    pub join_wait: Duration,
    /// A snapshot is taken (and the log behind it purged) every this many
    /// applied entries, and for a large database not before the log
    /// holds half its bytes (`take_snapshots`).
    pub snapshot_every: u64,
    /// Entries kept in the log behind the last snapshot, for followers
    /// that lag a little (one that lags more gets the snapshot).
    pub keep_behind_snapshot: u64,
    /// A snapshot is sent to a lagging node in chunks of this many bytes.
    pub snapshot_chunk_bytes: u64,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
    /// The lock lease: the leader expires the file-system locks of a node
    /// that answered none of its RPCs for this long (zero: never).
    pub lock_lease: Duration,
}

impl ClusterConfig {
    pub fn new(id: NodeId, listen: SocketAddr, data: &std::path::Path) -> ClusterConfig {
        ClusterConfig {
            id,
            listen,
            advertise: None,
            log_dir: data.join(LOG_DIR),
            snapshot_dir: data.join(SNAPSHOT_DIR),
            identity_file: data.join(cluster_id::FILE),
            tls: None,
            start: Start::Resume,
            leader_wait: Duration::from_secs(5),
            join_wait: Duration::from_secs(60),
            snapshot_every: 5000,
            keep_behind_snapshot: 1000,
            snapshot_chunk_bytes: 3 << 20,
            heartbeat_ms: 50,
            election_timeout_ms: (300, 900),
            lock_lease: Duration::from_secs(30),
        }
    }
}

/// Why a node failed to start or a membership change failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("opening the raft log: {0}")]
    Log(tablix_log::LogError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the store: {0}")]
    Store(StoreError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("openraft: {0}")]
    Raft(String),
    #[error("{0}")]
    Membership(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

// By hand, not `#[from]`: the message already holds the cause's, which
// must not come again as its source in a chain of causes.
impl From<tablix_log::LogError> for ClusterError {
    fn from(e: tablix_log::LogError) -> ClusterError {
        ClusterError::Log(e)
    }
}

impl From<StoreError> for ClusterError {
    fn from(e: StoreError) -> ClusterError {
        ClusterError::Store(e)
    }
}

fn raft_error(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Raft(e.to_string())
}

/// A request to add a node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    pub id: NodeId,
    /// Its raft address.
    pub addr: String,
    /// A voter, or a learner that only receives the log.
    pub voter: bool,
    /// Sent by the node itself, whose log is empty: if the cluster counts
    /// it as a member already, it lost its data and is added anew.
    #[serde(default)]
    pub fresh: bool,
}

/// What a read waits for before it runs on a node's own state (rqlite's
/// read consistency levels; `none` waits for nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadBarrier {
    /// The state the leader has applied, as the leader knows it without
    /// asking anyone (rqlite's `weak`: a deposed leader that does not know
    /// it yet may answer for a moment).
    Leader,
    /// What the leader had committed when a quorum confirmed it still
    /// leads (`linearizable`; openraft's read index, no log write).
    Quorum,
    /// An entry of its own through the log (`strong`).
    Log,
}

/// A request to remove a node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemoveRequest {
    pub id: NodeId,
}

/// What a node says of the cluster (the raft service's status, and
/// `tablix cluster status`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub id: NodeId,
    pub addr: String,
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub leader_addr: Option<String>,
    /// The log's last entry, the last the state applied and the last a
    /// snapshot holds, numbered as the store numbers them (from 1, as
    /// `tablix_meta`'s `applied_index`), not as openraft does.
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// Every member: id, address, voter or not.
    pub members: Vec<Member>,
    /// The id of the cluster this node belongs to (none before it
    /// bootstrapped or joined one).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// The version of this node's apply (`tablix_store::APPLY_VERSION`):
    /// every member runs the same one.
    #[serde(default)]
    pub apply_version: Option<u32>,
    /// Why this node's raft stopped (a storage failure: a full disk, an
    /// I/O error); it takes no entry until restarted.
    #[serde(default)]
    pub stopped: Option<String>,
    /// This node's SQL API, once it serves one.
    #[serde(default)]
    pub api_addr: Option<String>,
}

/// One member as a node sees it when it asks it (rqlite's `/nodes`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeReport {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    pub leader: bool,
    pub reachable: bool,
    /// Seconds the member took to answer.
    pub time: f64,
    pub api_addr: Option<String>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Member {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
}

/// What the raft service and the forwarder share.
pub(crate) struct Shared {
    pub(crate) id: NodeId,
    pub(crate) addr: String,
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) proposer: Proposer,
    pub(crate) transport: Transport,
    pub(crate) identity: ClusterIdentity,
    /// What this node's state machine answered the Commands it applied
    /// lately: the reply a proposal sent again is given.
    pub(crate) replies: crate::RecentReplies,
    pub(crate) leader_wait: Duration,
    /// Held by the leader through a membership change: openraft refuses a
    /// change while another is in progress, and nodes join concurrently.
    pub(crate) changing: tokio::sync::Mutex<()>,
    pub(crate) api_addr: std::sync::RwLock<Option<String>>,
    /// When this node last took an append (entries or a heartbeat) from a
    /// leader of its current term or a later one.
    pub(crate) last_contact: std::sync::Mutex<Option<Instant>>,
    /// Set on the leader while it hands leadership over: it takes no
    /// proposal (they wait for the next leader).
    pub(crate) transferring: std::sync::atomic::AtomicBool,
    /// Until when this node holds back from standing for election (a
    /// leadership transfer asked it to).
    pub(crate) hold_until: std::sync::Mutex<Option<Instant>>,
    /// When the service last logged a refused request: peers retry many
    /// times a second, the log says it once in a while.
    pub(crate) refused_logged: std::sync::Mutex<Option<Instant>>,
}

/// How fresh a node's state is, for rqlite's `freshness`.
#[derive(Clone, Copy, Debug)]
pub struct Freshness {
    /// How long ago the leader was last heard from (none: never since
    /// this node started).
    pub since_leader: Option<Duration>,
    /// Entries this node holds in its log but has not applied.
    pub unapplied: u64,
}

impl Shared {
    /// Logs `message` as a warning unless one was logged in the last
    /// ten seconds.
    pub(crate) fn warn_rarely(&self, message: String) {
        let Ok(mut last) = self.refused_logged.lock() else {
            return;
        };
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!("{message}");
        }
    }

    pub(crate) fn heard_from_leader(&self) {
        if let Ok(mut t) = self.last_contact.lock() {
            *t = Some(Instant::now());
        }
    }

    /// The leader this node knows of and its raft address.
    fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = named_leader(&m, self.id)?;
        let addr = m
            .membership_config
            .nodes()
            .find(|(n, _)| **n == id)
            .map(|(_, node)| node.addr.clone())?;
        Some((id, addr))
    }

    pub(crate) fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics();
        let m = m.borrow();
        let voters: BTreeSet<NodeId> = m.membership_config.voter_ids().collect();
        let members = m
            .membership_config
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect::<Vec<_>>();
        let leader = named_leader(&m, self.id);
        let leader_addr =
            leader.and_then(|l| members.iter().find(|n| n.id == l).map(|n| n.addr.clone()));
        ClusterStatus {
            id: self.id,
            addr: self.addr.clone(),
            state: if removed(&m, self.id) {
                "removed"
            } else {
                match m.state {
                    ServerState::Leader => "leader",
                    ServerState::Follower => "follower",
                    ServerState::Candidate => "candidate",
                    ServerState::Learner => "learner",
                    ServerState::Shutdown => "shutdown",
                }
            }
            .to_string(),
            term: m.current_term,
            leader,
            leader_addr,
            last_log_index: m
                .last_log_index
                .map(|i| crate::to_log(m.current_term, i).index),
            applied_index: m
                .last_applied
                .map(|l| crate::to_log(l.leader_id.term, l.index).index),
            snapshot_index: m
                .snapshot
                .map(|l| crate::to_log(l.leader_id.term, l.index).index),
            members,
            cluster_id: self.identity.get(),
            apply_version: Some(tablix_store::APPLY_VERSION),
            stopped: m.running_state.as_ref().err().map(|e| e.to_string()),
            api_addr: self.api_addr.read().ok().and_then(|a| a.clone()),
        }
    }

    /// Every member (voters only unless `learners`), each asked for its
    /// status within `ttl`, in parallel.
    pub(crate) async fn nodes(&self, learners: bool, ttl: Duration) -> Vec<NodeReport> {
        let status = self.status();
        let asked = status
            .members
            .iter()
            .filter(|m| m.voter || learners)
            .map(|m| {
                let m = m.clone();
                let own = status.clone();
                let transport = self.transport.clone();
                let leader = status.leader == Some(m.id);
                async move {
                    let began = Instant::now();
                    let answer = if m.id == own.id {
                        Ok(own)
                    } else {
                        transport.status(&m.addr, ttl).await
                    };
                    let time = began.elapsed().as_secs_f64();
                    match answer {
                        Ok(s) => NodeReport {
                            id: m.id,
                            addr: m.addr,
                            voter: m.voter,
                            leader,
                            reachable: true,
                            time,
                            api_addr: s.api_addr,
                            error: None,
                        },
                        Err(e) => NodeReport {
                            id: m.id,
                            addr: m.addr,
                            voter: m.voter,
                            leader,
                            reachable: false,
                            time,
                            api_addr: None,
                            error: Some(e.to_string()),
                        },
                    }
                }
            });
        let tasks: Vec<_> = asked.map(tokio::spawn).collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(r) = t.await {
                out.push(r);
            }
        }
        out
    }

    /// Proposes `command` wherever the leader is, waiting up to
    /// `leader_wait` for one; answered once this node applied it.
    pub(crate) async fn propose_anywhere(
        &self,
        command: Stamped<ReplicatedCommand>,
    ) -> Result<CommandReply, StoreError> {
        let deadline = Instant::now() + self.leader_wait;
        let seed = command.stamp.seed;
        let mut last = String::from("no leader is known");
        // Whether a copy sent may have been applied: then running out of
        // time is not "no leader took it".
        let mut maybe_applied = false;
        loop {
            // No leader will take a Command from a node it removed, and a
            // node is added again only by a member: waiting helps nothing.
            if removed(&self.raft.metrics().borrow(), self.id) {
                return Err(StoreError::NoLeader(
                    "this node is no longer a member of its cluster: it was removed; send writes to a member"
                        .into(),
                ));
            }
            match self.leader() {
                Some((id, _)) if id == self.id && self.is_transferring() => {
                    last = "this node is handing leadership over".into();
                }
                Some((id, _)) if id == self.id => {
                    // A leader cut off from its quorum does not know it:
                    // its entry waits for a commit that may never come.
                    let left = deadline.saturating_duration_since(Instant::now());
                    let proposed = tokio::time::timeout(
                        left.max(Duration::from_millis(100)),
                        self.proposer.propose_at(command.clone()),
                    )
                    .await;
                    match proposed {
                        Ok(Ok(c)) => return Ok(self.replies.resolve(seed, c.reply)),
                        Ok(Err(e @ ProposeError::NotLeader { .. })) => last = e.to_string(),
                        Ok(Err(e)) => return Err(StoreError::Replication(e.to_string())),
                        Err(_) => {
                            return Err(StoreError::Replication(format!(
                                "this node leads but a majority did not take the Command within {:?} (a partition?); it is applied only if this node's leadership holds",
                                self.leader_wait
                            )));
                        }
                    }
                }
                Some((id, addr)) => {
                    let answer: Result<Result<Committed, ProposeError>, TransportError> = self
                        .transport
                        .call(&addr, path::PROPOSE, &command, self.leader_wait)
                        .await;
                    match answer {
                        Ok(Ok(c)) => {
                            self.raft
                                .wait(Some(self.leader_wait))
                                .applied_index_at_least(Some(c.index), "a forwarded proposal")
                                .await
                                .map_err(|e| {
                                    StoreError::Replication(format!(
                                        "the leader applied the Command but this node did not within {:?}: {e}",
                                        self.leader_wait
                                    ))
                                })?;
                            return Ok(self.replies.resolve(seed, c.reply));
                        }
                        Ok(Err(e @ ProposeError::NotLeader { .. })) => last = e.to_string(),
                        Err(e @ TransportError::Unreachable { .. }) => last = e.to_string(),
                        // The leader may have taken it, lost leadership or
                        // died before answering: sent again, it is applied
                        // once (its seed) and answered where it was.
                        Err(e @ TransportError::NoAnswer { .. }) if Instant::now() < deadline => {
                            last = format!("{e}; the Command may have been applied");
                            maybe_applied = true;
                        }
                        Ok(Err(e)) => {
                            return Err(StoreError::Replication(format!(
                                "the leader, node {id}, refused the Command: {e}"
                            )));
                        }
                        Err(e) => {
                            return Err(StoreError::Replication(format!(
                                "forwarding to the leader, node {id}: {e}; the Command may have been applied"
                            )));
                        }
                    }
                }
                None => {}
            }
            if Instant::now() >= deadline {
                let waited = self.leader_wait;
                return Err(if maybe_applied {
                    StoreError::Replication(format!(
                        "no leader answered for the Command within {waited:?} ({last})"
                    ))
                } else {
                    StoreError::NoLeader(format!(
                        "no leader accepted the Command within {waited:?} ({last})"
                    ))
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// On the leader: the index (openraft's) a node must have applied
    /// before a read of `barrier` runs on its state.
    pub(crate) async fn read_index_here(&self, barrier: ReadBarrier) -> Result<u64, ProposeError> {
        let leader = named_leader(&self.raft.metrics().borrow(), self.id);
        if leader != Some(self.id) {
            return Err(ProposeError::NotLeader { leader });
        }
        match barrier {
            ReadBarrier::Leader => Ok(self
                .raft
                .metrics()
                .borrow()
                .last_applied
                .map_or(0, |l| l.index)),
            ReadBarrier::Quorum => match self.raft.ensure_linearizable().await {
                Ok(read) => Ok(read.map_or(0, |l| l.index)),
                Err(e) => match e.forward_to_leader() {
                    Some(f) => Err(ProposeError::NotLeader {
                        leader: f.leader_id,
                    }),
                    None => Err(ProposeError::Raft(e.to_string())),
                },
            },
            ReadBarrier::Log => match self.raft.client_write(Vec::new()).await {
                Ok(r) => Ok(r.log_id.index),
                Err(e) => Err(ProposeError::of(e)),
            },
        }
    }

    /// Waits until this node's state may serve a read of `barrier`: the
    /// leader (this node, or the one asked over its service) says which
    /// index, and this node applies up to it. Waits up to `leader_wait`
    /// for a leader.
    pub(crate) async fn read_barrier(&self, barrier: ReadBarrier) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.leader_wait;
        let mut last = String::from("no leader is known");
        loop {
            let index = match self.leader() {
                Some((id, _)) if id == self.id => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let asked = tokio::time::timeout(
                        left.max(Duration::from_millis(100)),
                        self.read_index_here(barrier),
                    )
                    .await;
                    match asked {
                        Ok(Ok(i)) => Some(i),
                        Ok(Err(e @ ProposeError::NotLeader { .. })) => {
                            last = e.to_string();
                            None
                        }
                        Ok(Err(e)) => return Err(StoreError::NoLeader(e.to_string())),
                        Err(_) => {
                            return Err(StoreError::NoLeader(format!(
                                "no majority confirmed this node's leadership within {:?}",
                                self.leader_wait
                            )));
                        }
                    }
                }
                Some((id, addr)) => {
                    let answer: Result<Result<u64, ProposeError>, TransportError> = self
                        .transport
                        .call(&addr, path::READ_INDEX, &barrier, self.leader_wait)
                        .await;
                    match answer {
                        Ok(Ok(i)) => Some(i),
                        Ok(Err(e @ ProposeError::NotLeader { .. })) => {
                            last = e.to_string();
                            None
                        }
                        Err(e @ TransportError::Unreachable { .. }) => {
                            last = e.to_string();
                            None
                        }
                        Ok(Err(e)) => {
                            return Err(StoreError::Replication(format!(
                                "the leader, node {id}, refused the read: {e}"
                            )));
                        }
                        Err(e) => return Err(StoreError::Replication(e.to_string())),
                    }
                }
                None => None,
            };
            if let Some(index) = index {
                let left = deadline.saturating_duration_since(Instant::now());
                return self
                    .raft
                    .wait(Some(left.max(Duration::from_millis(100))))
                    .applied_index_at_least(Some(index), "a read barrier")
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        StoreError::NoLeader(format!(
                            "this node did not apply up to the leader's entry {} in time: {e}",
                            index + 1
                        ))
                    });
            }
            if Instant::now() >= deadline {
                return Err(StoreError::NoLeader(format!(
                    "no leader answered within {:?} ({last})",
                    self.leader_wait
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Adds a node (on the leader; another node sends it there).
    pub(crate) async fn join(&self, request: JoinRequest) -> Result<(), String> {
        match self.leader() {
            Some((id, _)) if id == self.id => {}
            Some((_, addr)) => {
                return self
                    .transport
                    .join(&addr, &request, MEMBERSHIP_WAIT)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            None => return Err("no leader is known: try again once one is elected".into()),
        }
        let _turn = self.changing.lock().await;
        let status = self.status();
        let mut member = status.members.iter().find(|m| m.id == request.id);
        if let Some(m) = member
            && m.addr == request.addr
            && request.fresh
        {
            // A member whose log is empty lost its data directory. Taken
            // back as it was, the log it acknowledged would count where it
            // is gone (and openraft refuses a follower's log that went
            // back): it leaves and comes in again as a new node.
            if request.id == self.id {
                return Err("the leader cannot re-add itself".into());
            }
            tracing::warn!(
                "node {} came back with an empty log: removing it and adding it again",
                request.id
            );
            let change = if m.voter {
                ChangeMembers::RemoveVoters(BTreeSet::from([request.id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([request.id]))
            };
            self.raft
                .change_membership(change, false)
                .await
                .map_err(|e| format!("removing node {} that lost its data: {e}", request.id))?;
            if m.voter {
                self.raft
                    .change_membership(
                        ChangeMembers::RemoveNodes(BTreeSet::from([request.id])),
                        false,
                    )
                    .await
                    .map_err(|e| format!("removing node {} that lost its data: {e}", request.id))?;
            }
            member = None;
        }
        if let Some(m) = member {
            if m.addr != request.addr {
                return Err(format!(
                    "node {} is a member already, at {}: remove it before adding it at {}",
                    request.id, m.addr, request.addr
                ));
            }
            if m.voter || !request.voter {
                return Ok(());
            }
        } else {
            self.welcome(&request.addr).await?;
            self.raft
                .add_learner(request.id, Node::new(request.addr.clone()), true)
                .await
                .map_err(|e| format!("adding node {} as a learner: {e}", request.id))?;
        }
        if request.voter {
            self.raft
                .change_membership(
                    ChangeMembers::AddVoterIds(BTreeSet::from([request.id])),
                    false,
                )
                .await
                .map_err(|e| format!("making node {} a voter: {e}", request.id))?;
        }
        Ok(())
    }

    /// Gives the node at `addr`, about to be added, this cluster's id.
    /// It refuses when it belongs to another cluster; it must be running
    /// (a node without the id takes no entry).
    ///
    /// A welcome is idempotent, so one that got no answer is sent again
    /// (seen once in CI: the welcome to a node started again at its old
    /// address, just after the leader removed its earlier incarnation,
    /// failed in hyper's client with `SendRequest`).
    async fn welcome(&self, addr: &str) -> Result<(), String> {
        let mut tries = 0;
        loop {
            tries += 1;
            let answer: Result<Result<(), String>, TransportError> = self
                .transport
                .call(addr, path::WELCOME, &(), Duration::from_secs(5))
                .await;
            return match answer {
                Ok(r) => r,
                Err(TransportError::Refused { message, .. }) => Err(format!(
                    "the node at {addr} cannot join this cluster: {message}"
                )),
                Err(TransportError::Unreachable { .. } | TransportError::NoAnswer { .. })
                    if tries < WELCOME_TRIES =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => Err(format!(
                    "{e}: start the node before adding it (it takes the cluster's id from the leader)"
                )),
            };
        }
    }

    pub(crate) fn is_transferring(&self) -> bool {
        self.transferring.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stands for no election for `hold` (a leadership transfer to
    /// another node is under way); then stands again unless a later hold
    /// runs longer.
    pub(crate) fn hold_elections(self: &Arc<Self>, hold: Duration) {
        if hold.is_zero() {
            if let Ok(mut h) = self.hold_until.lock() {
                *h = None;
            }
            self.raft.runtime_config().elect(true);
            return;
        }
        let until = Instant::now() + hold;
        if let Ok(mut h) = self.hold_until.lock() {
            *h = Some(until);
        }
        self.raft.runtime_config().elect(false);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            let over = me
                .hold_until
                .lock()
                .map(|h| h.is_none_or(|h| Instant::now() >= h))
                .unwrap_or(true);
            if over {
                me.raft.runtime_config().elect(true);
            }
        });
    }

    /// Hands leadership to voter `target` (on the leader; another node
    /// sends it there). The leader stops taking proposals, waits until
    /// `target` holds its whole log, asks the other voters to stand for
    /// no election for a while, and stops its heartbeats: once the
    /// followers' leases run out, `target`, alone in standing, is
    /// elected. Raft's own rules keep it safe whatever happens; if
    /// `target` is not leader within the wait, everything is turned back
    /// on and the cluster elects as usual.
    pub(crate) async fn transfer_leader(self: &Arc<Self>, target: NodeId) -> Result<(), String> {
        match self.leader() {
            Some((id, _)) if id == self.id => {}
            Some((_, addr)) => {
                return self
                    .transport
                    // The leader's wait, its holds released, and some.
                    .call::<_, Result<(), String>>(
                        &addr,
                        path::TRANSFER,
                        &target,
                        TRANSFER_WAIT * 3,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            None => return Err("no leader is known: try again once one is elected".into()),
        }
        if target == self.id {
            return Ok(());
        }
        let status = self.status();
        let Some(member) = status.members.iter().find(|m| m.id == target) else {
            return Err(format!("node {target} is not a member"));
        };
        if !member.voter {
            return Err(format!(
                "node {target} is a learner: make it a voter (tablix cluster add) before handing it leadership"
            ));
        }
        let _turn = self.changing.lock().await;
        self.transferring
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let outcome = self.hand_over(target, &status).await;
        self.raft.runtime_config().heartbeat(true);
        self.transferring
            .store(false, std::sync::atomic::Ordering::SeqCst);
        outcome
    }

    async fn hand_over(
        self: &Arc<Self>,
        target: NodeId,
        status: &ClusterStatus,
    ) -> Result<(), String> {
        let deadline = Instant::now() + TRANSFER_WAIT;
        // The target must hold everything this leader appended.
        loop {
            let caught_up = {
                let m = self.raft.metrics();
                let m = m.borrow();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&target).copied().flatten())
                    .map(|l| l.index);
                m.last_log_index.is_some() && matched == m.last_log_index
            };
            if caught_up {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "node {target} did not catch up with the leader's log within {TRANSFER_WAIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let hold = TRANSFER_WAIT;
        for m in status.members.iter().filter(|m| m.voter && m.id != target) {
            if m.id == self.id {
                self.hold_elections(hold);
                continue;
            }
            let held: Result<Result<(), String>, TransportError> = self
                .transport
                .call(
                    &m.addr,
                    path::HOLD,
                    &(hold.as_millis() as u64),
                    Duration::from_secs(2),
                )
                .await;
            if let Err(e) = held.map_err(|e| e.to_string()).and_then(|r| r) {
                // It may stand against the target; the transfer may still
                // work, and nothing unsafe follows if it does not.
                tracing::warn!("node {} did not agree to hold its elections: {e}", m.id);
            }
        }
        self.raft.runtime_config().heartbeat(false);
        let elected = self
            .raft
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .metrics(|m| m.current_leader == Some(target), "the target to lead")
            .await;
        // Whatever happened, no node holds back any longer than needed.
        self.release_holds(status).await;
        elected.map(|_| ()).map_err(|_| {
            format!(
                "node {target} was not elected within {TRANSFER_WAIT:?}; the cluster elects as usual"
            )
        })
    }

    async fn release_holds(self: &Arc<Self>, status: &ClusterStatus) {
        for m in status.members.iter().filter(|m| m.voter) {
            if m.id == self.id {
                self.hold_elections(Duration::ZERO);
            } else {
                let _: Result<Result<(), String>, TransportError> = self
                    .transport
                    .call(&m.addr, path::HOLD, &0u64, Duration::from_secs(2))
                    .await;
            }
        }
    }

    /// Removes a node (on the leader; another node sends it there).
    pub(crate) async fn remove(&self, request: RemoveRequest) -> Result<(), String> {
        match self.leader() {
            Some((id, _)) if id == self.id => {}
            Some((_, addr)) => {
                return self
                    .transport
                    .remove(&addr, request.id, MEMBERSHIP_WAIT)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            None => return Err("no leader is known: try again once one is elected".into()),
        }
        let _turn = self.changing.lock().await;
        let status = self.status();
        let Some(member) = status.members.iter().find(|m| m.id == request.id) else {
            return Err(format!("node {} is not a member", request.id));
        };
        let voters = status.members.iter().filter(|m| m.voter).count();
        if member.voter && voters == 1 {
            return Err(format!(
                "node {} is the cluster's last voter: a cluster cannot remove it",
                request.id
            ));
        }
        let change = if member.voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([request.id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([request.id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| format!("removing node {}: {e}", request.id))?;
        Ok(())
    }
}

/// Breaks runs of split votes. Openraft 0.9 draws a node's election
/// timeout once, at start, and checks it on a tick (1.5 heartbeats): two
/// nodes whose timeouts fall in one tick, started together, stand as
/// candidates in the same ticks term after term and never elect (seen
/// with three daemons started by one shell loop). A node that stands
/// twice in a row without a leader sits out a random part of the longest
/// timeout, granting votes meanwhile, so another can win.
async fn break_split_votes(shared: std::sync::Weak<Shared>, longest_ms: u64) {
    // The server's metrics change only with its vote, state and
    // membership; the whole metrics change at every entry and would wake
    // this task for each.
    let Some(mut metrics) = shared.upgrade().map(|s| s.raft.server_metrics()) else {
        return;
    };
    let mut stood = 0u32;
    let mut last_term = 0;
    while metrics.changed().await.is_ok() {
        let (state, term) = {
            let m = metrics.borrow();
            (m.state, m.vote.leader_id().get_term())
        };
        if state != ServerState::Candidate {
            stood = 0;
            continue;
        }
        if term != last_term {
            last_term = term;
            stood += 1;
        }
        if stood >= 2 {
            stood = 0;
            let pause = Duration::from_millis(random_below(longest_ms.max(1)));
            tracing::debug!("two elections in a row without a leader: sitting out {pause:?}");
            let Some(s) = shared.upgrade() else { return };
            s.raft.runtime_config().elect(false);
            drop(s);
            tokio::time::sleep(pause).await;
            let Some(s) = shared.upgrade() else { return };
            // A leadership transfer's hold outlasts this pause.
            let held = s
                .hold_until
                .lock()
                .map(|h| h.is_some_and(|h| Instant::now() < h))
                .unwrap_or(false);
            if !held {
                s.raft.runtime_config().elect(true);
            }
        }
    }
}

/// On the leader: records as gone (`FsOp::Unmount`) the mounts of nodes
/// that are no longer members, so that no unlinked file waits for a
/// kernel that left (tablix-fs's `tablix_mount`). It looks whenever this
/// node becomes leader or the membership changes, and again after a
/// failed try; so a leader that removed itself leaves it to the next.
async fn forget_gone_mounts(shared: std::sync::Weak<Shared>, store: Arc<Store>) {
    // Server metrics: woken by a change of state, vote or membership, not
    // by every entry.
    let Some(mut metrics) = shared.upgrade().map(|s| s.raft.server_metrics()) else {
        return;
    };
    // (term, membership entry) last settled.
    let mut settled = None;
    // The first look, and one after a failed try, waits for no change.
    let mut again = true;
    loop {
        if !again && metrics.changed().await.is_err() {
            return;
        }
        again = false;
        let (now, members) = {
            let m = metrics.borrow();
            if m.state != ServerState::Leader {
                continue;
            }
            let members: BTreeSet<NodeId> =
                m.membership_config.nodes().map(|(id, _)| *id).collect();
            (
                (m.vote.leader_id().get_term(), *m.membership_config.log_id()),
                members,
            )
        };
        if settled == Some(now) {
            continue;
        }
        let read = {
            let store = Arc::clone(&store);
            tokio::task::spawn_blocking(move || store.read(|c| tablix_fs::read::mounted_nodes(c)))
                .await
        };
        let gone: Vec<u64> = match read {
            Ok(Ok(Ok(mounted))) => mounted
                .into_iter()
                .filter(|n| !members.contains(n))
                .collect(),
            other => {
                tracing::warn!("reading which nodes mount the file system: {other:?}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                again = true;
                continue;
            }
        };
        let mut done = true;
        for node in gone {
            let Some(s) = shared.upgrade() else { return };
            let command = Stamped::new(
                tablix_store::Stamp::now(),
                ReplicatedCommand::Fs(tablix_fs::FsOp::Unmount { node }),
            );
            match s.propose_anywhere(command).await {
                Ok(_) => {
                    tracing::info!("node {node} left the cluster: its mount is recorded as gone")
                }
                Err(e) => {
                    tracing::warn!("recording node {node}'s mount as gone, to be tried again: {e}");
                    done = false;
                }
            }
        }
        if done {
            settled = Some(now);
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            again = true;
        }
    }
}

/// The leader `me`'s metrics name. Openraft goes on naming a leader that
/// left office with no successor in sight (a leader that removed itself
/// names itself still), so a node names itself only while it leads.
fn named_leader(m: &openraft::RaftMetrics<NodeId, Node>, me: NodeId) -> Option<NodeId> {
    match m.current_leader {
        Some(l) if l == me && m.state != ServerState::Leader => None,
        named => named,
    }
}

/// Whether `me` was a member and is no longer: its membership names
/// other nodes and not it. (A node waiting to be added knows no
/// membership yet.)
fn removed(m: &openraft::RaftMetrics<NodeId, Node>, me: NodeId) -> bool {
    let mut nodes = m.membership_config.nodes().map(|(id, _)| *id).peekable();
    nodes.peek().is_some() && !nodes.any(|id| id == me)
}

/// A database at most this large is snapshotted every `snapshot_every`
/// entries whatever their size.
const SMALL_DATABASE: u64 = 64 << 20;

/// Takes a snapshot (openraft then purges the log behind it) once
/// `every` entries were applied since the last, and, for a database over
/// `SMALL_DATABASE`, once the log holds at least half as many bytes as
/// the database. A snapshot copies the whole database: by entries alone,
/// every 5,000 small writes to a database of gigabytes copied all of it,
/// on every node at once. With the byte bound a snapshot costs at most
/// about two bytes copied for every byte logged.
async fn take_snapshots(
    shared: std::sync::Weak<Shared>,
    store: std::sync::Weak<Store>,
    log: LogStore<TypeConfig>,
    every: u64,
) {
    // Openraft drops the metrics' sender when it stops.
    let Some(metrics) = shared.upgrade().map(|s| s.raft.metrics()) else {
        return;
    };
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if metrics.has_changed().is_err() {
            return;
        }
        let (applied, snapshot) = {
            let m = metrics.borrow();
            (
                m.last_applied.map_or(0, |l| l.index),
                m.snapshot.map_or(0, |l| l.index),
            )
        };
        if applied.saturating_sub(snapshot) < every {
            continue;
        }
        let (Some(s), Some(store)) = (shared.upgrade(), store.upgrade()) else {
            return;
        };
        // The log's lock waits for an append's sync: not on an async worker.
        let logged = log.clone();
        let sizes = tokio::task::spawn_blocking(move || {
            store.database_bytes().map(|db| (db, logged.bytes()))
        })
        .await;
        let (database, logged) = match sizes {
            Ok(Ok(sizes)) => sizes,
            other => {
                tracing::warn!("reading the database's size for the snapshot policy: {other:?}");
                continue;
            }
        };
        if database > SMALL_DATABASE && logged < database / 2 {
            continue;
        }
        if let Err(e) = s.raft.trigger().snapshot().await {
            tracing::warn!("asking openraft for a snapshot: {e}");
            return;
        }
    }
}

/// The lock lease. On the leader: expires (`FsOp::ExpireLocks`) the
/// locks of a node that has answered none of its RPCs (heartbeats are
/// some) for `lease`, counted from when this node took office at the
/// earliest, so that a lock held on a machine that died is not held
/// forever. On any other node: says once when no leader has been heard
/// from for `lease` while this node's processes hold locks, since the
/// leader may be taking them (and while no leader is reachable, nothing
/// here can write anyway).
///
/// It holds neither the node nor its store between looks, and ends when
/// openraft stops.
async fn keep_lock_leases(
    shared: std::sync::Weak<Shared>,
    store: std::sync::Weak<Store>,
    lease: Duration,
) {
    // Openraft drops the metrics' sender when it stops.
    let Some(metrics) = shared.upgrade().map(|s| s.raft.metrics()) else {
        return;
    };
    let tick = (lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    // The term this node leads in, and since when.
    let mut leading: Option<(u64, Instant)> = None;
    let mut warned = false;
    loop {
        tokio::time::sleep(tick).await;
        if metrics.has_changed().is_err() {
            return;
        }
        let (Some(s), Some(store)) = (shared.upgrade(), store.upgrade()) else {
            return;
        };
        let (state, term) = {
            let m = s.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_term)
        };
        let read =
            tokio::task::spawn_blocking(move || store.read(|c| tablix_fs::read::lock_holders(c)))
                .await;
        let holders = match read {
            Ok(Ok(Ok(holders))) => holders,
            other => {
                tracing::warn!("reading which nodes hold locks: {other:?}");
                continue;
            }
        };
        if state != ServerState::Leader {
            leading = None;
            let silent = s
                .last_contact
                .lock()
                .ok()
                .and_then(|t| t.map(|t| t.elapsed()))
                .is_some_and(|e| e >= lease);
            if silent && holders.contains(&s.id) {
                if !warned {
                    tracing::warn!(
                        "no leader has been heard from for {} s (the lock lease): the locks this node's processes hold may be expired by the cluster",
                        lease.as_secs_f64()
                    );
                }
                warned = true;
            } else {
                warned = false;
            }
            continue;
        }
        warned = false;
        let since = match leading {
            Some((t, since)) if t == term => since,
            _ => {
                let now = Instant::now();
                leading = Some((term, now));
                now
            }
        };
        for node in holders.into_iter().filter(|n| *n != s.id) {
            let heard = s
                .transport
                .last_answer(node)
                .map_or(since, |t| t.max(since));
            if heard.elapsed() < lease {
                continue;
            }
            let command = Stamped::new(
                tablix_store::Stamp::now(),
                ReplicatedCommand::Fs(tablix_fs::FsOp::ExpireLocks { node }),
            );
            match s.propose_anywhere(command).await {
                Ok(_) => tracing::warn!(
                    "node {node} has answered nothing for {:.1} s (the lock lease is {} s): its locks are expired",
                    heard.elapsed().as_secs_f64(),
                    lease.as_secs_f64()
                ),
                Err(e) => {
                    tracing::warn!("expiring the locks of node {node}, to be tried again: {e}")
                }
            }
        }
    }
}

/// A number in `0..n`, different in every process and call.
fn random_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() % n
}

/// The store's proposer in a cluster (see the module's documentation).
struct Forwarder {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
}

impl Propose for Forwarder {
    fn propose(&self, command: Stamped<ReplicatedCommand>, answer: ProposeAnswer) {
        let shared = Arc::clone(&self.shared);
        self.runtime.spawn(async move {
            answer(shared.propose_anywhere(command).await);
        });
    }
}

/// What the SQL API needs of a running node: its status, the members as
/// it sees them, and membership changes (through the leader).
#[derive(Clone)]
pub struct ClusterHandle(Arc<Shared>);

impl std::fmt::Debug for ClusterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterHandle(node {})", self.0.id)
    }
}

impl ClusterHandle {
    pub fn status(&self) -> ClusterStatus {
        self.0.status()
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.0.id
    }

    /// Records the address of this node's SQL API, for other nodes to
    /// report.
    pub fn set_api_addr(&self, addr: String) {
        if let Ok(mut a) = self.0.api_addr.write() {
            *a = Some(addr);
        }
    }

    /// Every voter (and learner, with `learners`), asked within `ttl`.
    pub async fn nodes(&self, learners: bool, ttl: Duration) -> Vec<NodeReport> {
        self.0.nodes(learners, ttl).await
    }

    pub async fn join(&self, request: JoinRequest) -> Result<(), String> {
        self.0.join(request).await
    }

    pub async fn remove(&self, id: NodeId) -> Result<(), String> {
        self.0.remove(RemoveRequest { id }).await
    }

    /// Waits until this node's state may serve a read of `barrier`.
    pub async fn read_barrier(&self, barrier: ReadBarrier) -> Result<(), StoreError> {
        self.0.read_barrier(barrier).await
    }

    pub fn is_leader(&self) -> bool {
        named_leader(&self.0.raft.metrics().borrow(), self.0.id) == Some(self.0.id)
    }

    /// How fresh this node's state is; `None` on the leader, whose state
    /// is as fresh as the cluster's.
    pub fn freshness(&self) -> Option<Freshness> {
        let m = self.0.raft.metrics().borrow().clone();
        if named_leader(&m, self.0.id) == Some(self.0.id) {
            return None;
        }
        let since_leader = self
            .0
            .last_contact
            .lock()
            .ok()
            .and_then(|t| t.map(|t| t.elapsed()));
        let unapplied = m
            .last_log_index
            .unwrap_or(0)
            .saturating_sub(m.last_applied.map_or(0, |l| l.index));
        Some(Freshness {
            since_leader,
            unapplied,
        })
    }

    /// The URL of the leader's SQL API (asked of the leader within
    /// `ttl`), if a leader is known and serves one.
    pub async fn leader_api(&self, ttl: Duration) -> Option<String> {
        let (id, addr) = self.0.leader()?;
        if id == self.0.id {
            return self.0.api_addr.read().ok().and_then(|a| a.clone());
        }
        self.0.transport.status(&addr, ttl).await.ok()?.api_addr
    }

    /// Whether this node is a learner (a member that does not vote).
    pub fn is_learner(&self) -> bool {
        let s = self.0.status();
        s.members.iter().any(|m| m.id == s.id && !m.voter)
    }
}

/// A node whose raft log is empty may come with a state built by the
/// store's own log (a daemon that ran without cluster flags): it holds
/// entries but no membership. Bootstrapping makes that state the
/// cluster's first: its last entry gets this node as the only voter, and
/// openraft starts from it as from a snapshot (its log purged up to that
/// entry, a snapshot built for the nodes that join). A node that would
/// join or resume with such a state is refused: joining replaces the
/// state with the cluster's.
fn adopt_own_state(
    config: &ClusterConfig,
    store: &Store,
    identity: &ClusterIdentity,
    advertise: &str,
) -> Result<(), ClusterError> {
    let state = store.applied_state()?;
    let (Some(applied), None) = (state.applied, state.membership) else {
        return Ok(());
    };
    let held = format!(
        "this data directory holds the state of a tablix that ran without cluster flags (entries up to {})",
        applied.index
    );
    match &config.start {
        Start::Bootstrap => {
            let members: BTreeMap<NodeId, Node> = [(config.id, Node::new(advertise))].into();
            let stored = openraft::StoredMembership::new(
                Some(crate::from_log::<NodeId>(applied)),
                openraft::Membership::from(members),
            );
            let bytes = postcard::to_stdvec(&stored)
                .map_err(|e| ClusterError::Membership(e.to_string()))?;
            // The id first: a crash before the membership is recorded
            // leaves a state this adopts again at the next start.
            if identity.get().is_none() {
                identity.create()?;
            }
            store.adopt_membership(&bytes)?;
            tracing::info!(
                "{held}: it is the new cluster's first state, with node {} its only voter",
                config.id
            );
            Ok(())
        }
        Start::Join(peer) => Err(ClusterError::Membership(format!(
            "{held}; a node joining {peer} takes that cluster's state, and this one would be lost. Join with an empty data directory, or start a cluster from this state with --bootstrap and join the other nodes to it"
        ))),
        Start::Resume => Err(ClusterError::Membership(format!(
            "{held} and is no cluster's member: add --bootstrap to start a cluster from it, or --join ADDR with an empty data directory"
        ))),
    }
}

/// A running node.
pub struct ClusterNode {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

/// How long a join may go on asking, and telling the operator why it
/// still waits: at the first retry, then every [`Waiting::EVERY`], so a
/// join to a peer that is down is not a silent minute.
struct Waiting<'a> {
    peer: &'a str,
    began: Instant,
    deadline: Instant,
    said: Option<Instant>,
}

impl<'a> Waiting<'a> {
    const EVERY: Duration = Duration::from_secs(5);

    fn new(peer: &'a str, wait: Duration) -> Waiting<'a> {
        let began = Instant::now();
        Waiting {
            peer,
            began,
            deadline: began + wait,
            said: None,
        }
    }

    /// A try failed for `why`: the join may try again (said now and
    /// then), or, once the wait is over, gives up with this error.
    fn retry(&mut self, why: &dyn std::fmt::Display) -> Result<(), ClusterError> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(ClusterError::Membership(format!(
                "gave up joining through {} after {} s: {why}",
                self.peer,
                now.duration_since(self.began).as_secs()
            )));
        }
        if self
            .said
            .is_some_and(|at| now.duration_since(at) < Self::EVERY)
        {
            return Ok(());
        }
        self.said = Some(now);
        let left = self.deadline.saturating_duration_since(now).as_secs();
        tracing::warn!(
            "cannot join through {} yet ({why}); retrying for up to {left} s more",
            self.peer
        );
        Ok(())
    }
}

impl ClusterNode {
    /// Starts the node on the current tokio runtime: openraft over the log
    /// in `log_dir` and `store` (opened with `LogKeeper::Replication`),
    /// the raft service, and the store's proposer; then bootstraps or
    /// joins as `config.start` says.
    pub async fn start(
        config: ClusterConfig,
        store: Arc<Store>,
    ) -> Result<ClusterNode, ClusterError> {
        let identity = ClusterIdentity::load(&config.identity_file)?;
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let advertise = config.advertise.clone().unwrap_or_else(|| addr.to_string());
        // A state that may not become a member's is refused before the
        // log's directory is made: a refusal leaves the data directory
        // as it found it.
        let fresh = !config.log_dir.exists();
        if fresh {
            adopt_own_state(&config, &store, &identity, &advertise)?;
        }
        let (log, _) = Log::open(&config.log_dir, LogConfig::default())?;
        if !fresh && log.last().is_none() {
            adopt_own_state(&config, &store, &identity, &advertise)?;
        }
        let sm = StateMachine::new(Arc::clone(&store), &config.snapshot_dir)?;
        let replies = sm.replies();
        let committing = sm.committing();
        let raft_config = Config {
            cluster_name: "tablix".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            // `take_snapshots` decides.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: config.keep_behind_snapshot,
            max_payload_entries: 16,
            snapshot_max_chunk_size: config.snapshot_chunk_bytes.max(1),
            ..Config::default()
        }
        .validate()
        .map_err(raft_error)?;
        let transport = Transport::with(config.tls.as_ref(), identity.clone());
        let log = LogStore::new(log);
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            Network::over(transport.clone()),
            log.clone(),
            sm,
        )
        .await
        .map_err(raft_error)?;
        let proposer = Proposer::new(raft.clone(), ProposerConfig::default(), committing);
        let shared = Arc::new(Shared {
            id: config.id,
            addr: advertise.clone(),
            proposer,
            raft,
            transport,
            identity,
            replies,
            leader_wait: config.leader_wait,
            changing: tokio::sync::Mutex::new(()),
            api_addr: std::sync::RwLock::new(None),
            last_contact: std::sync::Mutex::new(None),
            transferring: std::sync::atomic::AtomicBool::new(false),
            hold_until: std::sync::Mutex::new(None),
            refused_logged: std::sync::Mutex::new(None),
        });
        tokio::spawn(break_split_votes(
            Arc::downgrade(&shared),
            config.election_timeout_ms.1,
        ));
        tokio::spawn(take_snapshots(
            Arc::downgrade(&shared),
            Arc::downgrade(&store),
            log,
            config.snapshot_every.max(1),
        ));
        tokio::spawn(forget_gone_mounts(
            Arc::downgrade(&shared),
            Arc::clone(&store),
        ));
        if !config.lock_lease.is_zero() {
            tokio::spawn(keep_lock_leases(
                Arc::downgrade(&shared),
                Arc::downgrade(&store),
                config.lock_lease,
            ));
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = crate::service::router(Arc::clone(&shared));
        let tls = config.tls.clone();
        let server = tokio::spawn(async move {
            if let Some(tls) = tls {
                let stopped = async {
                    let _ = stopped.await;
                };
                return crate::tls::serve(listener, tls, router, stopped).await;
            }
            // Nagle off: an RPC is one small write each way.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!("the raft service stopped: {e}");
            }
        });
        store.set_proposer(Arc::new(Forwarder {
            shared: Arc::clone(&shared),
            runtime: tokio::runtime::Handle::current(),
        }))?;
        let node = ClusterNode {
            shared,
            addr,
            stop: Some(stop),
            server,
        };
        let initialized = node
            .shared
            .raft
            .is_initialized()
            .await
            .map_err(raft_error)?;
        match (&config.start, initialized) {
            (Start::Join(peer), true) => node.check_same_cluster(peer).await?,
            (_, true) | (Start::Resume, false) => {}
            (Start::Bootstrap, false) => {
                node.shared.identity.create()?;
                let members: BTreeMap<NodeId, Node> =
                    [(config.id, Node::new(advertise.clone()))].into();
                node.shared
                    .raft
                    .initialize(members)
                    .await
                    .map_err(raft_error)?;
            }
            (Start::Join(peer), false) => node.join_via(peer, &advertise, config.join_wait).await?,
        }
        Ok(node)
    }

    /// Refuses to go on as a member when the node at `peer` (which this
    /// one was told to join) belongs to another cluster: its data
    /// directory is another cluster's. A peer that cannot be asked is
    /// no reason to stop.
    async fn check_same_cluster(&self, peer: &str) -> Result<(), ClusterError> {
        let ours = self.shared.identity.get();
        match self
            .shared
            .transport
            .status(peer, Duration::from_secs(2))
            .await
        {
            Ok(status) => match (ours, status.cluster_id) {
                (Some(ours), Some(theirs)) if !ours.eq_ignore_ascii_case(&theirs) => {
                    Err(IdentityError::Other { ours, theirs }.into())
                }
                _ => Ok(()),
            },
            Err(TransportError::Refused { message, .. })
                if message.contains("belongs to cluster") =>
            {
                Err(ClusterError::Membership(format!(
                    "--join {peer}: this data directory belongs to another cluster than the node at {peer}: {message}"
                )))
            }
            Err(e) => {
                tracing::warn!("could not ask {peer} which cluster it belongs to: {e}");
                Ok(())
            }
        }
    }

    /// Asks the member at `peer` to add this node, retrying while the
    /// cluster has no leader or `peer` cannot be reached, for up to
    /// `wait`.
    async fn join_via(
        &self,
        peer: &str,
        advertise: &str,
        wait: Duration,
    ) -> Result<(), ClusterError> {
        let request = JoinRequest {
            id: self.shared.id,
            addr: advertise.to_string(),
            voter: true,
            // Only a node whose log is empty asks to join.
            fresh: true,
        };
        let mut waiting = Waiting::new(peer, wait);
        loop {
            // The member's cluster first: a data directory of another
            // cluster is never joined. The id itself is taken only from
            // the leader's welcome, once the leader has forgotten any
            // earlier incarnation of this node: a node that held the id
            // before that would answer the leader's replication of the
            // log it once acknowledged, and an empty log must never
            // answer for entries a lost disk held.
            let theirs = match self.shared.transport.status(peer, MEMBERSHIP_WAIT).await {
                Ok(status) => status.cluster_id,
                Err(e @ TransportError::Unreachable { .. }) => {
                    waiting.retry(&e)?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if let (Some(ours), Some(theirs)) = (self.shared.identity.get(), theirs)
                && !ours.eq_ignore_ascii_case(&theirs)
            {
                return Err(IdentityError::Other { ours, theirs }.into());
            }
            let answer = self
                .shared
                .transport
                .join(peer, &request, MEMBERSHIP_WAIT)
                .await;
            match answer {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) if e.starts_with("no leader") => waiting.retry(&e)?,
                Err(e @ TransportError::Unreachable { .. }) => waiting.retry(&e)?,
                Ok(Err(e)) => {
                    return Err(ClusterError::Membership(format!(
                        "joining through {peer}: {e}"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The raft service's bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.shared.raft
    }

    pub fn status(&self) -> ClusterStatus {
        self.shared.status()
    }

    /// This node's transport to the others (tests cut it to make
    /// partitions).
    pub fn transport(&self) -> &Transport {
        &self.shared.transport
    }

    pub fn handle(&self) -> ClusterHandle {
        ClusterHandle(Arc::clone(&self.shared))
    }

    /// Proposes `command` through the leader, wherever it is.
    pub async fn propose(
        &self,
        command: Stamped<ReplicatedCommand>,
    ) -> Result<CommandReply, StoreError> {
        self.shared.propose_anywhere(command).await
    }

    /// Adds a node (through the leader).
    pub async fn add(&self, id: NodeId, addr: &str, voter: bool) -> Result<(), ClusterError> {
        self.shared
            .join(JoinRequest {
                id,
                addr: addr.to_string(),
                voter,
                fresh: false,
            })
            .await
            .map_err(ClusterError::Membership)
    }

    /// Hands leadership to voter `id` (through the leader).
    pub async fn transfer_leader(&self, id: NodeId) -> Result<(), ClusterError> {
        self.shared
            .transfer_leader(id)
            .await
            .map_err(ClusterError::Membership)
    }

    /// Removes a node (through the leader).
    pub async fn remove(&self, id: NodeId) -> Result<(), ClusterError> {
        self.shared
            .remove(RemoveRequest { id })
            .await
            .map_err(ClusterError::Membership)
    }

    /// Stops openraft and the raft service (the store stays open: its
    /// owner closes it, which lets go of the proposer).
    pub async fn shutdown(mut self) -> Result<(), ClusterError> {
        let r = self.shared.raft.shutdown().await.map_err(raft_error);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.server).await;
        r
    }
}
