//! Integration tests of the tablix file system on a real FUSE mount.

mod harness;
mod model;
mod posix;
mod unprivileged;
