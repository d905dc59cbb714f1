/* SPDX-License-Identifier: Apache-2.0 */
/* The float codec: each element's bits regrouped into byte planes, each plane coded or kept. */
#include "coder.h"

/* How a dtype's elements become byte planes (doc/codecs.md section 3.1). Every plane holds one
 * byte per element; plane 0 is the one that holds the exponent. */
enum { L_BF16, L_F32, L_BYTES };
typedef struct layout {
    unsigned kind, unit, planes; /* unit: bytes per element as the layout sees it */
} layout;

/* A plane's mode byte. */
enum { P_RAW = 0, P_CONST = 1, P_HUFF = 2, P_HUFF4 = 3 };

static bool layout_of(int dtype, layout *l)
{
    switch (dtype) {
    case CKPTIO_DT_BF16: *l = (layout){L_BF16, 2, 2}; return true;
    case CKPTIO_DT_F16: *l = (layout){L_BYTES, 2, 2}; return true;
    case CKPTIO_DT_F32:
    case CKPTIO_DT_C64: *l = (layout){L_F32, 4, 4}; return true; /* a c64 is two f32 */
    case CKPTIO_DT_F64:
    case CKPTIO_DT_C128: *l = (layout){L_BYTES, 8, 8}; return true; /* a c128 is two f64 */
    case CKPTIO_DT_F8_E4M3FN:
    case CKPTIO_DT_F8_E5M2: *l = (layout){L_BYTES, 1, 1}; return true;
    default: return false;
    }
}

bool ckptio__float_knows(int dtype)
{
    layout l;
    return layout_of(dtype, &l);
}

/* Split n elements into the planes (plane p at out + p * n), and merge them back. The bf16,
 * f32 and f16 layouts go 16 elements at a time through SSE2 (every x86-64 has it); the rest,
 * and the tails, one element at a time. */
static void split_tail(const layout *l, const uint8_t *src, uint64_t i, uint64_t n, uint8_t *out)
{
    for (; i < n; i++) {
        const uint8_t *s = src + l->unit * i;
        if (l->kind == L_BF16) {
            out[i] = (uint8_t)(s[1] << 1 | s[0] >> 7);
            out[n + i] = (uint8_t)((s[1] & 0x80) | (s[0] & 0x7f));
        } else if (l->kind == L_F32) {
            out[i] = (uint8_t)(s[3] << 1 | s[2] >> 7);
            out[n + i] = (uint8_t)((s[3] & 0x80) | (s[2] & 0x7f));
            out[2 * n + i] = s[1];
            out[3 * n + i] = s[0];
        } else {
            for (unsigned p = 0; p < l->unit; p++) out[p * n + i] = s[l->unit - 1 - p];
        }
    }
}

static void merge_tail(const layout *l, const uint8_t *const *pl, uint64_t i, uint64_t n,
                       uint8_t *dst)
{
    for (; i < n; i++) {
        uint8_t *d = dst + l->unit * i;
        if (l->kind == L_BF16 || l->kind == L_F32) {
            unsigned e = pl[0][i], m = pl[1][i], hi = l->kind == L_BF16 ? 0 : 2;
            d[hi] = (uint8_t)(e << 7 | (m & 0x7f));
            d[hi + 1] = (uint8_t)((m & 0x80) | e >> 1);
            if (hi) {
                d[0] = pl[3][i];
                d[1] = pl[2][i];
            }
        } else {
            for (unsigned p = 0; p < l->unit; p++) d[l->unit - 1 - p] = pl[p][i];
        }
    }
}

#if defined(__SSE2__)
#include <emmintrin.h>

#define LOAD(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define STORE(p, v) _mm_storeu_si128((__m128i *)(void *)(p), v)

/* The exponent and sign+mantissa bytes of eight bf16-shaped 16-bit lanes (in the low byte). */
static inline __m128i exp16(__m128i v)
{
    return _mm_and_si128(_mm_srli_epi16(v, 7), _mm_set1_epi16(0xff));
}
static inline __m128i man16(__m128i v)
{
    return _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 8), _mm_set1_epi16(0x80)),
                        _mm_and_si128(v, _mm_set1_epi16(0x7f)));
}
/* The inverse: 16-bit lanes from exponent and sign+mantissa lanes. */
static inline __m128i join16(__m128i e, __m128i m)
{
    return _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(m, _mm_set1_epi16(0x80)), 8),
                                     _mm_slli_epi16(e, 7)),
                        _mm_and_si128(m, _mm_set1_epi16(0x7f)));
}

static uint64_t split_simd(const layout *l, const uint8_t *src, uint64_t n, uint8_t *out)
{
    uint64_t i = 0;
    const __m128i lo8 = _mm_set1_epi16(0xff);
    if (l->kind == L_BF16) {
        for (; i + 16 <= n; i += 16) {
            __m128i a = LOAD(src + 2 * i), b = LOAD(src + 2 * i + 16);
            STORE(out + i, _mm_packus_epi16(exp16(a), exp16(b)));
            STORE(out + n + i, _mm_packus_epi16(man16(a), man16(b)));
        }
    } else if (l->kind == L_F32) {
        /* The high halves of four f32 are bf16-shaped; the low halves are bytes 1 and 0. */
        for (; i + 16 <= n; i += 16) {
            __m128i v[4], hi[2], lo[2];
            for (int k = 0; k < 4; k++) v[k] = LOAD(src + 4 * i + 16 * k);
            for (int k = 0; k < 2; k++) {
                /* srai then packs keeps each lane's 16 high bits; the low 16 by shifting up. */
                hi[k] = _mm_packs_epi32(_mm_srai_epi32(v[2 * k], 16), _mm_srai_epi32(v[2 * k + 1], 16));
                lo[k] = _mm_packs_epi32(_mm_srai_epi32(_mm_slli_epi32(v[2 * k], 16), 16),
                                        _mm_srai_epi32(_mm_slli_epi32(v[2 * k + 1], 16), 16));
            }
            STORE(out + i, _mm_packus_epi16(exp16(hi[0]), exp16(hi[1])));
            STORE(out + n + i, _mm_packus_epi16(man16(hi[0]), man16(hi[1])));
            STORE(out + 2 * n + i, _mm_packus_epi16(_mm_srli_epi16(lo[0], 8), _mm_srli_epi16(lo[1], 8)));
            STORE(out + 3 * n + i, _mm_packus_epi16(_mm_and_si128(lo[0], lo8), _mm_and_si128(lo[1], lo8)));
        }
    } else if (l->unit == 2) {
        for (; i + 16 <= n; i += 16) {
            __m128i a = LOAD(src + 2 * i), b = LOAD(src + 2 * i + 16);
            STORE(out + i, _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
            STORE(out + n + i, _mm_packus_epi16(_mm_and_si128(a, lo8), _mm_and_si128(b, lo8)));
        }
    }
    return i;
}

static uint64_t merge_simd(const layout *l, const uint8_t *const *pl, uint64_t n, uint8_t *dst)
{
    uint64_t i = 0;
    const __m128i z = _mm_setzero_si128();
    if (l->kind == L_BF16 || l->kind == L_F32) {
        for (; i + 16 <= n; i += 16) {
            __m128i e = LOAD(pl[0] + i), m = LOAD(pl[1] + i);
            __m128i h0 = join16(_mm_unpacklo_epi8(e, z), _mm_unpacklo_epi8(m, z));
            __m128i h1 = join16(_mm_unpackhi_epi8(e, z), _mm_unpackhi_epi8(m, z));
            if (l->kind == L_BF16) {
                STORE(dst + 2 * i, h0);
                STORE(dst + 2 * i + 16, h1);
                continue;
            }
            __m128i b1 = LOAD(pl[2] + i), b0 = LOAD(pl[3] + i);
            __m128i l0 = _mm_unpacklo_epi8(b0, b1), l1 = _mm_unpackhi_epi8(b0, b1);
            uint8_t *d = dst + 4 * i;
            STORE(d, _mm_unpacklo_epi16(l0, h0));
            STORE(d + 16, _mm_unpackhi_epi16(l0, h0));
            STORE(d + 32, _mm_unpacklo_epi16(l1, h1));
            STORE(d + 48, _mm_unpackhi_epi16(l1, h1));
        }
    } else if (l->unit == 2) {
        for (; i + 16 <= n; i += 16) {
            __m128i h = LOAD(pl[0] + i), lo = LOAD(pl[1] + i);
            STORE(dst + 2 * i, _mm_unpacklo_epi8(lo, h));
            STORE(dst + 2 * i + 16, _mm_unpackhi_epi8(lo, h));
        }
    }
    return i;
}
#else
static uint64_t split_simd(const layout *l, const uint8_t *src, uint64_t n, uint8_t *out)
{
    CKPTIO__UNUSED(l), CKPTIO__UNUSED(src), CKPTIO__UNUSED(n), CKPTIO__UNUSED(out);
    return 0;
}
static uint64_t merge_simd(const layout *l, const uint8_t *const *pl, uint64_t n, uint8_t *dst)
{
    CKPTIO__UNUSED(l), CKPTIO__UNUSED(pl), CKPTIO__UNUSED(n), CKPTIO__UNUSED(dst);
    return 0;
}
#endif

static void split(const layout *l, const uint8_t *src, uint64_t n, uint8_t *out)
{
    split_tail(l, src, split_simd(l, src, n, out), n, out);
}

static void merge(const layout *l, const uint8_t *const *pl, uint64_t n, uint8_t *dst)
{
    merge_tail(l, pl, merge_simd(l, pl, n, dst), n, dst);
}

/* Counts of a plane, one histogram per stream, the four streams in one loop so that equal
 * neighbours do not wait on the same counter. */
static void count4(const uint8_t *s, uint64_t n, ckptio__hist h)
{
    uint64_t q = ckptio__huff_quarter(n);
    const uint8_t *s1 = s + q, *s2 = s + 2 * q, *s3 = s + 3 * q;
    for (uint64_t i = 0; i < q; i++) {
        h[0][s[i]]++;
        h[1][s1[i]]++;
        h[2][s2[i]]++;
        h[3][s3[i]]++;
    }
    for (uint64_t i = 4 * q; i < n; i++) h[3][s[i]]++;
}

/* Whether every stream has two symbols at least, so that each can have a code of its own. */
static bool streams_vary(const ckptio__hist h)
{
    for (unsigned k = 0; k < CKPTIO__HUFF_STREAMS; k++) {
        unsigned distinct = 0;
        for (unsigned v = 0; v < 256 && distinct < 2; v++) distinct += h[k][v] != 0;
        if (distinct < 2) return false;
    }
    return true;
}

/* Below this many elements a plane is counted whole rather than sampled first. */
#define SAMPLE_FROM 16384

int64_t ckptio__float_encode(ckptio__codec_ctx *c, int dtype, const uint8_t *src, uint64_t n,
                             uint8_t *dst, uint64_t cap)
{
    layout l;
    CKPTIO__RET_IF(!layout_of(dtype, &l) || n % l.unit, CKPTIO_E_USAGE);
    uint64_t elems = n / l.unit;
    if (!elems) return 0;
    const uint8_t *planes = src; /* one byte an element: the block is its own plane */
    if (l.planes > 1) {
        split(&l, src, elems, c->planes);
        planes = c->planes;
    }
    /* Each plane's mode from its counts alone: the Huffman size is known before coding. Plane
     * 0 (the exponent) is counted whole; the others are sampled first, and counted whole only
     * when the sample says coding them may pay (a mantissa rarely does; an XOR delta's does). */
    uint8_t mode[CKPTIO__MAX_PLANES], value[CKPTIO__MAX_PLANES];
    uint64_t total = 4;
    for (unsigned p = 0; p < l.planes; p++) {
        const uint8_t *s = planes + p * elems;
        if (p && elems >= SAMPLE_FROM) {
            uint32_t cnt[256] = {0};
            uint64_t seen = 0;
            for (uint64_t i = 0; i < elems; i += 8, seen++) cnt[s[i]]++;
            if (ckptio__huff_bits(cnt) * 100 > seen * 8 * 97) {
                mode[p] = P_RAW;
                total += 1 + elems;
                continue;
            }
        }
        memset(c->hist[p], 0, sizeof c->hist[p]);
        count4(s, elems, c->hist[p]);
        unsigned distinct = 0;
        for (unsigned v = 0; v < 256 && distinct < 2; v++)
            if (c->hist[p][0][v] | c->hist[p][1][v] | c->hist[p][2][v] | c->hist[p][3][v]) {
                distinct++;
                value[p] = (uint8_t)v;
            }
        if (distinct == 1) {
            mode[p] = P_CONST;
            total += 2;
            continue;
        }
        ckptio__huff_build(&c->enc[p], c->hist[p], 1);
        mode[p] = c->enc[p].size < elems ? P_HUFF : P_RAW;
        /* A code per quarter where the statistics change along the block (a tensor's rows of
         * different scales): kept when it is smaller, tables included. */
        if (mode[p] == P_HUFF && streams_vary(c->hist[p])) {
            uint64_t one = c->enc[p].size;
            ckptio__huff_enc *four = &c->enc4;
            ckptio__huff_build(four, c->hist[p], CKPTIO__HUFF_STREAMS);
            if (four->size < one) {
                ckptio__huff_enc t = c->enc[p];
                c->enc[p] = *four;
                *four = t;
                mode[p] = P_HUFF4;
            }
        }
        total += 1 + (mode[p] == P_RAW ? elems : c->enc[p].size);
    }
    if (total > n - n / 50 || total > cap) return 0;
    uint8_t *o = dst + 4;
    ckptio__store32(dst, (uint32_t)elems);
    for (unsigned p = 0; p < l.planes; p++) {
        const uint8_t *s = planes + p * elems;
        *o++ = mode[p];
        if (mode[p] == P_CONST) {
            *o++ = value[p];
        } else if (mode[p] == P_RAW) {
            memcpy(o, s, elems);
            o += elems;
        } else { /* P_HUFF, P_HUFF4: the code says how many tables */
            ckptio__huff_encode(&c->enc[p], s, elems, o);
            o += c->enc[p].size;
        }
    }
    assert((uint64_t)(o - dst) == total);
    return (int64_t)total;
}

int ckptio__float_decode(ckptio__codec_ctx *c, int dtype, const uint8_t *src, uint64_t stored,
                         uint8_t *dst, uint64_t raw)
{
    layout l;
    CKPTIO__RET_IF(!layout_of(dtype, &l) || raw % l.unit || !raw, CKPTIO_E_CORRUPT);
    uint64_t elems = raw / l.unit, pos = 4;
    /* The element count first: a block of constant planes says nothing else about its size. */
    CKPTIO__RET_IF(stored < 4 || ckptio__load32(src) != elems, CKPTIO_E_CORRUPT);
    const uint8_t *pl[CKPTIO__MAX_PLANES];
    for (unsigned p = 0; p < l.planes; p++) {
        CKPTIO__RET_IF(pos >= stored, CKPTIO_E_CORRUPT);
        /* A one-plane layout decodes straight into the block. */
        uint8_t mode = src[pos++], *out = l.planes == 1 ? dst : c->planes + p * elems;
        if (mode == P_RAW) {
            CKPTIO__RET_IF(stored - pos < elems, CKPTIO_E_CORRUPT);
            pl[p] = src + pos;
            pos += elems;
        } else if (mode == P_CONST) {
            CKPTIO__RET_IF(pos >= stored, CKPTIO_E_CORRUPT);
            memset(out, src[pos++], elems);
            pl[p] = out;
        } else if (mode == P_HUFF || mode == P_HUFF4) {
            int64_t used = ckptio__huff_parse(&c->dec, src + pos, stored - pos,
                                              mode == P_HUFF ? 1 : CKPTIO__HUFF_STREAMS);
            CKPTIO__TRY(used);
            CKPTIO__TRY(ckptio__huff_decode(&c->dec, out, elems, src + stored));
            pl[p] = out;
            pos += (uint64_t)used;
        } else {
            return CKPTIO_E_CORRUPT;
        }
    }
    CKPTIO__RET_IF(pos != stored, CKPTIO_E_CORRUPT);
    if (l.planes == 1) {
        if (pl[0] != dst) memcpy(dst, pl[0], elems);
    } else {
        merge(&l, pl, elems, dst);
    }
    return 0;
}
