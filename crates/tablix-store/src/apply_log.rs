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
use crate::command::{ReplicatedCommand, SqlCommand, Stamped, TxCommit};
use crate::command_log::record_applied;
use crate::error::{SqliteFailure, StoreError};
use crate::fs_writer::FsWriter;
use crate::group::{self, BEGIN_WRITE};
use crate::outcome::{FsResult, SqlReply};
use crate::proposals::{Proposals, Recorded};
use crate::sql_writer::SqlWriter;
use crate::tx_writer::{TxOutcome, TxWriter};
use crate::write_point::WriteProbe;
use std::cell::RefCell;

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
    /// Replicated Commands, applied in order: a proposer batches the
    /// Commands of concurrent clients into one entry, so one append and
    /// one fsync serve them all. An entry of none is recorded as a blank.
    Commands(Vec<Stamped<ReplicatedCommand>>),
}

/// What applying one entry answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EntryReply {
    /// A blank or membership entry (or one of no Commands) was recorded.
    Recorded,
    /// One reply per Command of the entry, in its order.
    Commands(Vec<CommandReply>),
}

/// What applying one Command of an entry answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CommandReply {
    Sql(SqlReply),
    Fs(FsResult),
    Tx(TxOutcome),
    /// The Command failed without changing anything, for a reason of its
    /// own (not a failure of the node, which stops the whole application).
    Failed(String),
    /// The state held this Command before the entry was handed over (it
    /// had applied part of the entry when the node stopped): it is not
    /// applied again, and its reply went with the node that stopped.
    AppliedBefore,
    /// An earlier entry applied a Command of the same stamp seed: this is
    /// the same proposal sent again (to a new leader, after the old one
    /// had replicated it), not applied twice. Its reply went with the
    /// first.
    Repeated,
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
    Ok(AppliedState {
        applied: crate::command_log::applied(conn)?,
        membership: membership(conn)?,
    })
}

/// The membership the state records, if any: only a cluster's state has
/// one.
pub(crate) fn membership(conn: &Connection) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.query_row(
        "SELECT value FROM main.tablix_meta WHERE key = 'membership'",
        [],
        |r| r.get::<_, Vec<u8>>(0),
    )
    .optional()
}

/// Records `membership` as that of the last entry the state holds, when
/// the state holds entries of the store's own log and no membership: a
/// state built without replication becomes the first state of a cluster.
/// Returns that entry.
pub(crate) fn adopt(conn: &Connection, membership: &[u8]) -> Result<LogId, StoreError> {
    let state = applied_state(conn)?;
    let applied = match (state.applied, state.membership) {
        (Some(applied), None) => applied,
        (None, _) => {
            return Err(StoreError::Apply(
                "the state holds no entry: there is nothing to adopt".into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err(StoreError::Apply(
                "the state is already a cluster's: it records a membership".into(),
            ));
        }
    };
    transaction(conn, |conn| record_membership(conn, membership))?;
    Ok(applied)
}

fn record_membership(conn: &Connection, membership: &[u8]) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO main.tablix_meta(key, value) VALUES ('membership', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute([membership])?;
    Ok(())
}

/// How far into the entry after the last applied one the state is: a
/// group commit may end inside an entry of several Commands, and a crash
/// there must neither apply its first Commands again nor skip the rest.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Within {
    /// The entry's index.
    index: u64,
    /// How many of its Commands the state holds.
    count: u64,
}

/// Records `within` (or that no entry is partly applied) in the open
/// transaction.
fn record_within(conn: &Connection, within: Option<Within>) -> rusqlite::Result<()> {
    match within {
        Some(w) => conn
            .prepare_cached(
                "INSERT INTO main.tablix_meta(key, value)
                 VALUES ('within_index', ?1), ('within_count', ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute([w.index as i64, w.count as i64])?,
        None => {
            // One key at a time: an `IN` list is an ephemeral table (a
            // B-tree and a page cache opened and closed), and this runs at
            // every group commit.
            let mut delete = conn.prepare_cached("DELETE FROM main.tablix_meta WHERE key = ?1")?;
            delete.execute(["within_index"])? + delete.execute(["within_count"])?
        }
    };
    Ok(())
}

fn within(conn: &Connection) -> rusqlite::Result<Option<Within>> {
    let get = |key: &str| -> rusqlite::Result<Option<i64>> {
        conn.prepare_cached("SELECT value FROM main.tablix_meta WHERE key = ?1")?
            .query_row([key], |r| r.get(0))
            .optional()
    };
    Ok(match (get("within_index")?, get("within_count")?) {
        (Some(index), Some(count)) => Some(Within {
            index: index as u64,
            count: count as u64,
        }),
        _ => None,
    })
}

/// Most Commands applied in one transaction.
const RUN: usize = 256;

/// Where one Command (or one blank or membership entry) stands in the
/// entries being applied: what a transaction ending with it records.
#[derive(Clone, Copy, Debug)]
struct Mark {
    /// Its entry.
    entry: LogId,
    /// Its place among the entry's Commands.
    pos: u64,
    /// Whether it is the entry's last.
    last: bool,
    /// The entry before its own, if among the entries being applied.
    prev: Option<LogId>,
}

impl Mark {
    /// The last entry the state holds once this item is applied, and how
    /// far into the next one it is.
    fn progress(&self) -> (Option<LogId>, Option<Within>) {
        if self.last {
            (Some(self.entry), None)
        } else {
            (
                self.prev,
                Some(Within {
                    index: self.entry.index,
                    count: self.pos + 1,
                }),
            )
        }
    }

    /// Records, in the open transaction, what the state holds once this
    /// item is applied.
    fn record(&self, conn: &Connection) -> rusqlite::Result<()> {
        let (complete, within) = self.progress();
        if let Some(id) = complete {
            record_applied(conn, id)?;
        }
        record_within(conn, within)
    }
}

/// Items of one kind gathered for one transaction.
enum Run {
    Fs(Vec<Stamped<FsOp>>),
    Sql(Vec<Stamped<SqlCommand>>),
    Tx(Vec<Stamped<TxCommit>>),
    /// Blank and membership entries: the last membership among them.
    Record(Option<Vec<u8>>),
    /// Commands applied before (`CommandReply::Repeated`).
    Repeated,
}

/// One item to apply: a Command, or a blank or membership entry.
enum Item {
    Fs(Stamped<FsOp>),
    Sql(Stamped<SqlCommand>),
    Tx(Stamped<TxCommit>),
    Record(Option<Vec<u8>>),
    Repeated,
}

/// A file-system Command replication applied: what it may have made
/// stale in a kernel's caches, for the mount of this node to invalidate
/// unless the Command came through that mount (its stamp's seed says).
#[derive(Clone, Debug)]
pub struct FsApplied {
    pub seed: u64,
    pub touched: Vec<tablix_fs::Touched>,
}

/// Who is told of applied file-system Commands: where the notes go, and
/// which Commands need none (a mount's own, whose kernel saw them).
pub(crate) struct Watcher {
    pub(crate) tx: std::sync::mpsc::SyncSender<FsApplied>,
    pub(crate) own: Box<dyn Fn(u64) -> bool + Send>,
}

/// Where the applied file-system Commands are told. Bounded: when the
/// watcher falls behind, notes are dropped with a warning, never waited
/// for: the writer must not wait on a kernel that may be waiting on it.
pub(crate) type FsWatch = std::sync::Arc<std::sync::Mutex<Option<Watcher>>>;

/// Where entries are applied and under which bounds.
pub(crate) struct Appliers<'a> {
    pub(crate) fs: &'a FsWriter,
    pub(crate) sql: &'a SqlWriter,
    pub(crate) tx: &'a TxWriter,
    /// The bounds user SQL of the log runs under.
    pub(crate) limits: &'a Limits,
    /// Most bytes of results one SQL group holds.
    pub(crate) budget: usize,
    pub(crate) probe: &'a WriteProbe,
    /// Told each applied file-system Command, if set.
    pub(crate) watch: Option<&'a FsWatch>,
    /// The proposals applied lately, when a repeat is not to be applied
    /// (replication's entries: a proposal may be sent again to a new
    /// leader; the store's own log never repeats one).
    pub(crate) dedup: Option<&'a RefCell<Proposals>>,
    /// What the last group's transaction recorded of them, for the
    /// memory to follow once it commits.
    pub(crate) recorded: RefCell<Option<Recorded>>,
    /// The state is known to hold no partly applied entry (the last
    /// `apply` on it applied every entry it was handed, and nothing else
    /// wrote it since): `apply` need not read where it stands.
    pub(crate) settled: bool,
}

impl Appliers<'_> {
    fn tell(&self, applied: &[&Stamped<FsOp>]) {
        let Some(watch) = self.watch else { return };
        let Ok(slot) = watch.lock() else { return };
        let Some(Watcher { tx, own }) = slot.as_ref() else {
            return;
        };
        for c in applied {
            // Asked before the Command is answered, while its mount still
            // counts it in flight. Waking the watcher for it would only
            // take the CPU from this thread before it answers.
            if own(c.stamp.seed) {
                continue;
            }
            let note = FsApplied {
                seed: c.stamp.seed,
                touched: c.command.touched(),
            };
            if note.touched.is_empty() {
                continue;
            }
            if let Err(std::sync::mpsc::TrySendError::Full(_)) = tx.try_send(note) {
                tracing::warn!(
                    "the mount's cache invalidations fall behind: one is dropped, and the kernel may show stale data until its cache times out"
                );
            }
        }
    }
}

/// Why applying stopped: the first entry not wholly applied and the
/// failure. Every entry before it is applied and committed.
#[derive(Debug)]
pub(crate) struct Halted {
    pub(crate) at: u64,
    pub(crate) error: StoreError,
}

/// The replies of the entries being applied, gathered as their items are.
struct Replies {
    out: Vec<EntryReply>,
}

impl Replies {
    fn push(&mut self, mark: &Mark, reply: Option<CommandReply>, skipped: u64) {
        if mark.pos == skipped {
            self.out.push(match reply {
                Some(_) => EntryReply::Commands(
                    std::iter::repeat_n(CommandReply::AppliedBefore, skipped as usize).collect(),
                ),
                None => EntryReply::Recorded,
            });
        }
        if let (Some(r), Some(EntryReply::Commands(v))) = (reply, self.out.last_mut()) {
            v.push(r);
        }
    }
}

/// Applies `entries` in order. `applied_to` is told the last entry each
/// committed transaction holds whole. Returns one reply per entry.
pub(crate) fn apply(
    to: &Appliers<'_>,
    entries: Vec<LogEntry>,
    mut applied_to: impl FnMut(LogId),
) -> Result<Vec<EntryReply>, Halted> {
    let first = entries.first().map_or(0, |e| e.id.index);
    // Commands of the first entry a stopped node had already applied.
    let stands = if to.settled {
        Ok(None)
    } else {
        within(to.fs.connection())
    };
    let skip = match stands {
        Ok(Some(w)) if w.index == first => w.count,
        Ok(Some(w)) => {
            tracing::warn!(
                "the state holds part of entry {} but is handed entry {first} next: the part is left as it is",
                w.index
            );
            0
        }
        Ok(None) => 0,
        Err(e) => {
            return Err(Halted {
                at: first,
                error: StoreError::Apply(format!("reading how far the state is: {e}")),
            });
        }
    };
    let mut replies = Replies {
        out: Vec::with_capacity(entries.len()),
    };
    let mut run: Option<Run> = None;
    let mut marks: Vec<Mark> = Vec::new();
    // The seeds of the Commands in `run`, in order (file-system and SQL
    // runs), and of every Command taken in this call.
    let mut seeds: Vec<u64> = Vec::new();
    let mut taken: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut prev: Option<LogId> = None;
    for (n, entry) in entries.into_iter().enumerate() {
        let skipped = if n == 0 { skip } else { 0 };
        let items: Vec<Item> = match entry.payload {
            EntryPayload::Blank => vec![Item::Record(None)],
            EntryPayload::Membership(m) => vec![Item::Record(Some(m))],
            EntryPayload::Commands(c) if c.is_empty() => vec![Item::Record(None)],
            EntryPayload::Commands(c) => c
                .into_iter()
                .map(|c| match c.command {
                    ReplicatedCommand::Fs(op) => Item::Fs(Stamped::new(c.stamp, op)),
                    ReplicatedCommand::Sql(s) => Item::Sql(Stamped::new(c.stamp, s)),
                    ReplicatedCommand::Tx(t) => Item::Tx(Stamped::new(c.stamp, t)),
                })
                .collect(),
        };
        let items: Vec<Item> = if let Some(known) = to.dedup {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let seed = match &item {
                    Item::Fs(c) => Some(c.stamp.seed),
                    Item::Sql(c) => Some(c.stamp.seed),
                    Item::Tx(c) => Some(c.stamp.seed),
                    _ => None,
                };
                let repeat =
                    seed.is_some_and(|seed| taken.contains(&seed) || known.borrow().contains(seed));
                if repeat {
                    out.push(Item::Repeated);
                } else {
                    if let Some(seed) = seed {
                        taken.insert(seed);
                    }
                    out.push(item);
                }
            }
            out
        } else {
            items
        };
        let count = items.len() as u64;
        if skipped >= count {
            // Every Command of it is held: only the record is missing.
            if let Err(e) = record_progress(to.fs.connection(), Some(entry.id), None) {
                return Err(Halted {
                    at: entry.id.index,
                    error: e,
                });
            }
            applied_to(entry.id);
            replies.out.push(EntryReply::Commands(
                std::iter::repeat_n(CommandReply::AppliedBefore, count as usize).collect(),
            ));
            prev = Some(entry.id);
            continue;
        }
        for (pos, item) in items.into_iter().enumerate().skip(skipped as usize) {
            let mark = Mark {
                entry: entry.id,
                pos: pos as u64,
                last: pos as u64 + 1 == count,
                prev,
            };
            let full = marks.len() >= RUN;
            let seed = match &item {
                Item::Fs(c) => Some(c.stamp.seed),
                Item::Sql(c) => Some(c.stamp.seed),
                Item::Tx(c) => Some(c.stamp.seed),
                _ => None,
            };
            match (&mut run, item) {
                (Some(Run::Fs(v)), Item::Fs(c)) if !full => v.push(c),
                (Some(Run::Sql(v)), Item::Sql(c)) if !full => v.push(c),
                (Some(Run::Tx(v)), Item::Tx(c)) if !full => v.push(c),
                (Some(Run::Record(m)), Item::Record(new)) if !full => {
                    if new.is_some() {
                        *m = new;
                    }
                }
                (Some(Run::Repeated), Item::Repeated) if !full => {}
                (_, item) => {
                    if let Some(r) = run.take() {
                        commit_run(to, r, &marks, &seeds, skip, &mut replies, &mut applied_to)?;
                    }
                    marks.clear();
                    seeds.clear();
                    run = Some(match item {
                        Item::Fs(c) => Run::Fs(vec![c]),
                        Item::Sql(c) => Run::Sql(vec![c]),
                        Item::Tx(c) => Run::Tx(vec![c]),
                        Item::Record(m) => Run::Record(m),
                        Item::Repeated => Run::Repeated,
                    });
                }
            }
            seeds.extend(seed);
            marks.push(mark);
        }
        prev = Some(entry.id);
    }
    if let Some(r) = run {
        commit_run(to, r, &marks, &seeds, skip, &mut replies, &mut applied_to)?;
    }
    Ok(replies.out)
}

/// Records in a transaction of its own the last entry the state holds
/// whole and how far into the next one it is.
fn record_progress(
    conn: &Connection,
    complete: Option<LogId>,
    within: Option<Within>,
) -> Result<(), StoreError> {
    transaction(conn, |conn| {
        if let Some(id) = complete {
            record_applied(conn, id)?;
        }
        record_within(conn, within)
    })
}

fn commit_run(
    to: &Appliers<'_>,
    run: Run,
    marks: &[Mark],
    seeds: &[u64],
    skip: u64,
    replies: &mut Replies,
    applied_to: &mut impl FnMut(LogId),
) -> Result<(), Halted> {
    let halted = |done: usize, error: StoreError| Halted {
        at: marks[done].entry.index,
        error,
    };
    // What the first Command of the first entry's skipped part replies.
    let skipped = |m: &Mark| {
        if m.prev.is_none() { skip } else { 0 }
    };
    let mut reached = |mark: &Mark| {
        if let (Some(id), _) = mark.progress() {
            applied_to(id);
        }
    };
    match run {
        Run::Fs(items) => {
            let mut done = 0;
            while done < items.len() {
                let group: Vec<&Stamped<FsOp>> = items[done..].iter().collect();
                let base = done;
                let results = to
                    .fs
                    .apply_group(
                        &group,
                        |conn, n| {
                            record_group(to, conn, &marks[base..base + n], &seeds[base..base + n])
                        },
                        to.probe,
                    )
                    .map_err(|e| halted(done, e))?;
                to.committed();
                let next = progress(done, results.len()).map_err(|e| halted(done, e))?;
                let changed: Vec<&Stamped<FsOp>> = group[..results.len()]
                    .iter()
                    .zip(&results)
                    .filter(|(_, r)| matches!(r, Ok(Ok(_))))
                    .map(|(c, _)| *c)
                    .collect();
                to.tell(&changed);
                for (m, r) in marks[done..next].iter().zip(results) {
                    let reply = match r {
                        Ok(r) => CommandReply::Fs(r),
                        Err(e) => CommandReply::Failed(e.to_string()),
                    };
                    replies.push(m, Some(reply), skipped(m));
                }
                done = next;
                reached(&marks[done - 1]);
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
                    .apply_group(
                        &group,
                        to.budget,
                        |conn, n| {
                            record_group(to, conn, &marks[base..base + n], &seeds[base..base + n])
                        },
                        to.probe,
                    )
                    .map_err(|e| halted(done, e))?;
                to.committed();
                let next = progress(done, results.len()).map_err(|e| halted(done, e))?;
                for (m, r) in marks[done..next].iter().zip(results) {
                    let reply = match r {
                        Ok(held) => CommandReply::Sql(held.reply),
                        Err(e) => CommandReply::Failed(e.to_string()),
                    };
                    replies.push(m, Some(reply), skipped(m));
                }
                done = next;
                reached(&marks[done - 1]);
            }
        }
        Run::Tx(items) => {
            let mut done = 0;
            while done < items.len() {
                let group: Vec<&Stamped<TxCommit>> = items[done..].iter().collect();
                let base = done;
                let results = to
                    .tx
                    .apply_group(
                        &group,
                        |conn, n| {
                            record_group(to, conn, &marks[base..base + n], &seeds[base..base + n])
                        },
                        to.probe,
                    )
                    .map_err(|e| halted(done, e))?;
                to.committed();
                let next = progress(done, results.len()).map_err(|e| halted(done, e))?;
                for (m, r) in marks[done..next].iter().zip(results) {
                    let reply = match r {
                        Ok(outcome) => CommandReply::Tx(outcome),
                        Err(e) => CommandReply::Failed(e.to_string()),
                    };
                    replies.push(m, Some(reply), skipped(m));
                }
                done = next;
                reached(&marks[done - 1]);
            }
        }
        Run::Repeated => {
            let last = marks[marks.len() - 1];
            transaction(to.fs.connection(), |conn| last.record(conn)).map_err(|e| halted(0, e))?;
            reached(&last);
            for m in marks {
                replies.push(m, Some(CommandReply::Repeated), skipped(m));
            }
        }
        Run::Record(membership) => {
            let last = marks[marks.len() - 1];
            transaction(to.fs.connection(), |conn| {
                last.record(conn)?;
                match &membership {
                    Some(m) => record_membership(conn, m),
                    None => Ok(()),
                }
            })
            .map_err(|e| halted(0, e))?;
            reached(&last);
            for m in marks {
                replies.push(m, None, 0);
            }
        }
    }
    Ok(())
}

/// Records, inside a group's transaction, where the log stands once the
/// group's Commands (`marks`, with their `seeds`) are applied, and the
/// proposals applied.
fn record_group(
    to: &Appliers<'_>,
    conn: &Connection,
    marks: &[Mark],
    seeds: &[u64],
) -> rusqlite::Result<()> {
    if let Some(last) = marks.last() {
        last.record(conn)?;
    }
    if let Some(known) = to.dedup {
        let applied: Vec<(u64, u64)> = marks
            .iter()
            .zip(seeds)
            .map(|(m, s)| (m.entry.index, *s))
            .collect();
        let recorded = known.borrow().record(conn, &applied)?;
        *to.recorded.borrow_mut() = Some(recorded);
    }
    Ok(())
}

impl Appliers<'_> {
    /// The memory of proposals follows the group that just committed.
    fn committed(&self) {
        if let (Some(known), Some(r)) = (self.dedup, self.recorded.borrow_mut().take()) {
            known.borrow_mut().commit(r);
        }
    }
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

/// Runs `body` in a write transaction of its own and commits it.
fn transaction(
    conn: &Connection,
    body: impl FnOnce(&Connection) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        StoreError::Commit(SqliteFailure::of(&e))
    };
    group::control(conn, BEGIN_WRITE).map_err(failed)?;
    body(conn).map_err(failed)?;
    group::control(conn, "COMMIT").map_err(failed)
}
