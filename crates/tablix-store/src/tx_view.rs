//! An interactive read/write transaction's private view of the database:
//! a *pin* (a read-only connection holding one read transaction open, so
//! its snapshot stays whole) serves the pages the transaction has not
//! written, and a sandboxed *view* connection on a `tablix-overlay` of it
//! runs the transaction's statements and records what they change.
//!
//! Both are pooled: a view connection keeps its sandbox (views, functions,
//! authorizer) and a pin its file handle between transactions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use tablix_vfs::{Overlay, PageSource};

use crate::config::StoreConfig;
use crate::error::{SqliteFailure, StoreError};
use crate::sandbox::{Role, Setup, UserConn};
use crate::volatile::MemImage;

/// Idle connections a pool keeps: as many as transactions may be open at
/// once (`--max-transactions`), so a steady load of that many clients
/// never opens a connection (a view's sandbox attaches the memory image
/// and parses a few hundred statements), and the pools never hold more
/// than the open transactions could.
pub(crate) fn keep_idle(config: &StoreConfig) -> usize {
    config.max_transactions.max(1)
}

/// Idle views that keep their page caches' memory.
const WARM_VIEWS: usize = 8;

/// One committed state of the database, held open and read page by page.
pub(crate) struct Pin {
    conn: Mutex<Connection>,
    page_size: usize,
    pages: u32,
}

impl PageSource for Pin {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn page_count(&self) -> u32 {
        self.pages
    }

    fn read_page(&self, pgno: u32, out: &mut [u8]) -> Result<(), String> {
        let c = self
            .conn
            .lock()
            .map_err(|_| "the snapshot's connection was poisoned".to_string())?;
        let mut st = c
            .prepare_cached("SELECT data FROM sqlite_dbpage WHERE pgno = ?1")
            .map_err(|e| format!("reading page {pgno} of the snapshot: {e}"))?;
        st.query_row([pgno], |r| {
            let data = r.get_ref(0)?.as_blob()?;
            if data.len() != out.len() {
                return Err(rusqlite::Error::InvalidColumnType(
                    0,
                    format!("page of {} bytes", data.len()),
                    rusqlite::types::Type::Blob,
                ));
            }
            out.copy_from_slice(data);
            Ok(())
        })
        .map_err(|e| format!("reading page {pgno} of the snapshot: {e}"))
    }
}

/// Connections that pin snapshots, kept between transactions.
pub(crate) struct Pins {
    config: StoreConfig,
    idle: Mutex<Vec<Connection>>,
    keep: usize,
    /// Connections opened since the store opened.
    pub(crate) opened: AtomicU64,
}

impl Pins {
    pub(crate) fn new(config: &StoreConfig) -> Pins {
        Pins {
            config: config.clone(),
            idle: Mutex::new(Vec::new()),
            keep: keep_idle(config),
            opened: AtomicU64::new(0),
        }
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let path = self.config.database_path();
        let conn = match &self.config.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(&path, flags, vfs.as_str())?,
            None => Connection::open_with_flags(&path, flags)?,
        };
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "query_only", true)?;
        // A view has a page cache of its own; the pin reads each page of
        // a transaction about once.
        conn.pragma_update(None, "cache_size", 64)?;
        Ok(conn)
    }

    /// Pins the newest committed state.
    pub(crate) fn take(&self) -> Result<Arc<Pin>, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let conn = match idle {
            Some(c) => c,
            None => {
                let c = self.open()?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                c
            }
        };
        let fail = |e: rusqlite::Error| StoreError::Failed(SqliteFailure::of(&e));
        conn.execute_batch("BEGIN").map_err(fail)?;
        // The first read starts the read transaction: the snapshot.
        let read = (|| {
            let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            Ok::<_, rusqlite::Error>((page_size, pages))
        })();
        let (page_size, pages) = match read {
            Ok(v) => v,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(fail(e));
            }
        };
        Ok(Arc::new(Pin {
            conn: Mutex::new(conn),
            page_size: usize::try_from(page_size).unwrap_or(4096),
            pages: u32::try_from(pages).unwrap_or(u32::MAX),
        }))
    }

    /// Ends the pin's read transaction and keeps its connection, if no
    /// view reads through it any more.
    pub(crate) fn give_back(&self, pin: Arc<Pin>) {
        let Ok(pin) = Arc::try_unwrap(pin) else {
            return;
        };
        let Ok(conn) = pin.conn.into_inner() else {
            return;
        };
        if conn.execute_batch("ROLLBACK").is_err() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.keep
        {
            idle.push(conn);
        }
    }
}

/// A view connection and its overlay.
pub(crate) struct View {
    /// Field order: the connection closes before its overlay goes.
    pub(crate) uc: UserConn,
    pub(crate) overlay: Overlay,
}

impl View {
    /// Bytes the transaction's changed pages hold.
    pub(crate) fn private_bytes(&self) -> usize {
        self.overlay.private_bytes()
    }
}

/// View connections kept between transactions.
pub(crate) struct Views {
    setup: Setup,
    idle: Mutex<Vec<View>>,
    keep: usize,
    /// Connections opened since the store opened.
    pub(crate) opened: AtomicU64,
}

impl Views {
    pub(crate) fn new(setup: Setup) -> Views {
        Views {
            keep: keep_idle(&setup.config),
            setup,
            idle: Mutex::new(Vec::new()),
            opened: AtomicU64::new(0),
        }
    }

    /// A view of `pin`'s state with no change of its own, the memory
    /// database's image as of `image`, recording its changes from now.
    pub(crate) fn take(
        &self,
        pin: &Arc<Pin>,
        image: &MemImage,
        limit: usize,
    ) -> Result<View, StoreError> {
        let source: Arc<dyn PageSource> = pin.clone();
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut view = match idle {
            Some(v) => {
                v.overlay.set_limit(limit);
                v.overlay.reset(source).map_err(StoreError::Apply)?;
                v
            }
            None => {
                let overlay = Overlay::new(limit).map_err(|e| StoreError::Open(e.to_string()))?;
                overlay.reset(source).map_err(StoreError::Apply)?;
                let uc =
                    UserConn::open_on(&self.setup, Role::Transaction, image, Some(&overlay.uri()))?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                View { uc, overlay }
            }
        };
        view.uc.refresh_mem(image)?;
        view.uc
            .conn
            .record()
            .map_err(|rc| StoreError::Failed(SqliteFailure::with_code(rc, "recording changes")))?;
        Ok(view)
    }

    /// Takes the view back: its changes are dropped and it lets go of the
    /// pin.
    pub(crate) fn give_back(&self, mut view: View) {
        view.uc.conn.stop();
        let clean = view.uc.conn.is_autocommit() || view.uc.conn.execute_batch("ROLLBACK").is_ok();
        view.overlay.clear();
        if !clean {
            return;
        }
        // Its cached pages are of a snapshot no transaction will read
        // again (the next one drops them). The first few idle views keep
        // the memory for the next transaction's pages (freeing and
        // allocating it again cost sixteen HTTP clients 3-4% of their
        // transactions); the others give it back.
        let idle = self.idle.lock().map_or(0, |v| v.len());
        if idle >= WARM_VIEWS {
            let _ = view.uc.conn.execute_batch("PRAGMA shrink_memory");
        }
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.keep
        {
            idle.push(view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_pool_keeps_as_many_connections_as_transactions_may_be_open() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = StoreConfig::new(dir.path());
        config.max_transactions = 12;
        let db = Connection::open(config.database_path()).expect("the database");
        db.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .expect("a table");
        let pins = Pins::new(&config);
        for round in 0..2 {
            let taken: Vec<Arc<Pin>> = (0..13).map(|_| pins.take().expect("a pin")).collect();
            for pin in taken {
                pins.give_back(pin);
            }
            let idle = pins.idle.lock().expect("the pool").len();
            assert_eq!(idle, 12, "round {round}: idle pins after 13 transactions");
        }
        // A pin given back while a view still reads through it keeps its
        // read transaction, so it is not pooled.
        let pin = pins.take().expect("a pin");
        let reader = Arc::clone(&pin);
        pins.give_back(pin);
        assert_eq!(pins.idle.lock().expect("the pool").len(), 11);
        drop(reader);
    }
}
