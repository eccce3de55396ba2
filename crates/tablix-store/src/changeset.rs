//! Changesets as SQLite's session extension writes them, read and written
//! here so that an interactive transaction's commit carries every changed
//! row whole (`complete_old_rows`) and the writer can check the tables and
//! rows it names (`changed_rows`) before applying it.
//!
//! The format (sqlite3session.h, "changeset format"): tables, each a
//! header (`'T'`, the column count as a varint, one primary-key flag byte
//! per column, the NUL-terminated name) followed by its changes; a change
//! is an operation byte (INSERT 18, DELETE 9, UPDATE 23), an indirect
//! flag byte, then records (DELETE: the old row; INSERT: the new row;
//! UPDATE: old, then new). A record holds one value per column: a type
//! byte (0 undefined, 1 integer, 2 real, 3 text, 4 blob, 5 NULL), then
//! 8 big-endian bytes for a number, or a varint length and the bytes.
//! In an UPDATE, a column neither changed nor part of the key is
//! undefined on both sides.

use rusqlite::Connection;
use rusqlite::types::ValueRef;

const TABLE: u8 = b'T';
const INSERT: u8 = 18;
const DELETE: u8 = 9;
const UPDATE: u8 = 23;

/// One value of a record.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    Integer(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
    Null,
}

impl Val {
    fn of(v: ValueRef<'_>) -> Val {
        match v {
            ValueRef::Null => Val::Null,
            ValueRef::Integer(i) => Val::Integer(i),
            ValueRef::Real(f) => Val::Real(f),
            ValueRef::Text(t) => Val::Text(t.to_vec()),
            ValueRef::Blob(b) => Val::Blob(b.to_vec()),
        }
    }

    fn to_sql(&self) -> rusqlite::types::Value {
        use rusqlite::types::Value;
        match self {
            Val::Integer(i) => Value::Integer(*i),
            Val::Real(f) => Value::Real(*f),
            Val::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            Val::Blob(b) => Value::Blob(b.clone()),
            Val::Null => Value::Null,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Insert,
    Delete,
    Update,
}

/// One changed row. A value is `None` where the record leaves it
/// undefined.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Change {
    pub(crate) op: Op,
    pub(crate) indirect: bool,
    pub(crate) old: Vec<Option<Val>>,
    pub(crate) new: Vec<Option<Val>>,
}

/// A table's header and its changes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Table {
    pub(crate) name: String,
    /// One flag per column: part of the primary key.
    pub(crate) pk: Vec<bool>,
    pub(crate) changes: Vec<Change>,
}

/// A table as a changeset sees it: its columns and which are the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The columns a changeset holds, in order: for a table without a
    /// primary key, the rowid (`_rowid_`) first.
    pub(crate) columns: Vec<String>,
    pub(crate) pk: Vec<bool>,
}

/// Why bytes are not a changeset.
#[derive(Debug, thiserror::Error)]
#[error("not a changeset: {0}")]
pub(crate) struct Malformed(String);

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, Malformed> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| Malformed(format!("it ends at byte {}", self.at)))?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| Malformed(format!("{n} bytes at {} run past its end", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    /// SQLite's varint: big-endian groups of 7 bits, the ninth byte whole.
    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v: u64 = 0;
        for i in 0..9 {
            let b = self.byte()?;
            if i == 8 {
                return Ok((v << 8) | u64::from(b));
            }
            v = (v << 7) | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Ok(v)
    }

    fn length(&mut self) -> Result<usize, Malformed> {
        let n = self.varint()?;
        usize::try_from(n).map_err(|_| Malformed(format!("a length of {n}")))
    }

    fn value(&mut self) -> Result<Option<Val>, Malformed> {
        Ok(match self.byte()? {
            0 => None,
            1 => Some(Val::Integer(i64::from_be_bytes(self.eight()?))),
            2 => Some(Val::Real(f64::from_be_bytes(self.eight()?))),
            3 => {
                let n = self.length()?;
                Some(Val::Text(self.take(n)?.to_vec()))
            }
            4 => {
                let n = self.length()?;
                Some(Val::Blob(self.take(n)?.to_vec()))
            }
            5 => Some(Val::Null),
            t => return Err(Malformed(format!("a value of type {t}"))),
        })
    }

    fn eight(&mut self) -> Result<[u8; 8], Malformed> {
        let b = self.take(8)?;
        let mut out = [0u8; 8];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn record(&mut self, n: usize) -> Result<Vec<Option<Val>>, Malformed> {
        (0..n).map(|_| self.value()).collect()
    }
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    if v > 0x00ff_ffff_ffff_ffff {
        // Nine bytes: eight of 7 bits, then one of 8.
        let mut groups = [0u8; 9];
        groups[8] = v as u8;
        let mut rest = v >> 8;
        for g in groups[..8].iter_mut().rev() {
            *g = (rest as u8 & 0x7f) | 0x80;
            rest >>= 7;
        }
        out.extend_from_slice(&groups);
        return;
    }
    let mut groups = Vec::with_capacity(9);
    let mut rest = v;
    loop {
        groups.push((rest & 0x7f) as u8);
        rest >>= 7;
        if rest == 0 {
            break;
        }
    }
    let last = groups.len() - 1;
    for (i, g) in groups.iter().rev().enumerate() {
        out.push(if i < last { g | 0x80 } else { *g });
    }
}

fn put_value(out: &mut Vec<u8>, v: &Option<Val>) {
    match v {
        None => out.push(0),
        Some(Val::Integer(i)) => {
            out.push(1);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Some(Val::Real(f)) => {
            out.push(2);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Some(Val::Text(t)) => {
            out.push(3);
            put_varint(out, t.len() as u64);
            out.extend_from_slice(t);
        }
        Some(Val::Blob(b)) => {
            out.push(4);
            put_varint(out, b.len() as u64);
            out.extend_from_slice(b);
        }
        Some(Val::Null) => out.push(5),
    }
}

/// Reads a changeset.
pub(crate) fn parse(bytes: &[u8]) -> Result<Vec<Table>, Malformed> {
    let mut r = Reader { bytes, at: 0 };
    let mut tables: Vec<Table> = Vec::new();
    while r.at < bytes.len() {
        let b = r.byte()?;
        if b == TABLE {
            let n = r.length()?;
            if n == 0 || n > 32767 {
                return Err(Malformed(format!("a table of {n} columns")));
            }
            let pk = r.take(n)?.iter().map(|&f| f != 0).collect();
            let rest = &bytes[r.at..];
            let end = rest
                .iter()
                .position(|&c| c == 0)
                .ok_or_else(|| Malformed("a table name without its end".into()))?;
            let name = String::from_utf8(rest[..end].to_vec())
                .map_err(|_| Malformed("a table name that is not UTF-8".into()))?;
            r.at += end + 1;
            tables.push(Table {
                name,
                pk,
                changes: Vec::new(),
            });
            continue;
        }
        let table = tables
            .last_mut()
            .ok_or_else(|| Malformed("a change before any table".into()))?;
        let n = table.pk.len();
        let op = match b {
            INSERT => Op::Insert,
            DELETE => Op::Delete,
            UPDATE => Op::Update,
            other => return Err(Malformed(format!("an operation {other}"))),
        };
        let indirect = r.byte()? != 0;
        let (old, new) = match op {
            Op::Insert => (vec![None; n], r.record(n)?),
            Op::Delete => (r.record(n)?, vec![None; n]),
            Op::Update => {
                let old = r.record(n)?;
                (old, r.record(n)?)
            }
        };
        table.changes.push(Change {
            op,
            indirect,
            old,
            new,
        });
    }
    Ok(tables)
}

/// Writes a changeset.
pub(crate) fn encode(tables: &[Table]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in tables {
        out.push(TABLE);
        put_varint(&mut out, t.pk.len() as u64);
        out.extend(t.pk.iter().map(|&p| u8::from(p)));
        out.extend_from_slice(t.name.as_bytes());
        out.push(0);
        for c in &t.changes {
            out.push(match c.op {
                Op::Insert => INSERT,
                Op::Delete => DELETE,
                Op::Update => UPDATE,
            });
            out.push(u8::from(c.indirect));
            if c.op != Op::Insert {
                for v in &c.old {
                    put_value(&mut out, v);
                }
            }
            if c.op != Op::Delete {
                for v in &c.new {
                    put_value(&mut out, v);
                }
            }
        }
    }
    out
}

/// The name SQLite's session extension gives the rowid of a table without
/// a primary key.
const ROWID: &str = "_rowid_";

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `table` in `conn`'s main database as a changeset holds it (the session
/// extension's rule: its visible columns in order, a table without a
/// primary key keyed by its rowid first), or None if there is no such
/// table.
pub(crate) fn table_shape(conn: &Connection, table: &str) -> rusqlite::Result<Option<Shape>> {
    let mut st =
        conn.prepare_cached("SELECT name, pk, hidden FROM pragma_table_xinfo(?1, 'main')")?;
    let mut columns = Vec::new();
    let mut pk = Vec::new();
    let mut rows = st.query([table])?;
    while let Some(r) = rows.next()? {
        if r.get::<_, i64>(2)? != 0 {
            continue;
        }
        columns.push(r.get::<_, String>(0)?);
        pk.push(r.get::<_, i64>(1)? != 0);
    }
    if columns.is_empty() {
        return Ok(None);
    }
    if !pk.contains(&true) {
        columns.insert(0, ROWID.to_string());
        pk.insert(0, true);
    }
    Ok(Some(Shape { columns, pk }))
}

/// Reads rows of one table by their key, in a changeset's column order.
struct RowReader<'c> {
    stmt: rusqlite::CachedStatement<'c>,
    key: Vec<usize>,
    width: usize,
}

impl<'c> RowReader<'c> {
    /// A reader of `t`'s rows on `conn`, if the table is still as the
    /// changeset knows it; `Err` says why not.
    fn new(conn: &'c Connection, t: &Table) -> Result<RowReader<'c>, Mismatch> {
        let shape = table_shape(conn, &t.name)
            .map_err(Mismatch::Failed)?
            .ok_or_else(|| Mismatch::Shape(format!("table {} was dropped", t.name)))?;
        if shape.pk != t.pk {
            return Err(Mismatch::Shape(format!(
                "table {} changed its columns",
                t.name
            )));
        }
        let cols: Vec<String> = shape.columns.iter().map(|c| quoted(c)).collect();
        let key: Vec<usize> = (0..t.pk.len()).filter(|&i| t.pk[i]).collect();
        let filter: Vec<String> = key
            .iter()
            .enumerate()
            .map(|(n, &i)| format!("{} IS ?{}", cols[i], n + 1))
            .collect();
        let sql = format!(
            "SELECT {} FROM main.{} WHERE {}",
            cols.join(", "),
            quoted(&t.name),
            filter.join(" AND ")
        );
        let stmt = conn.prepare_cached(&sql).map_err(Mismatch::Failed)?;
        Ok(RowReader {
            stmt,
            key,
            width: cols.len(),
        })
    }

    /// The row whose key the `old` record names, if there is one.
    fn read(&mut self, old: &[Option<Val>]) -> Result<Option<Vec<Val>>, Mismatch> {
        let mut args = Vec::with_capacity(self.key.len());
        for &i in &self.key {
            let v = old
                .get(i)
                .and_then(Option::as_ref)
                .ok_or_else(|| Mismatch::Shape("a change without its key".into()))?;
            args.push(v.to_sql());
        }
        let width = self.width;
        let mut rows = self
            .stmt
            .query(rusqlite::params_from_iter(args))
            .map_err(Mismatch::Failed)?;
        match rows.next().map_err(Mismatch::Failed)? {
            Some(r) => (0..width)
                .map(|i| r.get_ref(i).map(Val::of))
                .collect::<Result<Vec<Val>, _>>()
                .map(Some)
                .map_err(Mismatch::Failed),
            None => Ok(None),
        }
    }
}

/// Why rows could not be read as a changeset names them.
#[derive(Debug)]
pub(crate) enum Mismatch {
    /// The table is not as the changeset knows it.
    Shape(String),
    /// SQLite failed reading it.
    Failed(rusqlite::Error),
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Shape(m) => f.write_str(m),
            Mismatch::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Fills in, for every UPDATE of `tables`, the old values its record
/// leaves undefined: columns the transaction did not change, so `conn`
/// (the transaction's own view) still holds them as its snapshot did.
/// Each UPDATE then names its row whole ([`changed_rows`] checks it).
pub(crate) fn complete_old_rows(conn: &Connection, tables: &mut [Table]) -> Result<(), String> {
    for t in tables.iter_mut() {
        if !t
            .changes
            .iter()
            .any(|c| c.op == Op::Update && c.old.iter().any(Option::is_none))
        {
            continue;
        }
        let mut reader = RowReader::new(conn, t).map_err(|e| format!("reading {}: {e}", t.name))?;
        for c in t.changes.iter_mut().filter(|c| c.op == Op::Update) {
            if c.old.iter().all(Option::is_some) {
                continue;
            }
            let row = reader
                .read(&c.old)
                .map_err(|e| format!("reading a changed row of {}: {e}", t.name))?
                .ok_or_else(|| format!("a changed row of {} is not in the view", t.name))?;
            for (slot, now) in c.old.iter_mut().zip(row) {
                if slot.is_none() {
                    *slot = Some(now);
                }
            }
        }
    }
    Ok(())
}

/// The first UPDATE of `tables` whose row in `conn` differs, in any
/// column, from the whole old row it names (SQLite's own apply compares
/// only the columns an UPDATE changes): the table's name and whether the
/// row is gone. None when every such row is as named. A table that is
/// not as the changeset knows it (SQLite's apply would skip it) is a
/// [`Mismatch::Shape`].
pub(crate) fn changed_rows(
    conn: &Connection,
    tables: &[Table],
) -> Result<Option<(String, bool)>, Mismatch> {
    for t in tables {
        // Made for every table: it checks the table's shape too.
        let mut reader = RowReader::new(conn, t)?;
        for c in t.changes.iter().filter(|c| c.op == Op::Update) {
            match reader.read(&c.old)? {
                None => return Ok(Some((t.name.clone(), true))),
                Some(row) => {
                    let same = row
                        .iter()
                        .zip(&c.old)
                        .all(|(now, then)| then.as_ref().is_none_or(|then| then == now));
                    if !same {
                        return Ok(Some((t.name.clone(), false)));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// Why a changeset was not applied (nothing of it was, once the caller
/// rolls back its savepoint).
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A change met another state than it names.
    Conflict(tablix_vfs::ConflictKind, String),
    /// A table is not as the changeset knows it.
    Shape(String),
    /// SQLite failed.
    Failed(rusqlite::Error),
}

impl From<Mismatch> for Refusal {
    fn from(m: Mismatch) -> Refusal {
        match m {
            Mismatch::Shape(s) => Refusal::Shape(s),
            Mismatch::Failed(e) => Refusal::Failed(e),
        }
    }
}

/// The SQL of one change, its parameters, and how a change that touched
/// no row is told apart (its key).
fn change_sql(t: &Table, shape: &Shape, c: &Change) -> (String, Vec<rusqlite::types::Value>) {
    let cols: Vec<String> = shape.columns.iter().map(|c| quoted(c)).collect();
    let name = quoted(&t.name);
    let mut args = Vec::new();
    let mut filter = Vec::new();
    let whole_row = |args: &mut Vec<rusqlite::types::Value>, filter: &mut Vec<String>| {
        for (i, v) in c.old.iter().enumerate() {
            if let Some(v) = v {
                args.push(v.to_sql());
                filter.push(format!("{} IS ?{}", cols[i], args.len()));
            }
        }
    };
    match c.op {
        Op::Insert => {
            let mut names = Vec::new();
            for (i, v) in c.new.iter().enumerate() {
                if let Some(v) = v {
                    args.push(v.to_sql());
                    names.push(cols[i].clone());
                }
            }
            let marks: Vec<String> = (1..=args.len()).map(|n| format!("?{n}")).collect();
            (
                format!(
                    "INSERT INTO main.{name}({}) VALUES ({})",
                    names.join(", "),
                    marks.join(", ")
                ),
                args,
            )
        }
        Op::Delete => {
            whole_row(&mut args, &mut filter);
            (
                format!("DELETE FROM main.{name} WHERE {}", filter.join(" AND ")),
                args,
            )
        }
        Op::Update => {
            let mut set = Vec::new();
            for (i, v) in c.new.iter().enumerate() {
                if let Some(v) = v {
                    args.push(v.to_sql());
                    set.push(format!("{} = ?{}", cols[i], args.len()));
                }
            }
            whole_row(&mut args, &mut filter);
            (
                format!(
                    "UPDATE main.{name} SET {} WHERE {}",
                    set.join(", "),
                    filter.join(" AND ")
                ),
                args,
            )
        }
    }
}

/// Whether a row with the key `old` names is in `t`.
fn key_exists(
    conn: &Connection,
    t: &Table,
    shape: &Shape,
    old: &[Option<Val>],
) -> rusqlite::Result<bool> {
    let mut args = Vec::new();
    let mut filter = Vec::new();
    for (i, pk) in t.pk.iter().enumerate() {
        if *pk && let Some(Some(v)) = old.get(i) {
            args.push(v.to_sql());
            filter.push(format!("{} IS ?{}", quoted(&shape.columns[i]), args.len()));
        }
    }
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM main.{} WHERE {})",
        quoted(&t.name),
        filter.join(" AND ")
    );
    conn.prepare_cached(&sql)?
        .query_row(rusqlite::params_from_iter(args), |r| r.get(0))
}

/// Applies `tables` on `conn`, inside a savepoint the caller opened and
/// rolls back on `Err`: every change, or none. Each UPDATE and DELETE
/// takes effect only on its row as it names it whole (the old values
/// [`complete_old_rows`] filled in), and each INSERT only on a free key;
/// anything else is a conflict. A change that breaks a constraint (a
/// foreign key whose row comes later in the changeset, two unique values
/// swapped) is tried again once the others are applied, as SQLite's own
/// apply does; one that still does is a conflict. Statements are kept
/// prepared (SQLite's apply prepares its own at every call, and expires
/// every prepared statement of the connection twice, setting
/// `defer_foreign_keys`). For a schema with foreign-key actions the
/// caller uses SQLite's apply instead: actions must not run again.
pub(crate) fn apply(
    conn: &Connection,
    tables: &[Table],
    shapes: &mut ShapeCache,
) -> Result<(), Refusal> {
    let mut later: Vec<(&Table, &Change)> = Vec::new();
    for t in tables {
        let shape = shapes.get(conn, t)?;
        for c in &t.changes {
            if apply_one(conn, t, &shape, c)?.is_some() {
                later.push((t, c));
            }
        }
    }
    // Changes that broke a constraint, tried again while any succeeds.
    while !later.is_empty() {
        let before = later.len();
        let mut still = Vec::new();
        let mut last = None;
        for (t, c) in later {
            let shape = shapes.get(conn, t)?;
            if let Some(code) = apply_one(conn, t, &shape, c)? {
                last = Some((code, t.name.clone()));
                still.push((t, c));
            }
        }
        if still.len() == before {
            let (code, table) = last.unwrap_or_default();
            let kind = if code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY {
                tablix_vfs::ConflictKind::ForeignKey
            } else {
                tablix_vfs::ConflictKind::Constraint
            };
            return Err(Refusal::Conflict(kind, table));
        }
        later = still;
    }
    Ok(())
}

/// Applies one change. `Ok(Some(code))`: it broke a constraint (SQLite's
/// extended code) and may succeed once later changes are applied.
fn apply_one(
    conn: &Connection,
    t: &Table,
    shape: &Shape,
    c: &Change,
) -> Result<Option<i32>, Refusal> {
    let (sql, args) = change_sql(t, shape, c);
    let mut st = conn.prepare_cached(&sql).map_err(Refusal::Failed)?;
    match st.execute(rusqlite::params_from_iter(args)) {
        Ok(0) => {
            // An UPDATE or DELETE that found its row changed or gone.
            let exists = key_exists(conn, t, shape, &c.old).map_err(Refusal::Failed)?;
            let kind = if exists {
                tablix_vfs::ConflictKind::Data
            } else {
                tablix_vfs::ConflictKind::NotFound
            };
            Err(Refusal::Conflict(kind, t.name.clone()))
        }
        Ok(_) => Ok(None),
        Err(e) => match e.sqlite_error() {
            Some(f)
                if c.op == Op::Insert
                    && matches!(
                        f.extended_code,
                        rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                            | rusqlite::ffi::SQLITE_CONSTRAINT_ROWID
                    ) =>
            {
                Err(Refusal::Conflict(
                    tablix_vfs::ConflictKind::Exists,
                    t.name.clone(),
                ))
            }
            Some(f) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                Ok(Some(f.extended_code))
            }
            _ => Err(Refusal::Failed(e)),
        },
    }
}

/// Tables' shapes as of one schema version.
#[derive(Default)]
pub(crate) struct ShapeCache {
    version: Option<i64>,
    shapes: std::collections::HashMap<String, Shape>,
}

impl ShapeCache {
    /// Forgets every shape if the schema changed since they were read.
    pub(crate) fn check_version(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let v: i64 = conn
            .prepare_cached("PRAGMA schema_version")?
            .query_row([], |r| r.get(0))?;
        if self.version != Some(v) {
            self.shapes.clear();
            self.version = Some(v);
        }
        Ok(())
    }

    /// `t`'s shape, if it is still as the changeset knows it.
    fn get(&mut self, conn: &Connection, t: &Table) -> Result<Shape, Refusal> {
        if !self.shapes.contains_key(&t.name) {
            let shape = table_shape(conn, &t.name)
                .map_err(Refusal::Failed)?
                .ok_or_else(|| Refusal::Shape(format!("table {} was dropped", t.name)))?;
            self.shapes.insert(t.name.clone(), shape);
        }
        let shape = &self.shapes[&t.name];
        if shape.pk != t.pk {
            return Err(Refusal::Shape(format!(
                "table {} changed its columns",
                t.name
            )));
        }
        Ok(shape.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn val() -> impl Strategy<Value = Option<Val>> {
        prop_oneof![
            Just(None),
            any::<i64>().prop_map(|i| Some(Val::Integer(i))),
            any::<f64>()
                .prop_filter("NaN never equals itself", |f| !f.is_nan())
                .prop_map(|f| Some(Val::Real(f))),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|t| Some(Val::Text(t))),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| Some(Val::Blob(b))),
            Just(Some(Val::Null)),
        ]
    }

    fn table() -> impl Strategy<Value = Table> {
        (1usize..5).prop_flat_map(|n| {
            (
                "[a-z]{1,8}",
                prop::collection::vec(any::<bool>(), n),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![Op::Insert, Op::Delete, Op::Update]),
                        any::<bool>(),
                        prop::collection::vec(val(), n),
                        prop::collection::vec(val(), n),
                    ),
                    0..6,
                ),
            )
                .prop_map(move |(name, pk, changes)| Table {
                    name,
                    pk,
                    changes: changes
                        .into_iter()
                        .map(|(op, indirect, old, new)| Change {
                            op,
                            indirect,
                            old: if op == Op::Insert { vec![None; n] } else { old },
                            new: if op == Op::Delete { vec![None; n] } else { new },
                        })
                        .collect(),
                })
        })
    }

    proptest! {
        /// What is written reads back the same.
        #[test]
        fn changesets_round_trip(tables in prop::collection::vec(table(), 0..4)) {
            let bytes = encode(&tables);
            prop_assert_eq!(parse(&bytes).expect("parses"), tables);
        }

        /// Any prefix of a changeset, or damage to it, is refused or read,
        /// never a panic.
        #[test]
        fn damaged_changesets_never_panic(tables in prop::collection::vec(table(), 1..3), cut in 0usize..400, flip in any::<u8>()) {
            let mut bytes = encode(&tables);
            let at = cut.min(bytes.len());
            let _ = parse(&bytes[..at]);
            if at < bytes.len() {
                bytes[at] ^= flip;
                let _ = parse(&bytes);
            }
        }

        #[test]
        fn varints_round_trip(v in any::<u64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader { bytes: &out, at: 0 };
            prop_assert_eq!(r.varint().expect("reads"), v);
            prop_assert_eq!(r.at, out.len());
        }
    }

    #[test]
    fn sessions_changesets_are_read_and_completed_updates_name_whole_rows() {
        let mut c = tablix_vfs::RecordingConn::new(Connection::open_in_memory().unwrap());
        c.execute_batch(
            "CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, w TEXT);
             CREATE TABLE notes(body TEXT);
             INSERT INTO kv VALUES (1, 'a', 'x'), (2, 'b', 'y');
             INSERT INTO notes VALUES ('one');",
        )
        .unwrap();
        c.record().unwrap();
        c.execute_batch(
            "UPDATE kv SET v = 'A' WHERE k = 1; DELETE FROM kv WHERE k = 2;
             INSERT INTO notes VALUES ('two'); UPDATE notes SET body = 'ONE' WHERE body = 'one';",
        )
        .unwrap();
        let bytes = c.changeset().unwrap();
        let mut tables = parse(&bytes).unwrap();
        assert_eq!(encode(&tables), bytes, "re-encoding changes nothing");
        let kv = tables.iter().find(|t| t.name == "kv").unwrap();
        assert_eq!(kv.pk, vec![true, false, false]);
        let update = kv.changes.iter().find(|c| c.op == Op::Update).unwrap();
        assert_eq!(
            update.old[2], None,
            "w did not change, so SQLite leaves it out"
        );
        complete_old_rows(&c, &mut tables).unwrap();
        let kv = tables.iter().find(|t| t.name == "kv").unwrap();
        let update = kv.changes.iter().find(|c| c.op == Op::Update).unwrap();
        assert_eq!(
            update.old,
            vec![
                Some(Val::Integer(1)),
                Some(Val::Text(b"a".to_vec())),
                Some(Val::Text(b"x".to_vec()))
            ]
        );
        let notes = tables.iter().find(|t| t.name == "notes").unwrap();
        assert_eq!(notes.pk, vec![true, false], "keyed by its rowid");
        assert_eq!(
            table_shape(&c, "notes").unwrap().unwrap().columns,
            vec!["_rowid_", "body"]
        );
        assert_eq!(table_shape(&c, "nothing").unwrap(), None);
        // The completed changeset names a row another transaction changed
        // in the column this one left alone.
        let other = Connection::open_in_memory().unwrap();
        other
            .execute_batch(
                "CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, w TEXT);
                 CREATE TABLE notes(body TEXT);
                 INSERT INTO kv VALUES (1, 'a', 'CHANGED'), (2, 'b', 'y');
                 INSERT INTO notes VALUES ('one');",
            )
            .unwrap();
        assert_eq!(
            changed_rows(&other, &parse(&encode(&tables)).unwrap()).unwrap(),
            Some(("kv".to_string(), false))
        );
        other
            .execute_batch("UPDATE kv SET w = 'x' WHERE k = 1")
            .unwrap();
        assert_eq!(changed_rows(&other, &tables).unwrap(), None);
        other.execute_batch("DELETE FROM kv WHERE k = 1").unwrap();
        assert_eq!(
            changed_rows(&other, &tables).unwrap(),
            Some(("kv".to_string(), true))
        );
    }
}
