//! Real openraft nodes over the command log and the store, in one
//! process, talking through direct calls: elections, replication of SQL
//! and file-system Commands, a snapshot that brings a new node up after
//! the log was purged, and a leader that stops.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::RaftStateMachine;
use openraft::{Config, Raft, SnapshotPolicy};
use tablix_log::{Log, LogConfig};
use tablix_raft::{Batch, LogStore, Node, NodeId, StateMachine, TypeConfig};
use tablix_store::{CommandReply, EntryReply, ReplicatedCommand, Stamp, Stamped, Store, Value};

use super::{file, make_file, rows, sql, state_machine};

type Nodes = Arc<Mutex<BTreeMap<NodeId, Raft<TypeConfig>>>>;

/// Delivers each request to the target node's `Raft` directly; a node
/// not in the map is unreachable.
#[derive(Clone, Default)]
struct Router {
    nodes: Nodes,
}

struct Link {
    target: NodeId,
    nodes: Nodes,
}

impl Link {
    #[allow(
        clippy::result_large_err,
        reason = "openraft's network trait answers its RPCError"
    )]
    fn raft<E: std::error::Error>(&self) -> Result<Raft<TypeConfig>, RPCError<NodeId, Node, E>> {
        self.nodes
            .lock()
            .unwrap()
            .get(&self.target)
            .cloned()
            .ok_or_else(|| {
                RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
                    "node {} is down",
                    self.target
                ))))
            })
    }
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _: &Node) -> Link {
        Link {
            target,
            nodes: Arc::clone(&self.nodes),
        }
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let raft = self.raft()?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let raft = self.raft()?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let raft = self.raft()?;
        raft.vote(rpc).await.map_err(|e| {
            RPCError::Network(NetworkError::new(&std::io::Error::other(e.to_string())))
        })
    }
}

fn node(id: NodeId) -> Node {
    Node::new(format!("127.0.0.1:{}", 4000 + id))
}

/// Starts node `id` on its own directory and adds it to the router.
async fn start(
    id: NodeId,
    dir: &std::path::Path,
    router: &Router,
) -> (Raft<TypeConfig>, StateMachine) {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // Snapshots only when asked, so the test decides when the log is
        // purged; entries in a snapshot are not kept.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        // Small chunks: a snapshot crosses the network in several.
        snapshot_max_chunk_size: 16 << 10,
        ..Config::default()
    };
    let (log, _) = Log::open(
        &dir.join("log"),
        LogConfig {
            segment_bytes: 64 << 10,
            ..LogConfig::default()
        },
    )
    .unwrap();
    let sm = state_machine(dir);
    let raft = Raft::new(
        id,
        Arc::new(config.validate().unwrap()),
        router.clone(),
        LogStore::new(log),
        sm.clone(),
    )
    .await
    .unwrap();
    router.nodes.lock().unwrap().insert(id, raft.clone());
    (raft, sm)
}

fn stamped(n: u64, command: ReplicatedCommand) -> Batch {
    vec![Stamped::new(
        Stamp {
            unix_nanos: 1_700_000_000_000_000_000 + n as i64,
            seed: n,
        },
        command,
    )]
}

/// The reply of an entry's one Command.
fn only(reply: EntryReply) -> CommandReply {
    match reply {
        EntryReply::Commands(mut v) if v.len() == 1 => v.remove(0),
        other => panic!("{other:?}"),
    }
}

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

async fn leader_of(raft: &Raft<TypeConfig>, not: Option<NodeId>) -> NodeId {
    raft.wait(WAIT)
        .metrics(
            |m| m.current_leader.is_some() && m.current_leader != not,
            "a leader",
        )
        .await
        .unwrap()
        .current_leader
        .unwrap()
}

fn count(store: &Store) -> Vec<Vec<Value>> {
    rows(store, "SELECT count(*) FROM t")
}

#[test]
fn a_three_node_cluster_replicates_sql_and_files_and_a_snapshot_brings_a_new_node_up() {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    super::runtime().block_on(async {
        let router = Router::default();
        let mut nodes = BTreeMap::new();
        for id in 1..=3u64 {
            nodes.insert(id, start(id, dirs[id as usize - 1].path(), &router).await);
        }
        let members: BTreeMap<NodeId, Node> = (1..=3).map(|id| (id, node(id))).collect();
        nodes[&1].0.initialize(members).await.unwrap();
        let leader = leader_of(&nodes[&1].0, None).await;
        let raft = &nodes[&leader].0;

        let created = raft
            .client_write(stamped(
                1,
                sql(&["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"]),
            ))
            .await
            .unwrap();
        let created = only(created.data);
        assert!(matches!(created, CommandReply::Sql(_)), "{created:?}");
        let made = raft.client_write(stamped(2, make_file("f"))).await.unwrap();
        let ino = match only(made.data) {
            CommandReply::Fs(Ok(tablix_fs::FsReply::Attr(attr))) => attr.ino,
            other => panic!("{other:?}"),
        };
        // More than one snapshot chunk of file data.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut last = raft
            .client_write(stamped(
                3,
                ReplicatedCommand::Fs(tablix_fs::FsOp::Write {
                    ino,
                    offset: 0,
                    data: data.clone(),
                    kill_suidgid: false,
                }),
            ))
            .await
            .unwrap()
            .log_id;
        for n in 2..=20 {
            last = raft
                .client_write(stamped(
                    10 + n,
                    sql(&[&format!("INSERT INTO t VALUES ({n})")]),
                ))
                .await
                .unwrap()
                .log_id;
        }
        for (raft, sm) in nodes.values() {
            raft.wait(WAIT)
                .applied_index_at_least(Some(last.index), "every entry applied")
                .await
                .unwrap();
            assert_eq!(count(sm.store()), vec![vec![Value::Integer(20)]]);
            assert_eq!(file(sm.store(), "f"), data);
        }

        // The leader snapshots and purges its log: a new node can only
        // be brought up by the snapshot.
        raft.trigger().snapshot().await.unwrap();
        raft.wait(WAIT)
            .snapshot(last, "snapshot built")
            .await
            .unwrap();
        raft.trigger().purge_log(last.index).await.unwrap();
        raft.wait(WAIT)
            .purged(Some(last), "log purged")
            .await
            .unwrap();
        let (learner, learner_sm) = start(4, dirs[3].path(), &router).await;
        raft.add_learner(4, node(4), true).await.unwrap();
        learner
            .wait(WAIT)
            .applied_index_at_least(Some(last.index), "the learner caught up")
            .await
            .unwrap();
        assert_eq!(count(learner_sm.store()), vec![vec![Value::Integer(20)]]);
        assert_eq!(file(learner_sm.store(), "f"), data);
        let installed = learner_sm
            .clone()
            .get_current_snapshot()
            .await
            .unwrap()
            .expect("the learner installed a snapshot");
        assert_eq!(installed.meta.last_log_id, Some(last));

        // The leader stops; another is elected and the cluster goes on.
        raft.shutdown().await.unwrap();
        router.nodes.lock().unwrap().remove(&leader);
        let survivor = nodes.keys().copied().find(|id| *id != leader).unwrap();
        let next = leader_of(&nodes[&survivor].0, Some(leader)).await;
        assert_ne!(next, leader);
        let after = nodes[&next]
            .0
            .client_write(stamped(99, sql(&["INSERT INTO t VALUES (21)"])))
            .await
            .unwrap()
            .log_id;
        for (id, (raft, sm)) in &nodes {
            if *id == leader {
                continue;
            }
            raft.wait(WAIT)
                .applied_index_at_least(Some(after.index), "the new leader's entry applied")
                .await
                .unwrap();
            assert_eq!(count(sm.store()), vec![vec![Value::Integer(21)]]);
        }
        learner
            .wait(WAIT)
            .applied_index_at_least(Some(after.index), "the learner follows the new leader")
            .await
            .unwrap();
        assert_eq!(count(learner_sm.store()), vec![vec![Value::Integer(21)]]);
        for (raft, _) in nodes.values() {
            let _ = raft.shutdown().await;
        }
        let _ = learner.shutdown().await;
    });
}
