//! What applying a Command or running a query returns.

use serde::{Deserialize, Serialize};

use crate::command::Value;

/// Rows returned by a statement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rows {
    pub columns: Vec<String>,
    /// Declared type of each column, lower-cased; for an expression column
    /// the storage class of its first non-NULL value, or "" when unknown.
    pub types: Vec<String>,
    pub values: Vec<Vec<Value>>,
}

/// The result of one statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StatementResult {
    Executed {
        last_insert_id: i64,
        rows_affected: u64,
    },
    Rows(Rows),
    Error(String),
}

impl StatementResult {
    pub fn is_error(&self) -> bool {
        matches!(self, StatementResult::Error(_))
    }
}

/// One statement's result and how long it ran (for reporting only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatementOutcome {
    pub result: StatementResult,
    pub seconds: f64,
}

/// What applying user SQL (`SqlCommand`) returns.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SqlReply {
    /// One entry per statement that ran; a transaction stops at its first
    /// error.
    pub statements: Vec<StatementOutcome>,
    /// The Command's changes were rolled back (a transaction hit an error,
    /// a statement ended the transaction, or the results outgrew their
    /// bound).
    pub rolled_back: bool,
}

impl SqlReply {
    /// The results without timings, for comparing two runs.
    pub fn results(&self) -> Vec<StatementResult> {
        self.statements.iter().map(|s| s.result.clone()).collect()
    }
}

/// What applying a file-system operation returns: its reply, or the errno
/// that refused it (and rolled its changes back).
pub type FsResult = Result<tablix_fs::FsReply, tablix_fs::Errno>;

/// What applying a pipe operation returns: its reply, or the error that
/// refused it (and rolled its changes back).
pub type PipeResult = Result<tablix_pipe::PipeReply, tablix_pipe::PipeError>;
