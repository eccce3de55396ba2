//! The store's side of the command log: replicated Commands encoded as
//! log entries, and the last applied entry recorded in the state.
//!
//! Every replicated Command is appended before it is applied, and the
//! transaction that applies it records its id (`applied_index`,
//! `applied_term` in `tablix_meta`), so after a crash the state says
//! exactly which entries it holds and the rest are applied again from the
//! log, each once. The log is synced before any transaction that applies
//! its entries commits: the state never holds a change its log lacks.

use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use tablix_fs::FsOp;
use tablix_log::{Log, LogConfig, LogError, LogId, Recovered};

use crate::apply_log::{self, Appliers, EntryPayload, LogEntry};
use crate::command::{ReplicatedCommand, SqlCommand, Stamp, Stamped, TxCommit};
use crate::config::{LogKeeper, StoreConfig};
use crate::error::{SqliteFailure, StoreError};
use crate::fs_writer::FsWriter;
use crate::sql_writer::SqlWriter;
use crate::tx_writer::TxWriter;
use crate::write_point::{WritePoint, WriteProbe};

/// A typed failure of the node behind `e`, for the state machine's stop.
pub(crate) fn failure_of(e: &StoreError) -> SqliteFailure {
    match e {
        StoreError::Commit(f) | StoreError::Failed(f) | StoreError::PendingLost(f) => f.clone(),
        StoreError::Stopped { cause, .. } => cause.clone(),
        StoreError::Log(f) if f.disk_full => {
            SqliteFailure::with_code(rusqlite::ffi::SQLITE_FULL, &f.message)
        }
        StoreError::Log(f) => SqliteFailure::with_code(rusqlite::ffi::SQLITE_IOERR, &f.message),
        other => SqliteFailure::without_code(other.to_string()),
    }
}

/// The first byte of an entry's payload: the encoding's version. 1: the
/// postcard of a `Stamped<ReplicatedCommand>`.
const FORMAT: u8 = 1;

/// Format 3: the same postcard, compressed (LZ4 block, behind its length
/// as a little-endian u32). (Format 2 is openraft's entries, tablix-raft.)
const FORMAT_LZ4: u8 = 3;

/// Entries from this size on are compressed when that pays: a file's
/// write is logged, and also written to the WAL and then the database,
/// so on a disk-bound write every byte the log saves is a third of the
/// traffic (measured with Bonnie++, whose blocks are mostly zeros).
const COMPRESS_FROM: usize = 4096;

/// What a compressed entry must save of its size to be kept compressed
/// (eighths): a first sample of this many bytes that does not shrink
/// that much stops the attempt on incompressible data early.
const KEEP_EIGHTHS: usize = 7;
const SAMPLE: usize = 4096;

/// Compresses `body` behind [`FORMAT_LZ4`] into `out` when that saves at
/// least an eighth of it; false (and `out` unspecified) otherwise.
fn compress(body: &[u8], out: &mut Vec<u8>) -> bool {
    if body.len() < COMPRESS_FROM || body.len() > u32::MAX as usize {
        return false;
    }
    let sample = &body[..SAMPLE.min(body.len())];
    out.clear();
    out.resize(lz4_flex::block::get_maximum_output_size(sample.len()), 0);
    match lz4_flex::block::compress_into(sample, out) {
        Ok(n) if n <= sample.len() / 8 * KEEP_EIGHTHS => {}
        _ => return false,
    }
    out.clear();
    out.push(FORMAT_LZ4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.resize(5 + lz4_flex::block::get_maximum_output_size(body.len()), 0);
    match lz4_flex::block::compress_into(body, &mut out[5..]) {
        Ok(n) if n <= body.len() / 8 * KEEP_EIGHTHS => {
            out.truncate(5 + n);
            true
        }
        _ => false,
    }
}

/// The postcard bytes of a [`FORMAT_LZ4`] entry's body (after the format
/// byte). The length it claims is bounded by LZ4's greatest ratio, so a
/// damaged entry never asks for more memory than its size allows.
fn decompress(body: &[u8]) -> Result<Vec<u8>, String> {
    let (len, packed) = body
        .split_first_chunk::<4>()
        .ok_or("its compressed body has no length")?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > packed.len().saturating_mul(255).saturating_add(16) {
        return Err(format!(
            "it claims {len} bytes from {} compressed",
            packed.len()
        ));
    }
    lz4_flex::block::decompress(packed, len).map_err(|e| e.to_string())
}

/// The term of a single node's entries (replication brings elections).
pub(crate) const SINGLE_NODE_TERM: u64 = 1;

/// A replicated Command borrowed for encoding: the same bytes as
/// `Stamped<ReplicatedCommand>`, without copying the Command.
#[derive(Serialize)]
enum CommandRef<'a> {
    Sql(&'a SqlCommand),
    Fs(&'a FsOp),
    Tx(&'a TxCommit),
}

#[derive(Serialize)]
struct StampedRef<'a> {
    stamp: Stamp,
    command: CommandRef<'a>,
}

pub(crate) struct CommandLog {
    /// None when replication keeps the log ([`LogKeeper::Replication`]):
    /// the store then appends nothing and only tracks what it applied.
    log: Option<Log>,
    scratch: Vec<u8>,
    /// A compressed entry, built beside `scratch`.
    packed: Vec<u8>,
    /// The last entry a committed transaction applied.
    applied: Option<LogId>,
    /// Set once the state machine stopped: why, typed.
    stopped: Option<SqliteFailure>,
    probe: WriteProbe,
}

impl CommandLog {
    /// Opens the log of a state that holds the entries up to
    /// `state_applied`. Damage in the log's middle is cut when the state
    /// holds every entry it hides, or the configuration says to discard
    /// it; otherwise the open is refused, changing nothing.
    pub(crate) fn open(
        config: &StoreConfig,
        state_applied: Option<LogId>,
    ) -> Result<(CommandLog, Recovered), StoreError> {
        if config.log_keeper == LogKeeper::Replication {
            return Ok((
                CommandLog {
                    log: None,
                    scratch: Vec::new(),
                    packed: Vec::new(),
                    applied: state_applied,
                    stopped: None,
                    probe: config.write_probe.clone(),
                },
                Recovered::default(),
            ));
        }
        let dir = config.log_dir();
        let log_config = |discard_damaged| LogConfig {
            segment_bytes: config.log_segment_bytes,
            power: config.log_power.clone(),
            discard_damaged,
            ..LogConfig::default()
        };
        let a = state_applied.map_or(0, |a| a.index);
        let (log, recovered) = match Log::open(&dir, log_config(config.discard_damaged_log)) {
            Err(LogError::Damaged(d)) if d.through <= a => Log::open(&dir, log_config(true))?,
            Err(LogError::Damaged(d)) => {
                return Err(StoreError::Open(format!(
                    "the command log is damaged: {d}. The state holds entries up to {a}, so entries {}..={} cannot be applied, and tablix will not skip them; nothing was changed. Keep a copy of {}, then run `tablix fsck` on it to discard the damaged entries and every one after them (they are lost) and start from the rest",
                    d.index.max(a + 1),
                    d.through,
                    config.data_dir.display()
                )));
            }
            r => r?,
        };
        Ok((
            CommandLog {
                log: Some(log),
                scratch: Vec::new(),
                packed: Vec::new(),
                applied: None,
                stopped: None,
                probe: config.write_probe.clone(),
            },
            recovered,
        ))
    }

    /// Refuses with [`StoreError::Stopped`] once the state machine stopped.
    pub(crate) fn running(&self) -> Result<(), StoreError> {
        match &self.stopped {
            Some(cause) => Err(self.stopped_error(cause.clone())),
            None => Ok(()),
        }
    }

    fn stopped_error(&self, cause: SqliteFailure) -> StoreError {
        StoreError::Stopped {
            applied: self.applied.map_or(0, |a| a.index),
            cause,
        }
    }

    /// Stops the state machine: entries are logged that the state lacks
    /// and cannot take now. Every later write is refused; a restart
    /// applies them from the log.
    pub(crate) fn stop(&mut self, cause: SqliteFailure) -> StoreError {
        tracing::error!(
            "the state machine stopped at entry {} of the command log: {cause}; restart tablix to apply the rest",
            self.applied.map_or(0, |a| a.index)
        );
        let e = self.stopped_error(cause.clone());
        self.stopped.get_or_insert(cause);
        e
    }

    /// Takes back entries from `since` on that were logged for a group
    /// that failed on this node; if they cannot be taken back, the state
    /// machine stops (they would be applied at restart).
    pub(crate) fn unlog_or_stop(&mut self, since: u64, cause: &StoreError) {
        if let Err(e) = self.unlog(since) {
            let cause = match cause.sqlite_code() {
                Some(_) => failure_of(cause),
                None => SqliteFailure::without_code(format!("{cause}; taking it back: {e}")),
            };
            self.stop(cause);
        }
    }

    /// Runs the write probe (see [`WritePoint`]).
    pub(crate) fn at(&self, point: WritePoint) {
        self.probe.at(point);
    }

    pub(crate) fn probe(&self) -> &WriteProbe {
        &self.probe
    }

    /// The state now holds every entry up to `id`, committed.
    pub(crate) fn applied_to(&mut self, id: LogId) {
        self.applied = Some(id);
    }

    /// The state was replaced (a snapshot installed): it now holds the
    /// entries up to `id`, which may be before what it held.
    pub(crate) fn reset_applied(&mut self, id: Option<LogId>) {
        self.applied = id;
    }

    pub(crate) fn applied(&self) -> Option<LogId> {
        self.applied
    }

    /// The id of the `n`th entry (1-based) of a group starting at `first`.
    pub(crate) fn id_at(first: u64, n: usize) -> LogId {
        LogId {
            term: SINGLE_NODE_TERM,
            index: first + n as u64 - 1,
        }
    }

    fn append(&mut self, command: CommandRef<'_>, stamp: Stamp) -> Result<LogId, StoreError> {
        self.scratch.clear();
        self.scratch.push(FORMAT);
        let encoded = postcard::to_extend(
            &StampedRef { stamp, command },
            std::mem::take(&mut self.scratch),
        )
        .map_err(|e| StoreError::Apply(format!("encoding a log entry: {e}")))?;
        self.scratch = encoded;
        let log = self.log.as_mut().ok_or(StoreError::NotProposer)?;
        let id = LogId {
            term: SINGLE_NODE_TERM,
            index: log.next_index(),
        };
        let payload = if compress(&self.scratch[1..], &mut self.packed) {
            &self.packed
        } else {
            &self.scratch
        };
        log.append(id, payload)?;
        Ok(id)
    }

    pub(crate) fn append_fs(&mut self, c: &Stamped<FsOp>) -> Result<LogId, StoreError> {
        self.append(CommandRef::Fs(&c.command), c.stamp)
    }

    pub(crate) fn append_sql(&mut self, c: &Stamped<SqlCommand>) -> Result<LogId, StoreError> {
        self.append(CommandRef::Sql(&c.command), c.stamp)
    }

    pub(crate) fn append_tx(&mut self, c: &Stamped<TxCommit>) -> Result<LogId, StoreError> {
        self.append(CommandRef::Tx(&c.command), c.stamp)
    }

    /// Appends `items` with `append` and syncs them, running the probe
    /// after appending; returns the index of the first. On failure what was
    /// appended is taken back (see [`Self::unlog_or_stop`]).
    pub(crate) fn append_synced<T>(
        &mut self,
        items: &[T],
        append: impl Fn(&mut Self, &T) -> Result<LogId, StoreError>,
    ) -> Result<u64, StoreError> {
        let first = self.next_index();
        let logged = (|| {
            for item in items {
                append(self, item)?;
            }
            self.at(WritePoint::Appended);
            self.sync()
        })();
        match logged {
            Ok(()) => Ok(first),
            Err(e) => {
                self.unlog_or_stop(first, &e);
                Err(e)
            }
        }
    }

    /// Makes every appended entry durable.
    pub(crate) fn sync(&mut self) -> Result<(), StoreError> {
        match &mut self.log {
            Some(log) => Ok(log.sync()?),
            None => Ok(()),
        }
    }

    /// Takes back the entries from `since` on, which were appended but not
    /// applied and never acknowledged (their group failed on this node).
    pub(crate) fn unlog(&mut self, since: u64) -> Result<(), StoreError> {
        match &mut self.log {
            Some(log) => Ok(log.truncate(since)?),
            None => Ok(()),
        }
    }

    /// Whether the store keeps this log (else replication does, and the
    /// store only applies what it is handed).
    pub(crate) fn is_kept(&self) -> bool {
        self.log.is_some()
    }

    pub(crate) fn next_index(&self) -> u64 {
        match &self.log {
            Some(log) => log.next_index(),
            None => self.applied.map_or(1, |a| a.index + 1),
        }
    }

    pub(crate) fn last(&self) -> Option<LogId> {
        match &self.log {
            Some(log) => log.last(),
            None => self.applied,
        }
    }

    pub(crate) fn first_index(&self) -> u64 {
        match &self.log {
            Some(log) => log.first_index(),
            None => self.next_index(),
        }
    }

    /// Bytes the log holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.log.as_ref().map_or(0, Log::bytes)
    }

    /// Forgets the entries the state holds durably, up to `upto`.
    pub(crate) fn purge(&mut self, upto: LogId) -> Result<(), StoreError> {
        match &mut self.log {
            Some(log) => Ok(log.purge(upto)?),
            None => Ok(()),
        }
    }

    /// The entries from `from` on, decoded.
    pub(crate) fn read_from(
        &self,
        from: u64,
    ) -> Result<Vec<(LogId, Stamped<ReplicatedCommand>)>, StoreError> {
        let Some(log) = &self.log else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for e in log.entries(from..log.next_index())? {
            out.push((e.id, decode(e.id, &e.payload)?));
        }
        Ok(out)
    }
}

fn decode(id: LogId, payload: &[u8]) -> Result<Stamped<ReplicatedCommand>, StoreError> {
    let bad = |what: String| {
        StoreError::from(LogError::Corrupt {
            path: std::path::PathBuf::from("log"),
            index: id.index,
            offset: 0,
            detail: what,
        })
    };
    match payload.split_first() {
        Some((&FORMAT, rest)) => {
            postcard::from_bytes(rest).map_err(|e| bad(format!("its Command does not decode: {e}")))
        }
        Some((&FORMAT_LZ4, rest)) => {
            let plain =
                decompress(rest).map_err(|e| bad(format!("it does not decompress: {e}")))?;
            postcard::from_bytes(&plain)
                .map_err(|e| bad(format!("its Command does not decode: {e}")))
        }
        Some((v, _)) => Err(bad(format!(
            "it is written in format {v}, which this build does not know"
        ))),
        None => Err(bad("it is empty".into())),
    }
}

/// Brings the state up to the log at open: applies the entries after the
/// last one the state holds, in order, in groups of one kind, each group
/// recording its last entry. A log that ends before the state (its tail
/// was lost) continues after the state; a log that starts after it (its
/// middle was lost) is refused: entries would be skipped.
pub(crate) fn replay(
    log: &mut CommandLog,
    fs: &FsWriter,
    sql: &SqlWriter,
    tx: &TxWriter,
    config: &StoreConfig,
) -> Result<(), StoreError> {
    let applied = applied(fs.connection())?;
    let a = applied.map_or(0, |a| a.index);
    log.applied = applied;
    if !log.is_kept() {
        // Replication re-applies what the state lacks from its own log.
        return Ok(());
    }
    if log.first_index() > a + 1 {
        return Err(StoreError::Open(format!(
            "the command log in {} starts at entry {}, but the state holds entries only up to {a}: entries {}..={} are missing, so tablix will not skip them. Keep a copy of the data directory; moving the log directory aside makes tablix start from the state as it is",
            config.log_dir().display(),
            log.first_index(),
            a + 1,
            log.first_index() - 1
        )));
    }
    let last = log.last().map_or(0, |l| l.index);
    if last < a {
        if let Some(applied) = applied {
            tracing::warn!(
                "the command log ends at entry {last}, before the state's last entry {a} (its tail was lost or the log removed); new entries continue from {}",
                a + 1
            );
            log.purge(applied)?;
        }
        return Ok(());
    }
    let entries = log.read_from(a + 1)?;
    if entries.is_empty() {
        return Ok(());
    }
    // Entries a crashed process wrote but never synced are made durable
    // before the state holds them.
    log.sync()?;
    let count = entries.len();
    let limits = config.write_limits();
    let to = Appliers {
        fs,
        sql,
        tx,
        limits: &limits,
        budget: config.max_result_bytes,
        probe: &config.write_probe,
        watch: None,
        dedup: None,
        recorded: std::cell::RefCell::new(None),
        settled: false,
    };
    let entries = entries
        .into_iter()
        .map(|(id, c)| LogEntry {
            id,
            payload: EntryPayload::Commands(vec![c]),
        })
        .collect();
    apply_log::apply(&to, entries, |id| log.applied = Some(id)).map_err(|h| {
        StoreError::Open(format!(
            "applying entry {} of the command log at start failed: {}; nothing after entry {} is applied, and the next start tries again",
            h.at,
            h.error,
            h.at - 1
        ))
    })?;
    log.applied = log.last();
    tracing::info!(
        "applied {count} entries of the command log that the state lacked (entries {}..={last})",
        a + 1
    );
    Ok(())
}

/// Records in the open transaction that the state holds every entry up
/// to `id`.
pub(crate) fn record_applied(conn: &Connection, id: LogId) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO main.tablix_meta(key, value) VALUES ('applied_index', ?1), ('applied_term', ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute([id.index as i64, id.term as i64])?;
    Ok(())
}

/// The last entry the state holds (none for a state no log entry built).
pub fn applied(conn: &Connection) -> rusqlite::Result<Option<LogId>> {
    let get = |key: &str| -> rusqlite::Result<Option<i64>> {
        conn.query_row(
            "SELECT value FROM main.tablix_meta WHERE key = ?1",
            [key],
            |r| r.get(0),
        )
        .optional()
    };
    Ok(match (get("applied_index")?, get("applied_term")?) {
        (Some(index), Some(term)) => Some(LogId {
            term: term as u64,
            index: index as u64,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Statement, Value};
    use crate::principal::Principal;

    #[test]
    fn entries_decode_to_the_commands_appended() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig::new(dir.path());
        let (mut log, _) = CommandLog::open(&config, None).unwrap();
        let stamp = Stamp {
            unix_nanos: 5,
            seed: 7,
        };
        let fs = Stamped::new(
            stamp,
            FsOp::Write {
                ino: 3,
                offset: 9,
                data: vec![1, 2, 3],
                kill_suidgid: false,
            },
        );
        let sql = Stamped::new(
            stamp,
            SqlCommand {
                statements: vec![Statement::with_params(
                    "INSERT INTO t VALUES (?)",
                    crate::command::Params::Positional(vec![Value::Blob(vec![0; 4])]),
                )],
                transaction: true,
                principal: Principal::root(),
            },
        );
        assert_eq!(log.append_fs(&fs).unwrap().index, 1);
        assert_eq!(log.append_sql(&sql).unwrap().index, 2);
        let read = log.read_from(1).unwrap();
        assert_eq!(
            read[0].1,
            Stamped::new(stamp, ReplicatedCommand::Fs(fs.command))
        );
        assert_eq!(
            read[1].1,
            Stamped::new(stamp, ReplicatedCommand::Sql(sql.command))
        );
    }

    fn write_of(data: Vec<u8>) -> Stamped<FsOp> {
        Stamped::new(
            Stamp {
                unix_nanos: 1,
                seed: 2,
            },
            FsOp::Write {
                ino: 9,
                offset: 4096,
                data,
                kill_suidgid: false,
            },
        )
    }

    #[test]
    fn large_compressible_entries_are_compressed_and_others_kept_plain() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig::new(dir.path());
        let (mut log, _) = CommandLog::open(&config, None).unwrap();
        // Bonnie++'s kind of block: a few ones, then zeros.
        let mut zeros = vec![0u8; 128 << 10];
        zeros[..7].fill(1);
        // Incompressible: xorshift bytes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..128 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let small = vec![0u8; 100];
        let written = [write_of(zeros), write_of(noise), write_of(small)];
        for w in &written {
            log.append_fs(w).unwrap();
        }
        let raw = log.log.as_ref().unwrap();
        let formats: Vec<u8> = (1..=3).map(|i| raw.entry(i).unwrap().payload[0]).collect();
        assert_eq!(formats, [FORMAT_LZ4, FORMAT, FORMAT]);
        assert!(raw.entry(1).unwrap().payload.len() < 4096);
        let read = log.read_from(1).unwrap();
        for (w, (_, r)) in written.iter().zip(read) {
            assert_eq!(
                r,
                Stamped::new(w.stamp, ReplicatedCommand::Fs(w.command.clone()))
            );
        }
    }

    #[test]
    fn a_compressed_entry_claiming_more_than_lz4_can_hold_is_refused() {
        let mut body = u32::MAX.to_le_bytes().to_vec();
        body.extend_from_slice(&[0x10, 0, 0]);
        let e = decompress(&body).unwrap_err();
        assert!(e.contains("claims"), "{e}");
        assert!(decompress(&[1, 2]).is_err());
    }
}
