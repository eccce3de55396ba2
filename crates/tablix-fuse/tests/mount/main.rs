//! Integration tests of the tablix file system on a real FUSE mount.
#![allow(clippy::unwrap_used)]

mod harness;
mod model;
mod pipes;
mod posix;
mod unprivileged;
mod writeback;
