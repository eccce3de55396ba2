//! `tablix up`: the daemon.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tablix_api::{ApiConfig, ServerInfo, router, stamp_now};
use tablix_store::{Command, DaemonRecord, Durability, Store, StoreConfig};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{ModeArg, UpArgs};
use crate::discovery::{self, DaemonFile};

pub fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TABLIX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Before anything opens a connection: SQLite takes its page cache at
    // initialisation.
    args.pcache.install()?;
    let data = discovery::data_dir(args.data.as_deref())?;
    if let Some(mp) = &args.mountpoint {
        if !mp.is_dir() {
            bail!(
                "mount point {} does not exist or is not a directory",
                mp.display()
            );
        }
        bail!(
            "mounting the tablix file system at {} is not available in this build yet; start without MOUNTPOINT to serve SQL only",
            mp.display()
        );
    }
    let durability = match args.mode {
        ModeArg::Sync => Durability::Sync,
        ModeArg::Async => Durability::Async,
    };
    let mut config = StoreConfig::new(&data);
    config.durability = durability;
    config.flush_interval = Duration::from_millis(args.flush_interval_ms);
    config.readers = args.readers as usize;
    let store = Arc::new(Store::open(config)?);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve(Arc::clone(&store), &args, &data, durability));
    DaemonFile::remove(&data);
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
    data: &std::path::Path,
    durability: Durability,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.http).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {}: {e}; is another tablix (or rqlite) using it? choose another address with --http",
            args.http
        )
    })?;
    let addr = listener.local_addr()?;
    let version = env!("CARGO_PKG_VERSION").to_string();
    let record = DaemonRecord {
        pid: std::process::id(),
        http_addr: addr.to_string(),
        data_dir: data.display().to_string(),
        mode: durability.as_str().into(),
        version: version.clone(),
    };
    store
        .submit(tablix_store::Stamped::new(
            stamp_now(),
            Command::SetDaemon(record),
        ))
        .await?;
    let info = ServerInfo {
        version: version.clone(),
        pid: std::process::id(),
        http_addr: addr.to_string(),
        pcache: args.pcache.name().into(),
    };
    let app = router(
        store,
        info,
        ApiConfig {
            body_limit: args.body_limit as usize,
        },
    );
    DaemonFile {
        pid: std::process::id(),
        http_addr: addr.to_string(),
        version,
    }
    .write(data)?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    println!(
        "tablix ready: http=http://{addr} data={} mode={} pcache={} pid={}",
        data.display(),
        durability.as_str(),
        args.pcache.name(),
        std::process::id()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
        })
        .await
        .context("serving HTTP")?;
    Ok(())
}
