//! The log: live segments in order, free segments to recycle, and what
//! precedes the first live entry.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::LogError;
use crate::power::PowerModel;
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
    /// Crash tests' model of the machine: once halted nothing more
    /// reaches the log's files (every write and sync fails), and a power
    /// loss puts them back as their last syncs left them.
    pub power: Option<Arc<PowerModel>>,
    /// Open a log with damage ([`LogError::Damaged`]) by cutting it
    /// before the first entry that does not check: the entries from there
    /// on are gone. Without it the open is refused and nothing changes.
    pub discard_damaged: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 64 << 20,
            keep_free: 2,
            power: None,
            discard_damaged: false,
        }
    }
}

/// Entries that do not check with entries after them that do: not the
/// torn end of the last write, which a crash leaves, but damage (or a
/// power failure that kept part of an unsynced write and lost part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The segment file and the byte where the first bad record starts.
    pub path: PathBuf,
    pub offset: u64,
    /// The first entry that cannot be read.
    pub index: u64,
    /// The last entry the log holds after it.
    pub through: u64,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "entry {} (byte {} of {}) does not check, and entries up to {} follow it",
            self.index,
            self.offset,
            self.path.display(),
            self.through
        )
    }
}

/// What a read-only look at a log's directory found ([`Log::inspect`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inspection {
    /// The entry before the first held, if any.
    pub purged: Option<LogId>,
    /// The last entry held before any damage, or the last purged.
    pub last: Option<LogId>,
    pub segments: usize,
    /// Bytes of records in the live segments.
    pub bytes: u64,
    pub torn_tail: Option<(PathBuf, u64)>,
    pub damage: Option<Damage>,
}

impl Inspection {
    /// Index of the first entry held (the next index when none is).
    pub fn first_index(&self) -> u64 {
        self.purged.map_or(1, |p| p.index + 1)
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
    /// Damage cut off under [`LogConfig::discard_damaged`]: its entries
    /// are gone.
    pub discarded: Option<Damage>,
}

/// Segment files of a log directory, read.
struct Scanned {
    found: Vec<(Segment, ScanEnd)>,
    free: Vec<PathBuf>,
    next_file: u64,
}

fn scan(dir: &Path, writable: bool, power: Option<Arc<PowerModel>>) -> Result<Scanned, LogError> {
    let mut out = Scanned {
        found: Vec::new(),
        free: Vec::new(),
        next_file: 0,
    };
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
        out.next_file = out.next_file.max(n + 1);
        match Segment::open(item.path(), writable, power.clone())? {
            Some(s) => out.found.push(s),
            None => out.free.push(item.path()),
        }
    }
    out.found.sort_by_key(|(s, _)| s.header.seq);
    Ok(out)
}

/// The live segments, oldest first, picked out of those found.
struct Assembled {
    live: VecDeque<Segment>,
    orphans: Vec<Segment>,
    torn_tail: Option<(PathBuf, u64)>,
    damage: Option<Damage>,
}

/// The log is the newest segment and each older one that ends just before
/// the next begins. An older segment that stops short of the next at
/// bytes that do not check is part of it too, damaged: the entries it
/// lacks are not skipped silently.
fn assemble(mut found: Vec<(Segment, ScanEnd)>) -> Assembled {
    let mut a = Assembled {
        live: VecDeque::new(),
        orphans: Vec::new(),
        torn_tail: None,
        damage: None,
    };
    while let Some((s, end)) = found.pop() {
        let continues = match (a.live.front(), end) {
            (None, ScanEnd::Clean) => true,
            (None, ScanEnd::Torn { offset, later }) => {
                match later {
                    None => a.torn_tail = Some((s.path.clone(), offset)),
                    Some(through) => {
                        a.damage = Some(Damage {
                            path: s.path.clone(),
                            offset,
                            index: s.next_index(),
                            through,
                        });
                    }
                }
                true
            }
            (Some(newer), end) => {
                let first = newer.header.first_index;
                if s.count() > 0 && s.next_index() == first {
                    true
                } else if let ScanEnd::Torn { offset, .. } = end
                    && a.damage.is_none()
                    && s.next_index() < first
                {
                    a.damage = Some(Damage {
                        path: s.path.clone(),
                        offset,
                        index: s.next_index(),
                        through: a.live.back().map_or(first, |l| l.next_index() - 1),
                    });
                    true
                } else {
                    false
                }
            }
        };
        if continues && a.orphans.is_empty() {
            a.live.push_front(s);
        } else {
            a.orphans.push(s);
        }
    }
    a
}

/// What precedes the first live entry, and the last entry held.
fn bounds(live: &VecDeque<Segment>) -> (Option<LogId>, Option<LogId>) {
    let purged = live.front().and_then(|s| {
        let h = s.header;
        (h.first_index > 1).then(|| LogId {
            term: h.prev_term,
            index: h.first_index - 1,
        })
    });
    let last = live
        .back()
        .map(|s| LogId {
            term: s.last_term,
            index: s.next_index() - 1,
        })
        .filter(|l| l.index > 0);
    (purged, last)
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
    /// segment. A torn tail is cut (see [`Recovered`]); damage is refused
    /// with [`LogError::Damaged`], changing nothing, unless
    /// [`LogConfig::discard_damaged`] says to cut it.
    pub fn open(dir: &Path, config: LogConfig) -> Result<(Log, Recovered), LogError> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(|e| LogError::io(dir, "creating the directory", e))?;
        let scanned = scan(dir, true, config.power.clone())?;
        let next_seq = scanned.found.last().map_or(1, |(s, _)| s.header.seq + 1);
        let assembled = assemble(scanned.found);
        if let Some(d) = &assembled.damage
            && !config.discard_damaged
        {
            return Err(LogError::Damaged(d.clone()));
        }
        let mut recovered = Recovered {
            torn_tail: assembled.torn_tail,
            ..Recovered::default()
        };
        let mut log = Log {
            dir: dir.to_path_buf(),
            config,
            live: assembled.live,
            free: Vec::new(),
            next_seq,
            next_file: scanned.next_file,
            purged: None,
            last: None,
            poisoned: None,
        };
        if let Some(d) = assembled.damage {
            log.cut_at(&d)?;
            recovered.discarded = Some(d);
        }
        (log.purged, log.last) = bounds(&log.live);
        // Segments older than the log's start are purged ones; any that
        // is not is named in the report.
        let first = log.live.front().map_or(0, |s| s.header.first_index);
        for s in assembled.orphans {
            if s.next_index() > first {
                recovered.orphaned_segments += 1;
            }
            log.retire(s)?;
        }
        for path in scanned.free {
            let s = Segment::open_free(path, log.config.power.clone())?;
            log.release(s);
        }
        Ok((log, recovered))
    }

    /// Looks at the log in `dir` without changing any file: what it holds,
    /// a torn tail, damage. A missing directory is an empty log.
    pub fn inspect(dir: &Path) -> Result<Inspection, LogError> {
        if !dir.exists() {
            return Ok(Inspection::default());
        }
        let assembled = assemble(scan(dir, false, None)?.found);
        let (purged, last) = bounds(&assembled.live);
        Ok(Inspection {
            purged,
            last: last.or(purged),
            segments: assembled.live.len(),
            bytes: assembled.live.iter().map(Segment::bytes).sum(),
            torn_tail: assembled.torn_tail,
            damage: assembled.damage,
        })
    }

    /// Cuts the log before damage: the segments after the damaged one are
    /// freed, and the damaged one's bytes past its last good entry are
    /// zeroed, all synced before the log takes appends.
    fn cut_at(&mut self, d: &Damage) -> Result<(), LogError> {
        while self.live.back().is_some_and(|s| s.path != d.path) {
            if let Some(mut s) = self.live.pop_back() {
                s.invalidate()?;
                self.release(s);
            }
        }
        if let Some(s) = self.live.back_mut() {
            let end = s.records_end();
            s.zero_from(end)?;
            s.sync()?;
        }
        Ok(())
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
        if self.config.power.as_ref().is_some_and(|p| p.is_halted()) {
            return Err(LogError::Poisoned(
                "the machine lost power (a crash test)".into(),
            ));
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
        let header = Header::new(
            self.next_seq,
            self.next_index(),
            self.last.map_or(0, |l| l.term),
        );
        let mut seg = match self.free.pop() {
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
                let s = Segment::create(path, header, self.config.power.clone())?;
                self.next_file += 1;
                s
            }
        };
        // Segments holding only purged entries are retired once the new
        // one's header (which names the entry before it) is durable: a
        // crash in between leaves a log that starts earlier, never one
        // that forgot where it stood.
        let purged_to = self.purged.map_or(0, |p| p.index);
        let spent = self
            .live
            .iter()
            .take_while(|s| s.next_index() - 1 <= purged_to)
            .count();
        if spent > 0 {
            let r = seg.sync();
            if let Err(e) = r {
                self.free.push(seg);
                return self.poison(Err(e));
            }
            for _ in 0..spent {
                if let Some(s) = self.live.pop_front() {
                    let r = self.retire(s);
                    self.poison(r)?;
                }
            }
        }
        self.next_seq += 1;
        self.live.push_back(seg);
        Ok(())
    }

    /// Frees a segment whose entries are no longer the log's: its header
    /// is zeroed and synced first, so that no later open takes it for part
    /// of the log (a purged segment left with its header could come back
    /// after a crash while a newer one, deleted, did not).
    fn retire(&mut self, mut s: Segment) -> Result<(), LogError> {
        let r = s.invalidate();
        self.release(s);
        r
    }

    /// Keeps a segment no longer live (already invalid on disk) for
    /// reuse, or deletes it.
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
                let r = self.retire(s);
                self.poison(r)?;
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

    /// Empties the log, durably, and makes the next append take
    /// `before.index + 1` (1 when `before` is none), below or above where
    /// it stood: a follower's log that restarts after a snapshot.
    pub fn reset(&mut self, before: Option<LogId>) -> Result<(), LogError> {
        self.check()?;
        while let Some(mut s) = self.live.pop_back() {
            let r = s.invalidate();
            self.release(s);
            self.poison(r)?;
        }
        self.purged = before.filter(|b| b.index > 0);
        self.last = self.purged;
        Ok(())
    }

    /// Directory of the log's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
