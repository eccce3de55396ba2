//! A POSIX conformance suite: every operation with its error cases, on a
//! real mount. Runs as root, and again as an unprivileged user
//! (`unprivileged.rs`), where the expectations that differ say so.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use tablix_testkit::command::Limited;

use tablix_store::Durability;

use crate::harness::{Fixture, errno_of, mount, require_fuse};

use tablix_testkit::require::is_root;

/// `p` created (or emptied) and opened for reading and writing.
fn create_rw(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)
        .unwrap()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

/// Runs `body` on a fresh sync-mode mount (or the shared one).
fn with_mount(name: &str, body: impl FnOnce(&Fixture)) {
    require_fuse(name);
    let f = mount(Durability::Sync);
    body(&f);
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn create_open_flags() {
    with_mount("create_open_flags", |f| {
        let p = f.path("a");
        fs::write(&p, b"hello").unwrap();
        // O_CREAT|O_EXCL on an existing name.
        let r = OpenOptions::new().write(true).create_new(true).open(&p);
        assert_eq!(errno_of(r), libc::EEXIST);
        // O_TRUNC empties, O_APPEND appends.
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), 0);
        fs::write(&p, b"abc").unwrap();
        let mut a = OpenOptions::new().append(true).open(&p).unwrap();
        a.write_all(b"def").unwrap();
        drop(a);
        assert_eq!(fs::read(&p).unwrap(), b"abcdef");
        // Missing files, directories opened for writing, paths through files.
        assert_eq!(errno_of(File::open(f.path("missing"))), libc::ENOENT);
        fs::create_dir(f.path("d")).unwrap();
        assert_eq!(
            errno_of(OpenOptions::new().write(true).open(f.path("d"))),
            libc::EISDIR
        );
        assert_eq!(errno_of(File::open(f.path("a/x"))), libc::ENOTDIR);
        assert_eq!(errno_of(File::create(f.path("a/x"))), libc::ENOTDIR);
        // Mode and owner of a new file.
        let m = fs::metadata(&p).unwrap();
        assert!(m.file_type().is_file());
        assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn read_write_and_sparse_files() {
    with_mount("read_write_and_sparse_files", |f| {
        let p = f.path("sparse");
        let mut file = create_rw(&p);
        // Data at 0, a hole, data at 1 MiB, straddling a block boundary.
        file.write_all(b"start").unwrap();
        file.seek(SeekFrom::Start((1 << 20) - 3)).unwrap();
        file.write_all(b"middle").unwrap();
        file.sync_all().unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.len(), (1 << 20) + 3);
        let all = fs::read(&p).unwrap();
        assert_eq!(&all[..5], b"start");
        assert!(all[5..(1 << 20) - 3].iter().all(|&b| b == 0));
        assert_eq!(&all[(1 << 20) - 3..], b"middle");
        // SEEK_DATA / SEEK_HOLE over the hole.
        let fd = file.as_raw_fd();
        let data = unsafe_free_lseek(fd, 100, libc::SEEK_DATA);
        assert!(data.unwrap() >= 100);
        let hole = unsafe_free_lseek(fd, 0, libc::SEEK_HOLE).unwrap();
        assert!(hole > 0 && hole < (1 << 20) - 3, "first hole at {hole}");
        let data = unsafe_free_lseek(fd, hole, libc::SEEK_DATA).unwrap();
        assert!(data > hole && data <= (1 << 20) - 3, "data again at {data}");
        assert_eq!(
            unsafe_free_lseek(fd, (1 << 20) + 3, libc::SEEK_DATA),
            Err(libc::ENXIO)
        );
        // pread/pwrite.
        use std::os::unix::fs::FileExt;
        file.write_at(b"XY", 1).unwrap();
        let mut two = [0u8; 4];
        file.read_at(&mut two, 0).unwrap();
        assert_eq!(&two, b"sXYr");
        // A large write crossing many blocks reads back intact.
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(f.path("big"), &big).unwrap();
        assert_eq!(fs::read(f.path("big")).unwrap(), big);
    });
}

fn unsafe_free_lseek(fd: i32, off: i64, whence: i32) -> Result<i64, i32> {
    let w = match whence {
        libc::SEEK_DATA => nix::unistd::Whence::SeekData,
        libc::SEEK_HOLE => nix::unistd::Whence::SeekHole,
        _ => nix::unistd::Whence::SeekSet,
    };
    let fd = unsafe_borrow(fd);
    nix::unistd::lseek(fd, off, w).map_err(|e| e as i32)
}

fn unsafe_borrow(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // The descriptors passed here outlive every use of the borrow.
    #[allow(unsafe_code)]
    unsafe {
        std::os::fd::BorrowedFd::borrow_raw(fd)
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn truncate_and_file_size_limits() {
    with_mount("truncate_and_file_size_limits", |f| {
        let p = f.path("t");
        fs::write(&p, vec![7u8; 200_000]).unwrap();
        let file = OpenOptions::new().write(true).open(&p).unwrap();
        file.set_len(70_000).unwrap();
        file.set_len(300_000).unwrap();
        let back = fs::read(&p).unwrap();
        assert_eq!(back.len(), 300_000);
        assert!(back[..70_000].iter().all(|&b| b == 7));
        assert!(
            back[70_000..].iter().all(|&b| b == 0),
            "bytes past a shrink come back as zeros"
        );
        // Past the largest file size: EFBIG.
        assert_eq!(
            errno_of(file.set_len(tablix_fs::schema::MAX_FILE_SIZE + 1)),
            libc::EFBIG
        );
        use std::os::unix::fs::FileExt;
        let r = file.write_at(b"x", tablix_fs::schema::MAX_FILE_SIZE);
        assert_eq!(errno_of(r), libc::EFBIG);
        assert_eq!(
            errno_of(fs::File::open(f.path(".")).and_then(|d| d.set_len(0))),
            libc::EINVAL
        );
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn directories_and_link_counts() {
    with_mount("directories_and_link_counts", |f| {
        let d = f.path("d");
        fs::create_dir(&d).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().nlink(), 2);
        fs::create_dir(d.join("s1")).unwrap();
        fs::create_dir(d.join("s2")).unwrap();
        fs::write(d.join("file"), b"x").unwrap();
        assert_eq!(fs::metadata(&d).unwrap().nlink(), 4);
        assert_eq!(errno_of(fs::create_dir(&d)), libc::EEXIST);
        assert_eq!(errno_of(fs::remove_dir(&d)), libc::ENOTEMPTY);
        assert_eq!(errno_of(fs::remove_dir(d.join("file"))), libc::ENOTDIR);
        assert_eq!(errno_of(fs::remove_dir(d.join("nope"))), libc::ENOENT);
        assert_eq!(errno_of(fs::remove_file(d.join("s1"))), libc::EISDIR);
        fs::remove_dir(d.join("s1")).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().nlink(), 3);
        let mut names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["file", "s2"]);
        // Names longer than 255 bytes.
        let long = "n".repeat(256);
        assert_eq!(errno_of(fs::write(d.join(&long), b"")), libc::ENAMETOOLONG);
        assert_eq!(errno_of(fs::create_dir(d.join(&long))), libc::ENAMETOOLONG);
        assert_eq!(errno_of(fs::metadata(d.join(&long))), libc::ENAMETOOLONG);
        fs::write(d.join("n".repeat(255)), b"").unwrap();
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn hard_links_and_unlinked_open_files() {
    with_mount("hard_links_and_unlinked_open_files", |f| {
        let a = f.path("a");
        fs::write(&a, b"linked").unwrap();
        fs::hard_link(&a, f.path("b")).unwrap();
        assert_eq!(fs::metadata(&a).unwrap().nlink(), 2);
        assert_eq!(
            fs::metadata(&a).unwrap().ino(),
            fs::metadata(f.path("b")).unwrap().ino()
        );
        assert_eq!(errno_of(fs::hard_link(&a, f.path("b"))), libc::EEXIST);
        fs::create_dir(f.path("d")).unwrap();
        assert_eq!(
            errno_of(fs::hard_link(f.path("d"), f.path("d2"))),
            libc::EPERM
        );
        // Cross-device links.
        let outside = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(
            errno_of(fs::hard_link(outside.path(), f.path("x"))),
            libc::EXDEV
        );
        assert_eq!(
            errno_of(fs::rename(outside.path(), f.path("x"))),
            libc::EXDEV
        );
        // Open, unlink every name: still readable and writable until closed.
        let mut open = OpenOptions::new().read(true).write(true).open(&a).unwrap();
        fs::remove_file(&a).unwrap();
        fs::remove_file(f.path("b")).unwrap();
        assert_eq!(errno_of(fs::metadata(&a)), libc::ENOENT);
        let mut s = String::new();
        open.read_to_string(&mut s).unwrap();
        assert_eq!(s, "linked");
        open.write_all(b" more").unwrap();
        assert_eq!(open.metadata().unwrap().nlink(), 0);
        assert_eq!(open.metadata().unwrap().len(), 11);
        let ino = open.metadata().unwrap().ino();
        drop(open);
        // Once closed and forgotten, the inode's rows are reclaimed.
        if let Some(store) = &f.store {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let left: i64 = store
                    .read(|c| {
                        c.query_row(
                            "SELECT count(*) FROM tablix_inode WHERE ino = ?1",
                            [ino as i64],
                            |r| r.get(0),
                        )
                    })
                    .unwrap()
                    .unwrap();
                if left == 0 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "inode {ino} was never reclaimed"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn rename_edge_cases() {
    with_mount("rename_edge_cases", |f| {
        let p = |s: &str| f.path(s);
        fs::write(p("f1"), b"one").unwrap();
        fs::write(p("f2"), b"two").unwrap();
        fs::create_dir_all(p("d1/sub")).unwrap();
        fs::create_dir(p("d2")).unwrap();
        fs::create_dir(p("empty")).unwrap();
        // File over file replaces.
        fs::rename(p("f1"), p("f2")).unwrap();
        assert_eq!(fs::read(p("f2")).unwrap(), b"one");
        assert_eq!(errno_of(fs::metadata(p("f1"))), libc::ENOENT);
        // Kinds must match; a non-empty directory cannot be replaced.
        assert_eq!(errno_of(fs::rename(p("f2"), p("d2"))), libc::EISDIR);
        assert_eq!(errno_of(fs::rename(p("d2"), p("f2"))), libc::ENOTDIR);
        assert_eq!(errno_of(fs::rename(p("d2"), p("d1"))), libc::ENOTEMPTY);
        // A directory into itself.
        assert_eq!(errno_of(fs::rename(p("d1"), p("d1/sub/x"))), libc::EINVAL);
        assert_eq!(errno_of(fs::rename(p("missing"), p("x"))), libc::ENOENT);
        // Directory over an empty directory, moving between parents.
        fs::rename(p("d1/sub"), p("empty")).unwrap();
        assert_eq!(fs::metadata(p("d1")).unwrap().nlink(), 2);
        assert_eq!(fs::metadata(p("empty")).unwrap().nlink(), 2);
        fs::rename(p("empty"), p("d2/moved")).unwrap();
        assert_eq!(fs::metadata(p("d2")).unwrap().nlink(), 3);
        // Two names of one file: nothing happens.
        fs::hard_link(p("f2"), p("f3")).unwrap();
        fs::rename(p("f2"), p("f3")).unwrap();
        assert!(p("f2").exists() && p("f3").exists());
        // renameat2 flags.
        let r = renameat2(&p("f2"), &p("f3"), libc::RENAME_NOREPLACE);
        assert_eq!(r, Err(libc::EEXIST));
        fs::write(p("g"), b"gee").unwrap();
        renameat2(&p("g"), &p("d2"), libc::RENAME_EXCHANGE).unwrap();
        assert!(fs::metadata(p("g")).unwrap().is_dir());
        assert_eq!(fs::read(p("d2")).unwrap(), b"gee");
        assert!(p("g/moved").is_dir());
        assert_eq!(
            renameat2(&p("g"), &p("nothing"), libc::RENAME_EXCHANGE),
            Err(libc::ENOENT)
        );
        // Exchanging a file and a directory across parents fixes link counts.
        renameat2(&p("d1"), &p("d2"), libc::RENAME_EXCHANGE).unwrap();
        assert!(p("d2").is_dir() && p("d1").is_file());
    });
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<(), i32> {
    let flags = nix::fcntl::RenameFlags::from_bits_truncate(flags);
    nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, from, nix::fcntl::AT_FDCWD, to, flags)
        .map_err(|e| e as i32)
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn symlinks() {
    with_mount("symlinks", |f| {
        fs::write(f.path("target"), b"t").unwrap();
        std::os::unix::fs::symlink("target", f.path("l")).unwrap();
        assert_eq!(fs::read_link(f.path("l")).unwrap(), Path::new("target"));
        assert_eq!(fs::read(f.path("l")).unwrap(), b"t");
        let m = fs::symlink_metadata(f.path("l")).unwrap();
        assert!(m.file_type().is_symlink());
        assert_eq!(m.len(), 6);
        assert_eq!(errno_of(fs::read_link(f.path("target"))), libc::EINVAL);
        let long = "x".repeat(4096);
        assert_eq!(
            errno_of(std::os::unix::fs::symlink(&long, f.path("l2"))),
            libc::ENAMETOOLONG
        );
        assert_eq!(
            errno_of(std::os::unix::fs::symlink("t", f.path("l"))),
            libc::EEXIST
        );
        // A dangling link.
        std::os::unix::fs::symlink("nowhere", f.path("dangling")).unwrap();
        assert_eq!(errno_of(fs::read(f.path("dangling"))), libc::ENOENT);
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn special_files() {
    with_mount("special_files", |f| {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        // A FIFO: stored as an inode, the kernel carries the bytes.
        let fifo = f.path("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let writer_path = fifo.clone();
        let t = std::thread::spawn(move || fs::write(writer_path, b"through the fifo").unwrap());
        assert_eq!(fs::read(&fifo).unwrap(), b"through the fifo");
        t.join().unwrap();
        // A Unix socket bound inside the mount.
        let sock = f.path("sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(fs::metadata(&sock).unwrap().file_type().is_socket());
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        c.write_all(b"hi").unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        // Device nodes need CAP_MKNOD.
        let dev = f.path("null");
        let r = mknod(
            &dev,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(1, 3),
        );
        if is_root() {
            r.unwrap();
            let m = fs::metadata(&dev).unwrap();
            assert!(m.file_type().is_char_device());
            assert_eq!(m.rdev(), makedev(1, 3));
            if f.store.is_some() {
                // Served by the kernel's /dev/null driver.
                fs::write(&dev, b"discarded").unwrap();
                assert_eq!(fs::read(&dev).unwrap(), b"");
            }
            mknod(
                &f.path("blk"),
                SFlag::S_IFBLK,
                Mode::from_bits_truncate(0o600),
                makedev(7, 0),
            )
            .unwrap();
            assert!(
                fs::metadata(f.path("blk"))
                    .unwrap()
                    .file_type()
                    .is_block_device()
            );
        } else {
            assert_eq!(r.map_err(|e| e as i32), Err(libc::EPERM));
        }
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn attributes_and_times() {
    with_mount("attributes_and_times", |f| {
        let p = f.path("a");
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        // utimensat with explicit times, UTIME_OMIT and UTIME_NOW.
        use nix::sys::stat::{UtimensatFlags, utimensat};
        use nix::sys::time::TimeSpec;
        let t = TimeSpec::new(1_000_000_000, 123_456_789);
        utimensat(
            nix::fcntl::AT_FDCWD,
            &p,
            &t,
            &t,
            UtimensatFlags::FollowSymlink,
        )
        .unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_000_000_000, 123_456_789));
        assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 123_456_789));
        utimensat(
            nix::fcntl::AT_FDCWD,
            &p,
            &TimeSpec::UTIME_OMIT,
            &TimeSpec::UTIME_NOW,
            UtimensatFlags::FollowSymlink,
        )
        .unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.atime(), 1_000_000_000, "UTIME_OMIT leaves atime");
        assert!(m.mtime() > 1_700_000_000, "UTIME_NOW sets mtime to now");
        assert!(m.ctime() >= m.mtime());
        // A write moves mtime and ctime.
        let before = fs::metadata(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&p, b"y").unwrap();
        let after = fs::metadata(&p).unwrap();
        assert!((after.mtime(), after.mtime_nsec()) > (before.mtime(), before.mtime_nsec()));
        // chown: root may give a file away; others may not.
        let r = std::os::unix::fs::chown(&p, Some(4242), Some(4242));
        if is_root() {
            r.unwrap();
            assert_eq!(fs::metadata(&p).unwrap().uid(), 4242);
        } else {
            assert_eq!(errno_of(r), libc::EPERM);
        }
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn setgid_and_sticky_directories() {
    with_mount("setgid_and_sticky_directories", |f| {
        let d = f.path("sg");
        fs::create_dir(&d).unwrap();
        let gid = fs::metadata(&d).unwrap().gid();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o2775)).unwrap();
        fs::create_dir(d.join("child")).unwrap();
        fs::write(d.join("file"), b"").unwrap();
        let child = fs::metadata(d.join("child")).unwrap();
        assert_eq!(child.gid(), gid);
        assert_ne!(
            child.mode() & libc::S_ISGID,
            0,
            "subdirectories inherit set-group-ID"
        );
        assert_eq!(fs::metadata(d.join("file")).unwrap().gid(), gid);
        // A sticky directory: stays sticky and lists normally.
        let st = f.path("sticky");
        fs::create_dir(&st).unwrap();
        fs::set_permissions(&st, fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(fs::metadata(&st).unwrap().mode() & 0o7777, 0o1777);
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn extended_attributes() {
    with_mount("extended_attributes", |f| {
        let p = f.path("x");
        fs::write(&p, b"").unwrap();
        let c = cpath(&p);
        let set = |name: &str, value: &[u8], flags: i32| -> Result<(), i32> {
            nix_setxattr(&c, name, value, flags)
        };
        set("user.one", b"1", 0).unwrap();
        set("user.two", b"22", libc::XATTR_CREATE).unwrap();
        assert_eq!(set("user.two", b"x", libc::XATTR_CREATE), Err(libc::EEXIST));
        assert_eq!(
            set("user.none", b"x", libc::XATTR_REPLACE),
            Err(libc::ENODATA)
        );
        assert_eq!(set("bogus.ns", b"x", 0), Err(libc::EOPNOTSUPP));
        assert_eq!(nix_getxattr(&c, "user.two", 64), Ok(b"22".to_vec()));
        assert_eq!(nix_getxattr(&c, "user.two", 1), Err(libc::ERANGE));
        assert_eq!(nix_getxattr(&c, "user.missing", 64), Err(libc::ENODATA));
        assert_eq!(nix_listxattr(&c), Ok(b"user.one\0user.two\0".to_vec()));
        assert_eq!(nix_removexattr(&c, "user.one"), Ok(()));
        assert_eq!(nix_removexattr(&c, "user.one"), Err(libc::ENODATA));
        assert_eq!(nix_listxattr(&c), Ok(b"user.two\0".to_vec()));
        assert_eq!(set("user.big", &vec![0u8; 65537], 0), Err(libc::E2BIG));
    });
}

#[allow(unsafe_code)]
fn nix_setxattr(path: &CString, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let name = CString::new(name).expect("name");
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[allow(unsafe_code)]
fn nix_getxattr(path: &CString, name: &str, size: usize) -> Result<Vec<u8>, i32> {
    let name = CString::new(name).expect("name");
    let mut buf = vec![0u8; size];
    // SAFETY: as above; the buffer has `size` bytes.
    let r = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(r as usize);
    Ok(buf)
}

#[allow(unsafe_code)]
fn nix_listxattr(path: &CString) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: as above.
    let r = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(r as usize);
    Ok(buf)
}

#[allow(unsafe_code)]
fn nix_removexattr(path: &CString, name: &str) -> Result<(), i32> {
    let name = CString::new(name).expect("name");
    // SAFETY: as above.
    let r = unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn statfs_and_fallocate() {
    with_mount("statfs_and_fallocate", |f| {
        let s = nix::sys::statfs::statfs(&f.root).unwrap();
        assert_eq!(s.maximum_name_length(), 255);
        assert!(s.blocks() > 0);
        let p = f.path("fa");
        let file = create_rw(&p);
        use nix::fcntl::{FallocateFlags, fallocate};
        fallocate(&file, FallocateFlags::empty(), 0, 200_000).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 200_000);
        // Allocating stores nothing: the range reads as zeros.
        assert_eq!(file.metadata().unwrap().blocks(), 0);
        assert!(fs::read(&p).unwrap().iter().all(|&b| b == 0));
        fallocate(&file, FallocateFlags::FALLOC_FL_KEEP_SIZE, 200_000, 100_000).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 200_000);
        use std::os::unix::fs::FileExt;
        file.write_at(&[9u8; 200_000], 0).unwrap();
        fallocate(
            &file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            1000,
            150_000,
        )
        .unwrap();
        let back = fs::read(&p).unwrap();
        assert_eq!(back.len(), 200_000);
        assert!(back[..1000].iter().all(|&b| b == 9));
        assert!(back[1000..151_000].iter().all(|&b| b == 0));
        assert!(back[151_000..].iter().all(|&b| b == 9));
        let r = fallocate(&file, FallocateFlags::FALLOC_FL_PUNCH_HOLE, 0, 10);
        assert_eq!(r.map_err(|e| e as i32), Err(libc::EOPNOTSUPP));
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn record_locks_and_flock() {
    with_mount("record_locks_and_flock", |f| {
        let p = f.path("locked");
        fs::write(&p, b"0123456789").unwrap();
        let a = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let b = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        // flock: two open file descriptions conflict.
        use nix::fcntl::{Flock, FlockArg};
        let held = Flock::lock(a, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        let other = Flock::lock(b, FlockArg::LockExclusiveNonblock);
        let (b, e) = match other {
            Ok(_) => panic!("a second exclusive flock must fail"),
            Err(pair) => pair,
        };
        assert_eq!(e as i32, libc::EWOULDBLOCK);
        drop(held);
        drop(b);
        // fcntl record locks between processes.
        let file = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let lock = libc::flock {
            l_type: libc::F_WRLCK as i16,
            l_whence: libc::SEEK_SET as i16,
            l_start: 0,
            l_len: 5,
            l_pid: 0,
        };
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETLK(&lock)).unwrap();
        let status = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl,sys,os\nf=open(sys.argv[1],'r+')\ntry:\n fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 5, 0)\n sys.exit(1)\nexcept OSError:\n pass\nfcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 5, 5)\n",
            )
            .arg(&p)
            .output_limited();
        assert!(
            status.status.success(),
            "the other process must see the record lock and get the free range: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn mmap_shared_writable() {
    with_mount("mmap_shared_writable", |f| {
        let p = f.path("m");
        let file = create_rw(&p);
        file.set_len(8192).unwrap();
        use nix::sys::mman::{MapFlags, MsFlags, ProtFlags, mmap, msync, munmap};
        let len = std::num::NonZeroUsize::new(8192).expect("len");
        #[allow(unsafe_code)]
        // SAFETY: a fresh shared mapping of a file we own, unmapped below.
        unsafe {
            let ptr = mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &file,
                0,
            )
            .unwrap();
            let bytes = std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<u8>(), 8192);
            bytes[..5].copy_from_slice(b"mmap!");
            bytes[5000..5003].copy_from_slice(b"abc");
            msync(ptr, 8192, MsFlags::MS_SYNC).unwrap();
            munmap(ptr, 8192).unwrap();
        }
        drop(file);
        let back = fs::read(&p).unwrap();
        assert_eq!(&back[..5], b"mmap!");
        assert_eq!(&back[5000..5003], b"abc");
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn readdir_offsets_are_stable_under_changes() {
    with_mount("readdir_offsets_are_stable_under_changes", |f| {
        let d = f.path("many");
        fs::create_dir(&d).unwrap();
        let name = |i: usize| format!("entry-with-a-fairly-long-name-{i:05}");
        for i in 0..600 {
            fs::write(d.join(name(i)), b"").unwrap();
        }
        let mut dir = nix::dir::Dir::open(
            &d,
            nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        let mut seen = std::collections::HashMap::new();
        let mut removed = std::collections::HashSet::new();
        for (n, entry) in dir.iter().enumerate() {
            let entry = entry.unwrap();
            let s = entry.file_name().to_string_lossy().into_owned();
            *seen.entry(s).or_insert(0) += 1;
            if n == 100 {
                // Change the directory in the middle of the listing.
                for i in (300..600).step_by(3) {
                    fs::remove_file(d.join(name(i))).unwrap();
                    removed.insert(name(i));
                }
                for i in 600..700 {
                    fs::write(d.join(name(i)), b"").unwrap();
                }
            }
        }
        for i in 0..600 {
            let n = name(i);
            if removed.contains(&n) {
                continue;
            }
            assert_eq!(seen.get(&n), Some(&1), "{n} must be listed exactly once");
        }
        assert!(seen.values().all(|&c| c == 1), "no entry is listed twice");
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn sqlite_runs_on_the_mount() {
    // SQLite runs in another process, as any application would: SQLite's
    // Unix VFS holds a process-wide mutex around its file calls, which this
    // test process's own store also needs while serving them.
    with_mount("sqlite_runs_on_the_mount", |f| {
        let script = r#"
import sqlite3, sys
path = sys.argv[1]
a = sqlite3.connect(path, isolation_level=None, timeout=0.1)
a.execute("PRAGMA journal_mode=DELETE")
a.execute("CREATE TABLE t(x)")
a.execute("BEGIN")
for i in range(500):
    a.execute("INSERT INTO t VALUES (?)", (i,))
a.execute("COMMIT")
b = sqlite3.connect(path, isolation_level=None, timeout=0.1)
assert b.execute("SELECT count(*) FROM t").fetchone()[0] == 500
a.execute("BEGIN EXCLUSIVE")
try:
    b.execute("INSERT INTO t VALUES (1)")
    sys.exit("the second connection must be locked out")
except sqlite3.OperationalError as e:
    assert "locked" in str(e), e
a.execute("COMMIT")
a.execute("PRAGMA journal_mode=WAL")
a.execute("INSERT INTO t VALUES (501)")
assert b.execute("SELECT count(*) FROM t").fetchone()[0] == 501
assert b.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
"#;
        let status = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(f.path("app.db"))
            .output_limited();
        assert!(
            status.status.success(),
            "SQLite on the mount failed: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn permissions_by_user() {
    with_mount("permissions_by_user", |f| {
        use crate::unprivileged::{EXTRA_GROUP, FIXTURES_ENV, USER, prepare_fixtures};
        let fixtures = match std::env::var_os(FIXTURES_ENV) {
            Some(d) => std::path::PathBuf::from(d),
            None => {
                let d = f.path("fixtures");
                prepare_fixtures(&d);
                d
            }
        };
        let private = fixtures.join("private");
        let victim = fixtures.join("sticky-victim");
        if is_root() {
            // Root's capabilities: read, write and delete what it does not
            // own, whatever the mode bits say.
            std::os::unix::fs::chown(&private, Some(USER), Some(USER)).unwrap();
            assert_eq!(fs::read(&private).unwrap(), b"secret");
            fs::write(fixtures.join("closed-dir/by-root"), b"").unwrap();
            fs::remove_file(&victim).unwrap();
            let _ = EXTRA_GROUP;
            // chown drops set-user-ID, even root's.
            let suid = f.path("suid-root");
            fs::write(&suid, b"#!/bin/sh\n").unwrap();
            fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).unwrap();
            std::os::unix::fs::chown(&suid, Some(USER), None).unwrap();
            assert_eq!(fs::metadata(&suid).unwrap().mode() & 0o7777, 0o755);
        } else {
            assert_eq!(nix::unistd::geteuid().as_raw(), USER);
            assert_eq!(errno_of(fs::read(&private)), libc::EACCES);
            assert_eq!(errno_of(fs::write(&private, b"x")), libc::EACCES);
            // A supplementary group grants the group bits.
            assert_eq!(
                fs::read(fixtures.join("group-readable")).unwrap(),
                b"for the group"
            );
            assert_eq!(
                errno_of(fs::write(fixtures.join("group-readable"), b"x")),
                libc::EACCES
            );
            assert_eq!(
                errno_of(fs::write(fixtures.join("closed-dir/mine"), b"")),
                libc::EACCES
            );
            // Sticky directory: a writable file of another owner may not be
            // removed or renamed away.
            assert_eq!(errno_of(fs::remove_file(&victim)), libc::EPERM);
            assert_eq!(
                errno_of(fs::rename(&victim, fixtures.join("moved"))),
                libc::EPERM
            );
            fs::write(&victim, b"but writing it is allowed").unwrap();
            // Only the owner may chmod; only root may chown.
            let r = fs::set_permissions(&private, fs::Permissions::from_mode(0o777));
            assert_eq!(errno_of(r), libc::EPERM);
            let mine = f.path("mine");
            fs::write(&mine, b"").unwrap();
            assert_eq!(
                errno_of(std::os::unix::fs::chown(&mine, Some(0), None)),
                libc::EPERM
            );
            // chgrp to a group one belongs to works and clears nothing else.
            std::os::unix::fs::chown(&mine, None, Some(EXTRA_GROUP)).unwrap();
            // A write without CAP_FSETID drops set-user-ID.
            let suid = f.path("suid-mine");
            fs::write(&suid, b"v1").unwrap();
            fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).unwrap();
            assert_eq!(fs::metadata(&suid).unwrap().mode() & 0o7777, 0o4755);
            OpenOptions::new()
                .append(true)
                .open(&suid)
                .unwrap()
                .write_all(b"v2")
                .unwrap();
            assert_eq!(fs::metadata(&suid).unwrap().mode() & 0o7777, 0o755);
            // The owner, a member of the file's group, may set its
            // set-group-ID bit.
            fs::set_permissions(&mine, fs::Permissions::from_mode(0o2755)).unwrap();
            assert_eq!(fs::metadata(&mine).unwrap().mode() & 0o7777, 0o2755);
        }
    });
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_full_disk_gives_enospc_and_loses_nothing_sync_mode() {
    full_disk(
        "a_full_disk_gives_enospc_and_loses_nothing_sync_mode",
        Durability::Sync,
    );
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn a_full_disk_in_async_mode_keeps_fsynced_data_and_refuses_changes() {
    full_disk(
        "a_full_disk_in_async_mode_keeps_fsynced_data_and_refuses_changes",
        Durability::Async,
    );
}

#[test]
#[ignore = "needs root and /dev/fuse: make test runs it as root"]
fn fallocate_asks_for_room_the_disk_has_and_writes_nothing() {
    let name = "fallocate_asks_for_room_the_disk_has_and_writes_nothing";
    require_fuse(name);
    let tmp = tempfile::tempdir().unwrap();
    let disk = tablix_testkit::TinyDisk::mount(name, "8m");
    let small = disk.path().to_path_buf();
    let f = crate::harness::mount_at(Durability::Sync, tmp, small.join("data"));
    let p = f.path("big");
    let file = create_rw(&p);
    use nix::fcntl::{FallocateFlags, fallocate};
    let room = {
        let s = nix::sys::statvfs::statvfs(&small).unwrap();
        s.blocks_available() as i64 * s.fragment_size() as i64
    };
    // More than the data directory's disk holds: refused, nothing changed.
    assert_eq!(
        fallocate(&file, FallocateFlags::empty(), 0, room + (1 << 20)).map_err(|e| e as i32),
        Err(libc::ENOSPC)
    );
    assert_eq!(file.metadata().unwrap().len(), 0);
    // Within it: the size grows and no byte is written for it, so two
    // ranges that together exceed the room both fit.
    let half = room / 2 + 1;
    fallocate(&file, FallocateFlags::empty(), 0, half).unwrap();
    fallocate(&file, FallocateFlags::empty(), half, half).unwrap();
    let m = file.metadata().unwrap();
    assert_eq!(m.len(), 2 * half as u64);
    assert_eq!(m.blocks(), 0);
    use std::os::unix::fs::FileExt;
    let mut tail = [1u8; 4096];
    file.read_exact_at(&mut tail, 2 * half as u64 - 4096)
        .unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    // Bytes written into the range are stored as any write.
    file.write_all_at(b"kept", 10).unwrap();
    file.sync_all().unwrap();
    let mut back = [0u8; 4];
    file.read_exact_at(&mut back, 10).unwrap();
    assert_eq!(&back, b"kept");
}

/// Writes and fsyncs: in async mode a full disk shows at the fsync.
fn write_synced(p: &Path, body: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(p)?;
    file.write_all(body)?;
    file.sync_all()
}

fn full_disk(name: &str, mode: Durability) {
    require_fuse(name);
    let tmp = tempfile::tempdir().unwrap();
    // Unmounted after the file system on it (dropped after `f`).
    let disk = tablix_testkit::TinyDisk::mount(name, "3m");
    let small = disk.path().to_path_buf();
    // Space to give back once the disk is full: on a full disk even an
    // unlink fails (SQLite needs room in its WAL to record it).
    fs::write(small.join("filler"), vec![0u8; 512 * 1024]).unwrap();
    let f = crate::harness::mount_at(mode, tmp, small.join("data"));
    let mut written = Vec::new();
    let mut full = None;
    for i in 0..200 {
        let body = vec![(i % 251) as u8; 64 * 1024];
        match write_synced(&f.path(&format!("f{i}")), &body) {
            Ok(()) => written.push(i),
            Err(e) => {
                full = e.raw_os_error();
                break;
            }
        }
    }
    assert_eq!(full, Some(libc::ENOSPC), "a full disk must give ENOSPC");
    assert!(written.len() > 3, "some files fit: {}", written.len());
    for &i in &written {
        let back = fs::read(f.path(&format!("f{i}"))).unwrap();
        assert!(
            back == vec![(i % 251) as u8; 64 * 1024],
            "f{i} intact after ENOSPC"
        );
    }
    if mode == Durability::Async {
        // Async mode acknowledged operations before the commit that failed
        // (and that SQLite rolled back): the mount refuses further changes
        // rather than let the kernel's view and the rows drift apart.
        let r = write_synced(&f.path("more"), &[1u8; 64 * 1024]);
        assert!(
            matches!(
                r.as_ref().map_err(|e| e.raw_os_error()),
                Err(Some(libc::EIO | libc::ENOSPC))
            ),
            "{r:?}"
        );
        fs::remove_file(small.join("filler")).unwrap();
        let r = write_synced(&f.path("after"), b"refused");
        assert!(
            r.is_err(),
            "changes after a lost flush must fail until restart"
        );
        for &i in &written {
            let back = fs::read(f.path(&format!("f{i}"))).unwrap();
            assert!(back == vec![(i % 251) as u8; 64 * 1024], "f{i} intact");
        }
        return;
    }
    assert_eq!(
        errno_of(write_synced(&f.path("more"), &[1u8; 64 * 1024])),
        libc::ENOSPC
    );
    // Freeing space makes changes work again.
    fs::remove_file(small.join("filler")).unwrap();
    for &i in written.iter().take(4) {
        fs::remove_file(f.path(&format!("f{i}"))).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    fs::write(f.path("after"), b"space again").unwrap();
    assert_eq!(fs::read(f.path("after")).unwrap(), b"space again");
    if let Some(store) = &f.store {
        let applied = store
            .apply_fs(
                tablix_store::Stamp::now(),
                tablix_fs::FsOp::Check {
                    repair: false,
                    verify_data: true,
                },
            )
            .unwrap();
        match applied {
            Ok(tablix_fs::FsReply::Checked(r)) => {
                let unexpected: Vec<_> =
                    r.problems.iter().filter(|p| !p.starts_with("5:")).collect();
                assert!(unexpected.is_empty(), "{r:?}");
            }
            other => panic!("check: {other:?}"),
        }
    }
}
