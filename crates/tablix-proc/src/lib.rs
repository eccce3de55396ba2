//! The process table: a `processes` table in the memory database, after
//! SQLiteOS's pid_store (seed 000), fed by the kernel.
//!
//! [`Watcher`] listens to the kernel's process events (the netlink proc
//! connector: fork, exec, uid/gid and comm changes, exit) after seeding
//! itself from /proc, and hands batches of [`ProcEvent`]s to its caller as
//! [`ProcOp`]s; without the privilege for the connector it says so and
//! polls /proc instead. [`apply`] applies a [`ProcOp`] deterministically
//! inside the caller's transaction. Threads are rows too: `tgid` is the
//! seed's handler_id, the process whose descriptors a thread shares.

mod apply;
mod connector;
mod op;
mod scan;
pub mod schema;
mod watch;

pub use apply::apply;
pub use op::{ProcEvent, ProcInfo, ProcOp};
pub use scan::{boot_unix_ns, read_task, scan_all};
pub use watch::{Source, WatchConfig, Watcher};
