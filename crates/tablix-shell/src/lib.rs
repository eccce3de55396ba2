//! `tablix sql`: a shell modelled on the sqlite3 command-line tool, talking
//! to a tablix daemon over its HTTP API.

mod client;
mod dot;
mod dump;
mod format;
mod shell;
mod split;

pub use client::{Client, ClientError, Reply};
pub use format::Mode;
pub use shell::{Shell, ShellError};
pub use split::Splitter;
