//! `RaftStateMachine` over the store: openraft's committed entries are
//! applied by the store's one apply path (`Store::apply_entries`), which
//! records the last applied entry and the membership in the same
//! transaction as the changes; snapshots are copies of the persistent
//! database (`Store::snapshot_to`, `Store::install_snapshot`).
//!
//! Snapshots live in a directory of their own:
//! - `snapshot-<id>.db`: a snapshot, a self-contained SQLite file;
//! - `current`: postcard of the current snapshot's `SnapshotMeta`,
//!   replaced by rename, so it always names a complete, synced file;
//! - `building.db`, `receiving.db`: a snapshot being built or received.
//!
//! Files of older snapshots are removed once `current` names a newer one
//! (a reader that opened one keeps its descriptor).
#![allow(
    clippy::result_large_err,
    reason = "openraft's storage traits return its StorageError; the helpers here build it"
)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, LogId, RaftLogId, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use tablix_store::{EntryReply, LogEntry, Store, StoreError};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use crate::committing::Committing;
use crate::replies::RecentReplies;
use crate::types::{Node, NodeId, TypeConfig};
use crate::{from_log, to_log};

/// The file naming the current snapshot.
const CURRENT: &str = "current";

/// The store as openraft's state machine. Clones share the store and the
/// snapshot directory (the snapshot builder is a clone).
#[derive(Clone)]
pub struct StateMachine {
    store: Arc<Store>,
    dir: PathBuf,
    /// Tells apart snapshots built in one process at the same entry.
    built: Arc<AtomicU64>,
    /// The replies of the Commands applied lately (shared by clones).
    replies: RecentReplies,
    /// Told of each entry as its apply begins (the proposer's).
    committing: Committing,
}

type Membership = StoredMembership<NodeId, Node>;
type Meta = SnapshotMeta<NodeId, Node>;

fn error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl ToString) -> StorageError<NodeId> {
    StorageError::IO {
        source: StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())),
    }
}

fn sm_error(verb: ErrorVerb, e: impl ToString) -> StorageError<NodeId> {
    error(ErrorSubject::StateMachine, verb, e)
}

fn snapshot_error(verb: ErrorVerb, e: impl ToString) -> StorageError<NodeId> {
    error(ErrorSubject::Snapshot(None), verb, e)
}

/// Syncs a directory, making renames and new files in it durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl StateMachine {
    /// The state machine of `store`, which must have been opened with
    /// `LogKeeper::Replication`, keeping snapshots in `dir` (created if
    /// missing).
    pub fn new(store: Arc<Store>, dir: impl Into<PathBuf>) -> std::io::Result<StateMachine> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(StateMachine {
            store,
            dir,
            built: Arc::new(AtomicU64::new(0)),
            replies: RecentReplies::default(),
            committing: Committing::default(),
        })
    }

    /// The replies of the Commands this state machine applied lately.
    pub fn replies(&self) -> RecentReplies {
        self.replies.clone()
    }

    /// What tells this node's proposer that its entries are committed.
    pub fn committing(&self) -> Committing {
        self.committing.clone()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn data_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("snapshot-{id}.db"))
    }

    /// The current snapshot's meta, if one was built or installed.
    fn current_meta(&self) -> Result<Option<Meta>, StorageError<NodeId>> {
        match std::fs::read(self.dir.join(CURRENT)) {
            Ok(bytes) => postcard::from_bytes(&bytes)
                .map(Some)
                .map_err(|e| snapshot_error(ErrorVerb::Read, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(snapshot_error(ErrorVerb::Read, e)),
        }
    }

    /// Makes `meta` (whose file is in place and synced) the current
    /// snapshot, durably, and removes the files of older ones.
    fn make_current(&self, meta: &Meta) -> std::io::Result<()> {
        let bytes = postcard::to_stdvec(meta).map_err(std::io::Error::other)?;
        let next = self.dir.join("current.next");
        {
            let mut f = std::fs::File::create(&next)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&next, self.dir.join(CURRENT))?;
        sync_dir(&self.dir)?;
        let keep = format!("snapshot-{}.db", meta.snapshot_id);
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("snapshot-") && name.ends_with(".db") && name != keep {
                let _ = std::fs::remove_file(self.dir.join(name.as_ref()));
            }
        }
        Ok(())
    }

    async fn open_current(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let Some(meta) = self.current_meta()? else {
            return Ok(None);
        };
        let file = tokio::fs::File::open(self.data_path(&meta.snapshot_id))
            .await
            .map_err(|e| snapshot_error(ErrorVerb::Read, e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }

    /// Runs blocking store work off the async runtime's threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<Result<T, StoreError>, tokio::task::JoinError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || f(&store)).await
    }
}

/// The membership recorded in the store, or none yet.
fn membership_of(bytes: Option<&[u8]>) -> Result<Membership, StorageError<NodeId>> {
    match bytes {
        Some(b) => postcard::from_bytes(b).map_err(|e| sm_error(ErrorVerb::Read, e)),
        None => Ok(Membership::default()),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let building = self.dir.join("building.db");
        let path = building.clone();
        let state = self
            .blocking(move |store| store.snapshot_to(&path))
            .await
            .map_err(|e| snapshot_error(ErrorVerb::Write, e))?
            .map_err(|e| snapshot_error(ErrorVerb::Write, e))?;
        let last_log_id = state.applied.map(from_log);
        let n = self.built.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match &last_log_id {
            Some(id) => format!(
                "{}-{}-{}-{n}",
                id.leader_id.term,
                id.index,
                std::process::id()
            ),
            None => format!("none-{}-{n}", std::process::id()),
        };
        let meta = Meta {
            last_log_id,
            last_membership: membership_of(state.membership.as_deref())?,
            snapshot_id,
        };
        let data = self.data_path(&meta.snapshot_id);
        std::fs::rename(&building, &data)
            .and_then(|()| self.make_current(&meta))
            .map_err(|e| snapshot_error(ErrorVerb::Write, e))?;
        let file = tokio::fs::File::open(&data)
            .await
            .map_err(|e| snapshot_error(ErrorVerb::Read, e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let state = self
            .store
            .applied_state()
            .map_err(|e| sm_error(ErrorVerb::Read, e))?;
        Ok((
            state.applied.map(from_log),
            membership_of(state.membership.as_deref())?,
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<EntryReply>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        // Each entry's index (openraft's) and the seeds of its Commands,
        // to keep their replies by.
        let mut seeds: Vec<(u64, Vec<u64>)> = Vec::new();
        for entry in entries {
            let id = *entry.get_log_id();
            let each: Vec<u64> = match &entry.payload {
                EntryPayload::Normal(batch) => batch.iter().map(|c| c.stamp.seed).collect(),
                _ => Vec::new(),
            };
            if let Some(first) = each.first() {
                self.committing.applying(*first);
            }
            seeds.push((id.index, each));
            let payload = match entry.payload {
                EntryPayload::Blank => tablix_store::EntryPayload::Blank,
                EntryPayload::Normal(batch) => tablix_store::EntryPayload::Commands(batch),
                EntryPayload::Membership(m) => {
                    let stored = Membership::new(Some(id), m);
                    tablix_store::EntryPayload::Membership(
                        postcard::to_stdvec(&stored).map_err(|e| sm_error(ErrorVerb::Write, e))?,
                    )
                }
            };
            out.push(LogEntry {
                id: to_log(id.leader_id.term, id.index),
                payload,
            });
        }
        if out.is_empty() {
            return Ok(Vec::new());
        }
        let replies = self
            .store
            .apply_entries(out)
            .await
            .map_err(|e| sm_error(ErrorVerb::Write, e))?;
        for (reply, (index, seeds)) in replies.iter().zip(&seeds) {
            if let EntryReply::Commands(each) = reply {
                for (r, seed) in each.iter().zip(seeds) {
                    self.replies.record(*seed, r);
                }
                self.committing.applied(seeds, *index, each);
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<tokio::fs::File>, StorageError<NodeId>> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join("receiving.db"))
            .await
            .map_err(|e| snapshot_error(ErrorVerb::Write, e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<NodeId>> {
        let fail = |e: &dyn std::fmt::Display| {
            error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                e,
            )
        };
        let mut file = *snapshot;
        file.flush().await.map_err(|e| fail(&e))?;
        let data = self.data_path(&meta.snapshot_id);
        let receiving = self.dir.join("receiving.db");
        let theirs = file.metadata().await.map_err(|e| fail(&e))?;
        let is_receiving = std::fs::metadata(&receiving)
            .is_ok_and(|m| m.dev() == theirs.dev() && m.ino() == theirs.ino());
        if is_receiving {
            file.sync_all().await.map_err(|e| fail(&e))?;
            drop(file);
            std::fs::rename(&receiving, &data).map_err(|e| fail(&e))?;
        } else {
            // Handed a snapshot file of its own (one built here or read
            // from elsewhere): copied whole from its start.
            file.seek(std::io::SeekFrom::Start(0))
                .await
                .map_err(|e| fail(&e))?;
            let mut copy = tokio::fs::File::create(&data).await.map_err(|e| fail(&e))?;
            tokio::io::copy(&mut file, &mut copy)
                .await
                .map_err(|e| fail(&e))?;
            copy.sync_all().await.map_err(|e| fail(&e))?;
        }
        sync_dir(&self.dir).map_err(|e| fail(&e))?;
        let state = self
            .store
            .install_snapshot(&data)
            .await
            .map_err(|e| fail(&e))?;
        let held = state.applied.map(from_log);
        if held != meta.last_log_id {
            return Err(fail(&format!(
                "the snapshot's database holds entries up to {held:?}, but its meta says {:?}",
                meta.last_log_id
            )));
        }
        self.make_current(meta).map_err(|e| fail(&e))
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        self.open_current().await
    }
}
