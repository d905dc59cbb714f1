/* SPDX-License-Identifier: Apache-2.0 */
/* The entropy coder: order-0 canonical Huffman codes of at most 11 bits, four streams a plane. */
#include "coder.h"

#define MAXLEN CKPTIO__HUFF_MAXLEN
#define NS CKPTIO__HUFF_STREAMS

/* Heapsort of at most 256 keys: qsort may allocate, and encoding never does. */
static void sift(uint64_t *k, unsigned at, unsigned n)
{
    for (unsigned child; (child = 2 * at + 1) < n; at = child) {
        if (child + 1 < n && k[child + 1] > k[child]) child++;
        if (k[at] >= k[child]) return;
        uint64_t t = k[at];
        k[at] = k[child];
        k[child] = t;
    }
}

static void sort_keys(uint64_t *k, unsigned n)
{
    for (unsigned i = n / 2; i-- > 0;) sift(k, i, n);
    for (unsigned end = n; end-- > 1;) {
        uint64_t t = k[0];
        k[0] = k[end];
        k[end] = t;
        sift(k, 0, end);
    }
}

/* Optimal code lengths (two-queue Huffman over the sorted leaves), then limited to MAXLEN: the
 * longer codes are cut to MAXLEN, the Kraft sum brought back to 1 by lengthening the rarest
 * short codes, and any room left given back to the most frequent ones. Deterministic: ties
 * break on the symbol. Returns the number of symbols present. */
static unsigned code_lengths(const uint64_t count[256], uint8_t len[256])
{
    uint64_t key[256];
    unsigned n = 0;
    memset(len, 0, 256);
    for (unsigned s = 0; s < 256; s++)
        if (count[s]) key[n++] = count[s] << 8 | s;
    if (n < 2) {
        if (n == 1) len[key[0] & 0xff] = 1;
        return n;
    }
    sort_keys(key, n);
    uint64_t w[512];
    uint16_t parent[512];
    uint8_t depth[512];
    for (unsigned i = 0; i < n; i++) w[i] = key[i] >> 8;
    unsigned leaf = 0, inner = n;
    for (unsigned next = n; next < 2 * n - 1; next++) {
        unsigned pick[2];
        for (int j = 0; j < 2; j++) {
            if (leaf < n && (inner >= next || w[leaf] <= w[inner]))
                pick[j] = leaf++;
            else
                pick[j] = inner++;
        }
        w[next] = w[pick[0]] + w[pick[1]];
        parent[pick[0]] = parent[pick[1]] = (uint16_t)next;
    }
    depth[2 * n - 2] = 0;
    for (int i = (int)(2 * n) - 3; i >= 0; i--) {
        unsigned d = depth[parent[i]] + 1u;
        depth[i] = (uint8_t)(d > 255 ? 255 : d);
    }
    /* Kraft sum in units of 2^-MAXLEN. */
    uint64_t kraft = 0, full = 1u << MAXLEN;
    uint8_t l[256];
    for (unsigned i = 0; i < n; i++) {
        l[i] = depth[i] > MAXLEN ? MAXLEN : depth[i];
        kraft += 1u << (MAXLEN - l[i]);
    }
    while (kraft > full) /* key[] runs rarest first */
        for (unsigned i = 0; i < n && kraft > full; i++)
            if (l[i] < MAXLEN) {
                l[i]++;
                kraft -= 1u << (MAXLEN - l[i]);
            }
    /* Shortening a code of the longest length always fits while kraft < full, so this ends. */
    while (kraft < full)
        for (int i = (int)n - 1; i >= 0 && kraft < full; i--)
            if (l[i] > 1 && kraft + (1u << (MAXLEN - l[i])) <= full) {
                kraft += 1u << (MAXLEN - l[i]);
                l[i]--;
            }
    for (unsigned i = 0; i < n; i++) len[key[i] & 0xff] = l[i];
    return n;
}

uint64_t ckptio__huff_bits(const uint32_t count[256])
{
    uint64_t c[256], bits = 0;
    uint8_t len[256];
    for (unsigned s = 0; s < 256; s++) c[s] = count[s];
    if (code_lengths(c, len) < 2) return 0;
    for (unsigned s = 0; s < 256; s++) bits += c[s] * len[s];
    return bits;
}

/* Canonical codes from lengths: shorter codes first, then by symbol; reversed for LSB-first
 * streams. Returns false when the lengths do not make a complete prefix code. */
static bool canonical(const uint8_t len[256], uint16_t code[256])
{
    unsigned nlen[MAXLEN + 1] = {0};
    uint64_t kraft = 0;
    for (unsigned s = 0; s < 256; s++) {
        if (!len[s]) continue;
        if (len[s] > MAXLEN) return false;
        nlen[len[s]]++;
        kraft += 1u << (MAXLEN - len[s]);
    }
    if (kraft != 1u << MAXLEN) return false;
    unsigned next[MAXLEN + 2];
    next[1] = 0;
    for (unsigned b = 1; b <= MAXLEN; b++) next[b + 1] = (next[b] + nlen[b]) << 1;
    for (unsigned s = 0; s < 256; s++) {
        unsigned b = len[s];
        if (!b) continue;
        unsigned v = next[b]++, r = 0;
        for (unsigned i = 0; i < b; i++) r |= ((v >> i) & 1u) << (b - 1 - i);
        code[s] = (uint16_t)r;
    }
    return true;
}

/* Bytes of a table: one code for the plane lists lengths from symbol 0 to its last; a code
 * per stream, from its first symbol to its last (an exponent's symbols sit in a narrow band). */
static uint64_t table_bytes(unsigned tables, unsigned first, unsigned last)
{
    return tables == 1 ? 1 + (last + 2) / 2 : 2 + (last - first + 2) / 2;
}

void ckptio__huff_build(ckptio__huff_enc *h, const ckptio__hist hist, unsigned tables)
{
    h->tables = tables;
    h->size = 4 * NS;
    for (unsigned t = 0; t < tables; t++) {
        uint64_t count[256];
        for (unsigned s = 0; s < 256; s++) {
            uint64_t c = 0;
            for (unsigned k = 0; k < NS; k++)
                if (tables == 1 || k == t) c += hist[k][s];
            count[s] = c;
        }
        unsigned n = code_lengths(count, h->len[t]);
        assert(n >= 2);
        CKPTIO__UNUSED(n);
        bool ok = canonical(h->len[t], h->code[t]);
        assert(ok);
        CKPTIO__UNUSED(ok);
        h->first[t] = 256;
        h->last[t] = 0;
        for (unsigned s = 0; s < 256; s++)
            if (h->len[t][s]) {
                h->last[t] = s;
                if (h->first[t] == 256) h->first[t] = s;
            }
        for (unsigned s = 0; s < 256; s++)
            h->cl[t][s] = h->code[t][s] | (uint32_t)h->len[t][s] << 16;
        h->size += table_bytes(tables, h->first[t], h->last[t]);
    }
    for (unsigned k = 0; k < NS; k++) {
        const uint8_t *len = h->len[tables == 1 ? 0 : k];
        uint64_t bits = 0;
        for (unsigned s = 0; s < 256; s++) bits += (uint64_t)hist[k][s] * len[s];
        h->stream_bytes[k] = (bits + 7) / 8;
        h->size += h->stream_bytes[k];
    }
}

/* Add one symbol's code to a stream's accumulator. */
#define PUT(acc, nb, sym)                                                                      \
    do {                                                                                       \
        uint32_t e_ = cl[sym];                                                                 \
        acc |= (uint64_t)(e_ & 0xffff) << nb;                                                  \
        nb += e_ >> 16;                                                                        \
    } while (0)
/* Store the accumulator's whole bytes (8 written, the pending ones rewritten next time). */
#define FLUSH(acc, nb, o)                                                                      \
    do {                                                                                       \
        ckptio__store64(o, acc);                                                               \
        o += nb >> 3;                                                                          \
        acc >>= nb & ~7u;                                                                      \
        nb &= 7;                                                                               \
    } while (0)

/* Write one stream of the m symbols at in to out[0, len): codes packed LSB first, the last
 * byte padded with zero bits. */
static void put_stream(const uint32_t *cl, const uint8_t *in, uint64_t m, uint8_t *o, uint64_t len)
{
    uint8_t *end = o + len;
    uint64_t acc = 0, i = 0;
    unsigned nb = 0;
    /* Five codes of at most 11 bits on top of at most 7 pending bits fit the accumulator; the
     * 8-byte store stays inside the stream. */
    for (; i + 5 <= m && o + 8 <= end; i += 5) {
#pragma GCC unroll 5
        for (unsigned j = 0; j < 5; j++) PUT(acc, nb, in[i + j]);
        FLUSH(acc, nb, o);
    }
    for (; i < m; i++) {
        PUT(acc, nb, in[i]);
        for (; nb >= 8; nb -= 8, acc >>= 8) *o++ = (uint8_t)acc;
    }
    if (nb) *o++ = (uint8_t)acc;
    assert(o == end);
}

void ckptio__huff_encode(const ckptio__huff_enc *h, const uint8_t *in, uint64_t n, uint8_t *out)
{
    uint8_t *p = out;
    for (unsigned t = 0; t < h->tables; t++) {
        unsigned first = h->tables == 1 ? 0 : h->first[t], last = h->last[t];
        if (h->tables > 1) *p++ = (uint8_t)first;
        *p++ = (uint8_t)last;
        for (unsigned s = first; s <= last; s += 2)
            *p++ = (uint8_t)(h->len[t][s] | (s + 1 <= last ? h->len[t][s + 1] : 0) << 4);
    }
    for (unsigned k = 0; k < NS; k++, p += 4) ckptio__store32(p, (uint32_t)h->stream_bytes[k]);
    /* One stream after another: the out-of-order core overlaps their short dependency chains
     * by itself, and one stream's state stays in registers. */
    uint64_t q = ckptio__huff_quarter(n);
    for (unsigned k = 0; k < NS; k++) {
        put_stream(h->cl[h->tables == 1 ? 0 : k], in + k * q, k + 1 < NS ? q : n - k * q, p, h->stream_bytes[k]);
        p += h->stream_bytes[k];
    }
}

/* One table at src[0, avail) into e and e2 (ranged: it starts with its first symbol): its
 * bytes, or CKPTIO_E_CORRUPT. */
static int64_t parse_table(uint16_t *et, uint32_t *e2, const uint8_t *src, uint64_t avail,
                           bool ranged)
{
    CKPTIO__RET_IF(avail < 1u + ranged, CKPTIO_E_CORRUPT);
    unsigned first = ranged ? src[0] : 0, last = src[ranged];
    CKPTIO__RET_IF(first > last, CKPTIO_E_CORRUPT);
    uint64_t size = table_bytes(ranged ? CKPTIO__HUFF_STREAMS : 1, first, last);
    const uint8_t *lens = src + 1 + ranged;
    CKPTIO__RET_IF(avail < size, CKPTIO_E_CORRUPT);
    uint8_t len[256] = {0};
    uint16_t code[256];
    unsigned present = 0;
    for (unsigned s = first; s <= last; s++) {
        unsigned j = s - first;
        len[s] = (uint8_t)(lens[j / 2] >> (j & 1 ? 4 : 0) & 15);
        present += len[s] != 0;
    }
    /* Two symbols at least: a plane of one value is coded as a constant, never as a code. */
    CKPTIO__RET_IF(present < 2 || !canonical(len, code), CKPTIO_E_CORRUPT);
    for (unsigned s = 0; s <= last; s++) {
        if (!len[s]) continue;
        uint16_t e = (uint16_t)(s | len[s] << 8);
        for (unsigned j = code[s]; j < CKPTIO__HUFF_TABLE; j += 1u << len[s]) et[j] = e;
    }
    /* A second symbol joins the first where its whole code lies inside the same 11 bits. */
    for (unsigned j = 0; j < CKPTIO__HUFF_TABLE; j++) {
        unsigned a = et[j], la = a >> 8, b = et[j >> la], lb = b >> 8;
        e2[j] = la + lb <= MAXLEN ? (a & 0xff) | (b & 0xff) << 8 | (la + lb) << 16 | 2u << 24
                                  : (a & 0xff) | la << 16 | 1u << 24;
    }
    return (int64_t)size;
}

int64_t ckptio__huff_parse(ckptio__huff_dec *d, const uint8_t *src, uint64_t avail,
                           unsigned tables)
{
    uint64_t pos = 0;
    d->tables = tables;
    for (unsigned t = 0; t < tables; t++) {
        int64_t used = parse_table(d->e[t], d->e2[t], src + pos, avail - pos, tables > 1);
        CKPTIO__TRY(used);
        pos += (uint64_t)used;
    }
    CKPTIO__RET_IF(avail < pos + 4 * NS, CKPTIO_E_CORRUPT);
    uint64_t total = pos + 4 * NS;
    const uint8_t *at = src + total;
    for (unsigned k = 0; k < NS; k++) {
        uint64_t b = ckptio__load32(src + pos + 4 * k);
        d->stream[k] = at;
        CKPTIO__RET_IF(b > avail - total, CKPTIO_E_CORRUPT);
        total += b;
        at += b;
    }
    d->stream[NS] = at;
    return (int64_t)total;
}

/* A stream being read: the valid bits of acc end at bit (p - start) * 8 of the stream. */
typedef struct bits {
    uint64_t acc;
    unsigned nb;
    const uint8_t *p;
} bits;

/* The careful end of a stream: bytes one at a time up to `end`; a code that would need bits
 * past it is corrupt. */
static int finish(bits *b, const uint16_t *t, uint8_t *out, uint64_t m, const uint8_t *end)
{
    for (uint64_t i = 0; i < m; i++) {
        for (; b->nb <= 56 && b->p < end; b->p++, b->nb += 8) b->acc |= (uint64_t)*b->p << b->nb;
        uint16_t e = t[b->acc & (CKPTIO__HUFF_TABLE - 1)];
        CKPTIO__RET_IF((e >> 8) > b->nb, CKPTIO_E_CORRUPT);
        b->acc >>= e >> 8;
        b->nb -= e >> 8;
        out[i] = (uint8_t)e;
    }
    return 0;
}

/* Refill a stream to 56..63 valid bits with one 8-byte load; p advances by at most 7. */
#define REFILL(acc, nb, p)                                                                     \
    do {                                                                                       \
        acc |= ckptio__load64(p) << nb;                                                        \
        p += (63 - nb) >> 3;                                                                   \
        nb |= 56;                                                                              \
    } while (0)

/* One or two symbols of a stream, stored at o (two bytes written either way). */
#define TAKE2(t2, acc, nb, o)                                                                  \
    do {                                                                                       \
        uint32_t e_ = t2[acc & (CKPTIO__HUFF_TABLE - 1)];                                      \
        unsigned l_ = e_ >> 16 & 0xff;                                                         \
        memcpy(o, &e_, 2);                                                                     \
        o += e_ >> 24;                                                                         \
        acc >>= l_;                                                                            \
        nb -= l_;                                                                              \
    } while (0)

int ckptio__huff_decode(const ckptio__huff_dec *d, uint8_t *out, uint64_t n, const uint8_t *lim)
{
    /* Each stream's table: the plane's one, or its own. */
    unsigned per = d->tables == 1 ? 0 : 1;
    const uint32_t *t2_0 = d->e2[0], *t2_1 = d->e2[per], *t2_2 = d->e2[2 * per],
                   *t2_3 = d->e2[3 * per];
    uint64_t q = ckptio__huff_quarter(n);
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    unsigned n0 = 0, n1 = 0, n2 = 0, n3 = 0;
    const uint8_t *p0 = d->stream[0], *p1 = d->stream[1], *p2 = d->stream[2], *p3 = d->stream[3];
    uint8_t *o0 = out, *o1 = out + q, *o2 = out + 2 * q, *o3 = out + 3 * q;
    uint8_t *const e0 = o1, *const e1 = o2, *const e2 = o3, *const e3 = out + n;
    /* Five lookups of at most 11 bits per refill, each giving one or two symbols; the four
     * streams interleaved so that their lookups overlap. `rounds` refills of at most 7 bytes
     * stay inside the input, and rounds of at most 10 symbols inside each stream's output. */
    for (;;) {
        const uint8_t *far = p0 > p1 ? p0 : p1;
        far = far > p2 ? far : p2;
        far = far > p3 ? far : p3;
        uint64_t rounds = far + 8 <= lim ? (uint64_t)(lim - far - 8) / 7 + 1 : 0;
        uint64_t left = CKPTIO__MIN(CKPTIO__MIN(e0 - o0, e1 - o1), CKPTIO__MIN(e2 - o2, e3 - o3));
        rounds = CKPTIO__MIN(rounds, left / 10);
        if (!rounds) break;
        for (uint64_t r = 0; r < rounds; r++) {
            REFILL(a0, n0, p0);
            REFILL(a1, n1, p1);
            REFILL(a2, n2, p2);
            REFILL(a3, n3, p3);
#pragma GCC unroll 5
            for (unsigned j = 0; j < 5; j++) {
                TAKE2(t2_0, a0, n0, o0);
                TAKE2(t2_1, a1, n1, o1);
                TAKE2(t2_2, a2, n2, o2);
                TAKE2(t2_3, a3, n3, o3);
            }
        }
    }
    bits b[NS] = {{a0, n0, p0}, {a1, n1, p1}, {a2, n2, p2}, {a3, n3, p3}};
    uint8_t *o[NS] = {o0, o1, o2, o3};
    for (unsigned k = 0; k < NS; k++) {
        uint8_t *end = k + 1 < NS ? out + (k + 1) * q : out + n;
        const uint8_t *start = d->stream[k], *stop = d->stream[k + 1];
        CKPTIO__TRY(finish(&b[k], d->e[k * per], o[k], (uint64_t)(end - o[k]), stop));
        /* The stream must be used up exactly: its last byte holds at least one of its bits. */
        uint64_t used = (uint64_t)(b[k].p - start) * 8 - b[k].nb, have = (uint64_t)(stop - start);
        CKPTIO__RET_IF(used > have * 8 || (have && used <= have * 8 - 8), CKPTIO_E_CORRUPT);
    }
    return 0;
}
