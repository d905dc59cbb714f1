/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the single-file writer's two ways to write: aligned runs straight from the caller's
 * memory, everything else through staging. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* The source of the write in progress, watched by the vfs hook below: writes whose buffer lies
 * inside it were written in place, and none of them may complete after the call returned. */
static struct {
    const unsigned char *src;
    size_t len;
    int returned;
    unsigned placed, late;
    uint64_t fail_from; /* fail (EIO) the first in-place write at or past this file offset */
    int fail_at_all, failed;
} W;

static void watch_done(ckptio__req *r)
{
    const unsigned char *b = r->buf;
    if (r->op != CKPTIO__OP_WRITE || !W.src || b < W.src || b >= W.src + W.len) return;
    __atomic_add_fetch(&W.placed, 1, __ATOMIC_SEQ_CST);
    if (W.returned) __atomic_add_fetch(&W.late, 1, __ATOMIC_SEQ_CST);
    if (W.fail_at_all && !W.failed && r->off >= W.fail_from && r->res >= 0) {
        W.failed = 1;
        r->res = -EIO;
    }
}

static ckptio__vfs watch_vfs;

static void watch_on(void)
{
    memset(&W, 0, sizeof W);
    watch_vfs = ckptio__vfs_real;
    watch_vfs.req_done = watch_done;
    ckptio__vfs_set(&watch_vfs);
}

/* Write src[0, n) watched; afterwards scribble over it, as a caller reusing its buffer would. */
static int watched_write(ckptio_file_writer *f, unsigned char *src, size_t n)
{
    W.src = src;
    W.len = n;
    W.returned = 0;
    int rc = ckptio_file_writer_write(f, src, n);
    W.returned = 1;
    memset(src, 0xEE, n);
    return rc;
}

static ckptio_params small_requests(void)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    p.request_bytes = MiB; /* runs of a few MiB take the in-place path */
    p.staging_bytes = 4 * MiB;
    return p;
}

/* Aligned and unaligned sources, lengths and file offsets mixed: the file holds exactly the
 * bytes given, each source is overwritten as soon as its call returns, aligned runs at aligned
 * offsets were written from the caller's memory, and no such write outlived its call. */
static int test_mix(void)
{
    /* (offset of the source in an aligned buffer, length) */
    static const struct { size_t at, n; } steps[] = {
        {0, 6 * MiB},               /* aligned at 0: in place, its last MiB staged */
        {0, 17},                    /* the end of file is now unaligned... */
        {0, 4 * MiB},               /* ...so an aligned source is staged */
        {0, 4096 - 17},             /* back to aligned */
        {0, 3 * MiB + 100},         /* in place, an unaligned length */
        {0, 4096 - 100},
        {1, 5 * MiB},               /* unaligned source at an aligned offset: staged */
        {0, 0},
        {4096, MiB + 256 * KiB},    /* just long enough for in place */
        {0, MiB + 256 * KiB - 4096}, /* just too short */
        {0, 2 * MiB},
    };
    size_t total = 0, nsteps = sizeof steps / sizeof steps[0];
    for (size_t i = 0; i < nsteps; i++) total += steps[i].n;
    unsigned char *want = malloc(total);
    unsigned char *buf = t_alloc(8 * MiB);
    CHECK(want && buf);
    t_fill(want, total, 42);
    watch_on();
    ckptio_params p = small_requests();
    ckptio_file_writer *f = NULL;
    CHECK_OK(ckptio_file_writer_open(&f, "out.bin", &p));
    size_t at = 0;
    unsigned placed_runs = 0;
    for (size_t i = 0; i < nsteps; i++) {
        unsigned char *src = buf + steps[i].at;
        memcpy(src, want + at, steps[i].n);
        unsigned before = W.placed;
        CHECK_OK(watched_write(f, src, steps[i].n));
        at += steps[i].n;
        CHECK(ckptio_file_writer_tell(f) == at);
        placed_runs += W.placed > before;
    }
    CHECK_OK(ckptio_file_writer_commit(f));
    ckptio__vfs_set(NULL);
    ckptio_stats st;
    CHECK_OK(ckptio_file_writer_stats(f, &st));
    ckptio_file_writer_close(f);
    printf("in-place writes %u in %u runs, late %u; io_bytes %llu of %zu\n", W.placed,
           placed_runs, W.late, (unsigned long long)st.io_bytes, total);
    CHECK(W.late == 0);
    CHECK(placed_runs == 4); /* steps 0, 4, 8 and 10 */
    CHECK(st.bytes == total && st.io_bytes >= total && st.io_bytes < total + 64 * KiB);
    unsigned char *got = NULL;
    CHECK(t_read_file("out.bin", &got) == (long)total);
    CHECK(!memcmp(got, want, total));
    free(got);
    free(want);
    t_free(buf, 8 * MiB);
    return 0;
}

/* One in-place write of a run fails: the call itself reports it (it waited for its writes),
 * naming the file and the offset; no write from the source completes after the return; the
 * writer stays failed, nothing is published, and the temporary file goes with close. */
static int test_fail_mid_run(void)
{
    size_t n = 12 * MiB;
    unsigned char *src = t_alloc(n);
    CHECK(src);
    t_fill(src, n, 7);
    watch_on();
    W.fail_at_all = 1;
    W.fail_from = 5 * MiB;
    ckptio_params p = small_requests();
    ckptio_file_writer *f = NULL;
    CHECK_OK(ckptio_file_writer_open(&f, "out.bin", &p));
    CHECK_OK(ckptio_file_writer_write(f, "hdr", 3));
    CHECK_OK(ckptio_file_writer_write(f, (const char[4093]){0}, 4093));
    int rc = watched_write(f, src, n);
    const char *msg = ckptio_file_writer_errmsg(f);
    fprintf(stderr, "write: %d %s\n", rc, msg);
    CHECK(W.failed);
    CHECK(rc == -EIO);
    CHECK(W.late == 0);
    CHECK(t_contains(msg, "out.bin") && t_contains(msg, "offset"));
    CHECK_ERR(ckptio_file_writer_write(f, "x", 1), -EIO);
    CHECK(ckptio_file_writer_commit(f) < 0);
    ckptio_file_writer_close(f);
    ckptio__vfs_set(NULL);
    CHECK(access("out.bin", F_OK) != 0);
    unsigned char *got = NULL;
    CHECK(t_read_file("out.bin", &got) < 0);
    free(got);
    t_free(src, n);
    return 0;
}

const ckptio_test tests_file_write[] = {
    {"file_write/mix", test_mix, T_PER_BACKEND, 0},
    {"file_write/fail_mid_run", test_fail_mid_run, T_PER_BACKEND, 0},
    {0},
};
