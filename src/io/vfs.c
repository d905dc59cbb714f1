/* SPDX-License-Identifier: Apache-2.0 */
/* The production file-system table: thin wrappers over the real system calls. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vfs.h"

static int real_openat(int dirfd, const char *path, int flags, mode_t mode)
{
    return openat(dirfd, path, flags, mode);
}

static int real_renameat2(int od, const char *op, int nd, const char *np, unsigned flags)
{
    return renameat2(od, op, nd, np, flags);
}

const ckptio__vfs ckptio__vfs_real = {
    .openat = real_openat,
    .mkdirat = mkdirat,
    .renameat2 = real_renameat2,
    .write = write,
    .pread = pread,
    .pwrite = pwrite,
    .fallocate = fallocate,
    .ftruncate = ftruncate,
    .fsync = fsync,
};

const ckptio__vfs *ckptio__vfs_cur = &ckptio__vfs_real;

const ckptio__vfs *ckptio__vfs_set(const ckptio__vfs *v)
{
    const ckptio__vfs *old = ckptio__vfs_cur;
    ckptio__vfs_cur = v ? v : &ckptio__vfs_real;
    return old;
}
