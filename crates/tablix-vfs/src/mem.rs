//! The blocking memory VFS (`tablix-mem`): databases held in process memory,
//! shared by name between connections, whose locks make a connection wait
//! instead of returning SQLITE_BUSY.
//!
//! The lock protocol (SHARED / RESERVED / PENDING / EXCLUSIVE, with a
//! write-intent gate taken before a write transaction begins) and its
//! invariants are in this crate's DESIGN.md; the numbers in comments below
//! refer to those invariants.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Instant;

use libsqlite3_sys as ffi;
use rusqlite::Connection;

use crate::clock::{VfsError, find_vfs};

/// The name connections pass as `vfs=` to use the memory VFS.
pub const MEM_VFS_NAME: &str = "tablix-mem";

/// File-control opcode: block until this connection holds the database's
/// write-intent gate. Chosen far above SQLite's own opcodes.
const FCNTL_WRITE_INTENT: c_int = 0x7462_0001;
/// File-control opcode: give the gate back if this connection still holds it.
const FCNTL_WRITE_INTENT_RELEASE: c_int = 0x7462_0002;

const NONE: c_int = ffi::SQLITE_LOCK_NONE;
const SHARED: c_int = ffi::SQLITE_LOCK_SHARED;
const RESERVED: c_int = ffi::SQLITE_LOCK_RESERVED;
const EXCLUSIVE: c_int = ffi::SQLITE_LOCK_EXCLUSIVE;

/// Lock state of one database, guarded by `Store::lock`.
#[derive(Debug, Default)]
struct LockState {
    /// Connections holding SHARED or more (a writer counts too).
    shared: u32,
    /// The connection holding RESERVED (or more).
    reserved: Option<u64>,
    /// The RESERVED holder is waiting for the other SHARED locks to go.
    pending: bool,
    /// The RESERVED holder holds EXCLUSIVE.
    exclusive: bool,
    /// The connection holding the write-intent gate.
    gate: Option<u64>,
    /// Gate tickets: the next to hand out and the one being served (FIFO).
    gate_next: u64,
    gate_serving: u64,
    /// Bumped each time EXCLUSIVE is released; readers that began waiting
    /// before a release are admitted even if the next writer is already
    /// PENDING (invariant 6).
    releases: u64,
}

/// Wait-time counters of one database, in nanoseconds.
#[derive(Debug, Default)]
struct Counters {
    shared_waits: AtomicU64,
    shared_wait_ns: AtomicU64,
    shared_wait_max_ns: AtomicU64,
    exclusive_waits: AtomicU64,
    exclusive_wait_ns: AtomicU64,
    exclusive_wait_max_ns: AtomicU64,
    gate_waits: AtomicU64,
    gate_wait_ns: AtomicU64,
    gate_wait_max_ns: AtomicU64,
    transactions: AtomicU64,
    busy: AtomicU64,
}

/// A snapshot of one memory database's lock counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemLockStats {
    /// SHARED requests that had to wait (a writer was PENDING or EXCLUSIVE).
    pub shared_waits: u64,
    pub shared_wait_ns: u64,
    pub shared_wait_max_ns: u64,
    /// EXCLUSIVE requests that had to wait for readers to finish.
    pub exclusive_waits: u64,
    pub exclusive_wait_ns: u64,
    pub exclusive_wait_max_ns: u64,
    /// Write-intent requests that had to wait for another writer.
    pub gate_waits: u64,
    pub gate_wait_ns: u64,
    pub gate_wait_max_ns: u64,
    /// Write transactions (EXCLUSIVE or RESERVED released).
    pub transactions: u64,
    /// SQLITE_BUSY returned: only for a RESERVED request without the gate
    /// while another connection holds it, which tablix code never makes.
    pub busy: u64,
}

/// One named database: its bytes and its locks.
struct Store {
    data: RwLock<Vec<u8>>,
    lock: Mutex<LockState>,
    /// Readers waiting for a writer to finish.
    read_q: Condvar,
    /// The PENDING writer waiting for readers to finish.
    write_q: Condvar,
    /// Connections waiting for the write-intent gate.
    gate_q: Condvar,
    counters: Counters,
}

impl Store {
    fn new() -> Store {
        Store {
            data: RwLock::new(Vec::new()),
            lock: Mutex::new(LockState::default()),
            read_q: Condvar::new(),
            write_q: Condvar::new(),
            gate_q: Condvar::new(),
            counters: Counters::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, LockState> {
        // A panic while holding this mutex cannot leave the counts half
        // updated (every update is a single assignment), so poisoning is
        // ignored.
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, q: &Condvar, g: MutexGuard<'a, LockState>) -> MutexGuard<'a, LockState> {
        q.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self) -> MemLockStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemLockStats {
            shared_waits: l(&c.shared_waits),
            shared_wait_ns: l(&c.shared_wait_ns),
            shared_wait_max_ns: l(&c.shared_wait_max_ns),
            exclusive_waits: l(&c.exclusive_waits),
            exclusive_wait_ns: l(&c.exclusive_wait_ns),
            exclusive_wait_max_ns: l(&c.exclusive_wait_max_ns),
            gate_waits: l(&c.gate_waits),
            gate_wait_ns: l(&c.gate_wait_ns),
            gate_wait_max_ns: l(&c.gate_wait_max_ns),
            transactions: l(&c.transactions),
            busy: l(&c.busy),
        }
    }

    /// Takes the gate for connection `id`, waiting in FIFO order (invariant 4).
    fn acquire_gate(&self, id: u64) {
        let mut st = self.state();
        if st.gate == Some(id) {
            return;
        }
        let ticket = st.gate_next;
        st.gate_next += 1;
        if st.gate_serving != ticket || st.gate.is_some() {
            let start = Instant::now();
            while st.gate_serving != ticket || st.gate.is_some() {
                st = self.wait(&self.gate_q, st);
            }
            record(
                &self.counters.gate_waits,
                &self.counters.gate_wait_ns,
                &self.counters.gate_wait_max_ns,
                start,
            );
        }
        st.gate = Some(id);
    }

    fn release_gate(&self, st: &mut LockState, id: u64) {
        if st.gate == Some(id) {
            st.gate = None;
            st.gate_serving += 1;
            self.gate_q.notify_all();
        }
    }

    /// Raises connection `id` from `held` towards `want`; returns SQLite's
    /// result and the level actually held afterwards.
    fn lock(&self, id: u64, held: c_int, want: c_int) -> (c_int, c_int) {
        let mut st = self.state();
        let mut held = held;
        if held == NONE && want >= SHARED {
            // Invariant 5: no new reader while a writer is PENDING or
            // EXCLUSIVE, unless it was already waiting when the last
            // writer finished (invariant 6).
            if st.pending || st.exclusive {
                let start = Instant::now();
                let since = st.releases;
                while st.exclusive || (st.pending && st.releases == since) {
                    st = self.wait(&self.read_q, st);
                }
                record(
                    &self.counters.shared_waits,
                    &self.counters.shared_wait_ns,
                    &self.counters.shared_wait_max_ns,
                    start,
                );
            }
            st.shared += 1;
            held = SHARED;
        }
        if held == SHARED && want >= RESERVED {
            // Invariant 3: RESERVED only with the gate. A connection that
            // did not ask for it first gets it only if it is free: waiting
            // here while holding SHARED could deadlock with the PENDING
            // writer (invariant 7).
            match st.gate {
                Some(g) if g == id => {}
                None if st.gate_serving == st.gate_next => {
                    st.gate = Some(id);
                    st.gate_next += 1;
                }
                _ => {
                    self.counters.busy.fetch_add(1, Ordering::Relaxed);
                    return (ffi::SQLITE_BUSY, held);
                }
            }
            st.reserved = Some(id);
            held = RESERVED;
        }
        if held == RESERVED && want > RESERVED {
            // Invariant 5: PENDING keeps new readers out while the ones
            // already in finish; then EXCLUSIVE.
            if st.shared > 1 {
                st.pending = true;
                let start = Instant::now();
                while st.shared > 1 {
                    st = self.wait(&self.write_q, st);
                }
                record(
                    &self.counters.exclusive_waits,
                    &self.counters.exclusive_wait_ns,
                    &self.counters.exclusive_wait_max_ns,
                    start,
                );
            }
            st.pending = false;
            st.exclusive = true;
            held = EXCLUSIVE;
        }
        (ffi::SQLITE_OK, held)
    }

    fn unlock(&self, id: u64, held: c_int, want: c_int) {
        let mut st = self.state();
        if held >= RESERVED && want < RESERVED {
            if st.reserved == Some(id) {
                st.reserved = None;
                self.counters.transactions.fetch_add(1, Ordering::Relaxed);
            }
            st.pending = false;
            if st.exclusive {
                st.exclusive = false;
                st.releases += 1;
            }
            self.release_gate(&mut st, id);
            self.read_q.notify_all();
        }
        if held >= SHARED && want == NONE {
            st.shared = st.shared.saturating_sub(1);
            if st.pending && st.shared <= 1 {
                self.write_q.notify_one();
            }
        }
    }
}

fn record(count: &AtomicU64, total: &AtomicU64, max: &AtomicU64, start: Instant) {
    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    count.fetch_add(1, Ordering::Relaxed);
    total.fetch_add(ns, Ordering::Relaxed);
    max.fetch_max(ns, Ordering::Relaxed);
}

/// Every named memory database of the process. A database lives until it
/// is deleted (xDelete or [`drop_mem_database`]); open connections keep
/// their own reference.
fn registry() -> &'static Mutex<HashMap<String, Arc<Store>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn registry_lock() -> MutexGuard<'static, HashMap<String, Arc<Store>>> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// Lock counters of the memory database `name`, if it exists.
pub fn mem_lock_stats(name: &str) -> Option<MemLockStats> {
    registry_lock().get(name).map(|s| s.snapshot())
}

/// Forgets the memory database `name`: connections still open keep their
/// copy; the next open starts empty.
pub fn drop_mem_database(name: &str) {
    registry_lock().remove(name);
}

/// What SQLite allocates per open file (szOsFile bytes).
#[repr(C)]
struct MemFile {
    base: ffi::sqlite3_file,
    /// From `Arc::into_raw`; released in xClose.
    store: *const Store,
    id: u64,
    level: c_int,
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(1);

/// Keeps the registered structure alive for the rest of the process.
struct Registered {
    _vfs: Box<ffi::sqlite3_vfs>,
}
// SAFETY: the structure is written once before registration and only read
// by SQLite afterwards; its pointers are to static data.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

/// Registers the memory VFS as `tablix-mem` (once per process; later calls
/// return the same name). It is not made the default VFS.
pub fn register_mem_vfs() -> Result<&'static str, VfsError> {
    static REGISTERED: OnceLock<Result<Registered, String>> = OnceLock::new();
    let result = REGISTERED.get_or_init(|| {
        let platform = find_vfs(None).map_err(|e| e.to_string())?;
        // SAFETY: `platform` is SQLite's registered default VFS; copying it
        // keeps the methods we delegate (randomness, sleep, time, dlopen),
        // which read back their own pAppData through the pointer we pass.
        let mut base: ffi::sqlite3_vfs = unsafe { std::ptr::read(platform) };
        base.iVersion = base.iVersion.min(3);
        base.szOsFile = std::mem::size_of::<MemFile>() as c_int;
        base.mxPathname = 512;
        base.pNext = std::ptr::null_mut();
        base.zName = c"tablix-mem".as_ptr();
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
            return Err(format!("registering {MEM_VFS_NAME} failed with code {rc}"));
        }
        Ok(Registered { _vfs: boxed })
    });
    match result {
        Ok(_) => Ok(MEM_VFS_NAME),
        Err(e) => Err(VfsError::Register {
            name: e.clone(),
            code: ffi::SQLITE_ERROR,
        }),
    }
}

fn name_of(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated names.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let store = match name_of(name) {
        Some(n) => {
            let mut reg = registry_lock();
            match reg.get(&n) {
                Some(s) => s.clone(),
                None if flags & ffi::SQLITE_OPEN_CREATE != 0 => {
                    let s = Arc::new(Store::new());
                    reg.insert(n, s.clone());
                    s
                }
                None => return ffi::SQLITE_CANTOPEN,
            }
        }
        // Temporary files are private to the connection.
        None => Arc::new(Store::new()),
    };
    // SAFETY: SQLite hands us szOsFile writable bytes at `file`.
    unsafe {
        std::ptr::write(
            file.cast::<MemFile>(),
            MemFile {
                base: ffi::sqlite3_file {
                    pMethods: &IO_METHODS,
                },
                store: Arc::into_raw(store),
                id: NEXT_FILE.fetch_add(1, Ordering::Relaxed),
                level: NONE,
            },
        );
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _d: c_int,
) -> c_int {
    if let Some(n) = name_of(name) {
        registry_lock().remove(&n);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    let exists = name_of(name).is_some_and(|n| {
        registry_lock().get(&n).is_some_and(|s| {
            // A journal left empty is as good as absent.
            s.data.read().map(|d| !d.is_empty()).unwrap_or(true)
        })
    });
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = c_int::from(exists) };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
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

/// The open file behind `f`.
///
/// # Safety
/// `f` must have been opened by `x_open` and not closed.
unsafe fn mem_file<'a>(f: *mut ffi::sqlite3_file) -> &'a mut MemFile {
    // SAFETY: guaranteed by the caller; MemFile starts with the base.
    unsafe { &mut *f.cast::<MemFile>() }
}

/// # Safety
/// As [`mem_file`].
unsafe fn store_of<'a>(f: *mut ffi::sqlite3_file) -> &'a Store {
    // SAFETY: the Arc behind `store` lives until xClose.
    unsafe { &*mem_file(f).store }
}

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: called once per opened file by SQLite.
    unsafe {
        let mf = mem_file(f);
        if mf.level != NONE {
            (*mf.store).unlock(mf.id, mf.level, NONE);
            mf.level = NONE;
        }
        {
            let store = &*mf.store;
            let mut st = store.state();
            store.release_gate(&mut st, mf.id);
        }
        drop(Arc::from_raw(mf.store));
        mf.store = std::ptr::null();
    }
    ffi::SQLITE_OK
}

/// A read or write of `n` bytes at `off`, as indexes, if both are valid.
fn span(n: c_int, off: i64) -> Option<(usize, usize)> {
    Some((usize::try_from(n).ok()?, usize::try_from(off).ok()?))
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    off: i64,
) -> c_int {
    // SAFETY: `f` is open; `buf` has `n` writable bytes.
    unsafe {
        let store = store_of(f);
        let Some((n, off)) = span(n, off) else {
            return ffi::SQLITE_IOERR_READ;
        };
        let out = std::slice::from_raw_parts_mut(buf.cast::<u8>(), n);
        let data = store.data.read().unwrap_or_else(|e| e.into_inner());
        let have = data.len().saturating_sub(off).min(n);
        if have > 0 {
            out[..have].copy_from_slice(&data[off..off + have]);
        }
        if have < n {
            out[have..].fill(0);
            return ffi::SQLITE_IOERR_SHORT_READ;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    off: i64,
) -> c_int {
    // SAFETY: `f` is open; `buf` has `n` readable bytes.
    unsafe {
        let store = store_of(f);
        let Some((n, off)) = span(n, off) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let src = std::slice::from_raw_parts(buf.cast::<u8>(), n);
        let mut data = store.data.write().unwrap_or_else(|e| e.into_inner());
        let end = off + n;
        let len = data.len();
        if len < end {
            if data.try_reserve(end - len).is_err() {
                return ffi::SQLITE_FULL;
            }
            data.resize(end, 0);
        }
        data[off..end].copy_from_slice(src);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: `f` is open.
    let store = unsafe { store_of(f) };
    let Ok(size) = usize::try_from(size) else {
        return ffi::SQLITE_IOERR_TRUNCATE;
    };
    let mut data = store.data.write().unwrap_or_else(|e| e.into_inner());
    if size < data.len() {
        data.truncate(size);
        let keep = size.max(data.capacity() / 2);
        data.shrink_to(keep);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_sync(_f: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_size(f: *mut ffi::sqlite3_file, out: *mut i64) -> c_int {
    // SAFETY: `f` is open; `out` is valid.
    unsafe {
        let store = store_of(f);
        let len = store.data.read().unwrap_or_else(|e| e.into_inner()).len();
        *out = i64::try_from(len).unwrap_or(i64::MAX);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `f` is open; SQLite serialises calls on one file.
    unsafe {
        let mf = mem_file(f);
        if level <= mf.level {
            return ffi::SQLITE_OK;
        }
        let (rc, held) = (*mf.store).lock(mf.id, mf.level, level);
        mf.level = held;
        rc
    }
}

unsafe extern "C" fn f_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `f` is open; SQLite serialises calls on one file.
    unsafe {
        let mf = mem_file(f);
        if level >= mf.level {
            return ffi::SQLITE_OK;
        }
        (*mf.store).unlock(mf.id, mf.level, level);
        mf.level = level;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: `f` is open; `out` is valid.
    unsafe {
        let st = store_of(f).state();
        *out = c_int::from(st.reserved.is_some() || st.pending || st.exclusive);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    _arg: *mut c_void,
) -> c_int {
    // SAFETY: `f` is open.
    unsafe {
        let mf = mem_file(f);
        let store = &*mf.store;
        match op {
            FCNTL_WRITE_INTENT => {
                store.acquire_gate(mf.id);
                ffi::SQLITE_OK
            }
            FCNTL_WRITE_INTENT_RELEASE => {
                // Only a gate not yet turned into RESERVED is given back
                // here; once RESERVED, xUnlock releases it (invariant 4).
                let mut st = store.state();
                if st.reserved != Some(mf.id) {
                    store.release_gate(&mut st, mf.id);
                }
                ffi::SQLITE_OK
            }
            _ => ffi::SQLITE_NOTFOUND,
        }
    }
}

unsafe extern "C" fn f_sector_size(_f: *mut ffi::sqlite3_file) -> c_int {
    4096
}

unsafe extern "C" fn f_device_characteristics(_f: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_ATOMIC
        | ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
        | ffi::SQLITE_IOCAP_SAFE_APPEND
        | ffi::SQLITE_IOCAP_SEQUENTIAL
}

/// Holds the write-intent gate of one memory database for one connection.
/// Take it before `BEGIN IMMEDIATE`; the gate is handed on when the
/// transaction ends (or when this guard drops, if it never began).
pub struct WriteIntent<'c> {
    conn: &'c Connection,
    schema: CString,
}

/// Blocks until `conn` may start a write transaction on the memory database
/// attached as `schema` ("main" for a connection opened on it). Fails with
/// SQLite's code if that database is not on the memory VFS.
pub fn write_intent<'c>(conn: &'c Connection, schema: &str) -> Result<WriteIntent<'c>, c_int> {
    let schema = CString::new(schema).map_err(|_| ffi::SQLITE_MISUSE)?;
    // SAFETY: the handle is live and used on the caller's thread; the
    // opcode takes no argument.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            schema.as_ptr(),
            FCNTL_WRITE_INTENT,
            std::ptr::null_mut(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    Ok(WriteIntent { conn, schema })
}

impl Drop for WriteIntent<'_> {
    fn drop(&mut self) {
        // SAFETY: as in `write_intent`.
        unsafe {
            ffi::sqlite3_file_control(
                self.conn.handle(),
                self.schema.as_ptr(),
                FCNTL_WRITE_INTENT_RELEASE,
                std::ptr::null_mut(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    const SHORT: Duration = Duration::from_millis(100);

    fn store() -> Arc<Store> {
        Arc::new(Store::new())
    }

    /// Runs `f` on a thread and reports whether it finished within `SHORT`.
    fn spawn_lock(s: &Arc<Store>, f: impl FnOnce(&Store) + Send + 'static) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let s = s.clone();
        std::thread::spawn(move || {
            f(&s);
            let _ = tx.send(());
        });
        rx
    }

    #[test]
    fn readers_share_and_coexist_with_reserved() {
        let s = store();
        assert_eq!(s.lock(1, NONE, SHARED), (ffi::SQLITE_OK, SHARED));
        assert_eq!(s.lock(2, NONE, SHARED), (ffi::SQLITE_OK, SHARED));
        s.acquire_gate(3);
        assert_eq!(s.lock(3, NONE, RESERVED), (ffi::SQLITE_OK, RESERVED));
        // A new reader still gets in while the writer only holds RESERVED.
        assert_eq!(s.lock(4, NONE, SHARED), (ffi::SQLITE_OK, SHARED));
        assert_eq!(s.state().shared, 4);
    }

    #[test]
    fn pending_writer_waits_for_readers_and_keeps_new_ones_out() {
        let s = store();
        assert_eq!(s.lock(1, NONE, SHARED).0, ffi::SQLITE_OK);
        s.acquire_gate(2);
        assert_eq!(s.lock(2, NONE, RESERVED).0, ffi::SQLITE_OK);
        let writer = spawn_lock(&s, |s| {
            assert_eq!(s.lock(2, RESERVED, EXCLUSIVE), (ffi::SQLITE_OK, EXCLUSIVE));
        });
        assert!(
            writer.recv_timeout(SHORT).is_err(),
            "EXCLUSIVE granted over a reader"
        );
        assert!(s.state().pending);
        let late_reader = spawn_lock(&s, |s| {
            assert_eq!(s.lock(3, NONE, SHARED).0, ffi::SQLITE_OK);
        });
        assert!(
            late_reader.recv_timeout(SHORT).is_err(),
            "new reader passed a PENDING writer"
        );
        s.unlock(1, SHARED, NONE);
        writer
            .recv_timeout(Duration::from_secs(5))
            .expect("writer never got EXCLUSIVE");
        assert!(
            late_reader.recv_timeout(SHORT).is_err(),
            "reader got in under EXCLUSIVE"
        );
        s.unlock(2, EXCLUSIVE, SHARED);
        late_reader
            .recv_timeout(Duration::from_secs(5))
            .expect("reader never admitted");
        s.unlock(2, SHARED, NONE);
        let stats = s.snapshot();
        assert_eq!(
            (
                stats.exclusive_waits,
                stats.shared_waits,
                stats.transactions
            ),
            (1, 1, 1)
        );
        assert_eq!(s.state().gate, None);
    }

    #[test]
    fn queued_readers_go_before_the_next_writer() {
        let s = store();
        s.acquire_gate(1);
        assert_eq!(s.lock(1, NONE, EXCLUSIVE), (ffi::SQLITE_OK, EXCLUSIVE));
        let reader = spawn_lock(&s, |s| {
            assert_eq!(s.lock(2, NONE, SHARED).0, ffi::SQLITE_OK);
        });
        assert!(reader.recv_timeout(SHORT).is_err());
        // The writer finishes and, before the reader runs, the next writer
        // becomes PENDING behind a third reader's lock.
        {
            let mut st = s.state();
            st.exclusive = false;
            st.releases += 1;
            st.reserved = None;
            st.pending = true;
            s.read_q.notify_all();
        }
        reader
            .recv_timeout(Duration::from_secs(5))
            .expect("a reader queued before the release starved");
    }

    #[test]
    fn reserved_without_the_gate_is_busy_only_when_another_holds_it() {
        let s = store();
        // Free gate: taken implicitly.
        assert_eq!(s.lock(1, NONE, RESERVED), (ffi::SQLITE_OK, RESERVED));
        // Held by 1: a second connection cannot wait here without risking
        // deadlock, so it is told BUSY and keeps its SHARED lock.
        assert_eq!(s.lock(2, NONE, RESERVED), (ffi::SQLITE_BUSY, SHARED));
        assert_eq!(s.snapshot().busy, 1);
        s.unlock(1, RESERVED, NONE);
        assert_eq!(s.lock(2, SHARED, RESERVED), (ffi::SQLITE_OK, RESERVED));
    }

    #[test]
    fn gate_is_first_come_first_served() {
        let s = store();
        s.acquire_gate(1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for id in 2..=4u64 {
            let (o, s2) = (order.clone(), s.clone());
            waiters.push(std::thread::spawn(move || {
                s2.acquire_gate(id);
                o.lock().unwrap().push(id);
                let mut st = s2.state();
                s2.release_gate(&mut st, id);
            }));
            // Let each waiter take its ticket before the next starts.
            while s.state().gate_next < id {
                std::thread::yield_now();
            }
        }
        {
            let mut st = s.state();
            s.release_gate(&mut st, 1);
        }
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![2, 3, 4]);
        assert_eq!(s.snapshot().gate_waits, 3);
    }

    #[test]
    fn write_transactions_wait_instead_of_failing() {
        register_mem_vfs().unwrap();
        let uri = "file:unit-two-writers?vfs=tablix-mem";
        let open = move || {
            let c = Connection::open(uri).unwrap();
            c.execute_batch("PRAGMA journal_mode=MEMORY").unwrap();
            c
        };
        let a = open();
        a.execute_batch("CREATE TABLE t(x)").unwrap();
        let intent = write_intent(&a, "main").unwrap();
        a.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (1)")
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let other = std::thread::spawn(move || {
            let b = open();
            let _i = write_intent(&b, "main").unwrap();
            b.execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (2); COMMIT")
                .unwrap();
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(SHORT).is_err(),
            "second writer did not wait"
        );
        a.execute_batch("COMMIT").unwrap();
        drop(intent);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("second writer stuck");
        other.join().unwrap();
        let n: i64 = a
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(mem_lock_stats("unit-two-writers").unwrap().busy, 0);
        drop_mem_database("unit-two-writers");
    }

    #[test]
    fn write_intent_refused_off_the_memory_vfs() {
        let c = Connection::open_in_memory().unwrap();
        assert!(write_intent(&c, "main").is_err());
    }
}
