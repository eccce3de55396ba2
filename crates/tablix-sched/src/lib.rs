//! How the kernel schedules tablix's own threads, so that work a user asks
//! for (a query, a write) gives way to the mount and to everything else the
//! machine runs.
//!
//! * [`Lowered`] runs a piece of work under `SCHED_IDLE` (`idle.rs`): the
//!   store's user queries. Their progress handler calls [`give_way`],
//!   which yields every [`GIVE_WAY_EVERY`] so that a thread that is ready
//!   runs without waiting for the scheduler's tick.
//! * [`slice::shorten`] gives a thread a short scheduler slice until
//!   [`slice::restore`] (`slice.rs`): the store's writer, once a user
//!   write has run long, keeps normal priority but yields its CPU to
//!   whatever wakes beside it.
//!
//! `slice.rs` calls `sched_setattr(2)` and `sched_getattr(2)`, which no
//! library tablix uses wraps: this crate, `tablix-vfs` and `tablix-pcache`
//! are the only ones allowed `unsafe` code, and here only that module.

mod idle;
pub mod slice;

pub use idle::{GIVE_WAY_EVERY, Lowered, give_way};
