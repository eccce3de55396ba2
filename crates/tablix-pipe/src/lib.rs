//! Pipes as rows, after SQLiteOS (seed 000): each pipe is a row of `pipe`
//! (the seed's pipe_data header: capacity, buffered bytes, counters, open
//! ends), its buffered bytes are rows of `pipe_data` in write order, each
//! open end is a row of `pipe_end`, and each process holding one a row of
//! `pid_pipe`: the opener, and the processes that inherit it ([`forked`])
//! until they close it (`PipeOp::Holds`) or exit ([`exited`]).
//!
//! [`apply`] runs one [`PipeOp`] on a connection to the memory database,
//! inside the caller's write transaction; it reads no clock (times come in
//! the op) and keeps no state. Blocking, waking and signals are the
//! caller's business: an op never waits, it reports what it could do.
//!
//! Appending inserts one row; consuming deletes the rows read in full and
//! advances `pipe.head` inside the oldest one, reading only the bytes
//! wanted (incremental blob I/O). Neither rewrites buffered bytes, so a
//! stream through a pipe costs time linear in its length.

mod apply;
mod op;
pub mod read;
pub mod schema;

pub use apply::{apply, exited, forked};
pub use op::{End, PIPE_BUF, PipeError, PipeOp, PipeReply, PipeState};
pub use read::state;
