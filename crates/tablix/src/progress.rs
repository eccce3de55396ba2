//! Progress of long offline work (fsck, scrub) on standard error: a line
//! every few seconds saying what is being done and how far it got, so a
//! check of a large data directory never runs without a word.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a line is printed.
const EVERY: Duration = Duration::from_secs(2);

struct State {
    what: String,
    done: u64,
    total: u64,
    started: Instant,
    last: Instant,
}

/// Shared by the work's own callbacks and SQLite's progress handler, which
/// ticks during long single statements (an integrity check).
#[derive(Clone)]
pub struct Progress {
    tool: &'static str,
    state: Arc<Mutex<State>>,
}

impl Progress {
    pub fn new(tool: &'static str) -> Progress {
        let now = Instant::now();
        Progress {
            tool,
            state: Arc::new(Mutex::new(State {
                what: String::new(),
                done: 0,
                total: 0,
                started: now,
                last: now,
            })),
        }
    }

    /// Now doing `what`, `done` of `total` units (0 and 0: uncounted).
    pub fn at(&self, what: &str, done: u64, total: u64) {
        if let Ok(mut s) = self.state.lock() {
            if s.what != what {
                s.what = what.to_string();
            }
            s.done = done;
            s.total = total;
        }
        self.tick();
    }

    /// Prints a line if the last was long enough ago.
    pub fn tick(&self) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.last.elapsed() < EVERY {
            return;
        }
        s.last = Instant::now();
        let elapsed = s.started.elapsed().as_secs();
        let count = if s.total > 0 {
            format!(
                ": {} of {} ({}%)",
                s.done,
                s.total,
                s.done * 100 / s.total.max(1)
            )
        } else {
            String::new()
        };
        eprintln!("{}: {}{count}, {elapsed} s so far", self.tool, s.what);
    }

    /// Installs a SQLite progress handler that keeps the lines coming
    /// during long statements.
    pub fn watch(&self, conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
        let me = self.clone();
        conn.progress_handler(
            1_000_000,
            Some(move || {
                me.tick();
                false
            }),
        )
    }
}
