//! `tablix bench`: benchmarks as programs, reporting ratios against a
//! baseline measured in the same run on the same machine.

mod answer;
mod cluster;
mod daemon;
mod fs;
mod hits;
mod hostile;
mod insert;
mod load;
mod log;
mod pcache;
mod pipe;
mod raft;
mod speed;
mod speedtest1;
mod tps;
mod transport;
mod workloads;

use std::process::ExitCode;

use crate::cli::{BenchArgs, BenchWhich};

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.which {
        BenchWhich::Insert(a) => insert::run(a),
        BenchWhich::Tps(a) => tps::run(a),
        BenchWhich::Log(a) => log::run(a),
        BenchWhich::Raft(a) => raft::run(a),
        BenchWhich::Cluster(a) => cluster::run(a),
        BenchWhich::Fs(a) => fs::run(a),
        BenchWhich::Pipe(a) => pipe::run(a),
        BenchWhich::Hostile(a) => hostile::run(a),
        BenchWhich::Pcache(a) => pcache::run(a),
        BenchWhich::PcacheWorker(a) => pcache::worker(a),
        BenchWhich::TpsStock(a) => tps::stock_worker(a),
    }
}

/// Runs `tablix bench <command> <args>` in a child process (a measurement
/// that needs a process of its own, such as another page cache) and
/// parses the JSON it prints.
pub(crate) fn in_child(command: &str, args: &[String]) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("bench")
        .arg(command)
        .args(args)
        .output()
        .with_context(|| format!("starting `bench {command}`"))?;
    if !out.status.success() {
        anyhow::bail!(
            "`bench {command}` {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("the output of `bench {command}`"))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A small deterministic generator, so every configuration sees the same
/// sequence of keys.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
