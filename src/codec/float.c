/* SPDX-License-Identifier: Apache-2.0 */
/* The float codec: each element's bits regrouped into byte planes, each plane coded or kept. */
#include "coder.h"

/* How a dtype's elements become byte planes (doc/codecs.md section 2). Every plane holds one
 * byte per element; plane 0 is the one that holds the exponent. */
enum { L_BF16, L_F32, L_BYTES };
typedef struct layout {
    unsigned kind, unit, planes; /* unit: bytes per element as the layout sees it */
} layout;

/* A plane's mode byte. */
enum { P_RAW = 0, P_CONST = 1, P_HUFF = 2 };

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

/* Split elements [a, b) into the planes (each n bytes apart) and count them in stream k. */
static void split(const layout *l, const uint8_t *src, uint64_t a, uint64_t b, uint64_t n,
                  uint8_t *planes, ckptio__hist *hist, unsigned k)
{
    switch (l->kind) {
    case L_BF16:
        for (uint64_t i = a; i < b; i++) {
            unsigned v = (unsigned)src[2 * i] | (unsigned)src[2 * i + 1] << 8;
            uint8_t e = (uint8_t)(v >> 7), m = (uint8_t)((v >> 8 & 0x80) | (v & 0x7f));
            planes[i] = e;
            planes[n + i] = m;
            hist[0][k][e]++;
            hist[1][k][m]++;
        }
        break;
    case L_F32:
        for (uint64_t i = a; i < b; i++) {
            const uint8_t *s = src + 4 * i;
            uint8_t e = (uint8_t)(s[3] << 1 | s[2] >> 7), m = (uint8_t)((s[3] & 0x80) | (s[2] & 0x7f));
            planes[i] = e;
            planes[n + i] = m;
            planes[2 * n + i] = s[1];
            planes[3 * n + i] = s[0];
            hist[0][k][e]++;
            hist[1][k][m]++;
            hist[2][k][s[1]]++;
            hist[3][k][s[0]]++;
        }
        break;
    default:
        for (uint64_t i = a; i < b; i++)
            for (unsigned p = 0; p < l->unit; p++) {
                uint8_t v = src[l->unit * i + l->unit - 1 - p];
                planes[p * n + i] = v;
                hist[p][k][v]++;
            }
        break;
    }
}

/* The inverse: element i from the planes' bytes. */
static void merge(const layout *l, const uint8_t *const *pl, uint64_t n, uint8_t *dst)
{
    switch (l->kind) {
    case L_BF16:
        for (uint64_t i = 0; i < n; i++) {
            unsigned e = pl[0][i], m = pl[1][i];
            dst[2 * i] = (uint8_t)(e << 7 | (m & 0x7f));
            dst[2 * i + 1] = (uint8_t)((m & 0x80) | e >> 1);
        }
        break;
    case L_F32:
        for (uint64_t i = 0; i < n; i++) {
            unsigned e = pl[0][i], m = pl[1][i];
            dst[4 * i] = pl[3][i];
            dst[4 * i + 1] = pl[2][i];
            dst[4 * i + 2] = (uint8_t)(e << 7 | (m & 0x7f));
            dst[4 * i + 3] = (uint8_t)((m & 0x80) | e >> 1);
        }
        break;
    default:
        for (uint64_t i = 0; i < n; i++)
            for (unsigned p = 0; p < l->unit; p++) dst[l->unit * i + l->unit - 1 - p] = pl[p][i];
        break;
    }
}

int64_t ckptio__float_encode(ckptio__codec_ctx *c, int dtype, const uint8_t *src, uint64_t n,
                             uint8_t *dst, uint64_t cap)
{
    layout l;
    CKPTIO__RET_IF(!layout_of(dtype, &l) || n % l.unit, CKPTIO_E_USAGE);
    uint64_t elems = n / l.unit, q = ckptio__huff_quarter(elems);
    if (!elems) return 0;
    memset(c->hist, 0, l.planes * sizeof c->hist[0]);
    for (unsigned k = 0; k < CKPTIO__HUFF_STREAMS; k++)
        split(&l, src, k * q, k + 1 < CKPTIO__HUFF_STREAMS ? (k + 1) * q : elems, elems,
              c->planes, c->hist, k);
    /* Each plane's mode from its counts alone: the Huffman size is known before coding. */
    uint8_t mode[CKPTIO__MAX_PLANES];
    uint64_t total = 4;
    for (unsigned p = 0; p < l.planes; p++) {
        unsigned distinct = 0;
        for (unsigned s = 0; s < 256 && distinct < 2; s++)
            for (unsigned k = 0; k < CKPTIO__HUFF_STREAMS; k++)
                if (c->hist[p][k][s]) {
                    distinct++;
                    break;
                }
        if (distinct == 1) {
            mode[p] = P_CONST;
            total += 2;
            continue;
        }
        ckptio__huff_build(&c->enc[p], c->hist[p]);
        mode[p] = c->enc[p].size < elems ? P_HUFF : P_RAW;
        total += 1 + (mode[p] == P_HUFF ? c->enc[p].size : elems);
    }
    if (total > n - n / 50 || total > cap) return 0;
    uint8_t *o = dst + 4, *lim = dst + cap;
    ckptio__store32(dst, (uint32_t)elems);
    for (unsigned p = 0; p < l.planes; p++) {
        const uint8_t *pl = c->planes + p * elems;
        *o++ = mode[p];
        if (mode[p] == P_CONST) {
            *o++ = pl[0];
        } else if (mode[p] == P_RAW) {
            memcpy(o, pl, elems);
            o += elems;
        } else {
            ckptio__huff_encode(&c->enc[p], pl, elems, o, lim);
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
        uint8_t mode = src[pos++], *scratch = c->planes + p * elems;
        if (mode == P_RAW) {
            CKPTIO__RET_IF(stored - pos < elems, CKPTIO_E_CORRUPT);
            pl[p] = src + pos;
            pos += elems;
        } else if (mode == P_CONST) {
            CKPTIO__RET_IF(pos >= stored, CKPTIO_E_CORRUPT);
            memset(scratch, src[pos++], elems);
            pl[p] = scratch;
        } else if (mode == P_HUFF) {
            int64_t used = ckptio__huff_parse(&c->dec, src + pos, stored - pos);
            CKPTIO__TRY(used);
            CKPTIO__TRY(ckptio__huff_decode(&c->dec, scratch, elems, src + stored));
            pl[p] = scratch;
            pos += (uint64_t)used;
        } else {
            return CKPTIO_E_CORRUPT;
        }
    }
    CKPTIO__RET_IF(pos != stored, CKPTIO_E_CORRUPT);
    merge(&l, pl, elems, dst);
    return 0;
}
