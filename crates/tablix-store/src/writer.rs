//! The single writer thread: group commit, the durability policy, and the
//! WAL's bound.
//!
//! Two connections write the persistent database, taking turns (the
//! store's write turn): the file system's (`fs_writer.rs`) and user SQL's
//! (`sql_writer.rs`). The thread splits what it gathers into runs of one
//! kind, in order, and commits each run as one group on its connection.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::apply_log::{self, AppliedState, Appliers, EntryPayload, EntryReply, LogEntry};
use crate::budget::Limits;
use crate::command::{ReplicatedCommand, SqlCommand, Stamped};
use crate::command_log::{self, CommandLog, failure_of};
use crate::config::{Durability, StoreConfig};
use crate::error::{SqliteFailure, StoreError};
use crate::fs_writer::FsWriter;
use crate::proposals::Proposals;
use crate::sql_writer::{Held, SqlWriter};
use crate::state_machine::{Dispatch, FsItem, Grouped, Proposal, Reply, SqlItem, TxItem};
use crate::stats::Counters;
use crate::tx_writer::TxWriter;
use crate::volatile::Volatile;
use crate::wal::WalFile;
use crate::write_point::WritePoint;

/// How long the writer sleeps when nothing awaits a flush.
const IDLE: Duration = Duration::from_secs(3600);

/// How often an oversized WAL is tried again while readers hold it.
const WAL_RETRY: Duration = Duration::from_secs(1);

pub(crate) enum Request {
    /// A replicated Command to apply.
    Apply(Proposal),
    /// Make every Command acknowledged so far durable (fsync).
    Flush(oneshot::Sender<Result<(), StoreError>>),
    /// A pending transaction was opened by `Store::apply_fs_now`: commit it
    /// (and sync) within the flush interval.
    Pending,
    /// Committed entries of replication's log: apply them in order.
    Entries(Vec<LogEntry>, Answer<Vec<EntryReply>>),
    /// Replace the whole state with the snapshot at this path.
    Install(PathBuf, Answer<AppliedState>),
    /// Rewrite the database file compactly (VACUUM).
    Vacuum(Answer<()>),
}

/// Where the writer sends the answer to a request.
pub(crate) type Answer<T> = oneshot::Sender<Result<T, StoreError>>;

pub(crate) struct Writer {
    pub(crate) fs: Arc<Mutex<FsWriter>>,
    pub(crate) sql: SqlWriter,
    pub(crate) tx: TxWriter,
    /// The command log, and the write turn: held while either connection
    /// logs and writes a group or an async-mode operation. One write
    /// transaction at a time, entries appended in the order applied, and
    /// never a file-system operation waiting on SQLite's lock while
    /// holding the file system's connection (which its reads need).
    pub(crate) log: Arc<Mutex<CommandLog>>,
    pub(crate) volatile: Arc<Volatile>,
    pub(crate) config: StoreConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) wal: WalFile,
    /// Told the file-system Commands replication applies.
    pub(crate) fs_watch: crate::apply_log::FsWatch,
    /// The proposals replication's entries applied lately, as the state
    /// holds them; loaded at the first entries applied, and again after
    /// a snapshot replaced the state.
    pub(crate) proposals: std::cell::RefCell<Option<Proposals>>,
    /// True while the state is known to hold every entry replication
    /// handed it whole: the last apply of entries succeeded. False at
    /// start, after a failed apply and once a snapshot replaced the state.
    pub(crate) settled: std::cell::Cell<bool>,
}

impl Writer {
    /// Serves requests until every sender is gone, then flushes and
    /// checkpoints. Callers are answered only after their group committed
    /// (and, in sync mode, after SQLite's commit fsync'ed the WAL).
    pub(crate) fn run(mut self, rx: Receiver<Request>) {
        // Set while acknowledged Commands await their commit or fsync
        // (async mode only): when they must be durable.
        let mut deadline: Option<Instant> = None;
        // Set while the WAL is over its bound: when to try again.
        let mut wal_retry: Option<Instant> = None;
        let interval = self.config.flush_interval;
        let is_async = self.config.durability == Durability::Async;
        loop {
            let next = [deadline, wal_retry].into_iter().flatten().min();
            let timeout = next.map_or(IDLE, |d| d.saturating_duration_since(Instant::now()));
            let mut flushes = Vec::new();
            let mut wrote = false;
            let got = match rx.try_recv() {
                Ok(first) => Ok(first),
                Err(TryRecvError::Empty) => {
                    // Idle: a long user write's short scheduler slice
                    // (`sandbox.rs`) lasts through what followed it (its
                    // rollback, the WAL's checkpoint) and ends here.
                    tablix_sched::slice::restore();
                    rx.recv_timeout(timeout)
                }
                Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(first) => {
                    let mut applies = Dispatch::default();
                    let mut next = Some(first);
                    let mut pending = false;
                    while let Some(r) = next.take() {
                        match r {
                            Request::Apply(p) => applies.push(p),
                            Request::Flush(reply) => flushes.push(reply),
                            Request::Pending => pending = true,
                            Request::Entries(entries, reply) => {
                                if !applies.is_empty() {
                                    self.commit_runs(std::mem::take(&mut applies));
                                }
                                let _ = reply.send(self.apply_entries(entries));
                                wrote = true;
                            }
                            Request::Install(path, reply) => {
                                if !applies.is_empty() {
                                    self.commit_runs(std::mem::take(&mut applies));
                                }
                                let _ = reply.send(self.install(&path));
                                wrote = true;
                            }
                            Request::Vacuum(reply) => {
                                if !applies.is_empty() {
                                    self.commit_runs(std::mem::take(&mut applies));
                                }
                                let _ = reply.send(self.vacuum());
                                wrote = true;
                            }
                        }
                        if applies.len() < self.config.max_batch {
                            next = rx.try_recv().ok();
                        }
                    }
                    if !applies.is_empty() {
                        self.commit_runs(applies);
                        pending = true;
                        wrote = true;
                    }
                    if is_async && pending && deadline.is_none() {
                        deadline = Some(Instant::now() + interval);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Checked after every receive, not only on timeouts: under steady
            // traffic the receive never times out.
            let due = deadline.is_some_and(|d| Instant::now() >= d);
            if due || !flushes.is_empty() {
                let r = self.flush();
                deadline = None;
                // Async mode's file-system writes reach the WAL on the
                // callers' threads: their commit here is where it grows.
                // A sync-mode flush writes nothing.
                wrote |= is_async;
                if let Err(e) = &r {
                    tracing::error!("flush failed: {e}; trying again within the flush interval");
                    // What stayed pending must still become durable.
                    if is_async {
                        deadline = Some(Instant::now() + interval);
                    }
                }
                for reply in flushes {
                    let _ = reply.send(r.as_ref().map(|_| ()).map_err(StoreError::duplicate));
                }
            }
            if wrote || wal_retry.is_some_and(|t| Instant::now() >= t) {
                wal_retry = self.bound_wal().then(|| Instant::now() + WAL_RETRY);
            }
        }
        if let Err(e) = self.flush() {
            tracing::error!("final flush failed: {e}");
        }
        match (self.log(), self.fs()) {
            (Ok(mut log), Ok(fs)) => match fs.checkpoint() {
                // Everything the state holds is in the database file, synced:
                // the log need not keep it.
                Ok(()) => {
                    if let Some(applied) = log.applied()
                        && let Err(e) = log.purge(applied)
                    {
                        tracing::warn!("purging the command log at close: {e}");
                    }
                }
                Err(e) => tracing::warn!("final checkpoint failed: {e}"),
            },
            _ => tracing::error!("final checkpoint: the store's locks are poisoned"),
        }
    }

    fn fs(&self) -> Result<MutexGuard<'_, FsWriter>, StoreError> {
        self.fs.lock().map_err(|_| StoreError::Closed)
    }

    fn log(&self) -> Result<MutexGuard<'_, CommandLog>, StoreError> {
        self.log.lock().map_err(|_| StoreError::Closed)
    }

    /// Commits what was gathered: the file system's Commands first, then
    /// user SQL, then transactions' commits, each kind in the order
    /// received. Commands gathered
    /// together were submitted concurrently (a submitter waits for its
    /// answer), so no submitter sees its own Commands reordered; and a file
    /// operation never waits for user writes that queued beside it.
    fn commit_runs(&mut self, applies: Dispatch) {
        if !applies.fs.is_empty() {
            self.commit_fs(applies.fs);
        }
        if !applies.sql.is_empty() {
            self.commit_sql(applies.sql);
        }
        if !applies.tx.is_empty() {
            self.commit_tx(applies.tx);
        }
    }

    /// Answers a group's proposers with its replies (or its failure),
    /// counting the refused ones as the domain `M` judges them.
    fn answer<M: Grouped, T>(
        &self,
        replies: Vec<Reply<T>>,
        results: Result<Vec<Result<M::Reply, StoreError>>, StoreError>,
        reply_of: impl Fn(M::Reply) -> T,
    ) {
        let n = replies.len() as u64;
        Counters::add(&self.counters.batches, 1);
        self.counters
            .largest_batch
            .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
        match results {
            Ok(results) => {
                Counters::add(&self.counters.commands, n);
                for (reply, result) in replies.into_iter().zip(results) {
                    if result.as_ref().map_or(true, M::refused) {
                        Counters::add(&self.counters.failed_commands, 1);
                    }
                    let _ = reply.send(result.map(&reply_of));
                }
            }
            Err(e) => {
                Counters::add(&self.counters.failed_commits, 1);
                tracing::error!("group commit of {n} commands failed: {e}");
                for reply in replies {
                    let _ = reply.send(Err(e.duplicate()));
                }
            }
        }
    }

    /// Logs a group of file-system Commands, syncs the log, applies them
    /// in one transaction that records the last entry, and answers.
    fn commit_fs(&self, group: Vec<FsItem>) {
        let r = (|| {
            let mut log = self.log()?;
            let mut fs = self.fs()?;
            // Acknowledged async-mode operations commit first; if that
            // fails they stay pending, untouched, and this group waits.
            fs.commit_pending(&mut log)?;
            log.running()?;
            let items: Vec<&Stamped<tablix_fs::FsOp>> =
                group.iter().map(|(c, _)| c.as_ref()).collect();
            let first = log.append_synced(&items, |log, item| log.append_fs(item))?;
            log.at(WritePoint::Synced);
            let r = fs.apply_group(
                &items,
                |conn, n| command_log::record_applied(conn, CommandLog::id_at(first, n)),
                log.probe(),
            );
            match &r {
                Ok(done) => {
                    log.applied_to(CommandLog::id_at(first, done.len()));
                    log.at(WritePoint::Committed);
                }
                Err(e) => log.unlog_or_stop(first, e),
            }
            self.purge_if_due(&mut log, &fs);
            r
        })();
        let replies = group.into_iter().map(|(_, reply)| reply).collect();
        self.answer::<FsWriter, _>(replies, r, |reply| reply);
    }

    /// Logs a group of transaction commits, syncs the log, applies them
    /// in one transaction that records the last entry, and answers.
    fn commit_tx(&self, group: Vec<TxItem>) {
        let r = (|| {
            let mut log = self.log()?;
            self.fs()?.commit_pending(&mut log)?;
            log.running()?;
            let items: Vec<&Stamped<crate::command::TxCommit>> =
                group.iter().map(|(c, _)| c.as_ref()).collect();
            let first = log.append_synced(&items, |log, item| log.append_tx(item))?;
            log.at(WritePoint::Synced);
            let r = self.tx.apply_group(
                &items,
                |conn, n| command_log::record_applied(conn, CommandLog::id_at(first, n)),
                log.probe(),
            );
            match &r {
                Ok(done) => {
                    log.applied_to(CommandLog::id_at(first, done.len()));
                    log.at(WritePoint::Committed);
                }
                Err(e) => log.unlog_or_stop(first, e),
            }
            if let Ok(fs) = self.fs() {
                self.purge_if_due(&mut log, &fs);
            }
            r
        })();
        let replies = group.into_iter().map(|(_, reply)| reply).collect();
        self.answer::<TxWriter, _>(replies, r, |reply| reply);
    }

    fn commit_sql(&mut self, group: Vec<SqlItem>) {
        // A Command whose client went away is answered without running,
        // before it is logged: a logged Command always runs.
        let (group, gone): (Vec<SqlItem>, Vec<SqlItem>) = group
            .into_iter()
            .partition(|(_, limits, _)| !limits.cancel.is_cancelled());
        for (_, _, reply) in gone {
            Counters::add(&self.counters.failed_commands, 1);
            let _ = reply.send(Ok(SqlWriter::cancelled()));
        }
        if group.is_empty() {
            return;
        }
        self.refresh_mem_for(group.iter().map(|(c, _, _)| &c.command));
        let mut log = match self.log.lock() {
            Ok(log) => log,
            Err(_) => {
                let replies = group.into_iter().map(|(_, _, reply)| reply).collect();
                self.answer::<SqlWriter, _>(replies, Err(StoreError::Closed), |h: Held| h.reply);
                return;
            }
        };
        // The whole group is logged and synced once; results are held
        // until their part is answered: a part ends where they would pass
        // one request's bound, the rest follows as the next part.
        let mut first = log.next_index();
        let logged = (|| {
            self.fs()?.commit_pending(&mut log)?;
            log.running()?;
            first = log.next_index();
            for (c, _, _) in &group {
                log.append_sql(c)?;
            }
            log.at(WritePoint::Appended);
            log.sync()
        })();
        if let Err(e) = logged {
            log.unlog_or_stop(first, &e);
            let replies = group.into_iter().map(|(_, _, reply)| reply).collect();
            self.answer::<SqlWriter, _>(replies, Err(e), |h: Held| h.reply);
            return;
        }
        log.at(WritePoint::Synced);
        let mut rest = group;
        while !rest.is_empty() {
            let items: Vec<(&Stamped<SqlCommand>, &Limits)> =
                rest.iter().map(|(c, l, _)| (c.as_ref(), l)).collect();
            let r = self.sql.apply_group(
                &items,
                self.config.max_result_bytes,
                |conn, n| command_log::record_applied(conn, CommandLog::id_at(first, n)),
                log.probe(),
            );
            drop(items);
            let done = match &r {
                Ok(results) => {
                    log.applied_to(CommandLog::id_at(first, results.len().max(1)));
                    log.at(WritePoint::Committed);
                    results.len().max(1)
                }
                Err(e) => {
                    log.unlog_or_stop(first, e);
                    rest.len()
                }
            };
            first += done as u64;
            let later = rest.split_off(done.min(rest.len()));
            let replies = std::mem::replace(&mut rest, later)
                .into_iter()
                .map(|(_, _, reply)| reply)
                .collect();
            self.answer::<SqlWriter, _>(replies, r, |held: Held| held.reply);
        }
        if let Ok(fs) = self.fs() {
            self.purge_if_due(&mut log, &fs);
        }
    }

    /// Once the log holds more than a segment, makes the state's commits
    /// durable (one fsync of the WAL) and purges the entries they hold.
    fn purge_if_due(&self, log: &mut CommandLog, fs: &FsWriter) {
        if log.bytes() <= self.config.log_segment_bytes {
            return;
        }
        let Some(applied) = log.applied() else {
            return;
        };
        if let Err(e) = fs.sync_wal().and_then(|()| log.purge(applied)) {
            tracing::warn!("purging the command log up to entry {}: {e}", applied.index);
        }
    }

    /// Makes every acknowledged Command durable: syncs the log and
    /// commits async mode's pending transaction.
    fn flush(&self) -> Result<(), StoreError> {
        if self.config.durability == Durability::Async {
            Counters::add(&self.counters.flushes, 1);
        }
        let mut log = self.log()?;
        let mut fs = self.fs()?;
        fs.commit_pending(&mut log)?;
        log.running()?;
        log.sync()?;
        if !log.is_kept() {
            // Replication's log is durable on its own; what a flush
            // promises here is the state itself, up to now.
            fs.sync_wal()?;
        }
        self.purge_if_due(&mut log, &fs);
        Ok(())
    }

    /// Applies committed entries of replication's log, in log order, each
    /// after the last entry the state holds. A failure of the node stops the
    /// state machine: nothing more is applied until restart, and
    /// replication applies the rest again from its log then.
    fn apply_entries(&mut self, entries: Vec<LogEntry>) -> Result<Vec<EntryReply>, StoreError> {
        let n = entries.len() as u64;
        let sql = entries
            .iter()
            .flat_map(|e| match &e.payload {
                EntryPayload::Commands(c) => c.as_slice(),
                _ => &[],
            })
            .filter_map(|c| match &c.command {
                ReplicatedCommand::Sql(s) => Some(s),
                ReplicatedCommand::Fs(_) | ReplicatedCommand::Tx(_) => None,
            });
        self.refresh_mem_for(sql);
        let mut log = self.log()?;
        if log.is_kept() {
            return Err(StoreError::Apply(
                "this store keeps its own command log: entries of another log cannot be applied to it".into(),
            ));
        }
        log.running()?;
        // Entries come in log order, each after the last applied: an
        // entry the state holds is never applied again. Which entries are
        // committed is replication's to say; one it skips is logged.
        let mut last = log.applied().map_or(0, |a| a.index);
        for e in &entries {
            if e.id.index <= last {
                return Err(StoreError::Apply(format!(
                    "entry {} was handed to the store after entry {last}: entries are applied once, in order",
                    e.id.index
                )));
            }
            if e.id.index != last + 1 {
                tracing::warn!(
                    "applying entry {} after entry {last}, as replication asks: entries {}..={} are not applied",
                    e.id.index,
                    last + 1,
                    e.id.index - 1
                );
            }
            last = e.id.index;
        }
        let fs = self.fs()?;
        let known = match self.proposals.borrow_mut().take() {
            Some(p) => p,
            None => {
                Proposals::load(fs.connection()).map_err(|e| log.stop(SqliteFailure::of(&e)))?
            }
        };
        let known = std::cell::RefCell::new(known);
        let limits = self.config.write_limits();
        let probe = log.probe().clone();
        let to = Appliers {
            fs: &fs,
            sql: &self.sql,
            tx: &self.tx,
            limits: &limits,
            budget: self.config.max_result_bytes,
            probe: &probe,
            watch: Some(&self.fs_watch),
            dedup: Some(&known),
            recorded: std::cell::RefCell::new(None),
            settled: self.settled.replace(false),
        };
        let r = apply_log::apply(&to, entries, |id| log.applied_to(id));
        drop(to);
        // What committed groups recorded; a failed group left nothing.
        *self.proposals.borrow_mut() = Some(known.into_inner());
        Counters::add(&self.counters.batches, 1);
        match r {
            Ok(replies) => {
                Counters::add(&self.counters.commands, n);
                self.settled.set(true);
                Ok(replies)
            }
            Err(h) => {
                Counters::add(&self.counters.failed_commits, 1);
                tracing::error!("applying entry {} failed: {}", h.at, h.error);
                Err(log.stop(failure_of(&h.error)))
            }
        }
    }

    /// VACUUM on the file system's connection, holding the write turn,
    /// with nothing pending: the file is rewritten, no row changes.
    fn vacuum(&self) -> Result<(), StoreError> {
        let mut log = self.log()?;
        let mut fs = self.fs()?;
        fs.commit_pending(&mut log)?;
        log.running()?;
        fs.vacuum()
    }

    /// Replaces the whole state with a snapshot (replication's log keeps
    /// only what follows it).
    fn install(&mut self, path: &std::path::Path) -> Result<AppliedState, StoreError> {
        let mut log = self.log()?;
        if log.is_kept() {
            return Err(StoreError::Apply(
                "this store keeps its own command log: a snapshot would leave it behind the state"
                    .into(),
            ));
        }
        log.running()?;
        self.proposals.borrow_mut().take();
        self.settled.set(false);
        let mut fs = self.fs()?;
        match fs.install(path) {
            Ok(state) => {
                log.reset_applied(state.applied);
                Ok(state)
            }
            Err(e) => {
                // Refused before the copy, or failed after it (migrating,
                // syncing): the last applied entry is what the state says.
                match crate::command_log::applied(fs.connection()) {
                    Ok(applied) => log.reset_applied(applied),
                    Err(read) => {
                        log.stop(SqliteFailure::of(&read));
                    }
                }
                Err(e)
            }
        }
    }

    /// Attaches a fresh image of the memory database to user SQL's writer
    /// when one of `commands` reads it; outside any transaction.
    fn refresh_mem_for<'a>(&mut self, mut commands: impl Iterator<Item = &'a SqlCommand>) {
        let rules = self.sql.uc.policy.rules();
        let reads_memory =
            commands.any(|c| c.statements.iter().any(|s| rules.mentions_memory(&s.sql)));
        if reads_memory
            && self.volatile.generation() != self.sql.uc.mem_generation()
            && let Err(e) = self
                .volatile
                .image()
                .and_then(|img| self.sql.refresh_mem(&img))
        {
            tracing::warn!("refreshing the memory database's image for SQL: {e}");
        }
    }

    /// Checkpoints and truncates the WAL when it outgrew its bound.
    /// Returns whether it is still over (readers held it): try later.
    fn bound_wal(&self) -> bool {
        let size = self.wal.bytes();
        if size <= self.config.wal_limit {
            return false;
        }
        let r = (|| {
            let mut log = self.log()?;
            let mut fs = self.fs()?;
            fs.commit_pending(&mut log)?;
            fs.try_cut_wal(&self.wal, self.config.wal_limit)
        })();
        match r {
            Ok(true) => {
                Counters::add(&self.counters.wal_truncations, 1);
                false
            }
            Ok(false) => true,
            Err(e) => {
                tracing::warn!("checkpointing the WAL ({size} bytes) failed: {e}");
                true
            }
        }
    }
}
