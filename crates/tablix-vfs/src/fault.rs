//! The fault-injecting VFS: the platform VFS with power loss and I/O errors
//! on demand, for crash and error tests.
//!
//! It keeps, per file, the *durable image*: the file's content as of its
//! last `xSync`. [`FaultVfs::freeze`] models the power going out: from then
//! on writes, truncations, syncs and deletes are dropped (and reported as
//! done, as a dying kernel would). [`FaultVfs::power_loss`] then rewrites
//! every file to its durable image, deletes files that were never synced,
//! and deletes the `-shm` wal-index files, which live in memory across a
//! real power loss. Anything SQLite wrote but did not sync is gone: the
//! strictest model of a disk that honours fsync and nothing more.
//! [`FaultVfs::fail_io`] makes writes and syncs fail with SQLITE_IOERR;
//! [`FaultVfs::fill_disk`] makes writes fail with SQLITE_FULL, as the
//! platform VFS reports ENOSPC.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use libsqlite3_sys as ffi;

use crate::clock::{VfsError, find_vfs};

struct State {
    platform: *mut ffi::sqlite3_vfs,
    frozen: AtomicBool,
    failing: AtomicBool,
    full: AtomicBool,
    /// path -> content at the last sync (None: created and never synced).
    images: Mutex<HashMap<PathBuf, Option<Vec<u8>>>>,
}

#[repr(C)]
struct Inner {
    base: ffi::sqlite3_vfs,
    name: CString,
    state: State,
}

impl State {
    /// What a write, truncate or sync returns instead of reaching the disk:
    /// success after the power went out (nothing more is stored), `error`
    /// while I/O is failing, None to go ahead.
    fn intercept(&self, error: c_int) -> Option<c_int> {
        if self.frozen.load(Ordering::SeqCst) {
            Some(ffi::SQLITE_OK)
        } else if self.failing.load(Ordering::SeqCst) {
            Some(error)
        } else if error == ffi::SQLITE_IOERR_WRITE && self.full.load(Ordering::SeqCst) {
            Some(ffi::SQLITE_FULL)
        } else {
            None
        }
    }
}

/// A registered fault-injecting VFS named `tablix-fault-N`.
///
/// Invariant: it must outlive every connection opened with it (or with a
/// VFS layered over it): dropping it unregisters it.
pub struct FaultVfs {
    inner: Box<Inner>,
}

// SAFETY: the state is behind atomics and a mutex; the raw pointers point to
// SQLite's static platform VFS and to this value's own fields.
unsafe impl Send for FaultVfs {}
unsafe impl Sync for FaultVfs {}

/// What an open file looks like: our header, then the platform's file.
#[repr(C)]
struct FaultFile {
    base: ffi::sqlite3_file,
    state: *const State,
    /// Boxed path, or null for files SQLite opens without a name.
    path: *mut PathBuf,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn inner_file(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY (for callers): szOsFile reserves the platform file right after
    // our header, which is a multiple of 8 bytes long.
    unsafe { f.cast::<u8>().add(std::mem::size_of::<FaultFile>()).cast() }
}

impl FaultVfs {
    /// Registers a fault VFS over the default VFS. It is not made the
    /// default; open connections with it by name.
    pub fn register() -> Result<FaultVfs, VfsError> {
        let platform = find_vfs(None)?;
        let name = format!("tablix-fault-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let c_name = CString::new(name.clone()).map_err(|_| VfsError::NoDefaultVfs)?;
        // SAFETY: `platform` is a valid VFS; we copy its limits and then
        // replace every method that must reach our state.
        let mut base: ffi::sqlite3_vfs = unsafe { std::ptr::read(platform) };
        // SAFETY: as above.
        let platform_size = unsafe { (*platform).szOsFile };
        base.iVersion = base.iVersion.min(3);
        base.szOsFile = std::mem::size_of::<FaultFile>() as c_int + platform_size;
        base.pNext = std::ptr::null_mut();
        base.xOpen = Some(x_open);
        base.xDelete = Some(x_delete);
        base.xAccess = Some(x_access);
        base.xFullPathname = Some(x_full_pathname);
        let mut inner = Box::new(Inner {
            base,
            name: c_name,
            state: State {
                platform,
                frozen: AtomicBool::new(false),
                failing: AtomicBool::new(false),
                full: AtomicBool::new(false),
                images: Mutex::new(HashMap::new()),
            },
        });
        inner.base.zName = inner.name.as_ptr();
        inner.base.pAppData = (&inner.state as *const State).cast_mut().cast();
        let ptr: *mut ffi::sqlite3_vfs = &mut inner.base;
        // SAFETY: the Box is never moved out of FaultVfs; Drop unregisters.
        let rc = unsafe { ffi::sqlite3_vfs_register(ptr, 0) };
        if rc != ffi::SQLITE_OK {
            return Err(VfsError::Register { name, code: rc });
        }
        Ok(FaultVfs { inner })
    }

    pub fn name(&self) -> &str {
        self.inner.name.to_str().unwrap_or("")
    }

    /// The power goes out: nothing more reaches the disk.
    pub fn freeze(&self) {
        self.inner.state.frozen.store(true, Ordering::SeqCst);
    }

    /// Makes writes and syncs fail (true) or work again (false).
    pub fn fail_io(&self, on: bool) {
        self.inner.state.failing.store(on, Ordering::SeqCst);
    }

    /// Makes writes fail as on a full disk (true), or fit again (false).
    pub fn fill_disk(&self, on: bool) {
        self.inner.state.full.store(on, Ordering::SeqCst);
    }

    /// Puts every file back to what its last sync made durable, as after a
    /// reboot, and powers back on. Call after `freeze` and after closing
    /// every connection.
    pub fn power_loss(&self) -> std::io::Result<()> {
        let mut images = self
            .inner
            .state
            .images
            .lock()
            .map_err(|_| std::io::Error::other("fault VFS state poisoned"))?;
        for (path, image) in images.drain() {
            match image {
                Some(bytes) => std::fs::write(&path, bytes)?,
                None => match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
            }
            let mut shm = path.into_os_string();
            shm.push("-shm");
            let _ = std::fs::remove_file(shm);
        }
        self.inner.state.frozen.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for FaultVfs {
    fn drop(&mut self) {
        let ptr: *mut ffi::sqlite3_vfs = &mut self.inner.base;
        // SAFETY: registered in `register`.
        unsafe { ffi::sqlite3_vfs_unregister(ptr) };
    }
}

/// # Safety
/// `vfs` must be a fault VFS or a VFS that copied one (its pAppData).
unsafe fn state_of<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a State {
    // SAFETY: guaranteed by the caller.
    unsafe { &*((*vfs).pAppData as *const State) }
}

/// # Safety
/// `f` must be a file opened by `x_open`.
unsafe fn file_parts<'a>(
    f: *mut ffi::sqlite3_file,
) -> (&'a State, Option<&'a Path>, *mut ffi::sqlite3_file) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let ff = &*(f as *const FaultFile);
        let path = if ff.path.is_null() {
            None
        } else {
            Some((*ff.path).as_path())
        };
        (&*ff.state, path, inner_file(f))
    }
}

/// The platform file's method table.
unsafe fn methods(inner: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: a successfully opened platform file has methods for its life.
    unsafe { &*(*inner).pMethods }
}

fn path_of(name: *const c_char) -> Option<PathBuf> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated names.
    let s = unsafe { CStr::from_ptr(name) };
    Some(PathBuf::from(s.to_string_lossy().into_owned()))
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls with our VFS and a buffer of szOsFile bytes.
    unsafe {
        let state = state_of(vfs);
        let path = path_of(name);
        let existed = path.as_deref().is_some_and(Path::exists);
        let inner = inner_file(file);
        let platform = state.platform;
        let rc =
            ((*platform).xOpen.expect("platform xOpen"))(platform, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            (*file).pMethods = std::ptr::null();
            return rc;
        }
        if let Some(p) = &path
            && let Ok(mut images) = state.images.lock()
        {
            images
                .entry(p.clone())
                .or_insert_with(|| if existed { std::fs::read(p).ok() } else { None });
        }
        let ff = file as *mut FaultFile;
        std::ptr::write(
            ff,
            FaultFile {
                base: ffi::sqlite3_file {
                    pMethods: &IO_METHODS,
                },
                state,
                path: path.map_or(std::ptr::null_mut(), |p| Box::into_raw(Box::new(p))),
            },
        );
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: SQLite calls with our VFS.
    unsafe {
        let state = state_of(vfs);
        if state.frozen.load(Ordering::SeqCst) {
            return ffi::SQLITE_OK;
        }
        let platform = state.platform;
        let Some(delete) = (*platform).xDelete else {
            return ffi::SQLITE_ERROR;
        };
        let rc = delete(platform, name, sync_dir);
        if rc == ffi::SQLITE_OK
            && let Some(p) = path_of(name)
            && let Ok(mut images) = state.images.lock()
        {
            images.remove(&p);
        }
        rc
    }
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform VFS.
    unsafe {
        let platform = state_of(vfs).platform;
        match (*platform).xAccess {
            Some(access) => access(platform, name, flags, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform VFS.
    unsafe {
        let platform = state_of(vfs).platform;
        match (*platform).xFullPathname {
            Some(full) => full(platform, name, n, out),
            None => ffi::SQLITE_ERROR,
        }
    }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved_lock),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: Some(f_fetch),
    xUnfetch: Some(f_unfetch),
};

/// Calls the platform method `$m` of the file under `$f`, or returns `$none`
/// if the platform file lacks it.
macro_rules! forward {
    ($f:expr, $m:ident, $none:expr $(, $arg:expr)*) => {{
        // SAFETY: `$f` is a file opened by x_open.
        let (_, _, inner) = unsafe { file_parts($f) };
        // SAFETY: the platform file is open.
        match unsafe { methods(inner) }.$m {
            // SAFETY: same arguments SQLite gave us, on the platform file.
            Some(m) => unsafe { m(inner $(, $arg)*) },
            None => $none,
        }
    }};
}

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    let rc = forward!(f, xClose, ffi::SQLITE_OK);
    // SAFETY: the path was boxed by x_open and is freed once, here.
    unsafe {
        let ff = &mut *(f as *mut FaultFile);
        if !ff.path.is_null() {
            drop(Box::from_raw(ff.path));
            ff.path = std::ptr::null_mut();
        }
    }
    rc
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    off: i64,
) -> c_int {
    forward!(f, xRead, ffi::SQLITE_IOERR, buf, n, off)
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    off: i64,
) -> c_int {
    // SAFETY: `f` is ours.
    let (state, _, _) = unsafe { file_parts(f) };
    if let Some(rc) = state.intercept(ffi::SQLITE_IOERR_WRITE) {
        return rc;
    }
    forward!(f, xWrite, ffi::SQLITE_IOERR_WRITE, buf, n, off)
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: `f` is ours.
    let (state, _, _) = unsafe { file_parts(f) };
    if let Some(rc) = state.intercept(ffi::SQLITE_IOERR_TRUNCATE) {
        return rc;
    }
    forward!(f, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn f_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `f` is ours.
    let (state, path, _) = unsafe { file_parts(f) };
    if let Some(rc) = state.intercept(ffi::SQLITE_IOERR_FSYNC) {
        return rc;
    }
    let rc = forward!(f, xSync, ffi::SQLITE_OK, flags);
    if rc == ffi::SQLITE_OK
        && let Some(p) = path
        && let Ok(mut images) = state.images.lock()
    {
        images.insert(p.to_path_buf(), std::fs::read(p).ok());
    }
    rc
}

unsafe extern "C" fn f_file_size(f: *mut ffi::sqlite3_file, out: *mut i64) -> c_int {
    forward!(f, xFileSize, ffi::SQLITE_IOERR, out)
}

unsafe extern "C" fn f_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(f, xLock, ffi::SQLITE_OK, level)
}

unsafe extern "C" fn f_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(f, xUnlock, ffi::SQLITE_OK, level)
}

unsafe extern "C" fn f_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(f, xCheckReservedLock, ffi::SQLITE_OK, out)
}

unsafe extern "C" fn f_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    forward!(f, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn f_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    forward!(f, xSectorSize, 4096)
}

unsafe extern "C" fn f_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    forward!(f, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn f_shm_map(
    f: *mut ffi::sqlite3_file,
    pg: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(f, xShmMap, ffi::SQLITE_IOERR_SHMMAP, pg, size, extend, out)
}

unsafe extern "C" fn f_shm_lock(
    f: *mut ffi::sqlite3_file,
    off: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    forward!(f, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, off, n, flags)
}

unsafe extern "C" fn f_shm_barrier(f: *mut ffi::sqlite3_file) {
    forward!(f, xShmBarrier, ())
}

unsafe extern "C" fn f_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(f, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn f_fetch(
    f: *mut ffi::sqlite3_file,
    off: i64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `out` is valid; a NULL result tells SQLite to read instead.
    unsafe { *out = std::ptr::null_mut() };
    forward!(f, xFetch, ffi::SQLITE_OK, off, n, out)
}

unsafe extern "C" fn f_unfetch(f: *mut ffi::sqlite3_file, off: i64, p: *mut c_void) -> c_int {
    forward!(f, xUnfetch, ffi::SQLITE_OK, off, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn open(path: &Path, vfs: &str) -> Connection {
        Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            vfs,
        )
        .unwrap()
    }

    fn count(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn unsynced_writes_are_lost_and_synced_ones_kept() {
        let dir = std::env::temp_dir().join(format!("tablix-fault-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let vfs = FaultVfs::register().unwrap();
        let path = dir.join("f.db");
        let conn = open(&path, vfs.name());
        conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("PRAGMA synchronous=FULL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        // Without fsync on commit, later commits are not durable.
        conn.execute_batch(
            "PRAGMA synchronous=OFF; INSERT INTO t VALUES (2); INSERT INTO t VALUES (3);",
        )
        .unwrap();
        vfs.freeze();
        drop(conn);
        vfs.power_loss().unwrap();
        assert_eq!(count(&path), 1, "unsynced commits survived the power loss");
        // A sync of the journal alone (the store's async flush) makes the
        // commits before it durable.
        let conn = open(&path, vfs.name());
        conn.execute_batch("PRAGMA synchronous=OFF; INSERT INTO t VALUES (6);")
            .unwrap();
        crate::sync_journal(&conn).unwrap();
        conn.execute_batch("INSERT INTO t VALUES (7);").unwrap();
        vfs.freeze();
        drop(conn);
        vfs.power_loss().unwrap();
        assert_eq!(
            count(&path),
            2,
            "the journal sync was not durable, or more was"
        );
        // I/O errors are reported, and nothing is half-written.
        let conn = open(&path, vfs.name());
        vfs.fail_io(true);
        assert!(conn.execute("INSERT INTO t VALUES (4)", []).is_err());
        vfs.fail_io(false);
        conn.execute("INSERT INTO t VALUES (5)", []).unwrap();
        // A full disk is SQLITE_FULL, and frees up again.
        vfs.fill_disk(true);
        let big = "INSERT INTO t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) SELECT randomblob(100000) FROM n";
        let full = conn.execute(big, []).unwrap_err();
        assert_eq!(
            full.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DiskFull),
            "{full}"
        );
        vfs.fill_disk(false);
        drop(conn);
        assert_eq!(count(&path), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
