/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the zip CRC-32: against a bit-at-a-time reference, combined pieces, threads. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/common/crc32.h"
#include "test.h"

/* One bit at a time, straight from the definition. */
static uint32_t reference(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    return ~crc;
}

static uint8_t *random_bytes(size_t n, uint64_t seed)
{
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; b && i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        b[i] = (uint8_t)seed;
    }
    return b;
}

static int test_check_value(void)
{
    CHECK(ckptio__crc32(0, "123456789", 9) == 0xCBF43926u); /* the catalogued check value */
    CHECK(ckptio__crc32(0, "", 0) == 0);
    CHECK(ckptio__crc32(0x1234u, NULL, 0) == 0x1234u);
    return 0;
}

/* Every length up to a few folds, at every alignment, continuing a running CRC. */
static int test_lengths(void)
{
    uint8_t *b = random_bytes(5000, 7);
    CHECK(b);
    for (size_t n = 0; n < 4900; n += n < 400 ? 1 : 61)
        for (size_t off = 0; off < 16; off += 5)
            CHECK(ckptio__crc32(0xDEADBEEFu, b + off, n) == reference(0xDEADBEEFu, b + off, n));
    free(b);
    return 0;
}

static int test_combine(void)
{
    size_t n = 3u << 20;
    uint8_t *b = random_bytes(n, 11);
    CHECK(b);
    uint32_t whole = ckptio__crc32(0, b, n);
    size_t cuts[] = {0, 1, 15, 64, 4095, 1u << 20, n - 1, n};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t c = cuts[i];
        uint32_t a = ckptio__crc32(0, b, c), z = ckptio__crc32(0, b + c, n - c);
        CHECK(ckptio__crc32_combine(a, z, n - c) == whole);
    }
    free(b);
    return 0;
}

static int test_parallel(void)
{
    size_t n = (64u << 20) + 12345;
    uint8_t *b = random_bytes(n, 13);
    CHECK(b);
    uint32_t one = ckptio__crc32(0x55u, b, n);
    for (unsigned t = 1; t <= 8; t++) CHECK(ckptio__crc32_parallel(0x55u, b, n, t) == one);
    CHECK(ckptio__crc32_parallel(0x55u, b, 1000, 4) == ckptio__crc32(0x55u, b, 1000));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint32_t x = 0;
    for (int r = 0; r < 4; r++) x ^= ckptio__crc32((uint32_t)r, b, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("one thread: %.2f GB/s (%08x)\n", 4.0 * (double)n / s / 1e9, x);
    free(b);
    return 0;
}

const ckptio_test tests_crc32[] = {
    {"crc32/check_value", test_check_value, 0, 0},
    {"crc32/lengths", test_lengths, 0, 0},
    {"crc32/combine", test_combine, 0, 0},
    {"crc32/parallel", test_parallel, 0, 0},
    {0, 0, 0, 0},
};
