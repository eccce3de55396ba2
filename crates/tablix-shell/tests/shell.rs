//! The shell against a real server on an ephemeral 127.0.0.1 port.
#![allow(clippy::unwrap_used)]

use tablix_shell::{Client, Mode, Shell, ShellError};
use tablix_testkit::{ApiServer, Setup};

struct Server {
    addr: String,
    api: ApiServer,
}

fn server() -> Server {
    let api = ApiServer::start(Setup::default());
    Server {
        addr: api.addr.to_string(),
        api,
    }
}

fn run(s: &Server, mode: Mode, text: &str) -> (Result<(), ShellError>, String) {
    let mut shell = Shell::new(Client::tcp(&s.addr, None).unwrap(), Vec::new());
    shell.set_mode(mode);
    let r = shell.run_batch(text);
    (r, String::from_utf8(shell.into_output()).unwrap())
}

#[test]
fn tables_schema_and_modes() {
    let s = server();
    let (r, out) = run(
        &s,
        Mode::List,
        "CREATE TABLE b(x);\nCREATE TABLE a(y INTEGER, -- comment; with a semicolon\n z TEXT);\nCREATE INDEX ai ON a(y);\n.tables\n.schema a%\n.tables nomatch\n",
    );
    r.unwrap();
    assert_eq!(
        out,
        "a  b  daemon  files  mem.daemon  mem.pid_pipe  mem.pipe  mem.pipe_data  mem.pipe_end  mem.processes  pid_pipe  pid_store  pipes  processes  tablix_block  tablix_block_sum  tablix_blocks  tablix_dirent  tablix_inode  tablix_lock  tablix_lost_lock  tablix_meta  tablix_mount  tablix_proposals  tablix_release  tablix_symlink  tablix_transaction_stats  tablix_transactions  tablix_xattr\nCREATE TABLE a(y INTEGER, -- comment; with a semicolon\n z TEXT);\nCREATE INDEX ai ON a(y);\n"
    );
    let (r, out) = run(
        &s,
        Mode::Csv,
        "INSERT INTO a VALUES (1, 'x,y');\n.headers on\nSELECT * FROM a;\n.mode line\nSELECT y FROM a;\n",
    );
    r.unwrap();
    assert_eq!(out, "y,z\n1,\"x,y\"\ny = 1\n");
}

#[test]
fn errors_stop_a_batch_and_say_why() {
    let s = server();
    let (r, out) = run(
        &s,
        Mode::List,
        "SELECT 1;\nSELECT * FROM missing;\nSELECT 2;\n",
    );
    assert!(
        matches!(r, Err(ShellError::Sql(ref m)) if m.contains("no such table: missing") && m.starts_with("near line 2:")),
        "{r:?}"
    );
    assert_eq!(out, "1\n");
    // The line a statement began on, however many it spans or shares.
    let (r, _) = run(&s, Mode::List, "SELECT 1;\n\nSELECT\n  nope;\n");
    assert!(
        matches!(r, Err(ShellError::Sql(ref m)) if m.starts_with("near line 3:")),
        "{r:?}"
    );
    let (r, _) = run(&s, Mode::List, "SELECT 1; SELECT nope;\n");
    assert!(
        matches!(r, Err(ShellError::Sql(ref m)) if m.starts_with("near line 1:")),
        "{r:?}"
    );
    let (r, _) = run(&s, Mode::List, "BEGIN;\nCREATE TABLE never(x);\n");
    assert!(
        matches!(r, Err(ShellError::Sql(ref m)) if m.contains("BEGIN without COMMIT")),
        "{r:?}"
    );
    let (r, out) = run(&s, Mode::List, ".tables never\n");
    r.unwrap();
    assert_eq!(out, "", "an unfinished transaction must apply nothing");
    let (r, _) = run(&s, Mode::List, "COMMIT;");
    assert!(
        matches!(r, Err(ShellError::Sql(ref m)) if m.contains("no transaction is active")),
        "{r:?}"
    );
    let (r, _) = run(&s, Mode::List, ".read /nonexistent/file.sql\n");
    assert!(
        matches!(r, Err(ShellError::Usage(ref m)) if m.contains("cannot read")),
        "{r:?}"
    );
    let (r, _) = run(&s, Mode::List, ".quit\nSELECT 1;\n");
    assert!(matches!(r, Err(ShellError::Quit)));
}

#[test]
fn rollback_discards_and_read_runs_files() {
    let s = server();
    let file = s.api.dir.path().join("f.sql");
    std::fs::write(&file, "CREATE TABLE r(x);\nINSERT INTO r VALUES (7);\n").unwrap();
    let (r, out) = run(
        &s,
        Mode::List,
        &format!(
            ".read {}\nBEGIN;\nINSERT INTO r VALUES (8);\nROLLBACK;\nSELECT group_concat(x) FROM r;\n",
            file.display()
        ),
    );
    r.unwrap();
    assert_eq!(out, "7\n");
}

#[test]
fn dump_round_trips_types_and_objects() {
    let s = server();
    let (r, _) = run(
        &s,
        Mode::List,
        "CREATE TABLE \"odd name\"(i INTEGER, r REAL, t TEXT, b BLOB, n);\n\
         INSERT INTO \"odd name\" VALUES (1, 2.0, 'it''s', X'000102', NULL), (-5, 1e300, '', X'', 3.25);\n\
         CREATE VIEW v AS SELECT i FROM \"odd name\";\n\
         CREATE TRIGGER g AFTER INSERT ON \"odd name\" BEGIN SELECT 1; END;\n",
    );
    r.unwrap();
    let (r, dump) = run(&s, Mode::List, ".dump\n");
    r.unwrap();
    let other = server();
    let (r, _) = run(&other, Mode::List, &dump);
    r.unwrap();
    let (r, again) = run(&other, Mode::List, ".dump\n");
    r.unwrap();
    assert_eq!(dump, again);
    let (r, out) = run(
        &other,
        Mode::List,
        "SELECT typeof(i), typeof(r), typeof(t), typeof(b), typeof(n) FROM \"odd name\" ORDER BY i;\n",
    );
    r.unwrap();
    assert_eq!(
        out,
        "integer|real|text|blob|real\ninteger|real|text|blob|null\n"
    );
}
