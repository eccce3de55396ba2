//! The log: live segments in order, free segments to recycle, and what
//! precedes the first live entry.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::LogError;
use crate::record::Header;
use crate::segment::{ScanEnd, Segment};

/// The id of an entry: the term it was proposed in and its index.
/// Indexes start at 1 and have no gaps; terms never decrease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogId {
    pub term: u64,
    pub index: u64,
}

/// One entry read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: LogId,
    pub payload: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct LogConfig {
    /// Size a segment is filled to before the next one starts (an entry
    /// larger than this has a segment of its own).
    pub segment_bytes: u64,
    /// Free segments kept for reuse; more are deleted.
    pub keep_free: usize,
    /// Tests of power loss set this when the machine "dies": from then on
    /// nothing more reaches the log's files (every write and sync fails),
    /// so the files hold what was written before, as after a crash.
    pub halt: Option<Arc<AtomicBool>>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 64 << 20,
            keep_free: 2,
            halt: None,
        }
    }
}

/// What opening the log found besides its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The newest segment ended in bytes that are neither an entry nor
    /// the end marker (a write a crash tore): where they start. They are
    /// overwritten by the next append.
    pub torn_tail: Option<(PathBuf, u64)>,
    /// Segments with a valid header that do not continue the log (left
    /// by an interrupted truncation or damage): recycled.
    pub orphaned_segments: usize,
}

/// Largest payload of one entry.
pub const MAX_ENTRY_BYTES: usize = 1 << 30;

/// The command log of one node. Not thread-safe: its owner serializes
/// calls.
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    /// Live segments, oldest first; the last takes appends.
    live: VecDeque<Segment>,
    free: Vec<Segment>,
    next_seq: u64,
    next_file: u64,
    /// The last entry purged (its id), if any.
    purged: Option<LogId>,
    /// The last entry appended, or the last purged when none is held.
    last: Option<LogId>,
    poisoned: Option<String>,
}

const SEGMENT_SUFFIX: &str = ".seg";

impl Log {
    /// Opens the log in `dir` (created 0700 when missing), reading every
    /// segment. A torn tail is cut (see [`Recovered`]).
    pub fn open(dir: &Path, config: LogConfig) -> Result<(Log, Recovered), LogError> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(|e| LogError::io(dir, "creating the directory", e))?;
        let mut found = Vec::new();
        let mut free = Vec::new();
        let mut next_file = 0;
        let listing = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, "listing", e))?;
        for item in listing {
            let item = item.map_err(|e| LogError::io(dir, "listing", e))?;
            let name = item.file_name();
            let Some(n) = name
                .to_str()
                .and_then(|n| n.strip_suffix(SEGMENT_SUFFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            next_file = next_file.max(n + 1);
            match Segment::open(item.path())? {
                Some(s) => found.push(s),
                None => free.push(item.path()),
            }
        }
        found.sort_by_key(|(s, _)| s.header.seq);
        let mut recovered = Recovered::default();
        let next_seq = found.last().map_or(1, |(s, _)| s.header.seq + 1);
        // The log is the newest segment and each older one that ends just
        // before the next begins.
        let mut live: VecDeque<Segment> = VecDeque::new();
        let mut orphans = Vec::new();
        while let Some((s, end)) = found.pop() {
            let continues = match live.front() {
                None => {
                    if let ScanEnd::Torn { offset } = end {
                        recovered.torn_tail = Some((s.path.clone(), offset));
                    }
                    true
                }
                Some(newer) => s.next_index() == newer.header.first_index && s.count() > 0,
            };
            if continues && orphans.is_empty() {
                live.push_front(s);
            } else {
                orphans.push(s);
            }
        }
        let mut log = Log {
            dir: dir.to_path_buf(),
            config,
            live,
            free: Vec::new(),
            next_seq,
            next_file,
            purged: None,
            last: None,
            poisoned: None,
        };
        if let Some(first) = log.live.front() {
            let h = first.header;
            if h.first_index > 1 {
                log.purged = Some(LogId {
                    term: h.prev_term,
                    index: h.first_index - 1,
                });
            }
        }
        log.last = log.live.back().map(|s| LogId {
            term: s.last_term,
            index: s.next_index() - 1,
        });
        if log.last.is_some_and(|l| l.index == 0) {
            log.last = None;
        }
        // Segments older than the log's start are purged ones; any that
        // is not is named in the report.
        let first = log.live.front().map_or(0, |s| s.header.first_index);
        for s in orphans {
            if s.next_index() > first {
                recovered.orphaned_segments += 1;
            }
            log.release(s);
        }
        for path in free {
            let s = Segment::open_free(path)?;
            log.release(s);
        }
        Ok((log, recovered))
    }

    /// The last entry purged.
    pub fn purged(&self) -> Option<LogId> {
        self.purged
    }

    /// The last entry the log holds, or the last purged when it holds none.
    pub fn last(&self) -> Option<LogId> {
        self.last
    }

    /// Index the next append must take.
    pub fn next_index(&self) -> u64 {
        self.last.map_or(1, |l| l.index + 1)
    }

    /// Index of the first entry held (the next index when none is).
    pub fn first_index(&self) -> u64 {
        self.purged.map_or(1, |p| p.index + 1)
    }

    /// Bytes of records in the live segments (purged entries included
    /// until their segment is recycled).
    pub fn bytes(&self) -> u64 {
        self.live.iter().map(Segment::bytes).sum()
    }

    fn check(&self) -> Result<(), LogError> {
        if self
            .config
            .halt
            .as_ref()
            .is_some_and(|h| h.load(Ordering::Relaxed))
        {
            return Err(LogError::Poisoned("halted (a test's power loss)".into()));
        }
        match &self.poisoned {
            Some(why) => Err(LogError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// A failed write or sync leaves unknown bytes behind: the log takes
    /// nothing more until reopened. A failed extension (a full disk) wrote
    /// no record and changed nothing, so the log goes on.
    fn poison<T>(&mut self, r: Result<T, LogError>) -> Result<T, LogError> {
        if let Err(e) = &r
            && !matches!(
                e,
                LogError::Io {
                    op: "extending",
                    ..
                }
            )
        {
            self.poisoned = Some(e.to_string());
        }
        r
    }

    /// Appends one entry, which must take [`Log::next_index`] and a term
    /// no lower than the last. It is durable once [`Log::sync`] returns.
    /// A failed append (a full disk while extending a segment) leaves the
    /// log as it was.
    pub fn append(&mut self, id: LogId, payload: &[u8]) -> Result<(), LogError> {
        self.check()?;
        if id.index != self.next_index() {
            return Err(LogError::NotNext {
                expected: self.next_index(),
                got: id.index,
            });
        }
        if payload.len() > MAX_ENTRY_BYTES {
            return Err(LogError::TooLarge {
                bytes: payload.len(),
                limit: MAX_ENTRY_BYTES,
            });
        }
        let spent = self.live.back().is_none_or(|s| {
            s.count() > 0 && s.next_index() - 1 <= self.purged.map_or(0, |p| p.index)
        });
        let full = self
            .live
            .back()
            .is_some_and(|s| !s.fits(payload.len(), self.config.segment_bytes));
        if spent || full {
            self.roll()?;
        }
        let term_before = self.last.map_or(0, |l| l.term);
        let Some(s) = self.live.back_mut() else {
            return Err(LogError::Poisoned("no segment to append to".into()));
        };
        match s.append(id.term, id.index, payload) {
            Ok(()) => {
                self.last = Some(id);
                Ok(())
            }
            Err(e) => {
                // Only a write-behind of earlier appends fails here: what
                // reached the file is unknown until the log is opened again.
                s.forget_from(id.index, term_before);
                self.poison(Err(e))
            }
        }
    }

    /// Starts the next segment: a free one overwritten in place, or a new
    /// file. What the current one holds is made durable first, so that a
    /// newer segment on disk always follows a complete older one.
    fn roll(&mut self) -> Result<(), LogError> {
        if let Some(s) = self.live.back_mut() {
            let r = s.sync();
            self.poison(r)?;
        }
        let purged_to = self.purged.map_or(0, |p| p.index);
        while self
            .live
            .front()
            .is_some_and(|s| s.next_index() - 1 <= purged_to)
        {
            if let Some(s) = self.live.pop_front() {
                self.release(s);
            }
        }
        let header = Header {
            seq: self.next_seq,
            first_index: self.next_index(),
            prev_term: self.last.map_or(0, |l| l.term),
        };
        let seg = match self.free.pop() {
            Some(mut s) => match s.restart(header) {
                Ok(()) => s,
                Err(e) => {
                    self.free.push(s);
                    return Err(e);
                }
            },
            None => {
                let path = self
                    .dir
                    .join(format!("{:08}{SEGMENT_SUFFIX}", self.next_file));
                let s = Segment::create(path, header)?;
                self.next_file += 1;
                s
            }
        };
        self.next_seq += 1;
        self.live.push_back(seg);
        Ok(())
    }

    /// Keeps a segment no longer live for reuse, or deletes it.
    fn release(&mut self, s: Segment) {
        if self.free.len() < self.config.keep_free {
            self.free.push(s);
        } else {
            s.remove();
        }
    }

    /// Makes every appended entry durable: one write and one fdatasync
    /// per segment written since the last sync.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.check()?;
        for i in 0..self.live.len() {
            let r = self.live[i].sync();
            self.poison(r)?;
        }
        Ok(())
    }

    fn segment_of(&self, index: u64) -> Option<usize> {
        if index < self.first_index() || index >= self.next_index() {
            return None;
        }
        let i = self.live.partition_point(|s| s.header.first_index <= index);
        i.checked_sub(1)
    }

    fn missing(&self, index: u64) -> LogError {
        LogError::Missing {
            index,
            first: self.first_index(),
            last: self.next_index().saturating_sub(1),
        }
    }

    /// Reads one entry back (checksum verified).
    pub fn entry(&self, index: u64) -> Result<Entry, LogError> {
        let i = self.segment_of(index).ok_or_else(|| self.missing(index))?;
        let (term, payload) = self.live[i].read(index)?;
        Ok(Entry {
            id: LogId { term, index },
            payload,
        })
    }

    /// Reads the entries of `range` back, in order.
    pub fn entries(&self, range: std::ops::Range<u64>) -> Result<Vec<Entry>, LogError> {
        range.map(|i| self.entry(i)).collect()
    }

    /// Id of entry `index`: held, or the last purged.
    fn id_of(&self, index: u64) -> Result<Option<LogId>, LogError> {
        if index == 0 {
            return Ok(None);
        }
        if let Some(p) = self.purged
            && p.index == index
        {
            return Ok(Some(p));
        }
        Ok(Some(self.entry(index)?.id))
    }

    /// Removes the entries from `since` on (entries not purged), durably:
    /// on return no later open finds them.
    pub fn truncate(&mut self, since: u64) -> Result<(), LogError> {
        self.check()?;
        if since >= self.next_index() {
            return Ok(());
        }
        if since < self.first_index() {
            return Err(self.missing(since));
        }
        let before = self.id_of(since - 1)?;
        let Some(i) = self.segment_of(since) else {
            return Err(self.missing(since));
        };
        while self.live.len() > i + 1 {
            if let Some(mut s) = self.live.pop_back() {
                let r = s.invalidate();
                self.poison(r)?;
                self.release(s);
            }
        }
        let term_before = before.map_or(0, |b| b.term);
        let s = &mut self.live[i];
        let r = s.truncate_from(since, term_before).and_then(|()| s.sync());
        self.poison(r)?;
        self.last = before;
        Ok(())
    }

    /// Forgets the entries up to `upto` (which the state holds durably);
    /// segments holding only such entries are recycled. Purging past the
    /// last entry empties the log, and the next append takes
    /// `upto.index + 1`.
    pub fn purge(&mut self, upto: LogId) -> Result<(), LogError> {
        self.check()?;
        if self.purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(());
        }
        self.purged = Some(upto);
        if self.last.is_none_or(|l| l.index <= upto.index) {
            self.last = Some(upto);
        }
        while self.live.len() > 1
            && self
                .live
                .front()
                .is_some_and(|s| s.next_index() - 1 <= upto.index)
        {
            if let Some(s) = self.live.pop_front() {
                self.release(s);
            }
        }
        if self
            .live
            .back()
            .is_some_and(|s| s.next_index() - 1 < upto.index)
        {
            // Purged past everything held: the next append starts a
            // segment at the new index.
            let r = match self.live.pop_back() {
                Some(mut s) => {
                    let r = s.invalidate();
                    self.release(s);
                    r
                }
                None => Ok(()),
            };
            self.poison(r)?;
        }
        Ok(())
    }

    /// Directory of the log's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
