//! Splitting input into complete SQL statements, as sqlite3_complete() does:
//! a `;` ends a statement unless it is inside a string, identifier, comment
//! or the body of a CREATE TRIGGER (which ends at `END;`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Normal,
    Single,
    Double,
    Backtick,
    Bracket,
    LineComment,
    BlockComment,
}

/// Accumulates text and hands back each statement once it is complete.
#[derive(Debug, Default)]
pub struct Splitter {
    buf: String,
}

impl Splitter {
    pub fn new() -> Splitter {
        Splitter::default()
    }

    /// Whether text is waiting for the rest of its statement.
    pub fn is_pending(&self) -> bool {
        !self.buf.trim().is_empty()
    }

    /// Adds text (a line, with its newline, or a whole file) and returns
    /// the statements it completed, each with its terminating `;`.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while let Some(end) = statement_end(&self.buf) {
            let rest = self.buf.split_off(end);
            let stmt = std::mem::replace(&mut self.buf, rest);
            if !is_blank(&stmt) {
                out.push(stmt.trim().to_string());
            }
        }
        out
    }

    /// Takes whatever is left (input ended without a final `;`).
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        if is_blank(&rest) {
            None
        } else {
            Some(rest.trim().to_string())
        }
    }
}

/// True when `s` holds only whitespace, comments and semicolons.
fn is_blank(s: &str) -> bool {
    words(s).is_empty()
}

/// Byte offset just past the `;` that ends the first complete statement.
fn statement_end(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut state = State::Normal;
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match state {
            State::Normal => {
                if c.is_ascii_alphanumeric() || c == b'_' {
                    word.push(c.to_ascii_uppercase() as char);
                    i += 1;
                    continue;
                }
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                match c {
                    b'\'' => state = State::Single,
                    b'"' => state = State::Double,
                    b'`' => state = State::Backtick,
                    b'[' => state = State::Bracket,
                    b'-' if bytes.get(i + 1) == Some(&b'-') => {
                        state = State::LineComment;
                        i += 1;
                    }
                    b'/' if bytes.get(i + 1) == Some(&b'*') => {
                        state = State::BlockComment;
                        i += 1;
                    }
                    b';' => {
                        if !in_trigger_body(&words) {
                            return Some(i + 1);
                        }
                        words.push(";".into());
                    }
                    _ => {}
                }
            }
            State::Single if c == b'\'' => state = State::Normal,
            State::Double if c == b'"' => state = State::Normal,
            State::Backtick if c == b'`' => state = State::Normal,
            State::Bracket if c == b']' => state = State::Normal,
            State::LineComment if c == b'\n' => state = State::Normal,
            State::BlockComment if c == b'*' && bytes.get(i + 1) == Some(&b'/') => {
                state = State::Normal;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether a `;` after `words` is inside a CREATE TRIGGER body.
fn in_trigger_body(words: &[String]) -> bool {
    let mut it = words.iter().map(String::as_str).filter(|w| *w != ";");
    if it.next() != Some("CREATE") {
        return false;
    }
    let mut next = it.next();
    if matches!(next, Some("TEMP" | "TEMPORARY")) {
        next = it.next();
    }
    if next != Some("TRIGGER") {
        return false;
    }
    // The body has started (BEGIN seen) and the last word is not END.
    words.iter().any(|w| w == "BEGIN") && words.last().map(String::as_str) != Some("END")
}

/// The upper-cased words of `s` outside strings and comments.
pub(crate) fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut state = State::Normal;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match state {
            State::Normal => {
                if c.is_ascii_alphanumeric() || c == b'_' {
                    word.push(c.to_ascii_uppercase() as char);
                } else {
                    if !word.is_empty() {
                        out.push(std::mem::take(&mut word));
                    }
                    match c {
                        b'\'' => state = State::Single,
                        b'"' => state = State::Double,
                        b'`' => state = State::Backtick,
                        b'[' => state = State::Bracket,
                        b'-' if bytes.get(i + 1) == Some(&b'-') => state = State::LineComment,
                        b'/' if bytes.get(i + 1) == Some(&b'*') => {
                            state = State::BlockComment;
                            i += 1;
                        }
                        b';' => {}
                        _ if !c.is_ascii_whitespace() => out.push((c as char).to_string()),
                        _ => {}
                    }
                }
            }
            State::Single if c == b'\'' => state = State::Normal,
            State::Double if c == b'"' => state = State::Normal,
            State::Backtick if c == b'`' => state = State::Normal,
            State::Bracket if c == b']' => state = State::Normal,
            State::LineComment if c == b'\n' => state = State::Normal,
            State::BlockComment if c == b'*' && bytes.get(i + 1) == Some(&b'/') => {
                state = State::Normal;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_semicolons_outside_strings_and_comments() {
        let mut s = Splitter::new();
        assert_eq!(
            s.push("SELECT 'a;b', \"c;d\", [e;f]; -- x;y\nSELECT 2 /* ; */;\n"),
            ["SELECT 'a;b', \"c;d\", [e;f];", "-- x;y\nSELECT 2 /* ; */;"]
        );
        assert!(!s.is_pending());
        assert!(s.push("SELECT\n").is_empty());
        assert!(s.is_pending());
        assert_eq!(s.push("1;"), ["SELECT\n1;"]);
        assert_eq!(s.push("SELECT 'it''s';"), ["SELECT 'it''s';"]);
        assert!(s.push("SELECT 3").is_empty());
        assert_eq!(s.finish().as_deref(), Some("SELECT 3"));
        assert_eq!(s.push(";;  -- only a comment\n"), Vec::<String>::new());
    }

    #[test]
    fn trigger_bodies_end_at_end() {
        let mut s = Splitter::new();
        let t = "CREATE TRIGGER g AFTER INSERT ON t BEGIN\n  INSERT INTO u VALUES (1);\n  DELETE FROM v;\nEND;";
        assert!(s.push(&t[..40]).is_empty());
        assert_eq!(
            s.push(&format!("{}\nSELECT 1;", &t[40..])),
            [t.to_string(), "SELECT 1;".to_string()]
        );
        let mut s = Splitter::new();
        assert_eq!(
            s.push("CREATE TEMP TRIGGER x BEFORE DELETE ON t BEGIN SELECT 1; END; SELECT 2;")
                .len(),
            2
        );
    }
}
