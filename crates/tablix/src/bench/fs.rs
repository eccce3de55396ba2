//! `tablix bench fs`: the file system against ext4 on the same disk, in the
//! same run, with the programs the issue names (Bonnie++, Postmark) and a
//! metadata workload; and, when given its binary, libfuse's passthrough_hp
//! over the same disk: the fastest FUSE file system does the same work
//! there, so its figures are what FUSE itself costs.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::bench::Rng;
use crate::bench::daemon::Daemon;
use crate::bench::transport;
use crate::cli::FsBenchArgs;

/// Where a workload runs: plain ext4, a tablix mount served by a daemon,
/// or passthrough_hp's mount of a directory on ext4.
struct Target {
    label: String,
    dir: PathBuf,
    daemon: Option<Daemon>,
    peer: Option<Peer>,
    /// Bonnie++ runs here: size in MiB, and whether every write is fsync'ed.
    bonnie_runs: Vec<(u64, bool)>,
}

impl Target {
    fn ext4(base: &Path, bonnie_runs: Vec<(u64, bool)>) -> anyhow::Result<Target> {
        let dir = base.join("ext4");
        fresh_dir(&dir)?;
        Ok(Target {
            label: "ext4".into(),
            dir,
            daemon: None,
            peer: None,
            bonnie_runs,
        })
    }

    /// passthrough_hp (`bin`) serving `base/passthrough-src`, a directory
    /// on the same ext4, at `base/passthrough-mnt`, with its defaults
    /// (worker threads, splice, and the kernel's passthrough of reads and
    /// writes where it has it).
    fn passthrough(
        base: &Path,
        bin: &Path,
        bonnie_runs: Vec<(u64, bool)>,
    ) -> anyhow::Result<Target> {
        let src = base.join("passthrough-src");
        let mnt = base.join("passthrough-mnt");
        fresh_dir(&src)?;
        fresh_dir(&mnt)?;
        let peer = Peer::start(bin, &src, &mnt)?;
        Ok(Target {
            label: "passthrough_hp".into(),
            dir: mnt,
            daemon: None,
            peer: Some(peer),
            bonnie_runs,
        })
    }

    fn tablix(base: &Path, mode: &str, bonnie_run: (u64, bool)) -> anyhow::Result<Target> {
        let data = base.join(format!("tablix-{mode}-data"));
        let mnt = base.join(format!("tablix-{mode}-mnt"));
        let daemon = Daemon::start(&data, &mnt, mode, &[])?;
        Ok(Target {
            label: format!("tablix {mode}"),
            dir: mnt,
            daemon: Some(daemon),
            peer: None,
            bonnie_runs: vec![bonnie_run],
        })
    }

    /// The process serving the mount, for the FUSE round-trip probe.
    fn server(&self) -> Option<u32> {
        match (&self.daemon, &self.peer) {
            (Some(d), _) => Some(d.pid()),
            (None, Some(p)) => Some(p.child.id()),
            (None, None) => None,
        }
    }

    fn stop(self) -> anyhow::Result<()> {
        if let Some(d) = self.daemon {
            d.stop()
                .with_context(|| format!("stopping the {} daemon", self.label))?;
        }
        if let Some(p) = self.peer {
            p.stop()?;
        }
        Ok(())
    }
}

/// A FUSE file system of libfuse's examples, run in the foreground.
struct Peer {
    child: std::process::Child,
    mount: PathBuf,
}

impl Peer {
    fn start(bin: &Path, src: &Path, mnt: &Path) -> anyhow::Result<Peer> {
        let child = Command::new(bin)
            .arg("--foreground")
            .arg(src)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut peer = Peer {
            child,
            mount: mnt.to_path_buf(),
        };
        let began = Instant::now();
        while !is_fuse(mnt) {
            if let Some(status) = peer.child.try_wait()? {
                bail!("{} exited before mounting: {status}", bin.display());
            }
            if began.elapsed() > Duration::from_secs(10) {
                let _ = peer.child.kill();
                let _ = peer.child.wait();
                bail!(
                    "{} did not mount {} within 10 s",
                    bin.display(),
                    mnt.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(peer)
    }

    /// Unmounts, which ends the process; killed if it lingers.
    fn stop(mut self) -> anyhow::Result<()> {
        let status = Command::new("umount").arg(&self.mount).status()?;
        if !status.success() {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        let began = Instant::now();
        while self.child.try_wait()?.is_none() {
            if began.elapsed() > Duration::from_secs(10) {
                self.child.kill()?;
                self.child.wait()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Whether `dir` is the root of a FUSE mount.
fn is_fuse(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC)
}

fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

fn drop_caches() {
    // Best effort: needs root. Every target gets the same treatment.
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Bonnie++'s block figures: write, rewrite and read in KiB/s, seeks/s.
/// Infinity stands for bonnie++'s "+++++": done too fast to time. With
/// `durable`, bonnie++ fsyncs after every write (-b), the semantics of
/// tablix's sync mode.
fn bonnie(dir: &Path, mb: u64, durable: bool) -> anyhow::Result<[f64; 4]> {
    let out = Command::new("bonnie++")
        .arg("-d")
        .arg(dir)
        .args(["-s", &mb.to_string(), "-r", &(mb / 2).to_string()])
        .args(["-n", "0", "-f", "-q", "-u", "root"])
        .args(if durable { &["-b"][..] } else { &[][..] })
        .stderr(Stdio::null())
        .output()
        .context("running bonnie++ (apt install bonnie++)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("1.98,"))
        .with_context(|| format!("no CSV line from bonnie++: {text}"))?;
    let f: Vec<&str> = line.split(',').collect();
    let num = |i: usize| -> anyhow::Result<f64> {
        let v = f.get(i).copied().unwrap_or("");
        if v.starts_with('+') {
            return Ok(f64::INFINITY);
        }
        v.parse::<f64>()
            .with_context(|| format!("bonnie++ field {i} is {v:?}"))
    };
    Ok([num(11)?, num(13)?, num(17)?, num(19)?])
}

/// One file of `mb` MiB written in 1 MiB writes and fsync'ed once, then
/// read back in 1 MiB reads after the kernel's caches were dropped: MiB/s
/// of each. Bonnie++ reads back a file the kernel still caches (its
/// "+++++" at any size below RAM), so this is the block read that reaches
/// the file system. tablix's own page cache is not dropped.
fn cold_read(dir: &Path, mb: u64) -> anyhow::Result<[f64; 2]> {
    let path = dir.join("cold-read");
    let mut chunk = vec![0u8; 1 << 20];
    let mut rng = Rng::new(42);
    for word in chunk.chunks_mut(8) {
        word.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let start = Instant::now();
    let mut f =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    for i in 0..mb {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    let write = mb as f64 / start.elapsed().as_secs_f64();
    drop(f);
    drop_caches();
    let start = Instant::now();
    let mut f = std::fs::File::open(&path)?;
    let mut total = 0u64;
    loop {
        let n = f.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let read = total as f64 / f64::from(1 << 20) / start.elapsed().as_secs_f64();
    if total != mb << 20 {
        bail!("read {total} bytes of {} written", mb << 20);
    }
    std::fs::remove_file(&path)?;
    Ok([write, read])
}

/// Postmark's wall-clock time for the configured run, in seconds.
fn postmark(dir: &Path, files: u64, transactions: u64) -> anyhow::Result<f64> {
    let work = dir.join("postmark");
    fresh_dir(&work)?;
    let mut child = Command::new("postmark")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("running postmark (apt install postmark)")?;
    let script = format!(
        "set location {}\nset number {files}\nset transactions {transactions}\nset size 500 10000\nset seed 42\nrun\nquit\n",
        work.display()
    );
    let start = Instant::now();
    child
        .stdin
        .take()
        .context("postmark stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    let secs = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("transactions") {
        bail!("postmark failed: {text}");
    }
    std::fs::remove_dir_all(&work)?;
    Ok(secs)
}

/// A synthetic source tree (fixed seed): `files` files in directories of
/// 20, sizes log-uniform between 200 B and 40 KiB, packed as a tar.
pub(crate) fn source_tree(base: &Path, files: u64) -> anyhow::Result<PathBuf> {
    let tar = base.join(format!("tree-{files}.tar"));
    if tar.exists() {
        return Ok(tar);
    }
    let src = base.join("tree-src");
    fresh_dir(&src)?;
    let mut rng = Rng::new(42);
    for i in 0..files {
        let d = src.join(format!("src/mod{:03}/sub{}", i / 20 / 5, (i / 20) % 5));
        std::fs::create_dir_all(&d)?;
        let size = (200.0 * (200.0f64).powf(rng.unit())) as usize;
        let body: Vec<u8> = (0..size)
            .map(|j| b"abcdefghij klmnop\n"[(j + i as usize) % 18])
            .collect();
        std::fs::write(d.join(format!("file{i}.rs")), body)?;
    }
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()?;
    if !status.success() {
        bail!("tar failed to pack the tree");
    }
    std::fs::remove_dir_all(&src)?;
    Ok(tar)
}

fn timed(what: &str, cmd: &mut Command) -> anyhow::Result<f64> {
    let start = Instant::now();
    let status = cmd
        .stdout(Stdio::null())
        .status()
        .with_context(|| what.to_string())?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds for untar, find, du and rm -rf of the tree.
fn metadata(dir: &Path, tar: &Path) -> anyhow::Result<[f64; 4]> {
    let tree = dir.join("tree");
    fresh_dir(&tree)?;
    let untar = timed(
        "tar -x",
        Command::new("tar").arg("-xf").arg(tar).arg("-C").arg(&tree),
    )?;
    let find = timed(
        "find",
        Command::new("find").arg(&tree).arg("-type").arg("f"),
    )?;
    let du = timed("du", Command::new("du").arg("-s").arg(&tree))?;
    let rm = timed("rm -rf", Command::new("rm").arg("-rf").arg(&tree))?;
    Ok([untar, find, du, rm])
}

struct Results {
    label: String,
    /// Per Bonnie++ run (MiB, fsync per write): write, rewrite, read KiB/s
    /// and seeks/s.
    bonnie: Vec<((u64, bool), [f64; 4])>,
    /// MiB/s: sequential write, cold sequential read.
    cold: Option<[f64; 2]>,
    postmark: Option<f64>,
    meta: Option<[f64; 4]>,
    /// The FUSE transport's cost on this target's daemon, or why it was
    /// not measured.
    transport: Option<Result<transport::RoundTrip, String>>,
}

fn measure(t: &Target, a: &FsBenchArgs, tar: Option<&Path>) -> anyhow::Result<Results> {
    let wants = |w: &str| a.workloads.iter().any(|x| x == w);
    let mut r = Results {
        label: t.label.clone(),
        bonnie: Vec::new(),
        cold: None,
        postmark: None,
        meta: None,
        transport: None,
    };
    if wants("bonnie") {
        for &(mb, durable) in &t.bonnie_runs {
            drop_caches();
            eprintln!(
                "  {}: bonnie++ -s {mb}{}",
                t.label,
                if durable { " -b" } else { "" }
            );
            r.bonnie.push(((mb, durable), bonnie(&t.dir, mb, durable)?));
        }
    }
    if wants("read") {
        drop_caches();
        eprintln!("  {}: {} MiB written, read cold", t.label, a.read_mb);
        r.cold = Some(cold_read(&t.dir, a.read_mb)?);
    }
    if wants("postmark") {
        drop_caches();
        eprintln!("  {}: postmark", t.label);
        r.postmark = Some(postmark(&t.dir, a.postmark_files, a.postmark_transactions)?);
    }
    if let (true, Some(tar)) = (wants("meta"), tar) {
        drop_caches();
        eprintln!("  {}: untar/find/du/rm", t.label);
        r.meta = Some(metadata(&t.dir, tar)?);
    }
    if let Some(pid) = t.server() {
        eprintln!("  {}: FUSE round trip", t.label);
        r.transport = Some(transport::probe(pid, &t.dir, 5000, 3).map_err(|e| format!("{e:#}")));
    }
    Ok(r)
}

pub fn run(a: FsBenchArgs) -> anyhow::Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!("bench fs needs root (bonnie++ -u root, mounting, dropping caches)");
    }
    for m in &a.modes {
        if m != "sync" && m != "async" {
            bail!("unknown mode {m:?}: expected sync or async");
        }
    }
    for w in &a.workloads {
        if !["bonnie", "read", "postmark", "meta"].contains(&w.as_str()) {
            bail!("unknown workload {w:?}: expected bonnie, read, postmark or meta");
        }
    }
    if a.read_mb == 0 {
        bail!("--read-mb must be positive");
    }
    if let Some(bin) = &a.passthrough_hp
        && !bin.is_file()
    {
        bail!(
            "--passthrough-hp {}: no such file; build it in a clone of libfuse with `meson setup build && ninja -C build example/passthrough_hp`",
            bin.display()
        );
    }
    let base = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench/fs"));
    std::fs::create_dir_all(&base)?;
    let base = base.canonicalize()?;
    let tar = if a.workloads.iter().any(|w| w == "meta") {
        Some(source_tree(&base, a.tree_files)?)
    } else {
        None
    };
    let mut all = Vec::new();
    eprintln!("measuring ext4 in {}", base.display());
    let mut runs = Vec::new();
    for mode in &a.modes {
        let run = bonnie_run(&a, mode);
        if !runs.contains(&run) {
            runs.push(run);
        }
    }
    let t = Target::ext4(&base, runs.clone())?;
    all.push(measure(&t, &a, tar.as_deref())?);
    std::fs::remove_dir_all(&t.dir)?;
    if let Some(bin) = &a.passthrough_hp {
        eprintln!("measuring passthrough_hp over {}", base.display());
        let t = Target::passthrough(&base, bin, runs)?;
        let src = base.join("passthrough-src");
        let r = measure(&t, &a, tar.as_deref());
        t.stop()?;
        all.push(r?);
        std::fs::remove_dir_all(src)?;
    }
    for mode in &a.modes {
        eprintln!("measuring tablix {mode}");
        let t = Target::tablix(&base, mode, bonnie_run(&a, mode))?;
        let r = measure(&t, &a, tar.as_deref());
        t.stop()?;
        all.push(r?);
        std::thread::sleep(Duration::from_millis(200));
    }
    report(&all, &a);
    Ok(ExitCode::SUCCESS)
}

/// Sync mode is compared with ext4 fsyncing every write, at a smaller size.
fn bonnie_run(a: &FsBenchArgs, mode: &str) -> (u64, bool) {
    if mode == "sync" {
        (a.bonnie_sync_mb, true)
    } else {
        (a.bonnie_mb, false)
    }
}

fn report(all: &[Results], a: &FsBenchArgs) {
    let base = &all[0];
    let others = &all[1..];
    let header = |first: &str| {
        let mut h = format!("{first:<28}{:>14}", base.label);
        for o in others {
            h.push_str(&format!("{:>22}", o.label));
        }
        println!("{h}");
    };
    for (run, b) in &base.bonnie {
        let at_size: Vec<(&str, [f64; 4])> = others
            .iter()
            .filter_map(|o| {
                o.bonnie
                    .iter()
                    .find(|(r, _)| r == run)
                    .map(|(_, v)| (o.label.as_str(), *v))
            })
            .collect();
        println!(
            "\nBonnie++ 2.00 (-s {} MiB -f{}), KiB/s and seeks/s; ratio = column / ext4 (higher is better); inf = bonnie++'s +++++ (too fast to time)",
            run.0,
            if run.1 {
                " -b: fsync after every write"
            } else {
                ""
            }
        );
        let mut h = format!("{:<28}{:>14}", "", base.label);
        for (label, _) in &at_size {
            h.push_str(&format!("{label:>22}"));
        }
        println!("{h}");
        let names = [
            "sequential block write",
            "rewrite",
            "sequential block read",
            "random seeks",
        ];
        for (i, name) in names.iter().enumerate() {
            let mut line = format!("{name:<28}{:>14.0}", b[i]);
            for (_, ob) in &at_size {
                line.push_str(&format!("{:>14.0} ({:>5.2})", ob[i], ob[i] / b[i]));
            }
            println!("{line}");
        }
    }
    if let Some(c) = base.cold {
        println!(
            "\n{} MiB in 1 MiB writes, one fsync, then read after dropping the kernel's caches, MiB/s; ratio = column / ext4 (higher is better)",
            a.read_mb
        );
        header("");
        for (i, name) in ["sequential write", "sequential read, cold"]
            .iter()
            .enumerate()
        {
            let mut line = format!("{name:<28}{:>14.0}", c[i]);
            for o in others {
                if let Some(oc) = o.cold {
                    line.push_str(&format!("{:>14.0} ({:>5.2})", oc[i], oc[i] / c[i]));
                }
            }
            println!("{line}");
        }
    }
    if let Some(p) = base.postmark {
        println!(
            "\nPostmark ({} files, {} transactions, 500 B-10 KB), seconds; ratio = ext4's time / column's (throughput, higher is better)",
            a.postmark_files, a.postmark_transactions
        );
        header("");
        let mut line = format!("{:<28}{p:>14.2}", "total");
        for o in others {
            if let Some(op) = o.postmark {
                line.push_str(&format!("{op:>14.2} ({:>5.2})", p / op));
            }
        }
        println!("{line}");
    }
    if let Some(m) = base.meta {
        println!(
            "\nMetadata workload ({} files), seconds; ratio = column's time / ext4's (lower is better, target for tablix <= 2)",
            a.tree_files
        );
        header("");
        let names = ["tar -x", "find", "du -s", "rm -rf", "total"];
        let total = |v: &[f64; 4]| v.iter().sum::<f64>();
        for (i, name) in names.iter().enumerate() {
            let bv = if i < 4 { m[i] } else { total(&m) };
            let mut line = format!("{name:<28}{bv:>14.3}");
            for o in others {
                if let Some(om) = o.meta {
                    let ov = if i < 4 { om[i] } else { total(&om) };
                    line.push_str(&format!("{ov:>14.3} ({:>5.2})", ov / bv));
                }
            }
            println!("{line}");
        }
    }
    for o in others {
        match &o.transport {
            Some(Ok(t)) => {
                print!("\n{}: ", o.label);
                t.print();
            }
            Some(Err(e)) => println!("\n{}: FUSE round-trip probe not run: {e}", o.label),
            None => {}
        }
    }
}
