//! A scheduler slice of the thread's own choosing (Linux 6.12 and later).
//!
//! Under EEVDF a running thread keeps its CPU until it has used its slice,
//! and a thread woken on that CPU waits for that unless its own deadline
//! comes first; a kernel built without preemption (this one has HZ=250)
//! then lets it run to the next tick. Measured with `perf sched` under
//! `tablix bench hostile`: a client woken beside the writer computing a
//! runaway user write waited 3.8 ms for the tick. A thread with a short
//! slice gets a new, later deadline each time it has used one, so whoever
//! wakes beside it runs at once; its share of the CPU is unchanged (its
//! nice value, not its slice, decides that).
//!
//! The slice is `sched_attr.sched_runtime` of a `SCHED_OTHER` or
//! `SCHED_BATCH` thread. The kernel keeps it between 0.1 and 100 ms;
//! kernels before 6.12 ignore it.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::io;
use std::time::Duration;

/// `struct sched_attr` as far as `SCHED_ATTR_SIZE_VER0`, the part every
/// kernel with `sched_setattr` knows.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;
const SCHED_OTHER: u32 = libc::SCHED_OTHER as u32;
const SCHED_BATCH: u32 = libc::SCHED_BATCH as u32;
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// The calling thread's scheduling attributes.
fn get() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a writable `sched_attr` of `SIZE` bytes and `SIZE`
    // is the size passed, so the kernel writes inside it; thread 0 is the
    // caller.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            SIZE,
            0,
        )
    };
    if r == 0 {
        Ok(attr)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the calling thread's scheduling attributes.
fn set(attr: &SchedAttr) -> io::Result<()> {
    // SAFETY: `attr` is a readable `sched_attr` whose `size` field is its
    // own size, which bounds what the kernel reads; thread 0 is the caller.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, attr as *const SchedAttr, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the calling thread's slice to `runtime` ns (0: the default),
/// keeping its policy and nice value; returns the slice the kernel now
/// gives it, or None where it has none to report (before 6.12) or the
/// thread is under another policy (then nothing is changed).
fn set_runtime(runtime: u64) -> io::Result<Option<Duration>> {
    let mut attr = get()?;
    if attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH {
        return Ok(None);
    }
    attr.size = SIZE;
    attr.sched_flags &= SCHED_FLAG_RESET_ON_FORK;
    attr.sched_runtime = runtime;
    set(&attr)?;
    let now = get()?;
    Ok((now.sched_runtime != 0).then(|| Duration::from_nanos(now.sched_runtime)))
}

/// Asks for slices of `slice` for the calling thread, keeping its policy
/// and nice value. Returns the slice the kernel now gives it, or None where
/// the kernel has no slice to report (before 6.12) or the thread is under
/// another policy (then nothing is changed).
fn request(slice: Duration) -> io::Result<Option<Duration>> {
    // Zero would ask for the default slice.
    set_runtime(u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX).max(1))
}

thread_local! {
    /// Whether [`shorten`] changed this thread's slice since [`restore`].
    static SHORTENED: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread slices of `slice` until [`restore`]; only the
/// first call after a restore asks the kernel. A failure changes nothing.
pub fn shorten(slice: Duration) {
    if SHORTENED.replace(true) {
        return;
    }
    if let Err(e) = request(slice) {
        tracing::debug!("asking for a {slice:?} scheduler slice failed: {e}");
    }
}

/// Gives the calling thread the default slice again if [`shorten`] changed
/// it; otherwise does nothing (no system call).
pub fn restore() {
    if SHORTENED.replace(false)
        && let Err(e) = set_runtime(0)
    {
        tracing::warn!("restoring the default scheduler slice failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the running kernel is at least `major.minor`.
    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
        let mut parts = release
            .trim()
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        have >= (major, minor)
    }

    fn on_a_thread_of_its_own(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().expect("the test thread");
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_within_the_kernels_bounds() {
        on_a_thread_of_its_own(|| {
            let before = get().expect("sched_getattr");
            let got = request(Duration::from_micros(300)).expect("sched_setattr");
            let after = get().expect("sched_getattr");
            assert_eq!(
                (after.sched_policy, after.sched_nice),
                (before.sched_policy, before.sched_nice),
                "the policy and nice value are kept"
            );
            if kernel_at_least(6, 12) {
                assert_eq!(got, Some(Duration::from_micros(300)));
                let least = request(Duration::from_nanos(1)).expect("sched_setattr");
                assert_eq!(
                    least,
                    Some(Duration::from_micros(100)),
                    "the kernel's floor"
                );
            } else {
                assert_eq!(got, None);
            }
        });
    }

    #[test]
    fn a_shortened_thread_gets_its_default_slice_back() {
        on_a_thread_of_its_own(|| {
            let default = get().expect("sched_getattr").sched_runtime;
            restore();
            assert_eq!(get().expect("sched_getattr").sched_runtime, default);
            shorten(Duration::from_micros(200));
            shorten(Duration::from_micros(500));
            let during = get().expect("sched_getattr").sched_runtime;
            restore();
            assert_eq!(get().expect("sched_getattr").sched_runtime, default);
            if kernel_at_least(6, 12) {
                assert_eq!(during, 200_000, "the first shorten counts until restored");
                assert_ne!(default, 200_000);
            }
        });
    }

    #[test]
    fn a_nice_thread_keeps_its_nice_value() {
        on_a_thread_of_its_own(|| {
            rustix::process::setpriority_process(None, 5).expect("raising the nice value");
            request(Duration::from_micros(100)).expect("sched_setattr");
            assert_eq!(get().expect("sched_getattr").sched_nice, 5);
        });
    }

    #[test]
    fn a_thread_under_another_policy_is_left_alone() {
        on_a_thread_of_its_own(|| {
            // Entering SCHED_IDLE is always allowed.
            let mut attr = get().expect("sched_getattr");
            attr.size = SIZE;
            attr.sched_policy = libc::SCHED_IDLE as u32;
            attr.sched_nice = 0;
            attr.sched_runtime = 0;
            set(&attr).expect("entering SCHED_IDLE");
            assert_eq!(request(Duration::from_micros(100)).expect("request"), None);
            assert_eq!(
                get().expect("sched_getattr").sched_policy,
                libc::SCHED_IDLE as u32
            );
        });
    }
}
