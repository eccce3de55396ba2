/*
 * The LD_PRELOAD library of `tablix run`: pipe() and pipe2() return the
 * two ends of a new database-backed pipe instead of a kernel pipe.
 *
 * A pipe is made by creating a uniquely named pipe file in the mount's
 * pipes directory ($TABLIX_PIPE_DIR) for reading, opening it again for
 * writing, and removing the name: what remains are two ordinary file
 * descriptors, inherited across fork and exec like any other, whose last
 * close the daemon sees. Without $TABLIX_PIPE_DIR the calls fall through
 * to the C library.
 *
 * A pipe file must be a regular file to reach the FUSE file system, but
 * programs treat regular files differently from pipes (GNU head tries to
 * seek back, sort sizes its buffers from the length), so the stat family
 * is wrapped too: a tablix pipe (an inode of the pipes range on the
 * mount's device) is reported as a FIFO of length 0, as Linux reports a
 * pipe.
 *
 * A blocked call on a tablix pipe that a signal interrupts comes back with
 * EINTR even under SA_RESTART (a FUSE file system cannot ask the kernel to
 * restart a call). read, write, readv and writev are wrapped to restart
 * such a call themselves when every installed handler asks for restarts,
 * which is what the kernel would have done for whichever signal it was.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/sysmacros.h>
#include <unistd.h>

typedef int (*pipe2_fn)(int[2], int);

static int libc_pipe2(int fds[2], int flags)
{
    static pipe2_fn real;
    if (!real)
        real = (pipe2_fn)dlsym(RTLD_NEXT, "pipe2");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(fds, flags);
}

static atomic_uint serial;

int pipe2(int fds[2], int flags)
{
    const char *dir = getenv("TABLIX_PIPE_DIR");
    if (!dir || !*dir)
        return libc_pipe2(fds, flags);
    if (flags & ~(O_CLOEXEC | O_NONBLOCK | O_DIRECT)) {
        errno = EINVAL;
        return -1;
    }
    /* Packet mode (O_DIRECT) keeps write boundaries, which a database
     * pipe does not: such pipes stay kernel pipes. */
    if (flags & O_DIRECT)
        return libc_pipe2(fds, flags);
    int keep = flags & (O_CLOEXEC | O_NONBLOCK);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/anon-%d-%u-%ld", dir, (int)getpid(),
                     atomic_fetch_add(&serial, 1), (long)ts.tv_nsec);
    if (n < 0 || (size_t)n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int r = open(path, O_RDONLY | O_CREAT | O_EXCL | keep, 0600);
    if (r < 0)
        return -1;
    int w = open(path, O_WRONLY | keep);
    int saved = errno;
    unlink(path);
    if (w < 0) {
        close(r);
        errno = saved;
        return -1;
    }
    fds[0] = r;
    fds[1] = w;
    return 0;
}

int pipe(int fds[2])
{
    return pipe2(fds, 0);
}

/* Inode numbers of pipe files start here (tablix-fuse's PIPE_INO_BASE). */
#define PIPE_INO_BASE (1ULL << 49)

/* Not declared by current glibc headers, still called by old binaries. */
int __fxstat(int ver, int fd, struct stat *st);
int __fxstat64(int ver, int fd, struct stat64 *st);
int __xstat(int ver, const char *path, struct stat *st);
int __lxstat(int ver, const char *path, struct stat *st);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags);

static dev_t pipes_dev;
static atomic_int pipes_dev_known;

static int real_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    typedef int (*fn)(int, const char *, struct stat *, int);
    static fn real;
    if (!real)
        real = (fn)dlsym(RTLD_NEXT, "fstatat");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(dirfd, path, st, flags);
}

static int is_pipe(dev_t dev, unsigned long long ino, mode_t mode)
{
    if (!S_ISREG(mode) || ino < PIPE_INO_BASE)
        return 0;
    const char *dir = getenv("TABLIX_PIPE_DIR");
    if (!dir || !*dir)
        return 0;
    if (!atomic_load(&pipes_dev_known)) {
        struct stat d;
        if (real_fstatat(AT_FDCWD, dir, &d, 0) != 0)
            return 0;
        pipes_dev = d.st_dev;
        atomic_store(&pipes_dev_known, 1);
    }
    return dev == pipes_dev;
}

static int fix(int rc, struct stat *st)
{
    if (rc == 0 && is_pipe(st->st_dev, st->st_ino, st->st_mode)) {
        st->st_mode = S_IFIFO | (st->st_mode & 07777);
        st->st_size = 0;
        st->st_blocks = 0;
        st->st_blksize = 4096;
    }
    return rc;
}

int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    return fix(real_fstatat(dirfd, path, st, flags), st);
}

int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
    return fstatat(dirfd, path, (struct stat *)st, flags);
}

int fstat(int fd, struct stat *st)
{
    return fstatat(fd, "", st, AT_EMPTY_PATH);
}

int fstat64(int fd, struct stat64 *st)
{
    return fstat(fd, (struct stat *)st);
}

int stat(const char *path, struct stat *st)
{
    return fstatat(AT_FDCWD, path, st, 0);
}

int stat64(const char *path, struct stat64 *st)
{
    return stat(path, (struct stat *)st);
}

int lstat(const char *path, struct stat *st)
{
    return fstatat(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

int lstat64(const char *path, struct stat64 *st)
{
    return lstat(path, (struct stat *)st);
}

int __fxstat(int ver, int fd, struct stat *st)
{
    (void)ver;
    return fstat(fd, st);
}

int __fxstat64(int ver, int fd, struct stat64 *st)
{
    (void)ver;
    return fstat(fd, (struct stat *)st);
}

int __xstat(int ver, const char *path, struct stat *st)
{
    (void)ver;
    return stat(path, st);
}

int __lxstat(int ver, const char *path, struct stat *st)
{
    (void)ver;
    return lstat(path, st);
}

int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
    (void)ver;
    return fstatat(dirfd, path, st, flags);
}

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *stx)
{
    typedef int (*fn)(int, const char *, int, unsigned int, struct statx *);
    static fn real;
    if (!real)
        real = (fn)dlsym(RTLD_NEXT, "statx");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    int rc = real(dirfd, path, flags, mask, stx);
    if (rc == 0 && (stx->stx_mask & STATX_TYPE) && (stx->stx_mask & STATX_INO)) {
        dev_t dev = makedev(stx->stx_dev_major, stx->stx_dev_minor);
        if (is_pipe(dev, stx->stx_ino, stx->stx_mode)) {
            stx->stx_mode = S_IFIFO | (stx->stx_mode & 07777);
            stx->stx_size = 0;
            stx->stx_blocks = 0;
            stx->stx_blksize = 4096;
        }
    }
    return rc;
}

/* Whether every caught signal's handler has SA_RESTART. */
static int handlers_restart(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) != 0)
            continue;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
            continue;
        if (!(sa.sa_flags & SA_RESTART))
            return 0;
    }
    return 1;
}

/* After EINTR on `fd`: whether the call is to be made again. Keeps errno. */
static int restart(int fd)
{
    int saved = errno;
    struct stat st;
    int again = saved == EINTR && real_fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 &&
                is_pipe(st.st_dev, st.st_ino, st.st_mode) && handlers_restart();
    errno = saved;
    return again;
}

typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*iov_fn)(int, const struct iovec *, int);

/* Looks up the C library's `name` once. */
#define NEXT(name, type)                                                                           \
    static type real_##name;                                                                       \
    if (!real_##name)                                                                              \
        real_##name = (type)dlsym(RTLD_NEXT, #name);                                               \
    if (!real_##name) {                                                                            \
        errno = ENOSYS;                                                                            \
        return -1;                                                                                 \
    }

ssize_t read(int fd, void *buf, size_t n)
{
    NEXT(read, read_fn)
    ssize_t r;
    do
        r = real_read(fd, buf, n);
    while (r < 0 && restart(fd));
    return r;
}

ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
    (void)buflen;
    return read(fd, buf, n);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    NEXT(write, write_fn)
    ssize_t r;
    do
        r = real_write(fd, buf, n);
    while (r < 0 && restart(fd));
    return r;
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
    NEXT(readv, iov_fn)
    ssize_t r;
    do
        r = real_readv(fd, iov, n);
    while (r < 0 && restart(fd));
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
    NEXT(writev, iov_fn)
    ssize_t r;
    do
        r = real_writev(fd, iov, n);
    while (r < 0 && restart(fd));
    return r;
}
