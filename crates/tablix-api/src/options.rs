//! URL query options, as rqlite names them.

/// Read consistency asked for. A single node serves every level from its
/// latest committed state, which satisfies all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Level {
    None,
    #[default]
    Weak,
    Strong,
    Linearizable,
    Auto,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub transaction: bool,
    pub timings: bool,
    pub associative: bool,
    pub pretty: bool,
    pub blob_array: bool,
    pub level: Level,
    /// The statement of a `GET /db/query?q=...`.
    pub q: Option<String>,
}

/// Options rqlite defines that do not change what a single node does
/// (clustering, queueing and timeouts); accepted so rqlite clients work.
const ACCEPTED: &[&str] = &[
    "redirect",
    "freshness",
    "freshness_strict",
    "db_timeout",
    "timeout",
    "queue",
    "wait",
    "raft_index",
    "sync",
    "noleader",
    "nonvoters",
    "ver",
    "linearizable_timeout",
    "retries",
];

fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "" | "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        other => Err(format!("option {name}={other:?}: expected true or false")),
    }
}

impl Options {
    pub fn parse(pairs: &[(String, String)]) -> Result<Options, String> {
        let mut o = Options::default();
        for (name, value) in pairs {
            match name.as_str() {
                "transaction" => o.transaction = flag(name, value)?,
                "timings" => o.timings = flag(name, value)?,
                "associative" => o.associative = flag(name, value)?,
                "pretty" => o.pretty = flag(name, value)?,
                "blob_array" => o.blob_array = flag(name, value)?,
                "q" => o.q = Some(value.clone()),
                "level" => {
                    o.level = match value.as_str() {
                        "none" => Level::None,
                        "weak" | "" => Level::Weak,
                        "strong" => Level::Strong,
                        "linearizable" => Level::Linearizable,
                        "auto" => Level::Auto,
                        other => {
                            return Err(format!(
                                "option level={other:?}: expected none, weak, strong, linearizable or auto"
                            ));
                        }
                    }
                }
                known if ACCEPTED.contains(&known) => {}
                unknown => {
                    return Err(format!(
                        "unknown option {unknown:?}; known options: transaction, timings, associative, pretty, blob_array, level, q, {}",
                        ACCEPTED.join(", ")
                    ));
                }
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Options, String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        Options::parse(&owned)
    }

    #[test]
    fn flags_levels_and_unknowns() {
        let o = parse(&[
            ("transaction", ""),
            ("timings", "true"),
            ("level", "strong"),
            ("redirect", ""),
        ])
        .unwrap();
        assert!(o.transaction && o.timings && !o.associative);
        assert_eq!(o.level, Level::Strong);
        assert!(
            parse(&[("level", "eventual")])
                .unwrap_err()
                .contains("level")
        );
        assert!(
            parse(&[("timings", "maybe")])
                .unwrap_err()
                .contains("expected true or false")
        );
        assert!(
            parse(&[("transacton", "")])
                .unwrap_err()
                .contains("unknown option \"transacton\"")
        );
    }
}
