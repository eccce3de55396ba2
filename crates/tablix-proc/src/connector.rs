//! The kernel's process events through the netlink proc connector.

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_CONNECTOR};

/// The connector's process-events channel (linux/connector.h).
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

/// proc_event's `what` (linux/cn_proc.h).
const EV_NONE: u32 = 0;
const EV_FORK: u32 = 0x1;
const EV_EXEC: u32 = 0x2;
const EV_UID: u32 = 0x4;
const EV_GID: u32 = 0x40;
const EV_COMM: u32 = 0x200;
const EV_EXIT: u32 = 0x8000_0000;

/// One decoded kernel event; times are nanoseconds since boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelEvent {
    Fork {
        parent: u32,
        parent_tgid: u32,
        pid: u32,
        tgid: u32,
        at: u64,
    },
    Exec {
        pid: u32,
        tgid: u32,
    },
    Uid {
        pid: u32,
        ruid: u32,
        euid: u32,
    },
    Gid {
        pid: u32,
        rgid: u32,
        egid: u32,
    },
    Comm {
        pid: u32,
        comm: String,
    },
    Exit {
        pid: u32,
        status: u32,
        at: u64,
    },
    /// The kernel's answer to our subscription; non-zero is an errno.
    Ack(u32),
}

pub(crate) struct Connector {
    socket: Socket,
    buf: Vec<u8>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Connector {
    /// Subscribes to process events. Fails (EPERM) without CAP_NET_ADMIN
    /// in the initial namespaces.
    pub(crate) fn open() -> io::Result<Connector> {
        let mut socket = Socket::new(NETLINK_CONNECTOR)?;
        socket.bind(&SocketAddr::new(0, CN_IDX_PROC))?;
        let _ = socket.set_rx_buf_sz(4 << 20);
        let mut msg = Vec::with_capacity(NLMSG_HDR + CN_MSG + 4);
        let total = (NLMSG_HDR + CN_MSG + 4) as u32;
        msg.extend_from_slice(&total.to_ne_bytes());
        msg.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&std::process::id().to_ne_bytes());
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&4u16.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        socket.send(&msg, 0)?;
        Ok(Connector {
            socket,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    /// Whether events actually arrive: the kernel may accept the
    /// subscription and still send nothing (outside the initial pid and
    /// user namespaces). Starts a short-lived child and waits up to
    /// `within` for its exit to be reported; other events seen meanwhile
    /// are dropped (the caller seeds from /proc afterwards).
    pub(crate) fn probe(&mut self, within: std::time::Duration) -> io::Result<bool> {
        let child = std::process::Command::new("true").spawn()?;
        let pid = child.id();
        let mut child = child;
        child.wait()?;
        self.socket.set_non_blocking(true)?;
        let deadline = std::time::Instant::now() + within;
        let mut seen = false;
        while !seen && std::time::Instant::now() < deadline {
            match self.next() {
                Ok(events) => {
                    seen = events
                        .iter()
                        .any(|e| matches!(e, KernelEvent::Exit { pid: p, .. } if *p == pid));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) if e.raw_os_error() == Some(105) => {}
                Err(e) => return Err(e),
            }
        }
        self.socket.set_non_blocking(false)?;
        Ok(seen)
    }

    /// Blocks for the next datagram and decodes the events in it.
    /// ENOBUFS means events were dropped (the caller rescans /proc).
    pub(crate) fn next(&mut self) -> io::Result<Vec<KernelEvent>> {
        self.buf.clear();
        let n = self.socket.recv(&mut self.buf, 0)?;
        Ok(decode(&self.buf[..n]))
    }
}

/// Decodes the netlink messages of one datagram.
pub(crate) fn decode(mut b: &[u8]) -> Vec<KernelEvent> {
    let mut out = Vec::new();
    while b.len() >= NLMSG_HDR {
        let Some(len) = u32_at(b, 0).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDR || len > b.len() {
            break;
        }
        if let Some(ev) = decode_event(&b[NLMSG_HDR..len]) {
            out.push(ev);
        }
        let aligned = (len + 3) & !3;
        b = &b[aligned.min(b.len())..];
    }
    out
}

fn decode_event(cn: &[u8]) -> Option<KernelEvent> {
    if u32_at(cn, 0)? != CN_IDX_PROC || u32_at(cn, 4)? != CN_VAL_PROC {
        return None;
    }
    let ev = cn.get(CN_MSG..)?;
    let what = u32_at(ev, 0)?;
    let at = u64_at(ev, 8)?;
    let d = ev.get(16..)?;
    Some(match what {
        EV_NONE => KernelEvent::Ack(u32_at(d, 0)?),
        EV_FORK => KernelEvent::Fork {
            parent: u32_at(d, 0)?,
            parent_tgid: u32_at(d, 4)?,
            pid: u32_at(d, 8)?,
            tgid: u32_at(d, 12)?,
            at,
        },
        EV_EXEC => KernelEvent::Exec {
            pid: u32_at(d, 0)?,
            tgid: u32_at(d, 4)?,
        },
        EV_UID => KernelEvent::Uid {
            pid: u32_at(d, 0)?,
            ruid: u32_at(d, 8)?,
            euid: u32_at(d, 12)?,
        },
        EV_GID => KernelEvent::Gid {
            pid: u32_at(d, 0)?,
            rgid: u32_at(d, 8)?,
            egid: u32_at(d, 12)?,
        },
        EV_COMM => {
            let raw = d.get(8..24)?;
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            KernelEvent::Comm {
                pid: u32_at(d, 0)?,
                comm: String::from_utf8_lossy(&raw[..end]).into_owned(),
            }
        }
        EV_EXIT => KernelEvent::Exit {
            pid: u32_at(d, 0)?,
            status: u32_at(d, 8)?,
            at,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(what: u32, at: u64, data: &[u32]) -> Vec<u8> {
        let mut ev = Vec::new();
        ev.extend_from_slice(&what.to_ne_bytes());
        ev.extend_from_slice(&0u32.to_ne_bytes());
        ev.extend_from_slice(&at.to_ne_bytes());
        for d in data {
            ev.extend_from_slice(&d.to_ne_bytes());
        }
        let mut cn = Vec::new();
        for v in [CN_IDX_PROC, CN_VAL_PROC, 0, 0] {
            cn.extend_from_slice(&v.to_ne_bytes());
        }
        cn.extend_from_slice(&(ev.len() as u16).to_ne_bytes());
        cn.extend_from_slice(&0u16.to_ne_bytes());
        cn.extend_from_slice(&ev);
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR + cn.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        m.extend_from_slice(&cn);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    #[test]
    fn decodes_fork_and_exit() {
        let mut b = message(EV_FORK, 77, &[10, 10, 11, 11]);
        b.extend(message(EV_EXIT, 78, &[11, 11, 256, 17, 10, 10]));
        b.extend(message(0x1234, 1, &[1, 2]));
        assert_eq!(
            decode(&b),
            vec![
                KernelEvent::Fork {
                    parent: 10,
                    parent_tgid: 10,
                    pid: 11,
                    tgid: 11,
                    at: 77
                },
                KernelEvent::Exit {
                    pid: 11,
                    status: 256,
                    at: 78
                },
            ]
        );
        // Truncated input decodes to nothing rather than failing.
        assert!(decode(&b[..10]).is_empty());
    }
}
