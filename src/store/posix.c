/* SPDX-License-Identifier: Apache-2.0 */
/* The POSIX store: checkpoints as directories of a local (or mounted) file system. */
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

static int posix_list(const char *path, const ckptio_store_opts *o, ckptio__names *out,
                      ckptio__msg *msg)
{
    (void)o;
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

static int posix_is_checkpoint(const char *path, const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)o;
    int rc = has_manifest(path);
    return rc < 0 ? ckptio__fail(msg, rc, "cannot look into '%s'", path) : rc;
}

/* Renamed out of every listing first ("<path>.deleting-<pid>", then the parent fsynced), so
 * a crash never leaves a checkpoint half removed under its name; then the tree goes, under a
 * lock (what a crash leaves, posix_sweep removes). */
static int posix_remove(const char *path, const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)o;
    int rc = has_manifest(path);
    if (rc <= 0)
        return ckptio__fail(msg, rc == 0 ? CKPTIO_E_NOT_CHECKPOINT : rc,
                            "'%s' is not a checkpoint: it has no manifest", path);
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    char *at = strndup(path, len), *parent = at ? ckptio__parent_dir(at) : NULL, *gone = NULL;
    if (!parent || asprintf(&gone, "%s.deleting-%ld", at, (long)getpid()) < 0) {
        gone = NULL;
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    } else if (rename(at, gone) < 0) {
        rc = ckptio__fail(msg, -errno, "cannot move '%s' out of the way to remove it", path);
    } else if ((rc = ckptio__fsync_path(parent)) < 0) {
        rc = ckptio__fail(msg, rc, "removing '%s': fsync of '%s' failed", path, parent);
    } else {
        /* Held while the tree goes: tells a sweep in any process that this removal is alive. */
        int lock = open(gone, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (lock >= 0) (void)flock(lock, LOCK_EX | LOCK_NB);
        if ((rc = ckptio__remove_tree(gone)) < 0)
            rc = ckptio__fail(msg, rc, "cannot remove '%s' (the checkpoint '%s' is gone)", gone,
                              path);
        if (lock >= 0) close(lock);
    }
    free(at);
    free(parent);
    free(gone);
    return rc;
}

/* ---- paths ---- */

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

/* ---- saves: begin ---- */

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

/* The leftovers a killed process can leave beside a checkpoint or file it was saving or
 * removing: "<base>.tmp-<pid>.<n>" (a save's temporary, txn's name) and "<base>.deleting-<pid>"
 * (posix_remove's). */
enum { LEFT_NONE, LEFT_TMP, LEFT_DELETING };

/* [p, end) as a positive int of digits only, else 0. */
static long pid_of(const char *p, const char *end)
{
    long v = 0;
    if (p == end || *p < '1' || *p > '9') return 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9' || v > INT_MAX / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    return v <= INT_MAX ? v : 0;
}

/* The last `marker` in `ent` after its first byte (the base is never empty), or NULL. */
static const char *last_marker(const char *ent, const char *marker)
{
    const char *hit = NULL;
    for (const char *p = strstr(ent + 1, marker); p; p = strstr(p + 1, marker)) hit = p;
    return hit;
}

/* What `ent` is (LEFT_*), with its *pid; `base` (blen bytes) is the name it must start with,
 * or NULL for any. */
static int leftover(const char *ent, const char *base, size_t blen, long *pid)
{
    const char *end = ent + strlen(ent), *m = last_marker(ent, ".deleting-");
    bool ours = m && (!base || (m == ent + blen && !strncmp(ent, base, blen)));
    if (ours && (*pid = pid_of(m + 10, end))) return LEFT_DELETING;
    m = last_marker(ent, ".tmp-");
    if (!m || (base && (m != ent + blen || strncmp(ent, base, blen)))) return LEFT_NONE;
    const char *dot = strchr(m + 5, '.'); /* <pid>.<n>, n from 0 */
    if (!dot || !dot[1] || (strcmp(dot + 1, "0") && !pid_of(dot + 1, end))) return LEFT_NONE;
    return (*pid = pid_of(m + 5, dot)) ? LEFT_TMP : LEFT_NONE;
}

/* Remove, in directory `dir`, the leftovers (of `base`, or of any name when NULL) that no live
 * process owns, directories or regular files as `type` says (S_IFDIR, S_IFREG, 0: both). A
 * temporary goes only if all hold: <pid> is not ours and no such process exists (kill(pid, 0)
 * gives ESRCH), and no one holds its lock (a live writer keeps flock(LOCK_EX) on its
 * temporary, which also covers a writer in another pid namespace on the same machine). A tree
 * being removed goes when no one holds its lock and its <pid> is ours or gone. Never a
 * symlink; where the lock cannot be taken for any reason (NFS), it stays. Best effort: the
 * number removed, failures skipped; -errno when `dir` cannot be read. */
static int sweep_in(const char *dir, const char *base, mode_t type)
{
    size_t blen = base ? strlen(base) : 0;
    int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) return -errno;
    DIR *d = fdopendir(pfd);
    if (!d) {
        int e = -errno;
        close(pfd);
        return e;
    }
    struct dirent *de;
    long pid;
    int removed = 0;
    while ((de = readdir(d))) {
        int kind = leftover(de->d_name, base, blen, &pid);
        if (kind == LEFT_NONE || (kind == LEFT_TMP && pid == (long)getpid())) continue;
        if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;
        int fd = openat(dirfd(d), de->d_name,
                        O_RDONLY | O_NOFOLLOW | O_CLOEXEC |
                            (type == S_IFDIR ? O_DIRECTORY : O_NONBLOCK));
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) &&
            (!type || (st.st_mode & S_IFMT) == type) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
            char *full = NULL;
            if (S_ISREG(st.st_mode))
                removed += unlinkat(dirfd(d), de->d_name, 0) == 0;
            else if (asprintf(&full, "%s/%s", dir, de->d_name) >= 0)
                removed += ckptio__remove_tree(full) == 0;
            free(full);
        }
        close(fd); /* drops the lock, after the leftover is gone */
    }
    closedir(d);
    return removed;
}

/* The temporaries killed saves of this same name left: directories for a checkpoint, files
 * for a single file (ckptio.torch.save). The save goes on whatever happens. */
static void clean_stale(const ckptio__txn *t)
{
    const char *slash = strrchr(t->path, '/');
    (void)sweep_in(t->parent, slash ? slash + 1 : t->path,
                   t->kind == CKPTIO__TXN_DIR ? S_IFDIR : S_IFREG);
}

/* The catalog's sweep: every leftover directly in `dir`. */
static int posix_sweep(const char *dir, const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)o;
    int rc = sweep_in(dir, NULL, 0);
    if (rc == -ENOENT) return 0;
    return rc < 0 ? ckptio__fail(msg, rc, "cannot read the directory '%s' to sweep it", dir) : rc;
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

static void set_dir(ckptio__txn *t)
{
    snprintf(t->data_dir, sizeof t->data_dir, "data");
    t->where = t->tmp_path;
}

static int posix_begin(ckptio__txn *t, const char *path, int kind, unsigned flags, int direct,
                       const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)flags, (void)o;
    CKPTIO__TRY(resolve(t, path, msg));
    if (kind == CKPTIO__TXN_FILE) {
        CKPTIO__TRY(inspect_file(t, path, msg));
        clean_stale(t);
        CKPTIO__TRY(make_tmp_file(t, direct, msg));
    } else {
        CKPTIO__TRY(inspect_dir(t, msg));
        clean_stale(t);
        CKPTIO__TRY(make_tmp_dir(t, msg));
    }
    set_dir(t);
    return 0;
}

static int posix_join(ckptio__txn *t, const char *path, const char *tmp_path, unsigned flags,
                      const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)flags, (void)o;
    CKPTIO__TRY(resolve(t, path, msg));
    t->tmp_path = strdup(tmp_path);
    if (!t->tmp_path) return -ENOMEM;
    set_dir(t);
    t->tmp_fd = ckptio__vfs_open(AT_FDCWD, t->tmp_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (t->tmp_fd < 0)
        return ckptio__fail(msg, -errno, "cannot open '%s' (begun by another process?)",
                            t->tmp_path);
    return 0;
}

static unsigned posix_parallel(const ckptio__txn *t)
{
    (void)t;
    return 0; /* the settings' queue depth and threads */
}

/* ---- saves: data files ---- */

static int posix_open_data(ckptio__txn *t, const char *name, uint64_t part, int want_direct,
                           int *fd, int *direct, ckptio__msg *msg)
{
    (void)part;
    const char *slash = strrchr(name, '/');
    if (slash) { /* its folder: the ranks of a save share it, whoever comes first makes it */
        char dir[64];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - name), name);
        if (CKPTIO__VFS->mkdirat(t->tmp_fd, dir, 0755) < 0 && errno != EEXIST)
            return ckptio__fail(msg, -errno, "cannot create '%s/%s'", t->tmp_path, dir);
    }
    int rc = ckptio__file_open(t->tmp_fd, name, CKPTIO__F_WRITE, want_direct, fd, direct);
    if (rc < 0) {
        *fd = -1;
        return ckptio__fail(msg, rc, "cannot create data file '%s/%s'%s", t->tmp_path, name,
                            rc == -EINVAL ? ": the file system refuses O_DIRECT; use direct=auto"
                                          : "");
    }
    return 0;
}

static int posix_finish_data(ckptio__txn *t, int fd, uint64_t len, const char *label,
                             ckptio__msg *msg)
{
    (void)len;
    int rc;
    if ((t->flags & CKPTIO__TXN_FSYNC) && (rc = ckptio__fsync(fd)) < 0)
        return ckptio__fail(msg, rc, "fsync of '%s' failed: the data may not be on the device",
                            label);
    return 0;
}

static int posix_rename_data(ckptio__txn *t, int *fd, const char *from, const char *to,
                             uint64_t part, ckptio__msg *msg)
{
    (void)fd, (void)part;
    if (CKPTIO__VFS->renameat2(t->tmp_fd, from, t->tmp_fd, to, 0) < 0)
        return ckptio__fail(msg, -errno, "cannot rename '%s/%s' to '%s'", t->tmp_path, from, to);
    return 0;
}

/* Each process makes its own entries durable: on a shared file system another client's fsync
 * of the folder need not cover what this one created. */
static int posix_seal(ckptio__txn *t, ckptio__msg *msg)
{
    if (!(t->flags & CKPTIO__TXN_FSYNC)) return 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", t->tmp_path, t->data_dir);
    int rc = ckptio__fsync_path(dir);
    if (rc == -ENOENT) return 0; /* no data file was made */
    return rc < 0 ? ckptio__fail(msg, rc, "fsync of directory '%s' failed", dir) : 0;
}

/* ---- saves: publish ---- */

static int write_all(int fd, const uint8_t *p, uint64_t n)
{
    while (n) {
        ssize_t k = CKPTIO__VFS->write(fd, p, CKPTIO__MIN(n, (uint64_t)1 << 30));
        if (k < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += k;
        n -= (uint64_t)k;
    }
    return 0;
}

static int write_manifest(ckptio__txn *t, const uint8_t *buf, uint64_t len, ckptio__msg *msg)
{
    int fd = ckptio__vfs_open(t->tmp_fd, "manifest", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                              0644);
    if (fd < 0) return ckptio__fail(msg, -errno, "cannot create '%s/manifest'", t->tmp_path);
    int rc = write_all(fd, buf, len);
    if (rc == 0 && (t->flags & CKPTIO__TXN_FSYNC)) rc = ckptio__fsync(fd);
    if (close(fd) < 0 && rc == 0) rc = -errno;
    if (rc < 0)
        return ckptio__fail(msg, rc, "writing '%s/manifest' failed%s", t->tmp_path,
                            rc == -ENOSPC ? ": the device is full" : "");
    return 0;
}

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

static int posix_publish(ckptio__txn *t, const uint8_t *man, uint64_t len, ckptio__msg *msg)
{
    int rc;
    if (t->kind == CKPTIO__TXN_DIR && man) {
        CKPTIO__TRY(write_manifest(t, man, len, msg));
        /* the data folder's entries must be durable before the rename exposes them */
        CKPTIO__TRY(posix_seal(t, msg));
    }
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

/* ---- saves: abort, fini ---- */

static void posix_abort(ckptio__txn *t)
{
    if (t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    if (!t->owner || t->published || !t->tmp_path) return;
    if (t->kind == CKPTIO__TXN_FILE) unlink(t->tmp_path);
    else ckptio__remove_tree(t->tmp_path);
    t->owner = false; /* done: a second abort finds nothing of ours */
}

/* A joined rank's files go with the owner's whole directory. */
static void posix_drop(ckptio__txn *t, const char *prefix)
{
    (void)t, (void)prefix;
}

static void posix_fini(ckptio__txn *t)
{
    if (t->fd >= 0) close(t->fd); /* a forked child's copy (its parent's file stays open) */
    if (t->tmp_fd >= 0) close(t->tmp_fd); /* drops the lock, after the directory is gone */
    t->fd = t->tmp_fd = -1;
}

const ckptio__store_ops ckptio__store_posix = {
    .name = "posix",
    .scheme = NULL,
    .list = posix_list,
    .is_checkpoint = posix_is_checkpoint,
    .remove = posix_remove,
    .sweep = posix_sweep,
    .caps = CKPTIO__STORE_LOCAL,
    .begin = posix_begin,
    .join = posix_join,
    .parallel = posix_parallel,
    .open_data = posix_open_data,
    .finish_data = posix_finish_data,
    .rename_data = posix_rename_data,
    .seal = posix_seal,
    .publish = posix_publish,
    .abort = posix_abort,
    .drop = posix_drop,
    .fini = posix_fini,
};
