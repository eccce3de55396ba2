//! Versioned schema of the persistent database and the fixed schema of the
//! memory database.

use std::path::Path;

use rusqlite::Connection;

use crate::error::StoreError;

/// `PRAGMA application_id` of a tablix database: "tblx".
pub const APPLICATION_ID: i64 = 0x7462_6c78;

/// The store's own migration: its metadata table, which every domain may
/// add keys to. Frozen.
const STORE_MIGRATION_1: &str = "CREATE TABLE main.tablix_meta(
                  key   TEXT PRIMARY KEY,
                  value ANY
              ) STRICT;
              INSERT INTO main.tablix_meta(key, value) VALUES ('format', 'tablix');";

/// The store's second migration: the proposals a replicated store applied
/// lately, as the stamp seeds each entry applied (`proposals.rs`), so that
/// one proposed again (sent to a new leader after the old one had
/// replicated it) is not applied twice. Frozen.
const STORE_MIGRATION_5: &str = "CREATE TABLE main.tablix_proposals(
                  entry INTEGER PRIMARY KEY,
                  seeds BLOB NOT NULL
              ) STRICT;";

/// Every domain's migrations of the persistent database, as (schema
/// version, SQL). Each domain owns its list and its frozen SQL; the
/// versions are one sequence across domains, and `PRAGMA user_version`
/// records the last one applied. A new migration takes the next version.
/// (The memory database has no migrations: it is created afresh at every
/// start.)
const DOMAIN_MIGRATIONS: &[&[(u32, &str)]] = &[
    &[(1, STORE_MIGRATION_1), (5, STORE_MIGRATION_5)],
    tablix_fs::schema::MIGRATIONS,
];

pub const LATEST_SCHEMA_VERSION: u32 = 8;

/// The migrations in the order they run.
fn migrations() -> Vec<(u32, &'static str)> {
    let mut all: Vec<(u32, &'static str)> = DOMAIN_MIGRATIONS
        .iter()
        .flat_map(|d| d.iter().copied())
        .collect();
    all.sort_by_key(|(v, _)| *v);
    all
}

/// The tables checked at every start, when they exist: the store's own
/// and each domain's (see `tablix_fs::schema::QUICK_CHECKED`).
const QUICK_CHECKED: &[&[&str]] = &[
    &["tablix_meta", "tablix_proposals"],
    tablix_fs::schema::QUICK_CHECKED,
];

/// Refuses a database whose header, schema or system tables are damaged,
/// before anything writes to it.
pub(crate) fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let malformed = |detail: String| StoreError::Malformed {
        path: path.to_path_buf(),
        detail,
    };
    let damaged = |e: &rusqlite::Error| {
        matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
        )
    };
    let tables: Vec<String> = (|| {
        let mut st = conn.prepare("SELECT name FROM main.sqlite_schema WHERE type = 'table'")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<String>>>()
    })()
    .map_err(|e| {
        if damaged(&e) {
            malformed(crate::policy::error_message(&e))
        } else {
            StoreError::from(e)
        }
    })?;
    for table in QUICK_CHECKED
        .iter()
        .flat_map(|d| d.iter())
        .filter(|t| tables.iter().any(|n| n == *t))
    {
        let found: Vec<String> = (|| {
            let mut st = conn.prepare(&format!("PRAGMA main.quick_check({table})"))?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<Vec<String>>>()
        })()
        .map_err(|e| {
            malformed(format!(
                "checking {table}: {}",
                crate::policy::error_message(&e)
            ))
        })?;
        if found != ["ok"] {
            return Err(malformed(format!(
                "quick_check of {table}: {}",
                found.into_iter().take(3).collect::<Vec<_>>().join("; ")
            )));
        }
    }
    Ok(())
}

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
    // Migrations rename and drop their own tables: objects others defined
    // (a view or foreign key of a user's, from before the sandbox) must
    // neither be rewritten nor stop them.
    conn.pragma_update(None, "legacy_alter_table", true)?;
    conn.pragma_update(None, "foreign_keys", false)?;
    for (v, sql) in migrations().into_iter().filter(|(v, _)| *v > version) {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(Some("main"), "application_id", APPLICATION_ID)?;
        tx.pragma_update(Some("main"), "user_version", v)?;
        tx.commit()?;
        tracing::info!(version = v, "applied schema migration");
    }
    conn.pragma_update(None, "legacy_alter_table", false)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_one_to_latest_without_gaps() {
        let versions: Vec<u32> = migrations().iter().map(|(v, _)| *v).collect();
        assert_eq!(versions, (1..=LATEST_SCHEMA_VERSION).collect::<Vec<_>>());
    }

    /// CRC-32 of each released migration's SQL. A database migrated by
    /// one build must be what any later build expects: a failure here
    /// means a released migration was edited, which must instead be a new
    /// migration.
    const RELEASED: &[(u32, u32)] = &[
        (1, 0x171a_4b58),
        (2, 0x650f_ef4b),
        (3, 0xc9c7_3f21),
        (4, 0x1234_c39b),
        (5, 0xebed_41f5),
        (6, 0xf900_f321),
        (7, 0xd9d6_5f92),
        (8, 0xed51_0eda),
    ];

    #[test]
    fn released_migrations_are_frozen() {
        let all = migrations();
        for (version, crc) in RELEASED {
            let sql = all
                .iter()
                .find(|(v, _)| v == version)
                .map(|(_, sql)| *sql)
                .unwrap_or_else(|| panic!("released migration {version} is gone"));
            assert_eq!(
                crc32fast::hash(sql.as_bytes()),
                *crc,
                "released migration {version} was edited: add a new migration instead"
            );
        }
        assert_eq!(RELEASED.len() as u32, LATEST_SCHEMA_VERSION);
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
