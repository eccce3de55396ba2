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
    /// The end a `pipe_end.end` value names.
    pub(crate) fn parse(s: &str) -> End {
        match s {
            "read" => End::Read,
            "write" => End::Write,
            _ => End::Both,
        }
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            End::Read => "read",
            End::Write => "write",
            End::Both => "both",
        }
    }
}

/// One change to the pipe tables (the time comes from the Command's stamp).
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
    },
    /// Records that process `pid` opened `end` of `pipe` as `handle`, and
    /// holds it.
    Open {
        pipe: i64,
        handle: u64,
        end: End,
        pid: u32,
    },
    /// Closes `handle` (its last descriptor closed, in every process); a
    /// pipe with no name and no open end is removed.
    Close { handle: u64 },
    /// Process `pid` holds exactly the ends `held` of pipes (as its
    /// descriptors show, read after it closed one or was forked). Ends it
    /// held before and holds still keep their handle and `since_ns`; a new
    /// one is taken as an open handle of that pipe and end, `parent`'s if
    /// the parent holds one.
    Holds {
        pid: u32,
        parent: Option<u32>,
        held: Vec<(i64, End)>,
    },
    /// Moves bytes through the pipe in one transaction: appends as much of
    /// `write` as fits (nothing unless all of it fits, for at most
    /// PIPE_BUF bytes) and consumes up to `read` bytes, reading first if
    /// `read_first`. Writing without a read end fails with `BrokenPipe`.
    Io {
        pipe: i64,
        write: Vec<u8>,
        read: u32,
        read_first: bool,
    },
    /// Sets how many bytes the pipe holds (as F_SETPIPE_SZ does); fails if
    /// more are buffered.
    SetCapacity { pipe: i64, capacity: u32 },
    /// Removes the name; the pipe lives on while ends are open.
    Unlink { name: String },
}

/// What a pipe operation did, and the pipe's state after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PipeReply {
    Created {
        pipe: i64,
        existed: bool,
    },
    /// After an open, close or unlink; `removed` when the pipe is gone.
    Ends {
        pipe: i64,
        state: PipeState,
        removed: bool,
    },
    /// After `Holds`: how many ends the process took up and gave up.
    Held {
        added: u32,
        removed: u32,
    },
    /// Bytes appended and bytes consumed.
    Io {
        written: usize,
        data: Vec<u8>,
        state: PipeState,
    },
}

/// The counts a caller needs to decide whom to wake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeState {
    pub buffered: u64,
    pub capacity: u64,
    pub readers: u32,
    pub writers: u32,
    /// Made by pipe() (no name, or its name removed): opening it again
    /// (through /dev/fd/N) never waits for the other end, as Linux never
    /// waits on an anonymous pipe.
    pub anonymous: bool,
}

impl PipeState {
    /// Bytes that fit before the pipe is full.
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.buffered)
    }

    /// How many of `len` bytes a write may append now: nothing unless all
    /// of them fit when `len` is at most PIPE_BUF (such writes are atomic).
    pub fn writable(&self, len: usize) -> usize {
        let free = usize::try_from(self.free()).unwrap_or(usize::MAX);
        if len <= PIPE_BUF && free < len {
            0
        } else {
            len.min(free)
        }
    }
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
    #[error("{buffered} bytes are buffered, more than a capacity of {capacity}")]
    CapacityBelowBuffered { capacity: u32, buffered: u64 },
    #[error("broken pipe: no open read end")]
    BrokenPipe,
    /// SQLite failed under the operation: a failure of the node, typed
    /// by SQLite's extended result code (`None` when rusqlite failed
    /// before SQLite answered), never by its text.
    #[error("{message}")]
    Sql { code: Option<i32>, message: String },
}

impl PipeError {
    /// SQLite's primary result code behind a [`PipeError::Sql`].
    pub fn sqlite_code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            PipeError::Sql {
                code: Some(code), ..
            } => Some(rusqlite::ffi::Error::new(*code).code),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for PipeError {
    fn from(e: rusqlite::Error) -> PipeError {
        PipeError::Sql {
            code: e.sqlite_error().map(|f| f.extended_code),
            message: e.to_string(),
        }
    }
}
