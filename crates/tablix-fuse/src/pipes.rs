//! Database-backed pipes on the mount: `MOUNT/.tablix/pipes/NAME`.
//!
//! Every byte goes through a transaction of the memory database
//! (`PipeOp`s, applied by the store). What a kernel pipe keeps in its
//! wait queues lives here: FUSE replies not sent yet. A read of an empty
//! pipe parks its reply on the pipe's reader queue and returns; a later
//! write serves the first parked reader, and a reader that leaves bytes
//! behind serves the next (one reader woken at a time, as SQLiteOS does).
//! Writers blocked on a full pipe park likewise, opens of a named pipe wait
//! for the other end as FIFO opens do, and poll handles are notified on
//! every change.
//!
//! Invariant: a pipe's queue mutex is held across the transaction and the
//! queue change that depend on each other, so no wake-up is lost; it is
//! always taken before the store (the memory database's write gate), never
//! after.
//!
//! The kernel cannot tell us about signals (fuser answers INTERRUPT with
//! ENOSYS), so a watcher thread looks at the parked callers' pending
//! signals in /proc and answers a signalled or killed caller with EINTR.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use fuser::{
    FileHandle, FopenFlags, PollEvents, PollFlags, PollNotifier, ReplyCreate, ReplyData, ReplyOpen,
    ReplyWrite,
};
use tablix_fs::read::DirEntry;
use tablix_fs::{Attr, Errno};
use tablix_pipe::schema::DEFAULT_CAPACITY;
use tablix_pipe::{End, PipeOp, PipeReply, PipeState};
use tablix_store::{Stamp, Store};

use crate::errno::{pipe_errno, store_errno, to_fuser};
use crate::holders::{PipeHolders, ProcessOf};

/// The control directory at the mount's root (looked up by name, not
/// listed), and the pipes directory inside it.
pub const CONTROL_NAME: &[u8] = b".tablix";
pub const PIPES_NAME: &[u8] = b"pipes";
pub(crate) const CONTROL_INO: u64 = 1 << 48;
pub(crate) const PIPES_INO: u64 = CONTROL_INO + 1;
/// Pipe `id` is inode `PIPE_INO_BASE + id`. The file system's own inode
/// numbers (AUTOINCREMENT from 1) never get near these.
pub(crate) const PIPE_INO_BASE: u64 = 1 << 49;

/// The extended attribute holding a pipe's capacity in bytes, in decimal:
/// `setfattr -n user.tablix.capacity -v 1048576 PIPE` is F_SETPIPE_SZ.
pub const CAPACITY_XATTR: &[u8] = b"user.tablix.capacity";

/// How often parked callers are checked for signals.
const SIGNAL_SCAN: Duration = Duration::from_millis(20);

pub(crate) fn pipe_of(ino: u64) -> Option<i64> {
    ino.checked_sub(PIPE_INO_BASE)
        .and_then(|id| i64::try_from(id).ok())
}

fn nonblocking(flags: i32) -> bool {
    flags & libc::O_NONBLOCK != 0
}

/// What an open of a pipe file is.
pub(crate) fn end_of(flags: i32) -> End {
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => End::Read,
        libc::O_WRONLY => End::Write,
        _ => End::Both,
    }
}

/// Pipe files bypass the page cache, have no position and cannot seek.
fn stream_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NONSEEKABLE | FopenFlags::FOPEN_STREAM
}

struct ParkedRead {
    pid: u32,
    max: u32,
    reply: ReplyData,
}

struct ParkedWrite {
    pid: u32,
    data: Vec<u8>,
    done: usize,
    reply: ReplyWrite,
}

struct ParkedOpen {
    pid: u32,
    handle: u64,
    end: End,
    reply: ReplyOpen,
}

/// The wait queues of one pipe, and its counts as of the last operation.
#[derive(Default)]
struct Queues {
    /// Exact while the queues are locked: every change to the pipe's row
    /// is made by this engine under this lock and returns the new counts.
    /// None until first needed, and after a failed transaction.
    state: Option<PipeState>,
    readers: VecDeque<ParkedRead>,
    writers: VecDeque<ParkedWrite>,
    opens: Vec<ParkedOpen>,
    polls: Vec<PollNotifier>,
}

impl Queues {
    fn is_idle(&self) -> bool {
        self.readers.is_empty() && self.writers.is_empty() && self.opens.is_empty()
    }
}

#[derive(Clone, Copy)]
struct Handle {
    pipe: i64,
    end: End,
}

pub(crate) struct Pipes {
    store: Arc<Store>,
    /// Who holds which end (`pid_pipe`), kept true to /proc.
    holders: Arc<PipeHolders>,
    /// How long the kernel may cache a pipe file's entry and attributes.
    ttl: Duration,
    queues: Mutex<HashMap<i64, Arc<Mutex<Queues>>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_handle: AtomicU64,
    stopped: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pipes {
    pub(crate) fn new(store: Arc<Store>, holders: Arc<PipeHolders>, ttl: Duration) -> Arc<Pipes> {
        let pipes = Arc::new(Pipes {
            store,
            holders,
            ttl,
            queues: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&pipes);
        let spawned = std::thread::Builder::new()
            .name("tablix-pipe-signals".into())
            .spawn(move || watch_signals(weak));
        if let Err(e) = spawned {
            tracing::error!("cannot start the pipe signal watcher: {e}");
        }
        pipes
    }

    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    fn queues(&self, pipe: i64) -> Arc<Mutex<Queues>> {
        lock(&self.queues).entry(pipe).or_default().clone()
    }

    fn apply(&self, op: PipeOp) -> Result<PipeReply, Errno> {
        self.store
            .apply_pipe(Stamp::now(), &op)
            .map_err(|e| store_errno(&e))?
            .map_err(|e| pipe_errno(&e))
    }

    /// Runs one of tablix-pipe's reads on the memory database.
    fn query<T>(
        &self,
        f: impl FnOnce(&tablix_store::ReadConn) -> Result<T, tablix_pipe::PipeError>,
    ) -> Result<T, Errno> {
        self.store
            .read_volatile(f)
            .map_err(|e| store_errno(&e))?
            .map_err(|e| pipe_errno(&e))
    }

    fn state(&self, pipe: i64) -> Result<PipeState, Errno> {
        self.store
            .read_volatile(|c| tablix_pipe::read::state(c, pipe))
            .map_err(|e| store_errno(&e))?
            .map_err(|e| pipe_errno(&e))
    }

    // ----- names and attributes -----

    /// The control directory is read-only; the pipes directory is like
    /// /tmp: anyone may create a pipe there, only its owner may remove it.
    fn dir_attr(ino: u64) -> Attr {
        let perm = if ino == PIPES_INO { 0o1777 } else { 0o555 };
        Attr {
            ino,
            mode: libc::S_IFDIR | perm,
            nlink: 2,
            ..Attr::default()
        }
    }

    /// Attributes of a virtual inode.
    pub(crate) fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        match ino {
            CONTROL_INO | PIPES_INO => Ok(Self::dir_attr(ino)),
            _ => {
                let pipe = pipe_of(ino).ok_or(Errno::ENOENT)?;
                self.pipe_attr(pipe)
            }
        }
    }

    fn pipe_attr(&self, pipe: i64) -> Result<Attr, Errno> {
        self.query(|c| tablix_pipe::read::file(c, pipe))
            .map(|f| attr_of(&f))
    }

    /// Looks `name` up in a virtual directory.
    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, Errno> {
        match parent {
            CONTROL_INO if name == PIPES_NAME => Ok(Self::dir_attr(PIPES_INO)),
            CONTROL_INO => Err(Errno::ENOENT),
            PIPES_INO => {
                if name.len() > tablix_pipe::schema::MAX_NAME {
                    return Err(Errno::ENAMETOOLONG);
                }
                let name = std::str::from_utf8(name).map_err(|_| Errno::ENOENT)?;
                self.query(|c| tablix_pipe::read::named(c, name))
                    .map(|f| attr_of(&f))
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// Lists a virtual directory from `offset`, handing each entry to
    /// `emit` until it returns false, as `tablix_fs::read::readdir` does.
    pub(crate) fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut emit: impl FnMut(DirEntry) -> bool,
    ) -> Result<(), Errno> {
        let mut all = vec![
            (Self::dir_attr(ino), b".".to_vec()),
            (Self::dir_attr(ino), b"..".to_vec()),
        ];
        match ino {
            CONTROL_INO => all.push((Self::dir_attr(PIPES_INO), PIPES_NAME.to_vec())),
            PIPES_INO => {
                let named = self.query(|c| tablix_pipe::read::all_named(c))?;
                all.extend(named.into_iter().filter_map(|f| {
                    let attr = attr_of(&f);
                    f.name.map(|n| (attr, n.into_bytes()))
                }));
            }
            _ => return Err(Errno::ENOTDIR),
        }
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (attr, name)) in all.into_iter().enumerate().skip(skip) {
            let next = i as u64 + 1;
            if !emit(DirEntry { name, attr, next }) {
                break;
            }
        }
        Ok(())
    }

    /// `rm MOUNT/.tablix/pipes/NAME`.
    pub(crate) fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        if parent != PIPES_INO {
            return Err(Errno::EPERM);
        }
        let name = std::str::from_utf8(name).map_err(|_| Errno::ENOENT)?;
        self.apply(PipeOp::Unlink {
            name: name.to_string(),
        })?;
        Ok(())
    }

    // ----- opening and closing -----

    /// Applies `op` to the pipe whose queues `q` are, keeping `q.state`.
    fn apply_to(&self, q: &mut Queues, op: PipeOp) -> Result<PipeReply, Errno> {
        let r = self.apply(op);
        q.state = match &r {
            Ok(PipeReply::Ends { state, .. } | PipeReply::Io { state, .. }) => Some(*state),
            _ => None,
        };
        r
    }

    fn cached_state(&self, pipe: i64, q: &mut Queues) -> Result<PipeState, Errno> {
        match q.state {
            Some(s) => Ok(s),
            None => {
                let s = self.state(pipe)?;
                q.state = Some(s);
                Ok(s)
            }
        }
    }

    /// One transaction moving bytes: see `PipeOp::Io`.
    fn io(
        &self,
        pipe: i64,
        q: &mut Queues,
        write: Vec<u8>,
        read: u32,
        read_first: bool,
    ) -> Result<(usize, Vec<u8>), Errno> {
        let op = PipeOp::Io {
            pipe,
            write,
            read,
            read_first,
        };
        match self.apply_to(q, op)? {
            PipeReply::Io { written, data, .. } => Ok((written, data)),
            _ => Err(Errno::EIO),
        }
    }

    fn new_handle(
        &self,
        pipe: i64,
        q: &mut Queues,
        end: End,
        pid: u32,
    ) -> Result<(u64, PipeState), Errno> {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        // Descriptors belong to processes, not threads: the holder is the
        // opening thread's process.
        let op = PipeOp::Open {
            pipe,
            handle,
            end,
            pid: ProcessOf::read(pid).pid,
        };
        match self.apply_to(q, op)? {
            PipeReply::Ends { state, .. } => {
                lock(&self.handles).insert(handle, Handle { pipe, end });
                Ok((handle, state))
            }
            _ => Err(Errno::EIO),
        }
    }

    /// Creates pipe `name` in the pipes directory and opens it, as
    /// `open(O_CREAT)` does. Never waits for the other end: this is how
    /// `tablix pipe create` and the pipe() of `tablix run` make pipes.
    pub(crate) fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        (uid, gid, pid): (u32, u32, u32),
        reply: ReplyCreate,
    ) {
        let r = (|| {
            if parent != PIPES_INO {
                return Err(Errno::EPERM);
            }
            if name.len() > tablix_pipe::schema::MAX_NAME {
                return Err(Errno::ENAMETOOLONG);
            }
            let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
            let pipe = match self.apply(PipeOp::Create {
                name: name.to_string(),
                uid,
                gid,
                mode,
                capacity: DEFAULT_CAPACITY,
                exclusive: flags & libc::O_EXCL != 0,
            })? {
                PipeReply::Created { pipe, .. } => pipe,
                _ => return Err(Errno::EIO),
            };
            let end = end_of(flags);
            let q = self.queues(pipe);
            let mut q = lock(&q);
            let (handle, _) = self.new_handle(pipe, &mut q, end, pid)?;
            self.wake_opens(&mut q, end);
            let attr = self.pipe_attr(pipe)?;
            Ok((attr, handle))
        })();
        match r {
            Ok((attr, handle)) => reply.created(
                &self.ttl,
                &crate::attr::file_attr(&attr),
                fuser::Generation(0),
                FileHandle(handle),
                stream_flags(),
            ),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    /// Opens a pipe file. Like a FIFO, a blocking open for reading waits
    /// for a writer and one for writing waits for a reader; a
    /// non-blocking open for writing without a reader fails with ENXIO.
    /// A pipe without a name (pipe()'s, opened again through /dev/fd/N, as
    /// a shell's process substitution does) never waits, as Linux never
    /// waits on an anonymous pipe: its ends are already open, or gone.
    pub(crate) fn open(&self, ino: u64, flags: i32, pid: u32, reply: ReplyOpen) {
        let Some(pipe) = pipe_of(ino) else {
            // The virtual directories are opened with opendir.
            reply.error(to_fuser(Errno::EISDIR));
            return;
        };
        let end = end_of(flags);
        let q = self.queues(pipe);
        let mut q = lock(&q);
        let (handle, state) = match self.new_handle(pipe, &mut q, end, pid) {
            Ok(h) => h,
            Err(e) => {
                reply.error(to_fuser(e));
                return;
            }
        };
        self.wake_opens(&mut q, end);
        let nonblock = nonblocking(flags);
        let waits = !state.anonymous
            && match end {
                End::Read => state.writers == 0 && !nonblock,
                End::Write => state.readers == 0,
                End::Both => false,
            };
        if !waits {
            reply.opened(FileHandle(handle), stream_flags());
        } else if nonblock {
            self.close_handle(handle, &mut q);
            reply.error(to_fuser(Errno(libc::ENXIO)));
        } else {
            q.opens.push(ParkedOpen {
                pid,
                handle,
                end,
                reply,
            });
        }
    }

    /// Completes parked opens waiting for the end that just opened.
    fn wake_opens(&self, q: &mut Queues, opened: End) {
        let mut i = 0;
        while i < q.opens.len() {
            let waits_for_this = match q.opens[i].end {
                End::Read => opened.writes(),
                End::Write => opened.reads(),
                End::Both => true,
            };
            if waits_for_this {
                let o = q.opens.swap_remove(i);
                o.reply.opened(FileHandle(o.handle), stream_flags());
            } else {
                i += 1;
            }
        }
        notify_polls(q);
    }

    fn close_handle(&self, handle: u64, q: &mut Queues) -> Option<PipeReply> {
        lock(&self.handles).remove(&handle);
        let op = PipeOp::Close { handle };
        match self.apply_to(q, op) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("closing pipe handle {handle}: {e}");
                None
            }
        }
    }

    /// Task `tid` closed a descriptor of the open pipe file `fh` (FLUSH):
    /// what its process still holds is read again.
    pub(crate) fn flushed(&self, fh: u64, tid: u32) {
        if lock(&self.handles).contains_key(&fh) {
            self.holders.sync(tid);
        }
    }

    /// The last descriptor of an open pipe file was closed.
    pub(crate) fn release(&self, fh: u64) {
        let Some(h) = lock(&self.handles).get(&fh).copied() else {
            return;
        };
        let q = self.queues(h.pipe);
        let mut q = lock(&q);
        if let Some(PipeReply::Ends { removed, .. }) = self.close_handle(fh, &mut q) {
            self.serve(h.pipe, &mut q);
            notify_polls(&mut q);
            if removed && q.is_idle() {
                lock(&self.queues).remove(&h.pipe);
            }
        }
    }

    // ----- reading and writing -----

    /// The open handle `fh`, if it has the end `wanted` asks for.
    fn handle(&self, fh: u64, wanted: fn(End) -> bool) -> Result<Handle, Errno> {
        match lock(&self.handles).get(&fh) {
            Some(h) if wanted(h.end) => Ok(*h),
            _ => Err(Errno::EBADF),
        }
    }

    pub(crate) fn read(&self, fh: u64, max: u32, flags: i32, pid: u32, reply: ReplyData) {
        let h = match self.handle(fh, End::reads) {
            Ok(h) => h,
            Err(e) => return reply.error(to_fuser(e)),
        };
        let q = self.queues(h.pipe);
        let mut q = lock(&q);
        let nonblock = nonblocking(flags);
        let parked = ParkedRead { pid, max, reply };
        // Readers are served in arrival order: behind others, or on an
        // empty pipe, this one waits (no transaction is needed to know).
        let state = match self.cached_state(h.pipe, &mut q) {
            Ok(s) => s,
            Err(e) => {
                parked.reply.error(to_fuser(e));
                return;
            }
        };
        if !q.readers.is_empty() || state.buffered == 0 {
            if q.readers.is_empty() && state.writers == 0 {
                parked.reply.data(&[]);
            } else if nonblock {
                parked.reply.error(to_fuser(Errno::EAGAIN));
            } else {
                q.readers.push_back(parked);
            }
            return;
        }
        // Bytes are there. A writer waiting for room puts its bytes in by
        // the same transaction that takes these out.
        let rest = q.writers.front().map(|w| w.data[w.done..].to_vec());
        match self.io(h.pipe, &mut q, rest.unwrap_or_default(), max, true) {
            Ok((written, data)) => {
                parked.reply.data(&data);
                self.advance_writer(&mut q, written);
                self.serve(h.pipe, &mut q);
                notify_polls(&mut q);
            }
            Err(e) => parked.reply.error(to_fuser(e)),
        }
    }

    pub(crate) fn write(&self, fh: u64, data: &[u8], flags: i32, pid: u32, reply: ReplyWrite) {
        let h = match self.handle(fh, End::writes) {
            Ok(h) => h,
            Err(e) => return reply.error(to_fuser(e)),
        };
        let q = self.queues(h.pipe);
        let mut q = lock(&q);
        let nonblock = nonblocking(flags);
        let mut parked = ParkedWrite {
            pid,
            data: data.to_vec(),
            done: 0,
            reply,
        };
        let state = match self.cached_state(h.pipe, &mut q) {
            Ok(s) => s,
            Err(e) => {
                parked.reply.error(to_fuser(e));
                return;
            }
        };
        if state.readers == 0 {
            finish_failed_write(parked, Errno::EPIPE);
            return;
        }
        // Writers go in arrival order: behind others, or into a pipe
        // without room, this one waits.
        if !q.writers.is_empty() || state.writable(parked.data.len()) == 0 {
            if nonblock {
                parked.reply.error(to_fuser(Errno::EAGAIN));
            } else {
                q.writers.push_back(parked);
            }
            return;
        }
        // A reader waiting on the empty pipe takes the bytes out in the
        // same transaction that puts them in.
        let want = q.readers.front().map_or(0, |r| r.max);
        // The bytes go into the Command; a copy is kept only if some may
        // not fit and have to wait.
        let len = parked.data.len();
        let bytes = if state.writable(len) < len {
            parked.data.clone()
        } else {
            std::mem::take(&mut parked.data)
        };
        match self.io(h.pipe, &mut q, bytes, want, false) {
            Ok((written, out)) => {
                if !out.is_empty()
                    && let Some(r) = q.readers.pop_front()
                {
                    r.reply.data(&out);
                }
                parked.done = written;
                if written == len || nonblock {
                    parked.reply.written(written as u32);
                } else {
                    q.writers.push_back(parked);
                }
                self.serve(h.pipe, &mut q);
                notify_polls(&mut q);
            }
            Err(e) => finish_failed_write(parked, e),
        }
    }

    /// Credits `written` bytes to the first parked writer, answering it
    /// once all of its bytes are in.
    fn advance_writer(&self, q: &mut Queues, written: usize) {
        if written == 0 {
            return;
        }
        if let Some(w) = q.writers.front_mut() {
            w.done += written;
            if w.done >= w.data.len()
                && let Some(w) = q.writers.pop_front()
            {
                w.reply.written(w.done as u32);
            }
        }
    }

    /// Moves bytes between the parked writers, the pipe and the parked
    /// readers until nobody can make progress, one transaction per move;
    /// answers parked callers the pipe's ends no longer serve (end of file
    /// for readers without writers, EPIPE for writers without readers).
    /// Called with the pipe's queues locked.
    fn serve(&self, pipe: i64, q: &mut Queues) {
        loop {
            let Ok(state) = self.cached_state(pipe, q) else {
                return;
            };
            if state.readers == 0 && !q.writers.is_empty() {
                for w in q.writers.drain(..) {
                    finish_failed_write(w, Errno::EPIPE);
                }
            }
            if state.writers == 0 && state.buffered == 0 && !q.readers.is_empty() {
                for r in q.readers.drain(..) {
                    r.reply.data(&[]);
                }
            }
            let write = q
                .writers
                .front()
                .map(|w| w.data[w.done..].to_vec())
                .filter(|rest| state.writable(rest.len()) > 0);
            let read = q
                .readers
                .front()
                .map(|r| r.max)
                .filter(|_| state.buffered > 0 || write.is_some());
            if write.is_none() && read.is_none() {
                return;
            }
            let read_first = write.is_none();
            match self.io(
                pipe,
                q,
                write.unwrap_or_default(),
                read.unwrap_or(0),
                read_first,
            ) {
                Ok((0, out)) if out.is_empty() => return,
                Ok((written, out)) => {
                    if !out.is_empty()
                        && let Some(r) = q.readers.pop_front()
                    {
                        r.reply.data(&out);
                    }
                    self.advance_writer(q, written);
                    notify_polls(q);
                }
                Err(e) => {
                    // The transaction failed: the first parked caller of
                    // each queue gets the error rather than waiting forever.
                    if let Some(w) = q.writers.pop_front() {
                        finish_failed_write(w, e);
                    }
                    if let Some(r) = q.readers.pop_front() {
                        r.reply.error(to_fuser(e));
                    }
                }
            }
        }
    }

    // ----- capacity, as an extended attribute -----

    /// Sets a pipe's capacity. As F_SETPIPE_SZ: only root may go beyond
    /// /proc/sys/fs/pipe-max-size, and not below the bytes buffered.
    pub(crate) fn set_xattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        uid: u32,
    ) -> Result<(), Errno> {
        let pipe = pipe_of(ino).ok_or(Errno::EOPNOTSUPP)?;
        if name != CAPACITY_XATTR {
            return Err(Errno::EOPNOTSUPP);
        }
        let capacity: u32 = std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or(Errno::EINVAL)?;
        let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(1 << 20);
        if uid != 0 && capacity > max {
            return Err(Errno::EPERM);
        }
        let q = self.queues(pipe);
        let mut q = lock(&q);
        self.apply_to(&mut q, PipeOp::SetCapacity { pipe, capacity })?;
        // More room may let parked writers on.
        self.serve(pipe, &mut q);
        notify_polls(&mut q);
        Ok(())
    }

    pub(crate) fn get_xattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let pipe = pipe_of(ino).ok_or(Errno::ENODATA)?;
        if name != CAPACITY_XATTR {
            return Err(Errno::ENODATA);
        }
        let q = self.queues(pipe);
        let mut q = lock(&q);
        let s = self.cached_state(pipe, &mut q)?;
        Ok(s.capacity.to_string().into_bytes())
    }

    pub(crate) fn list_xattr(&self, ino: u64) -> Vec<u8> {
        match pipe_of(ino) {
            Some(_) => [CAPACITY_XATTR, b"\0"].concat(),
            None => Vec::new(),
        }
    }

    // ----- readiness -----

    pub(crate) fn poll(
        &self,
        fh: u64,
        ph: PollNotifier,
        events: PollEvents,
        flags: PollFlags,
    ) -> Result<PollEvents, Errno> {
        let h = self.handle(fh, |_| true)?;
        let q = self.queues(h.pipe);
        let mut q = lock(&q);
        let s = self.cached_state(h.pipe, &mut q)?;
        let mut ready = PollEvents::empty();
        if h.end.reads() {
            if s.buffered > 0 {
                ready |= PollEvents::POLLIN | PollEvents::POLLRDNORM;
            }
            if s.writers == 0 {
                ready |= PollEvents::POLLHUP;
            }
        }
        if h.end.writes() {
            if s.capacity.saturating_sub(s.buffered) >= tablix_pipe::PIPE_BUF as u64 {
                ready |= PollEvents::POLLOUT | PollEvents::POLLWRNORM;
            }
            if s.readers == 0 {
                ready |= PollEvents::POLLERR;
            }
        }
        let wanted = ready & (events | PollEvents::POLLHUP | PollEvents::POLLERR);
        // The kernel reuses one handle per open file: keep each once.
        if flags.contains(PollFlags::FUSE_POLL_SCHEDULE_NOTIFY)
            && !q.polls.iter().any(|p| p.handle().0 == ph.handle().0)
        {
            q.polls.push(ph);
        }
        Ok(wanted)
    }

    /// Answers every parked caller that has a signal pending or is gone;
    /// returns how many callers stay parked.
    fn interrupt_signalled(&self) -> usize {
        let all: Vec<Arc<Mutex<Queues>>> = lock(&self.queues).values().cloned().collect();
        let mut parked = 0;
        for q in all {
            let mut q = lock(&q);
            if q.is_idle() {
                continue;
            }
            let mut i = 0;
            while i < q.readers.len() {
                if interrupted(q.readers[i].pid) {
                    if let Some(r) = q.readers.remove(i) {
                        r.reply.error(to_fuser(Errno::EINTR));
                    }
                } else {
                    i += 1;
                }
            }
            let mut i = 0;
            while i < q.writers.len() {
                if interrupted(q.writers[i].pid) {
                    if let Some(w) = q.writers.remove(i) {
                        // Bytes already in the pipe stay there, as Linux
                        // reports a partial write when a signal arrives.
                        if w.done > 0 {
                            w.reply.written(w.done as u32);
                        } else {
                            w.reply.error(to_fuser(Errno::EINTR));
                        }
                    }
                } else {
                    i += 1;
                }
            }
            let mut i = 0;
            while i < q.opens.len() {
                if interrupted(q.opens[i].pid) {
                    let o = q.opens.swap_remove(i);
                    self.close_handle(o.handle, &mut q);
                    o.reply.error(to_fuser(Errno::EINTR));
                } else {
                    i += 1;
                }
            }
            parked += q.readers.len() + q.writers.len() + q.opens.len();
        }
        parked
    }
}

/// A pipe file's attributes.
fn attr_of(f: &tablix_pipe::read::PipeFile) -> Attr {
    Attr {
        ino: PIPE_INO_BASE + f.id.max(0) as u64,
        mode: libc::S_IFREG | f.mode,
        nlink: u32::from(f.name.is_some()),
        uid: f.uid,
        gid: f.gid,
        // A pipe file must look like a regular file to reach this file
        // system, and programs size their buffers from a regular file's
        // length (GNU sort spills every line to a temporary file at length
        // 0). The capacity is the most a pipe holds at once.
        size: f.capacity,
        atime_ns: f.changed_ns,
        mtime_ns: f.changed_ns,
        ctime_ns: f.changed_ns,
        btime_ns: f.created_ns,
        ..Attr::default()
    }
}

fn notify_polls(q: &mut Queues) {
    for ph in q.polls.drain(..) {
        // The poller may be gone; nothing to do then.
        let _ = ph.notify();
    }
}

/// A write that cannot go on: bytes already written are reported, else
/// the error; a broken pipe also raises SIGPIPE in the writer, as Linux
/// does.
fn finish_failed_write(w: ParkedWrite, e: Errno) {
    if w.done > 0 {
        w.reply.written(w.done as u32);
        return;
    }
    if e == Errno(libc::EPIPE) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(w.pid).unwrap_or(0));
        if pid.as_raw() > 0
            && let Err(err) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGPIPE)
        {
            tracing::debug!("SIGPIPE to {pid}: {err}");
        }
    }
    w.reply.error(to_fuser(e));
}

/// Signals that stop or continue a process do not interrupt a blocked
/// pipe call (Linux restarts it transparently).
const JOB_CONTROL: u64 = (1 << (libc::SIGSTOP - 1))
    | (1 << (libc::SIGTSTP - 1))
    | (1 << (libc::SIGTTIN - 1))
    | (1 << (libc::SIGTTOU - 1))
    | (1 << (libc::SIGCONT - 1));

/// Whether task `tid` is gone or has an unblocked signal pending.
pub(crate) fn interrupted(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let mask = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    if status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| s.trim_start().starts_with('Z') || s.trim_start().starts_with('X'))
    {
        return true;
    }
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    pending & !mask("SigBlk:") & !JOB_CONTROL != 0
}

/// Parked callers checked per SIGNAL_SCAN; with more, the scan slows down
/// in proportion, so that idle blocked readers cost little.
const SCAN_BATCH: usize = 64;

fn watch_signals(pipes: Weak<Pipes>) {
    let mut parked = 0;
    loop {
        let rounds = 1 + parked / SCAN_BATCH;
        std::thread::sleep(SIGNAL_SCAN * u32::try_from(rounds).unwrap_or(u32::MAX));
        let Some(p) = pipes.upgrade() else {
            return;
        };
        if p.stopped.load(Ordering::Acquire) {
            return;
        }
        parked = p.interrupt_signalled();
    }
}
