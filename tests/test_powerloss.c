/* SPDX-License-Identifier: Apache-2.0 */
/* Power loss: a vfs that keeps only what was fsynced, cut at every call of a save and commit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

/* How the model works. The writer runs on the real file system, through a vfs that counts its
 * calls and, at each fsync, copies what that fsync made durable into memory: a file's whole
 * content, or a directory's entries (name -> inode). Everything else (writes, O_DIRECT writes
 * included, creates, mkdirs, renames) is pending until such an fsync. Losing power before call N
 * rebuilds, in a fresh directory, only that durable state, walking from the work directory
 * through the durably recorded entries: an entry never fsynced in its directory disappears (a
 * rename rolls back), a file's content is what its last fsync saw. This is the weakest
 * guarantee POSIX gives, so a commit that survives it survives any real file system. */

typedef struct pl_ent {
    char *name;
    ino_t ino;
    int is_dir;
} pl_ent;

typedef struct pl_node {
    ino_t ino;
    unsigned char *data; /* files: content at the last fsync */
    size_t len;
    pl_ent *ents; /* directories: entries at the last fsync */
    size_t n;
} pl_node;

/* Under TSan a fork and a check cost about a second: every 16th point there (the full sweep
 * runs in the plain and ASan suites; TSan checks the harness's and the writer's locking). */
#ifdef UNDER_TSAN
#define PL_STRIDE 16
#else
#define PL_STRIDE 1
#endif

#define PL_NODES 256
#define PL_CRASHED 42

/* Calls come from the writer's thread and the psync workers: one lock keeps the count and the
 * snapshots in step, so a crash never sees half an fsync. */
static pthread_mutex_t pl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    pl_node nodes[PL_NODES];
    size_t n_nodes;
    ino_t root;
    char root_path[PATH_MAX], out_path[PATH_MAX], note_path[PATH_MAX];
    unsigned calls, crash_at; /* crash_at 0: not armed, nothing counted or recorded */
    int garbage; /* unsynced bytes of a file come back as garbage, up to its current size */
} P;

static pl_node *pl_node_of(ino_t ino, int create)
{
    for (size_t i = 0; i < P.n_nodes; i++)
        if (P.nodes[i].ino == ino) return &P.nodes[i];
    if (!create || P.n_nodes == PL_NODES) return NULL;
    pl_node *n = &P.nodes[P.n_nodes++];
    memset(n, 0, sizeof *n);
    n->ino = ino;
    return n;
}

static void pl_node_clear(pl_node *n)
{
    free(n->data);
    for (size_t i = 0; i < n->n; i++) free(n->ents[i].name);
    free(n->ents);
    n->data = NULL;
    n->ents = NULL;
    n->len = n->n = 0;
}

/* Read a whole file through a descriptor of our own: the writer's may be O_DIRECT and
 * write-only. */
static int pl_snap_file(int fd, pl_node *n)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int rfd = open(proc, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (rfd < 0 || fstat(rfd, &st) < 0) return -1;
    pl_node_clear(n);
    n->data = malloc((size_t)st.st_size + 1);
    if (!n->data) abort();
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t k = pread(rfd, n->data + got, (size_t)st.st_size - got, (off_t)got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    n->len = got;
    close(rfd);
    return 0;
}

static int pl_snap_dir(int fd, pl_node *n)
{
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) return -1;
    pl_node_clear(n);
    for (struct dirent *de; (de = readdir(d));) {
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;
        pl_ent *e = realloc(n->ents, (n->n + 1) * sizeof *e);
        if (!e) abort();
        n->ents = e;
        e[n->n++] = (pl_ent){strdup(de->d_name), st.st_ino, S_ISDIR(st.st_mode)};
    }
    closedir(d);
    return 0;
}

static int pl_snap(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return -1;
    pl_node *n = pl_node_of(st.st_ino, 1);
    if (!n) return -1;
    return S_ISDIR(st.st_mode) ? pl_snap_dir(fd, n) : pl_snap_file(fd, n);
}

/* What was there before the save counts as durable: snapshot the whole tree. */
static int pl_snap_tree(int fd)
{
    if (pl_snap(fd) < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode)) return 0;
    pl_node *n = pl_node_of(st.st_ino, 0);
    for (size_t i = 0; i < n->n; i++) {
        int c = openat(fd, n->ents[i].name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (c < 0) return -1;
        int rc = pl_snap_tree(c);
        close(c);
        if (rc < 0) return -1;
        n = pl_node_of(st.st_ino, 0); /* stable: nodes never move, but read it again anyway */
    }
    return 0;
}

/* The current size of inode `ino` under dir, or 0 (strict mode: how far garbage reaches). */
static off_t pl_cur_size(const char *dir, ino_t ino)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    off_t size = 0;
    for (struct dirent *de; !size && (de = readdir(d));) {
        char p[PATH_MAX];
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (lstat(p, &st) < 0) continue;
        if (S_ISDIR(st.st_mode)) size = pl_cur_size(p, ino);
        else if (st.st_ino == ino) size = st.st_size;
    }
    closedir(d);
    return size;
}

/* Rebuild directory inode `ino`'s durable entries under `dst` (which exists). */
static int pl_rebuild(const char *dst, ino_t ino)
{
    pl_node *n = pl_node_of(ino, 0);
    for (size_t i = 0; n && i < n->n; i++) {
        const pl_ent *e = &n->ents[i];
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dst, e->name);
        if (e->is_dir) {
            if (mkdir(p, 0755) < 0 || pl_rebuild(p, e->ino) < 0) return -1;
            continue;
        }
        pl_node *f = pl_node_of(e->ino, 0); /* NULL: created, never fsynced */
        size_t len = f ? f->len : 0, full = len;
        if (P.garbage) full = CKPTIO__MAX(len, (size_t)pl_cur_size(P.root_path, e->ino));
        unsigned char *b = malloc(full + 1);
        if (!b) return -1;
        if (len) memcpy(b, f->data, len);
        t_fill(b + len, full - len, 0xdead + full);
        int rc = t_write_file(p, b, full);
        free(b);
        if (rc < 0) return -1;
    }
    return 0;
}

static const char *const call_name[] = {"openat", "mkdirat", "renameat2", "write", "pread",
                                        "pwrite", "fallocate", "ftruncate", "fsync",
                                        "submit", "complete", "end"};
enum { C_OPEN, C_MKDIR, C_RENAME, C_WRITE, C_PREAD, C_PWRITE, C_FALLOC, C_FTRUNC, C_FSYNC,
       C_SUBMIT, C_DONE, C_END };

/* Power goes: rebuild the durable state, note which call it cut, and die at once. Called with
 * pl_lock held, so no other thread changes anything meanwhile. */
static void pl_power_off(int call)
{
    if (mkdir(P.out_path, 0755) < 0 || pl_rebuild(P.out_path, P.root) < 0) _exit(2);
    int fd = open(P.note_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        if (write(fd, &call, sizeof call) < 0) {}
        close(fd);
    }
    _exit(call == C_END ? 0 : PL_CRASHED);
}

static void pl_tick(int call)
{
    pthread_mutex_lock(&pl_lock);
    if (P.crash_at && ++P.calls == P.crash_at) pl_power_off(call);
    pthread_mutex_unlock(&pl_lock);
}

#define R ckptio__vfs_real
static int pl_openat(int d, const char *p, int fl, mode_t m)
{
    pl_tick(C_OPEN);
    return R.openat(d, p, fl, m);
}
static int pl_mkdirat(int d, const char *p, mode_t m)
{
    pl_tick(C_MKDIR);
    return R.mkdirat(d, p, m);
}
static int pl_renameat2(int od, const char *op, int nd, const char *np, unsigned fl)
{
    pl_tick(C_RENAME);
    return R.renameat2(od, op, nd, np, fl);
}
static ssize_t pl_write(int fd, const void *b, size_t n)
{
    pl_tick(C_WRITE);
    return R.write(fd, b, n);
}
static ssize_t pl_pread(int fd, void *b, size_t n, off_t off)
{
    pl_tick(C_PREAD);
    return R.pread(fd, b, n, off);
}
static ssize_t pl_pwrite(int fd, const void *b, size_t n, off_t off)
{
    pl_tick(C_PWRITE);
    return R.pwrite(fd, b, n, off);
}
static int pl_fallocate(int fd, int m, off_t off, off_t len)
{
    pl_tick(C_FALLOC);
    return R.fallocate(fd, m, off, len);
}
static int pl_ftruncate(int fd, off_t len)
{
    pl_tick(C_FTRUNC);
    return R.ftruncate(fd, len);
}
/* The only call that makes anything durable, in the model: it records what it made durable
 * under the lock, as one step. The real fsync is skipped, since durability here is the model's
 * (and it costs most of the run time on a real disk); unarmed, it does nothing. */
static int pl_fsync(int fd)
{
    pthread_mutex_lock(&pl_lock);
    if (P.crash_at && ++P.calls == P.crash_at) pl_power_off(C_FSYNC);
    if (P.crash_at && pl_snap(fd) < 0) abort();
    pthread_mutex_unlock(&pl_lock);
    return 0;
}
static int pl_req_submit(ckptio__req *r)
{
    CKPTIO__UNUSED(r);
    pl_tick(C_SUBMIT);
    return 0;
}
static void pl_req_done(ckptio__req *r)
{
    CKPTIO__UNUSED(r);
    pl_tick(C_DONE);
}
#undef R

static const ckptio__vfs pl_vfs = {
    .openat = pl_openat, .mkdirat = pl_mkdirat, .renameat2 = pl_renameat2, .write = pl_write,
    .pread = pl_pread, .pwrite = pl_pwrite, .fallocate = pl_fallocate,
    .ftruncate = pl_ftruncate, .fsync = pl_fsync, .req_submit = pl_req_submit,
    .req_done = pl_req_done,
};

/* ---- the test ---- */

enum { S_ABSENT, S_OLD, S_NEW, S_BROKEN };
static const char *const state_name[] = {"absent", "the old checkpoint", "the new checkpoint",
                                         "broken"};

static int state_of(const char *path, const model *old, const model *neu)
{
    struct stat st;
    if (lstat(path, &st) < 0 && errno == ENOENT) return S_ABSENT;
    if (old && load_model(path, old) == 0) return S_OLD;
    if (load_model(path, neu) == 0) return S_NEW;
    return S_BROKEN;
}

/* Save `neu` over `old` (or fresh, old NULL) and lose power before call k, for every k until
 * the save completes, then once more just after commit returned. The rebuilt `ck` must be the
 * old checkpoint (or absent, fresh) or the complete new one; after commit returned, the new
 * one. A following save into the rebuilt directory cleans what the dead one left. */
static int powerloss_run(const model *old, const model *neu, int garbage)
{
    /* Own copies: t_path's buffers rotate. */
    char work[PATH_MAX - 8], out[PATH_MAX - 8], note[PATH_MAX], tmpl[PATH_MAX - 8];
    char ck[PATH_MAX], out_ck[PATH_MAX], tmpl_ck[PATH_MAX];
    snprintf(work, sizeof work, "%s", t_path("work"));
    snprintf(out, sizeof out, "%s", t_path("out"));
    snprintf(note, sizeof note, "%s", t_path("note"));
    snprintf(tmpl, sizeof tmpl, "%s", t_path("template"));
    snprintf(ck, sizeof ck, "%s/ck", work);
    snprintf(out_ck, sizeof out_ck, "%s/ck", out);
    snprintf(tmpl_ck, sizeof tmpl_ck, "%s/ck", tmpl);
    unsigned seen[3] = {0}, by_call[C_END + 1] = {0}, points = 0;
    /* Setup and recovery saves are not under test: the unarmed vfs spares their fsyncs. */
    ckptio__vfs_set(&pl_vfs);
    CHECK(t_sh("rm -rf '%s' && mkdir '%s'", tmpl, tmpl) == 0);
    if (old) CHECK_OK(save_model(tmpl_ck, old, 0, NULL, 0));
    for (unsigned k = 1;; k += PL_STRIDE) {
        CHECK(t_sh("rm -rf '%s' '%s' '%s' && cp -a '%s' '%s'", work, out, note, tmpl, work) == 0);
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            int wfd = open(work, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            struct stat st;
            if (wfd < 0 || fstat(wfd, &st) < 0 || pl_snap_tree(wfd) < 0) _exit(2);
            close(wfd);
            P.root = st.st_ino;
            snprintf(P.root_path, sizeof P.root_path, "%s", work);
            snprintf(P.out_path, sizeof P.out_path, "%s", out);
            snprintf(P.note_path, sizeof P.note_path, "%s", note);
            P.crash_at = k;
            P.garbage = garbage;
            char msg[CKPTIO__MSG_LEN];
            int rc = save_model(ck, neu, old != NULL, msg, sizeof msg);
            if (rc < 0) {
                fprintf(stderr, "save failed: %s: %s\n", ckptio_errname(rc), msg);
                _exit(3);
            }
            /* Committed: power goes now, with every call of the save behind it. */
            pthread_mutex_lock(&pl_lock);
            pl_power_off(C_END);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == PL_CRASHED));
        int done = WEXITSTATUS(st) == 0;
        int call = C_END;
        unsigned char *nb = NULL;
        if (t_read_file(note, &nb) == (long)sizeof call) memcpy(&call, nb, sizeof call);
        free(nb);
        int s = state_of(out_ck, old, neu);
        int ok = done ? s == S_NEW : s == S_NEW || s == (old ? S_OLD : S_ABSENT);
        if (!ok) {
            fprintf(stderr,
                    "power lost before call %u (%s, %s, %s mode): '%s' is %s; expected %s\n", k,
                    call_name[call], old ? "overwrite" : "fresh save",
                    garbage ? "garbage" : "discard", out_ck, state_name[s],
                    done ? "the new checkpoint (commit had returned)" : "old or new");
            t_sh("ls -lR '%s' >&2", out);
            return 1;
        }
        seen[s]++;
        by_call[call]++;
        points++;
        /* Recovery: the next save of the same name in the rebuilt directory removes the dead
         * save's temp dir (its process is gone) and succeeds. */
        CHECK_OK(save_model(out_ck, neu, 1, NULL, 0));
        CHECK(count_prefix_in(out, "ck.tmp-") == 0);
        if (done) break;
        CHECK(k < 2000);
    }
    ckptio__vfs_set(NULL);
    printf("%s, %s mode, %s: %u power-loss points; old %u, absent %u, new %u; broken 0 "
           "[cut at:",
           old ? "overwrite" : "fresh save", garbage ? "garbage" : "discard", t_backend(), points,
           seen[S_OLD], seen[S_ABSENT], seen[S_NEW]);
    for (int c = 0; c <= C_END; c++)
        if (by_call[c]) printf(" %s %u", call_name[c], by_call[c]);
    printf("]\n");
    CHECK(points * PL_STRIDE >= 50);
    CHECK(seen[S_NEW] >= 1 && seen[old ? S_OLD : S_ABSENT] >= 1);
    return 0;
}

static int pl_backend_ok(void)
{
    return strcmp(t_backend(), "io_uring") || ckptio__io_uring_available();
}

/* The stricter garbage mode once, with psync (every data write a vfs call), keeps the group
 * near 20 s; discarding unsynced bytes runs on every backend. */
static int garbage_too(void)
{
    return !strcmp(t_backend(), "psync");
}

static int test_powerloss_fresh(void)
{
    if (!pl_backend_ok()) return T_SKIP;
    model neu;
    CHECK(model_make(&neu, 42) == 0);
    CHECK(powerloss_run(NULL, &neu, 0) == 0);
    if (garbage_too()) CHECK(powerloss_run(NULL, &neu, 1) == 0);
    model_free(&neu);
    return leak_check();
}

static int test_powerloss_overwrite(void)
{
    if (!pl_backend_ok()) return T_SKIP;
    model old, neu;
    CHECK(model_make(&old, 41) == 0 && model_make(&neu, 42) == 0);
    CHECK(powerloss_run(&old, &neu, 0) == 0);
    if (garbage_too()) CHECK(powerloss_run(&old, &neu, 1) == 0);
    model_free(&old);
    model_free(&neu);
    return leak_check();
}

const ckptio_test tests_powerloss[] = {
    {"powerloss/fresh", test_powerloss_fresh, T_PER_BACKEND, 120},
    {"powerloss/overwrite", test_powerloss_overwrite, T_PER_BACKEND, 120},
    {0},
};
