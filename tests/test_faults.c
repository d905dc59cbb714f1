/* SPDX-License-Identifier: Apache-2.0 */
/* Reliability: I/O faults, full disks, SIGKILL mid-save, damaged files never cost a checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

#ifndef CKPTIO_EXE
#error "tests/meson.build defines CKPTIO_EXE, the path of the ckptio command"
#endif

/* ---- the fault-injecting vfs ---- */

enum {
    FP_OPEN, FP_MKDIR, FP_RENAME, FP_WRITE, FP_PREAD, FP_PWRITE, FP_FALLOC, FP_FTRUNC, FP_FSYNC,
    FP_SUBMIT_W, FP_DONE_W, FP_SUBMIT_R, FP_DONE_R, FP_N
};
static const char *const fp_name[FP_N] = {
    "openat", "mkdirat", "renameat2", "write", "pread", "pwrite", "fallocate", "ftruncate",
    "fsync", "submit(write)", "complete(write)", "submit(read)", "complete(read)"};

enum { M_OFF, M_FAIL, M_SHORT, M_EINTR, M_KILL };

/* Armed before any I/O starts; the counters are touched by psync workers too. */
static struct {
    int mode, point, err;
    unsigned nth;       /* fire at the nth call of `point` (1-based) */
    unsigned kill_at;   /* M_KILL: SIGKILL before the kill_at-th call of any point */
    unsigned count[FP_N];
    unsigned total;
    unsigned fired;
} F;

static void f_reset(void)
{
    memset(&F, 0, sizeof F);
}

/* Count this call; return the mode to apply to it (M_OFF: pass through). */
static int hit(int point)
{
    unsigned n = __atomic_add_fetch(&F.count[point], 1, __ATOMIC_SEQ_CST);
    unsigned t = __atomic_add_fetch(&F.total, 1, __ATOMIC_SEQ_CST);
    if (F.mode == M_KILL) {
        if (t == F.kill_at) kill(getpid(), SIGKILL);
        return M_OFF;
    }
    if (F.mode == M_OFF || point != F.point) return M_OFF;
    /* ENOSPC and EIO fire once; short transfers a few times in a row, to need several retries */
    if (n == F.nth || (F.mode == M_SHORT && n > F.nth && n < F.nth + 4)) {
        __atomic_add_fetch(&F.fired, 1, __ATOMIC_SEQ_CST);
        return F.mode;
    }
    return M_OFF;
}

static int fail_errno(int mode)
{
    errno = mode == M_EINTR ? EINTR : F.err;
    return -1;
}

#define R ckptio__vfs_real
static int f_openat(int d, const char *p, int fl, mode_t m)
{
    int h = hit(FP_OPEN);
    return h ? fail_errno(h) : R.openat(d, p, fl, m);
}
static int f_mkdirat(int d, const char *p, mode_t m)
{
    int h = hit(FP_MKDIR);
    return h ? fail_errno(h) : R.mkdirat(d, p, m);
}
static int f_renameat2(int od, const char *op, int nd, const char *np, unsigned fl)
{
    int h = hit(FP_RENAME);
    return h ? fail_errno(h) : R.renameat2(od, op, nd, np, fl);
}
/* A short transfer moves half (kept a multiple of 4096 so O_DIRECT stays aligned). */
static size_t short_len(size_t n)
{
    size_t k = (n / 2) & ~(size_t)4095;
    return k ? k : n;
}
static ssize_t f_write(int fd, const void *b, size_t n)
{
    int h = hit(FP_WRITE);
    if (h == M_SHORT) return R.write(fd, b, n > 1 ? n / 2 : n);
    return h ? fail_errno(h) : R.write(fd, b, n);
}
static ssize_t f_pread(int fd, void *b, size_t n, off_t off)
{
    int h = hit(FP_PREAD);
    if (h == M_SHORT) return R.pread(fd, b, short_len(n), off);
    return h ? fail_errno(h) : R.pread(fd, b, n, off);
}
static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
    int h = hit(FP_PWRITE);
    if (h == M_SHORT) return R.pwrite(fd, b, short_len(n), off);
    return h ? fail_errno(h) : R.pwrite(fd, b, n, off);
}
static int f_fallocate(int fd, int m, off_t off, off_t len)
{
    int h = hit(FP_FALLOC);
    return h ? fail_errno(h) : R.fallocate(fd, m, off, len);
}
static int f_ftruncate(int fd, off_t len)
{
    int h = hit(FP_FTRUNC);
    return h ? fail_errno(h) : R.ftruncate(fd, len);
}
static int f_fsync(int fd)
{
    int h = hit(FP_FSYNC);
    return h ? fail_errno(h) : R.fsync(fd);
}
static int f_req_submit(ckptio__req *r)
{
    int h = hit(r->op == CKPTIO__OP_WRITE ? FP_SUBMIT_W : FP_SUBMIT_R);
    return h == M_FAIL ? -F.err : 0;
}
static void f_req_done(ckptio__req *r)
{
    int h = hit(r->op == CKPTIO__OP_WRITE ? FP_DONE_W : FP_DONE_R);
    if (h == M_FAIL && r->res >= 0) r->res = -F.err;
}
#undef R

static const ckptio__vfs fault_vfs = {
    .openat = f_openat, .mkdirat = f_mkdirat, .renameat2 = f_renameat2, .write = f_write,
    .pread = f_pread, .pwrite = f_pwrite, .fallocate = f_fallocate, .ftruncate = f_ftruncate,
    .fsync = f_fsync, .req_submit = f_req_submit, .req_done = f_req_done,
};

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Whether the current backend can see this point at all (io_uring never calls pread/pwrite). */
static int point_applies(int pt)
{
    int uring = !strcmp(t_backend(), "io_uring") ||
                (!strcmp(t_backend(), "auto") && ckptio__io_uring_available());
    return !((pt == FP_PWRITE || pt == FP_PREAD) && uring);
}

/* ---- tests ---- */

/* Every write-side fault point, with ENOSPC and EIO at several call numbers: the save fails
 * with that error, the message names the file, the temp dir is gone, the old checkpoint loads
 * bit-exact, and no descriptor or memory leaks. fallocate is the exception: the writer falls
 * back to plain extending writes, and the new checkpoint must then be complete. */
static int test_fault_save(void)
{
    model old, neu;
    char msg[CKPTIO__MSG_LEN];
    CHECK(model_make(&old, 1) == 0 && model_make(&neu, 2) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &old, 0, NULL, 0));

    /* A clean save first, counting the calls at each point. */
    ckptio__vfs_set(&fault_vfs);
    f_reset();
    CHECK_OK(save_model(ck, &neu, 1, NULL, 0));
    unsigned clean[FP_N];
    memcpy(clean, F.count, sizeof clean);
    CHECK(load_model(ck, &neu) == 0);
    CHECK_OK(save_model(ck, &old, 1, NULL, 0));

    static const int points[] = {FP_OPEN, FP_MKDIR, FP_RENAME, FP_WRITE, FP_PWRITE, FP_FALLOC,
                                 FP_FTRUNC, FP_FSYNC, FP_SUBMIT_W, FP_DONE_W};
    static const int errs[] = {ENOSPC, EIO};
    unsigned injected = 0;
    int fds0 = count_fds();
    for (size_t pi = 0; pi < sizeof points / sizeof points[0]; pi++) {
        int pt = points[pi];
        if (!point_applies(pt) || !clean[pt]) continue;
        /* first, second, middle and last call of this point */
        unsigned nths[4] = {1, 2, (clean[pt] + 1) / 2, clean[pt]};
        for (size_t ei = 0; ei < 2; ei++) {
            for (int k = 0; k < 4; k++) {
                if (nths[k] > clean[pt] || (k && nths[k] == nths[k - 1])) continue;
                f_reset();
                F.mode = M_FAIL;
                F.point = pt;
                F.err = errs[ei];
                F.nth = nths[k];
                int rc = save_model(ck, &neu, 1, msg, sizeof msg);
                unsigned fired = F.fired;
                F.mode = M_OFF;
                if (!fired) continue; /* the calls moved (a retried request): nothing injected */
                injected++;
                int got = load_model(ck, rc == 0 ? &neu : &old);
                int tmps = count_prefix("ck.tmp-"), fds = count_fds();
                int named = t_contains(msg, ck);
                int published = t_contains(msg, "published at");
                if (published && got != 0) got = load_model(ck, &neu); /* renamed, then failed */
                int ok = tmps == 0 && fds == fds0 && got == 0 &&
                         (rc == 0 ? pt == FP_FALLOC
                                  : (published ? rc == CKPTIO_E_NOT_DURABLE : rc == -errs[ei]) &&
                                        named);
                if (!ok) {
                    fprintf(stderr,
                            "%s #%u (%s): save -> %d %s [%s]; load -> %d; tmp dirs %d; fds %d "
                            "(were %d)\n",
                            fp_name[pt], nths[k], errs[ei] == ENOSPC ? "ENOSPC" : "EIO", rc,
                            ckptio_errname(rc), msg, got, tmps, fds, fds0);
                    return 1;
                }
                if (published || rc == 0) CHECK_OK(save_model(ck, &old, 1, NULL, 0));
            }
        }
    }
    ckptio__vfs_set(NULL);
    CHECK(load_model(ck, &old) == 0);
    printf("faults injected on save: %u, nothing lost\n", injected);
    CHECK(injected >= 20);
    model_free(&old);
    model_free(&neu);
    return leak_check();
}

/* Short transfers and EINTR are retried where the kernel allows them: the save still succeeds
 * and loads bit-exact. */
static int test_fault_retry(void)
{
    model m;
    CHECK(model_make(&m, 3) == 0);
    static const int points[] = {FP_OPEN, FP_WRITE, FP_PWRITE, FP_FALLOC, FP_FTRUNC, FP_FSYNC,
                                 FP_PREAD};
    unsigned injected = 0;
    int fds0 = count_fds();
    ckptio__vfs_set(&fault_vfs);
    for (size_t pi = 0; pi < sizeof points / sizeof points[0]; pi++) {
        int pt = points[pi];
        if (!point_applies(pt)) continue;
        for (int mode = M_SHORT; mode <= M_EINTR; mode++) {
            if (mode == M_SHORT && pt != FP_WRITE && pt != FP_PWRITE && pt != FP_PREAD) continue;
            for (unsigned nth = 1; nth <= 3; nth++) {
                char name[64], msg[CKPTIO__MSG_LEN];
                snprintf(name, sizeof name, "ck-%zu-%d-%u", pi, mode, nth);
                f_reset();
                F.mode = mode;
                F.point = pt;
                F.nth = nth;
                int rc = save_model(t_path(name), &m, 0, msg, sizeof msg);
                if (rc < 0) {
                    fprintf(stderr, "%s #%u %s: %s %s\n", fp_name[pt], nth,
                            mode == M_SHORT ? "short" : "EINTR", ckptio_errname(rc), msg);
                    return 1;
                }
                if (pt != FP_PREAD) injected += F.fired;
                if (pt == FP_PREAD) { /* reads: arm it again for the load */
                    f_reset();
                    F.mode = mode;
                    F.point = pt;
                    F.nth = nth;
                }
                int got = load_model(t_path(name), &m);
                if (pt == FP_PREAD) injected += F.fired;
                F.mode = M_OFF;
                if (got != 0) {
                    fprintf(stderr, "%s #%u %s: load -> %d\n", fp_name[pt], nth,
                            mode == M_SHORT ? "short" : "EINTR", got);
                    return 1;
                }
            }
        }
    }
    ckptio__vfs_set(NULL);
    CHECK(count_fds() == fds0 && count_prefix("ck-") >= 1);
    printf("short transfers and EINTR injected: %u, all retried\n", injected);
    CHECK(injected >= 10);
    model_free(&m);
    return leak_check();
}

/* EIO on reads (the manifest, data through the engine): the load fails naming the file, never
 * returns other bytes, and leaks nothing. */
static int test_fault_read(void)
{
    model m;
    CHECK(model_make(&m, 4) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &m, 0, NULL, 0));
    ckptio__vfs_set(&fault_vfs);
    f_reset();
    CHECK(load_model(ck, &m) == 0);
    unsigned clean[FP_N];
    memcpy(clean, F.count, sizeof clean);
    static const int points[] = {FP_OPEN, FP_PREAD, FP_SUBMIT_R, FP_DONE_R};
    unsigned injected = 0;
    int fds0 = count_fds();
    for (size_t pi = 0; pi < sizeof points / sizeof points[0]; pi++) {
        int pt = points[pi];
        if (!point_applies(pt)) continue;
        for (unsigned nth = 1; nth <= clean[pt]; nth++) {
            f_reset();
            F.mode = M_FAIL;
            F.point = pt;
            F.err = EIO;
            F.nth = nth;
            int got = load_model(ck, &m);
            unsigned fired = F.fired;
            F.mode = M_OFF;
            if (!fired) continue;
            injected++;
            const char *msg = ckptio_last_error();
            if (got != -EIO || count_fds() != fds0 || !t_contains(msg, ck)) {
                fprintf(stderr, "%s #%u: load -> %d (%s) fds %d/%d\n", fp_name[pt], nth, got,
                        msg, count_fds(), fds0);
                return 1;
            }
        }
    }
    ckptio__vfs_set(NULL);
    CHECK(load_model(ck, &m) == 0);
    printf("read faults injected: %u, all reported as EIO\n", injected);
    CHECK(injected >= 5);
    model_free(&m);
    return leak_check();
}

/* A real full file system: a 8 MiB tmpfs in a private mount namespace (root only). A save
 * that does not fit fails with -ENOSPC naming the file and leaves nothing behind; the
 * checkpoint already there still loads. */
static int test_fault_enospc_tmpfs(void)
{
    if (unshare(CLONE_NEWNS) < 0) return T_SKIP;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return T_SKIP;
    const char *mnt = t_path("small");
    CHECK(mkdir(mnt, 0700) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=8m") < 0) return T_SKIP;
    char ck[4200], big_path[4200];
    snprintf(ck, sizeof ck, "%s/ck", mnt);
    snprintf(big_path, sizeof big_path, "%s/big", mnt);
    model m;
    CHECK(model_make(&m, 5) == 0);
    CHECK_OK(save_model(ck, &m, 0, NULL, 0)); /* ~5 MiB: fits */
    int fds0 = count_fds();
    char msg[CKPTIO__MSG_LEN];
    int rc = save_model(ck, &m, 1, msg, sizeof msg); /* a second copy does not */
    CHECK_ERR(rc, -ENOSPC);
    CHECK(t_contains(msg, ck) && t_contains(msg, "full"));
    CHECK(count_fds() == fds0);
    CHECK(load_model(ck, &m) == 0);
    DIR *d = opendir(mnt);
    CHECK(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += de->d_name[0] != '.';
    closedir(d);
    CHECK(n == 1); /* ck only */
    printf("ENOSPC on tmpfs: %s\n", msg);
    model_free(&m);
    umount2(mnt, MNT_DETACH);
    return leak_check();
}

/* ---- crash harness ---- */

static int cli_verify(const char *path)
{
    return t_sh("'%s' verify '%s' >/dev/null 2>&1", CKPTIO_EXE, path);
}

/* Save in a child and SIGKILL it just before its k-th file-system call, for every k from the
 * first call to past the last (data writes, their completions, fsyncs, the manifest write, the
 * rename). After each kill: `ck` holds the old checkpoint or the complete new one, bit-exact,
 * and ckptio verify agrees; the next save into the same parent removes the dead save's temp
 * dir. Backends rotate between kill points. */
static int test_crash_kill(void)
{
    static const char *const be[3] = {"psync", "io_uring", "buffered"};
    model old, neu;
    CHECK(model_make(&old, 11) == 0 && model_make(&neu, 12) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &old, 0, NULL, 0));

    /* How many calls does one save make? */
    unsigned calls = 0;
    for (int b = 0; b < 3; b++) {
        setenv("CKPTIO_IO", be[b], 1);
        ckptio__vfs_set(&fault_vfs);
        f_reset();
        int rc = save_model(ck, &neu, 1, NULL, 0);
        ckptio__vfs_set(NULL);
        if (rc == CKPTIO_E_UNSUPPORTED) continue; /* no io_uring here */
        CHECK_OK(rc);
        if (F.total > calls) calls = F.total;
    }
    CHECK_OK(save_model(ck, &old, 1, NULL, 0));
    CHECK(calls >= 50);

    unsigned killed = 0, survived = 0, saw_new = 0, cleaned = 0;
    for (unsigned k = 1; k <= calls + 2; k++) {
        const char *b = be[k % 3];
        if (!strcmp(b, "io_uring") && !ckptio__io_uring_available()) b = "psync";
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            setenv("CKPTIO_IO", b, 1);
            ckptio__vfs_set(&fault_vfs);
            f_reset();
            F.mode = M_KILL;
            F.kill_at = k;
            _exit(save_model(ck, &neu, 1, NULL, 0) == 0 ? 0 : 3);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        int was_killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        CHECK(was_killed || (WIFEXITED(st) && WEXITSTATUS(st) == 0));
        killed += was_killed;
        int is_old = load_model(ck, &old) == 0;
        int is_new = !is_old && load_model(ck, &neu) == 0;
        if (!is_old && !is_new) {
            fprintf(stderr, "kill before call %u (%s): '%s' is neither checkpoint\n", k, b, ck);
            return 1;
        }
        if (!was_killed) CHECK(is_new);
        CHECK(cli_verify(ck) == 0);
        saw_new += is_new;
        survived++;
        /* The next save into this parent removes what the killed one left. */
        int left = count_prefix("ck.tmp-");
        setenv("CKPTIO_IO", b, 1);
        CHECK_OK(save_model(ck, &old, 1, NULL, 0));
        CHECK(count_prefix("ck.tmp-") == 0);
        cleaned += (unsigned)left;
    }
    printf("kill points: %u (killed %u), old or new intact at each: %u, new visible after %u; "
           "temp dirs cleaned by the next save: %u\n",
           calls + 2, killed, survived, saw_new, cleaned);
    CHECK(killed >= 50 && saw_new >= 1 && survived == calls + 2);
    model_free(&old);
    model_free(&neu);
    return leak_check();
}

/* Cleanup removes only dead saves' temp dirs of the same name: never a live writer's, never
 * another name's, never a look-alike. */
static int test_stale_cleanup_safe(void)
{
    model m;
    CHECK(model_make(&m, 21) == 0);
    /* A pid that surely is not running: a reaped child's. */
    pid_t dead = fork();
    CHECK(dead >= 0);
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char n[256];
    snprintf(n, sizeof n, "ck.tmp-%d.0", (int)dead);
    CHECK(mkdir(t_path(n), 0700) == 0);
    snprintf(n, sizeof n, "ck.tmp-%d.0/data", (int)dead);
    CHECK(mkdir(t_path(n), 0700) == 0);
    snprintf(n, sizeof n, "other.tmp-%d.0", (int)dead); /* another name */
    CHECK(mkdir(t_path(n), 0700) == 0);
    snprintf(n, sizeof n, "ck.tmp-%d.0x", (int)dead); /* not our pattern */
    CHECK(mkdir(t_path(n), 0700) == 0);
    snprintf(n, sizeof n, "ck.tmp-%d.1", (int)getppid()); /* a live process */
    CHECK(mkdir(t_path(n), 0700) == 0);
    snprintf(n, sizeof n, "ck.tmp-%d.2", (int)dead); /* a symlink to something precious */
    CHECK(mkdir(t_path("precious"), 0700) == 0 && t_write_file(t_path("precious/x"), "x", 1) == 0);
    CHECK(symlink(t_path("precious"), t_path(n)) == 0);

    /* A writer of `ck` in this process removes the dead one only: 3 strangers + its own. */
    ckptio_params p = fparams(0);
    ckptio_writer *live = NULL;
    CHECK_OK(ckptio_writer_open(&live, t_path("ck"), &p));
    CHECK(count_prefix("ck.tmp-") == 4);
    CHECK(count_prefix("other.tmp-") == 1);
    /* Saves from other processes while it is alive, of another name and of the same name:
     * the live writer's temp dir stays (its pid is alive and it holds the lock). */
    for (int i = 0; i < 2; i++) {
        pid_t c = fork();
        CHECK(c >= 0);
        if (c == 0) _exit(save_model(t_path(i ? "ck" : "ck2"), &m, 1, NULL, 0) == 0 ? 0 : 1);
        int st;
        waitpid(c, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        CHECK(count_prefix("ck.tmp-") == 4);
    }
    struct stat sb;
    CHECK(stat(t_path("precious/x"), &sb) == 0);
    ckptio_writer_close(live);
    CHECK(load_model(t_path("ck"), &m) == 0);
    model_free(&m);
    return leak_check();
}

/* ---- hostile files ---- */

/* Random damage to a saved checkpoint — bit flips anywhere in the manifest or the data file,
 * truncation of either — must never crash and never return other bytes than were saved:
 * every load either fails (corrupt, truncated, not a checkpoint) or is bit-exact. */
static int test_mutated_checkpoint(void)
{
    model m;
    CHECK(model_make(&m, 31) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &m, 0, NULL, 0));
    const char *files[2] = {t_path("ck/manifest"), t_path("ck/data/000000.ckd")};
    unsigned char *orig[2];
    long len[2];
    for (int f = 0; f < 2; f++) CHECK((len[f] = t_read_file(files[f], &orig[f])) > 0);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    unsigned tried = 0, rejected = 0, exact = 0;
    int fds0 = count_fds();
    for (int i = 0; i < 400; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int f = i % 3 == 0; /* two thirds of the mutations hit the manifest */
        unsigned char *b = malloc((size_t)len[f]);
        CHECK(b);
        memcpy(b, orig[f], (size_t)len[f]);
        long n = len[f];
        int kind = (int)((x >> 32) % 4);
        if (kind == 3) n = (long)((x >> 8) % (uint64_t)len[f]); /* truncate */
        else
            for (int k = 0; k <= kind; k++) { /* 1 to 3 bit flips */
                uint64_t y = x * (uint64_t)(k + 1) * 0xD1B54A32D192ED03ull;
                b[(y >> 16) % (uint64_t)len[f]] ^= (unsigned char)(1u << (y & 7));
            }
        CHECK(t_write_file(files[f], b, (size_t)n) == 0);
        free(b);
        int got = load_model(ck, &m);
        tried++;
        if (got == 1) {
            fprintf(stderr, "mutation %d of %s (kind %d): wrong bytes returned\n", i, files[f],
                    kind);
            return 1;
        }
        if (got == 0) exact++;
        else rejected++;
        CHECK(t_write_file(files[f], orig[f], (size_t)len[f]) == 0);
    }
    CHECK(count_fds() == fds0);
    CHECK(load_model(ck, &m) == 0);
    printf("mutated checkpoints tried: %u; rejected %u, loaded bit-exact %u (damage in "
           "padding), wrong bytes 0\n",
           tried, rejected, exact);
    CHECK(rejected > tried / 2);
    for (int f = 0; f < 2; f++) free(orig[f]);
    model_free(&m);
    return leak_check();
}

const ckptio_test tests_faults[] = {
    {"faults/save", test_fault_save, T_PER_BACKEND, 120},
    {"faults/retry", test_fault_retry, T_PER_BACKEND, 120},
    {"faults/read", test_fault_read, T_PER_BACKEND, 120},
    {"faults/enospc_tmpfs", test_fault_enospc_tmpfs, 0, 60},
    {"faults/crash_kill", test_crash_kill, 0, 300},
    {"faults/stale_cleanup", test_stale_cleanup_safe, 0, 60},
    {"faults/mutated_checkpoint", test_mutated_checkpoint, 0, 120},
    {0},
};
