//! The state-machine boundary. Each domain of tablix state (user SQL, the
//! file system, pipes, the process table, the daemon record) is a
//! [`StateMachine`]: an operation type, a reply type, and `apply`, which
//! runs one operation inside a transaction the store opened. The store
//! owns everything around it (transactions, savepoints, group commit,
//! durability); a domain owns what its operation does.
//!
//! The dispatch of a Command to its domain happens in one place, the
//! [`Dispatch`] of the writer thread for replicated Commands (by kind, in
//! the order gathered) and the store's node-local entry points for the
//! memory database; each domain's writer is handed only its own
//! operations, so no domain has an arm for another's.

use rusqlite::Connection;

use crate::budget::Limits;
use crate::command::{SqlCommand, Stamp, Stamped};
use crate::error::StoreError;

/// One domain of state, applied inside the store's transactions.
pub(crate) trait StateMachine {
    /// What the domain is asked to do.
    type Op;
    /// What applying one operation answers its proposer: the Command's
    /// result, the same on every node that applies the same log.
    type Reply: Clone;
    /// Bounds a proposer sets that are not part of the Command (user
    /// SQL's time and result-size limits); `()` for the others.
    type Bounds;

    /// The connection the domain's operations run on, where the store
    /// opens their transaction and savepoints.
    fn connection(&self) -> &Connection;

    /// Applies `op` inside the open transaction and the savepoint the store
    /// opened for it. `Ok` is the Command's result; the store rolls the
    /// savepoint back when [`StateMachine::refused`] says so. `Err` is not a
    /// result: the node failed under the Command (`StoreError::Failed`),
    /// and nothing of its group is applied.
    fn apply(
        &self,
        stamp: Stamp,
        op: &Self::Op,
        bounds: &Self::Bounds,
    ) -> Result<Self::Reply, StoreError>;

    /// Whether the reply refuses the Command: its changes are undone.
    fn refused(reply: &Self::Reply) -> bool;
}

/// A domain whose Commands the writer applies in groups, several in one
/// transaction (`group.rs`).
pub(crate) trait Grouped: StateMachine {
    /// The reply of a Command whose statement ended the whole transaction
    /// itself (SQL's `ON CONFLICT ROLLBACK`, an interrupted write): it is
    /// taken out of its group and did not happen.
    fn ended(reply: Self::Reply) -> Self::Reply;

    /// Bytes the reply holds until its group is answered.
    fn reply_bytes(_reply: &Self::Reply) -> usize {
        0
    }
}

/// A proposal of a replicated Command to the writer: the Command, the
/// bounds it runs under, and where its typed reply goes. Built by the
/// store's entry points, so a proposal's reply channel always matches its
/// Command's domain.
pub(crate) enum Proposal {
    Sql(
        Box<Stamped<SqlCommand>>,
        Limits,
        Reply<crate::outcome::SqlReply>,
    ),
    Fs(
        Box<Stamped<tablix_fs::FsOp>>,
        Reply<crate::outcome::FsResult>,
    ),
    Tx(
        Box<Stamped<crate::command::TxCommit>>,
        Reply<crate::tx_writer::TxOutcome>,
    ),
}

/// Where the writer sends a Command's result.
pub(crate) type Reply<T> = tokio::sync::oneshot::Sender<Result<T, StoreError>>;

/// A gathered file-system proposal: the Command and its reply channel.
pub(crate) type FsItem = (
    Box<Stamped<tablix_fs::FsOp>>,
    Reply<crate::outcome::FsResult>,
);

/// A gathered SQL proposal: the Command, its bounds, its reply channel.
pub(crate) type SqlItem = (
    Box<Stamped<SqlCommand>>,
    Limits,
    Reply<crate::outcome::SqlReply>,
);

/// A gathered transaction commit: the changeset and its reply channel.
pub(crate) type TxItem = (
    Box<Stamped<crate::command::TxCommit>>,
    Reply<crate::tx_writer::TxOutcome>,
);

/// Gathered proposals split by domain, each kind in the order received.
#[derive(Default)]
pub(crate) struct Dispatch {
    pub(crate) fs: Vec<FsItem>,
    pub(crate) sql: Vec<SqlItem>,
    pub(crate) tx: Vec<TxItem>,
}

impl Dispatch {
    pub(crate) fn push(&mut self, p: Proposal) {
        match p {
            Proposal::Sql(c, limits, reply) => self.sql.push((c, limits, reply)),
            Proposal::Fs(c, reply) => self.fs.push((c, reply)),
            Proposal::Tx(c, reply) => self.tx.push((c, reply)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.fs.len() + self.sql.len() + self.tx.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
