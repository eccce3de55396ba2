//! SQLite VFS layers owned by tablix, and the few C-level connection calls
//! rusqlite does not wrap.
//!
//! This crate is one of the three places in the workspace allowed to
//! contain `unsafe` code (the others are the page cache and the scheduler
//! calls of `tablix-sched`): everything here talks to SQLite's C interface
//! directly.
//!
//! [`ClockVfs`] wraps the platform VFS ("unix") and replaces only its clock,
//! so that SQL such as `datetime('now')` evaluated while the store applies a
//! Command sees the time carried inside that Command, never the wall clock.
//! Replaying the same Commands therefore produces the same database.
//!
//! The memory VFS (`tablix-mem`, [`register_mem_vfs`]) keeps databases in
//! process memory, shared by name between connections, with a lock protocol
//! under which connections wait instead of seeing SQLITE_BUSY: a write
//! transaction first takes the database's write-intent gate
//! ([`write_intent`]), a pending writer keeps new readers out, and readers
//! queued behind one writer go before the next. DESIGN.md gives its state
//! diagram and invariants.
//!
//! The overlay VFS (`tablix-overlay`, [`Overlay`]) gives an interactive
//! transaction a private, writable view of one committed state of the
//! database: unwritten pages come from a [`PageSource`], written ones stay
//! in memory. [`RecordingConn`] records what a connection changes as a
//! changeset (SQLite's session extension), and [`apply_changeset`] applies
//! one whole or not at all.
//!
//! [`FaultVfs`] wraps the platform VFS for tests: it simulates power loss
//! (dropping everything not synced) and I/O errors.
#![allow(unsafe_code)]

mod clock;
mod connection;
mod fault;
mod mem;
mod overlay;
mod session;

pub use clock::{ClockVfs, VfsError, is_registered};
pub use connection::{
    create_scalar_function_on_db, heap_used, is_complete, set_heap_limits, set_last_insert_rowid,
    split_statements, sync_journal,
};
pub use fault::FaultVfs;
pub use mem::{
    MEM_VFS_NAME, MemLockStats, WriteIntent, drop_mem_database, mem_lock_stats, register_mem_vfs,
    write_intent,
};
pub use overlay::{OVERLAY_VFS_NAME, Overlay, PageSource, register_overlay_vfs};
pub use session::{ApplyError, ConflictKind, RecordingConn, apply_changeset, set_triggers};
