//! One segment file: a header, then records back to back, then an end
//! marker (a zeroed record header), then zeros or stale bytes of an
//! earlier use. The file is extended with written zeros a chunk ahead of
//! its records, so that a record is an overwrite in place and the
//! fdatasync that makes it durable has no file size or allocation to
//! commit (measured: `tablix bench log`).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use crate::error::LogError;
use crate::power::PowerModel;
use crate::record::{self, HEADER_BYTES, Header, RECORD_HEADER_BYTES, RecordHeader, Salt};

/// Bytes written as zeros ahead of the records at a time.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;

/// The unit a tight extension rounds to.
const PAGE_BYTES: u64 = 4096;

/// Records buffered before they are written out, short of a sync.
const WRITE_BEHIND_BYTES: usize = 1 << 20;

/// The end marker: a record header of zeros, which never checks.
const END: [u8; RECORD_HEADER_BYTES] = [0; RECORD_HEADER_BYTES];

/// How a scan of a segment ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScanEnd {
    /// At an end marker, or at the end of the file.
    Clean,
    /// At bytes that are neither an entry nor an end marker: a write
    /// that a crash tore, or damage. `later` is the last index of entries
    /// that still check after those bytes: a crash that kills the
    /// process leaves a prefix of its last write, never such entries, so
    /// they mean damage, or a power failure that kept some pages of an
    /// unsynced write and lost others. Which of the two is not in the
    /// bytes.
    Torn { offset: u64, later: Option<u64> },
}

pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    file: File,
    pub(crate) header: Header,
    /// Offset of each entry's record, from `header.first_index` on.
    offsets: Vec<u64>,
    /// Term of the last entry (`header.prev_term` when there is none).
    pub(crate) last_term: u64,
    /// Records encoded and not yet written, which start at `buf_at`.
    buf: Vec<u8>,
    buf_at: u64,
    /// Bytes of the file.
    len: u64,
    /// Written since the last fdatasync.
    dirty: bool,
    /// Crash tests' model of power loss, if any.
    power: Option<Arc<PowerModel>>,
}

fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], at: u64) -> Result<(), LogError> {
    file.read_exact_at(buf, at)
        .map_err(|e| LogError::io(path, "reading", e))
}

impl Segment {
    /// Creates a segment file with `header` and no entries.
    pub(crate) fn create(
        path: PathBuf,
        header: Header,
        power: Option<Arc<PowerModel>>,
    ) -> Result<Segment, LogError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| LogError::io(&path, "creating", e))?;
        let mut s = Segment {
            path,
            file,
            header,
            offsets: Vec::new(),
            last_term: header.prev_term,
            buf: Vec::new(),
            buf_at: HEADER_BYTES,
            len: 0,
            dirty: true,
            power,
        };
        // The new file's name is made durable before any entry in it is.
        let dir_synced = s
            .path
            .parent()
            .ok_or_else(|| std::io::Error::other("a segment path without a directory"))
            .and_then(File::open)
            .and_then(|d| d.sync_all())
            .map_err(|e| LogError::io(&s.path, "syncing the directory", e));
        if let Err(e) = dir_synced.and_then(|()| s.restart(header)) {
            let _ = std::fs::remove_file(&s.path);
            return Err(e);
        }
        Ok(s)
    }

    /// Opens an existing segment file and reads its entries: `None` for a
    /// file without a valid header (a free segment). A segment opened
    /// without `writable` is only read.
    pub(crate) fn open(
        path: PathBuf,
        writable: bool,
        power: Option<Arc<PowerModel>>,
    ) -> Result<Option<(Segment, ScanEnd)>, LogError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(&path)
            .map_err(|e| LogError::io(&path, "opening", e))?;
        // The header first: a free segment's bytes are not read.
        let mut head = [0u8; HEADER_BYTES as usize];
        match file.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(LogError::io(&path, "reading", e)),
        }
        let Some(header) = Header::decode(&head) else {
            return Ok(None);
        };
        let mut bytes = head.to_vec();
        file.read_to_end(&mut bytes)
            .map_err(|e| LogError::io(&path, "reading", e))?;
        let len = bytes.len() as u64;
        let salt = header.salt();
        let mut offsets = Vec::new();
        let mut last_term = header.prev_term;
        let mut pos = HEADER_BYTES as usize;
        let torn = |pos: usize, expected: u64, last_term: u64| ScanEnd::Torn {
            offset: pos as u64,
            later: if header.salted {
                entries_after(&bytes, pos, expected, last_term, salt)
            } else {
                None
            },
        };
        let end = loop {
            let expected = header.first_index + offsets.len() as u64;
            let Some(raw) = bytes.get(pos..pos + RECORD_HEADER_BYTES) else {
                break if bytes[pos.min(bytes.len())..].iter().all(|b| *b == 0) {
                    ScanEnd::Clean
                } else {
                    torn(pos, expected, last_term)
                };
            };
            let raw: &[u8; RECORD_HEADER_BYTES] = raw.try_into().map_err(|_| LogError::Io {
                path: path.clone(),
                op: "scanning",
                cause: std::io::ErrorKind::InvalidData.into(),
            })?;
            if raw == &END {
                break ScanEnd::Clean;
            }
            let h = RecordHeader::decode(raw);
            let start = pos + RECORD_HEADER_BYTES;
            let payload = bytes.get(start..start.saturating_add(h.len as usize));
            match payload {
                Some(p) if h.index == expected && h.checks(salt, raw, p) => {
                    offsets.push(pos as u64);
                    last_term = h.term;
                    pos = start + p.len();
                }
                _ => break torn(pos, expected, last_term),
            }
        };
        let s = Segment {
            path,
            file,
            header,
            offsets,
            last_term,
            buf: Vec::new(),
            buf_at: pos as u64,
            len,
            // What a crashed process wrote may not be on disk yet: the
            // first sync after opening makes it so.
            dirty: true,
            power,
        };
        Ok(Some((s, end)))
    }

    /// Opens a file without a valid header as a free segment, to be
    /// restarted before use.
    pub(crate) fn open_free(
        path: PathBuf,
        power: Option<Arc<PowerModel>>,
    ) -> Result<Segment, LogError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| LogError::io(&path, "opening", e))?;
        let len = file
            .metadata()
            .map_err(|e| LogError::io(&path, "opening", e))?
            .len();
        let header = Header::new(0, 0, 0);
        Ok(Segment {
            path,
            file,
            header,
            offsets: Vec::new(),
            last_term: 0,
            buf: Vec::new(),
            buf_at: HEADER_BYTES,
            len,
            dirty: false,
            power,
        })
    }

    /// Entries the segment holds.
    pub(crate) fn count(&self) -> u64 {
        self.offsets.len() as u64
    }

    /// Index of the entry after its last.
    pub(crate) fn next_index(&self) -> u64 {
        self.header.first_index + self.count()
    }

    /// Where the next record goes.
    fn end(&self) -> u64 {
        self.buf_at + self.buf.len() as u64
    }

    /// Bytes of records the segment holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.end() - HEADER_BYTES
    }

    /// Whether a record of `payload` bytes fits below `limit`. A segment
    /// without entries takes one of any size.
    pub(crate) fn fits(&self, payload: usize, limit: u64) -> bool {
        self.offsets.is_empty() || self.end() + (RECORD_HEADER_BYTES * 2 + payload) as u64 <= limit
    }

    pub(crate) fn append(&mut self, term: u64, index: u64, payload: &[u8]) -> Result<(), LogError> {
        debug_assert_eq!(index, self.next_index());
        self.offsets.push(self.end());
        record::encode(&mut self.buf, self.header.salt(), term, index, payload);
        self.last_term = term;
        if self.buf.len() >= WRITE_BEHIND_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    /// Forgets the entries just appended from `index` on, before they
    /// were written (an append that failed part-way).
    pub(crate) fn forget_from(&mut self, index: u64, term_before: u64) {
        let i = (index - self.header.first_index) as usize;
        if let Some(&at) = self.offsets.get(i)
            && at >= self.buf_at
        {
            self.buf.truncate((at - self.buf_at) as usize);
            self.offsets.truncate(i);
            self.last_term = term_before;
        }
    }

    /// Writes the buffered records and an end marker after them. A write
    /// that passes the file's end extends it with the records themselves
    /// (bulk data is written once, not over zeros); a small one is then
    /// followed by zeros a chunk ahead, so that the next records overwrite
    /// in place. A write that fails for want of space leaves the segment
    /// as it was (its end marker restored) and does not poison the log.
    pub(crate) fn write_out(&mut self) -> Result<(), LogError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let end = self.end();
        let need = end + RECORD_HEADER_BYTES as u64;
        let grows = need > self.len;
        self.buf.extend_from_slice(&END);
        let r = self.write_at(&self.buf, self.buf_at);
        self.buf.truncate(self.buf.len() - RECORD_HEADER_BYTES);
        if let Err(e) = r {
            let full = e.kind() == std::io::ErrorKind::StorageFull;
            if grows {
                let _ = self.set_len(self.len);
            }
            let restored = self.write_at(&END, self.buf_at).is_ok();
            let op = if full && restored {
                "extending"
            } else {
                "writing"
            };
            return Err(LogError::io(&self.path, op, e));
        }
        if grows {
            self.len = need;
            if self.buf.len() < (CHUNK_BYTES / 4) as usize {
                // Zeros ahead are an optimization: without them the next
                // records extend the file themselves.
                let _ = self.extend_to(need + 1);
            }
        }
        self.buf_at = end;
        self.buf.clear();
        self.dirty = true;
        Ok(())
    }

    /// Extends the file with written zeros to at least `need` bytes, a
    /// chunk at a time; on a disk too full for a chunk, to `need` alone
    /// (rounded to a page). On failure (a full disk) nothing the segment
    /// holds changed.
    fn extend_to(&mut self, need: u64) -> Result<(), LogError> {
        if need <= self.len {
            return Ok(());
        }
        let chunked = need.max(self.len + CHUNK_BYTES).div_ceil(CHUNK_BYTES) * CHUNK_BYTES;
        match self.zero_to(chunked) {
            Err(LogError::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::StorageFull => {
                // Give back what the chunk's partial write took.
                let _ = self.set_len(self.len);
                let r = self.zero_to(need.div_ceil(PAGE_BYTES) * PAGE_BYTES);
                if r.is_err() {
                    let _ = self.set_len(self.len);
                }
                r
            }
            r => r,
        }
    }

    fn zero_to(&mut self, target: u64) -> Result<(), LogError> {
        let zeros = vec![0u8; CHUNK_BYTES as usize];
        let mut at = self.len;
        while at < target {
            let n = (target - at).min(CHUNK_BYTES) as usize;
            self.write_at(&zeros[..n], at)
                .map_err(|e| LogError::io(&self.path, "extending", e))?;
            at += n as u64;
        }
        self.len = target;
        self.dirty = true;
        Ok(())
    }

    /// Makes everything written durable (fdatasync).
    pub(crate) fn sync(&mut self) -> Result<(), LogError> {
        let in_place = self.end() + RECORD_HEADER_BYTES as u64 <= self.len;
        if !self.dirty && !self.buf.is_empty() && in_place {
            return self.write_durably();
        }
        self.write_out()?;
        if self.dirty {
            self.halted()
                .and_then(|()| self.file.sync_data())
                .map_err(|e| LogError::io(&self.path, "syncing", e))?;
            if let Some(p) = &self.power {
                p.synced(&self.path);
            }
            self.dirty = false;
        }
        Ok(())
    }

    /// The records buffered are all the segment holds unsynced, and they
    /// go over bytes already allocated: one write that is durable when it
    /// returns (`RWF_DSYNC`, what `tablix bench log` measured as the
    /// cheapest sync) does what a write and an fdatasync would.
    fn write_durably(&mut self) -> Result<(), LogError> {
        let end = self.end();
        self.buf.extend_from_slice(&END);
        let r = self.halted().and_then(|()| {
            if let Some(p) = &self.power {
                p.before_write(&self.file, &self.path, self.buf_at, self.buf.len() as u64)?;
            }
            let slice = [std::io::IoSlice::new(&self.buf)];
            let n = rustix::io::pwritev2(
                &self.file,
                &slice,
                self.buf_at,
                rustix::io::ReadWriteFlags::DSYNC,
            )?;
            if n < self.buf.len() {
                // A short write: the rest the usual way.
                self.file
                    .write_all_at(&self.buf[n..], self.buf_at + n as u64)?;
                self.file.sync_data()?;
            }
            Ok(())
        });
        self.buf.truncate(self.buf.len() - RECORD_HEADER_BYTES);
        r.map_err(|e| LogError::io(&self.path, "syncing", e))?;
        if let Some(p) = &self.power {
            p.synced(&self.path);
        }
        self.buf_at = end;
        self.buf.clear();
        Ok(())
    }

    /// Reads entry `index` back: its term and payload.
    pub(crate) fn read(&self, index: u64) -> Result<(u64, Vec<u8>), LogError> {
        let i = index - self.header.first_index;
        let at = self.offsets[i as usize];
        let corrupt = |detail: &str| LogError::Corrupt {
            path: self.path.clone(),
            index,
            offset: at,
            detail: detail.to_string(),
        };
        let mut raw = [0u8; RECORD_HEADER_BYTES];
        if at >= self.buf_at {
            let from = (at - self.buf_at) as usize;
            raw.copy_from_slice(&self.buf[from..from + RECORD_HEADER_BYTES]);
        } else {
            read_exact_at(&self.file, &self.path, &mut raw, at)?;
        }
        let h = RecordHeader::decode(&raw);
        if h.index != index {
            return Err(corrupt(&format!("it is numbered {}", h.index)));
        }
        let start = at + RECORD_HEADER_BYTES as u64;
        let mut payload = vec![0u8; h.len as usize];
        if start >= self.buf_at {
            let from = (start - self.buf_at) as usize;
            let src = self
                .buf
                .get(from..from + payload.len())
                .ok_or_else(|| corrupt("its length passes the end"))?;
            payload.copy_from_slice(src);
        } else {
            read_exact_at(&self.file, &self.path, &mut payload, start)?;
        }
        if !h.checks(self.header.salt(), &raw, &payload) {
            return Err(corrupt("its checksum does not match"));
        }
        Ok((h.term, payload))
    }

    /// Removes the entries from `index` on: their records are overwritten
    /// with zeros (the first of them an end marker; synced by the caller),
    /// so none is read again, nor found after a later torn write.
    pub(crate) fn truncate_from(&mut self, index: u64, term_before: u64) -> Result<(), LogError> {
        let i = (index - self.header.first_index) as usize;
        let Some(&at) = self.offsets.get(i) else {
            return Ok(());
        };
        self.offsets.truncate(i);
        self.last_term = term_before;
        if at >= self.buf_at {
            self.buf.truncate((at - self.buf_at) as usize);
            return Ok(());
        }
        let written = self.buf_at;
        self.buf.clear();
        self.buf_at = at;
        self.zero_range(at, written + RECORD_HEADER_BYTES as u64, "truncating")
    }

    /// Overwrites the segment's bytes from `at` (where its records end)
    /// to the end of the file with zeros: what a scan found past damage
    /// is not taken for entries again. Synced by the caller.
    pub(crate) fn zero_from(&mut self, at: u64) -> Result<(), LogError> {
        debug_assert!(self.buf.is_empty() && at == self.buf_at);
        self.zero_range(at, self.len, "discarding damaged entries")
    }

    fn zero_range(&mut self, from: u64, to: u64, op: &'static str) -> Result<(), LogError> {
        let zeros = vec![0u8; CHUNK_BYTES as usize];
        let to = to.min(self.len).max(from + RECORD_HEADER_BYTES as u64);
        // The zeroed record header may end past the tracked length: the
        // file is extended first, so its length stays the tracked one.
        self.extend_to(to)?;
        let mut at = from;
        while at < to {
            let n = (to - at).min(CHUNK_BYTES) as usize;
            self.write_at(&zeros[..n], at)
                .map_err(|e| LogError::io(&self.path, op, e))?;
            at += n as u64;
        }
        self.dirty = true;
        Ok(())
    }

    /// Starts the segment over with `header` and no entries, keeping its
    /// bytes (a recycled segment is overwritten in place).
    pub(crate) fn restart(&mut self, header: Header) -> Result<(), LogError> {
        self.extend_to(HEADER_BYTES + RECORD_HEADER_BYTES as u64)?;
        let mut first = header.encode().to_vec();
        first.extend_from_slice(&END);
        self.write_at(&first, 0)
            .map_err(|e| LogError::io(&self.path, "starting a segment", e))?;
        self.header = header;
        self.offsets.clear();
        self.last_term = header.prev_term;
        self.buf.clear();
        self.buf_at = HEADER_BYTES;
        self.dirty = true;
        Ok(())
    }

    /// Makes the segment a free one on disk: its header zeroed and synced,
    /// so that no later scan takes its entries for part of the log.
    pub(crate) fn invalidate(&mut self) -> Result<(), LogError> {
        self.write_at(&[0u8; HEADER_BYTES as usize], 0)
            .map_err(|e| LogError::io(&self.path, "freeing a segment", e))?;
        self.dirty = true;
        self.offsets.clear();
        self.buf.clear();
        self.sync()
    }

    /// Fails once a crash test's machine has lost power.
    fn halted(&self) -> std::io::Result<()> {
        match &self.power {
            Some(p) if p.is_halted() => Err(std::io::Error::other(
                "the machine lost power (a crash test)",
            )),
            _ => Ok(()),
        }
    }

    /// Every write to the file goes through here, so a crash test's power
    /// model sees it.
    fn write_at(&self, bytes: &[u8], at: u64) -> std::io::Result<()> {
        self.halted()?;
        if let Some(p) = &self.power {
            p.before_write(&self.file, &self.path, at, bytes.len() as u64)?;
        }
        self.file.write_all_at(bytes, at)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.halted()?;
        if let Some(p) = &self.power {
            p.before_write(&self.file, &self.path, len, 0)?;
        }
        self.file.set_len(len)
    }

    /// Where its records end (the next record goes there).
    pub(crate) fn records_end(&self) -> u64 {
        self.end()
    }

    pub(crate) fn remove(self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("removing the free log segment {}: {e}", self.path.display());
        }
    }
}

/// After bytes at `from` that are no record (the next entry expected was
/// `expected`), the last index of a run of entries that check further on,
/// if there is one. Records are not aligned, so every offset is tried;
/// the index, which must lie within what the rest of the bytes can hold,
/// and the term rule out nearly all before any CRC is computed.
fn entries_after(
    bytes: &[u8],
    from: usize,
    expected: u64,
    last_term: u64,
    salt: Salt,
) -> Option<u64> {
    let at = |pos: usize| -> Option<(RecordHeader, usize)> {
        let raw: &[u8; RECORD_HEADER_BYTES] =
            bytes.get(pos..pos + RECORD_HEADER_BYTES)?.try_into().ok()?;
        let h = RecordHeader::decode(raw);
        let start = pos + RECORD_HEADER_BYTES;
        let payload = bytes.get(start..start.checked_add(h.len as usize)?)?;
        h.checks(salt, raw, payload)
            .then_some((h, start + payload.len()))
    };
    let most = (bytes.len() / RECORD_HEADER_BYTES) as u64;
    for pos in from + 1..bytes.len().saturating_sub(RECORD_HEADER_BYTES - 1) {
        let raw = &bytes[pos..pos + RECORD_HEADER_BYTES];
        let index = u64::from_le_bytes(raw[16..24].try_into().ok()?);
        let term = u64::from_le_bytes(raw[8..16].try_into().ok()?);
        if index <= expected || index - expected > most || term < last_term {
            continue;
        }
        let Some((h, mut next)) = at(pos) else {
            continue;
        };
        let mut last = h.index;
        while let Some((h, after)) = at(next) {
            if h.index != last + 1 {
                break;
            }
            last = h.index;
            next = after;
        }
        return Some(last);
    }
    None
}
