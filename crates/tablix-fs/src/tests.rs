//! Operations applied directly to a database, without FUSE.

use rusqlite::Connection;

use proptest::prelude::*;

use crate::check::{self, Options, Report};
use crate::op::{Attr, FsOp, FsReply, LockKind, ROOT, SetAttr, Touched};
use crate::read;
use crate::schema::{
    BLOCK_SIZE, MIGRATION_2, MIGRATION_3, MIGRATION_4, MIGRATION_6, MIGRATION_7, MIGRATION_8,
};
use crate::{Errno, FsError, apply};

/// A database as the store's migrations leave it, before migration 3.
fn fs_v2() -> Connection {
    let c = Connection::open_in_memory().expect("memory db");
    c.execute_batch("CREATE TABLE tablix_meta(key TEXT PRIMARY KEY, value ANY) STRICT;")
        .expect("meta");
    c.execute_batch(MIGRATION_2).expect("schema");
    c
}

/// The file system's migrations after the second, in order.
const AFTER_V2: &[&str] = &[
    MIGRATION_3,
    MIGRATION_4,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
];

/// Runs the migrations from 3 on, as the store does.
fn migrate(c: &Connection, migrations: &[&str]) {
    c.execute_batch("PRAGMA legacy_alter_table = ON; PRAGMA foreign_keys = OFF;")
        .expect("pragmas");
    for m in migrations {
        c.execute_batch(&format!("BEGIN; {m} COMMIT;"))
            .expect("migration");
    }
}

fn fs() -> Connection {
    let c = fs_v2();
    migrate(&c, AFTER_V2);
    apply(&c, 1, &FsOp::Mount { uid: 0, gid: 0 }).expect("mount");
    c
}

/// Checks with every data block verified; `repair` as fsck's.
fn check(c: &Connection, now: i64, repair: bool) -> Result<Report, FsError> {
    check::check(
        c,
        now,
        Options {
            repair,
            verify_data: true,
        },
        &mut |_| {},
    )
}

fn node(c: &Connection, parent: u64, name: &str, mode: u32) -> u64 {
    match apply(
        c,
        2,
        &FsOp::MakeNode {
            parent,
            name: name.into(),
            mode,
            rdev: 0,
            uid: 0,
            gid: 0,
        },
    ) {
        Ok(FsReply::Attr(a)) => a.ino,
        other => panic!("make {name}: {other:?}"),
    }
}

fn write(c: &Connection, ino: u64, offset: u64, data: &[u8]) {
    apply(
        c,
        3,
        &FsOp::Write {
            ino,
            offset,
            data: data.to_vec(),
            kill_suidgid: false,
        },
    )
    .unwrap_or_else(|e| panic!("write: {e:?}"));
}

#[test]
fn truncation_keeps_no_bytes_past_the_size_and_counts_allocation() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    write(&c, f, 0, &vec![1u8; (BLOCK_SIZE * 2 + 10) as usize]);
    assert_eq!(
        read::getattr(&c, f).expect("attr").allocated,
        BLOCK_SIZE * 2 + 10
    );
    let set = |size| FsOp::SetAttr {
        ino: f,
        attr: SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    };
    apply(&c, 4, &set(100)).expect("shrink");
    assert_eq!(read::getattr(&c, f).expect("attr").allocated, 100);
    apply(&c, 5, &set(BLOCK_SIZE * 3)).expect("grow");
    let back = read::read(&c, f, 0, (BLOCK_SIZE * 3) as u32).expect("read");
    assert!(back[..100].iter().all(|&b| b == 1));
    assert!(back[100..].iter().all(|&b| b == 0));
    // A hole, then data: SEEK_HOLE and SEEK_DATA find the boundary.
    write(&c, f, BLOCK_SIZE * 2, b"x");
    assert_eq!(read::seek(&c, f, 0, libc::SEEK_HOLE), Ok(BLOCK_SIZE));
    assert_eq!(
        read::seek(&c, f, BLOCK_SIZE, libc::SEEK_DATA),
        Ok(BLOCK_SIZE * 2)
    );
    assert!(check(&c, 6, false).expect("check").is_clean());
}

#[test]
fn exchange_across_directories_moves_link_counts() {
    let c = fs();
    let a = node(&c, ROOT, "a", libc::S_IFDIR | 0o755);
    let b = node(&c, ROOT, "b", libc::S_IFDIR | 0o755);
    node(&c, a, "sub", libc::S_IFDIR | 0o755);
    node(&c, b, "file", libc::S_IFREG | 0o644);
    let op = FsOp::Rename {
        parent: a,
        name: b"sub".to_vec(),
        new_parent: b,
        new_name: b"file".to_vec(),
        flags: libc::RENAME_EXCHANGE,
    };
    apply(&c, 7, &op).expect("exchange");
    assert_eq!(read::getattr(&c, a).expect("a").nlink, 2);
    assert_eq!(read::getattr(&c, b).expect("b").nlink, 3);
    assert!(read::lookup(&c, b, b"file").expect("file").is_dir());
    // A directory cannot move below itself.
    let into_self = FsOp::Rename {
        parent: ROOT,
        name: b"b".to_vec(),
        new_parent: read::lookup(&c, b, b"file").expect("sub").ino,
        new_name: b"x".to_vec(),
        flags: 0,
    };
    assert_eq!(apply(&c, 8, &into_self), Err(FsError::Errno(Errno::EINVAL)));
    assert!(check(&c, 9, false).expect("check").is_clean());
}

#[test]
fn unlinked_inodes_wait_for_reclaim_and_check_repairs_damage() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    write(&c, f, 0, b"data");
    apply(
        &c,
        10,
        &FsOp::Unlink {
            parent: ROOT,
            name: b"f".to_vec(),
        },
    )
    .expect("unlink");
    // Still readable (an open file) until reclaimed.
    assert_eq!(read::read(&c, f, 0, 10).expect("read"), b"data");
    apply(&c, 11, &FsOp::Reclaim { inodes: vec![f] }).expect("reclaim");
    assert_eq!(read::getattr(&c, f), Err(FsError::Errno(Errno::ENOENT)));
    let g = node(&c, ROOT, "g", libc::S_IFREG | 0o644);
    c.execute(
        "UPDATE tablix_inode SET nlink = 5 WHERE ino = ?1",
        [g as i64],
    )
    .expect("damage");
    let report = check(&c, 12, true).expect("check");
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(check(&c, 13, false).expect("recheck").is_clean());
}

#[test]
fn writes_inside_stored_bytes_patch_in_place() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    write(&c, f, 0, &vec![1u8; 100_000]);
    write(&c, f, 10, b"abc");
    write(&c, f, BLOCK_SIZE + 5, b"xyz");
    let back = read::read(&c, f, 0, 100_000).expect("read");
    assert_eq!(&back[8..15], &[1, 1, b'a', b'b', b'c', 1, 1]);
    assert_eq!(
        &back[(BLOCK_SIZE + 5) as usize..(BLOCK_SIZE + 8) as usize],
        b"xyz"
    );
    assert_eq!(back.len(), 100_000);
    assert!(check(&c, 20, false).expect("check").is_clean());
}

#[test]
fn whole_block_rewrites_patch_in_place_and_keep_the_allocation() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    let block = BLOCK_SIZE as usize;
    write(&c, f, 0, &vec![1u8; block * 2 + 7]);
    // Whole blocks over whole stored blocks, one of them inside a larger
    // write that also extends the short last block.
    write(&c, f, 0, &vec![2u8; block]);
    let mut tail = vec![3u8; block];
    tail.extend_from_slice(&[4u8; 20]);
    write(&c, f, BLOCK_SIZE, &tail);
    let back = read::read(&c, f, 0, (BLOCK_SIZE * 3) as u32).expect("read");
    assert_eq!(back.len(), block * 2 + 20);
    assert!(back[..block].iter().all(|&b| b == 2));
    assert!(back[block..block * 2].iter().all(|&b| b == 3));
    assert!(back[block * 2..].iter().all(|&b| b == 4));
    let a = read::getattr(&c, f).expect("attr");
    assert_eq!(a.size, BLOCK_SIZE * 2 + 20);
    assert_eq!(a.allocated, BLOCK_SIZE * 2 + 20);
    assert!(check(&c, 21, false).expect("check").is_clean());
}

#[test]
fn checksums_catch_damaged_data_and_name_the_file() {
    let c = fs();
    let d = node(&c, ROOT, "docs", libc::S_IFDIR | 0o755);
    let f = node(&c, d, "report", libc::S_IFREG | 0o644);
    write(&c, f, 0, &vec![7u8; 100_000]);
    let r = check(&c, 30, false).expect("check");
    assert!(r.is_clean(), "{r:?}");
    assert_eq!((r.verified_blocks, r.unverified_blocks), (2, 0));
    // One byte changed behind the file system's back.
    c.blob_open(
        rusqlite::MAIN_DB,
        "tablix_block",
        "data",
        crate::schema::block_key(f, 1),
        false,
    )
    .and_then(|mut b| b.write_at(&[0], 100))
    .expect("damage");
    let r = check(&c, 31, true).expect("check");
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert!(
        r.problems[0].contains("block 1 of inode") && r.problems[0].contains("/docs/report"),
        "{r:?}"
    );
    assert_eq!(r.unrepaired, 1, "damaged data cannot be repaired");
}

#[test]
fn blocks_from_before_checksums_stay_readable_and_count_as_unverified() {
    let c = fs();
    let f = node(&c, ROOT, "old", libc::S_IFREG | 0o644);
    write(&c, f, 0, &vec![5u8; 1000]);
    c.execute("DELETE FROM tablix_block_sum", [])
        .expect("legacy");
    // A patch inside the stored bytes keeps it unverified, not wrong.
    write(&c, f, 10, b"new");
    let r = check(&c, 2, false).expect("check");
    assert!(r.is_clean(), "{r:?}");
    assert_eq!((r.verified_blocks, r.unverified_blocks), (0, 1));
    assert_eq!(
        &read::read(&c, f, 9, 5).expect("read"),
        &[5, b'n', b'e', b'w', 5]
    );
    // Stored whole again, it gets a checksum.
    write(&c, f, 0, &vec![6u8; 2000]);
    let r = check(&c, 3, false).expect("check");
    assert_eq!((r.verified_blocks, r.unverified_blocks), (1, 0));
}

#[test]
fn migration_4_moves_checksums_and_keeps_data() {
    let c = fs_v2();
    migrate(&c, &[MIGRATION_3]);
    // Two blocks of one file as migration 3 stored them: one with its
    // checksum in the row, one from before checksums.
    let (a, b) = (vec![1u8; BLOCK_SIZE as usize], vec![2u8; 100]);
    c.execute(
        "INSERT INTO tablix_inode(ino, mode, nlink, uid, gid, size, allocated, atime_ns, mtime_ns, ctime_ns, btime_ns)
             VALUES (2, 33188, 1, 0, 0, ?1, ?1, 0, 0, 0, 0)",
        [BLOCK_SIZE as i64 + 100],
    )
    .expect("inode");
    c.execute(
        "INSERT INTO tablix_dirent(parent, name, ino) VALUES (1, CAST('f' AS BLOB), 2)",
        [],
    )
    .expect("entry");
    c.execute(
        "INSERT INTO tablix_block(id, data, crc) VALUES (?1, ?2, ?3), (?4, ?5, NULL)",
        rusqlite::params![
            crate::schema::block_key(2, 0),
            a,
            &crate::checksum::of(&a)[..],
            crate::schema::block_key(2, 1),
            b
        ],
    )
    .expect("blocks");
    migrate(&c, &AFTER_V2[1..]);
    apply(&c, 1, &FsOp::Mount { uid: 0, gid: 0 }).expect("mount");
    let r = check(&c, 2, false).expect("check");
    assert!(r.is_clean(), "{r:?}");
    assert_eq!((r.verified_blocks, r.unverified_blocks), (1, 1));
    let back = read::read(&c, 2, 0, BLOCK_SIZE as u32 + 100).expect("read");
    assert_eq!(&back[..BLOCK_SIZE as usize], &a[..]);
    assert_eq!(&back[BLOCK_SIZE as usize..], &b[..]);
    let columns: i64 = c
        .query_row(
            "SELECT count(*) FROM pragma_table_info('tablix_block')",
            [],
            |r| r.get(0),
        )
        .expect("columns");
    assert_eq!(columns, 2, "the row keeps only id and data");
}

#[test]
fn checksums_of_missing_blocks_are_found_and_removed() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    write(&c, f, 0, &[3u8; 10]);
    c.execute("DELETE FROM tablix_block", [])
        .expect("lose data");
    c.execute(
        "UPDATE tablix_inode SET size = 0, allocated = 0 WHERE ino = ?1",
        [f as i64],
    )
    .expect("size");
    let r = check(&c, 2, true).expect("check");
    assert_eq!(r.problems.len(), 1, "{r:?}");
    assert!(r.problems[0].contains("checksum but no data"), "{r:?}");
    assert!(check(&c, 3, false).expect("check").is_clean());
}

#[test]
fn migration_3_keeps_inodes_and_never_reuses_their_numbers() {
    let c = fs_v2();
    // Before migration 3, AUTOINCREMENT numbered inodes; the highest ever
    // handed out was 9 although 9 is gone now.
    c.execute_batch(
        "INSERT INTO tablix_inode(ino, mode, nlink, uid, gid, atime_ns, mtime_ns, ctime_ns, btime_ns)
             VALUES (9, 33188, 1, 0, 0, 0, 0, 0, 0);
         INSERT INTO tablix_dirent(parent, name, ino) VALUES (1, CAST('nine' AS BLOB), 9);
         DELETE FROM tablix_dirent WHERE ino = 9; DELETE FROM tablix_inode WHERE ino = 9;
         INSERT INTO tablix_inode(ino, mode, nlink, uid, gid, atime_ns, mtime_ns, ctime_ns, btime_ns)
             VALUES (5, 33188, 1, 0, 0, 0, 0, 0, 0);
         INSERT INTO tablix_dirent(parent, name, ino) VALUES (1, CAST('five' AS BLOB), 5);",
    )
    .expect("old rows");
    migrate(&c, AFTER_V2);
    let seq: i64 = c
        .query_row("SELECT count(*) FROM sqlite_sequence", [], |r| r.get(0))
        .expect("sequence");
    assert_eq!(seq, 0, "no system rows left in sqlite_sequence");
    assert_eq!(read::lookup(&c, ROOT, b"five").expect("five").ino, 5);
    let n = node(&c, ROOT, "new", libc::S_IFREG | 0o644);
    assert_eq!(n, 10);
    assert!(check(&c, 2, false).expect("check").is_clean());
}

#[test]
fn paths_resolve_with_permissions_dots_and_symlinks() {
    let c = fs();
    let home = node(&c, ROOT, "home", libc::S_IFDIR | 0o755);
    let private = node(&c, home, "private", libc::S_IFDIR | 0o700);
    let secret = node(&c, private, "secret", libc::S_IFREG | 0o644);
    apply(
        &c,
        2,
        &FsOp::Symlink {
            parent: home,
            name: b"link".to_vec(),
            target: b"private/secret".to_vec(),
            uid: 0,
            gid: 0,
        },
    )
    .expect("symlink");
    apply(
        &c,
        2,
        &FsOp::Symlink {
            parent: ROOT,
            name: b"loop".to_vec(),
            target: b"/loop".to_vec(),
            uid: 0,
            gid: 0,
        },
    )
    .expect("loop");
    let root = |_: &Attr, _: u32| true;
    // Someone else: only "other" bits apply.
    let other = |a: &Attr, mask: u32| a.mode & mask == mask;
    assert_eq!(
        read::resolve(&c, b"/home/link", &root).map(|a| a.ino),
        Ok(secret)
    );
    assert_eq!(
        read::resolve(&c, b"/home/./private/../private//secret", &root).map(|a| a.ino),
        Ok(secret)
    );
    assert_eq!(
        read::resolve(&c, b"/home/link", &other),
        Err(FsError::Errno(Errno::EACCES))
    );
    assert_eq!(read::resolve(&c, b"/home", &other).map(|a| a.ino), Ok(home));
    assert_eq!(
        read::resolve(&c, b"/loop", &root),
        Err(FsError::Errno(Errno::ELOOP))
    );
    assert_eq!(
        read::resolve(&c, b"/home/link/", &root),
        Err(FsError::Errno(Errno::ENOTDIR))
    );
    assert_eq!(
        read::resolve(&c, b"/nope", &root),
        Err(FsError::Errno(Errno::ENOENT))
    );
    assert_eq!(
        read::resolve(&c, b"home", &root),
        Err(FsError::Errno(Errno::EINVAL))
    );
    let long = format!("/{}", "a".repeat(300));
    assert_eq!(
        read::resolve(&c, long.as_bytes(), &root),
        Err(FsError::Errno(Errno::ENAMETOOLONG))
    );
}

/// One step of the checksum property test.
#[derive(Clone, Debug)]
enum Step {
    Write(u64, Vec<u8>),
    Truncate(u64),
    Punch(u64, u64),
    Allocate(u64, u64),
}

fn step() -> impl Strategy<Value = Step> {
    let at = 0..BLOCK_SIZE * 3;
    prop_oneof![
        4 => (at.clone(), prop::collection::vec(any::<u8>(), 1..20_000)).prop_map(|(o, d)| Step::Write(o, d)),
        1 => at.clone().prop_map(Step::Truncate),
        1 => (at.clone(), 1..BLOCK_SIZE).prop_map(|(o, l)| Step::Punch(o, l)),
        1 => (at, 1..BLOCK_SIZE).prop_map(|(o, l)| Step::Allocate(o, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Whatever path a change takes (in-place patch, whole-block store,
    /// read-modify-write, truncation, hole punching, allocation), the data
    /// matches a plain byte vector and every block matches its checksum.
    #[test]
    fn every_write_path_keeps_blocks_and_checksums_right(steps in prop::collection::vec(step(), 1..24)) {
        let c = fs();
        let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
        let mut model: Vec<u8> = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let now = 100 + i as i64;
            match s {
                Step::Write(o, d) => {
                    write(&c, f, *o, d);
                    let end = *o as usize + d.len();
                    if model.len() < end { model.resize(end, 0); }
                    model[*o as usize..end].copy_from_slice(d);
                }
                Step::Truncate(n) => {
                    apply(&c, now, &FsOp::SetAttr { ino: f, attr: SetAttr { size: Some(*n), ..SetAttr::default() } }).expect("truncate");
                    model.resize(*n as usize, 0);
                }
                Step::Punch(o, l) => {
                    apply(&c, now, &FsOp::Fallocate { ino: f, offset: *o, length: *l, mode: libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE }).expect("punch");
                    let end = ((*o + *l) as usize).min(model.len());
                    if (*o as usize) < end { model[*o as usize..end].fill(0); }
                }
                Step::Allocate(o, l) => {
                    apply(&c, now, &FsOp::Fallocate { ino: f, offset: *o, length: *l, mode: 0 }).expect("allocate");
                    let end = (*o + *l) as usize;
                    if model.len() < end { model.resize(end, 0); }
                }
            }
        }
        let back = read::read(&c, f, 0, (BLOCK_SIZE * 5) as u32).expect("read");
        prop_assert_eq!(back, model);
        let r = check(&c, 1000, false).expect("check");
        prop_assert!(r.is_clean(), "{:?}", r);
        prop_assert_eq!(r.unverified_blocks, 0);
    }
}

/// Whether `ino` still exists (unlinked or not).
fn exists(c: &Connection, ino: u64) -> bool {
    match read::getattr(c, ino) {
        Ok(_) => true,
        Err(FsError::Errno(Errno::ENOENT)) => false,
        Err(e) => panic!("getattr {ino}: {e:?}"),
    }
}

fn unlink(c: &Connection, now: i64, name: &str) {
    apply(
        c,
        now,
        &FsOp::Unlink {
            parent: ROOT,
            name: name.into(),
        },
    )
    .expect("unlink");
}

fn release(c: &Connection, now: i64, node: u64, inodes: &[u64]) {
    apply(
        c,
        now,
        &FsOp::Release {
            node,
            inodes: inodes.to_vec(),
        },
    )
    .expect("release");
}

#[test]
fn on_a_cluster_an_unlinked_file_lives_until_every_mounted_node_released_it() {
    let c = fs();
    for node in [1, 2] {
        mount_node(&c, 2, node);
    }
    let f = self::node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    write(&c, f, 0, b"still open on node 2");
    // A release of a linked inode records nothing: the node may look it
    // up again.
    release(&c, 4, 1, &[f]);
    unlink(&c, 5, "f");
    release(&c, 6, 1, &[f]);
    assert_eq!(
        read::read(&c, f, 0, 64).expect("read"),
        b"still open on node 2"
    );
    // Node 1 released it again; node 2 still holds it.
    release(&c, 7, 1, &[f]);
    assert!(exists(&c, f));
    release(&c, 8, 2, &[f]);
    assert!(!exists(&c, f));
    // Released before its unlinking, by both nodes: it waits for node 1.
    let g = self::node(&c, ROOT, "g", libc::S_IFREG | 0o644);
    release(&c, 8, 1, &[g]);
    release(&c, 8, 2, &[g]);
    unlink(&c, 8, "g");
    release(&c, 8, 2, &[g]);
    assert!(exists(&c, g));
    release(&c, 8, 1, &[g]);
    assert!(!exists(&c, g));
    let releases: i64 = c
        .query_row("SELECT count(*) FROM tablix_release", [], |r| r.get(0))
        .expect("count");
    assert_eq!(releases, 0, "a freed inode's releases go with it");
    assert!(check(&c, 9, false).expect("check").is_clean());
}

#[test]
fn a_node_mounting_again_releases_all_it_held_and_one_that_left_is_waited_for_no_more() {
    let c = fs();
    for node in [1, 2, 3] {
        mount_node(&c, 2, node);
    }
    let g = node(&c, ROOT, "g", libc::S_IFREG | 0o644);
    let h = node(&c, ROOT, "h", libc::S_IFREG | 0o644);
    unlink(&c, 5, "g");
    unlink(&c, 5, "h");
    release(&c, 6, 2, &[g, h]);
    release(&c, 6, 3, &[g]);
    // Node 1 restarts: its kernel holds nothing now.
    mount_node(&c, 7, 1);
    assert!(!exists(&c, g));
    assert!(exists(&c, h), "node 3 may still hold h");
    // Node 3 leaves the cluster.
    apply(&c, 8, &FsOp::Unmount { node: 3 }).expect("unmount");
    assert!(!exists(&c, h));
    let mounted: Vec<i64> = c
        .prepare("SELECT node FROM tablix_mount ORDER BY node")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(mounted, [1, 2]);
    assert!(check(&c, 9, false).expect("check").is_clean());
}

#[test]
fn check_removes_releases_of_inodes_that_are_not_unlinked() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    c.execute(
        "INSERT INTO tablix_release(ino, node) VALUES (?1, 1), (999, 1)",
        [f as i64],
    )
    .expect("damage");
    let report = check(&c, 10, true).expect("check");
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(
        report.problems.iter().all(|p| p.starts_with("9: ")),
        "{report:?}"
    );
    assert!(check(&c, 11, false).expect("recheck").is_clean());
}

fn lock(
    c: &Connection,
    (node, owner): (u64, u64),
    ino: u64,
    range: (u64, u64),
    kind: LockKind,
) -> Result<FsReply, FsError> {
    apply(
        c,
        20,
        &FsOp::Lock {
            node,
            owner,
            pid: 7,
            ino,
            start: range.0,
            end: range.1,
            kind,
        },
    )
}

fn locks_of(c: &Connection, ino: u64) -> Vec<(i64, i64, i64, i64, bool)> {
    c.prepare("SELECT node, owner, start, end, write FROM tablix_lock WHERE ino = ?1 ORDER BY node, owner, start")
        .expect("prepare")
        .query_map([ino as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn locks_of_different_owners_conflict_as_posix_says_and_an_owner_changes_its_own_freely() {
    let c = fs();
    let f = node(&c, ROOT, "db", libc::S_IFREG | 0o644);
    let end = u64::MAX;
    let (a, b, a_elsewhere) = ((1, 10), (2, 10), (2, 11));
    // Read locks share; a write lock excludes every other owner's lock.
    lock(&c, a, f, (0, end), LockKind::Read).expect("a reads");
    lock(&c, b, f, (100, 199), LockKind::Read).expect("b reads too");
    assert_eq!(
        lock(&c, b, f, (0, 0), LockKind::Write),
        Err(FsError::Errno(Errno::EAGAIN))
    );
    assert_eq!(
        lock(&c, a_elsewhere, f, (150, 150), LockKind::Write),
        Err(FsError::Errno(Errno::EAGAIN))
    );
    // An owner upgrades inside its own lock, splitting it.
    lock(&c, b, f, (100, 199), LockKind::Unlock).expect("b lets go");
    lock(&c, a, f, (10, 19), LockKind::Write).expect("a upgrades a part");
    assert_eq!(
        locks_of(&c, f),
        [
            (1, 10, 0, 9, false),
            (1, 10, 10, 19, true),
            (1, 10, 20, i64::MAX, false)
        ]
    );
    // Another owner may read beside the write lock, not over it.
    lock(&c, b, f, (20, 29), LockKind::Read).expect("beside it");
    assert_eq!(
        lock(&c, b, f, (15, 25), LockKind::Read),
        Err(FsError::Errno(Errno::EAGAIN))
    );
    // A refused lock changed nothing.
    assert_eq!(locks_of(&c, f).len(), 4);
    // An unlock of the middle leaves both ends.
    lock(&c, a, f, (5, 24), LockKind::Unlock).expect("a unlocks the middle");
    assert_eq!(
        locks_of(&c, f),
        [
            (1, 10, 0, 4, false),
            (1, 10, 25, i64::MAX, false),
            (2, 10, 20, 29, false)
        ]
    );
    assert_eq!(
        lock(&c, b, f, (9, 5), LockKind::Read),
        Err(FsError::Errno(Errno::EINVAL))
    );
    assert!(check(&c, 21, false).expect("check").is_clean());
}

#[test]
fn a_nodes_locks_go_when_it_mounts_again_or_leaves_and_a_freed_files_with_it() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    let g = node(&c, ROOT, "g", libc::S_IFREG | 0o644);
    for node in [1, 2, 3] {
        mount_node(&c, 2, node);
    }
    lock(&c, (1, 5), f, (0, 9), LockKind::Write).expect("node 1");
    lock(&c, (2, 5), f, (10, 19), LockKind::Write).expect("node 2");
    lock(&c, (3, 5), g, (0, 0), LockKind::Read).expect("node 3");
    mount_node(&c, 3, 1);
    lock(&c, (2, 6), f, (0, 9), LockKind::Write).expect("node 1's lock went");
    apply(&c, 4, &FsOp::Unmount { node: 2 }).expect("node 2 leaves");
    assert_eq!(locks_of(&c, f), []);
    unlink(&c, 5, "g");
    release(&c, 6, 1, &[g]);
    release(&c, 6, 3, &[g]);
    assert_eq!(locks_of(&c, g), [], "freed with its inode");
    assert_eq!(
        lock(&c, (3, 5), g, (0, 0), LockKind::Read),
        Err(FsError::Errno(Errno::ENOENT))
    );
    c.execute("INSERT INTO tablix_lock VALUES (999, 1, 1, 0, 0, 1, 1)", [])
        .expect("damage");
    let report = check(&c, 7, true).expect("check");
    assert!(
        report.problems.iter().any(|p| p.starts_with("10: ")),
        "{report:?}"
    );
    assert!(check(&c, 8, false).expect("recheck").is_clean());
}

/// A cluster node's mount.
fn mount_node(c: &Connection, now: i64, node: u64) {
    apply(
        c,
        now,
        &FsOp::MountNode {
            uid: 0,
            gid: 0,
            node,
        },
    )
    .expect("mount");
}

#[test]
fn an_expired_lease_takes_one_nodes_locks_and_leaves_its_mount_and_open_files() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    let g = node(&c, ROOT, "g", libc::S_IFREG | 0o644);
    for node in [1, 2] {
        mount_node(&c, 2, node);
    }
    lock(&c, (1, 5), f, (0, 9), LockKind::Write).expect("node 1");
    lock(&c, (2, 5), f, (10, 19), LockKind::Write).expect("node 2");
    lock(&c, (2, 6), g, (0, 0), LockKind::Read).expect("node 2 again");
    assert_eq!(read::lock_holders(&c).expect("holders"), [1, 2]);
    // Node 2 holds g open after its unlinking.
    unlink(&c, 3, "g");
    release(&c, 4, 1, &[g]);
    apply(&c, 5, &FsOp::ExpireLocks { node: 2 }).expect("expire");
    assert_eq!(read::lock_holders(&c).expect("holders"), [1]);
    assert_eq!(locks_of(&c, f), [(1, 5, 0, 9, true)]);
    assert_eq!(locks_of(&c, g), []);
    assert_eq!(
        read::mounted_nodes(&c).expect("mounts"),
        [1, 2],
        "still a mount"
    );
    assert!(
        read::getattr(&c, g).is_ok(),
        "the file node 2 holds open stays"
    );
    // What node 2 held is free; node 1's lock still stands.
    lock(&c, (1, 7), f, (10, 19), LockKind::Write).expect("free now");
    assert_eq!(
        lock(&c, (2, 5), f, (0, 0), LockKind::Read),
        Err(FsError::Errno(Errno::EAGAIN))
    );
    // Expiring a node without locks changes nothing.
    apply(&c, 6, &FsOp::ExpireLocks { node: 9 }).expect("no locks");
    let report = check(&c, 7, false).expect("check");
    assert!(
        report.problems.iter().all(|p| p.starts_with("5: ")),
        "only the file held open is reported: {report:?}"
    );
    // Node 2's process (pid 7) is told its locks were lost, on each file,
    // until its owner lets go of the whole file (its close).
    assert_eq!(read::lost_lock_pids(&c, f, 2).expect("lost"), [7]);
    assert_eq!(read::lost_lock_pids(&c, g, 2).expect("lost"), [7]);
    assert_eq!(read::lost_lock_pids(&c, f, 1).expect("kept"), []);
    assert!(!read::holds_lock(&c, f, (2, 5)).expect("holds"));
    assert!(read::holds_or_lost_lock(&c, f, (2, 5)).expect("lost"));
    assert!(!read::holds_or_lost_lock(&c, f, (2, 6)).expect("another owner"));
    lock(&c, (2, 5), f, (0, 99), LockKind::Unlock).expect("part");
    assert_eq!(read::lost_lock_pids(&c, f, 2).expect("lost"), [7]);
    lock(&c, (2, 5), f, (0, u64::MAX), LockKind::Unlock).expect("closed");
    assert_eq!(read::lost_lock_pids(&c, f, 2).expect("forgotten"), []);
    // A node that mounts again starts with nothing lost.
    mount_node(&c, 8, 2);
    assert_eq!(read::lost_lock_pids(&c, g, 2).expect("remounted"), []);
}

#[test]
fn a_fenced_change_is_refused_once_the_lease_took_its_senders_lock() {
    let c = fs();
    let f = node(&c, ROOT, "f", libc::S_IFREG | 0o644);
    mount_node(&c, 2, 3);
    lock(&c, (3, 5), f, (0, 9), LockKind::Write).expect("lock");
    let fenced = |pid: u32, data: &[u8]| FsOp::Fenced {
        node: 3,
        pid,
        ino: f,
        op: Box::new(FsOp::Write {
            ino: f,
            offset: 0,
            data: data.to_vec(),
            kill_suidgid: false,
        }),
    };
    assert_eq!(
        fenced(7, b"x").touched(),
        [Touched::Data {
            ino: f,
            offset: 0,
            len: 1
        }]
    );
    // While the lock stands, the change is the write itself.
    assert_eq!(apply(&c, 4, &fenced(7, b"held")), Ok(FsReply::Written(4)));
    apply(&c, 5, &FsOp::ExpireLocks { node: 3 }).expect("expire");
    // Sent before its node knew, it lands after the expiry: refused, and
    // the file is as it was.
    assert_eq!(
        apply(&c, 6, &fenced(7, b"late")),
        Err(FsError::Errno(Errno::EIO))
    );
    assert_eq!(read::read(&c, f, 0, 10).expect("read"), b"held");
    // Another process of that node lost nothing.
    assert_eq!(apply(&c, 7, &fenced(8, b"ok")), Ok(FsReply::Written(2)));
    assert_eq!(read::read(&c, f, 0, 10).expect("read"), b"okld");
}

#[test]
fn a_lost_lock_of_a_missing_inode_is_found_and_removed() {
    let c = fs();
    c.execute("INSERT INTO tablix_lost_lock VALUES (2, 999, 7, 5)", [])
        .expect("insert");
    let report = check(&c, 2, false).expect("check");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.starts_with("11: inode 999")),
        "{report:?}"
    );
    check(&c, 3, true).expect("repair");
    assert!(check(&c, 4, false).expect("check").problems.is_empty());
}

#[test]
fn an_inode_is_found_by_the_end_of_any_of_its_names() {
    let c = fs();
    let shm = node(&c, ROOT, "db-shm", libc::S_IFREG | 0o644);
    let plain = node(&c, ROOT, "db", libc::S_IFREG | 0o644);
    assert!(read::named_with_suffix(&c, shm, b"-shm").expect("shm"));
    assert!(!read::named_with_suffix(&c, plain, b"-shm").expect("plain"));
    assert!(!read::named_with_suffix(&c, plain, b"a-longer-suffix").expect("longer"));
    // A second name counts as much as the first.
    apply(
        &c,
        3,
        &FsOp::Link {
            ino: plain,
            parent: ROOT,
            name: b"other-shm".to_vec(),
        },
    )
    .expect("link");
    assert!(read::named_with_suffix(&c, plain, b"-shm").expect("linked"));
}

#[test]
fn an_append_lands_at_the_end_the_state_holds() {
    let c = fs();
    let f = node(&c, ROOT, "log", libc::S_IFREG | 0o644);
    write(&c, f, 0, b"first\n");
    let append = |data: &[u8]| {
        apply(
            &c,
            9,
            &FsOp::Append {
                ino: f,
                data: data.to_vec(),
                kill_suidgid: false,
            },
        )
    };
    assert_eq!(append(b"second\n"), Ok(FsReply::Written(7)));
    // Past a hole too: the end is the size, not the last stored byte.
    apply(
        &c,
        10,
        &FsOp::SetAttr {
            ino: f,
            attr: SetAttr {
                size: Some(20_000),
                ..SetAttr::default()
            },
        },
    )
    .expect("grow");
    assert_eq!(append(b"third\n"), Ok(FsReply::Written(6)));
    let a = read::getattr(&c, f).expect("attr");
    assert_eq!(a.size, 20_006);
    assert_eq!(a.mtime_ns, 9, "the append's time");
    assert_eq!(read::read(&c, f, 0, 13).expect("head"), b"first\nsecond\n");
    assert_eq!(read::read(&c, f, 20_000, 100).expect("tail"), b"third\n");
    let d = node(&c, ROOT, "dir", libc::S_IFDIR | 0o755);
    assert_eq!(
        apply(
            &c,
            11,
            &FsOp::Append {
                ino: d,
                data: b"x".to_vec(),
                kill_suidgid: false
            }
        ),
        Err(FsError::Errno(Errno::EISDIR))
    );
    assert!(check(&c, 12, false).expect("check").is_clean());
}
