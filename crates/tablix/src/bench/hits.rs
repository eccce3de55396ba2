//! Hit ratios of a page cache under rowid lookups with several access
//! patterns, at a cache budget given as a share of the database's pages.
//! Misses are the pager's own count, the same whichever cache runs.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, params};

use super::Rng;

/// The access patterns measured.
pub const PATTERNS: &[&str] = &[
    "uniform",
    "zipf-0.8",
    "zipf-1.1",
    "zipf-0.8+scan",
    "zipf-1.1+scan",
];

/// Budgets, in percent of the database's pages.
pub const BUDGETS: &[f64] = &[1.0, 5.0, 10.0, 25.0];

/// Builds (once) the database the hit-ratio runs read.
pub fn prepare(dir: &Path, rows: u64) -> rusqlite::Result<PathBuf> {
    let path = dir.join(format!("hits-{rows}.db"));
    if path.exists() {
        return Ok(path);
    }
    let tmp = dir.join(format!("hits-{rows}.db.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let conn = Connection::open(&tmp)?;
    conn.execute_batch(
        "PRAGMA journal_mode = DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB);",
    )?;
    let tx = conn.unchecked_transaction()?;
    {
        let mut st = tx.prepare("INSERT INTO t VALUES (?1, zeroblob(?2))")?;
        let mut rng = Rng::new(1);
        for i in 1..=rows {
            st.execute(params![i as i64, 150 + rng.below(100) as i64])?;
        }
    }
    tx.commit()?;
    drop(conn);
    std::fs::rename(&tmp, &path).map_err(|_| rusqlite::Error::InvalidQuery)?;
    Ok(path)
}

/// Zipf-distributed ranks by inverse CDF over `n` items.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut total = 0.0;
        for r in 1..=n {
            total += 1.0 / (r as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|c| *c < u) as u64
    }
}

/// Pager counts of one measurement.
pub struct Counts {
    /// Hits and misses of the lookups.
    pub hits: i64,
    pub misses: i64,
    /// Hits and misses of the scans (the same for any cache smaller than
    /// the table, since a scan touches every page once).
    pub scan_hits: i64,
    pub scan_misses: i64,
}

/// Runs `lookups` rowid lookups (after a warm-up of a fifth as many) and
/// returns the pager's counts for the measured part.
pub fn run(db: &Path, budget_pct: f64, pattern: &str, lookups: u64) -> anyhow::Result<Counts> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let rows: i64 = conn.query_row("SELECT max(id) FROM t", [], |r| r.get(0))?;
    let budget = ((pages as f64 * budget_pct / 100.0) as i64).max(10);
    conn.execute_batch(&format!("PRAGMA cache_size = {budget}"))?;
    let (skew, scans) = match pattern {
        "uniform" => (None, false),
        "zipf-0.8" => (Some(0.8), false),
        "zipf-1.1" => (Some(1.1), false),
        "zipf-0.8+scan" => (Some(0.8), true),
        "zipf-1.1+scan" => (Some(1.1), true),
        other => anyhow::bail!("unknown pattern {other}; known: {}", PATTERNS.join(", ")),
    };
    let n = rows as u64;
    let zipf = skew.map(|s| Zipf::new(n, s));
    // Hot ranks are spread over the table, not packed into a few pages.
    let mut perm: Vec<u64> = (1..=n).collect();
    let mut rng = Rng::new(42);
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut rng = Rng::new(7);
    let mut st = conn.prepare("SELECT length(pad) FROM t WHERE id = ?1")?;
    let mut scan = conn.prepare("SELECT sum(length(pad)) FROM t")?;
    conn.execute_batch("BEGIN")?;
    let warm = lookups / 5;
    let mut start = (0, 0);
    let mut in_scans = (0, 0);
    for i in 0..warm + lookups {
        if i == warm {
            start = tablix_pcache::pager_cache_counters(&conn);
            in_scans = (0, 0);
        }
        if scans && i % (lookups / 10).max(1) == 0 {
            let before = tablix_pcache::pager_cache_counters(&conn);
            scan.query_row([], |_| Ok(()))?;
            let after = tablix_pcache::pager_cache_counters(&conn);
            in_scans.0 += after.0 - before.0;
            in_scans.1 += after.1 - before.1;
        }
        let rank = match &zipf {
            Some(z) => z.sample(&mut rng),
            None => rng.below(n),
        };
        st.query_row(params![perm[rank as usize % perm.len()] as i64], |_| Ok(()))?;
    }
    let end = tablix_pcache::pager_cache_counters(&conn);
    conn.execute_batch("COMMIT")?;
    Ok(Counts {
        hits: end.0 - start.0 - in_scans.0,
        misses: end.1 - start.1 - in_scans.1,
        scan_hits: in_scans.0,
        scan_misses: in_scans.1,
    })
}
