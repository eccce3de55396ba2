//! Operations applied directly to a database, without FUSE.

use rusqlite::Connection;

use crate::check::check;
use crate::op::{FsOp, FsReply, ROOT, SetAttr};
use crate::read;
use crate::schema::{BLOCK_SIZE, SCHEMA};
use crate::{Errno, apply};

fn fs() -> Connection {
    let c = Connection::open_in_memory().expect("memory db");
    c.execute_batch("CREATE TABLE tablix_meta(key TEXT PRIMARY KEY, value ANY) STRICT;")
        .expect("meta");
    c.execute_batch(SCHEMA).expect("schema");
    apply(&c, 1, &FsOp::Mount { uid: 0, gid: 0 }).expect("mount");
    c
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
    assert_eq!(apply(&c, 8, &into_self), Err(Errno::EINVAL));
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
    assert_eq!(read::getattr(&c, f), Err(Errno::ENOENT));
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
