//! Counters the store keeps about itself.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Default)]
pub(crate) struct Counters {
    pub commands: AtomicU64,
    pub failed_commands: AtomicU64,
    pub batches: AtomicU64,
    pub largest_batch: AtomicU64,
    pub failed_commits: AtomicU64,
    pub flushes: AtomicU64,
    pub reads: AtomicU64,
    pub wal_truncations: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            commands: get(&self.commands),
            failed_commands: get(&self.failed_commands),
            batches: get(&self.batches),
            largest_batch: get(&self.largest_batch),
            failed_commits: get(&self.failed_commits),
            flushes: get(&self.flushes),
            reads: get(&self.reads),
            wal_truncations: get(&self.wal_truncations),
            memory_locks: MemoryLockStats::default(),
            sqlite_heap_bytes: 0,
            sqlite_heap_peak_bytes: 0,
            statements_timed_out: 0,
            statements_cancelled: 0,
            statements_stopped_at_shutdown: 0,
        }
    }
}

/// A snapshot of the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Commands applied (committed or failed alone).
    pub commands: u64,
    /// Commands rolled back by their own error.
    pub failed_commands: u64,
    /// Group commits (SQLite write transactions).
    pub batches: u64,
    /// Most Commands one group commit carried.
    pub largest_batch: u64,
    /// Group commits whose COMMIT failed; none of their Commands were acknowledged.
    pub failed_commits: u64,
    /// Explicit fsyncs of the WAL (async mode and flush requests).
    pub flushes: u64,
    /// Read transactions run on the reader pools.
    pub reads: u64,
    /// Times the WAL outgrew its bound and was checkpointed and cut back.
    pub wal_truncations: u64,
    /// SQLite's heap now and at its highest (bytes).
    pub sqlite_heap_bytes: i64,
    pub sqlite_heap_peak_bytes: i64,
    /// User requests stopped past their time limit, because their client
    /// went away, and because the daemon stopped.
    pub statements_timed_out: u64,
    pub statements_cancelled: u64,
    pub statements_stopped_at_shutdown: u64,
    /// Lock waits on the memory database (its blocking VFS).
    pub memory_locks: MemoryLockStats,
}

/// How long connections of the memory database waited for its locks
/// (microseconds), and how often.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryLockStats {
    /// Readers that waited for a writer to finish.
    pub shared_waits: u64,
    pub shared_wait_us: u64,
    pub shared_wait_max_us: u64,
    /// Writers that waited for readers to finish (PENDING).
    pub exclusive_waits: u64,
    pub exclusive_wait_us: u64,
    pub exclusive_wait_max_us: u64,
    /// Writers that waited for the write-intent gate.
    pub gate_waits: u64,
    pub gate_wait_us: u64,
    pub gate_wait_max_us: u64,
    /// Write transactions.
    pub write_transactions: u64,
    /// SQLITE_BUSY returned (a write without the gate); stays 0.
    pub busy: u64,
}

impl From<tablix_vfs::MemLockStats> for MemoryLockStats {
    fn from(s: tablix_vfs::MemLockStats) -> MemoryLockStats {
        MemoryLockStats {
            shared_waits: s.shared_waits,
            shared_wait_us: s.shared_wait_ns / 1000,
            shared_wait_max_us: s.shared_wait_max_ns / 1000,
            exclusive_waits: s.exclusive_waits,
            exclusive_wait_us: s.exclusive_wait_ns / 1000,
            exclusive_wait_max_us: s.exclusive_wait_max_ns / 1000,
            gate_waits: s.gate_waits,
            gate_wait_us: s.gate_wait_ns / 1000,
            gate_wait_max_us: s.gate_wait_max_ns / 1000,
            write_transactions: s.transactions,
            busy: s.busy,
        }
    }
}
