//! The tablix page cache: SQLite's page cache replaced through the public
//! `sqlite3_pcache_methods2` interface (`SQLITE_CONFIG_PCACHE2`), with a
//! choice of eviction policy and live statistics.
//!
//! * [`Policy::Lru`]: least recently unpinned first, the reference;
//! * [`Policy::LfuHist`]: the reference-history policy of Ma (2013), made
//!   O(1) with per-count FIFO buckets;
//! * [`Policy::S3Fifo`]: S3-FIFO, scan-resistant;
//! * [`Policy::S3Lru`]: S3-FIFO's admission in front of an LRU main area;
//! * [`Policy::TinyLfu`]: W-TinyLFU, frequency-aware.
//!
//! Rust programs call [`install`] before opening their first connection; C
//! programs link `libtablix_pcache.a` and call `tablix_pcache_install`
//! (see `include/tablix_pcache.h`). Statistics are read with [`caches`],
//! [`totals`] or, with the `sql` feature, the `pcache_stats` virtual table.
//!
//! This crate, `tablix-vfs` and `tablix-sched` are the only ones allowed
//! `unsafe` code.
#![allow(unsafe_code)]

mod cache;
mod ffi;
mod list;
mod methods;
#[cfg(feature = "sql")]
mod pager;
mod policy;
mod slot;
mod stats;
mod table;
#[cfg(test)]
mod tests;
#[cfg(feature = "sql")]
mod vtab;

pub use ffi::{PcacheMethods2, PcachePage};
pub use methods::{InstallError, builtin_methods, install, measure_fetch_unpin, methods};
#[cfg(feature = "sql")]
pub use pager::pager_cache_counters;
pub use policy::Policy;
pub use stats::{StatsSnapshot, caches, totals};
#[cfg(feature = "sql")]
pub use vtab::register_stats_table;

/// The policy tablix uses unless told otherwise (chosen from the figures
/// in DESIGN.md).
pub const DEFAULT_POLICY: Policy = Policy::S3Fifo;
