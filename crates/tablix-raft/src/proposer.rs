//! Batching proposals: the Commands of concurrent clients ride one
//! openraft entry, so one append, one fsync and one apply serve them all.
//!
//! Openraft 0.9 appends and applies each `client_write` as an entry of its
//! own; with one Command per entry a node pays a log sync per Command and
//! concurrent clients gain nothing. The proposer is a group commit in
//! front of it: a task takes every proposal waiting when an entry can be
//! sent (at most [`ProposerConfig::in_flight`] entries are in openraft and
//! not yet committed at once), makes them one entry, and hands each client
//! its own Command's reply. An entry stops counting once committed
//! (`committing.rs`): the next one is logged and replicated while it is
//! applied.
//!
//! An entry also waits, up to [`ProposerConfig::gather`], for the clients
//! the previous entry just answered (`gather.rs` says why and when).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use openraft::Raft;
use openraft::error::{ClientWriteError, RaftError};
use tablix_store::{CommandReply, EntryReply, ReplicatedCommand, Stamped};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::committing::{Committing, Expected};
use crate::gather::{Backoff, DEFAULT_WAIT, Queued};
use crate::types::{NodeId, TypeConfig};

/// Why a proposal was not applied.
#[derive(Clone, Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    /// This node does not lead; `leader` is the one it knows of, if any.
    #[error("this node is not the leader{}", match .leader {
        Some(l) => format!(" (node {l} is)"),
        None => " and knows of no leader".to_string(),
    })]
    NotLeader { leader: Option<NodeId> },
    /// Replication stopped on this node (it shut down, or its storage
    /// failed): nothing more is proposed here until it restarts.
    #[error("replication stopped on this node: {0}")]
    Stopped(String),
    /// Openraft refused or failed the entry for another reason.
    #[error("openraft: {0}")]
    Raft(String),
}

/// The bounds of the proposer's batches.
#[derive(Clone, Copy, Debug)]
pub struct ProposerConfig {
    /// Most Commands in one entry.
    pub max_commands: usize,
    /// An entry takes no more Commands once its encoding passes this many
    /// bytes (so it holds at most this plus one Command).
    pub max_bytes: usize,
    /// Most entries proposed and not yet committed at once; proposals
    /// arriving meanwhile wait and form the next entry. One by default:
    /// openraft 0.9 syncs each entry appended while another is in flight
    /// on its own, and with two or four in flight 16 clients made fewer
    /// inserts a second than with one (`tablix bench raft`).
    pub in_flight: usize,
    /// Most proposals waiting for a batch; more wait for room.
    pub queue: usize,
    /// Longest an entry waits for the proposals it expects (zero: never).
    pub gather: Duration,
}

impl Default for ProposerConfig {
    fn default() -> Self {
        ProposerConfig {
            max_commands: 256,
            max_bytes: 4 << 20,
            in_flight: 1,
            queue: 1024,
            gather: DEFAULT_WAIT,
        }
    }
}

/// A Command's reply and the entry that carried it (openraft's index).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Committed {
    pub reply: CommandReply,
    pub index: u64,
}

type Answer = oneshot::Sender<Result<Committed, ProposeError>>;

struct Proposal {
    command: Stamped<ReplicatedCommand>,
    reply: Answer,
}

/// Proposes Commands to openraft in batches. Clones share the batching
/// task, which ends when the last clone is dropped.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Proposal>,
    /// Proposals sent and not yet taken by the batching task.
    queued: Queued,
}

impl Proposer {
    /// Starts the batching task on the current tokio runtime.
    /// `committing` is the state machine's ([`crate::StateMachine::committing`]):
    /// it says when an entry is committed, which frees its slot.
    pub fn new(raft: Raft<TypeConfig>, config: ProposerConfig, committing: Committing) -> Proposer {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let queued = Queued::default();
        tokio::spawn(batch(raft, rx, config, queued.clone(), committing));
        Proposer { tx, queued }
    }

    /// Proposes `command`: answered with its own reply once the entry
    /// that carries it is committed and applied.
    pub async fn propose(
        &self,
        command: Stamped<ReplicatedCommand>,
    ) -> Result<CommandReply, ProposeError> {
        self.propose_at(command).await.map(|c| c.reply)
    }

    /// [`Proposer::propose`], also saying which entry carried it.
    pub async fn propose_at(
        &self,
        command: Stamped<ReplicatedCommand>,
    ) -> Result<Committed, ProposeError> {
        let (reply, rx) = oneshot::channel();
        let gone = || ProposeError::Stopped("the proposer ended".into());
        // Room first: a caller that gives up while the queue is full has
        // sent nothing and counted nothing.
        let room = self.tx.reserve().await.map_err(|_| gone())?;
        self.queued.sent();
        room.send(Proposal { command, reply });
        rx.await.map_err(|_| gone())?
    }
}

/// The batching task: one entry per turn, up to `in_flight` at once.
async fn batch(
    raft: Raft<TypeConfig>,
    mut rx: mpsc::Receiver<Proposal>,
    config: ProposerConfig,
    queued: Queued,
    committing: Committing,
) {
    let slots = Arc::new(Semaphore::new(config.in_flight.max(1)));
    // How many proposals the next entry expects: set as each entry is
    // answered, to its Commands plus the proposals waiting then.
    let expected = Arc::new(AtomicUsize::new(0));
    let mut backoff = Backoff::default();
    loop {
        // A slot first, then the proposals: whatever arrived while every
        // slot was busy goes out together.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        // The entry is known to the state machine by its first Command.
        let seed = first.command.stamp.seed;
        let mut batch = Batch::new(first, config, &queued);
        while batch.has_room() {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let want = expected.load(Ordering::Relaxed).min(config.max_commands);
        if batch.len() < want && !config.gather.is_zero() && backoff.may_wait() {
            let filled = gather(&mut batch, &mut rx, want, config.gather).await;
            backoff.waited(filled);
        }
        let raft = raft.clone();
        let expected = Arc::clone(&expected);
        let queued = queued.clone();
        let committing = committing.clone();
        tokio::spawn(async move {
            let (commands, answers): (Vec<_>, Vec<_>) = batch
                .proposals
                .into_iter()
                .map(|p| (p.command, p.reply))
                .unzip();
            let count = commands.len();
            let seeds = commands.iter().map(|c| c.stamp.seed).collect();
            // Called before the answers go out, so a client answered here
            // cannot have proposed again yet; also at commit, when the next
            // entry may leave: clients answered together then still
            // propose together (gather.rs).
            let expect_next = || {
                expected.store(count.saturating_add(queued.waiting()), Ordering::Relaxed);
            };
            // The slot is free once the entry is committed (its apply
            // began) or answered, whichever comes first; the clients are
            // answered once it is applied or openraft answered.
            let mut slot = Some(slot);
            let mut answers = Some(answers);
            let Expected { committed, applied } = committing.expect(seeds);
            let mut committed = Some(committed);
            let mut applied = Some(applied);
            let write = raft.client_write(commands);
            tokio::pin!(write);
            let outcome = loop {
                tokio::select! {
                    o = &mut write => break o,
                    told = told(&mut committed) => {
                        committed = None;
                        if told.is_ok() {
                            expect_next();
                            slot = None;
                        }
                    }
                    told = told(&mut applied) => {
                        applied = None;
                        if let Ok(a) = told
                            && let Some(answers) = answers.take()
                        {
                            // `applied` ended the registration.
                            expect_next();
                            // Past its commit too: a commit told late
                            // must not set the expectation again.
                            committed = None;
                            slot = None;
                            for (answer, reply) in answers.into_iter().zip(a.replies) {
                                let _ = answer.send(Ok(Committed { reply, index: a.index }));
                            }
                        }
                    }
                }
            };
            committing.forget(seed);
            let Some(answers) = answers else {
                // Answered when applied (openraft's answer says the same),
                // its slot freed and the next entry's expectation set then:
                // set again now, it would count the answered clients' next
                // proposals twice.
                return;
            };
            expect_next();
            drop(slot);
            match outcome {
                Ok(r) => match r.data {
                    EntryReply::Commands(replies) if replies.len() == count => {
                        let index = r.log_id.index;
                        for (answer, reply) in answers.into_iter().zip(replies) {
                            let _ = answer.send(Ok(Committed { reply, index }));
                        }
                    }
                    other => {
                        let e = ProposeError::Raft(format!(
                            "an entry of {count} Commands was answered {other:?}"
                        ));
                        for answer in answers {
                            let _ = answer.send(Err(e.clone()));
                        }
                    }
                },
                Err(e) => {
                    let e = ProposeError::of(e);
                    for answer in answers {
                        let _ = answer.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

/// What `rx` is sent, or never while it is `None` (already received).
async fn told<T>(rx: &mut Option<oneshot::Receiver<T>>) -> Result<T, oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Adds proposals to `batch` as they arrive until it holds `want`, is
/// full, or `wait` passed. False if the time ran out.
async fn gather(
    batch: &mut Batch,
    rx: &mut mpsc::Receiver<Proposal>,
    want: usize,
    wait: Duration,
) -> bool {
    // Tokio's timers count whole milliseconds; a blocking thread's timed
    // wait keeps the microseconds, and ends early when `_cancel` is
    // dropped (a runtime shutting down waits for its blocking threads).
    let (_cancel, cancelled) = std::sync::mpsc::channel::<()>();
    let mut timer = tokio::task::spawn_blocking(move || {
        let _ = cancelled.recv_timeout(wait);
    });
    while batch.len() < want && batch.has_room() {
        tokio::select! {
            biased;
            p = rx.recv() => match p {
                Some(p) => batch.push(p),
                None => return true,
            },
            _ = &mut timer => return false,
        }
    }
    true
}

/// The proposals of one entry, within the config's bounds.
struct Batch {
    proposals: Vec<Proposal>,
    bytes: usize,
    config: ProposerConfig,
    /// The proposer's count of proposals not yet taken.
    queued: Queued,
}

impl Batch {
    fn new(first: Proposal, config: ProposerConfig, queued: &Queued) -> Batch {
        let mut batch = Batch {
            proposals: Vec::new(),
            bytes: 0,
            config,
            queued: queued.clone(),
        };
        batch.push(first);
        batch
    }

    fn push(&mut self, p: Proposal) {
        self.queued.taken();
        self.bytes = self.bytes.saturating_add(size(&p.command));
        self.proposals.push(p);
    }

    fn len(&self) -> usize {
        self.proposals.len()
    }

    fn has_room(&self) -> bool {
        self.proposals.len() < self.config.max_commands && self.bytes < self.config.max_bytes
    }
}

/// A Command's encoded size, which bounds an entry's.
fn size(command: &Stamped<ReplicatedCommand>) -> usize {
    postcard::experimental::serialized_size(command).unwrap_or(usize::MAX)
}

impl ProposeError {
    pub(crate) fn of(e: RaftError<NodeId, ClientWriteError<NodeId, crate::Node>>) -> ProposeError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
                leader: f.leader_id,
            },
            RaftError::APIError(e) => ProposeError::Raft(e.to_string()),
            RaftError::Fatal(f) => ProposeError::Stopped(f.to_string()),
        }
    }
}
