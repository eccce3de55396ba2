//! The `sqlite3_pcache_methods2` callbacks and their installation.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::cache::Cache;
use crate::ffi::{self, PcacheMethods2, PcachePage, Sqlite3Pcache};
use crate::policy::Policy;

/// The policy new caches get; set by [`install`].
static POLICY: AtomicU8 = AtomicU8::new(0);

fn current_policy() -> Policy {
    Policy::ALL[POLICY.load(Ordering::Relaxed) as usize % Policy::ALL.len()]
}

/// What SQLite's `sqlite3_pcache*` points to. SQLite serialises calls on one
/// cache per connection, but the mutex keeps the contract's thread safety
/// even for callers that do not.
struct Handle {
    cache: Mutex<Cache>,
}

/// The methods table for `policy`.
pub fn methods(policy: Policy) -> PcacheMethods2 {
    POLICY.store(
        Policy::ALL.iter().position(|p| *p == policy).unwrap_or(0) as u8,
        Ordering::Relaxed,
    );
    PcacheMethods2 {
        version: 1,
        arg: std::ptr::null_mut(),
        init: Some(x_init),
        shutdown: Some(x_shutdown),
        create: Some(x_create),
        cachesize: Some(x_cachesize),
        pagecount: Some(x_pagecount),
        fetch: Some(x_fetch),
        unpin: Some(x_unpin),
        rekey: Some(x_rekey),
        truncate: Some(x_truncate),
        destroy: Some(x_destroy),
        shrink: Some(x_shrink),
    }
}

/// Why [`install`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallError {
    /// SQLite refused the configuration (SQLITE_MISUSE: it is already
    /// initialised; install before opening any connection).
    Refused(c_int),
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallError::Refused(ffi::SQLITE_MISUSE) => f.write_str(
                "SQLite is already initialised: the page cache must be installed before the first connection opens",
            ),
            InstallError::Refused(rc) => write!(f, "sqlite3_config(SQLITE_CONFIG_PCACHE2) failed with code {rc}"),
        }
    }
}

impl std::error::Error for InstallError {}

/// Makes `policy` the page cache of every SQLite connection this process
/// opens from now on. Must run before SQLite initialises (before the first
/// connection), or after `sqlite3_shutdown`.
pub fn install(policy: Policy) -> Result<(), InstallError> {
    let m = methods(policy);
    // SAFETY: SQLITE_CONFIG_PCACHE2 takes one pointer to a methods struct,
    // which SQLite copies.
    let rc =
        unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &m as *const PcacheMethods2) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(InstallError::Refused(rc))
    }
}

/// # Safety
/// `p` must be a pointer returned by `x_create` and not yet destroyed.
unsafe fn with<R>(p: *mut Sqlite3Pcache, f: impl FnOnce(&mut Cache) -> R) -> Option<R> {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &*(p as *const Handle) };
    // A poisoned lock means a previous call panicked mid-update; the cache
    // still checks its invariants, so carry on with its state.
    let mut guard = match h.cache.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    // Debug builds let an invariant failure abort loudly. Release builds
    // must never take the host program down: a panic becomes the
    // contract's failure value (NULL page, no-op).
    #[cfg(debug_assertions)]
    return Some(f(&mut guard));
    #[cfg(not(debug_assertions))]
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut guard))).ok()
}

unsafe extern "C" fn x_init(_arg: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_arg: *mut c_void) {}

unsafe extern "C" fn x_create(
    sz_page: c_int,
    sz_extra: c_int,
    purgeable: c_int,
) -> *mut Sqlite3Pcache {
    let (Ok(page), Ok(extra)) = (usize::try_from(sz_page), usize::try_from(sz_extra)) else {
        return std::ptr::null_mut();
    };
    let Some(cache) = Cache::new(page, extra, purgeable != 0, current_policy()) else {
        return std::ptr::null_mut();
    };
    let layout = std::alloc::Layout::new::<Handle>();
    // SAFETY: Handle has non-zero size; a null result is the contract's
    // allocation failure.
    let mem = unsafe { std::alloc::alloc(layout) }.cast::<Handle>();
    if mem.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `mem` is a fresh allocation for one Handle.
    unsafe {
        mem.write(Handle {
            cache: Mutex::new(cache),
        })
    };
    mem.cast()
}

unsafe extern "C" fn x_cachesize(p: *mut Sqlite3Pcache, n: c_int) {
    // SAFETY: SQLite passes a cache from x_create.
    unsafe { with(p, |c| c.set_capacity(n.max(0) as usize)) };
}

unsafe extern "C" fn x_pagecount(p: *mut Sqlite3Pcache) -> c_int {
    // SAFETY: as above.
    unsafe { with(p, |c| c.page_count() as c_int) }.unwrap_or(0)
}

unsafe extern "C" fn x_fetch(p: *mut Sqlite3Pcache, key: c_uint, create: c_int) -> *mut PcachePage {
    // SAFETY: as above.
    unsafe { with(p, |c| c.fetch(key, create)) }.unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn x_unpin(p: *mut Sqlite3Pcache, page: *mut PcachePage, discard: c_int) {
    // SAFETY: SQLite passes a page this cache returned.
    unsafe { with(p, |c| c.unpin(Cache::slot_of(page), discard != 0)) };
}

unsafe extern "C" fn x_rekey(
    p: *mut Sqlite3Pcache,
    page: *mut PcachePage,
    _old: c_uint,
    new: c_uint,
) {
    // SAFETY: as above.
    unsafe { with(p, |c| c.rekey(Cache::slot_of(page), new)) };
}

unsafe extern "C" fn x_truncate(p: *mut Sqlite3Pcache, limit: c_uint) {
    // SAFETY: as above.
    unsafe { with(p, |c| c.truncate(limit)) };
}

unsafe extern "C" fn x_shrink(p: *mut Sqlite3Pcache) {
    // SAFETY: as above.
    unsafe { with(p, |c| c.shrink()) };
}

unsafe extern "C" fn x_destroy(p: *mut Sqlite3Pcache) {
    if p.is_null() {
        return;
    }
    let h = p.cast::<Handle>();
    // SAFETY: created by x_create with this layout; SQLite calls destroy
    // once, after every other call on it.
    unsafe {
        std::ptr::drop_in_place(h);
        std::alloc::dealloc(h.cast(), std::alloc::Layout::new::<Handle>());
    }
}

/// C entry point: `int tablix_pcache_install(const char *policy)`.
/// Returns SQLITE_OK, SQLITE_ERROR for an unknown policy (NULL or a name
/// not in `tablix_pcache_policies()`), or SQLite's code when it refuses.
///
/// # Safety
/// `policy` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tablix_pcache_install(policy: *const c_char) -> c_int {
    if policy.is_null() {
        return ffi::SQLITE_ERROR;
    }
    // SAFETY: guaranteed by the caller.
    let name = unsafe { CStr::from_ptr(policy) };
    let Some(p) = name.to_str().ok().and_then(|s| s.parse::<Policy>().ok()) else {
        return ffi::SQLITE_ERROR;
    };
    match install(p) {
        Ok(()) => ffi::SQLITE_OK,
        Err(InstallError::Refused(rc)) => rc,
    }
}

/// C entry point: the valid policy names, comma-separated.
#[unsafe(no_mangle)]
pub extern "C" fn tablix_pcache_policies() -> *const c_char {
    c"lru, lfu-hist, s3-fifo".as_ptr()
}

/// C entry point: hits, misses and evictions of every tablix cache so far.
///
/// # Safety
/// Each pointer must be NULL or point to writable storage.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tablix_pcache_totals(
    hits: *mut u64,
    misses: *mut u64,
    evictions: *mut u64,
) {
    let (h, m, e) = crate::stats::totals();
    // SAFETY: guaranteed by the caller.
    unsafe {
        if !hits.is_null() {
            *hits = h;
        }
        if !misses.is_null() {
            *misses = m;
        }
        if !evictions.is_null() {
            *evictions = e;
        }
    }
}
