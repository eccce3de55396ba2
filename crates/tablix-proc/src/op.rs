//! Process-table changes as data.

use serde::{Deserialize, Serialize};

/// What /proc says about one task (a process or a thread).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub pid: u32,
    pub tgid: u32,
    pub ppid: Option<u32>,
    pub uid: Option<u32>,
    pub euid: Option<u32>,
    pub gid: Option<u32>,
    pub egid: Option<u32>,
    pub comm: Option<String>,
    pub exe: Option<String>,
    pub cmdline: Option<String>,
    pub start_ns: Option<i64>,
}

/// One thing that happened to a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcEvent {
    /// The task exists as described (seeding, polling, or re-read after exec).
    Seen(ProcInfo),
    /// `pid` (of thread group `tgid`) was created by `parent`; it starts
    /// as a copy of its parent's row.
    Fork {
        pid: u32,
        tgid: u32,
        parent: u32,
        parent_tgid: u32,
        at_ns: i64,
    },
    /// `pid` ran a new program; `info` is what /proc said right after.
    Exec(ProcInfo),
    /// Real and effective user ids changed.
    Uid { pid: u32, uid: u32, euid: u32 },
    /// Real and effective group ids changed.
    Gid { pid: u32, gid: u32, egid: u32 },
    /// The task renamed itself (prctl PR_SET_NAME).
    Comm { pid: u32, comm: String },
    /// The task ended: `status` as wait(2) reports it, None if unknown
    /// (seen only by polling).
    Exit {
        pid: u32,
        at_ns: i64,
        status: Option<u32>,
    },
}

/// A batch of events, applied in one transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcOp {
    /// Forget every live row first (seeding at start).
    pub reset: bool,
    pub events: Vec<ProcEvent>,
    /// Exited processes kept afterwards, most recent first.
    pub keep_exited: u32,
}
