//! rqlite's response shape, written as results arrive: a [`Sink`] that
//! encodes each row into a buffer and hands the buffer on in chunks, so
//! that a large result never exists whole in the daemon, and counts the
//! bytes against the request's bound.
//!
//! Per statement the keys come in the order they can be known: `columns`,
//! `values` (or, with `associative`, `rows`), then `types` (the storage
//! class of an expression column is the first non-NULL value's), `error`
//! after rows if the statement failed part way, and `time`.

use base64::Engine;
use tablix_store::{Cell, Sink, Stop};

use crate::options::Options;

/// Bytes gathered before a chunk is handed on.
pub(crate) const CHUNK: usize = 64 * 1024;

/// The buffer a response starts with.
const FIRST_BUF: usize = 512;

/// Where encoded chunks go.
pub(crate) trait Out {
    fn emit(&mut self, chunk: Vec<u8>) -> Result<(), Stop>;
}

/// Everything in one buffer, for responses already bounded (a write's
/// results, gathered while the writer held them).
impl Out for Vec<Vec<u8>> {
    fn emit(&mut self, chunk: Vec<u8>) -> Result<(), Stop> {
        self.push(chunk);
        Ok(())
    }
}

/// Which endpoint's shape results take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `/db/execute`: every result is an execute result.
    Execute,
    /// `/db/query` and `/db/request`: rows as query results.
    Mixed,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening `{"results":[`.
    Start,
    /// Between statements.
    Between,
    /// Inside a statement's object, nothing written yet.
    Statement,
    /// Inside a statement's rows (its list is open).
    Rows,
    /// Inside a statement's object, after its result.
    Done,
}

pub(crate) struct Encoder<O: Out> {
    out: O,
    o: Options,
    shape: Shape,
    buf: Vec<u8>,
    /// Bytes handed on so far, and the most allowed.
    sent: usize,
    limit: usize,
    state: State,
    statements: usize,
    rows: usize,
    columns: Vec<String>,
}

impl<O: Out> Encoder<O> {
    pub(crate) fn new(out: O, o: &Options, shape: Shape, limit: usize) -> Encoder<O> {
        Encoder {
            out,
            o: o.clone(),
            shape,
            // Most answers are a few dozen bytes: the buffer grows to a
            // chunk only for results that need one. Two chunk-sized
            // buffers per request took 16 clients' single-row inserts
            // from 0.90-0.98 to 0.77-0.86 of the rate before results were
            // streamed (allocator locks, freed heap pages unmapped).
            buf: Vec::with_capacity(FIRST_BUF),
            sent: 0,
            limit,
            state: State::Start,
            statements: 0,
            rows: 0,
            columns: Vec::new(),
        }
    }

    /// Where the chunks went.
    pub(crate) fn into_out(self) -> O {
        self.out
    }

    /// Statements whose results were begun so far.
    pub(crate) fn statements(&self) -> usize {
        self.statements
    }

    /// Whether anything has been handed on (a failure of the whole
    /// request can still become an HTTP error until then).
    pub(crate) fn started(&self) -> bool {
        self.sent > 0
    }

    fn nl(&mut self, depth: usize) {
        if self.o.pretty {
            self.buf.push(b'\n');
            self.buf.extend(std::iter::repeat_n(b' ', depth * 2));
        }
    }

    fn raw(&mut self, s: &str) {
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn key(&mut self, depth: usize, first: bool, name: &str) {
        if !first {
            self.buf.push(b',');
        }
        self.nl(depth);
        string(&mut self.buf, name);
        self.buf.push(b':');
        if self.o.pretty {
            self.buf.push(b' ');
        }
    }

    /// Hands the buffer on once it holds a chunk. `force`: whatever it holds.
    fn flush(&mut self, force: bool) -> Result<(), Stop> {
        if self.buf.is_empty() || (!force && self.buf.len() < CHUNK) {
            return Ok(());
        }
        self.sent += self.buf.len();
        // After a full chunk more are likely; after the last, none.
        let next = if force {
            Vec::new()
        } else {
            Vec::with_capacity(CHUNK + 1024)
        };
        let chunk = std::mem::replace(&mut self.buf, next);
        self.out.emit(chunk)
    }

    fn too_large(&self) -> Stop {
        Stop::TooLarge(format!(
            "the result is larger than the limit of {} bytes (--max-result-bytes); select fewer rows or columns, or read large values in pieces (substr, file_data(path, offset, length))",
            self.limit
        ))
    }

    /// Fails with TooLarge once the result outgrows its bound.
    fn check(&self) -> Result<(), Stop> {
        if self.sent + self.buf.len() > self.limit {
            Err(self.too_large())
        } else {
            Ok(())
        }
    }

    fn open_results(&mut self) {
        if self.state == State::Start {
            self.raw("{");
            self.key(1, true, "results");
            self.raw("[");
            self.state = State::Between;
        }
    }

    fn open_statement(&mut self) {
        self.open_results();
        if self.state == State::Between {
            if self.statements > 0 {
                self.raw(",");
            }
            self.nl(2);
            self.raw("{");
            self.statements += 1;
            self.state = State::Statement;
        }
    }

    /// The first key of a statement's object, or a later one.
    fn first_key(&self) -> bool {
        self.state == State::Statement
    }

    fn value(&mut self, cell: &Cell<'_>) -> Result<(), Stop> {
        match cell {
            Cell::Null => self.raw("null"),
            Cell::Integer(i) => self.raw(&i.to_string()),
            Cell::Real(f) if f.is_finite() => {
                let text = serde_json::to_string(f).unwrap_or_else(|_| "null".into());
                self.raw(&text);
            }
            Cell::Real(_) => self.raw("null"),
            Cell::Text(t) => {
                let text = String::from_utf8_lossy(t);
                // Long text in pieces, each at a character boundary.
                self.buf.push(b'"');
                let mut rest: &str = &text;
                while !rest.is_empty() {
                    let mut cut = rest.len().min(CHUNK);
                    while !rest.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    escape(&mut self.buf, &rest[..cut]);
                    rest = &rest[cut..];
                    self.flush(false)?;
                }
                self.buf.push(b'"');
            }
            Cell::Blob(b) if self.o.blob_array => {
                self.buf.push(b'[');
                for (i, piece) in b.chunks(CHUNK / 4).enumerate() {
                    for (j, byte) in piece.iter().enumerate() {
                        if i + j > 0 {
                            self.buf.push(b',');
                        }
                        self.raw(&byte.to_string());
                    }
                    self.flush(false)?;
                }
                self.buf.push(b']');
            }
            Cell::Blob(b) => {
                self.buf.push(b'"');
                // Whole 3-byte groups per piece, so the pieces join up.
                for piece in b.chunks(CHUNK / 4 * 3) {
                    let at = self.buf.len();
                    self.buf.resize(at + piece.len().div_ceil(3) * 4, 0);
                    let n = base64::engine::general_purpose::STANDARD
                        .encode_slice(piece, &mut self.buf[at..])
                        .unwrap_or(0);
                    self.buf.truncate(at + n);
                    self.flush(false)?;
                }
                self.buf.push(b'"');
            }
        }
        Ok(())
    }

    fn time(&mut self, depth: usize, first: bool, seconds: f64) {
        if self.o.timings {
            self.key(depth, first, "time");
            let t = serde_json::to_string(&seconds).unwrap_or_else(|_| "0".into());
            self.raw(&t);
        }
    }

    /// A statement's result of tablix's own (a transaction begun or
    /// ended): its fields, as given. Ended by `end_statement`.
    pub(crate) fn fields(&mut self, pairs: &[(&str, serde_json::Value)]) -> Result<(), Stop> {
        self.open_statement();
        for (name, value) in pairs {
            let first = self.first_key();
            self.key(3, first, name);
            let text = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
            self.raw(&text);
            self.state = State::Done;
        }
        self.check()
    }

    /// Closes the response: after the last statement, with the request's
    /// time when asked for.
    pub(crate) fn finish(mut self, seconds: f64) -> Result<O, Stop> {
        self.open_results();
        if self.statements > 0 {
            self.nl(1);
        }
        self.raw("]");
        self.time(1, false, seconds);
        self.nl(0);
        self.raw("}");
        if self.o.pretty {
            self.raw("\n");
        }
        self.flush(true)?;
        Ok(self.out)
    }
}

/// The bytes a value takes once encoded.
fn encoded_len(cell: &Cell<'_>, blob_array: bool) -> usize {
    match cell {
        Cell::Null => 4,
        Cell::Integer(_) | Cell::Real(_) => 24,
        Cell::Text(t) => {
            2 + String::from_utf8_lossy(t)
                .bytes()
                .map(|b| match b {
                    b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                    c if c < 0x20 => 6,
                    _ => 1,
                })
                .sum::<usize>()
        }
        Cell::Blob(b) if blob_array => {
            2 + b
                .iter()
                .map(|&x| {
                    if x >= 100 {
                        4
                    } else if x >= 10 {
                        3
                    } else {
                        2
                    }
                })
                .sum::<usize>()
        }
        Cell::Blob(b) => 2 + b.len().div_ceil(3) * 4,
    }
}

/// Appends `s` as a JSON string's content (without quotes).
fn escape(buf: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        match b {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            b'\t' => buf.extend_from_slice(b"\\t"),
            0x08 => buf.extend_from_slice(b"\\b"),
            0x0c => buf.extend_from_slice(b"\\f"),
            c if c < 0x20 => buf.extend_from_slice(format!("\\u{c:04x}").as_bytes()),
            c => buf.push(c),
        }
    }
}

fn string(buf: &mut Vec<u8>, s: &str) {
    buf.push(b'"');
    escape(buf, s);
    buf.push(b'"');
}

impl<O: Out> Sink for Encoder<O> {
    fn columns(&mut self, names: &[String]) -> Result<(), Stop> {
        self.open_statement();
        self.rows = 0;
        if self.shape == Shape::Execute {
            self.columns.clear();
            return Ok(());
        }
        self.columns = names.to_vec();
        if self.o.associative {
            self.key(3, true, "rows");
        } else {
            self.key(3, true, "columns");
            self.raw("[");
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    self.raw(",");
                }
                string(&mut self.buf, n);
            }
            self.raw("]");
            self.key(3, false, "values");
        }
        self.raw("[");
        self.state = State::Rows;
        self.check()
    }

    fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), Stop> {
        if self.shape == Shape::Execute {
            return Ok(());
        }
        // The whole row must fit before any of it is written, so that a
        // result cut at its bound ends at a row and stays valid JSON.
        let names: usize = if self.o.associative {
            self.columns.iter().map(|c| c.len() + 4).sum()
        } else {
            0
        };
        let need = names
            + 4
            + cells
                .iter()
                .map(|c| encoded_len(c, self.o.blob_array) + 1)
                .sum::<usize>();
        if self.sent + self.buf.len() + need > self.limit {
            return Err(self.too_large());
        }
        if self.rows > 0 {
            self.raw(",");
        }
        self.nl(4);
        self.rows += 1;
        self.raw(if self.o.associative { "{" } else { "[" });
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                self.raw(",");
            }
            if self.o.associative {
                let name = self.columns.get(i).cloned().unwrap_or_default();
                string(&mut self.buf, &name);
                self.raw(":");
            }
            self.value(cell)?;
        }
        self.raw(if self.o.associative { "}" } else { "]" });
        self.flush(false)
    }

    fn end_rows(&mut self, types: &[String]) -> Result<(), Stop> {
        if self.shape == Shape::Execute {
            // A query's result on /db/execute: rqlite reports no change.
            self.open_statement();
            self.key(3, true, "last_insert_id");
            self.raw("0");
            self.key(3, false, "rows_affected");
            self.raw("0");
            self.state = State::Done;
            return Ok(());
        }
        if self.rows > 0 {
            self.nl(3);
        }
        self.raw("]");
        self.key(3, false, "types");
        if self.o.associative {
            self.raw("{");
            for (i, (c, t)) in self.columns.clone().iter().zip(types).enumerate() {
                if i > 0 {
                    self.raw(",");
                }
                string(&mut self.buf, c);
                self.raw(":");
                string(&mut self.buf, t);
            }
            self.raw("}");
        } else {
            self.raw("[");
            for (i, t) in types.iter().enumerate() {
                if i > 0 {
                    self.raw(",");
                }
                string(&mut self.buf, t);
            }
            self.raw("]");
        }
        self.state = State::Done;
        Ok(())
    }

    fn executed(&mut self, last_insert_id: i64, rows_affected: u64) -> Result<(), Stop> {
        self.open_statement();
        let first = self.first_key();
        self.key(3, first, "last_insert_id");
        self.raw(&last_insert_id.to_string());
        self.key(3, false, "rows_affected");
        self.raw(&rows_affected.to_string());
        self.state = State::Done;
        Ok(())
    }

    fn error(&mut self, message: &str) -> Result<(), Stop> {
        self.open_statement();
        if self.state == State::Rows {
            if self.rows > 0 {
                self.nl(3);
            }
            self.raw("]");
        }
        let first = self.first_key();
        self.key(3, first, "error");
        string(&mut self.buf, message);
        self.state = State::Done;
        Ok(())
    }

    fn end_statement(&mut self, seconds: f64) -> Result<(), Stop> {
        self.open_statement();
        let first = self.first_key();
        self.time(3, first, seconds);
        self.nl(2);
        self.raw("}");
        self.state = State::Between;
        self.flush(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};

    fn run(
        o: &Options,
        shape: Shape,
        limit: usize,
        f: impl FnOnce(&mut Encoder<Vec<Vec<u8>>>),
    ) -> Json {
        let mut e = Encoder::new(Vec::new(), o, shape, limit);
        f(&mut e);
        let chunks = e.finish(1.0).unwrap();
        serde_json::from_slice(&chunks.concat()).unwrap()
    }

    fn rows_statement(e: &mut Encoder<Vec<Vec<u8>>>) {
        e.columns(&["id".into(), "b".into()]).unwrap();
        e.row(&[Cell::Integer(1), Cell::Blob(&[0, 255])]).unwrap();
        e.end_rows(&["integer".into(), "blob".into()]).unwrap();
        e.end_statement(0.5).unwrap();
    }

    #[test]
    fn rqlite_shapes() {
        let plain = Options::default();
        let j = run(&plain, Shape::Mixed, 1 << 20, |e| {
            rows_statement(e);
            e.executed(7, 2).unwrap();
            e.end_statement(0.5).unwrap();
            e.error("no such table: x").unwrap();
            e.end_statement(0.5).unwrap();
        });
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
            pretty: true,
            ..Options::default()
        };
        let j = run(&o, Shape::Mixed, 1 << 20, rows_statement);
        assert_eq!(
            j,
            json!({"results": [{"types": {"id": "integer", "b": "blob"}, "rows": [{"id": 1, "b": [0, 255]}], "time": 0.5}], "time": 1.0})
        );
        let j = run(&plain, Shape::Execute, 1 << 20, rows_statement);
        assert_eq!(
            j,
            json!({"results": [{"last_insert_id": 0, "rows_affected": 0}]})
        );
        let j = run(&plain, Shape::Mixed, 1 << 20, |_| {});
        assert_eq!(j, json!({"results": []}));
    }

    #[test]
    fn errors_after_rows_and_awkward_values_stay_valid_json() {
        let j = run(&Options::default(), Shape::Mixed, 1 << 20, |e| {
            e.columns(&["t".into()]).unwrap();
            e.row(&[Cell::Text("quote \" back \\ nl \n ctl \u{1} é".as_bytes())])
                .unwrap();
            e.row(&[Cell::Real(f64::INFINITY)]).unwrap();
            e.row(&[Cell::Text(&[0xff, b'a'])]).unwrap();
            e.error("interrupted").unwrap();
            e.end_statement(0.0).unwrap();
        });
        assert_eq!(
            j,
            json!({"results": [{"columns": ["t"], "values": [["quote \" back \\ nl \n ctl \u{1} é"], [null], ["\u{fffd}a"]], "error": "interrupted"}]})
        );
    }

    #[test]
    fn large_values_stream_in_pieces_and_the_bound_holds() {
        let big = vec![7u8; 3 * CHUNK + 5];
        for blob_array in [false, true] {
            let o = Options {
                blob_array,
                ..Options::default()
            };
            let mut e = Encoder::new(Vec::new(), &o, Shape::Mixed, 64 << 20);
            e.columns(&["b".into()]).unwrap();
            e.row(&[Cell::Blob(&big)]).unwrap();
            e.end_rows(&["blob".into()]).unwrap();
            e.end_statement(0.0).unwrap();
            let chunks = e.finish(0.0).unwrap();
            assert!(chunks.len() > 3, "sent in pieces");
            assert!(chunks.iter().all(|c| c.len() < 2 * CHUNK));
            let j: Json = serde_json::from_slice(&chunks.concat()).unwrap();
            let back: Vec<u8> = if blob_array {
                serde_json::from_value(j["results"][0]["values"][0][0].clone()).unwrap()
            } else {
                base64::engine::general_purpose::STANDARD
                    .decode(j["results"][0]["values"][0][0].as_str().unwrap())
                    .unwrap()
            };
            assert_eq!(back, big);
        }
        let mut e = Encoder::new(Vec::new(), &Options::default(), Shape::Mixed, 100_000);
        e.columns(&["b".into()]).unwrap();
        assert!(matches!(e.row(&[Cell::Blob(&big)]), Err(Stop::TooLarge(_))));
    }
}
