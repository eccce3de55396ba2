//! The seed's four batch workloads (ReSQLite's write-only, read-only,
//! write-heavy and read-heavy), run the way its client ran them: a file of
//! SQL, one statement a line, through a shell's batch mode, one statement
//! at a time. Plain sqlite3 reads the file on standard input (its default
//! durability: a rollback journal, every statement its own transaction);
//! tablix's shell runs it with `tablix sql -f`; rqlite's shell with
//! `.read`. Each system's output goes to /dev/null, and the time is the
//! whole process's, as the seed timed it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

/// Rows every workload's table starts with (not timed).
const SEEDED: u64 = 1000;

pub(super) struct Workload {
    pub name: &'static str,
    /// The table it uses, created and seeded before the clock starts.
    pub table: &'static str,
    /// The statements, one a line.
    pub script: String,
    pub statements: u64,
}

impl Workload {
    /// Creates the table and seeds it, as one statement each.
    pub fn setup(&self) -> [String; 2] {
        [
            format!("CREATE TABLE {}(k INTEGER PRIMARY KEY, v TEXT)", self.table),
            format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {SEEDED}) \
                 INSERT INTO {} SELECT i, 'seeded row ' || i FROM n",
                self.table
            ),
        ]
    }
}

fn writes(out: &mut String, table: &str, n: u64, from: u64) {
    for i in from..from + n {
        out.push_str(&format!(
            "INSERT INTO {table}(v) VALUES ('written row {i}');\n"
        ));
    }
}

fn reads(out: &mut String, table: &str, n: u64, from: u64) {
    for i in from..from + n {
        out.push_str(&format!(
            "SELECT v FROM {table} WHERE k = {};\n",
            1 + i % SEEDED
        ));
    }
}

/// The four workloads, their sizes multiplied by `scale` (1: the seed's).
pub(super) fn all(scale: f64) -> Vec<Workload> {
    let n = |x: u64| ((x as f64 * scale).round() as u64).max(1);
    let mut out = Vec::new();
    let mut script = String::new();
    writes(&mut script, "w_only", n(15_000), 0);
    out.push(Workload {
        name: "write-only",
        table: "w_only",
        script,
        statements: n(15_000),
    });
    let mut script = String::new();
    reads(&mut script, "r_only", n(15_000), 0);
    out.push(Workload {
        name: "read-only",
        table: "r_only",
        script,
        statements: n(15_000),
    });
    for (name, table, w, r) in [
        ("write-heavy", "w_heavy", 1_500, 200),
        ("read-heavy", "r_heavy", 200, 1_500),
    ] {
        let mut script = String::new();
        for round in 0..3 {
            writes(&mut script, table, n(w), round * n(w));
            reads(&mut script, table, n(r), round * n(r));
        }
        out.push(Workload {
            name,
            table,
            script,
            statements: 3 * (n(w) + n(r)),
        });
    }
    out
}

/// Writes each workload's script to `dir`; their paths, in order.
pub(super) fn write_scripts(dir: &Path, workloads: &[Workload]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    workloads
        .iter()
        .map(|w| {
            let path = dir.join(format!("{}.sql", w.name));
            std::fs::write(&path, &w.script)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// Runs `cmd` (its standard input `input`, its output discarded) and
/// returns the seconds it took; a failure or anything on standard error
/// fails the measurement.
fn timed(mut cmd: Command, input: Option<&str>, what: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let took = started.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("ERR") || err.contains("rror") {
        bail!("{what} failed ({}): {}", out.status, err.trim());
    }
    Ok(took)
}

/// Plain sqlite3 on a fresh database file in `dir`: seconds for the
/// script at `script`.
pub(super) fn sqlite3(dir: &Path, w: &Workload, script: &Path) -> anyhow::Result<f64> {
    let db = dir.join(format!("sqlite3-{}.db", w.name));
    for ext in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
    }
    let mut setup = Command::new("sqlite3");
    setup.arg(&db).args(w.setup());
    timed(setup, None, "sqlite3 (setup)")?;
    let text = std::fs::read_to_string(script)?;
    let mut run = Command::new("sqlite3");
    run.arg(&db);
    timed(run, Some(&text), &format!("sqlite3 < {}", script.display()))
}

/// tablix's shell in batch mode against the node whose API is `http`.
pub(super) fn tablix(http: &str, script: &Path) -> anyhow::Result<f64> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["sql", "--addr", http, "-f"]).arg(script);
    timed(cmd, None, &format!("tablix sql -f {}", script.display()))
}

/// rqlite's shell reading the script with `.read`, against `http`.
pub(super) fn rqlite(cli: &Path, http: &str, script: &Path) -> anyhow::Result<f64> {
    let (host, port) = http
        .rsplit_once(':')
        .with_context(|| format!("{http} is not host:port"))?;
    let mut cmd = Command::new(cli);
    cmd.args(["-H", host, "-p", port]);
    timed(
        cmd,
        Some(&format!(".read {}\n", script.display())),
        &format!("rqlite .read {}", script.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_workloads_have_its_sizes_and_mix() {
        let w = all(1.0);
        let names: Vec<_> = w.iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            ["write-only", "read-only", "write-heavy", "read-heavy"]
        );
        let count = |w: &Workload, verb: &str| {
            w.script.lines().filter(|l| l.starts_with(verb)).count() as u64
        };
        assert_eq!(count(&w[0], "INSERT"), 15_000);
        assert_eq!(count(&w[1], "SELECT"), 15_000);
        assert_eq!(
            (count(&w[2], "INSERT"), count(&w[2], "SELECT")),
            (4_500, 600)
        );
        assert_eq!(
            (count(&w[3], "INSERT"), count(&w[3], "SELECT")),
            (600, 4_500)
        );
        for x in &w {
            assert_eq!(x.script.lines().count() as u64, x.statements, "{}", x.name);
        }
        let small = all(0.01);
        assert_eq!(small[0].statements, 150);
    }
}
