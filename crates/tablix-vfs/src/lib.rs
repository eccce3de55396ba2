//! SQLite VFS layers owned by tablix, and the few C-level connection calls
//! rusqlite does not wrap.
//!
//! This crate is one of the two places in the workspace allowed to contain
//! `unsafe` code (the other is the page cache): everything here talks to
//! SQLite's C interface directly.
//!
//! [`ClockVfs`] wraps the platform VFS ("unix") and replaces only its clock,
//! so that SQL such as `datetime('now')` evaluated while the store applies a
//! Command sees the time carried inside that Command, never the wall clock.
//! Replaying the same Commands therefore produces the same database.
//!
//! [`FaultVfs`] wraps the platform VFS for tests: it simulates power loss
//! (dropping everything not synced) and I/O errors.
#![allow(unsafe_code)]

mod clock;
mod connection;
mod fault;

pub use clock::{ClockVfs, VfsError, is_registered};
pub use connection::{set_last_insert_rowid, sync_journal};
pub use fault::FaultVfs;
