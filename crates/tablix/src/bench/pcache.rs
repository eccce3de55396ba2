//! `tablix bench pcache`: every page-cache policy against SQLite's built-in
//! cache, each configuration in its own process (the page cache is chosen
//! once per process, before SQLite initialises).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use serde_json::json;

use super::{hits, median, speed, speedtest1};
use crate::cli::{PcacheBenchArgs, PcacheChoice, PcacheWorkerArgs, Suite, parse_pcache};

/// The configurations measured, SQLite's own cache first.
pub(super) const CONFIGS: &[&str] = &[
    "sqlite",
    "lru",
    "lfu-hist",
    "s3-fifo",
    "s3-lru",
    "w-tinylfu",
];

/// Runs one configuration of one suite in a child process and parses its
/// JSON answer. `extra` holds further `--name value` pairs.
fn spawn(
    config: &str,
    suite: &str,
    dir: &Path,
    extra: &[(&str, String)],
) -> anyhow::Result<serde_json::Value> {
    let mut args: Vec<String> = vec![
        "--pcache".into(),
        config.into(),
        "--suite".into(),
        suite.into(),
        "--dir".into(),
        dir.display().to_string(),
    ];
    for (name, value) in extra {
        args.push(format!("--{name}"));
        args.push(value.clone());
    }
    super::in_child("pcache-worker", &args)
}

pub fn worker(a: PcacheWorkerArgs) -> anyhow::Result<ExitCode> {
    a.pcache.install()?;
    let answer = match a.suite {
        Suite::Speed => {
            // The fastest of three runs on fresh databases: scheduling and
            // cache noise only ever add time.
            let mut best = speed::run(&a.dir, a.rows)?;
            for _ in 1..3 {
                for (b, t) in best.iter_mut().zip(speed::run(&a.dir, a.rows)?) {
                    *b = b.min(t);
                }
            }
            json!({ "seconds": best })
        }
        Suite::Hits => {
            let db = a.dir.join(format!("hits-{}.db", a.rows));
            let c = hits::run(&db, a.budget, &a.pattern, a.lookups)?;
            json!({ "hits": c.hits, "misses": c.misses, "scan_hits": c.scan_hits, "scan_misses": c.scan_misses })
        }
        Suite::Ops => json!({ "ns": ops(a.pcache)? }),
        Suite::Speedtest1 | Suite::All => bail!("a worker runs one of speed, hits and ops"),
    };
    println!("{answer}");
    Ok(ExitCode::SUCCESS)
}

pub fn run(a: PcacheBenchArgs) -> anyhow::Result<ExitCode> {
    let dir: PathBuf = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    for c in CONFIGS {
        parse_pcache(c).map_err(anyhow::Error::msg)?;
    }
    if matches!(a.suite, Suite::Speed | Suite::All) {
        speed_suite(&dir, &a)?;
    }
    if matches!(a.suite, Suite::Ops | Suite::All) {
        ops_suite(&dir, &a)?;
    }
    if matches!(a.suite, Suite::Hits | Suite::All) {
        hit_suite(&dir, &a)?;
    }
    if matches!(a.suite, Suite::Speedtest1 | Suite::All) {
        speedtest1::suite(&speedtest1::Options {
            dir: &dir,
            source: a.speedtest1.as_deref(),
            library: &a.pcache_lib,
            size: a.speedtest1_size,
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

fn speed_suite(dir: &Path, a: &PcacheBenchArgs) -> anyhow::Result<()> {
    // times[config][workload] = seconds of each round
    let mut times = vec![vec![Vec::new(); speed::WORKLOADS.len()]; CONFIGS.len()];
    for round in 0..a.repeat.max(1) {
        // Rotate the order each round so no configuration always runs first.
        for k in 0..CONFIGS.len() {
            let c = (k + round) % CONFIGS.len();
            let j = spawn(CONFIGS[c], "speed", dir, &[("rows", a.rows.to_string())])?;
            let secs = j["seconds"].as_array().context("no seconds")?;
            for (w, s) in secs.iter().enumerate() {
                times[c][w].push(s.as_f64().unwrap_or(f64::NAN));
            }
        }
        eprintln!("speed round {}/{} done", round + 1, a.repeat);
    }
    println!(
        "\nspeed suite: {} rows per table, cache holds the working set; each round's time is the fastest of 3 runs in one process, then the median of {} rounds; ratio = time / time with SQLite's own cache",
        a.rows, a.repeat
    );
    let per_config: Vec<Vec<f64>> = times
        .iter()
        .map(|c| c.iter().map(|t| median(t.clone())).collect())
        .collect();
    ratio_table("sqlite ms", 1e3, &per_config);
    if a.instructions {
        instruction_counts(dir, a)?;
    }
    Ok(())
}

/// Runs each configuration's speed suite once under callgrind and reports
/// every workload's inclusive instruction count against SQLite's cache.
fn instruction_counts(dir: &Path, a: &PcacheBenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let symbols = speed::symbols();
    let mut counts: Vec<Vec<f64>> = Vec::new();
    for c in CONFIGS {
        let out = dir.join(format!("callgrind.{c}.out"));
        let st = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&exe)
            .args([
                "bench",
                "pcache-worker",
                "--pcache",
                c,
                "--suite",
                "speed",
                "--dir",
            ])
            .arg(dir)
            .args(["--rows", &a.instruction_rows.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .context("running valgrind (install it: apt-get install valgrind)")?;
        if !st.success() {
            bail!("callgrind run for {c} failed");
        }
        let ann = Command::new("callgrind_annotate")
            .args(["--inclusive=yes", "--threshold=100"])
            .arg(&out)
            .output()
            .context("running callgrind_annotate")?;
        let text = String::from_utf8_lossy(&ann.stdout);
        let mut row = Vec::new();
        for sym in &symbols {
            let n = text
                .lines()
                .find(|l| l.contains(&format!(":{sym} ")) || l.ends_with(&format!(":{sym}")))
                .and_then(|l| l.split_whitespace().next())
                .map(|n| n.replace(',', ""))
                .and_then(|n| n.parse::<f64>().ok())
                .with_context(|| format!("no count for {sym} in the {c} profile"))?;
            row.push(n);
        }
        counts.push(row);
        eprintln!("callgrind {c} done");
    }
    println!(
        "\ninstructions per workload under callgrind ({} rows, one run each); ratio = instructions / instructions with SQLite's own cache",
        a.instruction_rows
    );
    ratio_table("sqlite Minstr", 1e-6, &counts);
    Ok(())
}

/// Prints one row per speed workload: SQLite's figure (scaled by `scale`)
/// and every other configuration's as a ratio to it, then each one's worst
/// ratio. `values[config][workload]`, with SQLite's cache first.
fn ratio_table(base_label: &str, scale: f64, values: &[Vec<f64>]) {
    print!("{:<18} {base_label:>13}", "workload");
    for c in &CONFIGS[1..] {
        print!(" {c:>10}");
    }
    println!();
    let mut worst = vec![0.0f64; values.len()];
    for (w, name) in speed::WORKLOADS.iter().enumerate() {
        let base = values[0][w];
        print!("{name:<18} {:>13.1}", base * scale);
        for (c, v) in values.iter().enumerate().skip(1) {
            let r = v[w] / base;
            worst[c] = worst[c].max(r);
            print!(" {r:>10.3}");
        }
        println!();
    }
    print!("{:<18} {:>13}", "worst ratio", "");
    for w in &worst[1..] {
        print!(" {w:>10.3}");
    }
    println!();
}

fn hit_suite(dir: &Path, a: &PcacheBenchArgs) -> anyhow::Result<()> {
    let db = hits::prepare(dir, a.hit_rows)?;
    let pages = rusqlite::Connection::open(&db)?
        .query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0))?;
    println!(
        "\nhit ratios: {} rowid lookups after {} warm-up, {} rows in {} pages; '+scan' adds a full table scan every {} lookups",
        a.lookups,
        a.lookups / 5,
        a.hit_rows,
        pages,
        (a.lookups / 10).max(1)
    );
    println!(
        "lookup misses relative to SQLite's own cache (lower is better), lookup hit ratio in parentheses;"
    );
    println!("'total' is the same ratio counting the scans' own misses too");
    print!("{:<15} {:>6} {:>18}", "pattern", "budget", "sqlite");
    for c in &CONFIGS[1..] {
        print!(" {c:>18}");
    }
    print!(" {:>14}", "s3-fifo total");
    println!();
    for pattern in hits::PATTERNS {
        for budget in hits::BUDGETS {
            let mut cells = Vec::new();
            for c in CONFIGS {
                let j = spawn(
                    c,
                    "hits",
                    dir,
                    &[
                        ("rows", a.hit_rows.to_string()),
                        ("budget", budget.to_string()),
                        ("pattern", (*pattern).into()),
                        ("lookups", a.lookups.to_string()),
                    ],
                )?;
                let get = |k: &str| j[k].as_i64().unwrap_or(0) as f64;
                let (h, m) = (get("hits"), get("misses"));
                cells.push((m, h / (h + m).max(1.0), m + get("scan_misses")));
            }
            let base = cells[0].0.max(1.0);
            print!(
                "{pattern:<15} {:>5}% {:>9} ({:>5.1}%)",
                budget,
                cells[0].0,
                cells[0].1 * 100.0
            );
            for (m, ratio, _) in &cells[1..] {
                print!(" {:>9.3} ({:>5.1}%)", m / base, ratio * 100.0);
            }
            print!(" {:>14.3}", cells[3].2 / cells[0].2.max(1.0));
            println!();
        }
    }
    Ok(())
}

/// Nanoseconds per fetch+unpin pair on resident pages, calling the methods
/// table directly as the pager does (SQLite's own through GETPCACHE2).
fn ops(choice: PcacheChoice) -> anyhow::Result<f64> {
    let m = match choice {
        PcacheChoice::Sqlite => {
            tablix_pcache::builtin_methods().context("SQLite already initialised")?
        }
        PcacheChoice::Tablix(p) => tablix_pcache::methods(p),
    };
    tablix_pcache::measure_fetch_unpin(&m, 2000, 20_000_000).context("incomplete methods table")
}

fn ops_suite(dir: &Path, a: &PcacheBenchArgs) -> anyhow::Result<()> {
    let mut ns = vec![Vec::new(); CONFIGS.len()];
    for round in 0..a.repeat.max(1) {
        for k in 0..CONFIGS.len() {
            let c = (k + round) % CONFIGS.len();
            let j = spawn(CONFIGS[c], "ops", dir, &[])?;
            ns[c].push(j["ns"].as_f64().unwrap_or(f64::NAN));
        }
    }
    println!(
        "
fetch+unpin of a resident page, called directly, median of {} rounds",
        a.repeat
    );
    let base = median(ns[0].clone());
    for (c, v) in CONFIGS.iter().zip(ns) {
        let m = median(v);
        println!("{c:<10} {m:>7.1} ns  {:>6.3}", m / base);
    }
    Ok(())
}
