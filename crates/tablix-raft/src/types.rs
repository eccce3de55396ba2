//! tablix's openraft types: an entry carries a batch of the store's
//! replicated Commands with their stamps (see `proposer.rs`), applying it
//! answers the store's reply (one per Command), and a snapshot is a file
//! (a copy of the persistent database).

use tablix_store::{EntryReply, ReplicatedCommand, Stamped};

/// What an entry proposes: Commands applied in order.
pub type Batch = Vec<Stamped<ReplicatedCommand>>;

/// A node's id in the cluster.
pub type NodeId = u64;

/// What the cluster knows of a node: its address.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The type configuration of tablix's cluster.
    pub TypeConfig:
        D = Batch,
        R = EntryReply,
        NodeId = NodeId,
        Node = Node,
        SnapshotData = tokio::fs::File,
);
