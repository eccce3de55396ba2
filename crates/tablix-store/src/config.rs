//! Store configuration.

use std::path::PathBuf;
use std::time::Duration;

/// When an acknowledged Command is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every acknowledged Command has been fsync'ed.
    Sync,
    /// Commands are acknowledged on commit and fsync'ed within
    /// [`StoreConfig::flush_interval`].
    Async,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Async => "async",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Durability::Sync),
            "async" => Ok(Durability::Async),
            other => Err(format!("unknown mode {other:?}: expected sync or async")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// Read-only connections in the pool.
    pub readers: usize,
    /// Most Commands one group commit takes.
    pub max_batch: usize,
    /// Upper bound on how long an acknowledged Command stays unsynced in
    /// async mode.
    pub flush_interval: Duration,
    /// The SQLite VFS under the store's connections (the platform's if
    /// None); tests name a fault-injecting one.
    pub vfs: Option<String>,
    /// Longest a read request's statements may run, together.
    pub read_timeout: Duration,
    /// Longest a write request's statements may hold the writer, together.
    pub write_timeout: Duration,
    /// Largest result of one request, in bytes as sent; also the largest
    /// value user SQL can build.
    pub max_result_bytes: usize,
    /// SQLite's heap limit for the whole process, in bytes (0: none).
    pub memory_limit: u64,
    /// The WAL is checkpointed and cut back once it grows past this.
    pub wal_limit: u64,
    /// What /proc hides from other users (None: read it from this
    /// system's /proc mount).
    pub proc_visibility: Option<crate::sandbox::ProcVisibility>,
    /// Size of a command log segment (`DATA/log/*.seg`), each written
    /// full of zeros a chunk at a time and then recycled.
    pub log_segment_bytes: u64,
    /// Crash tests' model of the machine under the command log: halted
    /// when the machine "dies", then the log's unsynced writes are lost
    /// (see `tablix_log::PowerModel`).
    pub log_power: Option<std::sync::Arc<tablix_log::PowerModel>>,
    /// Open a command log damaged in its middle by cutting it before the
    /// damage, losing the entries from there on (`tablix fsck` repairs
    /// so). Without it such a log stops the open, unless the state already
    /// holds every entry past the damage.
    pub discard_damaged_log: bool,
    /// Called at each point of the write path (crash tests stop the
    /// process or the machine there); nothing by default.
    pub write_probe: crate::WriteProbe,
    /// Who keeps the log of replicated Commands: the store itself, or
    /// replication, which then hands the store committed entries.
    pub log_keeper: LogKeeper,
    /// Most interactive transactions open at once.
    pub max_transactions: usize,
    /// An interactive transaction with no request for this long is
    /// rolled back.
    pub tx_idle_timeout: Duration,
    /// An interactive transaction open this long is rolled back (it keeps
    /// the WAL from being restarted).
    pub tx_max_duration: Duration,
    /// Most bytes of pages one interactive transaction may change.
    pub tx_max_bytes: usize,
}

/// Who keeps the log of the store's replicated Commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogKeeper {
    /// The store: Commands proposed to it are appended to its own command
    /// log (`DATA/log`), synced, then applied.
    #[default]
    Store,
    /// Replication (tablix-raft): the store opens no log of its own,
    /// refuses Commands proposed to it, and applies the committed entries
    /// handed to [`crate::Store::apply_entries`].
    Replication,
}

/// Default of [`StoreConfig::log_segment_bytes`]: 64 MiB.
pub const DEFAULT_LOG_SEGMENT_BYTES: u64 = 64 << 20;

/// Default of [`StoreConfig::max_transactions`].
pub const DEFAULT_MAX_TRANSACTIONS: usize = 64;
/// Default of [`StoreConfig::tx_idle_timeout`].
pub const DEFAULT_TX_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`StoreConfig::tx_max_duration`].
pub const DEFAULT_TX_MAX_DURATION: Duration = Duration::from_secs(300);
/// Default of [`StoreConfig::tx_max_bytes`]: 64 MiB.
pub const DEFAULT_TX_MAX_BYTES: usize = 64 << 20;

/// Default of [`StoreConfig::read_timeout`].
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`StoreConfig::write_timeout`].
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`StoreConfig::max_result_bytes`]: 64 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 << 20;
/// Default of [`StoreConfig::memory_limit`]: 1 GiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 1 << 30;
/// Default of [`StoreConfig::wal_limit`]: 128 MiB (checkpoints every 64).
pub const DEFAULT_WAL_LIMIT: u64 = 128 << 20;

impl StoreConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            data_dir: data_dir.into(),
            durability: Durability::Sync,
            readers: 4,
            max_batch: 1024,
            flush_interval: Duration::from_millis(200),
            vfs: None,
            read_timeout: DEFAULT_READ_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            wal_limit: DEFAULT_WAL_LIMIT,
            proc_visibility: None,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_BYTES,
            log_power: None,
            discard_damaged_log: false,
            write_probe: crate::WriteProbe::default(),
            log_keeper: LogKeeper::Store,
            max_transactions: DEFAULT_MAX_TRANSACTIONS,
            tx_idle_timeout: DEFAULT_TX_IDLE_TIMEOUT,
            tx_max_duration: DEFAULT_TX_MAX_DURATION,
            tx_max_bytes: DEFAULT_TX_MAX_BYTES,
        }
    }

    /// The bounds of a read request that asks for nothing tighter.
    pub fn read_limits(&self) -> crate::budget::Limits {
        crate::budget::Limits {
            timeout: self.read_timeout,
            max_result_bytes: self.max_result_bytes,
            cancel: crate::budget::Cancel::new(),
        }
    }

    /// The bounds of a write request that asks for nothing tighter.
    pub fn write_limits(&self) -> crate::budget::Limits {
        crate::budget::Limits {
            timeout: self.write_timeout,
            max_result_bytes: self.max_result_bytes,
            cancel: crate::budget::Cancel::new(),
        }
    }

    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("tablix.db")
    }

    /// The directory of the command log.
    pub fn log_dir(&self) -> PathBuf {
        self.data_dir.join("log")
    }
}
