//! The public face of the store.

use std::future::Future;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::budget::{Limits, Watchdog};
use tablix_fs::FsOp;
use tablix_pipe::PipeOp;
use tablix_proc::ProcOp;

use crate::apply_log::{AppliedState, CommandReply, EntryReply, FsApplied, FsWatch, LogEntry};
use crate::command::{
    DaemonRecord, ReplicatedCommand, SqlCommand, Stamp, Stamped, Statement, TxCommit,
};
use crate::command_log::{self, CommandLog};
use crate::config::{LogKeeper, StoreConfig};
use crate::error::StoreError;
use crate::exec::{self, Collect, Sink};
use crate::fs_writer::FsWriter;
use crate::lock::DirLock;
use crate::outcome::{FsResult, PipeResult, SqlReply, StatementOutcome};
use crate::principal::Principal;
use crate::read_conn::ReadConn;
use crate::readers::{self, Pool};
use crate::sandbox::{ProcVisibility, Role, Setup, UserConn};
use crate::sql_writer::SqlWriter;
use crate::state_machine::Proposal;
use crate::stats::{Counters, StoreStats};
use crate::transactions::{Finished, Transactions, TxInfo, TxKind, TxLimits, TxStats};
use crate::tx_writer::{TxOutcome, TxWriter};
use crate::volatile::{self, DaemonRecords, Pipes, Processes, Volatile};
use crate::wal::WalFile;
use crate::writer::{Request, Writer};

/// Distinguishes the memory databases of stores opened in one process.
static NEXT_MEMORY_DB: AtomicU64 = AtomicU64::new(0);

/// Connections serving the file system's reads.
const FS_READERS: usize = 4;

/// An answer that arrives once the writer has committed (or failed).
pub struct Ticket<T> {
    rx: oneshot::Receiver<Result<T, StoreError>>,
}

impl<T> Ticket<T> {
    /// A ticket and the sender that resolves it.
    fn pair() -> (oneshot::Sender<Result<T, StoreError>>, Ticket<T>) {
        let (tx, rx) = oneshot::channel();
        (tx, Ticket { rx })
    }

    fn ready(result: Result<T, StoreError>) -> Ticket<T> {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(result);
        Ticket { rx }
    }

    /// Waits on the current thread. Must not be called from async code.
    pub fn wait(self) -> Result<T, StoreError> {
        self.rx.blocking_recv().unwrap_or(Err(StoreError::Closed))
    }
}

impl<T> Future for Ticket<T> {
    type Output = Result<T, StoreError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StoreError::Closed)))
    }
}

/// Where a store whose log replication keeps ([`LogKeeper::Replication`])
/// sends the Commands proposed to it: replication logs and commits them
/// (on whichever node leads) and hands them back through
/// [`Store::apply_entries`]. `answer` is called once, with the Command's
/// own reply once this node applied it, or with why it was not.
pub trait Propose: Send + Sync {
    fn propose(&self, command: Stamped<ReplicatedCommand>, answer: ProposeAnswer);
}

/// How a [`Propose`] answers one Command.
pub type ProposeAnswer = Box<dyn FnOnce(Result<CommandReply, StoreError>) + Send>;

/// The store of one data directory. Owns the directory exclusively for as
/// long as it is open.
pub struct Store {
    config: StoreConfig,
    /// The file system's writer connection: the writer thread applies its
    /// groups on it, and in async mode file-system Commands are applied
    /// on it directly.
    fs: Arc<Mutex<FsWriter>>,
    /// The command log, and the write turn: one write transaction at a
    /// time on the persistent database, its entries logged in order.
    log: Arc<Mutex<CommandLog>>,
    tx: Mutex<Option<Sender<Request>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// User SQL's read-only connections.
    readers: Pool<UserConn>,
    /// The file system's read-only connections.
    fs_readers: Pool<Connection>,
    /// Tells statements that only read from those that need the writer.
    classifier: Mutex<UserConn>,
    volatile: Arc<Volatile>,
    watchdog: Arc<Watchdog>,
    counters: Arc<Counters>,
    /// With `LogKeeper::Replication`: where proposed Commands go while
    /// replication runs (it holds the store: `close` lets it go).
    proposer: std::sync::RwLock<Option<Arc<dyn Propose>>>,
    fs_watch: FsWatch,
    /// Interactive transactions, and the thread that rolls back the ones
    /// idle or open too long.
    transactions: Arc<Transactions>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    _lock: DirLock,
}

/// Creates the database file (0600, which SQLite gives its WAL too) and
/// takes those permissions from any file more open, so that no other user
/// can read the rows behind SQL's back. (A new data directory is made
/// 0711: others may reach the daemon's socket in it, not list it.)
fn prepare_data_dir(config: &StoreConfig) -> Result<(), StoreError> {
    let dir = &config.data_dir;
    let err = |cause| StoreError::DataDir {
        path: dir.clone(),
        cause,
    };
    let db = config.database_path();
    for path in [
        db.clone(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
    ] {
        if let Ok(m) = std::fs::metadata(&path)
            && m.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    if !db.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&db)
            .map_err(err)?;
    }
    Ok(())
}

impl Store {
    /// Opens (creating on first use) the data directory and starts the writer.
    pub fn open(config: StoreConfig) -> Result<Store, StoreError> {
        if !config.data_dir.exists() {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o711,
            )
            .create(&config.data_dir)
            .map_err(|cause| StoreError::DataDir {
                path: config.data_dir.clone(),
                cause,
            })?;
        }
        let lock = DirLock::acquire(&config.data_dir)?;
        prepare_data_dir(&config)?;
        if config.memory_limit > 0 {
            let hard = config.memory_limit.min(i64::MAX as u64) as i64;
            tablix_vfs::set_heap_limits(hard / 4 * 3, hard);
        }
        let volatile = Arc::new(Volatile::open(&format!(
            "tablix-mem-{}-{}",
            std::process::id(),
            NEXT_MEMORY_DB.fetch_add(1, Ordering::Relaxed)
        ))?);
        // The file system's writer first: it checks and migrates the
        // database before anything else opens it.
        let fs = Arc::new(Mutex::new(FsWriter::open(&config)?));
        let image = volatile.image()?;
        let rules = Arc::new(crate::sandbox::discover_rules(&image)?);
        let watchdog = Watchdog::start(Arc::new(std::sync::atomic::AtomicBool::new(false)))?;
        let setup = Setup {
            config: config.clone(),
            rules,
            visibility: config
                .proc_visibility
                .unwrap_or_else(ProcVisibility::of_this_system),
            watchdog: Arc::clone(&watchdog),
            transactions: crate::transactions::Reporter::default(),
        };
        let mut readers = Vec::with_capacity(config.readers.max(1));
        for _ in 0..config.readers.max(1) {
            readers.push(UserConn::open(&setup, Role::Reader, &image)?);
        }
        let readers = Pool::new(readers, "SQL reader");
        let transactions = Arc::new(Transactions::new(
            setup.clone(),
            TxLimits {
                max_open: config.max_transactions.max(1),
                idle: config.tx_idle_timeout,
                lifetime: config.tx_max_duration,
                max_bytes: config.tx_max_bytes,
            },
            Arc::clone(&volatile),
        ));
        setup.transactions.set(&transactions);
        let fs_readers = readers::open_fs_readers(&config, FS_READERS)?;
        let classifier = Mutex::new(UserConn::open(&setup, Role::Classifier, &image)?);
        let sql = SqlWriter {
            uc: UserConn::open(&setup, Role::Writer, &image)?,
        };
        let tx_writer = TxWriter::open(&config)?;
        let state_applied = {
            let fs = fs.lock().map_err(|_| StoreError::Closed)?;
            crate::apply_version::check(fs.connection(), config.log_keeper, crate::APPLY_VERSION)?;
            command_log::applied(fs.connection())?
        };
        let (mut log, recovered) = CommandLog::open(&config, state_applied)?;
        if let Some(d) = &recovered.discarded {
            tracing::warn!(
                "the command log was damaged: {d}; it is cut before entry {}{}",
                d.index,
                if d.through <= state_applied.map_or(0, |a| a.index) {
                    " (the state already holds every entry after it, so nothing is lost)"
                } else {
                    ", and the entries from there on are lost"
                }
            );
        }
        if let Some((segment, offset)) = &recovered.torn_tail {
            tracing::warn!(
                "the command log ended in a torn write at byte {offset} of {} (never synced, so never acknowledged); it is cut there",
                segment.display()
            );
        }
        if recovered.orphaned_segments > 0 {
            tracing::warn!(
                "{} command log segment(s) did not continue the log and were recycled",
                recovered.orphaned_segments
            );
        }
        {
            let fs = fs.lock().map_err(|_| StoreError::Closed)?;
            command_log::replay(&mut log, &fs, &sql, &tx_writer, &config)?;
        }
        let log = Arc::new(Mutex::new(log));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let fs_watch: FsWatch = Arc::new(Mutex::new(None));
        let writer = Writer {
            fs: Arc::clone(&fs),
            sql,
            tx: tx_writer,
            log: Arc::clone(&log),
            volatile: Arc::clone(&volatile),
            config: config.clone(),
            counters: Arc::clone(&counters),
            wal: WalFile::of(&config.database_path()),
            fs_watch: Arc::clone(&fs_watch),
            proposals: std::cell::RefCell::new(None),
            settled: std::cell::Cell::new(false),
        };
        let handle = std::thread::Builder::new()
            .name("tablix-writer".into())
            .spawn(move || writer.run(rx))?;
        let reaping = Arc::clone(&transactions);
        let reaper = std::thread::Builder::new()
            .name("tablix-tx-reaper".into())
            .spawn(move || reaping.reap_until_closed())?;
        Ok(Store {
            config,
            fs,
            log,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            readers,
            fs_readers,
            classifier,
            volatile,
            watchdog,
            counters,
            proposer: std::sync::RwLock::new(None),
            fs_watch,
            transactions,
            reaper: Mutex::new(Some(reaper)),
            _lock: lock,
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn send(&self, request: Request) -> Result<(), StoreError> {
        let guard = self.tx.lock().map_err(|_| StoreError::Closed)?;
        match guard.as_ref() {
            Some(tx) => tx.send(request).map_err(|_| StoreError::Closed),
            None => Err(StoreError::Closed),
        }
    }

    /// Queues user SQL for the writer, to run within `limits` (see
    /// [`StoreConfig::write_limits`] for the configured ones). The ticket
    /// resolves once the group it joined has committed at the configured
    /// durability.
    ///
    /// With [`LogKeeper::Replication`] the Command goes to the proposer
    /// replication set ([`Store::set_proposer`]) and is applied, on every
    /// node, under the configured write limits rather than `limits`.
    pub fn submit_sql(&self, stamped: Stamped<SqlCommand>, limits: Limits) -> Ticket<SqlReply> {
        if let Some(p) = self.proposer() {
            let command = Stamped::new(stamped.stamp, ReplicatedCommand::Sql(stamped.command));
            return through(p.as_ref(), command, |r| match r {
                CommandReply::Sql(reply) => Ok(reply),
                other => Err(other),
            });
        }
        if let Err(e) = self.proposable() {
            return Ticket::ready(Err(e));
        }
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Apply(Proposal::Sql(
            Box::new(stamped),
            limits,
            reply,
        ))) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Applies user SQL within the configured write limits and waits for it.
    pub fn apply_sql(&self, stamp: Stamp, command: SqlCommand) -> Result<SqlReply, StoreError> {
        self.submit_sql(Stamped::new(stamp, command), self.config.write_limits())
            .wait()
    }

    /// Queues a file-system operation for the writer's group commit; the
    /// ticket resolves once its group has committed at the configured
    /// durability.
    pub fn submit_fs(&self, stamped: Stamped<FsOp>) -> Ticket<FsResult> {
        if let Some(p) = self.proposer() {
            let command = Stamped::new(stamped.stamp, ReplicatedCommand::Fs(stamped.command));
            return through(p.as_ref(), command, |r| match r {
                CommandReply::Fs(result) => Ok(result),
                other => Err(other),
            });
        }
        if let Err(e) = self.proposable() {
            return Ticket::ready(Err(e));
        }
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Apply(Proposal::Fs(Box::new(stamped), reply))) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Queues an interactive transaction's commit for the writer's group
    /// commit; the ticket resolves once its group has committed (or it was
    /// refused, whole, as a conflict).
    pub(crate) fn submit_tx(&self, stamped: Stamped<TxCommit>) -> Ticket<TxOutcome> {
        if let Some(p) = self.proposer() {
            let command = Stamped::new(stamped.stamp, ReplicatedCommand::Tx(stamped.command));
            return through(p.as_ref(), command, |r| match r {
                CommandReply::Tx(outcome) => Ok(outcome),
                other => Err(other),
            });
        }
        if let Err(e) = self.proposable() {
            return Ticket::ready(Err(e));
        }
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Apply(Proposal::Tx(Box::new(stamped), reply))) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Applies a file-system operation through the writer's group commit
    /// and waits for it, whatever the mode.
    pub fn apply_fs(&self, stamp: Stamp, op: FsOp) -> Result<FsResult, StoreError> {
        self.submit_fs(Stamped::new(stamp, op)).wait()
    }

    /// Sends the Commands proposed to this store, which replication keeps
    /// the log of, to `proposer` from now on (until [`Store::close`]). Set
    /// once, by replication.
    pub fn set_proposer(&self, proposer: Arc<dyn Propose>) -> Result<(), StoreError> {
        if self.config.log_keeper != LogKeeper::Replication {
            return Err(StoreError::Apply(
                "this store keeps its own command log: Commands are proposed to it".into(),
            ));
        }
        let mut slot = self.proposer.write().map_err(|_| StoreError::Closed)?;
        if slot.is_some() {
            return Err(StoreError::Apply("the store has a proposer already".into()));
        }
        *slot = Some(proposer);
        Ok(())
    }

    fn proposer(&self) -> Option<Arc<dyn Propose>> {
        self.proposer.read().ok().and_then(|p| p.clone())
    }

    /// Tells `tx` of every file-system Command replication applies from
    /// now on (replacing whoever was told before), without waiting: a
    /// note that finds `tx` full is dropped. A Command whose stamp's seed
    /// `own` claims (asked on the writer's thread, before the Command is
    /// answered) is not told.
    pub fn watch_fs(
        &self,
        tx: std::sync::mpsc::SyncSender<FsApplied>,
        own: impl Fn(u64) -> bool + Send + 'static,
    ) {
        if let Ok(mut slot) = self.fs_watch.lock() {
            *slot = Some(crate::apply_log::Watcher {
                tx,
                own: Box::new(own),
            });
        }
    }

    /// Refuses Commands proposed to a store whose log replication keeps
    /// (and which has no proposer).
    fn proposable(&self) -> Result<(), StoreError> {
        match self.config.log_keeper {
            LogKeeper::Store => Ok(()),
            LogKeeper::Replication => Err(StoreError::NotProposer),
        }
    }

    /// Applies committed entries of replication's log
    /// ([`LogKeeper::Replication`]), in log order, on the writer thread,
    /// each after the last entry the state holds (an entry the state
    /// holds is refused, never applied twice). Each run of
    /// entries of one kind commits in one transaction that records its
    /// last entry (and the last membership among them), so a crash
    /// leaves the state naming exactly what it holds. The ticket resolves
    /// with one reply per entry once every entry is committed; a failure
    /// of the node stops the state machine ([`StoreError::Stopped`]).
    pub fn apply_entries(&self, entries: Vec<LogEntry>) -> Ticket<Vec<EntryReply>> {
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Entries(entries, reply)) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Makes this state, built by the store's own command log (a daemon
    /// without cluster flags), the first state of a cluster: records
    /// `membership`, in replication's encoding, as the membership of the
    /// last entry the state holds, and syncs it. Refused, changing
    /// nothing, unless the state holds an entry and no membership (a
    /// cluster's state always records one). Returns that entry.
    pub fn adopt_membership(&self, membership: &[u8]) -> Result<crate::LogId, StoreError> {
        // The write turn, as every writer of the state takes it.
        let _turn = self.log.lock().map_err(|_| StoreError::Closed)?;
        let fs = self.fs.lock().map_err(|_| StoreError::Closed)?;
        let applied = crate::apply_log::adopt(fs.connection(), membership)?;
        fs.sync_wal()?;
        Ok(applied)
    }

    /// The last entry the state holds and the membership recorded with
    /// it, as committed.
    pub fn applied_state(&self) -> Result<AppliedState, StoreError> {
        self.read(|c| crate::apply_log::applied_state(c))?
            .map_err(Into::into)
    }

    /// The persistent database's size in bytes (its pages), as a reader
    /// sees it.
    pub fn database_bytes(&self) -> Result<u64, StoreError> {
        let bytes = self.read(|c| {
            c.query_row(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                [],
                |r| r.get::<_, i64>(0),
            )
        })??;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// Writes a snapshot of the state to `path` (replacing any file
    /// there): a consistent copy from one read transaction, taken while
    /// writes go on, synced. Then makes the state itself durable up to
    /// at least the copy, so a log purged up to the snapshot never runs
    /// ahead of the state after a crash. Returns what the copy holds.
    /// Blocks: async code calls it from a blocking task.
    pub fn snapshot_to(&self, path: &std::path::Path) -> Result<AppliedState, StoreError> {
        let state = {
            let lease = self
                .fs_readers
                .acquire(std::time::Duration::from_secs(60))?;
            crate::snapshot::copy(&lease, path)?
        };
        self.flush().wait()?;
        Ok(state)
    }

    /// Replaces the whole state with the snapshot at `path` (one that
    /// [`Store::snapshot_to`] wrote, here or on another node), on the
    /// writer thread, durably. Only for a store whose log replication
    /// keeps: the next entry applied must follow the snapshot's.
    pub fn install_snapshot(&self, path: &std::path::Path) -> Ticket<AppliedState> {
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Install(path.to_path_buf(), reply)) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Records the daemon that owns the data directory (node-local).
    pub fn set_daemon(&self, stamp: Stamp, record: &DaemonRecord) -> Result<(), StoreError> {
        self.local(|c| volatile::apply_alone(&DaemonRecords(c), stamp, record))
    }

    /// Applies a pipe operation (node-local) at once, on this thread.
    pub fn apply_pipe(&self, stamp: Stamp, op: &PipeOp) -> Result<PipeResult, StoreError> {
        self.local(|c| volatile::apply_alone(&Pipes(c), stamp, op))
    }

    /// Applies a batch of process events (node-local) at once, on this
    /// thread. Returns the processes the batch forked that inherited pipe
    /// ends (what each still holds is for the caller to read: see
    /// `PipeOp::Holds`).
    pub fn apply_proc(&self, stamp: Stamp, op: &ProcOp) -> Result<Vec<u32>, StoreError> {
        self.local(|c| volatile::apply_alone(&Processes(c), stamp, op))
    }

    /// A node-local Command of the memory database, applied at once on
    /// this thread in its own transaction (see `volatile.rs`): never
    /// logged, synced or replicated.
    fn local<R>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        Counters::add(&self.counters.commands, 1);
        self.volatile.write(f)
    }

    /// Runs tablix's own read-only SQL on the memory database (as `main`),
    /// for crates that own its tables: pipes and processes.
    pub fn read_volatile<R>(&self, f: impl FnOnce(&ReadConn) -> R) -> Result<R, StoreError> {
        Counters::add(&self.counters.reads, 1);
        self.volatile.read(f)
    }

    /// Applies a file-system operation. In sync mode this is
    /// [`Store::apply_fs`] (group commit, durable on return). In async
    /// mode it runs at once on the caller's thread inside a transaction
    /// that stays open, so that a stream of small operations pays for
    /// neither a thread hand-off nor a commit each; the writer commits and
    /// syncs it within the flush interval, and [`Store::flush`] forces
    /// that. Use [`Store::read_latest`] to read what such operations wrote.
    pub fn apply_fs_now(&self, stamp: Stamp, op: FsOp) -> Result<FsResult, StoreError> {
        // Replicated Commands are acknowledged once committed: nothing of
        // them is pending here.
        if self.config.durability == crate::config::Durability::Sync || self.proposer().is_some() {
            return self.apply_fs(stamp, op);
        }
        self.proposable()?;
        // The log (the write turn) first, so that waiting for it never
        // holds the connection the mount's reads need.
        let mut log = self.log.lock().map_err(|_| StoreError::Closed)?;
        let mut fs = self.fs.lock().map_err(|_| StoreError::Closed)?;
        let began = !fs.has_pending();
        let r = fs.apply_pending(&mut log, &Stamped::new(stamp, op));
        drop(fs);
        drop(log);
        Counters::add(&self.counters.commands, 1);
        if began {
            self.send(Request::Pending)?;
        }
        r
    }

    /// Runs tablix's own read-only SQL (`f`) on the newest state, including
    /// operations of [`Store::apply_fs_now`] not committed yet: in async
    /// mode on the file system's writer connection (a read that changes a
    /// row fails, see [`ReadConn`]); in sync mode, where nothing acknowledged is uncommitted,
    /// on the file system's readers (see [`Store::read`]).
    pub fn read_latest<R>(&self, f: impl FnOnce(&ReadConn) -> R) -> Result<R, StoreError> {
        if self.config.durability == crate::config::Durability::Sync || self.proposer().is_some() {
            return self.read(f);
        }
        Counters::add(&self.counters.reads, 1);
        let fs = self.fs.lock().map_err(|_| StoreError::Closed)?;
        ReadConn::on_writer(fs.connection(), f)
    }

    /// Makes everything acknowledged so far durable, whatever the mode.
    pub fn flush(&self) -> Ticket<()> {
        let (reply, rx) = oneshot::channel();
        match self.send(Request::Flush(reply)) {
            Ok(()) => Ticket { rx },
            Err(e) => Ticket::ready(Err(e)),
        }
    }

    /// Begins an interactive transaction as `principal`: a read/write one
    /// reads the state committed now plus its own writes and commits as
    /// one changeset ([`Store::commit`]); a read-only one keeps reading
    /// the state committed now. Neither holds the writer. Returns its id.
    pub fn begin(&self, principal: &Principal, kind: TxKind) -> Result<String, StoreError> {
        if !self.is_open() {
            return Err(StoreError::Closed);
        }
        self.transactions.begin(principal, kind)
    }

    /// Runs statements inside transaction `id` as `principal` within
    /// `limits`, handing results to `sink` as they come. A statement that
    /// fails is undone alone; the transaction goes on.
    pub fn run_in(
        &self,
        id: &str,
        principal: &Principal,
        statements: &[Statement],
        limits: &Limits,
        sink: &mut dyn Sink,
    ) -> Result<(), StoreError> {
        Counters::add(&self.counters.reads, 1);
        self.transactions
            .run(id, principal, statements, limits, sink)
    }

    /// Commits transaction `id`: its changes are validated against the
    /// state and applied whole by the writer, or refused whole as a
    /// conflict (first committer wins). Blocks until the writer answers:
    /// async code calls it from a blocking task.
    pub fn commit(&self, id: &str, principal: &Principal) -> Result<TxOutcome, StoreError> {
        let outcome = match self.transactions.finish(id, principal)? {
            Finished::Nothing => return Ok(TxOutcome::Committed { rows: 0 }),
            Finished::Changes(commit) => self.submit_tx(Stamped::new(Stamp::now(), commit)).wait(),
        };
        self.transactions.record_outcome(&outcome);
        outcome
    }

    /// Rolls transaction `id` back: nothing of it is applied.
    pub fn rollback(&self, id: &str, principal: &Principal) -> Result<(), StoreError> {
        self.transactions.rollback(id, principal)
    }

    /// The open transactions `principal` may see (its own; root's: all).
    pub fn transactions(&self, principal: &Principal) -> Vec<TxInfo> {
        self.transactions.list(principal)
    }

    /// Counters of interactive transactions.
    pub fn tx_stats(&self) -> TxStats {
        self.transactions.stats()
    }

    /// Begins an interactive transaction for a program that links tablix:
    /// the returned handle runs statements, commits or rolls back, and
    /// rolls back if dropped open.
    pub fn transaction(
        &self,
        principal: &Principal,
        kind: TxKind,
    ) -> Result<crate::transactions::Transaction<'_>, StoreError> {
        let id = self.begin(principal, kind)?;
        Ok(crate::transactions::Transaction::new(
            self,
            id,
            principal.clone(),
        ))
    }

    /// Writes the user tables (those of `only`, if any) as SQL text that
    /// loads them back, from one snapshot: rqlite's `/db/backup?fmt=sql`.
    /// Blocks: async code calls it from a blocking task.
    pub fn dump_sql(
        &self,
        only: &[String],
        out: &mut dyn std::io::Write,
    ) -> Result<(), StoreError> {
        Counters::add(&self.counters.reads, 1);
        let lease = self
            .fs_readers
            .acquire(std::time::Duration::from_secs(60))?;
        readers::in_snapshot(&lease, |c| crate::dump::write_sql(c, "main", only, out))?
    }

    /// Writes the user tables (those of `only`, if any) into a new SQLite
    /// file at `target`, from one snapshot, while writes go on: rqlite's
    /// `/db/backup`. Blocks.
    pub fn backup_to(&self, target: &std::path::Path, only: &[String]) -> Result<(), StoreError> {
        Counters::add(&self.counters.reads, 1);
        crate::dump::write_file(
            &self.config.database_path(),
            self.config.vfs.as_deref(),
            target,
            only,
        )
    }

    /// The statements that replace the user tables with those of the
    /// SQLite database at `path` (rqlite's `/db/load` of a file): today's
    /// user objects dropped, the file's made. Refused for a file that is
    /// not SQLite or that holds tablix's own tables. Blocks.
    pub fn load_statements(&self, path: &std::path::Path) -> Result<Vec<String>, crate::LoadError> {
        let current = self.read(|c| crate::dump::user_objects(c))??;
        crate::dump::load_statements(path, &current)
    }

    /// Rewrites the database file compactly (`VACUUM`), on the writer
    /// thread between groups: maintenance of this node's file, which
    /// changes no row and is not a Command. Blocks until done.
    pub fn vacuum(&self) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Vacuum(reply))?;
        Ticket { rx }.wait()
    }

    /// Runs read-only user statements as `principal` within the
    /// configured read limits, on one snapshot, and gathers their results.
    pub fn query(
        &self,
        principal: &Principal,
        statements: &[Statement],
    ) -> Result<Vec<StatementOutcome>, StoreError> {
        let limits = self.config.read_limits();
        let mut sink = Collect::new(limits.max_result_bytes);
        self.query_into(principal, statements, &limits, &mut sink)?;
        Ok(sink.outcomes)
    }

    /// Runs read-only user statements as `principal` within `limits`, on
    /// one snapshot of a reader, handing results to `sink` as they come.
    /// Waits for a reader at most the request's time limit.
    pub fn query_into(
        &self,
        principal: &Principal,
        statements: &[Statement],
        limits: &Limits,
        sink: &mut dyn Sink,
    ) -> Result<(), StoreError> {
        let mut lease = self.readers.acquire(limits.timeout)?;
        Counters::add(&self.counters.reads, 1);
        let rules = lease.policy.rules();
        if statements.iter().any(|s| rules.mentions_memory(&s.sql))
            && self.volatile.generation() != lease.mem_generation()
        {
            let image = self.volatile.image()?;
            lease.refresh_mem(&image)?;
        }
        let uc: &UserConn = &lease;
        let _running = uc.begin(principal, limits);
        readers::in_snapshot(&uc.conn, |_| {
            for st in statements {
                if exec::run(uc, st, sink).is_err() {
                    break;
                }
            }
        })
    }

    /// Whether every statement only reads and returns rows, as `principal`
    /// would run it: such a request can go to a reader; any other needs
    /// the writer. Prepares, never runs, on a connection of its own.
    pub fn classify(
        &self,
        principal: &Principal,
        statements: &[Statement],
    ) -> Result<bool, StoreError> {
        let c = self.classifier.lock().map_err(|_| StoreError::Closed)?;
        c.policy.set_principal(principal);
        let _enforcing = c.enforce();
        for st in statements {
            if crate::sqltext::nul_offset(&st.sql).is_some() {
                return Ok(false);
            }
            if crate::exec::several(&st.sql) {
                // Several statements in one element: a read if each only
                // reads and the last returns rows (its rows are the
                // element's result).
                use rusqlite::fallible_iterator::FallibleIterator;
                let mut batch = rusqlite::Batch::new(&c.conn, &st.sql);
                let mut last_has_rows = false;
                loop {
                    match batch.next() {
                        Ok(Some(p)) if p.readonly() => last_has_rows = p.column_count() > 0,
                        Ok(None) => break,
                        _ => return Ok(false),
                    }
                }
                if !last_has_rows {
                    return Ok(false);
                }
                continue;
            }
            match c.conn.prepare(&st.sql) {
                Ok(p) if p.readonly() && p.column_count() > 0 => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Runs tablix's own read-only SQL (`f`) on one snapshot of the file
    /// system's readers, which no user query ever holds.
    pub fn read<R>(&self, f: impl FnOnce(&ReadConn) -> R) -> Result<R, StoreError> {
        Counters::add(&self.counters.reads, 1);
        let lease = self
            .fs_readers
            .acquire(std::time::Duration::from_secs(60))?;
        readers::in_snapshot(&lease, |c| f(&ReadConn::reader(c)))
    }

    pub fn stats(&self) -> StoreStats {
        let (heap, peak) = tablix_vfs::heap_used();
        let stops = &self.watchdog.counts;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            memory_locks: self.volatile.lock_stats().into(),
            sqlite_heap_bytes: heap,
            sqlite_heap_peak_bytes: peak,
            statements_timed_out: get(&stops.timed_out),
            statements_cancelled: get(&stops.cancelled),
            statements_stopped_at_shutdown: get(&stops.shut_down),
            ..self.counters.snapshot()
        }
    }

    /// Whether the store still takes Commands.
    pub fn is_open(&self) -> bool {
        self.tx.lock().map(|t| t.is_some()).unwrap_or(false)
    }

    /// Interrupts every user statement running now and refuses new ones
    /// (stopping the daemon): acknowledged writes are kept.
    pub fn stop_statements(&self) {
        self.watchdog.stop_all();
    }

    /// Stops accepting Commands, lets the writer finish every queued one,
    /// flushes and checkpoints. Idempotent.
    pub fn close(&self) -> Result<(), StoreError> {
        if let Ok(mut p) = self.proposer.write() {
            p.take();
        }
        if let Ok(mut w) = self.fs_watch.lock() {
            w.take();
        }
        self.transactions.close();
        if let Some(h) = self.reaper.lock().ok().and_then(|mut h| h.take()) {
            let _ = h.join();
        }
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        self.readers.close();
        self.fs_readers.close();
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        let joined = match handle {
            Some(h) => h
                .join()
                .map_err(|_| StoreError::Apply("the writer thread panicked".into())),
            None => Ok(()),
        };
        self.watchdog.close();
        joined
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!("closing the store: {e}");
        }
    }
}

/// Proposes `command` through `proposer`; the ticket resolves with the
/// part of its reply `pick` takes (it hands back a reply of another kind).
fn through<T: Send + 'static>(
    proposer: &dyn Propose,
    command: Stamped<ReplicatedCommand>,
    pick: fn(CommandReply) -> Result<T, CommandReply>,
) -> Ticket<T> {
    let (tx, ticket) = Ticket::pair();
    proposer.propose(
        command,
        Box::new(move |r| {
            let _ = tx.send(r.and_then(|reply| match reply {
                CommandReply::Failed(e) => Err(StoreError::Apply(e)),
                CommandReply::AppliedBefore => Err(StoreError::Replication(
                    "the Command was applied before this node restarted; its reply is lost".into(),
                )),
                CommandReply::Repeated => Err(StoreError::Replication(
                    "the Command was applied once already (sent again after a leader change); its reply is lost".into(),
                )),
                // Formatted only when it is not the kind asked for: a
                // reply carries its result rows, however many.
                other => pick(other).map_err(|other| {
                    StoreError::Replication(format!("a Command was answered {other:?}"))
                }),
            }));
        }),
    );
    ticket
}
