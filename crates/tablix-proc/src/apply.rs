//! Deterministic application of process-table batches.

use rusqlite::{Connection, params};

use crate::op::{ProcEvent, ProcInfo, ProcOp};

/// Applies `op` inside the caller's transaction on the memory database.
///
/// Every op leaves at most `keep_exited` exited rows (the newest), so only
/// an op that marked rows exited can leave more: the others skip the
/// trim, which steps over `keep_exited` index entries. (3,000 processes
/// started one after another took 258-291 ms of the daemon's CPU, against
/// 288-308 ms when every op trimmed.)
pub fn apply(conn: &Connection, op: &ProcOp) -> rusqlite::Result<()> {
    if op.reset {
        conn.execute("DELETE FROM processes", [])?;
    }
    // Rows this op marked exited.
    let mut exited = 0;
    for event in &op.events {
        match event {
            ProcEvent::Seen(info) => seen(conn, info, false)?,
            ProcEvent::Exec(info) => seen(conn, info, true)?,
            ProcEvent::Fork {
                pid,
                tgid,
                parent,
                parent_tgid,
                at_ns,
            } => exited += fork(conn, *pid, *tgid, *parent, *parent_tgid, *at_ns)?,
            ProcEvent::Uid { pid, uid, euid } => {
                conn.prepare_cached(
                    "UPDATE processes SET uid = ?2, euid = ?3 WHERE pid = ?1 AND exit_ns IS NULL",
                )?
                .execute(params![pid, uid, euid])?;
            }
            ProcEvent::Gid { pid, gid, egid } => {
                conn.prepare_cached(
                    "UPDATE processes SET gid = ?2, egid = ?3 WHERE pid = ?1 AND exit_ns IS NULL",
                )?
                .execute(params![pid, gid, egid])?;
            }
            ProcEvent::Comm { pid, comm } => {
                conn.prepare_cached(
                    "UPDATE processes SET comm = ?2 WHERE pid = ?1 AND exit_ns IS NULL",
                )?
                .execute(params![pid, comm])?;
            }
            ProcEvent::Exit { pid, at_ns, status } => {
                // wait(2) status: exit code in bits 8..15, or the signal in
                // bits 0..6.
                let (code, signal) = match status {
                    Some(s) if s & 0x7f == 0 => (Some((s >> 8) & 0xff), None),
                    Some(s) => (None, Some(s & 0x7f)),
                    None => (None, None),
                };
                exited += conn
                    .prepare_cached(
                        "UPDATE processes SET exit_ns = ?2, exit_code = ?3, exit_signal = ?4
                         WHERE pid = ?1 AND exit_ns IS NULL",
                    )?
                    .execute(params![pid, at_ns, code, signal])?;
            }
        }
    }
    if exited == 0 && !op.reset {
        return Ok(());
    }
    conn.prepare_cached(
        "DELETE FROM processes WHERE id IN (
             SELECT id FROM processes WHERE exit_ns IS NOT NULL
             ORDER BY exit_ns DESC, id DESC LIMIT -1 OFFSET ?1)",
    )?
    .execute([op.keep_exited])?;
    Ok(())
}

fn seen(conn: &Connection, i: &ProcInfo, exec: bool) -> rusqlite::Result<()> {
    let updated = conn
        .prepare_cached(
            "UPDATE processes SET tgid = ?2, ppid = coalesce(?3, ppid), uid = coalesce(?4, uid),
                 euid = coalesce(?5, euid), gid = coalesce(?6, gid), egid = coalesce(?7, egid),
                 comm = coalesce(?8, comm), exe = CASE WHEN ?12 THEN ?9 ELSE coalesce(?9, exe) END,
                 cmdline = CASE WHEN ?12 THEN ?10 ELSE coalesce(?10, cmdline) END,
                 start_ns = coalesce(start_ns, ?11)
             WHERE pid = ?1 AND exit_ns IS NULL",
        )?
        .execute(params![
            i.pid, i.tgid, i.ppid, i.uid, i.euid, i.gid, i.egid, i.comm, i.exe, i.cmdline,
            i.start_ns, exec
        ])?;
    if updated == 0 {
        conn.prepare_cached(
            "INSERT INTO processes(pid, tgid, ppid, uid, euid, gid, egid, comm, exe, cmdline, start_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?
        .execute(params![
            i.pid, i.tgid, i.ppid, i.uid, i.euid, i.gid, i.egid, i.comm, i.exe, i.cmdline,
            i.start_ns
        ])?;
    }
    Ok(())
}

/// Returns how many rows it marked exited (a stale row of the pid).
fn fork(
    conn: &Connection,
    pid: u32,
    tgid: u32,
    parent: u32,
    parent_tgid: u32,
    at_ns: i64,
) -> rusqlite::Result<usize> {
    // A live row for this pid is stale: that task's exit was missed.
    let stale = conn
        .prepare_cached("UPDATE processes SET exit_ns = ?2 WHERE pid = ?1 AND exit_ns IS NULL")?
        .execute(params![pid, at_ns])?;
    // A new process's parent is the forking process; a new thread's is
    // its process's parent. The task inherits the forking thread's
    // credentials and names, or, when that thread has no row (it started
    // between the scan and the first event), its process's.
    let is_thread = pid != tgid;
    let copied = conn
        .prepare_cached(
            "INSERT INTO processes(pid, tgid, ppid, uid, euid, gid, egid, comm, exe, cmdline, start_ns)
             SELECT ?1, ?2, CASE WHEN ?5 THEN ppid ELSE ?4 END, uid, euid, gid, egid, comm, exe,
                    cmdline, ?6
             FROM processes WHERE pid IN (?3, ?4) AND exit_ns IS NULL
             ORDER BY pid = ?3 DESC LIMIT 1",
        )?
        .execute(params![pid, tgid, parent, parent_tgid, is_thread, at_ns])?;
    if copied == 0 {
        conn.prepare_cached(
            "INSERT INTO processes(pid, tgid, ppid, start_ns) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![pid, tgid, parent_tgid, at_ns])?;
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SCHEMA;

    fn info(pid: u32, comm: &str) -> ProcInfo {
        ProcInfo {
            pid,
            tgid: pid,
            ppid: Some(1),
            uid: Some(1000),
            euid: Some(1000),
            gid: Some(100),
            egid: Some(100),
            comm: Some(comm.into()),
            exe: Some(format!("/bin/{comm}")),
            cmdline: Some(comm.into()),
            start_ns: Some(5),
        }
    }

    fn op(events: Vec<ProcEvent>, keep: u32) -> ProcOp {
        ProcOp {
            reset: false,
            events,
            keep_exited: keep,
        }
    }

    /// A process table holding only `task`.
    fn table_with(task: ProcInfo) -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        apply(&c, &op(vec![ProcEvent::Seen(task)], 2)).unwrap();
        c
    }

    #[test]
    fn fork_exec_exit_and_bounded_history() {
        let c = table_with(info(10, "sh"));
        let fork = |pid, tgid, parent| ProcEvent::Fork {
            pid,
            tgid,
            parent,
            parent_tgid: 10,
            at_ns: 7,
        };
        apply(&c, &op(vec![fork(11, 11, 10), fork(12, 10, 10)], 2)).unwrap();
        apply(&c, &op(vec![ProcEvent::Exec(info(11, "sort"))], 2)).unwrap();
        let row = |pid: u32| -> (u32, Option<u32>, String, Option<i64>) {
            c.query_row(
                "SELECT tgid, ppid, comm, exit_code FROM processes WHERE pid = ?1 ORDER BY id DESC",
                [pid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap()
        };
        assert_eq!(row(11), (11, Some(1), "sort".into(), None));
        // The thread shares its process's id and parent.
        assert_eq!(row(12), (10, Some(1), "sh".into(), None));
        let handler: u32 = c
            .query_row(
                "SELECT tgid FROM processes WHERE pid = 12 AND exit_ns IS NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(handler, 10);
        let exit = |pid, at_ns, status| ProcEvent::Exit {
            pid,
            at_ns,
            status: Some(status),
        };
        apply(&c, &op(vec![exit(11, 8, 3 << 8), exit(12, 9, 9)], 2)).unwrap();
        assert_eq!(row(11).3, Some(3));
        let sig: i64 = c
            .query_row(
                "SELECT exit_signal FROM processes WHERE pid = 12",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(sig, 9);
        // A third exit pushes the oldest out of the history of two.
        apply(&c, &op(vec![exit(10, 10, 0)], 2)).unwrap();
        let pids: Vec<u32> = c
            .prepare("SELECT pid FROM processes ORDER BY pid")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(pids, vec![10, 12]);
    }

    #[test]
    fn a_fork_from_a_thread_without_a_row_inherits_its_processs_credentials() {
        let c = table_with(info(10, "make"));
        // Thread 15 of process 10 was never seen; it forks 16, then a
        // fork with no known parent at all makes 17.
        let fork = |pid, parent, parent_tgid| ProcEvent::Fork {
            pid,
            tgid: pid,
            parent,
            parent_tgid,
            at_ns: 7,
        };
        apply(&c, &op(vec![fork(16, 15, 10), fork(17, 40, 40)], 2)).unwrap();
        let row = |pid: u32| -> (Option<u32>, Option<u32>, Option<u32>, Option<String>) {
            c.query_row(
                "SELECT ppid, uid, egid, comm FROM processes WHERE pid = ?1",
                [pid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap()
        };
        assert_eq!(
            row(16),
            (Some(10), Some(1000), Some(100), Some("make".into()))
        );
        assert_eq!(row(17), (Some(40), None, None, None));
    }

    /// Ops of forks (some of live pids: their exits were missed), execs
    /// and exits, one to three to an op, leave the table as applying each
    /// op and then always trimming it would.
    #[test]
    fn skipping_the_trim_leaves_the_table_as_trimming_after_every_op_would() {
        const SEED: u64 = 0x5eed_0f7a;
        const KEEP: u32 = 5;
        const TRIM: &str = "DELETE FROM processes WHERE id IN (
             SELECT id FROM processes WHERE exit_ns IS NOT NULL
             ORDER BY exit_ns DESC, id DESC LIMIT -1 OFFSET ?1)";
        let mut state = SEED;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        let ours = Connection::open_in_memory().unwrap();
        let model = Connection::open_in_memory().unwrap();
        for c in [&ours, &model] {
            c.execute_batch(SCHEMA).unwrap();
        }
        let rows = |c: &Connection| -> Vec<(i64, u32, Option<i64>)> {
            c.prepare("SELECT id, pid, exit_ns FROM processes ORDER BY id")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        for step in 0..600_i64 {
            let events = (0..=next(3))
                .map(|_| {
                    let pid = 100 + next(12) as u32;
                    match next(3) {
                        0 => ProcEvent::Fork {
                            pid,
                            tgid: pid,
                            parent: 1,
                            parent_tgid: 1,
                            at_ns: step,
                        },
                        1 => ProcEvent::Exec(info(pid, "x")),
                        _ => ProcEvent::Exit {
                            pid,
                            at_ns: step,
                            status: Some(0),
                        },
                    }
                })
                .collect();
            let op = op(events, KEEP);
            apply(&ours, &op).unwrap();
            apply(&model, &op).unwrap();
            model.execute(TRIM, [KEEP]).unwrap();
            assert_eq!(
                rows(&ours),
                rows(&model),
                "seed {SEED:#x}, op {step}: {:?}",
                op.events
            );
        }
        let exited: u32 = ours
            .query_row(
                "SELECT count(*) FROM processes WHERE exit_ns IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(exited, KEEP, "the history filled up and stayed bounded");
    }
}
