//! The SQL sandbox: what users see of system state, and escape attempts
//! that must change nothing.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rusqlite::Connection;
use tablix_fs::{FsOp, FsReply};
use tablix_proc::{ProcEvent, ProcInfo, ProcOp};
use tablix_store::{
    Principal, ProcVisibility, SqlCommand, Stamp, Statement, StatementResult, Store, StoreConfig,
    Value,
};

use super::stamp;

fn alice() -> Principal {
    Principal::local(1000, 1000, vec![100])
}

fn bob() -> Principal {
    Principal::local(1001, 1001, vec![])
}

fn as_user(who: &Principal, statements: &[&str]) -> SqlCommand {
    SqlCommand {
        statements: statements.iter().map(|s| Statement::new(*s)).collect(),
        transaction: false,
        principal: who.clone(),
    }
}

fn query(store: &Store, who: &Principal, q: &str) -> StatementResult {
    store
        .query(who, &[Statement::new(q)])
        .unwrap()
        .remove(0)
        .result
}

fn rows(store: &Store, who: &Principal, q: &str) -> Vec<Vec<Value>> {
    match query(store, who, q) {
        StatementResult::Rows(r) => r.values,
        other => panic!("{q} as {}: {other:?}", who.name),
    }
}

fn text(v: &str) -> Value {
    Value::Text(v.into())
}

fn fs(store: &Store, op: FsOp) -> tablix_fs::Attr {
    match store.apply_fs(stamp(9), op).unwrap() {
        Ok(FsReply::Attr(a)) => a,
        other => panic!("{other:?}"),
    }
}

fn mkdir(store: &Store, parent: u64, name: &str, mode: u32, uid: u32) -> u64 {
    fs(
        store,
        FsOp::MakeNode {
            parent,
            name: name.into(),
            mode: libc::S_IFDIR | mode,
            rdev: 0,
            uid,
            gid: uid,
        },
    )
    .ino
}

fn file(store: &Store, parent: u64, name: &str, mode: u32, uid: u32, body: &[u8]) -> u64 {
    let ino = fs(
        store,
        FsOp::MakeNode {
            parent,
            name: name.into(),
            mode: libc::S_IFREG | mode,
            rdev: 0,
            uid,
            gid: uid,
        },
    )
    .ino;
    store
        .apply_fs(
            stamp(10),
            FsOp::Write {
                ino,
                offset: 0,
                data: body.to_vec(),
                kill_suidgid: false,
            },
        )
        .unwrap()
        .expect("the operation succeeds");
    ino
}

/// A store holding a small tree: /home/alice (0700) with a secret, a
/// world-readable /pub, a root-only /etc/shadow.
fn tree() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(dir.path())).unwrap();
    store
        .apply_fs(stamp(1), FsOp::Mount { uid: 0, gid: 0 })
        .unwrap()
        .expect("the operation succeeds");
    let home = mkdir(&store, 1, "home", 0o755, 0);
    let a = mkdir(&store, home, "alice", 0o700, 1000);
    file(&store, a, "diary", 0o600, 1000, b"SECRET alice");
    let p = mkdir(&store, 1, "pub", 0o755, 0);
    file(&store, p, "readme", 0o644, 0, b"hello");
    file(&store, p, "grouped", 0o640, 0, b"for group 0");
    let etc = mkdir(&store, 1, "etc", 0o755, 0);
    file(&store, etc, "shadow", 0o600, 0, b"SECRET root");
    (dir, store)
}

#[test]
fn files_shows_each_user_only_what_lookups_would_reach() {
    let (_d, store) = tree();
    let paths = |who: &Principal| -> Vec<Value> {
        rows(&store, who, "SELECT path FROM files ORDER BY path")
            .into_iter()
            .map(|mut r| r.remove(0))
            .collect()
    };
    let all = paths(&Principal::root());
    assert!(all.contains(&text("/home/alice/diary")), "{all:?}");
    let a = paths(&alice());
    assert!(a.contains(&text("/home/alice/diary")), "{a:?}");
    let b = paths(&bob());
    assert!(
        b.contains(&text("/home/alice")),
        "the directory itself is listed in /home: {b:?}"
    );
    assert!(!b.contains(&text("/home/alice/diary")), "{b:?}");
    // Names in a directory bob may list are visible, even unreadable files.
    assert!(b.contains(&text("/etc/shadow")), "{b:?}");
}

#[test]
fn file_contents_need_read_permission() {
    let (_d, store) = tree();
    let read = |who: &Principal, q: &str| query(&store, who, q);
    match read(
        &alice(),
        "SELECT CAST(file_data('/home/alice/diary') AS TEXT)",
    ) {
        StatementResult::Rows(r) => assert_eq!(r.values, [[text("SECRET alice")]]),
        other => panic!("{other:?}"),
    }
    for (who, path, why) in [
        (bob(), "/home/alice/diary", "Permission denied"),
        (bob(), "/etc/shadow", "Permission denied"),
        (alice(), "/etc/shadow", "Permission denied"),
        (bob(), "/pub/grouped", "Permission denied"),
        (bob(), "/nowhere", "No such file"),
        (bob(), "/pub", "Is a directory"),
    ] {
        match read(&who, &format!("SELECT file_data('{path}')")) {
            StatementResult::Error(m) => assert!(m.contains(why), "{path} as {}: {m}", who.name),
            other => panic!("{path} as {}: {other:?}", who.name),
        }
    }
    match read(
        &Principal::root(),
        "SELECT CAST(file_data('/etc/shadow', 7, 100) AS TEXT)",
    ) {
        StatementResult::Rows(r) => assert_eq!(r.values, [[text("root")]]),
        other => panic!("{other:?}"),
    }
    // As substr's, a NULL offset or length gives NULL; other types are refused.
    assert_eq!(
        rows(
            &store,
            &Principal::root(),
            "SELECT file_data('/etc/shadow', NULL, 4), file_data('/etc/shadow', 0, NULL)"
        ),
        [[Value::Null, Value::Null]]
    );
    match read(
        &Principal::root(),
        "SELECT file_data('/etc/shadow', 'x', 4)",
    ) {
        StatementResult::Error(m) => assert!(m.contains("must be integers"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The raw blocks are root's.
    match read(
        &bob(),
        "SELECT CAST(data AS TEXT) FROM tablix_block WHERE instr(data, CAST('SECRET' AS BLOB)) > 0",
    ) {
        StatementResult::Error(m) => assert!(m.contains("raw tablix state"), "{m}"),
        other => panic!("bob read the raw blocks: {other:?}"),
    }
    assert_eq!(
        rows(
            &store,
            &Principal::root(),
            "SELECT count(*) FROM tablix_block WHERE instr(data, CAST('SECRET' AS BLOB)) > 0"
        ),
        [[Value::Integer(2)]]
    );
    // No view or trigger can call file_data for whoever reads it.
    let r = store
        .apply_sql(
            stamp(20),
            as_user(
                &alice(),
                &["CREATE VIEW leak AS SELECT file_data('/home/alice/diary') AS d"],
            ),
        )
        .unwrap();
    let r2 = query(&store, &bob(), "SELECT * FROM leak");
    assert!(
        r.statements[0].result.is_error() || r2.is_error(),
        "{r:?} {r2:?}"
    );
}

fn task(pid: u32, uid: u32, euid: u32, exe: &str) -> ProcEvent {
    ProcEvent::Seen(ProcInfo {
        pid,
        tgid: pid,
        ppid: Some(1),
        uid: Some(uid),
        euid: Some(euid),
        gid: Some(uid),
        egid: Some(uid),
        comm: Some(exe.rsplit('/').next().unwrap_or(exe).into()),
        exe: Some(exe.into()),
        cmdline: Some(format!("{exe} --secret-flag")),
        start_ns: Some(1),
    })
}

fn with_processes(visibility: ProcVisibility) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.proc_visibility = Some(visibility);
    let store = Store::open(config).unwrap();
    store
        .apply_proc(
            stamp(1),
            &ProcOp {
                reset: true,
                events: vec![
                    task(10, 1000, 1000, "/usr/bin/vim"),
                    task(11, 1001, 1001, "/usr/bin/ssh"),
                    task(12, 1000, 0, "/usr/bin/sudo"),
                ],
                keep_exited: 10,
            },
        )
        .unwrap();
    (dir, store)
}

#[test]
fn processes_follow_procs_rules() {
    let (_d, store) = with_processes(ProcVisibility::default());
    let q = "SELECT pid, exe, cmdline FROM processes ORDER BY pid";
    assert_eq!(
        rows(&store, &alice(), q),
        [
            vec![
                Value::Integer(10),
                text("/usr/bin/vim"),
                text("/usr/bin/vim --secret-flag")
            ],
            // Others' tasks: everything but the executable's path, as /proc.
            vec![
                Value::Integer(11),
                Value::Null,
                text("/usr/bin/ssh --secret-flag")
            ],
            // alice's own set-user-ID task runs as root: not hers to inspect.
            vec![
                Value::Integer(12),
                Value::Null,
                text("/usr/bin/sudo --secret-flag")
            ],
        ]
    );
    assert_eq!(
        rows(
            &store,
            &Principal::root(),
            "SELECT count(exe) FROM processes"
        ),
        [[Value::Integer(3)]]
    );
    match query(&store, &alice(), "SELECT exe FROM mem.processes") {
        StatementResult::Error(m) => assert!(m.contains("raw tablix state"), "{m}"),
        other => panic!("{other:?}"),
    }
    let (_d, store) = with_processes(ProcVisibility {
        hidepid: 1,
        exempt_gid: Some(100),
    });
    assert_eq!(
        rows(
            &store,
            &bob(),
            "SELECT pid, comm, cmdline FROM processes ORDER BY pid"
        )[0],
        [Value::Integer(10), Value::Null, Value::Null]
    );
    // alice is in /proc's exempt group.
    assert_eq!(
        rows(&store, &alice(), "SELECT count(cmdline) FROM processes"),
        [[Value::Integer(3)]]
    );
    let (_d, store) = with_processes(ProcVisibility {
        hidepid: 2,
        exempt_gid: None,
    });
    assert_eq!(
        rows(&store, &bob(), "SELECT pid FROM processes"),
        [[Value::Integer(11)]]
    );
    assert_eq!(
        rows(&store, &bob(), "SELECT pid, handler_id FROM pid_store"),
        [[Value::Integer(11), Value::Integer(11)]]
    );
}

/// A task forked from a process tablix never saw has no credentials until
/// /proc is read; if it exits first, its row keeps NULLs. The views must
/// still answer, showing it as an unreadable /proc entry would be.
#[test]
fn a_task_whose_credentials_were_never_read_is_roots_alone_to_inspect() {
    for hidepid in [0, 2] {
        let (_d, store) = with_processes(ProcVisibility {
            hidepid,
            exempt_gid: None,
        });
        let fork = ProcEvent::Fork {
            pid: 20,
            tgid: 20,
            parent: 99,
            parent_tgid: 99,
            at_ns: 2,
        };
        let exit = ProcEvent::Exit {
            pid: 20,
            at_ns: 3,
            status: Some(0),
        };
        store
            .apply_proc(
                stamp(2),
                &ProcOp {
                    reset: false,
                    events: vec![fork, exit],
                    keep_exited: 10,
                },
            )
            .unwrap();
        let q = "SELECT pid, uid, exit_code FROM processes WHERE pid = 20";
        let seen = rows(&store, &alice(), q);
        if hidepid == 0 {
            assert_eq!(seen, [[Value::Integer(20), Value::Null, Value::Integer(0)]]);
        } else {
            assert!(seen.is_empty(), "{seen:?}");
        }
        assert_eq!(
            rows(&store, &Principal::root(), q),
            [[Value::Integer(20), Value::Null, Value::Integer(0)]]
        );
        // The other tasks are unaffected.
        assert_eq!(
            rows(
                &store,
                &alice(),
                "SELECT count(*) FROM processes WHERE pid < 20"
            ),
            [[Value::Integer(if hidepid == 0 { 3 } else { 1 })]]
        );
    }
}

#[test]
fn pipes_show_named_ones_and_the_users_own() {
    use tablix_pipe::{End, PipeOp};
    let (_d, store) = with_processes(ProcVisibility::default());
    let create = |name: Option<&str>, uid: u32| PipeOp::Create {
        name: name.map_or_else(|| format!("anon-{uid}"), String::from),
        uid,
        gid: uid,
        mode: 0o600,
        capacity: 65536,
        exclusive: true,
    };
    for (n, uid) in [(Some("jobs"), 1001), (None, 1000), (None, 1001)] {
        store
            .apply_pipe(stamp(2), &create(n, uid))
            .unwrap()
            .expect("the operation succeeds");
    }
    // Anonymous pipes are those tablix run creates and unlinks at once.
    let unnamed: Vec<i64> = rows(
        &store,
        &Principal::root(),
        "SELECT id FROM pipes WHERE name LIKE 'anon-%'",
    )
    .into_iter()
    .filter_map(|r| match r[0] {
        Value::Integer(i) => Some(i),
        _ => None,
    })
    .collect();
    for (i, id) in unnamed.iter().enumerate() {
        store
            .apply_pipe(
                stamp(3),
                &PipeOp::Open {
                    pipe: *id,
                    handle: 100 + i as u64,
                    end: End::Both,
                    pid: 10 + i as u32,
                },
            )
            .unwrap()
            .expect("the operation succeeds");
        store
            .apply_pipe(
                stamp(3),
                &PipeOp::Unlink {
                    name: format!("anon-{}", 1000 + i),
                },
            )
            .unwrap()
            .expect("the operation succeeds");
    }
    let seen = |who: &Principal| rows(&store, who, "SELECT count(*) FROM pipes");
    assert_eq!(seen(&Principal::root()), [[Value::Integer(3)]]);
    assert_eq!(seen(&alice()), [[Value::Integer(2)]], "jobs and her own");
    assert_eq!(
        rows(&store, &alice(), "SELECT pid FROM pid_pipe"),
        [[Value::Integer(10)]],
        "only her own process's ends"
    );
    match query(&store, &alice(), "SELECT data FROM mem.pipe_data") {
        StatementResult::Error(m) => assert!(m.contains("raw"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// Everything system-owned, as root sees it raw: any change is an escape.
fn fingerprint(path: &std::path::Path) -> BTreeMap<String, Vec<String>> {
    let c = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let dump = |sql: &str| -> Vec<String> {
        let mut st = c.prepare(sql).unwrap();
        let n = st.column_count();
        st.query_map([], |r| {
            Ok((0..n)
                .map(|i| match r.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                        String::from_utf8_lossy(t).into_owned()
                    }
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join("|"))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    let mut out = BTreeMap::new();
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'tablix\\_%' ESCAPE '\\' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for name in tables {
        // WITHOUT ROWID tables by their keys.
        let order = match name.as_str() {
            "tablix_xattr" => "ino, name",
            "tablix_release" => "ino, node",
            "tablix_lock" => "ino, node, owner, start",
            "tablix_lost_lock" => "node, ino, pid, owner",
            _ => "rowid",
        };
        // Every Command, refused or not, moves the log position the state
        // records: that is the store's doing, not the user's.
        let except = if name == "tablix_meta" {
            "WHERE key NOT IN ('applied_index', 'applied_term')"
        } else {
            ""
        };
        out.insert(
            name.clone(),
            dump(&format!(
                "SELECT * FROM \"{name}\" {except} ORDER BY {order}"
            )),
        );
    }
    out.insert(
        "schema".into(),
        dump("SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name LIKE 'tablix\\_%' ESCAPE '\\' OR tbl_name LIKE 'tablix\\_%' ESCAPE '\\' ORDER BY name"),
    );
    out.insert(
        "stats".into(),
        dump("SELECT * FROM sqlite_schema WHERE name = 'sqlite_stat1'")
            .into_iter()
            .flat_map(|_| {
                dump("SELECT * FROM sqlite_stat1 WHERE tbl LIKE 'tablix\\_%' ESCAPE '\\'")
            })
            .collect(),
    );
    // sqlite_sequence is the users' alone: no system table counts on it.
    out.insert(
        "system tables on sqlite_sequence".into(),
        dump("SELECT name FROM sqlite_schema WHERE name LIKE 'tablix\\_%' ESCAPE '\\' AND sql LIKE '%AUTOINCREMENT%'"),
    );
    out.insert(
        "user objects with reserved names or references".into(),
        dump(
            "SELECT type, name FROM sqlite_schema WHERE name NOT LIKE 'tablix\\_%' ESCAPE '\\' AND tbl_name NOT LIKE 'tablix\\_%' ESCAPE '\\'
               AND (lower(name) IN ('files', 'processes', 'pipes', 'pipe', 'pipe_data', 'pid_pipe', 'pid_store', 'daemon')
                    OR lower(sql) LIKE '%tablix\\_%' ESCAPE '\\')",
        ),
    );
    out
}

/// Root-made (raw) state the file system relies on keeps working: the
/// next inode number is the next one, and reclamation frees inodes.
fn file_system_still_works(store: &Store) {
    let before: i64 = match &rows(
        store,
        &Principal::root(),
        "SELECT value FROM tablix_meta WHERE key = 'next_ino'",
    )[0][0]
    {
        Value::Integer(i) => *i,
        other => panic!("{other:?}"),
    };
    let ino = file(store, 1, &format!("probe-{before}"), 0o644, 0, b"x");
    assert_eq!(ino as i64, before, "inode numbers come from tablix_meta");
    store
        .apply_fs(
            stamp(30),
            FsOp::Unlink {
                parent: 1,
                name: format!("probe-{before}").into(),
            },
        )
        .unwrap()
        .expect("the operation succeeds");
    let r = store
        .apply_fs(stamp(31), FsOp::Reclaim { inodes: vec![ino] })
        .unwrap();
    assert!(r.is_ok(), "reclaim failed: {r:?}");
    assert_eq!(
        rows(
            store,
            &Principal::root(),
            &format!("SELECT count(*) FROM tablix_inode WHERE ino = {ino}")
        ),
        [[Value::Integer(0)]]
    );
}

/// The reproductions of the hardening issue and their relatives, as root
/// and as an ordinary user: each must fail or change nothing of tablix's.
const ESCAPES: &[(&str, &str)] = &[
    // (statement, what the refusal says (alternatives split by |); "" =
    // may succeed, harmlessly)
    (
        "UPDATE sqlite_sequence SET seq = 281474976710655 WHERE name = 'tablix_inode'",
        "",
    ),
    ("DELETE FROM sqlite_sequence", ""),
    (
        "INSERT INTO sqlite_sequence VALUES ('tablix_inode', 281474976710655)",
        "",
    ),
    (
        "CREATE TABLE fk(x REFERENCES tablix_inode(ino))",
        "refers to tablix_inode",
    ),
    (
        "CREATE TABLE fk2(x INTEGER, FOREIGN KEY(x) REFERENCES \"TABLIX_DIRENT\"(id))",
        "refers to tablix_dirent",
    ),
    ("CREATE TABLE temp.acct(x)", "temp"),
    ("CREATE TABLE \"temp\".acct(x)", "temp"),
    ("CREATE TEMP TABLE acct(x)", "temporary"),
    ("CREATE TEMPORARY VIEW tv AS SELECT 1", "temporary"),
    ("CREATE VIEW temp.tv AS SELECT 1", "temp"),
    (
        "CREATE TRIGGER temp.tg AFTER INSERT ON main.u BEGIN SELECT 1; END",
        "temp",
    ),
    ("CREATE INDEX temp.ti ON u(x)", ""),
    ("ANALYZE", "ANALYZE"),
    ("ANALYZE main", "ANALYZE of tablix system table"),
    ("ANALYZE tablix_inode", "ANALYZE of tablix system table"),
    (
        "INSERT INTO sqlite_stat1 VALUES ('tablix_inode', NULL, '1000000')",
        "ANALYZE only",
    ),
    ("CREATE TABLE processes(x)", "reserved"),
    ("CREATE VIEW pipes AS SELECT 1", "reserved"),
    ("CREATE TABLE daemon(pid)", "reserved"),
    ("CREATE TABLE Files(x)", "reserved"),
    ("CREATE TABLE tablix_mine(x)", "reserved"),
    (
        "ALTER TABLE u RENAME TO processes",
        "reserved|views may not be indexed",
    ),
    ("ALTER TABLE v2 RENAME TO processes", "reserved"),
    ("ALTER TABLE u RENAME TO tablix_u", "reserved"),
    (
        "ALTER TABLE u ADD COLUMN y REFERENCES tablix_inode",
        "refers to tablix_inode",
    ),
    ("SELECT 1\0; DROP TABLE u", "NUL byte"),
    (
        "CREATE VIEW v AS SELECT * FROM tablix_inode",
        "refers to tablix_inode",
    ),
    (
        "CREATE TRIGGER g AFTER INSERT ON u BEGIN DELETE FROM tablix_inode; END",
        "refers to tablix_inode",
    ),
    (
        "CREATE TRIGGER g2 AFTER INSERT ON tablix_inode BEGIN SELECT 1; END",
        "system table",
    ),
    (
        "CREATE VIRTUAL TABLE ft USING fts5(a, content='tablix_block')",
        "refers to tablix_block",
    ),
    ("CREATE VIRTUAL TABLE ds USING dbstat", "not allowed"),
    ("CREATE INDEX i ON tablix_inode(uid)", "system table"),
    ("REINDEX tablix_dirent_parent", "system table"),
    ("DELETE FROM tablix_inode", "system table"),
    ("UPDATE tablix_meta SET value = 1", "system table"),
    (
        "INSERT INTO mem.pipe(uid, gid, mode, capacity, created_ns, changed_ns) VALUES (0,0,0,0,0,0)",
        "mem",
    ),
    ("DELETE FROM processes", "view"),
    ("DROP VIEW files", "temporary"),
    ("DROP TABLE tablix_block", "system table"),
    (
        "UPDATE sqlite_master SET sql = 'x' WHERE name = 'tablix_inode'",
        "may not be modified",
    ),
    ("PRAGMA writable_schema = 1", "not allowed"),
    ("PRAGMA journal_mode = DELETE", "not allowed"),
    ("PRAGMA foreign_keys = OFF", "not allowed"),
    ("PRAGMA optimize", "not allowed"),
    ("ATTACH 'x.db' AS x", "ATTACH"),
    ("SELECT load_extension('libx')", "load_extension"),
    ("BEGIN", "transaction control"),
];

#[test]
fn escape_attempts_change_nothing_of_tablixs() {
    for who in [Principal::root(), alice()] {
        let (dir, store) = tree();
        // A user table with statistics, so that sqlite_stat1 exists.
        let setup = store
            .apply_sql(
                stamp(2),
                as_user(
                    &who,
                    &[
                        "CREATE TABLE u(x)",
                        "CREATE TABLE v2(x)",
                        "CREATE INDEX ux ON u(x)",
                        "INSERT INTO u VALUES (1), (2)",
                        "ANALYZE u",
                    ],
                ),
            )
            .unwrap();
        assert!(
            setup.statements.iter().all(|s| !s.result.is_error()),
            "{setup:?}"
        );
        let db = dir.path().join("tablix.db");
        let before = fingerprint(&db);
        for (sql, why) in ESCAPES {
            let r = store.apply_sql(stamp(3), as_user(&who, &[sql])).unwrap();
            match (&r.statements[0].result, why.is_empty()) {
                (StatementResult::Error(m), false) => assert!(
                    why.split('|').any(|w| m.contains(w)),
                    "{sql:?} as {}: {m}",
                    who.name
                ),
                (_, true) => {}
                (other, false) => panic!("{sql:?} was allowed as {}: {other:?}", who.name),
            }
            assert_eq!(
                fingerprint(&db),
                before,
                "{sql:?} as {} changed system state",
                who.name
            );
        }
        file_system_still_works(&store);
    }
}

#[test]
fn raw_reads_and_cte_spoofing_are_refused_to_users() {
    let (_d, store) = tree();
    for q in [
        "SELECT name FROM tablix_dirent",
        "SELECT * FROM main.tablix_inode",
        "SELECT * FROM tablix_blocks",
        "SELECT * FROM dbstat",
        "WITH files AS (SELECT CAST(name AS TEXT) FROM tablix_dirent) SELECT * FROM files",
        "WITH x AS (SELECT 1), \"FILES\"(n) AS (SELECT name FROM tablix_dirent) SELECT * FROM \"FILES\"",
        "WITH tablix_walk AS (SELECT data FROM tablix_block) SELECT * FROM tablix_walk",
        "SELECT * FROM (SELECT name FROM tablix_dirent) AS files",
        "SELECT * FROM mem.processes",
        "SELECT * FROM mem.pid_pipe",
    ] {
        match query(&store, &bob(), q) {
            StatementResult::Error(m) => assert!(
                m.contains("raw tablix state") || m.contains("reserved"),
                "{q}: {m}"
            ),
            other => panic!("{q} was allowed: {other:?}"),
        }
    }
    // The same as root, and a user's own query through the views, work.
    assert!(!query(&store, &Principal::root(), "SELECT count(*) FROM dbstat").is_error());
    assert!(!query(&store, &bob(), "SELECT path FROM files WHERE type = 'dir'").is_error());
}

/// Pieces of SQL around system names, in many spellings.
fn names() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "tablix_inode",
        "TABLIX_INODE",
        "\"tablix_dirent\"",
        "[tablix_block]",
        "`tablix_meta`",
        "main.tablix_xattr",
        "main.\"tablix_symlink\"",
        "temp.t",
        "\"temp\".t",
        "TEMP.t",
        "mem.pipe",
        "mem.processes",
        "mem.daemon",
        "processes",
        "pipes",
        "files",
        "daemon",
        "pid_pipe",
        "pid_store",
        "sqlite_sequence",
        "sqlite_stat1",
        "sqlite_master",
        "u",
        "dbstat",
        "tablix_walk",
        "Files",
    ])
}

fn fragment() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "INSERT INTO {a} VALUES (1)",
            "INSERT INTO {a} SELECT * FROM {b}",
            "UPDATE {a} SET seq = 1",
            "DELETE FROM {a}",
            "REPLACE INTO {a} VALUES ('tablix_inode', 1)",
            "CREATE TABLE {a}(x)",
            "CREATE TABLE v{n}(x REFERENCES {a})",
            "CREATE VIEW {a} AS SELECT 1",
            "CREATE VIEW v{n} AS SELECT * FROM {a}",
            "CREATE TRIGGER {a} AFTER INSERT ON u BEGIN DELETE FROM {b}; END",
            "CREATE TRIGGER g{n} AFTER INSERT ON {a} BEGIN SELECT 1; END",
            "ALTER TABLE u RENAME TO {a}",
            "ALTER TABLE {a} RENAME TO z{n}",
            "ALTER TABLE {a} ADD COLUMN c{n}",
            "DROP TABLE {a}",
            "DROP VIEW {a}",
            "ANALYZE {a}",
            "CREATE INDEX i{n} ON {a}(x)",
            "REINDEX {a}",
            "WITH {a} AS (SELECT * FROM {b}) SELECT * FROM {a}",
            "INSERT INTO sqlite_stat1 VALUES ('{a}', NULL, '1')",
            "CREATE VIRTUAL TABLE f{n} USING fts5(x, content='{a}')",
            "PRAGMA {a}",
            "SELECT * FROM {a}",
        ]),
        names(),
        names(),
        0u32..1000,
        prop::sample::select(vec!["", " ", "/* c */ ", "\n-- c\n"]),
    )
        .prop_map(|(t, a, b, n, pad)| {
            format!(
                "{pad}{}",
                t.replace("{a}", a)
                    .replace("{b}", b)
                    .replace("{n}", &n.to_string())
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Whatever such statements a user or root sends, in whatever order,
    /// no system row, schema entry or statistic changes, and the file
    /// system keeps working.
    #[test]
    fn generated_sql_never_changes_system_state(
        statements in prop::collection::vec(fragment(), 1..30),
        as_root in any::<bool>(),
    ) {
        let who = if as_root { Principal::root() } else { alice() };
        let (dir, store) = tree();
        store.apply_sql(stamp(2), as_user(&who, &["CREATE TABLE u(x)"])).unwrap();
        let db = dir.path().join("tablix.db");
        let before = fingerprint(&db);
        for sql in &statements {
            store.apply_sql(Stamp { unix_nanos: 5, seed: 5 }, as_user(&who, &[sql])).unwrap();
            let _ = store.query(&who, &[Statement::new(sql.clone())]).unwrap();
        }
        prop_assert_eq!(fingerprint(&db), before);
        file_system_still_works(&store);
    }
}
