/* SPDX-License-Identifier: Apache-2.0 */
/* Parameters of the public API: a tiny staging pool, fsync and O_DIRECT off or refused, flush. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sys/mount.h>

#include "api_helpers.h"
#include "test.h"

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

const ckptio_test tests_api_params[] = {
    {"api_small_staging", test_small_staging, T_PER_BACKEND, 120},
    {"api_fsync_direct_off", test_fsync_direct_off, T_PER_BACKEND, 0},
    {"api_flush_reuse", test_flush_reuse, T_PER_BACKEND, 0},
    {"api_odirect_refused", test_odirect_refused, T_PER_BACKEND, 0},
    {0},
};
