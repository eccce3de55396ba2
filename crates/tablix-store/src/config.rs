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
}

impl StoreConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            data_dir: data_dir.into(),
            durability: Durability::Sync,
            readers: 4,
            max_batch: 1024,
            flush_interval: Duration::from_millis(200),
            vfs: None,
        }
    }

    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("tablix.db")
    }
}
