//! Random sequences of file-system operations, run on the mount and on an
//! in-memory model; results, contents and metadata compared after each
//! step.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use proptest::prelude::*;
use tablix_store::Durability;

use crate::harness::{mount, require_fuse};

const DIRS: [&str; 2] = ["d1", "d2"];
const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    Write {
        p: usize,
        offset: u64,
        len: usize,
        byte: u8,
    },
    Truncate {
        p: usize,
        len: u64,
    },
    Unlink {
        p: usize,
    },
    Mkdir {
        p: usize,
    },
    Rmdir {
        p: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
}

fn path_of(i: usize) -> String {
    format!("{}/{}", DIRS[i / NAMES.len()], NAMES[i % NAMES.len()])
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..DIRS.len() * NAMES.len();
    prop_oneof![
        4 => (p.clone(), 0u64..200_000, 0usize..140_000, any::<u8>())
            .prop_map(|(p, offset, len, byte)| Op::Write { p, offset, len, byte }),
        2 => (p.clone(), 0u64..250_000).prop_map(|(p, len)| Op::Truncate { p, len }),
        2 => p.clone().prop_map(|p| Op::Unlink { p }),
        1 => p.clone().prop_map(|p| Op::Mkdir { p }),
        1 => p.clone().prop_map(|p| Op::Rmdir { p }),
        2 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (p.clone(), p).prop_map(|(from, to)| Op::Link { from, to }),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    File(usize),
    Dir,
}

#[derive(Default)]
struct Model {
    names: BTreeMap<String, Node>,
    files: HashMap<usize, Vec<u8>>,
    next: usize,
}

impl Model {
    fn nlink(&self, id: usize) -> usize {
        self.names
            .values()
            .filter(|n| **n == Node::File(id))
            .count()
    }

    fn drop_if_unlinked(&mut self, id: usize) {
        if self.nlink(id) == 0 {
            self.files.remove(&id);
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), i32> {
        match op {
            Op::Write {
                p,
                offset,
                len,
                byte,
            } => {
                let path = path_of(*p);
                let id = match self.names.get(&path) {
                    Some(Node::Dir) => return Err(libc::EISDIR),
                    Some(Node::File(id)) => *id,
                    None => {
                        self.next += 1;
                        self.names.insert(path, Node::File(self.next));
                        self.files.insert(self.next, Vec::new());
                        self.next
                    }
                };
                let data = self.files.get_mut(&id).expect("file");
                let end = *offset as usize + len;
                if *len > 0 {
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[*offset as usize..end].fill(*byte);
                }
                Ok(())
            }
            Op::Truncate { p, len } => match self.names.get(&path_of(*p)) {
                None => Err(libc::ENOENT),
                Some(Node::Dir) => Err(libc::EISDIR),
                Some(Node::File(id)) => {
                    self.files
                        .get_mut(id)
                        .expect("file")
                        .resize(*len as usize, 0);
                    Ok(())
                }
            },
            Op::Unlink { p } => match self.names.get(&path_of(*p)).cloned() {
                None => Err(libc::ENOENT),
                Some(Node::Dir) => Err(libc::EISDIR),
                Some(Node::File(id)) => {
                    self.names.remove(&path_of(*p));
                    self.drop_if_unlinked(id);
                    Ok(())
                }
            },
            Op::Mkdir { p } => {
                if self.names.contains_key(&path_of(*p)) {
                    return Err(libc::EEXIST);
                }
                self.names.insert(path_of(*p), Node::Dir);
                Ok(())
            }
            Op::Rmdir { p } => match self.names.get(&path_of(*p)) {
                None => Err(libc::ENOENT),
                Some(Node::File(_)) => Err(libc::ENOTDIR),
                Some(Node::Dir) => {
                    self.names.remove(&path_of(*p));
                    Ok(())
                }
            },
            Op::Rename { from, to } => {
                let (fp, tp) = (path_of(*from), path_of(*to));
                let src = self.names.get(&fp).cloned().ok_or(libc::ENOENT)?;
                if fp == tp {
                    return Ok(());
                }
                match (&src, self.names.get(&tp).cloned()) {
                    (Node::File(_), Some(Node::Dir)) => return Err(libc::EISDIR),
                    (Node::Dir, Some(Node::File(_))) => return Err(libc::ENOTDIR),
                    (Node::File(a), Some(Node::File(b))) if *a == b => return Ok(()),
                    _ => {}
                }
                let replaced = self.names.insert(tp, src);
                self.names.remove(&fp);
                if let Some(Node::File(id)) = replaced {
                    self.drop_if_unlinked(id);
                }
                Ok(())
            }
            Op::Link { from, to } => {
                let src = self
                    .names
                    .get(&path_of(*from))
                    .cloned()
                    .ok_or(libc::ENOENT)?;
                if self.names.contains_key(&path_of(*to)) {
                    return Err(libc::EEXIST);
                }
                match src {
                    Node::Dir => Err(libc::EPERM),
                    Node::File(id) => {
                        self.names.insert(path_of(*to), Node::File(id));
                        Ok(())
                    }
                }
            }
        }
    }
}

fn run(root: &Path, op: &Op) -> Result<(), i32> {
    let p = |i: &usize| root.join(path_of(*i));
    let r: std::io::Result<()> = match op {
        Op::Write {
            p: i,
            offset,
            len,
            byte,
        } => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p(i))
            .and_then(|f| f.write_all_at(&vec![*byte; *len], *offset)),
        Op::Truncate { p: i, len } => OpenOptions::new()
            .write(true)
            .open(p(i))
            .and_then(|f| f.set_len(*len)),
        Op::Unlink { p: i } => fs::remove_file(p(i)),
        Op::Mkdir { p: i } => fs::create_dir(p(i)),
        Op::Rmdir { p: i } => fs::remove_dir(p(i)),
        Op::Rename { from, to } => fs::rename(p(from), p(to)),
        Op::Link { from, to } => fs::hard_link(p(from), p(to)),
    };
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

fn compare(root: &Path, model: &Model) -> Result<(), TestCaseError> {
    for dir in DIRS {
        let mut listed: Vec<String> = fs::read_dir(root.join(dir))
            .map_err(|e| TestCaseError::fail(format!("listing {dir}: {e}")))?
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        listed.sort();
        let expected: Vec<String> = model
            .names
            .keys()
            .filter(|k| k.starts_with(&format!("{dir}/")))
            .cloned()
            .collect();
        prop_assert_eq!(listed, expected, "entries of {}", dir);
    }
    for (path, node) in &model.names {
        let m = fs::symlink_metadata(root.join(path))
            .map_err(|e| TestCaseError::fail(format!("{path}: {e}")))?;
        match node {
            Node::Dir => prop_assert!(m.is_dir(), "{} should be a directory", path),
            Node::File(id) => {
                let want = &model.files[id];
                prop_assert!(m.is_file(), "{} should be a file", path);
                prop_assert_eq!(m.len(), want.len() as u64, "size of {}", path);
                prop_assert_eq!(m.nlink() as usize, model.nlink(*id), "nlink of {}", path);
                let got = fs::read(root.join(path)).expect("read");
                prop_assert!(got == *want, "contents of {} differ", path);
            }
        }
    }
    Ok(())
}

fn check_sequence(mode: Durability, ops: &[Op]) -> Result<(), TestCaseError> {
    let f = mount(mode);
    for d in DIRS {
        fs::create_dir(f.path(d)).expect("top directories");
    }
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let want = model.apply(op);
        let got = run(&f.root, op);
        prop_assert_eq!(got, want, "step {}: {:?}", step, op);
        compare(&f.root, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs root and /dev/fuse: make test runs it as root"]
    fn sync_mount_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        require_fuse("sync_mount_matches_the_model");
        check_sequence(Durability::Sync, &ops)?;
    }

    #[test]
    #[ignore = "needs root and /dev/fuse: make test runs it as root"]
    fn async_mount_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        require_fuse("async_mount_matches_the_model");
        check_sequence(Durability::Async, &ops)?;
    }
}
