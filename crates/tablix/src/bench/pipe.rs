//! `tablix bench pipe`: database-backed pipes against kernel pipes in the
//! same run. Bandwidth: one thread writes `--mb` MiB in `--chunk`-byte
//! writes while another reads with `--chunk`-byte reads (LMbench bw_pipe
//! moves 64 KiB at a time). Latency: two threads bounce one byte through
//! two pipes (LMbench lat_pipe); the figure is one round trip.
//!
//! The tablix pipes are made as `tablix run`'s pipe() makes them: a pipe
//! file created in MOUNT/.tablix/pipes, opened again for writing, unlinked.
//!
//! On a small virtual machine a kernel pipe's figures depend mostly on
//! where its two ends run: on one CPU a wake-up is a context switch, across
//! CPUs an inter-processor interrupt that costs ten times more. Each
//! measurement is therefore made with the two threads on the same CPU, on
//! different CPUs, and left to the scheduler, and reported per placement.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::bench::daemon::Daemon;
use crate::bench::median;
use crate::bench::transport;
use crate::cli::PipeBenchArgs;

/// Makes a pipe: (read end, write end).
type MakePipe<'a> = &'a dyn Fn() -> anyhow::Result<(File, File)>;

fn kernel_pipe() -> anyhow::Result<(File, File)> {
    let (r, w) = nix::unistd::pipe()?;
    Ok((File::from(r), File::from(w)))
}

fn tablix_pipe(dir: &Path, serial: &std::cell::Cell<u64>) -> anyhow::Result<(File, File)> {
    let n = serial.get();
    serial.set(n + 1);
    let path = dir.join(format!("bench-{}-{n}", std::process::id()));
    use nix::fcntl::OFlag;
    // Created for reading, as the preload library does (std's OpenOptions
    // cannot create without write access).
    let r = nix::fcntl::open(
        &path,
        OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .with_context(|| format!("creating {}", path.display()))?;
    let r = File::from(r);
    let w = OpenOptions::new().write(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok((r, w))
}

/// Where the two threads of a measurement run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    SameCpu,
    SplitCpus,
    Free,
}

impl Placement {
    fn label(self) -> &'static str {
        match self {
            Placement::SameCpu => "same CPU",
            Placement::SplitCpus => "two CPUs",
            Placement::Free => "scheduler's choice",
        }
    }

    /// Pins the calling thread for role 0 or 1.
    fn pin(self, role: usize) {
        let cpu = match self {
            Placement::Free => return,
            Placement::SameCpu => 0,
            Placement::SplitCpus => role,
        };
        if let Err(e) = transport::pin_self(&[cpu]) {
            eprintln!("cannot pin a thread to CPU {cpu}: {e}");
        }
    }
}

/// MB/s (10^6 bytes) moving `total` bytes in `chunk`-byte writes and reads.
fn bandwidth(make: MakePipe, total: u64, chunk: usize, place: Placement) -> anyhow::Result<f64> {
    let (r, mut w) = make()?;
    let reader = std::thread::spawn(move || -> anyhow::Result<f64> {
        place.pin(0);
        read_all(r, total, chunk)
    });
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        place.pin(1);
        let buf = vec![0x5au8; chunk];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk as u64) as usize;
            w.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let secs = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    Ok(total as f64 / secs / 1e6)
}

/// Reads `total` bytes; returns the seconds from the first byte's request.
fn read_all(mut r: File, total: u64, chunk: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut buf = vec![0u8; chunk];
    let mut got = 0u64;
    while got < total {
        let n = r.read(&mut buf)?;
        if n == 0 {
            bail!("end of file after {got} of {total} bytes");
        }
        got += n as u64;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Microseconds per round trip of one byte.
fn latency(make: MakePipe, round_trips: u64, place: Placement) -> anyhow::Result<f64> {
    let (mut a_r, mut a_w) = make()?;
    let (mut b_r, mut b_w) = make()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        place.pin(1);
        let mut byte = [0u8; 1];
        for _ in 0..round_trips {
            a_r.read_exact(&mut byte)?;
            b_w.write_all(&byte)?;
        }
        Ok(())
    });
    let pinger = std::thread::spawn(move || -> std::io::Result<f64> {
        place.pin(0);
        let mut byte = [7u8; 1];
        let start = Instant::now();
        for _ in 0..round_trips {
            a_w.write_all(&byte)?;
            b_r.read_exact(&mut byte)?;
        }
        Ok(start.elapsed().as_secs_f64())
    });
    let secs = pinger
        .join()
        .map_err(|_| anyhow::anyhow!("ping thread panicked"))??;
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    Ok(secs / round_trips as f64 * 1e6)
}

/// Transactions and bytes the daemon recorded for pipes so far.
fn pipe_counters(http: &str) -> anyhow::Result<(i64, i64)> {
    let url = format!("http://{http}/db/query");
    let body: serde_json::Value = ureq::get(&url)
        .query(
            "q",
            "SELECT coalesce(sum(writes + reads), 0), coalesce(sum(total_in), 0) FROM pipes",
        )
        .call()?
        .body_mut()
        .read_json()?;
    let row = &body["results"][0]["values"][0];
    Ok((row[0].as_i64().unwrap_or(-1), row[1].as_i64().unwrap_or(-1)))
}

pub fn run(args: PipeBenchArgs) -> anyhow::Result<ExitCode> {
    let base = args
        .dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("target/bench/pipe"));
    std::fs::create_dir_all(&base)?;
    let extra = ["--fuse-threads".to_string(), args.fuse_threads.to_string()];
    let daemon = Daemon::start(&base.join("data"), &base.join("mnt"), "sync", &extra)?;
    let result = measure(&args, &daemon);
    let stopped = daemon.stop();
    result?;
    stopped?;
    Ok(ExitCode::SUCCESS)
}

fn measure(args: &PipeBenchArgs, daemon: &Daemon) -> anyhow::Result<()> {
    let dir = daemon.mount.join(".tablix").join("pipes");
    let serial = std::cell::Cell::new(0u64);
    let tablix = || tablix_pipe(&dir, &serial);
    let total = args.mb << 20;
    let chunk = args.chunk as usize;
    println!(
        "pipes: {} MiB in {chunk}-byte transfers, {} one-byte round trips; {} runs each, medians",
        args.mb, args.round_trips, args.repeat
    );
    let placements = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        vec![Placement::SameCpu, Placement::SplitCpus, Placement::Free]
    } else {
        vec![Placement::SameCpu]
    };
    let mut rows = Vec::new();
    for place in placements {
        let (mut bw_k, mut bw_t, mut lat_k, mut lat_t) = (vec![], vec![], vec![], vec![]);
        for run in 1..=args.repeat {
            bw_k.push(bandwidth(&kernel_pipe, total, chunk, place)?);
            bw_t.push(bandwidth(&tablix, total, chunk, place)?);
            lat_k.push(latency(&kernel_pipe, args.round_trips, place)?);
            lat_t.push(latency(&tablix, args.round_trips, place)?);
            println!(
                "  {} run {run}: bandwidth kernel {:.0} MB/s, tablix {:.0} MB/s; latency kernel {:.1} us, tablix {:.1} us",
                place.label(),
                bw_k[bw_k.len() - 1],
                bw_t[bw_t.len() - 1],
                lat_k[lat_k.len() - 1],
                lat_t[lat_t.len() - 1]
            );
        }
        rows.push((
            place,
            median(bw_k),
            median(bw_t),
            median(lat_k),
            median(lat_t),
        ));
    }
    // Every byte went through a transaction: the daemon's counters (of
    // pipes still open) are checked on one more bandwidth run kept open.
    let (r, w) = tablix()?;
    let (tx_before, bytes_before) = pipe_counters(&daemon.http)?;
    let probe = 8 << 20;
    {
        let (mut r, mut w) = (r.try_clone()?, w.try_clone()?);
        let writer = std::thread::spawn(move || w.write_all(&vec![1u8; probe]));
        let mut buf = vec![0u8; chunk];
        let mut got = 0;
        while got < probe {
            got += r.read(&mut buf)?;
        }
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
    }
    let (tx_after, bytes_after) = pipe_counters(&daemon.http)?;
    drop((r, w));
    let transport = transport::probe(daemon.pid(), &daemon.mount, 5000, args.repeat as usize);
    println!();
    println!(
        "{:<20} {:>14} {:>14} {:>7}   {:>12} {:>12} {:>7}",
        "threads on", "kernel MB/s", "tablix MB/s", "ratio", "kernel us", "tablix us", "ratio"
    );
    for (place, bk, bt, lk, lt) in &rows {
        println!(
            "{:<20} {:>14.0} {:>14.0} {:>7.3}   {:>12.1} {:>12.1} {:>7.2}",
            place.label(),
            bk,
            bt,
            bt / bk,
            lk,
            lt,
            lt / lk
        );
    }
    println!(
        "through the database: {} bytes in {} transactions on a probe of {probe} bytes",
        bytes_after - bytes_before,
        tx_after - tx_before
    );
    match transport {
        Ok(t) => {
            t.print();
            // The reads are parked before the bytes arrive, so a round
            // trip's critical path holds two requests: each end's write,
            // whose handling also answers the other end's parked read.
            println!(
                "a one-byte round trip waits for at least 2 FUSE requests (each end's write): {:.0} us at the cheapest placement, before any transaction",
                2.0 * t.same_cpu
            );
        }
        Err(e) => println!("FUSE round-trip probe not run: {e:#}"),
    }
    for (place, bk, bt, lk, lt) in &rows {
        println!(
            "targets ({}): bandwidth ratio >= 0.5 {}, latency ratio <= 5 {}",
            place.label(),
            if bt / bk >= 0.5 { "met" } else { "missed" },
            if lt / lk <= 5.0 { "met" } else { "missed" }
        );
    }
    Ok(())
}
