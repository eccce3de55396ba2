//! Dot-commands.

use crate::format::Mode;

pub(crate) const HELP: &str = "\
.backup FILE            Write the user tables to FILE as a SQLite database
.consistency ?LEVEL?     Show or set the read consistency: none, weak,
                         linearizable, strong or auto (a cluster's reads)
.dump ?TABLE...?         Render the user tables (or those named) as SQL
.headers on|off          Turn column headers on or off (csv, list modes)
.help                    Show this message
.leader                  Show the cluster's leader
.mode ?MODE?             Set the output mode: table, csv, json, line, list
.nodes                   Show the cluster's nodes, as the daemon asked sees them
.quit, .exit             Leave the shell
.read FILE               Run the SQL and dot-commands in FILE
.restore FILE            Replace the user tables with those of FILE (a
                         SQLite database, or SQL) in one transaction
.schema ?PATTERN?        Show CREATE statements (LIKE pattern on the name)
.tables ?PATTERN?        List tables and views, system tables as mem.NAME
.timer on|off            Report how long each statement took
";

#[derive(Debug, PartialEq)]
pub(crate) enum Dot {
    Backup(String),
    Restore(String),
    Consistency(Option<String>),
    Dump(Vec<String>),
    Leader,
    Nodes,
    Headers(bool),
    Help,
    Mode(Option<Mode>),
    Quit,
    Read(String),
    Schema(Option<String>),
    Tables(Option<String>),
    Timer(bool),
}

/// rqlite's read consistency levels.
pub(crate) const LEVELS: &[&str] = &["none", "weak", "linearizable", "strong", "auto"];

fn on_off(args: &[String], what: &str) -> Result<bool, String> {
    match args.first().map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("on" | "yes" | "1" | "true") => Ok(true),
        Some("off" | "no" | "0" | "false") => Ok(false),
        _ => Err(format!("usage: .{what} on|off")),
    }
}

/// Splits a dot-command line into words, honouring '...' and "..." quoting.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                any = true;
            }
            None if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            None => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub(crate) fn parse(line: &str) -> Result<Dot, String> {
    let mut w = words(line.trim().trim_start_matches('.'));
    if w.is_empty() {
        return Err("empty dot-command; try .help".into());
    }
    let name = w.remove(0);
    let args = w;
    match name.as_str() {
        "consistency" => match args.first().map(|l| l.to_ascii_lowercase()) {
            None => Ok(Dot::Consistency(None)),
            Some(l) if LEVELS.contains(&l.as_str()) => Ok(Dot::Consistency(Some(l))),
            Some(l) => Err(format!(
                "unknown consistency level {l:?}: use none, weak, linearizable, strong or auto"
            )),
        },
        "dump" => Ok(Dot::Dump(args)),
        "backup" | "save" => match args.as_slice() {
            [file] => Ok(Dot::Backup(file.clone())),
            _ => Err("usage: .backup FILE".into()),
        },
        "restore" => match args.as_slice() {
            [file] => Ok(Dot::Restore(file.clone())),
            _ => Err("usage: .restore FILE".into()),
        },
        "leader" => Ok(Dot::Leader),
        "nodes" => Ok(Dot::Nodes),
        "headers" | "header" => on_off(&args, "headers").map(Dot::Headers),
        "help" => Ok(Dot::Help),
        "mode" => match args.first() {
            None => Ok(Dot::Mode(None)),
            Some(m) => m.parse().map(|m| Dot::Mode(Some(m))),
        },
        "quit" | "exit" | "q" => Ok(Dot::Quit),
        "read" => match args.as_slice() {
            [file] => Ok(Dot::Read(file.clone())),
            _ => Err("usage: .read FILE".into()),
        },
        "schema" => Ok(Dot::Schema(args.first().cloned())),
        "tables" | "table" => Ok(Dot::Tables(args.first().cloned())),
        "timer" => on_off(&args, "timer").map(Dot::Timer),
        other => Err(format!("unknown command: .{other}; try .help")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(
            parse(".dump a b"),
            Ok(Dot::Dump(vec!["a".into(), "b".into()]))
        );
        assert_eq!(parse(".headers on"), Ok(Dot::Headers(true)));
        assert_eq!(parse(".mode csv"), Ok(Dot::Mode(Some(Mode::Csv))));
        assert_eq!(parse(".mode"), Ok(Dot::Mode(None)));
        assert_eq!(
            parse(".read 'my file.sql'"),
            Ok(Dot::Read("my file.sql".into()))
        );
        assert_eq!(parse(".timer off"), Ok(Dot::Timer(false)));
        assert_eq!(parse(".exit"), Ok(Dot::Quit));
        assert_eq!(parse(".tables t%"), Ok(Dot::Tables(Some("t%".into()))));
        assert!(
            parse(".frobnicate")
                .unwrap_err()
                .contains("unknown command")
        );
        assert!(parse(".mode yaml").unwrap_err().contains("unknown mode"));
        assert!(parse(".timer maybe").unwrap_err().contains("usage"));
        assert!(parse(".read").unwrap_err().contains("usage"));
        assert_eq!(parse(".nodes"), Ok(Dot::Nodes));
        assert_eq!(parse(".backup b.db"), Ok(Dot::Backup("b.db".into())));
        assert_eq!(parse(".restore b.db"), Ok(Dot::Restore("b.db".into())));
        assert!(parse(".backup").unwrap_err().contains("usage"));
        assert_eq!(parse(".leader"), Ok(Dot::Leader));
        assert_eq!(parse(".consistency"), Ok(Dot::Consistency(None)));
        assert_eq!(
            parse(".consistency Strong"),
            Ok(Dot::Consistency(Some("strong".into())))
        );
        assert!(
            parse(".consistency eventual")
                .unwrap_err()
                .contains("unknown consistency level")
        );
    }
}
