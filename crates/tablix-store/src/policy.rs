//! What user SQL may do. Installed as SQLite's authorizer on every connection
//! that runs user SQL.
//!
//! Architecture invariant: system tables change only through Commands. User
//! SQL may read them, never write them, never attach triggers, indexes or
//! views to them, and never change connection state that the replicated
//! database does not carry (transactions, temp objects, settings pragmas,
//! attached files).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

/// Whether a table belongs to tablix rather than to the user. Everything in
/// the memory database is tablix state, as is every `tablix_*` table and
/// the file system's `files` view.
pub fn is_system_table(database: Option<&str>, table: &str) -> bool {
    let lower = table.to_ascii_lowercase();
    database == Some("mem")
        || lower.starts_with("tablix_")
        || lower == "pcache_stats"
        || lower == "files"
}

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

/// Decides one authorizer request for user SQL: `Err` carries the message the
/// user sees.
pub(crate) fn decide(action: AuthAction<'_>, database: Option<&str>) -> Result<(), String> {
    let system = |table: &str| -> Result<(), String> {
        if is_system_table(database, table) {
            Err(format!(
                "{} is a tablix system table: it is read-only to SQL and changes only through tablix commands",
                qualified(database, table)
            ))
        } else {
            Ok(())
        }
    };
    match action {
        AuthAction::Insert { table_name }
        | AuthAction::Delete { table_name }
        | AuthAction::Update { table_name, .. } => system(table_name),
        AuthAction::CreateTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::AlterTable { table_name, .. }
        | AuthAction::CreateIndex { table_name, .. }
        | AuthAction::DropIndex { table_name, .. }
        | AuthAction::CreateTrigger { table_name, .. }
        | AuthAction::DropTrigger { table_name, .. }
        | AuthAction::CreateVtable { table_name, .. }
        | AuthAction::DropVtable { table_name, .. } => system(table_name),
        AuthAction::CreateView { view_name } | AuthAction::DropView { view_name } => {
            system(view_name)
        }
        AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::DropTempIndex { .. }
        | AuthAction::DropTempTable { .. }
        | AuthAction::DropTempTrigger { .. }
        | AuthAction::DropTempView { .. } => Err(
            "temporary objects are not supported: they would live outside the stored state".into(),
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
        _ => Ok(()),
    }
}

fn qualified(database: Option<&str>, table: &str) -> String {
    match database {
        Some(db) if db != "main" => format!("{db}.{table}"),
        _ => table.to_string(),
    }
}

/// Handle on an installed authorizer.
#[derive(Clone)]
pub(crate) struct Policy {
    /// While false, the connection runs tablix's own statements unrestricted.
    enforcing: Arc<AtomicBool>,
    /// Message of the most recent denial, for replacing SQLite's terse
    /// "not authorized".
    denial: Arc<Mutex<Option<String>>>,
}

impl Policy {
    pub(crate) fn install(conn: &mut Connection, enforcing: bool) -> rusqlite::Result<Policy> {
        let policy = Policy {
            enforcing: Arc::new(AtomicBool::new(enforcing)),
            denial: Arc::new(Mutex::new(None)),
        };
        let hook = policy.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| {
            if !hook.enforcing.load(Ordering::Relaxed) {
                return Authorization::Allow;
            }
            match decide(ctx.action, ctx.database_name) {
                Ok(()) => Authorization::Allow,
                Err(message) => {
                    if let Ok(mut slot) = hook.denial.lock() {
                        *slot = Some(message);
                    }
                    Authorization::Deny
                }
            }
        }))?;
        Ok(policy)
    }

    pub(crate) fn set_enforcing(&self, on: bool) {
        self.enforcing.store(on, Ordering::Relaxed);
    }

    /// Turns an error into the message a user should see.
    pub(crate) fn describe(&self, err: &rusqlite::Error) -> String {
        let denied = matches!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::AuthorizationForStatementDenied)
        );
        if denied
            && let Ok(mut slot) = self.denial.lock()
            && let Some(m) = slot.take()
        {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::hooks::TransactionOperation;

    #[test]
    fn decision_table() {
        let allowed = |a, db| decide(a, db).is_ok();
        let cases: Vec<(AuthAction<'_>, Option<&str>, bool)> = vec![
            (AuthAction::Insert { table_name: "t" }, Some("main"), true),
            (
                AuthAction::Insert {
                    table_name: "daemon",
                },
                Some("mem"),
                false,
            ),
            (
                AuthAction::Delete {
                    table_name: "tablix_meta",
                },
                Some("main"),
                false,
            ),
            (
                AuthAction::Update {
                    table_name: "TABLIX_META",
                    column_name: "v",
                },
                Some("main"),
                false,
            ),
            (
                AuthAction::Read {
                    table_name: "daemon",
                    column_name: "pid",
                },
                Some("mem"),
                true,
            ),
            (
                AuthAction::CreateTable { table_name: "t" },
                Some("main"),
                true,
            ),
            (
                AuthAction::CreateTable { table_name: "t" },
                Some("mem"),
                false,
            ),
            (
                AuthAction::CreateTable {
                    table_name: "tablix_x",
                },
                Some("main"),
                false,
            ),
            (
                AuthAction::DropTable {
                    table_name: "tablix_meta",
                },
                Some("main"),
                false,
            ),
            (
                AuthAction::CreateTrigger {
                    trigger_name: "g",
                    table_name: "daemon",
                },
                Some("mem"),
                false,
            ),
            (
                AuthAction::CreateIndex {
                    index_name: "i",
                    table_name: "t",
                },
                Some("main"),
                true,
            ),
            (
                AuthAction::CreateTempTable { table_name: "t" },
                Some("temp"),
                false,
            ),
            (
                AuthAction::Transaction {
                    operation: TransactionOperation::Begin,
                },
                None,
                false,
            ),
            (
                AuthAction::Savepoint {
                    operation: TransactionOperation::Begin,
                    savepoint_name: "s",
                },
                None,
                false,
            ),
            (AuthAction::Attach { filename: "/x" }, None, false),
            (
                AuthAction::Pragma {
                    pragma_name: "table_info",
                    pragma_value: Some("t"),
                },
                None,
                true,
            ),
            (
                AuthAction::Pragma {
                    pragma_name: "user_version",
                    pragma_value: None,
                },
                None,
                true,
            ),
            (
                AuthAction::Pragma {
                    pragma_name: "user_version",
                    pragma_value: Some("3"),
                },
                None,
                false,
            ),
            (
                AuthAction::Pragma {
                    pragma_name: "journal_mode",
                    pragma_value: Some("delete"),
                },
                None,
                false,
            ),
            (
                AuthAction::Function {
                    function_name: "load_extension",
                },
                None,
                false,
            ),
            (
                AuthAction::Function {
                    function_name: "abs",
                },
                None,
                true,
            ),
            (AuthAction::Select, None, true),
        ];
        for (action, db, want) in cases {
            assert_eq!(allowed(action, db), want, "{action:?} in {db:?}");
        }
    }

    #[test]
    fn denial_message_replaces_not_authorized() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE tablix_meta(k)").unwrap();
        let policy = Policy::install(&mut conn, true).unwrap();
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
