//! SQL over HTTP, compatible with rqlite's data API so that rqlite clients
//! and drivers work unchanged:
//!
//! * `POST /db/execute`, `GET|POST /db/query`, `GET|POST /db/request`;
//! * request bodies as JSON arrays of plain strings, `[sql, positional...]`
//!   arrays or `[sql, {named}]` arrays;
//! * the `transaction`, `timings`, `associative`, `pretty`, `blob_array`
//!   and `db_timeout` options, and rqlite's response shapes with a
//!   per-statement `error`;
//! * `GET /status` and `GET /readyz`;
//! * rqlite's auth file for API users, HTTP Basic credentials, TLS.
//!
//! Every request is attributed to a caller (`identity.rs`): a Unix user by
//! the peer credentials of the Unix socket or by the owner of a loopback
//! client's socket, or an API user. Writes become
//! [`tablix_store::ReplicatedCommand`]s stamped here with the time and a random
//! seed; reads run on the store's readers and stream their results.

mod auth;
mod body;
mod cluster;
mod encode;
mod identity;
mod listen;
mod maintenance;
mod options;
mod server;
mod sock_diag;
mod transaction;

pub use auth::{AuthFile, Perms};
pub use body::parse_statements;
pub use identity::{Caller, Peer};
pub use listen::{ConnectionGone, Endpoint, serve, tls_acceptor};
pub use options::{Level, Options, duration as parse_duration};
pub use server::{ApiConfig, ServerInfo, router};
pub use tokio_rustls::TlsAcceptor;
