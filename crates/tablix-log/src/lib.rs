//! tablix's command log: every replicated Command as a numbered,
//! checksummed entry, durable before the state applies it.
//!
//! The log lives in segment files in one directory. Appends go to the
//! newest segment; [`Log::sync`] makes them durable with one write
//! (`RWF_DSYNC` when nothing else is unsynced, else a write and an
//! fdatasync). A segment is filled to its size, then the next starts;
//! segments whose entries the state holds durably are purged and
//! recycled, overwritten in place. The calls mirror what a Raft log store
//! does (append, sync, read, truncate a conflicting suffix, purge a
//! prefix, a vote), so replication drives the same log. See DESIGN.md.

mod error;
mod log;
mod power;
mod record;
mod segment;
mod vote;

pub use error::LogError;
pub use log::{Damage, Entry, Inspection, Log, LogConfig, LogId, MAX_ENTRY_BYTES, Recovered};
pub use power::PowerModel;
