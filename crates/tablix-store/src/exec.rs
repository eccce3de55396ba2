//! Running user statements on a sandboxed connection, handing each
//! result to a [`Sink`] as it is produced: rows are never gathered by the
//! store, so a reader can stream them to its client and the result's size
//! is bounded where it is written.

use crate::error::SqliteFailure;
use std::time::Instant;

use rusqlite::types::ValueRef;

use crate::audit;
use crate::command::{Params, Statement, Value};
use crate::outcome::{Rows, StatementOutcome, StatementResult};
use crate::policy::error_message;
use crate::sandbox::UserConn;
use crate::sqltext;

/// One value of a result row, borrowed from SQLite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'a> {
    Null,
    Integer(i64),
    Real(f64),
    /// Text as SQLite stores it (UTF-8, unchecked).
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl<'a> From<ValueRef<'a>> for Cell<'a> {
    fn from(v: ValueRef<'a>) -> Cell<'a> {
        match v {
            ValueRef::Null => Cell::Null,
            ValueRef::Integer(i) => Cell::Integer(i),
            ValueRef::Real(f) => Cell::Real(f),
            ValueRef::Text(t) => Cell::Text(t),
            ValueRef::Blob(b) => Cell::Blob(b),
        }
    }
}

impl Cell<'_> {
    fn storage_class(&self) -> &'static str {
        match self {
            Cell::Null => "",
            Cell::Integer(_) => "integer",
            Cell::Real(_) => "real",
            Cell::Text(_) => "text",
            Cell::Blob(_) => "blob",
        }
    }

    /// Bytes the value takes, for bounding collected results.
    fn size(&self) -> usize {
        match self {
            Cell::Null => 4,
            Cell::Integer(_) | Cell::Real(_) => 8,
            Cell::Text(b) | Cell::Blob(b) => b.len(),
        }
    }

    fn to_value(self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Integer(i) => Value::Integer(i),
            Cell::Real(f) => Value::Real(f),
            Cell::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            Cell::Blob(b) => Value::Blob(b.to_vec()),
        }
    }
}

/// Why a sink takes no more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The result outgrew its bound: the message becomes the statement's
    /// error and the request ends there.
    TooLarge(String),
    /// Nobody reads the result any more (its client went away).
    Gone,
    /// SQLite failed under a Command's statement (a full disk, an I/O
    /// error, a damaged page): not the statement's result. Only the SQL
    /// writer stops so; the group it was in is not applied.
    Failed(SqliteFailure),
}

/// Where results go. For each statement: `columns`, any number of `row`s,
/// then `end_rows` or `error` (an error may follow rows); or `executed`,
/// or `error`; then `end_statement`.
pub trait Sink {
    fn columns(&mut self, names: &[String]) -> Result<(), Stop>;
    fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), Stop>;
    /// The columns' types: declared, else the storage class of the first
    /// non-NULL value, else "".
    fn end_rows(&mut self, types: &[String]) -> Result<(), Stop>;
    fn executed(&mut self, last_insert_id: i64, rows_affected: u64) -> Result<(), Stop>;
    fn error(&mut self, message: &str) -> Result<(), Stop>;
    fn end_statement(&mut self, seconds: f64) -> Result<(), Stop>;
}

/// The message for a result over `limit` bytes.
pub(crate) fn too_large(limit: usize) -> String {
    format!(
        "the result is larger than the limit of {limit} bytes (--max-result-bytes); select fewer rows or columns, or read large values in pieces (substr, file_data(path, offset, length))"
    )
}

/// Runs one user statement. `Ok(failed)` says whether it failed (its
/// error went to the sink); `Err` means the request must end here.
pub(crate) fn run(uc: &UserConn, st: &Statement, sink: &mut dyn Sink) -> Result<bool, Stop> {
    let started = Instant::now();
    let r = run_inner(uc, st, sink);
    let seconds = started.elapsed().as_secs_f64();
    match r {
        Ok(failed) => {
            sink.end_statement(seconds)?;
            Ok(failed)
        }
        Err(Stop::TooLarge(m)) => {
            sink.error(&m)?;
            sink.end_statement(seconds)?;
            Err(Stop::TooLarge(m))
        }
        Err(stop @ (Stop::Gone | Stop::Failed(_))) => Err(stop),
    }
}

/// What user SQL may not contain, whatever it does: a NUL byte (SQLite
/// would stop reading there) and a CTE named like a system view.
fn precheck(uc: &UserConn, sql: &str) -> Option<String> {
    if sql.trim().is_empty() {
        return Some("empty statement".into());
    }
    if let Some(at) = sqltext::nul_offset(sql) {
        return Some(format!(
            "the statement contains a NUL byte at offset {at}; SQLite would ignore everything after it"
        ));
    }
    let rules = uc.policy.rules();
    sqltext::defined_name(sql, |n| rules.is_reserved(n)).map(|name| {
        format!(
            "a common table expression may not be named {name:?}: the name is reserved for tablix"
        )
    })
}

fn run_inner(uc: &UserConn, st: &Statement, sink: &mut dyn Sink) -> Result<bool, Stop> {
    if let Some(m) = precheck(uc, &st.sql) {
        sink.error(&m)?;
        return Ok(true);
    }
    if several(&st.sql) {
        return run_several(uc, st, sink);
    }
    let _enforcing = uc.enforce();
    uc.policy.take_ddl();
    let mut stmt = match uc.conn.prepare(&st.sql) {
        Ok(s) => s,
        Err(e) => {
            node_failure(uc, &e)?;
            sink.error(&uc.policy.describe(&e))?;
            return Ok(true);
        }
    };
    if let Err(m) = bind(&mut stmt, &st.params) {
        sink.error(&m)?;
        return Ok(true);
    }
    run_prepared(uc, stmt, sink)
}

/// Whether `sql` holds more than one statement (a `;` that ends a
/// complete statement before its end). Most hold none, or only a last
/// one, and are told apart without a look at SQLite's rules.
pub(crate) fn several(sql: &str) -> bool {
    let body = sql.trim_end().trim_end_matches(';');
    body.contains(';') && tablix_vfs::split_statements(sql).len() > 1
}

/// Several statements in one element, as rqlite runs them: each in turn,
/// until one fails; the element's result is the last one's (an earlier
/// statement's rows are not sent). Each is prepared, authorised and
/// audited as a statement of its own.
fn run_several(uc: &UserConn, st: &Statement, sink: &mut dyn Sink) -> Result<bool, Stop> {
    use rusqlite::fallible_iterator::FallibleIterator;
    let _enforcing = uc.enforce();
    if !matches!(st.params, Params::None) {
        sink.error(
            "parameters are taken with one statement per element; this element holds several",
        )?;
        return Ok(true);
    }
    // Results wait here until the next statement replaces them: bounded
    // as a value is (the result limit).
    let bound = uc
        .conn
        .limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH)
        .ok()
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(1 << 20);
    let mut batch = rusqlite::Batch::new(&uc.conn, &st.sql);
    let mut last = Collect::new(bound);
    let mut failed = false;
    loop {
        uc.policy.take_ddl();
        let stmt = match batch.next() {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e) => {
                node_failure(uc, &e)?;
                last = Collect::new(bound);
                last.error(&uc.policy.describe(&e))?;
                last.end_statement(0.0)?;
                failed = true;
                break;
            }
        };
        last = Collect::new(bound);
        match run_prepared(uc, stmt, &mut last) {
            Ok(true) => {
                last.end_statement(0.0)?;
                failed = true;
                break;
            }
            Ok(false) => last.end_statement(0.0)?,
            Err(Stop::TooLarge(m)) => {
                sink.error(&m)?;
                return Err(Stop::TooLarge(m));
            }
            Err(stop) => return Err(stop),
        }
    }
    match last.outcomes.pop() {
        Some(out) => replay_result(&out.result, sink)?,
        None => sink.error("empty statement")?,
    }
    Ok(failed)
}

/// Hands a gathered result to `sink` as if it were being produced.
pub(crate) fn replay_result(result: &StatementResult, sink: &mut dyn Sink) -> Result<(), Stop> {
    match result {
        StatementResult::Rows(rows) => {
            sink.columns(&rows.columns)?;
            for row in &rows.values {
                let cells: Vec<Cell<'_>> = row
                    .iter()
                    .map(|v| match v {
                        Value::Null => Cell::Null,
                        Value::Integer(i) => Cell::Integer(*i),
                        Value::Real(f) => Cell::Real(*f),
                        Value::Text(t) => Cell::Text(t.as_bytes()),
                        Value::Blob(b) => Cell::Blob(b),
                    })
                    .collect();
                sink.row(&cells)?;
            }
            sink.end_rows(&rows.types)
        }
        StatementResult::Executed {
            last_insert_id,
            rows_affected,
        } => sink.executed(*last_insert_id, *rows_affected),
        StatementResult::Error(m) => sink.error(m),
    }
}

/// Gathered results handed to `sink` statement by statement, as if being
/// produced. A result that outgrows the sink's bound ends there, with its
/// error, as a streamed one does.
pub fn replay(outcomes: &[StatementOutcome], sink: &mut dyn Sink) -> Result<(), Stop> {
    for out in outcomes {
        match replay_result(&out.result, sink) {
            Ok(()) => sink.end_statement(out.seconds)?,
            Err(Stop::TooLarge(m)) => {
                sink.error(&m)?;
                sink.end_statement(out.seconds)?;
                return Err(Stop::TooLarge(m));
            }
            Err(stop) => return Err(stop),
        }
    }
    Ok(())
}

/// Runs one prepared user statement: a schema change under the audit,
/// anything else stepped straight into `sink`.
fn run_prepared(
    uc: &UserConn,
    mut stmt: rusqlite::Statement<'_>,
    sink: &mut dyn Sink,
) -> Result<bool, Stop> {
    if !uc.policy.take_ddl() {
        return step(uc, &mut stmt, sink);
    }
    // A schema change: undone unless what it changed passes the audit.
    let before = match uc.own(|c| {
        let s = audit::snapshot(c)?;
        c.execute_batch("SAVEPOINT tablix_ddl")?;
        Ok::<_, rusqlite::Error>(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            sink.error(&error_message(&e))?;
            return Ok(true);
        }
    };
    let mut held = HeldDdl::default();
    let failed = step(uc, &mut stmt, &mut held)?;
    drop(stmt);
    let verdict = if failed {
        Err(None)
    } else {
        uc.own(|c| audit::check(c, &before, uc.policy.rules()))
            .map_err(Some)
    };
    let end = uc.own(|c| {
        if c.is_autocommit() {
            return Ok(());
        }
        if verdict.is_err() {
            c.execute_batch("ROLLBACK TO tablix_ddl")?;
        }
        c.execute_batch("RELEASE tablix_ddl")
    });
    if let Err(e) = end {
        sink.error(&error_message(&e))?;
        return Ok(true);
    }
    match verdict {
        Ok(()) => {
            held.replay(sink)?;
            Ok(false)
        }
        Err(None) => {
            held.replay(sink)?;
            Ok(true)
        }
        Err(Some(m)) => {
            sink.error(&m)?;
            Ok(true)
        }
    }
}

/// A schema change's own result, held until the audit has spoken.
#[derive(Default)]
struct HeldDdl {
    executed: Option<(i64, u64)>,
    error: Option<String>,
}

impl HeldDdl {
    fn replay(self, sink: &mut dyn Sink) -> Result<(), Stop> {
        if let Some(e) = self.error {
            return sink.error(&e);
        }
        let (id, n) = self.executed.unwrap_or((0, 0));
        sink.executed(id, n)
    }
}

impl Sink for HeldDdl {
    fn columns(&mut self, _: &[String]) -> Result<(), Stop> {
        Ok(())
    }
    fn row(&mut self, _: &[Cell<'_>]) -> Result<(), Stop> {
        Ok(())
    }
    fn end_rows(&mut self, _: &[String]) -> Result<(), Stop> {
        Ok(())
    }
    fn executed(&mut self, id: i64, n: u64) -> Result<(), Stop> {
        self.executed = Some((id, n));
        Ok(())
    }
    fn error(&mut self, m: &str) -> Result<(), Stop> {
        self.error = Some(m.to_string());
        Ok(())
    }
    fn end_statement(&mut self, _: f64) -> Result<(), Stop> {
        Ok(())
    }
}

/// On the SQL writer, a failure of the node under a statement: a result
/// code of [`crate::error::is_node_local`] other than running out of
/// memory. A user's write that outgrows the heap limit (configured alike
/// on every node) fails as the statement's own result, so that it cannot
/// stop every Command after it.
fn node_failure(uc: &UserConn, e: &rusqlite::Error) -> Result<(), Stop> {
    match e.sqlite_error_code() {
        Some(code)
            if uc.is_writer()
                && code != rusqlite::ErrorCode::OutOfMemory
                && crate::error::is_node_local(code) =>
        {
            Err(Stop::Failed(SqliteFailure::of(e)))
        }
        _ => Ok(()),
    }
}

/// The message for a failure while stepping: the guard's reason if it
/// interrupted the statement.
fn step_error(uc: &UserConn, e: &rusqlite::Error) -> String {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted)
        && let Some(why) = uc.guard.interruption()
    {
        return why;
    }
    uc.policy.describe(e)
}

fn step(
    uc: &UserConn,
    stmt: &mut rusqlite::Statement<'_>,
    sink: &mut dyn Sink,
) -> Result<bool, Stop> {
    let conn = &uc.conn;
    let width = stmt.column_count();
    if width == 0 {
        let before = conn.total_changes();
        if let Err(e) = stmt.raw_execute() {
            node_failure(uc, &e)?;
            sink.error(&step_error(uc, &e))?;
            return Ok(true);
        }
        // sqlite3_changes() keeps its old value across statements that
        // change no rows (DDL among them), so it counts only if this
        // statement changed something; it excludes rows changed by
        // triggers.
        let rows_affected = if conn.total_changes() == before {
            0
        } else {
            conn.changes()
        };
        sink.executed(conn.last_insert_rowid(), rows_affected)?;
        return Ok(false);
    }
    let names: Vec<String> = stmt.column_names().map(|c| c.to_string()).collect();
    let mut types: Vec<String> = stmt
        .columns()
        .map(|c| c.decl_type().unwrap_or("").to_ascii_lowercase())
        .collect();
    sink.columns(&names)?;
    let mut rows = stmt.raw_query();
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(e) => {
                node_failure(uc, &e)?;
                sink.error(&step_error(uc, &e))?;
                return Ok(true);
            }
        };
        let mut cells: Vec<Cell<'_>> = Vec::with_capacity(width);
        for i in 0..width {
            match row.get_ref(i) {
                Ok(v) => cells.push(v.into()),
                Err(e) => {
                    sink.error(&error_message(&e))?;
                    return Ok(true);
                }
            }
        }
        for (ty, cell) in types.iter_mut().zip(&cells) {
            if ty.is_empty() {
                *ty = cell.storage_class().to_string();
            }
        }
        sink.row(&cells)?;
    }
    sink.end_rows(&types)?;
    Ok(false)
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

/// A sink that gathers results, within a byte bound: for the writer, whose
/// results wait for the commit, and for callers that want them whole.
pub struct Collect {
    limit: usize,
    used: usize,
    pub(crate) outcomes: Vec<StatementOutcome>,
    result: Option<StatementResult>,
    rows: Rows,
}

impl Collect {
    pub fn new(limit: usize) -> Collect {
        Collect {
            limit,
            used: 0,
            outcomes: Vec::new(),
            result: None,
            rows: Rows::default(),
        }
    }

    /// The results gathered, one per statement.
    pub fn into_outcomes(self) -> Vec<StatementOutcome> {
        self.outcomes
    }

    /// Bytes of results gathered so far.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    fn charge(&mut self, bytes: usize) -> Result<(), Stop> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            Err(Stop::TooLarge(too_large(self.limit)))
        } else {
            Ok(())
        }
    }
}

impl Sink for Collect {
    fn columns(&mut self, names: &[String]) -> Result<(), Stop> {
        self.charge(names.iter().map(String::len).sum())?;
        self.rows = Rows {
            columns: names.to_vec(),
            ..Rows::default()
        };
        Ok(())
    }

    fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), Stop> {
        self.charge(cells.iter().map(Cell::size).sum())?;
        self.rows
            .values
            .push(cells.iter().map(|c| c.to_value()).collect());
        Ok(())
    }

    fn end_rows(&mut self, types: &[String]) -> Result<(), Stop> {
        self.rows.types = types.to_vec();
        self.result = Some(StatementResult::Rows(std::mem::take(&mut self.rows)));
        Ok(())
    }

    fn executed(&mut self, last_insert_id: i64, rows_affected: u64) -> Result<(), Stop> {
        self.result = Some(StatementResult::Executed {
            last_insert_id,
            rows_affected,
        });
        Ok(())
    }

    fn error(&mut self, message: &str) -> Result<(), Stop> {
        self.rows = Rows::default();
        self.result = Some(StatementResult::Error(message.to_string()));
        Ok(())
    }

    fn end_statement(&mut self, seconds: f64) -> Result<(), Stop> {
        let result = self
            .result
            .take()
            .unwrap_or_else(|| StatementResult::Error("the statement produced no result".into()));
        self.outcomes.push(StatementOutcome { result, seconds });
        Ok(())
    }
}
