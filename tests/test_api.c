/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the public C API (ckptio.h): round trips, regions, corruption, commit, errors. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../src/format/manifest.h"
#include "test.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

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

static uint64_t rnd(rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rnd_below(rng *r, uint64_t n)
{
    return n ? rnd(r) % n : 0;
}

static double mono(void)
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
static uint64_t rss_limit;

/* Under sanitizers: end the test once its resident memory passes the limit. */
static void *rss_watch(void *arg)
{
    (void)arg;
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
static void limit_memory(uint64_t bytes)
{
#ifndef T_SANITIZED
    struct rlimit rl = {bytes, bytes};
    if (setrlimit(RLIMIT_AS, &rl) != 0) perror("setrlimit");
#else
    pthread_t th;
    rss_limit = 2 * bytes;
    if (pthread_create(&th, NULL, rss_watch, NULL) == 0) pthread_detach(th);
#endif
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* A failing call: its code is `a` or `b`, ckptio_last_error() is non-empty and, when `needle`
 * is given, contains it. The message is copied first: any later ckptio call may replace it. */
static int expect_fail(long long rc, int a, int b, const char *needle, const char *expr, int line)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    if (rc != a && rc != b) {
        fprintf(stderr, "test_api.c:%d: %s -> %lld (%s), expected %s: %s\n", line, expr, rc,
                ckptio_errname((int)rc), ckptio_errname(a), msg);
        return 1;
    }
    if (!msg[0]) {
        fprintf(stderr, "test_api.c:%d: %s failed but ckptio_last_error() is empty\n", line,
                expr);
        return 1;
    }
    if (needle && !strstr(msg, needle)) {
        fprintf(stderr, "test_api.c:%d: %s: message does not name '%s': %s\n", line, expr,
                needle, msg);
        return 1;
    }
    return 0;
}

#define CHECK_FAIL(expr, code, needle)                                                         \
    do {                                                                                       \
        long long f_rc_ = (long long)(expr);                                                   \
        if (expect_fail(f_rc_, (code), (code), (needle), #expr, __LINE__)) return 1;           \
    } while (0)
#define CHECK_FAIL2(expr, c1, c2, needle)                                                      \
    do {                                                                                       \
        long long f_rc_ = (long long)(expr);                                                   \
        if (expect_fail(f_rc_, (c1), (c2), (needle), #expr, __LINE__)) return 1;               \
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

static int gbuf_make(gbuf *g, size_t len, size_t lead)
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

/* Make the body read-only (a source the library must not write to). */
static int gbuf_readonly(gbuf *g)
{
    return mprotect(g->map, g->maplen - PAGE, PROT_READ);
}

/* Whether every byte of the body outside [p, p + used) still holds GUARD_BYTE. */
static int gbuf_intact(const gbuf *g, size_t used)
{
    const unsigned char *end = g->map + g->maplen - PAGE;
    for (const unsigned char *q = g->map; q < g->p; q++)
        if (*q != GUARD_BYTE) return 0;
    for (const unsigned char *q = g->p + used; q < end; q++)
        if (*q != GUARD_BYTE) return 0;
    return 1;
}

static void gbuf_free(gbuf *g)
{
    if (g->map) munmap(g->map, g->maplen);
    g->map = NULL;
}

/* Fill with random bytes; a BOOL tensor gets 0/1 values. */
static void fill_dtype(void *buf, size_t len, int dtype, uint64_t seed)
{
    t_fill(buf, len, seed);
    if (dtype == CKPTIO_DT_BOOL)
        for (size_t i = 0; i < len; i++) ((unsigned char *)buf)[i] &= 1;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Number of entries of `dir` (without . and ..) whose names start with `prefix` ("" = all). */
static int count_entries(const char *dir, const char *prefix)
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

/* Print the entries of a directory (for failure logs). */
static void list_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    fprintf(stderr, "  entries of %s:", dir);
    while ((de = readdir(d))) fprintf(stderr, " '%s'", de->d_name);
    fputc('\n', stderr);
    closedir(d);
}

/* No `<name>.tmp-*` sibling of checkpoint `name` in t_dir(). */
static int no_tmp(const char *name)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s.tmp", name);
    int n = count_entries(t_dir(), prefix);
    if (n != 0) list_dir(t_dir());
    return n == 0;
}

/* Find the name of the temporary sibling of `name` (a `<name>.tmp-*` entry of t_dir()). */
static int find_tmp(const char *name, char *out, size_t len)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s.tmp-", name);
    DIR *d = opendir(t_dir());
    if (!d) return -1;
    int found = -1;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix))) {
            snprintf(out, len, "%s", de->d_name);
            found = 0;
        }
    closedir(d);
    return found;
}

static int read_byte(const char *path, uint64_t off, unsigned char *b)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, b, 1, (off_t)off);
    close(fd);
    return n == 1 ? 0 : -1;
}

/* XOR one byte of a file (applying it twice restores the file). */
static int flip_byte(const char *path, uint64_t off, unsigned char mask)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    unsigned char b;
    int rc = -1;
    if (pread(fd, &b, 1, (off_t)off) == 1) {
        b ^= mask;
        if (pwrite(fd, &b, 1, (off_t)off) == 1 && fsync(fd) == 0) rc = 0;
    }
    close(fd);
    return rc;
}

static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* Save a single one-chunk tensor as a whole checkpoint. */
static int save1(const char *path, const char *name, int dtype, uint32_t ndim,
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
static int load_cmp(ckptio_reader *r, const char *name, const void *expect, uint64_t nbytes)
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
static int odirect_refused(const char *dir)
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
static int expected_direct(const char *dir)
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
static int check_stats(const ckptio_stats *s, int want_direct, const char *what)
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
static void box_copy(unsigned char *dst, const uint64_t *dshape, const uint64_t *doff,
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
static void extract(unsigned char *out, const unsigned char *ref, const uint64_t *shape,
                    const uint64_t *off, const uint64_t *ext, uint32_t ndim, size_t esz)
{
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    box_copy(out, ext, zeros, ref, shape, off, ext, ndim, esz);
}

static uint64_t volume(const uint64_t *shape, uint32_t ndim)
{
    uint64_t v = 1;
    for (uint32_t d = 0; d < ndim; d++) v *= shape[d];
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* Round trips                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Every dtype of the table, as a 2-d tensor and as a 0-d scalar; tensor_info of each. The
 * checkpoint path is relative (the cwd is t_dir()). */
static int test_dtypes(void)
{
    T_SEED(0xD7E5);
    enum { NDT = CKPTIO_DT_BYTES };
    static const uint64_t shape[2] = {5, 13};
    unsigned char *data[NDT + 1] = {0}, *scal[NDT + 1] = {0};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", NULL));
    for (int d = CKPTIO_DT_BOOL; d <= CKPTIO_DT_BYTES; d++) {
        size_t esz = ckptio_dtype_size(d);
        CHECKF(esz > 0 && ckptio_dtype_name(d), "dtype %d", d);
        data[d] = malloc(65 * esz);
        scal[d] = malloc(esz);
        CHECK(data[d] && scal[d]);
        fill_dtype(data[d], 65 * esz, d, seed + (uint64_t)d);
        fill_dtype(scal[d], esz, d, seed + 100 + (uint64_t)d);
        char name[64];
        snprintf(name, sizeof name, "dt.%s", ckptio_dtype_name(d));
        CHECK_OK(ckptio_writer_add(w, name, d, 2, shape, NULL, NULL, data[d], 65 * esz));
        snprintf(name, sizeof name, "scalar.%s", ckptio_dtype_name(d));
        /* a scalar has no dimensions: shape may be NULL or point at nothing in particular */
        CHECK_OK(ckptio_writer_add(w, name, d, 0, (d & 1) ? NULL : shape, NULL, NULL, scal[d],
                                   esz));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ck", NULL));
    CHECK(ckptio_reader_num_tensors(r) == 2 * NDT);
    for (int d = CKPTIO_DT_BOOL; d <= CKPTIO_DT_BYTES; d++) {
        size_t esz = ckptio_dtype_size(d);
        for (int s = 0; s < 2; s++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%s", s ? "scalar" : "dt", ckptio_dtype_name(d));
            int64_t i = ckptio_reader_find(r, name);
            CHECKF(i >= 0, "find(%s) -> %lld", name, (long long)i);
            ckptio_tensor_info ti = {.size = sizeof ti};
            CHECK_OK(ckptio_reader_tensor(r, (size_t)i, &ti));
            CHECKF(!strcmp(ti.name, name), "info.name '%s' for '%s'", ti.name, name);
            CHECKF(ti.dtype == d, "%s: dtype %d", name, ti.dtype);
            CHECKF(ti.ndim == (s ? 0u : 2u), "%s: ndim %u", name, ti.ndim);
            if (!s) CHECK(ti.shape && ti.shape[0] == 5 && ti.shape[1] == 13);
            uint64_t nb = (s ? 1 : 65) * esz;
            CHECKF(ti.nbytes == nb, "%s: nbytes %llu", name, (unsigned long long)ti.nbytes);
            CHECKF(ti.num_chunks == 1, "%s: num_chunks %llu", name,
                   (unsigned long long)ti.num_chunks);
            CHECKF(ti.stored_bytes == nb, "%s: stored_bytes %llu (no codec: expected %llu)",
                   name, (unsigned long long)ti.stored_bytes, (unsigned long long)nb);
            if (load_cmp(r, name, s ? scal[d] : data[d], nb)) return 1;
        }
    }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    for (int d = 0; d <= NDT; d++) free(data[d]), free(scal[d]);
    return 0;
}

/* Small and boundary sizes (empty, 1 byte, scalars, 4095/4096/4097 bytes, ...) from sources
 * that are aligned, misaligned, or end at a guard page (read-only, so the library must not
 * write into them or read past their end), loaded into destinations aligned and misaligned,
 * with capacity exact and rounded up; bytes outside the capacity must stay untouched. */
static int test_sizes(void)
{
    T_SEED(0x5122);
    static const struct {
        const char *name;
        int dtype;
        uint32_t ndim;
        uint64_t shape[2];
    } cases[] = {
        {"empty_0x5", CKPTIO_DT_F32, 2, {0, 5}},   {"empty_5x0", CKPTIO_DT_U8, 2, {5, 0}},
        {"empty_1d", CKPTIO_DT_I64, 1, {0, 0}},    {"one_byte", CKPTIO_DT_U8, 1, {1, 0}},
        {"scalar_f64", CKPTIO_DT_F64, 0, {0, 0}},  {"scalar_u8", CKPTIO_DT_BOOL, 0, {0, 0}},
        {"b4095", CKPTIO_DT_U8, 1, {4095, 0}},     {"b4096", CKPTIO_DT_U8, 1, {4096, 0}},
        {"b4097", CKPTIO_DT_I8, 1, {4097, 0}},     {"f32_4096B", CKPTIO_DT_F32, 2, {32, 32}},
        {"c128_4112B", CKPTIO_DT_C128, 1, {257, 0}}, {"b8191", CKPTIO_DT_BYTES, 1, {8191, 0}},
        {"u16_12290B", CKPTIO_DT_U16, 2, {5, 1229}}, {"b63", CKPTIO_DT_U8, 1, {63, 0}},
        {"b65", CKPTIO_DT_U8, 1, {65, 0}},
    };
    enum { NC = sizeof cases / sizeof cases[0], NSRC = 3, NDST = 5 };
    static const size_t src_lead[NSRC] = {0, 1, LEAD_END};
    static const char *const src_tag[NSRC] = {"aligned", "plus1", "at_guard"};
    gbuf src[NC][NSRC];
    memset(src, 0, sizeof src);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t c = 0; c < NC; c++) {
        uint64_t nb = volume(cases[c].shape, cases[c].ndim) * ckptio_dtype_size(cases[c].dtype);
        for (size_t s = 0; s < NSRC; s++) {
            CHECK(gbuf_make(&src[c][s], nb, src_lead[s]) == 0);
            fill_dtype(src[c][s].p, nb, cases[c].dtype, seed + c * 7 + s);
            CHECK(gbuf_readonly(&src[c][s]) == 0);
            char name[64];
            snprintf(name, sizeof name, "%s.%s", cases[c].name, src_tag[s]);
            CHECK_OK(ckptio_writer_add(w, name, cases[c].dtype, cases[c].ndim, cases[c].shape,
                                       NULL, NULL, src[c][s].p, nb));
        }
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NC * NSRC);
    /* destinations: aligned exact, aligned rounded, +1 exact, +1 rounded, ending at a guard */
    static const size_t dst_lead[NDST] = {0, 0, 1, 1, LEAD_END};
    static const int dst_round[NDST] = {0, 1, 0, 1, 0};
    for (size_t c = 0; c < NC; c++) {
        uint64_t nb = volume(cases[c].shape, cases[c].ndim) * ckptio_dtype_size(cases[c].dtype);
        for (size_t s = 0; s < NSRC; s++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%s", cases[c].name, src_tag[s]);
            ckptio_tensor_info ti = {.size = sizeof ti};
            int64_t idx = ckptio_reader_find(r, name);
            CHECKF(idx >= 0, "find(%s)", name);
            CHECK_OK(ckptio_reader_tensor(r, (size_t)idx, &ti));
            CHECKF(ti.nbytes == nb, "%s: nbytes %llu, expected %llu", name,
                   (unsigned long long)ti.nbytes, (unsigned long long)nb);
            for (size_t k = 0; k < NDST; k++) {
                uint64_t cap = dst_round[k] ? round_up(nb ? nb : 1, PAGE) : nb;
                gbuf dst;
                CHECK(gbuf_make(&dst, cap, dst_lead[k]) == 0);
                ckptio_region whole = {.size = sizeof whole, .name = name, .dst = dst.p,
                                       .capacity = cap};
                int rc = k % 2 ? ckptio_reader_read_tensor(r, name, dst.p, cap)
                               : ckptio_reader_read(r, &whole, 1);
                CHECKF(rc >= 0, "%s into dst kind %zu (cap %llu): %s: %s", name, k,
                       (unsigned long long)cap, ckptio_errname(rc), ckptio_reader_errmsg(r));
                CHECKF(memcmp(dst.p, src[c][s].p, nb) == 0, "%s: dst kind %zu: data differ",
                       name, k);
                CHECKF(gbuf_intact(&dst, cap), "%s: dst kind %zu: bytes outside capacity %llu "
                       "were written", name, k, (unsigned long long)cap);
                gbuf_free(&dst);
            }
        }
    }
    /* all of them again in one call, each destination ending at its guard page */
    ckptio_region reg[NC * NSRC];
    gbuf dst[NC * NSRC];
    char names[NC * NSRC][64];
    for (size_t c = 0; c < NC; c++)
        for (size_t s = 0; s < NSRC; s++) {
            size_t i = c * NSRC + s;
            uint64_t nb = src[c][s].len;
            snprintf(names[i], sizeof names[i], "%s.%s", cases[c].name, src_tag[s]);
            CHECK(gbuf_make(&dst[i], nb, LEAD_END) == 0);
            reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .name = names[i],
                                     .dst = dst[i].p, .capacity = nb};
        }
    CHECK_OK(ckptio_reader_read(r, reg, NC * NSRC));
    for (size_t c = 0; c < NC; c++)
        for (size_t s = 0; s < NSRC; s++) {
            size_t i = c * NSRC + s;
            CHECKF(memcmp(dst[i].p, src[c][s].p, src[c][s].len) == 0 &&
                       gbuf_intact(&dst[i], src[c][s].len),
                   "batched read of %s", names[i]);
            gbuf_free(&dst[i]);
            gbuf_free(&src[c][s]);
        }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    return 0;
}

/* 48 MiB tensors from an aligned and a misaligned (ptr + 1) read-only source, loaded into
 * aligned, misaligned and guard-bounded destinations, whole and as a region. */
static int test_big(void)
{
    T_SEED(0xB16);
    const uint64_t na = 48 * MiB, nm = 48 * MiB + 781; /* a multiple of 7 */
    const uint64_t shape_a[1] = {na / 4}, shape_m[2] = {nm / 7, 7};
    gbuf a, m;
    CHECK(gbuf_make(&a, na, 0) == 0 && gbuf_make(&m, nm, 1) == 0);
    t_fill(a.p, na, seed);
    t_fill(m.p, nm, seed + 1);
    CHECK(gbuf_readonly(&a) == 0 && gbuf_readonly(&m) == 0);
    CHECK(nm % 7 == 0);
    ckptio_writer *w = NULL;
    double t0 = mono();
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "big.aligned", CKPTIO_DT_F32, 1, shape_a, NULL, NULL, a.p, na));
    CHECK_OK(ckptio_writer_add(w, "big.plus1", CKPTIO_DT_U8, 2, shape_m, NULL, NULL, m.p, nm));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_stats st;
    CHECK_OK(ckptio_writer_stats(w, &st));
    ckptio_writer_close(w);
    printf("saved 96 MiB in %.3f s (%s, direct %d)\n", mono() - t0, st.backend, st.direct);
    CHECKF(st.bytes == na + nm, "writer stats.bytes %llu", (unsigned long long)st.bytes);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    const char *names[2] = {"big.aligned", "big.plus1"};
    const gbuf *srcs[2] = {&a, &m};
    static const size_t lead[3] = {0, 1, LEAD_END};
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 3; k++) {
            uint64_t n = srcs[t]->len, cap = k == 0 ? round_up(n, PAGE) : n;
            gbuf d;
            CHECK(gbuf_make(&d, cap, lead[k]) == 0);
            t0 = mono();
            CHECK_OK(ckptio_reader_read_tensor(r, names[t], d.p, cap));
            printf("loaded %s into dst kind %d in %.3f s\n", names[t], k, mono() - t0);
            CHECKF(memcmp(d.p, srcs[t]->p, n) == 0, "%s dst kind %d: data differ", names[t], k);
            CHECKF(gbuf_intact(&d, cap), "%s dst kind %d: wrote outside capacity", names[t], k);
            gbuf_free(&d);
        }
    /* a region from the middle of each: rows [1000001, +2000000) of the 2-d one */
    {
        uint64_t off[2] = {1000001, 2}, shp[2] = {2000000, 5};
        uint64_t n = shp[0] * shp[1];
        unsigned char *exp = malloc(n);
        gbuf d;
        CHECK(exp && gbuf_make(&d, n, 3) == 0);
        extract(exp, m.p, shape_m, off, shp, 2, 1);
        ckptio_region rg = {.size = sizeof(ckptio_region), .name = "big.plus1", .offset = off,
                            .shape = shp, .dst = d.p,
                            .capacity = n};
        CHECK_OK(ckptio_reader_read(r, &rg, 1));
        CHECK(memcmp(d.p, exp, n) == 0 && gbuf_intact(&d, n));
        gbuf_free(&d);
        free(exp);
    }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    gbuf_free(&a);
    gbuf_free(&m);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Listing in bytewise name order, find, tensor_info and chunk_info of one- and multi-chunk
 * tensors, reader_path; chunk extents are aligned, inside their files and disjoint. */
static int test_listing(void)
{
    T_SEED(0x1157);
    static const char *const names[] = {"zeta",  "alpha",      "Beta",    "alpha.1",
                                        "alpha/0", "\xc3\xa9t\xc3\xa9", "a",  "_x",
                                        "B",     "layer.10.w", "layer.2.w", "Z9"};
    enum { NT = sizeof names / sizeof names[0] };
    uint64_t sizes[NT];
    unsigned char *data[NT];
    ckptio_writer *w = NULL;
    const char *path = t_path("ck");
    CHECK_OK(ckptio_writer_open(&w, path, NULL));
    for (int i = 0; i < NT; i++) {
        sizes[i] = (uint64_t)(i * 3001 + (i % 3 ? 7 : 4096 * 3));
        data[i] = malloc(sizes[i]);
        CHECK(data[i]);
        t_fill(data[i], sizes[i], seed + (uint64_t)i);
        uint64_t shape[1] = {sizes[i]};
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_U8, 1, shape, NULL, NULL, data[i],
                                   sizes[i]));
    }
    /* a tensor of three chunks (rows 0-9, 10-10, 11-29 of a 30x100 i32) */
    static const uint64_t gshape[2] = {30, 100};
    int32_t *grid = malloc(30 * 100 * 4);
    CHECK(grid);
    t_fill(grid, 30 * 100 * 4, seed + 99);
    static const uint64_t rows[4] = {0, 10, 11, 30};
    for (int c = 2; c >= 0; c--) {
        uint64_t off[2] = {rows[c], 0}, shp[2] = {rows[c + 1] - rows[c], 100};
        CHECK_OK(ckptio_writer_add(w, "grid", CKPTIO_DT_I32, 2, gshape, off, shp,
                                   grid + rows[c] * 100, shp[0] * 100 * 4));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    const char *sorted[NT + 1];
    for (int i = 0; i < NT; i++) sorted[i] = names[i];
    sorted[NT] = "grid";
    qsort(sorted, NT + 1, sizeof sorted[0], cmp_str);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    CHECKF(!strcmp(ckptio_reader_path(r), path), "reader_path '%s'", ckptio_reader_path(r));
    CHECK(ckptio_reader_num_tensors(r) == NT + 1);
    struct ext {
        char file[256];
        uint64_t off, len;
    } exts[NT + 8];
    int nexts = 0;
    for (size_t i = 0; i <= NT; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        CHECKF(!strcmp(ti.name, sorted[i]), "tensor %zu is '%s', expected '%s'", i, ti.name,
               sorted[i]);
        CHECKF(ckptio_reader_find(r, sorted[i]) == (int64_t)i, "find(%s)", sorted[i]);
        int is_grid = !strcmp(ti.name, "grid");
        int k = 0;
        while (!is_grid && strcmp(names[k], ti.name)) k++;
        uint64_t nb = is_grid ? 30 * 100 * 4 : sizes[k];
        CHECK(ti.dtype == (is_grid ? CKPTIO_DT_I32 : CKPTIO_DT_U8));
        CHECK(ti.ndim == (is_grid ? 2u : 1u));
        CHECK(is_grid ? ti.shape[0] == 30 && ti.shape[1] == 100 : ti.shape[0] == nb);
        CHECKF(ti.nbytes == nb, "%s nbytes %llu", ti.name, (unsigned long long)ti.nbytes);
        CHECKF(ti.num_chunks == (is_grid ? 3u : 1u), "%s num_chunks %llu", ti.name,
               (unsigned long long)ti.num_chunks);
        CHECKF(ti.stored_bytes == nb, "%s stored_bytes %llu", ti.name,
               (unsigned long long)ti.stored_bytes);
        uint64_t stored = 0, seen_rows = 0;
        for (size_t c = 0; c < ti.num_chunks; c++) {
            ckptio_chunk_info ci;
            CHECK_OK(ckptio_reader_chunk(r, i, c, &ci));
            CHECK(ci.file && ci.file[0] && ci.file[0] != '/' && !strstr(ci.file, ".."));
            CHECKF(ci.stored_bytes == ci.nbytes, "%s chunk %zu: stored %llu, nbytes %llu",
                   ti.name, c, (unsigned long long)ci.stored_bytes,
                   (unsigned long long)ci.nbytes);
            if (is_grid) {
                CHECK(ci.offset[1] == 0 && ci.shape[1] == 100);
                int match = 0;
                for (int q = 0; q < 3; q++)
                    match |= ci.offset[0] == rows[q] && ci.shape[0] == rows[q + 1] - rows[q];
                CHECKF(match, "grid chunk %zu: offset %llu rows %llu", c,
                       (unsigned long long)ci.offset[0], (unsigned long long)ci.shape[0]);
                CHECK(ci.nbytes == ci.shape[0] * 400);
                seen_rows += ci.shape[0];
            } else {
                CHECK(ci.offset[0] == 0 && ci.shape[0] == nb && ci.nbytes == nb);
            }
            uint64_t align = ci.stored_bytes >= 4096 ? 4096 : 64;
            CHECKF(ci.file_offset % align == 0, "%s chunk %zu at %llu (%llu bytes)", ti.name, c,
                   (unsigned long long)ci.file_offset, (unsigned long long)ci.stored_bytes);
            char fp[600];
            snprintf(fp, sizeof fp, "ck/%s", ci.file);
            long long fs = file_size(t_path(fp));
            CHECKF(fs >= 0 && (uint64_t)fs >= ci.file_offset + ci.stored_bytes,
                   "%s chunk %zu: file %s of %lld bytes, extent ends at %llu", ti.name, c,
                   ci.file, fs, (unsigned long long)(ci.file_offset + ci.stored_bytes));
            CHECK(nexts < NT + 8);
            snprintf(exts[nexts].file, sizeof exts[nexts].file, "%s", ci.file);
            exts[nexts].off = ci.file_offset;
            exts[nexts++].len = ci.stored_bytes;
            stored += ci.stored_bytes;
        }
        CHECK(stored == ti.stored_bytes);
        if (is_grid) CHECK(seen_rows == 30);
        if (load_cmp(r, ti.name, is_grid ? (void *)grid : (void *)data[k], nb)) return 1;
    }
    for (int i = 0; i < nexts; i++)
        for (int j = i + 1; j < nexts; j++)
            if (!strcmp(exts[i].file, exts[j].file) && exts[i].len && exts[j].len)
                CHECKF(exts[i].off + exts[i].len <= exts[j].off ||
                           exts[j].off + exts[j].len <= exts[i].off,
                       "extents [%llu,+%llu) and [%llu,+%llu) of %s overlap",
                       (unsigned long long)exts[i].off, (unsigned long long)exts[i].len,
                       (unsigned long long)exts[j].off, (unsigned long long)exts[j].len,
                       exts[i].file);
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    CHECK_NEG(ckptio_reader_tensor(r, NT + 1, &ti));
    CHECK_NEG(ckptio_reader_chunk(r, 0, 1, &ci));
    CHECK_NEG(ckptio_reader_chunk(r, NT + 1, 0, &ci));
    CHECK(ckptio_reader_find(r, "nope") == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_find(r, "alph") == CKPTIO_E_NOT_FOUND);
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    for (int i = 0; i < NT; i++) free(data[i]);
    free(grid);
    return 0;
}

/* Metadata: binary values with NULs, an empty value, replaced keys (longer and shorter),
 * a 1 MiB value, a UTF-8 key, bytewise key order, values copied at set_meta, NOT_FOUND. */
static int test_metadata(void)
{
    T_SEED(0x3E7A);
    unsigned char *bigv = malloc(MiB), *bigc = malloc(MiB);
    CHECK(bigv && bigc);
    t_fill(bigv, MiB, seed);
    memcpy(bigc, bigv, MiB);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t step = 1000;
    CHECK_OK(ckptio_writer_set_meta(w, "step", &step, sizeof step));
    step = 2000;
    CHECK_OK(ckptio_writer_set_meta(w, "step", &step, sizeof step));
    step = 3; /* the library copied the value: this change must not show */
    CHECK_OK(ckptio_writer_set_meta(w, "name", "short", 5));
    CHECK_OK(ckptio_writer_set_meta(w, "name", "a much longer value than before", 31));
    CHECK_OK(ckptio_writer_set_meta(w, "long", "a much longer value than the next", 33));
    CHECK_OK(ckptio_writer_set_meta(w, "long", "x", 1));
    static const unsigned char bin[7] = {0, 1, 0, 255, 0, 0x80, 0};
    CHECK_OK(ckptio_writer_set_meta(w, "bin", bin, sizeof bin));
    CHECK_OK(ckptio_writer_set_meta(w, "empty", "", 0));
    CHECK_OK(ckptio_writer_set_meta(w, "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf", "k",
                                    1));
    CHECK_OK(ckptio_writer_set_meta(w, "big", bigv, MiB));
    memset(bigv, 0, MiB);
    CHECK_OK(ckptio_writer_set_meta(w, "z", "last", 4));
    CHECK_OK(ckptio_writer_set_meta(w, "A", "first", 5));
    uint64_t shape[1] = {3};
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, shape, NULL, NULL, "abc", 3));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    static const char *const keys[] = {"A",   "big",  "bin", "empty",
                                       "long", "name", "step", "z",
                                       "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf"};
    enum { NK = sizeof keys / sizeof keys[0] };
    CHECKF(ckptio_reader_num_meta(r) == NK, "num_meta %zu", ckptio_reader_num_meta(r));
    for (size_t i = 0; i < NK; i++) {
        const char *k = NULL;
        const void *v = NULL;
        size_t len = 0;
        CHECK_OK(ckptio_reader_meta(r, i, &k, &v, &len));
        CHECKF(k && !strcmp(k, keys[i]), "meta %zu key '%s', expected '%s'", i, k ? k : "(null)",
               keys[i]);
    }
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "step", &v, &len));
    uint64_t got;
    CHECK(len == 8);
    memcpy(&got, v, 8);
    CHECKF(got == 2000, "step %llu", (unsigned long long)got);
    CHECK_OK(ckptio_reader_get_meta(r, "name", &v, &len));
    CHECK(len == 31 && !memcmp(v, "a much longer value than before", 31));
    CHECK_OK(ckptio_reader_get_meta(r, "long", &v, &len));
    CHECK(len == 1 && !memcmp(v, "x", 1));
    CHECK_OK(ckptio_reader_get_meta(r, "bin", &v, &len));
    CHECK(len == sizeof bin && !memcmp(v, bin, sizeof bin));
    CHECK_OK(ckptio_reader_get_meta(r, "empty", &v, &len));
    CHECK(len == 0);
    CHECK_OK(ckptio_reader_get_meta(r, "big", &v, &len));
    CHECK(len == MiB && !memcmp(v, bigc, MiB));
    CHECK_OK(ckptio_reader_get_meta(r, "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf", &v,
                                    &len));
    CHECK(len == 1 && !memcmp(v, "k", 1));
    CHECK(ckptio_reader_get_meta(r, "nokey", &v, &len) == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_get_meta(r, "ste", &v, &len) == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_get_meta(r, "t", &v, &len) == CKPTIO_E_NOT_FOUND); /* a tensor, not meta */
    const char *k;
    CHECK_NEG(ckptio_reader_meta(r, NK, &k, &v, &len));
    if (load_cmp(r, "t", "abc", 3)) return 1;
    ckptio_reader_close(r);
    free(bigv);
    free(bigc);
    return 0;
}

/* A checkpoint with metadata but no tensors, and one with nothing at all: the contract does
 * not require tensors. */
static int test_empty_checkpoint(void)
{
    T_SEED(0);
    (void)seed;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("meta_only"), NULL));
    CHECK_OK(ckptio_writer_set_meta(w, "step", "7", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_writer_open(&w, t_path("nothing"), NULL));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("meta_only"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 0 && ckptio_reader_num_meta(r) == 1);
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    CHECK_OK(ckptio_reader_open(&r, t_path("nothing"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 0 && ckptio_reader_num_meta(r) == 0);
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    return 0;
}

/* Writer and reader stats: bytes, tensors/regions, backend forced by CKPTIO_IO, O_DIRECT. */
static int test_stats(void)
{
    T_SEED(0x57A7);
    const uint64_t n0 = MiB, n1 = 100 * KiB + 3, n2 = 10;
    unsigned char *a = t_alloc(n0), *b = malloc(n1 + 1), *c = malloc(n2);
    CHECK(a && b && c);
    t_fill(a, n0, seed);
    t_fill(b + 1, n1, seed + 1);
    t_fill(c, n2, seed + 2);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t s0[1] = {n0 / 8}, s1[1] = {n1}, s2[1] = {n2};
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_F64, 1, s0, NULL, NULL, a, n0));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, s1, NULL, NULL, b + 1, n1));
    CHECK_OK(ckptio_writer_add(w, "c", CKPTIO_DT_BYTES, 1, s2, NULL, NULL, c, n2));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_stats st;
    memset(&st, 0x5A, sizeof st);
    CHECK_OK(ckptio_writer_stats(w, &st));
    ckptio_writer_close(w);
    int want = expected_direct(t_dir());
    if (check_stats(&st, want, "writer")) return 1;
    CHECKF(st.bytes == n0 + n1 + n2, "writer bytes %llu", (unsigned long long)st.bytes);
    CHECKF(st.tensors == 3, "writer tensors %llu", (unsigned long long)st.tensors);
    CHECK(st.seconds > 0);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    unsigned char *da = t_alloc(n0), *db = malloc(1000);
    CHECK(da && db);
    uint64_t off[1] = {5000}, shp[1] = {1000};
    ckptio_region reg[2] = {{.size = sizeof(ckptio_region), .name = "a", .dst = da, .capacity = n0},
                            {.size = sizeof(ckptio_region), .name = "b", .offset = off,
                             .shape = shp, .dst = db,
                             .capacity = 1000}};
    CHECK_OK(ckptio_reader_read(r, reg, 2));
    CHECK(!memcmp(da, a, n0) && !memcmp(db, b + 1 + 5000, 1000));
    memset(&st, 0x5A, sizeof st);
    CHECK_OK(ckptio_reader_stats(r, &st));
    if (check_stats(&st, want, "reader")) return 1;
    CHECKF(st.bytes == n0 + 1000, "reader bytes %llu after 2 regions",
           (unsigned long long)st.bytes);
    CHECKF(st.tensors == 2, "reader tensors %llu after 2 regions", (unsigned long long)st.tensors);
    unsigned char dc[16];
    CHECK_OK(ckptio_reader_read_tensor(r, "c", dc, sizeof dc));
    CHECK(!memcmp(dc, c, n2));
    CHECK_OK(ckptio_reader_stats(r, &st));
    CHECKF(st.bytes == n0 + 1000 + n2 && st.tensors == 3, "reader bytes %llu tensors %llu",
           (unsigned long long)st.bytes, (unsigned long long)st.tensors);
    ckptio_reader_close(r);
    t_free(a, n0);
    t_free(da, n0);
    free(b);
    free(c);
    free(db);
    return 0;
}

/* 100,000 tensors of 1-16 elements of mixed dtypes and ranks, loaded in one read call of
 * 100,000 regions given in shuffled order (by name and by index). Prints the times. */
static int test_many_tiny(void)
{
    T_SEED(0x71A7);
    enum { N = 100000 };
    rng g = {seed};
    char(*names)[24] = malloc((size_t)N * 24);
    uint64_t *off = malloc(N * sizeof *off), *nb = malloc(N * sizeof *nb);
    int *dt = malloc(N * sizeof *dt);
    size_t *perm = malloc(N * sizeof *perm);
    ckptio_region *reg = malloc(N * sizeof *reg);
    CHECK(names && off && nb && dt && perm && reg);
    uint64_t total = 0;
    for (size_t i = 0; i < N; i++) {
        /* names not in index order, so listing and lookup cannot rely on insertion order */
        snprintf(names[i], 24, "p%02u/t%06zu", (unsigned)((i * 37) % 97), i);
        dt[i] = CKPTIO_DT_BOOL + (int)(i % CKPTIO_DT_BYTES);
        uint64_t elems = 1 + rnd_below(&g, 16);
        nb[i] = elems * ckptio_dtype_size(dt[i]);
        off[i] = total;
        total += nb[i];
    }
    unsigned char *src = malloc(total), *dst = malloc(total);
    CHECK(src && dst);
    t_fill(src, total, seed);
    for (size_t i = 0; i < N; i++)
        if (dt[i] == CKPTIO_DT_BOOL)
            for (uint64_t k = 0; k < nb[i]; k++) src[off[i] + k] &= 1;
    memset(dst, 0xEE, total);

    double t0 = mono();
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < N; i++) {
        uint64_t elems = nb[i] / ckptio_dtype_size(dt[i]);
        uint64_t shape[2] = {0, 0};
        uint32_t ndim;
        if (elems == 1 && i % 2) ndim = 0;
        else if (i % 3 == 0) ndim = 2, shape[0] = 1, shape[1] = elems;
        else ndim = 1, shape[0] = elems;
        CHECK_OK(ckptio_writer_add(w, names[i], dt[i], ndim, shape, NULL, NULL, src + off[i],
                                   nb[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    double t_save = mono() - t0;

    t0 = mono();
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    double t_open = mono() - t0;
    CHECK(ckptio_reader_num_tensors(r) == N);
    for (size_t i = 0; i < N; i++) perm[i] = i;
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = (size_t)rnd_below(&g, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t k = 0; k < N; k++) {
        size_t i = perm[k];
        reg[k] = (ckptio_region){.size = sizeof(ckptio_region), .name = names[i],
                                 .dst = dst + off[i], .capacity = nb[i]};
        if (k % 2) {
            int64_t idx = ckptio_reader_find(r, names[i]);
            CHECKF(idx >= 0, "find(%s)", names[i]);
            reg[k].name = NULL;
            reg[k].tensor = (size_t)idx;
        }
    }
    t0 = mono();
    CHECK_OK(ckptio_reader_read(r, reg, N));
    double t_read = mono() - t0;
    for (size_t i = 0; i < N; i++)
        CHECKF(!memcmp(dst + off[i], src + off[i], nb[i]), "tensor %s differs", names[i]);
    ckptio_stats st;
    CHECK_OK(ckptio_reader_stats(r, &st));
    CHECKF(st.tensors == N && st.bytes == total, "reader stats: %llu regions, %llu bytes",
           (unsigned long long)st.tensors, (unsigned long long)st.bytes);
    ckptio_reader_close(r);
    printf("100000 tiny tensors (%llu bytes): save %.3f s, open %.3f s, one read call %.3f s\n",
           (unsigned long long)total, t_save, t_open, t_read);
    free(names), free(off), free(nb), free(dt), free(perm), free(reg), free(src), free(dst);
    return 0;
}

/* Names are opaque UTF-8 bytes: Greek, CJK, emoji (with ZWJ), combining marks (e + U+0301 is
 * not U+00E9), '/', '.', '..', spaces, and a name of exactly CKPTIO_MAX_NAME bytes. None of
 * them may create anything outside the checkpoint directory. */
static int test_unicode_names(void)
{
    T_SEED(0x0717);
    static char maxname[CKPTIO_MAX_NAME + 1];
    memset(maxname, 'n', CKPTIO_MAX_NAME);
    maxname[0] = 'M';
    const char *names[] = {
        "\xce\xb1.\xce\xb2.\xce\xb3/weight",                         /* α.β.γ/weight */
        /* 权重/层1/偏置 */
        "\xe6\x9d\x83\xe9\x87\x8d/\xe5\xb1\x82" "1/\xe5\x81\x8f\xe7\xbd\xae",
        "\xf0\x9f\x98\x80\xf0\x9f\x9a\x80 emoji",                    /* 😀🚀 emoji */
        "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", /* ZWJ family */
        "e\xcc\x81",                                                 /* e + combining acute */
        "\xc3\xa9",                                                  /* precomposed é */
        "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82\xe0\xa4\xa6\xe0\xa5\x80", /* हिंदी */
        "a/b/c/d",
        "./relative",
        "../not/a/path",
        "/absolute/looking",
        "dots...",
        "..",
        "spaces in a name ",
        " leading space",
        "tab\tand newline\n",
        maxname,
    };
    enum { NN = sizeof names / sizeof names[0] };
    unsigned char data[NN][40];
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < NN; i++) {
        uint64_t shape[1] = {10};
        t_fill(data[i], 40, seed + i);
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_F32, 1, shape, NULL, NULL, data[i], 40));
    }
    CHECK_OK(ckptio_writer_set_meta(w, "\xe6\xad\xa5/step \xf0\x9f\x98\x80", "1", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECKF(count_entries(t_dir(), "") == 1, "something besides the checkpoint was created");

    const char *sorted[NN];
    memcpy(sorted, names, sizeof sorted);
    qsort(sorted, NN, sizeof sorted[0], cmp_str);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NN);
    for (size_t i = 0; i < NN; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        CHECKF(!strcmp(ti.name, sorted[i]), "tensor %zu is '%.40s', expected '%.40s'", i,
               ti.name, sorted[i]);
    }
    for (size_t i = 0; i < NN; i++) {
        CHECKF(ckptio_reader_find(r, names[i]) >= 0, "find('%.40s')", names[i]);
        if (load_cmp(r, names[i], data[i], 40)) return 1;
    }
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "\xe6\xad\xa5/step \xf0\x9f\x98\x80", &v, &len));
    CHECK(len == 1 && *(const char *)v == '1');
    ckptio_reader_close(r);
    return 0;
}

/* A data file with extents past 4 GiB: a 4 GiB + 8 KiB tensor from an mmap'ed region
 * (mostly zero pages, random patterns every 256 MiB and around the 4 GiB mark), then a random
 * tensor. Reads the second whole and regions of the first past (and across) 4 GiB. */
static int test_4gib(void)
{
    T_SEED(0x4619);
#if defined(__SANITIZE_THREAD__)
    /* TSan shadows every byte touched several times over: 4 GiB of tensor does not fit the
     * machine, and this test is about offsets, not threads (ASan runs it). */
    printf("skipped under TSan\n");
    return T_SKIP;
#endif
    struct statvfs sv;
    CHECK(statvfs(t_dir(), &sv) == 0);
    double free_b = (double)sv.f_bavail * (double)sv.f_frsize;
    if (free_b < 12e9) {
        printf("only %.1f GB free in %s: skipped\n", free_b / 1e9, t_dir());
        return T_SKIP;
    }
    const uint64_t cols = 4096, rows = (1ull << 20) + 2, total = rows * cols; /* 4 GiB + 8 KiB */
    unsigned char *big = mmap(NULL, total, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(big != MAP_FAILED);
    for (uint64_t k = 0; k <= 16; k++) t_fill(big + k * 256 * MiB, 4096, seed + k);
    t_fill(big + 4 * GiB - 4096, total - (4 * GiB - 4096), seed + 99);
    CHECK(mprotect(big, total, PROT_READ) == 0);
    const uint64_t n2 = 3 * MiB + 5;
    unsigned char *after = malloc(n2);
    CHECK(after);
    t_fill(after, n2, seed + 1000);

    double t0 = mono();
    ckptio_writer *w = NULL;
    uint64_t shape[2] = {rows, cols}, s2[1] = {n2};
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "huge", CKPTIO_DT_U8, 2, shape, NULL, NULL, big, total));
    CHECK_OK(ckptio_writer_add(w, "after", CKPTIO_DT_BYTES, 1, s2, NULL, NULL, after, n2));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    printf("saved 4 GiB + 8 KiB + 3 MiB in %.2f s\n", mono() - t0);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    int64_t ih = ckptio_reader_find(r, "huge"), ia = ckptio_reader_find(r, "after");
    CHECK(ih >= 0 && ia >= 0);
    CHECK_OK(ckptio_reader_tensor(r, (size_t)ih, &ti));
    CHECKF(ti.nbytes == total, "huge nbytes %llu", (unsigned long long)ti.nbytes);
    CHECK_OK(ckptio_reader_chunk(r, (size_t)ia, 0, &ci));
    printf("'after' stored in %s at offset %llu%s\n", ci.file, (unsigned long long)ci.file_offset,
           ci.file_offset >= 4 * GiB ? " (past 4 GiB)" : "");
    if (load_cmp(r, "after", after, n2)) return 1;

    /* regions of "huge", all in one call */
    enum { NR = 17 + 4 };
    uint64_t offs[NR][2], shps[NR][2];
    for (int k = 0; k <= 16; k++) {
        offs[k][0] = (uint64_t)k * 65536, offs[k][1] = 0; /* row k * 256 MiB / 4096 */
        shps[k][0] = 1, shps[k][1] = cols;
    }
    uint64_t extra[4][4] = {
        {rows - 2, 0, 2, cols},         /* the last 8 KiB, wholly past 4 GiB */
        {rows - 3, 100, 2, 100},        /* a column slice crossing the 4 GiB mark */
        {rows - 1, cols - 1, 1, 1},     /* the last byte */
        {1000, 0, 3, cols},             /* zero pages */
    };
    for (int k = 0; k < 4; k++) {
        offs[17 + k][0] = extra[k][0], offs[17 + k][1] = extra[k][1];
        shps[17 + k][0] = extra[k][2], shps[17 + k][1] = extra[k][3];
    }
    ckptio_region reg[NR];
    unsigned char *dst[NR], *exp = malloc(3 * cols);
    CHECK(exp);
    for (int k = 0; k < NR; k++) {
        uint64_t n = shps[k][0] * shps[k][1];
        dst[k] = malloc(n + 1);
        CHECK(dst[k]);
        reg[k] = (ckptio_region){.size = sizeof(ckptio_region), .name = "huge", .offset = offs[k],
                                 .shape = shps[k],
                                 .dst = dst[k] + (k & 1), .capacity = n};
    }
    CHECK_OK(ckptio_reader_read(r, reg, NR));
    for (int k = 0; k < NR; k++) {
        uint64_t n = shps[k][0] * shps[k][1];
        extract(exp, big, shape, offs[k], shps[k], 2, 1);
        CHECKF(!memcmp(dst[k] + (k & 1), exp, n), "region %d (row %llu col %llu) differs", k,
               (unsigned long long)offs[k][0], (unsigned long long)offs[k][1]);
        free(dst[k]);
    }
    t0 = mono();
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    printf("verified in %.2f s\n", mono() - t0);
    ckptio_reader_close(r);
    munmap(big, total);
    free(after);
    free(exp);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Regions over chunked tensors                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct rtensor {
    const char *name;
    int dtype;
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t seg[4][8]; /* chunk lengths along each dim (0-terminated); all zero: random */
} rtensor;

static const rtensor rtensors[] = {
    {"r1.f32", CKPTIO_DT_F32, 1, {1000}, {{7, 1, 12, 180, 800}}},
    {"r1.i64", CKPTIO_DT_I64, 1, {3000}, {{1000, 1000, 1000}}},
    {"r2.bf16", CKPTIO_DT_BF16, 2, {37, 53}, {{0}}},
    {"r3.f32", CKPTIO_DT_F32, 2, {512, 1024}, {{100, 312, 100}, {1, 511, 256, 256}}},
    {"r4.f64", CKPTIO_DT_F64, 3, {9, 10, 11}, {{0}}},
    {"r5.u8", CKPTIO_DT_U8, 4, {5, 6, 7, 8}, {{5}, {3, 3}, {7}, {2, 2, 2, 2}}},
    {"r6.c64", CKPTIO_DT_C64, 4, {4, 5, 6, 7}, {{0}}},
    {"r7.u16", CKPTIO_DT_U16, 2, {40, 6}, {{7, 1, 12, 20}, {6}}},
    {"r8.c128", CKPTIO_DT_C128, 3, {3, 4, 1000}, {{0}}},
    {"r9.bool", CKPTIO_DT_BOOL, 2, {100, 100}, {{0}}},
    {"r10.i16", CKPTIO_DT_I16, 3, {64, 33, 17}, {{16, 16, 16, 16}, {11, 11, 11}, {17}}},
    /* chunks of more than one checksum block, read in strided runs */
    {"r11.f32", CKPTIO_DT_F32, 2, {512, 2048}, {{300, 212}, {1000, 1048}}},
};
enum { NRT = sizeof rtensors / sizeof rtensors[0] };

typedef struct rchunk {
    int t;
    uint64_t off[4], shp[4];
    unsigned char *data;
    uint64_t nb;
} rchunk;

/* Segment lengths of one dim of length D: the table's, or 1-4 random ones. Returns count. */
static unsigned split_dim(rng *g, const rtensor *t, uint32_t d, uint64_t *seg)
{
    unsigned n = 0;
    if (t->seg[0][0]) {
        while (n < 8 && t->seg[d][n]) seg[n] = t->seg[d][n], n++;
        return n;
    }
    uint64_t D = t->shape[d];
    unsigned parts = 1 + (unsigned)rnd_below(g, D < 4 ? D : 4);
    unsigned char cut[1025] = {0};
    for (unsigned c = 1; c < parts;) {
        uint64_t at = 1 + rnd_below(g, D - 1);
        if (!cut[at]) cut[at] = 1, c++;
    }
    uint64_t start = 0;
    for (uint64_t i = 1; i <= D; i++)
        if (i == D || cut[i]) seg[n++] = i - start, start = i;
    return n;
}

enum { BOX_RANDOM, BOX_ELEMENT, BOX_FULL, BOX_EMPTY, BOX_COLUMN, BOX_WIDE, BOX_KINDS };

static void rand_box(rng *g, const rtensor *t, int kind, uint64_t *off, uint64_t *shp)
{
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t D = t->shape[d];
        switch (kind) {
        case BOX_ELEMENT:
            off[d] = rnd_below(g, D), shp[d] = 1;
            break;
        case BOX_FULL:
            off[d] = 0, shp[d] = D;
            break;
        case BOX_COLUMN: /* all of every dim but the last, one index of the last */
            if (d + 1 < t->ndim) off[d] = 0, shp[d] = D;
            else off[d] = rnd_below(g, D), shp[d] = 1;
            break;
        case BOX_WIDE: { /* most of every dim: crosses many chunks */
            off[d] = rnd_below(g, D / 4 + 1);
            uint64_t rem = D - off[d];
            shp[d] = rem - rnd_below(g, rem / 4 + 1);
            if (!shp[d]) shp[d] = 1;
            break;
        }
        default:
            off[d] = rnd_below(g, D);
            shp[d] = 1 + rnd_below(g, D - off[d]);
        }
    }
    if (kind == BOX_EMPTY) shp[rnd_below(g, t->ndim)] = 0;
}

/* N-d tensors of several dtypes stored as chunks (regular grids, uneven splits like
 * 7+1+12+..., random splits), added in shuffled order across tensors; then hundreds of random
 * boxes (full, single element, empty, column slices, boxes spanning many chunks) read one per
 * call and all in one batched call, compared against the reference in memory. */
static int test_regions(void)
{
    T_SEED(0x8E610);
    limit_memory(3 * GiB);
    rng g = {seed};
    unsigned char *ref[NRT];
    uint64_t nchunks[NRT] = {0};
    enum { MAXC = 4096 };
    rchunk *ch = calloc(MAXC, sizeof *ch);
    CHECK(ch);
    size_t nc = 0;
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        size_t esz = ckptio_dtype_size(rt->dtype);
        uint64_t nb = volume(rt->shape, rt->ndim) * esz;
        ref[t] = malloc(nb);
        CHECK(ref[t]);
        fill_dtype(ref[t], nb, rt->dtype, seed + (uint64_t)t);
        uint64_t seg[4][8];
        unsigned nseg[4], idx[4] = {0};
        for (uint32_t d = 0; d < rt->ndim; d++) nseg[d] = split_dim(&g, rt, d, seg[d]);
        for (;;) {
            CHECK(nc < MAXC);
            rchunk *c = &ch[nc++];
            c->t = t;
            for (uint32_t d = 0; d < rt->ndim; d++) {
                c->off[d] = 0;
                for (unsigned k = 0; k < idx[d]; k++) c->off[d] += seg[d][k];
                c->shp[d] = seg[d][idx[d]];
            }
            c->nb = volume(c->shp, rt->ndim) * esz;
            c->data = malloc(c->nb + 1);
            CHECK(c->data);
            extract(c->data, ref[t], rt->shape, c->off, c->shp, rt->ndim, esz);
            nchunks[t]++;
            int d = (int)rt->ndim - 1;
            for (; d >= 0; d--) {
                if (++idx[d] < nseg[d]) break;
                idx[d] = 0;
            }
            if (d < 0) break;
        }
    }
    size_t *order = malloc(nc * sizeof *order);
    CHECK(order);
    for (size_t i = 0; i < nc; i++) order[i] = i;
    for (size_t i = nc - 1; i > 0; i--) {
        size_t j = (size_t)rnd_below(&g, i + 1), x = order[i];
        order[i] = order[j], order[j] = x;
    }
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < nc; i++) {
        const rchunk *c = &ch[order[i]];
        const rtensor *rt = &rtensors[c->t];
        /* chunks at the origin sometimes pass offset NULL */
        int origin = 1;
        for (uint32_t d = 0; d < rt->ndim; d++) origin &= c->off[d] == 0;
        CHECK_OK(ckptio_writer_add(w, rt->name, rt->dtype, rt->ndim, rt->shape,
                                   origin && (i & 1) ? NULL : c->off, c->shp, c->data, c->nb));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    printf("%zu chunks over %d tensors\n", nc, NRT);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NRT);
    size_t tidx[NRT];
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        int64_t i = ckptio_reader_find(r, rt->name);
        CHECKF(i >= 0, "find(%s)", rt->name);
        tidx[t] = (size_t)i;
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, tidx[t], &ti));
        CHECKF(ti.num_chunks == nchunks[t], "%s: %llu chunks, %llu added", rt->name,
               (unsigned long long)ti.num_chunks, (unsigned long long)nchunks[t]);
        for (uint64_t k = 0; k < ti.num_chunks; k++) {
            ckptio_chunk_info ci;
            CHECK_OK(ckptio_reader_chunk(r, tidx[t], k, &ci));
            int found = 0;
            for (size_t j = 0; j < nc && !found; j++) {
                if (ch[j].t != t) continue;
                found = !memcmp(ch[j].off, ci.offset, rt->ndim * 8) &&
                        !memcmp(ch[j].shp, ci.shape, rt->ndim * 8) && ch[j].nb == ci.nbytes;
            }
            CHECKF(found, "%s: chunk %llu is not one that was added", rt->name,
                   (unsigned long long)k);
        }
    }

    /* one region per call */
    unsigned char *exp = malloc(4 * MiB + 64);
    CHECK(exp);
    int nreads = 0;
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        size_t esz = ckptio_dtype_size(rt->dtype);
        for (int i = 0; i < 38; i++) {
            uint64_t off[4] = {0}, shp[4] = {0};
            int kind = i < 36 ? i % BOX_KINDS : BOX_FULL;
            rand_box(&g, rt, kind, off, shp);
            uint64_t n = volume(shp, rt->ndim) * esz;
            extract(exp, ref[t], rt->shape, off, shp, rt->ndim, esz);
            ckptio_region rg = {.size = sizeof(ckptio_region), .name = rt->name, .offset = off,
                                .shape = shp};
            if (i == 36) rg.offset = NULL, rg.shape = NULL; /* whole tensor */
            if (i == 37) rg.offset = NULL;                  /* whole tensor, offset NULL */
            if (i % 5 == 4) rg.name = NULL, rg.tensor = tidx[t];
            int aligned = i % 2 == 0;
            uint64_t cap = aligned ? round_up(n + 1, PAGE) : n;
            unsigned char *buf = aligned ? t_alloc(cap) : malloc(n + 2);
            CHECK(buf);
            if (!aligned) buf[0] = buf[n + 1] = GUARD_BYTE;
            rg.dst = aligned ? buf : buf + 1;
            rg.capacity = cap;
            int rc = ckptio_reader_read(r, &rg, 1);
            CHECKF(rc >= 0, "%s box %d (kind %d): %s: %s", rt->name, i, kind, ckptio_errname(rc),
                   ckptio_reader_errmsg(r));
            CHECKF(!memcmp(rg.dst, exp, n), "%s box %d (kind %d): off [%llu %llu %llu %llu] "
                   "shape [%llu %llu %llu %llu]: data differ", rt->name, i, kind,
                   (unsigned long long)off[0], (unsigned long long)off[1],
                   (unsigned long long)off[2], (unsigned long long)off[3],
                   (unsigned long long)shp[0], (unsigned long long)shp[1],
                   (unsigned long long)shp[2], (unsigned long long)shp[3]);
            if (aligned) t_free(buf, cap);
            else {
                CHECKF(buf[0] == GUARD_BYTE && buf[n + 1] == GUARD_BYTE,
                       "%s box %d: wrote outside the destination", rt->name, i);
                free(buf);
            }
            nreads++;
        }
    }

    /* 300 random boxes in one call, destinations packed in one arena with gaps */
    enum { NB = 300 };
    ckptio_region *reg = calloc(NB, sizeof *reg);
    uint64_t(*boff)[4] = calloc(NB, sizeof *boff), (*bshp)[4] = calloc(NB, sizeof *bshp);
    int *bt = calloc(NB, sizeof *bt);
    uint64_t *bpos = calloc(NB, sizeof *bpos);
    CHECK(reg && boff && bshp && bt && bpos);
    uint64_t arena_len = 0;
    for (int i = 0; i < NB; i++) {
        bt[i] = (int)rnd_below(&g, NRT);
        const rtensor *rt = &rtensors[bt[i]];
        int kind = (int)rnd_below(&g, BOX_KINDS);
        rand_box(&g, rt, kind, boff[i], bshp[i]);
        uint64_t n = volume(bshp[i], rt->ndim) * ckptio_dtype_size(rt->dtype);
        bpos[i] = round_up(arena_len, PAGE) + (i % 3 == 1 ? (uint64_t)i % 61 : 0);
        arena_len = bpos[i] + n + 16;
        reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .offset = boff[i],
                                 .shape = bshp[i], .capacity = n};
        if (i % 2) reg[i].name = rt->name;
        else reg[i].tensor = tidx[bt[i]];
    }
    unsigned char *arena = t_alloc(arena_len);
    CHECK(arena);
    for (int i = 0; i < NB; i++) reg[i].dst = arena + bpos[i];
    /* the batch once with default params, once through a tiny staging pool (many requests
     * per run, runs cut across requests) */
    ckptio_params tiny;
    ckptio_params_init(&tiny);
    tiny.staging_bytes = 256 * KiB;
    tiny.request_bytes = 64 * KiB;
    tiny.queue_depth = 2;
    for (int pass = 0; pass < 2; pass++) {
        ckptio_reader *rr = r;
        if (pass == 1) CHECK_OK(ckptio_reader_open(&rr, t_path("ck"), &tiny));
        memset(arena, GUARD_BYTE, arena_len);
        double t0 = mono();
        CHECK_OK(ckptio_reader_read(rr, reg, NB));
        printf("%s: one call of %d regions (%llu bytes) in %.3f s\n",
               pass ? "tiny staging" : "defaults", NB, (unsigned long long)arena_len,
               mono() - t0);
        for (int i = 0; i < NB; i++) {
            const rtensor *rt = &rtensors[bt[i]];
            size_t esz = ckptio_dtype_size(rt->dtype);
            uint64_t n = reg[i].capacity;
            extract(exp, ref[bt[i]], rt->shape, boff[i], bshp[i], rt->ndim, esz);
            CHECKF(!memcmp(arena + bpos[i], exp, n), "pass %d: batched region %d of %s differs",
                   pass, i, rt->name);
            memset(arena + bpos[i], GUARD_BYTE, n);
        }
        for (uint64_t k = 0; k < arena_len; k++)
            CHECKF(arena[k] == GUARD_BYTE,
                   "pass %d: batched read wrote outside its regions at arena %llu", pass,
                   (unsigned long long)k);
        CHECK_OK(ckptio_reader_verify(rr, NULL));
        if (pass == 1) ckptio_reader_close(rr);
    }
    printf("%d single reads\n", nreads);
    ckptio_reader_close(r);
    t_free(arena, arena_len);
    for (size_t i = 0; i < nc; i++) free(ch[i].data);
    for (int t = 0; t < NRT; t++) free(ref[t]);
    free(ch), free(order), free(exp), free(reg), free(boff), free(bshp), free(bt), free(bpos);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Corruption                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Where the (single) chunk of tensor `name` lies: data file path (absolute) and offset. */
static int locate(ckptio_reader *r, const char *name, char *file, size_t flen, char *path,
                  size_t plen, uint64_t *off, uint64_t *len)
{
    int64_t i = ckptio_reader_find(r, name);
    if (i < 0) return (int)i;
    ckptio_chunk_info ci;
    int rc = ckptio_reader_chunk(r, (size_t)i, 0, &ci);
    if (rc < 0) return rc;
    snprintf(file, flen, "%s", ci.file);
    char rel[600];
    snprintf(rel, sizeof rel, "ck/%s", ci.file);
    snprintf(path, plen, "%s", t_path(rel));
    *off = ci.file_offset;
    *len = ci.stored_bytes;
    return 0;
}

/* One flipped byte inside a tensor's stored bytes: reading that tensor (or a region holding
 * the byte) fails with CKPTIO_E_CHECKSUM naming tensor and file, the other tensors still
 * read, verify reports exactly one bad chunk; with checksums off the reader returns the
 * damaged bytes; once the byte is restored all is well again. */
static int test_corrupt_flip(void)
{
    T_SEED(0xF11B);
    rng g = {seed};
    static const char *const names[3] = {"big", "other", "small"};
    const uint64_t nbs[3] = {5 * MiB + 123, 64 * KiB, 1000};
    unsigned char *data[3];
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (int i = 0; i < 3; i++) {
        data[i] = malloc(nbs[i]);
        CHECK(data[i]);
        t_fill(data[i], nbs[i], seed + (uint64_t)i);
        uint64_t shape[1] = {nbs[i]};
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_U8, 1, shape, NULL, NULL, data[i],
                                   nbs[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    struct {
        int t;
        uint64_t pos;
    } cases[] = {
        {0, 0},                         /* first byte */
        {0, nbs[0] - 1},                /* last byte (in the partial last block) */
        {0, nbs[0] / 2},                /* the middle of a multi-block tensor */
        {0, rnd_below(&g, nbs[0])},     /* anywhere */
        {2, rnd_below(&g, nbs[2])},     /* a small (64-aligned) chunk */
        {1, nbs[1] - 1},
    };
    ckptio_params nock;
    ckptio_params_init(&nock);
    nock.checksums = CKPTIO_OFF;
    unsigned char *buf = t_alloc(round_up(nbs[0], PAGE));
    CHECK(buf);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int t = cases[c].t;
        uint64_t pos = cases[c].pos, foff = 0, flen = 0;
        char file[512], path[1024];
        fprintf(stderr, "case %zu: byte %llu of '%s'\n", c, (unsigned long long)pos, names[t]);
        ckptio_reader *r = NULL;
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
        CHECK_OK(locate(r, names[t], file, sizeof file, path, sizeof path, &foff, &flen));
        CHECK(flen == nbs[t]);
        unsigned char before;
        CHECK(read_byte(path, foff + pos, &before) == 0 && before == data[t][pos]);
        CHECK(flip_byte(path, foff + pos, 0x10) == 0);

        int rc = ckptio_reader_read_tensor(r, names[t], buf, round_up(nbs[0], PAGE));
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ckptio_reader_errmsg(r));
        CHECKF(rc == CKPTIO_E_CHECKSUM, "read_tensor(%s) -> %s, expected CKPTIO_E_CHECKSUM: %s",
               names[t], ckptio_errname(rc), msg);
        CHECKF(t_contains(msg, names[t]) && t_contains(msg, file),
               "message does not name tensor '%s' and file '%s': %s", names[t], file, msg);
        /* the same as values: the tensor, the file and the damaged block's offset in it */
        static ckptio_error_info info, last;
        info.size = last.size = sizeof info;
        CHECK_OK(ckptio_reader_error_info(r, &info));
        CHECK_OK(ckptio_last_error_info(&last));
        uint64_t block_at = foff + pos / (1u << 20) * (1u << 20);
        CHECKF(info.code == CKPTIO_E_CHECKSUM && !strcmp(info.tensor, names[t]) &&
                   !strcmp(info.file, path) && info.offset == block_at &&
                   info.rank == CKPTIO_ERROR_NO_RANK,
               "error info: code %d tensor '%s' file '%s' offset %llu (expected %llu)",
               info.code, info.tensor, info.file, (unsigned long long)info.offset,
               (unsigned long long)block_at);
        CHECK(!memcmp(&info, &last, sizeof info));
        /* a one-element region holding the damaged byte */
        uint64_t roff[1] = {pos}, rshp[1] = {1};
        ckptio_region rg = {.size = sizeof(ckptio_region), .name = names[t], .offset = roff,
                            .shape = rshp, .dst = buf,
                            .capacity = 1};
        rc = ckptio_reader_read(r, &rg, 1);
        CHECKF(rc == CKPTIO_E_CHECKSUM, "region at the damaged byte -> %s: %s",
               ckptio_errname(rc), ckptio_reader_errmsg(r));
        for (int o = 0; o < 3; o++)
            if (o != t && load_cmp(r, names[o], data[o], nbs[o])) return 1;
        uint64_t bad = 0;
        rc = ckptio_reader_verify(r, &bad);
        snprintf(msg, sizeof msg, "%s", ckptio_reader_errmsg(r));
        CHECKF(rc == CKPTIO_E_CHECKSUM, "verify -> %s: %s", ckptio_errname(rc), msg);
        CHECKF(bad == 1, "verify: bad_chunks %llu", (unsigned long long)bad);
        CHECKF(t_contains(msg, file) && t_contains(msg, names[t]),
               "verify message does not name '%s' and '%s': %s", file, names[t], msg);
        ckptio_reader_close(r);

        /* with checksums off the damaged byte comes back as stored */
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &nock));
        CHECK_OK(ckptio_reader_read_tensor(r, names[t], buf, round_up(nbs[0], PAGE)));
        CHECK(buf[pos] == (data[t][pos] ^ 0x10));
        buf[pos] ^= 0x10;
        CHECK(!memcmp(buf, data[t], nbs[t]));
        ckptio_reader_close(r);

        CHECK(flip_byte(path, foff + pos, 0x10) == 0);
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
        CHECK_OK(ckptio_reader_verify(r, &bad));
        CHECK(bad == 0);
        if (load_cmp(r, names[t], data[t], nbs[t])) return 1;
        ckptio_reader_close(r);
    }
    /* two damaged blocks of one chunk count once; a second damaged chunk counts too */
    {
        char file[512], path[1024], f2[512], p2[1024];
        uint64_t foff = 0, flen = 0, soff = 0, slen = 0;
        ckptio_reader *r = NULL;
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
        CHECK_OK(locate(r, "big", file, sizeof file, path, sizeof path, &foff, &flen));
        CHECK_OK(locate(r, "small", f2, sizeof f2, p2, sizeof p2, &soff, &slen));
        CHECK(flip_byte(path, foff + 1, 0x01) == 0 && flip_byte(path, foff + flen - 2, 0x01) == 0);
        uint64_t bad = 0;
        CHECK_FAIL(ckptio_reader_verify(r, &bad), CKPTIO_E_CHECKSUM, "big");
        CHECKF(bad == 1, "two damaged blocks of one chunk: bad_chunks %llu",
               (unsigned long long)bad);
        CHECK(flip_byte(p2, soff + 3, 0x01) == 0);
        CHECK_FAIL(ckptio_reader_verify(r, &bad), CKPTIO_E_CHECKSUM, NULL);
        CHECKF(bad == 2, "two damaged chunks: bad_chunks %llu", (unsigned long long)bad);
        CHECK(flip_byte(path, foff + 1, 0x01) == 0 && flip_byte(path, foff + flen - 2, 0x01) == 0);
        CHECK(flip_byte(p2, soff + 3, 0x01) == 0);
        CHECK_OK(ckptio_reader_verify(r, &bad));
        CHECK(bad == 0);

        /* bytes of a data file that belong to no chunk (alignment padding) are not data:
         * damaging them breaks nothing */
        struct {
            uint64_t off, len;
        } ext[3];
        for (int i = 0; i < 3; i++) {
            CHECK_OK(locate(r, names[i], f2, sizeof f2, p2, sizeof p2, &ext[i].off, &ext[i].len));
            CHECK(!strcmp(f2, file));
        }
        long long fsize = file_size(path);
        uint64_t gap = UINT64_MAX, first = UINT64_MAX;
        for (int i = 0; i < 3; i++) first = ext[i].off < first ? ext[i].off : first;
        /* only between extents: a file header, if the format grows one, may be checked */
        for (uint64_t x = first; x < (uint64_t)fsize && gap == UINT64_MAX; x++) {
            int inside = 0;
            for (int i = 0; i < 3; i++) inside |= x >= ext[i].off && x < ext[i].off + ext[i].len;
            if (!inside) gap = x;
            else /* skip to the end of the extent holding x */
                for (int i = 0; i < 3; i++)
                    if (x >= ext[i].off && x < ext[i].off + ext[i].len)
                        x = ext[i].off + ext[i].len - 1;
        }
        if (gap != UINT64_MAX) {
            CHECK(flip_byte(path, gap, 0xFF) == 0);
            CHECK_OK(ckptio_reader_verify(r, &bad));
            for (int i = 0; i < 3; i++)
                if (load_cmp(r, names[i], data[i], nbs[i])) return 1;
            CHECK(flip_byte(path, gap, 0xFF) == 0);
        } else {
            printf("no padding between extents: padding check skipped\n");
        }
        ckptio_reader_close(r);
    }
    t_free(buf, round_up(nbs[0], PAGE));
    for (int i = 0; i < 3; i++) free(data[i]);
    return 0;
}

/* A data file cut short (in the middle of its last chunk, by one byte, at the chunk's start):
 * reading that chunk fails with CKPTIO_E_CORRUPT naming the file (an open that already
 * notices the short file may fail the same way instead), chunks before the cut still read,
 * verify fails. */
static int test_corrupt_truncated_data(void)
{
    T_SEED(0x72C);
    static const char *const names[3] = {"a", "b", "c"};
    const uint64_t nbs[3] = {10000, 200 * KiB, 300 * KiB + 5};
    unsigned char *data[3];
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("pristine"), NULL));
    for (int i = 0; i < 3; i++) {
        data[i] = malloc(nbs[i]);
        CHECK(data[i]);
        t_fill(data[i], nbs[i], seed + (uint64_t)i);
        uint64_t shape[1] = {nbs[i]};
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_U8, 1, shape, NULL, NULL, data[i],
                                   nbs[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    for (int c = 0; c < 3; c++) {
        CHECK(t_sh("rm -rf '%s' && cp -a '%s' '%s'", t_path("ck"), t_path("pristine"),
                   t_path("ck")) == 0);
        ckptio_reader *r = NULL;
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
        /* the chunk that ends the file holding "c" */
        char file[512], path[1024], f2[512], p2[1024];
        uint64_t off[3] = {0}, len[3] = {0};
        int last = -1;
        CHECK_OK(locate(r, "c", file, sizeof file, path, sizeof path, &off[2], &len[2]));
        for (int i = 0; i < 3; i++) {
            CHECK_OK(locate(r, names[i], f2, sizeof f2, p2, sizeof p2, &off[i], &len[i]));
            if (!strcmp(f2, file) && (last < 0 || off[i] > off[last])) last = i;
        }
        ckptio_reader_close(r);
        long long size = file_size(path);
        CHECK(size >= 0 && (uint64_t)size == off[last] + len[last]);
        uint64_t cut = c == 0 ? off[last] + len[last] / 2 : c == 1 ? (uint64_t)size - 1
                                                                   : off[last];
        fprintf(stderr, "case %d: %s cut from %lld to %llu bytes (tensor '%s' at %llu)\n", c,
                file, size, (unsigned long long)cut, names[last],
                (unsigned long long)off[last]);
        CHECK(truncate(path, (off_t)cut) == 0);

        int rc = ckptio_reader_open(&r, t_path("ck"), NULL);
        if (rc < 0) {
            CHECK_FAIL(rc, CKPTIO_E_CORRUPT, file);
            printf("case %d: ckptio_reader_open noticed the short file\n", c);
            continue;
        }
        unsigned char *buf = t_alloc(round_up(nbs[last], PAGE));
        CHECK(buf);
        rc = ckptio_reader_read_tensor(r, names[last], buf, round_up(nbs[last], PAGE));
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ckptio_reader_errmsg(r));
        CHECKF(rc == CKPTIO_E_CORRUPT, "case %d: read_tensor(%s) -> %s, expected "
               "CKPTIO_E_CORRUPT: %s", c, names[last], ckptio_errname(rc), msg);
        CHECKF(t_contains(msg, file), "case %d: message does not name '%s': %s", c, file, msg);
        t_free(buf, round_up(nbs[last], PAGE));
        for (int i = 0; i < 3; i++)
            if (i != last && off[i] + len[i] <= cut && load_cmp(r, names[i], data[i], nbs[i]))
                return 1;
        uint64_t bad = 0;
        rc = ckptio_reader_verify(r, &bad);
        CHECKF(rc < 0, "case %d: verify of a truncated file -> %d", c, rc);
        CHECKF(bad >= 1, "case %d: verify -> %s but bad_chunks %llu", c, ckptio_errname(rc),
               (unsigned long long)bad);
        ckptio_reader_close(r);
    }
    for (int i = 0; i < 3; i++) free(data[i]);
    return 0;
}

/* Write `len` bytes as the manifest of checkpoint "ck" and expect open to fail with `code`. */
static int expect_bad_manifest(const void *bytes, size_t len, int code, const char *what)
{
    if (t_write_file(t_path("ck/manifest"), bytes, len) != 0) return 1;
    ckptio_reader *r = (ckptio_reader *)&r;
    int rc = ckptio_reader_open(&r, t_path("ck"), NULL);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    CHECKF(rc == code, "%s: open -> %s, expected %s: %s", what, ckptio_errname(rc),
           ckptio_errname(code), msg);
    CHECKF(r == NULL, "%s: *out not NULL after a failed open", what);
    CHECKF(msg[0], "%s: empty ckptio_last_error()", what);
    return 0;
}

/* Damaged manifests: truncated at several lengths (including 0 bytes), garbage, a flipped
 * byte, a newer format version: open fails with CKPTIO_E_CORRUPT (FORMAT for the version),
 * without crashing; the intact manifest opens again. */
static int test_corrupt_manifest(void)
{
    T_SEED(0x3A1F);
    uint64_t shape[2] = {100, 3};
    unsigned char data[300 * 2];
    t_fill(data, sizeof data, seed);
    CHECK_OK(save1(t_path("ck"), "t", CKPTIO_DT_F16, 2, shape, data, sizeof data, NULL));
    unsigned char *m = NULL;
    long len = t_read_file(t_path("ck/manifest"), &m);
    CHECK(len > 16);
    size_t cuts[] = {0, 1, 4, 7, 8, 12, 16, 31, 64, (size_t)len / 2, (size_t)len - 8,
                     (size_t)len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        if (cuts[i] >= (size_t)len) continue;
        char what[128];
        snprintf(what, sizeof what, "manifest cut to %zu of %ld bytes", cuts[i], len);
        if (expect_bad_manifest(m, cuts[i], CKPTIO_E_CORRUPT, what)) return 1;
    }
    unsigned char *garbage = malloc((size_t)len + 4096);
    CHECK(garbage);
    t_fill(garbage, (size_t)len + 4096, seed + 1);
    if (expect_bad_manifest(garbage, (size_t)len, CKPTIO_E_CORRUPT, "garbage of equal length"))
        return 1;
    if (expect_bad_manifest(garbage, (size_t)len + 4096, CKPTIO_E_CORRUPT, "longer garbage"))
        return 1;
    memcpy(garbage, m, 16); /* a plausible header followed by garbage */
    if (expect_bad_manifest(garbage, (size_t)len, CKPTIO_E_CORRUPT, "header + garbage"))
        return 1;
    for (long pos = 0; pos < len; pos += (len + 6) / 7) {
        memcpy(garbage, m, (size_t)len);
        garbage[pos] ^= 0x04;
        char what[128];
        snprintf(what, sizeof what, "manifest byte %ld flipped", pos);
        if (expect_bad_manifest(garbage, (size_t)len, CKPTIO_E_CORRUPT, what)) return 1;
    }
    /* a newer format version, re-encoded with a valid checksum */
    {
        char err[256];
        ckptio__manifest *mf = NULL;
        CHECK_OK(ckptio__manifest_decode(m, (uint64_t)len, &mf, err, sizeof err));
        mf->version = CKPTIO_FORMAT_VERSION + 1;
        uint64_t elen = 0;
        CHECK_OK(ckptio__manifest_encoded_size(mf, &elen));
        uint8_t *enc = malloc(elen);
        CHECK(enc);
        CHECK_OK(ckptio__manifest_encode(mf, enc, elen));
        ckptio__manifest_free(mf);
        mf = NULL;
        int drc = ckptio__manifest_decode(enc, elen, &mf, err, sizeof err);
        ckptio__manifest_free(mf);
        if (drc == CKPTIO_E_FORMAT) {
            if (expect_bad_manifest(enc, elen, CKPTIO_E_FORMAT, "format version + 1")) return 1;
        } else {
            printf("the encoder does not write the version field: version check skipped\n");
        }
        free(enc);
    }
    CHECK(t_write_file(t_path("ck/manifest"), m, (size_t)len) == 0);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    if (load_cmp(r, "t", data, sizeof data)) return 1;
    ckptio_reader_close(r);
    free(m);
    free(garbage);
    return 0;
}

/* A manifest naming a data file outside the checkpoint ("../outside.ckd", "data/../../...",
 * an absolute path to a real copy of the data): open fails with CKPTIO_E_CORRUPT and never
 * opens the outside file (watched with inotify). */
static int test_manifest_escape(void)
{
    T_SEED(0xE5C);
    uint64_t shape[1] = {50000};
    unsigned char *data = malloc(50000);
    CHECK(data);
    t_fill(data, 50000, seed);
    CHECK_OK(save1(t_path("ck"), "t", CKPTIO_DT_U8, 1, shape, data, 50000, NULL));
    ckptio_reader *r = NULL;
    char file[512], path[1024];
    uint64_t off = 0, len = 0;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK_OK(locate(r, "t", file, sizeof file, path, sizeof path, &off, &len));
    ckptio_reader_close(r);
    /* a faithful copy outside: a reader that followed the name would succeed */
    CHECK(t_sh("cp '%s' '%s'", path, t_path("outside.ckd")) == 0);
    unsigned char *m = NULL;
    long mlen = t_read_file(t_path("ck/manifest"), &m);
    CHECK(mlen > 0);
    char absname[600];
    snprintf(absname, sizeof absname, "%s", t_path("outside.ckd"));
    const char *evil[] = {"../outside.ckd", "data/../../outside.ckd", absname, "./../outside.ckd"};
    for (size_t e = 0; e < sizeof evil / sizeof evil[0]; e++) {
        char err[256];
        ckptio__manifest *mf = NULL;
        CHECK_OK(ckptio__manifest_decode(m, (uint64_t)mlen, &mf, err, sizeof err));
        CHECK(mf->n_files >= 1);
        size_t nl = strlen(evil[e]);
        char *st = malloc(mf->strtab_len + nl + 1);
        CHECK(st);
        memcpy(st, mf->strtab, mf->strtab_len);
        memcpy(st + mf->strtab_len, evil[e], nl + 1);
        char *old_st = mf->strtab;
        uint64_t old_len = mf->strtab_len;
        for (uint64_t f = 0; f < mf->n_files; f++) {
            mf->files[f].name = old_len;
            mf->files[f].name_len = (uint32_t)nl;
        }
        mf->strtab = st;
        mf->strtab_len = old_len + nl + 1;
        uint64_t elen = 0;
        int rc = ckptio__manifest_encoded_size(mf, &elen);
        uint8_t *enc = rc >= 0 ? malloc(elen) : NULL;
        if (enc) rc = ckptio__manifest_encode(mf, enc, elen);
        mf->strtab = old_st;
        mf->strtab_len = old_len;
        ckptio__manifest_free(mf);
        free(st);
        CHECKF(rc >= 0 && enc, "could not encode a manifest naming '%s': %s", evil[e],
               ckptio_errname(rc));
        CHECK(t_write_file(t_path("ck/manifest"), enc, elen) == 0);
        free(enc);

        int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        CHECK(in >= 0);
        CHECK(inotify_add_watch(in, t_dir(), IN_OPEN | IN_ACCESS) >= 0);
        r = (ckptio_reader *)&r;
        rc = ckptio_reader_open(&r, t_path("ck"), NULL);
        int opened_ok = rc >= 0;
        if (opened_ok) {
            unsigned char *buf = malloc(50000);
            int rrc = ckptio_reader_read_tensor(r, "t", buf, 50000);
            fprintf(stderr, "open accepted '%s'; reading then gave %s\n", evil[e],
                    ckptio_errname(rrc));
            free(buf);
            ckptio_reader_close(r);
        }
        char evbuf[8192] __attribute__((aligned(8)));
        int touched = 0;
        ssize_t n;
        while ((n = read(in, evbuf, sizeof evbuf)) > 0)
            for (char *p = evbuf; p < evbuf + n;) {
                const struct inotify_event *ev = (const struct inotify_event *)p;
                if (ev->len && !strcmp(ev->name, "outside.ckd")) touched = 1;
                p += sizeof *ev + ev->len;
            }
        close(in);
        CHECKF(!opened_ok, "a manifest naming '%s' was accepted", evil[e]);
        CHECK_FAIL(rc, CKPTIO_E_CORRUPT, NULL);
        CHECKF(r == NULL, "*out not NULL after a failed open");
        CHECKF(!touched, "the reader opened a file outside the checkpoint ('%s')", evil[e]);
    }
    free(m);
    free(data);
    return 0;
}

/* Checksums off at save: round trip, verify passes, chunks still record their sizes. */
static int test_checksums_off(void)
{
    T_SEED(0xC50F);
    ckptio_params p;
    ckptio_params_init(&p);
    p.checksums = CKPTIO_OFF;
    const uint64_t n0 = 3 * MiB + 7, n1 = 777;
    unsigned char *a = malloc(n0), *b = malloc(n1);
    CHECK(a && b);
    t_fill(a, n0, seed);
    t_fill(b, n1, seed + 1);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    uint64_t s0[1] = {n0}, s1[1] = {n1};
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, s0, NULL, NULL, a, n0));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_I8, 1, s1, NULL, NULL, b, n1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL)); /* checksums ON at read: none stored */
    if (load_cmp(r, "a", a, n0) || load_cmp(r, "b", b, n1)) return 1;
    uint64_t off[1] = {n0 - 5000}, shp[1] = {5000};
    unsigned char *d = malloc(5000);
    CHECK(d);
    CHECK_OK(ckptio_reader_read(r, &(ckptio_region){.size = sizeof(ckptio_region), .name = "a",
                                                    .offset = off, .shape = shp,
                                                   .dst = d, .capacity = 5000},
                                1));
    CHECK(!memcmp(d, a + n0 - 5000, 5000));
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, 0, &ti));
    CHECK(ti.stored_bytes == n0);
    ckptio_reader_close(r);
    free(a), free(b), free(d);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Commit protocol                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Closing without commit aborts: nothing at the path, no `<name>.tmp-*` sibling, whether
 * nothing, something, or flushed data was added. While the writer is open the path stays
 * absent and the temporary sibling is not a checkpoint. */
static int test_abort(void)
{
    T_SEED(0xAB0);
    const uint64_t n = 2 * MiB + 3;
    unsigned char *a = malloc(n);
    CHECK(a);
    t_fill(a, n, seed);
    uint64_t shape[1] = {n};
    for (int mode = 0; mode < 3; mode++) {
        ckptio_writer *w = NULL;
        CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
        if (mode >= 1) {
            CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
            CHECK_OK(ckptio_writer_set_meta(w, "k", "v", 1));
        }
        if (mode == 2) {
            CHECK_OK(ckptio_writer_flush(w));
            CHECK(!exists(t_path("ck")));
            char tmp[512];
            CHECKF(find_tmp("ck", tmp, sizeof tmp) == 0, "no ck.tmp-* while writing");
            char want[64];
            snprintf(want, sizeof want, "ck.tmp-%d.", (int)getpid());
            CHECKF(!strncmp(tmp, want, strlen(want)), "temporary directory '%s', expected "
                   "'%s<n>'", tmp, want);
            ckptio_reader *r = (ckptio_reader *)&r;
            CHECK_FAIL(ckptio_reader_open(&r, t_path(tmp), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
            CHECK(r == NULL);
        }
        CHECK(!exists(t_path("ck")));
        ckptio_writer_close(w);
        CHECKF(!exists(t_path("ck")), "mode %d: aborted checkpoint is visible", mode);
        CHECKF(no_tmp("ck"), "mode %d: temporary directory left behind", mode);
        CHECKF(count_entries(t_dir(), "") == 0, "mode %d: something was left in t_dir()", mode);
    }
    /* an aborted overwrite leaves the old checkpoint as it was */
    CHECK_OK(save1(t_path("ck"), "old", CKPTIO_DT_U8, 1, shape, a, n, NULL));
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "new", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_flush(w));
    ckptio_writer_close(w);
    CHECK(no_tmp("ck"));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1 && ckptio_reader_find(r, "new") == CKPTIO_E_NOT_FOUND);
    if (load_cmp(r, "old", a, n)) return 1;
    ckptio_reader_close(r);
    free(a);
    return 0;
}

/* Opening a writer on an existing checkpoint (or directory) without overwrite fails with
 * CKPTIO_E_EXISTS and changes nothing; with overwrite the new content replaces the old at
 * commit, with no siblings left; overwrite of a path that does not exist just creates it. */
static int test_exists_overwrite(void)
{
    T_SEED(0xE715);
    const uint64_t n = 100000;
    unsigned char *a = malloc(n), *b = malloc(n), *c = malloc(n);
    CHECK(a && b && c);
    t_fill(a, n, seed), t_fill(b, n, seed + 1), t_fill(c, n, seed + 2);
    uint64_t shape[1] = {n};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, shape, NULL, NULL, b, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    struct stat st;
    CHECK(stat(t_path("ck/manifest"), &st) == 0 && S_ISREG(st.st_mode));
    CHECK(stat(t_path("ck/data"), &st) == 0 && S_ISDIR(st.st_mode));

    w = (ckptio_writer *)&w;
    CHECK_FAIL(ckptio_writer_open(&w, t_path("ck"), NULL), CKPTIO_E_EXISTS, "ck");
    CHECK(w == NULL);
    CHECK(mkdir(t_path("plain"), 0700) == 0);
    w = (ckptio_writer *)&w;
    CHECK_FAIL(ckptio_writer_open(&w, t_path("plain"), NULL), CKPTIO_E_EXISTS, NULL);
    CHECK(w == NULL);
    CHECK(no_tmp("ck") && no_tmp("plain"));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    if (load_cmp(r, "a", a, n) || load_cmp(r, "b", b, n)) return 1;
    ckptio_reader_close(r);

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "c", CKPTIO_DT_U8, 1, shape, NULL, NULL, c, n));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "2", 1));
    /* until commit the old checkpoint is what a reader sees */
    CHECK_OK(ckptio_writer_flush(w));
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_find(r, "a") >= 0 && ckptio_reader_find(r, "c") == CKPTIO_E_NOT_FOUND);
    ckptio_reader_close(r);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1);
    CHECK(ckptio_reader_find(r, "a") == CKPTIO_E_NOT_FOUND);
    if (load_cmp(r, "c", c, n)) return 1;
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "gen", &v, &len));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    CHECKF(count_entries(t_dir(), "") == 2, "leftovers after an overwrite");
    CHECK(stat(t_path("ck/manifest"), &st) == 0 && S_ISREG(st.st_mode));

    /* overwrite ON where nothing exists yet */
    CHECK_OK(save1(t_path("fresh"), "a", CKPTIO_DT_U8, 1, shape, a, n, &p));
    CHECK_OK(ckptio_reader_open(&r, t_path("fresh"), NULL));
    if (load_cmp(r, "a", a, n)) return 1;
    ckptio_reader_close(r);
    CHECKF(count_entries(t_dir(), "") == 3, "leftovers after a fresh save");
    free(a), free(b), free(c);
    return 0;
}

/* An overwrite whose commit fails (a tensor missing a chunk: CKPTIO_E_INCOMPLETE) leaves the
 * old checkpoint loadable bit-exact and no temporary directory; the writer takes no more
 * calls but close. */
static int test_overwrite_fail(void)
{
    T_SEED(0x0F41);
    const uint64_t n = MiB + 11;
    unsigned char *a = malloc(n), *x = malloc(n);
    CHECK(a && x);
    t_fill(a, n, seed), t_fill(x, n, seed + 1);
    uint64_t shape[1] = {n};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "1", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    unsigned char *m0 = NULL;
    long m0len = t_read_file(t_path("ck/manifest"), &m0);
    CHECK(m0len > 0);

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, x, n));
    uint64_t off[1] = {0}, half[1] = {n / 2};
    CHECK_OK(ckptio_writer_add(w, "holey", CKPTIO_DT_U8, 1, shape, off, half, x, n / 2));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "2", 1));
    CHECK_FAIL(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE, "holey");
    CHECK_NEG(ckptio_writer_add(w, "more", CKPTIO_DT_U8, 1, shape, NULL, NULL, x, n));
    CHECK_NEG(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    CHECK(no_tmp("ck"));
    CHECKF(count_entries(t_dir(), "") == 1, "leftovers after a failed overwrite");
    unsigned char *m1 = NULL;
    long m1len = t_read_file(t_path("ck/manifest"), &m1);
    CHECK(m1len == m0len && !memcmp(m0, m1, (size_t)m0len));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1);
    if (load_cmp(r, "a", a, n)) return 1;
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "gen", &v, &len));
    CHECK(len == 1 && *(const char *)v == '1');
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);

    /* the same failure on a fresh path leaves nothing */
    CHECK_OK(ckptio_writer_open(&w, t_path("ck2"), NULL));
    CHECK_OK(ckptio_writer_add(w, "holey", CKPTIO_DT_U8, 1, shape, off, half, x, n / 2));
    CHECK_FAIL(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE, "holey");
    ckptio_writer_close(w);
    CHECK(!exists(t_path("ck2")) && no_tmp("ck2"));
    free(a), free(x), free(m0), free(m1);
    return 0;
}

/* Opening what is not a checkpoint: a directory without a manifest (NOT_CHECKPOINT), a
 * missing path (-ENOENT), a regular file (some failure). */
static int test_open_errors(void)
{
    T_SEED(0);
    (void)seed;
    ckptio_reader *r = (ckptio_reader *)&r;
    CHECK(mkdir(t_path("empty"), 0700) == 0);
    CHECK_FAIL(ckptio_reader_open(&r, t_path("empty"), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
    CHECK(r == NULL);
    CHECK(mkdir(t_path("empty/data"), 0700) == 0);
    CHECK_FAIL(ckptio_reader_open(&r, t_path("empty"), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
    r = (ckptio_reader *)&r;
    CHECK_FAIL(ckptio_reader_open(&r, t_path("nonexistent"), NULL), -ENOENT, NULL);
    CHECK(r == NULL);
    CHECK(t_write_file(t_path("file"), "hello", 5) == 0);
    CHECK_NEG(ckptio_reader_open(&r, t_path("file"), NULL));
    CHECK(r == NULL);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Bad calls                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Each rejected writer call returns its named error, explains itself (naming the tensor),
 * and leaves the writer usable: the checkpoint commits with exactly the accepted tensors. */
static int test_bad_writer_calls(void)
{
    T_SEED(0xBAD1);
    float f4[4] = {1, 2, 3, 4};
    float f10[10];
    unsigned char u100[100];
    t_fill(f10, sizeof f10, seed);
    t_fill(u100, sizeof u100, seed + 1);
    uint64_t s4[1] = {4}, s10[1] = {10}, s10x10[2] = {10, 10};
    ckptio_writer *w = (ckptio_writer *)&w;

    CHECK_FAIL(ckptio_writer_open(NULL, t_path("ck"), NULL), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_open(&w, NULL, NULL), CKPTIO_E_USAGE, NULL);
    CHECK(w == NULL);
    ckptio_params bad;
    memset(&bad, 0, sizeof bad); /* not initialized with ckptio_params_init */
    w = (ckptio_writer *)&w;
    CHECK_NEG(ckptio_writer_open(&w, t_path("ck"), &bad));
    CHECK(w == NULL);
    CHECK(!exists(t_path("ck")));
    ckptio_writer_close(NULL);
    ckptio_reader_close(NULL);
    CHECK_FAIL(ckptio_writer_add(NULL, "x", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
               CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_set_meta(NULL, "k", "v", 1), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_flush(NULL), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_commit(NULL), CKPTIO_E_USAGE, NULL);
    ckptio_stats st;
    CHECK_FAIL(ckptio_writer_stats(NULL, &st), CKPTIO_E_USAGE, NULL);

    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_FAIL(ckptio_writer_stats(w, NULL), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_add(w, NULL, CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
               CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_add(w, "nodata", CKPTIO_DT_F32, 1, s4, NULL, NULL, NULL, 16),
               CKPTIO_E_USAGE, "nodata");
    CHECK_FAIL(ckptio_writer_add(w, "noshape", CKPTIO_DT_F32, 1, NULL, NULL, NULL, f4, 16),
               CKPTIO_E_USAGE, "noshape");
    /* names: empty, invalid UTF-8 (stray byte, truncated, overlong, surrogate), too long */
    CHECK_FAIL(ckptio_writer_add(w, "", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
               CKPTIO_E_USAGE, NULL);
    static const char *const bad_utf8[] = {"\xff\xfe", "bad\xc3", "over\xc0\x80long",
                                           "sur\xed\xa0\x80rogate", "\x80start"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++)
        CHECK_FAIL(ckptio_writer_add(w, bad_utf8[i], CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
                   CKPTIO_E_USAGE, NULL);
    static char longname[CKPTIO_MAX_NAME + 2];
    memset(longname, 'L', CKPTIO_MAX_NAME + 1);
    CHECK_FAIL2(ckptio_writer_add(w, longname, CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
                CKPTIO_E_LIMIT, CKPTIO_E_USAGE, NULL);
    longname[CKPTIO_MAX_NAME] = 0; /* exactly the limit: accepted */
    CHECK_OK(ckptio_writer_add(w, longname, CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16));

    /* dtypes */
    static const int bad_dt[] = {0, -1, CKPTIO_DT_BYTES + 1, 999};
    for (size_t i = 0; i < sizeof bad_dt / sizeof bad_dt[0]; i++)
        CHECK_FAIL(ckptio_writer_add(w, "dtype_t", bad_dt[i], 1, s4, NULL, NULL, f4, 16),
                   CKPTIO_E_DTYPE, "dtype_t");
    CHECK_OK(ckptio_writer_add(w, "dtype_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16));

    /* sizes and boxes */
    CHECK_FAIL(ckptio_writer_add(w, "nbytes_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 15),
               CKPTIO_E_SHAPE, "nbytes_t");
    CHECK_FAIL(ckptio_writer_add(w, "nbytes_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 17),
               CKPTIO_E_SHAPE, "nbytes_t");
    CHECK_FAIL(ckptio_writer_add(w, "nbytes_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 0),
               CKPTIO_E_SHAPE, "nbytes_t");
    CHECK_OK(ckptio_writer_add(w, "nbytes_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16));
    {
        uint64_t o8[1] = {8}, sh4[1] = {4}, o10[1] = {10}, sh1[1] = {1}, omax[1] = {UINT64_MAX},
                 sh2[1] = {2}, sh11[1] = {11}, o0[1] = {0};
        CHECK_FAIL(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, o8, sh4, f10, 16),
                   CKPTIO_E_SHAPE, "outside_t");
        CHECK_FAIL(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, o10, sh1, f10, 4),
                   CKPTIO_E_SHAPE, "outside_t");
        CHECK_FAIL(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, omax, sh2, f10, 8),
                   CKPTIO_E_SHAPE, "outside_t");
        CHECK_FAIL(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, o0, sh11, u100, 44),
                   CKPTIO_E_SHAPE, "outside_t");
        /* chunk_shape NULL is the whole tensor's shape: at offset 8 it sticks out */
        CHECK_FAIL(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, o8, NULL, f10, 40),
                   CKPTIO_E_SHAPE, "outside_t");
    }
    CHECK_OK(ckptio_writer_add(w, "outside_t", CKPTIO_DT_F32, 1, s10, NULL, NULL, f10, 40));
    {
        uint64_t deep[CKPTIO_MAX_NDIM + 1];
        for (int i = 0; i <= CKPTIO_MAX_NDIM; i++) deep[i] = 1;
        CHECK_FAIL(ckptio_writer_add(w, "deep_t", CKPTIO_DT_F32, CKPTIO_MAX_NDIM + 1, deep, NULL,
                                     NULL, f4, 4),
                   CKPTIO_E_LIMIT, "deep_t");
        CHECK_OK(ckptio_writer_add(w, "deep_t", CKPTIO_DT_F32, CKPTIO_MAX_NDIM, deep, NULL, NULL,
                                   f4, 4));
        uint64_t huge[2] = {1ull << 40, 1ull << 40};
        CHECK_FAIL2(ckptio_writer_add(w, "huge_t", CKPTIO_DT_F64, 2, huge, NULL, NULL, f4, 16),
                    CKPTIO_E_LIMIT, CKPTIO_E_SHAPE, "huge_t");
    }
    /* chunks of one tensor must agree with one another */
    {
        uint64_t o0[1] = {0}, o5[1] = {5}, sh5[1] = {5}, s11[1] = {11};
        uint64_t s10x1[2] = {10, 1}, o5x0[2] = {5, 0}, sh5x1[2] = {5, 1};
        CHECK_OK(ckptio_writer_add(w, "agree_t", CKPTIO_DT_F32, 1, s10, o0, sh5, f10, 20));
        CHECK_FAIL(ckptio_writer_add(w, "agree_t", CKPTIO_DT_I32, 1, s10, o5, sh5, f10 + 5, 20),
                   CKPTIO_E_SHAPE, "agree_t");
        CHECK_FAIL(ckptio_writer_add(w, "agree_t", CKPTIO_DT_F32, 1, s11, o5, sh5, f10 + 5, 20),
                   CKPTIO_E_SHAPE, "agree_t");
        CHECK_FAIL(ckptio_writer_add(w, "agree_t", CKPTIO_DT_F32, 2, s10x1, o5x0, sh5x1, f10 + 5,
                                     20),
                   CKPTIO_E_SHAPE, "agree_t");
        CHECK_OK(ckptio_writer_add(w, "agree_t", CKPTIO_DT_F32, 1, s10, o5, sh5, f10 + 5, 20));
    }
    /* duplicates and overlaps */
    CHECK_OK(ckptio_writer_add(w, "dup_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16));
    CHECK_FAIL(ckptio_writer_add(w, "dup_t", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
               CKPTIO_E_DUPLICATE, "dup_t");
    {
        uint64_t o00[2] = {0, 0}, sh5x10[2] = {5, 10}, o40[2] = {4, 0}, sh2x10[2] = {2, 10},
                 o50[2] = {5, 0}, o99[2] = {9, 9}, sh1x1[2] = {1, 1};
        CHECK_OK(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, o00, sh5x10, u100, 50));
        CHECK_FAIL(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, o40, sh2x10, u100, 20),
                   CKPTIO_E_DUPLICATE, "ov_t");
        CHECK_FAIL(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, o00, sh5x10, u100, 50),
                   CKPTIO_E_DUPLICATE, "ov_t");
        CHECK_OK(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, o50, sh5x10, u100 + 50,
                                   50));
        CHECK_FAIL(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, o99, sh1x1, u100, 1),
                   CKPTIO_E_DUPLICATE, "ov_t");
        CHECK_FAIL(ckptio_writer_add(w, "ov_t", CKPTIO_DT_U8, 2, s10x10, NULL, NULL, u100, 100),
                   CKPTIO_E_DUPLICATE, "ov_t");
    }
    /* the writer's own message is set as well */
    CHECK(ckptio_writer_errmsg(w) && ckptio_writer_errmsg(w)[0]);

    /* metadata */
    CHECK_FAIL(ckptio_writer_set_meta(w, NULL, "v", 1), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_set_meta(w, "", "v", 1), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_set_meta(w, "\xff", "v", 1), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_writer_set_meta(w, "k", NULL, 5), CKPTIO_E_USAGE, NULL);
    {
        size_t big = (size_t)CKPTIO_MAX_META_VALUE + 1;
        void *v = t_alloc(big); /* untouched pages cost nothing */
        CHECK(v);
        CHECK_FAIL(ckptio_writer_set_meta(w, "bigkey", v, big), CKPTIO_E_LIMIT, NULL);
        t_free(v, big);
    }
    CHECK_OK(ckptio_writer_set_meta(w, "k", "v", 1));

    CHECK_OK(ckptio_writer_commit(w));
    CHECK_OK(ckptio_writer_stats(w, &st)); /* checked last, below */
    CHECK_FAIL(ckptio_writer_add(w, "late", CKPTIO_DT_F32, 1, s4, NULL, NULL, f4, 16),
               CKPTIO_E_STATE, NULL);
    CHECK_FAIL(ckptio_writer_set_meta(w, "late", "v", 1), CKPTIO_E_STATE, NULL);
    CHECK_FAIL(ckptio_writer_flush(w), CKPTIO_E_STATE, NULL);
    CHECK_FAIL(ckptio_writer_commit(w), CKPTIO_E_STATE, NULL);
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECKF(ckptio_reader_num_tensors(r) == 8, "%zu tensors, expected 8",
           ckptio_reader_num_tensors(r));
    if (load_cmp(r, longname, f4, 16) || load_cmp(r, "dtype_t", f4, 16) ||
        load_cmp(r, "nbytes_t", f4, 16) || load_cmp(r, "outside_t", f10, 40) ||
        load_cmp(r, "deep_t", f4, 4) || load_cmp(r, "agree_t", f10, 40) ||
        load_cmp(r, "dup_t", f4, 16) || load_cmp(r, "ov_t", u100, 100))
        return 1;
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, (size_t)ckptio_reader_find(r, "deep_t"), &ti));
    CHECK(ti.ndim == CKPTIO_MAX_NDIM && ti.dtype == CKPTIO_DT_F32);
    CHECK(ckptio_reader_find(r, "huge_t") == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_find(r, "nodata") == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_num_meta(r) == 1);
    ckptio_reader_close(r);
    /* "tensors written": 8 tensors, two of them in two chunks */
    CHECKF(st.tensors == 8, "writer stats: %llu tensors, expected 8 (10 chunks)",
           (unsigned long long)st.tensors);
    return 0;
}

/* Rejected reader calls: NULL arguments, unknown names, regions outside the tensor,
 * destinations too small; the reader stays usable afterwards. */
static int test_bad_reader_calls(void)
{
    T_SEED(0xBAD2);
    float t[10 * 20];
    unsigned char u[100];
    t_fill(t, sizeof t, seed);
    t_fill(u, sizeof u, seed + 1);
    uint64_t st_[2] = {10, 20}, su[1] = {100};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "tensor_t", CKPTIO_DT_F32, 2, st_, NULL, NULL, t, sizeof t));
    CHECK_OK(ckptio_writer_add(w, "u", CKPTIO_DT_U8, 1, su, NULL, NULL, u, sizeof u));
    CHECK_OK(ckptio_writer_set_meta(w, "k", "v", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = (ckptio_reader *)&r;
    CHECK_FAIL(ckptio_reader_open(NULL, t_path("ck"), NULL), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_open(&r, NULL, NULL), CKPTIO_E_USAGE, NULL);
    CHECK(r == NULL);
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));

    float buf[10 * 20 + 8];
    const uint64_t cap = sizeof t;
    CHECK_FAIL(ckptio_reader_read_tensor(NULL, "tensor_t", buf, cap), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_read_tensor(r, NULL, buf, cap), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_read_tensor(r, "tensor_t", NULL, cap), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_read_tensor(r, "nope_t", buf, cap), CKPTIO_E_NOT_FOUND, "nope_t");
    CHECK_FAIL(ckptio_reader_read_tensor(r, "tensor_t", buf, cap - 1), CKPTIO_E_BUFFER,
               "tensor_t");
    CHECK_FAIL(ckptio_reader_read_tensor(r, "tensor_t", buf, 0), CKPTIO_E_BUFFER, "tensor_t");

    ckptio_region rg = {.size = sizeof(ckptio_region), .name = "tensor_t", .dst = buf,
                        .capacity = cap};
    CHECK_FAIL(ckptio_reader_read(NULL, &rg, 1), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_read(r, NULL, 1), CKPTIO_E_USAGE, NULL);
    rg.capacity = cap - 4;
    CHECK_FAIL(ckptio_reader_read(r, &rg, 1), CKPTIO_E_BUFFER, "tensor_t");
    rg.capacity = cap;
    rg.dst = NULL;
    CHECK_FAIL(ckptio_reader_read(r, &rg, 1), CKPTIO_E_USAGE, NULL);
    rg.dst = buf;
    rg.name = "nope_t";
    CHECK_FAIL(ckptio_reader_read(r, &rg, 1), CKPTIO_E_NOT_FOUND, "nope_t");
    rg.name = NULL;
    rg.tensor = 2;
    CHECK_NEG(ckptio_reader_read(r, &rg, 1));
    rg.tensor = (size_t)-1;
    CHECK_NEG(ckptio_reader_read(r, &rg, 1));
    rg.name = "tensor_t";
    {
        /* boxes outside the 10 x 20 tensor */
        static unsigned char roomy[4096];
        static const uint64_t boxes[][4] = {
            {9, 0, 2, 1},  {0, 20, 1, 1},  {10, 0, 1, 1},       {0, 0, 11, 20},
            {0, 0, 10, 21}, {UINT64_MAX, 0, 2, 1}, {0, UINT64_MAX - 1, 1, 3},
            {1, 1, UINT64_MAX, 1}, {11, 0, 0, 1},
        };
        for (size_t i = 0; i < sizeof boxes / sizeof boxes[0]; i++) {
            uint64_t off[2] = {boxes[i][0], boxes[i][1]}, shp[2] = {boxes[i][2], boxes[i][3]};
            rg.offset = off, rg.shape = shp;
            rg.dst = roomy, rg.capacity = sizeof roomy; /* room enough: only the range is wrong */
            fprintf(stderr, "box %zu\n", i);
            CHECK_FAIL(ckptio_reader_read(r, &rg, 1), CKPTIO_E_RANGE, "tensor_t");
        }
        /* a bad region among good ones fails the call */
        uint64_t off[2] = {5, 5}, shp[2] = {6, 1};
        unsigned char ub[100];
        ckptio_region three[3] = {
            {.size = sizeof(ckptio_region), .name = "u", .dst = ub, .capacity = sizeof ub},
            {.size = sizeof(ckptio_region), .name = "tensor_t", .offset = off, .shape = shp,
             .dst = buf, .capacity = cap},
            {.size = sizeof(ckptio_region), .name = "u", .dst = ub, .capacity = sizeof ub},
        };
        CHECK_FAIL(ckptio_reader_read(r, three, 3), CKPTIO_E_RANGE, "tensor_t");
    }
    CHECK(ckptio_reader_find(r, "nope_t") == CKPTIO_E_NOT_FOUND);
    const void *v;
    size_t len;
    CHECK(ckptio_reader_get_meta(r, "nokey", &v, &len) == CKPTIO_E_NOT_FOUND);
    CHECK_FAIL(ckptio_reader_get_meta(NULL, "k", &v, &len), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_get_meta(r, NULL, &v, &len), CKPTIO_E_USAGE, NULL);
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    CHECK_FAIL(ckptio_reader_tensor(r, 0, NULL), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_tensor(NULL, 0, &ti), CKPTIO_E_USAGE, NULL);
    CHECK_NEG(ckptio_reader_tensor(r, 2, &ti));
    CHECK_FAIL(ckptio_reader_chunk(r, 0, 0, NULL), CKPTIO_E_USAGE, NULL);
    CHECK_NEG(ckptio_reader_chunk(r, 0, 1, &ci));
    CHECK_NEG(ckptio_reader_chunk(r, 2, 0, &ci));
    const char *k;
    CHECK_NEG(ckptio_reader_meta(r, 1, &k, &v, &len));
    CHECK_FAIL(ckptio_reader_verify(NULL, NULL), CKPTIO_E_USAGE, NULL);
    ckptio_stats st;
    CHECK_FAIL(ckptio_reader_stats(NULL, &st), CKPTIO_E_USAGE, NULL);
    CHECK_FAIL(ckptio_reader_stats(r, NULL), CKPTIO_E_USAGE, NULL);
    CHECK(ckptio_reader_errmsg(r) && ckptio_reader_errmsg(r)[0]);

    /* still usable */
    CHECK_OK(ckptio_reader_read_tensor(r, "tensor_t", buf, cap));
    CHECK(!memcmp(buf, t, sizeof t));
    uint64_t off[2] = {3, 7}, shp[2] = {7, 13};
    float exp[7 * 13], got[7 * 13];
    extract((unsigned char *)exp, (const unsigned char *)t, st_, off, shp, 2, 4);
    CHECK_OK(ckptio_reader_read(r, &(ckptio_region){.size = sizeof(ckptio_region),
                                                    .name = "tensor_t", .offset = off,
                                                   .shape = shp, .dst = got,
                                                   .capacity = sizeof got},
                                1));
    CHECK(!memcmp(got, exp, sizeof exp));
    if (load_cmp(r, "u", u, sizeof u)) return 1;
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Parameters                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Save `n` random bytes (n a multiple of 4) as "a" (f32, aligned source) and "m" (source at
 * ptr + 1), plus a small one, with params `wp`; load with `rp` into aligned and misaligned
 * destinations; verify. */
static int roundtrip_params(const char *ck, const ckptio_params *wp, const ckptio_params *rp,
                            uint64_t n, uint64_t seed, ckptio_stats *wst, ckptio_stats *rst)
{
    gbuf a, m;
    unsigned char small[1000];
    CHECK(gbuf_make(&a, n, 0) == 0 && gbuf_make(&m, n + 3, 1) == 0);
    t_fill(a.p, n, seed), t_fill(m.p, n + 3, seed + 1), t_fill(small, sizeof small, seed + 2);
    uint64_t sa[1] = {n / 4}, sm[1] = {n + 3}, ss[1] = {sizeof small};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, ck, wp));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_F32, 1, sa, NULL, NULL, a.p, n));
    CHECK_OK(ckptio_writer_add(w, "m", CKPTIO_DT_U8, 1, sm, NULL, NULL, m.p, n + 3));
    CHECK_OK(ckptio_writer_add(w, "s", CKPTIO_DT_U8, 1, ss, NULL, NULL, small, sizeof small));
    CHECK_OK(ckptio_writer_commit(w));
    if (wst) CHECK_OK(ckptio_writer_stats(w, wst));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, rp));
    gbuf d1, d2;
    CHECK(gbuf_make(&d1, round_up(n + 3, PAGE), 0) == 0 && gbuf_make(&d2, n + 3, 1) == 0);
    CHECK_OK(ckptio_reader_read_tensor(r, "a", d1.p, d1.len));
    CHECK(!memcmp(d1.p, a.p, n));
    CHECK_OK(ckptio_reader_read_tensor(r, "a", d2.p, n));
    CHECK(!memcmp(d2.p, a.p, n) && gbuf_intact(&d2, n));
    CHECK_OK(ckptio_reader_read_tensor(r, "m", d1.p, d1.len));
    CHECK(!memcmp(d1.p, m.p, n + 3));
    CHECK_OK(ckptio_reader_read_tensor(r, "m", d2.p, n + 3));
    CHECK(!memcmp(d2.p, m.p, n + 3) && gbuf_intact(&d2, n + 3));
    if (load_cmp(r, "s", small, sizeof small)) return 1;
    if (rst) CHECK_OK(ckptio_reader_stats(r, rst));
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    gbuf_free(&a), gbuf_free(&m), gbuf_free(&d1), gbuf_free(&d2);
    return 0;
}

/* A tiny staging pool (1 MiB, 256 KiB requests, queue depth 2, 2 threads) still moves 20 MiB
 * tensors both ways, also for checkpoints saved with other params (other checksum blocks). */
static int test_small_staging(void)
{
    T_SEED(0x57A6);
    ckptio_params p;
    ckptio_params_init(&p);
    p.staging_bytes = MiB;
    p.request_bytes = 256 * KiB;
    p.queue_depth = 2;
    p.io_threads = 2;
    limit_memory(3 * GiB);
    if (roundtrip_params(t_path("ck"), &p, &p, 20 * MiB, seed, NULL, NULL)) return 1;
    /* saved with defaults (1 MiB checksum blocks), read through the small pool; and the
     * other way round */
    fprintf(stderr, "saved with defaults, loaded with small staging\n");
    if (roundtrip_params(t_path("ck2"), NULL, &p, 5 * MiB + 8, seed + 10, NULL, NULL)) return 1;
    fprintf(stderr, "saved with small staging, loaded with defaults\n");
    if (roundtrip_params(t_path("ck3"), &p, NULL, 5 * MiB + 8, seed + 20, NULL, NULL)) return 1;
    ckptio_params_init(&p);
    p.staging_bytes = 64 * KiB;
    p.request_bytes = 64 * KiB;
    p.queue_depth = 1;
    fprintf(stderr, "saved with defaults, loaded with 64 KiB staging\n");
    return roundtrip_params(t_path("ck4"), NULL, &p, 3 * MiB + 4, seed + 30, NULL, NULL);
}

/* fsync off, direct off, both off: round trips; with direct off no O_DIRECT is reported; a
 * checkpoint written without O_DIRECT reads back with it and the other way round. */
static int test_fsync_direct_off(void)
{
    T_SEED(0xF5D0);
    ckptio_params nofsync, nodirect, both;
    ckptio_params_init(&nofsync);
    nofsync.fsync = CKPTIO_OFF;
    ckptio_params_init(&nodirect);
    nodirect.direct = CKPTIO_OFF;
    both = nodirect;
    both.fsync = CKPTIO_OFF;
    ckptio_stats ws, rs;
    if (roundtrip_params(t_path("ck1"), &nofsync, NULL, 3 * MiB, seed, &ws, &rs)) return 1;
    if (check_stats(&ws, expected_direct(t_dir()), "writer, fsync off")) return 1;
    if (roundtrip_params(t_path("ck2"), &nodirect, &nodirect, 3 * MiB, seed + 10, &ws, &rs))
        return 1;
    if (check_stats(&ws, 0, "writer, direct off") || check_stats(&rs, 0, "reader, direct off"))
        return 1;
    /* read from the device: with the cache allowed, the resident file would be copied from it */
    ckptio_params nocache;
    ckptio_params_init(&nocache);
    nocache.cache = CKPTIO_CACHE_NEVER;
    if (roundtrip_params(t_path("ck3"), &both, &nocache, 5 * MiB + 4, seed + 20, &ws, &rs))
        return 1;
    if (check_stats(&ws, 0, "writer, fsync and direct off")) return 1;
    if (check_stats(&rs, expected_direct(t_dir()), "reader, direct auto")) return 1;
    return 0;
}

/* Buffers may be reused once ckptio_writer_flush returns: sources are overwritten (or
 * unmapped) after flush, and the checkpoint holds what they held at add time. */
static int test_flush_reuse(void)
{
    T_SEED(0xF1B5);
    const uint64_t na = 4 * MiB, nm = 3 * MiB + 5, nc = 2 * MiB;
    unsigned char *a = t_alloc(na), *mraw = malloc(nm + 1), *c = t_alloc(nc);
    unsigned char *a0 = malloc(na), *m0 = malloc(nm), *c0 = malloc(nc), *a1 = malloc(na),
                  *m1 = malloc(nm);
    CHECK(a && mraw && c && a0 && m0 && c0 && a1 && m1);
    unsigned char *m = mraw + 1;
    t_fill(a, na, seed), t_fill(m, nm, seed + 1), t_fill(c, nc, seed + 2);
    memcpy(a0, a, na), memcpy(m0, m, nm), memcpy(c0, c, nc);
    uint64_t sa[1] = {na}, sm[1] = {nm}, sc[1] = {nc};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a0", CKPTIO_DT_U8, 1, sa, NULL, NULL, a, na));
    CHECK_OK(ckptio_writer_add(w, "m0", CKPTIO_DT_U8, 1, sm, NULL, NULL, m, nm));
    CHECK_OK(ckptio_writer_add(w, "c0", CKPTIO_DT_U8, 1, sc, NULL, NULL, c, nc));
    CHECK_OK(ckptio_writer_flush(w));
    t_fill(a, na, seed + 3), t_fill(m, nm, seed + 4);
    t_free(c, nc);
    memcpy(a1, a, na), memcpy(m1, m, nm);
    CHECK_OK(ckptio_writer_add(w, "a1", CKPTIO_DT_U8, 1, sa, NULL, NULL, a, na));
    CHECK_OK(ckptio_writer_add(w, "m1", CKPTIO_DT_U8, 1, sm, NULL, NULL, m, nm));
    CHECK_OK(ckptio_writer_flush(w));
    memset(a, 0, na), memset(m, 0, nm);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    if (load_cmp(r, "a0", a0, na) || load_cmp(r, "m0", m0, nm) || load_cmp(r, "c0", c0, nc) ||
        load_cmp(r, "a1", a1, na) || load_cmp(r, "m1", m1, nm))
        return 1;
    ckptio_reader_close(r);
    t_free(a, na);
    free(mraw), free(a0), free(m0), free(c0), free(a1), free(m1);
    return 0;
}

/* A checkpoint where the file system refuses O_DIRECT: ramfs, which refuses it on every kernel
 * (tmpfs did before Linux 6.6 and no longer does), mounted in a private mount namespace. With
 * direct AUTO it works and reports no O_DIRECT; with direct ON (not the buffered backend) the
 * save fails with -EINVAL and leaves nothing, and the reader refuses too. */
static int test_odirect_refused(void)
{
    T_SEED(0x7F5);
    const char *mnt = t_path("ram");
    if (t_mount_ramfs(mnt) != 0) {
        printf("cannot mount a private ramfs here (%s): skipped\n", strerror(errno));
        return T_SKIP;
    }
    char dir[600], ck[700];
    snprintf(dir, sizeof dir, "%s", mnt);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    int refused = odirect_refused(dir);
    CHECKF(refused, "ramfs at %s accepted an O_DIRECT open", dir);
    int want = 0; /* the fallback: buffered I/O plus fsync */
    ckptio_stats ws, rs;
    int rc = roundtrip_params(ck, NULL, NULL, 2 * MiB + 4, seed, &ws, &rs);
    if (!rc)
        rc = check_stats(&ws, want, "writer on ramfs") || check_stats(&rs, want, "reader on ramfs");
    if (!rc) printf("stats.direct on ramfs: writer %d, reader %d\n", ws.direct, rs.direct);
    if (!rc && refused && strcmp(t_backend(), "buffered") != 0) {
        /* O_DIRECT demanded where the file system refuses it */
        ckptio_params p;
        ckptio_params_init(&p);
        p.direct = CKPTIO_ON;
        snprintf(ck, sizeof ck, "%s/ck_direct", dir);
        unsigned char *d = t_alloc(MiB);
        uint64_t shape[1] = {MiB};
        ckptio_writer *w = NULL;
        int r1 = ckptio_writer_open(&w, ck, &p), r2 = 0, r3 = 0;
        if (r1 >= 0) r2 = ckptio_writer_add(w, "x", CKPTIO_DT_U8, 1, shape, NULL, NULL, d, MiB);
        if (r1 >= 0 && r2 >= 0) r3 = ckptio_writer_commit(w);
        int first = r1 < 0 ? r1 : r2 < 0 ? r2 : r3;
        ckptio_writer_close(w);
        t_free(d, MiB);
        if (first != -EINVAL) {
            fprintf(stderr, "direct ON on ramfs: open %s, add %s, commit %s; expected -EINVAL\n",
                    ckptio_errname(r1), ckptio_errname(r2), ckptio_errname(r3));
            rc = 1;
        } else if (exists(ck) || count_entries(dir, "ck_direct.tmp") != 0) {
            fprintf(stderr, "direct ON on ramfs: failed save left files\n");
            rc = 1;
        }
        /* the reader, too, refuses direct ON there */
        ckptio_reader *r = NULL;
        snprintf(ck, sizeof ck, "%s/ck", dir);
        unsigned char *buf = t_alloc(4 * MiB);
        int o = ckptio_reader_open(&r, ck, &p);
        int rd = o < 0 ? o : ckptio_reader_read_tensor(r, "m", buf, 4 * MiB);
        ckptio_reader_close(r);
        t_free(buf, 4 * MiB);
        if (!rc && rd != -EINVAL) {
            fprintf(stderr, "reader with direct ON on ramfs: %s, expected -EINVAL\n",
                    ckptio_errname(rd));
            rc = 1;
        }
    }
    if (t_sh("rm -rf '%s'/*", dir) != 0) rc = 1;
    umount2(dir, MNT_DETACH);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Versions, ABI, threads                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Versions, alignment, and a params struct from an older header: fields past `size` are not
 * the caller's and must be ignored (here: overwrite stays off). */
static int test_versions_params_size(void)
{
    T_SEED(0x5123);
    CHECK(ckptio_version_number() == CKPTIO_VERSION_NUMBER);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", CKPTIO_VERSION_MAJOR, CKPTIO_VERSION_MINOR,
             CKPTIO_VERSION_PATCH);
    CHECKF(t_contains(ckptio_version_string(), v), "version string '%s'",
           ckptio_version_string());
    CHECK(ckptio_format_version() == CKPTIO_FORMAT_VERSION);
    size_t al = ckptio_alignment();
    CHECKF(al >= 512 && (al & (al - 1)) == 0, "alignment %zu", al);
    CHECK(!strcmp(ckptio_errname(0), "OK") && ckptio_strerror(0)[0]);

    unsigned char d[100];
    t_fill(d, sizeof d, seed);
    uint64_t shape[1] = {sizeof d};
    CHECK_OK(save1(t_path("ck"), "a", CKPTIO_DT_U8, 1, shape, d, sizeof d, NULL));
    ckptio_params p;
    ckptio_params_init(&p);
    CHECK(p.size == sizeof p);
    p.size = (uint32_t)offsetof(ckptio_params, overwrite); /* a header without `overwrite` */
    p.overwrite = CKPTIO_ON;                               /* not the caller's: ignored */
    ckptio_writer *w = (ckptio_writer *)&w;
    CHECK_FAIL(ckptio_writer_open(&w, t_path("ck"), &p), CKPTIO_E_EXISTS, NULL);
    CHECK(w == NULL);
    p.size = sizeof p;
    CHECK_OK(save1(t_path("ck"), "b", CKPTIO_DT_U8, 1, shape, d, sizeof d, &p));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_find(r, "b") >= 0 && ckptio_reader_find(r, "a") == CKPTIO_E_NOT_FOUND);
    ckptio_reader_close(r);
    return 0;
}

typedef struct qarg {
    ckptio_reader *r;
    const char *missing; /* t_path() is not thread-safe: computed up front */
    int bad;
    char own_error[256];
} qarg;

/* Query functions from another thread while the main thread reads; a failing call there
 * sets that thread's last error only. */
static void *query_thread(void *arg)
{
    qarg *q = arg;
    for (int it = 0; it < 2000 && !q->bad; it++) {
        size_t n = ckptio_reader_num_tensors(q->r);
        for (size_t i = 0; i < n; i++) {
            ckptio_tensor_info ti = {.size = sizeof ti};
            ckptio_chunk_info ci;
            if (ckptio_reader_tensor(q->r, i, &ti) < 0 ||
                ckptio_reader_find(q->r, ti.name) != (int64_t)i ||
                ckptio_reader_chunk(q->r, i, 0, &ci) < 0 || ci.nbytes != ti.nbytes)
                q->bad = 1;
        }
        const void *v;
        size_t len;
        if (ckptio_reader_get_meta(q->r, "k", &v, &len) < 0 || len != 5) q->bad = 2;
    }
    /* a failing call on a fresh reader of this thread */
    ckptio_reader *r2 = NULL;
    if (ckptio_reader_open(&r2, q->missing, NULL) != -ENOENT) q->bad = 3;
    snprintf(q->own_error, sizeof q->own_error, "%s", ckptio_last_error());
    return NULL;
}

static int test_reader_threads(void)
{
    T_SEED(0x7EAD);
    const uint64_t n = 4 * MiB;
    unsigned char *a = malloc(n), *b = malloc(n);
    CHECK(a && b);
    t_fill(a, n, seed);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (int i = 0; i < 16; i++) {
        char name[32];
        uint64_t shape[1] = {n / 16};
        snprintf(name, sizeof name, "t%02d", i);
        CHECK_OK(ckptio_writer_add(w, name, CKPTIO_DT_U8, 1, shape, NULL, NULL, a + i * (n / 16),
                                   n / 16));
    }
    CHECK_OK(ckptio_writer_set_meta(w, "k", "value", 5));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    /* a failure of this thread, whose message must survive the other thread's failures */
    CHECK_FAIL(ckptio_reader_read_tensor(r, "missing_here", b, n), CKPTIO_E_NOT_FOUND,
               "missing_here");
    qarg q[3];
    pthread_t th[3];
    char missing[4200];
    snprintf(missing, sizeof missing, "%s", t_path("no-such-checkpoint"));
    for (int i = 0; i < 3; i++) {
        q[i] = (qarg){.r = r, .missing = missing};
        CHECK(pthread_create(&th[i], NULL, query_thread, &q[i]) == 0);
    }
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < 16; i++) {
            char name[32];
            snprintf(name, sizeof name, "t%02d", i);
            CHECK_OK(ckptio_reader_read_tensor(r, name, b + i * (n / 16), n / 16));
        }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(!memcmp(a, b, n));
    for (int i = 0; i < 3; i++) {
        CHECKF(!q[i].bad, "query thread %d failed (%d)", i, q[i].bad);
        CHECKF(t_contains(q[i].own_error, "no-such-checkpoint"), "thread %d last error: %s", i,
               q[i].own_error);
    }
    ckptio_reader_close(r);
    free(a), free(b);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

/* The structs that may grow (issue 9): a size of 0 or below the first version is refused and
 * the message says what to set; a CUDA destination is not supported yet; a caller built
 * against a newer header (larger structs) is read with its own stride and filled only as far
 * as this library's struct goes. */
static int test_sized_structs(void)
{
    const uint64_t n = 3 * 4096 + 5, one = 1;
    unsigned char *a = t_alloc(n), *b = t_alloc(n), *got = t_alloc(2 * n);
    CHECK(a && b && got);
    t_fill(a, n, 71);
    t_fill(b, n, 72);
    const char *ck = t_path("ck");
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, ck, NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, &n, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, &n, NULL, NULL, b, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, NULL));

    ckptio_region reg = {.name = "a", .dst = got, .capacity = n};
    CHECK_FAIL(ckptio_reader_read(r, &reg, 1), CKPTIO_E_USAGE, "sizeof(ckptio_region)");
    reg.size = sizeof(uint32_t);
    CHECK_FAIL(ckptio_reader_read(r, &reg, 1), CKPTIO_E_USAGE, "sizeof(ckptio_region)");
    reg.size = sizeof reg;
    reg.memory = CKPTIO_MEM_CUDA;
    CHECK_FAIL(ckptio_reader_read(r, &reg, 1), CKPTIO_E_UNSUPPORTED, "GPU");
    reg.memory = 7;
    CHECK_FAIL(ckptio_reader_read(r, &reg, 1), CKPTIO_E_USAGE, "memory kind");
    reg.memory = CKPTIO_MEM_HOST;
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    CHECK(!memcmp(got, a, n));

    /* A newer caller's array: fields past ours are ignored, the stride is its size. */
    struct {
        ckptio_region reg;
        uint64_t later[3];
    } big[2];
    memset(big, 0x5a, sizeof big);
    big[0].reg = (ckptio_region){.size = sizeof big[0], .name = "b", .dst = got, .capacity = n};
    big[1].reg = (ckptio_region){.size = sizeof big[0], .name = "a", .dst = got + n,
                                 .capacity = n};
    memset(got, 0, 2 * n);
    CHECK_OK(ckptio_reader_read(r, &big[0].reg, 2));
    CHECK(!memcmp(got, b, n) && !memcmp(got + n, a, n));
    big[1].reg.size = sizeof(ckptio_region);
    CHECK_FAIL(ckptio_reader_read(r, &big[0].reg, 2), CKPTIO_E_USAGE, "element 1");

    ckptio_tensor_info ti = {.size = 0};
    CHECK_FAIL(ckptio_reader_tensor(r, 0, &ti), CKPTIO_E_USAGE, "sizeof(ckptio_tensor_info)");
    struct {
        ckptio_tensor_info ti;
        uint64_t later;
    } bt;
    memset(&bt, 0x5a, sizeof bt);
    bt.ti.size = sizeof bt;
    CHECK_OK(ckptio_reader_tensor(r, 1, &bt.ti));
    CHECK(bt.ti.size == sizeof bt && !strcmp(bt.ti.name, "b") && bt.ti.nbytes == n);
    CHECK(bt.ti.ndim == 1 && bt.ti.shape[0] == n && bt.ti.num_chunks == one);
    CHECK(bt.later == 0x5a5a5a5a5a5a5a5aull); /* past what this library knows: untouched */
    ckptio_reader_close(r);

    char path[4200];
    snprintf(path, sizeof path, "%s/manifest", ck);
    ckptio_range rg = {.offset = 0, .len = 8, .dst = got};
    CHECK_FAIL(ckptio_file_read(path, &rg, 1, NULL, NULL), CKPTIO_E_USAGE, "sizeof(ckptio_range)");
    rg.size = sizeof rg;
    CHECK_OK(ckptio_file_read(path, &rg, 1, NULL, NULL));
    t_free(a, n);
    t_free(b, n);
    t_free(got, 2 * n);
    return 0;
}

const ckptio_test tests_api[] = {
    {"api_dtypes", test_dtypes, T_PER_BACKEND, 0},
    {"api_sizes", test_sizes, T_PER_BACKEND, 0},
    {"api_big", test_big, T_PER_BACKEND, 120},
    {"api_listing", test_listing, T_PER_BACKEND, 0},
    {"api_metadata", test_metadata, T_PER_BACKEND, 0},
    {"api_empty_checkpoint", test_empty_checkpoint, T_PER_BACKEND, 0},
    {"api_stats", test_stats, T_PER_BACKEND, 0},
    {"api_many_tiny", test_many_tiny, T_PER_BACKEND, 180},
    {"api_unicode_names", test_unicode_names, T_PER_BACKEND, 0},
    {"api_4gib", test_4gib, 0, 300},
    {"api_regions", test_regions, T_PER_BACKEND, 120},
    {"api_corrupt_flip", test_corrupt_flip, T_PER_BACKEND, 0},
    {"api_corrupt_truncated_data", test_corrupt_truncated_data, T_PER_BACKEND, 0},
    {"api_corrupt_manifest", test_corrupt_manifest, T_PER_BACKEND, 0},
    {"api_manifest_escape", test_manifest_escape, T_PER_BACKEND, 0},
    {"api_checksums_off", test_checksums_off, T_PER_BACKEND, 0},
    {"api_abort", test_abort, T_PER_BACKEND, 0},
    {"api_exists_overwrite", test_exists_overwrite, T_PER_BACKEND, 0},
    {"api_overwrite_fail", test_overwrite_fail, T_PER_BACKEND, 0},
    {"api_open_errors", test_open_errors, T_PER_BACKEND, 0},
    {"api_bad_writer_calls", test_bad_writer_calls, T_PER_BACKEND, 0},
    {"api_bad_reader_calls", test_bad_reader_calls, T_PER_BACKEND, 0},
    {"api_small_staging", test_small_staging, T_PER_BACKEND, 120},
    {"api_fsync_direct_off", test_fsync_direct_off, T_PER_BACKEND, 0},
    {"api_flush_reuse", test_flush_reuse, T_PER_BACKEND, 0},
    {"api_odirect_refused", test_odirect_refused, T_PER_BACKEND, 0},
    {"api_versions_params_size", test_versions_params_size, 0, 0},
    {"api_reader_threads", test_reader_threads, T_PER_BACKEND, 0},
    {"api_sized_structs", test_sized_structs, 0, 0},
    {0},
};
