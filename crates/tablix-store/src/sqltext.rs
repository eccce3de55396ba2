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

/// What a token's span holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Word,
    /// A quoted identifier, closed by this byte.
    Quoted(u8),
    Str,
    Punct,
    Other,
}

/// One token's place in the text: `from..to` is its text, inside its
/// quotes for a quoted one (doubled quote characters still doubled).
#[derive(Clone, Copy, Debug)]
struct Span {
    kind: Kind,
    from: usize,
    to: usize,
}

/// The tokens of a text as spans, whitespace and comments dropped. An
/// unterminated string, identifier or comment runs to the end.
struct Spans<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Spans<'a> {
    fn new(sql: &'a str) -> Spans<'a> {
        Spans {
            b: sql.as_bytes(),
            i: 0,
        }
    }
}

impl Iterator for Spans<'_> {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        let b = self.b;
        let mut i = self.i;
        let span = loop {
            let Some(&c) = b.get(i) else {
                self.i = i;
                return None;
            };
            let from = i;
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
                    i += 1;
                    let inside = i;
                    let end = loop {
                        if i >= b.len() {
                            break i;
                        }
                        if b[i] == close {
                            // Doubled quotes escape themselves (not in [...]).
                            if close != b']' && b.get(i + 1) == Some(&close) {
                                i += 2;
                                continue;
                            }
                            i += 1;
                            break i - 1;
                        }
                        i += 1;
                    };
                    let kind = if c == b'\'' {
                        Kind::Str
                    } else {
                        Kind::Quoted(close)
                    };
                    break Span {
                        kind,
                        from: inside,
                        to: end,
                    };
                }
                b'x' | b'X' if b.get(i + 1) == Some(&b'\'') => {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i = (i + 1).min(b.len());
                    break Span {
                        kind: Kind::Other,
                        from,
                        to: i,
                    };
                }
                b'?' | b':' | b'@' | b'$' => {
                    i += 1;
                    while i < b.len() && (is_id_char(b[i]) || b[i] == b':') {
                        i += 1;
                    }
                    break Span {
                        kind: Kind::Other,
                        from,
                        to: i,
                    };
                }
                c if c.is_ascii_digit()
                    || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
                {
                    while i < b.len() && (is_id_char(b[i]) || b[i] == b'.') {
                        // An exponent's sign belongs to the number.
                        if (b[i] == b'e' || b[i] == b'E')
                            && matches!(b.get(i + 1), Some(b'+' | b'-'))
                        {
                            i += 1;
                        }
                        i += 1;
                    }
                    break Span {
                        kind: Kind::Other,
                        from,
                        to: i,
                    };
                }
                c if is_id_start(c) => {
                    while i < b.len() && is_id_char(b[i]) {
                        i += 1;
                    }
                    break Span {
                        kind: Kind::Word,
                        from,
                        to: i,
                    };
                }
                _ => {
                    i += 1;
                    break Span {
                        kind: Kind::Punct,
                        from,
                        to: i,
                    };
                }
            }
        };
        self.i = i;
        Some(span)
    }
}

/// Appends `span`'s text to `out`: unquoted, and lower-cased unless it is
/// a string literal's.
fn push_text(out: &mut String, sql: &[u8], span: Span) {
    let raw = &sql[span.from..span.to];
    let start = out.len();
    match span.kind {
        Kind::Quoted(close) if close != b']' => push_undoubled(out, raw, close),
        Kind::Str => push_undoubled(out, raw, b'\''),
        _ => out.push_str(&String::from_utf8_lossy(raw)),
    }
    if span.kind != Kind::Str {
        out[start..].make_ascii_lowercase();
    }
}

/// Appends `raw` with each doubled `quote` taken as one.
fn push_undoubled(out: &mut String, raw: &[u8], quote: u8) {
    let mut rest = raw;
    let mut bytes = Vec::new();
    while let Some(at) = rest.iter().position(|&b| b == quote) {
        bytes.extend_from_slice(&rest[..=at]);
        rest = rest.get(at + 2..).unwrap_or_default();
    }
    if bytes.is_empty() {
        out.push_str(&String::from_utf8_lossy(raw));
    } else {
        bytes.extend_from_slice(rest);
        out.push_str(&String::from_utf8_lossy(&bytes));
    }
}

/// Splits `sql` into tokens (whitespace and comments dropped). An
/// unterminated string, identifier or comment runs to the end.
pub(crate) fn tokens(sql: &str) -> Vec<Token> {
    let b = sql.as_bytes();
    Spans::new(sql)
        .map(|span| {
            let text = || {
                let mut s = String::new();
                push_text(&mut s, b, span);
                s
            };
            match span.kind {
                Kind::Word => Token::Word(text()),
                Kind::Quoted(_) => Token::Quoted(text()),
                Kind::Str => Token::Str(text()),
                Kind::Punct => Token::Punct(b[span.from] as char),
                Kind::Other => Token::Other,
            }
        })
        .collect()
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
///
/// The writer asks this of every user statement it runs, so it reads the
/// text in place: one buffer, reused for each name.
pub(crate) fn mentioned_name(sql: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    let b = sql.as_bytes();
    let (mut name, mut lower) = (String::new(), String::new());
    for span in Spans::new(sql) {
        if !matches!(span.kind, Kind::Word | Kind::Quoted(_) | Kind::Str) {
            continue;
        }
        name.clear();
        push_text(&mut name, b, span);
        // A string is compared lower-cased and named as written.
        let key = if span.kind == Kind::Str {
            lower.clear();
            lower.push_str(&name);
            lower.make_ascii_lowercase();
            &lower
        } else {
            &name
        };
        if matches(key) {
            return Some(name);
        }
    }
    None
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
    fn a_mentioned_name_is_read_unquoted_and_a_string_is_named_as_written() {
        let named = |sql: &str, name: &str| mentioned_name(sql, |n| n == name);
        assert_eq!(
            named("SELECT * FROM \"Pro\"\"c\"", "pro\"c").as_deref(),
            Some("pro\"c")
        );
        assert_eq!(named("SELECT 'It''S'", "it's").as_deref(), Some("It'S"));
        assert_eq!(
            named("SELECT [a]]b]", "a").as_deref(),
            Some("a"),
            "no doubling in [...]"
        );
        assert_eq!(
            named("SELECT * FROM `Unclosed", "unclosed").as_deref(),
            Some("unclosed")
        );
        assert_eq!(named("SELECT x -- y\n, /* y */ z", "y"), None);
        assert_eq!(named("SELECT x'79', :y, 1e+5y", "y"), None);
        assert_eq!(
            named("SELECT caf\u{e9} FROM t", "caf\u{e9}").as_deref(),
            Some("caf\u{e9}")
        );
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
