//! Output modes, after sqlite3's `.mode`.

use std::fmt::Write as _;

use serde_json::Value as Json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Table,
    Csv,
    Json,
    Line,
    List,
}

impl Mode {
    /// The mode's name, as `.mode` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Table => "table",
            Mode::Csv => "csv",
            Mode::Json => "json",
            Mode::Line => "line",
            Mode::List => "list",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "table" | "box" => Ok(Mode::Table),
            "csv" => Ok(Mode::Csv),
            "json" => Ok(Mode::Json),
            "line" => Ok(Mode::Line),
            "list" => Ok(Mode::List),
            other => Err(format!(
                "unknown mode {other:?}: choose table, csv, json, line or list"
            )),
        }
    }
}

/// A value as text: NULL as empty text as sqlite3 prints it, a blob as an
/// `X'..'` literal so that binary data never garbles the terminal.
pub(crate) fn text(v: &Json) -> String {
    match v {
        Json::Null => String::new(),
        Json::String(s) => s.clone(),
        Json::Array(bytes) => {
            let hex: String = bytes_of(bytes)
                .unwrap_or_default()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("X'{hex}'")
        }
        other => other.to_string(),
    }
}

/// The bytes of a blob sent as an array of byte values.
pub(crate) fn bytes_of(a: &[Json]) -> Option<Vec<u8>> {
    a.iter().map(|b| b.as_u64().map(|b| b as u8)).collect()
}

pub(crate) fn render(mode: Mode, headers: bool, columns: &[String], rows: &[Vec<Json>]) -> String {
    let mut out = String::new();
    match mode {
        Mode::Table => table(&mut out, columns, rows),
        Mode::Csv => {
            if headers {
                line(&mut out, columns.iter().map(|c| csv_field(c)), ",");
            }
            for r in rows {
                line(&mut out, r.iter().map(|v| csv_field(&text(v))), ",");
            }
        }
        Mode::List => {
            if headers {
                line(&mut out, columns.iter().cloned(), "|");
            }
            for r in rows {
                line(&mut out, r.iter().map(text), "|");
            }
        }
        Mode::Line => {
            let width = columns.iter().map(|c| c.chars().count()).max().unwrap_or(0);
            for (i, r) in rows.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                for (c, v) in columns.iter().zip(r) {
                    let _ = writeln!(out, "{c:>width$} = {}", text(v));
                }
            }
        }
        Mode::Json => {
            if rows.is_empty() {
                return out;
            }
            out.push('[');
            for (i, r) in rows.iter().enumerate() {
                let obj: serde_json::Map<String, Json> = columns
                    .iter()
                    .cloned()
                    .zip(r.iter().map(json_value))
                    .collect();
                if i > 0 {
                    out.push_str(",\n");
                }
                out.push_str(&Json::Object(obj).to_string());
            }
            out.push_str("]\n");
        }
    }
    out
}

fn json_value(v: &Json) -> Json {
    match v {
        Json::Array(a) => Json::String(
            bytes_of(a)
                .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
                .unwrap_or_default(),
        ),
        other => other.clone(),
    }
}

fn line(out: &mut String, fields: impl Iterator<Item = String>, sep: &str) {
    let fields: Vec<String> = fields.collect();
    out.push_str(&fields.join(sep));
    out.push('\n');
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn table(out: &mut String, columns: &[String], rows: &[Vec<Json>]) {
    let cells: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(text).collect()).collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.chars().count()).collect();
    for r in &cells {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let rule: String = widths.iter().fold(String::from("+"), |mut s, w| {
        s.push_str(&"-".repeat(w + 2));
        s.push('+');
        s
    });
    let row = |out: &mut String, vals: &[String], numeric: &[bool]| {
        out.push('|');
        for ((v, w), num) in vals.iter().zip(&widths).zip(numeric) {
            let pad = w - v.chars().count();
            if *num {
                let _ = write!(out, " {}{v} |", " ".repeat(pad));
            } else {
                let _ = write!(out, " {v}{} |", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    let _ = writeln!(out, "{rule}");
    row(out, columns, &vec![false; columns.len()]);
    let _ = writeln!(out, "{rule}");
    for (r, raw) in cells.iter().zip(rows) {
        let numeric: Vec<bool> = raw.iter().map(Json::is_number).collect();
        row(out, r, &numeric);
    }
    let _ = writeln!(out, "{rule}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> (Vec<String>, Vec<Vec<Json>>) {
        (
            vec!["id".into(), "name".into()],
            vec![
                vec![json!(1), json!("fiona")],
                vec![json!(22), json!("a,\"b\"")],
                vec![json!(3), Json::Null],
            ],
        )
    }

    #[test]
    fn every_mode() {
        let (c, r) = sample();
        assert_eq!(
            render(Mode::Table, false, &c, &r),
            "+----+-------+\n| id | name  |\n+----+-------+\n|  1 | fiona |\n| 22 | a,\"b\" |\n|  3 |       |\n+----+-------+\n"
        );
        assert_eq!(
            render(Mode::Csv, true, &c, &r),
            "id,name\n1,fiona\n22,\"a,\"\"b\"\"\"\n3,\n"
        );
        assert_eq!(
            render(Mode::List, false, &c, &r),
            "1|fiona\n22|a,\"b\"\n3|\n"
        );
        assert_eq!(
            render(Mode::Line, false, &c, &r[..1]),
            "  id = 1\nname = fiona\n"
        );
        assert_eq!(
            render(Mode::Json, false, &c, &r[..2]),
            "[{\"id\":1,\"name\":\"fiona\"},\n{\"id\":22,\"name\":\"a,\\\"b\\\"\"}]\n"
        );
        assert!("yaml".parse::<Mode>().unwrap_err().contains("unknown mode"));
        assert_eq!(text(&json!([0, 255])), "X'00ff'");
    }
}
