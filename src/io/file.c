/* SPDX-License-Identifier: Apache-2.0 */
/* Data files: opening (O_DIRECT where allowed, reads kept beneath a dir), alignment, fsync. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine.h"
#include "vfs.h"

#define DIO_DEFAULT_ALIGN 4096u
#define DIO_MIN_ALIGN     512u

/* Without openat2 (Linux < 5.6, or a seccomp filter that hides it): walk the name one
 * component at a time with O_NOFOLLOW, refusing absolute names and "..". Stricter than
 * RESOLVE_BENEATH (no symlink is followed, even one staying inside), never looser. */
static int open_beneath_walk(int dirfd, const char *name, int oflags)
{
    char buf[PATH_MAX];
    size_t len = strlen(name);
    if (name[0] == '/') return -EXDEV;
    if (len >= sizeof buf) return -ENAMETOOLONG;
    memcpy(buf, name, len + 1);

    int cur = dirfd; /* not ours to close until we replace it */
    char *comp = buf;
    for (;;) {
        char *slash = strchr(comp, '/');
        if (slash) *slash = '\0';
        if (!strcmp(comp, "..")) {
            if (cur != dirfd) close(cur);
            return -EXDEV;
        }
        bool last = !slash;
        if (!last && (!*comp || !strcmp(comp, "."))) {
            comp = slash + 1;
            continue;
        }
        int fd = last ? openat(cur, *comp ? comp : ".", oflags | O_NOFOLLOW)
                      : openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        if (cur != dirfd) close(cur);
        if (fd < 0) return -err;
        if (last) return fd;
        cur = fd;
        comp = slash + 1;
    }
}

static int open_beneath(int dirfd, const char *name, int oflags)
{
    struct open_how how = {
        .flags = (uint64_t)oflags,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    long fd;
    do
        fd = syscall(SYS_openat2, dirfd, name, &how, sizeof how);
    while (fd < 0 && errno == EINTR);
    if (fd >= 0) return (int)fd;
    /* Old container seccomp profiles answer unknown syscalls with EPERM, newer with ENOSYS. */
    if (errno != ENOSYS && errno != EPERM) return -errno;
    return open_beneath_walk(dirfd, name, oflags);
}

int ckptio__file_open(int dirfd, const char *name, int flags, int want_direct, int *fd_out,
                      int *direct_out)
{
    int rc = 0, fd = -1, direct = 0;
    CKPTIO__RET_IF(!fd_out, CKPTIO_E_USAGE);
    *fd_out = -1;
    if (direct_out) *direct_out = 0;
    CKPTIO__RET_IF(!name || !*name, CKPTIO_E_USAGE);
    CKPTIO__RET_IF(flags != CKPTIO__F_READ && flags != CKPTIO__F_WRITE &&
                       flags != CKPTIO__F_WRITE_USER,
                   CKPTIO_E_USAGE);
    CKPTIO__RET_IF(want_direct != CKPTIO_AUTO && want_direct != CKPTIO_OFF &&
                       want_direct != CKPTIO_ON,
                   CKPTIO_E_USAGE);

    if (flags == CKPTIO__F_READ) {
        /* O_NONBLOCK so that a FIFO planted in a checkpoint cannot hang the open; only
         * regular files (and block devices) are data files. */
        fd = open_beneath(dirfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        CKPTIO__GOTO_IF(fd < 0, fd);
        struct stat st;
        CKPTIO__GOTO_IF(fstat(fd, &st) < 0, -errno);
        CKPTIO__GOTO_IF(!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode), -EINVAL);
    } else {
        mode_t mode = flags == CKPTIO__F_WRITE_USER ? 0666 : 0644;
        do
            fd = CKPTIO__VFS->openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        while (fd < 0 && errno == EINTR);
        CKPTIO__GOTO_IF(fd < 0, -errno);
    }

    /* O_DIRECT is switched on after the open, not passed to it: a file system that refuses it
     * (tmpfs before Linux 6.6, ramfs, procfs, some FUSE) only says so once the O_CREAT|O_EXCL
     * open has already created the file, which would then block the buffered retry. */
    int fl = fcntl(fd, F_GETFL);
    CKPTIO__GOTO_IF(fl < 0, -errno);
    fl &= ~O_NONBLOCK; /* io_uring would turn O_NONBLOCK into -EAGAIN completions */
    CKPTIO__GOTO_IF(fcntl(fd, F_SETFL, fl) < 0, -errno);
    if (want_direct != CKPTIO_OFF) {
        if (fcntl(fd, F_SETFL, fl | O_DIRECT) == 0)
            direct = 1;
        else
            CKPTIO__GOTO_IF(errno != EINVAL || want_direct == CKPTIO_ON, -errno);
    }
    *fd_out = fd;
    if (direct_out) *direct_out = direct;
    return 0;
out:
    if (fd >= 0) {
        close(fd);
        if (flags != CKPTIO__F_READ) unlinkat(dirfd, name, 0); /* O_EXCL: we created it */
    }
    return rc;
}

static uint32_t sane_align(uint32_t v)
{
    if (v == 0) v = DIO_DEFAULT_ALIGN;
    if (v < DIO_MIN_ALIGN) v = DIO_MIN_ALIGN;
    if (v > (1u << 30)) v = 1u << 30; /* nothing real is this coarse; keeps the shift safe */
    return (uint32_t)(ckptio__is_pow2(v) ? v : 1u << (32 - __builtin_clz(v)));
}

void ckptio__file_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align)
{
    uint32_t mem = 0, off = 0;
#ifdef STATX_DIOALIGN
    struct statx sx;
    /* Reported (Linux 6.1+) only by file systems that know; 0 means no direct I/O here, and
     * then the conservative default is as good as anything. */
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        mem = sx.stx_dio_mem_align;
        off = sx.stx_dio_offset_align;
    }
#else
    CKPTIO__UNUSED(fd);
#endif
    if (mem == 0 || off == 0) mem = off = 0;
    if (mem_align) *mem_align = sane_align(mem);
    if (off_align) *off_align = sane_align(off);
}

int ckptio__fsync(int fd)
{
    while (CKPTIO__VFS->fsync(fd) < 0)
        if (errno != EINTR) return -errno;
    return 0;
}

int ckptio__fsync_path(const char *dir)
{
    CKPTIO__RET_IF(!dir, CKPTIO_E_USAGE);
    int fd = ckptio__vfs_open(AT_FDCWD, dir, O_DIRECTORY | O_RDONLY | O_CLOEXEC, 0);
    CKPTIO__RET_IF(fd < 0, -errno);
    int rc = ckptio__fsync(fd);
    close(fd);
    return rc;
}
