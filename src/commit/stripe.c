/* SPDX-License-Identifier: Apache-2.0 */
/* Stripe directories in other roots: create, make durable, remove, and collect leftovers. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../io/engine.h"
#include "../io/vfs.h"
#include "stripe.h"
#include "txn.h"

/* The checkpoint's name, kept to [A-Za-z0-9._-] (the format's file name characters) and 96
 * bytes, so that an operator listing a root sees whose stripe it is. */
static void stem(const char *owner, char *out, size_t cap)
{
    const char *slash = strrchr(owner, '/');
    const char *base = slash ? slash + 1 : owner;
    size_t n = 0;
    for (; *base && n + 1 < cap && n < 96; base++) {
        char c = *base;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        out[n++] = ok ? c : '_';
    }
    if (n && out[0] == '.') out[0] = '_';
    out[n] = 0;
}

static uint64_t stripe_id(void)
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Unique within the process even without /dev/urandom. */
    return v ^ ((uint64_t)ts.tv_nsec << 20) ^ ((uint64_t)getpid() << 40) ^ ckptio__tmp_id();
}

static int write_text(int dirfd, const char *name, const char *text)
{
    int fd = ckptio__vfs_open(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -errno;
    size_t n = strlen(text), done = 0;
    int rc = 0;
    while (done < n) {
        ssize_t k = CKPTIO__VFS->write(fd, text + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = -errno;
            break;
        }
        done += (size_t)k;
    }
    if (rc == 0 && CKPTIO__VFS->fsync(fd) < 0) rc = -errno;
    close(fd);
    return rc;
}

int ckptio__stripe_create(ckptio__stripe *s, const char *root, const char *owner,
                          ckptio__msg *msg)
{
    *s = (ckptio__stripe){.fd = -1};
    s->root = realpath(root, NULL);
    if (!s->root)
        return ckptio__fail(msg, -errno,
                            "cannot use '%s' as a root for '%s': it must be an existing "
                            "directory",
                            root, owner);
    char base[100];
    stem(owner, base, sizeof base);
    if (asprintf(&s->name, "%s.%016llx%s", base, (unsigned long long)stripe_id(),
                 CKPTIO__STRIPE_SUFFIX) < 0) {
        s->name = NULL;
        return -ENOMEM;
    }
    if (asprintf(&s->path, "%s/%s", s->root, s->name) < 0) {
        s->path = NULL;
        return -ENOMEM;
    }
    if (CKPTIO__VFS->mkdirat(AT_FDCWD, s->path, 0755) < 0)
        return ckptio__fail(msg, -errno, "cannot create stripe directory '%s' for '%s'", s->path,
                            owner);
    s->fd = open(s->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc = s->fd < 0 ? -errno : 0;
    /* The lock comes before the owner file: a collector only considers stripes that have one. */
    if (rc == 0) (void)flock(s->fd, LOCK_EX | LOCK_NB);
    if (rc == 0) rc = write_text(s->fd, CKPTIO__STRIPE_OWNER, owner);
    if (rc == 0 && CKPTIO__VFS->mkdirat(s->fd, "data", 0755) < 0) rc = -errno;
    if (rc < 0)
        return ckptio__fail(msg, rc, "cannot set up stripe directory '%s' for '%s'", s->path,
                            owner);
    return 0;
}

int ckptio__stripe_sync(ckptio__stripe *s, ckptio__msg *msg)
{
    char data[PATH_MAX];
    snprintf(data, sizeof data, "%s/data", s->path);
    int rc = ckptio__fsync_path(data);
    if (rc == 0) rc = ckptio__fsync(s->fd);
    if (rc == 0) rc = ckptio__fsync_path(s->root);
    if (rc < 0) return ckptio__fail(msg, rc, "fsync of stripe directory '%s' failed", s->path);
    return 0;
}

void ckptio__stripe_fini(ckptio__stripe *s)
{
    if (s->path && s->fd >= 0 && !s->keep) ckptio__remove_tree(s->path);
    if (s->fd >= 0) close(s->fd);
    free(s->root);
    free(s->name);
    free(s->path);
    *s = (ckptio__stripe){.fd = -1};
}

/* Whether `fd`'s owner file says exactly `owner`. */
static bool owned_by(int fd, const char *owner)
{
    int f = openat(fd, CKPTIO__STRIPE_OWNER, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0) return false;
    char buf[PATH_MAX + 2];
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    if (n < 0) return false;
    buf[n] = 0;
    return !strcmp(buf, owner);
}

int ckptio__stripe_collect(const char *root, const char *owner, ckptio__stripe_named named,
                           void *ctx, bool dry, unsigned *found)
{
    *found = 0;
    DIR *d = opendir(root);
    if (!d) return -errno;
    size_t sl = strlen(CKPTIO__STRIPE_SUFFIX);
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n <= sl || strcmp(de->d_name + n - sl, CKPTIO__STRIPE_SUFFIX)) continue;
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        /* Locked: a live save's. Then the owner, then (under our lock, so that a save that
         * published it has closed) whether the published checkpoint names it. */
        bool mine = flock(fd, LOCK_EX | LOCK_NB) == 0 && owned_by(fd, owner) &&
                    !named(ctx, de->d_name);
        if (mine) {
            ++*found;
            if (!dry) {
                char path[PATH_MAX];
                snprintf(path, sizeof path, "%s/%s", root, de->d_name);
                ckptio__remove_tree(path);
            }
        }
        close(fd);
    }
    closedir(d);
    return 0;
}
