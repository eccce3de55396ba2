//! Command-line syntax.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "tablix",
    version,
    about = "Operating-system state as rows in SQLite"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon in the foreground.
    Up(Box<UpArgs>),
    /// Run SQL against a running daemon (a shell modelled on sqlite3).
    Sql(SqlArgs),
    /// Look at and change a cluster's members through any node.
    Cluster(ClusterArgs),
    /// Run a benchmark and print figures as ratios against a baseline.
    Bench(BenchArgs),
    /// Check the file system of a data directory (the daemon must be
    /// stopped) and repair what can be repaired safely.
    Fsck(FsckArgs),
    /// Named database-backed pipes under MOUNT/.tablix/pipes.
    Pipe(PipeArgs),
    /// Run a command whose pipe() and pipe2() make database-backed pipes
    /// (through an LD_PRELOAD library), across fork and exec.
    Run(RunArgs),
    /// Read every data block of a data directory against its checksum,
    /// while the daemon runs or not, and name the files whose data is
    /// damaged.
    Scrub(ScrubArgs),
    /// Async mode's writeback pushes, for the daemon that starts it: paths
    /// on standard input, NUL-ended, an answer line each on standard output.
    #[command(hide = true, name = PUSH_WRITEBACK)]
    PushWriteback,
}

/// The hidden subcommand a daemon in async mode runs as its push helper.
pub const PUSH_WRITEBACK: &str = "push-writeback";

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// Data directory [default: as for `tablix up`]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

/// A duration such as 30s, 500ms or 1m30s.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    tablix_api::parse_duration(s)
}

/// Seconds a benchmark's measurement runs: more than 0, at most an hour.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!("{s:?} is not a number of seconds in (0, 3600]")),
    }
}

/// An address to listen on: IP:PORT, or HOST:PORT with a host name the
/// resolver knows (`localhost:4001`); a name is taken as its first address.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} is not HOST:PORT (such as 127.0.0.1:4001)"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{s:?} is not HOST:PORT (such as 127.0.0.1:4001)"));
    }
    use std::net::ToSocketAddrs;
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

/// A size in bytes, with an optional binary suffix: 4096, 64KiB, 64MiB, 1GiB
/// (K, M, G and KB, MB, GB mean the same).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 65536, 64MiB or 1GiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?}: use KiB, MiB or GiB"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[derive(Args, Debug)]
pub struct PipeArgs {
    #[command(subcommand)]
    pub which: PipeCommand,
}

#[derive(Subcommand, Debug)]
pub enum PipeCommand {
    /// Create a named pipe: MOUNT/.tablix/pipes/NAME, which programs open,
    /// read and write like a FIFO.
    Create {
        /// Data directory whose daemon serves the mount [default: as for `tablix up`]
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        /// Permission bits, in octal.
        #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
        mode: u32,
        /// Bytes the pipe holds before writers block (as F_SETPIPE_SZ;
        /// beyond /proc/sys/fs/pipe-max-size only for root).
        #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(4096..=1 << 30))]
        capacity: Option<u32>,
        /// Pipe name: a file name of 1 to 255 bytes without '/'.
        name: String,
    },
    /// Remove a named pipe (it lives on while ends are open).
    Remove {
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        name: String,
    },
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode such as 600 or 0644")),
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Data directory whose daemon serves the mount [default: as for `tablix up`]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Data directory [default: as for `tablix up`]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Only report; change nothing.
    #[arg(short = 'n', long)]
    pub no_repair: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Sync,
    Async,
}

/// The read level of a cluster node's mount, as rqlite names levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MountReadArg {
    /// The node's own state, at once.
    None,
    /// The state the leader has applied.
    Weak,
    /// What a quorum confirmed committed (read index).
    Linearizable,
    /// An entry of its own through the log.
    Strong,
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Data directory [default: $TABLIX_DATA, else $XDG_DATA_HOME/tablix, else ~/.local/share/tablix]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address of the HTTP SQL API (port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:4001", value_parser = parse_listen_addr)]
    pub http: SocketAddr,
    /// sync: every acknowledged write is on disk; async: flushed within --flush-interval-ms.
    #[arg(long, value_enum, default_value = "sync")]
    pub mode: ModeArg,
    /// Longest time an acknowledged write stays unsynced in async mode.
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub flush_interval_ms: u64,
    /// Largest HTTP request body accepted (bytes); larger ones get 413.
    #[arg(long, value_name = "BYTES", default_value_t = 8 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    pub body_limit: u64,
    /// Read-only connections serving queries.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub readers: u64,
    /// Page-cache policy: lru, lfu-hist, s3-fifo, s3-lru, w-tinylfu, or sqlite for SQLite's own cache.
    #[arg(long, value_name = "POLICY", default_value = tablix_pcache::DEFAULT_POLICY.name(), value_parser = parse_pcache)]
    pub pcache: PcacheChoice,
    /// Let every user use the mount (the kernel still enforces the mode
    /// bits). On by default when running as root; otherwise it needs
    /// `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Threads serving file-system requests.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub fuse_threads: u64,
    /// Exited processes kept in the `processes` table.
    #[arg(long, value_name = "N", default_value_t = tablix_proc::schema::DEFAULT_HISTORY, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub process_history: u32,
    /// How often /proc is scanned when the kernel's process events are
    /// unavailable (not root).
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub process_poll_ms: u64,
    /// API users and their permissions, in rqlite's auth-file format (a
    /// JSON list of {"username", "password", "perms"}; tablix adds the
    /// permission "raw" and optional "uid" and "gid").
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,
    /// PEM certificate chain: serve --http over TLS (with --http-key).
    #[arg(long, value_name = "FILE", requires = "http_key")]
    pub http_cert: Option<PathBuf>,
    /// PEM private key of --http-cert.
    #[arg(long, value_name = "FILE", requires = "http_cert")]
    pub http_key: Option<PathBuf>,
    /// Serve --http on an address other machines can reach without TLS and
    /// API users. Anyone on the network could then use the API as the
    /// auth file's "*" user allows; not recommended.
    #[arg(long)]
    pub insecure_http: bool,
    /// Longest a read request's statements may run, together (a request
    /// may ask for less with rqlite's db_timeout).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub statement_timeout: std::time::Duration,
    /// Longest a write request's statements may hold the writer, together.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub write_timeout: std::time::Duration,
    /// Largest result one request returns, and largest value SQL can build.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_result_bytes: u64,
    /// SQLite's heap limit for the daemon (0: none).
    #[arg(long, value_name = "BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub memory_limit: u64,
    /// The WAL is checkpointed and cut back once it grows past this;
    /// ordinary checkpoints come every half of it (at most 64 MiB).
    #[arg(long, value_name = "BYTES", default_value = "128MiB", value_parser = parse_bytes)]
    pub wal_limit: u64,
    /// Most HTTP requests served at once; more wait their turn.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_requests: u64,
    /// Most interactive transactions (BEGIN over the API or the shell)
    /// open at once; each holds a connection or two.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_transactions: u64,
    /// An interactive transaction with no request for this long is
    /// rolled back.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub tx_idle_timeout: std::time::Duration,
    /// An interactive transaction open this long is rolled back: its
    /// snapshot keeps the WAL from being restarted.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub tx_max_duration: std::time::Duration,
    /// Most bytes of pages one interactive transaction may change; a
    /// statement that would pass it fails, the transaction goes on.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    pub tx_max_bytes: u64,
    /// This node's id in a cluster (a number other than 0, unique in the
    /// cluster). With --raft: the daemon is a node of a Raft cluster.
    #[arg(long, value_name = "ID", requires = "raft", value_parser = clap::value_parser!(u64).range(1..))]
    pub node_id: Option<u64>,
    /// Address of this node's raft service, which other nodes reach
    /// (port 0 picks a free one). Needs --node-id.
    #[arg(long, value_name = "ADDR", requires = "node_id", value_parser = parse_listen_addr)]
    pub raft: Option<SocketAddr>,
    /// The address other nodes reach --raft at, when it differs (behind
    /// NAT, or --raft on 0.0.0.0).
    #[arg(long, value_name = "HOST:PORT", requires = "raft")]
    pub raft_advertise: Option<String>,
    /// Found a new cluster with this node its only voter (the first
    /// start only; a node that is a member already ignores it).
    #[arg(long, requires = "raft", conflicts_with = "join")]
    pub bootstrap: bool,
    /// Ask the member whose raft service is at HOST:PORT to add this node
    /// (the first start only).
    #[arg(long, value_name = "HOST:PORT", requires = "raft")]
    pub join: Option<String>,
    /// How long --join keeps asking while that member cannot be reached
    /// or its cluster has no leader (it may be starting too).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "join", value_parser = clap::value_parser!(u64).range(1..))]
    pub join_wait: u64,
    /// Serve --raft on an address other machines can reach without
    /// mutual TLS (--raft-cert, --raft-key, --raft-ca): anyone who reaches
    /// it can read the log and change the cluster. Not recommended.
    #[arg(long, requires = "raft")]
    pub insecure_raft: bool,
    #[command(flatten)]
    pub raft_tls: RaftTlsArgs,
    /// On a cluster node, what a read through the mount waits for before
    /// it reads the node's state (each lookup, getattr, read and readdir
    /// that reaches the daemon; kernel caches are invalidated as entries
    /// apply).
    #[arg(
        long,
        value_enum,
        value_name = "LEVEL",
        default_value = "none",
        requires = "raft"
    )]
    pub mount_read: MountReadArg,
    /// On a cluster node, the lock lease: the leader expires the
    /// file-system locks (fcntl, lockf, flock) of a node it has heard
    /// nothing from for this long, so that a machine that died holds
    /// none for good (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, requires = "raft")]
    pub lock_lease: u64,
    /// Take a snapshot (and compact the log behind it) every this many
    /// applied entries; for a database over 64 MiB, only once the log
    /// also holds half the database's size in bytes.
    #[arg(long, value_name = "N", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub snapshot_every: u64,
    /// Stop (as on SIGTERM) when the process that started this one
    /// exits, however it ends: for benchmarks and tests that start
    /// daemons of their own.
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
    /// Where to mount the tablix file system.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
}

/// Mutual TLS between nodes: every node (and `tablix cluster`) shows a
/// certificate signed by the cluster's authority and accepts only such.
#[derive(Args, Debug, Clone, Default)]
pub struct RaftTlsArgs {
    /// Certificate (PEM) this node shows other nodes; with --raft-key and
    /// --raft-ca, node-to-node traffic is mutual TLS.
    #[arg(long, value_name = "FILE", requires_all = ["raft_key", "raft_ca"], global = true)]
    pub raft_cert: Option<PathBuf>,
    /// The private key (PEM) of --raft-cert.
    #[arg(long, value_name = "FILE", requires_all = ["raft_cert", "raft_ca"], global = true)]
    pub raft_key: Option<PathBuf>,
    /// The authority (PEM) that signs every node's certificate; only its
    /// certificates are let in.
    #[arg(long, value_name = "FILE", requires_all = ["raft_cert", "raft_key"], global = true)]
    pub raft_ca: Option<PathBuf>,
}

impl RaftTlsArgs {
    /// The TLS identity the flags name, if any.
    pub fn load(&self) -> anyhow::Result<Option<tablix_raft::NodeTls>> {
        let (Some(cert), Some(key), Some(ca)) = (&self.raft_cert, &self.raft_key, &self.raft_ca)
        else {
            return Ok(None);
        };
        let files = tablix_raft::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        };
        Ok(Some(
            tablix_raft::NodeTls::load(&files).map_err(anyhow::Error::new)?,
        ))
    }
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Raft service of any node of the cluster.
    #[arg(
        long,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:4002",
        global = true
    )]
    pub raft: String,
    #[command(flatten)]
    pub tls: RaftTlsArgs,
    #[command(subcommand)]
    pub action: ClusterAction,
}

#[derive(Subcommand, Debug)]
pub enum ClusterAction {
    /// The cluster as the node at --raft sees it: members, leader, term,
    /// log and applied indexes.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a node as a voter (it is brought up to date first).
    Add {
        #[arg(value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
        /// The node's raft address.
        #[arg(value_name = "HOST:PORT")]
        addr: String,
    },
    /// Add a node as a learner: it receives the log and votes in nothing.
    AddLearner {
        #[arg(value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
        #[arg(value_name = "HOST:PORT")]
        addr: String,
    },
    /// Hand leadership to a voter: the leader waits until it holds the
    /// whole log, and lets it win the next election.
    TransferLeader {
        #[arg(value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
    },
    /// Remove a node (never the last voter).
    Remove {
        #[arg(value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
    },
}

#[derive(Args, Debug)]
pub struct SqlArgs {
    /// Daemon to talk to over TCP: `HOST[:PORT]` or `http(s)://HOST[:PORT]`
    /// [default: the Unix socket of --data's daemon]
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// An API user of the daemon's auth file, USER or USER:PASSWORD (the
    /// password may also come from $TABLIX_PASSWORD).
    #[arg(short = 'u', long, value_name = "USER[:PASSWORD]")]
    pub user: Option<String>,
    /// PEM certificate to trust for https:// addresses.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Data directory whose daemon to find [default: as for `tablix up`]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Run the SQL and dot-commands in FILE.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Stay interactive after running -f FILE or SQL arguments.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Output mode: table, csv, json, line or list.
    #[arg(short = 'm', long, value_name = "MODE", default_value = "table")]
    pub mode: String,
    /// Print column headers in csv and list modes.
    #[arg(long)]
    pub headers: bool,
    /// SQL statements or dot-commands to run, then exit.
    #[arg(value_name = "SQL")]
    pub sql: Vec<String>,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchWhich,
}

#[derive(Subcommand, Debug)]
pub enum BenchWhich {
    /// Single-row inserts through the HTTP API (sync mode) with several
    /// client counts, against plain rusqlite with one insert per transaction.
    Insert(InsertBenchArgs),
    /// The seed's TPS benchmark (SQLite's server-process-edition):
    /// interactive read/write transactions of five REPLACEs and read-only
    /// ones of five range reads, several clients of each, through the
    /// embedded API and the HTTP API, against stock SQLite with one
    /// writer (synchronous OFF and FULL).
    Tps(TpsBenchArgs),
    /// Where the command log should live: groups of logged Commands
    /// applied to a state database, with the log in the state's
    /// transaction, in its own SQLite file or in an append-only file,
    /// against the state's commit alone.
    Log(LogBenchArgs),
    /// The write path as a cluster of one under openraft against the
    /// store's own command log, in one process: single-row inserts from
    /// concurrent clients.
    Raft(RaftBenchArgs),
    /// Clusters on loopback: concurrent single-row inserts on tablix and
    /// rqlite clusters of 1 and 3 nodes and on tablix's plain daemon
    /// (rate, p50 and p99), a source tree unpacked and removed on a
    /// 3-node cluster's mount against a plain daemon's and a 1-node
    /// cluster's, and failover after SIGKILL of the leader.
    Cluster(ClusterBenchArgs),
    /// The page cache: a speed suite after SQLite's speedtest1 and hit
    /// ratios under several access patterns, each policy against SQLite's
    /// built-in cache.
    Pcache(PcacheBenchArgs),
    /// The file system: Bonnie++, Postmark and a metadata workload (unpack a
    /// source tree, find, du, rm -rf) on a tablix mount in async and sync
    /// mode, each against ext4 on the same disk in the same run.
    Fs(FsBenchArgs),
    /// Database-backed pipes against kernel pipes: bandwidth with 64 KiB
    /// transfers (as LMbench's bw_pipe) and one-byte ping-pong latency
    /// (lat_pipe).
    Pipe(PipeBenchArgs),
    /// The mount's latency (stat, small reads) and the daemon's memory
    /// while four runaway queries and a runaway write run beside ordinary
    /// clients, against the same daemon idle.
    Hostile(HostileBenchArgs),
    /// One configuration of `bench pcache`, in its own process (internal).
    #[command(hide = true)]
    PcacheWorker(PcacheWorkerArgs),
    /// One stock SQLite run of `bench tps`, in a process of SQLite's own
    /// page cache (internal).
    #[command(hide = true)]
    TpsStock(TpsStockArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    Speed,
    Hits,
    /// Nanoseconds per fetch+unpin of a resident page, called directly.
    Ops,
    /// SQLite's own test/speedtest1.c, built against the bundled SQLite and
    /// the page cache as a C library: each test's instructions (callgrind)
    /// and the misses, per policy, at SQLite's default cache size and at
    /// 200 pages.
    Speedtest1,
    All,
}

#[derive(Args, Debug)]
pub struct PcacheBenchArgs {
    /// Which suite to run.
    #[arg(long, value_enum, default_value = "all")]
    pub suite: Suite,
    /// Scratch directory [default: ./target/bench]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Rows per table in the speed suite.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Rounds of the speed suite; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Also count each speed workload's instructions under callgrind (one
    /// run per configuration, `--instruction-rows` rows): deterministic
    /// figures that machine noise cannot move.
    #[arg(long)]
    pub instructions: bool,
    /// Rows per table for the instruction counts.
    #[arg(long, default_value_t = 25_000)]
    pub instruction_rows: u64,
    /// Rows of the hit-ratio database.
    #[arg(long, default_value_t = 150_000)]
    pub hit_rows: u64,
    /// Lookups per hit-ratio measurement.
    #[arg(long, default_value_t = 100_000)]
    pub lookups: u64,
    /// SQLite's test/speedtest1.c [default: fetched from SQLite's
    /// repository at the bundled version's tag, once, into --dir]
    #[arg(long, value_name = "FILE")]
    pub speedtest1: Option<PathBuf>,
    /// speedtest1's --size.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub speedtest1_size: u32,
    /// The page cache as a static library, for speedtest1.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "target/pcache-c/release/libtablix_pcache.a"
    )]
    pub pcache_lib: PathBuf,
}

#[derive(Args, Debug)]
pub struct PcacheWorkerArgs {
    #[arg(long, value_parser = parse_pcache)]
    pub pcache: PcacheChoice,
    #[arg(long, value_enum)]
    pub suite: Suite,
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 25_000)]
    pub rows: u64,
    /// Hit suite: cache budget in percent of the database's pages.
    #[arg(long, default_value_t = 5.0)]
    pub budget: f64,
    /// Hit suite: access pattern.
    #[arg(long, default_value = "uniform")]
    pub pattern: String,
    #[arg(long, default_value_t = 100_000)]
    pub lookups: u64,
}

#[derive(Args, Debug)]
pub struct InsertBenchArgs {
    /// Scratch directory on the disk to measure [default: ./target/bench]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Concurrent HTTP clients to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 4, 16])]
    pub clients: Vec<usize>,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}

#[derive(Args, Debug)]
pub struct TpsBenchArgs {
    /// Scratch directory on the disk to measure [default:
    /// /dev/shm/tablix-bench-tps, tmpfs, as the seed ran]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Rows of t1 (the seed's size is 5000000).
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Read/write clients to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 3, 4])]
    pub rw: Vec<usize>,
    /// Read-only clients beside them, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0usize, 1])]
    pub ro: Vec<usize>,
    /// Read/write clients over HTTP, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 3, 4, 16])]
    pub http_rw: Vec<usize>,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Page cache of the embedded runs, as `tablix up --pcache` (stock
    /// SQLite runs in a process of its own, on SQLite's).
    #[arg(long, value_name = "POLICY", default_value = tablix_pcache::DEFAULT_POLICY.name(), value_parser = parse_pcache)]
    pub pcache: PcacheChoice,
}

#[derive(Args, Debug)]
pub struct TpsStockArgs {
    #[arg(long)]
    pub path: PathBuf,
    #[arg(long)]
    pub rows: u64,
    /// SQLite's `synchronous`: OFF or FULL.
    #[arg(long)]
    pub sync: String,
    #[arg(long, value_parser = parse_seconds)]
    pub seconds: f64,
}

#[derive(Args, Debug)]
pub struct LogBenchArgs {
    /// Scratch directory on the disk to measure [default: ./target/bench/log]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Entries per group (one transaction, one log append), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16])]
    pub batches: Vec<usize>,
    /// Rounds; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,
}

#[derive(Args, Debug)]
pub struct RaftBenchArgs {
    /// Scratch directory on the disk to measure [default: ./target/bench/raft]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16])]
    pub clients: Vec<usize>,
    /// Rounds, alternating which path runs first; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,
}

#[derive(Args, Debug)]
pub struct ClusterBenchArgs {
    /// Scratch directory on the disk to measure [default: ./target/bench/cluster]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// rqlite's server, built from its source (`go build ./cmd/rqlited`);
    /// without it only tablix is measured.
    #[arg(long, value_name = "PATH")]
    pub rqlited: Option<PathBuf>,
    /// Seconds each insert measurement runs.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Concurrent clients, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 4, 16, 64])]
    pub clients: Vec<usize>,
    /// Insert rounds per client count, the systems taking turns in each;
    /// the run with the median rate is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,
    /// Files in the synthetic source tree unpacked on the mount (0: skip;
    /// the mounts need root).
    #[arg(long, default_value_t = 2000)]
    pub tree_files: u64,
    /// Size of the seed's four batch workloads run through each system's
    /// shell, as a multiple of the seed's (1: 15,000 statements for
    /// write-only; 0: skip them).
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub workload_scale: f64,
    /// rqlite's shell, for the batch workloads [default: `rqlite` beside
    /// --rqlited].
    #[arg(long, value_name = "PATH")]
    pub rqlite: Option<PathBuf>,
}

fn parse_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a scale between 0 and 100")),
    }
}

#[derive(Args, Debug)]
pub struct PipeBenchArgs {
    /// Scratch directory for the daemon [default: ./target/bench/pipe]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// MiB moved per bandwidth run.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub mb: u64,
    /// Bytes per write and read in the bandwidth runs.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub chunk: u64,
    /// Round trips per latency run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub round_trips: u64,
    /// Runs of each measurement; medians are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub repeat: u64,
    /// Threads serving the daemon's file-system requests.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub fuse_threads: u64,
}

#[derive(Args, Debug)]
pub struct HostileBenchArgs {
    /// Scratch directory [default: ./target/bench/hostile]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Files measured per phase (each stat'ed and read once).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub files: u64,
    /// tablix modes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["async".to_string(), "sync".to_string()])]
    pub modes: Vec<String>,
    /// Seconds the ordinary clients run in each phase.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// The daemon's --memory-limit.
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    pub memory_limit: u64,
}

#[derive(Args, Debug)]
pub struct FsBenchArgs {
    /// Scratch directory on the disk to measure [default: ./target/bench/fs]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Bonnie++ file size in MiB (bonnie++ -s); RAM is given as half of it.
    #[arg(long, default_value_t = 4096)]
    pub bonnie_mb: u64,
    /// Bonnie++ file size for sync mode, where every 8 KiB write is durable
    /// before it returns; compared with ext4 at this size with -b (fsync
    /// after every write).
    #[arg(long, default_value_t = 1024)]
    pub bonnie_sync_mb: u64,
    /// Postmark's initial file count.
    #[arg(long, default_value_t = 5000)]
    pub postmark_files: u64,
    /// Postmark's transactions.
    #[arg(long, default_value_t = 20000)]
    pub postmark_transactions: u64,
    /// Files in the synthetic source tree of the metadata workload.
    #[arg(long, default_value_t = 6000)]
    pub tree_files: u64,
    /// tablix modes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["async".to_string(), "sync".to_string()])]
    pub modes: Vec<String>,
    /// Size in MiB of the file written and then read cold (the kernel's
    /// caches dropped in between).
    #[arg(long, default_value_t = 1024)]
    pub read_mb: u64,
    /// Workloads to run, comma-separated: bonnie, read, postmark, meta.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["bonnie".to_string(), "read".to_string(), "postmark".to_string(), "meta".to_string()])]
    pub workloads: Vec<String>,
    /// libfuse's passthrough_hp, built from its source (`meson setup build
    /// && ninja -C build example/passthrough_hp`): the same workloads on
    /// its mount of a directory on the same disk, FUSE's own cost.
    #[arg(long, value_name = "PATH")]
    pub passthrough_hp: Option<PathBuf>,
}

/// A page cache to run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcacheChoice {
    /// SQLite's built-in page cache.
    Sqlite,
    Tablix(tablix_pcache::Policy),
}

impl PcacheChoice {
    pub fn name(self) -> &'static str {
        match self {
            PcacheChoice::Sqlite => "sqlite",
            PcacheChoice::Tablix(p) => p.name(),
        }
    }

    /// Installs the choice; must run before SQLite initialises.
    pub fn install(self) -> anyhow::Result<()> {
        match self {
            PcacheChoice::Sqlite => Ok(()),
            PcacheChoice::Tablix(p) => tablix_pcache::install(p).map_err(anyhow::Error::from),
        }
    }
}

pub fn parse_pcache(s: &str) -> Result<PcacheChoice, String> {
    if s == "sqlite" {
        return Ok(PcacheChoice::Sqlite);
    }
    s.parse()
        .map(PcacheChoice::Tablix)
        .map_err(|e: String| format!("{e}, sqlite"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_ips_and_host_names() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:4001").unwrap(),
            "127.0.0.1:4001".parse::<SocketAddr>().unwrap()
        );
        let local = parse_listen_addr("localhost:4002").unwrap();
        assert!(local.ip().is_loopback(), "{local}");
        assert_eq!(local.port(), 4002);
        for bad in ["localhost", ":4001", "localhost:99999", "host:port"] {
            let err = parse_listen_addr(bad).unwrap_err();
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }
}
