/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of src/io: the engine on every backend, file opening rules, alignment and the pool. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "test.h"

#define MiB ((uint64_t)1 << 20)

#if defined(__SANITIZE_ADDRESS__)
#define T_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_LSAN 1
#endif
#endif
#ifdef T_LSAN
int __lsan_do_recoverable_leak_check(void);
#endif

/* The runner leaves with _exit(), which skips LeakSanitizer's exit hook: ask it directly. */
static int no_leaks(void)
{
#ifdef T_LSAN
    return __lsan_do_recoverable_leak_check() == 0;
#else
    return 1;
#endif
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The engine for this run's backend (CKPTIO_IO); 77 when io_uring is asked for but missing. */
static int open_engine(ckptio__engine **e, unsigned depth, unsigned threads)
{
    int be = ckptio__backend_from_env(CKPTIO_BACKEND_AUTO);
    CHECK_OK(be);
    if (be == CKPTIO_BACKEND_IO_URING && !ckptio__io_uring_available()) {
        fprintf(stderr, "io_uring unavailable here\n");
        return T_SKIP;
    }
    CHECK_OK(ckptio__engine_open(e, be, depth, threads));
    const char *want = be == CKPTIO_BACKEND_IO_URING                               ? "io_uring"
                       : be == CKPTIO_BACKEND_AUTO && ckptio__io_uring_available() ? "io_uring"
                                                                                   : "psync";
    CHECK(!strcmp(ckptio__engine_name(*e), want));
    return 0;
}

static int buffered(void)
{
    return !strcmp(t_backend(), "buffered");
}

/* How data files are opened in this run: t_dir() allows O_DIRECT, so demand it unless the
 * run is the buffered one. */
static int run_direct(void)
{
    return buffered() ? CKPTIO_OFF : CKPTIO_ON;
}

/* Submit all n requests keeping the engine full, reap them all, check each moved len bytes.
 * *busy counts -EBUSY refusals, which must come exactly when depth requests are out. */
static int run_all(ckptio__engine *e, ckptio__req *reqs, unsigned n, unsigned *busy)
{
    unsigned next = 0, done = 0;
    ckptio__req *out[32];
    while (done < n) {
        while (next < n) {
            int rc = ckptio__engine_submit(e, &reqs[next]);
            if (rc == -EBUSY) {
                CHECK(e->inflight == e->depth);
                (*busy)++;
                break;
            }
            CHECK_OK(rc);
            next++;
        }
        int k = ckptio__engine_reap(e, out, 32, 1);
        CHECK(k >= 1);
        for (int i = 0; i < k; i++) {
            if (out[i]->res != (int64_t)out[i]->len)
                fprintf(stderr, "req off %llu len %llu: res %lld\n",
                        (unsigned long long)out[i]->off, (unsigned long long)out[i]->len,
                        (long long)out[i]->res);
            CHECK(out[i]->res == (int64_t)out[i]->len);
        }
        done += (unsigned)k;
    }
    CHECK(e->inflight == 0);
    return 0;
}

/* 64 MiB out as 1-8 MiB writes, 12 in flight; back as 2 MiB reads, 16 in flight. */
static int test_roundtrip(void)
{
    const uint64_t total = 64 * MiB;
    ckptio__engine *e;
    int rc = open_engine(&e, 12, 4);
    if (rc) return rc;
    uint8_t *src = t_alloc(total), *dst = t_alloc(total);
    CHECK(src && dst);
    t_fill(src, total, 1);

    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "data", CKPTIO__F_WRITE, run_direct(), &fd, &direct));
    CHECK(direct == !buffered());
    uint32_t ma, oa;
    ckptio__file_dio_align(fd, &ma, &oa);
    CHECK(MiB % oa == 0 && 4096 % ma == 0);

    static ckptio__req reqs[64];
    unsigned n = 0, busy = 0;
    for (uint64_t off = 0; off < total; n++) {
        uint64_t len = CKPTIO__MIN(((n * 5) % 8 + 1) * MiB, total - off);
        reqs[n] = (ckptio__req){
            .fd = fd, .op = CKPTIO__OP_WRITE, .buf = src + off, .off = off, .len = len};
        off += len;
    }
    CHECK_OK(run_all(e, reqs, n, &busy));
    CHECK(busy > 0);
    CHECK_OK(ckptio__fsync(fd));
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == total);
    close(fd);

    CHECK_OK(ckptio__file_open(AT_FDCWD, "data", CKPTIO__F_READ, run_direct(), &fd, &direct));
    CHECK(direct == !buffered());
    ckptio__engine_close(e);
    rc = open_engine(&e, 16, 4);
    if (rc) return rc;
    n = 0;
    for (uint64_t off = 0; off < total; off += 2 * MiB, n++)
        reqs[n] = (ckptio__req){.fd = fd,
                                .op = CKPTIO__OP_READ,
                                .buf = dst + off,
                                .off = off,
                                .len = 2 * MiB,
                                .user_u64 = n};
    busy = 0;
    CHECK_OK(run_all(e, reqs, n, &busy));
    CHECK(busy > 0);
    CHECK(memcmp(src, dst, total) == 0);
    ckptio__engine_close(e);
    close(fd);
    t_free(src, total);
    t_free(dst, total);
    return 0;
}

/* Many small requests with irregular reaping: exercises the queues (and TSan) more than
 * the bandwidth. */
static int test_stress(void)
{
    enum { N = 4096, SZ = 4096 };
    ckptio__engine *e;
    int rc = open_engine(&e, 16, 4);
    if (rc) return rc;
    uint8_t *src = t_alloc((size_t)N * SZ), *dst = t_alloc((size_t)N * SZ);
    CHECK(src && dst);
    t_fill(src, (size_t)N * SZ, 7);
    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "s", CKPTIO__F_WRITE, run_direct(), &fd, &direct));
    int rfd = open("s", O_RDONLY | O_CLOEXEC);
    CHECK(rfd >= 0);
    static ckptio__req reqs[2 * N];
    for (unsigned i = 0; i < N; i++) {
        /* Out of order on purpose: a permutation of the blocks. */
        uint64_t blk = (i * 2654435761u) % N;
        reqs[i] = (ckptio__req){
            .fd = fd, .op = CKPTIO__OP_WRITE, .buf = src + blk * SZ, .off = blk * SZ, .len = SZ};
        reqs[N + i] = (ckptio__req){
            .fd = rfd, .op = CKPTIO__OP_READ, .buf = dst + blk * SZ, .off = blk * SZ, .len = SZ};
    }
    for (int pass = 0; pass < 2; pass++) {
        unsigned next = 0, done = 0, seed = 12345;
        ckptio__req *out[8];
        while (done < N) {
            while (next < N && ckptio__engine_submit(e, &reqs[pass * N + next]) == 0)
                next++;
            seed = seed * 1103515245u + 12345u;
            unsigned min = (seed >> 16) % 3, max = 1 + (seed >> 8) % 8; /* min 0: collect */
            unsigned before = e->inflight;
            int k = ckptio__engine_reap(e, out, max, min);
            CHECK(k >= 0 && (unsigned)k <= max && e->inflight == before - (unsigned)k);
            CHECK((unsigned)k >= CKPTIO__MIN(min, CKPTIO__MIN(max, before)));
            for (int i = 0; i < k; i++)
                CHECK(out[i]->res == SZ);
            done += (unsigned)k;
        }
    }
    CHECK(memcmp(src, dst, (size_t)N * SZ) == 0);
    ckptio__engine_close(e);
    close(fd);
    close(rfd);
    t_free(src, (size_t)N * SZ);
    t_free(dst, (size_t)N * SZ);
    return 0;
}

static int reap_one(ckptio__engine *e, ckptio__req **r)
{
    CHECK(ckptio__engine_reap(e, r, 1, 1) == 1);
    return 0;
}

/* A read across the end of file returns what is there; past it, 0. */
static int test_eof(void)
{
    ckptio__engine *e;
    int rc = open_engine(&e, 4, 2);
    if (rc) return rc;
    uint8_t data[10000];
    t_fill(data, sizeof data, 3);
    CHECK(t_write_file("small", data, sizeof data) == 0);
    int fd, direct;
    int want = buffered() ? CKPTIO_OFF : CKPTIO_AUTO;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "small", CKPTIO__F_READ, want, &fd, &direct));
    uint8_t *buf = t_alloc(16384);
    CHECK(buf);
    const struct {
        uint64_t off, len;
        int64_t res;
    } cases[] = {{0, 16384, 10000}, {8192, 8192, 10000 - 8192}, {16384, 4096, 0}, {0, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(buf, 0, 16384);
        ckptio__req r = {.fd = fd,
                         .op = CKPTIO__OP_READ,
                         .buf = buf,
                         .off = cases[i].off,
                         .len = cases[i].len},
                    *got;
        CHECK_OK(ckptio__engine_submit(e, &r));
        CHECK_OK(reap_one(e, &got));
        CHECK(got == &r && r.res == cases[i].res);
        if (r.res > 0) CHECK(memcmp(buf, data + r.off, (size_t)r.res) == 0);
    }
    ckptio__engine_close(e);
    close(fd);
    t_free(buf, 16384);
    return 0;
}

/* Failures come back as completions with -errno; the engine stays usable. */
static int test_errors(void)
{
    ckptio__engine *e;
    int rc = open_engine(&e, 4, 2);
    if (rc) return rc;
    uint8_t *buf = t_alloc(8192);
    CHECK(buf);
    int wfd = open("w", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    int rfd = open("w", O_RDONLY | O_CLOEXEC);
    CHECK(wfd >= 0 && rfd >= 0);
    const struct {
        int fd, op;
    } bad[] = {{wfd, CKPTIO__OP_READ}, {rfd, CKPTIO__OP_WRITE}, {-1, CKPTIO__OP_READ}};
    ckptio__req r[3], *got;
    for (int i = 0; i < 3; i++) {
        r[i] = (ckptio__req){.fd = bad[i].fd, .op = bad[i].op, .buf = buf, .len = 4096};
        CHECK_OK(ckptio__engine_submit(e, &r[i]));
    }
    for (int i = 0; i < 3; i++) {
        CHECK_OK(reap_one(e, &got));
        CHECK(got->res == -EBADF);
    }
    /* O_DIRECT refuses a misaligned buffer with EINVAL. */
    int dfd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "d", CKPTIO__F_WRITE, CKPTIO_AUTO, &dfd, &direct));
    if (direct) {
        r[0] = (ckptio__req){.fd = dfd, .op = CKPTIO__OP_WRITE, .buf = buf + 1, .len = 4096};
        CHECK_OK(ckptio__engine_submit(e, &r[0]));
        CHECK_OK(reap_one(e, &got));
        CHECK(got->res == -EINVAL);
    }
    r[0] = (ckptio__req){.fd = wfd, .op = CKPTIO__OP_WRITE, .buf = buf, .len = 8192};
    CHECK_OK(ckptio__engine_submit(e, &r[0]));
    CHECK_OK(reap_one(e, &got));
    CHECK(got->res == 8192);
    r[0].op = 7;
    CHECK_ERR(ckptio__engine_submit(e, &r[0]), CKPTIO_E_USAGE);
    ckptio__engine_close(e);
    close(wfd);
    close(rfd);
    close(dfd);
    t_free(buf, 8192);
    return 0;
}

/* A write cut short (by RLIMIT_FSIZE) is continued, and the continuation's EFBIG reported. */
static int test_short_write(void)
{
    ckptio__engine *e;
    int rc = open_engine(&e, 4, 2);
    if (rc) return rc;
    const uint64_t limit = MiB + 4096;
    uint8_t *buf = t_alloc(2 * MiB);
    CHECK(buf);
    t_fill(buf, 2 * MiB, 5);
    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "f", CKPTIO__F_WRITE, run_direct(), &fd, &direct));
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, rl;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    rl = old;
    rl.rlim_cur = limit;
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    ckptio__req r = {.fd = fd, .op = CKPTIO__OP_WRITE, .buf = buf, .len = 2 * MiB}, *got;
    CHECK_OK(ckptio__engine_submit(e, &r));
    CHECK_OK(reap_one(e, &got));
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECK(got->res == -EFBIG);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == limit);
    ckptio__engine_close(e);
    close(fd);
    t_free(buf, 2 * MiB);
    return 0;
}

/* depth is a hard bound; reap never waits for what cannot come, and min=0 only collects. */
static int test_busy(void)
{
    ckptio__engine *e;
    int rc = open_engine(&e, 3, 1);
    if (rc) return rc;
    CHECK(e->depth == 3);
    uint8_t *buf = t_alloc(4 * 4096);
    CHECK(buf);
    int fd = open("b", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    ckptio__req r[4], *out[8];
    for (int i = 0; i < 4; i++)
        r[i] = (ckptio__req){.fd = fd,
                             .op = CKPTIO__OP_WRITE,
                             .buf = buf + i * 4096,
                             .off = (uint64_t)i * 4096,
                             .len = 4096};
    for (int i = 0; i < 3; i++)
        CHECK_OK(ckptio__engine_submit(e, &r[i]));
    CHECK_ERR(ckptio__engine_submit(e, &r[3]), -EBUSY);
    int got = ckptio__engine_reap(e, out, 8, 0);
    CHECK(got >= 0 && got <= 3);
    int rest = ckptio__engine_reap(e, out, 8, 100); /* more than in flight: clamped */
    CHECK(rest == 3 - got && e->inflight == 0);
    CHECK(ckptio__engine_reap(e, out, 8, 1) == 0); /* nothing in flight: no wait */
    CHECK_OK(ckptio__engine_submit(e, &r[3]));
    CHECK(ckptio__engine_reap(e, out, 0, 1) == 0); /* no room: nothing taken */
    CHECK(ckptio__engine_reap(e, out, 1, 1) == 1 && out[0] == &r[3] && r[3].res == 4096);
    ckptio__engine_close(e);
    close(fd);
    t_free(buf, 4 * 4096);
    return 0;
}

/* Closing with requests still queued waits for them: all the data lands, nothing leaks. */
static int test_close_pending(void)
{
    enum { N = 16 };
    int fds0 = count_fds();
    ckptio__engine *e;
    int rc = open_engine(&e, N, 1); /* one thread: most requests wait in the queue */
    if (rc) return rc;
    uint8_t *buf = t_alloc(N * MiB);
    CHECK(buf);
    t_fill(buf, N * MiB, 9);
    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "c", CKPTIO__F_WRITE, run_direct(), &fd, &direct));
    static ckptio__req r[N];
    for (unsigned i = 0; i < N; i++) {
        r[i] = (ckptio__req){
            .fd = fd, .op = CKPTIO__OP_WRITE, .buf = buf + i * MiB, .off = i * MiB, .len = MiB};
        CHECK_OK(ckptio__engine_submit(e, &r[i]));
    }
    ckptio__engine_close(e);
    for (unsigned i = 0; i < N; i++)
        CHECK(r[i].res == (int64_t)MiB);
    close(fd);
    unsigned char *back;
    CHECK(t_read_file("c", &back) == (long)(N * MiB));
    CHECK(memcmp(back, buf, N * MiB) == 0);
    free(back);
    t_free(buf, N * MiB);
    ckptio__engine_close(NULL);
    CHECK(count_fds() == fds0);
    CHECK(no_leaks());
    return 0;
}

static int test_env(void)
{
    static const struct {
        const char *v;
        int want;
    } cases[] = {{"io_uring", CKPTIO_BACKEND_IO_URING},
                 {"psync", CKPTIO_BACKEND_PSYNC},
                 {"buffered", CKPTIO_BACKEND_BUFFERED},
                 {"auto", CKPTIO_BACKEND_AUTO},
                 {"", CKPTIO_BACKEND_PSYNC},
                 {"bogus", CKPTIO_E_USAGE},
                 {"IO_URING", CKPTIO_E_USAGE},
                 {"psync ", CKPTIO_E_USAGE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("CKPTIO_IO", cases[i].v, 1);
        CHECK_ERR(ckptio__backend_from_env(CKPTIO_BACKEND_PSYNC), cases[i].want);
    }
    unsetenv("CKPTIO_IO");
    for (int b = CKPTIO_BACKEND_AUTO; b <= CKPTIO_BACKEND_BUFFERED; b++)
        CHECK(ckptio__backend_from_env(b) == b);
    CHECK_ERR(ckptio__backend_from_env(9), CKPTIO_E_USAGE);

    ckptio__engine *e;
    bool uring = ckptio__io_uring_available();
    CHECK(uring == ckptio__io_uring_available()); /* cached, stable */
    CHECK_OK(ckptio__engine_open(&e, CKPTIO_BACKEND_AUTO, 0, 0));
    CHECK(!strcmp(ckptio__engine_name(e), uring ? "io_uring" : "psync"));
    CHECK(e->depth == 16 && e->threads == 4);
    ckptio__engine_close(e);
    CHECK_OK(ckptio__engine_open(&e, CKPTIO_BACKEND_BUFFERED, 2, 2));
    CHECK(!strcmp(ckptio__engine_name(e), "psync"));
    ckptio__engine_close(e);
    if (uring) {
        CHECK_OK(ckptio__engine_open(&e, CKPTIO_BACKEND_IO_URING, 2, 0));
        CHECK(!strcmp(ckptio__engine_name(e), "io_uring"));
        ckptio__engine_close(e);
    } else {
        CHECK_ERR(ckptio__engine_open(&e, CKPTIO_BACKEND_IO_URING, 2, 0), CKPTIO_E_UNSUPPORTED);
        CHECK(e == NULL);
    }
    CHECK_ERR(ckptio__engine_open(&e, 42, 2, 0), CKPTIO_E_USAGE);
    return 0;
}

/* Opens `name` in `dirfd` every way and checks that the outcome matches what a plain open
 * with O_DIRECT says about this file system. */
static int check_direct_rules(int dirfd, const char *name)
{
    int probe = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
    int refused = probe < 0 && errno == EINVAL;
    CHECK(probe >= 0 || refused);
    if (probe >= 0) close(probe);
    unlinkat(dirfd, name, 0);
    fprintf(stderr, "O_DIRECT %s here\n", refused ? "refused" : "accepted");

    int fd, direct;
    CHECK_OK(ckptio__file_open(dirfd, name, CKPTIO__F_WRITE, CKPTIO_AUTO, &fd, &direct));
    CHECK(direct == !refused);
    CHECK(write(fd, "x", 1) == 1 || direct); /* a 1-byte O_DIRECT write may fail: fine */
    close(fd);
    CHECK_OK(ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_AUTO, &fd, &direct));
    CHECK(direct == !refused);
    close(fd);
    if (refused) {
        CHECK_ERR(ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_ON, &fd, &direct), -EINVAL);
        CHECK(fd == -1);
    }
    CHECK_OK(ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_OFF, &fd, &direct));
    CHECK(direct == 0);
    close(fd);
    CHECK(unlinkat(dirfd, name, 0) == 0);

    int rc = ckptio__file_open(dirfd, name, CKPTIO__F_WRITE, CKPTIO_ON, &fd, &direct);
    if (refused) {
        CHECK_ERR(rc, -EINVAL);
        /* The refused attempt must not leave a file that would block a buffered retry. */
        CHECK(faccessat(dirfd, name, F_OK, 0) < 0 && errno == ENOENT);
    } else {
        CHECK_OK(rc);
        CHECK(direct == 1);
        close(fd);
        CHECK(unlinkat(dirfd, name, 0) == 0);
    }
    CHECK_OK(ckptio__file_open(dirfd, name, CKPTIO__F_WRITE, CKPTIO_OFF, &fd, &direct));
    CHECK(direct == 0);
    close(fd);
    CHECK(unlinkat(dirfd, name, 0) == 0);
    return 0;
}

/* ramfs refuses O_DIRECT on every kernel; mount one in a private mount namespace (test.h). */
int t_mount_ramfs(const char *where)
{
    if (mkdir(where, 0700) < 0) return -1;
    if (unshare(CLONE_NEWNS) < 0) {
        /* Not root: a user namespace grants the right, once our uid is mapped in it. */
        uid_t uid = geteuid();
        gid_t gid = getegid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) return -1;
        char m[64];
        snprintf(m, sizeof m, "0 %u 1", (unsigned)uid);
        if (t_write_file("/proc/self/uid_map", m, strlen(m)) < 0) return -1;
        if (t_write_file("/proc/self/setgroups", "deny", 4) < 0) return -1;
        snprintf(m, sizeof m, "0 %u 1", (unsigned)gid);
        if (t_write_file("/proc/self/gid_map", m, strlen(m)) < 0) return -1;
    }
    /* Private first, or the mount would propagate back to the host's namespace. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
    return mount("none", where, "ramfs", 0, NULL);
}

static int test_direct_fallback(void)
{
    int ran = 0;
    char name[64];
    snprintf(name, sizeof name, "ckptio-test-%d", (int)getpid());
    /* tmpfs refused O_DIRECT before Linux 6.6 and accepts it since: either way the engine
     * must agree with the kernel. */
    int shm = open("/dev/shm", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (shm >= 0) {
        int rc = check_direct_rules(shm, name);
        unlinkat(shm, name, 0);
        close(shm);
        if (rc) return rc;
        ran++;
    }
    /* A read-only file system that never allows O_DIRECT. */
    int proc = open("/proc/self", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (proc >= 0) {
        int fd, direct;
        CHECK_OK(ckptio__file_open(proc, "status", CKPTIO__F_READ, CKPTIO_AUTO, &fd, &direct));
        CHECK(direct == 0);
        char b[16];
        CHECK(read(fd, b, sizeof b) > 0);
        close(fd);
        CHECK_ERR(ckptio__file_open(proc, "status", CKPTIO__F_READ, CKPTIO_ON, &fd, &direct),
                  -EINVAL);
        close(proc);
        ran++;
    }
    if (t_mount_ramfs(t_path("ram")) == 0) {
        int dir = open(t_path("ram"), O_DIRECTORY | O_RDONLY | O_CLOEXEC);
        CHECK(dir >= 0);
        CHECK_OK(check_direct_rules(dir, name));
        close(dir);
        umount(t_path("ram"));
        ran++;
    } else {
        fprintf(stderr, "no private ramfs here (%s): that part skipped\n", strerror(errno));
    }
    return ran ? 0 : T_SKIP;
}

static int refused(int dirfd, const char *name)
{
    int fd = 12345, direct;
    int rc = ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_OFF, &fd, &direct);
    if (rc >= 0) {
        fprintf(stderr, "'%s' was opened\n", name);
        close(fd);
        return 0;
    }
    return fd == -1;
}

static int opens(int dirfd, const char *name)
{
    int fd, direct;
    int rc = ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_OFF, &fd, &direct);
    if (rc < 0) {
        fprintf(stderr, "'%s': %s\n", name, ckptio_errname(rc));
        return 0;
    }
    char c = 0;
    int ok = read(fd, &c, 1) == 1 && c == 'k';
    close(fd);
    return ok;
}

static int check_beneath(int d)
{
    static const char *const bad[] = {"../x",        "/etc/passwd", "a/../../x", "out",     "rel",
                                      "a/../../d/f", "fifo",        "a/out2",    "nothere", "",
                                      ".."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(refused(d, bad[i]));
    CHECK(opens(d, "f") && opens(d, "a/g") && opens(d, "./a//g"));
    return 0;
}

#ifdef SYS_openat2
/* Make openat2 look absent (ENOSYS), as on old kernels and in old container profiles. The
 * architecture is not checked: openat2 has one number on every architecture. */
static int hide_openat2(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}
#endif

static int test_beneath(void)
{
    CHECK(mkdir("d", 0755) == 0 && mkdir("d/a", 0755) == 0);
    CHECK(t_write_file("x", "k", 1) == 0 && t_write_file("d/f", "k", 1) == 0);
    CHECK(t_write_file("d/a/g", "k", 1) == 0);
    CHECK(symlink("/etc/passwd", "d/out") == 0 && symlink("../x", "d/rel") == 0);
    CHECK(symlink("../../x", "d/a/out2") == 0 && mkfifo("d/fifo", 0644) == 0);
    int d = open("d", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    CHECK(d >= 0);
    CHECK_OK(check_beneath(d));
#ifdef SYS_openat2
    if (hide_openat2() == 0) {
        CHECK(syscall(SYS_openat2, d, "f", NULL, 0) < 0 && errno == ENOSYS);
        fprintf(stderr, "again without openat2\n");
        CHECK_OK(check_beneath(d));
        CHECK(refused(d, "a/../f")); /* the walk refuses any "..", even one staying inside */
    } else {
        fprintf(stderr, "cannot hide openat2 (%s): fallback untested\n", strerror(errno));
    }
#endif
    close(d);
    return 0;
}

static int test_align(void)
{
    uint32_t ma = 0, oa = 0;
    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "a", CKPTIO__F_WRITE, CKPTIO_AUTO, &fd, &direct));
    CHECK(direct == 1); /* the test directory allows O_DIRECT */
    ckptio__file_dio_align(fd, &ma, &oa);
    fprintf(stderr, "t_dir alignment: memory %u, offset %u\n", ma, oa);
    CHECK(ckptio__is_pow2(ma) && ckptio__is_pow2(oa));
    CHECK(ma >= 512 && oa >= 512 && ma <= 65536 && oa <= 65536);
    /* What it reports must work: one aligned O_DIRECT write at an aligned offset. */
    uint8_t *buf = t_alloc(2 * (size_t)oa + ma);
    CHECK(buf);
    CHECK(pwrite(fd, buf + ma, oa, oa) == (ssize_t)oa);
    t_free(buf, 2 * (size_t)oa + ma);
    close(fd);
    ckptio__file_dio_align(-1, &ma, &oa); /* unknown: the safe default */
    CHECK(ma == 4096 && oa == 4096);
    ckptio__file_dio_align(-1, NULL, NULL);
    return 0;
}

static int test_fsync(void)
{
    int fd = open("f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    CHECK_OK(ckptio__fsync(fd));
    close(fd);
    CHECK_ERR(ckptio__fsync(fd), -EBADF);
    CHECK_OK(ckptio__fsync_path(t_dir()));
    CHECK_OK(ckptio__fsync_path("."));
    CHECK_ERR(ckptio__fsync_path(t_path("missing")), -ENOENT);
    CHECK_ERR(ckptio__fsync_path(t_path("f")), -ENOTDIR);
    return 0;
}

static int test_write_exclusive(void)
{
    int fd, direct;
    CHECK_OK(ckptio__file_open(AT_FDCWD, "e", CKPTIO__F_WRITE, CKPTIO_OFF, &fd, &direct));
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_WRONLY);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 0777) == (0644 & ~(unsigned)umask(022)));
    close(fd);
    CHECK_ERR(ckptio__file_open(AT_FDCWD, "e", CKPTIO__F_WRITE, CKPTIO_OFF, &fd, &direct), -EEXIST);
    CHECK_ERR(ckptio__file_open(AT_FDCWD, "e", 3, CKPTIO_OFF, &fd, &direct), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__file_open(AT_FDCWD, "e", CKPTIO__F_READ, 5, &fd, &direct), CKPTIO_E_USAGE);
    CHECK_OK(ckptio__file_open(AT_FDCWD, "e", CKPTIO__F_READ, CKPTIO_AUTO, &fd, &direct));
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
    close(fd);
    return 0;
}

/* A request the kernel never finishes (a read of a pipe nobody writes) makes io_uring's reap
 * fail with -ETIMEDOUT after CKPTIO_IO_TIMEOUT seconds, half-way through it cancels and resends
 * what is in flight, a retried reap is told again after about one tick, and the request still
 * completes with the right bytes once the data comes. */
static int test_stall(void)
{
    if (!ckptio__io_uring_available()) return T_SKIP;
    setenv("CKPTIO_IO_TIMEOUT", "2", 1);
    ckptio__engine *e;
    int rc = ckptio__engine_open(&e, CKPTIO_BACKEND_IO_URING, 4, 0);
    unsetenv("CKPTIO_IO_TIMEOUT");
    CHECK_OK(rc);
    int p[2];
    CHECK(pipe(p) == 0);
    char buf[8] = {0};
    ckptio__req r = {.fd = p[0], .op = CKPTIO__OP_READ, .buf = buf, .off = 0, .len = 5};
    CHECK_OK(ckptio__engine_submit(e, &r));
    ckptio__req *out[4];
    double t0 = ckptio__now();
    CHECK_ERR(ckptio__engine_reap(e, out, 4, 1), -ETIMEDOUT);
    double waited = ckptio__now() - t0;
    CHECK(waited >= 1.5 && waited < 30);
    t0 = ckptio__now();
    CHECK_ERR(ckptio__engine_reap(e, out, 4, 1), -ETIMEDOUT);
    CHECK(ckptio__now() - t0 < 10);
    CHECK(e->inflight == 1);
    CHECK(write(p[1], "hello", 5) == 5);
    CHECK(ckptio__engine_reap(e, out, 4, 1) == 1);
    CHECK(out[0] == &r && r.res == 5 && memcmp(buf, "hello", 5) == 0);
    ckptio__engine_close(e);
    close(p[0]);
    close(p[1]);
    return 0;
}

static int test_pool(void)
{
    ckptio__pool p;
    CHECK_ERR(ckptio__pool_init(&p, 0, 4096), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__pool_init(&p, 2, 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__pool_init(&p, 4, SIZE_MAX / 2), CKPTIO_E_LIMIT);
    ckptio__pool_fini(&p); /* a pool whose init failed is safe to release */
    CHECK_OK(ckptio__pool_init(&p, 4, MiB + 1));
    CHECK(p.buf_size >= MiB + 1 && p.buf_size % 4096 == 0 && p.nfree == 4);
    uint8_t *b[5];
    for (int i = 0; i < 4; i++) {
        b[i] = ckptio__pool_get(&p);
        CHECK(b[i] && (uintptr_t)b[i] % 4096 == 0);
        memset(b[i], i + 1, p.buf_size); /* whole buffer usable (ASan watches) */
        for (int j = 0; j < i; j++)
            CHECK(b[i] != b[j]);
    }
    CHECK(ckptio__pool_get(&p) == NULL && p.nfree == 0);
    for (int i = 0; i < 4; i++)
        CHECK(b[i][0] == i + 1 && b[i][p.buf_size - 1] == i + 1);
    ckptio__pool_put(&p, b[2]);
    ckptio__pool_put(&p, NULL);
    CHECK(ckptio__pool_get(&p) == b[2]);
    for (int i = 0; i < 4; i++)
        ckptio__pool_put(&p, b[i]);
    CHECK(p.nfree == 4);
    for (int round = 0; round < 3; round++) { /* reuse: the same buffers come back */
        for (int i = 0; i < 4; i++)
            b[i] = ckptio__pool_get(&p);
        CHECK(ckptio__pool_get(&p) == NULL);
        for (int i = 0; i < 4; i++)
            ckptio__pool_put(&p, b[i]);
    }
    ckptio__pool_fini(&p);
    CHECK(p.base == NULL && p.count == 0);
    ckptio__pool_fini(&p);
    ckptio__pool_fini(NULL);
    CHECK(no_leaks());
    return 0;
}

const ckptio_test tests_io[] = {
    {"io/roundtrip", test_roundtrip, T_PER_BACKEND, 180},
    {"io/stress", test_stress, T_PER_BACKEND, 120},
    {"io/eof", test_eof, T_PER_BACKEND, 0},
    {"io/errors", test_errors, T_PER_BACKEND, 0},
    {"io/short_write", test_short_write, T_PER_BACKEND, 0},
    {"io/busy", test_busy, T_PER_BACKEND, 0},
    {"io/close_pending", test_close_pending, T_PER_BACKEND, 0},
    {"io/env", test_env, 0, 0},
    {"io/direct_fallback", test_direct_fallback, 0, 0},
    {"io/beneath", test_beneath, 0, 0},
    {"io/align", test_align, 0, 0},
    {"io/fsync", test_fsync, 0, 0},
    {"io/write_exclusive", test_write_exclusive, 0, 0},
    {"io/pool", test_pool, 0, 0},
    {"io/stall", test_stall, 0, 60},
    {0},
};
