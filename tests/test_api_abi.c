/* SPDX-License-Identifier: Apache-2.0 */
/* Versions, ABI and threads of the public API: structs of other sizes, a reader shared. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stddef.h>

#include "api_helpers.h"
#include "test.h"

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

const ckptio_test tests_api_abi[] = {
    {"api_versions_params_size", test_versions_params_size, 0, 0},
    {"api_reader_threads", test_reader_threads, T_PER_BACKEND, 0},
    {"api_sized_structs", test_sized_structs, 0, 0},
    {0},
};
