//! Results in rqlite's JSON response shapes.

use base64::Engine;
use serde_json::{Map, Value as Json, json};
use tablix_store::{Rows, StatementOutcome, StatementResult, Value};

use crate::options::Options;

/// Which endpoint's shape a row-less or row-returning result takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `/db/execute`: every result is an execute result.
    Execute,
    /// `/db/query` and `/db/request`: rows as query results, the rest as
    /// execute results.
    Mixed,
}

pub(crate) fn results(
    outcomes: &[StatementOutcome],
    shape: Shape,
    o: &Options,
    seconds: f64,
) -> Json {
    let list: Vec<Json> = outcomes.iter().map(|out| result(out, shape, o)).collect();
    let mut top = Map::new();
    top.insert("results".into(), Json::Array(list));
    if o.timings {
        top.insert("time".into(), json!(seconds));
    }
    Json::Object(top)
}

fn result(out: &StatementOutcome, shape: Shape, o: &Options) -> Json {
    let mut m = Map::new();
    match (&out.result, shape) {
        (StatementResult::Error(e), _) => {
            m.insert("error".into(), json!(e));
        }
        (
            StatementResult::Executed {
                last_insert_id,
                rows_affected,
            },
            _,
        ) => {
            m.insert("last_insert_id".into(), json!(last_insert_id));
            m.insert("rows_affected".into(), json!(rows_affected));
        }
        (StatementResult::Rows(_), Shape::Execute) => {
            m.insert("last_insert_id".into(), json!(0));
            m.insert("rows_affected".into(), json!(0));
        }
        (StatementResult::Rows(rows), Shape::Mixed) => rows_into(&mut m, rows, o),
    }
    if o.timings {
        m.insert("time".into(), json!(out.seconds));
    }
    Json::Object(m)
}

fn rows_into(m: &mut Map<String, Json>, rows: &Rows, o: &Options) {
    if o.associative {
        let types: Map<String, Json> = rows
            .columns
            .iter()
            .zip(&rows.types)
            .map(|(c, t)| (c.clone(), json!(t)))
            .collect();
        let list: Vec<Json> = rows
            .values
            .iter()
            .map(|row| {
                Json::Object(
                    rows.columns
                        .iter()
                        .zip(row)
                        .map(|(c, v)| (c.clone(), value(v, o)))
                        .collect(),
                )
            })
            .collect();
        m.insert("types".into(), Json::Object(types));
        m.insert("rows".into(), Json::Array(list));
    } else {
        m.insert("columns".into(), json!(rows.columns));
        m.insert("types".into(), json!(rows.types));
        let values: Vec<Json> = rows
            .values
            .iter()
            .map(|row| Json::Array(row.iter().map(|v| value(v, o)).collect()))
            .collect();
        m.insert("values".into(), Json::Array(values));
    }
}

fn value(v: &Value, o: &Options) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => json!(i),
        Value::Real(f) => json!(f),
        Value::Text(t) => json!(t),
        Value::Blob(b) if o.blob_array => json!(b),
        Value::Blob(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(result: StatementResult) -> StatementOutcome {
        StatementOutcome {
            result,
            seconds: 0.5,
        }
    }

    #[test]
    fn shapes() {
        let rows = outcome(StatementResult::Rows(Rows {
            columns: vec!["id".into(), "b".into()],
            types: vec!["integer".into(), "blob".into()],
            values: vec![vec![Value::Integer(1), Value::Blob(vec![0, 255])]],
        }));
        let exec = outcome(StatementResult::Executed {
            last_insert_id: 7,
            rows_affected: 2,
        });
        let err = outcome(StatementResult::Error("no such table: x".into()));
        let plain = Options::default();
        let j = results(
            &[rows.clone(), exec.clone(), err.clone()],
            Shape::Mixed,
            &plain,
            1.0,
        );
        assert_eq!(
            j,
            json!({"results": [
                {"columns": ["id", "b"], "types": ["integer", "blob"], "values": [[1, "AP8="]]},
                {"last_insert_id": 7, "rows_affected": 2},
                {"error": "no such table: x"}
            ]})
        );
        let o = Options {
            associative: true,
            timings: true,
            blob_array: true,
            ..Options::default()
        };
        let j = results(std::slice::from_ref(&rows), Shape::Mixed, &o, 1.0);
        assert_eq!(
            j,
            json!({"results": [{"types": {"id": "integer", "b": "blob"}, "rows": [{"id": 1, "b": [0, 255]}], "time": 0.5}], "time": 1.0})
        );
        let j = results(&[rows], Shape::Execute, &plain, 1.0);
        assert_eq!(
            j,
            json!({"results": [{"last_insert_id": 0, "rows_affected": 0}]})
        );
    }
}
