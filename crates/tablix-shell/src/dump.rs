//! `.dump`, `.backup` and `.restore`: the user tables through the
//! daemon's `/db/backup` (as SQL, or as a SQLite file, from one snapshot)
//! and `/db/load`. System tables (`tablix_*`) are tablix's own and are
//! never part of them.

use crate::client::Client;
use crate::shell::ShellError;

/// Every user table, or those named in `only` (case-insensitive), as SQL
/// text that `tablix sql` reads back.
pub(crate) fn dump(client: &Client, only: &[String]) -> Result<String, ShellError> {
    let bytes = client.backup(true, only)?;
    String::from_utf8(bytes).map_err(|_| ShellError::Sql("the dump is not UTF-8 text".into()))
}

/// Writes the user tables to `file` as a SQLite database.
pub(crate) fn backup(client: &Client, file: &str) -> Result<(), ShellError> {
    let bytes = client.backup(false, &[])?;
    std::fs::write(file, bytes).map_err(|e| ShellError::Usage(format!("cannot write {file}: {e}")))
}

/// Replaces the user tables with those of `file` (a SQLite database, or
/// SQL text); what the daemon answered.
pub(crate) fn restore(client: &Client, file: &str) -> Result<String, ShellError> {
    let bytes =
        std::fs::read(file).map_err(|e| ShellError::Usage(format!("cannot read {file}: {e}")))?;
    Ok(client.load(bytes)?)
}
