/* SPDX-License-Identifier: Apache-2.0 */
/* The POSIX store: checkpoints as directories of a local (or mounted) file system. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/engine.h"
#include "store.h"

static int remove_at(int at, const char *name, int depth)
{
    if (depth > 64) return -ELOOP;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOTDIR && errno != ELOOP) return errno == ENOENT ? 0 : -errno;
        return unlinkat(at, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = -errno;
        close(fd);
        return e;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        int r = remove_at(dirfd(d), de->d_name, depth + 1);
        if (r < 0 && !rc) rc = r;
    }
    closedir(d);
    if (unlinkat(at, name, AT_REMOVEDIR) < 0 && errno != ENOENT && !rc) rc = -errno;
    return rc;
}

int ckptio__remove_tree(const char *path)
{
    return remove_at(AT_FDCWD, path, 0);
}

/* Whether directory `path` holds a manifest file (0/1), or -errno. */
static int has_manifest(const char *path)
{
    char *m;
    if (asprintf(&m, "%s/manifest", path) < 0) return -ENOMEM;
    struct stat st;
    int rc = stat(m, &st) == 0 ? S_ISREG(st.st_mode) : errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
    free(m);
    return rc;
}

static int posix_list(const char *path, ckptio__names *out, ckptio__msg *msg)
{
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return 0; /* no directory: no checkpoints */
        return ckptio__fail(msg, -errno, "cannot list '%s'", path);
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *sub;
        if (asprintf(&sub, "%s/%s", path, e->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (has_manifest(sub) == 1) rc = ckptio__names_add(out, e->d_name, strlen(e->d_name));
        free(sub);
    }
    closedir(d);
    return rc;
}

static int posix_is_checkpoint(const char *path, ckptio__msg *msg)
{
    int rc = has_manifest(path);
    return rc < 0 ? ckptio__fail(msg, rc, "cannot look into '%s'", path) : rc;
}

/* Renamed out of every listing first ("<path>.deleting-<pid>", then the parent fsynced), so
 * a crash never leaves a checkpoint half removed under its name; then the tree goes. */
static int posix_remove(const char *path, ckptio__msg *msg)
{
    int rc = has_manifest(path);
    if (rc <= 0)
        return ckptio__fail(msg, rc == 0 ? CKPTIO_E_NOT_CHECKPOINT : rc,
                            "'%s' is not a checkpoint: it has no manifest", path);
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    char *gone = NULL, *parent = NULL;
    if (asprintf(&gone, "%.*s.deleting-%ld", (int)len, path, (long)getpid()) < 0) return -ENOMEM;
    const char *slash = memrchr(path, '/', len);
    parent = slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!parent) rc = -ENOMEM;
    else if (rename(path, gone) < 0)
        rc = ckptio__fail(msg, -errno, "cannot move '%s' out of the way to remove it", path);
    else if ((rc = ckptio__fsync_path(parent)) < 0)
        rc = ckptio__fail(msg, rc, "removing '%s': fsync of '%s' failed", path, parent);
    if (rc == 0 && (rc = ckptio__remove_tree(gone)) < 0)
        rc = ckptio__fail(msg, rc, "cannot remove '%s' (the checkpoint '%s' is gone)", gone, path);
    free(gone);
    free(parent);
    return rc;
}

const ckptio__store_ops ckptio__store_posix = {
    .name = "posix",
    .scheme = NULL,
    .list = posix_list,
    .is_checkpoint = posix_is_checkpoint,
    .remove = posix_remove,
};
