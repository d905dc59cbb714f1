/* SPDX-License-Identifier: Apache-2.0 */
/* Rejected calls of the public API: each names its error and leaves the writer or reader usable. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "api_helpers.h"
#include "test.h"

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

const ckptio_test tests_api_bad_calls[] = {
    {"api_bad_writer_calls", test_bad_writer_calls, T_PER_BACKEND, 0},
    {"api_bad_reader_calls", test_bad_reader_calls, T_PER_BACKEND, 0},
    {0},
};
