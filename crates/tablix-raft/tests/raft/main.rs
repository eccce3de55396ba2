//! The command log as openraft's log storage, checked by openraft's own
//! storage test suite, and read back after reopening.
#![allow(clippy::unwrap_used)]

use std::io::Cursor;
use std::sync::{Arc, Mutex};

use openraft::storage::{
    RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    Entry, EntryPayload, LogId, RaftLogId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    Vote,
};
use tablix_log::{Log, LogConfig};
use tablix_raft::LogStore;

openraft::declare_raft_types!(
    TypeConfig:
        D = String,
        R = String,
        Node = (),
);

type Nid = u64;
/// The last applied entry and the membership.
type Applied = (Option<LogId<Nid>>, StoredMembership<Nid, ()>);
/// The current snapshot: its meta and bytes.
type Current = Option<(SnapshotMeta<Nid, ()>, Vec<u8>)>;

/// What the suite checks of a state machine: the last applied entry, the
/// membership, snapshots of both. (The store's own state machine is the
/// replication issue's.)
#[derive(Clone, Default)]
struct Machine {
    state: Arc<Mutex<Applied>>,
    current: Arc<Mutex<Current>>,
}

impl RaftSnapshotBuilder<TypeConfig> for Machine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<Nid>> {
        let state = self.state.lock().unwrap().clone();
        let data = postcard::to_stdvec(&state).unwrap();
        let meta = SnapshotMeta {
            last_log_id: state.0,
            last_membership: state.1,
            snapshot_id: format!("{:?}", state.0),
        };
        *self.current.lock().unwrap() = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for Machine {
    type SnapshotBuilder = Machine;

    async fn applied_state(&mut self) -> Result<Applied, StorageError<Nid>> {
        Ok(self.state.lock().unwrap().clone())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<String>, StorageError<Nid>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut state = self.state.lock().unwrap();
        let mut out = Vec::new();
        for e in entries {
            state.0 = Some(*e.get_log_id());
            if let EntryPayload::Membership(m) = &e.payload {
                state.1 = StoredMembership::new(Some(*e.get_log_id()), m.clone());
            }
            out.push(String::new());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Machine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<Nid>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<Nid, ()>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<Nid>> {
        let data = snapshot.into_inner();
        *self.state.lock().unwrap() = postcard::from_bytes(&data).unwrap();
        *self.current.lock().unwrap() = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<Nid>> {
        Ok(self
            .current
            .lock()
            .unwrap()
            .clone()
            .map(|(meta, data)| Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }))
    }
}

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, Machine, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, Machine), StorageError<Nid>> {
        let dir = tempfile::tempdir().unwrap();
        let small = LogConfig {
            segment_bytes: 4096,
            ..LogConfig::default()
        };
        let (log, _) = Log::open(dir.path(), small).unwrap();
        Ok((dir, LogStore::new(log), Machine::default()))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_command_log() {
    Suite::test_all(OnDisk).unwrap();
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(term, 0), index),
        payload: EntryPayload::Blank,
    }
}

#[test]
fn entries_and_the_vote_read_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (log, _) = Log::open(dir.path(), LogConfig::default()).unwrap();
        let mut store = LogStore::<TypeConfig>::new(log);
        let entries: Vec<_> = (0..50).map(|i| blank(1 + i / 20, i)).collect();
        store.blocking_append(entries.clone()).await.unwrap();
        store.save_vote(&Vote::new(3, 7)).await.unwrap();
        store
            .purge(LogId::new(openraft::CommittedLeaderId::new(1, 0), 9))
            .await
            .unwrap();
        drop(store);
        let (log, _) = Log::open(dir.path(), LogConfig::default()).unwrap();
        let mut store = LogStore::<TypeConfig>::new(log);
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(*entries[49].get_log_id()));
        // Purging is logical: a reopened log may start earlier, not later.
        let first = state.last_purged_log_id.map_or(0, |p| p.index + 1);
        assert!(first <= 10, "{state:?}");
        let read = store.try_get_log_entries(10..50).await.unwrap();
        assert_eq!(read, entries[10..50].to_vec());
    });
}
