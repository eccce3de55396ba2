//! User tables out and back in: as SQL text (`/db/backup?fmt=sql`, the
//! shell's `.dump`), as a SQLite file of their own (`/db/backup`), and the
//! statements that load either (`/db/load`). System state (`tablix_*`,
//! the memory database, the views of the temp schema) is never part of
//! them: a backup holds what every user may change with SQL.

use std::io::Write;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use crate::error::{SqliteFailure, StoreError};

/// A user object of a schema: its kind, name, table and SQL.
struct Object {
    kind: String,
    name: String,
    table: String,
    sql: String,
}

/// The user objects of `schema` in creation order (tables, indexes, views,
/// triggers), shadow tables of virtual tables left out (their virtual
/// table makes them again), only those of tables in `only` when given.
fn objects(conn: &Connection, schema: &str, only: &[String]) -> rusqlite::Result<Vec<Object>> {
    let shadow: Vec<String> = {
        let mut st = conn
            .prepare("SELECT name FROM pragma_table_list WHERE schema = ?1 AND type = 'shadow'")?;
        st.query_map([schema], |r| r.get(0))?
            .collect::<Result<_, _>>()?
    };
    let sql = format!(
        "SELECT type, name, tbl_name, sql FROM {}.sqlite_schema
         WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
           AND tbl_name NOT LIKE 'tablix\\_%' ESCAPE '\\'
         ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, rowid",
        quote(schema)
    );
    let mut st = conn.prepare(&sql)?;
    let all: Vec<Object> = st
        .query_map([], |r| {
            Ok(Object {
                kind: r.get(0)?,
                name: r.get(1)?,
                table: r.get(2)?,
                sql: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(all
        .into_iter()
        .filter(|o| !shadow.iter().any(|s| s == &o.name))
        .filter(|o| only.is_empty() || only.iter().any(|t| t.eq_ignore_ascii_case(&o.table)))
        .collect())
}

/// Whether `schema` holds tablix's own tables: a data directory's
/// database, not a backup of user tables.
pub(crate) fn has_system_tables(conn: &Connection, schema: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        &format!(
            "SELECT EXISTS (SELECT 1 FROM {}.sqlite_schema WHERE name LIKE 'tablix\\_%' ESCAPE '\\')",
            quote(schema)
        ),
        [],
        |r| r.get(0),
    )
}

/// An identifier, quoted.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A value as an SQL literal that reads back as the same value and type.
fn literal(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) if f.is_nan() => "NULL".into(),
        ValueRef::Real(f) if f.is_infinite() => if f > 0.0 { "1e999" } else { "-1e999" }.into(),
        ValueRef::Real(f) => {
            let s = format!("{f:?}");
            if s.contains(['.', 'e', 'E']) {
                s
            } else {
                format!("{s}.0")
            }
        }
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) if !s.contains('\0') => format!("'{}'", s.replace('\'', "''")),
            // Bytes that are not text SQL can spell: as a blob, cast.
            _ => format!("CAST({} AS TEXT)", hex(t)),
        },
        ValueRef::Blob(b) => hex(b),
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(3 + b.len() * 2);
    s.push_str("X'");
    for byte in b {
        s.push_str(&format!("{byte:02x}"));
    }
    s.push('\'');
    s
}

/// The columns of `table` a row's values are written to (generated ones
/// are computed, not written), and whether that is every column.
fn columns(conn: &Connection, schema: &str, table: &str) -> rusqlite::Result<(Vec<String>, bool)> {
    let mut st = conn.prepare("SELECT name, hidden FROM pragma_table_xinfo(?1, ?2)")?;
    let all: Vec<(String, i64)> = st
        .query_map([table, schema], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let every = all.iter().all(|(_, h)| *h == 0);
    Ok((
        all.into_iter()
            .filter(|(_, h)| *h == 0 || *h == 1)
            .map(|(n, _)| n)
            .collect(),
        every,
    ))
}

/// Writes the user objects of `schema` (those of tables in `only`, if
/// any) as SQL that `tablix sql` or `/db/load` reads back: one
/// transaction, tables with their rows, then indexes, views and
/// triggers. Reads inside whatever read transaction `conn` is in.
pub(crate) fn write_sql(
    conn: &Connection,
    schema: &str,
    only: &[String],
    out: &mut dyn Write,
) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| StoreError::Failed(SqliteFailure::of(&e));
    let io = StoreError::Io;
    let objects = objects(conn, schema, only).map_err(failed)?;
    out.write_all(b"BEGIN TRANSACTION;\n").map_err(io)?;
    for o in objects.iter().filter(|o| o.kind == "table") {
        writeln!(out, "{};", o.sql).map_err(io)?;
        let (cols, every) = columns(conn, schema, &o.name).map_err(failed)?;
        let list: Vec<String> = cols.iter().map(|c| quote(c)).collect();
        let sql = format!(
            "SELECT {} FROM {}.{}",
            list.join(", "),
            quote(schema),
            quote(&o.name)
        );
        let mut st = conn.prepare(&sql).map_err(failed)?;
        let mut rows = st.query([]).map_err(failed)?;
        // As sqlite3's .dump writes it, unless generated columns must be
        // left out.
        let names = if every {
            String::new()
        } else {
            format!("({})", list.join(","))
        };
        while let Some(r) = rows.next().map_err(failed)? {
            let mut values = Vec::with_capacity(cols.len());
            for i in 0..cols.len() {
                values.push(literal(r.get_ref(i).map_err(failed)?));
            }
            writeln!(
                out,
                "INSERT INTO {}{names} VALUES({});",
                quote(&o.name),
                values.join(",")
            )
            .map_err(io)?;
        }
    }
    // AUTOINCREMENT counters of the tables dumped.
    let seq = format!("SELECT name, seq FROM {}.sqlite_sequence", quote(schema));
    if let Ok(mut st) = conn.prepare(&seq) {
        let pairs: Vec<(String, i64)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(failed)?
            .collect::<Result<_, _>>()
            .map_err(failed)?;
        for (name, n) in pairs {
            if objects.iter().any(|o| o.kind == "table" && o.name == name) {
                writeln!(
                    out,
                    "DELETE FROM sqlite_sequence WHERE name = {};\nINSERT INTO sqlite_sequence(name, seq) VALUES({}, {n});",
                    literal(ValueRef::Text(name.as_bytes())),
                    literal(ValueRef::Text(name.as_bytes()))
                )
                .map_err(io)?;
            }
        }
    }
    for o in objects.iter().filter(|o| o.kind != "table") {
        writeln!(out, "{};", o.sql).map_err(io)?;
    }
    out.write_all(b"COMMIT;\n").map_err(io)?;
    Ok(())
}

/// Writes the user objects of the database at `source` (opened read-only
/// and attached, so one read transaction covers the copy) into a new
/// SQLite file at `target`: tables with their rows, AUTOINCREMENT
/// counters, then indexes, views and triggers.
pub(crate) fn write_file(
    source: &std::path::Path,
    vfs: Option<&str>,
    target: &std::path::Path,
    only: &[String],
) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| StoreError::Failed(SqliteFailure::of(&e));
    let _ = std::fs::remove_file(target);
    let conn = Connection::open_with_flags(
        target,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(failed)?;
    let mut uri = format!(
        "file:{}?mode=ro",
        source
            .display()
            .to_string()
            .replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23")
    );
    if let Some(v) = vfs {
        uri.push_str(&format!("&vfs={v}"));
    }
    conn.execute("ATTACH DATABASE ?1 AS src", [&uri])
        .map_err(failed)?;
    conn.execute_batch("BEGIN").map_err(failed)?;
    let copied = (|| {
        let objects = objects(&conn, "src", only)?;
        for o in objects.iter().filter(|o| o.kind == "table") {
            conn.execute_batch(&o.sql)?;
            let (cols, _) = columns(&conn, "src", &o.name)?;
            let list: Vec<String> = cols.iter().map(|c| quote(c)).collect();
            conn.execute_batch(&format!(
                "INSERT INTO main.{t}({c}) SELECT {c} FROM src.{t}",
                t = quote(&o.name),
                c = list.join(", ")
            ))?;
        }
        let sequence: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.sqlite_schema WHERE name = 'sqlite_sequence')",
            [],
            |r| r.get(0),
        )?;
        if sequence {
            conn.execute_batch(
                "DELETE FROM main.sqlite_sequence;
                 INSERT INTO main.sqlite_sequence SELECT * FROM src.sqlite_sequence
                  WHERE name IN (SELECT name FROM main.sqlite_schema WHERE type = 'table');",
            )?;
        }
        for o in objects.iter().filter(|o| o.kind != "table") {
            conn.execute_batch(&o.sql)?;
        }
        Ok::<_, rusqlite::Error>(())
    })();
    match copied {
        Ok(()) => conn
            .execute_batch("COMMIT; DETACH DATABASE src")
            .map_err(failed),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(failed(e))
        }
    }
}

/// Why a file cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the data is not a SQLite database: {0}")]
    NotSqlite(String),
    #[error(
        "the database holds tablix's own tables (tablix_*): it is a tablix data directory's, not a backup of user tables; /db/load restores user tables, and a whole node is restored by copying its data directory"
    )]
    SystemTables,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The statements that make the user tables those of the SQLite database
/// at `path`: every user object of `current` (today's schema, as
/// `(kind, name)`) dropped, then the file's objects and rows made.
pub(crate) fn load_statements(
    path: &std::path::Path,
    current: &[(String, String)],
) -> Result<Vec<String>, LoadError> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| LoadError::NotSqlite(e.to_string()))?;
    let check: Result<String, _> = conn.query_row("PRAGMA quick_check", [], |r| r.get(0));
    match check {
        Ok(ok) if ok == "ok" => {}
        Ok(other) => return Err(LoadError::NotSqlite(other)),
        Err(e) => return Err(LoadError::NotSqlite(e.to_string())),
    }
    if has_system_tables(&conn, "main").map_err(|e| LoadError::NotSqlite(e.to_string()))? {
        return Err(LoadError::SystemTables);
    }
    let mut out = Vec::new();
    for (kind, name) in current
        .iter()
        .filter(|(k, _)| k == "view" || k == "trigger")
    {
        out.push(format!(
            "DROP {} IF EXISTS {}",
            kind.to_ascii_uppercase(),
            quote(name)
        ));
    }
    for (_, name) in current.iter().filter(|(k, _)| k == "table") {
        out.push(format!("DROP TABLE IF EXISTS {}", quote(name)));
    }
    let mut text = Vec::new();
    conn.execute_batch("BEGIN")
        .map_err(|e| StoreError::Failed(SqliteFailure::of(&e)))?;
    write_sql(&conn, "main", &[], &mut text)?;
    let _ = conn.execute_batch("COMMIT");
    let text = String::from_utf8_lossy(&text);
    out.extend(
        tablix_vfs::split_statements(&text)
            .into_iter()
            .filter(|s| crate::TxControl::parse(s).is_none())
            .map(str::to_string),
    );
    Ok(out)
}

/// The user objects of `conn`'s main database, as `(kind, name)`.
pub(crate) fn user_objects(conn: &Connection) -> Result<Vec<(String, String)>, StoreError> {
    let failed = |e: rusqlite::Error| StoreError::Failed(SqliteFailure::of(&e));
    Ok(objects(conn, "main", &[])
        .map_err(failed)?
        .into_iter()
        .map(|o| (o.kind, o.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_read_back_as_the_same_values_and_types() {
        let c = Connection::open_in_memory().unwrap();
        let values = [
            ValueRef::Null,
            ValueRef::Integer(-3),
            ValueRef::Real(2.0),
            ValueRef::Real(1.5e300),
            ValueRef::Real(f64::INFINITY),
            ValueRef::Text(b"it's"),
            ValueRef::Text(b"nul\0inside"),
            ValueRef::Blob(&[0, 255]),
        ];
        for v in values {
            let lit = literal(v);
            let back: (String, rusqlite::types::Value) = c
                .query_row(&format!("SELECT typeof({lit}), {lit}"), [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap();
            let want = rusqlite::types::Value::try_from(v).unwrap();
            assert_eq!(back.1, want, "{lit}");
        }
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn a_dump_and_a_file_carry_user_objects_and_rows_but_no_system_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("src.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE tablix_meta(key TEXT PRIMARY KEY, value);
             INSERT INTO tablix_meta VALUES ('secret', 1);
             CREATE TABLE t(k INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT, g TEXT GENERATED ALWAYS AS (upper(v)));
             INSERT INTO t(v) VALUES ('a;b'), ('it''s');
             CREATE INDEX ti ON t(v);
             CREATE VIEW tv AS SELECT v FROM t;
             CREATE TRIGGER tt AFTER INSERT ON t BEGIN SELECT 1; END;",
        )
        .unwrap();
        let mut text = Vec::new();
        write_sql(&c, "main", &[], &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(!text.contains("tablix_meta"), "{text}");
        assert!(
            text.contains("INSERT INTO \"t\"(\"k\",\"v\") VALUES(1,'a;b');"),
            "{text}"
        );
        assert!(text.contains("CREATE TRIGGER tt"), "{text}");
        // Read back into an empty database, it is the same again.
        let d = Connection::open_in_memory().unwrap();
        d.execute_batch(&text).unwrap();
        let mut again = Vec::new();
        write_sql(&d, "main", &[], &mut again).unwrap();
        assert_eq!(String::from_utf8(again).unwrap(), text);
        // As a file of its own.
        let file = dir.path().join("backup.db");
        write_file(&path, None, &file, &[]).unwrap();
        let b = Connection::open(&file).unwrap();
        assert!(!has_system_tables(&b, "main").unwrap());
        let n: i64 = b
            .query_row("SELECT count(*) FROM tv", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        let seq: i64 = b
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 't'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(seq, 2);
        // A data directory's database is not loaded; a backup is.
        assert!(matches!(
            load_statements(&path, &[]),
            Err(LoadError::SystemTables)
        ));
        let statements = load_statements(&file, &[("table".into(), "old".into())]).unwrap();
        assert_eq!(statements[0], "DROP TABLE IF EXISTS \"old\"");
        assert!(
            statements
                .iter()
                .all(|s| crate::TxControl::parse(s).is_none())
        );
        let e = Connection::open_in_memory().unwrap();
        e.execute_batch("CREATE TABLE old(x)").unwrap();
        for s in &statements {
            e.execute_batch(s).unwrap();
        }
        let n: i64 = e
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        // Not SQLite at all.
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"this is not a database, not at all, no").unwrap();
        assert!(matches!(
            load_statements(&junk, &[]),
            Err(LoadError::NotSqlite(_))
        ));
    }
}
