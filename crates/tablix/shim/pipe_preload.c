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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
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
