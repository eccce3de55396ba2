//! Workloads after SQLite's speed1.test / speedtest1, timed one by one, on
//! a cache large enough to hold the working set.

use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, params};

use super::Rng;

/// Names of the workloads, in the order they run.
pub const WORKLOADS: &[&str] = &[
    "insert-unindexed",
    "insert-indexed",
    "range-scan",
    "like-scan",
    "indexed-lookup",
    "rowid-lookup",
    "indexed-update",
    "unindexed-update",
    "range-delete",
    "random-delete",
    "vacuum",
];

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

/// A number spelled out in English, as speedtest1 fills its text columns.
pub fn number_name(mut n: u64) -> String {
    let mut out = Vec::new();
    for (unit, name) in [
        (1_000_000_000, "billion"),
        (1_000_000, "million"),
        (1_000, "thousand"),
    ] {
        if n >= unit {
            out.push(number_name(n / unit));
            out.push(name.to_string());
            n %= unit;
        }
    }
    if n >= 100 {
        out.push(ONES[(n / 100) as usize].to_string());
        out.push("hundred".into());
        n %= 100;
    }
    if n >= 20 {
        out.push(TENS[(n / 10) as usize].to_string());
        n %= 10;
    }
    if n > 0 || out.is_empty() {
        out.push(ONES[n as usize].to_string());
    }
    out.join(" ")
}

type Workload = fn(&Connection, &mut Rng, u64) -> rusqlite::Result<()>;

/// The workloads, in order. Each is its own non-inlined function so that a
/// profiler (callgrind, with --inclusive) can count each one's instructions.
const FUNCTIONS: [Workload; 11] = [
    insert_unindexed,
    insert_indexed,
    range_scan,
    like_scan,
    indexed_lookup,
    rowid_lookup,
    indexed_update,
    unindexed_update,
    range_delete,
    random_delete,
    vacuum,
];

/// `n` rows of (random number, sequence, the number in words) into `table`.
fn insert_rows(conn: &Connection, rng: &mut Rng, n: u64, table: &str) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut st = tx.prepare(&format!("INSERT INTO {table} VALUES (?1, ?2, ?3)"))?;
    for i in 0..n {
        let r = rng.below(n * 10);
        st.execute(params![r as i64, i as i64, number_name(r)])?;
    }
    drop(st);
    tx.commit()
}

#[inline(never)]
fn insert_unindexed(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    insert_rows(conn, rng, n, "t1")
}

#[inline(never)]
fn insert_indexed(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    insert_rows(conn, rng, n, "t2")
}

#[inline(never)]
fn range_scan(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let mut st = conn.prepare("SELECT count(*), avg(b) FROM t1 WHERE b BETWEEN ?1 AND ?2")?;
    for _ in 0..50 {
        let lo = rng.below(n) as i64;
        st.query_row(params![lo, lo + (n / 100) as i64], |_| Ok(()))?;
    }
    Ok(())
}

#[inline(never)]
fn like_scan(conn: &Connection, _rng: &mut Rng, _n: u64) -> rusqlite::Result<()> {
    let mut st = conn.prepare("SELECT count(*) FROM t1 WHERE c LIKE ?1")?;
    for i in 0..20 {
        st.query_row(params![format!("%{}%", ONES[1 + i % 19])], |_| Ok(()))?;
    }
    Ok(())
}

#[inline(never)]
fn indexed_lookup(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let mut st = conn.prepare("SELECT b, c FROM t2 WHERE a = ?1")?;
    for _ in 0..n / 2 {
        let mut rows = st.query(params![rng.below(n * 10) as i64])?;
        while rows.next()?.is_some() {}
    }
    Ok(())
}

#[inline(never)]
fn rowid_lookup(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let mut st = conn.prepare("SELECT a, c FROM t1 WHERE rowid = ?1")?;
    for _ in 0..n {
        let mut rows = st.query(params![1 + rng.below(n) as i64])?;
        while rows.next()?.is_some() {}
    }
    Ok(())
}

#[inline(never)]
fn indexed_update(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut st = tx.prepare("UPDATE t2 SET b = b + 1 WHERE a = ?1")?;
    for _ in 0..n / 4 {
        st.execute(params![rng.below(n * 10) as i64])?;
    }
    drop(st);
    tx.commit()
}

#[inline(never)]
fn unindexed_update(conn: &Connection, _rng: &mut Rng, _n: u64) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut st = tx.prepare("UPDATE t1 SET b = b * 2 WHERE a % 100 = ?1")?;
    for i in 0..10 {
        st.execute(params![i])?;
    }
    drop(st);
    tx.commit()
}

#[inline(never)]
fn range_delete(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut st = tx.prepare("DELETE FROM t2 WHERE a BETWEEN ?1 AND ?2")?;
    for _ in 0..20 {
        let lo = rng.below(n * 10) as i64;
        st.execute(params![lo, lo + (n / 10) as i64])?;
    }
    drop(st);
    tx.commit()
}

#[inline(never)]
fn random_delete(conn: &Connection, rng: &mut Rng, n: u64) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let mut st = tx.prepare("DELETE FROM t1 WHERE rowid = ?1")?;
    for _ in 0..n / 2 {
        st.execute(params![1 + rng.below(n) as i64])?;
    }
    drop(st);
    tx.commit()
}

#[inline(never)]
fn vacuum(conn: &Connection, _rng: &mut Rng, _n: u64) -> rusqlite::Result<()> {
    conn.execute_batch("VACUUM")
}

/// Runs every workload on a fresh database in `dir`; returns seconds each.
pub fn run(dir: &Path, rows: u64) -> rusqlite::Result<Vec<f64>> {
    let path = dir.join(format!("speed-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = Connection::open(&path)?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.execute_batch(
        "PRAGMA synchronous = OFF;
         PRAGMA cache_size = -524288;
         CREATE TABLE t1(a INTEGER, b INTEGER, c TEXT);
         CREATE TABLE t2(a INTEGER, b INTEGER, c TEXT);
         CREATE INDEX t2a ON t2(a);",
    )?;
    let mut rng = Rng::new(0x5EED);
    let n = rows.max(100);
    let mut times = Vec::with_capacity(FUNCTIONS.len());
    for f in FUNCTIONS {
        let t = Instant::now();
        f(&conn, &mut rng, n)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    if ok != "ok" {
        return Err(rusqlite::Error::InvalidQuery);
    }
    Ok(times)
}

/// The symbol of each workload function, as a profiler names it.
pub fn symbols() -> Vec<String> {
    WORKLOADS
        .iter()
        .map(|w| format!("tablix::bench::speed::{}", w.replace('-', "_")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::number_name;

    #[test]
    fn numbers_are_spelled_out() {
        assert_eq!(number_name(0), "zero");
        assert_eq!(number_name(42), "forty two");
        assert_eq!(
            number_name(1_234_567),
            "one million two hundred thirty four thousand five hundred sixty seven"
        );
    }
}
