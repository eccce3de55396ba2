//! Bounds on one request's user SQL: a time limit, a result size, and
//! cancellation when its client goes away or the daemon stops.
//!
//! Each connection that runs user SQL has a [`Guard`]: the current
//! request's deadline and cancellation, read by SQLite's progress handler
//! every [`PROGRESS_OPS`] virtual-machine steps (which then interrupts the
//! statement), and by the [`Watchdog`] thread, which calls
//! `sqlite3_interrupt` for work that runs long inside one step (a sort, a
//! large index build). The watchdog interrupts a connection only while the
//! request is registered with it, under the registry's lock, so an
//! interrupt never lands on the connection's next request.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rusqlite::InterruptHandle;

/// Virtual-machine steps between two looks at the deadline.
pub(crate) const PROGRESS_OPS: i32 = 1000;

/// How often the watchdog looks at running requests.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// Set to stop a request: the API sets it when the client disconnects.
/// A linked one is also cancelled by its parent (the request's
/// connection), not the other way round.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    own: Arc<AtomicBool>,
    parent: Option<Arc<AtomicBool>>,
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A cancellation of its own that `parent`'s cancels too.
    pub fn linked(parent: &Cancel) -> Cancel {
        Cancel {
            own: Arc::default(),
            parent: Some(Arc::clone(&parent.own)),
        }
    }

    pub fn cancel(&self) {
        self.own.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.own.load(Ordering::Acquire)
            || self
                .parent
                .as_ref()
                .is_some_and(|p| p.load(Ordering::Acquire))
    }
}

/// The bounds of one request.
#[derive(Clone, Debug)]
pub struct Limits {
    /// How long its statements may run, together.
    pub timeout: Duration,
    /// Largest result it may return, in bytes as sent.
    pub max_result_bytes: usize,
    pub cancel: Cancel,
}

/// Why a request's statement was interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Stopped {
    Running = 0,
    TimedOut = 1,
    Cancelled = 2,
    ShuttingDown = 3,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

const NO_DEADLINE: u64 = u64::MAX;

/// How many requests were stopped, and why; shared by a store's guards.
#[derive(Debug, Default)]
pub(crate) struct StopCounts {
    pub(crate) timed_out: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) shut_down: AtomicU64,
}

/// One connection's view of the request it runs.
#[derive(Debug)]
pub(crate) struct Guard {
    deadline_ns: AtomicU64,
    /// When the current request began; `u64::MAX` while none runs.
    started_ns: AtomicU64,
    timeout_ms: AtomicU64,
    cancel: Mutex<Option<Cancel>>,
    stopped: AtomicU8,
    /// The store is shutting down: stop everything.
    shutdown: Arc<AtomicBool>,
    counts: Arc<StopCounts>,
}

impl Guard {
    pub(crate) fn new(shutdown: Arc<AtomicBool>, counts: Arc<StopCounts>) -> Guard {
        Guard {
            deadline_ns: AtomicU64::new(NO_DEADLINE),
            started_ns: AtomicU64::new(u64::MAX),
            timeout_ms: AtomicU64::new(0),
            cancel: Mutex::new(None),
            stopped: AtomicU8::new(Stopped::Running as u8),
            shutdown,
            counts,
        }
    }

    /// Starts bounding a request: its time runs from now.
    pub(crate) fn start(&self, limits: &Limits) {
        let now = now_ns();
        self.started_ns.store(now, Ordering::Relaxed);
        let deadline = now.saturating_add(limits.timeout.as_nanos() as u64);
        self.timeout_ms
            .store(limits.timeout.as_millis() as u64, Ordering::Relaxed);
        self.deadline_ns.store(deadline, Ordering::Release);
        if let Ok(mut c) = self.cancel.lock() {
            *c = Some(limits.cancel.clone());
        }
        self.stopped
            .store(Stopped::Running as u8, Ordering::Release);
    }

    /// How long the current request has run; zero while none runs.
    pub(crate) fn running_for(&self) -> Duration {
        Duration::from_nanos(now_ns().saturating_sub(self.started_ns.load(Ordering::Relaxed)))
    }

    /// No request runs: nothing to stop.
    pub(crate) fn finish(&self) {
        self.deadline_ns.store(NO_DEADLINE, Ordering::Release);
        self.started_ns.store(u64::MAX, Ordering::Relaxed);
        if let Ok(mut c) = self.cancel.lock() {
            *c = None;
        }
    }

    /// Whether the running statement must stop; records why.
    pub(crate) fn should_stop(&self) -> bool {
        let why = if self.shutdown.load(Ordering::Acquire) {
            Stopped::ShuttingDown
        } else if self
            .cancel
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(Cancel::is_cancelled))
            .unwrap_or(false)
        {
            Stopped::Cancelled
        } else if now_ns() >= self.deadline_ns.load(Ordering::Acquire) {
            Stopped::TimedOut
        } else {
            return false;
        };
        let first = self
            .stopped
            .compare_exchange(
                Stopped::Running as u8,
                why as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if first {
            let counter = match why {
                Stopped::TimedOut => &self.counts.timed_out,
                Stopped::Cancelled => &self.counts.cancelled,
                _ => &self.counts.shut_down,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// What to tell the user about an interrupted statement, if the guard
    /// interrupted it.
    pub(crate) fn interruption(&self) -> Option<String> {
        let why = self.stopped.load(Ordering::Acquire);
        let ms = self.timeout_ms.load(Ordering::Relaxed);
        Some(match why {
            x if x == Stopped::TimedOut as u8 => format!(
                "statement interrupted: the request ran longer than its time limit of {} (the daemon's --statement-timeout or --write-timeout, or the request's db_timeout)",
                human_ms(ms)
            ),
            x if x == Stopped::Cancelled as u8 => {
                "statement cancelled: the client went away".to_string()
            }
            x if x == Stopped::ShuttingDown as u8 => {
                "statement cancelled: tablix is shutting down".to_string()
            }
            _ => return None,
        })
    }
}

fn human_ms(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

struct Entry {
    id: u64,
    guard: Weak<Guard>,
    handle: InterruptHandle,
    interrupted: bool,
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    next_id: u64,
    closed: bool,
    /// The thread sleeps long (nothing was running): a new entry must
    /// wake it. While it polls, entries need no wake-up (one fewer
    /// context switch per request under load).
    parked: bool,
    /// When the last entry was added: the thread parks only after
    /// [`LINGER`] without one, so that a steady stream of short requests,
    /// each over before the thread looks, does not wake it once apiece.
    last_watch: Option<Instant>,
}

/// How long the watchdog goes on polling after the last request began.
const LINGER: Duration = Duration::from_secs(1);

/// Interrupts statements that outlive their request's bounds.
pub(crate) struct Watchdog {
    registry: Mutex<Registry>,
    wake: Condvar,
    shutdown: Arc<AtomicBool>,
    pub(crate) counts: Arc<StopCounts>,
}

/// A request registered with the watchdog; deregisters when dropped.
pub(crate) struct Watched<'a> {
    dog: &'a Watchdog,
    id: u64,
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if let Ok(mut r) = self.dog.registry.lock() {
            r.entries.retain(|e| e.id != self.id);
        }
    }
}

impl Watchdog {
    pub(crate) fn start(shutdown: Arc<AtomicBool>) -> std::io::Result<Arc<Watchdog>> {
        let dog = Arc::new(Watchdog {
            registry: Mutex::new(Registry::default()),
            wake: Condvar::new(),
            shutdown,
            counts: Arc::default(),
        });
        let weak = Arc::downgrade(&dog);
        std::thread::Builder::new()
            .name("tablix-watchdog".into())
            .spawn(move || Watchdog::run(&weak))?;
        Ok(dog)
    }

    /// A guard for a connection whose requests this watchdog watches.
    pub(crate) fn guard(&self) -> Guard {
        Guard::new(Arc::clone(&self.shutdown), Arc::clone(&self.counts))
    }

    /// Watches a request running on the connection `handle` belongs to.
    pub(crate) fn watch(&self, guard: &Arc<Guard>, handle: InterruptHandle) -> Watched<'_> {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.next_id += 1;
        let id = r.next_id;
        r.entries.push(Entry {
            id,
            guard: Arc::downgrade(guard),
            handle,
            interrupted: false,
        });
        r.last_watch = Some(Instant::now());
        let parked = std::mem::take(&mut r.parked);
        drop(r);
        if parked {
            self.wake.notify_one();
        }
        Watched { dog: self, id }
    }

    /// Stops every running request now (SIGTERM, unmount).
    pub(crate) fn stop_all(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.sweep();
    }

    /// Ends the watchdog thread.
    pub(crate) fn close(&self) {
        if let Ok(mut r) = self.registry.lock() {
            r.closed = true;
        }
        self.wake.notify_all();
    }

    fn sweep(&self) -> bool {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        for e in r.entries.iter_mut() {
            if e.interrupted {
                continue;
            }
            if let Some(g) = e.guard.upgrade()
                && g.should_stop()
            {
                e.handle.interrupt();
                e.interrupted = true;
            }
        }
        r.closed
    }

    fn run(weak: &Weak<Watchdog>) {
        loop {
            let Some(dog) = weak.upgrade() else { return };
            if dog.sweep() {
                return;
            }
            let mut r = dog.registry.lock().unwrap_or_else(|p| p.into_inner());
            // Park once nothing has run for a while; else look again
            // shortly.
            r.parked = r.entries.is_empty() && r.last_watch.is_none_or(|t| t.elapsed() >= LINGER);
            let wait = if r.parked {
                Duration::from_secs(1)
            } else {
                WATCH_EVERY
            };
            let _ = dog.wake.wait_timeout(r, wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_stops_for_its_deadline_cancellation_and_shutdown() {
        let shutdown = Arc::new(AtomicBool::new(false));
        let g = Guard::new(Arc::clone(&shutdown), Arc::default());
        assert!(!g.should_stop(), "no request: nothing to stop");
        let cancel = Cancel::new();
        g.start(&Limits {
            timeout: Duration::from_secs(60),
            max_result_bytes: 1,
            cancel: cancel.clone(),
        });
        assert!(!g.should_stop());
        cancel.cancel();
        assert!(g.should_stop());
        assert!(g.interruption().unwrap().contains("client went away"));
        // A request's cancellation follows its connection's.
        let connection = Cancel::new();
        let request = Cancel::linked(&connection);
        request.cancel();
        assert!(!connection.is_cancelled());
        let request = Cancel::linked(&connection);
        connection.cancel();
        assert!(request.is_cancelled());
        g.start(&Limits {
            timeout: Duration::ZERO,
            max_result_bytes: 1,
            cancel: Cancel::new(),
        });
        assert!(g.should_stop());
        assert!(g.interruption().unwrap().contains("time limit of 0 s"));
        g.finish();
        assert!(!g.should_stop());
        shutdown.store(true, Ordering::Release);
        assert!(g.should_stop());
    }

    #[test]
    fn a_request_runs_from_its_start_and_none_runs_after_it_finishes() {
        let g = Guard::new(Arc::default(), Arc::default());
        assert_eq!(g.running_for(), Duration::ZERO, "before any request");
        g.start(&Limits {
            timeout: Duration::from_secs(60),
            max_result_bytes: 1,
            cancel: Cancel::new(),
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(g.running_for() >= Duration::from_millis(20));
        g.finish();
        assert_eq!(g.running_for(), Duration::ZERO, "after the request");
    }

    #[test]
    fn the_watchdog_interrupts_a_long_statement() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let dog = Watchdog::start(Arc::new(AtomicBool::new(false))).unwrap();
        let guard = Arc::new(dog.guard());
        guard.start(&Limits {
            timeout: Duration::from_millis(100),
            max_result_bytes: 1,
            cancel: Cancel::new(),
        });
        let _w = dog.watch(&guard, conn.get_interrupt_handle());
        let started = Instant::now();
        let err = conn
            .query_row(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::OperationInterrupted)
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        dog.close();
    }
}
