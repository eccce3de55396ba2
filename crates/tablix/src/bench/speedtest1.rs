//! SQLite's own benchmark, `test/speedtest1.c`, under every page cache.
//!
//! speedtest1 is built from its source against the SQLite that tablix
//! bundles (the same version, compiled the same way for every
//! configuration) and the page cache as a C library
//! (`libtablix_pcache.a`). `bench-c/speedtest1_pcache.c` installs the
//! policy named by `$TABLIX_PCACHE` before `main`; without it SQLite keeps
//! its own cache. Each configuration runs once under callgrind, dumping its
//! counts before every test, so each test's instructions are its own and
//! deterministic; a second, plain run reports the page-cache misses of the
//! main connection (`--stats`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::pcache::CONFIGS;

/// `--cachesize` runs: SQLite's default cache, and a small one.
const CACHE_SIZES: [Option<u32>; 2] = [None, Some(200)];

/// A test is over its budget when it costs more than this many times the
/// instructions it costs with SQLite's cache.
const OVER: f64 = 1.05;

/// Where speedtest1.c comes from when not given: SQLite's repository at the
/// tag of the bundled version.
fn source_url(version: &str) -> String {
    format!("https://raw.githubusercontent.com/sqlite/sqlite/version-{version}/test/speedtest1.c")
}

pub struct Options<'a> {
    pub dir: &'a Path,
    /// speedtest1.c, if given.
    pub source: Option<&'a Path>,
    /// The page cache as a static library.
    pub library: &'a Path,
    /// speedtest1's `--size`.
    pub size: u32,
}

/// The bundled SQLite's source directory and version.
fn sqlite_source() -> anyhow::Result<(PathBuf, String)> {
    let Some(dir) = option_env!("TABLIX_SQLITE_SOURCE") else {
        bail!("this binary was built without the bundled SQLite's source path");
    };
    let dir = PathBuf::from(dir);
    let header = std::fs::read_to_string(dir.join("sqlite3.h"))
        .with_context(|| format!("reading {}/sqlite3.h", dir.display()))?;
    let version = header
        .lines()
        .find_map(|l| l.strip_prefix("#define SQLITE_VERSION "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .context("no SQLITE_VERSION in sqlite3.h")?;
    Ok((dir, version))
}

/// speedtest1.c: the given file, else one fetched before for this SQLite
/// version, else fetched now.
fn speedtest1_source(o: &Options, version: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = o.source {
        if !p.is_file() {
            bail!("{} is not a file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let cached = o.dir.join(format!("speedtest1-{version}.c"));
    if cached.is_file() {
        return Ok(cached);
    }
    let url = source_url(version);
    eprintln!("fetching {url}");
    let partial = o.dir.join(format!("speedtest1-{version}.c.part"));
    let st = Command::new("curl")
        .args([
            "--fail",
            "--silent",
            "--show-error",
            "--location",
            "--output",
        ])
        .arg(&partial)
        .arg(&url)
        .status()
        .context("running curl")?;
    if !st.success() {
        let _ = std::fs::remove_file(&partial);
        bail!("could not fetch {url}; give SQLite's test/speedtest1.c with --speedtest1 FILE");
    }
    std::fs::rename(&partial, &cached)?;
    Ok(cached)
}

fn run_cc(args: &[&std::ffi::OsStr], what: &str) -> anyhow::Result<()> {
    let out = Command::new("cc")
        .args(args)
        .output()
        .context("running cc (install a C compiler)")?;
    if !out.status.success() {
        bail!("{what} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Builds speedtest1 with the bundled SQLite and the page-cache library.
fn build(o: &Options) -> anyhow::Result<(PathBuf, String)> {
    let (sqlite, version) = sqlite_source()?;
    if !o.library.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p tablix-pcache --target-dir target/pcache-c` (make bench-pcache does)",
            o.library.display()
        );
    }
    let source = speedtest1_source(o, &version)?;
    let work = o.dir.join("speedtest1-build");
    std::fs::create_dir_all(&work)?;
    std::fs::write(
        work.join("speedtest1_pcache.c"),
        include_str!("../../bench-c/speedtest1_pcache.c"),
    )?;
    std::fs::write(
        work.join("tablix_pcache.h"),
        include_str!("../../../tablix-pcache/include/tablix_pcache.h"),
    )?;
    // SQLite itself takes a while to compile: once per version.
    let object = work.join(format!("sqlite3-{version}.o"));
    if !object.is_file() {
        eprintln!("compiling SQLite {version}");
        let partial = work.join("sqlite3.o.part");
        run_cc(
            &[
                "-O2".as_ref(),
                "-c".as_ref(),
                sqlite.join("sqlite3.c").as_os_str(),
                "-o".as_ref(),
                partial.as_os_str(),
            ],
            "compiling sqlite3.c",
        )?;
        std::fs::rename(&partial, &object)?;
    }
    let exe = work.join("speedtest1");
    let include = format!("-I{}", sqlite.display());
    let include_here = format!("-I{}", work.display());
    run_cc(
        &[
            "-O2".as_ref(),
            include.as_ref(),
            include_here.as_ref(),
            source.as_os_str(),
            work.join("speedtest1_pcache.c").as_os_str(),
            object.as_os_str(),
            o.library.as_os_str(),
            "-lpthread".as_ref(),
            "-ldl".as_ref(),
            "-lm".as_ref(),
            "-o".as_ref(),
            exe.as_os_str(),
        ],
        "building speedtest1",
    )?;
    Ok((exe, version))
}

/// One configuration's figures for one cache size.
struct Run {
    /// (test name, instructions), in test order.
    tests: Vec<(String, u64)>,
    /// Page-cache misses of the main connection.
    misses: u64,
}

fn args(size: u32, cache: Option<u32>, db: &Path) -> Vec<String> {
    let mut a = vec!["--size".to_string(), size.to_string()];
    if let Some(c) = cache {
        a.push("--cachesize".into());
        a.push(c.to_string());
    }
    a.push(db.display().to_string());
    a
}

fn fresh(db: &Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// Runs `config` at `cache`: under callgrind for each test's instructions,
/// then plainly for the misses.
fn run(
    exe: &Path,
    work: &Path,
    config: &str,
    size: u32,
    cache: Option<u32>,
) -> anyhow::Result<Run> {
    let tag = format!(
        "{config}-{}",
        cache.map_or("default".into(), |c| c.to_string())
    );
    let dir = work.join(&tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("speedtest1.db");
    let policy = if config == "sqlite" { "" } else { config };
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!(
            "--callgrind-out-file={}",
            dir.join("cg.out").display()
        ))
        .args([
            "--dump-before=speedtest1_begin_test",
            "--dump-before=speedtest1_final",
        ])
        .arg(exe)
        .args(args(size, cache, &db))
        .env("TABLIX_PCACHE", policy)
        .output()
        .context("running valgrind (install it: apt-get install valgrind)")?;
    if !out.status.success() {
        bail!(
            "speedtest1 under callgrind ({tag}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let names = test_names(&String::from_utf8_lossy(&out.stdout));
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let is_dump = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("cg.out"));
        if is_dump {
            let text = std::fs::read_to_string(&path)?;
            if let Some(p) = parse_dump(&text) {
                parts.push(p);
            }
        }
    }
    parts.sort_unstable();
    // Part 1 runs up to the first test; part k + 1 is test k (up to the
    // next test's start, or the final report).
    let counts: Vec<u64> = parts.iter().skip(1).map(|&(_, n)| n).collect();
    if counts.len() < names.len() {
        bail!(
            "{tag}: {} tests but {} callgrind dumps",
            names.len(),
            counts.len()
        );
    }
    fresh(&db);
    let plain = Command::new(exe)
        .arg("--stats")
        .args(args(size, cache, &db))
        .env("TABLIX_PCACHE", policy)
        .output()
        .context("running speedtest1")?;
    if !plain.status.success() {
        bail!(
            "speedtest1 ({tag}) failed: {}",
            String::from_utf8_lossy(&plain.stderr)
        );
    }
    let misses = String::from_utf8_lossy(&plain.stdout)
        .lines()
        .find_map(|l| l.split_once("Page cache misses:"))
        .and_then(|(_, n)| n.trim().parse().ok())
        .with_context(|| format!("{tag}: no page cache misses in speedtest1's --stats"))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Run {
        tests: names.into_iter().zip(counts).collect(),
        misses,
    })
}

/// speedtest1's test lines, `" 100 - 25000 INSERTs into table ...... 0.1s"`,
/// as `"100 - 25000 INSERTs into table"`.
fn test_names(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| {
            let t = l.trim_start();
            let (num, rest) = t.split_once(" - ")?;
            num.parse::<u32>().ok()?;
            let name = rest.split("..").next().unwrap_or(rest).trim_end();
            Some(format!("{num} - {name}"))
        })
        .collect()
}

/// A callgrind dump's part number and instruction count.
fn parse_dump(text: &str) -> Option<(u32, u64)> {
    let mut part = None;
    let mut total = None;
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("part: ") {
            part = p.trim().parse().ok();
        } else if let Some(n) = line.strip_prefix("summary: ") {
            total = n.trim().parse().ok();
        }
        if part.is_some() && total.is_some() {
            break;
        }
    }
    Some((part?, total?))
}

pub fn suite(o: &Options) -> anyhow::Result<()> {
    let (exe, version) = build(o)?;
    let work = exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| o.dir.to_path_buf());
    for cache in CACHE_SIZES {
        // Two configurations at a time: callgrind runs one thread each.
        let mut runs: Vec<Option<Run>> = (0..CONFIGS.len()).map(|_| None).collect();
        let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
        for chunk in (0..CONFIGS.len())
            .collect::<Vec<_>>()
            .chunks(parallel.max(1))
        {
            let results: Vec<(usize, anyhow::Result<Run>)> = std::thread::scope(|s| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|&c| {
                        let (exe, work) = (&exe, &work);
                        (
                            c,
                            s.spawn(move || run(exe, work, CONFIGS[c], o.size, cache)),
                        )
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(c, h)| {
                        (
                            c,
                            h.join()
                                .unwrap_or_else(|_| Err(anyhow::anyhow!("a run panicked"))),
                        )
                    })
                    .collect()
            });
            for (c, r) in results {
                runs[c] = Some(r?);
                eprintln!("speedtest1 {} cache {:?} done", CONFIGS[c], cache);
            }
        }
        let runs: Vec<Run> = runs.into_iter().flatten().collect();
        report(&runs, &version, o.size, cache)?;
    }
    Ok(())
}

fn report(runs: &[Run], version: &str, size: u32, cache: Option<u32>) -> anyhow::Result<()> {
    let base = &runs[0];
    for r in &runs[1..] {
        if r.tests.len() != base.tests.len() {
            bail!("the configurations ran different tests");
        }
    }
    println!(
        "\nspeedtest1 (SQLite {version}'s test/speedtest1.c, --size {size}, {}): instructions of each test under callgrind / with SQLite's own cache",
        cache.map_or("default cache size".to_string(), |c| format!(
            "--cachesize {c}"
        ))
    );
    print!("{:<56} {:>12}", "test", "sqlite Minstr");
    for c in &CONFIGS[1..] {
        print!(" {c:>9}");
    }
    println!();
    let mut totals = vec![0u64; runs.len()];
    let mut over = vec![0usize; runs.len()];
    let mut worst = vec![0f64; runs.len()];
    for (t, (name, b)) in base.tests.iter().enumerate() {
        print!("{:<56} {:>12.1}", truncate(name, 56), *b as f64 / 1e6);
        for (c, r) in runs.iter().enumerate() {
            let n = r.tests[t].1;
            totals[c] += n;
            if c == 0 {
                continue;
            }
            let ratio = n as f64 / (*b).max(1) as f64;
            if ratio > OVER {
                over[c] += 1;
            }
            worst[c] = worst[c].max(ratio);
            print!(" {ratio:>9.3}");
        }
        println!();
    }
    print!("{:<56} {:>12.1}", "total", totals[0] as f64 / 1e6);
    for t in &totals[1..] {
        print!(" {:>9.3}", *t as f64 / totals[0].max(1) as f64);
    }
    println!();
    print!("{:<56} {:>12}", "worst test", "");
    for w in &worst[1..] {
        print!(" {w:>9.3}");
    }
    println!();
    print!("{:<56} {:>12}", format!("tests over {OVER}"), "");
    for n in &over[1..] {
        print!(" {n:>9}");
    }
    println!();
    print!(
        "{:<56} {:>12}",
        "page cache misses (main connection)", base.misses
    );
    for r in &runs[1..] {
        print!(" {:>9.3}", r.misses as f64 / base.misses.max(1) as f64);
    }
    println!();
    Ok(())
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_lines_and_dumps_are_parsed() {
        let out = "-- Speedtest1 for SQLite 3.54.1\n \
             100 - 25000 INSERTs into table with no index.................    0.095s\n \
             990 - ANALYZE................................................    0.010s\n \
                   TOTAL.......................................................    1.168s\n";
        assert_eq!(
            test_names(out),
            vec![
                "100 - 25000 INSERTs into table with no index",
                "990 - ANALYZE"
            ]
        );
        let dump = "version: 1\ncmd: ./speedtest1\npart: 7\ndesc: Trigger: --dump-before=speedtest1_begin_test\nevents: Ir\nsummary: 107625241\ntotals: 107625241\n";
        assert_eq!(parse_dump(dump), Some((7, 107_625_241)));
        assert_eq!(parse_dump("part: 3\n"), None);
        assert!(source_url("3.54.1").ends_with("/version-3.54.1/test/speedtest1.c"));
    }
}
