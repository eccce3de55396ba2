//! The single writer thread: group commit and the durability policy.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
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
}

pub(crate) struct Writer {
    pub(crate) applier: Applier,
    pub(crate) config: StoreConfig,
    pub(crate) counters: Arc<Counters>,
}

impl Writer {
    /// Serves requests until every sender is gone, then flushes and
    /// checkpoints. Callers are answered only after their group committed
    /// (and, in sync mode, after SQLite's commit fsync'ed the WAL).
    pub(crate) fn run(self, rx: Receiver<Request>) {
        // Set while committed Commands await their fsync (async mode only).
        let mut dirty_since: Option<Instant> = None;
        let interval = self.config.flush_interval;
        loop {
            let timeout = dirty_since.map_or(IDLE, |t| interval.saturating_sub(t.elapsed()));
            let mut flushes = Vec::new();
            match rx.recv_timeout(timeout) {
                Ok(first) => {
                    let mut applies = Vec::new();
                    let mut next = Some(first);
                    while let Some(r) = next.take() {
                        match r {
                            Request::Apply(cmd, reply) => applies.push((cmd, reply)),
                            Request::Flush(reply) => flushes.push(reply),
                        }
                        if applies.len() < self.config.max_batch {
                            next = rx.try_recv().ok();
                        }
                    }
                    if !applies.is_empty() {
                        self.commit_group(applies);
                        if self.config.durability == Durability::Async && dirty_since.is_none() {
                            dirty_since = Some(Instant::now());
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Checked after every receive, not only on timeouts: under steady
            // traffic the receive never times out.
            let due = dirty_since.is_some_and(|t| t.elapsed() >= interval);
            if due || !flushes.is_empty() {
                let r = self.flush();
                dirty_since = None;
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
        if let Err(e) = self.applier.checkpoint() {
            tracing::warn!("final checkpoint failed: {e}");
        }
    }

    fn commit_group(&self, group: Vec<(Box<Stamped>, Reply)>) {
        let items: Vec<&Stamped> = group.iter().map(|(c, _)| c.as_ref()).collect();
        let n = items.len() as u64;
        Counters::add(&self.counters.batches, 1);
        self.counters
            .largest_batch
            .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
        match self.applier.apply_batch(&items) {
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
        self.applier.sync_wal()
    }
}
