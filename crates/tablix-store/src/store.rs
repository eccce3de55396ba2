//! The public face of the store.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::apply::Applier;
use crate::command::{Command, Stamp, Stamped, Statement};
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::lock::DirLock;
use crate::outcome::{Applied, StatementOutcome};
use crate::readers::Readers;
use crate::stats::{Counters, StoreStats};
use crate::volatile::Volatile;
use crate::writer::{Request, Writer};

/// Distinguishes the memory databases of stores opened in one process.
static NEXT_MEMORY_DB: AtomicU64 = AtomicU64::new(0);

/// An answer that arrives once the writer has committed (or failed).
pub struct Ticket<T> {
    rx: oneshot::Receiver<Result<T, StoreError>>,
}

impl<T> Ticket<T> {
    fn ready(result: Result<T, StoreError>) -> Ticket<T> {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(result);
        Ticket { rx }
    }

    /// Waits on the current thread. Must not be called from async code.
    pub fn wait(self) -> Result<T, StoreError> {
        self.rx.blocking_recv().unwrap_or(Err(StoreError::Closed))
    }
}

impl<T> Future for Ticket<T> {
    type Output = Result<T, StoreError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StoreError::Closed)))
    }
}

/// The store of one data directory. Owns the directory exclusively for as
/// long as it is open.
pub struct Store {
    config: StoreConfig,
    /// The writer connection: the writer thread applies groups on it, and
    /// in async mode file-system Commands are applied on it directly.
    applier: Arc<Mutex<Applier>>,
    tx: Mutex<Option<Sender<Request>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Readers,
    volatile: Volatile,
    counters: Arc<Counters>,
    _lock: DirLock,
}

impl Store {
    /// Opens (creating on first use) the data directory and starts the writer.
    pub fn open(config: StoreConfig) -> Result<Store, StoreError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| StoreError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let lock = DirLock::acquire(&config.data_dir)?;
        let volatile = Volatile::open(&format!(
            "tablix-mem-{}-{}",
            std::process::id(),
            NEXT_MEMORY_DB.fetch_add(1, Ordering::Relaxed)
        ))?;
        let applier = Arc::new(Mutex::new(Applier::open(&config, volatile.uri())?));
        let readers = Readers::open(&config, volatile.uri())?;
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            applier: Arc::clone(&applier),
            config: config.clone(),
            counters: Arc::clone(&counters),
        };
        let handle = std::thread::Builder::new()
            .name("tablix-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Store {
            config,
            applier,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            readers,
            volatile,
            counters,
            _lock: lock,
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn send(&self, request: Request) -> Result<(), StoreError> {
        let guard = self.tx.lock().map_err(|_| StoreError::Closed)?;
        match guard.as_ref() {
            Some(tx) => tx.send(request).map_err(|_| StoreError::Closed),
            None => Err(StoreError::Closed),
        }
    }

    /// Queues a Command for the writer. The ticket resolves once the group
    /// it joined has committed at the configured durability.
    pub fn submit(&self, stamped: Stamped) -> Ticket<Applied> {
        if stamped.command.is_volatile() {
            return Ticket::ready(self.apply_volatile(&stamped));
        }
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Apply(Box::new(stamped), reply)) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Applies a Command and waits for it.
    pub fn apply(&self, stamp: Stamp, command: Command) -> Result<Applied, StoreError> {
        let stamped = Stamped::new(stamp, command);
        if stamped.command.is_volatile() {
            return self.apply_volatile(&stamped);
        }
        self.submit(stamped).wait()
    }

    /// Applies a Command of the memory database at once, on this thread,
    /// in its own transaction (see `volatile.rs`).
    fn apply_volatile(&self, stamped: &Stamped) -> Result<Applied, StoreError> {
        Counters::add(&self.counters.commands, 1);
        self.volatile.apply(stamped)
    }

    /// Runs tablix's own read-only SQL on the memory database (as `main`),
    /// for crates that own its tables: pipes and processes.
    pub fn read_volatile<R>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> R,
    ) -> Result<R, StoreError> {
        Counters::add(&self.counters.reads, 1);
        self.volatile.read(f)
    }

    /// Applies a file-system operation. In sync mode this is [`Store::apply`]
    /// (group commit, durable on return). In async mode it runs at once on
    /// the caller's thread inside a transaction that stays open, so that a
    /// stream of small operations pays for neither a thread hand-off nor a
    /// commit each; the writer commits and syncs it within the flush
    /// interval, and [`Store::flush`] forces that. Use
    /// [`Store::read_latest`] to read what such operations wrote.
    pub fn apply_fs_now(&self, stamp: Stamp, op: tablix_fs::FsOp) -> Result<Applied, StoreError> {
        if self.config.durability == crate::config::Durability::Sync {
            return self.apply(stamp, Command::Fs(op));
        }
        let mut applier = self.applier.lock().map_err(|_| StoreError::Closed)?;
        let began = !applier.has_pending();
        let r = applier.apply_pending(&Stamped::new(stamp, Command::Fs(op)));
        drop(applier);
        Counters::add(&self.counters.commands, 1);
        if began {
            self.send(Request::Pending)?;
        }
        r
    }

    /// Runs tablix's own read-only SQL (`f`) on the newest state, including
    /// operations of [`Store::apply_fs_now`] not committed yet: on the writer
    /// connection in async mode, on the reader pool (see [`Store::read`])
    /// in sync mode, where nothing acknowledged is uncommitted.
    pub fn read_latest<R>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> R,
    ) -> Result<R, StoreError> {
        if self.config.durability == crate::config::Durability::Sync {
            return self.read(f);
        }
        Counters::add(&self.counters.reads, 1);
        let applier = self.applier.lock().map_err(|_| StoreError::Closed)?;
        Ok(f(applier.connection()))
    }

    /// Makes everything acknowledged so far durable, whatever the mode.
    pub fn flush(&self) -> Ticket<()> {
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Flush(reply)) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Runs read-only statements on one snapshot, on the reader pool.
    pub fn query(&self, statements: &[Statement]) -> Result<Vec<StatementOutcome>, StoreError> {
        Counters::add(&self.counters.reads, 1);
        self.readers.query(statements)
    }

    /// Runs `statements` on the reader pool if they only read; None when
    /// they need the writer (submit them as a Command instead).
    pub fn query_if_read_only(
        &self,
        statements: &[Statement],
    ) -> Result<Option<Vec<StatementOutcome>>, StoreError> {
        let out = self.readers.query_if_read_only(statements)?;
        if out.is_some() {
            Counters::add(&self.counters.reads, 1);
        }
        Ok(out)
    }

    /// Runs tablix's own read-only SQL (`f`) on one snapshot of the reader
    /// pool, with the SQL policy off: for crates that own tables of the
    /// store, such as the file system.
    pub fn read<R>(&self, f: impl FnOnce(&rusqlite::Connection) -> R) -> Result<R, StoreError> {
        Counters::add(&self.counters.reads, 1);
        self.readers.read(f)
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            memory_locks: self.volatile.lock_stats().into(),
            ..self.counters.snapshot()
        }
    }

    /// Stops accepting Commands, lets the writer finish every queued one,
    /// flushes and checkpoints. Idempotent.
    pub fn close(&self) -> Result<(), StoreError> {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        self.readers.close();
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            h.join()
                .map_err(|_| StoreError::Apply("the writer thread panicked".into()))?;
        }
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!("closing the store: {e}");
        }
    }
}
