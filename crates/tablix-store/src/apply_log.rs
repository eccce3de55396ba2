//! Applying entries of a log: the one path by which logged Commands reach
//! the state after the fact, shared by the replay of the store's own
//! command log at open (`command_log::replay`) and by the committed
//! entries replication hands the store ([`crate::Store::apply_entries`]).
//!
//! Entries are applied in order, in runs of one kind (file system, user
//! SQL, entries with nothing to apply), each run one group commit whose
//! transaction records the run's last entry, so a crash between two runs
//! leaves the state naming exactly the entries it holds.

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use tablix_fs::FsOp;
use tablix_log::LogId;

use crate::budget::Limits;
use crate::command::{ReplicatedCommand, SqlCommand, Stamped};
use crate::command_log::record_applied;
use crate::error::{SqliteFailure, StoreError};
use crate::fs_writer::FsWriter;
use crate::group::{self, BEGIN_WRITE};
use crate::outcome::{FsResult, SqlReply};
use crate::sql_writer::SqlWriter;
use crate::write_point::WriteProbe;

/// One entry of a log replication keeps, committed, for the store to
/// apply. Its id is the log's: indexes from 1, each one after the last
/// applied.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    pub id: LogId,
    pub payload: EntryPayload,
}

/// What an entry asks of the state.
#[derive(Clone, Debug, PartialEq)]
pub enum EntryPayload {
    /// Nothing (a new leader's first entry): only its id is recorded.
    Blank,
    /// A change of the cluster's members, in replication's own encoding:
    /// the store keeps the last one beside the last applied entry, in the
    /// same transaction, and never reads it.
    Membership(Vec<u8>),
    /// A replicated Command.
    Command(Stamped<ReplicatedCommand>),
}

/// What applying one entry answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EntryReply {
    /// A blank or membership entry was recorded.
    Recorded,
    Sql(SqlReply),
    Fs(FsResult),
    /// The Command failed without changing anything, for a reason of its
    /// own (not a failure of the node, which stops the whole application).
    Failed(String),
}

/// The last entry the state holds and the last membership recorded with
/// it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppliedState {
    pub applied: Option<LogId>,
    pub membership: Option<Vec<u8>>,
}

/// Reads the applied state from `conn`'s main database.
pub(crate) fn applied_state(conn: &Connection) -> rusqlite::Result<AppliedState> {
    let membership = conn
        .query_row(
            "SELECT value FROM main.tablix_meta WHERE key = 'membership'",
            [],
            |r| r.get::<_, Vec<u8>>(0),
        )
        .optional()?;
    Ok(AppliedState {
        applied: crate::command_log::applied(conn)?,
        membership,
    })
}

fn record_membership(conn: &Connection, membership: &[u8]) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO main.tablix_meta(key, value) VALUES ('membership', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute([membership])?;
    Ok(())
}

/// Most entries applied in one transaction.
const RUN: usize = 256;

/// Entries of one kind gathered for one transaction, with their ids.
enum Run {
    Fs(Vec<Stamped<FsOp>>),
    Sql(Vec<Stamped<SqlCommand>>),
    /// Blank and membership entries: the last membership among them.
    Record(Option<Vec<u8>>),
}

/// Where entries are applied and under which bounds.
pub(crate) struct Appliers<'a> {
    pub(crate) fs: &'a FsWriter,
    pub(crate) sql: &'a SqlWriter,
    /// The bounds user SQL of the log runs under.
    pub(crate) limits: &'a Limits,
    /// Most bytes of results one SQL group holds.
    pub(crate) budget: usize,
    pub(crate) probe: &'a WriteProbe,
}

/// Why applying stopped: the first entry not applied and the failure.
/// Every entry before it is applied and committed.
#[derive(Debug)]
pub(crate) struct Halted {
    pub(crate) at: u64,
    pub(crate) error: StoreError,
}

/// Applies `entries` in order. `applied_to` is told the last entry each
/// committed transaction holds. Returns one reply per entry.
pub(crate) fn apply(
    to: &Appliers<'_>,
    entries: Vec<LogEntry>,
    mut applied_to: impl FnMut(LogId),
) -> Result<Vec<EntryReply>, Halted> {
    let mut replies = Vec::with_capacity(entries.len());
    let mut run: Option<Run> = None;
    let mut ids: Vec<LogId> = Vec::new();
    for entry in entries {
        let item = Run::of(entry.payload);
        let full = ids.len() >= RUN;
        match (&mut run, item) {
            (Some(Run::Fs(v)), Run::Fs(c)) if !full => v.extend(c),
            (Some(Run::Sql(v)), Run::Sql(c)) if !full => v.extend(c),
            (Some(Run::Record(m)), Run::Record(new)) if !full => {
                if new.is_some() {
                    *m = new;
                }
            }
            (_, item) => {
                if let Some(r) = run.take() {
                    commit_run(to, r, &ids, &mut replies, &mut applied_to)?;
                }
                ids.clear();
                run = Some(item);
            }
        }
        ids.push(entry.id);
    }
    if let Some(r) = run {
        commit_run(to, r, &ids, &mut replies, &mut applied_to)?;
    }
    Ok(replies)
}

impl Run {
    /// A run of the one entry `payload`.
    fn of(payload: EntryPayload) -> Run {
        match payload {
            EntryPayload::Blank => Run::Record(None),
            EntryPayload::Membership(m) => Run::Record(Some(m)),
            EntryPayload::Command(c) => match c.command {
                ReplicatedCommand::Fs(op) => Run::Fs(vec![Stamped::new(c.stamp, op)]),
                ReplicatedCommand::Sql(s) => Run::Sql(vec![Stamped::new(c.stamp, s)]),
            },
        }
    }
}

fn commit_run(
    to: &Appliers<'_>,
    run: Run,
    ids: &[LogId],
    replies: &mut Vec<EntryReply>,
    applied_to: &mut impl FnMut(LogId),
) -> Result<(), Halted> {
    let halted = |done: usize, error: StoreError| Halted {
        at: ids[done].index,
        error,
    };
    match run {
        Run::Fs(items) => {
            let mut done = 0;
            while done < items.len() {
                let group: Vec<&Stamped<FsOp>> = items[done..].iter().collect();
                let base = done;
                let results = to
                    .fs
                    .apply_group(&group, |n| ids[base + n - 1], to.probe)
                    .map_err(|e| halted(done, e))?;
                done = progress(done, results.len()).map_err(|e| halted(done, e))?;
                applied_to(ids[done - 1]);
                replies.extend(results.into_iter().map(|r| match r {
                    Ok(r) => EntryReply::Fs(r),
                    Err(e) => EntryReply::Failed(e.to_string()),
                }));
            }
        }
        Run::Sql(items) => {
            let mut done = 0;
            while done < items.len() {
                let group: Vec<(&Stamped<SqlCommand>, &Limits)> =
                    items[done..].iter().map(|c| (c, to.limits)).collect();
                let base = done;
                let results = to
                    .sql
                    .apply_group(&group, to.budget, |n| ids[base + n - 1], to.probe)
                    .map_err(|e| halted(done, e))?;
                done = progress(done, results.len()).map_err(|e| halted(done, e))?;
                applied_to(ids[done - 1]);
                replies.extend(results.into_iter().map(|r| match r {
                    Ok(held) => EntryReply::Sql(held.reply),
                    Err(e) => EntryReply::Failed(e.to_string()),
                }));
            }
        }
        Run::Record(membership) => {
            let last = ids[ids.len() - 1];
            record(to.fs.connection(), last, membership.as_deref()).map_err(|e| halted(0, e))?;
            applied_to(last);
            replies.extend(ids.iter().map(|_| EntryReply::Recorded));
        }
    }
    Ok(())
}

/// Where a run stands after a group of `applied` more entries: a group
/// always applies at least one (`group::commit`), or the run would never
/// end.
fn progress(done: usize, applied: usize) -> Result<usize, StoreError> {
    if applied == 0 {
        return Err(StoreError::Apply(
            "a group commit applied none of its entries".into(),
        ));
    }
    Ok(done + applied)
}

/// Records, in a transaction of its own, that the state holds every entry
/// up to `last` and, if given, the membership.
fn record(conn: &Connection, last: LogId, membership: Option<&[u8]>) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        StoreError::Commit(SqliteFailure::of(&e))
    };
    group::control(conn, BEGIN_WRITE).map_err(failed)?;
    record_applied(conn, last).map_err(failed)?;
    if let Some(m) = membership {
        record_membership(conn, m).map_err(failed)?;
    }
    group::control(conn, "COMMIT").map_err(failed)
}
