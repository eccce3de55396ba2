//! Running one user statement on a connection.

use std::time::Instant;

use rusqlite::Connection;
use rusqlite::types::ValueRef;

use crate::command::{Params, Statement, Value};
use crate::outcome::{Rows, StatementOutcome, StatementResult};
use crate::policy::{Policy, error_message};

/// Runs `st` on `conn`. Errors become [`StatementResult::Error`]; they never
/// escape, so the caller decides what an error means for its transaction.
pub(crate) fn run(conn: &Connection, policy: &Policy, st: &Statement) -> StatementOutcome {
    let started = Instant::now();
    let result = match run_inner(conn, policy, st) {
        Ok(r) => r,
        Err(message) => StatementResult::Error(message),
    };
    StatementOutcome {
        result,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn run_inner(
    conn: &Connection,
    policy: &Policy,
    st: &Statement,
) -> Result<StatementResult, String> {
    if st.sql.trim().is_empty() {
        return Err("empty statement".into());
    }
    let mut stmt = conn.prepare(&st.sql).map_err(|e| policy.describe(&e))?;
    run_prepared_inner(conn, policy, &mut stmt, &st.params)
}

/// Runs a statement already prepared on `conn` with `params`.
pub(crate) fn run_prepared(
    conn: &Connection,
    policy: &Policy,
    stmt: &mut rusqlite::Statement<'_>,
    params: &Params,
) -> StatementOutcome {
    let started = Instant::now();
    let result = match run_prepared_inner(conn, policy, stmt, params) {
        Ok(r) => r,
        Err(message) => StatementResult::Error(message),
    };
    StatementOutcome {
        result,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn run_prepared_inner(
    conn: &Connection,
    policy: &Policy,
    stmt: &mut rusqlite::Statement<'_>,
    params: &Params,
) -> Result<StatementResult, String> {
    bind(stmt, params)?;
    let width = stmt.column_count();
    if width == 0 {
        let before = conn.total_changes();
        stmt.raw_execute().map_err(|e| policy.describe(&e))?;
        // sqlite3_changes() keeps its old value across statements that change
        // no rows (DDL among them), so it counts only if this statement
        // changed something; it excludes rows changed by triggers.
        let rows_affected = if conn.total_changes() == before {
            0
        } else {
            conn.changes()
        };
        return Ok(StatementResult::Executed {
            last_insert_id: conn.last_insert_rowid(),
            rows_affected,
        });
    }
    let columns: Vec<String> = stmt.column_names().map(|c| c.to_string()).collect();
    let mut types: Vec<String> = stmt
        .columns()
        .map(|c| c.decl_type().unwrap_or("").to_ascii_lowercase())
        .collect();
    let mut values = Vec::new();
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next().map_err(|e| policy.describe(&e))? {
        let mut out = Vec::with_capacity(width);
        for i in 0..width {
            let v = row.get_ref(i).map_err(|e| error_message(&e))?;
            out.push(to_value(v));
        }
        values.push(out);
    }
    for (i, ty) in types.iter_mut().enumerate() {
        if ty.is_empty()
            && let Some(v) = values
                .iter()
                .map(|r: &Vec<Value>| &r[i])
                .find(|v| **v != Value::Null)
        {
            *ty = storage_class(v).to_string();
        }
    }
    Ok(StatementResult::Rows(Rows {
        columns,
        types,
        values,
    }))
}

fn storage_class(v: &Value) -> &'static str {
    match v {
        Value::Null => "",
        Value::Integer(_) => "integer",
        Value::Real(_) => "real",
        Value::Text(_) => "text",
        Value::Blob(_) => "blob",
    }
}

fn to_value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn to_sql(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Integer(i) => V::Integer(*i),
        Value::Real(f) => V::Real(*f),
        Value::Text(t) => V::Text(t.clone()),
        Value::Blob(b) => V::Blob(b.clone()),
    }
}

/// Binds parameters, refusing missing, surplus and unknown ones.
fn bind(stmt: &mut rusqlite::Statement<'_>, params: &Params) -> Result<(), String> {
    let count = stmt.parameter_count();
    let bind_err = |e: rusqlite::Error| error_message(&e);
    match params {
        Params::None if count == 0 => Ok(()),
        Params::None => Err(format!(
            "statement has {count} parameter{} but no values were given",
            if count == 1 { "" } else { "s" }
        )),
        Params::Positional(values) => {
            if values.len() != count {
                return Err(format!(
                    "statement has {count} parameter{} but {} value{} given",
                    if count == 1 { "" } else { "s" },
                    values.len(),
                    if values.len() == 1 { " was" } else { "s were" }
                ));
            }
            for (i, v) in values.iter().enumerate() {
                stmt.raw_bind_parameter(i + 1, to_sql(v))
                    .map_err(bind_err)?;
            }
            Ok(())
        }
        Params::Named(pairs) => {
            let mut used = vec![false; pairs.len()];
            let mut names = Vec::with_capacity(count);
            for i in 1..=count {
                let Some(full) = stmt.parameter_name(i).map(str::to_string) else {
                    return Err(format!(
                        "parameter {i} is positional (?) but values were given by name"
                    ));
                };
                let key = &full[1..];
                let Some(pos) = pairs.iter().position(|(k, _)| k == key || *k == full) else {
                    return Err(format!("no value given for parameter {full}"));
                };
                used[pos] = true;
                stmt.raw_bind_parameter(i, to_sql(&pairs[pos].1))
                    .map_err(bind_err)?;
                names.push(full);
            }
            if let Some(extra) = used.iter().position(|u| !u) {
                return Err(format!(
                    "unknown parameter {:?}: the statement has {}",
                    pairs[extra].0,
                    if names.is_empty() {
                        "no named parameters".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Connection, Policy) {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, n REAL)")
            .unwrap();
        let policy = Policy::install(&mut conn, true).unwrap();
        (conn, policy)
    }

    fn err(conn: &Connection, p: &Policy, st: Statement) -> String {
        match run(conn, p, &st).result {
            StatementResult::Error(m) => m,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn executes_binds_and_reads() {
        let (conn, p) = setup();
        let r = run(
            &conn,
            &p,
            &Statement::with_params(
                "INSERT INTO t(name, n) VALUES (?, ?)",
                Params::Positional(vec![Value::Text("fiona".into()), Value::Real(1.5)]),
            ),
        );
        assert_eq!(
            r.result,
            StatementResult::Executed {
                last_insert_id: 1,
                rows_affected: 1
            }
        );
        let r = run(
            &conn,
            &p,
            &Statement::with_params(
                "INSERT INTO t(name) VALUES (:name)",
                Params::Named(vec![("name".into(), Value::Text("declan".into()))]),
            ),
        );
        assert!(!r.result.is_error(), "{r:?}");
        let r = run(
            &conn,
            &p,
            &Statement::new("SELECT id, name, n, 1+1 AS two FROM t"),
        );
        let StatementResult::Rows(rows) = r.result else {
            panic!("{r:?}")
        };
        assert_eq!(rows.columns, ["id", "name", "n", "two"]);
        assert_eq!(rows.types, ["integer", "text", "real", "integer"]);
        assert_eq!(
            rows.values[1],
            [
                Value::Integer(2),
                Value::Text("declan".into()),
                Value::Null,
                Value::Integer(2)
            ]
        );
    }

    #[test]
    fn parameter_mistakes_are_clear() {
        let (conn, p) = setup();
        let m = err(&conn, &p, Statement::new("INSERT INTO t(name) VALUES (?)"));
        assert!(m.contains("1 parameter but no values"), "{m}");
        let m = err(
            &conn,
            &p,
            Statement::with_params("INSERT INTO t(name) VALUES (?)", Params::Positional(vec![])),
        );
        assert!(m.contains("but 0 values were given"), "{m}");
        let m = err(
            &conn,
            &p,
            Statement::with_params(
                "INSERT INTO t(name) VALUES (:name)",
                Params::Named(vec![
                    ("name".into(), Value::Null),
                    ("nmae".into(), Value::Null),
                ]),
            ),
        );
        assert!(m.contains("unknown parameter \"nmae\""), "{m}");
        let m = err(
            &conn,
            &p,
            Statement::with_params("INSERT INTO t(name) VALUES (:name)", Params::Named(vec![])),
        );
        assert!(m.contains("no value given for parameter :name"), "{m}");
        let m = err(&conn, &p, Statement::new("SELEC 1"));
        assert!(m.contains("syntax error"), "{m}");
        let m = err(&conn, &p, Statement::new("SELECT 1; SELECT 2"));
        assert!(m.contains("one statement"), "{m}");
        let m = err(&conn, &p, Statement::new("  "));
        assert_eq!(m, "empty statement");
    }
}
