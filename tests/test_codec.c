/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the per-block codecs: bit-exact round trips, blocks kept raw, hostile streams. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>

#include "../src/codec/codec.h"
#include "test.h"

#ifndef CKPTIO_SOURCE_ROOT
#define CKPTIO_SOURCE_ROOT "."
#endif

#define MIB (1u << 20)

static const int float_dtypes[] = {CKPTIO_DT_BF16, CKPTIO_DT_F16,       CKPTIO_DT_F32,
                                   CKPTIO_DT_F64,  CKPTIO_DT_C64,       CKPTIO_DT_C128,
                                   CKPTIO_DT_F8_E4M3FN, CKPTIO_DT_F8_E5M2};
#define N_FLOAT (sizeof float_dtypes / sizeof float_dtypes[0])

static uint64_t le32(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Roughly normal, mean 0, standard deviation about `sd` (a sum of four uniforms). */
static double gauss(uint64_t *s, double sd)
{
    double t = 0;
    for (int i = 0; i < 4; i++) t += (double)(rng(s) >> 11) / 9007199254740992.0;
    return (t - 2.0) * 1.7320508 * sd;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* f16 bits of a float near 0.02 in size: exponent rebased, mantissa cut, tiny ones flushed to
 * subnormals. Only the distribution matters here. */
static uint16_t f16_bits(float f)
{
    uint32_t u = f32_bits(f), sign = u >> 16 & 0x8000;
    int e = (int)(u >> 23 & 0xff) - 127 + 15;
    if (e <= 0) return (uint16_t)(sign | (u >> 13 & 0x3ff) >> 4);
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    return (uint16_t)(sign | (uint32_t)e << 10 | (u >> 13 & 0x3ff));
}

/* Elements like trained weights, with the special values sprinkled in: NaNs with payloads,
 * -0.0, +-inf, subnormals. */
static void fill_float(int dtype, uint8_t *buf, uint64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t es = ckptio_dtype_size(dtype);
    static const uint16_t sp16[] = {0x7fc1, 0xff81, 0x8000, 0x7f80, 0xff80, 0x0001, 0x807f};
    static const uint16_t sph[] = {0x7e01, 0xfc01, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x83ff};
    static const uint32_t sp32[] = {0x7fc00001u, 0xffa00123u, 0x80000000u, 0x7f800000u,
                                    0xff800000u, 0x00000001u, 0x807fffffu};
    static const uint64_t sp64[] = {0x7ff8000000000001ull, 0xfff4000000000123ull,
                                    0x8000000000000000ull, 0x7ff0000000000000ull,
                                    0xfff0000000000000ull, 0x0000000000000001ull,
                                    0x800fffffffffffffull};
    static const uint8_t sp8[] = {0x7f, 0xff, 0x80, 0x7c, 0xfc, 0x01, 0x87};
    unsigned k = 0;
    for (uint64_t at = 0; at < n; at += es, k++) {
        float f = (float)gauss(&s, 0.02);
        bool special = k % 97 == 13;
        unsigned j = (k / 97) % 7;
        switch (dtype) {
        case CKPTIO_DT_BF16: {
            uint16_t v = special ? sp16[j] : (uint16_t)(f32_bits(f) >> 16);
            memcpy(buf + at, &v, 2);
            break;
        }
        case CKPTIO_DT_F16: {
            uint16_t v = special ? sph[j] : f16_bits(f);
            memcpy(buf + at, &v, 2);
            break;
        }
        case CKPTIO_DT_F32:
        case CKPTIO_DT_C64:
            for (size_t h = 0; h < es; h += 4) {
                uint32_t v = special ? sp32[j] : f32_bits((float)gauss(&s, 0.02));
                memcpy(buf + at + h, &v, 4);
            }
            break;
        case CKPTIO_DT_F64:
        case CKPTIO_DT_C128:
            for (size_t h = 0; h < es; h += 8) {
                double d = gauss(&s, 0.02);
                uint64_t v;
                memcpy(&v, &d, 8);
                if (special) v = sp64[j];
                memcpy(buf + at + h, &v, 8);
            }
            break;
        default: /* fp8: the high byte of a bf16 keeps sign and most of the exponent */
            buf[at] = special ? sp8[j] : (uint8_t)((f32_bits(f) >> 24 & 0x80) | (f32_bits(f) >> 20 & 0x7f));
            break;
        }
    }
}

/* Encode then decode through exact-size buffers; the stored size (0: kept raw) in *stored. */
static int roundtrip(ckptio__codec_ctx *c, unsigned codec, int dtype, const uint8_t *src,
                     uint64_t n, int64_t *stored)
{
    uint8_t *enc = malloc(n ? n : 1), *back = malloc(n ? n : 1);
    CHECK(enc && back);
    int64_t s = ckptio__codec_encode(c, codec, dtype, src, n, enc, n);
    if (s < 0) fprintf(stderr, "encode %s %s %llu -> %lld\n", ckptio__codec_name(codec),
                       ckptio_dtype_name(dtype), (unsigned long long)n, (long long)s);
    CHECK(s >= 0 && (uint64_t)s <= n - n / 50);
    if (s > 0) {
        uint8_t *in = malloc((size_t)s); /* exactly the stream, so ASan sees any overread */
        CHECK(in);
        memcpy(in, enc, (size_t)s);
        CHECK_OK(ckptio__codec_decode(c, codec, dtype, in, (uint64_t)s, back, n));
        CHECK(memcmp(back, src, n) == 0);
        free(in);
    }
    *stored = s;
    free(enc);
    free(back);
    return 0;
}

static int test_ctx(void)
{
    ckptio__codec_ctx *c = (ckptio__codec_ctx *)&c;
    CHECK_ERR(ckptio__codec_ctx_new(&c, 4095), CKPTIO_E_USAGE);
    CHECK(c == NULL);
    CHECK_ERR(ckptio__codec_ctx_new(&c, 2048), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_ctx_new(&c, 3 * 4096), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_ctx_new(&c, 128u << 20), CKPTIO_E_USAGE);
    CHECK_OK(ckptio__codec_ctx_new(&c, 4096));
    ckptio__codec_ctx_free(c);
    CHECK_OK(ckptio__codec_ctx_new(&c, 64u << 20));
    ckptio__codec_ctx_free(c);
    ckptio__codec_ctx_free(NULL);
    CHECK(ckptio__codec_for(CKPTIO_DT_BF16) == CKPTIO__CODEC_FLOAT);
    CHECK(ckptio__codec_for(CKPTIO_DT_F8_E5M2) == CKPTIO__CODEC_FLOAT);
    CHECK(ckptio__codec_for(CKPTIO_DT_I64) == CKPTIO__CODEC_ZSTD);
    CHECK(ckptio__codec_for(CKPTIO_DT_BYTES) == CKPTIO__CODEC_ZSTD);
    CHECK(!strcmp(ckptio__codec_name(CKPTIO__CODEC_NONE), "none"));
    CHECK(!strcmp(ckptio__codec_name(CKPTIO__CODEC_ZSTD), "zstd"));
    CHECK(!strcmp(ckptio__codec_name(CKPTIO__CODEC_FLOAT), "float"));
    CHECK(!strcmp(ckptio__codec_name(7), "?"));
    /* Misuse of the encoder. */
    CHECK_OK(ckptio__codec_ctx_new(&c, 4096));
    uint8_t src[8192] = {0}, dst[8192];
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_ZSTD, CKPTIO_DT_U8, src, 8192, dst, 8192),
              CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_NONE, CKPTIO_DT_U8, src, 64, dst, 64),
              CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_I32, src, 64, dst, 64),
              CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_F32, src, 62, dst, 62),
              CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_ZSTD, CKPTIO_DT_U8, src, 64, dst, 63),
              CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_encode(c, CKPTIO__CODEC_ZSTD, 99, src, 64, dst, 64), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio__codec_decode(c, CKPTIO__CODEC_ZSTD, CKPTIO_DT_U8, src, 64, dst, 8192),
              CKPTIO_E_USAGE);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Every float dtype, both codecs, at sizes from one element to a whole max_block. */
static int test_floats(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, MIB));
    uint8_t *buf = malloc(MIB);
    CHECK(buf);
    for (unsigned d = 0; d < N_FLOAT; d++) {
        int dt = float_dtypes[d];
        uint64_t es = ckptio_dtype_size(dt);
        uint64_t sizes[] = {es, 3 * es, 4 * es, 5 * es, 7 * es, 4098 / es * es, 4096 + 11 * es,
                            65536 + 3 * es, MIB - es, MIB};
        for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            fill_float(dt, buf, sizes[i], i + 7 * d);
            int64_t s, z;
            CHECK(roundtrip(c, CKPTIO__CODEC_FLOAT, dt, buf, sizes[i], &s) == 0);
            CHECK(roundtrip(c, CKPTIO__CODEC_ZSTD, dt, buf, sizes[i], &z) == 0);
            /* Blocks of a few KiB and more shrink: the exponent alone saves more than 2 %. */
            if (sizes[i] >= 4096) CHECK(s > 0);
            if (sizes[i] == MIB)
                printf("%-10s float %.3f  zstd %.3f\n", ckptio_dtype_name(dt),
                       (double)MIB / (double)s, z ? (double)MIB / (double)z : 1.0);
        }
    }
    free(buf);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Blocks of one repeated value (planes kept as one byte) and of zeros, in every dtype. */
static int test_constant(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, 65536));
    uint8_t *buf = malloc(65536);
    CHECK(buf);
    for (int dt = 1; dt <= CKPTIO_DT_BYTES; dt++) {
        uint64_t es = ckptio_dtype_size(dt);
        /* A complex element is two floats: each half repeats the same value. */
        uint64_t unit = dt == CKPTIO_DT_C64 || dt == CKPTIO_DT_C128 ? es / 2 : es;
        for (int pattern = 0; pattern < 3; pattern++) {
            for (uint64_t i = 0; i < 65536; i++)
                buf[i] = pattern == 0 ? 0 : pattern == 1 ? (uint8_t)(0x3f + i % unit) : 0xff;
            for (uint64_t n = es; n <= 65536; n *= 4) {
                int64_t s;
                CHECK(roundtrip(c, CKPTIO__CODEC_ZSTD, dt, buf, n, &s) == 0);
                if (ckptio__codec_for(dt) == CKPTIO__CODEC_FLOAT) {
                    CHECK(roundtrip(c, CKPTIO__CODEC_FLOAT, dt, buf, n, &s) == 0);
                    if (n >= 1024) CHECK(s > 0 && s <= 4 + 2 * 8);
                }
            }
        }
    }
    free(buf);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Integers and bytes through zstd: small values. */
static int test_integers(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, MIB));
    uint8_t *buf = malloc(MIB);
    CHECK(buf);
    uint64_t s0 = 5;
    for (int dt = 1; dt <= CKPTIO_DT_BYTES; dt++) {
        uint64_t es = ckptio_dtype_size(dt);
        for (uint64_t i = 0; i < MIB; i += es) {
            uint64_t v = rng(&s0) % 100;
            memset(buf + i, 0, es);
            memcpy(buf + i, &v, CKPTIO__MIN(es, 8));
        }
        uint64_t sizes[] = {es, 4098 / es * es, MIB};
        for (unsigned k = 0; k < 3; k++) {
            int64_t s;
            CHECK(roundtrip(c, CKPTIO__CODEC_ZSTD, dt, buf, sizes[k], &s) == 0);
            if (sizes[k] == MIB) CHECK(s > 0);
        }
    }
    free(buf);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* XOR of two nearby float states: high bits mostly zero. */
static int test_xor_delta(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, MIB));
    uint8_t *a = malloc(MIB), *b = malloc(MIB);
    CHECK(a && b);
    uint64_t s = 9;
    fill_float(CKPTIO_DT_BF16, a, MIB, 3);
    for (uint64_t i = 0; i < MIB; i += 2) {
        uint16_t v;
        memcpy(&v, a + i, 2);
        uint16_t w = rng(&s) % 4 == 0 ? (uint16_t)(v + (rng(&s) % 5) - 2) : v;
        w ^= v;
        memcpy(b + i, &w, 2);
    }
    int64_t st;
    CHECK(roundtrip(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, b, MIB, &st) == 0);
    printf("bf16 xor delta: %.3f\n", (double)MIB / (double)st);
    CHECK(st > 0 && (uint64_t)st < MIB / 3);
    free(a);
    free(b);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* A block whose quarters have different exponent statistics (a tensor's rows of different
 * scales) gets a code per stream (plane mode 3), and decodes back exactly; a truncation of it
 * anywhere is refused. */
static int test_tables_per_stream(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, MIB));
    uint8_t *a = malloc(MIB);
    CHECK(a);
    fill_float(CKPTIO_DT_BF16, a, MIB, 4);
    for (uint64_t i = 0; i < MIB; i += 2) { /* shift each quarter's exponents apart */
        uint16_t v;
        memcpy(&v, a + i, 2);
        unsigned e = (v >> 7) & 0xff, q = (unsigned)(i / (MIB / 4));
        if (e > 20 && e < 230) e = e - 10 + 6 * q;
        v = (uint16_t)((v & 0x807f) | e << 7);
        memcpy(a + i, &v, 2);
    }
    uint8_t *enc = malloc(MIB), *back = malloc(MIB);
    CHECK(enc && back);
    int64_t st = ckptio__codec_encode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, a, MIB, enc, MIB);
    CHECK(st > 0 && enc[4] == 3); /* plane 0's mode: a table per stream */
    CHECK_OK(ckptio__codec_decode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, enc, (uint64_t)st, back,
                                  MIB));
    CHECK(memcmp(back, a, MIB) == 0);
    for (int64_t cut = 5; cut < st; cut += st / 97 + 1)
        CHECK(ckptio__codec_decode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, enc, (uint64_t)cut,
                                   back, MIB) == CKPTIO_E_CORRUPT);
    printf("bf16, quarters of different scales: %.4f\n", (double)MIB / (double)st);
    free(a);
    free(enc);
    free(back);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Random bytes are kept raw by every codec, whatever the dtype. */
static int test_random_raw(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, MIB));
    uint8_t *buf = malloc(MIB), *dst = malloc(MIB);
    CHECK(buf && dst);
    t_fill(buf, MIB, 17);
    for (int dt = 1; dt <= CKPTIO_DT_BYTES; dt++) {
        uint64_t es = ckptio_dtype_size(dt);
        uint64_t sizes[] = {4096, 4098 / es * es, MIB};
        for (unsigned k = 0; k < 3; k++) {
            CHECK(ckptio__codec_encode(c, CKPTIO__CODEC_ZSTD, dt, buf, sizes[k], dst, sizes[k]) == 0);
            if (ckptio__codec_for(dt) == CKPTIO__CODEC_FLOAT)
                CHECK(ckptio__codec_encode(c, CKPTIO__CODEC_FLOAT, dt, buf, sizes[k], dst,
                                           sizes[k]) == 0);
        }
    }
    free(buf);
    free(dst);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Decode `len` bytes of s into an exact-size copy and an exact-size destination. */
static int dec(ckptio__codec_ctx *c, unsigned codec, int dtype, const uint8_t *s, uint64_t len,
               uint64_t raw)
{
    uint8_t *in = malloc(len ? len : 1), *out = malloc(raw ? raw : 1);
    if (!in || !out) return -ENOMEM;
    memcpy(in, s, len);
    int rc = ckptio__codec_decode(c, codec, dtype, in, len, out, raw);
    free(in);
    free(out);
    return rc;
}

/* A valid small stream of each codec and dtype, broken every way the header names. */
static int test_refuse(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, 65536));
    uint64_t n = 8192;
    uint8_t *buf = malloc(n + 16), *enc = malloc(n + 16);
    CHECK(buf && enc);
    for (unsigned d = 0; d < N_FLOAT; d++) {
        int dt = float_dtypes[d];
        uint64_t es = ckptio_dtype_size(dt);
        fill_float(dt, buf, n, d);
        for (unsigned codec = CKPTIO__CODEC_ZSTD; codec <= CKPTIO__CODEC_FLOAT; codec++) {
            int64_t s = ckptio__codec_encode(c, codec, dt, buf, n, enc, n);
            CHECK(s > 0);
            uint64_t len = (uint64_t)s;
            CHECK_OK(dec(c, codec, dt, enc, len, n));
            /* Unknown codecs, NONE included (a raw block never reaches the decoder). */
            CHECK_ERR(dec(c, 0, dt, enc, len, n), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, 3, dt, enc, len, n), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, 0x102, dt, enc, len, n), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, codec, 0, enc, len, n), CKPTIO_E_CORRUPT);
            /* Every prefix, and one byte too many. */
            for (uint64_t k = 0; k < len; k++) CHECK_ERR(dec(c, codec, dt, enc, k, n), CKPTIO_E_CORRUPT);
            enc[len] = 0;
            CHECK_ERR(dec(c, codec, dt, enc, len + 1, n), CKPTIO_E_CORRUPT);
            /* Sizes that disagree. */
            CHECK_ERR(dec(c, codec, dt, enc, len, n - es), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, codec, dt, enc, len, n + es), CKPTIO_E_CORRUPT);
            if (es > 1) CHECK_ERR(dec(c, codec, dt, enc, len, n - 1), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, codec, dt, enc, len, 0), CKPTIO_E_CORRUPT);
            CHECK_ERR(dec(c, codec, dt, enc, len, 65536 + 4096), CKPTIO_E_USAGE);
            /* Any one byte changed: refused or decoded, never out of bounds. */
            for (uint64_t k = 0; k < len; k++) {
                uint8_t keep = enc[k];
                enc[k] ^= (uint8_t)(1u << (k % 8));
                int rc = dec(c, codec, dt, enc, len, n);
                CHECK(rc == 0 || rc == CKPTIO_E_CORRUPT);
                enc[k] = keep;
            }
        }
    }
    free(buf);
    free(enc);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* Code tables that are no prefix code: oversubscribed, incomplete, lengths past 11, one
 * symbol. The first plane of a bf16 block of weights is coded, its table at byte 6. */
static int test_tables(void)
{
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, 65536));
    uint64_t n = 16384;
    uint8_t *buf = malloc(n), *enc = malloc(n);
    CHECK(buf && enc);
    fill_float(CKPTIO_DT_BF16, buf, n, 1);
    int64_t s = ckptio__codec_encode(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, buf, n, enc, n);
    CHECK(s > 0);
    uint64_t len = (uint64_t)s;
    CHECK(enc[4] == 2); /* the exponent plane is Huffman-coded */
    unsigned last = enc[5], tab = (last + 2) / 2;
    uint8_t *copy = malloc(len);
    CHECK(copy);
    /* Every length 1: oversubscribed. */
    memcpy(copy, enc, len);
    memset(copy + 6, 0x11, tab);
    CHECK_ERR(dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n), CKPTIO_E_CORRUPT);
    /* Two symbols of length 2 only: incomplete. */
    memcpy(copy, enc, len);
    memset(copy + 6, 0, tab);
    copy[6] = 0x22;
    CHECK_ERR(dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n), CKPTIO_E_CORRUPT);
    /* One symbol only. */
    copy[6] = 0x01;
    CHECK_ERR(dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n), CKPTIO_E_CORRUPT);
    /* Lengths 12..15. */
    for (unsigned bad = 12; bad < 16; bad++) {
        memcpy(copy, enc, len);
        for (unsigned k = 0; k < tab; k++)
            if ((copy[6 + k] & 15) == 11) copy[6 + k] = (uint8_t)((copy[6 + k] & 0xf0) | bad);
        int rc = dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n);
        CHECK(rc == CKPTIO_E_CORRUPT || !memcmp(copy, enc, len));
    }
    /* Stream sizes that run past the block, and a mode byte nobody defined. */
    memcpy(copy, enc, len);
    copy[6 + tab + 3] = 0x7f;
    CHECK_ERR(dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n), CKPTIO_E_CORRUPT);
    memcpy(copy, enc, len);
    copy[4] = 3;
    CHECK_ERR(dec(c, CKPTIO__CODEC_FLOAT, CKPTIO_DT_BF16, copy, len, n), CKPTIO_E_CORRUPT);
    free(copy);
    free(buf);
    free(enc);
    ckptio__codec_ctx_free(c);
    return 0;
}

/* The fuzz corpus: the target over every seed (fuzz/fuzz_codec.c says what an input holds),
 * then the seeds that say what they are: valid-* decode, invalid-* are refused. */
static int test_corpus(void)
{
#ifdef CKPTIO_FUZZ_CODEC_REPLAY
    CHECK(t_sh("%s %s", CKPTIO_FUZZ_CODEC_REPLAY, CKPTIO_SOURCE_ROOT "/fuzz/corpus/codec") == 0);
#endif
    const char *dir = CKPTIO_SOURCE_ROOT "/fuzz/corpus/codec";
    DIR *d = opendir(dir);
    CHECK(d);
    ckptio__codec_ctx *c;
    CHECK_OK(ckptio__codec_ctx_new(&c, 256u << 10));
    unsigned valid = 0, invalid = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        bool good = !strncmp(e->d_name, "valid-", 6), bad = !strncmp(e->d_name, "invalid-", 8);
        if (!good && !bad) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unsigned char *buf = NULL;
        long len = t_read_file(path, &buf);
        CHECK(len >= 6);
        uint64_t raw = le32(buf + 2);
        int rc = raw > (256u << 10) ? CKPTIO_E_USAGE
                                    : dec(c, buf[0], buf[1], buf + 6, (uint64_t)len - 6, raw);
        if ((rc == 0) != good) fprintf(stderr, "%s: %d\n", e->d_name, rc);
        CHECK((rc == 0) == good);
        valid += good;
        invalid += bad;
        free(buf);
    }
    closedir(d);
    printf("%u valid and %u invalid seeds\n", valid, invalid);
    CHECK(valid >= 10 && invalid >= 10);
    ckptio__codec_ctx_free(c);
    return 0;
}

const ckptio_test tests_codec[] = {
    {"codec/ctx", test_ctx, 0, 0},
    {"codec/floats", test_floats, 0, 120},
    {"codec/tables_per_stream", test_tables_per_stream, 0, 60},
    {"codec/constant", test_constant, 0, 0},
    {"codec/integers", test_integers, 0, 0},
    {"codec/xor_delta", test_xor_delta, 0, 0},
    {"codec/random_raw", test_random_raw, 0, 120},
    {"codec/refuse", test_refuse, 0, 300},
    {"codec/tables", test_tables, 0, 0},
    {"codec/corpus", test_corpus, 0, 0},
    {0, 0, 0, 0},
};
