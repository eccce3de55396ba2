//! Every request has a bound: time, result size, the readers it may wait
//! for; the file system's own reads and writes never wait for a user's
//! query; the WAL and a damaged database are dealt with at the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tablix_fs::{FsOp, FsReply};
use tablix_store::{
    Cancel, Durability, Limits, Principal, Statement, StatementResult, Store, StoreConfig,
    StoreError, Value,
};

use super::{sql, stamp};

const RUNAWAY: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c";

fn limits(ms: u64) -> Limits {
    Limits {
        timeout: Duration::from_millis(ms),
        max_result_bytes: 1 << 20,
        cancel: Cancel::new(),
    }
}

fn first_error(r: &[tablix_store::StatementOutcome]) -> String {
    match &r[0].result {
        StatementResult::Error(m) => m.clone(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn a_runaway_query_stops_at_its_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    let mut sink = Collect::default();
    store
        .query_into(
            &Principal::root(),
            &[Statement::new(RUNAWAY)],
            &limits(200),
            &mut sink,
        )
        .unwrap();
    let m = sink.error.expect("an error");
    assert!(m.contains("time limit of 200 ms"), "{m}");
}

#[test]
fn a_runaway_write_is_rolled_back_and_its_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.write_timeout = Duration::from_millis(300);
    let store = Store::open(config).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE t(x)"]))
        .unwrap();
    let runaway = store.submit_sql(tablix_store::Stamped::new(
        stamp(1),
        sql(&["INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"]),
    ), store.config().write_limits());
    let fine: Vec<_> = (0..5)
        .map(|i| {
            store.submit_sql(
                tablix_store::Stamped::new(
                    stamp(2 + i as i64),
                    sql(&["INSERT INTO t VALUES (-1)"]),
                ),
                store.config().write_limits(),
            )
        })
        .collect();
    let r = runaway.wait().unwrap();
    assert!(r.rolled_back);
    assert!(
        first_error(&r.statements).contains("time limit of 300 ms"),
        "{r:?}"
    );
    for t in fine {
        assert!(!t.wait().unwrap().rolled_back);
    }
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(5)]],
        "only the five small inserts"
    );
}

#[test]
fn a_cancelled_request_stops() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(StoreConfig::new(dir.path())).unwrap());
    let l = limits(60_000);
    let cancel = l.cancel.clone();
    let s = Arc::clone(&store);
    let t = std::thread::spawn(move || {
        let mut sink = Collect::default();
        s.query_into(
            &Principal::root(),
            &[Statement::new(RUNAWAY)],
            &l,
            &mut sink,
        )
        .unwrap();
        sink.error
    });
    std::thread::sleep(Duration::from_millis(200));
    cancel.cancel();
    let m = t.join().unwrap().expect("an error");
    assert!(m.contains("client went away"), "{m}");
    // Stopping the store's statements stops new ones at once too.
    store.stop_statements();
    let r = store
        .query(&Principal::root(), &[Statement::new(RUNAWAY)])
        .unwrap();
    assert!(first_error(&r).contains("shutting down"), "{r:?}");
}

#[test]
fn results_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.max_result_bytes = 2 << 20;
    let store = Store::open(config).unwrap();
    // More rows than the bound holds: refused once it is passed.
    let r = store
        .query(
            &Principal::root(),
            &[Statement::new(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100000) SELECT x, hex(randomblob(32)) FROM c",
            )],
        )
        .unwrap();
    assert!(
        first_error(&r).contains("larger than the limit of 2097152 bytes"),
        "{r:?}"
    );
    // One value larger than the bound cannot even be made.
    let r = store
        .query(
            &Principal::root(),
            &[Statement::new("SELECT zeroblob(50000000)")],
        )
        .unwrap();
    assert!(first_error(&r).contains("too big"), "{r:?}");
    // Writes that return too much do not happen.
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE b(x)"]))
        .unwrap();
    let r = store
        .apply_sql(
            stamp(1),
            sql(&["INSERT INTO b SELECT zeroblob(1000000) FROM (SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) RETURNING x"]),
        )
        .unwrap();
    assert!(r.rolled_back, "{r:?}");
    assert_eq!(
        rows(&store, "SELECT count(*) FROM b"),
        [[Value::Integer(0)]]
    );
}

#[test]
fn writes_gathered_together_are_bounded_as_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.max_result_bytes = 2 << 20;
    config.write_timeout = Duration::from_secs(20);
    let store = Store::open(config).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE t(x)"]))
        .unwrap();
    // randomblob on the writer refuses more than the bound before making it.
    let r = store
        .apply_sql(
            stamp(1),
            sql(&["INSERT INTO t VALUES (randomblob(50000000))"]),
        )
        .unwrap();
    assert!(first_error(&r.statements).contains("too big"), "{r:?}");
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(0)]]
    );
    // Its length is read as SQLite's own reads it: text as its number,
    // NULL and anything below 1 as one byte.
    let r = store
        .apply_sql(
            stamp(1),
            sql(&["SELECT length(randomblob('16')), length(randomblob(NULL)), length(randomblob(2.9)), length(randomblob(-5))"]),
        )
        .unwrap();
    match &r.statements[0].result {
        StatementResult::Rows(r) => assert_eq!(
            r.values,
            [[
                Value::Integer(16),
                Value::Integer(1),
                Value::Integer(2),
                Value::Integer(1)
            ]]
        ),
        other => panic!("{other:?}"),
    }
    // A slow write holds the writer so that the next ones are gathered into
    // one batch; each returns ~1.5 MiB, so no two fit in one group's bound.
    let slow = store.submit_sql(tablix_store::Stamped::new(
        stamp(2),
        sql(&["INSERT INTO t SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 3000000) SELECT x FROM c)"]),
    ), store.config().write_limits());
    std::thread::sleep(Duration::from_millis(50));
    let before = store.stats().batches;
    let big: Vec<_> = (0..4)
        .map(|i| {
            store.submit_sql(
                tablix_store::Stamped::new(
                    stamp(3 + i),
                    sql(&["INSERT INTO t SELECT zeroblob(1500000) RETURNING x"]),
                ),
                store.config().write_limits(),
            )
        })
        .collect();
    assert!(!slow.wait().unwrap().rolled_back);
    for t in big {
        let r = t.wait().unwrap();
        assert!(!r.rolled_back, "{r:?}");
        match &r.statements[0].result {
            StatementResult::Rows(rows) => assert_eq!(rows.values.len(), 1),
            other => panic!("expected the returned row, got {other:?}"),
        }
    }
    // The slow write's group, then four more: gathered together, the four
    // were still committed one group each, none holding two results.
    assert!(store.stats().batches - before >= 5);
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(5)]]
    );
}

#[test]
fn the_file_system_never_waits_for_user_queries() {
    for mode in [Durability::Sync, Durability::Async] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path());
        config.durability = mode;
        config.readers = 2;
        config.write_timeout = Duration::from_secs(20);
        let store = Arc::new(Store::open(config).unwrap());
        store
            .apply_fs(stamp(0), FsOp::Mount { uid: 0, gid: 0 })
            .unwrap()
            .expect("the operation succeeds");
        store
            .apply_sql(stamp(0), sql(&["CREATE TABLE t(x)"]))
            .unwrap();
        // Every user reader busy, and a user write holding the writer, all
        // until stop_statements below.
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut busy = Vec::new();
        for _ in 0..2 {
            let (s, ended) = (Arc::clone(&store), Arc::clone(&ended));
            busy.push(std::thread::spawn(move || {
                let mut sink = Collect::default();
                let _ = s.query_into(
                    &Principal::root(),
                    &[Statement::new(RUNAWAY)],
                    &limits(600_000),
                    &mut sink,
                );
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        let write = store.submit_sql(tablix_store::Stamped::new(
            stamp(1),
            sql(&["INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"]),
        ), store.config().write_limits());
        // Wait until both readers are taken.
        while store
            .query_into(
                &Principal::root(),
                &[Statement::new("SELECT 1")],
                &limits(0),
                &mut Collect::default(),
            )
            .is_ok()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The file system reads (and, in sync mode through the writer
        // thread, would write) while the user's statements still run.
        for _ in 0..50 {
            store
                .read_latest(|c| tablix_fs::read::getattr(c, 1))
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            ended.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "{mode:?}: the file system's reads waited for the user's queries"
        );
        // A user read waits for a reader at most its own time limit.
        let r = store.query_into(
            &Principal::root(),
            &[Statement::new("SELECT 1")],
            &limits(100),
            &mut Collect::default(),
        );
        assert!(matches!(r, Err(StoreError::Busy(_))), "{r:?}");
        store.stop_statements();
        for t in busy {
            t.join().unwrap();
        }
        let w = write.wait().unwrap();
        assert!(w.rolled_back, "{w:?}");
        // Stopped statements do not stop the file system.
        let made = store
            .apply_fs(
                stamp(2),
                FsOp::MakeNode {
                    parent: 1,
                    name: b"after".to_vec(),
                    mode: libc::S_IFREG | 0o644,
                    rdev: 0,
                    uid: 0,
                    gid: 0,
                },
            )
            .unwrap();
        assert!(matches!(made, Ok(FsReply::Attr(_))), "{made:?}");
    }
}

/// 200 rows of 100 kB: a transaction far larger than the 1 MiB WAL
/// limit the tests below set.
const INSERT_20_MB: &str = "INSERT INTO big SELECT zeroblob(100000) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200) SELECT x FROM c)";

/// Waits up to 10 s for the WAL at `wal` to be at most `limit` bytes.
fn wait_for_wal_within(wal: &std::path::Path, limit: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let size = std::fs::metadata(wal).map_or(0, |m| m.len());
        if size <= limit {
            return;
        }
        assert!(Instant::now() < deadline, "the WAL stayed at {size} bytes");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A connection of its own on the store's database holding a read
/// snapshot of it, which keeps any checkpoint from going past it.
fn hold_snapshot(data_dir: &std::path::Path) -> rusqlite::Connection {
    let reader = rusqlite::Connection::open_with_flags(
        data_dir.join("tablix.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    reader
}

/// A store whose WAL is bounded at 1 MiB.
fn small_wal_store(durability: Durability) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.wal_limit = 1 << 20;
    config.durability = durability;
    let store = Store::open(config).unwrap();
    (dir, store)
}

/// The WAL is over the 1 MiB limit while `reader` holds its snapshot;
/// once it ends, the writer's bound cuts the WAL back.
fn release_and_expect_cut(store: &Store, wal: &std::path::Path, reader: rusqlite::Connection) {
    let held = std::fs::metadata(wal).unwrap().len();
    assert!(
        held > 1 << 20,
        "the WAL was cut back under a reader ({held} bytes)"
    );
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    wait_for_wal_within(wal, 1 << 20);
    // The writer counts its cut just after making it: the file may be
    // seen cut first.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.stats().wal_truncations == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let cut = store.stats().wal_truncations;
    assert!(
        cut >= 1,
        "the WAL shrank, but not by the bound ({cut} truncations)"
    );
}

#[test]
fn a_large_transaction_leaves_no_large_wal_behind() {
    let (dir, store) = small_wal_store(Durability::Sync);
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE big(b)", INSERT_20_MB]))
        .unwrap();
    let wal = dir.path().join("tablix.db-wal");
    wait_for_wal_within(&wal, 1 << 20);
    // Cut back by SQLite's own checkpoint (every half of the limit, with
    // journal_size_limit) or by the writer's bound, whichever came first;
    // either way the database holds everything.
    assert_eq!(
        rows(&store, "SELECT count(*) FROM big"),
        [[Value::Integer(200)]]
    );
}

/// SQLite's automatic checkpoint cannot reset a WAL that a reader still
/// needs; once the reader is gone and no write comes to trigger another,
/// only the writer's own bound cuts it back.
#[test]
fn a_wal_a_reader_held_is_cut_back_by_the_bound() {
    let (dir, store) = small_wal_store(Durability::Sync);
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE big(b)"]))
        .unwrap();
    let reader = hold_snapshot(dir.path());
    store.apply_sql(stamp(1), sql(&[INSERT_20_MB])).unwrap();
    let wal = dir.path().join("tablix.db-wal");
    // Past a retry of the bound, which the reader makes fail.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(store.stats().wal_truncations, 0);
    release_and_expect_cut(&store, &wal, reader);
    // Cut to the limit, not to nothing: the next writes reuse its pages.
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 1 << 20);
    assert_eq!(
        rows(&store, "SELECT count(*) FROM big"),
        [[Value::Integer(200)]]
    );
    store
        .apply_sql(stamp(2), sql(&["DELETE FROM big"]))
        .unwrap();
    assert_eq!(
        rows(&store, "SELECT count(*) FROM big"),
        [[Value::Integer(0)]]
    );
}

/// In async mode file-system writes reach the WAL on the callers' own
/// threads, never through the writer's queue: the bound is checked where
/// the writer commits them, at its flush.
#[test]
fn an_async_file_system_wal_a_reader_held_is_cut_back_by_the_bound() {
    let (dir, store) = small_wal_store(Durability::Async);
    store
        .apply_fs(stamp(0), FsOp::Mount { uid: 0, gid: 0 })
        .unwrap()
        .expect("the operation succeeds");
    let made = store
        .apply_fs(
            stamp(1),
            FsOp::MakeNode {
                parent: 1,
                name: "big".into(),
                mode: libc::S_IFREG | 0o644,
                rdev: 0,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
    let ino = match made {
        Ok(FsReply::Attr(a)) => a.ino,
        other => panic!("{other:?}"),
    };
    store.flush().wait().unwrap();
    let reader = hold_snapshot(dir.path());
    for i in 0..20u64 {
        store
            .apply_fs_now(
                stamp(2 + i as i64),
                FsOp::Write {
                    ino,
                    offset: i << 20,
                    data: vec![i as u8 + 1; 1 << 20],
                    kill_suidgid: false,
                },
            )
            .unwrap()
            .expect("the operation succeeds");
    }
    store.flush().wait().unwrap();
    let wal = dir.path().join("tablix.db-wal");
    release_and_expect_cut(&store, &wal, reader);
    let size: i64 = store
        .read(|c| {
            c.query_row(
                "SELECT size FROM tablix_inode WHERE ino = ?1",
                [ino as i64],
                |r| r.get(0),
            )
        })
        .unwrap()
        .unwrap();
    assert_eq!(size, 20 << 20);
}

#[test]
fn a_damaged_database_is_refused_with_a_pointer_to_fsck() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(StoreConfig::new(dir.path())).unwrap();
        store
            .apply_fs(stamp(0), FsOp::Mount { uid: 0, gid: 0 })
            .unwrap()
            .expect("the operation succeeds");
    }
    // Find the inode table's root page and scribble over it.
    let db = dir.path().join("tablix.db");
    let page: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'tablix_inode'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.seek(SeekFrom::Start((page as u64 - 1) * 4096)).unwrap();
    f.write_all(&[0xA5; 4096]).unwrap();
    drop(f);
    let err = Store::open(StoreConfig::new(dir.path()))
        .err()
        .expect("refused");
    assert!(matches!(err, StoreError::Malformed { .. }), "{err}");
    let m = err.to_string();
    assert!(
        m.contains("is damaged") && m.contains("tablix fsck --data"),
        "{m}"
    );
}

#[test]
fn only_the_daemon_can_read_the_data_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = Store::open(StoreConfig::new(&data)).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE t(x)"]))
        .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o711);
    for f in ["tablix.db", "tablix.db-wal", "tablix.db-shm"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
}

fn rows(store: &Store, q: &str) -> Vec<Vec<Value>> {
    match &store
        .query(&Principal::root(), &[Statement::new(q)])
        .unwrap()[0]
        .result
    {
        StatementResult::Rows(r) => r.values.clone(),
        other => panic!("{q}: {other:?}"),
    }
}

/// A sink that keeps only the first error.
#[derive(Default)]
struct Collect {
    error: Option<String>,
}

impl tablix_store::Sink for Collect {
    fn columns(&mut self, _: &[String]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn row(&mut self, _: &[tablix_store::Cell<'_>]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn end_rows(&mut self, _: &[String]) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn executed(&mut self, _: i64, _: u64) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
    fn error(&mut self, m: &str) -> Result<(), tablix_store::Stop> {
        self.error.get_or_insert_with(|| m.to_string());
        Ok(())
    }
    fn end_statement(&mut self, _: f64) -> Result<(), tablix_store::Stop> {
        Ok(())
    }
}

/// Every connection the store lends for its own reads refuses writes, in
/// both modes: the file system's readers and the memory database's; async
/// mode's loan of the writer's connection (which sees pending writes)
/// fails a read that changed a row. The writer writes on afterwards.
#[test]
fn lent_connections_only_read() {
    for mode in [Durability::Sync, Durability::Async] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path().join("data"));
        config.durability = mode;
        let store = Store::open(config).unwrap();
        store
            .apply_fs(stamp(0), FsOp::Mount { uid: 0, gid: 0 })
            .unwrap()
            .expect("the operation succeeds");
        let node = |n: i64| super::new_file(&format!("f{n}"));
        let made = store.apply_fs_now(stamp(1), node(1)).unwrap();
        assert!(made.is_ok(), "{mode:?}: {made:?}");
        let readonly = |r: Result<rusqlite::Result<usize>, StoreError>, what: &str| {
            let e = r.unwrap().expect_err(what);
            assert_eq!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ReadOnly),
                "{mode:?}, {what}: {e}"
            );
        };
        match mode {
            Durability::Sync => readonly(
                store.read_latest(|c| c.execute("DELETE FROM tablix_dirent", [])),
                "read_latest",
            ),
            // On the writer's connection a write is caught, not refused.
            Durability::Async => {
                let r =
                    store.read_latest(|c| c.execute("UPDATE tablix_meta SET value = value", []));
                assert!(matches!(r, Err(StoreError::Apply(_))), "{r:?}");
            }
        }
        readonly(
            store.read(|c| c.execute("DELETE FROM tablix_dirent", [])),
            "read",
        );
        readonly(
            store.read_volatile(|c| c.execute("DELETE FROM daemon", [])),
            "read_volatile",
        );
        // The pending write is visible to read_latest and intact.
        let names: i64 = store
            .read_latest(|c| c.query_row("SELECT count(*) FROM tablix_dirent", [], |r| r.get(0)))
            .unwrap()
            .unwrap();
        assert_eq!(names, 1, "{mode:?}");
        let again = store.apply_fs_now(stamp(2), node(2)).unwrap();
        assert!(
            again.is_ok(),
            "{mode:?}: the writer no longer writes after a loan: {again:?}"
        );
        store.flush().wait().unwrap();
        let names: i64 = store
            .read(|c| c.query_row("SELECT count(*) FROM tablix_dirent", [], |r| r.get(0)))
            .unwrap()
            .unwrap();
        assert_eq!(names, 2, "{mode:?}");
    }
}
