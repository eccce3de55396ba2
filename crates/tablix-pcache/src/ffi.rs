//! The slice of SQLite's C interface the page cache needs, declared here so
//! that the C static library links against the application's own SQLite.
//! Layouts follow sqlite3.h exactly.

use std::ffi::{c_int, c_uint, c_void};

pub const SQLITE_OK: c_int = 0;
pub const SQLITE_ERROR: c_int = 1;
pub const SQLITE_MISUSE: c_int = 21;
pub const SQLITE_CONFIG_PCACHE2: c_int = 18;
pub const SQLITE_CONFIG_GETPCACHE2: c_int = 19;

/// `sqlite3_pcache`: opaque to SQLite.
pub type Sqlite3Pcache = c_void;

/// `sqlite3_pcache_page`.
#[repr(C)]
pub struct PcachePage {
    pub buf: *mut c_void,
    pub extra: *mut c_void,
}

/// `sqlite3_pcache_methods2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PcacheMethods2 {
    pub version: c_int,
    pub arg: *mut c_void,
    pub init: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    pub shutdown: Option<unsafe extern "C" fn(*mut c_void)>,
    pub create: Option<unsafe extern "C" fn(c_int, c_int, c_int) -> *mut Sqlite3Pcache>,
    pub cachesize: Option<unsafe extern "C" fn(*mut Sqlite3Pcache, c_int)>,
    pub pagecount: Option<unsafe extern "C" fn(*mut Sqlite3Pcache) -> c_int>,
    pub fetch: Option<unsafe extern "C" fn(*mut Sqlite3Pcache, c_uint, c_int) -> *mut PcachePage>,
    pub unpin: Option<unsafe extern "C" fn(*mut Sqlite3Pcache, *mut PcachePage, c_int)>,
    pub rekey: Option<unsafe extern "C" fn(*mut Sqlite3Pcache, *mut PcachePage, c_uint, c_uint)>,
    pub truncate: Option<unsafe extern "C" fn(*mut Sqlite3Pcache, c_uint)>,
    pub destroy: Option<unsafe extern "C" fn(*mut Sqlite3Pcache)>,
    pub shrink: Option<unsafe extern "C" fn(*mut Sqlite3Pcache)>,
}

// SAFETY: the struct holds only function pointers and a null argument.
unsafe impl Send for PcacheMethods2 {}
unsafe impl Sync for PcacheMethods2 {}

unsafe extern "C" {
    /// Variadic in C; called here only with the PCACHE2 options, which take
    /// one pointer.
    pub fn sqlite3_config(op: c_int, ...) -> c_int;
    pub fn sqlite3_initialize() -> c_int;
}
