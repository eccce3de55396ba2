//! The check after a user statement changed the schema.
//!
//! The authorizer sees most of a schema change but not all of it: ALTER
//! TABLE RENAME's new name, a foreign key's target, the tables a view or a
//! trigger body names, a virtual table's arguments. A statement that
//! changed the schema runs inside a savepoint; afterwards every object it
//! created or changed is checked, and the statement is undone if one of
//! them takes a reserved name or mentions a `tablix_` object (a foreign
//! key to the inode table would block reclamation, a view over system
//! tables would break their migrations).

use std::collections::BTreeMap;

use rusqlite::Connection;

use crate::policy::{Rules, SYSTEM_PREFIX};
use crate::sqltext;

/// The main schema's objects: (type, name) to their SQL.
pub(crate) struct Snapshot(BTreeMap<(String, String), Option<String>>);

pub(crate) fn snapshot(conn: &Connection) -> rusqlite::Result<Snapshot> {
    let mut st = conn.prepare("SELECT type, name, sql FROM main.sqlite_schema")?;
    let rows = st.query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))?;
    Ok(Snapshot(rows.collect::<Result<_, _>>()?))
}

/// Checks what changed since `before`; `Err` says why the change is refused.
pub(crate) fn check(conn: &Connection, before: &Snapshot, rules: &Rules) -> Result<(), String> {
    let after = snapshot(conn).map_err(|e| format!("checking the schema change failed: {e}"))?;
    let changed: Vec<(&String, &String, &Option<String>)> = after
        .0
        .iter()
        .filter(|(key, sql)| before.0.get(*key) != Some(*sql))
        // SQLite's own objects (autoindexes, sqlite_sequence, sqlite_stat*).
        .filter(|((_, name), _)| !name.to_ascii_lowercase().starts_with("sqlite_"))
        .map(|((kind, name), sql)| (kind, name, sql))
        .collect();
    if let Some((kind, name, _)) = changed.iter().find(|(_, name, _)| rules.is_reserved(name)) {
        return Err(format!(
            "{kind} name {name:?} is reserved for tablix; choose another name"
        ));
    }
    for (kind, name, sql) in changed {
        if let Some(sql) = sql
            && let Some(system) = sqltext::mentions_prefix(sql, SYSTEM_PREFIX)
        {
            return Err(format!(
                "{kind} {name} refers to {system}: user tables, views, triggers and indexes may not reference tablix system state (names starting with {SYSTEM_PREFIX})"
            ));
        }
    }
    Ok(())
}
