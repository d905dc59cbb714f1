/* SPDX-License-Identifier: Apache-2.0 */
/* The helpers the public-API test groups (tests/test_api_*.c) share: checks, buffers, files. */
#ifndef CKPTIO_TEST_API_HELPERS_H
#define CKPTIO_TEST_API_HELPERS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)
#define PAGE 4096u
#define GUARD_BYTE 0xA5

/* Every test starts here: the seed goes to the log, which the runner prints on failure. */
#define T_SEED(s)                                                                              \
    uint64_t seed = (s);                                                                       \
    fprintf(stderr, "%s: seed 0x%llx, backend %s\n", __func__, (unsigned long long)seed,      \
            t_backend())

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rnd(rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rnd_below(rng *r, uint64_t n)
{
    return n ? rnd(r) % n : 0;
}

static inline double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sanitizers reserve terabytes of address space: no RLIMIT_AS under them. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define T_SANITIZED 1
#endif
#endif

#ifdef T_SANITIZED
/* Under sanitizers: end the test once its resident memory passes the limit (passed in arg: a
 * header keeps no file-scope state). */
static inline void *rss_watch(void *arg)
{
    const uint64_t rss_limit = (uint64_t)(uintptr_t)arg;
    for (;;) {
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long long size = 0, rss = 0;
        if (f) {
            if (fscanf(f, "%llu %llu", &size, &rss) != 2) rss = 0;
            fclose(f);
        }
        if (rss * (uint64_t)sysconf(_SC_PAGESIZE) > rss_limit) {
            fprintf(stderr, "resident memory passed %llu MiB: runaway allocation\n",
                    (unsigned long long)(rss_limit >> 20));
            _exit(3);
        }
        usleep(20000);
    }
    return NULL;
}
#endif

/* Cap this test process's memory, so that a runaway allocation in the library fails this
 * test (ENOMEM) instead of waking the OOM killer on the whole machine. */
static inline void limit_memory(uint64_t bytes)
{
#ifndef T_SANITIZED
    struct rlimit rl = {bytes, bytes};
    if (setrlimit(RLIMIT_AS, &rl) != 0) perror("setrlimit");
#else
    pthread_t th;
    if (pthread_create(&th, NULL, rss_watch, (void *)(uintptr_t)(2 * bytes)) == 0)
        pthread_detach(th);
#endif
}

static inline uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* A failing call: its code is `a` or `b`, ckptio_last_error() is non-empty and, when `needle`
 * is given, contains it. The message is copied first: any later ckptio call may replace it. */
static inline int expect_fail(long long rc, int a, int b, const char *needle, const char *expr,
                              const char *file, int line)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    if (rc != a && rc != b) {
        fprintf(stderr, "%s:%d: %s -> %lld (%s), expected %s: %s\n", file, line, expr, rc,
                ckptio_errname((int)rc), ckptio_errname(a), msg);
        return 1;
    }
    if (!msg[0]) {
        fprintf(stderr, "%s:%d: %s failed but ckptio_last_error() is empty\n", file, line,
                expr);
        return 1;
    }
    if (needle && !strstr(msg, needle)) {
        fprintf(stderr, "%s:%d: %s: message does not name '%s': %s\n", file, line, expr,
                needle, msg);
        return 1;
    }
    return 0;
}

#define CHECK_FAIL(expr, code, needle)                                                         \
    do {                                                                                       \
        long long f_rc_ = (long long)(expr);                                                   \
        if (expect_fail(f_rc_, (code), (code), (needle), #expr, __FILE__, __LINE__))           \
            return 1;                                                                          \
    } while (0)
#define CHECK_FAIL2(expr, c1, c2, needle)                                                      \
    do {                                                                                       \
        long long f_rc_ = (long long)(expr);                                                   \
        if (expect_fail(f_rc_, (c1), (c2), (needle), #expr, __FILE__, __LINE__)) return 1;     \
    } while (0)
/* A call that must fail, with any code (the contract does not name one). */
#define CHECK_NEG(expr)                                                                        \
    do {                                                                                       \
        long long f_rc_ = (long long)(expr);                                                   \
        if (f_rc_ >= 0) {                                                                      \
            fprintf(stderr, "%s:%d: %s -> %lld, expected a failure\n", __FILE__, __LINE__,     \
                    #expr, f_rc_);                                                             \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)
/* Like CHECK, with a formatted explanation. */
#define CHECKF(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* A buffer inside its own mapping, followed by a PROT_NONE guard page. The bytes around
 * [p, p + len) are GUARD_BYTE so that writes outside can be detected. lead is the distance of
 * p from the mapping's start; LEAD_END places p so that the buffer ends at the guard page. */
#define LEAD_END ((size_t)-1)
typedef struct gbuf {
    unsigned char *map;
    size_t maplen; /* including the guard page */
    unsigned char *p;
    size_t len;
} gbuf;

static inline int gbuf_make(gbuf *g, size_t len, size_t lead)
{
    size_t body = round_up((lead == LEAD_END ? 0 : lead) + len, PAGE);
    if (!body) body = PAGE;
    g->maplen = body + PAGE;
    g->map = mmap(NULL, g->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        return -1;
    }
    memset(g->map, GUARD_BYTE, body);
    if (mprotect(g->map + body, PAGE, PROT_NONE) != 0) return -1;
    g->p = lead == LEAD_END ? g->map + body - len : g->map + lead;
    g->len = len;
    return 0;
}

/* Whether every byte of the body outside [p, p + used) still holds GUARD_BYTE. */
static inline int gbuf_intact(const gbuf *g, size_t used)
{
    const unsigned char *end = g->map + g->maplen - PAGE;
    for (const unsigned char *q = g->map; q < g->p; q++)
        if (*q != GUARD_BYTE) return 0;
    for (const unsigned char *q = g->p + used; q < end; q++)
        if (*q != GUARD_BYTE) return 0;
    return 1;
}

static inline void gbuf_free(gbuf *g)
{
    if (g->map) munmap(g->map, g->maplen);
    g->map = NULL;
}

/* Fill with random bytes; a BOOL tensor gets 0/1 values. */
static inline void fill_dtype(void *buf, size_t len, int dtype, uint64_t seed)
{
    t_fill(buf, len, seed);
    if (dtype == CKPTIO_DT_BOOL)
        for (size_t i = 0; i < len; i++) ((unsigned char *)buf)[i] &= 1;
}

static inline int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Number of entries of `dir` (without . and ..) whose names start with `prefix` ("" = all). */
static inline int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
            !strncmp(de->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

static inline long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* Save a single one-chunk tensor as a whole checkpoint. */
static inline int save1(const char *path, const char *name, int dtype, uint32_t ndim,
                 const uint64_t *shape, const void *data, uint64_t nbytes,
                 const ckptio_params *p)
{
    ckptio_writer *w = NULL;
    int rc = ckptio_writer_open(&w, path, p);
    if (rc >= 0) rc = ckptio_writer_add(w, name, dtype, ndim, shape, NULL, NULL, data, nbytes);
    if (rc >= 0) rc = ckptio_writer_commit(w);
    if (rc < 0)
        fprintf(stderr, "save1(%s, %s) -> %s: %s\n", path, name, ckptio_errname(rc),
                ckptio_last_error());
    ckptio_writer_close(w);
    return rc;
}

/* Read tensor `name` whole, into a fresh aligned buffer, and compare with `expect`. */
static inline int load_cmp(ckptio_reader *r, const char *name, const void *expect, uint64_t nbytes)
{
    uint64_t cap = round_up(nbytes ? nbytes : 1, PAGE);
    unsigned char *buf = t_alloc(cap);
    if (!buf) return 1;
    int rc = ckptio_reader_read_tensor(r, name, buf, cap);
    int bad = rc < 0 || memcmp(buf, expect, nbytes) != 0;
    if (rc < 0)
        fprintf(stderr, "read_tensor(%s) -> %s: %s\n", name, ckptio_errname(rc),
                ckptio_reader_errmsg(r));
    else if (bad)
        fprintf(stderr, "tensor %s: loaded bytes differ from saved ones\n", name);
    t_free(buf, cap);
    return bad;
}

/* Whether the file system of `dir` refuses O_DIRECT opens (tmpfs before Linux 6.6 did; newer
 * kernels accept them). */
static inline int odirect_refused(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.odirect-probe-%d", dir, (int)getpid());
    int fd = open(path, O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    int refused = fd < 0 && errno == EINVAL;
    if (fd >= 0) close(fd);
    unlink(path);
    return refused;
}

/* Expected stats.direct for a checkpoint under `dir` with direct AUTO: 0 for the buffered
 * backend or where O_DIRECT is refused, 1 on file systems known to support O_DIRECT, -1 if
 * either may be right (tmpfs that accepts O_DIRECT opens: a library may still prefer the
 * page cache there). */
static inline int expected_direct(const char *dir)
{
    if (!strcmp(t_backend(), "buffered")) return 0;
    struct statfs sf;
    if (statfs(dir, &sf) != 0) return -1;
    switch ((unsigned long)sf.f_type) {
    case 0xEF53:     /* ext2/3/4 */
    case 0x58465342: /* xfs */
    case 0x9123683E: /* btrfs */
        return 1;
    case 0x01021994: /* tmpfs */
        return odirect_refused(dir) ? 0 : -1;
    default:
        return -1;
    }
}

/* The stats fields every completed operation must have. */
static inline int check_stats(const ckptio_stats *s, int want_direct, const char *what)
{
    const char *be = t_backend();
    if (strcmp(be, "auto") != 0)
        CHECKF(!strcmp(s->backend, be), "%s: stats.backend '%s', forced '%s'", what, s->backend,
               be);
    else
        CHECKF(!strcmp(s->backend, "io_uring") || !strcmp(s->backend, "psync"),
               "%s: stats.backend '%s'", what, s->backend);
    if (want_direct >= 0)
        CHECKF(s->direct == want_direct, "%s: stats.direct %d, expected %d", what, s->direct,
               want_direct);
    if (s->direct)
        CHECKF(s->alignment >= 512 && (s->alignment & (s->alignment - 1)) == 0,
               "%s: stats.alignment %u", what, s->alignment);
    CHECKF(s->seconds >= 0 && isfinite(s->seconds), "%s: stats.seconds %g", what, s->seconds);
    CHECKF(s->gbps >= 0 && isfinite(s->gbps), "%s: stats.gbps %g", what, s->gbps);
    CHECKF(s->io_bytes >= s->bytes, "%s: io_bytes %llu < bytes %llu", what,
           (unsigned long long)s->io_bytes, (unsigned long long)s->bytes);
    return 0;
}

/* Copy the box `ext` at `soff` of a row-major array of shape `sshape` to `doff` of one of
 * shape `dshape` (element size esz). */
static inline void box_copy(unsigned char *dst, const uint64_t *dshape, const uint64_t *doff,
                     const unsigned char *src, const uint64_t *sshape, const uint64_t *soff,
                     const uint64_t *ext, uint32_t ndim, size_t esz)
{
    if (ndim == 0) {
        memcpy(dst, src, esz);
        return;
    }
    for (uint32_t d = 0; d < ndim; d++)
        if (!ext[d]) return;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    uint64_t row = ext[ndim - 1] * esz;
    for (;;) {
        uint64_t so = 0, dof = 0;
        for (uint32_t d = 0; d < ndim; d++) {
            uint64_t i = d + 1 < ndim ? idx[d] : 0;
            so = so * sshape[d] + soff[d] + i;
            dof = dof * dshape[d] + doff[d] + i;
        }
        memcpy(dst + dof * esz, src + so * esz, row);
        int d = (int)ndim - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < ext[d]) break;
            idx[d] = 0;
        }
        if (d < 0) break;
    }
}

/* The box [off, off + ext) of `ref` (shape `shape`) as a packed row-major array in out. */
static inline void extract(unsigned char *out, const unsigned char *ref, const uint64_t *shape,
                    const uint64_t *off, const uint64_t *ext, uint32_t ndim, size_t esz)
{
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    box_copy(out, ext, zeros, ref, shape, off, ext, ndim, esz);
}

static inline uint64_t volume(const uint64_t *shape, uint32_t ndim)
{
    uint64_t v = 1;
    for (uint32_t d = 0; d < ndim; d++) v *= shape[d];
    return v;
}

#endif
