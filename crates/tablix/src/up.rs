//! `tablix up`: the daemon.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tablix_api::{ApiConfig, AuthFile, Endpoint, ServerInfo, router};
use tablix_raft::{ClusterConfig, ClusterHandle, ClusterNode, ReadBarrier, Start};
use tablix_store::{DaemonRecord, Durability, LogKeeper, Store, StoreConfig};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{ModeArg, MountReadArg, UpArgs};
use crate::discovery::{self, DaemonFile};

/// How long requests in flight may take to finish once the daemon stops
/// (their statements are interrupted at once, so this is rarely used).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long the async runtime's own blocking work may keep the daemon once
/// everything has stopped.
const RUNTIME_GRACE: Duration = Duration::from_secs(5);

/// Refuses to expose the SQL API to the network unprotected, unless told to.
fn check_exposure(args: &UpArgs, auth: &AuthFile) -> anyhow::Result<()> {
    let ip = args.http.ip();
    let local = match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => v6.is_loopback(),
    };
    if local {
        return Ok(());
    }
    let protected = args.http_cert.is_some() && !auth.is_empty();
    if protected {
        return Ok(());
    }
    let missing = match (args.http_cert.is_some(), !auth.is_empty()) {
        (false, false) => "TLS (--http-cert, --http-key) and API users (--auth FILE)",
        (false, true) => "TLS (--http-cert, --http-key)",
        _ => "API users (--auth FILE)",
    };
    if !args.insecure_http {
        bail!(
            "--http {} can be reached from other machines, and tablix would serve it without {missing}; add them, bind 127.0.0.1, or pass --insecure-http to do it anyway",
            args.http
        );
    }
    tracing::warn!(
        "serving SQL on {} without {missing} (--insecure-http): anyone who can reach it gets what the auth file's \"*\" user allows, and sees traffic in the clear",
        args.http
    );
    Ok(())
}

/// The cluster settings the flags give (none without --raft). A raft
/// service other machines can reach without mutual TLS is refused unless
/// forced.
fn cluster_config(args: &UpArgs, data: &Path) -> anyhow::Result<Option<ClusterConfig>> {
    let (Some(id), Some(listen)) = (args.node_id, args.raft) else {
        if args.raft_tls.raft_cert.is_some() {
            bail!(
                "--raft-cert, --raft-key and --raft-ca secure a cluster node's raft service: add --node-id and --raft"
            );
        }
        return Ok(None);
    };
    let tls = args.raft_tls.load()?;
    if args.mode == ModeArg::Async {
        bail!(
            "--mode async is not available on a cluster node: a replicated write is acknowledged once a majority has it; drop --mode async"
        );
    }
    if !listen.ip().is_loopback() && tls.is_none() {
        if !args.insecure_raft {
            bail!(
                "--raft {listen} can be reached from other machines: give it mutual TLS (--raft-cert, --raft-key, --raft-ca), bind a loopback address, or pass --insecure-raft to serve it in the clear anyway"
            );
        }
        tracing::warn!(
            "serving the raft service on {listen} without TLS (--insecure-raft): anyone who reaches it can read the log and change the cluster"
        );
    }
    let mut config = ClusterConfig::new(id, listen, data);
    config.tls = tls;
    config.advertise = args.raft_advertise.clone();
    config.snapshot_every = args.snapshot_every;
    config.lock_lease = Duration::from_secs(args.lock_lease);
    config.join_wait = Duration::from_secs(args.join_wait);
    config.start = match (&args.join, args.bootstrap) {
        (Some(peer), _) => Start::Join(peer.clone()),
        (None, true) => Start::Bootstrap,
        (None, false) => Start::Resume,
    };
    Ok(Some(config))
}

/// A data directory is either a plain daemon's (the store keeps its own
/// command log) or a cluster node's (openraft keeps the log, the cluster's
/// id is in `cluster-id`); starting one as the other would let its state
/// part from its log. A cluster node's without cluster flags is refused.
/// A plain daemon's started with cluster flags first replays its own log
/// to the end (a store opened for replication never reads it), so that
/// `--bootstrap` starts the cluster from everything it acknowledged, and
/// a join or resume is refused with the state complete
/// (`tablix_raft`'s `adopt_own_state`).
fn settle_own_log(
    config: &StoreConfig,
    data: &Path,
    cluster: Option<&ClusterConfig>,
) -> anyhow::Result<()> {
    let member = data.join(tablix_raft::cluster_id::FILE);
    match cluster {
        None if member.exists() => bail!(
            "{} is the data directory of a node of a tablix cluster (it has {}): start it with its --node-id and --raft (and its --raft-cert, --raft-key and --raft-ca if it had them); without them its state would part from the cluster's",
            data.display(),
            member.display()
        ),
        Some(_) if !member.exists() && config.log_dir().is_dir() => {
            let mut own = config.clone();
            own.log_keeper = LogKeeper::Store;
            let store = Store::open(own).context(
                "replaying the command log of the daemon that ran here without cluster flags",
            )?;
            store.close()?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Starts this node of the cluster and, when the daemon mounts, waits for
/// a leader: mounting is a replicated write.
async fn start_node(
    config: ClusterConfig,
    store: Arc<Store>,
    mounting: bool,
) -> anyhow::Result<ClusterNode> {
    let start = config.start.clone();
    let node = ClusterNode::start(config, store)
        .await
        .context("starting this node of the cluster")?;
    if mounting && node.status().leader.is_none() {
        tracing::info!("waiting for the cluster to have a leader before mounting");
        let waited = node
            .raft()
            .wait(Some(LEADER_WAIT))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await;
        if waited.is_err() {
            let hint = match start {
                Start::Resume => {
                    " (a new node needs --bootstrap or --join; a member needs a majority of its cluster running)"
                }
                _ => "",
            };
            bail!("no leader within {LEADER_WAIT:?}: the file system cannot be mounted{hint}");
        }
    }
    Ok(node)
}

/// How long a cluster node waits for a leader before giving up mounting.
const LEADER_WAIT: Duration = Duration::from_secs(60);

pub fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    crate::daemon_log::init();
    if args.exit_with_parent {
        // The kernel sends the signal when the thread that started this
        // process exits; one that exited before this call left it to init.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
            .context("asking to be stopped when the process that started tablix exits")?;
        if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
            bail!("--exit-with-parent: the process that started tablix has already exited");
        }
    }
    // Before anything opens a connection: SQLite takes its page cache at
    // initialisation.
    args.pcache.install()?;
    let data = discovery::data_dir(args.data.as_deref())?;
    if let Some(mp) = &args.mountpoint {
        // Refuse a bad mount point before touching the data directory.
        match std::fs::metadata(mp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("mount point {} does not exist", mp.display())
            }
            Ok(m) if !m.is_dir() => bail!("mount point {} is not a directory", mp.display()),
            _ => {}
        }
    }
    let auth = match &args.auth {
        Some(path) => AuthFile::load(path).map_err(anyhow::Error::msg)?,
        None => AuthFile::default(),
    };
    check_exposure(&args, &auth)?;
    let tls = match (&args.http_cert, &args.http_key) {
        (Some(cert), Some(key)) => {
            Some(tablix_api::tls_acceptor(cert, key).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    let durability = match args.mode {
        ModeArg::Sync => Durability::Sync,
        ModeArg::Async => Durability::Async,
    };
    let cluster = cluster_config(&args, &data)?;
    let mut config = StoreConfig::new(&data);
    if cluster.is_some() {
        config.log_keeper = LogKeeper::Replication;
    }
    config.durability = durability;
    config.flush_interval = Duration::from_millis(args.flush_interval_ms);
    config.readers = args.readers as usize;
    config.read_timeout = args.statement_timeout;
    config.write_timeout = args.write_timeout;
    config.max_transactions = usize::try_from(args.max_transactions).unwrap_or(usize::MAX);
    config.tx_idle_timeout = args.tx_idle_timeout;
    config.tx_max_duration = args.tx_max_duration;
    config.tx_max_bytes = usize::try_from(args.tx_max_bytes).unwrap_or(usize::MAX);
    config.max_result_bytes = usize::try_from(args.max_result_bytes).unwrap_or(usize::MAX);
    config.memory_limit = args.memory_limit;
    config.wal_limit = args.wal_limit;
    #[cfg(debug_assertions)]
    if let Some(probe) = kill_at_from_env()? {
        config.write_probe = probe;
    }
    settle_own_log(&config, &data, cluster.as_ref())?;
    let store = Arc::new(Store::open(config)?);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let node = match cluster {
        Some(c) => {
            let started =
                runtime.block_on(start_node(c, Arc::clone(&store), args.mountpoint.is_some()));
            match started {
                Ok(node) => Some(node),
                Err(e) => {
                    runtime.shutdown_timeout(RUNTIME_GRACE);
                    store.close()?;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let result = runtime.block_on(serve(
        Arc::clone(&store),
        &args,
        &data,
        durability,
        auth,
        tls,
        node.as_ref().map(ClusterNode::handle),
    ));
    DaemonFile::remove(&data);
    let result = match result {
        // The mount goes before the store closes: the kernel flushes its
        // cached writes through it while unmounting.
        Ok(Some(mounted)) => mounted.unmount().context("unmounting"),
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    // The node stops after the mount: unmounting writes through it.
    if let Some(node) = node
        && let Err(e) = runtime.block_on(node.shutdown())
    {
        tracing::warn!("stopping this node of the cluster: {e}");
    }
    // Blocking tasks still running (a client that stopped reading) must not
    // keep the daemon.
    runtime.shutdown_timeout(RUNTIME_GRACE);
    // Every acknowledged Command is already committed; closing drains the
    // queue, flushes and checkpoints.
    store.close()?;
    result?;
    tracing::info!(
        "stopped; all acknowledged writes are kept in {}",
        data.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn serve(
    store: Arc<Store>,
    args: &UpArgs,
    data: &Path,
    durability: Durability,
    auth: AuthFile,
    tls: Option<tablix_api::TlsAcceptor>,
    cluster: Option<ClusterHandle>,
) -> anyhow::Result<Option<tablix_fuse::Mounted>> {
    let has_tls = tls.is_some();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let tcp = Endpoint::tcp(args.http, tls).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {}: {e}; is another tablix (or rqlite) using it? choose another address with --http",
            args.http
        )
    })?;
    let addr: SocketAddr = tcp.local_addr().unwrap_or(args.http);
    if let Some(c) = &cluster {
        c.set_api_addr(format!("{scheme}://{addr}"));
    }
    let socket = data.join(discovery::SOCKET);
    let unix =
        Endpoint::unix(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    let version = env!("CARGO_PKG_VERSION").to_string();
    let record = DaemonRecord {
        pid: std::process::id(),
        http_addr: addr.to_string(),
        data_dir: data.display().to_string(),
        mode: durability.as_str().into(),
        version: version.clone(),
    };
    store.set_daemon(tablix_store::Stamp::now(), &record)?;
    let mounted = match &args.mountpoint {
        // Mounting waits on the store's writer: not on an async worker.
        Some(mp) => Some(tokio::task::block_in_place(|| {
            mount(
                Arc::clone(&store),
                args,
                data,
                durability,
                mp,
                cluster.as_ref(),
            )
        })?),
        None => None,
    };
    // The watcher seeds the table before returning: blocking, not on an
    // async worker.
    let holders = mounted.as_ref().map(|m| m.pipe_holders());
    tokio::task::block_in_place(|| watch_processes(Arc::clone(&store), args, holders))?;
    let info = ServerInfo {
        version: version.clone(),
        pid: std::process::id(),
        http_addr: addr.to_string(),
        pcache: args.pcache.name().into(),
        socket: Some(socket.display().to_string()),
        mount: mounted
            .as_ref()
            .map(|m| m.mountpoint().display().to_string()),
        tls: has_tls,
    };
    let app = router(
        Arc::clone(&store),
        info,
        ApiConfig {
            body_limit: args.body_limit as usize,
            max_requests: args.max_requests as usize,
            cluster: cluster.clone(),
        },
        Arc::new(auth),
    );
    DaemonFile {
        pid: std::process::id(),
        http_addr: addr.to_string(),
        version,
        mount: mounted.as_ref().map(|m| m.mountpoint().to_path_buf()),
        socket: Some(socket.clone()),
    }
    .write(data)?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let raft_note = cluster
        .as_ref()
        .map(|c| {
            let s = c.status();
            format!(" node={} raft={}", s.id, s.addr)
        })
        .unwrap_or_default();
    let mount_note = mounted
        .as_ref()
        .map(|m| format!(" mount={}", m.mountpoint().display()))
        .unwrap_or_default();
    println!(
        "tablix ready: http={}://{addr} socket={} data={} mode={} pcache={}{mount_note}{raft_note} pid={}",
        if has_tls { "https" } else { "http" },
        socket.display(),
        data.display(),
        durability.as_str(),
        args.pcache.name(),
        std::process::id()
    );
    let ended = mounted.as_ref().map(|m| m.ended());
    let unmounted = async move {
        let Some(ended) = ended else {
            return std::future::pending().await;
        };
        while !ended.load(std::sync::atomic::Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let stopping = Arc::clone(&store);
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = unmounted => tracing::info!("the file system was unmounted: shutting down"),
        }
        // User statements stop now; acknowledged writes are kept.
        stopping.stop_statements();
    };
    tablix_api::serve(vec![tcp, unix], app, shutdown, SHUTDOWN_GRACE).await;
    Ok(mounted)
}

/// Keeps the `processes` table current: kernel events when privileged,
/// else polling /proc, which is said once at start. The children a batch
/// forked that inherited pipe ends have their descriptors read (`holders`,
/// the mount's).
fn watch_processes(
    store: Arc<Store>,
    args: &UpArgs,
    holders: Option<Arc<tablix_fuse::PipeHolders>>,
) -> anyhow::Result<()> {
    let config = tablix_proc::WatchConfig {
        history: args.process_history,
        poll_interval: Duration::from_millis(args.process_poll_ms),
        force_poll: std::env::var_os("TABLIX_PROCESS_POLL").is_some(),
    };
    let watcher = tablix_proc::Watcher::start(config, move |op| {
        match store.apply_proc(tablix_store::Stamp::now(), &op) {
            Ok(inherited) => {
                if let Some(holders) = &holders {
                    for pid in inherited {
                        holders.sync(pid);
                    }
                }
            }
            Err(e) => tracing::warn!("updating the process table: {e}"),
        }
    })
    .context("starting the process-table watcher")?;
    match watcher.source() {
        tablix_proc::Source::Connector => {
            tracing::info!("process table: following the kernel's process events")
        }
        tablix_proc::Source::Poll(why) => tracing::warn!(
            "process table: {why}; polling /proc every {} ms instead",
            args.process_poll_ms
        ),
    }
    Ok(())
}

fn mount(
    store: Arc<Store>,
    args: &UpArgs,
    data: &Path,
    durability: Durability,
    mountpoint: &Path,
    cluster: Option<&ClusterHandle>,
) -> anyhow::Result<tablix_fuse::Mounted> {
    let root = nix::unistd::geteuid().is_root();
    let barrier = match args.mount_read {
        MountReadArg::None => None,
        MountReadArg::Weak => Some(ReadBarrier::Leader),
        MountReadArg::Linearizable => Some(ReadBarrier::Quorum),
        MountReadArg::Strong => Some(ReadBarrier::Log),
    };
    let read_gate = match (cluster, barrier) {
        (Some(cluster), Some(barrier)) => Some(Arc::new(MountReads {
            cluster: cluster.clone(),
            barrier,
            runtime: tokio::runtime::Handle::current(),
        }) as Arc<dyn tablix_fuse::ReadGate>),
        _ => None,
    };
    let options = tablix_fuse::MountOptions {
        mountpoint: mountpoint.to_path_buf(),
        fs: tablix_fuse::FsConfig {
            writeback_cache: (durability == Durability::Async)
                .then(|| Duration::from_millis(args.flush_interval_ms)),
            // This binary, whatever replaced its file since it started.
            push_helper: Some(tablix_fuse::PushHelper {
                program: PathBuf::from("/proc/self/exe"),
                name: "tablix".into(),
                args: vec![crate::cli::PUSH_WRITEBACK.into()],
            }),
            ttl: Duration::from_secs(10),
            max_write: 1 << 20,
            data_dir: data.to_path_buf(),
            read_gate,
            node: cluster.map(|c| c.id()),
        },
        threads: args.fuse_threads as usize,
        allow_other: root || args.allow_other,
    };
    Ok(tablix_fuse::mount(store, options)?)
}

/// A cluster node's mount read level: each read waits on the FUSE thread
/// that serves it (never an async worker) until the node may serve it.
#[derive(Debug)]
struct MountReads {
    cluster: ClusterHandle,
    barrier: ReadBarrier,
    runtime: tokio::runtime::Handle,
}

impl tablix_fuse::ReadGate for MountReads {
    fn before_read(&self) -> Result<(), tablix_store::StoreError> {
        self.runtime
            .block_on(self.cluster.read_barrier(self.barrier))
    }
}

/// Crash tests of debug builds: `TABLIX_KILL_AT=POINT:N` makes the daemon
/// SIGKILL itself the Nth time its write path reaches POINT (a
/// `tablix_store::WritePoint` name), so that a test stops it exactly
/// there. Release builds do not read the variable.
#[cfg(debug_assertions)]
fn kill_at_from_env() -> anyhow::Result<Option<tablix_store::WriteProbe>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tablix_store::{WritePoint, WriteProbe};
    let Ok(spec) = std::env::var("TABLIX_KILL_AT") else {
        return Ok(None);
    };
    let (point, n) = spec.split_once(':').context("TABLIX_KILL_AT is POINT:N")?;
    let point: WritePoint = point.parse().map_err(anyhow::Error::msg)?;
    let n: u64 = n.parse().context("TABLIX_KILL_AT is POINT:N")?;
    let seen = AtomicU64::new(0);
    Ok(Some(WriteProbe::new(move |at| {
        if at == point && seen.fetch_add(1, Ordering::Relaxed) + 1 == n {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
    })))
}
