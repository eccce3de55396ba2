//! `RaftLogStorage` and `RaftLogReader` over the command log.
//!
//! An entry's payload is its openraft `Entry` encoded with postcard behind
//! a format byte; the log's own id of it is `(term, index + 1)`. The vote
//! is postcard too, in the log's vote file. Calls run the log's blocking
//! I/O on the caller's task: an append is one write and one fdatasync,
//! the cost openraft's own storage examples pay the same way.
#![allow(
    clippy::result_large_err,
    reason = "openraft's storage traits return its StorageError; the helpers here build it"
)]

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogId, RaftTypeConfig, StorageError,
    StorageIOError, Vote,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tablix_log::Log;

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
    _types: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            log: Arc::clone(&self.log),
            _types: PhantomData,
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
    C::Entry: Serialize + DeserializeOwned,
{
    pub fn new(log: Log) -> LogStore<C> {
        LogStore {
            log: Arc::new(Mutex::new(log)),
            _types: PhantomData,
        }
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
    C::Entry: Serialize + DeserializeOwned,
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
    C::Entry: Serialize + DeserializeOwned,
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
                log.truncate(at.index)
                    .map_err(|e| io_error::<C>(subject.clone(), ErrorVerb::Write, e))?;
            }
            if log.first_index() == log.next_index() && at.index != log.next_index() {
                // An empty log takes its first entry at any index (a
                // follower's log after a snapshot): what precedes it is
                // marked purged, in the entry's term.
                log.reset(Some(tablix_log::LogId {
                    term: at.term,
                    index: at.index - 1,
                }))
                .map_err(|e| io_error::<C>(subject.clone(), ErrorVerb::Write, e))?;
            }
            log.append(at, &payload)
                .map_err(|e| io_error::<C>(subject, ErrorVerb::Write, e))?;
        }
        let synced = log.sync();
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
        self.lock()?
            .truncate(log_id.index + 1)
            .map_err(|e| io_error::<C>(ErrorSubject::Log(log_id), ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.lock()?
            .purge(to_log(log_id.leader_id.term, log_id.index))
            .map_err(|e| io_error::<C>(ErrorSubject::Log(log_id), ErrorVerb::Delete, e))
    }
}
