//! The tablix file system as rows of the persistent database.
//!
//! * [`schema`]: the tables (inodes, directory entries, data blocks, symlink
//!   targets, extended attributes) and the `files` view;
//! * [`apply`]: every state change, as an [`FsOp`] applied inside the
//!   store's writer transaction;
//! * [`read`]: lookups, attributes, directory listings and data, on reader
//!   connections;
//! * [`check`]: the file-system checker behind `tablix fsck`.
//!
//! Architecture invariant: this crate never reads the clock or keeps state
//! between calls. Time comes in as the Command's stamp, so applying the same
//! operations in the same order gives the same file system.

mod apply;
pub mod check;
pub mod checksum;
mod errno;
mod error;
mod inode;
mod op;
pub mod read;
pub mod schema;

pub use apply::apply;
pub use errno::Errno;
pub use error::FsError;
pub use op::{Attr, FsOp, FsReply, Ino, LockKind, ROOT, SetAttr, SetTime, Touched};

#[cfg(test)]
mod tests;
