//! The owner of one TCP socket, asked of the kernel by its addresses
//! (netlink `SOCK_DIAG_BY_FAMILY`, the interface `ss` uses).
//!
//! A lookup by the exact four-tuple is a hash probe in the kernel: its
//! cost does not grow with the number of sockets, unlike reading the text
//! tables under /proc/net, which list every socket (thousands in TIME_WAIT
//! after a burst of short connections) on every connection accepted.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, sockopt,
};

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLM_F_REQUEST`: a request, not a dump.
const NLM_F_REQUEST: u16 = 1;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// `INET_DIAG_NOCOOKIE`: match the socket by its addresses only.
const NO_COOKIE: u32 = u32::MAX;
/// Length of `struct nlmsghdr`.
const HEADER: usize = 16;
/// Length of `struct inet_diag_req_v2`.
const REQUEST: usize = 56;
/// Offset of `idiag_uid` in `struct inet_diag_msg`: family, state,
/// timer, retrans (4), the socket id (48), expires, rqueue, wqueue (12).
const UID_AT: usize = 64;
/// How long the kernel may take to answer.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Why the kernel could not say.
#[derive(Debug)]
pub(crate) enum DiagError {
    /// The netlink socket failed (no sock_diag support, a sandbox).
    Io(nix::Error),
    /// The kernel answered with an error (ENOENT: no such socket).
    Kernel(i32),
    /// An answer this code does not understand.
    Malformed,
}

impl std::fmt::Display for DiagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiagError::Io(e) => write!(f, "netlink sock_diag: {e}"),
            DiagError::Kernel(errno) => write!(
                f,
                "sock_diag: {}",
                nix::errno::Errno::from_raw(*errno).desc()
            ),
            DiagError::Malformed => write!(f, "sock_diag: an answer of unknown form"),
        }
    }
}

/// The uid owning the TCP socket whose local address is `local` and
/// remote address `remote`. Uses one netlink socket per thread, kept
/// open; an answer to an earlier request that timed out is skipped by
/// its sequence number.
pub(crate) fn tcp_owner(local: SocketAddr, remote: SocketAddr) -> Result<u32, DiagError> {
    thread_local! {
        static SOCKET: RefCell<Option<OwnedFd>> = const { RefCell::new(None) };
        static SEQUENCE: Cell<u32> = const { Cell::new(0) };
    }
    let seq = SEQUENCE.with(|s| {
        let n = s.get().wrapping_add(1);
        s.set(n);
        n
    });
    SOCKET.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(open().map_err(DiagError::Io)?);
        }
        let fd = slot.as_ref().ok_or(DiagError::Malformed)?;
        let r = ask(fd, seq, local, remote);
        if matches!(r, Err(DiagError::Io(_))) {
            // Start afresh next time.
            *slot = None;
        }
        r
    })
}

fn open() -> nix::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    let timeout = nix::sys::time::TimeVal::new(TIMEOUT.as_secs() as i64, 0);
    socket::setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)?;
    Ok(fd)
}

fn ask(fd: &OwnedFd, seq: u32, local: SocketAddr, remote: SocketAddr) -> Result<u32, DiagError> {
    let request = encode(seq, local, remote);
    socket::sendto(
        fd.as_raw_fd(),
        &request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(DiagError::Io)?;
    let mut answer = [0u8; 512];
    loop {
        let n =
            socket::recv(fd.as_raw_fd(), &mut answer, MsgFlags::empty()).map_err(DiagError::Io)?;
        let answer = &answer[..n];
        if sequence(answer) == Some(seq) {
            return decode(answer);
        }
    }
}

/// The request message: a header and `inet_diag_req_v2` naming the socket.
fn encode(seq: u32, local: SocketAddr, remote: SocketAddr) -> Vec<u8> {
    let family = match (local.ip(), remote.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET as u8,
        _ => libc::AF_INET6 as u8,
    };
    let mut m = Vec::with_capacity(HEADER + REQUEST);
    m.extend_from_slice(&((HEADER + REQUEST) as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.push(family);
    m.push(libc::IPPROTO_TCP as u8);
    m.push(0); // no extensions
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state
    // struct inet_diag_sockid: ports and addresses in network order.
    m.extend_from_slice(&local.port().to_be_bytes());
    m.extend_from_slice(&remote.port().to_be_bytes());
    m.extend_from_slice(&address(local.ip(), family));
    m.extend_from_slice(&address(remote.ip(), family));
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    m.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    debug_assert_eq!(m.len(), HEADER + REQUEST);
    m
}

/// An address as `inet_diag_sockid` holds it: 16 bytes, an IPv4 address
/// in the first four.
fn address(ip: IpAddr, family: u8) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) if family == libc::AF_INET as u8 => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V4(v4) => out = v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

/// The sequence number an answer carries.
fn sequence(answer: &[u8]) -> Option<u32> {
    let b = answer.get(8..12)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn decode(answer: &[u8]) -> Result<u32, DiagError> {
    let word = |at: usize| -> Result<u32, DiagError> {
        let bytes = answer.get(at..at + 4).ok_or(DiagError::Malformed)?;
        Ok(u32::from_ne_bytes(
            bytes.try_into().map_err(|_| DiagError::Malformed)?,
        ))
    };
    let kind = answer
        .get(4..6)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .ok_or(DiagError::Malformed)?;
    match kind {
        NLMSG_ERROR => Err(DiagError::Kernel(-(word(HEADER)? as i32))),
        SOCK_DIAG_BY_FAMILY => word(HEADER + UID_AT),
        _ => Err(DiagError::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn finds_the_owner_of_a_loopback_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let me = nix::unistd::geteuid().as_raw();
        let local = client.local_addr().expect("addr");
        let remote = client.peer_addr().expect("addr");
        assert_eq!(tcp_owner(local, remote).expect("sock_diag lookup"), me);
        // The server's end is a socket too, with the same owner.
        let s_local = server.local_addr().expect("addr");
        let s_remote = server.peer_addr().expect("addr");
        assert_eq!(tcp_owner(s_local, s_remote).expect("sock_diag lookup"), me);
    }

    #[test]
    fn no_such_socket_is_an_error_not_an_owner() {
        let a: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:2".parse().expect("addr");
        match tcp_owner(a, b) {
            Err(DiagError::Kernel(e)) => assert_eq!(e, libc::ENOENT),
            other => panic!("unexpected answer for a socket that does not exist: {other:?}"),
        }
    }

    #[test]
    fn request_layout() {
        let m = encode(
            7,
            "127.0.0.1:40000".parse().expect("addr"),
            "127.0.0.1:4001".parse().expect("addr"),
        );
        assert_eq!(m.len(), 72);
        assert_eq!(sequence(&m), Some(7));
        assert_eq!(&m[24..26], &40000u16.to_be_bytes());
        assert_eq!(&m[26..28], &4001u16.to_be_bytes());
        assert_eq!(&m[28..32], &[127, 0, 0, 1]);
        assert_eq!(&m[44..48], &[127, 0, 0, 1]);
        assert_eq!(&m[64..72], &[0xff; 8]);
    }
}
