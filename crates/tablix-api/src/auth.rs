//! API users, in rqlite's auth-file format:
//!
//! ```json
//! [
//!   {"username": "bob", "password": "secret1", "perms": ["all"]},
//!   {"username": "mary", "password": "$2a$10$...", "perms": ["query", "status"], "uid": 1000},
//!   {"username": "*", "perms": ["status", "ready"]}
//! ]
//! ```
//!
//! Passwords are plain or bcrypt hashes, as rqlite takes them. tablix adds
//! the permission `raw` (read tablix's raw system tables; `all` includes
//! it) and optional `uid`/`gid`: the Unix credentials the user's SQL is
//! judged by when it looks at files, pipes and processes (default nobody,
//! 65534). `*` stands for requests without credentials; since no request
//! may be anonymous, it can grant only `status` and `ready`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use serde::Deserialize;
use tablix_store::Principal;

/// What a caller may do, by rqlite's permission names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    pub execute: bool,
    pub query: bool,
    pub load: bool,
    pub backup: bool,
    pub snapshot: bool,
    pub status: bool,
    pub ready: bool,
    pub join: bool,
    pub join_read_only: bool,
    pub remove: bool,
    pub leader_ops: bool,
    /// Read tablix's raw system tables (tablix's own permission).
    pub raw: bool,
}

impl Perms {
    /// Everything rqlite's `all` grants, and raw reads.
    pub fn all() -> Perms {
        Perms {
            execute: true,
            query: true,
            load: true,
            backup: true,
            snapshot: true,
            status: true,
            ready: true,
            join: true,
            join_read_only: true,
            remove: true,
            leader_ops: true,
            raw: true,
        }
    }

    /// What a local Unix user may do: everything but raw reads, which are
    /// root's.
    pub fn local(uid: u32) -> Perms {
        Perms {
            raw: uid == 0,
            ..Perms::all()
        }
    }

    fn grant(&mut self, name: &str) -> Result<(), String> {
        match name {
            "all" => *self = Perms::all(),
            "execute" => self.execute = true,
            "query" => self.query = true,
            "load" => self.load = true,
            "backup" => self.backup = true,
            "snapshot" => self.snapshot = true,
            "status" => self.status = true,
            "ready" => self.ready = true,
            "join" => self.join = true,
            "join-read-only" => self.join_read_only = true,
            "remove" => self.remove = true,
            "leader-ops" => self.leader_ops = true,
            "raw" => self.raw = true,
            other => {
                return Err(format!(
                    "unknown permission {other:?}; known: all, execute, query, load, backup, snapshot, status, ready, join, join-read-only, remove, leader-ops, raw"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    username: String,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    perms: Vec<String>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

/// One API user.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    password: String,
    pub perms: Perms,
    pub uid: u32,
    pub gid: u32,
}

impl User {
    /// The principal this user's SQL runs as.
    pub fn principal(&self) -> Principal {
        Principal {
            name: format!("api user {}", self.name),
            uid: self.uid,
            gid: self.gid,
            groups: Vec::new(),
            raw: self.perms.raw,
        }
    }
}

/// The API users of a daemon.
#[derive(Debug, Default)]
pub struct AuthFile {
    users: HashMap<String, User>,
    /// What requests without credentials may do (`*`).
    anyone: Perms,
    /// Password checks that succeeded: bcrypt is slow on purpose, and every
    /// request carries the password.
    verified: Mutex<HashMap<(String, String), ()>>,
}

const NOBODY: u32 = 65534;
const MAX_VERIFIED: usize = 1024;

impl AuthFile {
    pub fn load(path: &Path) -> Result<AuthFile, String> {
        let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        AuthFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &[u8]) -> Result<AuthFile, String> {
        let entries: Vec<Entry> = serde_json::from_slice(text)
            .map_err(|e| format!("not an rqlite auth file (a JSON list of users): {e}"))?;
        let mut out = AuthFile::default();
        for e in entries {
            let mut perms = Perms::default();
            for p in &e.perms {
                perms
                    .grant(p)
                    .map_err(|m| format!("user {:?}: {m}", e.username))?;
            }
            if e.username == "*" {
                if perms
                    != (Perms {
                        status: perms.status,
                        ready: perms.ready,
                        ..Perms::default()
                    })
                {
                    return Err(
                        "user \"*\" (requests without credentials) may be granted only status and ready: no request that reads or changes data is anonymous".into(),
                    );
                }
                out.anyone = perms;
                continue;
            }
            let Some(password) = e.password else {
                return Err(format!("user {:?} has no password", e.username));
            };
            if e.username.is_empty() || e.username.contains(':') {
                return Err(format!(
                    "user name {:?} is empty or contains ':'",
                    e.username
                ));
            }
            let user = User {
                name: e.username.clone(),
                password,
                perms,
                uid: e.uid.unwrap_or(NOBODY),
                gid: e.gid.or(e.uid).unwrap_or(NOBODY),
            };
            if out.users.insert(e.username.clone(), user).is_some() {
                return Err(format!("user {:?} appears twice", e.username));
            }
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// What requests without credentials may do.
    pub fn anyone(&self) -> Perms {
        self.anyone
    }

    /// The user `name` if `password` is theirs.
    pub fn check(&self, name: &str, password: &str) -> Option<&User> {
        let user = self.users.get(name)?;
        let key = (name.to_string(), password.to_string());
        if let Ok(v) = self.verified.lock()
            && v.contains_key(&key)
        {
            return Some(user);
        }
        let ok = if user.password.starts_with("$2") {
            bcrypt::verify(password, &user.password).unwrap_or(false)
        } else {
            constant_time_eq(user.password.as_bytes(), password.as_bytes())
        };
        if !ok {
            return None;
        }
        if let Ok(mut v) = self.verified.lock() {
            if v.len() >= MAX_VERIFIED {
                v.clear();
            }
            v.insert(key, ());
        }
        Some(user)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rqlite_files_parse_and_passwords_check() {
        let hash = bcrypt::hash("hashed-secret", 4).unwrap();
        let text = format!(
            r#"[
              {{"username": "bob", "password": "secret1", "perms": ["all"]}},
              {{"username": "mary", "password": "{hash}", "perms": ["query", "status"], "uid": 1000}},
              {{"username": "*", "perms": ["status", "ready"]}}
            ]"#
        );
        let a = AuthFile::parse(text.as_bytes()).unwrap();
        let bob = a.check("bob", "secret1").unwrap();
        assert!(bob.perms.execute && bob.perms.raw);
        assert!(a.check("bob", "secret2").is_none());
        assert!(a.check("nobody", "secret1").is_none());
        let mary = a.check("mary", "hashed-secret").unwrap();
        assert!(mary.perms.query && !mary.perms.execute && !mary.perms.raw);
        assert_eq!((mary.uid, mary.gid), (1000, 1000));
        assert_eq!(mary.principal().uid, 1000);
        assert!(a.check("mary", "hashed-secret").is_some(), "cached");
        assert!(a.check("mary", "wrong").is_none());
        assert!(a.anyone().ready && !a.anyone().query);
    }

    #[test]
    fn bad_files_are_refused_with_reasons() {
        for (text, want) in [
            ("{", "not an rqlite auth file"),
            (
                r#"[{"username": "a", "perms": ["all"]}]"#,
                "has no password",
            ),
            (
                r#"[{"username": "a", "password": "p", "perms": ["fly"]}]"#,
                "unknown permission \"fly\"",
            ),
            (
                r#"[{"username": "*", "perms": ["query"]}]"#,
                "only status and ready",
            ),
            (
                r#"[{"username": "a", "password": "p"}, {"username": "a", "password": "q"}]"#,
                "appears twice",
            ),
            (
                r#"[{"username": "a", "password": "p", "role": "x"}]"#,
                "unknown field",
            ),
        ] {
            let e = AuthFile::parse(text.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
