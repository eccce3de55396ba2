//! Request bodies: rqlite's JSON forms of a list of statements.

use serde_json::Value as Json;
use tablix_store::{Params, Statement, Value};

/// Parses a body such as
/// `["CREATE TABLE t(x)", ["INSERT INTO t VALUES(?)", 1], ["INSERT INTO t VALUES(:x)", {"x": 2}]]`.
pub fn parse_statements(body: &[u8]) -> Result<Vec<Statement>, String> {
    let json: Json =
        serde_json::from_slice(body).map_err(|e| format!("request body is not valid JSON: {e}"))?;
    let Json::Array(items) = json else {
        return Err("request body must be a JSON array of statements".into());
    };
    if items.is_empty() {
        return Err("request body contains no statements".into());
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| statement(item).map_err(|e| format!("statement {i}: {e}")))
        .collect()
}

fn statement(item: Json) -> Result<Statement, String> {
    match item {
        Json::String(sql) => Ok(Statement::new(sql)),
        Json::Array(mut parts) => {
            if parts.is_empty() {
                return Err("an empty array is not a statement".into());
            }
            let Json::String(sql) = parts.remove(0) else {
                return Err("the first element must be the SQL text".into());
            };
            if parts.len() == 1 && parts[0].is_object() {
                let Some(Json::Object(map)) = parts.pop() else {
                    return Err("named parameters must be an object".into());
                };
                let named = map
                    .into_iter()
                    .map(|(k, v)| {
                        value(v)
                            .map(|v| (k.clone(), v))
                            .map_err(|e| format!("parameter {k:?}: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
                return Ok(Statement::with_params(sql, Params::Named(named)));
            }
            if parts.is_empty() {
                return Ok(Statement::new(sql));
            }
            let positional = parts
                .into_iter()
                .enumerate()
                .map(|(i, v)| value(v).map_err(|e| format!("parameter {}: {e}", i + 1)))
                .collect::<Result<_, _>>()?;
            Ok(Statement::with_params(sql, Params::Positional(positional)))
        }
        other => Err(format!(
            "expected a string or an array, found {}",
            kind(&other)
        )),
    }
}

fn value(v: Json) -> Result<Value, String> {
    match v {
        Json::Null => Ok(Value::Null),
        Json::Bool(b) => Ok(Value::Integer(i64::from(b))),
        Json::Number(n) => n
            .as_i64()
            .map(Value::Integer)
            .or_else(|| n.as_f64().map(Value::Real))
            .ok_or_else(|| format!("number {n} is out of range")),
        Json::String(s) => Ok(Value::Text(s)),
        // A blob, as rqlite's blob_array form writes it back.
        Json::Array(bytes) => bytes
            .iter()
            .map(|b| b.as_u64().filter(|b| *b <= 255).map(|b| b as u8))
            .collect::<Option<Vec<u8>>>()
            .map(Value::Blob)
            .ok_or_else(|| "an array value must be a blob: integers 0..=255".to_string()),
        Json::Object(_) => Err("objects are not SQL values".into()),
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_three_forms() {
        let s = parse_statements(
            br#"["CREATE TABLE t(x)", ["INSERT INTO t VALUES(?, ?)", 1, 2.5], ["INSERT INTO t VALUES(:x)", {"x": "y"}], ["SELECT 1"], ["INSERT INTO t VALUES(?)", [1, 2]], ["INSERT INTO t VALUES(?)", true]]"#,
        )
        .unwrap();
        assert_eq!(s[0], Statement::new("CREATE TABLE t(x)"));
        assert_eq!(
            s[1].params,
            Params::Positional(vec![Value::Integer(1), Value::Real(2.5)])
        );
        assert_eq!(
            s[2].params,
            Params::Named(vec![("x".into(), Value::Text("y".into()))])
        );
        assert_eq!(s[3], Statement::new("SELECT 1"));
        assert_eq!(
            s[4].params,
            Params::Positional(vec![Value::Blob(vec![1, 2])])
        );
        assert_eq!(s[5].params, Params::Positional(vec![Value::Integer(1)]));
    }

    #[test]
    fn malformed_bodies_are_explained() {
        for (body, want) in [
            (&b"{"[..], "not valid JSON"),
            (b"{}", "must be a JSON array"),
            (b"[]", "no statements"),
            (
                b"[1]",
                "statement 0: expected a string or an array, found a number",
            ),
            (b"[[]]", "empty array"),
            (b"[[1]]", "first element must be the SQL text"),
            (
                br#"[["SELECT ?", {"a": {}}]]"#,
                "parameter \"a\": objects are not SQL values",
            ),
            (
                br#"[["SELECT ?", [300]]]"#,
                "parameter 1: an array value must be a blob",
            ),
        ] {
            let err = parse_statements(body).unwrap_err();
            assert!(
                err.contains(want),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
