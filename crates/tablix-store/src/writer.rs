//! The single writer thread: group commit and the durability policy.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::apply::Applier;
use crate::command::Stamped;
use crate::config::{Durability, StoreConfig};
use crate::error::StoreError;
use crate::outcome::Applied;
use crate::stats::Counters;

/// How long the writer sleeps when nothing awaits a flush.
const IDLE: Duration = Duration::from_secs(3600);

/// Where the writer sends a Command's result.
pub(crate) type Reply = oneshot::Sender<Result<Applied, StoreError>>;

pub(crate) enum Request {
    Apply(Box<Stamped>, Reply),
    /// Make every Command acknowledged so far durable (fsync).
    Flush(oneshot::Sender<Result<(), StoreError>>),
    /// A pending transaction was opened by `Store::apply_fs_now`: commit it
    /// (and sync) within the flush interval.
    Pending,
}

pub(crate) struct Writer {
    pub(crate) applier: Arc<Mutex<Applier>>,
    pub(crate) config: StoreConfig,
    pub(crate) counters: Arc<Counters>,
}

impl Writer {
    /// Serves requests until every sender is gone, then flushes and
    /// checkpoints. Callers are answered only after their group committed
    /// (and, in sync mode, after SQLite's commit fsync'ed the WAL).
    pub(crate) fn run(self, rx: Receiver<Request>) {
        // Set while acknowledged Commands await their commit or fsync
        // (async mode only): when they must be durable.
        let mut deadline: Option<Instant> = None;
        let interval = self.config.flush_interval;
        let is_async = self.config.durability == Durability::Async;
        loop {
            let timeout = deadline.map_or(IDLE, |d| d.saturating_duration_since(Instant::now()));
            let mut flushes = Vec::new();
            match rx.recv_timeout(timeout) {
                Ok(first) => {
                    let mut applies = Vec::new();
                    let mut next = Some(first);
                    let mut pending = false;
                    while let Some(r) = next.take() {
                        match r {
                            Request::Apply(cmd, reply) => applies.push((cmd, reply)),
                            Request::Flush(reply) => flushes.push(reply),
                            Request::Pending => pending = true,
                        }
                        if applies.len() < self.config.max_batch {
                            next = rx.try_recv().ok();
                        }
                    }
                    if !applies.is_empty() {
                        self.commit_group(applies);
                        pending = true;
                    }
                    if is_async && pending && deadline.is_none() {
                        deadline = Some(Instant::now() + interval);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Checked after every receive, not only on timeouts: under steady
            // traffic the receive never times out.
            let due = deadline.is_some_and(|d| Instant::now() >= d);
            if due || !flushes.is_empty() {
                let r = self.flush();
                deadline = None;
                if let Err(e) = &r {
                    tracing::error!("flush failed: {e}");
                }
                for reply in flushes {
                    let _ = reply.send(
                        r.as_ref()
                            .map(|_| ())
                            .map_err(|e| StoreError::Apply(e.to_string())),
                    );
                }
            }
        }
        if let Err(e) = self.flush() {
            tracing::error!("final flush failed: {e}");
        }
        match self.lock() {
            Ok(a) => {
                if let Err(e) = a.checkpoint() {
                    tracing::warn!("final checkpoint failed: {e}");
                }
            }
            Err(e) => tracing::error!("final checkpoint: {e}"),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Applier>, StoreError> {
        self.applier.lock().map_err(|_| StoreError::Closed)
    }

    fn commit_group(&self, group: Vec<(Box<Stamped>, Reply)>) {
        let items: Vec<&Stamped> = group.iter().map(|(c, _)| c.as_ref()).collect();
        let n = items.len() as u64;
        Counters::add(&self.counters.batches, 1);
        self.counters
            .largest_batch
            .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
        let mut applier = match self.lock() {
            Ok(a) => a,
            Err(e) => {
                for (_, reply) in group {
                    let _ = reply.send(Err(StoreError::Closed));
                }
                tracing::error!("group commit: {e}");
                return;
            }
        };
        // Acknowledged file-system Commands commit first: a SQL Command
        // that ends its transaction must not take them with it.
        if let Err(e) = applier.commit_pending() {
            tracing::error!("committing pending file-system operations failed: {e}");
        }
        match applier.apply_batch(&items) {
            Ok(results) => {
                Counters::add(&self.counters.commands, n);
                for ((_, reply), result) in group.into_iter().zip(results) {
                    if result.as_ref().map_or(true, |a| a.rolled_back) {
                        Counters::add(&self.counters.failed_commands, 1);
                    }
                    let _ = reply.send(result);
                }
            }
            Err(e) => {
                Counters::add(&self.counters.failed_commits, 1);
                tracing::error!("group commit of {n} commands failed: {e}");
                let message = e.to_string();
                for (_, reply) in group {
                    let _ = reply.send(Err(StoreError::Commit(message.clone())));
                }
            }
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        if self.config.durability == Durability::Sync {
            // SQLite's commit already fsync'ed (synchronous=FULL).
            return Ok(());
        }
        Counters::add(&self.counters.flushes, 1);
        let mut applier = self.lock()?;
        applier.commit_pending()?;
        applier.sync_wal()
    }
}
