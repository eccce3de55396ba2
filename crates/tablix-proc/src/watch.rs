//! The thread that keeps the process table current.

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::connector::{Connector, KernelEvent};
use crate::op::{ProcEvent, ProcOp};
use crate::scan::{boot_unix_ns, read_task, scan_all};

/// How the table is fed.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// Exited processes kept in the table.
    pub history: u32,
    /// How often /proc is scanned when the connector is unavailable.
    pub poll_interval: Duration,
    /// Skip the connector (tests of the fallback).
    pub force_poll: bool,
}

/// Where events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Connector,
    /// Polling /proc, and why the connector could not be used.
    Poll(String),
}

/// A running watcher; its threads live as long as the process.
pub struct Watcher {
    source: Source,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The largest batch applied in one transaction.
const MAX_BATCH: usize = 4096;

impl Watcher {
    /// Seeds the table from /proc (synchronously, through `sink`), then
    /// starts following the kernel. `sink` applies each batch.
    pub fn start(
        config: WatchConfig,
        mut sink: impl FnMut(ProcOp) + Send + 'static,
    ) -> std::io::Result<Watcher> {
        let boot = boot_unix_ns();
        let connector = if config.force_poll {
            Err("polling was asked for (TABLIX_PROCESS_POLL)".to_string())
        } else {
            match Connector::open() {
                Err(e) if e.raw_os_error() == Some(1) => Err(
                    "the kernel's process events need CAP_NET_ADMIN (run as root)".to_string(),
                ),
                Err(e) => Err(format!("the kernel's process events are unavailable: {e}")),
                Ok(mut c) => match c.probe(Duration::from_secs(2)) {
                    Ok(true) => Ok(c),
                    Ok(false) => Err(
                        "the kernel accepted the process-event subscription but sent no events (not in the initial namespaces?)"
                            .to_string(),
                    ),
                    Err(e) => Err(format!("testing the kernel's process events failed: {e}")),
                },
            }
        };
        // Subscribe before seeding, so nothing between the two is missed.
        let seed = scan_all(boot);
        let mut known: HashSet<u32> = seed.iter().map(|i| i.pid).collect();
        sink(ProcOp {
            reset: true,
            events: seed.into_iter().map(ProcEvent::Seen).collect(),
            keep_exited: config.history,
        });
        let history = config.history;
        let source = match connector {
            Ok(mut connector) => {
                let (tx, rx) = mpsc::channel::<Result<Vec<KernelEvent>, std::io::Error>>();
                std::thread::Builder::new()
                    .name("tablix-proc-events".into())
                    .spawn(move || {
                        loop {
                            let got = connector.next();
                            let failed = got.as_ref().is_err_and(|e| e.raw_os_error() != Some(105));
                            if tx.send(got).is_err() || failed {
                                break;
                            }
                        }
                    })?;
                std::thread::Builder::new()
                    .name("tablix-proc-apply".into())
                    .spawn(move || apply_events(rx, boot, history, sink))?;
                Source::Connector
            }
            Err(reason) => {
                let interval = config.poll_interval;
                std::thread::Builder::new()
                    .name("tablix-proc-poll".into())
                    .spawn(move || {
                        loop {
                            std::thread::sleep(interval);
                            let now = scan_all(boot);
                            let at_ns = now_ns();
                            let current: HashSet<u32> = now.iter().map(|i| i.pid).collect();
                            let mut events: Vec<ProcEvent> = known
                                .difference(&current)
                                .map(|&pid| ProcEvent::Exit {
                                    pid,
                                    at_ns,
                                    status: None,
                                })
                                .collect();
                            events.extend(
                                now.into_iter()
                                    .filter(|i| !known.contains(&i.pid))
                                    .map(ProcEvent::Seen),
                            );
                            known = current;
                            if !events.is_empty() {
                                sink(ProcOp {
                                    reset: false,
                                    events,
                                    keep_exited: history,
                                });
                            }
                        }
                    })?;
                Source::Poll(reason)
            }
        };
        Ok(Watcher { source })
    }

    pub fn source(&self) -> &Source {
        &self.source
    }
}

/// Turns kernel events into batches: everything already queued goes into
/// one transaction.
fn apply_events(
    rx: mpsc::Receiver<Result<Vec<KernelEvent>, std::io::Error>>,
    boot: Option<i64>,
    history: u32,
    mut sink: impl FnMut(ProcOp),
) {
    let boot = boot.unwrap_or(0);
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let mut reset = false;
        let mut events = Vec::new();
        for got in batch {
            match got {
                Ok(kernel) => events.extend(kernel.into_iter().filter_map(|k| convert(k, boot))),
                Err(e) if e.raw_os_error() == Some(105) => {
                    // ENOBUFS: the kernel dropped events; start over from /proc.
                    tracing::warn!("process events were dropped; rescanning /proc");
                    reset = true;
                    events = scan_all(Some(boot))
                        .into_iter()
                        .map(ProcEvent::Seen)
                        .collect();
                }
                Err(e) => {
                    tracing::warn!("process events stopped: {e}");
                    return;
                }
            }
        }
        if !events.is_empty() || reset {
            sink(ProcOp {
                reset,
                events,
                keep_exited: history,
            });
        }
    }
}

fn convert(k: KernelEvent, boot: i64) -> Option<ProcEvent> {
    let at = |t: u64| boot.saturating_add(i64::try_from(t).unwrap_or(i64::MAX));
    Some(match k {
        KernelEvent::Fork {
            parent,
            parent_tgid,
            pid,
            tgid,
            at: t,
        } => ProcEvent::Fork {
            pid,
            tgid,
            parent,
            parent_tgid,
            at_ns: at(t),
        },
        KernelEvent::Exec { pid, tgid } => ProcEvent::Exec(read_task(tgid, pid, Some(boot))?),
        KernelEvent::Uid { pid, ruid, euid } => ProcEvent::Uid {
            pid,
            uid: ruid,
            euid,
        },
        KernelEvent::Gid { pid, rgid, egid } => ProcEvent::Gid {
            pid,
            gid: rgid,
            egid,
        },
        KernelEvent::Comm { pid, comm } => ProcEvent::Comm { pid, comm },
        KernelEvent::Exit { pid, status, at: t } => ProcEvent::Exit {
            pid,
            at_ns: at(t),
            status: Some(status),
        },
        KernelEvent::Ack(0) => return None,
        KernelEvent::Ack(err) => {
            tracing::warn!("the kernel refused process events: errno {err}");
            return None;
        }
    })
}
