//! Versioned schema of the persistent database and the fixed schema of the
//! memory database.

use std::path::Path;

use rusqlite::Connection;

use crate::error::StoreError;

/// `PRAGMA application_id` of a tablix database: "tblx".
pub const APPLICATION_ID: i64 = 0x7462_6c78;

struct Migration {
    version: u32,
    sql: &'static str,
}

/// Persistent-database migrations, applied in order. `PRAGMA user_version`
/// records the last one applied. Never edit a released entry: append.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: "CREATE TABLE main.tablix_meta(
                  key   TEXT PRIMARY KEY,
                  value ANY
              ) STRICT;
              INSERT INTO main.tablix_meta(key, value) VALUES ('format', 'tablix');",
    },
    Migration {
        version: 2,
        sql: tablix_fs::schema::SCHEMA,
    },
];

pub const LATEST_SCHEMA_VERSION: u32 = 2;

/// Volatile state, created afresh in the memory database at every start
/// (unqualified: created on a connection that has it as `main`).
pub const MEMORY_SCHEMA: &str = "
CREATE TABLE daemon(
    pid        INTEGER NOT NULL,
    http_addr  TEXT NOT NULL,
    data_dir   TEXT NOT NULL,
    mode       TEXT NOT NULL,
    version    TEXT NOT NULL,
    started_ns INTEGER NOT NULL
);
";

/// Brings the persistent database to [`LATEST_SCHEMA_VERSION`], refusing a
/// database that is not tablix's or that a newer tablix wrote.
pub(crate) fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let app_id: i64 = conn.query_row("PRAGMA main.application_id", [], |r| r.get(0))?;
    let version: u32 = conn.query_row("PRAGMA main.user_version", [], |r| r.get(0))?;
    let objects: i64 =
        conn.query_row("SELECT count(*) FROM main.sqlite_schema", [], |r| r.get(0))?;
    if app_id != APPLICATION_ID && (app_id != 0 || version != 0 || objects != 0) {
        return Err(StoreError::NotTablix {
            path: path.to_path_buf(),
            found: app_id,
        });
    }
    if version > LATEST_SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: LATEST_SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > version) {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(m.sql)?;
        tx.pragma_update(Some("main"), "application_id", APPLICATION_ID)?;
        tx.pragma_update(Some("main"), "user_version", m.version)?;
        tx.commit()?;
        tracing::info!(version = m.version, "applied schema migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_ordered_and_end_at_latest() {
        let mut last = 0;
        for m in MIGRATIONS {
            assert!(m.version > last, "migration {} out of order", m.version);
            last = m.version;
        }
        assert_eq!(last, LATEST_SCHEMA_VERSION);
    }

    #[test]
    fn refuses_newer_and_foreign_databases() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn, Path::new("x")).unwrap();
        // Migrating twice is a no-op.
        migrate(&conn, Path::new("x")).unwrap();
        conn.pragma_update(None, "user_version", LATEST_SCHEMA_VERSION + 1)
            .unwrap();
        assert!(matches!(
            migrate(&conn, Path::new("x")),
            Err(StoreError::NewerSchema { found, .. }) if found == LATEST_SCHEMA_VERSION + 1
        ));
        let other = Connection::open_in_memory().unwrap();
        other.execute_batch("CREATE TABLE t(x)").unwrap();
        assert!(matches!(
            migrate(&other, Path::new("y")),
            Err(StoreError::NotTablix { .. })
        ));
    }
}
