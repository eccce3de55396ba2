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
 *
 * The C library's stdio reads through its own internal read, which no
 * preload library can replace, so its input functions are wrapped too:
 * __uflow (what getc_unlocked calls on an empty buffer) restarts the
 * interrupted refill; getc, fgetc, getchar and their unlocked forms,
 * fgets and getdelim/getline read through it, a character at a time from
 * the stream's buffer; fread restarts its own transfer, counting bytes.
 * Output (fwrite, fputs, printf) and scanf are not wrapped: there an
 * interrupted write or read fails with EINTR and sets the stream's error.
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
#include <limits.h>
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

/* ----- stdio input ----- */

/* The headers may define these as macros; here they are functions. */
#undef getc
#undef getc_unlocked
#undef fgetc_unlocked
#undef getchar_unlocked
#undef fread_unlocked

/* Whether `f`'s read failed with an interruption to be restarted: its
 * error flag is set now but was not before, errno is EINTR, the stream
 * reads a tablix pipe and every handler asks for restarts. */
static int stream_restarts(FILE *f, int had_error)
{
    return !had_error && (f->_flags & _IO_ERR_SEEN) && restart(f->_fileno);
}

typedef int (*uflow_fn)(FILE *);

/* Refills `f`'s buffer and takes a character (the slow path of
 * getc_unlocked), restarting an interrupted refill. */
int __uflow(FILE *f)
{
    NEXT(__uflow, uflow_fn)
    int had_error = f->_flags & _IO_ERR_SEEN;
    for (;;) {
        int c = real___uflow(f);
        if (c != EOF || !stream_restarts(f, had_error))
            return c;
        f->_flags &= ~_IO_ERR_SEEN;
    }
}

/* A character from `f`, its lock held: the C library's macro, whose slow
 * path is the __uflow above. */
static int take(FILE *f)
{
    return __getc_unlocked_body(f);
}

int getc_unlocked(FILE *f)
{
    return take(f);
}

int fgetc_unlocked(FILE *f)
{
    return take(f);
}

int getchar_unlocked(void)
{
    return take(stdin);
}

int getc(FILE *f)
{
    flockfile(f);
    int c = take(f);
    funlockfile(f);
    return c;
}

int fgetc(FILE *f)
{
    return getc(f);
}

int _IO_getc(FILE *f)
{
    return getc(f);
}

int getchar(void)
{
    return getc(stdin);
}

/* fgets as the C library has it (the stream's earlier error is kept
 * aside; NULL when nothing was read or a read failed), reading through
 * take(). */
static char *fgets_locked(char *s, int n, FILE *f)
{
    if (n <= 0)
        return NULL;
    if (n == 1) {
        s[0] = 0;
        return s;
    }
    int old_error = f->_flags & _IO_ERR_SEEN;
    f->_flags &= ~_IO_ERR_SEEN;
    int count = 0;
    while (count < n - 1) {
        int c = take(f);
        if (c == EOF)
            break;
        s[count++] = (char)c;
        if (c == '\n')
            break;
    }
    char *result;
    if (count == 0 || ((f->_flags & _IO_ERR_SEEN) && errno != EAGAIN)) {
        result = NULL;
    } else {
        s[count] = 0;
        result = s;
    }
    f->_flags |= old_error;
    return result;
}

char *fgets_unlocked(char *s, int n, FILE *f)
{
    return fgets_locked(s, n, f);
}

char *fgets(char *s, int n, FILE *f)
{
    flockfile(f);
    char *r = fgets_locked(s, n, f);
    funlockfile(f);
    return r;
}

void __chk_fail(void) __attribute__((noreturn));

char *__fgets_chk(char *s, size_t size, int n, FILE *f)
{
    if ((size_t)n > size)
        __chk_fail();
    return fgets(s, n, f);
}

char *__fgets_unlocked_chk(char *s, size_t size, int n, FILE *f)
{
    if ((size_t)n > size)
        __chk_fail();
    return fgets_unlocked(s, n, f);
}

/* getdelim as the C library has it: the line, delimiter included, in a
 * buffer grown as needed; -1 when nothing was read. */
ssize_t getdelim(char **line, size_t *cap, int delim, FILE *f)
{
    if (!line || !cap) {
        errno = EINVAL;
        return -1;
    }
    if (!*line || *cap == 0) {
        size_t want = 120;
        char *p = realloc(*line, want);
        if (!p) {
            errno = ENOMEM;
            return -1;
        }
        *line = p;
        *cap = want;
    }
    flockfile(f);
    size_t len = 0;
    ssize_t result = -1;
    for (;;) {
        int c = take(f);
        if (c == EOF)
            break;
        if (len + 1 >= *cap) {
            size_t want = *cap * 2;
            if (want > (size_t)SSIZE_MAX) {
                errno = EOVERFLOW;
                f->_flags |= _IO_ERR_SEEN;
                goto out;
            }
            char *p = realloc(*line, want);
            if (!p) {
                errno = ENOMEM;
                f->_flags |= _IO_ERR_SEEN;
                goto out;
            }
            *line = p;
            *cap = want;
        }
        (*line)[len++] = (char)c;
        if (c == delim)
            break;
    }
    if (len > 0) {
        (*line)[len] = 0;
        result = (ssize_t)len;
    }
out:
    funlockfile(f);
    return result;
}

ssize_t __getdelim(char **line, size_t *cap, int delim, FILE *f)
{
    return getdelim(line, cap, delim, f);
}

ssize_t getline(char **line, size_t *cap, FILE *f)
{
    return getdelim(line, cap, '\n', f);
}

typedef size_t (*fread_fn)(void *, size_t, size_t, FILE *);

/* fread, restarting an interrupted transfer where it stopped: the C
 * library's own reads the bytes in whole, so they are counted one by one. */
static size_t fread_restarting(void *p, size_t size, size_t n, FILE *f, fread_fn real)
{
    if (size == 0 || n == 0)
        return 0;
    size_t total;
    if (__builtin_mul_overflow(size, n, &total)) {
        errno = EOVERFLOW;
        return 0;
    }
    int had_error = f->_flags & _IO_ERR_SEEN;
    size_t done = 0;
    while (done < total) {
        size_t got = real((char *)p + done, 1, total - done, f);
        done += got;
        if (done == total || !stream_restarts(f, had_error))
            break;
        f->_flags &= ~_IO_ERR_SEEN;
    }
    return done / size;
}

size_t fread(void *p, size_t size, size_t n, FILE *f)
{
    NEXT(fread, fread_fn)
    flockfile(f);
    size_t r = fread_restarting(p, size, n, f, real_fread);
    funlockfile(f);
    return r;
}

size_t fread_unlocked(void *p, size_t size, size_t n, FILE *f)
{
    NEXT(fread_unlocked, fread_fn)
    return fread_restarting(p, size, n, f, real_fread_unlocked);
}

size_t __fread_chk(void *p, size_t room, size_t size, size_t n, FILE *f)
{
    size_t total;
    if (__builtin_mul_overflow(size, n, &total) || total > room)
        __chk_fail();
    return fread(p, size, n, f);
}

size_t __fread_unlocked_chk(void *p, size_t room, size_t size, size_t n, FILE *f)
{
    size_t total;
    if (__builtin_mul_overflow(size, n, &total) || total > room)
        __chk_fail();
    return fread_unlocked(p, size, n, f);
}
