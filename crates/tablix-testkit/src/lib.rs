//! What tablix's integration tests share, so that each exists once:
//!
//! * [`require`]: tests that need root or FUSE are `#[ignore]`d with their
//!   reason and fail loudly when run without what they need (`make test`
//!   runs them as root); none returns early and counts as passed;
//! * [`ApiServer`]: a store and the HTTP API serving it on an ephemeral
//!   127.0.0.1 port (and the data directory's Unix socket), in a
//!   temporary directory;
//! * [`TinyDisk`]: a small tmpfs, for full-disk tests (root);
//! * [`register`]: a compare-and-set register's history and its
//!   linearizability check (a memoized search whose order is replayed,
//!   and `consistency_model`'s checker for a history it finds no order
//!   for), for Jepsen-style tests;
//! * [`command`]: commands run within a time limit, so that a hang fails
//!   its test with where it waits.

mod api_server;
pub mod command;
mod linearization;
pub mod register;
pub mod require;
mod tiny_disk;

pub use api_server::{ApiServer, Setup};
pub use tiny_disk::TinyDisk;
