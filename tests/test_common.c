/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of src/common: error table, dtypes, names, containers. */
#include <errno.h>
#include <stdlib.h>

#include "../src/common/common.h"
#include "test.h"

static int test_errors(void)
{
    CHECK(!strcmp(ckptio_errname(CKPTIO_E_CORRUPT), "CKPTIO_E_CORRUPT"));
    CHECK(!strcmp(ckptio_errname(-ENOSPC), "ENOSPC"));
    CHECK(t_contains(ckptio_strerror(CKPTIO_E_EXISTS), "exists"));
    CHECK(t_contains(ckptio_strerror(-ENOSPC), "space"));
    CHECK(ckptio_strerror(-99999) != NULL);
    ckptio__msg m;
    ckptio__msg_clear(&m);
    CHECK(ckptio__fail(&m, CKPTIO_E_SHAPE, "tensor '%s' in %s", "w", "f") == CKPTIO_E_SHAPE);
    CHECK(t_contains(m.text, "tensor 'w' in f"));
    CHECK(t_contains(ckptio_last_error(), "CKPTIO_E_SHAPE"));
    return 0;
}

static int test_dtypes(void)
{
    CHECK(ckptio_dtype_size(CKPTIO_DT_BF16) == 2);
    CHECK(ckptio_dtype_size(CKPTIO_DT_C128) == 16);
    CHECK(ckptio_dtype_size(0) == 0 && ckptio_dtype_size(999) == 0);
    CHECK(ckptio_dtype_from_name("f8_e4m3fn") == CKPTIO_DT_F8_E4M3FN);
    CHECK(ckptio_dtype_from_name("nope") == CKPTIO_E_DTYPE);
    for (int d = CKPTIO_DT_BOOL; d <= CKPTIO_DT_BYTES; d++)
        CHECK(ckptio_dtype_from_name(ckptio_dtype_name(d)) == d);
    return 0;
}

static int test_names(void)
{
    CHECK(ckptio__valid_name("model.w", 7, 100));
    CHECK(ckptio__valid_name("\xc3\xa9t\xc3\xa9", 5, 100));           /* été */
    CHECK(ckptio__valid_name("\xf0\x9f\x98\x80", 4, 100));            /* emoji */
    CHECK(!ckptio__valid_name("", 0, 100));
    CHECK(!ckptio__valid_name("a\0b", 3, 100));
    CHECK(!ckptio__valid_name("\xc3", 1, 100));                       /* truncated */
    CHECK(!ckptio__valid_name("\xc0\x80", 2, 100));                   /* overlong */
    CHECK(!ckptio__valid_name("\xed\xa0\x80", 3, 100));               /* surrogate */
    CHECK(!ckptio__valid_name("abcd", 4, 3));
    return 0;
}

static int test_containers(void)
{
    ckptio__strmap m;
    ckptio__strmap_init(&m);
    enum { N = 50000 };
    char *keys = malloc((size_t)N * 16);
    CHECK(keys);
    for (uint64_t i = 0; i < N; i++) {
        char *k = keys + i * 16;
        int n = snprintf(k, 16, "k%llu", (unsigned long long)i);
        uint64_t v = i;
        CHECK(ckptio__strmap_put(&m, k, (size_t)n, &v) == 1);
    }
    uint64_t v = 7;
    CHECK(ckptio__strmap_put(&m, "k5", 2, &v) == 0 && v == 5);
    for (uint64_t i = 0; i < N; i += 997) {
        char k[16];
        int n = snprintf(k, 16, "k%llu", (unsigned long long)i);
        CHECK(ckptio__strmap_get(&m, k, (size_t)n, &v) == 1 && v == i);
    }
    CHECK(ckptio__strmap_get(&m, "zz", 2, &v) == 0);
    ckptio__strmap_free(&m);
    free(keys);

    ckptio__vec vec;
    ckptio__vec_init(&vec, sizeof(uint64_t));
    for (uint64_t i = 0; i < 1000; i++) CHECK(ckptio__vec_push(&vec, &i, 1) == (int64_t)i);
    CHECK(*CKPTIO__VEC_AT(&vec, uint64_t, 999) == 999);
    ckptio__vec_free(&vec);
    uint64_t dims[3] = {1ull << 40, 1ull << 20, 1ull << 10}, out;
    CHECK(!ckptio__volume(dims, 3, 2, &out));
    CHECK(ckptio__volume(dims, 2, 2, &out) && out == 1ull << 61);
    CHECK(ckptio__volume(dims, 0, 4, &out) && out == 4);
    return 0;
}

const ckptio_test tests_common[] = {
    {"common/errors", test_errors, 0, 0},
    {"common/dtypes", test_dtypes, 0, 0},
    {"common/names", test_names, 0, 0},
    {"common/containers", test_containers, 0, 0},
    {0},
};
