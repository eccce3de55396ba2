//! Integration tests of the store through its public API.
#![allow(clippy::unwrap_used)]

mod bounds;
mod fs_faults;
mod isolation;
mod replicated;
mod sandbox;
mod transactions;
mod tx_model;

use std::sync::Arc;

use proptest::prelude::*;
use rusqlite::Connection;
use tablix_store::{
    DaemonRecord, Durability, Params, Principal, SqlCommand, SqlReply, Stamp, Stamped, Statement,
    StatementResult, Store, StoreConfig, StoreError, Value,
};
use tablix_testkit::TinyDisk;

pub(crate) fn stamp(n: i64) -> Stamp {
    Stamp {
        unix_nanos: 1_700_000_000_000_000_000 + n,
        seed: n as u64,
    }
}

pub(crate) fn sql(statements: &[&str]) -> SqlCommand {
    SqlCommand {
        statements: statements.iter().map(|s| Statement::new(*s)).collect(),
        transaction: false,
        principal: Principal::root(),
    }
}

/// Makes a regular file `name` in the root directory, owned by root.
pub(crate) fn new_file(name: &str) -> tablix_fs::FsOp {
    tablix_fs::FsOp::MakeNode {
        parent: 1,
        name: name.into(),
        mode: libc::S_IFREG | 0o644,
        rdev: 0,
        uid: 0,
        gid: 0,
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

#[test]
fn fresh_directory_is_created_and_data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a/b/data");
    {
        let store = Store::open(StoreConfig::new(&data)).unwrap();
        let r = store
            .apply_sql(
                stamp(1),
                sql(&[
                    "CREATE TABLE kv(k TEXT PRIMARY KEY, v)",
                    "INSERT INTO kv VALUES ('x', 1)",
                ]),
            )
            .unwrap();
        assert!(!r.rolled_back, "{r:?}");
        assert_eq!(
            rows(&store, "SELECT value FROM tablix_meta WHERE key = 'format'"),
            [[Value::Text("tablix".into())]]
        );
    }
    let store = Store::open(StoreConfig::new(&data)).unwrap();
    assert_eq!(rows(&store, "SELECT v FROM kv"), [[Value::Integer(1)]]);
    // The memory database starts empty at every open.
    assert_eq!(
        rows(&store, "SELECT count(*) FROM mem.daemon"),
        [[Value::Integer(0)]]
    );
}

#[test]
fn a_second_store_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(StoreConfig::new(dir.path())).unwrap();
    match Store::open(StoreConfig::new(dir.path())) {
        Err(
            e @ StoreError::Locked {
                holder: Some(pid), ..
            },
        ) => {
            assert_eq!(pid, std::process::id());
            assert!(
                e.to_string().contains("in use by another tablix daemon"),
                "{e}"
            );
        }
        other => panic!("expected Locked, got {:?}", other.err()),
    }
}

#[test]
fn a_database_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(StoreConfig::new(dir.path())).unwrap());
    let conn = Connection::open(dir.path().join("tablix.db")).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let err = Store::open(StoreConfig::new(dir.path())).err().unwrap();
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("written by a newer tablix"),
        "{err}"
    );
}

#[test]
fn an_uncreatable_data_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open(StoreConfig::new(file.join("data")))
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::DataDir { .. }), "{err}");
    assert!(
        err.to_string().starts_with("cannot create data directory"),
        "{err}"
    );
}

#[test]
fn system_tables_are_read_only_to_sql_but_change_through_commands() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    let record = DaemonRecord {
        pid: 42,
        http_addr: "127.0.0.1:1".into(),
        data_dir: "/d".into(),
        mode: "sync".into(),
        version: "0".into(),
    };
    store.set_daemon(stamp(5), &record).unwrap();
    assert_eq!(
        rows(&store, "SELECT pid, started_ns FROM daemon"),
        [[Value::Integer(42), Value::Integer(stamp(5).unix_nanos)]]
    );
    for (bad, why) in [
        ("DELETE FROM daemon", "it is a view"),
        (
            "UPDATE mem.daemon SET pid = 1",
            "mem is tablix system state",
        ),
        ("INSERT INTO tablix_meta VALUES ('k', 1)", "system table"),
        ("DROP TABLE tablix_meta", "system table"),
        ("CREATE TABLE mem.mine(x)", "mem is tablix system state"),
        (
            "CREATE TRIGGER g AFTER INSERT ON tablix_meta BEGIN SELECT 1; END",
            "system table",
        ),
    ] {
        let r = store.apply_sql(stamp(6), sql(&[bad])).unwrap();
        match &r.statements[0].result {
            StatementResult::Error(m) => assert!(m.contains(why), "{bad}: {m}"),
            other => panic!("{bad} was allowed: {other:?}"),
        }
    }
    // Reads of system tables through the writer and readers are fine, and a
    // query cannot write at all.
    let r = store
        .query(
            &Principal::root(),
            &[Statement::new(
                "INSERT INTO daemon VALUES (1,'','','','',0)",
            )],
        )
        .unwrap();
    assert!(r[0].result.is_error());
    assert_eq!(
        rows(&store, "SELECT pid FROM daemon"),
        [[Value::Integer(42)]]
    );
}

#[test]
fn transaction_control_and_settings_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    for (bad, why) in [
        ("BEGIN", "transaction control"),
        ("SAVEPOINT s", "transaction control"),
        ("PRAGMA journal_mode = DELETE", "not allowed"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "ATTACH"),
        ("CREATE TEMP TABLE t(x)", "temporary objects"),
    ] {
        let r = store.apply_sql(stamp(1), sql(&[bad])).unwrap();
        match &r.statements[0].result {
            StatementResult::Error(m) => assert!(m.contains(why), "{bad}: {m}"),
            other => panic!("{bad} was allowed: {other:?}"),
        }
    }
}

#[test]
fn a_transaction_stops_at_its_first_error_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE t(x UNIQUE)"]))
        .unwrap();
    let r = store
        .apply_sql(
            stamp(1),
            SqlCommand {
                statements: vec![
                    Statement::new("INSERT INTO t VALUES (1)"),
                    Statement::new("INSERT INTO t VALUES (1)"),
                    Statement::new("INSERT INTO t VALUES (2)"),
                ],
                transaction: true,
                principal: Principal::root(),
            },
        )
        .unwrap();
    assert!(r.rolled_back);
    assert_eq!(r.statements.len(), 2);
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(0)]]
    );
    // Without a transaction each statement stands alone.
    let r = store
        .apply_sql(
            stamp(2),
            sql(&[
                "INSERT INTO t VALUES (1)",
                "INSERT INTO t VALUES (1)",
                "INSERT INTO t VALUES (2)",
            ]),
        )
        .unwrap();
    assert!(!r.rolled_back);
    assert_eq!(r.statements.len(), 3);
    assert!(r.statements[1].result.is_error());
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(2)]]
    );
}

#[test]
fn replay_of_stamped_commands_is_deterministic() {
    let commands: Vec<Stamped<SqlCommand>> = (0..20)
        .map(|i| {
            Stamped::new(
                stamp(i * 1_000_000_007),
                if i == 0 {
                    sql(&["CREATE TABLE r(a, b, c)"])
                } else {
                    SqlCommand {
                        statements: vec![Statement::with_params(
                            "INSERT INTO r VALUES (random(), hex(randomblob(8)), strftime('%Y-%m-%d %H:%M:%f', 'now') || ?)",
                            Params::Positional(vec![Value::Integer(i)]),
                        )],
                        transaction: i % 2 == 0,
                        principal: Principal::root(),
                    }
                },
            )
        })
        .collect();
    let dump = |dir: &std::path::Path| {
        let store = Store::open(StoreConfig::new(dir)).unwrap();
        for c in &commands {
            store
                .submit_sql(c.clone(), store.config().write_limits())
                .wait()
                .unwrap();
        }
        rows(&store, "SELECT a, b, c FROM r ORDER BY rowid")
    };
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let first = dump(a.path());
    assert_eq!(first.len(), 19);
    assert_eq!(first, dump(b.path()));
    // The clock is the stamp's, not the wall clock's.
    assert!(
        matches!(&first[0][2], Value::Text(t) if t.starts_with("2023-11-14")),
        "{:?}",
        first[0][2]
    );
}

#[test]
fn concurrent_writers_and_readers_all_succeed_in_async_mode() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.durability = Durability::Async;
    let store = Arc::new(Store::open(config).unwrap());
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE c(w, i)"]))
        .unwrap();
    let mut threads = Vec::new();
    for w in 0..8 {
        let store = Arc::clone(&store);
        threads.push(std::thread::spawn(move || {
            for i in 0..50 {
                let r = store
                    .apply_sql(
                        stamp(i),
                        SqlCommand {
                            statements: vec![Statement::with_params(
                                "INSERT INTO c VALUES (?, ?)",
                                Params::Positional(vec![Value::Integer(w), Value::Integer(i)]),
                            )],
                            transaction: false,
                            principal: Principal::root(),
                        },
                    )
                    .unwrap();
                assert!(!r.rolled_back);
                let n = rows(&store, &format!("SELECT count(*) FROM c WHERE w = {w}"));
                assert_eq!(n, [[Value::Integer(i + 1)]], "reader saw a stale snapshot");
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    store.flush().wait().unwrap();
    assert_eq!(
        rows(&store, "SELECT count(*) FROM c"),
        [[Value::Integer(400)]]
    );
    let stats = store.stats();
    assert_eq!(stats.commands, 401);
    assert!(stats.flushes >= 1, "{stats:?}");
}

fn statement() -> impl Strategy<Value = String> {
    prop_oneof![
        (0i64..8).prop_map(|k| format!("INSERT INTO p VALUES ({k}, random())")),
        (0i64..8).prop_map(|k| format!("INSERT OR ROLLBACK INTO p VALUES ({k}, 0)")),
        (0i64..8).prop_map(|k| format!("DELETE FROM p WHERE k = {k}")),
        (0i64..8).prop_map(|k| format!("UPDATE p SET v = v + 1 WHERE k = {k}")),
        Just("INSERT INTO missing VALUES (1)".to_string()),
        Just("UPDATE tablix_meta SET value = 1".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// Commands submitted together (so the writer groups them) end in the
    /// same state with the same results as Commands applied one at a time.
    #[test]
    fn concurrent_submission_matches_sequential_application(
        commands in prop::collection::vec((prop::collection::vec(statement(), 1..4), any::<bool>()), 1..40)
    ) {
        let stamped: Vec<Stamped<SqlCommand>> = commands.iter().enumerate().map(|(i, (sts, tx))| Stamped::new(
            stamp(i as i64),
            SqlCommand { statements: sts.iter().map(Statement::new).collect(), transaction: *tx, principal: Principal::root() },
        )).collect();
        let run = |grouped: bool| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(StoreConfig::new(dir.path())).unwrap();
            store.apply_sql(stamp(-1), sql(&["CREATE TABLE p(k PRIMARY KEY, v)"])).unwrap();
            let results: Vec<SqlReply> = if grouped {
                let tickets: Vec<_> = stamped.iter().map(|c| store.submit_sql(c.clone(), store.config().write_limits())).collect();
                tickets.into_iter().map(|t| t.wait().unwrap()).collect()
            } else {
                stamped.iter().map(|c| store.submit_sql(c.clone(), store.config().write_limits()).wait().unwrap()).collect()
            };
            let view: Vec<_> = results.iter().map(|a| (a.results(), a.rolled_back)).collect();
            (view, rows(&store, "SELECT k, v FROM p ORDER BY k"))
        };
        prop_assert_eq!(run(true), run(false));
    }
}

#[test]
fn async_mode_flushes_by_itself_within_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.durability = Durability::Async;
    config.flush_interval = std::time::Duration::from_millis(50);
    let store = Store::open(config).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE a(x)"]))
        .unwrap();
    assert_eq!(store.stats().flushes, 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        store.stats().flushes,
        1,
        "one flush after the one dirty commit"
    );
}

#[test]
fn async_mode_flushes_within_the_interval_under_steady_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.durability = Durability::Async;
    config.flush_interval = std::time::Duration::from_millis(20);
    let store = Store::open(config).unwrap();
    store
        .apply_sql(stamp(0), sql(&["CREATE TABLE a(x)"]))
        .unwrap();
    // Queue far more than one group at once, so the writer's queue stays
    // non-empty (a receive never waits) for many flush intervals; never ask
    // to flush.
    let started = std::time::Instant::now();
    let tickets: Vec<_> = (0..30_000)
        .map(|i| {
            store.submit_sql(
                Stamped::new(stamp(i), sql(&["INSERT INTO a VALUES (1)"])),
                store.config().write_limits(),
            )
        })
        .collect();
    for t in tickets {
        t.wait().unwrap();
    }
    let busy = started.elapsed();
    let flushes = store.stats().flushes;
    assert!(
        busy >= std::time::Duration::from_millis(100),
        "too fast to test: {busy:?}"
    );
    assert!(
        flushes >= 3,
        "{flushes} flushes while the writer was busy for {busy:?} with a 20 ms bound"
    );
}

#[test]
#[ignore = "needs root to mount a tmpfs: make test runs it as root"]
fn a_full_disk_fails_writes_and_loses_nothing() {
    // Room for the database, its WAL and index, and the command log's
    // first pages.
    let disk = TinyDisk::mount("a_full_disk_fails_writes_and_loses_nothing", "1m");
    let data = disk.path().join("data");
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 128 * 1024]).unwrap();
    let mut acked = 0i64;
    let mut refusal = None;
    {
        let store = Store::open(StoreConfig::new(&data)).unwrap();
        store
            .apply_sql(
                stamp(0),
                sql(&["CREATE TABLE big(id INTEGER PRIMARY KEY, b BLOB)"]),
            )
            .unwrap();
        for i in 0..1000 {
            let r = store.apply_sql(
                stamp(i),
                SqlCommand {
                    statements: vec![Statement::with_params(
                        "INSERT INTO big VALUES (?, zeroblob(8192))",
                        Params::Positional(vec![Value::Integer(i)]),
                    )],
                    transaction: false,
                    principal: Principal::root(),
                },
            );
            match r {
                Ok(a) if !a.statements[0].result.is_error() => acked += 1,
                Ok(a) => {
                    refusal = Some(format!("{:?}", a.statements[0].result));
                    break;
                }
                Err(e) => {
                    refusal = Some(e.to_string());
                    break;
                }
            }
        }
        let refusal = refusal.as_deref().unwrap_or("none");
        assert!(
            refusal.contains("full"),
            "expected a disk-full error, got {refusal}"
        );
        assert!(acked > 10, "only {acked} rows fit: {refusal}");
        // The store still serves reads, and every acknowledged row is there.
        assert_eq!(
            rows(&store, "SELECT count(*) FROM big"),
            [[Value::Integer(acked)]]
        );
        // Once space is freed elsewhere, writes work again.
        std::fs::remove_file(&ballast).unwrap();
        let r = store
            .apply_sql(stamp(-1), sql(&["DELETE FROM big WHERE id >= 5"]))
            .unwrap();
        assert!(!r.statements[0].result.is_error(), "{r:?}");
        acked = 5;
    }
    let store = Store::open(StoreConfig::new(&data)).unwrap();
    assert_eq!(
        rows(&store, "PRAGMA integrity_check"),
        [[Value::Text("ok".into())]]
    );
    assert_eq!(
        rows(&store, "SELECT count(*) FROM big"),
        [[Value::Integer(acked)]]
    );
}

fn insert(n: i64) -> SqlCommand {
    SqlCommand {
        statements: vec![Statement::with_params(
            "INSERT INTO p(v) VALUES (?)",
            Params::Positional(vec![Value::Integer(n)]),
        )],
        transaction: false,
        principal: Principal::root(),
    }
}

fn count_p(data: &std::path::Path) -> (i64, String) {
    recover(data);
    let conn = Connection::open(data.join("tablix.db")).unwrap();
    let n = conn
        .query_row("SELECT count(*) FROM p", [], |r| r.get(0))
        .unwrap();
    let ok = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    (n, ok)
}

/// Opens the store at `data` after a crash and closes it: what the
/// state lacks of the command log is applied, as at any restart.
pub(crate) fn recover(data: &std::path::Path) {
    drop(Store::open(StoreConfig::new(data)).expect("reopening after the crash"));
}

/// The fault-injecting VFS under the database, and the command log's halt:
/// [`Fault::freeze`] is the machine dying, for both.
pub(crate) struct Fault {
    vfs: tablix_vfs::FaultVfs,
    log: Arc<tablix_log::PowerModel>,
}

impl Fault {
    /// From now on nothing more reaches the database or the log.
    pub(crate) fn freeze(&self) {
        self.vfs.freeze();
        self.log.halt();
    }

    /// The machine loses power: the database's files and the log's lose
    /// every write since their last sync.
    pub(crate) fn power_loss(&self) -> std::io::Result<()> {
        self.vfs.power_loss()?;
        self.log.lose_unsynced()
    }
}

impl std::ops::Deref for Fault {
    type Target = tablix_vfs::FaultVfs;
    fn deref(&self) -> &tablix_vfs::FaultVfs {
        &self.vfs
    }
}

/// A store configuration on a fault-injecting VFS. The VFS is returned
/// first so that callers declare it first: it must outlive the store.
pub(crate) fn faulty_store(durability: Durability) -> (Fault, tempfile::TempDir, StoreConfig) {
    let vfs = tablix_vfs::FaultVfs::register().unwrap();
    let log = Arc::new(tablix_log::PowerModel::new());
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.vfs = Some(vfs.name().to_string());
    config.durability = durability;
    config.flush_interval = std::time::Duration::from_secs(3600);
    config.log_power = Some(Arc::clone(&log));
    (Fault { vfs, log }, dir, config)
}

/// Opens the store and creates table `p`.
fn open_with_p(config: StoreConfig) -> Store {
    let store = Store::open(config).unwrap();
    store
        .apply_sql(
            stamp(0),
            sql(&["CREATE TABLE p(id INTEGER PRIMARY KEY, v)"]),
        )
        .unwrap();
    store
}

#[test]
fn power_loss_keeps_every_write_acknowledged_in_sync_mode() {
    let (fault, dir, config) = faulty_store(Durability::Sync);
    let store = Arc::new(open_with_p(config));
    // Concurrent writers, so acknowledgements come from group commits.
    let acked: usize = (0..4)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..25)
                    .filter(|i| store.apply_sql(stamp(w * 100 + i), insert(*i)).is_ok())
                    .count()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(acked, 100);
    fault.freeze();
    drop(store);
    fault.power_loss().unwrap();
    assert_eq!(count_p(dir.path()), (100, "ok".to_string()));
}

#[test]
fn power_loss_in_async_mode_keeps_every_answered_sql_write() {
    let (fault, dir, config) = faulty_store(Durability::Async);
    let store = open_with_p(config);
    for i in 0..20 {
        store.apply_sql(stamp(i), insert(i)).unwrap();
    }
    store.flush().wait().unwrap();
    for i in 20..40 {
        store.apply_sql(stamp(i), insert(i)).unwrap();
    }
    fault.freeze();
    drop(store);
    fault.power_loss().unwrap();
    // User SQL is durable when answered in either mode: its group's log
    // entries are synced before it commits. The database itself lost the
    // commits never synced; the log brings them back.
    assert_eq!(count_p(dir.path()), (40, "ok".to_string()));
}

#[test]
fn io_errors_fail_the_group_and_lose_nothing() {
    let (fault, dir, config) = faulty_store(Durability::Sync);
    let store = open_with_p(config);
    for i in 0..10 {
        store.apply_sql(stamp(i), insert(i)).unwrap();
    }
    fault.fail_io(true);
    let err = store.apply_sql(stamp(10), insert(10)).unwrap_err();
    // Failing under the statement or at COMMIT: the group fails whole,
    // typed by SQLite's code, never as the Command's own result.
    assert!(
        matches!(err, StoreError::Commit(_) | StoreError::Failed(_)),
        "{err:?}"
    );
    assert_eq!(
        err.sqlite_code(),
        Some(rusqlite::ErrorCode::SystemIoFailure),
        "{err:?}"
    );
    fault.fail_io(false);
    store.apply_sql(stamp(11), insert(11)).unwrap();
    assert_eq!(
        rows(&store, "SELECT count(*) FROM p"),
        [[Value::Integer(11)]]
    );
    drop(store);
    assert_eq!(count_p(dir.path()), (11, "ok".to_string()));
}

/// A full disk under a user's write is a failure of this node, not the
/// statement's result: the request fails typed (SQLITE_FULL), nothing of
/// its group is applied, and the store writes again once space is back.
#[test]
fn a_full_disk_under_user_sql_fails_the_request_not_the_statement() {
    let (fault, dir, config) = faulty_store(Durability::Sync);
    let store = open_with_p(config);
    store.apply_sql(stamp(1), insert(1)).unwrap();
    fault.fill_disk(true);
    let big = sql(&[
        "INSERT INTO p(v) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) SELECT randomblob(100000) FROM n",
    ]);
    let r = store.apply_sql(stamp(2), big);
    let err = r.expect_err("a write on a full disk was answered as applied or refused by SQL");
    assert_eq!(
        err.sqlite_code(),
        Some(rusqlite::ErrorCode::DiskFull),
        "{err:?}"
    );
    fault.fill_disk(false);
    store.apply_sql(stamp(3), insert(3)).unwrap();
    drop(store);
    assert_eq!(count_p(dir.path()), (2, "ok".to_string()));
}

/// The memory database under load: threads moving bytes through pipes
/// while others query them with SQL. Nobody sees SQLITE_BUSY, every byte
/// arrives, and the lock counters show the waits.
#[test]
fn pipes_and_sql_readers_share_the_memory_database_without_busy() {
    use tablix_pipe::{End, PipeOp, PipeReply};
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(StoreConfig::new(dir.path())).unwrap());
    let pipe_op = |store: &Store, op: PipeOp| -> PipeReply {
        store
            .apply_pipe(stamp(1), &op)
            .unwrap()
            .expect("the op succeeds")
    };
    let writers = 4u64;
    let per = 300usize;
    let mut threads = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        threads.push(std::thread::spawn(move || {
            let name = format!("p{w}");
            let op = PipeOp::Create {
                name,
                uid: 0,
                gid: 0,
                mode: 0o600,
                capacity: 65536,
                exclusive: true,
            };
            let PipeReply::Created { pipe, .. } = pipe_op(&store, op) else {
                panic!("not created");
            };
            let end = End::Both;
            pipe_op(
                &store,
                PipeOp::Open {
                    pipe,
                    handle: w + 1,
                    end,
                    pid: 1,
                },
            );
            let mut got = Vec::new();
            for i in 0..per {
                let byte = (i % 251) as u8;
                let op = PipeOp::Io {
                    pipe,
                    write: vec![byte; 100],
                    read: 60,
                    read_first: false,
                };
                let PipeReply::Io { written, data, .. } = pipe_op(&store, op) else {
                    panic!("not io");
                };
                assert_eq!(written, 100);
                got.extend(data);
            }
            let op = PipeOp::Io {
                pipe,
                write: vec![],
                read: 1 << 20,
                read_first: true,
            };
            let PipeReply::Io { data, .. } = pipe_op(&store, op) else {
                panic!("not io");
            };
            got.extend(data);
            let want: Vec<u8> = (0..per).flat_map(|i| vec![(i % 251) as u8; 100]).collect();
            assert!(got == want, "pipe {w}: bytes lost or reordered");
        }));
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (store, done) = (store.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) || n == 0 {
                let out = store
                    .query(&Principal::root(), &[Statement::new(
                        "SELECT sum(total_in), sum(buffered) FROM pipes JOIN mem.pipe_end ON pipe = id",
                    )])
                    .unwrap();
                assert!(!out[0].result.is_error(), "{:?}", out[0].result);
                n += 1;
            }
            n
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let locks = store.stats().memory_locks;
    eprintln!("{reads} SQL reads; memory locks: {locks:?}");
    assert_eq!(locks.busy, 0);
    assert!(
        locks.write_transactions >= writers * (per as u64 + 3),
        "{locks:?}"
    );
}

#[test]
fn several_statements_in_one_element_run_in_turn_and_answer_as_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path().join("data"))).unwrap();
    store
        .apply_sql(
            stamp(1),
            sql(&["CREATE TABLE t(v); CREATE INDEX tv ON t(v)"]),
        )
        .unwrap();
    let r = store
        .apply_sql(
            stamp(2),
            sql(&[
                "INSERT INTO t VALUES (1); INSERT INTO t VALUES ('a;b'); SELECT count(*) FROM t",
            ]),
        )
        .unwrap();
    match &r.statements[0].result {
        StatementResult::Rows(rows) => assert_eq!(rows.values, [[Value::Integer(2)]]),
        other => panic!("{other:?}"),
    }
    // One that fails stops the element there; what ran before stays
    // (each statement stands alone), unless the Command is a transaction.
    let r = store
        .apply_sql(stamp(3), sql(&["INSERT INTO t VALUES (3); INSERT INTO nowhere VALUES (1); INSERT INTO t VALUES (4)"]))
        .unwrap();
    assert!(r.statements[0].result.is_error(), "{r:?}");
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(3)]]
    );
    let mut both = sql(&["INSERT INTO t VALUES (5); INSERT INTO nowhere VALUES (1)"]);
    both.transaction = true;
    let r = store.apply_sql(stamp(4), both).unwrap();
    assert!(r.rolled_back);
    assert_eq!(
        rows(&store, "SELECT count(*) FROM t"),
        [[Value::Integer(3)]]
    );
    // Reads too, on a reader; a trigger's body is one statement.
    let out = store
        .query(
            &Principal::root(),
            &[Statement::new("SELECT 1; SELECT count(*) FROM t")],
        )
        .unwrap();
    assert!(
        matches!(&out[0].result, StatementResult::Rows(r) if r.values == [[Value::Integer(3)]])
    );
    let r = store
        .apply_sql(
            stamp(5),
            sql(&["CREATE TABLE log(x); CREATE TRIGGER g AFTER INSERT ON t BEGIN INSERT INTO log VALUES (1); INSERT INTO log VALUES (2); END; INSERT INTO t VALUES (9)"]),
        )
        .unwrap();
    assert!(!r.statements[0].result.is_error(), "{r:?}");
    assert_eq!(
        rows(&store, "SELECT count(*) FROM log"),
        [[Value::Integer(2)]]
    );
}
