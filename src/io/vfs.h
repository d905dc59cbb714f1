/* SPDX-License-Identifier: Apache-2.0 */
/* The system calls the library makes on files and directories, as one replaceable table. */
#ifndef CKPTIO_VFS_H
#define CKPTIO_VFS_H

#include <errno.h>
#include <sys/types.h>

#include "../common/common.h"

struct ckptio__req;

/* Every call that creates, writes, reads data of, syncs, or renames a file of a checkpoint goes
 * through this table (SQLite's sqlite3_vfs), so that a test can make any one of them fail, or
 * crash the process at it, and check that nothing is lost. Entries follow the system calls'
 * convention: -1 with errno set on failure. Production uses the real calls; only the tests
 * install another table, before any I/O starts (the pointer is read without a lock). */
typedef struct ckptio__vfs {
    int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
    int (*mkdirat)(int dirfd, const char *path, mode_t mode);
    int (*renameat2)(int olddir, const char *oldpath, int newdir, const char *newpath,
                     unsigned flags);
    ssize_t (*write)(int fd, const void *buf, size_t n);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
    int (*fallocate)(int fd, int mode, off_t off, off_t len);
    int (*ftruncate)(int fd, off_t len);
    int (*fsync)(int fd);
    /* Engine requests, whatever the backend (io_uring never calls pread/pwrite here):
     * req_submit may refuse a request (-errno), req_done may change its result. NULL: none. */
    int (*req_submit)(struct ckptio__req *r);
    void (*req_done)(struct ckptio__req *r);
} ckptio__vfs;

CKPTIO__HIDDEN extern const ckptio__vfs ckptio__vfs_real;
CKPTIO__HIDDEN extern const ckptio__vfs *ckptio__vfs_cur;
#define CKPTIO__VFS (ckptio__vfs_cur)

/* openat through the table, retrying EINTR (an open may be interrupted on slow file
 * systems, NFS among them). */
static inline int ckptio__vfs_open(int dirfd, const char *path, int flags, mode_t mode)
{
    int fd;
    do
        fd = CKPTIO__VFS->openat(dirfd, path, flags, mode);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Install `v` (NULL: the real calls); returns the previous table. Tests only. */
CKPTIO__HIDDEN const ckptio__vfs *ckptio__vfs_set(const ckptio__vfs *v);

#endif
