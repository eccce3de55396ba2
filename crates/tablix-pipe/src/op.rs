//! Pipe operations as data.

use serde::{Deserialize, Serialize};

/// Writes of at most this many bytes are atomic (POSIX PIPE_BUF on Linux).
pub const PIPE_BUF: usize = 4096;

/// Which end(s) of a pipe an open handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum End {
    Read,
    Write,
    Both,
}

impl End {
    pub fn reads(self) -> bool {
        matches!(self, End::Read | End::Both)
    }
    pub fn writes(self) -> bool {
        matches!(self, End::Write | End::Both)
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            End::Read => "read",
            End::Write => "write",
            End::Both => "both",
        }
    }
}

/// One change to the pipe tables. `now_ns` is the proposer's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PipeOp {
    /// Creates the pipe `name` (or finds it, unless `exclusive`).
    Create {
        name: String,
        uid: u32,
        gid: u32,
        mode: u32,
        capacity: u32,
        exclusive: bool,
        now_ns: i64,
    },
    /// Records that process `pid` opened `end` of `pipe` as `handle`.
    Open {
        pipe: i64,
        handle: u64,
        end: End,
        pid: u32,
        now_ns: i64,
    },
    /// Closes `handle`; a pipe with no name and no open end is removed.
    Close { handle: u64, now_ns: i64 },
    /// Appends as much of `data` as fits (nothing unless all of it fits,
    /// for at most PIPE_BUF bytes). Fails with `BrokenPipe` without readers.
    Write {
        pipe: i64,
        data: Vec<u8>,
        now_ns: i64,
    },
    /// Consumes up to `max` bytes.
    Read { pipe: i64, max: u32, now_ns: i64 },
    /// Removes the name; the pipe lives on while ends are open.
    Unlink { name: String, now_ns: i64 },
}

/// What a pipe operation did, and the pipe's state after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PipeReply {
    Created {
        pipe: i64,
        existed: bool,
    },
    /// Open ends after the change.
    Ends {
        pipe: i64,
        readers: u32,
        writers: u32,
        removed: bool,
    },
    Written {
        n: usize,
        state: PipeState,
    },
    Read {
        data: Vec<u8>,
        state: PipeState,
    },
}

/// The counts a caller needs to decide whom to wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeState {
    pub buffered: u64,
    pub capacity: u64,
    pub readers: u32,
    pub writers: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PipeError {
    #[error("a pipe named {0:?} exists")]
    Exists(String),
    #[error("no pipe named {0:?}")]
    NoSuchName(String),
    #[error("invalid pipe name {0:?}: a file name of 1 to 255 bytes without '/'")]
    InvalidName(String),
    #[error("no pipe {0}")]
    NoSuchPipe(i64),
    #[error("no open pipe handle {0}")]
    NoSuchHandle(u64),
    #[error("capacity must be between 4096 bytes and 1 GiB, not {0}")]
    InvalidCapacity(u32),
    #[error("broken pipe: no open read end")]
    BrokenPipe,
    #[error("{0}")]
    Sql(String),
}

impl From<rusqlite::Error> for PipeError {
    fn from(e: rusqlite::Error) -> PipeError {
        PipeError::Sql(e.to_string())
    }
}
