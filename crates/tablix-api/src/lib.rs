//! SQL over HTTP, compatible with rqlite's data API so that rqlite clients
//! and drivers work unchanged:
//!
//! * `POST /db/execute`, `GET|POST /db/query`, `GET|POST /db/request`;
//! * request bodies as JSON arrays of plain strings, `[sql, positional...]`
//!   arrays or `[sql, {named}]` arrays;
//! * the `transaction`, `timings`, `associative`, `pretty` and `blob_array`
//!   options, and rqlite's response shapes with a per-statement `error`;
//! * `GET /status` and `GET /readyz`.
//!
//! Writes become [`tablix_store::Command`]s stamped here with the time and a
//! random seed; reads run on the store's reader pool.

mod body;
mod options;
mod render;
mod server;

pub use body::parse_statements;
pub use options::{Level, Options};
pub use server::{ApiConfig, ServerInfo, router};
