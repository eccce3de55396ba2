//! File-system Commands under power loss, I/O errors and a full disk, on
//! the fault-injecting VFS: what was acknowledged survives as the mode
//! promises, a loss is declared to every later caller, and the file
//! system checks clean afterwards.

use std::path::Path;

use rusqlite::{Connection, ErrorCode};
use tablix_fs::check::{Options, check};
use tablix_fs::{FsOp, FsReply};
use tablix_store::{Durability, Store, StoreError};

use super::{faulty_store, new_file, sql, stamp};

/// Bytes written to each test file: more than one data block.
const FILE_BYTES: usize = 100_000;

fn content(n: u64) -> Vec<u8> {
    (0..FILE_BYTES).map(|i| (i as u64 * 7 + n) as u8).collect()
}

/// Makes file `f{n}` and writes its content, through `apply_fs_now` (a
/// group commit in sync mode, the pending transaction in async mode).
fn make_file(store: &Store, n: u64) -> Result<(), StoreError> {
    let made = store.apply_fs_now(stamp(10 + 2 * n as i64), new_file(&format!("f{n}")))?;
    let ino = match made {
        Ok(FsReply::Attr(a)) => a.ino,
        other => panic!("making f{n}: {other:?}"),
    };
    let wrote = store.apply_fs_now(
        stamp(11 + 2 * n as i64),
        FsOp::Write {
            ino,
            offset: 0,
            data: content(n),
            kill_suidgid: false,
        },
    )?;
    assert!(wrote.is_ok(), "writing f{n}: {wrote:?}");
    Ok(())
}

fn mounted(store: &Store) {
    store
        .apply_fs(stamp(0), FsOp::Mount { uid: 0, gid: 0 })
        .unwrap()
        .expect("the operation succeeds");
    store.flush().wait().unwrap();
}

/// The files in the root directory of the database at `data` (opened
/// without tablix), each with whether its content is intact; panics
/// unless the file system checks clean.
fn files_after(data: &Path) -> Vec<(String, bool)> {
    super::recover(data);
    let conn = Connection::open(data.join("tablix.db")).unwrap();
    let report = check(
        &conn,
        0,
        Options {
            repair: false,
            verify_data: true,
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    let mut st = conn
        .prepare("SELECT CAST(name AS TEXT), ino FROM tablix_dirent WHERE parent = 1 ORDER BY name")
        .unwrap();
    let rows: Vec<(String, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows.into_iter()
        .map(|(name, ino)| {
            let n: u64 = name.trim_start_matches('f').parse().unwrap();
            let data = tablix_fs::read::read(&conn, ino as u64, 0, FILE_BYTES as u32 + 1).unwrap();
            (name, data == content(n))
        })
        .collect()
}

fn names(files: &[(String, bool)]) -> Vec<&str> {
    files.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn file_system_writes_survive_power_loss_as_each_mode_promises() {
    for mode in [Durability::Sync, Durability::Async] {
        let (fault, dir, config) = faulty_store(mode);
        let store = Store::open(config).unwrap();
        mounted(&store);
        for n in 0..4 {
            make_file(&store, n).unwrap();
        }
        // Async mode promises what was flushed; sync mode every write.
        store.flush().wait().unwrap();
        for n in 4..8 {
            make_file(&store, n).unwrap();
        }
        fault.freeze();
        drop(store);
        fault.power_loss().unwrap();
        let files = files_after(dir.path());
        let want: Vec<String> = match mode {
            Durability::Sync => (0..8).map(|n| format!("f{n}")).collect(),
            Durability::Async => (0..4).map(|n| format!("f{n}")).collect(),
        };
        assert_eq!(names(&files), want, "{mode:?}");
        assert!(
            files.iter().all(|(_, intact)| *intact),
            "{mode:?}: {files:?}"
        );
    }
}

/// A flush that fails under acknowledged async-mode writes, and groups
/// that wait behind it: the writes are either committed once the disk
/// works again, or (rolled back by SQLite) applied from the command log
/// at restart. Never gone in silence.
#[test]
fn io_errors_under_pending_file_system_writes_never_lose_them_silently() {
    let (fault, dir, config) = faulty_store(Durability::Async);
    let store = Store::open(config).unwrap();
    mounted(&store);
    store
        .apply_sql(stamp(1), sql(&["CREATE TABLE t(x)"]))
        .unwrap();
    for n in 0..3 {
        make_file(&store, n).unwrap();
    }
    fault.fail_io(true);
    let flushed = store.flush().wait();
    let e = flushed.expect_err("a flush on a failing disk succeeded");
    assert_eq!(e.sqlite_code(), Some(ErrorCode::SystemIoFailure), "{e}");
    // A SQL group must commit the pending writes first: it fails whole.
    let e = store
        .apply_sql(stamp(2), sql(&["INSERT INTO t VALUES (1)"]))
        .expect_err("a group committed over failing I/O");
    assert!(e.sqlite_code().is_some(), "untyped: {e:?}");
    fault.fail_io(false);
    match make_file(&store, 3) {
        Ok(()) => {
            // The pending writes were kept: all of them become durable.
            store.flush().wait().unwrap();
            fault.freeze();
            drop(store);
            fault.power_loss().unwrap();
            let files = files_after(dir.path());
            assert_eq!(names(&files), ["f0", "f1", "f2", "f3"]);
            assert!(files.iter().all(|(_, intact)| *intact), "{files:?}");
        }
        Err(StoreError::Stopped { cause, .. }) => {
            // SQLite rolled the pending writes back, but their log entries
            // were synced: the state machine stops (and says so to every
            // later caller), and the restart applies them from the log.
            let again = make_file(&store, 4).unwrap_err();
            assert!(matches!(again, StoreError::Stopped { .. }), "{again}");
            assert!(cause.code.is_some(), "the stop carries no SQLite code");
            drop(store);
            let files = files_after(dir.path());
            assert_eq!(names(&files), ["f0", "f1", "f2"]);
            assert!(files.iter().all(|(_, intact)| *intact), "{files:?}");
        }
        Err(other) => panic!("after the disk recovered: {other}"),
    }
}

/// On a full disk a file-system write fails with SQLite's SQLITE_FULL,
/// typed (the mount answers ENOSPC), applies nothing, and the writes
/// acknowledged before it stay.
#[test]
fn a_full_disk_fails_file_system_writes_typed_and_keeps_what_was_acknowledged() {
    for mode in [Durability::Sync, Durability::Async] {
        let (fault, dir, config) = faulty_store(mode);
        let store = Store::open(config).unwrap();
        mounted(&store);
        for n in 0..2 {
            make_file(&store, n).unwrap();
        }
        store.flush().wait().unwrap();
        fault.fill_disk(true);
        // Sync mode fails the write's group commit; async mode fails at
        // the flush that commits the pending transaction.
        let failed = match mode {
            Durability::Sync => make_file(&store, 2).unwrap_err(),
            Durability::Async => {
                make_file(&store, 2).unwrap();
                store.flush().wait().unwrap_err()
            }
        };
        assert_eq!(
            failed.sqlite_code(),
            Some(ErrorCode::DiskFull),
            "{mode:?}: {failed:?}"
        );
        fault.fill_disk(false);
        match (mode, store.flush().wait()) {
            (_, Ok(())) | (Durability::Async, Err(StoreError::Stopped { .. })) => {}
            (_, Err(e)) => panic!("{mode:?}: flushing once space is back: {e}"),
        }
        let later = make_file(&store, 3);
        drop(store);
        let files = files_after(dir.path());
        let shown = names(&files);
        assert!(
            files.iter().all(|(_, intact)| *intact),
            "{mode:?}: {files:?}"
        );
        assert_eq!(
            &shown[..2],
            ["f0", "f1"],
            "{mode:?}: acknowledged files lost"
        );
        match (mode, later) {
            (Durability::Sync, Ok(())) => assert_eq!(shown, ["f0", "f1", "f3"], "{mode:?}"),
            // Kept and committed once space was back, or declared lost.
            (Durability::Async, Ok(())) => {
                assert!(shown == ["f0", "f1", "f2", "f3"], "{mode:?}: {shown:?}")
            }
            // SQLite rolled them back: the state machine stopped, and
            // the restart applied them from the log.
            (Durability::Async, Err(StoreError::Stopped { .. })) => {
                assert_eq!(shown, ["f0", "f1", "f2"], "{mode:?}")
            }
            (_, Err(e)) => panic!("{mode:?}: after space came back: {e}"),
        }
    }
}
