//! The command-clock VFS: the platform VFS with a settable clock.

use std::ffi::{CStr, CString, c_int};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use libsqlite3_sys as ffi;

/// Milliseconds between the Julian day epoch and the Unix epoch, the unit
/// SQLite's `xCurrentTimeInt64` reports in.
const UNIX_EPOCH_JULIAN_MS: i64 = 210_866_760_000_000;

/// Errors registering a VFS.
#[derive(Debug, thiserror::Error)]
pub enum VfsError {
    #[error("SQLite has no default VFS to wrap")]
    NoDefaultVfs,
    #[error("no SQLite VFS is registered as {0:?}")]
    Unknown(String),
    #[error("registering VFS {name} failed with SQLite result code {code}")]
    Register { name: String, code: c_int },
}

/// The registered VFS named `name`, or the default VFS when None.
/// Initialises SQLite first (idempotent), which registers the built-in VFSes.
pub(crate) fn find_vfs(name: Option<&str>) -> Result<*mut ffi::sqlite3_vfs, VfsError> {
    let c_name = match name {
        Some(n) => Some(CString::new(n).map_err(|_| VfsError::Unknown(n.to_string()))?),
        None => None,
    };
    // SAFETY: sqlite3_initialize is idempotent and thread-safe; a null name
    // asks for the default VFS; SQLite returns a registered structure or
    // null.
    let vfs = unsafe {
        ffi::sqlite3_initialize();
        ffi::sqlite3_vfs_find(c_name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()))
    };
    if vfs.is_null() {
        return Err(match name {
            Some(n) => VfsError::Unknown(n.to_string()),
            None => VfsError::NoDefaultVfs,
        });
    }
    Ok(vfs)
}

/// Layout handed to SQLite: `base` must stay the first field so that the
/// `sqlite3_vfs*` SQLite passes back can be cast to `*const Inner`.
#[repr(C)]
struct Inner {
    base: ffi::sqlite3_vfs,
    /// Current command time, milliseconds since the Julian day epoch.
    now_julian_ms: AtomicI64,
    name: CString,
}

/// A registered VFS named `tablix-clock-N` that behaves exactly like the
/// platform VFS except that its clock reads the value last given to
/// [`ClockVfs::set_unix_nanos`].
///
/// Invariant: the registration lives as long as this value; dropping it
/// unregisters the VFS, so every connection opened with it must be closed
/// first (the store keeps the connection in a field declared before it).
pub struct ClockVfs {
    inner: Box<Inner>,
}

// SAFETY: `Inner` is only mutated through its atomic; the raw pointers in
// `base` point to SQLite's static platform VFS and to `name`, both of which
// outlive the registration.
unsafe impl Send for ClockVfs {}
unsafe impl Sync for ClockVfs {}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl ClockVfs {
    /// Registers a new clock VFS wrapping the default VFS. It is not made
    /// the default; open connections with it by name.
    pub fn register() -> Result<ClockVfs, VfsError> {
        ClockVfs::register_over(None)
    }

    /// Registers a clock VFS over the VFS named `base` (the default VFS if
    /// None), which must stay registered while this one is.
    pub fn register_over(base: Option<&str>) -> Result<ClockVfs, VfsError> {
        let platform = find_vfs(base)?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = format!("tablix-clock-{id}");
        let c_name = CString::new(name.clone()).map_err(|_| VfsError::NoDefaultVfs)?;
        // SAFETY: `platform` is non-null and points to a fully initialised
        // sqlite3_vfs; copying it keeps its methods, szOsFile and pAppData,
        // which the platform methods read back through the pointer we pass.
        let mut base: ffi::sqlite3_vfs = unsafe { std::ptr::read(platform) };
        base.pNext = std::ptr::null_mut();
        base.xCurrentTime = Some(current_time);
        base.xCurrentTimeInt64 = if base.iVersion >= 2 {
            Some(current_time_int64)
        } else {
            None
        };
        let mut inner = Box::new(Inner {
            base,
            now_julian_ms: AtomicI64::new(UNIX_EPOCH_JULIAN_MS),
            name: c_name,
        });
        inner.base.zName = inner.name.as_ptr();
        let ptr: *mut ffi::sqlite3_vfs = &mut inner.base;
        // SAFETY: `ptr` stays valid until `Drop` unregisters it: the Box is
        // never moved out of `ClockVfs`.
        let rc = unsafe { ffi::sqlite3_vfs_register(ptr, 0) };
        if rc != ffi::SQLITE_OK {
            return Err(VfsError::Register { name, code: rc });
        }
        Ok(ClockVfs { inner })
    }

    /// The name to pass as the `vfs` argument when opening a connection.
    pub fn name(&self) -> &str {
        // The name was built from a Rust String, so it is valid UTF-8.
        self.inner.name.to_str().unwrap_or("")
    }

    /// Sets the time every connection using this VFS sees as "now".
    pub fn set_unix_nanos(&self, unix_nanos: i64) {
        let ms = unix_nanos.div_euclid(1_000_000) + UNIX_EPOCH_JULIAN_MS;
        self.inner.now_julian_ms.store(ms, Ordering::Release);
    }
}

impl Drop for ClockVfs {
    fn drop(&mut self) {
        let ptr: *mut ffi::sqlite3_vfs = &mut self.inner.base;
        // SAFETY: registered in `register`; unregistering an unknown VFS is
        // a no-op in SQLite.
        unsafe { ffi::sqlite3_vfs_unregister(ptr) };
    }
}

/// Reads the command time of the VFS SQLite called us through.
///
/// # Safety
/// `vfs` must be the `base` field of a live `Inner`.
unsafe fn now_of(vfs: *mut ffi::sqlite3_vfs) -> i64 {
    // SAFETY: guaranteed by the caller; `base` is the first field of a
    // repr(C) struct.
    let inner = unsafe { &*(vfs as *const Inner) };
    inner.now_julian_ms.load(Ordering::Acquire)
}

unsafe extern "C" fn current_time_int64(vfs: *mut ffi::sqlite3_vfs, out: *mut i64) -> c_int {
    // SAFETY: SQLite calls this with the registered VFS and a valid out ptr.
    unsafe { *out = now_of(vfs) };
    ffi::SQLITE_OK
}

unsafe extern "C" fn current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: as above.
    unsafe { *out = now_of(vfs) as f64 / 86_400_000.0 };
    ffi::SQLITE_OK
}

/// Whether SQLite knows a VFS by this name (used by tests and diagnostics).
pub fn is_registered(name: &CStr) -> bool {
    // SAFETY: `name` is a valid NUL-terminated string.
    !unsafe { ffi::sqlite3_vfs_find(name.as_ptr()) }.is_null()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    #[test]
    fn now_comes_from_the_command_clock() {
        let vfs = ClockVfs::register().unwrap();
        let dir = std::env::temp_dir().join(format!("tablix-vfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clock.db");
        let conn = Connection::open_with_flags_and_vfs(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            vfs.name(),
        )
        .unwrap();
        // 2001-09-09 01:46:40 UTC
        vfs.set_unix_nanos(1_000_000_000 * 1_000_000_000);
        let t: String = conn
            .query_row("SELECT datetime('now')", [], |r| r.get(0))
            .unwrap();
        assert_eq!(t, "2001-09-09 01:46:40");
        vfs.set_unix_nanos(0);
        let e: i64 = conn
            .query_row("SELECT unixepoch('now')", [], |r| r.get(0))
            .unwrap();
        assert_eq!(e, 0);
        // The file itself is written through the platform VFS unchanged.
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(conn);
        let name = CString::new(vfs.name()).unwrap();
        assert!(is_registered(&name));
        drop(vfs);
        assert!(!is_registered(&name));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
