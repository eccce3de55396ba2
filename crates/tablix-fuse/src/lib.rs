//! The tablix file system served to the kernel through FUSE.
//!
//! * `fs`: the request handlers, thin wrappers that read through the
//!   store's reader pool and change state only by `FsOp` Commands;
//! * [`mount`]: mounting with the options tablix needs (multi-threaded,
//!   large writes, readdirplus, kernel caching, writeback cache in async
//!   mode), clearing a stale mount left by a crashed run, and unmounting;
//! * [`errno`]: the one mapping from store failures to an errno;
//! * `invalidate`: on a cluster node, FUSE invalidation notices for the
//!   changes replication applies that this kernel did not see;
//! * `kernel_refs`: on a cluster node, the inodes this kernel holds, and
//!   the releasing of unlinked ones it does not (an unlinked file open
//!   on any node stays readable there);
//! * `locks`: on a cluster node, POSIX record locks and `flock` locks
//!   that hold across nodes, as replicated Commands;
//! * `pipes` and `holders`: the database pipes under `.tablix/pipes`, and
//!   which processes hold their ends ([`PipeHolders`]), kept true to /proc
//!   from each close (FLUSH) and fork.
//!
//! Architecture invariant: no handler changes state except by submitting
//! an `FsOp` Command to the store, and every handler sends exactly one reply.

mod attr;
pub mod errno;
mod fs;
mod holders;
mod invalidate;
mod kernel_refs;
mod locks;
mod mount;
mod pipes;
mod route;
mod writeback;

pub use fs::{FsConfig, ReadGate, TablixFs};
pub use holders::PipeHolders;
pub use mount::{MountError, MountOptions, Mounted, mount};
pub use pipes::{CAPACITY_XATTR, CONTROL_NAME, PIPES_NAME};
pub use writeback::{PushHelper, serve_pushes};
