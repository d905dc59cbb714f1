/* SPDX-License-Identifier: Apache-2.0 */
/* Read paths: page-cache residency, parallel verification, merged small reads. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/io/cache.h"
#include "../src/io/vfs.h"
#include "test.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

/* The first data file of checkpoint `ck` (ckptio writes one for a small checkpoint). */
static const char *data_file(const char *ck)
{
    static char p[4096];
    snprintf(p, sizeof p, "%s/data/000000.ckd", ck);
    return p;
}

/* Pages of [off, off + len) of `path` that are resident, and how many pages it has. */
static int resident_of(const char *path, uint64_t off, uint64_t len, uint64_t *res, uint64_t *pages)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    fstat(fd, &st);
    ckptio__cachefile cf = {.fd = fd, .size = (uint64_t)st.st_size};
    int rc = ckptio__cache_resident(&cf, off, len, res, pages);
    ckptio__cache_fini(&cf);
    close(fd);
    return rc;
}

/* Drop the file's clean pages from the cache (written-back first). */
static int evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    fdatasync(fd);
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

/* Make [off, off + len) resident with a buffered read (no further: readahead off). */
static int warm(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    char *buf = malloc(1 << 20);
    int rc = 0;
    for (uint64_t o = off; o < off + len && rc == 0;) {
        ssize_t n = pread(fd, buf, (size_t)CKPTIO__MIN(1ull << 20, off + len - o), (off_t)o);
        if (n < 0) rc = -1;
        if (n <= 0) break;
        o += (uint64_t)n;
    }
    free(buf);
    close(fd);
    return rc;
}

/* Save n 1-d uint8 tensors "t<i>" of sizes[i] bytes, filled from seed + i. */
static int save_tensors(const char *ck, size_t n, const uint64_t *sizes, unsigned char **data,
                        uint64_t seed)
{
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, ck, NULL));
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%05zu", i);
        t_fill(data[i], sizes[i], seed + i);
        CHECK_OK(ckptio_writer_add(w, name, CKPTIO_DT_U8, 1, &sizes[i], NULL, NULL, data[i],
                                   sizes[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    return 0;
}

static ckptio_params read_params(int cache, unsigned threads)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.cache = cache;
    p.verify_threads = threads;
    return p;
}

/* Read every tensor into fresh aligned memory and compare; *rs gets the read stats. */
static int load_check(const char *ck, const ckptio_params *p, size_t n, const uint64_t *sizes,
                      unsigned char **want, ckptio_read_stats *rs, ckptio_stats *st)
{
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, ck, p));
    unsigned char **got = calloc(n, sizeof *got);
    ckptio_region *reg = calloc(n, sizeof *reg);
    CHECK(got && reg);
    for (size_t i = 0; i < n; i++) {
        got[i] = t_alloc(sizes[i] + 4096);
        /* room to read whole pages in place, as the Python layer gives */
        reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .tensor = i, .dst = got[i],
                                 .capacity = (sizes[i] + 4095) / 4096 * 4096};
    }
    CHECK_OK(ckptio_reader_read(r, reg, n));
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got[i], want[i], sizes[i])) {
            fprintf(stderr, "tensor %zu differs\n", i);
            return 1;
        }
        t_free(got[i], sizes[i] + 4096);
    }
    if (rs) {
        *rs = (ckptio_read_stats){.size = sizeof *rs};
        CHECK_OK(ckptio_reader_read_stats(r, rs));
    }
    if (st) CHECK_OK(ckptio_reader_stats(r, st));
    free(got);
    free(reg);
    ckptio_reader_close(r);
    return 0;
}

/* One 24 MiB + 5 byte tensor (a tail that is not a whole block) and two small ones. */
#define PR_N 3
static const uint64_t pr_sizes[PR_N] = {24 * MiB + 5, 300 * KiB + 7, 4 * MiB};

/* A checkpoint ckptio just wrote is not in the page cache (O_DIRECT writes), a load from the
 * device leaves it out too; with half of the data file read through the cache, a load takes
 * that half from the cache and the rest from the device, bytes exact and stats split. */
static int partial_residency(int force_mincore)
{
    ckptio__cache_force_mincore = force_mincore;
    unsigned char *data[PR_N];
    for (int i = 0; i < PR_N; i++) data[i] = t_alloc(pr_sizes[i]);
    const char *ck = t_path("ck");
    if (save_tensors(ck, PR_N, pr_sizes, data, 11)) return 1;
    const char *df = data_file(ck);
    struct stat st;
    CHECK(stat(df, &st) == 0);
    uint64_t size = (uint64_t)st.st_size, res, pages, stored = 0;
    for (int i = 0; i < PR_N; i++) stored += pr_sizes[i];
    ckptio_params auto_p = read_params(CKPTIO_CACHE_AUTO, 0);
    ckptio_read_stats rs;
    ckptio_stats s;
    if (load_check(ck, &auto_p, PR_N, pr_sizes, data, &rs, &s)) return 1;
    if (!s.direct) { /* buffered backend or a file system refusing O_DIRECT: all through the cache */
        CHECK(rs.cache_bytes == 0);
        return 0;
    }
    CHECK_OK(resident_of(df, 0, size, &res, &pages));
    fprintf(stderr, "after save and a load: %llu of %llu pages resident\n",
            (unsigned long long)res, (unsigned long long)pages);
    CHECK(rs.cache_bytes == 0 && rs.device_bytes >= size / 2);
    CHECK(res * 8 < pages); /* not re-read into the cache by the load */
    /* now the first half through the cache */
    CHECK(evict(df) == 0);
    uint64_t half = size / 2 / 4096 * 4096;
    CHECK(warm(df, 0, half) == 0);
    CHECK_OK(resident_of(df, 0, half, &res, &pages));
    if (res != pages) {
        fprintf(stderr, "the page cache keeps %llu of %llu pages just read; skipping\n",
                (unsigned long long)res, (unsigned long long)pages);
        return T_SKIP;
    }
    if (load_check(ck, &auto_p, PR_N, pr_sizes, data, &rs, NULL)) return 1;
    fprintf(stderr, "half resident: cache %llu device %llu of %llu, %u threads\n",
            (unsigned long long)rs.cache_bytes, (unsigned long long)rs.device_bytes,
            (unsigned long long)size, rs.verify_threads);
    /* A page resident now was resident when the read was planned (an O_DIRECT read adds none,
     * the buffered one reads no ahead) or was copied after all, having been evicted in
     * between: its bytes came from the cache, but for granules (1 MiB) cut at the edges. The
     * page cache may drop pages meanwhile, so only what is resident after counts. */
    CHECK_OK(resident_of(df, 0, size, &res, &pages));
    CHECK(rs.cache_bytes + 3 * MiB >= res * 4096);
    CHECK(rs.device_bytes > 0 && rs.device_bytes + rs.cache_bytes >= stored);
    CHECK(rs.verify_threads >= 1);
    /* never: everything from the device, even what is resident */
    ckptio_params never = read_params(CKPTIO_CACHE_NEVER, 0);
    if (load_check(ck, &never, PR_N, pr_sizes, data, &rs, NULL)) return 1;
    CHECK(rs.cache_bytes == 0 && rs.device_bytes >= stored);
    /* CKPTIO_CACHE=never overrides the params */
    setenv("CKPTIO_CACHE", "never", 1);
    if (load_check(ck, &auto_p, PR_N, pr_sizes, data, &rs, NULL)) return 1;
    CHECK(rs.cache_bytes == 0);
    setenv("CKPTIO_CACHE", "bogus", 1);
    ckptio_reader *r;
    CHECK_ERR(ckptio_reader_open(&r, ck, &auto_p), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "CKPTIO_CACHE"));
    unsetenv("CKPTIO_CACHE");
    /* all resident: nothing from the device */
    CHECK(warm(df, 0, size) == 0);
    if (load_check(ck, &auto_p, PR_N, pr_sizes, data, &rs, NULL)) return 1;
    CHECK_OK(resident_of(df, 0, size, &res, &pages));
    if (res == pages) CHECK(rs.cache_bytes == stored && rs.device_bytes == 0);
    else fprintf(stderr, "%llu pages were evicted during the load\n",
                 (unsigned long long)(pages - res));
    for (int i = 0; i < PR_N; i++) t_free(data[i], pr_sizes[i]);
    return 0;
}

static int test_partial_residency(void)
{
    return partial_residency(0);
}

static int test_partial_residency_mincore(void)
{
    return partial_residency(1);
}

/* ---- pages evicted between the residency query and the read ---- */

static atomic_int evictions;
static ssize_t evicting_pread(int fd, void *buf, size_t n, off_t off)
{
    /* The first cached copy drops the whole file from the cache before it reads. */
    if (atomic_fetch_add(&evictions, 1) == 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    return pread(fd, buf, n, off);
}

static int test_evicted_mid_load(void)
{
    unsigned char *data[PR_N];
    for (int i = 0; i < PR_N; i++) data[i] = t_alloc(pr_sizes[i]);
    const char *ck = t_path("ck");
    if (save_tensors(ck, PR_N, pr_sizes, data, 23)) return 1;
    const char *df = data_file(ck);
    struct stat st;
    CHECK(stat(df, &st) == 0);
    CHECK(warm(df, 0, (uint64_t)st.st_size) == 0);
    ckptio__vfs v = ckptio__vfs_real;
    v.pread = evicting_pread;
    ckptio__vfs_set(&v);
    ckptio_params p = read_params(CKPTIO_CACHE_AUTO, 3);
    ckptio_read_stats rs;
    ckptio_stats s;
    int rc = load_check(ck, &p, PR_N, pr_sizes, data, &rs, &s);
    ckptio__vfs_set(NULL);
    if (rc) return rc;
    if (s.direct) CHECK(atomic_load(&evictions) > 0 && rs.cache_bytes > 0);
    uint64_t res, pages;
    CHECK_OK(resident_of(df, 0, (uint64_t)st.st_size, &res, &pages));
    fprintf(stderr, "evicted mid-load: %d cached copies, %llu of %llu pages resident after\n",
            atomic_load(&evictions), (unsigned long long)res, (unsigned long long)pages);
    for (int i = 0; i < PR_N; i++) t_free(data[i], pr_sizes[i]);
    return 0;
}

/* ---- deterministic checksum errors ---- */

/* Flip one byte at `off` of the file (buffered), then drop the file from the cache. */
static int damage(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    unsigned char b;
    if (pread(fd, &b, 1, (off_t)off) != 1) return -1;
    b ^= 0x5A;
    if (pwrite(fd, &b, 1, (off_t)off) != 1) return -1;
    close(fd);
    return evict(path);
}

/* Reads (psync's and the cached copies) that cover this file offset are held back, so that
 * they complete after the reads of the blocks behind them. */
static uint64_t slow_off = UINT64_MAX;
static ssize_t slow_pread(int fd, void *buf, size_t n, off_t off)
{
    if ((uint64_t)off <= slow_off && slow_off < (uint64_t)off + n) usleep(200 * 1000);
    return pread(fd, buf, n, off);
}

static int chunk_at(const char *ck, size_t tensor, uint64_t *off)
{
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, ck, NULL));
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, tensor, 0, &ci));
    *off = ci.file_offset;
    ckptio_reader_close(r);
    return 0;
}

/* Three damaged blocks in three tensors, the first one's read held back: every load, whatever
 * the threads, the cache state or the order of completions, names the first one in the file (tensor t00001, its block at
 * 2 MiB) with the same message; verify does too, counting all three chunks. */
static int test_checksum_deterministic(void)
{
#define CD_N 6
    const uint64_t sizes[CD_N] = {3 * MiB, 9 * MiB + 3, 2 * MiB, 5 * MiB, 700 * KiB, 6 * MiB};
    unsigned char *data[CD_N];
    for (int i = 0; i < CD_N; i++) data[i] = t_alloc(sizes[i]);
    const char *ck = t_path("ck");
    if (save_tensors(ck, CD_N, sizes, data, 31)) return 1;
    const char *df = data_file(ck);
    uint64_t o1, o3, o5;
    if (chunk_at(ck, 1, &o1) || chunk_at(ck, 3, &o3) || chunk_at(ck, 5, &o5)) return 1;
    CHECK(damage(df, o5 + 10) == 0);
    CHECK(damage(df, o1 + 2 * MiB + 77) == 0);
    CHECK(damage(df, o3 + 4 * MiB + 1) == 0);
    char want[64];
    snprintf(want, sizeof want, "at offset %llu of", (unsigned long long)(o1 + 2 * MiB));
    char first[1024] = "";
    slow_off = o1 + 2 * MiB + 77;
    ckptio__vfs v = ckptio__vfs_real;
    v.pread = slow_pread;
    ckptio__vfs_set(&v);
    /* (cache mode, threads, what to make resident first: 0 none, 1 all, 2 from tensor 3 on) */
    const int runs[][3] = {{CKPTIO_CACHE_NEVER, 1, 0}, {CKPTIO_CACHE_NEVER, 4, 0},
                           {CKPTIO_CACHE_AUTO, 4, 1},  {CKPTIO_CACHE_AUTO, 1, 1},
                           {CKPTIO_CACHE_AUTO, 3, 2},  {CKPTIO_CACHE_NEVER, 2, 0},
                           {CKPTIO_CACHE_AUTO, 2, 2}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        CHECK(evict(df) == 0);
        struct stat st;
        CHECK(stat(df, &st) == 0);
        if (runs[k][2] == 1) CHECK(warm(df, 0, (uint64_t)st.st_size) == 0);
        if (runs[k][2] == 2) CHECK(warm(df, o3, (uint64_t)st.st_size - o3) == 0);
        ckptio_params p = read_params(runs[k][0], (unsigned)runs[k][1]);
        p.queue_depth = 8;
        p.request_bytes = 1 * MiB; /* many requests in flight, completing in any order */
        ckptio_reader *r;
        CHECK_OK(ckptio_reader_open(&r, ck, &p));
        ckptio_region reg[CD_N];
        unsigned char *got[CD_N];
        for (size_t i = 0; i < CD_N; i++) {
            got[i] = t_alloc(sizes[i]);
            reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .tensor = i, .dst = got[i],
                                     .capacity = sizes[i]};
        }
        CHECK_ERR(ckptio_reader_read(r, reg, CD_N), CKPTIO_E_CHECKSUM);
        const char *msg = ckptio_reader_errmsg(r);
        fprintf(stderr, "run %zu: %s\n", k, msg);
        CHECK(t_contains(msg, "'t00001'") && t_contains(msg, want) &&
              t_contains(msg, "000000.ckd"));
        if (!k) snprintf(first, sizeof first, "%s", msg);
        CHECK(!strcmp(first, msg));
        uint64_t bad = 0;
        CHECK_ERR(ckptio_reader_verify(r, &bad), CKPTIO_E_CHECKSUM);
        CHECK(bad == 3);
        CHECK(t_contains(ckptio_reader_errmsg(r), want));
        for (size_t i = 0; i < CD_N; i++) t_free(got[i], sizes[i]);
        ckptio_reader_close(r);
    }
    ckptio__vfs_set(NULL);
    for (int i = 0; i < CD_N; i++) t_free(data[i], sizes[i]);
    return 0;
}

/* ---- many small tensors, merged reads ---- */

/* 600 tensors of odd sizes (16 KiB to 256 KiB, most not a multiple of 512) read into aligned
 * memory: the small in-place reads are merged into shared requests, bytes exact, from the
 * device and from the cache; then sub-boxes at odd offsets of a 2-d tensor. */
static int test_merged_reads(void)
{
#define MR_N 600
    uint64_t *sizes = calloc(MR_N, sizeof *sizes);
    unsigned char **data = calloc(MR_N, sizeof *data);
    CHECK(sizes && data);
    uint64_t total = 0;
    for (size_t i = 0; i < MR_N; i++) {
        sizes[i] = 16 * KiB + (i * 7919 * 37) % (240 * KiB);
        if (i % 3 == 0) sizes[i] = sizes[i] / 4096 * 4096; /* some whole pages */
        data[i] = t_alloc(sizes[i]);
        total += sizes[i];
    }
    const char *ck = t_path("ck");
    if (save_tensors(ck, MR_N, sizes, data, 47)) return 1;
    ckptio_params never = read_params(CKPTIO_CACHE_NEVER, 2);
    ckptio_read_stats rs;
    ckptio_stats s;
    if (load_check(ck, &never, MR_N, sizes, data, &rs, &s)) return 1;
    fprintf(stderr, "%d tensors, %llu bytes: %llu requests, %llu merged\n", MR_N,
            (unsigned long long)total, (unsigned long long)rs.requests,
            (unsigned long long)rs.merged);
    if (s.direct) CHECK(rs.merged > MR_N / 2 && rs.requests < MR_N / 4);
    CHECK(warm(data_file(ck), 0, total + MR_N * 4096) == 0);
    ckptio_params p = read_params(CKPTIO_CACHE_AUTO, 2);
    if (load_check(ck, &p, MR_N, sizes, data, &rs, NULL)) return 1;

    /* a 2-d tensor of 1000 x 1037 bytes, read as boxes at odd offsets */
    ckptio_writer *w;
    const uint64_t shape[2] = {1000, 1037};
    unsigned char *m = t_alloc(1000 * 1037);
    t_fill(m, 1000 * 1037, 5);
    CHECK_OK(ckptio_writer_open(&w, t_path("ck2"), NULL));
    CHECK_OK(ckptio_writer_add(w, "m", CKPTIO_DT_U8, 2, shape, NULL, NULL, m, 1000 * 1037));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    for (int pass = 0; pass < 2; pass++) {
        ckptio_params q = read_params(pass ? CKPTIO_CACHE_AUTO : CKPTIO_CACHE_NEVER, 2);
        if (pass) CHECK(warm(data_file(t_path("ck2")), 0, 1000 * 1037) == 0);
        ckptio_reader *r;
        CHECK_OK(ckptio_reader_open(&r, t_path("ck2"), &q));
        const uint64_t boxes[][4] = {{3, 5, 17, 1001}, {0, 0, 1000, 1037}, {999, 1036, 1, 1},
                                     {101, 0, 333, 1037}, {7, 511, 900, 3}};
        for (size_t b = 0; b < sizeof boxes / sizeof boxes[0]; b++) {
            const uint64_t *bx = boxes[b];
            uint64_t n = bx[2] * bx[3];
            unsigned char *got = t_alloc(n + 4096);
            ckptio_region reg = {.size = sizeof reg, .name = "m", .offset = bx, .shape = bx + 2,
                                 .dst = got + (b & 1), .capacity = n};
            CHECK_OK(ckptio_reader_read(r, &reg, 1));
            for (uint64_t i = 0; i < bx[2]; i++)
                CHECK(!memcmp(got + (b & 1) + i * bx[3], m + (bx[0] + i) * 1037 + bx[1], bx[3]));
            t_free(got, n + 4096);
        }
        ckptio_reader_close(r);
    }
    t_free(m, 1000 * 1037);
    for (size_t i = 0; i < MR_N; i++) t_free(data[i], sizes[i]);
    free(sizes);
    free(data);
    return 0;
}

/* A foreign file read with ckptio_file_read, resident in part: exact bytes. */
static int test_file_read_cached(void)
{
    const uint64_t len = 5 * MiB + 123;
    unsigned char *want = t_alloc(len), *got = t_alloc(len + 4096);
    t_fill(want, len, 77);
    const char *path = t_path("f.bin");
    CHECK(t_write_file(path, want, len) == 0);
    CHECK(evict(path) == 0);
    CHECK(warm(path, 1 * MiB, 2 * MiB) == 0);
    ckptio_range rg[3] = {{.size = sizeof(ckptio_range), .offset = 0, .len = 3 * MiB, .dst = got},
                          {.size = sizeof(ckptio_range), .offset = 3 * MiB + 1,
                           .len = len - 3 * MiB - 1, .dst = got + 3 * MiB + 1},
                          {.size = sizeof(ckptio_range), .offset = 3 * MiB, .len = 1,
                           .dst = got + 3 * MiB}};
    ckptio_params p = read_params(CKPTIO_CACHE_AUTO, 2);
    ckptio_stats st;
    CHECK_OK(ckptio_file_read(path, rg, 3, &p, &st));
    CHECK(!memcmp(got, want, len));
    t_free(want, len);
    t_free(got, len + 4096);
    return 0;
}

/* Memory the reader chooses: a block of its own, aligned, for a region of 4 KiB or more (its
 * capacity rounded up), 64-byte-aligned places in a shared slab for smaller ones, none for an
 * empty region; reading into them returns the bytes. A bad region is refused, nothing kept. */
static int test_place(void)
{
    enum { PN = 5 };
    uint64_t sizes[PN] = {5000, 100, 0, 3000, 1 * MiB};
    unsigned char *data[PN];
    for (size_t i = 0; i < PN; i++) data[i] = t_alloc(sizes[i] ? sizes[i] : 1);
    const char *ck = t_path("ck");
    if (save_tensors(ck, PN, sizes, data, 31)) return 1;
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, ck, NULL));
    ckptio_region reg[PN];
    ckptio_landing land[PN] = {{.size = sizeof(ckptio_landing)}};
    for (size_t i = 0; i < PN; i++) reg[i] = (ckptio_region){.size = sizeof reg[0], .tensor = i};
    ckptio_block *blocks;
    size_t nb;
    CHECK_OK(ckptio_reader_place(r, reg, PN, land, &blocks, &nb));
    CHECK(nb == 3); /* two own blocks, one slab */
    uint64_t a = ckptio_alignment();
    CHECK(land[2].block == CKPTIO_NO_BLOCK);
    CHECK(land[1].block == land[3].block && land[1].at % 64 == 0 && land[3].at % 64 == 0);
    CHECK(land[3].at >= land[1].at + 100);
    for (size_t i = 0; i < PN; i += 4) {
        CHECK(land[i].block != land[1].block && land[i].at == 0 && land[i].lead == 0);
        CHECK(land[i].capacity == (sizes[i] + a - 1) / a * a);
        CHECK((uintptr_t)blocks[land[i].block].base % a == 0);
    }
    for (size_t i = 0; i < PN; i++) {
        if (land[i].block == CKPTIO_NO_BLOCK) continue;
        reg[i].dst = (uint8_t *)blocks[land[i].block].base + land[i].at;
        reg[i].capacity = land[i].capacity;
        reg[i].lead = land[i].lead;
    }
    CHECK_OK(ckptio_reader_read(r, reg, PN));
    for (size_t i = 0; i < PN; i++)
        if (sizes[i]) CHECK(!memcmp(reg[i].dst, data[i], sizes[i]));
    for (size_t b = 0; b < nb; b++) ckptio_block_free(blocks[b].base);
    free(blocks);
    uint64_t past[1] = {200};
    reg[1].shape = past;
    CHECK_ERR(ckptio_reader_place(r, reg, PN, land, &blocks, &nb), CKPTIO_E_RANGE);
    CHECK(nb == 0 && !blocks);
    ckptio_reader_close(r);
    for (size_t i = 0; i < PN; i++) t_free(data[i], sizes[i] ? sizes[i] : 1);
    return 0;
}

/* The same choice for byte ranges of any file: a block of its own for 4 KiB or more, with
 * the lead that puts its first byte where the file has it in its page (so a direct read lands
 * in place), slab places for smaller ones; ckptio_file_read into them returns the bytes. */
static int test_file_place(void)
{
    enum { PN = 4 };
    const size_t len = 2 * MiB;
    unsigned char *want = t_alloc(len);
    t_fill(want, len, 41);
    const char *path = t_path("f");
    CHECK(t_write_file(path, want, len) == 0);
    uint64_t off[PN] = {100, 8192, 5000, 4096 * 3 + 64}, n[PN] = {3000, 0, 64, 700000};
    ckptio_range rg[PN];
    for (size_t i = 0; i < PN; i++)
        rg[i] = (ckptio_range){.size = sizeof rg[0], .offset = off[i], .len = n[i]};
    ckptio_landing land[PN] = {{.size = sizeof(ckptio_landing)}};
    ckptio_block *blocks;
    size_t nb;
    CHECK_OK(ckptio_file_place(rg, PN, land, &blocks, &nb));
    CHECK(nb == 2); /* one slab (3000 and 64 bytes), one block of its own */
    CHECK(land[1].block == CKPTIO_NO_BLOCK);
    CHECK(land[0].block == land[2].block && land[2].at % 64 == 0 && land[2].at >= 3000);
    CHECK(land[3].block != land[0].block && land[3].lead == 64 && land[3].at == 64);
    CHECK(land[3].capacity >= n[3] && (land[3].at + land[3].capacity) % ckptio_alignment() == 0);
    for (size_t i = 0; i < PN; i++)
        if (land[i].block != CKPTIO_NO_BLOCK)
            rg[i].dst = (uint8_t *)blocks[land[i].block].base + land[i].at;
    CHECK_OK(ckptio_file_read(path, rg, PN, NULL, NULL));
    for (size_t i = 0; i < PN; i++)
        if (n[i]) CHECK(!memcmp(rg[i].dst, want + off[i], n[i]));
    for (size_t b = 0; b < nb; b++) ckptio_block_free(blocks[b].base);
    free(blocks);
    land[0].size = 4;
    CHECK_ERR(ckptio_file_place(rg, PN, land, &blocks, &nb), CKPTIO_E_USAGE);
    CHECK(nb == 0 && !blocks);
    t_free(want, len);
    return 0;
}

/* Read every tensor of `ck` shared as reader (index, count); the parts must come in rotation
 * from part `index`, cover every region once, and the bytes must match. */
static int shared_check(const char *ck, size_t n, const uint64_t *sizes, unsigned char **want,
                        uint32_t index, uint32_t count, uint32_t rounds, const size_t *first_part)
{
    ckptio_params p = read_params(CKPTIO_CACHE_AUTO, 2);
    p.direct = CKPTIO_OFF;
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, ck, &p));
    unsigned char **got = calloc(n, sizeof *got);
    ckptio_region *reg = calloc(n, sizeof *reg);
    unsigned *seen = calloc(n, sizeof *seen);
    CHECK(got && reg && seen);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        got[i] = t_alloc(sizes[i]);
        reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .tensor = i, .dst = got[i],
                                 .capacity = sizes[i]};
        total += sizes[i];
    }
    ckptio_share_part parts[64];
    ckptio_share sh = {.size = sizeof sh, .index = index, .count = count, .parts = parts,
                       .parts_cap = 64};
    CHECK_OK(ckptio_reader_read_shared(r, reg, n, &sh));
    CHECK(sh.rounds == rounds && sh.n_parts == (uint64_t)count * rounds);
    CHECK(sh.start == total * index / sh.n_parts);
    uint64_t bytes = 0;
    for (uint64_t j = 0; j < sh.n_parts; j++) {
        for (uint64_t x = parts[j].first; x < parts[j].first + parts[j].count; x++) seen[x]++;
        bytes += parts[j].bytes;
        /* each part starts where the one before it, in file order, ended */
        const ckptio_share_part *next = &parts[(j + 1) % sh.n_parts];
        if (j + 1 < sh.n_parts && (index + j + 1) % sh.n_parts != 0)
            CHECK(next->first == parts[j].first + parts[j].count);
    }
    CHECK(bytes == total);
    for (size_t i = 0; i < n; i++) {
        CHECK(seen[i] == 1);
        CHECK(!memcmp(got[i], want[i], sizes[i]));
        t_free(got[i], sizes[i]);
    }
    /* the first part read is this reader's own */
    for (size_t i = 0; first_part[i] != SIZE_MAX; i++)
        CHECK(parts[0].first + i == first_part[i] && i < parts[0].count);
    free(got);
    free(reg);
    free(seen);
    ckptio_reader_close(r);
    return 0;
}

/* A load shared by 4 readers: ten tensors of 100 bytes are four parts of 250 bytes (a tensor
 * goes with its first byte), and reader i starts at part i, then wraps around; 64 MiB read by
 * one reader is two rounds of two parts. Bad shares are refused before anything is read. */
static int test_shared_rotation(void)
{
    uint64_t sizes[10];
    unsigned char *data[10];
    for (size_t i = 0; i < 10; i++) {
        sizes[i] = 100;
        data[i] = t_alloc(100);
    }
    const char *ck = t_path("ck");
    if (save_tensors(ck, 10, sizes, data, 3)) return 1;
    static const size_t firsts[4][4] = {
        {0, 1, 2, SIZE_MAX}, {3, 4, SIZE_MAX}, {5, 6, 7, SIZE_MAX}, {8, 9, SIZE_MAX}};
    for (uint32_t i = 0; i < 4; i++)
        if (shared_check(ck, 10, sizes, data, i, 4, 1, firsts[i])) return 1;

    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, ck, NULL));
    unsigned char buf[100];
    ckptio_region reg = {.size = sizeof reg, .tensor = 0, .dst = buf, .capacity = 100};
    ckptio_share sh = {.size = sizeof sh, .index = 4, .count = 4};
    CHECK_ERR(ckptio_reader_read_shared(r, &reg, 1, &sh), CKPTIO_E_USAGE);
    sh.index = 0;
    reg.capacity = 99;
    CHECK_ERR(ckptio_reader_read_shared(r, &reg, 1, &sh), CKPTIO_E_BUFFER);
    CHECK(sh.n_parts == 0); /* refused before the parts were cut */
    ckptio_reader_close(r);

    uint64_t big[8];
    unsigned char *bdata[8];
    for (size_t i = 0; i < 8; i++) {
        big[i] = 8 * MiB + 64 * i;
        bdata[i] = t_alloc(big[i]);
    }
    const char *ck2 = t_path("ck2");
    if (save_tensors(ck2, 8, big, bdata, 9)) return 1;
    static const size_t own[] = {0, 1, 2, 3, SIZE_MAX};
    if (shared_check(ck2, 8, big, bdata, 0, 1, 2, own)) return 1;
    for (size_t i = 0; i < 8; i++) t_free(bdata[i], big[i]);
    for (size_t i = 0; i < 10; i++) t_free(data[i], 100);
    return 0;
}

const ckptio_test tests_reads[] = {
    {"reads/partial_residency", test_partial_residency, T_PER_BACKEND, 120},
    {"reads/partial_residency_mincore", test_partial_residency_mincore, 0, 120},
    {"reads/evicted_mid_load", test_evicted_mid_load, T_PER_BACKEND, 120},
    {"reads/checksum_deterministic", test_checksum_deterministic, T_PER_BACKEND, 180},
    {"reads/merged_reads", test_merged_reads, T_PER_BACKEND, 180},
    {"reads/file_read_cached", test_file_read_cached, T_PER_BACKEND, 60},
    {"reads/shared_rotation", test_shared_rotation, T_PER_BACKEND, 120},
    {"reads/place", test_place, 0, 60},
    {"reads/file-place", test_file_place, 0, 60},
    {0},
};
