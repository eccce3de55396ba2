//! The overlay VFS (`tablix-overlay`): a private, writable view of one
//! committed state of a database.
//!
//! An interactive transaction runs on a connection of its own whose main
//! database is an [`Overlay`]: a page it has not written is read from a
//! [`PageSource`] (the store reads it from a connection that holds a read
//! transaction of the real database open, so every page comes from the same
//! snapshot), and a page it writes stays in the overlay's memory, seen by
//! that connection alone. Nothing written here ever reaches the real
//! database: the store takes the transaction's changes out as a changeset
//! (`session.rs`) and applies that through its single writer.
//!
//! The real database is in WAL mode, which the overlay cannot give (it
//! has no shared memory): page 1 is served with the header's read and
//! write versions at 1, so SQLite treats the view as a rollback-journal
//! database. At every [`Overlay::reset`] its file change counter becomes
//! one more than the view last held, which is the counter the connection's
//! page cache is valid for: a connection that keeps its cache between
//! statements (locking mode NORMAL) throws it away when the view moves to
//! another snapshot, and keeps it otherwise. DESIGN.md gives the
//! life cycle and the invariants.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libsqlite3_sys as ffi;

use crate::clock::{VfsError, find_vfs};

/// The name connections pass as `vfs=` to open an overlay.
pub const OVERLAY_VFS_NAME: &str = "tablix-overlay";

/// Names of overlays start so; nothing else is opened under such a name.
const PREFIX: &str = "tablix-overlay-";

/// Where an overlay's unwritten pages come from: one committed state of a
/// database, page by page. Calls come from inside SQLite, on the thread
/// that runs the overlay's connection.
pub trait PageSource: Send + Sync {
    /// The database's page size in bytes.
    fn page_size(&self) -> usize;
    /// How many pages the database has in this state.
    fn page_count(&self) -> u32;
    /// Copies page `pgno` (from 1) into `out`, which is one page long.
    fn read_page(&self, pgno: u32, out: &mut [u8]) -> Result<(), String>;
}

/// What one overlay holds.
struct View {
    source: Option<Arc<dyn PageSource>>,
    page_size: usize,
    /// Pages this view changed, and page 1, kept as served.
    pages: HashMap<u32, Box<[u8]>>,
    /// Bytes of the view's database.
    size: u64,
    /// Pages past this read as zeros: a truncation cut the source's.
    source_pages: u32,
    /// Most bytes `pages` may hold beyond page 1.
    limit: usize,
    /// Bytes `pages` holds beyond page 1.
    used: usize,
    /// The first failure to read the source since the last reset.
    source_error: Option<String>,
    /// Whether a write was refused for the limit since the last reset.
    over_limit: bool,
    /// Page 1's change counter as the view last held it: the connection's
    /// page cache is valid for that counter, so a reset serves the next.
    counter: u32,
}

impl View {
    fn empty(limit: usize) -> View {
        View {
            source: None,
            page_size: 4096,
            pages: HashMap::new(),
            size: 0,
            source_pages: 0,
            limit,
            used: 0,
            source_error: None,
            over_limit: false,
            counter: 0,
        }
    }

    /// Page 1's change counter as the view holds it now.
    fn held_counter(&self) -> u32 {
        self.pages
            .get(&1)
            .and_then(|p| p.get(24..28))
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(self.counter, u32::from_be_bytes)
    }

    /// Copies page `pgno` as the view has it into `out`.
    fn read_page(&mut self, pgno: u32, out: &mut [u8]) -> Result<(), c_int> {
        if let Some(p) = self.pages.get(&pgno) {
            out.copy_from_slice(p);
            return Ok(());
        }
        if pgno > self.source_pages {
            out.fill(0);
            return Ok(());
        }
        let Some(source) = &self.source else {
            return Err(ffi::SQLITE_IOERR_READ);
        };
        source.read_page(pgno, out).map_err(|e| {
            self.source_error.get_or_insert(e);
            ffi::SQLITE_IOERR_READ
        })
    }

    /// The view's own copy of page `pgno`, made from what it reads now if
    /// it had none; fails past the limit.
    fn own_page(&mut self, pgno: u32) -> Result<&mut [u8], c_int> {
        if !self.pages.contains_key(&pgno) {
            if self.used.saturating_add(self.page_size) > self.limit {
                self.over_limit = true;
                return Err(ffi::SQLITE_FULL);
            }
            let mut page = vec![0u8; self.page_size].into_boxed_slice();
            self.read_page(pgno, &mut page)?;
            self.pages.insert(pgno, page);
            self.used += self.page_size;
        }
        self.pages
            .get_mut(&pgno)
            .map(|p| &mut p[..])
            .ok_or(ffi::SQLITE_IOERR_WRITE)
    }
}

/// A private view of a database, registered under a name of its own for
/// as long as this value lives. Open it with [`Overlay::uri`]; point it at
/// a state with [`Overlay::reset`] before the connection reads it.
pub struct Overlay {
    name: String,
    view: Arc<Mutex<View>>,
}

static NEXT_OVERLAY: AtomicU64 = AtomicU64::new(1);

fn registry() -> MutexGuard<'static, HashMap<String, Arc<Mutex<View>>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Mutex<View>>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn lock(view: &Mutex<View>) -> MutexGuard<'_, View> {
    // Every update of a view is completed before its lock is released
    // (no call that can panic runs half way through one).
    view.lock().unwrap_or_else(|e| e.into_inner())
}

impl Overlay {
    /// A new, empty overlay whose private pages may hold up to `limit`
    /// bytes (page 1 aside); registers the VFS if needed.
    pub fn new(limit: usize) -> Result<Overlay, VfsError> {
        register_overlay_vfs()?;
        let name = format!("{PREFIX}{}", NEXT_OVERLAY.fetch_add(1, Ordering::Relaxed));
        let view = Arc::new(Mutex::new(View::empty(limit)));
        registry().insert(name.clone(), Arc::clone(&view));
        Ok(Overlay { name, view })
    }

    /// The URI a connection opens this overlay with.
    pub fn uri(&self) -> String {
        format!("file:{}?vfs={OVERLAY_VFS_NAME}", self.name)
    }

    /// Makes the view `source`'s state, with no private page: what the
    /// view held is dropped. A connection open on it sees the new state at
    /// its next transaction (the change counter differs).
    pub fn reset(&self, source: Arc<dyn PageSource>) -> Result<(), String> {
        let page_size = source.page_size();
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(format!(
                "the source's page size {page_size} is not SQLite's"
            ));
        }
        let pages = source.page_count();
        let mut first = vec![0u8; page_size].into_boxed_slice();
        let mut v = lock(&self.view);
        // A connection caches pages for the change counter it last read or
        // wrote, which is the one the view holds: the next one differs.
        let generation = v.held_counter().wrapping_add(1);
        if pages > 0 {
            source.read_page(1, &mut first)?;
            // A rollback-journal database to the connection (bytes 18 and
            // 19), whose change counter (24) is new, and whose in-header
            // size is not trusted (92, the counter it is valid for,
            // differs), so SQLite sizes it by `xFileSize`.
            first[18] = 1;
            first[19] = 1;
            first[24..28].copy_from_slice(&generation.to_be_bytes());
            first[92..96].copy_from_slice(&generation.wrapping_add(1).to_be_bytes());
        }
        v.counter = generation;
        v.pages.clear();
        if pages > 0 {
            v.pages.insert(1, first);
        }
        v.source = Some(source);
        v.page_size = page_size;
        v.size = u64::from(pages) * page_size as u64;
        v.source_pages = pages;
        v.used = 0;
        v.source_error = None;
        v.over_limit = false;
        Ok(())
    }

    /// Lets go of the source and every private page; the view reads as
    /// an empty file until the next reset.
    pub fn clear(&self) {
        let mut v = lock(&self.view);
        let (limit, counter) = (v.limit, v.held_counter());
        *v = View::empty(limit);
        v.counter = counter;
    }

    /// Bytes of private pages the view holds (page 1 aside).
    pub fn private_bytes(&self) -> usize {
        lock(&self.view).used
    }

    /// Sets the most bytes private pages may take (page 1 aside).
    pub fn set_limit(&self, limit: usize) {
        lock(&self.view).limit = limit;
    }

    /// Whether a write was refused because the private pages would pass
    /// the limit, since the last reset or the last time this was asked.
    pub fn take_over_limit(&self) -> bool {
        std::mem::take(&mut lock(&self.view).over_limit)
    }

    /// The first failure to read the source since the last reset.
    pub fn source_error(&self) -> Option<String> {
        lock(&self.view).source_error.clone()
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        registry().remove(&self.name);
    }
}

/// What SQLite allocates per file opened through this VFS: an overlay's
/// main database uses this header; any other file is the platform's own.
#[repr(C)]
struct OverlayFile {
    base: ffi::sqlite3_file,
    /// From `Arc::into_raw`; released in xClose.
    view: *const Mutex<View>,
}

/// Keeps the registered structure alive for the rest of the process.
struct Registered {
    _vfs: Box<ffi::sqlite3_vfs>,
}
// SAFETY: the structure is written once before registration and only read
// by SQLite afterwards; its pointers are to static data.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

/// Registers the overlay VFS (once per process). It is not the default.
pub fn register_overlay_vfs() -> Result<&'static str, VfsError> {
    static REGISTERED: OnceLock<Result<Registered, String>> = OnceLock::new();
    let result = REGISTERED.get_or_init(|| {
        let platform = find_vfs(None).map_err(|e| e.to_string())?;
        // SAFETY: `platform` is SQLite's registered default VFS; copying it
        // keeps the methods delegated unchanged (randomness, sleep, time),
        // which read back their own pAppData.
        let mut base: ffi::sqlite3_vfs = unsafe { std::ptr::read(platform) };
        // SAFETY: as above.
        let platform_size = unsafe { (*platform).szOsFile };
        base.iVersion = base.iVersion.min(3);
        base.szOsFile = platform_size.max(std::mem::size_of::<OverlayFile>() as c_int);
        base.pNext = std::ptr::null_mut();
        base.zName = c"tablix-overlay".as_ptr();
        base.pAppData = platform.cast();
        base.xOpen = Some(x_open);
        base.xDelete = Some(x_delete);
        base.xAccess = Some(x_access);
        base.xFullPathname = Some(x_full_pathname);
        base.xDlOpen = None;
        base.xDlError = None;
        base.xDlSym = None;
        base.xDlClose = None;
        base.xSetSystemCall = None;
        base.xGetSystemCall = None;
        base.xNextSystemCall = None;
        let mut boxed = Box::new(base);
        let ptr: *mut ffi::sqlite3_vfs = &mut *boxed;
        // SAFETY: the Box lives in a static for the rest of the process.
        let rc = unsafe { ffi::sqlite3_vfs_register(ptr, 0) };
        if rc != ffi::SQLITE_OK {
            return Err(format!(
                "registering {OVERLAY_VFS_NAME} failed with code {rc}"
            ));
        }
        Ok(Registered { _vfs: boxed })
    });
    match result {
        Ok(_) => Ok(OVERLAY_VFS_NAME),
        Err(e) => Err(VfsError::Register {
            name: e.clone(),
            code: ffi::SQLITE_ERROR,
        }),
    }
}

/// The platform VFS this one delegates to.
///
/// # Safety
/// `vfs` must be the overlay VFS.
unsafe fn platform(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: guaranteed by the caller; pAppData was set at registration.
    unsafe { (*vfs).pAppData.cast() }
}

/// Whether `name` is an overlay's (or a file named after one).
fn is_ours(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated names.
    let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    s.starts_with(PREFIX).then(|| s.into_owned())
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(n) = is_ours(name) else {
        // Temporary files (the temp schema, sorts, statement journals) are
        // the platform's, opened in the buffer SQLite gave us.
        // SAFETY: szOsFile is at least the platform's.
        return unsafe {
            let p = platform(vfs);
            match (*p).xOpen {
                Some(open) => open(p, name, file, flags, out_flags),
                None => ffi::SQLITE_CANTOPEN,
            }
        };
    };
    // A journal or WAL named after an overlay: refused, so nothing of a
    // view ever reaches a file (its connection keeps its journal in
    // memory).
    if flags & ffi::SQLITE_OPEN_MAIN_DB == 0 {
        // SAFETY: a failed open leaves no methods to call.
        unsafe { (*file).pMethods = std::ptr::null() };
        return ffi::SQLITE_CANTOPEN;
    }
    let Some(view) = registry().get(&n).cloned() else {
        // SAFETY: as above.
        unsafe { (*file).pMethods = std::ptr::null() };
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: SQLite hands us szOsFile writable bytes at `file`.
    unsafe {
        std::ptr::write(
            file.cast::<OverlayFile>(),
            OverlayFile {
                base: ffi::sqlite3_file {
                    pMethods: &IO_METHODS,
                },
                view: Arc::into_raw(view),
            },
        );
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_delete(vfs: *mut ffi::sqlite3_vfs, name: *const c_char, d: c_int) -> c_int {
    if is_ours(name).is_some() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: forwarded unchanged to the platform VFS.
    unsafe {
        let p = platform(vfs);
        match (*p).xDelete {
            Some(delete) => delete(p, name, d),
            None => ffi::SQLITE_IOERR_DELETE,
        }
    }
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    if let Some(n) = is_ours(name) {
        // The overlay exists while registered; nothing named after it does
        // (no journal, no WAL).
        let exists = registry().contains_key(&n);
        // SAFETY: SQLite passes a valid out pointer.
        unsafe { *out = c_int::from(exists) };
        return ffi::SQLITE_OK;
    }
    // SAFETY: forwarded unchanged to the platform VFS.
    unsafe {
        let p = platform(vfs);
        match (*p).xAccess {
            Some(access) => access(p, name, flags, out),
            None => ffi::SQLITE_IOERR_ACCESS,
        }
    }
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    if is_ours(name).is_none() {
        // SAFETY: forwarded unchanged to the platform VFS.
        return unsafe {
            let p = platform(vfs);
            match (*p).xFullPathname {
                Some(full) => full(p, name, n, out),
                None => ffi::SQLITE_CANTOPEN,
            }
        };
    }
    // SAFETY: `name` is NUL-terminated; `out` has room for `n` bytes.
    unsafe {
        let src = CStr::from_ptr(name).to_bytes_with_nul();
        let Ok(cap) = usize::try_from(n) else {
            return ffi::SQLITE_CANTOPEN;
        };
        if src.len() > cap {
            return ffi::SQLITE_CANTOPEN;
        }
        std::ptr::copy_nonoverlapping(src.as_ptr().cast::<c_char>(), out, src.len());
    }
    ffi::SQLITE_OK
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
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
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The view behind an open overlay file.
///
/// # Safety
/// `f` must have been opened by `x_open` as an overlay and not closed.
unsafe fn view_of<'a>(f: *mut ffi::sqlite3_file) -> &'a Mutex<View> {
    // SAFETY: guaranteed by the caller; the Arc lives until xClose.
    unsafe { &*(*f.cast::<OverlayFile>()).view }
}

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: called once per opened overlay file by SQLite.
    unsafe {
        let of = &mut *f.cast::<OverlayFile>();
        drop(Arc::from_raw(of.view));
        of.view = std::ptr::null();
    }
    ffi::SQLITE_OK
}

/// A read or write of `n` bytes at `off`, as indexes, if both are valid.
fn span(n: c_int, off: i64) -> Option<(usize, u64)> {
    Some((usize::try_from(n).ok()?, u64::try_from(off).ok()?))
}

/// Calls `each(pgno, offset in page, range of the buffer)` for every page
/// the `n` bytes at `off` touch.
fn pages_of(
    page_size: usize,
    off: u64,
    n: usize,
    mut each: impl FnMut(u32, usize, std::ops::Range<usize>) -> Result<(), c_int>,
) -> Result<(), c_int> {
    let ps = page_size as u64;
    let mut done = 0usize;
    while done < n {
        let at = off + done as u64;
        let pgno = u32::try_from(at / ps + 1).map_err(|_| ffi::SQLITE_IOERR)?;
        let within = (at % ps) as usize;
        let len = (page_size - within).min(n - done);
        each(pgno, within, done..done + len)?;
        done += len;
    }
    Ok(())
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    off: i64,
) -> c_int {
    let Some((n, off)) = span(n, off) else {
        return ffi::SQLITE_IOERR_READ;
    };
    // SAFETY: `f` is an open overlay; `buf` has `n` writable bytes.
    let (view, out) = unsafe {
        (
            view_of(f),
            std::slice::from_raw_parts_mut(buf.cast::<u8>(), n),
        )
    };
    let mut v = lock(view);
    let have = usize::try_from(v.size.saturating_sub(off))
        .unwrap_or(usize::MAX)
        .min(n);
    let page_size = v.page_size;
    let mut scratch: Vec<u8> = Vec::new();
    let r = pages_of(page_size, off, have, |pgno, within, range| {
        if within == 0 && range.len() == page_size {
            return v.read_page(pgno, &mut out[range]);
        }
        scratch.resize(page_size, 0);
        v.read_page(pgno, &mut scratch)?;
        out[range.clone()].copy_from_slice(&scratch[within..within + range.len()]);
        Ok(())
    });
    if let Err(rc) = r {
        return rc;
    }
    if have < n {
        out[have..].fill(0);
        return ffi::SQLITE_IOERR_SHORT_READ;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    off: i64,
) -> c_int {
    let Some((n, off)) = span(n, off) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: `f` is an open overlay; `buf` has `n` readable bytes.
    let (view, src) = unsafe { (view_of(f), std::slice::from_raw_parts(buf.cast::<u8>(), n)) };
    let mut v = lock(view);
    let page_size = v.page_size;
    let r = pages_of(page_size, off, n, |pgno, within, range| {
        let page = v.own_page(pgno)?;
        page[within..within + range.len()].copy_from_slice(&src[range]);
        Ok(())
    });
    if let Err(rc) = r {
        return rc;
    }
    v.size = v.size.max(off + n as u64);
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let Ok(size) = u64::try_from(size) else {
        return ffi::SQLITE_IOERR_TRUNCATE;
    };
    // SAFETY: `f` is an open overlay.
    let mut v = lock(unsafe { view_of(f) });
    let ps = v.page_size as u64;
    let keep = u32::try_from(size.div_ceil(ps)).unwrap_or(u32::MAX);
    let before = v.pages.len();
    v.pages.retain(|&pgno, _| pgno <= keep);
    let dropped = before - v.pages.len();
    v.used = v.used.saturating_sub(dropped * v.page_size);
    v.source_pages = v.source_pages.min(keep);
    v.size = size;
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_sync(_f: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_size(f: *mut ffi::sqlite3_file, out: *mut i64) -> c_int {
    // SAFETY: `f` is an open overlay; `out` is valid.
    unsafe {
        let v = lock(view_of(f));
        *out = i64::try_from(v.size).unwrap_or(i64::MAX);
    }
    ffi::SQLITE_OK
}

// The view is the connection's alone: every lock is granted at once.
unsafe extern "C" fn f_lock(_f: *mut ffi::sqlite3_file, _level: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_unlock(_f: *mut ffi::sqlite3_file, _level: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_check_reserved_lock(_f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: `out` is valid.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_control(
    _f: *mut ffi::sqlite3_file,
    _op: c_int,
    _a: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn f_sector_size(_f: *mut ffi::sqlite3_file) -> c_int {
    4096
}

unsafe extern "C" fn f_device_characteristics(_f: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    /// A source reading a database's pages from a connection that holds
    /// a read transaction open (as the store's does).
    struct Pinned(Mutex<Connection>, usize, u32);

    impl Pinned {
        fn of(path: &std::path::Path) -> Arc<Pinned> {
            let c = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            c.execute_batch("BEGIN").unwrap();
            let ps: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
            let n: u32 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
            Arc::new(Pinned(Mutex::new(c), ps as usize, n))
        }
    }

    impl PageSource for Pinned {
        fn page_size(&self) -> usize {
            self.1
        }
        fn page_count(&self) -> u32 {
            self.2
        }
        fn read_page(&self, pgno: u32, out: &mut [u8]) -> Result<(), String> {
            let c = self.0.lock().unwrap();
            c.query_row(
                "SELECT data FROM sqlite_dbpage WHERE pgno = ?1",
                [pgno],
                |r| {
                    out.copy_from_slice(r.get_ref(0)?.as_blob()?);
                    Ok(())
                },
            )
            .map_err(|e| e.to_string())
        }
    }

    fn real_db(dir: &std::path::Path) -> (std::path::PathBuf, Connection) {
        let path = dir.join("real.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO t SELECT i, 'v' || i FROM n;",
        )
        .unwrap();
        (path, c)
    }

    fn open(o: &Overlay) -> Connection {
        let c = Connection::open_with_flags(
            o.uri(),
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI,
        )
        .unwrap();
        c.execute_batch("PRAGMA journal_mode=MEMORY").unwrap();
        c
    }

    fn count(c: &Connection, sql: &str) -> i64 {
        c.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_view_reads_its_snapshot_and_keeps_its_writes_private() {
        let dir = tempdir();
        let (path, real) = real_db(dir.path());
        let o = Overlay::new(64 << 20).unwrap();
        o.reset(Pinned::of(&path)).unwrap();
        let view = open(&o);
        assert_eq!(count(&view, "SELECT count(*) FROM t"), 2000);
        // The real database moves on; the view stays at its snapshot.
        // Several statements of its own move its change counter on.
        real.execute_batch("DELETE FROM t WHERE k > 1000").unwrap();
        assert_eq!(count(&view, "SELECT count(*) FROM t"), 2000);
        // The view's writes are its own, across statements.
        for sql in [
            "INSERT INTO t VALUES (5000, 'mine')",
            "UPDATE t SET v = 'x' WHERE k = 1",
            "UPDATE t SET v = 'y' WHERE k = 2",
            "UPDATE t SET v = 'z' WHERE k = 3",
        ] {
            view.execute_batch(sql).unwrap();
        }
        assert_eq!(count(&view, "SELECT count(*) FROM t"), 2001);
        assert_eq!(count(&real, "SELECT count(*) FROM t"), 1000);
        assert_eq!(count(&real, "SELECT count(*) FROM t WHERE v = 'x'"), 0);
        assert!(o.private_bytes() > 0);
        assert_eq!(
            view.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
                .unwrap(),
            "ok"
        );
        // Moved to the newest state, the view sees it and nothing of its
        // old writes, though the connection kept its page cache.
        o.reset(Pinned::of(&path)).unwrap();
        assert_eq!(o.private_bytes(), 0);
        assert_eq!(count(&view, "SELECT count(*) FROM t"), 1000);
        assert_eq!(count(&view, "SELECT count(*) FROM t WHERE k = 5000"), 0);
        // Cleared and pointed at a newer state again, as a pooled view is.
        view.execute_batch("UPDATE t SET v = 'w' WHERE k = 4")
            .unwrap();
        o.clear();
        real.execute_batch("DELETE FROM t WHERE k > 500").unwrap();
        o.reset(Pinned::of(&path)).unwrap();
        assert_eq!(count(&view, "SELECT count(*) FROM t"), 500);
        assert_eq!(count(&view, "SELECT count(*) FROM t WHERE v = 'w'"), 0);
        // The real database never had a journal or WAL named after it.
        assert!(!std::path::Path::new(&format!("{}-journal", o.name)).exists());
    }

    #[test]
    fn private_pages_past_the_limit_fail_the_statement_as_a_full_disk() {
        let dir = tempdir();
        let (path, _real) = real_db(dir.path());
        let o = Overlay::new(16 * 4096).unwrap();
        o.reset(Pinned::of(&path)).unwrap();
        let view = open(&o);
        let e = view
            .execute_batch("UPDATE t SET v = hex(randomblob(200))")
            .unwrap_err();
        assert_eq!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull));
        assert!(o.take_over_limit());
        assert!(!o.take_over_limit(), "asking clears it");
        // The statement was undone; the view is as it was.
        assert_eq!(
            count(&view, "SELECT count(*) FROM t WHERE v LIKE 'v%'"),
            2000
        );
        o.set_limit(64 << 20);
        view.execute_batch("UPDATE t SET v = 'y' WHERE k < 10")
            .unwrap();
        assert_eq!(count(&view, "SELECT count(*) FROM t WHERE v = 'y'"), 9);
    }

    #[test]
    fn a_failing_source_is_an_io_error_and_is_kept() {
        /// The pinned source, failing once told to.
        struct Flaky(Arc<Pinned>, std::sync::atomic::AtomicBool);
        impl PageSource for Flaky {
            fn page_size(&self) -> usize {
                self.0.page_size()
            }
            fn page_count(&self) -> u32 {
                self.0.page_count()
            }
            fn read_page(&self, pgno: u32, out: &mut [u8]) -> Result<(), String> {
                if self.1.load(Ordering::Relaxed) {
                    return Err(format!("page {pgno} is gone"));
                }
                self.0.read_page(pgno, out)
            }
        }
        let dir = tempdir();
        let (path, _real) = real_db(dir.path());
        let o = Overlay::new(1 << 20).unwrap();
        let source = Arc::new(Flaky(Pinned::of(&path), false.into()));
        o.reset(Arc::clone(&source) as Arc<dyn PageSource>).unwrap();
        let view = open(&o);
        source.1.store(true, Ordering::Relaxed);
        let e = view
            .query_row("SELECT sum(length(v)) FROM t", [], |r| r.get::<_, i64>(0))
            .unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::SystemIoFailure)
        );
        assert!(o.source_error().is_some_and(|m| m.contains("is gone")));
        // Cleared, the view holds nothing and reads as an empty file.
        o.clear();
        assert_eq!(o.private_bytes(), 0);
        assert!(o.source_error().is_none());
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }
}
