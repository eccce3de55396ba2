//! The sandbox a connection that runs user SQL lives in.
//!
//! Every such connection (the SQL writer, each reader, the classifier)
//! is set up the same way:
//!
//! * SQLite's defensive mode on and the schema untrusted, so no SQL can
//!   write the schema, pages or shadow tables directly, and functions with
//!   side effects cannot run from views or triggers;
//! * the largest value it can build or return bounded
//!   (`SQLITE_LIMIT_LENGTH`, the result limit);
//! * the memory database attached as `mem` from an image (a private,
//!   read-only copy, see `volatile.rs`), never the live one;
//! * the views of system state (`files`, `processes`, `pipes`,
//!   `pid_pipe`, `pid_store`, `daemon`) in its temp schema, and the
//!   functions they use to apply the current request's principal;
//! * the authorizer (`policy.rs`) and a progress handler that stops
//!   statements past their request's bounds (`budget.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::config::DbConfig;
use rusqlite::functions::FunctionFlags;
use rusqlite::limits::Limit;
use rusqlite::{Connection, OpenFlags};
use tablix_vfs::ClockVfs;

use crate::budget::{Guard, Limits, PROGRESS_OPS, Watchdog, Watched};
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::policy::{Policy, Rules, State};
use crate::principal::Principal;
use crate::volatile::MemImage;

/// The `daemon` view: the running daemon, public.
const DAEMON_VIEW: &str = "
CREATE TEMP VIEW daemon AS
    SELECT pid, http_addr, data_dir, mode, version, started_ns FROM mem.daemon;
";

/// Every view of system state, in creation order.
fn user_views() -> [&'static str; 5] {
    [
        tablix_fs::schema::USER_VIEWS,
        tablix_pipe::schema::USER_VIEWS,
        tablix_proc::schema::USER_VIEWS,
        DAEMON_VIEW,
        crate::transactions::USER_VIEWS,
    ]
}

/// Smallest value limit, whatever the result limit: SQL needs room to work.
const MIN_VALUE_LIMIT: usize = 1 << 20;

/// A user write that has run this long computes rather than commits a row:
/// from then until the writer next waits for work (`writer.rs`: its
/// rollback and the WAL's checkpoint too) the writer thread takes
/// [`LONG_WRITE_SLICE`]. Short writes keep the default slice, so a burst of
/// them is not cut up by every thread that wakes.
const LONG_WRITE: std::time::Duration = std::time::Duration::from_millis(1);

/// The writer's scheduler slice during a long user write, the shortest the
/// kernel gives: the write keeps normal priority, but whatever wakes beside
/// it (the mount's threads, their callers) runs within this instead of at
/// the next tick (`tablix_sched::slice`).
const LONG_WRITE_SLICE: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a transaction's request runs at normal priority before it is
/// lowered (`SCHED_IDLE`, as a read request's is from its start): under
/// it, entering and leaving cost a fifth of a five-statement transaction's
/// time (measured with `tablix bench tps`), and a query this short cannot
/// hold the mount's threads back for longer than one scheduler call.
const TX_LOWER_AFTER: std::time::Duration = std::time::Duration::from_micros(200);

/// What the connection does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Applies user SQL Commands (read-write, on the command clock).
    Writer,
    /// Runs read-only requests.
    Reader,
    /// Prepares statements to tell whether they only read; never runs one.
    Classifier,
    /// Runs an interactive transaction's statements on its private view
    /// (`tx_view.rs`): read-write, its changes recorded, never the
    /// writer's.
    Transaction,
}

/// What /proc hides from other users, as it is mounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcVisibility {
    /// /proc's hidepid: 0 shows everything, 1 hides other users' task
    /// details, 2 hides their tasks.
    pub hidepid: u8,
    /// Members of this group are exempt (/proc's `gid=` option).
    pub exempt_gid: Option<u32>,
}

impl ProcVisibility {
    /// Reads /proc's mount options from /proc/self/mountinfo.
    pub fn of_this_system() -> ProcVisibility {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        ProcVisibility::from_mountinfo(&text)
    }

    fn from_mountinfo(text: &str) -> ProcVisibility {
        let mut v = ProcVisibility::default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            if fields.get(4) != Some(&"/proc") || fields.get(dash + 1) != Some(&"proc") {
                continue;
            }
            let options = fields.get(dash + 3).copied().unwrap_or("");
            for o in options.split(',') {
                match o.split_once('=') {
                    Some(("hidepid", "1" | "noaccess")) => v.hidepid = 1,
                    Some(("hidepid", "2" | "invisible" | "4" | "ptraceable")) => v.hidepid = 2,
                    Some(("hidepid", _)) => v.hidepid = 0,
                    Some(("gid", g)) => v.exempt_gid = g.parse().ok(),
                    _ => {}
                }
            }
        }
        v
    }
}

/// What every sandboxed connection of one store shares.
#[derive(Clone)]
pub(crate) struct Setup {
    pub(crate) config: StoreConfig,
    pub(crate) rules: Arc<Rules>,
    pub(crate) visibility: ProcVisibility,
    pub(crate) watchdog: Arc<Watchdog>,
    /// The store's interactive transactions, for the views that report
    /// them; set once they exist (they keep a `Setup` themselves).
    pub(crate) transactions: crate::transactions::Reporter,
}

/// The names of system state, read from a scratch connection laid out as
/// a sandboxed one.
pub(crate) fn discover_rules(image: &MemImage) -> Result<Rules, StoreError> {
    let mut conn = Connection::open_in_memory()?;
    attach_image(&mut conn, image)?;
    for views in user_views() {
        conn.execute_batch(views)?;
    }
    Ok(Rules::discover(&conn)?)
}

fn attach_image(conn: &mut Connection, image: &MemImage) -> rusqlite::Result<()> {
    if conn
        .query_row(
            "SELECT 1 FROM pragma_database_list WHERE name = 'mem'",
            [],
            |_| Ok(()),
        )
        .is_err()
    {
        conn.execute_batch("ATTACH ':memory:' AS mem")?;
    }
    conn.deserialize_read_exact("mem", &image.bytes[..], image.bytes.len(), true)
}

/// A connection that runs user SQL.
///
/// Field order matters: `conn` closes before the clock VFS it may use is
/// unregistered.
pub(crate) struct UserConn {
    pub(crate) conn: tablix_vfs::RecordingConn,
    pub(crate) policy: Policy,
    pub(crate) guard: Arc<Guard>,
    /// The memory image attached as `mem`.
    mem_generation: u64,
    /// State of the generator behind `random()` (the writer's).
    rng: Arc<AtomicU64>,
    watchdog: Arc<Watchdog>,
    clock: Option<ClockVfs>,
    role: Role,
}

impl UserConn {
    /// Whether this connection applies Commands (the SQL writer).
    pub(crate) fn is_writer(&self) -> bool {
        self.role == Role::Writer
    }

    pub(crate) fn open(
        setup: &Setup,
        role: Role,
        image: &MemImage,
    ) -> Result<UserConn, StoreError> {
        UserConn::open_on(setup, role, image, None)
    }

    /// Opens a sandboxed connection on `uri` (a transaction's view), or
    /// on the store's database when None.
    pub(crate) fn open_on(
        setup: &Setup,
        role: Role,
        image: &MemImage,
        uri: Option<&str>,
    ) -> Result<UserConn, StoreError> {
        let config = &setup.config;
        let clock = match role {
            Role::Writer => Some(
                ClockVfs::register_over(config.vfs.as_deref())
                    .map_err(|e| StoreError::Open(e.to_string()))?,
            ),
            _ => None,
        };
        let mut flags = OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        flags |= match role {
            Role::Writer | Role::Transaction => OpenFlags::SQLITE_OPEN_READ_WRITE,
            Role::Reader | Role::Classifier => OpenFlags::SQLITE_OPEN_READ_ONLY,
        };
        let path = config.database_path();
        let vfs = clock.as_ref().map(ClockVfs::name).or(config.vfs.as_deref());
        let mut conn = match (uri, vfs) {
            (Some(uri), _) => Connection::open_with_flags(uri, flags)?,
            (None, Some(v)) => Connection::open_with_flags_and_vfs(&path, flags, v)?,
            (None, None) => Connection::open_with_flags(&path, flags)?,
        };
        if role == Role::Transaction {
            // The view keeps its journal in memory (its VFS refuses a file
            // for it) and its pages between statements: it is the only
            // connection of its database.
            conn.pragma_update(None, "journal_mode", "MEMORY")?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        if role == Role::Writer {
            writer_pragmas(&conn, config)?;
        }
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
        let value_limit = config
            .max_result_bytes
            .max(MIN_VALUE_LIMIT)
            .min(i32::MAX as usize);
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, value_limit as i32)?;
        attach_image(&mut conn, image)?;
        let policy = Policy::install(&mut conn, Arc::clone(&setup.rules), nobody())?;
        let rng = Arc::new(AtomicU64::new(0));
        register_identity(&conn, policy.shared_state(), setup.visibility)?;
        crate::file_data::register(&conn, policy.shared_state())?;
        crate::transactions::register_report(
            &conn,
            policy.shared_state(),
            setup.transactions.clone(),
        )?;
        if role == Role::Writer {
            register_random(&conn, &rng, value_limit)?;
        }
        tablix_pcache::register_stats_table(&conn)?;
        for views in user_views() {
            conn.execute_batch(views)?;
        }
        let guard = Arc::new(setup.watchdog.guard());
        let g = Arc::clone(&guard);
        let writes = role == Role::Writer;
        conn.progress_handler(
            PROGRESS_OPS,
            Some(move || {
                if writes && g.running_for() >= LONG_WRITE {
                    tablix_sched::slice::shorten(LONG_WRITE_SLICE);
                }
                // A reader's query runs lowered (`begin`) and yields to
                // any thread ready beside it; for the writer a no-op.
                tablix_sched::give_way();
                g.should_stop()
            }),
        )?;
        if matches!(role, Role::Reader | Role::Classifier) {
            conn.pragma_update(None, "query_only", true)?;
        }
        if role == Role::Transaction {
            policy.state().in_transaction = true;
        }
        Ok(UserConn {
            conn: tablix_vfs::RecordingConn::new(conn),
            policy,
            guard,
            mem_generation: image.generation,
            rng,
            watchdog: Arc::clone(&setup.watchdog),
            clock,
            role,
        })
    }

    /// Attaches a newer image of the memory database, if `image` is one.
    /// Only between transactions.
    pub(crate) fn refresh_mem(&mut self, image: &MemImage) -> Result<(), StoreError> {
        if image.generation <= self.mem_generation {
            return Ok(());
        }
        attach_image(self.conn.conn_mut(), image)?;
        self.mem_generation = image.generation;
        Ok(())
    }

    pub(crate) fn mem_generation(&self) -> u64 {
        self.mem_generation
    }

    /// Enforces the authorizer until the returned value is dropped: user
    /// SQL is prepared and stepped only inside. Outside, the connection
    /// runs tablix's own statements (transaction control, audits).
    pub(crate) fn enforce(&self) -> Enforcing<'_> {
        self.policy.set_enforcing(true);
        Enforcing(&self.policy)
    }

    /// Runs tablix's own SQL while user SQL is being enforced.
    pub(crate) fn own<R>(&self, f: impl FnOnce(&Connection) -> R) -> R {
        let was = std::mem::replace(&mut self.policy.state().enforcing, false);
        let r = f(&self.conn);
        self.policy.set_enforcing(was);
        r
    }

    /// Starts a request as `principal` within `limits`; the request ends
    /// when the returned value is dropped.
    pub(crate) fn begin(&self, principal: &Principal, limits: &Limits) -> Running<'_> {
        self.policy.set_principal(principal);
        self.guard.start(limits);
        let watched = self
            .watchdog
            .watch(&self.guard, self.conn.get_interrupt_handle());
        Running {
            conn: self,
            _watched: watched,
            // Only work that holds no turn of the writer: a user write
            // holds the write turn, which the mount's writes wait for, so
            // it must not wait for idle CPU. A transaction's statements
            // run on its private view, most of them short and each a
            // request of its own: they are lowered once they have run
            // TX_LOWER_AFTER, so a short one pays no scheduler call.
            _lowered: match self.role {
                Role::Reader => Some(tablix_sched::Lowered::enter()),
                Role::Transaction => Some(tablix_sched::Lowered::after(TX_LOWER_AFTER)),
                Role::Writer | Role::Classifier => None,
            },
        }
    }

    /// Puts the writer in the state every Command starts from: the
    /// Command's time and seed, and no remembered insert id.
    pub(crate) fn set_stamp(&self, stamp: crate::command::Stamp) {
        if let Some(clock) = &self.clock {
            clock.set_unix_nanos(stamp.unix_nanos);
        }
        self.rng.store(stamp.seed, Ordering::Relaxed);
        tablix_vfs::set_last_insert_rowid(&self.conn, 0);
    }
}

/// The authorizer's enforcement, ended when dropped.
pub(crate) struct Enforcing<'a>(&'a Policy);

impl Drop for Enforcing<'_> {
    fn drop(&mut self) {
        self.0.set_enforcing(false);
    }
}

/// A request running on a sandboxed connection.
pub(crate) struct Running<'a> {
    conn: &'a UserConn,
    _watched: Watched<'a>,
    /// A reader's thread under SCHED_IDLE for the request.
    _lowered: Option<tablix_sched::Lowered>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.conn.guard.finish();
    }
}

/// Whom a connection runs as between requests: nobody.
fn nobody() -> Principal {
    Principal {
        name: "nobody".into(),
        uid: 65534,
        gid: 65534,
        groups: Vec::new(),
        raw: false,
    }
}

fn principal_of(state: &Mutex<State>) -> Principal {
    state
        .lock()
        .map(|s| s.principal.clone())
        .unwrap_or_else(|_| nobody())
}

/// The functions the views use to apply the current principal. They have
/// no side effects (innocuous: usable in the temp views) but depend on who
/// asks, so they are not deterministic and no index can be built on them.
fn register_identity(
    conn: &Connection,
    state: Arc<Mutex<State>>,
    visibility: ProcVisibility,
) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_INNOCUOUS;
    let s = Arc::clone(&state);
    conn.create_scalar_function("tablix_may", 4, flags, move |ctx| {
        let p = s.lock().map_err(|_| poisoned())?;
        Ok(match four_ids(ctx)? {
            Some([mode, uid, gid, mask]) => p.principal.may(mode, uid, gid, mask),
            None => p.principal.is_root(),
        })
    })?;
    let s = Arc::clone(&state);
    conn.create_scalar_function("tablix_may_inspect", 4, flags, move |ctx| {
        let p = s.lock().map_err(|_| poisoned())?;
        Ok(match four_ids(ctx)? {
            Some([uid, euid, gid, egid]) => p.principal.may_inspect(uid, euid, gid, egid),
            None => p.principal.is_root(),
        })
    })?;
    let s = Arc::clone(&state);
    conn.create_scalar_function("tablix_caller_uid", 0, flags, move |_| {
        Ok(principal_of(&s).uid)
    })?;
    conn.create_scalar_function("tablix_hidepid", 0, flags, move |_| {
        let p = principal_of(&state);
        let exempt = visibility
            .exempt_gid
            .is_some_and(|g| p.gid == g || p.groups.contains(&g));
        Ok(if exempt { 0 } else { visibility.hidepid })
    })?;
    Ok(())
}

/// The four integer arguments of an access check, or None when one is
/// NULL: a task whose credentials were never read (it forked from a
/// process tablix had not seen and exited before it was looked at) is
/// root's alone to inspect, as an unreadable /proc entry would be.
fn four_ids(ctx: &rusqlite::functions::Context<'_>) -> rusqlite::Result<Option<[u32; 4]>> {
    let mut ids = [0; 4];
    for (i, id) in ids.iter_mut().enumerate() {
        match ctx.get::<Option<i64>>(i)? {
            Some(v) => *id = v as u32,
            None => return Ok(None),
        }
    }
    Ok(Some(ids))
}

fn poisoned() -> rusqlite::Error {
    rusqlite::Error::UserFunctionError("tablix: a lock was poisoned".into())
}

/// Replaces SQLite's `random()` and `randomblob()` on the writer with a
/// generator seeded from the Command's stamp, so replay reproduces them.
/// `randomblob(n)` refuses more than `limit` bytes before allocating them,
/// as SQLite's own would.
fn register_random(conn: &Connection, rng: &Arc<AtomicU64>, limit: usize) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8;
    let state = Arc::clone(rng);
    conn.create_scalar_function("random", 0, flags, move |_| Ok(next_random(&state) as i64))?;
    let state = Arc::clone(rng);
    conn.create_scalar_function("randomblob", 1, flags, move |ctx| {
        let n = sqlite_int(ctx.get_raw(0));
        if n > limit as i64 {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_TOOBIG),
                Some("string or blob too big".into()),
            ));
        }
        let n = n.max(1) as usize;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            out.extend_from_slice(&next_random(&state).to_le_bytes());
        }
        out.truncate(n);
        Ok(out)
    })?;
    Ok(())
}

/// A value as SQLite's `sqlite3_value_int64` reads it, which its own
/// `randomblob` uses: NULL is 0, reals are truncated, text and blobs are
/// their leading integer (after blanks and a sign; none is 0).
fn sqlite_int(v: rusqlite::types::ValueRef<'_>) -> i64 {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Integer(i) => i,
        ValueRef::Real(f) => f as i64,
        ValueRef::Null => 0,
        ValueRef::Text(t) | ValueRef::Blob(t) => {
            let t = t.trim_ascii_start();
            let (negative, digits) = match t.first() {
                Some(b'-') => (true, &t[1..]),
                Some(b'+') => (false, &t[1..]),
                _ => (false, t),
            };
            let magnitude = digits
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0i64, |n, d| {
                    n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
                });
            if negative { -magnitude } else { magnitude }
        }
    }
}

/// splitmix64: small, fast and good enough for SQL's random().
fn next_random(state: &AtomicU64) -> u64 {
    let s = state
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pragmas of a connection that writes the user database: durability
/// comes from the command log (see `fs_writer.rs`), and the WAL is bounded
/// as the file system's is.
pub(crate) fn writer_pragmas(conn: &Connection, config: &StoreConfig) -> rusqlite::Result<()> {
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "journal_size_limit", config.wal_limit as i64)?;
    conn.pragma_update(
        None,
        "wal_autocheckpoint",
        crate::fs_writer::sql_autocheckpoint_pages(config.wal_limit),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each case checked against sqlite3's own `length(randomblob(x))`.
    #[test]
    fn randomblobs_length_is_read_as_sqlite_reads_an_integer() {
        use rusqlite::types::ValueRef;
        for (v, n) in [
            (ValueRef::Integer(16), 16),
            (ValueRef::Real(2.9), 2),
            (ValueRef::Real(-2.9), -2),
            (ValueRef::Null, 0),
            (ValueRef::Blob(b"12"), 12),
            (ValueRef::Blob(&[0xff, b'1']), 0),
            (ValueRef::Text(b"16"), 16),
            (ValueRef::Text(b"  -7x"), -7),
            (ValueRef::Text(b"+3.5e2"), 3),
            (ValueRef::Text(b"abc"), 0),
            (ValueRef::Text(b"99999999999999999999"), i64::MAX),
        ] {
            assert_eq!(sqlite_int(v), n, "{v:?}");
        }
    }

    #[test]
    fn proc_mount_options_are_read() {
        let line = |opts: &str| {
            format!(
                "22 1 0:21 / /proc rw,nosuid - proc proc {opts}\n30 1 0:5 / /dev rw - devtmpfs udev rw\n"
            )
        };
        let v = |opts: &str| ProcVisibility::from_mountinfo(&line(opts));
        assert_eq!(v("rw"), ProcVisibility::default());
        assert_eq!(v("rw,hidepid=invisible").hidepid, 2);
        assert_eq!(
            v("rw,hidepid=2,gid=27"),
            ProcVisibility {
                hidepid: 2,
                exempt_gid: Some(27)
            }
        );
        assert_eq!(v("rw,hidepid=noaccess").hidepid, 1);
        assert_eq!(v("rw,hidepid=off").hidepid, 0);
        // /proc mounted elsewhere (a container's) does not count.
        let other = "22 1 0:21 / /srv/proc rw - proc proc rw,hidepid=2\n";
        assert_eq!(ProcVisibility::from_mountinfo(other).hidepid, 0);
    }
}
