//! Replication's side of the command log: [`LogStore`] is openraft's log
//! storage (`RaftLogStorage`, pinned openraft 0.9) over `tablix_log::Log`,
//! the same log the store writes today, so replication plugs openraft in
//! without a second log and without touching the store's apply.
//!
//! Openraft numbers entries from 0; the log from 1. Entry `i` of openraft
//! is entry `i + 1` of the log, everywhere in this crate and nowhere else.

mod log_store;

pub use log_store::LogStore;
