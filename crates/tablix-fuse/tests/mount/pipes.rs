//! Database-backed pipes on a real mount: `MOUNT/.tablix/pipes/NAME`,
//! with the behaviours of Linux pipes and FIFOs.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tablix_testkit::command::Limited;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tablix_store::Durability;

use crate::harness::{Fixture, errno_of, mount, require_fuse};

const CAPACITY: usize = 65_536;
/// Record size of the stress test: PIPE_BUF, so each write is atomic.
const RECORD: usize = 4096;

fn pipes_dir(f: &Fixture) -> PathBuf {
    f.root.join(".tablix").join("pipes")
}

/// Creates the named pipe `name` as `tablix pipe create` does.
fn create(f: &Fixture, name: &str) -> PathBuf {
    let p = pipes_dir(f).join(name);
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .expect("create a pipe");
    p
}

/// Opens both ends; each open waits for the other, as with a FIFO.
fn ends(p: &Path) -> (File, File) {
    let rp = p.to_path_buf();
    let reader = std::thread::spawn(move || File::open(rp).expect("open read end"));
    let w = OpenOptions::new()
        .write(true)
        .open(p)
        .expect("open write end");
    (reader.join().expect("reader thread"), w)
}

fn nonblocking(p: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}

/// The row of `pipes` for `name`: (buffered, total_in, total_out, readers, writers).
fn row(f: &Fixture, name: &str) -> (i64, i64, i64, i64, i64) {
    let store = f.store.as_ref().expect("a store");
    store
        .read_volatile(|c| {
            c.query_row(
                "SELECT buffered, bytes_in, bytes_out, readers, writers FROM pipe WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
        })
        .expect("store")
        .expect("a row for the pipe")
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn with_mount(name: &str, body: impl FnOnce(&Fixture)) {
    require_fuse(name);
    let f = mount(Durability::Sync);
    body(&f);
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn named_pipes_are_created_listed_opened_like_fifos_and_removed() {
    with_mount("named_pipes", |f| {
        let dir = pipes_dir(f);
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
        let p = create(f, "jobs");
        // It exists now: O_EXCL fails, and it is listed.
        let again = OpenOptions::new().write(true).create_new(true).open(&p);
        assert_eq!(errno_of(again), libc::EEXIST);
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["jobs"]);
        // Names are file names: too long is ENAMETOOLONG; nothing else
        // can be made here.
        let long = dir.join("x".repeat(256));
        assert_eq!(errno_of(File::create(long)), libc::ENAMETOOLONG);
        assert_eq!(errno_of(fs::create_dir(dir.join("d"))), libc::EPERM);
        assert_eq!(errno_of(fs::write(f.path(".tablix/x"), b"")), libc::EPERM);
        assert_eq!(errno_of(fs::remove_dir(f.path(".tablix"))), libc::EPERM);
        // A blocking open for reading waits for a writer.
        let rp = p.clone();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut r = File::open(rp).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 100];
            // A short read: what is there, not the 100 asked for.
            let n = r.read(&mut buf).unwrap();
            let first = buf[..n].to_vec();
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).unwrap();
            (first, rest)
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "open did not wait"
        );
        // A non-blocking open for writing works now that a reader is there.
        let mut w = OpenOptions::new().write(true).open(&p).unwrap();
        rx.recv_timeout(Duration::from_secs(5))
            .expect("reader open");
        w.write_all(b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        w.write_all(b" world").unwrap();
        drop(w);
        let (first, rest) = reader.join().unwrap();
        assert_eq!(first, b"hello");
        assert_eq!(rest, b" world", "then end of file once the writer closed");
        wait_for("both ends released", || row(f, "jobs").3 == 0);
        assert_eq!(row(f, "jobs"), (0, 11, 11, 0, 0));
        // Without a reader, a non-blocking open for writing is ENXIO.
        assert_eq!(errno_of(nonblocking(&p, true)), libc::ENXIO);
        // Not seekable, and reported with the size a pipe can hold.
        let (mut r, _w) = ends(&p);
        use std::io::Seek;
        assert_eq!(errno_of(r.seek(std::io::SeekFrom::Start(0))), libc::ESPIPE);
        assert!(fs::metadata(&p).unwrap().file_type().is_file());
        drop((r, _w));
        fs::remove_file(&p).unwrap();
        assert_eq!(errno_of(File::open(&p)), libc::ENOENT);
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn one_blocked_reader_is_woken_per_write_and_readers_go_in_order() {
    with_mount("one_reader_woken", |f| {
        let p = create(f, "q");
        let (r, mut w) = ends(&p);
        let r = Arc::new(r);
        let (tx, rx) = mpsc::channel();
        for id in 0..2 {
            let (r, tx) = (Arc::clone(&r), tx.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16];
                let n = (&*r).read(&mut buf).unwrap();
                tx.send((id, buf[..n].to_vec())).unwrap();
            });
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(rx.try_recv().is_err(), "a read of an empty pipe returned");
        w.write_all(b"a").unwrap();
        let (_, got) = rx.recv_timeout(Duration::from_secs(5)).expect("one reader");
        assert_eq!(got, b"a");
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "one byte woke two readers"
        );
        w.write_all(b"b").unwrap();
        let (_, got) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the other reader");
        assert_eq!(got, b"b");
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn capacity_nonblocking_io_and_atomic_small_writes() {
    with_mount("capacity", |f| {
        let p = create(f, "cap");
        let (r, _w) = ends(&p);
        let mut wn = nonblocking(&p, true).unwrap();
        let mut rn = nonblocking(&p, false).unwrap();
        let mut buf = [0u8; 10];
        assert_eq!(errno_of(rn.read(&mut buf)), libc::EAGAIN);
        // Fill the pipe: a large non-blocking write goes in partially.
        let n = wn.write(&vec![7u8; CAPACITY - 100]).unwrap();
        assert_eq!(n, CAPACITY - 100);
        // 100 bytes free: a PIPE_BUF write is all or nothing...
        assert_eq!(errno_of(wn.write(&[1u8; 4096])), libc::EAGAIN);
        // ...a larger one takes what fits...
        assert_eq!(wn.write(&[2u8; 5000]).unwrap(), 100);
        // ...and a full pipe takes nothing.
        assert_eq!(errno_of(wn.write(&[3u8; 1])), libc::EAGAIN);
        assert_eq!(row(f, "cap").0, CAPACITY as i64);
        // A blocking write of more than the capacity waits for readers
        // and arrives whole and in order.
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let expect = big.clone();
        let mut wb = OpenOptions::new().write(true).open(&p).unwrap();
        let writer = std::thread::spawn(move || wb.write_all(&big).map(|()| big.len()));
        let mut all = Vec::new();
        let mut r = r;
        while all.len() < CAPACITY + expect.len() {
            let mut chunk = vec![0u8; 8192];
            let n = r.read(&mut chunk).unwrap();
            assert!(n > 0);
            all.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(writer.join().unwrap().unwrap(), expect.len());
        assert!(all[..CAPACITY - 100].iter().all(|&b| b == 7));
        assert!(all[CAPACITY - 100..CAPACITY].iter().all(|&b| b == 2));
        assert_eq!(&all[CAPACITY..], &expect[..]);
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn capacity_is_an_extended_attribute_like_f_setpipe_sz() {
    with_mount("capacity_xattr", |f| {
        let p = create(f, "big");
        let attr = std::ffi::OsStr::from_bytes(tablix_fuse::CAPACITY_XATTR);
        assert_eq!(xattr::get(&p, attr).unwrap().unwrap(), b"65536");
        assert!(xattr::list(&p).unwrap().any(|n| n == attr));
        xattr::set(&p, attr, b"131072").unwrap();
        let (_r, _w) = ends(&p);
        let mut wn = nonblocking(&p, true).unwrap();
        assert_eq!(wn.write(&vec![1u8; 200_000]).unwrap(), 131_072);
        assert_eq!(row(f, "big").0, 131_072);
        // Not below what is buffered, not nonsense.
        let err = |v: &[u8]| xattr::set(&p, attr, v).unwrap_err().raw_os_error();
        assert_eq!(err(b"65536"), Some(libc::EBUSY));
        assert_eq!(err(b"lots"), Some(libc::EINVAL));
        assert_eq!(err(b"100"), Some(libc::EINVAL));
        let other = std::ffi::OsStr::new("user.other");
        assert_eq!(
            xattr::set(&p, other, b"x").unwrap_err().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn poll_select_and_epoll_report_readiness() {
    with_mount("poll", |f| {
        let p = create(f, "ready");
        let (r, mut w) = ends(&p);
        let ready = |file: &File, ev: PollFlags, ms: u16| -> PollFlags {
            let mut fds = [PollFd::new(file.as_fd(), ev)];
            poll(&mut fds, PollTimeout::from(ms)).unwrap();
            fds[0].revents().unwrap_or(PollFlags::empty())
        };
        assert!(!ready(&r, PollFlags::POLLIN, 50).contains(PollFlags::POLLIN));
        assert!(ready(&w, PollFlags::POLLOUT, 50).contains(PollFlags::POLLOUT));
        // A poller blocked in epoll_wait is woken by a write.
        let epoll = Epoll::new(EpollCreateFlags::empty()).unwrap();
        epoll
            .add(&r, EpollEvent::new(EpollFlags::EPOLLIN, 1))
            .unwrap();
        let waiter = std::thread::spawn(move || {
            let mut events = [EpollEvent::empty(); 1];
            let n = epoll
                .wait(&mut events, EpollTimeout::from(5000u16))
                .unwrap();
            (n, events[0].data())
        });
        std::thread::sleep(Duration::from_millis(100));
        w.write_all(b"x").unwrap();
        assert_eq!(waiter.join().unwrap(), (1, 1), "epoll_wait was not woken");
        assert!(ready(&r, PollFlags::POLLIN, 50).contains(PollFlags::POLLIN));
        // A full pipe is not writable.
        let mut wn = nonblocking(&p, true).unwrap();
        while wn.write(&[0u8; 4096]).is_ok() {}
        assert!(!ready(&w, PollFlags::POLLOUT, 50).contains(PollFlags::POLLOUT));
        // Every write end closed: the read end reports hang-up.
        drop((w, wn));
        wait_for("writers gone", || row(f, "ready").4 == 0);
        assert!(ready(&r, PollFlags::POLLIN, 50).contains(PollFlags::POLLHUP));
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn broken_pipe_raises_sigpipe_and_eof_follows_the_last_writer() {
    with_mount("broken_pipe", |f| {
        let p = create(f, "broken");
        // A writer process whose reader goes away dies of SIGPIPE, as
        // `yes | head -1` relies on.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "(head -c 5 > /dev/null) < {p} & yes > {p}; echo \"writer status $?\"",
                p = p.display()
            ))
            .output_limited();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("writer status 141"),
            "yes was not killed by SIGPIPE: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // With SIGPIPE ignored the write fails with EPIPE instead.
        let (r, mut w) = ends(&p);
        drop(r);
        wait_for("reader gone", || row(f, "broken").3 == 0);
        // (The test harness ignores SIGPIPE, as Rust programs do.)
        assert_eq!(errno_of(w.write(b"x")), libc::EPIPE);
        drop(w);
        // A process that dies holding the only write end: the reader sees
        // what it wrote, then end of file.
        let rp = p.clone();
        let reader = std::thread::spawn(move || fs::read(rp).unwrap());
        let wf = OpenOptions::new().write(true).open(&p).unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("printf last; exec sleep 60")
            .stdout(Stdio::from(wf))
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        child.kill().unwrap();
        child.wait().unwrap();
        // Nothing is left from the `yes` above: a pipe nobody has open
        // drops its bytes, as a Linux FIFO does.
        let got = reader.join().unwrap();
        assert!(
            got == b"last",
            "read {} bytes: {:?}",
            got.len(),
            &got[..got.len().min(16)]
        );
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn signals_interrupt_blocked_reads_and_killed_readers_release_their_end() {
    with_mount("signals", |f| {
        let p = create(f, "sig");
        let (r, _w) = ends(&p);
        let flag = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGUSR1, Arc::clone(&flag)).unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            tx.send(nix::sys::pthread::pthread_self()).unwrap();
            let mut buf = [0u8; 4];
            (&r).read(&mut buf).map_err(|e| e.raw_os_error())
        });
        let thread = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        nix::sys::pthread::pthread_kill(thread, nix::sys::signal::Signal::SIGUSR1).unwrap();
        let got = reader.join().unwrap();
        assert_eq!(got, Err(Some(libc::EINTR)));
        assert!(flag.load(Ordering::SeqCst), "the handler ran");
        wait_for("the interrupted reader's end released", || {
            row(f, "sig").3 == 0
        });
        // A reader killed while blocked does not hang and lets go of its end.
        let before = 0;
        let mut cat = Command::new("cat")
            .arg(&p)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("cat's read end", || row(f, "sig").3 == before + 1);
        std::thread::sleep(Duration::from_millis(100));
        cat.kill().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while cat.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "a killed blocked reader hangs");
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_for("cat's end released", || row(f, "sig").3 == before);
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn cloexec_is_honoured() {
    with_mount("cloexec", |f| {
        let p = create(f, "ce");
        let _w = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        use nix::fcntl::{FcntlArg, OFlag, fcntl, open};
        for (flags, want) in [(OFlag::O_CLOEXEC, true), (OFlag::empty(), false)] {
            let r = open(&p, OFlag::O_RDONLY | flags, nix::sys::stat::Mode::empty()).unwrap();
            let fd = fcntl(&r, FcntlArg::F_GETFD).unwrap();
            assert_eq!(fd & libc::FD_CLOEXEC != 0, want);
        }
    });
}

fn record(writer: u32, seq: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(RECORD);
    v.extend_from_slice(&writer.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = writer.wrapping_mul(0x9e37_79b9) ^ seq.wrapping_mul(0x85eb_ca6b) | 1;
    while v.len() < RECORD {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.push(x as u8);
    }
    v
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn many_pipes_readers_and_writers_across_processes_lose_and_duplicate_nothing() {
    with_mount("stress", |f| {
        const PIPES: usize = 4;
        const WRITERS: u32 = 3;
        const READERS: usize = 2;
        const COUNT: u32 = 200;
        // The workers are dd processes: with bs=RECORD a writer issues one
        // write per record (its input is a regular file, so every read is
        // whole) and a reader one read per record, and dd counts the reads
        // that came back short ("N+M records in").
        let scratch = tempfile::tempdir().unwrap();
        let dd = |input: &Path, output: &Path| {
            Command::new("dd")
                .arg(format!("if={}", input.display()))
                .arg(format!("of={}", output.display()))
                .arg(format!("bs={RECORD}"))
                .arg("conv=notrunc")
                .env("LC_ALL", "C")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run dd")
        };
        let mut readers = Vec::new();
        let mut writers = Vec::new();
        let mut holders = Vec::new();
        for i in 0..PIPES {
            let name = format!("stress{i}");
            let p = create(f, &name);
            for r in 0..READERS {
                let out = scratch.path().join(format!("read{i}.{r}"));
                readers.push((i, dd(&p, &out), out));
            }
            // A write end held until every writer is done, so that the
            // readers' end of file comes after all of them (a FIFO's
            // readers see end of file whenever no writer is open).
            holders.push(OpenOptions::new().write(true).open(&p).unwrap());
            wait_for("readers open", || row(f, &name).3 == READERS as i64);
            for wr in 0..WRITERS {
                let id = i as u32 * 100 + wr;
                let input = scratch.path().join(format!("write{id}"));
                let records: Vec<u8> = (0..COUNT).flat_map(|seq| record(id, seq)).collect();
                fs::write(&input, records).unwrap();
                writers.push(dd(&input, &p));
            }
        }
        for w in writers {
            let out = w.wait_with_output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "writer: {log}");
            assert!(
                log.contains(&format!("{COUNT}+0 records out")),
                "a writer wrote other than whole records: {log}"
            );
        }
        drop(holders);
        let mut seen = std::collections::HashMap::<(usize, u32), Vec<u32>>::new();
        for (pipe, r, path) in readers {
            let out = r.wait_with_output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "reader: {log}");
            // Writes are whole records and reads ask for one, so every read
            // returns exactly one record.
            assert!(
                log.lines().any(|l| l.ends_with("+0 records in")),
                "a record was split between readers: {log}"
            );
            let got = fs::read(&path).unwrap();
            assert_eq!(got.len() % RECORD, 0, "a reader got a partial record");
            let mut last = std::collections::HashMap::<u32, u32>::new();
            for rec in got.chunks(RECORD) {
                let writer = u32::from_le_bytes(rec[0..4].try_into().unwrap());
                let seq = u32::from_le_bytes(rec[4..8].try_into().unwrap());
                assert_eq!(rec, record(writer, seq), "corrupt record {writer}/{seq}");
                assert_eq!(writer as usize / 100, pipe, "a record crossed pipes");
                if let Some(prev) = last.insert(writer, seq) {
                    assert!(seq > prev, "writer {writer}'s records out of order");
                }
                seen.entry((pipe, writer)).or_default().push(seq);
            }
        }
        assert_eq!(seen.len(), PIPES * WRITERS as usize);
        for ((pipe, writer), mut seqs) in seen {
            seqs.sort_unstable();
            let missing: Vec<u32> = (0..COUNT)
                .filter(|s| seqs.binary_search(s).is_err())
                .collect();
            assert!(
                seqs.len() == COUNT as usize && missing.is_empty(),
                "pipe {pipe} writer {writer}: {} records, missing {missing:?}",
                seqs.len()
            );
        }
        let bytes = i64::from(WRITERS * COUNT) * RECORD as i64;
        for i in 0..PIPES {
            let name = format!("stress{i}");
            // Ends are released asynchronously after the processes exit.
            wait_for("every end released", || row(f, &name).3 == 0);
            assert_eq!(row(f, &name), (0, bytes, bytes, 0, 0));
        }
    });
}
