//! The shell: SQL and dot-commands from arguments, files, standard input or
//! an interactive prompt.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::client::{Client, ClientError, Reply};
use crate::dot::{self, Dot, HELP};
use crate::dump::dump;
use crate::format::{Mode, render};
use crate::split::{Splitter, words};

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// A statement failed; an interactive shell goes on.
    #[error("{0}")]
    Sql(String),
    /// A dot-command was misused; an interactive shell goes on.
    #[error("{0}")]
    Usage(String),
    /// The daemon could not be reached or refused the request.
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// `.quit`.
    #[error("quit")]
    Quit,
}

pub struct Shell<W: Write> {
    client: Client,
    out: W,
    mode: Mode,
    headers: bool,
    timer: bool,
    /// The transaction a typed BEGIN opened, until COMMIT or ROLLBACK.
    transaction: Option<OpenTx>,
    /// Whether input is a batch (a file, arguments, standard input not
    /// a terminal): a schema change inside its transaction folds it.
    batch: bool,
    /// Whether consecutive plain writes, or consecutive queries, may ride
    /// in one request (a batch read whole: a file or arguments, never
    /// lines as they arrive).
    grouping: bool,
    /// Statements of one kind waiting to be sent as one group, with the
    /// line each began on.
    pending: Vec<(String, usize)>,
    pending_kind: Kind,
}

/// What may ride in a group with what.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A write whose answer is only a count.
    Write,
    /// A query, which changes nothing.
    Read,
}

/// Most statements a group carries, and most bytes of SQL text.
const GROUP_STATEMENTS: usize = 128;
const GROUP_BYTES: usize = 64 << 10;

/// Whether `sql` may wait in a group, and in which: a write whose answer
/// is only a count, or a query (SELECT, VALUES), which changes nothing
/// and so may run again.
fn groupable(sql: &str) -> Option<Kind> {
    let w = words(sql);
    match w.first().map(String::as_str) {
        Some("INSERT" | "UPDATE" | "DELETE" | "REPLACE") if !w.iter().any(|x| x == "RETURNING") => {
            Some(Kind::Write)
        }
        Some("SELECT" | "VALUES") => Some(Kind::Read),
        _ => None,
    }
}

/// A transaction the shell has open.
struct OpenTx {
    /// The daemon's interactive transaction, whose statements run as
    /// they come; None once folded: the statements then run as one
    /// request at COMMIT.
    id: Option<String>,
    /// The statements run in it so far.
    statements: Vec<String>,
    /// Whether any of them showed rows (it can then not be run again).
    showed_rows: bool,
    readonly: bool,
}

/// What a statement does to the shell's transaction.
enum Control {
    Begin { readonly: bool },
    Commit,
    Rollback,
    None,
}

fn control(sql: &str) -> Control {
    let w = words(sql);
    match w.first().map(String::as_str) {
        Some("BEGIN") => Control::Begin {
            readonly: w.last().map(String::as_str) == Some("READONLY"),
        },
        Some("COMMIT" | "END") => Control::Commit,
        Some("ROLLBACK") if !w.iter().any(|x| x == "TO") => Control::Rollback,
        _ => Control::None,
    }
}

/// An error of a batch, with the line its statement began on, as sqlite3
/// says it.
fn near(e: ShellError, line: usize) -> ShellError {
    match e {
        ShellError::Sql(m) => ShellError::Sql(format!("near line {line}: {m}")),
        ShellError::Usage(m) => ShellError::Usage(format!("near line {line}: {m}")),
        other => other,
    }
}

/// Whether `sql` changes the schema: an interactive transaction cannot
/// carry that (its changes travel as rows).
fn is_schema_change(sql: &str) -> bool {
    matches!(
        words(sql).first().map(String::as_str),
        Some("CREATE" | "ALTER" | "DROP")
    )
}

impl<W: Write> Shell<W> {
    pub fn new(client: Client, out: W) -> Shell<W> {
        Shell {
            client,
            out,
            mode: Mode::Table,
            headers: false,
            timer: false,
            transaction: None,
            batch: true,
            grouping: false,
            pending: Vec::new(),
            pending_kind: Kind::Write,
        }
    }

    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    pub fn set_headers(&mut self, on: bool) {
        self.headers = on;
    }

    pub fn into_output(self) -> W {
        self.out
    }

    /// Runs text (SQL statements and dot-commands, one per line) as a batch:
    /// stops at the first error and returns it.
    ///
    /// Consecutive plain writes outside a transaction travel as groups,
    /// one request each, applied all or nothing: a group that fails is
    /// sent again without the failing statement and what follows it, and
    /// that statement then runs alone, so what is applied and what is
    /// shown are what running them one at a time gives, with one round
    /// trip (and one replicated entry) for many statements. Consecutive
    /// queries travel as groups too; their answers are shown in order up
    /// to the first error.
    pub fn run_batch(&mut self, text: &str) -> Result<(), ShellError> {
        let was = std::mem::replace(&mut self.grouping, true);
        let r = self.run_lines(text.split_inclusive('\n').map(|l| Ok(l.to_string())));
        self.grouping = was;
        r
    }

    /// Runs lines as a batch as they arrive (standard input read from a
    /// pipe: another program may wait for each statement's answer before
    /// it writes the next), each statement's results written out before
    /// the next line is read. Stops at the first error and returns it; a
    /// transaction still open then, or at the end of input, is rolled
    /// back.
    pub fn run_lines(
        &mut self,
        lines: impl IntoIterator<Item = std::io::Result<String>>,
    ) -> Result<(), ShellError> {
        let r = (|| {
            let mut splitter = Splitter::new();
            // The line the pending statement began on, for errors.
            let mut began = 1;
            for (n, line) in lines.into_iter().enumerate() {
                let line = line?;
                let number = n + 1;
                if !splitter.is_pending() {
                    began = number;
                    if line.trim_start().starts_with('.') {
                        // A dot-command may read what the group writes.
                        self.flush_group()?;
                    }
                }
                let statements = self
                    .feed(&mut splitter, &line)
                    .map_err(|e| near(e, number))?;
                let ended = !statements.is_empty();
                for (i, sql) in statements.into_iter().enumerate() {
                    let at = if i == 0 { began } else { number };
                    self.statement(sql, at)?;
                }
                // What is left pending began on this line.
                if ended {
                    began = number;
                }
            }
            if let Some(rest) = splitter.finish() {
                self.statement(rest, began)?;
            }
            self.flush_group()?;
            if self.transaction.is_some() {
                return Err(ShellError::Sql(
                    "input ended inside a transaction: BEGIN without COMMIT; nothing of it was applied"
                        .into(),
                ));
            }
            Ok(())
        })();
        if r.is_err() {
            self.pending.clear();
            self.abandon();
        }
        r
    }

    /// Runs one statement of a batch begun on line `at`, or keeps it for
    /// the group being gathered.
    fn statement(&mut self, sql: String, at: usize) -> Result<(), ShellError> {
        let kind =
            groupable(&sql).filter(|_| self.grouping && !self.timer && self.transaction.is_none());
        if let Some(kind) = kind {
            if kind != self.pending_kind {
                self.flush_group()?;
                self.pending_kind = kind;
            }
            self.pending.push((sql, at));
            let bytes: usize = self.pending.iter().map(|(s, _)| s.len()).sum();
            if self.pending.len() >= GROUP_STATEMENTS || bytes >= GROUP_BYTES {
                self.flush_group()?;
            }
            return Ok(());
        }
        self.flush_group()?;
        self.run_sql(&sql).map_err(|e| near(e, at))?;
        self.out.flush()?;
        Ok(())
    }

    /// Sends the gathered writes. A group is one request in a
    /// transaction; when statement k of it fails nothing of it was
    /// applied, and the first k are sent again as a group of their own,
    /// after which statement k runs alone: it fails there with its own
    /// error (the batch stops, as it would have one statement at a time)
    /// or, the state having changed meanwhile, succeeds and the rest
    /// follows.
    fn flush_group(&mut self) -> Result<(), ShellError> {
        let group = std::mem::take(&mut self.pending);
        if self.pending_kind == Kind::Read {
            return self.flush_reads(&group);
        }
        let (mut start, mut end) = (0, group.len());
        while start < group.len() {
            if end - start == 1 {
                self.one_at_a_time(&group[start..end])?;
                (start, end) = (end, group.len());
                continue;
            }
            let sqls: Vec<String> = group[start..end].iter().map(|(s, _)| s.clone()).collect();
            let replies = self
                .client
                .request(&sqls, true)
                .map_err(|e| near(e.into(), group[start].1))?;
            match replies.iter().position(|r| matches!(r, Reply::Error(_))) {
                None => {
                    self.show(replies, false)?;
                    (start, end) = (end, group.len());
                }
                Some(k) => end = start + k.max(1),
            }
        }
        self.out.flush()?;
        Ok(())
    }

    /// Sends gathered queries as one request and shows their answers in
    /// order, up to the first error. A request that fails whole (their
    /// answers together past the daemon's result limit, a daemon gone)
    /// is run again one query at a time: queries change nothing.
    fn flush_reads(&mut self, group: &[(String, usize)]) -> Result<(), ShellError> {
        if group.len() < 2 {
            return self.one_at_a_time(group);
        }
        let sqls: Vec<String> = group.iter().map(|(s, _)| s.clone()).collect();
        let Ok(replies) = self.client.request(&sqls, false) else {
            return self.one_at_a_time(group);
        };
        let answered = replies.len().min(group.len());
        for (reply, (_, at)) in replies.into_iter().zip(group) {
            if let Reply::Error(e) = reply {
                return Err(near(ShellError::Sql(e), *at));
            }
            self.show(vec![reply], false)?;
        }
        // Any query the daemon did not answer runs on its own.
        self.one_at_a_time(&group[answered..])?;
        self.out.flush()?;
        Ok(())
    }

    fn one_at_a_time(&mut self, group: &[(String, usize)]) -> Result<(), ShellError> {
        for (sql, at) in group {
            self.send(std::slice::from_ref(sql), false)
                .map_err(|e| near(e, *at))?;
            self.out.flush()?;
        }
        Ok(())
    }

    /// Rolls back a transaction left open (at an error in a batch, at the
    /// end of input).
    fn abandon(&mut self) {
        if let Some(OpenTx { id: Some(id), .. }) = self.transaction.take() {
            let _ = self.client.end(&id, false);
        }
    }

    /// Hands a line to the splitter, or runs it as a dot-command when no
    /// statement is pending. Returns the statements it completed.
    fn feed(&mut self, splitter: &mut Splitter, line: &str) -> Result<Vec<String>, ShellError> {
        if !splitter.is_pending() && line.trim_start().starts_with('.') {
            self.dot(line.trim())?;
            return Ok(Vec::new());
        }
        Ok(splitter.push(line))
    }

    /// The interactive prompt, with line editing and history. Errors are
    /// printed and the shell goes on.
    pub fn repl(&mut self, history: Option<&Path>) -> Result<(), ShellError> {
        self.batch = false;
        // Ctrl-C while a statement runs gives its request up (the daemon
        // stops the statement) and comes back to the prompt.
        let interrupt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        if signal_hook::flag::register(signal_hook::consts::SIGINT, interrupt.clone()).is_ok() {
            self.client.interrupt_on(interrupt);
        }
        let mut editor = DefaultEditor::new().map_err(|e| ShellError::Usage(e.to_string()))?;
        if let Some(h) = history {
            let _ = editor.load_history(h);
        }
        writeln!(
            self.out,
            "tablix sql, connected to {}. Enter \".help\" for usage hints.",
            self.client.addr()
        )?;
        let mut splitter = Splitter::new();
        loop {
            let prompt = match (splitter.is_pending(), self.transaction.is_some()) {
                (true, _) => "   ...> ",
                (false, true) => "tablix*> ",
                (false, false) => "tablix> ",
            };
            let line = match editor.readline(prompt) {
                Ok(l) => l,
                Err(ReadlineError::Interrupted) => {
                    splitter = Splitter::new();
                    continue;
                }
                Err(ReadlineError::Eof) => {
                    if let Some(rest) = splitter.finish() {
                        eprintln!("Error: incomplete SQL, not run: {rest}");
                    }
                    break;
                }
                Err(e) => return Err(ShellError::Usage(e.to_string())),
            };
            if !line.trim().is_empty() {
                let _ = editor.add_history_entry(line.as_str());
            }
            let result = self
                .feed(&mut splitter, &format!("{line}\n"))
                .and_then(|stmts| {
                    for sql in stmts {
                        if let Err(e) = self.run_sql(&sql) {
                            self.report(&e)?;
                        }
                    }
                    Ok(())
                });
            match result {
                Ok(()) => {}
                Err(ShellError::Quit) => break,
                Err(e) => self.report(&e)?,
            }
        }
        if let Some(h) = history {
            let _ = editor.save_history(h);
        }
        if self.transaction.is_some() {
            self.abandon();
            eprintln!("(the open transaction was rolled back)");
        }
        Ok(())
    }

    fn report(&mut self, e: &ShellError) -> Result<(), ShellError> {
        if matches!(e, ShellError::Quit) {
            return Ok(());
        }
        self.out.flush()?;
        eprintln!("Error: {e}");
        Ok(())
    }

    fn run_sql(&mut self, sql: &str) -> Result<(), ShellError> {
        let open = self.transaction.is_some();
        match control(sql) {
            Control::Begin { .. } if open => Err(ShellError::Sql(
                "cannot start a transaction within a transaction".into(),
            )),
            Control::Begin { readonly } => {
                let id = self.client.begin(readonly)?;
                self.transaction = Some(OpenTx {
                    id: Some(id),
                    statements: Vec::new(),
                    showed_rows: false,
                    readonly,
                });
                Ok(())
            }
            Control::Commit | Control::Rollback if !open => {
                Err(ShellError::Sql("no transaction is active".into()))
            }
            Control::Rollback => {
                self.abandon();
                Ok(())
            }
            Control::Commit => {
                let Some(tx) = self.transaction.take() else {
                    return Ok(());
                };
                match tx.id {
                    // Folded: the whole block runs now, as one request.
                    None if tx.statements.is_empty() => Ok(()),
                    None => self.send(&tx.statements, true),
                    Some(id) => match self.client.end(&id, true)? {
                        None => Ok(()),
                        Some(why) => Err(ShellError::Sql(format!(
                            "{why} (the transaction was rolled back)"
                        ))),
                    },
                }
            }
            Control::None => {
                let batch = self.batch;
                let Some(tx) = self.transaction.as_mut() else {
                    return self.send(&[sql.to_string()], false);
                };
                // A batch's schema change (a dump being restored) cannot
                // run in an interactive transaction: the block is rolled
                // back there and run again whole, as one request, at
                // COMMIT; unless what it showed would be shown twice.
                if batch
                    && tx.id.is_some()
                    && !tx.showed_rows
                    && !tx.readonly
                    && is_schema_change(sql)
                    && let Some(id) = tx.id.take()
                {
                    self.client.end(&id, false)?;
                }
                tx.statements.push(sql.to_string());
                match tx.id.clone() {
                    None => Ok(()),
                    Some(id) => {
                        let started = Instant::now();
                        let replies = self.client.request_in(&id, &[sql.to_string()])?;
                        self.timed(started)?;
                        // A batch stops at its first error, and the
                        // transaction with it; at the prompt the
                        // statement alone is undone and it goes on.
                        let showed = self.show(replies, batch)?;
                        if let Some(tx) = self.transaction.as_mut() {
                            tx.showed_rows |= showed;
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    fn send(&mut self, statements: &[String], transaction: bool) -> Result<(), ShellError> {
        let started = Instant::now();
        let replies = self.client.request(statements, transaction)?;
        self.timed(started)?;
        self.show(replies, transaction).map(|_| ())
    }

    fn timed(&mut self, started: Instant) -> Result<(), ShellError> {
        if self.timer {
            writeln!(
                self.out,
                "Run Time: real {:.6}",
                started.elapsed().as_secs_f64()
            )?;
        }
        Ok(())
    }

    /// Writes out the rows of `replies`; the first error fails. Returns
    /// whether rows were shown.
    fn show(&mut self, replies: Vec<Reply>, transaction: bool) -> Result<bool, ShellError> {
        let mut first_error = None;
        let mut showed = false;
        for reply in replies {
            match reply {
                Reply::Rows {
                    columns, values, ..
                } => {
                    let text = render(self.mode, self.headers, &columns, &values);
                    self.out.write_all(text.as_bytes())?;
                    showed = true;
                }
                Reply::Executed { .. } => {}
                Reply::Error(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if transaction => Err(ShellError::Sql(format!(
                "{e} (the transaction was rolled back)"
            ))),
            Some(e) => Err(ShellError::Sql(e)),
            None => Ok(showed),
        }
    }

    fn rows(&mut self, sql: String) -> Result<Vec<Vec<serde_json::Value>>, ShellError> {
        match self.client.query(&[sql])?.pop() {
            Some(Reply::Rows { values, .. }) => Ok(values),
            Some(Reply::Error(e)) => Err(ShellError::Sql(e)),
            _ => Ok(Vec::new()),
        }
    }

    /// The cluster's nodes, voters and learners, as the daemon sees them.
    fn nodes(&self) -> Result<Vec<serde_json::Value>, ShellError> {
        let seen = self.client.get_json("/nodes?ver=2&nonvoters")?;
        Ok(seen["nodes"].as_array().cloned().unwrap_or_default())
    }

    fn dot(&mut self, line: &str) -> Result<(), ShellError> {
        let cmd = dot::parse(line).map_err(ShellError::Usage)?;
        match cmd {
            Dot::Help => self.out.write_all(HELP.as_bytes())?,
            Dot::Quit => return Err(ShellError::Quit),
            Dot::Headers(on) => self.headers = on,
            Dot::Timer(on) => self.timer = on,
            Dot::Mode(Some(m)) => self.mode = m,
            Dot::Mode(None) => writeln!(self.out, "current output mode: {}", self.mode.name())?,
            Dot::Read(file) => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| ShellError::Usage(format!("cannot read {file}: {e}")))?;
                self.run_batch(&text)?;
            }
            Dot::Tables(pattern) => {
                let like = sql_string(pattern.as_deref().unwrap_or("%"));
                // The user's tables, tablix's views of system state (in
                // temp), and its raw tables (root's) as mem.NAME.
                let names = self.rows(format!(
                    "SELECT name FROM main.sqlite_schema WHERE type IN ('table', 'view') \
                     AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name LIKE {like} \
                     UNION ALL SELECT name FROM temp.sqlite_schema WHERE type = 'view' \
                     AND name LIKE {like} \
                     UNION ALL SELECT 'mem.' || name FROM mem.sqlite_schema \
                     WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
                     AND name LIKE {like} ORDER BY 1"
                ))?;
                let names: Vec<String> = names.iter().map(|r| crate::format::text(&r[0])).collect();
                if !names.is_empty() {
                    writeln!(self.out, "{}", names.join("  "))?;
                }
            }
            Dot::Schema(pattern) => {
                let like = sql_string(pattern.as_deref().unwrap_or("%"));
                let rows = self.rows(format!(
                    "SELECT sql FROM (SELECT sql, name, type, 0 AS db, rowid AS r FROM main.sqlite_schema \
                     UNION ALL SELECT sql, name, type, 1, rowid FROM mem.sqlite_schema) \
                     WHERE sql IS NOT NULL AND name LIKE {like} ORDER BY db, r"
                ))?;
                for r in rows {
                    writeln!(self.out, "{};", crate::format::text(&r[0]))?;
                }
            }
            Dot::Dump(tables) => {
                let text = dump(&self.client, &tables)?;
                self.out.write_all(text.as_bytes())?;
            }
            Dot::Backup(file) => {
                crate::dump::backup(&self.client, &file)?;
                writeln!(self.out, "backup file written successfully")?;
            }
            Dot::Restore(file) => {
                let said = crate::dump::restore(&self.client, &file)?;
                writeln!(self.out, "{said}")?;
            }
            Dot::Consistency(Some(level)) => self.client.set_level(Some(level)),
            Dot::Consistency(None) => writeln!(
                self.out,
                "{}",
                self.client.level().unwrap_or("weak (the daemon's default)")
            )?,
            Dot::Nodes => {
                for n in self.nodes()? {
                    writeln!(
                        self.out,
                        "{}: raft {}, api {}, {}{}{}",
                        n["id"].as_str().unwrap_or("?"),
                        n["addr"].as_str().unwrap_or("?"),
                        n["api_addr"]
                            .as_str()
                            .filter(|a| !a.is_empty())
                            .unwrap_or("-"),
                        if n["voter"] == true {
                            "voter"
                        } else {
                            "learner"
                        },
                        if n["leader"] == true { ", leader" } else { "" },
                        if n["reachable"] == true {
                            String::new()
                        } else {
                            format!(
                                ", unreachable ({})",
                                n["error"].as_str().unwrap_or("no answer")
                            )
                        },
                    )?;
                }
            }
            Dot::Leader => match self.nodes()?.into_iter().find(|n| n["leader"] == true) {
                Some(n) => writeln!(
                    self.out,
                    "node {} (api {}, raft {})",
                    n["id"].as_str().unwrap_or("?"),
                    n["api_addr"]
                        .as_str()
                        .filter(|a| !a.is_empty())
                        .unwrap_or("-"),
                    n["addr"].as_str().unwrap_or("?")
                )?,
                None => writeln!(self.out, "no leader is known")?,
            },
        }
        Ok(())
    }
}

fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::{Kind, groupable};

    #[test]
    fn only_count_answering_writes_and_queries_are_grouped() {
        assert_eq!(groupable("INSERT INTO t VALUES (1);"), Some(Kind::Write));
        assert_eq!(groupable("  update t set a = 1"), Some(Kind::Write));
        assert_eq!(groupable("DELETE FROM t RETURNING *;"), None);
        assert_eq!(
            groupable("INSERT INTO t VALUES ('returning');"),
            Some(Kind::Write)
        );
        assert_eq!(groupable("SELECT 1;"), Some(Kind::Read));
        assert_eq!(groupable("VALUES (1), (2);"), Some(Kind::Read));
        for other in [
            "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x;",
            "CREATE TABLE t(a);",
            "BEGIN;",
            "PRAGMA user_version;",
            "-- only a comment",
        ] {
            assert_eq!(groupable(other), None, "{other}");
        }
    }
}
