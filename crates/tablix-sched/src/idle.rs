//! `SCHED_IDLE` for the span of a piece of work: while a [`Lowered`]
//! lives, any other runnable thread of the machine goes first, and a thread
//! that wakes takes the CPU from the lowered one at once rather than after
//! a scheduler slice.
//!
//! Linux keeps the policy per thread. Entering `SCHED_IDLE` is always
//! allowed; leaving it needs `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows
//! the thread's nice value. The threads lowered serve other work too (the
//! store runs user queries on the API's blocking pool), so a thread enters
//! `SCHED_IDLE` only where it can leave it again, which is probed once, on
//! a thread of its own. Without the capability nothing is lowered.
//!
//! A lowered thread also gives way ([`give_way`], called from a loop it
//! runs, such as SQLite's progress handler): the first call after each
//! [`GIVE_WAY_EVERY`] of running yields. `SCHED_IDLE` alone does not make
//! it step aside for a thread that is already runnable. EEVDF picks among
//! the threads *eligible* on a CPU (those not ahead of their fair share),
//! so when the only other runnable thread has run ahead by a hair, the
//! idle thread is picked, and it then keeps the CPU for its whole slice,
//! which is wall time whatever its weight: on this kernel (HZ=250, no
//! preemption) nothing looks again before the next tick. Traced with the
//! scheduler's tracepoints under `tablix bench hostile`: a client whose
//! FUSE reply had woken it waited 3.5 ms while a runaway query ran. A
//! yield makes the scheduler pick again at once (EEVDF's `yield_task_fair`
//! charges the time run and moves the yielding thread's deadline back);
//! with nothing else runnable it is one system call. Without the
//! capability to lower, the thread still gives way.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::process::{getpriority_process, setpriority_process};
use thread_priority::{
    NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
    set_thread_priority_and_policy, thread_native_id, thread_schedule_policy,
};

fn policy(p: NormalThreadSchedulePolicy) -> ThreadSchedulePolicy {
    ThreadSchedulePolicy::Normal(p)
}

/// Puts the calling thread under `SCHED_IDLE`; returns its nice value to
/// restore, or None (and changes nothing) unless it ran under
/// `SCHED_OTHER`.
fn idle() -> Option<i32> {
    if thread_schedule_policy().ok()? != policy(NormalThreadSchedulePolicy::Other) {
        return None;
    }
    let nice = getpriority_process(None).ok()?;
    // The crate sets the nice value too: SCHED_IDLE's only one, 0 (which
    // SCHED_IDLE ignores). It may fail there for a thread at a higher nice
    // value; the policy is then set already, and `restore` undoes both.
    let _ = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        policy(NormalThreadSchedulePolicy::Idle),
    );
    Some(nice)
}

/// Puts the calling thread back under `SCHED_OTHER` at `nice`.
fn restore(nice: i32) -> Result<(), String> {
    // Min under SCHED_OTHER is nice 19, always allowed; then down to `nice`.
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        policy(NormalThreadSchedulePolicy::Other),
    )
    .map_err(|e| format!("{e:?}"))?;
    setpriority_process(None, nice).map_err(|e| e.to_string())
}

/// Whether this process may take a thread out of `SCHED_IDLE` again;
/// found out on a scratch thread, whose policy then dies with it.
fn may_restore() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        std::thread::Builder::new()
            .name("tablix-sched-probe".into())
            .spawn(|| {
                let Some(nice) = idle() else {
                    return false;
                };
                restore(nice).is_ok()
                    && thread_schedule_policy().ok()
                        == Some(policy(NormalThreadSchedulePolicy::Other))
                    && getpriority_process(None).ok() == Some(nice)
            })
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false)
    })
}

/// How long a lowered thread runs between two yields: what a thread ready
/// beside it may wait (plus one call of the loop that gives way).
pub const GIVE_WAY_EVERY: Duration = Duration::from_micros(100);

thread_local! {
    /// While a [`Lowered`] lives on this thread: when it last gave way.
    static GAVE_WAY: Cell<Option<Instant>> = const { Cell::new(None) };
    /// A [`Lowered::after`] guard not yet lowered: when it is to be.
    static LOWER_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The nice value a [`Lowered::after`] guard lowered the thread from.
    static LOWERED_FROM: Cell<Option<i32>> = const { Cell::new(None) };
}

/// Yields the CPU if the calling thread is lowered and has not yielded for
/// [`GIVE_WAY_EVERY`]; otherwise returns at once (no system call). A
/// thread whose [`Lowered::after`] delay has passed is lowered first.
/// Returns whether it yielded.
pub fn give_way() -> bool {
    let now = Instant::now();
    if let Some(at) = LOWER_AT.get()
        && now >= at
    {
        LOWER_AT.set(None);
        if may_restore() {
            LOWERED_FROM.set(idle());
        }
    }
    if !due(now) {
        return false;
    }
    std::thread::yield_now();
    // The period starts when the thread runs again: a lowered thread may
    // wait long for its turn, and that wait is not running.
    GAVE_WAY.set(Some(Instant::now()));
    true
}

/// Whether a lowered thread is due to give way at `now`.
fn due(now: Instant) -> bool {
    GAVE_WAY
        .get()
        .is_some_and(|last| now.saturating_duration_since(last) >= GIVE_WAY_EVERY)
}

/// The calling thread under `SCHED_IDLE`, where the process may take it
/// out again, and giving way ([`give_way`]) until dropped.
#[must_use = "the thread is lowered only while the guard lives"]
pub struct Lowered {
    nice: Option<i32>,
    /// Lowered by [`give_way`] once its delay passed, if at all.
    later: bool,
    /// What the mark was before: an enclosing guard's.
    was: Option<Instant>,
    /// Dropped on the thread it lowered: the policy and the thread-local
    /// mark belong to that thread.
    _thread: PhantomData<*const ()>,
}

impl Lowered {
    pub fn enter() -> Lowered {
        let was = GAVE_WAY.replace(Some(Instant::now()));
        Lowered {
            nice: if may_restore() { idle() } else { None },
            later: false,
            was,
            _thread: PhantomData,
        }
    }

    /// Gives way from now on, as [`Lowered::enter`], but enters
    /// `SCHED_IDLE` only at the first [`give_way`] after `delay`: work
    /// shorter than that pays no scheduler call. Not nested in another
    /// guard of its kind.
    pub fn after(delay: Duration) -> Lowered {
        let now = Instant::now();
        let was = GAVE_WAY.replace(Some(now));
        LOWER_AT.set(Some(now + delay));
        Lowered {
            nice: None,
            later: true,
            was,
            _thread: PhantomData,
        }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        GAVE_WAY.set(self.was);
        if self.later {
            LOWER_AT.set(None);
            self.nice = LOWERED_FROM.take();
        }
        if let Some(nice) = self.nice
            && let Err(e) = restore(nice)
        {
            tracing::warn!("taking a thread out of SCHED_IDLE failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> (Option<ThreadSchedulePolicy>, i32) {
        (
            thread_schedule_policy().ok(),
            getpriority_process(None).expect("getpriority"),
        )
    }

    #[test]
    fn a_lowered_thread_gets_its_policy_back() {
        std::thread::spawn(|| {
            let before = now();
            {
                let _low = Lowered::enter();
                let during = now().0;
                if may_restore() {
                    assert_eq!(during, Some(policy(NormalThreadSchedulePolicy::Idle)));
                } else {
                    assert_eq!(during, before.0, "lowered without a way back");
                }
            }
            assert_eq!(now(), before);
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn a_thread_lowered_later_is_lowered_only_once_its_delay_passed() {
        std::thread::spawn(|| {
            let before = now();
            {
                let _low = Lowered::after(Duration::from_secs(3600));
                give_way();
                assert_eq!(now(), before, "lowered before its delay");
            }
            assert_eq!(now(), before);
            {
                let _low = Lowered::after(Duration::ZERO);
                give_way();
                let during = now().0;
                if may_restore() {
                    assert_eq!(during, Some(policy(NormalThreadSchedulePolicy::Idle)));
                } else {
                    assert_eq!(during, before.0, "lowered without a way back");
                }
            }
            assert_eq!(now(), before, "the policy came back");
        })
        .join()
        .expect("the test thread");
    }

    /// The periods are checked at chosen instants, not by sleeping: a
    /// lowered thread on a busy machine may wait longer than a period
    /// between any two calls.
    #[test]
    fn only_a_lowered_thread_gives_way_and_not_more_often_than_its_period() {
        std::thread::spawn(|| {
            let far = Instant::now() + 1000 * GIVE_WAY_EVERY;
            assert!(!due(far), "not lowered");
            assert!(!give_way(), "not lowered");
            {
                let _low = Lowered::enter();
                let entered = GAVE_WAY.get().expect("a mark while lowered");
                assert!(!due(entered + GIVE_WAY_EVERY / 2), "within its period");
                assert!(due(entered + GIVE_WAY_EVERY), "a period later");
                std::thread::sleep(GIVE_WAY_EVERY);
                let before = Instant::now();
                assert!(give_way(), "a period later, for real");
                let gave = GAVE_WAY.get().expect("a mark while lowered");
                assert!(gave >= before, "the period restarts when it gave way");
                assert!(!due(gave + GIVE_WAY_EVERY / 2), "just gave way");
                {
                    let _inner = Lowered::enter();
                    let inner = GAVE_WAY.get().expect("the inner guard's mark");
                    assert!(inner >= gave, "the inner guard starts a period");
                }
                assert_eq!(GAVE_WAY.get(), Some(gave), "the outer guard's period again");
            }
            assert!(!due(far), "no longer lowered");
            assert!(!give_way(), "no longer lowered");
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn a_nice_thread_keeps_its_nice_value() {
        std::thread::spawn(|| {
            setpriority_process(None, 7).expect("raising the nice value");
            {
                let _low = Lowered::enter();
            }
            assert_eq!(now().1, 7);
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    #[ignore = "needs root to leave SCHED_IDLE: make test runs it as root"]
    fn root_may_lower_a_thread() {
        assert!(rustix::process::geteuid().is_root(), "run as root");
        assert!(may_restore());
    }
}
