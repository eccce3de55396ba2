//! `RaftLogStorage` and `RaftLogReader` over the command log.
//!
//! An entry's payload is its openraft `Entry` encoded with postcard behind
//! a format byte; the log's own id of it is `(term, index + 1)`. The vote
//! is postcard too, in the log's vote file. Calls run the log's blocking
//! I/O on the caller's task: an append is one write and one fdatasync,
//! the cost openraft's own storage examples pay the same way. The newest
//! entries are also kept decoded (`recent_entries.rs`): openraft reads
//! each one back to apply it and, on a leader, to send it to every
//! follower.
#![allow(
    clippy::result_large_err,
    reason = "openraft's storage traits return its StorageError; the helpers here build it"
)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftTypeConfig, StorageError,
    StorageIOError, Vote,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tablix_log::Log;

use crate::recent_entries::RecentEntries;
use crate::{from_log, to_log};

/// Payload bytes past which a replication request takes no further
/// entry. Openraft 0.9 gives an AppendEntries as long as the heartbeat
/// interval (50 ms) before it counts as timed out and sends it again:
/// sixteen entries of 1 MiB writes, its own cap, took longer than that to
/// reach a busy follower's disk, and requests sent again and again kept
/// heartbeats from followers until they called elections.
const SEND_BYTES: usize = 1 << 20;

/// The first byte of an openraft entry's payload: the encoding's version.
/// (The store's own single-node entries start with 1.)
const FORMAT: u8 = 2;

/// Openraft's log storage on a command log. Clones share the log (a
/// reader is a clone).
pub struct LogStore<C: RaftTypeConfig> {
    log: Arc<Mutex<Log>>,
    /// Changed only while `log`'s lock is held (taken after it).
    recent: Arc<Mutex<RecentEntries<C::Entry>>>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            log: Arc::clone(&self.log),
            recent: Arc::clone(&self.recent),
        }
    }
}

fn io_error<C: RaftTypeConfig>(
    subject: ErrorSubject<C::NodeId>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError<C::NodeId> {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, openraft::AnyError::new(&e)),
    }
}

impl<C: RaftTypeConfig> LogStore<C>
where
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    pub fn new(log: Log) -> LogStore<C> {
        // Openraft's next index.
        let next = log.next_index() - 1;
        LogStore {
            log: Arc::new(Mutex::new(log)),
            recent: Arc::new(Mutex::new(RecentEntries::empty_at(next))),
        }
    }

    /// The entries kept in memory. Their lock is taken after the log's,
    /// never before it.
    fn recent(&self) -> MutexGuard<'_, RecentEntries<C::Entry>> {
        // A panicking holder leaves at worst a suffix that no longer ends
        // where the log does: `check` against the log's end empties it at
        // the next change.
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes the log's live segments hold (`Log::bytes`); none once its
    /// lock was poisoned.
    pub fn bytes(&self) -> u64 {
        self.log.lock().map_or(0, |l| l.bytes())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Log>, StorageError<C::NodeId>> {
        self.log.lock().map_err(|_| {
            io_error::<C>(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                std::io::Error::other("the command log's lock was poisoned"),
            )
        })
    }

    /// Openraft's entries `[from, to)`, clamped to what the log holds,
    /// stopping after the entry whose payload brings the bytes read to
    /// `bytes` or more.
    fn read(
        &self,
        from: u64,
        to: u64,
        bytes: usize,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        if let Some(entries) = self.recent().read(from, to, bytes) {
            return Ok(entries);
        }
        let log = self.lock()?;
        // Openraft's indexes, clamped to what the log holds.
        let from = from.max(log.first_index() - 1);
        let to = to.min(log.next_index() - 1);
        let mut out = Vec::new();
        let mut read = 0usize;
        for i in from..to.max(from) {
            if read >= bytes {
                break;
            }
            let e = log
                .entry(i + 1)
                .map_err(|e| io_error::<C>(ErrorSubject::Logs, ErrorVerb::Read, e))?;
            read = read.saturating_add(e.payload.len());
            out.push(Self::decode(&e)?);
        }
        Ok(out)
    }

    fn decode(entry: &tablix_log::Entry) -> Result<C::Entry, StorageError<C::NodeId>> {
        let subject = ErrorSubject::Log(from_log(entry.id));
        match entry.payload.split_first() {
            Some((&FORMAT, rest)) => {
                postcard::from_bytes(rest).map_err(|e| io_error::<C>(subject, ErrorVerb::Read, e))
            }
            _ => Err(io_error::<C>(
                subject,
                ErrorVerb::Read,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "entry {} of the command log is not an openraft entry",
                        entry.id.index
                    ),
                ),
            )),
        }
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C>
where
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let from = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        self.read(from, to, usize::MAX)
    }

    /// What one AppendEntries carries: entries from `start` until their
    /// payloads pass `SEND_BYTES` (at least one).
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.read(start, end, SEND_BYTES)
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C>
where
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    type LogReader = LogStore<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let log = self.lock()?;
        Ok(LogState {
            last_purged_log_id: log.purged().map(from_log),
            last_log_id: log.last().map(from_log),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let bytes = postcard::to_stdvec(vote)
            .map_err(|e| io_error::<C>(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        self.lock()?
            .save_vote(&bytes)
            .map_err(|e| io_error::<C>(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        let bytes = self
            .lock()?
            .vote()
            .map_err(|e| io_error::<C>(ErrorSubject::Vote, ErrorVerb::Read, e))?;
        bytes
            .map(|b| postcard::from_bytes(&b))
            .transpose()
            .map_err(|e| io_error::<C>(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut log = self.lock()?;
        let mut recent = self.recent();
        let mut payload = Vec::new();
        for entry in entries {
            let id = entry.get_log_id().clone();
            let subject = ErrorSubject::Log(id.clone());
            payload.clear();
            payload.push(FORMAT);
            payload = postcard::to_extend(&entry, std::mem::take(&mut payload))
                .map_err(|e| io_error::<C>(subject.clone(), ErrorVerb::Write, e))?;
            let at = to_log(id.leader_id.term, id.index);
            if at.index < log.next_index() && at.index >= log.first_index() {
                // An entry at an index the log holds replaces it and every
                // later one: they conflict with it (Raft's log matching).
                let truncated = log.truncate(at.index);
                recent.truncate(id.index);
                recent.check(log.next_index() - 1);
                truncated.map_err(|e| io_error::<C>(subject.clone(), ErrorVerb::Write, e))?;
            }
            if log.first_index() == log.next_index() && at.index != log.next_index() {
                // An empty log takes its first entry at any index (a
                // follower's log after a snapshot): what precedes it is
                // marked purged, in the entry's term.
                let reset = log.reset(Some(tablix_log::LogId {
                    term: at.term,
                    index: at.index - 1,
                }));
                recent.check(log.next_index() - 1);
                reset.map_err(|e| io_error::<C>(subject.clone(), ErrorVerb::Write, e))?;
            }
            if let Err(e) = log.append(at, &payload) {
                recent.check(log.next_index() - 1);
                return Err(io_error::<C>(subject, ErrorVerb::Write, e));
            }
            recent.push(id.index, entry, payload.len());
        }
        recent.check(log.next_index() - 1);
        // Readers find the entries in memory while the log syncs.
        drop(recent);
        let synced = log.sync();
        if synced.is_err() {
            // The log is poisoned: nothing is read from memory either.
            *self.recent() = RecentEntries::empty_at(log.next_index() - 1);
        }
        drop(log);
        match synced {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                callback.log_io_completed(Err(std::io::Error::other(message)));
                Err(io_error::<C>(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let mut log = self.lock()?;
        let r = log.truncate(log_id.index + 1);
        let mut recent = self.recent();
        recent.truncate(log_id.index);
        recent.check(log.next_index() - 1);
        r.map_err(|e| io_error::<C>(ErrorSubject::Log(log_id), ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        let mut log = self.lock()?;
        let r = log.purge(to_log(log_id.leader_id.term, log_id.index));
        let mut recent = self.recent();
        recent.purge(log_id.index);
        recent.check(log.next_index() - 1);
        r.map_err(|e| io_error::<C>(ErrorSubject::Log(log_id), ErrorVerb::Delete, e))
    }
}
