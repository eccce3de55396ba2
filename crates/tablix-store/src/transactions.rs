//! Interactive transactions: open ones by id, their bounds, and their
//! statistics. A read/write transaction runs on a private view of its
//! snapshot (`tx_view.rs`) and commits as one `TxCommit`; a read-only one
//! (`BEGIN READONLY`) keeps a sandboxed reader's read transaction open.
//! DESIGN.md ("Interactive transactions") gives the design.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::budget::Limits;
use crate::changeset;
use crate::command::{Statement, TxCommit};
use crate::error::{SqliteFailure, StoreError};
use crate::exec::{self, Cell, Sink, Stop};
use crate::principal::Principal;
use crate::sandbox::{Role, Setup, UserConn};
use crate::tx_view::{Pin, Pins, View, Views};
use crate::volatile::Volatile;

/// What a transaction may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TxKind {
    /// `BEGIN`: reads its snapshot and its own writes; commits as one
    /// changeset.
    ReadWrite,
    /// `BEGIN READONLY`: reads its snapshot; never blocks nor is blocked.
    ReadOnly,
}

/// A statement that begins or ends an interactive transaction, as a
/// client sends it: `BEGIN [DEFERRED | IMMEDIATE | EXCLUSIVE]
/// [TRANSACTION]`, `BEGIN [TRANSACTION] READONLY` (the seed's), `COMMIT`
/// or `END [TRANSACTION]`, `ROLLBACK [TRANSACTION]` (not `ROLLBACK TO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxControl {
    Begin(TxKind),
    Commit,
    Rollback,
}

impl TxControl {
    /// What `sql` is, if one of those (a trailing `;` and comments aside).
    pub fn parse(sql: &str) -> Option<TxControl> {
        use crate::sqltext::{Token, tokens};
        let mut t = tokens(sql);
        while t.last() == Some(&Token::Punct(';')) {
            t.pop();
        }
        let words: Vec<&str> = t
            .iter()
            .map(|k| match k {
                Token::Word(w) => Some(w.as_str()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        match words.as_slice() {
            ["begin"] | ["begin", "transaction"] => Some(TxControl::Begin(TxKind::ReadWrite)),
            ["begin", "deferred" | "immediate" | "exclusive"]
            | [
                "begin",
                "deferred" | "immediate" | "exclusive",
                "transaction",
            ] => Some(TxControl::Begin(TxKind::ReadWrite)),
            ["begin", "readonly"] | ["begin", "transaction", "readonly"] => {
                Some(TxControl::Begin(TxKind::ReadOnly))
            }
            ["commit"] | ["commit", "transaction"] | ["end"] | ["end", "transaction"] => {
                Some(TxControl::Commit)
            }
            ["rollback"] | ["rollback", "transaction"] => Some(TxControl::Rollback),
            _ => None,
        }
    }
}

/// The bounds of interactive transactions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxLimits {
    pub(crate) max_open: usize,
    pub(crate) idle: Duration,
    pub(crate) lifetime: Duration,
    pub(crate) max_bytes: usize,
}

/// One open transaction as its owner (or root) may see it.
#[derive(Clone, Debug, Serialize)]
pub struct TxInfo {
    pub id: String,
    pub kind: TxKind,
    pub owner: String,
    pub uid: u32,
    pub age_seconds: f64,
    pub idle_seconds: f64,
    /// Bytes of pages it changed (read/write only).
    pub changed_bytes: u64,
}

/// Counters of interactive transactions since the store opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TxStats {
    /// Open now, read/write and read-only.
    pub open: u64,
    pub open_readonly: u64,
    pub begun: u64,
    pub committed: u64,
    /// Commits refused because rows they changed were changed since their
    /// snapshot (first committer wins).
    pub conflicts: u64,
    /// Commits refused for another reason of their own.
    pub refused: u64,
    pub rolled_back: u64,
    /// Rolled back after `--tx-idle-timeout` without a request.
    pub idle_timeouts: u64,
    /// Rolled back after `--tx-max-duration`.
    pub expired: u64,
    /// Statements refused because the transaction's changes would pass
    /// `--tx-max-bytes`.
    pub too_large: u64,
    /// Connections opened for transactions (views, the pins under them,
    /// read-only readers). The pools keep up to `--max-transactions`
    /// idle, so a steady load opens none.
    pub connections_opened: u64,
}

#[derive(Default)]
struct Counters {
    begun: AtomicU64,
    committed: AtomicU64,
    conflicts: AtomicU64,
    refused: AtomicU64,
    rolled_back: AtomicU64,
    idle_timeouts: AtomicU64,
    expired: AtomicU64,
    too_large: AtomicU64,
    readers_opened: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What an open transaction runs on.
enum Body {
    ReadWrite { view: View, pin: Arc<Pin> },
    ReadOnly { uc: UserConn },
}

/// An open transaction.
struct Entry {
    kind: TxKind,
    owner: Principal,
    started: Instant,
    /// Milliseconds after `started` of the end of its last request.
    last_used_ms: AtomicU64,
    /// None once it ended (the entry is then out of the table too).
    body: Mutex<Option<Body>>,
}

impl Entry {
    fn idle(&self, now: Instant) -> Duration {
        let since_start = now.saturating_duration_since(self.started);
        since_start.saturating_sub(Duration::from_millis(
            self.last_used_ms.load(Ordering::Relaxed),
        ))
    }

    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_used_ms.store(ms, Ordering::Relaxed);
    }

    fn owned_by(&self, who: &Principal) -> bool {
        self.owner.uid == who.uid && self.owner.name == who.name
    }
}

/// Why transactions that ended without their client's word ended, for the
/// client's next request (the most recent ones).
const REMEMBERED_ENDS: usize = 1024;

/// The open transactions of one store.
pub(crate) struct Transactions {
    limits: TxLimits,
    open: Mutex<HashMap<String, Arc<Entry>>>,
    ended: Mutex<VecDeque<(String, String)>>,
    views: Views,
    pins: Pins,
    readers: Mutex<Vec<UserConn>>,
    setup: Setup,
    volatile: Arc<Volatile>,
    counters: Counters,
    /// Wakes the reaper early (closing).
    closing: (Mutex<bool>, Condvar),
}

/// What a commit leaves to the writer: the changeset, or nothing.
pub(crate) enum Finished {
    /// A read-only transaction, or one that changed nothing.
    Nothing,
    Changes(TxCommit),
}

impl Transactions {
    pub(crate) fn new(setup: Setup, limits: TxLimits, volatile: Arc<Volatile>) -> Transactions {
        Transactions {
            limits,
            open: Mutex::new(HashMap::new()),
            ended: Mutex::new(VecDeque::new()),
            views: Views::new(setup.clone()),
            pins: Pins::new(&setup.config),
            readers: Mutex::new(Vec::new()),
            setup,
            volatile,
            counters: Counters::default(),
            closing: (Mutex::new(false), Condvar::new()),
        }
    }

    fn table(&self) -> Result<MutexGuard<'_, HashMap<String, Arc<Entry>>>, StoreError> {
        self.open.lock().map_err(|_| StoreError::Closed)
    }

    /// Begins a transaction as `who`; returns its id.
    pub(crate) fn begin(&self, who: &Principal, kind: TxKind) -> Result<String, StoreError> {
        if self.table()?.len() >= self.limits.max_open {
            return Err(StoreError::TooManyTransactions(format!(
                "{} interactive transactions are open, the most tablix allows (--max-transactions); commit or roll back one first",
                self.limits.max_open
            )));
        }
        let image = self.volatile.image()?;
        let body = match kind {
            TxKind::ReadWrite => {
                let pin = self.pins.take()?;
                match self.views.take(&pin, &image, self.limits.max_bytes) {
                    Ok(view) => Body::ReadWrite { view, pin },
                    Err(e) => {
                        self.pins.give_back(pin);
                        return Err(e);
                    }
                }
            }
            TxKind::ReadOnly => {
                let idle = self.readers.lock().ok().and_then(|mut v| v.pop());
                let mut uc = match idle {
                    Some(uc) => uc,
                    None => {
                        let uc = UserConn::open(&self.setup, Role::Reader, &image)?;
                        bump(&self.counters.readers_opened);
                        uc
                    }
                };
                uc.refresh_mem(&image)?;
                let began = uc.own(|c| {
                    c.execute_batch("BEGIN")?;
                    // The first read starts the read transaction: the
                    // snapshot, as of now.
                    c.query_row("SELECT count(*) FROM main.sqlite_schema", [], |r| {
                        r.get::<_, i64>(0)
                    })
                });
                if let Err(e) = began {
                    let _ = uc.conn.execute_batch("ROLLBACK");
                    return Err(StoreError::Failed(SqliteFailure::of(&e)));
                }
                Body::ReadOnly { uc }
            }
        };
        let id = new_id();
        let entry = Arc::new(Entry {
            kind,
            owner: who.clone(),
            started: Instant::now(),
            last_used_ms: AtomicU64::new(0),
            body: Mutex::new(Some(body)),
        });
        let mut table = self.table()?;
        if table.len() >= self.limits.max_open {
            drop(table);
            if let Ok(mut b) = entry.body.lock()
                && let Some(body) = b.take()
            {
                self.release(body);
            }
            return Err(StoreError::TooManyTransactions(format!(
                "{} interactive transactions are open, the most tablix allows (--max-transactions); commit or roll back one first",
                self.limits.max_open
            )));
        }
        table.insert(id.clone(), entry);
        bump(&self.counters.begun);
        Ok(id)
    }

    /// The entry of `id`, if `who` may use it.
    fn entry(&self, id: &str, who: &Principal) -> Result<Arc<Entry>, StoreError> {
        let found = self.table()?.get(id).cloned();
        match found {
            Some(e) if e.owned_by(who) => Ok(e),
            _ => Err(self.gone(id)),
        }
    }

    /// The error for a transaction that is not open: why it ended, if it
    /// ended without its client's word, else that there is none.
    fn gone(&self, id: &str) -> StoreError {
        let why = self
            .ended
            .lock()
            .ok()
            .and_then(|e| e.iter().find(|(i, _)| i == id).map(|(_, w)| w.clone()));
        StoreError::NoTransaction(match why {
            Some(w) => format!("transaction {id} was rolled back: {w}"),
            None => format!(
                "no open transaction {id} of yours (it was committed or rolled back, or never began); begin a new one"
            ),
        })
    }

    /// Runs `statements` inside transaction `id`, handing results to
    /// `sink` as they come.
    pub(crate) fn run(
        &self,
        id: &str,
        who: &Principal,
        statements: &[Statement],
        limits: &Limits,
        sink: &mut dyn Sink,
    ) -> Result<(), StoreError> {
        let entry = self.entry(id, who)?;
        let mut body = entry.body.try_lock().map_err(|_| {
            StoreError::TransactionBusy(format!(
                "transaction {id} is running another request; send its requests one at a time"
            ))
        })?;
        let Some(b) = body.as_mut() else {
            return Err(self.gone(id));
        };
        let broken = match b {
            Body::ReadWrite { view, .. } => {
                let uc = &view.uc;
                let _running = uc.begin(who, limits);
                let mut out = ViewSink {
                    inner: sink,
                    view,
                    max_bytes: self.limits.max_bytes,
                    too_large: false,
                };
                for st in statements {
                    if exec::run(uc, st, &mut out).is_err() {
                        break;
                    }
                }
                if out.too_large {
                    bump(&self.counters.too_large);
                }
                view.overlay.source_error()
            }
            Body::ReadOnly { uc } => {
                let _running = uc.begin(who, limits);
                for st in statements {
                    if exec::run(uc, st, sink).is_err() {
                        break;
                    }
                }
                None
            }
        };
        if let Some(why) = broken {
            // The snapshot could not be read: the view cannot go on.
            if let Some(b) = body.take() {
                self.release(b);
            }
            drop(body);
            self.forget(id, format!("its snapshot could not be read ({why})"));
            return Ok(());
        }
        drop(body);
        entry.touch();
        Ok(())
    }

    /// Ends transaction `id` for COMMIT: what the writer must apply.
    pub(crate) fn finish(&self, id: &str, who: &Principal) -> Result<Finished, StoreError> {
        let body = self.end(id, who)?;
        match body {
            Body::ReadOnly { .. } => {
                self.release(body);
                bump(&self.counters.committed);
                Ok(Finished::Nothing)
            }
            Body::ReadWrite { ref view, .. } => {
                let changes = (|| -> Result<Option<Vec<u8>>, StoreError> {
                    let bytes = view.uc.conn.changeset().map_err(|rc| {
                        StoreError::Failed(SqliteFailure::with_code(
                            rc,
                            "gathering the transaction's changes",
                        ))
                    })?;
                    if bytes.is_empty() {
                        return Ok(None);
                    }
                    let mut tables =
                        changeset::parse(&bytes).map_err(|e| StoreError::Apply(e.to_string()))?;
                    changeset::complete_old_rows(&view.uc.conn, &mut tables)
                        .map_err(StoreError::Apply)?;
                    Ok(Some(changeset::encode(&tables)))
                })();
                self.release(body);
                match changes? {
                    None => {
                        bump(&self.counters.committed);
                        Ok(Finished::Nothing)
                    }
                    Some(changeset) => Ok(Finished::Changes(TxCommit { changeset })),
                }
            }
        }
    }

    /// Counts the writer's verdict on a commit.
    pub(crate) fn record_outcome(&self, outcome: &Result<crate::TxOutcome, StoreError>) {
        match outcome {
            Ok(crate::TxOutcome::Committed { .. }) => bump(&self.counters.committed),
            Ok(crate::TxOutcome::Conflict(_)) => bump(&self.counters.conflicts),
            Ok(crate::TxOutcome::Refused(_)) | Err(_) => bump(&self.counters.refused),
        }
    }

    /// Rolls transaction `id` back.
    pub(crate) fn rollback(&self, id: &str, who: &Principal) -> Result<(), StoreError> {
        let body = self.end(id, who)?;
        self.release(body);
        bump(&self.counters.rolled_back);
        Ok(())
    }

    /// Takes transaction `id` out of the table, once no request runs in it.
    fn end(&self, id: &str, who: &Principal) -> Result<Body, StoreError> {
        let entry = self.entry(id, who)?;
        let mut body = entry.body.try_lock().map_err(|_| {
            StoreError::TransactionBusy(format!(
                "transaction {id} is running another request; send its requests one at a time"
            ))
        })?;
        let taken = body.take().ok_or_else(|| self.gone(id))?;
        drop(body);
        if let Ok(mut t) = self.open.lock() {
            t.remove(id);
        }
        Ok(taken)
    }

    /// Gives what a transaction held back to the pools.
    fn release(&self, body: Body) {
        match body {
            Body::ReadWrite { view, pin } => {
                self.views.give_back(view);
                self.pins.give_back(pin);
            }
            Body::ReadOnly { uc } => {
                let ended = uc.own(|c| c.is_autocommit() || c.execute_batch("ROLLBACK").is_ok());
                if ended
                    && let Ok(mut idle) = self.readers.lock()
                    && idle.len() < crate::tx_view::keep_idle(&self.setup.config)
                {
                    idle.push(uc);
                }
            }
        }
    }

    /// Takes `id` out of the table and remembers why it ended.
    fn forget(&self, id: &str, why: String) {
        if let Ok(mut t) = self.open.lock() {
            t.remove(id);
        }
        if let Ok(mut e) = self.ended.lock() {
            if e.len() >= REMEMBERED_ENDS {
                e.pop_front();
            }
            e.push_back((id.to_string(), why));
        }
    }

    /// Rolls back the transactions idle or open too long; returns how
    /// many are open afterwards.
    pub(crate) fn reap(&self) -> usize {
        let now = Instant::now();
        let entries: Vec<(String, Arc<Entry>)> = match self.open.lock() {
            Ok(t) => t.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect(),
            Err(_) => return 0,
        };
        for (id, e) in entries {
            let idle = e.idle(now);
            let age = now.saturating_duration_since(e.started);
            let why = if idle >= self.limits.idle {
                bump(&self.counters.idle_timeouts);
                format!(
                    "it was idle for {} s, longer than --tx-idle-timeout ({} s)",
                    idle.as_secs(),
                    self.limits.idle.as_secs()
                )
            } else if age >= self.limits.lifetime {
                bump(&self.counters.expired);
                format!(
                    "it was open for {} s, longer than --tx-max-duration ({} s)",
                    age.as_secs(),
                    self.limits.lifetime.as_secs()
                )
            } else {
                continue;
            };
            // A request running in it keeps it; its end is checked next
            // time round.
            let Ok(mut body) = e.body.try_lock() else {
                continue;
            };
            if let Some(b) = body.take() {
                drop(body);
                self.release(b);
                self.forget(&id, why);
            }
        }
        self.open.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// Runs the reaper until [`Transactions::close`]: every second, or
    /// less often while nothing is open.
    pub(crate) fn reap_until_closed(&self) {
        let (lock, cv) = &self.closing;
        let Ok(mut closed) = lock.lock() else {
            return;
        };
        while !*closed {
            let wait = if self.open.lock().map(|t| t.is_empty()).unwrap_or(true) {
                Duration::from_secs(5)
            } else {
                Duration::from_millis(250)
            };
            closed = match cv.wait_timeout(closed, wait) {
                Ok((g, _)) => g,
                Err(_) => return,
            };
            if *closed {
                break;
            }
            drop(closed);
            self.reap();
            closed = match lock.lock() {
                Ok(g) => g,
                Err(_) => return,
            };
        }
    }

    /// Rolls every open transaction back and stops the reaper.
    pub(crate) fn close(&self) {
        if let Ok(mut c) = self.closing.0.lock() {
            *c = true;
        }
        self.closing.1.notify_all();
        let entries: Vec<(String, Arc<Entry>)> = match self.open.lock() {
            Ok(mut t) => t.drain().collect(),
            Err(_) => return,
        };
        for (id, e) in entries {
            let body = match e.body.lock() {
                Ok(mut b) => b.take(),
                Err(_) => None,
            };
            if let Some(b) = body {
                self.release(b);
            }
            self.forget(&id, "the daemon stopped".into());
        }
    }

    /// The transactions `who` may see: its own, or every one for root.
    pub(crate) fn list(&self, who: &Principal) -> Vec<TxInfo> {
        let now = Instant::now();
        let entries: Vec<(String, Arc<Entry>)> = match self.open.lock() {
            Ok(t) => t.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect(),
            Err(_) => return Vec::new(),
        };
        let mut out: Vec<TxInfo> = entries
            .into_iter()
            .filter(|(_, e)| who.raw || e.owned_by(who))
            .map(|(id, e)| {
                let changed_bytes = match e.body.try_lock() {
                    Ok(b) => match b.as_ref() {
                        Some(Body::ReadWrite { view, .. }) => view.private_bytes() as u64,
                        _ => 0,
                    },
                    Err(_) => 0,
                };
                TxInfo {
                    id,
                    kind: e.kind,
                    owner: e.owner.name.clone(),
                    uid: e.owner.uid,
                    age_seconds: now.saturating_duration_since(e.started).as_secs_f64(),
                    idle_seconds: e.idle(now).as_secs_f64(),
                    changed_bytes,
                }
            })
            .collect();
        out.sort_by(|a, b| b.age_seconds.total_cmp(&a.age_seconds));
        out
    }

    pub(crate) fn stats(&self) -> TxStats {
        let (open, open_readonly) = match self.open.lock() {
            Ok(t) => (
                t.len() as u64,
                t.values().filter(|e| e.kind == TxKind::ReadOnly).count() as u64,
            ),
            Err(_) => (0, 0),
        };
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TxStats {
            open,
            open_readonly,
            begun: get(&c.begun),
            committed: get(&c.committed),
            conflicts: get(&c.conflicts),
            refused: get(&c.refused),
            rolled_back: get(&c.rolled_back),
            idle_timeouts: get(&c.idle_timeouts),
            expired: get(&c.expired),
            too_large: get(&c.too_large),
            connections_opened: get(&c.readers_opened)
                + get(&self.views.opened)
                + get(&self.pins.opened),
        }
    }
}

/// The views of interactive transactions user SQL may query: the counters
/// (`tablix_transaction_stats`, as `/status` has them) and the open
/// transactions its principal may see (`tablix_transactions`: its own;
/// root's: every one), each read when queried.
pub(crate) const USER_VIEWS: &str = "
CREATE TEMP VIEW tablix_transaction_stats AS
    SELECT s->>'open' AS open, s->>'open_readonly' AS open_readonly, s->>'begun' AS begun,
           s->>'committed' AS committed, s->>'conflicts' AS conflicts, s->>'refused' AS refused,
           s->>'rolled_back' AS rolled_back, s->>'idle_timeouts' AS idle_timeouts,
           s->>'expired' AS expired, s->>'too_large' AS too_large,
           s->>'connections_opened' AS connections_opened
    FROM (SELECT tablix_transactions_json('stats') AS s);
CREATE TEMP VIEW tablix_transactions AS
    SELECT t.value->>'id' AS id, t.value->>'kind' AS kind, t.value->>'owner' AS owner,
           t.value->>'uid' AS uid, t.value->>'age_seconds' AS age_seconds,
           t.value->>'idle_seconds' AS idle_seconds, t.value->>'changed_bytes' AS changed_bytes
    FROM json_each(tablix_transactions_json('open')) AS t;
";

/// Where the views of interactive transactions find them: set once the
/// store's transactions exist (they hold the sandbox's setup, so the
/// setup holds them weakly).
#[derive(Clone, Default)]
pub(crate) struct Reporter(Arc<std::sync::OnceLock<std::sync::Weak<Transactions>>>);

impl Reporter {
    pub(crate) fn set(&self, t: &Arc<Transactions>) {
        let _ = self.0.set(Arc::downgrade(t));
    }

    fn get(&self) -> Option<Arc<Transactions>> {
        self.0.get().and_then(std::sync::Weak::upgrade)
    }
}

/// Registers `tablix_transactions_json(what)`: the counters ('stats') or
/// the open transactions the current principal may see ('open'), as JSON.
pub(crate) fn register_report(
    conn: &rusqlite::Connection,
    state: Arc<std::sync::Mutex<crate::policy::State>>,
    reporter: Reporter,
) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_INNOCUOUS;
    conn.create_scalar_function("tablix_transactions_json", 1, flags, move |ctx| {
        let what: String = ctx.get(0)?;
        let fail = |e: serde_json::Error| rusqlite::Error::UserFunctionError(Box::new(e));
        let Some(t) = reporter.get() else {
            return Ok(match what.as_str() {
                "stats" => serde_json::to_string(&TxStats::default()).map_err(fail)?,
                _ => "[]".to_string(),
            });
        };
        match what.as_str() {
            "stats" => serde_json::to_string(&t.stats()).map_err(fail),
            "open" => {
                let who = state.lock().map(|s| s.principal.clone()).map_err(|_| {
                    rusqlite::Error::UserFunctionError("tablix: a lock was poisoned".into())
                })?;
                serde_json::to_string(&t.list(&who)).map_err(fail)
            }
            other => Err(rusqlite::Error::UserFunctionError(
                format!("tablix_transactions_json: unknown report {other:?}").into(),
            )),
        }
    })
}

/// A new transaction id: 128 random bits in hex.
fn new_id() -> String {
    let a = getrandom::u64().unwrap_or_else(|_| crate::command::Stamp::now().unix_nanos as u64);
    let b = getrandom::u64().unwrap_or_else(|_| a.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15);
    format!("{a:016x}{b:016x}")
}

/// A transaction's results on their way to the client, with the view's
/// own failures said plainly.
struct ViewSink<'a> {
    inner: &'a mut dyn Sink,
    view: &'a View,
    max_bytes: usize,
    too_large: bool,
}

impl Sink for ViewSink<'_> {
    fn columns(&mut self, names: &[String]) -> Result<(), Stop> {
        self.inner.columns(names)
    }
    fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), Stop> {
        self.inner.row(cells)
    }
    fn end_rows(&mut self, types: &[String]) -> Result<(), Stop> {
        self.inner.end_rows(types)
    }
    fn executed(&mut self, last_insert_id: i64, rows_affected: u64) -> Result<(), Stop> {
        self.inner.executed(last_insert_id, rows_affected)
    }
    fn error(&mut self, message: &str) -> Result<(), Stop> {
        if self.view.overlay.take_over_limit() {
            self.too_large = true;
            return self.inner.error(&format!(
                "the transaction's changes would pass --tx-max-bytes ({} bytes of changed pages); this statement was undone and the transaction goes on: commit what it has, or change less",
                self.max_bytes
            ));
        }
        if let Some(why) = self.view.overlay.source_error() {
            return self.inner.error(&format!(
                "reading the transaction's snapshot failed ({why}); the transaction was rolled back"
            ));
        }
        self.inner.error(message)
    }
    fn end_statement(&mut self, seconds: f64) -> Result<(), Stop> {
        self.inner.end_statement(seconds)
    }
}

/// An interactive transaction of a program that links tablix
/// ([`crate::Store::transaction`]): rolled back if dropped open.
pub struct Transaction<'s> {
    store: &'s crate::Store,
    id: String,
    principal: Principal,
    open: bool,
}

impl<'s> Transaction<'s> {
    pub(crate) fn new(
        store: &'s crate::Store,
        id: String,
        principal: Principal,
    ) -> Transaction<'s> {
        Transaction {
            store,
            id,
            principal,
            open: true,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs statements in the transaction within the store's read limits
    /// and gathers their results.
    pub fn run(
        &self,
        statements: &[Statement],
    ) -> Result<Vec<crate::StatementOutcome>, StoreError> {
        let limits = self.store.config().read_limits();
        let mut sink = exec::Collect::new(limits.max_result_bytes);
        self.store
            .run_in(&self.id, &self.principal, statements, &limits, &mut sink)?;
        Ok(sink.outcomes)
    }

    /// Runs one statement without parameters.
    pub fn execute(&self, sql: &str) -> Result<crate::StatementResult, StoreError> {
        let mut out = self.run(&[Statement::new(sql)])?;
        out.pop()
            .map(|o| o.result)
            .ok_or_else(|| StoreError::Apply("a statement gave no result".into()))
    }

    /// Commits: the outcome says whether the changes were applied or the
    /// transaction conflicted.
    pub fn commit(mut self) -> Result<crate::TxOutcome, StoreError> {
        self.open = false;
        self.store.commit(&self.id, &self.principal)
    }

    pub fn rollback(mut self) -> Result<(), StoreError> {
        self.open = false;
        self.store.rollback(&self.id, &self.principal)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.store.rollback(&self.id, &self.principal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_control_is_told_from_other_sql() {
        let cases = [
            ("BEGIN", Some(TxControl::Begin(TxKind::ReadWrite))),
            (
                "begin transaction;",
                Some(TxControl::Begin(TxKind::ReadWrite)),
            ),
            (
                "BEGIN IMMEDIATE TRANSACTION",
                Some(TxControl::Begin(TxKind::ReadWrite)),
            ),
            ("BEGIN READONLY", Some(TxControl::Begin(TxKind::ReadOnly))),
            (
                "  BEGIN TRANSACTION READONLY ; ",
                Some(TxControl::Begin(TxKind::ReadOnly)),
            ),
            ("COMMIT", Some(TxControl::Commit)),
            ("END TRANSACTION", Some(TxControl::Commit)),
            ("ROLLBACK", Some(TxControl::Rollback)),
            ("ROLLBACK TO sp", None),
            ("SAVEPOINT sp", None),
            ("BEGIN READONLY garbage", None),
            ("SELECT 'BEGIN'", None),
            (
                "CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1; END",
                None,
            ),
            ("", None),
        ];
        for (sql, want) in cases {
            assert_eq!(TxControl::parse(sql), want, "{sql:?}");
        }
    }
}
