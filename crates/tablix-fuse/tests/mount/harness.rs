//! Mounting a fresh tablix file system for one test.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tablix_fuse::{FsConfig, MountOptions, Mounted};
use tablix_store::{Durability, Store, StoreConfig};

/// Set (to a directory on a mount) when this binary runs as the
/// unprivileged user: tests then work there instead of mounting.
pub const SHARED_MOUNT_ENV: &str = "TABLIX_TEST_MOUNT";

pub struct Fixture {
    /// A directory on the mount the test owns.
    pub root: PathBuf,
    /// The store behind the mount, when this process mounted it.
    pub store: Option<Arc<Store>>,
    mounted: Option<Mounted>,
    _tmp: Option<tempfile::TempDir>,
}

impl Fixture {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.mounted.take();
        if let Some(s) = self.store.take() {
            let _ = s.close();
        }
    }
}

/// Fails the test unless FUSE tests can run here (root and /dev/fuse):
/// tests that call it are `#[ignore]`d and run by `make test` as root.
/// The unprivileged pass runs in a mount root made for it.
pub fn require_fuse(test: &str) {
    if std::env::var_os(SHARED_MOUNT_ENV).is_none() {
        tablix_testkit::require::fuse(test);
    }
}

pub fn mount(mode: Durability) -> Fixture {
    if let Some(shared) = std::env::var_os(SHARED_MOUNT_ENV) {
        let base = PathBuf::from(shared);
        let root = tempfile::Builder::new()
            .prefix("t")
            .tempdir_in(&base)
            .expect("a directory in the shared mount")
            .keep();
        return Fixture {
            root,
            store: None,
            mounted: None,
            _tmp: None,
        };
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    mount_at(mode, tmp, data)
}

/// Mounts a store whose data directory is `data` (e.g. on a small tmpfs).
pub fn mount_at(mode: Durability, tmp: tempfile::TempDir, data: PathBuf) -> Fixture {
    let mp = tmp.path().join("mnt");
    std::fs::create_dir_all(&mp).expect("mount point");
    let mut config = StoreConfig::new(&data);
    config.durability = mode;
    config.flush_interval = Duration::from_millis(50);
    let interval = config.flush_interval;
    let store = Arc::new(Store::open(config).expect("store"));
    let options = MountOptions {
        mountpoint: mp.clone(),
        fs: FsConfig {
            writeback_cache: (mode == Durability::Async).then_some(interval),
            push_helper: None,
            ttl: Duration::from_secs(10),
            max_write: 1 << 20,
            data_dir: data,
            read_gate: None,
            node: None,
        },
        threads: 4,
        allow_other: true,
    };
    let mounted = tablix_fuse::mount(Arc::clone(&store), options).expect("mount");
    Fixture {
        root: mp,
        store: Some(store),
        mounted: Some(mounted),
        _tmp: Some(tmp),
    }
}

/// The errno of a failed std::io call.
pub fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().expect("an OS error"),
    }
}
