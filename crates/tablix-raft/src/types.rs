//! tablix's openraft types: an entry carries one of the store's
//! replicated Commands with its stamp, applying it answers the store's
//! reply, and a snapshot is a file (a copy of the persistent database).

use tablix_store::{EntryReply, ReplicatedCommand, Stamped};

/// A node's id in the cluster.
pub type NodeId = u64;

/// What the cluster knows of a node: its address.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The type configuration of tablix's cluster.
    pub TypeConfig:
        D = Stamped<ReplicatedCommand>,
        R = EntryReply,
        NodeId = NodeId,
        Node = Node,
        SnapshotData = tokio::fs::File,
);
