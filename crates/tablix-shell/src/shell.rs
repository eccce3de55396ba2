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
    #[error("{0}")]
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
    /// Statements collected between BEGIN and COMMIT; sent as one
    /// transaction at COMMIT.
    transaction: Option<Vec<String>>,
}

/// What a statement does to the shell's own transaction buffer.
enum Control {
    Begin,
    Commit,
    Rollback,
    None,
}

fn control(sql: &str) -> Control {
    let w = words(sql);
    match w.first().map(String::as_str) {
        Some("BEGIN") => Control::Begin,
        Some("COMMIT" | "END") => Control::Commit,
        Some("ROLLBACK") if !w.iter().any(|x| x == "TO") => Control::Rollback,
        _ => Control::None,
    }
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
    pub fn run_batch(&mut self, text: &str) -> Result<(), ShellError> {
        let mut splitter = Splitter::new();
        for line in text.split_inclusive('\n') {
            for sql in self.feed(&mut splitter, line)? {
                self.run_sql(&sql)?;
            }
        }
        if let Some(rest) = splitter.finish() {
            self.run_sql(&rest)?;
        }
        if self.transaction.take().is_some() {
            return Err(ShellError::Sql(
                "input ended inside a transaction: BEGIN without COMMIT; nothing of it was applied"
                    .into(),
            ));
        }
        Ok(())
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
                Err(ReadlineError::Eof) => break,
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
        match (control(sql), self.transaction.is_some()) {
            (Control::Begin, true) => Err(ShellError::Sql(
                "cannot start a transaction within a transaction".into(),
            )),
            (Control::Begin, false) => {
                self.transaction = Some(Vec::new());
                Ok(())
            }
            (Control::Commit | Control::Rollback, false) => {
                Err(ShellError::Sql("no transaction is active".into()))
            }
            (Control::Rollback, true) => {
                self.transaction = None;
                Ok(())
            }
            (Control::Commit, true) => {
                let statements = self.transaction.take().unwrap_or_default();
                if statements.is_empty() {
                    return Ok(());
                }
                self.send(&statements, true)
            }
            (Control::None, true) => {
                if let Some(t) = self.transaction.as_mut() {
                    t.push(sql.to_string());
                }
                Ok(())
            }
            (Control::None, false) => self.send(&[sql.to_string()], false),
        }
    }

    fn send(&mut self, statements: &[String], transaction: bool) -> Result<(), ShellError> {
        let started = Instant::now();
        let replies = self.client.request(statements, transaction)?;
        let elapsed = started.elapsed();
        let mut first_error = None;
        for reply in replies {
            match reply {
                Reply::Rows {
                    columns, values, ..
                } => {
                    let text = render(self.mode, self.headers, &columns, &values);
                    self.out.write_all(text.as_bytes())?;
                }
                Reply::Executed { .. } => {}
                Reply::Error(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if self.timer {
            writeln!(self.out, "Run Time: real {:.6}", elapsed.as_secs_f64())?;
        }
        match first_error {
            Some(e) if transaction => Err(ShellError::Sql(format!(
                "{e} (the transaction was rolled back)"
            ))),
            Some(e) => Err(ShellError::Sql(e)),
            None => Ok(()),
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
            Dot::Mode(None) => writeln!(self.out, "current output mode: {:?}", self.mode)?,
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
