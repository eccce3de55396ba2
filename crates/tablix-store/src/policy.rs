//! What user SQL may do: SQLite's authorizer on every connection that runs
//! user SQL, deciding by rules about *where* an object lives and *who*
//! asks, not by a list of forbidden statements.
//!
//! * **System state** is everything in the memory database (`mem`), every
//!   object of the main database whose name starts with `tablix_`, and the
//!   virtual tables that expose database internals (`dbstat`). User SQL
//!   never writes, creates, drops, alters, analyzes or reindexes it.
//! * **Raw reads** of system state are for principals with the `raw` right
//!   (root, and API users granted it). Everyone else reads system state
//!   only through the views tablix creates in each connection's temp
//!   schema (`files`, `processes`, `pipes`, ...), which show what the file
//!   system and /proc would show that user: SQLite names the inner-most
//!   view or CTE responsible for each read, and reads on behalf of those
//!   views are allowed. Their inner CTEs are named `tablix_*`, and user
//!   SQL may give no CTE a view's name or that prefix
//!   ([`crate::sqltext::defined_name`]), so no user query can act as one.
//! * **Only `main` changes.** The temp schema in every spelling (`TEMP`,
//!   `temp.`, `"temp".`), attached databases, transactions and settings
//!   pragmas are connection state the stored database does not carry.
//! * **Reserved names**: a user object may not take the name of a system
//!   view or table of any schema, nor the `tablix_` prefix, so nothing can
//!   shadow system state; after a schema change, the store audits what
//!   changed (`audit.rs`) for names and references the authorizer is not
//!   told about (ALTER TABLE RENAME's new name, a foreign key's target).
//! * Unknown actions are denied.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

use crate::principal::Principal;

/// The prefix of every name tablix keeps for itself in the main database.
pub(crate) const SYSTEM_PREFIX: &str = "tablix_";

/// Virtual tables that show pages, cells or other connections' state of
/// any table, system tables included: raw.
const INTERNAL_MODULES: &[&str] = &[
    "dbstat",
    "sqlite_dbpage",
    "sqlite_dbdata",
    "sqlite_dbptr",
    "sqlite_stmt",
];

/// Modules user SQL may create virtual tables with: full-text search and
/// R*trees, which hold only what their owner puts in them.
const USER_MODULES: &[&str] = &[
    "fts3",
    "fts4",
    "fts5",
    "fts5vocab",
    "rtree",
    "rtree_i32",
    "geopoly",
];

/// Tables whose writes SQLite itself guards (direct writes need
/// `writable_schema`, which defensive mode forbids); DDL writes them.
const SCHEMA_TABLES: &[&str] = &[
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
    "sqlite_temp_schema",
];

/// Pragmas that only report, and may take an argument naming what to report on.
const REPORTING_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "database_list",
    "collation_list",
    "function_list",
    "module_list",
    "pragma_list",
    "compile_options",
];

/// Pragmas that may be read but not set.
const READABLE_PRAGMAS: &[&str] = &[
    "user_version",
    "schema_version",
    "application_id",
    "page_count",
    "page_size",
    "freelist_count",
    "journal_mode",
    "synchronous",
    "foreign_keys",
    "encoding",
    "data_version",
    "max_page_count",
    "auto_vacuum",
];

/// The names of system state, found once per store from the schemas
/// themselves.
#[derive(Debug, Default)]
pub(crate) struct Rules {
    /// Views (and their CTEs) that read system state for any user:
    /// lower-case names of the temp schema's views.
    views: HashSet<String>,
    /// Lower-case names of the memory database's tables and views.
    memory: HashSet<String>,
    /// Names whose mention means a statement reads the memory database:
    /// `mem`, its objects, and the views that read them.
    reads_memory: HashSet<String>,
}

impl Rules {
    /// Reads the names from a connection that has the memory database
    /// attached as `mem` and the user views created in `temp`.
    pub(crate) fn discover(conn: &Connection) -> rusqlite::Result<Rules> {
        let names = |sql: &str| -> rusqlite::Result<HashSet<String>> {
            let mut st = conn.prepare(sql)?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            rows.map(|r| r.map(|n| n.to_ascii_lowercase())).collect()
        };
        // SQLite guards its own sqlite_ names itself.
        let memory = names(
            "SELECT name FROM mem.sqlite_schema WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
        )?;
        let views: Vec<(String, String)> = {
            let mut st =
                conn.prepare("SELECT name, sql FROM temp.sqlite_schema WHERE type = 'view'")?;
            let rows = st.query_map([], |r| {
                Ok((r.get::<_, String>(0)?.to_ascii_lowercase(), r.get(1)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut reads_memory: HashSet<String> = memory.clone();
        reads_memory.insert("mem".into());
        // A view reads the memory database if it names it or a view that does.
        loop {
            let before = reads_memory.len();
            for (name, sql) in &views {
                if crate::sqltext::mentioned_name(sql, |n| reads_memory.contains(n)).is_some() {
                    reads_memory.insert(name.clone());
                }
            }
            if reads_memory.len() == before {
                break;
            }
        }
        Ok(Rules {
            views: views.into_iter().map(|(n, _)| n).collect(),
            memory,
            reads_memory,
        })
    }

    /// Whether `sql` may read the memory database: it names it, one of its
    /// objects, or a view over them. (User views and triggers cannot reach
    /// it: the audit refuses them.)
    pub(crate) fn mentions_memory(&self, sql: &str) -> bool {
        crate::sqltext::mentioned_name(sql, |n| self.reads_memory.contains(n)).is_some()
    }

    /// Whether reads on behalf of `accessor` (SQLite's inner-most view or
    /// CTE) are reads of a system view.
    fn is_system_view(&self, accessor: &str) -> bool {
        let a = accessor.to_ascii_lowercase();
        self.views.contains(&a) || a.starts_with(SYSTEM_PREFIX)
    }

    /// Whether no user object or CTE may take `name`.
    pub(crate) fn is_reserved(&self, name: &str) -> bool {
        let n = name.to_ascii_lowercase();
        n.starts_with(SYSTEM_PREFIX)
            || self.views.contains(&n)
            || self.memory.contains(&n)
            || n == "pcache_stats"
    }

    /// Whether `table` in `database` is system state.
    pub(crate) fn is_system(&self, database: Option<&str>, table: &str) -> bool {
        let t = table.to_ascii_lowercase();
        database == Some("mem")
            || t.starts_with(SYSTEM_PREFIX)
            || INTERNAL_MODULES.contains(&t.as_str())
    }
}

/// Per-connection state the authorizer and the identity functions read.
#[derive(Debug)]
pub(crate) struct State {
    /// While false, the connection runs tablix's own statements.
    pub(crate) enforcing: bool,
    /// Whom the current request runs as.
    pub(crate) principal: Principal,
    /// A schema change was authorised since the statement began.
    pub(crate) ddl: bool,
    /// Message of the most recent denial, replacing SQLite's terse one.
    pub(crate) denial: Option<String>,
    /// The connection runs an interactive transaction, whose changes
    /// travel as a changeset: schema changes cannot, and are refused.
    pub(crate) in_transaction: bool,
}

/// Why a schema change is refused inside an interactive transaction.
const TX_DDL: &str = "schema changes (CREATE, ALTER, DROP) are not allowed inside an interactive transaction: its changes travel as a changeset of rows; run the schema change on its own, outside the transaction";

/// Handle on an installed authorizer.
#[derive(Clone)]
pub(crate) struct Policy {
    state: Arc<Mutex<State>>,
    rules: Arc<Rules>,
}

fn qualified(database: Option<&str>, table: &str) -> String {
    match database {
        Some(db) if db != "main" => format!("{db}.{table}"),
        _ => table.to_string(),
    }
}

fn only_main(database: Option<&str>, what: &str) -> Result<(), String> {
    match database {
        Some("main") | None => Ok(()),
        Some("temp") => Err(format!(
            "{what} in the temp schema is not allowed: temporary objects would live outside the stored state"
        )),
        Some(db) => Err(format!(
            "{what} in database {db} is not allowed: {db} is tablix system state; only the main database can be changed"
        )),
    }
}

impl Rules {
    fn system_denied(&self, database: Option<&str>, table: &str) -> Result<(), String> {
        if self.is_system(database, table) {
            Err(format!(
                "{} is a tablix system table: it is read-only to SQL and changes only through tablix commands",
                qualified(database, table)
            ))
        } else {
            Ok(())
        }
    }

    fn reserved_denied(&self, kind: &str, name: &str) -> Result<(), String> {
        if self.is_reserved(name) {
            Err(format!(
                "{kind} name {name:?} is reserved: names starting with {SYSTEM_PREFIX} and the names of tablix's views and tables ({}) belong to tablix",
                self.reserved_list()
            ))
        } else {
            Ok(())
        }
    }

    fn reserved_list(&self) -> String {
        let mut all: Vec<&str> = self
            .views
            .iter()
            .chain(self.memory.iter())
            .map(String::as_str)
            .collect();
        all.sort_unstable();
        all.dedup();
        all.join(", ")
    }

    /// Decides one request of the authorizer for `who`; `Err` carries the
    /// message the user sees.
    pub(crate) fn decide(
        &self,
        who: &Principal,
        action: AuthAction<'_>,
        database: Option<&str>,
        accessor: Option<&str>,
        ddl: &mut bool,
    ) -> Result<(), String> {
        match action {
            AuthAction::Read {
                table_name,
                column_name,
            } => {
                if database == Some("temp") || !self.is_system(database, table_name) {
                    return Ok(());
                }
                // A table scanned without any column read (count(*), or a
                // view's join on the rowid after SQLite flattened it into
                // the outer query, where no accessor is named): no value
                // leaves it, only how many rows it has, which statfs shows
                // of inodes and blocks anyway.
                if column_name.is_empty() {
                    return Ok(());
                }
                if who.raw || accessor.is_some_and(|a| self.is_system_view(a)) {
                    return Ok(());
                }
                Err(format!(
                    "{} is raw tablix state, readable only by root and API users granted \"raw\"; query the views instead ({})",
                    qualified(database, table_name),
                    {
                        let mut v: Vec<&str> = self.views.iter().map(String::as_str).collect();
                        v.sort_unstable();
                        v.join(", ")
                    }
                ))
            }
            AuthAction::Insert { table_name }
            | AuthAction::Delete { table_name }
            | AuthAction::Update { table_name, .. } => {
                let t = table_name.to_ascii_lowercase();
                if t.starts_with("sqlite_temp_")
                    && matches!(action, AuthAction::Insert { .. })
                {
                    // The one way into the temp schema's catalog: creating a
                    // temporary object (a trigger in temp on a main table
                    // reports only the table's database otherwise).
                    return Err("temporary objects are not supported: they would live outside the stored state".into());
                }
                if SCHEMA_TABLES.contains(&t.as_str()) {
                    return Ok(());
                }
                only_main(database, &format!("writing {table_name}"))?;
                if t.starts_with("sqlite_stat") {
                    return Err(format!(
                        "{table_name} is written by ANALYZE only: query-planner statistics steer tablix's own queries too"
                    ));
                }
                self.system_denied(database, table_name)
            }
            AuthAction::CreateTable { table_name } => {
                *ddl = true;
                only_main(database, "CREATE TABLE")?;
                self.reserved_denied("table", table_name)
            }
            AuthAction::CreateView { view_name } => {
                *ddl = true;
                only_main(database, "CREATE VIEW")?;
                self.reserved_denied("view", view_name)
            }
            AuthAction::CreateIndex {
                index_name,
                table_name,
            } => {
                *ddl = true;
                only_main(database, "CREATE INDEX")?;
                self.system_denied(database, table_name)?;
                self.reserved_denied("index", index_name)
            }
            AuthAction::CreateTrigger {
                trigger_name,
                table_name,
            } => {
                *ddl = true;
                only_main(database, "CREATE TRIGGER")?;
                self.system_denied(database, table_name)?;
                self.reserved_denied("trigger", trigger_name)
            }
            AuthAction::CreateVtable {
                table_name,
                module_name,
            } => {
                *ddl = true;
                only_main(database, "CREATE VIRTUAL TABLE")?;
                self.reserved_denied("table", table_name)?;
                if USER_MODULES.contains(&module_name.to_ascii_lowercase().as_str()) {
                    Ok(())
                } else {
                    Err(format!(
                        "virtual tables using {module_name} are not allowed; allowed modules: {}",
                        USER_MODULES.join(", ")
                    ))
                }
            }
            AuthAction::DropTable { table_name }
            | AuthAction::DropView {
                view_name: table_name,
            }
            | AuthAction::DropVtable { table_name, .. } => {
                *ddl = true;
                only_main(database, &format!("dropping {table_name}"))?;
                self.system_denied(database, table_name)
            }
            AuthAction::DropIndex {
                index_name,
                table_name,
            }
            | AuthAction::DropTrigger {
                trigger_name: index_name,
                table_name,
            } => {
                *ddl = true;
                only_main(database, &format!("dropping {index_name}"))?;
                self.system_denied(database, table_name)?;
                self.system_denied(database, index_name)
            }
            AuthAction::AlterTable {
                database_name,
                table_name,
            } => {
                *ddl = true;
                only_main(Some(database_name), "ALTER TABLE")?;
                self.system_denied(Some(database_name), table_name)
            }
            AuthAction::Analyze { table_name } => {
                only_main(database, "ANALYZE")?;
                if self.is_system(database, table_name) {
                    Err(format!(
                        "ANALYZE of tablix system table {table_name} is not allowed: name your own tables (ANALYZE t)"
                    ))
                } else {
                    Ok(())
                }
            }
            AuthAction::Reindex { index_name } => self.system_denied(database, index_name),
            AuthAction::CreateTempIndex { .. }
            | AuthAction::CreateTempTable { .. }
            | AuthAction::CreateTempTrigger { .. }
            | AuthAction::CreateTempView { .. }
            | AuthAction::DropTempIndex { .. }
            | AuthAction::DropTempTable { .. }
            | AuthAction::DropTempTrigger { .. }
            | AuthAction::DropTempView { .. } => Err(
                "temporary objects are not supported: they would live outside the stored state"
                    .into(),
            ),
            AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => Err(
                "transaction control statements are not supported: send the statements as one request with the `transaction` option".into(),
            ),
            AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
                Err("ATTACH and DETACH are not supported".into())
            }
            AuthAction::Pragma {
                pragma_name,
                pragma_value,
            } => {
                let name = pragma_name.to_ascii_lowercase();
                if REPORTING_PRAGMAS.contains(&name.as_str())
                    || (pragma_value.is_none() && READABLE_PRAGMAS.contains(&name.as_str()))
                {
                    Ok(())
                } else {
                    Err(format!(
                        "PRAGMA {pragma_name}{} is not allowed: settings belong to the tablix daemon",
                        pragma_value.map(|v| format!(" = {v}")).unwrap_or_default()
                    ))
                }
            }
            AuthAction::Function { function_name } => {
                if function_name.eq_ignore_ascii_case("load_extension") {
                    Err("load_extension() is not allowed".into())
                } else {
                    Ok(())
                }
            }
            AuthAction::Select | AuthAction::Recursive => Ok(()),
            other => Err(format!("{other:?} is not allowed")),
        }
    }
}

impl Policy {
    /// Installs the authorizer on `conn`, starting as `principal`.
    pub(crate) fn install(
        conn: &mut Connection,
        rules: Arc<Rules>,
        principal: Principal,
    ) -> rusqlite::Result<Policy> {
        let policy = Policy {
            state: Arc::new(Mutex::new(State {
                enforcing: false,
                principal,
                ddl: false,
                denial: None,
                in_transaction: false,
            })),
            rules,
        };
        let hook = policy.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| {
            let Ok(mut state) = hook.state.lock() else {
                return Authorization::Deny;
            };
            if !state.enforcing {
                return Authorization::Allow;
            }
            let State {
                principal,
                ddl,
                denial,
                in_transaction,
                ..
            } = &mut *state;
            match hook
                .rules
                .decide(principal, ctx.action, ctx.database_name, ctx.accessor, ddl)
            {
                Ok(()) if *ddl && *in_transaction => {
                    *denial = Some(TX_DDL.into());
                    Authorization::Deny
                }
                Ok(()) => Authorization::Allow,
                Err(message) => {
                    *denial = Some(message);
                    Authorization::Deny
                }
            }
        }))?;
        Ok(policy)
    }

    pub(crate) fn rules(&self) -> &Rules {
        &self.rules
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // The authorizer never panics while holding the lock; a poisoned
        // lock still holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle for the SQL functions that read the current principal.
    pub(crate) fn shared_state(&self) -> Arc<Mutex<State>> {
        Arc::clone(&self.state)
    }

    pub(crate) fn set_enforcing(&self, on: bool) {
        self.state().enforcing = on;
    }

    pub(crate) fn set_principal(&self, principal: &Principal) {
        let mut s = self.state();
        if s.principal != *principal {
            s.principal = principal.clone();
        }
    }

    /// Forgets what the previous statement did; returns whether it made a
    /// schema change.
    pub(crate) fn take_ddl(&self) -> bool {
        std::mem::take(&mut self.state().ddl)
    }

    /// Turns an error into the message a user should see.
    pub(crate) fn describe(&self, err: &rusqlite::Error) -> String {
        let denied = matches!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::AuthorizationForStatementDenied)
        );
        if denied && let Some(m) = self.state().denial.take() {
            return m;
        }
        error_message(err)
    }
}

/// SQLite's own message for an error, without rusqlite's decoration.
pub(crate) fn error_message(err: &rusqlite::Error) -> String {
    match err {
        rusqlite::Error::SqliteFailure(_, Some(msg)) => msg.clone(),
        rusqlite::Error::MultipleStatement => {
            "only one statement is allowed per request element".into()
        }
        other => other.to_string(),
    }
}

/// Whether a table name belongs to tablix rather than to the user, as the
/// public API reports it: the memory database, the `tablix_` prefix and the
/// user views' names.
pub fn is_system_table(database: Option<&str>, table: &str) -> bool {
    let t = table.to_ascii_lowercase();
    database == Some("mem")
        || t.starts_with(SYSTEM_PREFIX)
        || matches!(t.as_str(), "files" | "pcache_stats")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::hooks::TransactionOperation;

    fn rules() -> Rules {
        Rules {
            views: ["files", "processes", "pipes"].map(String::from).into(),
            memory: ["processes", "pipe", "daemon"].map(String::from).into(),
            reads_memory: ["mem", "processes", "pipe", "daemon", "pipes"]
                .map(String::from)
                .into(),
        }
    }

    fn user() -> Principal {
        Principal::local(1000, 1000, vec![])
    }

    #[test]
    fn a_statement_reads_the_memory_database_when_a_token_names_it() {
        let r = rules();
        for sql in [
            "SELECT * FROM Processes",
            "SELECT * FROM \"MEM\".x",
            "SELECT * FROM pragma_table_info('PIPES')",
            "SELECT count(*) FROM [daemon]",
        ] {
            assert!(r.mentions_memory(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO bench(v) VALUES (?)",
            "SELECT 1 -- processes",
            "SELECT * FROM processes2",
            "SELECT \"pro\"\"cesses\" FROM t",
        ] {
            assert!(!r.mentions_memory(sql), "{sql}");
        }
    }

    #[test]
    fn decision_table() {
        let r = rules();
        let alice = user();
        let root = Principal::root();
        let allowed = |who: &Principal, a, db, acc| r.decide(who, a, db, acc, &mut false).is_ok();
        let read = |t| AuthAction::Read {
            table_name: t,
            column_name: "c",
        };
        /// (who, action, database, accessor, allowed)
        type Case<'a> = (
            &'a Principal,
            AuthAction<'a>,
            Option<&'a str>,
            Option<&'a str>,
            bool,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                &alice,
                AuthAction::Insert { table_name: "t" },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Insert {
                    table_name: "daemon",
                },
                Some("mem"),
                None,
                false,
            ),
            (
                &root,
                AuthAction::Insert {
                    table_name: "daemon",
                },
                Some("mem"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Delete {
                    table_name: "tablix_meta",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Update {
                    table_name: "TABLIX_META",
                    column_name: "v",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Update {
                    table_name: "sqlite_sequence",
                    column_name: "seq",
                },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Insert {
                    table_name: "sqlite_stat1",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Insert {
                    table_name: "sqlite_master",
                },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Insert { table_name: "t" },
                Some("temp"),
                None,
                false,
            ),
            // Raw reads: root yes, others only through a system view.
            (&alice, read("tablix_block"), Some("main"), None, false),
            (&root, read("tablix_block"), Some("main"), None, true),
            (
                &alice,
                read("tablix_inode"),
                Some("main"),
                Some("files"),
                true,
            ),
            (
                &alice,
                read("tablix_inode"),
                Some("main"),
                Some("tablix_walk"),
                true,
            ),
            (
                &alice,
                read("tablix_inode"),
                Some("main"),
                Some("my_view"),
                false,
            ),
            (&alice, read("processes"), Some("mem"), None, false),
            (
                &alice,
                read("processes"),
                Some("mem"),
                Some("processes"),
                true,
            ),
            (&alice, read("dbstat"), Some("main"), None, false),
            (&alice, read("files"), Some("temp"), None, true),
            (&alice, read("t"), Some("main"), None, true),
            // Creating: main only, no reserved names.
            (
                &alice,
                AuthAction::CreateTable { table_name: "t" },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::CreateTable { table_name: "t" },
                Some("temp"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTable { table_name: "t" },
                Some("mem"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTable {
                    table_name: "tablix_x",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateView {
                    view_name: "Processes",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTable { table_name: "pipe" },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTrigger {
                    trigger_name: "g",
                    table_name: "tablix_inode",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTrigger {
                    trigger_name: "files",
                    table_name: "t",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateIndex {
                    index_name: "i",
                    table_name: "t",
                },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::CreateVtable {
                    table_name: "f",
                    module_name: "fts5",
                },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::CreateVtable {
                    table_name: "f",
                    module_name: "dbstat",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::CreateTempTable { table_name: "t" },
                Some("temp"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::DropTable {
                    table_name: "tablix_meta",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::DropView { view_name: "files" },
                Some("temp"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::AlterTable {
                    database_name: "main",
                    table_name: "tablix_inode",
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::AlterTable {
                    database_name: "main",
                    table_name: "t",
                },
                None,
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Analyze {
                    table_name: "tablix_inode",
                },
                Some("main"),
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Analyze { table_name: "t" },
                Some("main"),
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Transaction {
                    operation: TransactionOperation::Begin,
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Savepoint {
                    operation: TransactionOperation::Begin,
                    savepoint_name: "s",
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Attach { filename: "/x" },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Pragma {
                    pragma_name: "table_info",
                    pragma_value: Some("t"),
                },
                None,
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Pragma {
                    pragma_name: "user_version",
                    pragma_value: None,
                },
                None,
                None,
                true,
            ),
            (
                &alice,
                AuthAction::Pragma {
                    pragma_name: "user_version",
                    pragma_value: Some("3"),
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Pragma {
                    pragma_name: "optimize",
                    pragma_value: None,
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Function {
                    function_name: "load_extension",
                },
                None,
                None,
                false,
            ),
            (
                &alice,
                AuthAction::Function {
                    function_name: "abs",
                },
                None,
                None,
                true,
            ),
            (&alice, AuthAction::Select, None, None, true),
        ];
        for (who, action, db, acc, want) in cases {
            let desc = format!("{action:?} in {db:?} via {acc:?} as {}", who.name);
            assert_eq!(allowed(who, action, db, acc), want, "{desc}");
        }
    }

    #[test]
    fn schema_changes_are_noticed() {
        let r = rules();
        let mut ddl = false;
        r.decide(&user(), AuthAction::Select, None, None, &mut ddl)
            .unwrap();
        assert!(!ddl);
        r.decide(
            &user(),
            AuthAction::CreateTable { table_name: "t" },
            Some("main"),
            None,
            &mut ddl,
        )
        .unwrap();
        assert!(ddl);
    }

    #[test]
    fn denial_message_replaces_not_authorized() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE tablix_meta(k)").unwrap();
        let policy = Policy::install(&mut conn, Arc::new(rules()), user()).unwrap();
        policy.set_enforcing(true);
        let err = conn
            .execute("INSERT INTO tablix_meta VALUES (1)", [])
            .unwrap_err();
        let msg = policy.describe(&err);
        assert!(
            msg.contains("tablix_meta is a tablix system table"),
            "{msg}"
        );
        policy.set_enforcing(false);
        conn.execute("INSERT INTO tablix_meta VALUES (1)", [])
            .unwrap();
    }
}
