//! The one place that decides where a request goes: the virtual tree
//! under `/.tablix` (the pipe files, node-local rows of the memory
//! database, served by `pipes.rs`) or the stored file system (reads and
//! Commands of the persistent database). Handlers match on what this
//! module answers and never compare inode numbers or names themselves.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use tablix_fs::{Ino, ROOT};

use crate::pipes::{CONTROL_INO, CONTROL_NAME};

/// Where a request about one inode goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    /// `/.tablix` and everything under it.
    Virtual(Ino),
    Stored(Ino),
}

/// Where a request about a name in a directory goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `/.tablix` itself: it exists, and it cannot be made, removed,
    /// renamed, linked to or replaced.
    Control,
    /// A name in a virtual directory.
    Virtual(Ino),
    /// A name in a stored directory.
    Stored(Ino),
}

/// Virtual inode numbers start here; the stored file system's own
/// (AUTOINCREMENT from 1) never get near them.
pub(crate) fn node(ino: u64) -> Node {
    if ino >= CONTROL_INO {
        Node::Virtual(ino)
    } else {
        Node::Stored(ino)
    }
}

pub(crate) fn entry(parent: u64, name: &OsStr) -> Entry {
    match node(parent) {
        Node::Virtual(p) => Entry::Virtual(p),
        Node::Stored(ROOT) if name.as_bytes() == CONTROL_NAME => Entry::Control,
        Node::Stored(p) => Entry::Stored(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipes::{PIPE_INO_BASE, PIPES_INO};

    #[test]
    fn every_inode_and_name_has_one_route() {
        let nodes = [
            (ROOT, Node::Stored(ROOT)),
            (2, Node::Stored(2)),
            (CONTROL_INO - 1, Node::Stored(CONTROL_INO - 1)),
            (CONTROL_INO, Node::Virtual(CONTROL_INO)),
            (PIPES_INO, Node::Virtual(PIPES_INO)),
            (PIPE_INO_BASE + 7, Node::Virtual(PIPE_INO_BASE + 7)),
        ];
        for (ino, want) in nodes {
            assert_eq!(node(ino), want, "inode {ino}");
        }
        let tablix = OsStr::from_bytes(CONTROL_NAME);
        let names = [
            (ROOT, tablix, Entry::Control),
            (ROOT, OsStr::new("tablix"), Entry::Stored(ROOT)),
            (ROOT, OsStr::new("a"), Entry::Stored(ROOT)),
            // Only the root's `.tablix` is the control directory.
            (5, tablix, Entry::Stored(5)),
            (
                CONTROL_INO,
                OsStr::new("pipes"),
                Entry::Virtual(CONTROL_INO),
            ),
            (PIPES_INO, tablix, Entry::Virtual(PIPES_INO)),
        ];
        for (parent, name, want) in names {
            assert_eq!(entry(parent, name), want, "{name:?} in {parent}");
        }
    }
}
