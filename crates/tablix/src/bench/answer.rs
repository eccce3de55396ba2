//! What the benchmarks count as done: rqlite-style JSON answers read whole
//! and checked, so that an error answered with HTTP 200 is not counted.

/// Whether an rqlite-style answer to one INSERT reports one row inserted.
pub(crate) fn one_row_inserted(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["results"][0]["rows_affected"].as_i64())
        == Some(1)
}

/// Whether an rqlite-style answer has results, none of them an error.
pub(crate) fn succeeded(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v["results"]
                .as_array()
                .map(|r| !r.is_empty() && r.iter().all(|one| one.get("error").is_none()))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_reporting_one_inserted_row_counts() {
        assert!(one_row_inserted(
            r#"{"results":[{"last_insert_id":7,"rows_affected":1}]}"#
        ));
        assert!(!one_row_inserted(
            r#"{"results":[{"error":"no such table: bench"}]}"#
        ));
        assert!(!one_row_inserted(r#"{"results":[{"rows_affected":0}]}"#));
        assert!(!one_row_inserted("<html>busy</html>"));
    }

    #[test]
    fn an_answer_with_an_error_is_no_success() {
        assert!(succeeded(r#"{"results":[{"rows_affected":1}]}"#));
        assert!(succeeded(
            r#"{"results":[{"columns":["count(*)"],"values":[[3]]}]}"#
        ));
        assert!(!succeeded(
            r#"{"results":[{"error":"interrupted: the statement ran past its time limit"}]}"#
        ));
        assert!(!succeeded(r#"{"results":[]}"#));
        assert!(!succeeded("not json"));
    }
}
