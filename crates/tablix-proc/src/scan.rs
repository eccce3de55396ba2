//! Reading tasks from /proc.

use std::path::Path;

use crate::op::ProcInfo;

/// Clock ticks per second in /proc times (USER_HZ, 100 on every Linux ABI).
const TICKS_PER_SECOND: i64 = 100;

/// When the machine booted, in Unix nanoseconds (from /proc/stat's btime).
pub fn boot_unix_ns() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    let secs: i64 = line[6..].trim().parse().ok()?;
    Some(secs * 1_000_000_000)
}

fn ids(status: &str, key: &str) -> (Option<u32>, Option<u32>) {
    let Some(line) = status.lines().find(|l| l.starts_with(key)) else {
        return (None, None);
    };
    let mut it = line[key.len()..].split_whitespace().map(|v| v.parse().ok());
    (it.next().flatten(), it.next().flatten())
}

/// Reads task `tid` of process `tgid`; None if it is gone.
pub fn read_task(tgid: u32, tid: u32, boot_ns: Option<i64>) -> Option<ProcInfo> {
    let dir = Path::new("/proc")
        .join(tgid.to_string())
        .join("task")
        .join(tid.to_string());
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // comm is in parentheses and may itself contain ") "; fields after the
    // last ')' are space-separated: state is field 3, ppid 4, starttime 22.
    let close = stat.rfind(')')?;
    let comm = stat.find('(').map(|open| stat[open + 1..close].to_string());
    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ppid = rest.get(1).and_then(|v| v.parse().ok());
    let start_ns = match (rest.get(19).and_then(|v| v.parse::<i64>().ok()), boot_ns) {
        (Some(ticks), Some(boot)) => Some(boot + ticks * (1_000_000_000 / TICKS_PER_SECOND)),
        _ => None,
    };
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    let (uid, euid) = ids(&status, "Uid:");
    let (gid, egid) = ids(&status, "Gid:");
    let proc_dir = Path::new("/proc").join(tgid.to_string());
    let exe = std::fs::read_link(proc_dir.join("exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let cmdline = std::fs::read(proc_dir.join("cmdline")).ok().map(|raw| {
        let trimmed = raw.strip_suffix(&[0]).unwrap_or(&raw);
        String::from_utf8_lossy(trimmed).replace('\0', " ")
    });
    // A task being reaped while it is read shows ppid 0 and empty fields:
    // the kernel reports its parent only while its pid is attached. Its
    // directory is gone once the pid is detached, so a task still there
    // after the reads was whole during them; one that is gone yields
    // nothing rather than a half-dead snapshot (its exit event follows).
    if !dir.exists() {
        return None;
    }
    Some(ProcInfo {
        pid: tid,
        tgid,
        ppid,
        uid,
        euid,
        gid,
        egid,
        comm,
        exe,
        cmdline,
        start_ns,
    })
}

fn numeric_entries(dir: &Path) -> Vec<u32> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Every task (processes and their threads) now in /proc.
pub fn scan_all(boot_ns: Option<i64>) -> Vec<ProcInfo> {
    let mut out = Vec::new();
    for tgid in numeric_entries(Path::new("/proc")) {
        let tasks = numeric_entries(&Path::new("/proc").join(tgid.to_string()).join("task"));
        for tid in tasks {
            if let Some(info) = read_task(tgid, tid, boot_ns) {
                out.push(info);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let info = read_task(me, me, boot_unix_ns()).expect("own task");
        assert_eq!(info.tgid, me);
        assert_eq!(info.uid, Some(nix_uid()));
        assert!(info.start_ns.is_some_and(|s| s > 1_600_000_000_000_000_000));
        assert!(scan_all(None).iter().any(|i| i.pid == me));
    }

    #[test]
    fn a_task_reaped_while_it_is_read_yields_nothing_rather_than_ppid_zero() {
        // The kernel reports ppid 0 for a task whose pid is detached while
        // its stat file is read; about one read race in 25 hits it here.
        let me = std::process::id();
        for _ in 0..400 {
            let mut child = std::process::Command::new("true")
                .spawn()
                .expect("spawn true");
            let pid = child.id();
            let reader = std::thread::spawn(move || {
                let mut seen = Vec::new();
                while let Some(info) = read_task(pid, pid, None) {
                    seen.push(info.ppid);
                }
                seen
            });
            child.wait().expect("wait");
            let seen = reader.join().expect("reader");
            assert!(
                seen.iter().all(|p| *p == Some(me)),
                "pid {pid} was read with parents {seen:?}, not {me}"
            );
        }
    }

    fn nix_uid() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        ids(&status, "Uid:").0.unwrap()
    }
}
