//! Replication's side of the store: [`LogStore`] is openraft's log
//! storage (`RaftLogStorage`, pinned openraft 0.9) over `tablix_log::Log`,
//! and [`StateMachine`] is openraft's state machine over the store, whose
//! one apply path (`Store::apply_entries`) applies committed entries and
//! records the last applied entry and the membership in the same
//! transaction. Replication plugs openraft in over these two without a
//! second log and without touching the store's apply.
//!
//! Openraft runs in its standard Raft mode (`single-term-leader`: one
//! leader per term), so a log id is a term and an index, as the log keeps
//! it. Openraft numbers entries from 0; the log and the store from 1.
//! Entry `i` of openraft is entry `i + 1` of the log, everywhere in this
//! crate and nowhere else.
//!
//! Architecture invariant: this is the only crate that knows openraft.

mod cluster;
pub mod cluster_id;
mod committing;
mod gather;
mod log_store;
mod proposer;
mod recent_entries;
mod replies;
mod service;
mod single;
mod state_machine;
mod tls;
mod transport;
mod types;

pub use cluster::{
    ClusterConfig, ClusterError, ClusterHandle, ClusterNode, ClusterStatus, Freshness, JoinRequest,
    LOG_DIR, Member, NodeReport, ReadBarrier, RemoveRequest, SNAPSHOT_DIR, Start,
};
pub use committing::Committing;
pub use log_store::LogStore;
pub use proposer::{Committed, ProposeError, Proposer, ProposerConfig};
pub use replies::RecentReplies;
pub use single::{SingleNode, SingleNodeError};
pub use state_machine::StateMachine;
pub use tls::{NodeTls, TlsError, TlsFiles};
pub use transport::{Faults, Network, Transport, TransportError};
pub use types::{Batch, Node, NodeId, TypeConfig};

/// The log's id of openraft's entry `index` of `term`.
pub(crate) fn to_log(term: u64, index: u64) -> tablix_log::LogId {
    tablix_log::LogId {
        term,
        index: index + 1,
    }
}

/// Openraft's id of the log's entry `id` (indexes from 1).
pub(crate) fn from_log<N: openraft::NodeId>(id: tablix_log::LogId) -> openraft::LogId<N> {
    openraft::LogId::new(
        openraft::CommittedLeaderId::new(id.term, N::default()),
        id.index - 1,
    )
}
