/* SPDX-License-Identifier: Apache-2.0 */
/* The zip format's CRC-32 at memory speed: carry-less multiply folding, pieces combined. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "crc32.h"

/* CRC-32 as zip and zlib compute it: the reflected polynomial 0xEDB88320, the register
 * started at and finished with all ones. "Raw" below means without those two inversions:
 * raw(a || b) depends only on raw(a) and b, and the raw CRC of bytes is linear in them. */
#define POLY 0xEDB88320u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (unsigned i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

/* Eight bytes a step through eight tables (about 1.5-2 GB/s on one core). */
static uint32_t raw_tables(uint32_t c, const uint8_t *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
            table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
            table[0][p[7]];
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__)
/* Folding (the method of Intel's white paper "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ"): four 128-bit lanes, each moved 512 bits on (its two 64-bit halves times
 * x^(512+32) and x^(512-32) mod P, carry-less) and added to the next 64 bytes; then the lanes
 * folded into one, 128 bits at a time. The 16 bytes that remain have the same raw CRC as all
 * the bytes folded into them: the tables finish them, and the tail. Constants: those powers of
 * x mod P, and x^(128+32), x^(128-32) mod P, reflected and shifted left by one. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t raw_fold(uint32_t c, const uint8_t *p,
                                                                   size_t n)
{
    if (n < 128) return raw_tables(c, p, n);
    const __m128i k4 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
#define LOAD(q) _mm_loadu_si128((const __m128i *)(const void *)(q))
#define FOLD(x, k, d)                                                                          \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), \
                  d)
    __m128i x0 = _mm_xor_si128(LOAD(p), _mm_cvtsi32_si128((int)c)), x1 = LOAD(p + 16),
            x2 = LOAD(p + 32), x3 = LOAD(p + 48);
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = FOLD(x0, k4, LOAD(p));
        x1 = FOLD(x1, k4, LOAD(p + 16));
        x2 = FOLD(x2, k4, LOAD(p + 32));
        x3 = FOLD(x3, k4, LOAD(p + 48));
    }
    x0 = FOLD(x0, k1, x1);
    x0 = FOLD(x0, k1, x2);
    x0 = FOLD(x0, k1, x3);
    for (; n >= 16; p += 16, n -= 16) x0 = FOLD(x0, k1, LOAD(p));
#undef FOLD
#undef LOAD
    uint8_t rest[16];
    _mm_storeu_si128((__m128i *)(void *)rest, x0);
    return raw_tables(raw_tables(0, rest, sizeof rest), p, n);
}
#endif

typedef uint32_t (*raw_fn)(uint32_t, const uint8_t *, size_t);
static _Atomic(raw_fn) chosen;

static raw_fn choose(void)
{
    pthread_once(&table_once, make_table);
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!getenv("CKPTIO_CRC32_TABLES") && __builtin_cpu_supports("pclmul") &&
        __builtin_cpu_supports("sse4.1"))
        return raw_fold;
#endif
    return raw_tables;
}

uint32_t ckptio__crc32(uint32_t crc, const void *buf, size_t n)
{
    raw_fn f = atomic_load_explicit(&chosen, memory_order_acquire);
    if (CKPTIO__UNLIKELY(!f)) {
        f = choose();
        atomic_store_explicit(&chosen, f, memory_order_release);
    }
    return ~f(~crc, buf, n);
}

/* ---- combining: crc(a || b) from crc(a), crc(b) and b's length ---- */

/* a * b modulo P, both reflected polynomials (bit 31 is x^0). */
static uint32_t mult_mod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) p ^= b;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8n) modulo P: squarings of x^8, by the bits of n. */
static uint32_t x8n_mod(uint64_t n)
{
    uint32_t p = 1u << 31, sq = 1u << 23; /* x^0; x^8 */
    for (; n; n >>= 1) {
        if (n & 1) p = mult_mod(sq, p);
        sq = mult_mod(sq, sq);
    }
    return p;
}

uint32_t ckptio__crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    /* The inversions cancel but for crc_a's register shifted over len_b zero bytes. */
    return mult_mod(x8n_mod(len_b), crc_a) ^ crc_b;
}

/* ---- one buffer on several threads ---- */

typedef struct piece {
    const uint8_t *p;
    size_t n;
    uint32_t crc;
} piece;

static void *run_piece(void *arg)
{
    piece *q = arg;
    q->crc = ckptio__crc32(0, q->p, q->n);
    return NULL;
}

uint32_t ckptio__crc32_parallel(uint32_t crc, const void *buf, size_t n, unsigned threads)
{
    if (threads > CKPTIO__CRC32_MAX_THREADS) threads = CKPTIO__CRC32_MAX_THREADS;
    if (threads < 2 || n < (size_t)threads * CKPTIO__CRC32_MIN_PIECE)
        return ckptio__crc32(crc, buf, n);
    piece q[CKPTIO__CRC32_MAX_THREADS];
    pthread_t t[CKPTIO__CRC32_MAX_THREADS];
    bool started[CKPTIO__CRC32_MAX_THREADS] = {false};
    size_t step = n / threads;
    for (unsigned i = 0; i < threads; i++) {
        q[i] = (piece){(const uint8_t *)buf + i * step, i + 1 < threads ? step : n - i * step, 0};
        /* The caller's thread takes the first piece; a thread that cannot start, its own. */
        started[i] = i > 0 && pthread_create(&t[i], NULL, run_piece, &q[i]) == 0;
    }
    for (unsigned i = 0; i < threads; i++)
        if (!started[i]) run_piece(&q[i]);
    for (unsigned i = 0; i < threads; i++) {
        if (started[i]) pthread_join(t[i], NULL);
        crc = ckptio__crc32_combine(crc, q[i].crc, q[i].n);
    }
    return crc;
}
