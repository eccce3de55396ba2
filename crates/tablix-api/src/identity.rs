//! Who is asking. Every request is attributed to someone before anything
//! runs:
//!
//! * over the Unix socket in the data directory, to the connecting
//!   process's credentials (`SO_PEERCRED`, groups from /proc, read when
//!   it connects);
//! * over TCP with HTTP Basic credentials, to that API user of the auth
//!   file;
//! * over loopback TCP without credentials, to the Unix user who owns the
//!   client's socket (asked of the kernel: sock_diag), so that
//!   rqlite clients on the same machine work unchanged;
//! * otherwise to nobody: the request is refused (401), unless the auth
//!   file lets anyone ask for status and readiness.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use tablix_store::Principal;

use crate::auth::{AuthFile, Perms};

/// How a connection reached the daemon; worked out once per connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The Unix socket: the connecting process's credentials.
    Unix(Local),
    /// TCP; `owner` is the Unix user owning the client's socket when the
    /// client is on this machine's loopback.
    Tcp {
        remote: SocketAddr,
        owner: Option<Local>,
        tls: bool,
    },
}

/// A local Unix user as a connection presents it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Local {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub user: Option<String>,
}

impl Peer {
    /// A Unix-socket connection from a process with these credentials:
    /// its supplementary groups are read from /proc now, while it is
    /// connected (the credentials themselves are the ones it connected
    /// with). May ask the user database: call off the async workers, or
    /// try [`Peer::unix_cached`] first.
    pub fn unix(uid: u32, gid: u32, pid: Option<i32>) -> Peer {
        Peer::unix_with(uid, gid, pid, accounts().lookup(uid, gid))
    }

    /// [`Peer::unix`] when the user database's answer is at hand.
    pub fn unix_cached(uid: u32, gid: u32, pid: Option<i32>) -> Option<Peer> {
        Some(Peer::unix_with(uid, gid, pid, accounts().cached(uid, gid)?))
    }

    fn unix_with(uid: u32, gid: u32, pid: Option<i32>, account: Account) -> Peer {
        let groups = pid.and_then(groups_of_process).unwrap_or(account.groups);
        Peer::Unix(Local {
            uid,
            gid,
            groups,
            user: account.user,
        })
    }

    /// A TCP connection from `remote` to our `local` address. May read
    /// the socket tables and ask the user database: call off the async
    /// workers, or try [`Peer::tcp_cached`] first.
    pub fn tcp(remote: SocketAddr, local: SocketAddr, tls: bool) -> Peer {
        let owner = if is_loopback(remote.ip()) {
            socket_owner(remote, local).map(|uid| owner(uid, accounts().lookup(uid, uid)))
        } else {
            None
        };
        Peer::Tcp { remote, owner, tls }
    }

    /// [`Peer::tcp`] when it needs nothing that may block: the kernel
    /// answers sock_diag at once, and the user database's answer is at
    /// hand. `None`: call [`Peer::tcp`].
    pub fn tcp_cached(remote: SocketAddr, local: SocketAddr, tls: bool) -> Option<Peer> {
        if !is_loopback(remote.ip()) {
            return Some(Peer::Tcp {
                remote,
                owner: None,
                tls,
            });
        }
        let (client, server) = (normalize(remote), normalize(local));
        let uid = crate::sock_diag::tcp_owner(client, server).ok()?;
        let account = accounts().cached(uid, uid)?;
        Some(Peer::Tcp {
            remote,
            owner: Some(owner(uid, account)),
            tls,
        })
    }
}

fn owner(uid: u32, account: Account) -> Local {
    Local {
        uid,
        gid: account.gid,
        groups: account.groups,
        user: account.user,
    }
}

/// The attributed caller of one request.
#[derive(Clone, Debug)]
pub struct Caller {
    pub principal: Principal,
    pub perms: Perms,
}

/// Why a request has no caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Credentials are needed (or were wrong): 401.
    Unauthenticated(String),
}

pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Attributes a request from `peer` carrying `authorization` (the header).
pub fn resolve(
    peer: &Peer,
    authorization: Option<&str>,
    auth: &AuthFile,
) -> Result<Caller, Refusal> {
    if let Some(header) = authorization {
        let (user, password) = basic(header).ok_or_else(|| {
            Refusal::Unauthenticated(
                "the Authorization header is not HTTP Basic user:password".into(),
            )
        })?;
        let u = auth.check(&user, &password).ok_or_else(|| {
            Refusal::Unauthenticated(format!("wrong user name or password for {user:?}"))
        })?;
        return Ok(Caller {
            principal: u.principal(),
            perms: u.perms,
        });
    }
    match peer {
        Peer::Unix(l)
        | Peer::Tcp {
            owner: Some(l), ..
        } => Ok(Caller {
            principal: Principal::named(l.uid, l.gid, l.groups.clone(), l.user.as_deref()),
            perms: Perms::local(l.uid),
        }),
        Peer::Tcp { remote, .. } => Ok(Caller {
            principal: Principal {
                name: format!("anonymous client {remote}"),
                uid: 65534,
                gid: 65534,
                groups: Vec::new(),
                raw: false,
            },
            perms: auth.anyone(),
        })
        .and_then(|c| {
            if c.perms == Perms::default() {
                Err(Refusal::Unauthenticated(format!(
                    "{remote} is not on this machine: send the user name and password of an API user (HTTP Basic)"
                )))
            } else {
                Ok(c)
            }
        }),
    }
}

fn basic(header: &str) -> Option<(String, String)> {
    let encoded = header
        .strip_prefix("Basic ")
        .or_else(|| header.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// The supplementary groups of a running process, from /proc.
fn groups_of_process(pid: i32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Groups:"))?;
    Some(
        line["Groups:".len()..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// How long a user-database answer is reused: group membership changed
/// in /etc/group (or a directory service) applies to new connections
/// within this.
const ACCOUNT_TTL: Duration = Duration::from_secs(10);

/// Entries kept at most; the cache starts over when full.
const MAX_ACCOUNTS: usize = 4096;

/// What the user database says of a uid.
#[derive(Clone, Debug)]
struct Account {
    user: Option<String>,
    gid: u32,
    groups: Vec<u32>,
}

/// User-database answers by (uid, gid asked with), so that a burst of
/// connections does not parse /etc/passwd and /etc/group (or ask a
/// directory service) for each.
#[derive(Default)]
struct Accounts {
    cache: Mutex<HashMap<(u32, u32), (Instant, Account)>>,
}

fn accounts() -> &'static Accounts {
    static ACCOUNTS: std::sync::OnceLock<Accounts> = std::sync::OnceLock::new();
    ACCOUNTS.get_or_init(Accounts::default)
}

impl Accounts {
    /// A fresh enough answer about `uid`, if one is cached.
    fn cached(&self, uid: u32, gid: u32) -> Option<Account> {
        let c = self.cache.lock().ok()?;
        let (at, a) = c.get(&(uid, gid))?;
        (at.elapsed() < ACCOUNT_TTL).then(|| a.clone())
    }

    /// `uid`'s name, primary group and groups; `gid` is the primary group
    /// to assume when the database does not know `uid`.
    fn lookup(&self, uid: u32, gid: u32) -> Account {
        if let Some(a) = self.cached(uid, gid) {
            return a;
        }
        let now = Instant::now();
        let account = account_of(uid, gid);
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= MAX_ACCOUNTS {
                c.clear();
            }
            c.insert((uid, gid), (now, account.clone()));
        }
        account
    }
}

/// Asks the user database (NSS) about `uid`.
fn account_of(uid: u32, gid: u32) -> Account {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return Account {
            user: None,
            gid,
            groups: Vec::new(),
        };
    };
    let primary = user.gid.as_raw();
    let groups = std::ffi::CString::new(user.name.clone())
        .ok()
        .and_then(|name| nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(primary)).ok())
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default();
    Account {
        user: Some(user.name),
        gid: primary,
        groups,
    }
}

fn normalize(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

/// The owner of the socket whose local address is `client` and remote
/// address `server`: both ends of a loopback connection are sockets of
/// this machine, each owned by the uid that created it. Asked of the
/// kernel by the exact addresses; where sock_diag is unavailable, found
/// in the socket tables under /proc/net instead (slower: they list every
/// socket).
fn socket_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let (client, server) = (normalize(client), normalize(server));
    match crate::sock_diag::tcp_owner(client, server) {
        Ok(uid) => return Some(uid),
        Err(crate::sock_diag::DiagError::Kernel(_)) => {
            // A client socket of the other family (an IPv6 socket speaking
            // to a mapped IPv4 address).
            if let (IpAddr::V4(c), IpAddr::V4(s)) = (client.ip(), server.ip()) {
                let c6 = SocketAddr::new(IpAddr::V6(c.to_ipv6_mapped()), client.port());
                let s6 = SocketAddr::new(IpAddr::V6(s.to_ipv6_mapped()), server.port());
                return crate::sock_diag::tcp_owner(c6, s6).ok();
            }
            return None;
        }
        Err(e) => tracing::debug!("{e}; reading /proc/net/tcp instead"),
    }
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        if let Some(uid) = find_owner(&text, client, server) {
            return Some(uid);
        }
    }
    None
}

/// Finds the uid of the socket `local` → `remote` in one socket table.
fn find_owner(text: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let l = parse_addr(f.get(1)?)?;
        let r = parse_addr(f.get(2)?)?;
        if normalize(l) == local && normalize(r) == remote {
            f.get(7)?.parse().ok()
        } else {
            None
        }
    })
}

/// An address as the socket tables write it: hex words in host byte
/// order, then the port.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes()),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                let word = u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).ok()?;
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            IpAddr::from(bytes)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_tables_parse() {
        // What a 127.0.0.1:40000 -> 127.0.0.1:4001 connection looks like,
        // both ends, on a little-endian machine.
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:9C40 0100007F:0FA1 01 00000000:00000000 00:00000000 00000000  1000        0 111 1\n\
            1: 0100007F:0FA1 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 112 1\n";
        let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let server: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(find_owner(text, client, server), Some(1000));
            assert_eq!(find_owner(text, server, client), Some(0));
        }
        let six = "0000000000000000FFFF00000100007F:9C40";
        assert_eq!(
            parse_addr(six).map(normalize),
            if cfg!(target_endian = "little") {
                Some(client)
            } else {
                parse_addr(six).map(normalize)
            }
        );
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn callers_are_attributed_or_refused() {
        let auth =
            AuthFile::parse(br#"[{"username": "bob", "password": "pw", "perms": ["query"]}]"#)
                .unwrap();
        let unix = Peer::Unix(Local {
            uid: 1000,
            gid: 1000,
            groups: vec![1000],
            user: None,
        });
        let c = resolve(&unix, None, &auth).unwrap();
        assert_eq!(c.principal.uid, 1000);
        assert!(c.perms.execute && !c.perms.raw);
        let remote = Peer::Tcp {
            remote: "10.1.2.3:5000".parse().unwrap(),
            owner: None,
            tls: true,
        };
        assert!(matches!(
            resolve(&remote, None, &auth),
            Err(Refusal::Unauthenticated(_))
        ));
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("bob:pw")
        );
        let c = resolve(&remote, Some(&basic), &auth).unwrap();
        assert_eq!(c.principal.name, "api user bob");
        assert!(c.perms.query && !c.perms.execute);
        let wrong = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("bob:no")
        );
        assert!(resolve(&unix, Some(&wrong), &auth).is_err());
        let loopback = Peer::Tcp {
            remote: "127.0.0.1:5000".parse().unwrap(),
            owner: Some(Local {
                uid: 0,
                gid: 0,
                groups: vec![0],
                user: Some("root".into()),
            }),
            tls: false,
        };
        assert!(resolve(&loopback, None, &auth).unwrap().perms.raw);
    }
}
