//! `.dump`: the user's schema and rows as SQL text that `tablix sql` can read
//! back. System tables (`tablix_*`) and the file system's `files` view are
//! tablix's own and are not dumped.

use std::fmt::Write as _;

use serde_json::Value as Json;

use crate::client::{Client, Reply};
use crate::format::bytes_of;
use crate::shell::ShellError;

const SCHEMA: &str = "SELECT type, name, tbl_name, sql FROM main.sqlite_schema \
    WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
    AND tbl_name NOT LIKE 'tablix\\_%' ESCAPE '\\' AND name != 'files' \
    ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, rowid";

/// Dumps every user table, or those named in `only` (case-insensitive).
pub(crate) fn dump(client: &Client, only: &[String]) -> Result<String, ShellError> {
    let objects = match client.query(&[SCHEMA.to_string()])?.pop() {
        Some(Reply::Rows { values, .. }) => values,
        Some(Reply::Error(e)) => return Err(ShellError::Sql(e)),
        _ => Vec::new(),
    };
    let wanted =
        |table: &str| only.is_empty() || only.iter().any(|t| t.eq_ignore_ascii_case(table));
    let field = |row: &[Json], i: usize| {
        row.get(i)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let objects: Vec<(String, String, String, String)> = objects
        .iter()
        .map(|r| (field(r, 0), field(r, 1), field(r, 2), field(r, 3)))
        .filter(|(_, _, table, _)| wanted(table))
        .collect();
    let tables: Vec<&(String, String, String, String)> =
        objects.iter().filter(|o| o.0 == "table").collect();
    let selects: Vec<String> = tables
        .iter()
        .map(|(_, name, _, _)| format!("SELECT * FROM {}", quote_ident(name)))
        .collect();
    let data = if selects.is_empty() {
        Vec::new()
    } else {
        client.query(&selects)?
    };
    let mut out = String::from("BEGIN TRANSACTION;\n");
    for ((_, name, _, sql), rows) in tables.iter().zip(&data) {
        let _ = writeln!(out, "{sql};");
        match rows {
            Reply::Rows { values, .. } => {
                for row in values {
                    let literals: Vec<String> = row.iter().map(literal).collect();
                    let _ = writeln!(
                        out,
                        "INSERT INTO {} VALUES({});",
                        quote_ident(name),
                        literals.join(",")
                    );
                }
            }
            Reply::Error(e) => return Err(ShellError::Sql(format!("dumping {name}: {e}"))),
            Reply::Executed { .. } => {}
        }
    }
    for (_, _, _, sql) in objects.iter().filter(|o| o.0 != "table") {
        let _ = writeln!(out, "{sql};");
    }
    out.push_str("COMMIT;\n");
    Ok(out)
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A value as an SQL literal that reads back as the same value and type.
fn literal(v: &Json) -> String {
    match v {
        Json::Null => "NULL".into(),
        Json::Bool(b) => i64::from(*b).to_string(),
        Json::Number(n) => {
            let s = n.to_string();
            if n.is_f64() && !s.contains(['.', 'e', 'E']) {
                format!("{s}.0")
            } else {
                s
            }
        }
        Json::String(s) => format!("'{}'", s.replace('\'', "''")),
        Json::Array(a) => {
            let hex: String = bytes_of(a)
                .unwrap_or_default()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("X'{hex}'")
        }
        Json::Object(_) => "NULL".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_round_trip_types() {
        assert_eq!(literal(&json!(null)), "NULL");
        assert_eq!(literal(&json!(3)), "3");
        assert_eq!(literal(&json!(1.5)), "1.5");
        assert_eq!(literal(&json!(2.0)), "2.0");
        assert_eq!(literal(&json!("it's")), "'it''s'");
        assert_eq!(literal(&json!([0, 255])), "X'00ff'");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
