//! Who a request runs as, and what that lets them see.
//!
//! Every user statement carries a [`Principal`]: the Unix credentials it is
//! judged by (a local client's own, or those an API user is mapped to) and
//! whether it may read tablix's raw system tables. The rules here are the
//! kernel's: [`Principal::may`] is the permission check of a disk file
//! system (`generic_permission`, with root's capabilities), and
//! [`Principal::may_inspect`] the check /proc applies before showing a
//! task's private fields (ptrace's read access).

use serde::{Deserialize, Serialize};

/// Unix credentials and rights of one request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Principal {
    /// For messages and logs: "uid 1000 (alice)", "api user bob".
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// May read tablix's raw system tables (`tablix_*`, the memory
    /// database): root, and API users granted it.
    pub raw: bool,
}

/// access(2)'s mask bits, as [`Principal::may`] takes them.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

impl Principal {
    /// A local Unix user, known by peer credentials. Only root reads raw
    /// system tables.
    pub fn local(uid: u32, gid: u32, groups: Vec<u32>) -> Principal {
        Principal::named(uid, gid, groups, nix_user_name(uid).as_deref())
    }

    /// [`Principal::local`] whose user name the caller looked up.
    pub fn named(uid: u32, gid: u32, groups: Vec<u32>, user: Option<&str>) -> Principal {
        let name = match user {
            Some(n) => format!("uid {uid} ({n})"),
            None => format!("uid {uid}"),
        };
        Principal {
            name,
            uid,
            gid,
            groups,
            raw: uid == 0,
        }
    }

    /// Root, for tablix's own tools and tests.
    pub fn root() -> Principal {
        Principal {
            name: "uid 0 (root)".into(),
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            raw: true,
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether this principal may access a file of `mode`, owned by
    /// `uid`:`gid`, for `mask` (MAY_READ | MAY_WRITE | MAY_EXEC). Root may
    /// do anything except execute a non-directory without an x bit.
    pub fn may(&self, mode: u32, uid: u32, gid: u32, mask: u32) -> bool {
        let mask = mask & 0o7;
        if self.is_root() {
            let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
            return mask & MAY_EXEC == 0 || is_dir || mode & 0o111 != 0;
        }
        let granted = if self.uid == uid {
            (mode >> 6) & 0o7
        } else if self.in_group(gid) {
            (mode >> 3) & 0o7
        } else {
            mode & 0o7
        };
        granted & mask == mask
    }

    /// Whether this principal may see a task's private fields (its exe,
    /// and everything when /proc hides other users' tasks): root, or real
    /// and effective ids all equal to the caller's.
    pub fn may_inspect(&self, uid: u32, euid: u32, gid: u32, egid: u32) -> bool {
        self.is_root()
            || (uid == self.uid && euid == self.uid && gid == self.gid && egid == self.gid)
    }
}

/// The user name of `uid`, if the passwd database has one.
fn nix_user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        f.next()?;
        let id: u32 = f.next()?.parse().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Principal {
        Principal {
            name: String::new(),
            uid,
            gid,
            groups: groups.to_vec(),
            raw: false,
        }
    }

    #[test]
    fn permission_checks_follow_the_mode_bits() {
        const DIR: u32 = libc::S_IFDIR;
        const FILE: u32 = libc::S_IFREG;
        let alice = user(1000, 1000, &[50]);
        let cases = [
            // (mode, owner, group, mask, allowed)
            (FILE | 0o600, 1000, 1, MAY_READ, true),
            (FILE | 0o600, 1001, 1000, MAY_READ, false),
            (FILE | 0o060, 1001, 50, MAY_READ | MAY_WRITE, true),
            (FILE | 0o604, 1000, 1, MAY_READ, true),
            // The owner class decides, even when "other" would allow.
            (FILE | 0o007, 1000, 1, MAY_READ, false),
            (DIR | 0o711, 0, 0, MAY_EXEC, true),
            (DIR | 0o700, 0, 0, MAY_EXEC, false),
            (DIR | 0o750, 0, 50, MAY_EXEC, true),
        ];
        for (mode, uid, gid, mask, want) in cases {
            assert_eq!(
                alice.may(mode, uid, gid, mask),
                want,
                "{mode:o} {uid}:{gid} {mask}"
            );
        }
        let root = Principal::root();
        assert!(root.may(FILE, 5, 5, MAY_READ | MAY_WRITE), "mode 000");
        assert!(root.may(DIR, 5, 5, MAY_EXEC), "mode 000");
        assert!(!root.may(FILE | 0o644, 5, 5, MAY_EXEC));
        assert!(root.may(FILE | 0o100, 5, 5, MAY_EXEC));
    }

    #[test]
    fn inspection_needs_matching_ids_or_root() {
        let alice = user(1000, 1000, &[]);
        assert!(alice.may_inspect(1000, 1000, 1000, 1000));
        // A set-user-ID program run by alice runs as someone else.
        assert!(!alice.may_inspect(1000, 0, 1000, 1000));
        assert!(!alice.may_inspect(1001, 1001, 1001, 1001));
        assert!(Principal::root().may_inspect(1, 2, 3, 4));
        assert!(Principal::local(0, 0, vec![]).raw);
        assert!(!Principal::local(1000, 1000, vec![]).raw);
    }
}
