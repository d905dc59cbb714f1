/* SPDX-License-Identifier: Apache-2.0 */
/* The commit transaction: begin beside the target, publish by rename, or abort and leave it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/engine.h"
#include "../io/vfs.h"
#include "../store/s3.h"
#include "txn.h"

/* ---- path helpers ---- */

static _Atomic unsigned tmp_counter;

unsigned ckptio__tmp_id(void)
{
    return atomic_fetch_add(&tmp_counter, 1);
}

char *ckptio__parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int ckptio__follow_links(const char *path, char **out)
{
    *out = NULL;
    char *cur = strdup(path);
    if (!cur) return -ENOMEM;
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) < 0 || !S_ISLNK(st.st_mode)) break;
        if (hops == 40) {
            free(cur);
            return -ELOOP;
        }
        char target[PATH_MAX];
        ssize_t n = readlink(cur, target, sizeof target - 1);
        if (n < 0) break; /* replaced meanwhile: let the caller's own open report it */
        target[n] = 0;
        char *next = NULL;
        if (target[0] == '/' || !strchr(cur, '/')) {
            next = strdup(target);
        } else {
            char *dir = ckptio__parent_dir(cur);
            if (dir && asprintf(&next, "%s/%s", dir, target) < 0) next = NULL;
            free(dir);
        }
        free(cur);
        if (!next) return -ENOMEM;
        cur = next;
    }
    *out = cur;
    return 0;
}

/* ---- begin ---- */

/* A path that is a symlink (latest -> step-1000) is saved through: what it points to is what
 * is created or replaced, beside it, and the link stays a link. A directory target loses its
 * trailing slashes and must end in a real name. */
static int resolve(ckptio__txn *t, const char *path, ckptio__msg *msg)
{
    size_t len = strlen(path);
    if (t->kind == CKPTIO__TXN_DIR)
        while (len > 1 && path[len - 1] == '/') len--;
    char *given = strndup(path, len);
    if (!given) return -ENOMEM;
    int rc = ckptio__follow_links(given, &t->path);
    free(given);
    if (rc < 0)
        return ckptio__fail(msg, rc, "cannot save to '%s'%s", path,
                            rc == -ELOOP ? ": too many levels of symbolic links" : "");
    len = strlen(t->path);
    if (t->kind == CKPTIO__TXN_DIR) /* a link's target may end in '/' too */
        while (len > 1 && t->path[len - 1] == '/') t->path[--len] = 0;
    t->parent = ckptio__parent_dir(t->path);
    if (!t->parent) return -ENOMEM;
    if (t->kind != CKPTIO__TXN_DIR) return 0;
    char *slash = strrchr(t->path, '/');
    const char *base = slash ? slash + 1 : t->path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "'%s' does not name a checkpoint directory; give a path like "
                            "ckpt/step-1000",
                            path);
    return 0;
}

/* 1 if directory `path` has no entries, 0 if it has some, -errno if it cannot be read. */
static int dir_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return -errno;
    struct dirent *de;
    int empty = 1;
    while (empty && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

/* What is at a directory target. It may be replaced only if it is a committed checkpoint or an
 * empty directory, so that overwrite can never destroy something that is not ours. Nothing is
 * changed here: until publish's rename the path stays exactly as it was. */
static int inspect_dir(ckptio__txn *t, ckptio__msg *msg)
{
    struct stat st;
    t->found = CKPTIO__AT_NOTHING;
    t->found_mode = 0;
    if (lstat(t->path, &st) < 0) {
        if (errno == ENOENT) return 0;
        return ckptio__fail(msg, -errno, "cannot inspect '%s'", t->path);
    }
    if (!(t->flags & CKPTIO__TXN_OVERWRITE))
        return ckptio__fail(msg, CKPTIO_E_EXISTS,
                            "'%s' already exists; pass overwrite to replace it, or choose "
                            "another path",
                            t->path);
    if (!S_ISDIR(st.st_mode))
        return ckptio__fail(msg, CKPTIO_E_EXISTS,
                            "'%s' exists and is not a directory; refusing to replace it",
                            t->path);
    t->found_mode = st.st_mode;
    char mpath[PATH_MAX];
    if (snprintf(mpath, sizeof mpath, "%s/manifest", t->path) >= (int)sizeof mpath)
        return ckptio__fail(msg, -ENAMETOOLONG, "path '%s' is too long", t->path);
    if (access(mpath, F_OK) == 0) {
        t->found = CKPTIO__AT_CHECKPOINT;
        return 0;
    }
    int empty = dir_empty(t->path);
    if (empty == 1) t->found = CKPTIO__AT_EMPTY_DIR;
    if (empty == 1 || empty == -ENOENT) return 0;
    return ckptio__fail(msg, CKPTIO_E_EXISTS,
                        "'%s' exists and is not a ckptio checkpoint (no manifest); refusing to "
                        "replace it",
                        t->path);
}

/* A file target may be replaced (with overwrite) by anything but a directory. */
static int inspect_file(ckptio__txn *t, const char *given, ckptio__msg *msg)
{
    struct stat st;
    if (lstat(t->path, &st) != 0) return 0;
    bool link = strcmp(given, t->path) != 0;
    if (!(t->flags & CKPTIO__TXN_OVERWRITE) || S_ISDIR(st.st_mode))
        return ckptio__fail(msg, CKPTIO_E_EXISTS, "'%s'%s%s%s already exists%s", given,
                            link ? " (a symlink to '" : "", link ? t->path : "",
                            link ? "')" : "",
                            S_ISDIR(st.st_mode) ? " and is a directory; refusing to replace it"
                                                : "; pass overwrite to replace it");
    t->found = CKPTIO__AT_FILE;
    t->found_mode = st.st_mode;
    return 0;
}

/* Whether `ent` is "<base>.tmp-<pid>.<n>" (decimal pid and n, nothing after); sets *pid. */
static bool stale_name(const char *ent, const char *base, size_t blen, long *pid)
{
    if (strncmp(ent, base, blen) || strncmp(ent + blen, ".tmp-", 5)) return false;
    const char *p = ent + blen + 5;
    char *end;
    if (*p < '1' || *p > '9') return false;
    long v = strtol(p, &end, 10);
    if (*end != '.' || end[1] < '0' || end[1] > '9') return false;
    for (p = end + 1; *p; p++)
        if (*p < '0' || *p > '9') return false;
    *pid = v;
    return v > 0 && v <= INT_MAX;
}

/* Remove the temporaries that killed saves of this same name left behind: directories for a
 * checkpoint, files for a single file (ckptio.torch.save). One is removed only if all hold: its
 * name is exactly <name>.tmp-<pid>.<n>; it is of the transaction's kind (a directory, or a
 * regular file), not a symlink; <pid> is not ours and no such process exists (kill(pid, 0)
 * gives ESRCH); and no one holds its lock (a live writer keeps flock(LOCK_EX) on its temporary,
 * which also covers a writer in another pid namespace on the same machine). Where the lock
 * cannot be taken for any reason (NFS), it stays. Best effort: failures are ignored, the save
 * goes on. */
static void clean_stale(const ckptio__txn *t)
{
    const char *slash = strrchr(t->path, '/');
    const char *base = slash ? slash + 1 : t->path;
    size_t blen = strlen(base);
    bool dir = t->kind == CKPTIO__TXN_DIR;
    int pfd = open(t->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return;
    DIR *d = fdopendir(pfd);
    if (!d) {
        close(pfd);
        return;
    }
    struct dirent *de;
    long pid;
    while ((de = readdir(d))) {
        if (!stale_name(de->d_name, base, blen, &pid) || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        int fd = openat(dirfd(d), de->d_name,
                        O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (dir ? O_DIRECTORY : O_NONBLOCK));
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) &&
            flock(fd, LOCK_EX | LOCK_NB) == 0) {
            char *full = NULL;
            if (!dir)
                (void)unlinkat(dirfd(d), de->d_name, 0);
            else if (asprintf(&full, "%s/%s", t->parent, de->d_name) >= 0)
                ckptio__remove_tree(full);
            free(full);
        }
        close(fd); /* drops the lock, after the temporary is gone */
    }
    closedir(d);
}

static int make_tmp_dir(ckptio__txn *t, ckptio__msg *msg)
{
    size_t len = strlen(t->path) + 64;
    t->tmp_path = malloc(len);
    if (!t->tmp_path) return -ENOMEM;
    for (int tries = 0; tries < 1000; tries++) {
        snprintf(t->tmp_path, len, "%s.tmp-%d.%u", t->path, (int)getpid(), ckptio__tmp_id());
        if (CKPTIO__VFS->mkdirat(AT_FDCWD, t->tmp_path, 0755) == 0) goto made;
        if (errno != EEXIST)
            return ckptio__fail(msg, -errno, "cannot create directory '%s' (is '%s' writable?)",
                                t->tmp_path, t->parent);
    }
    return ckptio__fail(msg, -EEXIST, "cannot find a free temporary name next to '%s'", t->path);
made:
    t->owner = true;
    t->tmp_fd = ckptio__vfs_open(AT_FDCWD, t->tmp_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (t->tmp_fd < 0) return ckptio__fail(msg, -errno, "cannot open '%s'", t->tmp_path);
    /* Held until fini: tells clean_stale() in other processes that this save is alive. */
    (void)flock(t->tmp_fd, LOCK_EX | LOCK_NB);
    return 0;
}

static int make_tmp_file(ckptio__txn *t, int direct, ckptio__msg *msg)
{
    size_t len = strlen(t->path) + 64;
    t->tmp_path = malloc(len);
    if (!t->tmp_path) return -ENOMEM;
    int rc;
    for (int tries = 0;; tries++) {
        snprintf(t->tmp_path, len, "%s.tmp-%d.%u", t->path, (int)getpid(), ckptio__tmp_id());
        rc = ckptio__file_open(AT_FDCWD, t->tmp_path, CKPTIO__F_WRITE_USER, direct, &t->fd,
                               &t->direct);
        if (rc != -EEXIST || tries > 1000) break;
    }
    if (rc < 0) {
        t->fd = -1;
        return ckptio__fail(msg, rc, "cannot create a temporary file next to '%s'", t->path);
    }
    t->owner = true;
    /* Held until the file is closed: tells clean_stale() in other processes it is alive. */
    (void)flock(t->fd, LOCK_EX | LOCK_NB);
    return 0;
}

static void txn_init(ckptio__txn *t, int kind, unsigned flags)
{
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->flags = flags;
    t->tmp_fd = t->fd = -1;
}

int ckptio__txn_begin(ckptio__txn *t, const char *path, int kind, unsigned flags, int direct,
                      ckptio__msg *msg)
{
    if (path && kind == CKPTIO__TXN_DIR && ckptio__s3_is_url(path))
        return ckptio__objtxn_begin(t, path, flags, msg);
    txn_init(t, kind, flags);
    if (!path || !*path || (kind != CKPTIO__TXN_DIR && kind != CKPTIO__TXN_FILE))
        return ckptio__fail(msg, CKPTIO_E_USAGE, "internal error: bad commit transaction");
    CKPTIO__TRY(resolve(t, path, msg));
    if (kind == CKPTIO__TXN_FILE) {
        CKPTIO__TRY(inspect_file(t, path, msg));
        clean_stale(t);
        return make_tmp_file(t, direct, msg);
    }
    CKPTIO__TRY(inspect_dir(t, msg));
    clean_stale(t);
    return make_tmp_dir(t, msg);
}

int ckptio__txn_join(ckptio__txn *t, const char *path, const char *tmp_path, unsigned flags,
                     ckptio__msg *msg)
{
    if (path && tmp_path && ckptio__s3_is_url(path))
        return ckptio__objtxn_join(t, path, tmp_path, flags, msg);
    txn_init(t, CKPTIO__TXN_DIR, flags);
    if (!path || !*path || !tmp_path)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "internal error: bad commit transaction");
    CKPTIO__TRY(resolve(t, path, msg));
    t->tmp_path = strdup(tmp_path);
    if (!t->tmp_path) return -ENOMEM;
    t->tmp_fd = ckptio__vfs_open(AT_FDCWD, t->tmp_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (t->tmp_fd < 0)
        return ckptio__fail(msg, -errno, "cannot open '%s' (begun by another process?)",
                            t->tmp_path);
    return 0;
}

/* ---- publish ---- */

/* rename through the vfs, both paths relative to the working directory. */
static int ren(const char *from, const char *to, unsigned flags)
{
    return CKPTIO__VFS->renameat2(AT_FDCWD, from, AT_FDCWD, to, flags);
}

/* Move the temporary directory into place. Replacement swaps the two directories atomically,
 * so the target always names a complete checkpoint, old or new; the old one is left at
 * t->old_path for publish to remove once the swap is durable. */
static int publish_dir(ckptio__txn *t, ckptio__msg *msg)
{
    if (ren(t->tmp_path, t->path, RENAME_NOREPLACE) == 0) return 0;
    int e = errno;
    if (e != EEXIST && e != ENOTEMPTY && e != EINVAL)
        return ckptio__fail(msg, -e, "cannot rename '%s' to '%s'", t->tmp_path, t->path);
    if (e == EINVAL) {
        /* No RENAME_NOREPLACE on this file system: check, then plain rename. */
        if (access(t->path, F_OK) != 0 && ren(t->tmp_path, t->path, 0) == 0) return 0;
    }
    if (!(t->flags & CKPTIO__TXN_OVERWRITE))
        return ckptio__fail(msg, CKPTIO_E_EXISTS,
                            "'%s' appeared while saving (another writer?); the new checkpoint "
                            "was not published",
                            t->path);
    CKPTIO__TRY(inspect_dir(t, msg));
    if (t->found != CKPTIO__AT_CHECKPOINT) {
        /* rename(2) replaces an empty directory atomically and refuses one that has filled
         * since it was inspected. */
        if (ren(t->tmp_path, t->path, 0) == 0) return 0;
        if (errno == ENOTEMPTY || errno == EEXIST)
            return ckptio__fail(msg, CKPTIO_E_EXISTS,
                                "'%s' is no longer empty; refusing to replace it: the new "
                                "checkpoint was not published",
                                t->path);
        return ckptio__fail(msg, -errno, "cannot rename '%s' to '%s'", t->tmp_path, t->path);
    }
    if (ren(t->tmp_path, t->path, RENAME_EXCHANGE) == 0) {
        t->old_path = strdup(t->tmp_path); /* now the old checkpoint */
        return 0;
    }
    if (errno != EINVAL)
        return ckptio__fail(msg, -errno, "cannot swap '%s' into '%s'", t->tmp_path, t->path);
    /* No RENAME_EXCHANGE: move the old one aside first. A crash between the two renames
     * leaves it at <path>.old-*, complete and loadable. */
    char old[PATH_MAX];
    snprintf(old, sizeof old, "%s.old-%d.%u", t->path, (int)getpid(), ckptio__tmp_id());
    if (ren(t->path, old, 0) < 0)
        return ckptio__fail(msg, -errno, "cannot move '%s' aside", t->path);
    if (ren(t->tmp_path, t->path, 0) < 0) {
        int err = -errno;
        /* Put the old one back; if even that fails, say where it is so nothing is lost. */
        if (ren(old, t->path, 0) < 0)
            return ckptio__fail(msg, err,
                                "cannot rename '%s' to '%s', nor move the previous checkpoint "
                                "back: it is intact at '%s'",
                                t->tmp_path, t->path, old);
        return ckptio__fail(msg, err, "cannot rename '%s' to '%s'", t->tmp_path, t->path);
    }
    t->old_path = strdup(old);
    return 0;
}

/* A replaced file keeps its mode, as it would if written in place (a 0600 file stays 0600):
 * taken at publish, not begin, so a chmod meanwhile is honoured. */
static int keep_mode(ckptio__txn *t, ckptio__msg *msg)
{
    struct stat st;
    if (!(t->flags & CKPTIO__TXN_OVERWRITE) || stat(t->path, &st) < 0 || !S_ISREG(st.st_mode))
        return 0;
    if (fchmod(t->fd, st.st_mode & 07777) == 0) return 0;
    return ckptio__fail(msg, -errno, "cannot give '%s' the mode %03o of the file it replaces",
                        t->tmp_path, (unsigned)(st.st_mode & 07777));
}

static int publish_file(ckptio__txn *t, ckptio__msg *msg)
{
    int rc;
    CKPTIO__TRY(keep_mode(t, msg));
    if ((t->flags & CKPTIO__TXN_FSYNC) && (rc = ckptio__fsync(t->fd)) < 0)
        return ckptio__fail(msg, rc, "fsync of '%s' failed: the data may not be on the device",
                            t->tmp_path);
    close(t->fd);
    t->fd = -1;
    /* rename() replaces a file atomically; without overwrite, never clobber one that appeared
     * since begin. */
    if (t->flags & CKPTIO__TXN_OVERWRITE) {
        rc = ren(t->tmp_path, t->path, 0);
    } else {
        rc = ren(t->tmp_path, t->path, RENAME_NOREPLACE);
        if (rc < 0 && errno == EINVAL) { /* no RENAME_NOREPLACE here: link() never replaces */
            rc = link(t->tmp_path, t->path);
            if (rc == 0) unlink(t->tmp_path);
        }
    }
    if (rc < 0) {
        rc = errno == EEXIST ? CKPTIO_E_EXISTS : -errno;
        return ckptio__fail(msg, rc, "cannot publish '%s' as '%s'", t->tmp_path, t->path);
    }
    return 0;
}

int ckptio__txn_publish(ckptio__txn *t, ckptio__msg *msg)
{
    int rc;
    if (!t->owner || t->published)
        return ckptio__fail(msg, CKPTIO_E_STATE,
                            "internal error: '%s' cannot be published by this transaction",
                            t->path ? t->path : "?");
    if (t->kind == CKPTIO__TXN_FILE) {
        CKPTIO__TRY(publish_file(t, msg));
    } else {
        /* The directory's own entries must be durable before the rename exposes them. */
        if ((t->flags & CKPTIO__TXN_FSYNC) && (rc = ckptio__fsync(t->tmp_fd)) < 0)
            return ckptio__fail(msg, rc, "fsync of directory '%s' failed", t->tmp_path);
        CKPTIO__TRY(publish_dir(t, msg));
    }
    /* Past the rename nothing is undone: what was published is complete and visible, only its
     * directory entry may not survive a crash, which is not the same as "not saved". */
    t->published = true;
    rc = (t->flags & CKPTIO__TXN_FSYNC) ? ckptio__fsync_path(t->parent) : 0;
    /* The replaced checkpoint goes only after that fsync, so that no crash finds the target
     * naming a directory already emptied. */
    if (t->old_path) ckptio__remove_tree(t->old_path);
    if (rc < 0)
        return ckptio__fail(msg, CKPTIO_E_NOT_DURABLE,
                            "published at '%s', but its directory entry may not be durable: "
                            "fsync of '%s' failed: %s; the %s is complete; re-run sync or save "
                            "again",
                            t->path, t->parent, strerror(-rc),
                            t->kind == CKPTIO__TXN_FILE ? "file" : "checkpoint");
    return 0;
}

/* ---- abort, fini ---- */

void ckptio__txn_abort(ckptio__txn *t)
{
    if (t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    if (t->obj) {
        ckptio__objtxn_abort(t);
        return;
    }
    if (!t->owner || t->published || !t->tmp_path) return;
    if (t->kind == CKPTIO__TXN_FILE) unlink(t->tmp_path);
    else ckptio__remove_tree(t->tmp_path);
    t->owner = false; /* done: a second abort finds nothing of ours */
}

void ckptio__txn_fini(ckptio__txn *t)
{
    if (!t || !t->kind) return;
    ckptio__txn_abort(t);
    if (t->tmp_fd >= 0) close(t->tmp_fd); /* drops the lock, after the directory is gone */
    if (t->obj) ckptio__objtxn_fini(t);
    free(t->path);
    free(t->parent);
    free(t->tmp_path);
    free(t->old_path);
    memset(t, 0, sizeof *t);
    t->tmp_fd = t->fd = -1;
}
