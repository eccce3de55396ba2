//! Async mode's bound on writes the kernel's writeback cache holds.

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use tablix_store::Durability;

use crate::harness::{mount_at, require_fuse};

/// The size the store has committed for `name` in the mount's root (its
/// readers see only what was committed), or None while it has no row.
fn committed_size(store: &tablix_store::Store, name: &[u8]) -> Option<u64> {
    store
        .read(|c| tablix_fs::read::lookup(c, tablix_fs::ROOT, name))
        .expect("a read of the store")
        .ok()
        .map(|a| a.size)
}

/// Waits until the store has committed `size` bytes for `name`, failing
/// after 3 s.
fn wait_committed(store: &tablix_store::Store, name: &[u8], size: u64) {
    let began = Instant::now();
    while committed_size(store, name) != Some(size) {
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "a write to a file held open is not committed after {:?} (committed size {:?}, expected {size})",
            began.elapsed(),
            committed_size(store, name)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn async_mode_commits_a_file_held_open_within_the_flush_interval() {
    require_fuse("async_mode_commits_a_file_held_open_within_the_flush_interval");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Flush interval 50 ms (the harness's).
    let f = mount_at(Durability::Async, tmp, data);
    let store = std::sync::Arc::clone(f.store.as_ref().unwrap());
    let mut held = File::create(f.path("held")).unwrap();
    held.write_all(&[7u8; 10_000]).unwrap();
    // The kernel keeps such a write in its page cache until its own
    // writeback, 30 s later by default; the mount must push it within
    // half the interval and commit it. Three seconds are sixty intervals, a tenth of that.
    wait_committed(&store, b"held", 10_000);
    // Later writes to the same open file too, and the file is still open.
    held.write_all(&[8u8; 5_000]).unwrap();
    wait_committed(&store, b"held", 15_000);
    drop(held);
    assert_eq!(
        std::fs::read(f.path("held")).unwrap().len(),
        15_000,
        "the file reads back whole"
    );
}

/// lseek's SEEK_DATA or SEEK_HOLE on `file`, as its offset or errno.
fn seek(file: &File, offset: i64, whence: nix::unistd::Whence) -> Result<i64, nix::errno::Errno> {
    nix::unistd::lseek(file, offset, whence)
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn async_mode_seek_data_and_hole_count_the_writes_the_kernel_still_holds() {
    use nix::errno::Errno;
    use nix::unistd::Whence::{SeekData, SeekHole};
    use std::os::unix::fs::FileExt;
    require_fuse("async_mode_seek_data_and_hole_count_the_writes_the_kernel_still_holds");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let f = mount_at(Durability::Async, tmp, data);
    const MIB: u64 = 1 << 20;

    // Written and never flushed: the store has no byte of it yet.
    let fresh = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(f.path("fresh"))
        .unwrap();
    fresh.write_all_at(b"start", 0).unwrap();
    fresh.write_all_at(b"middle", MIB - 3).unwrap();
    let end = (MIB + 3) as i64;
    assert_eq!(seek(&fresh, 0, SeekData), Ok(0), "data at the start");
    let data_at = seek(&fresh, 100, SeekData).unwrap();
    assert!(
        (100..=end - 6).contains(&data_at),
        "SEEK_DATA from 100 skipped the bytes written at {}: {data_at}",
        MIB - 3
    );
    assert_eq!(
        seek(&fresh, (MIB - 3) as i64, SeekHole),
        Ok(end),
        "the data written last runs to the end of the file"
    );
    assert_eq!(seek(&fresh, end, SeekData), Err(Errno::ENXIO));

    // A sparse file the store holds, then a write into its hole that only
    // the kernel holds: no seek may call those bytes a hole.
    let sparse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(f.path("sparse"))
        .unwrap();
    sparse.write_all_at(b"head", 0).unwrap();
    sparse.write_all_at(b"tail", 2 * MIB).unwrap();
    sparse.sync_all().unwrap();
    sparse.write_all_at(b"inside", MIB).unwrap();
    let data_at = seek(&sparse, 256 * 1024, SeekData).unwrap();
    assert!(
        data_at <= MIB as i64,
        "SEEK_DATA from 256 KiB skipped the bytes written at 1 MiB: {data_at}"
    );
    let hole_at = seek(&sparse, MIB as i64, SeekHole).unwrap();
    assert!(
        hole_at >= (MIB + 6) as i64,
        "SEEK_HOLE from 1 MiB found a hole inside the bytes written there: {hole_at}"
    );
    let mut back = [0u8; 6];
    sparse.read_exact_at(&mut back, MIB).unwrap();
    assert_eq!(&back, b"inside");
}
