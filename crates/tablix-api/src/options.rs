//! URL query options, as rqlite names them.

/// Read consistency asked for. A single node serves every level from its
/// latest committed state, which satisfies all of them; a cluster node
/// waits as `cluster::before_read` says.
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
    /// The interactive transaction the request's statements run in (its
    /// id, as `BEGIN` answered).
    pub tx: Option<String>,
    /// rqlite's `db_timeout`: a tighter time limit for this request's
    /// statements than the daemon's (never a looser one).
    pub db_timeout: Option<std::time::Duration>,
    /// rqlite's `freshness`: how long ago a follower may last have heard
    /// from the leader and still serve a `level=none` read.
    pub freshness: Option<std::time::Duration>,
    /// rqlite's `freshness_strict`: also refuse while entries are not
    /// applied yet.
    pub freshness_strict: bool,
}

/// Options rqlite defines that tablix takes without acting on them here:
/// `redirect` is acted on before the handler (`cluster::redirect`); the
/// rest are queueing and timeouts a tablix node does not have.
const ACCEPTED: &[&str] = &[
    "redirect",
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

/// A Go-style duration, as rqlite's options take them: "500ms", "2s",
/// "1m30s", "1.5h".
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    if s.is_empty() {
        return Err("expected a duration such as 2s or 500ms".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?} lacks a unit (ns, us, ms, s, m or h)"))?;
        let n: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?} is not a duration such as 2s or 500ms"))?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("unknown unit {other:?} in {s:?}")),
        };
        total += n * scale;
        rest = &rest[unit..];
    }
    std::time::Duration::try_from_secs_f64(total).map_err(|e| format!("{s:?}: {e}"))
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
                "tx" => {
                    if value.is_empty() {
                        return Err(
                            "option tx needs the transaction's id, as BEGIN answered it".into()
                        );
                    }
                    o.tx = Some(value.clone())
                }
                "db_timeout" => {
                    o.db_timeout = Some(
                        duration(value).map_err(|e| format!("option db_timeout={value:?}: {e}"))?,
                    )
                }
                "freshness" => {
                    let d =
                        duration(value).map_err(|e| format!("option freshness={value:?}: {e}"))?;
                    o.freshness = (!d.is_zero()).then_some(d);
                }
                "freshness_strict" => o.freshness_strict = flag(name, value)?,
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
                        "unknown option {unknown:?}; known options: transaction, timings, associative, pretty, blob_array, level, freshness, freshness_strict, q, db_timeout, {}",
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
        assert_eq!(
            parse(&[("tx", "ab12")]).unwrap().tx.as_deref(),
            Some("ab12")
        );
        assert!(parse(&[("tx", "")]).unwrap_err().contains("id"));
        let o = parse(&[("db_timeout", "1m30s")]).unwrap();
        assert_eq!(o.db_timeout, Some(std::time::Duration::from_secs(90)));
        assert_eq!(
            parse(&[("db_timeout", "250ms")]).unwrap().db_timeout,
            Some(std::time::Duration::from_millis(250))
        );
        let o = parse(&[("freshness", "1s"), ("freshness_strict", "")]).unwrap();
        assert_eq!(o.freshness, Some(std::time::Duration::from_secs(1)));
        assert!(o.freshness_strict);
        assert_eq!(parse(&[("freshness", "0s")]).unwrap().freshness, None);
        assert!(
            parse(&[("freshness", "soon")])
                .unwrap_err()
                .contains("freshness")
        );
        for bad in ["5", "2 s", "1x", "", "-1s"] {
            assert!(
                parse(&[("db_timeout", bad)])
                    .unwrap_err()
                    .contains("db_timeout"),
                "{bad}"
            );
        }
    }
}
