//! The `sqlite3_pcache_methods2` callbacks and their installation.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
#[cfg(debug_assertions)]
use std::sync::atomic::AtomicBool;
#[cfg(debug_assertions)]
use std::sync::atomic::Ordering;

use crate::cache::{Cache, slot_of};
use crate::ffi::{self, PcacheMethods2, PcachePage, Sqlite3Pcache};
use crate::policy::{Evict, LfuHist, Lru, Policy, S3Fifo, S3Lru, TinyLfu};

/// What SQLite's `sqlite3_pcache*` points to.
///
/// Thread safety: SQLite never calls one cache from two threads at once:
/// every pager call runs under its connection's mutex (or, in shared-cache
/// mode, the shared cache's mutex), which is also what lets SQLite's own
/// pcache1 run without a per-cache lock. A cache may move between threads,
/// so it is `Send`; it is never entered concurrently, so it needs no lock.
/// Debug builds verify that claim on every call. Process-wide state (the
/// installed policy, the statistics registry) is atomic or mutex-guarded.
struct Handle<P: Evict> {
    cache: UnsafeCell<Cache<P>>,
    #[cfg(debug_assertions)]
    busy: AtomicBool,
}

/// The methods table for `policy`.
pub fn methods(policy: Policy) -> PcacheMethods2 {
    match policy {
        Policy::Lru => table::<Lru>(),
        Policy::LfuHist => table::<LfuHist>(),
        Policy::S3Fifo => table::<S3Fifo>(),
        Policy::S3Lru => table::<S3Lru>(),
        Policy::TinyLfu => table::<TinyLfu>(),
    }
}

/// One table per policy: every callback is compiled for its policy.
fn table<P: Evict>() -> PcacheMethods2 {
    PcacheMethods2 {
        version: 1,
        arg: std::ptr::null_mut(),
        init: Some(x_init),
        shutdown: Some(x_shutdown),
        create: Some(x_create::<P>),
        cachesize: Some(x_cachesize::<P>),
        pagecount: Some(x_pagecount::<P>),
        fetch: Some(x_fetch::<P>),
        unpin: Some(x_unpin::<P>),
        rekey: Some(x_rekey::<P>),
        truncate: Some(x_truncate::<P>),
        destroy: Some(x_destroy::<P>),
        shrink: Some(x_shrink::<P>),
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

/// SQLite's built-in page cache methods, for measuring against. Takes them
/// before SQLite initialises, then initialises SQLite (which initialises
/// that cache). None if SQLite was already initialised.
pub fn builtin_methods() -> Option<PcacheMethods2> {
    let mut m = methods(Policy::Lru);
    // SAFETY: SQLITE_CONFIG_GETPCACHE2 writes one methods struct through
    // the pointer; sqlite3_initialize has no preconditions.
    unsafe {
        if ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, &mut m as *mut PcacheMethods2)
            != ffi::SQLITE_OK
        {
            return None;
        }
        if ffi::sqlite3_initialize() != ffi::SQLITE_OK {
            return None;
        }
    }
    Some(m)
}

/// # Safety
/// `p` must be a pointer returned by `x_create` and not yet destroyed.
#[inline(always)]
unsafe fn with<P: Evict, R>(
    p: *mut Sqlite3Pcache,
    f: impl FnOnce(&mut Cache<P>) -> R,
) -> Option<R> {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &*(p as *const Handle<P>) };
    // SAFETY: SQLite serialises calls on one cache (see `Handle`), so this
    // is the only reference to the cache for the duration of the call.
    let cache = unsafe { &mut *h.cache.get() };
    // A panic here is a bug in the cache. The callbacks are `extern "C"`,
    // so it aborts the process: carrying on with a cache in an unknown
    // state could hand SQLite the wrong page and corrupt a database, while
    // stopping cannot. (Allocation failure is not a panic: it returns NULL
    // as the contract allows.) Debug builds also check the serialisation
    // claim above.
    #[cfg(debug_assertions)]
    assert!(
        !h.busy.swap(true, Ordering::Acquire),
        "page cache entered concurrently"
    );
    let r = f(cache);
    #[cfg(debug_assertions)]
    h.busy.store(false, Ordering::Release);
    Some(r)
}

unsafe extern "C" fn x_init(_arg: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_arg: *mut c_void) {}

unsafe extern "C" fn x_create<P: Evict>(
    sz_page: c_int,
    sz_extra: c_int,
    purgeable: c_int,
) -> *mut Sqlite3Pcache {
    let (Ok(page), Ok(extra)) = (usize::try_from(sz_page), usize::try_from(sz_extra)) else {
        return std::ptr::null_mut();
    };
    let Some(cache) = Cache::<P>::new(page, extra, purgeable != 0) else {
        return std::ptr::null_mut();
    };
    let layout = std::alloc::Layout::new::<Handle<P>>();
    // SAFETY: Handle has non-zero size; a null result is the contract's
    // allocation failure.
    let mem = unsafe { std::alloc::alloc(layout) }.cast::<Handle<P>>();
    if mem.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `mem` is a fresh allocation for one Handle.
    unsafe {
        mem.write(Handle {
            cache: UnsafeCell::new(cache),
            #[cfg(debug_assertions)]
            busy: AtomicBool::new(false),
        })
    };
    mem.cast()
}

unsafe extern "C" fn x_cachesize<P: Evict>(p: *mut Sqlite3Pcache, n: c_int) {
    // SAFETY: SQLite passes a cache from x_create.
    unsafe { with::<P, _>(p, |c| c.set_capacity(n.max(0) as usize)) };
}

unsafe extern "C" fn x_pagecount<P: Evict>(p: *mut Sqlite3Pcache) -> c_int {
    // SAFETY: as above.
    unsafe { with::<P, _>(p, |c| c.page_count() as c_int) }.unwrap_or(0)
}

unsafe extern "C" fn x_fetch<P: Evict>(
    p: *mut Sqlite3Pcache,
    key: c_uint,
    create: c_int,
) -> *mut PcachePage {
    // SAFETY: as above.
    unsafe { with::<P, _>(p, |c| c.fetch(key, create)) }.unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn x_unpin<P: Evict>(
    p: *mut Sqlite3Pcache,
    page: *mut PcachePage,
    discard: c_int,
) {
    // SAFETY: SQLite passes a page this cache returned.
    unsafe { with::<P, _>(p, |c| c.unpin(slot_of(page), discard != 0)) };
}

unsafe extern "C" fn x_rekey<P: Evict>(
    p: *mut Sqlite3Pcache,
    page: *mut PcachePage,
    _old: c_uint,
    new: c_uint,
) {
    // SAFETY: as above.
    unsafe { with::<P, _>(p, |c| c.rekey(slot_of(page), new)) };
}

unsafe extern "C" fn x_truncate<P: Evict>(p: *mut Sqlite3Pcache, limit: c_uint) {
    // SAFETY: as above.
    unsafe { with::<P, _>(p, |c| c.truncate(limit)) };
}

unsafe extern "C" fn x_shrink<P: Evict>(p: *mut Sqlite3Pcache) {
    // SAFETY: as above.
    unsafe { with::<P, _>(p, |c| c.shrink()) };
}

unsafe extern "C" fn x_destroy<P: Evict>(p: *mut Sqlite3Pcache) {
    if p.is_null() {
        return;
    }
    let h = p.cast::<Handle<P>>();
    // SAFETY: created by x_create with this layout; SQLite calls destroy
    // once, after every other call on it.
    unsafe {
        std::ptr::drop_in_place(h);
        std::alloc::dealloc(h.cast(), std::alloc::Layout::new::<Handle<P>>());
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
    static NAMES: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| std::ffi::CString::new(Policy::names()).unwrap_or_default())
        .as_ptr()
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

/// Nanoseconds per fetch+unpin pair of a resident page through `m`, called
/// as the pager calls them, over `keys` pages fetched `pairs` times in a
/// fixed pseudo-random order. None if the table lacks a method. SQLite must
/// be initialised (or `m` be tablix's, whose init does nothing).
pub fn measure_fetch_unpin(m: &PcacheMethods2, keys: u32, pairs: u64) -> Option<f64> {
    let (create, size, fetch, unpin, destroy) =
        (m.create?, m.cachesize?, m.fetch?, m.unpin?, m.destroy?);
    let keys = keys.max(1);
    let mut x = 3u64;
    let order: Vec<u32> = (0..4096)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            1 + ((x >> 33) % u64::from(keys)) as u32
        })
        .collect();
    // SAFETY: the methods are used as SQLite uses them: init, create, then
    // fetch/unpin pairs on one thread, destroy.
    unsafe {
        let c = create(4096, 136, 1);
        if c.is_null() {
            return None;
        }
        size(c, keys as c_int * 2);
        for k in 1..=keys {
            let p = fetch(c, k, 2);
            if !p.is_null() {
                unpin(c, p, 0);
            }
        }
        let t = std::time::Instant::now();
        for i in 0..pairs {
            let p = fetch(c, order[(i & 4095) as usize], 1);
            if !p.is_null() {
                unpin(c, p, 0);
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / pairs.max(1) as f64;
        destroy(c);
        Some(ns)
    }
}
