//! Real SQLite workloads under each policy. The page cache is process-wide
//! configuration, so this binary holds one test that shuts SQLite down and
//! installs each policy in turn.
#![allow(unsafe_code, clippy::unwrap_used)]

use rusqlite::Connection;
use tablix_pcache::{InstallError, Policy, caches, install, register_stats_table};

fn workload(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA cache_size = 40;
         CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
         CREATE INDEX tk ON t(k);",
    )
    .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut ins = tx.prepare("INSERT INTO t(k, v) VALUES (?1, ?2)").unwrap();
        let mut x: u64 = 7;
        for i in 0..8_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ins.execute(rusqlite::params![
                (x >> 40) as i64,
                format!("row {i} {}", "p".repeat((x % 200) as usize))
            ])
            .unwrap();
        }
    }
    tx.commit().unwrap();
    conn.execute_batch(
        "UPDATE t SET v = v || 'x' WHERE k % 7 = 0;
         DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY k LIMIT 1200);
         DELETE FROM t WHERE id % 13 = 5;
         CREATE TABLE u AS SELECT * FROM t WHERE id % 2 = 0;
         DROP TABLE u;
         VACUUM;",
    )
    .unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t WHERE v LIKE '%p%'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(n > 400);
    conn
}

#[test]
fn every_policy_runs_sqlite_correctly() {
    let dir = std::env::temp_dir().join(format!("tablix-pcache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for policy in Policy::ALL {
        // SAFETY: no connection is open here.
        assert_eq!(unsafe { rusqlite::ffi::sqlite3_shutdown() }, 0);
        install(policy).unwrap();
        let path = dir.join(format!("{policy}.db"));
        let _ = std::fs::remove_file(&path);
        {
            let conn = workload(&path);
            let ok: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(ok, "ok", "{policy}");
            // The counters are visible in SQL.
            register_stats_table(&conn).unwrap();
            let (name, hits, misses, evictions, resident, cap): (String, i64, i64, i64, i64, i64) =
                conn.query_row(
                    "SELECT policy, hits, misses, evictions, resident, capacity FROM pcache_stats
                     WHERE purgeable ORDER BY hits DESC LIMIT 1",
                    [],
                    |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                        ))
                    },
                )
                .unwrap();
            assert_eq!(name, policy.name());
            assert!(
                hits > 1000 && misses > 100 && evictions > 100,
                "{policy}: {hits} {misses} {evictions}"
            );
            assert!(
                resident <= cap + 10,
                "{policy}: {resident} resident, budget {cap}"
            );
        }
        // Installing after SQLite has initialised is refused, not ignored.
        assert!(matches!(install(policy), Err(InstallError::Refused(21))));
        // Every cache was destroyed with its connection.
        assert!(
            caches().is_empty(),
            "{policy}: caches leaked: {:?}",
            caches()
        );
        let conn = Connection::open(&path).unwrap();
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }
    let err = "arc".parse::<Policy>().unwrap_err();
    assert!(
        err.contains("lru, lfu-hist, s3-fifo, s3-lru, w-tinylfu"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
