//! SQL text as SQLite's tokenizer splits it, for the few rules the
//! authorizer cannot see: a NUL byte inside a statement, names a statement
//! gives its common table expressions, and the names a schema object's
//! definition mentions.

/// One token, with identifiers and words unquoted and lower-cased (SQLite
/// compares names case-insensitively in ASCII).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    /// A bare word: a keyword or an identifier.
    Word(String),
    /// A quoted identifier: "x", [x] or `x`.
    Quoted(String),
    /// A string literal's content.
    Str(String),
    /// One punctuation character.
    Punct(char),
    /// Numbers, blobs, parameters, operators of several characters.
    Other,
}

impl Token {
    /// The name this token may stand for: a word or a quoted identifier.
    fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) | Token::Quoted(w) => Some(w),
            _ => None,
        }
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self, Token::Word(x) if x == w)
    }
}

fn is_id_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

fn is_id_char(b: u8) -> bool {
    is_id_start(b) || b.is_ascii_digit() || b == b'$'
}

/// Splits `sql` into tokens (whitespace and comments dropped). An
/// unterminated string, identifier or comment runs to the end.
pub(crate) fn tokens(sql: &str) -> Vec<Token> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let text = |from: usize, to: usize| String::from_utf8_lossy(&b[from..to]).to_ascii_lowercase();
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0c => i += 1,
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(b.len());
            }
            b'\'' | b'"' | b'`' | b'[' => {
                let close = if c == b'[' { b']' } else { c };
                let mut value = Vec::new();
                i += 1;
                while i < b.len() {
                    if b[i] == close {
                        // Doubled quotes escape themselves (not in [...]).
                        if close != b']' && b.get(i + 1) == Some(&close) {
                            value.push(close);
                            i += 2;
                            continue;
                        }
                        i += 1;
                        break;
                    }
                    value.push(b[i]);
                    i += 1;
                }
                let v = String::from_utf8_lossy(&value).into_owned();
                out.push(if c == b'\'' {
                    Token::Str(v)
                } else {
                    Token::Quoted(v.to_ascii_lowercase())
                });
            }
            b'x' | b'X' if b.get(i + 1) == Some(&b'\'') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i = (i + 1).min(b.len());
                out.push(Token::Other);
            }
            b'?' | b':' | b'@' | b'$' => {
                i += 1;
                while i < b.len() && (is_id_char(b[i]) || b[i] == b':') {
                    i += 1;
                }
                out.push(Token::Other);
            }
            c if c.is_ascii_digit()
                || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                while i < b.len() && (is_id_char(b[i]) || b[i] == b'.') {
                    // An exponent's sign belongs to the number.
                    if (b[i] == b'e' || b[i] == b'E') && matches!(b.get(i + 1), Some(b'+' | b'-')) {
                        i += 1;
                    }
                    i += 1;
                }
                out.push(Token::Other);
            }
            c if is_id_start(c) => {
                let from = i;
                while i < b.len() && is_id_char(b[i]) {
                    i += 1;
                }
                out.push(Token::Word(text(from, i)));
            }
            c => {
                i += 1;
                out.push(Token::Punct(c as char));
            }
        }
    }
    out
}

/// The byte offset of a NUL in `sql`, if any: SQLite would stop reading the
/// statement there and silently run only what comes before.
pub(crate) fn nul_offset(sql: &str) -> Option<usize> {
    sql.bytes().position(|b| b == 0)
}

/// Names `sql` defines as common table expressions (or windows) for which
/// `reserved` holds: `name AS (`, `name AS [NOT] MATERIALIZED (` and
/// `name(columns) AS (` forms. Returns the first.
pub(crate) fn defined_name(sql: &str, reserved: impl Fn(&str) -> bool) -> Option<String> {
    // Every form needs the word AS, so a statement without those two
    // letters anywhere (most single-row writes) needs no tokens: this runs
    // on the writer thread for every user statement.
    if !sql
        .as_bytes()
        .windows(2)
        .any(|w| w.eq_ignore_ascii_case(b"as"))
    {
        return None;
    }
    let t = tokens(sql);
    for i in 0..t.len() {
        let Some(name) = t[i].name() else { continue };
        if !reserved(name) {
            continue;
        }
        let mut j = i + 1;
        if t.get(j) == Some(&Token::Punct('(')) {
            let mut depth = 0usize;
            while j < t.len() {
                match t[j] {
                    Token::Punct('(') => depth += 1,
                    Token::Punct(')') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j += 1;
        }
        if t.get(j).is_some_and(|x| x.is_word("as"))
            && t.get(j + 1).is_some_and(|x| {
                *x == Token::Punct('(') || x.is_word("not") || x.is_word("materialized")
            })
        {
            return Some(name.to_string());
        }
    }
    None
}

/// The first name (bare, quoted or in a string, as a virtual table's
/// arguments take them) in `sql` that `matches` accepts.
pub(crate) fn mentioned_name(sql: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    tokens(sql).into_iter().find_map(|t| match t {
        Token::Word(w) | Token::Quoted(w) if matches(&w) => Some(w),
        Token::Str(s) if matches(&s.to_ascii_lowercase()) => Some(s),
        _ => None,
    })
}

/// Whether `sql` contains `prefix` (lower case) at the start of a word,
/// anywhere: in names, strings and comments alike. Conservative on
/// purpose: a virtual table's arguments are parsed by its module, which may
/// unquote a string twice.
pub(crate) fn mentions_prefix(sql: &str, prefix: &str) -> Option<String> {
    let lower = sql.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut from = 0;
    while let Some(at) = lower[from..].find(prefix) {
        let start = from + at;
        if start == 0 || !is_id_char(b[start - 1]) {
            let end = b[start..]
                .iter()
                .position(|&c| !is_id_char(c))
                .map_or(b.len(), |n| start + n);
            return Some(lower[start..end].to_string());
        }
        from = start + prefix.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_sqlites_quoting_and_comments() {
        let t = tokens(
            "SELECT \"Files\", [a b], `c``d`, 'it''s', x'00', 1.5e+3, ?1, :n -- files\n/* files */ FROM t",
        );
        assert_eq!(
            t,
            vec![
                Token::Word("select".into()),
                Token::Quoted("files".into()),
                Token::Punct(','),
                Token::Quoted("a b".into()),
                Token::Punct(','),
                Token::Quoted("c`d".into()),
                Token::Punct(','),
                Token::Str("it's".into()),
                Token::Punct(','),
                Token::Other,
                Token::Punct(','),
                Token::Other,
                Token::Punct(','),
                Token::Other,
                Token::Punct(','),
                Token::Other,
                Token::Word("from".into()),
                Token::Word("t".into()),
            ]
        );
        assert_eq!(nul_offset("SELECT 1\0; DROP"), Some(8));
        assert_eq!(nul_offset("SELECT 1"), None);
    }

    #[test]
    fn cte_names_are_found_in_every_form() {
        let files = |n: &str| n == "files";
        for sql in [
            "WITH files AS (SELECT 1) SELECT * FROM files",
            "WITH x AS (SELECT 1), \"FILES\"(a) AS (SELECT 2) SELECT 1",
            "WITH RECURSIVE [files] AS MATERIALIZED (SELECT 1) SELECT 1",
            "with `Files` as not materialized (select 1) select 1",
            "SELECT * FROM (WITH files AS (SELECT 1) SELECT * FROM files)",
        ] {
            assert_eq!(defined_name(sql, files).as_deref(), Some("files"), "{sql}");
        }
        for sql in [
            "SELECT * FROM files AS f",
            "SELECT path AS files FROM files",
            "SELECT 'files AS (' FROM t",
            "SELECT * FROM files -- AS (\n",
            "INSERT INTO files(x) VALUES (1)",
        ] {
            assert_eq!(defined_name(sql, files), None, "{sql}");
        }
    }

    #[test]
    fn mentioned_names_include_quoted_and_string_forms() {
        let sys = |n: &str| n.starts_with("tablix_");
        assert_eq!(
            mentioned_name("CREATE TABLE t(x REFERENCES \"TABLIX_INODE\"(ino))", sys).as_deref(),
            Some("tablix_inode")
        );
        assert_eq!(
            mentioned_name(
                "CREATE VIRTUAL TABLE f USING fts5(a, content='tablix_block')",
                sys
            )
            .as_deref(),
            Some("tablix_block")
        );
        assert_eq!(
            mentioned_name("CREATE VIEW v AS SELECT 'x' FROM t -- tablix_x", sys),
            None
        );
    }
}
