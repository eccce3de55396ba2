//! Which apply built a state. A replicated Command's effect on the state
//! is defined by the build that applies it; nodes of one cluster must
//! apply every entry alike or their states part without a word. The
//! version is recorded in the state (`apply_version` in `tablix_meta`),
//! so it travels with snapshots, and sent on every request between nodes
//! (tablix-raft), which refuse another.

use rusqlite::{Connection, OptionalExtension};

use crate::config::LogKeeper;
use crate::error::StoreError;

/// The version of what applying a replicated Command does. Raise it with
/// any change to the encoding of a `Stamped<ReplicatedCommand>` or to the
/// state an entry leaves (a file-system operation's effect on its rows, a
/// SQL function the writer replaces, the group's savepoint rules).
pub const APPLY_VERSION: u32 = 1;

fn recorded(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.query_row(
        "SELECT value FROM main.tablix_meta WHERE key = 'apply_version'",
        [],
        |r| r.get::<_, Option<i64>>(0),
    )
    .optional()
    .map(Option::flatten)
}

fn record(conn: &Connection, version: u32) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO main.tablix_meta(key, value) VALUES ('apply_version', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [i64::from(version)],
    )?;
    Ok(())
}

/// Checks the state on `conn` (no transaction open) against `ours` and
/// records `ours` where the state names none (a new state, or one from a
/// build before the record) or where the store keeps its own log: a
/// single node's entries are applied by one build only. A cluster's state
/// of another version is refused: its log may hold entries the other
/// nodes applied with the other build's rules. A cluster's state opened
/// with the store's own log (`tablix fsck` repairing a member's data
/// directory) keeps the version it records.
pub(crate) fn check(conn: &Connection, keeper: LogKeeper, ours: u32) -> Result<(), StoreError> {
    let fail = |e: rusqlite::Error| StoreError::Open(format!("reading the apply version: {e}"));
    match recorded(conn).map_err(fail)? {
        Some(v) if v == i64::from(ours) => Ok(()),
        Some(v) if keeper == LogKeeper::Replication => Err(StoreError::Open(format!(
            "this state was built by entries applied as version {v}, and this build applies them as version {ours}: the nodes of a cluster must apply every entry alike, or their states would part. Run a build of apply version {v} on this data directory; nothing was changed"
        ))),
        // A cluster's state (it records a membership).
        Some(_) if crate::apply_log::membership(conn).map_err(fail)?.is_some() => Ok(()),
        _ => record(conn, ours).map_err(fail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE tablix_meta(key TEXT PRIMARY KEY, value)")
            .unwrap();
        c
    }

    #[test]
    fn a_version_is_recorded_once_and_another_refused_only_on_a_cluster() {
        let c = state();
        check(&c, LogKeeper::Replication, 3).unwrap();
        assert_eq!(recorded(&c).unwrap(), Some(3));
        check(&c, LogKeeper::Replication, 3).unwrap();
        let e = check(&c, LogKeeper::Replication, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 3") && e.contains("version 4"), "{e}");
        assert_eq!(
            recorded(&c).unwrap(),
            Some(3),
            "a refusal changed the state"
        );
        // A single node's own log: the build that opens it applies it all.
        check(&c, LogKeeper::Store, 4).unwrap();
        assert_eq!(recorded(&c).unwrap(), Some(4));
        // Unless the state is a cluster's: it keeps its version.
        c.execute_batch("INSERT INTO tablix_meta VALUES ('membership', x'00')")
            .unwrap();
        check(&c, LogKeeper::Store, 5).unwrap();
        assert_eq!(recorded(&c).unwrap(), Some(4));
        check(&c, LogKeeper::Replication, 5).unwrap_err();
    }
}
