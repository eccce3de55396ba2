//! User SQL runs at the lowest CPU priority (nice 19) while its request's
//! statements run, so that a query computing for seconds delays the
//! mount's requests by a wakeup, not by a scheduler slice (measured with
//! four runaway queries on two cores, `tablix bench hostile`: a stat on
//! the mount waited 4.0 ms at the 99th percentile at equal priority,
//! 35-60 us at nice 19, 40 us idle).
//!
//! Linux keeps a nice value per thread, and `setpriority(PRIO_PROCESS, 0)`
//! sets the calling thread's alone. Lowering a priority is always allowed;
//! raising it back needs `CAP_SYS_NICE` or a `RLIMIT_NICE` that allows it.
//! User SQL runs on threads that serve other work too (the writer thread,
//! the API's blocking pool), so a thread is lowered only where it can be
//! raised again afterwards, which is probed once, on a thread of its own.

use std::sync::OnceLock;

use rustix::process::{getpriority_process, setpriority_process};

/// The nice value user SQL runs at.
pub(crate) const USER_SQL_NICE: i32 = 19;

/// Whether this process may raise a thread's priority back to where it
/// was; found out on a scratch thread, whose priority then dies with it.
fn may_restore() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        std::thread::Builder::new()
            .name("tablix-nice-probe".into())
            .spawn(|| {
                let Ok(before) = getpriority_process(None) else {
                    return false;
                };
                setpriority_process(None, USER_SQL_NICE).is_ok()
                    && setpriority_process(None, before).is_ok()
            })
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false)
    })
}

/// The calling thread at [`USER_SQL_NICE`] until dropped, when the
/// process may restore it; otherwise nothing changes.
pub(crate) struct Lowered {
    before: Option<i32>,
}

impl Lowered {
    pub(crate) fn enter() -> Lowered {
        let before = getpriority_process(None)
            .ok()
            .filter(|&n| n < USER_SQL_NICE && may_restore())
            .filter(|_| setpriority_process(None, USER_SQL_NICE).is_ok());
        Lowered { before }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if let Some(before) = self.before
            && let Err(e) = setpriority_process(None, before)
        {
            tracing::warn!("restoring a thread's priority to nice {before} failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_runs_user_sql_at_nice_19_and_gets_its_priority_back() {
        std::thread::spawn(|| {
            let before = getpriority_process(None).expect("getpriority");
            {
                let _low = Lowered::enter();
                let during = getpriority_process(None).expect("getpriority");
                if may_restore() {
                    assert_eq!(during, USER_SQL_NICE);
                } else {
                    assert_eq!(during, before, "lowered without a way back");
                }
            }
            assert_eq!(getpriority_process(None).expect("getpriority"), before);
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    #[ignore = "needs root to raise a priority back: make test runs it as root"]
    fn root_lowers_user_sql_and_restores_it() {
        assert!(rustix::process::geteuid().is_root(), "run as root");
        assert!(may_restore());
    }
}
