/* SPDX-License-Identifier: Apache-2.0 */
/* The codec room's insides: the context, the Huffman coder's tables, and each codec's entry. */
#ifndef CKPTIO_CODER_H
#define CKPTIO_CODER_H

#include <assert.h>
#include <string.h>

#include "codec.h"

/* Longest Huffman code: 11 bits keeps the decode tables (2048 entries, 12 KiB) in L1. */
#define CKPTIO__HUFF_MAXLEN 11
#define CKPTIO__HUFF_TABLE (1u << CKPTIO__HUFF_MAXLEN)
/* Every coded plane is cut into this many streams, decoded in lockstep. */
#define CKPTIO__HUFF_STREAMS 4
/* A float layout has at most this many byte planes (f64). */
#define CKPTIO__MAX_PLANES 8

/* The counts of one plane: one histogram per stream (quarter of the plane). */
typedef uint32_t ckptio__hist[CKPTIO__HUFF_STREAMS][256];

/* An encoder's view of one plane's code: one table for the four streams, or one table each
 * (a plane whose statistics change along the block: each quarter gets its own code). */
typedef struct ckptio__huff_enc {
    unsigned tables;                         /* 1 or CKPTIO__HUFF_STREAMS */
    uint8_t len[CKPTIO__HUFF_STREAMS][256];  /* 0 for absent symbols */
    uint16_t code[CKPTIO__HUFF_STREAMS][256]; /* bit-reversed: the first bit sent is bit 0 */
    uint32_t cl[CKPTIO__HUFF_STREAMS][256];  /* code | len << 16, for the coding loop */
    unsigned first[CKPTIO__HUFF_STREAMS];    /* lowest symbol present */
    unsigned last[CKPTIO__HUFF_STREAMS];     /* highest symbol present */
    uint64_t stream_bytes[CKPTIO__HUFF_STREAMS];
    uint64_t size; /* the plane's coded size after its mode byte: tables, stream sizes, streams */
} ckptio__huff_enc;

/* A decoder's tables (one, or one per stream), indexed by the next 11 bits of a stream: e =
 * symbol | length << 8; e2 = the one or two symbols those bits hold whole, first | second << 8
 * | bits << 16 | count << 24. */
typedef struct ckptio__huff_dec {
    unsigned tables;
    uint16_t e[CKPTIO__HUFF_STREAMS][CKPTIO__HUFF_TABLE];
    uint32_t e2[CKPTIO__HUFF_STREAMS][CKPTIO__HUFF_TABLE];
    const uint8_t *stream[CKPTIO__HUFF_STREAMS + 1]; /* starts, then the end of the last */
} ckptio__huff_dec;

struct ckptio__codec_ctx {
    uint64_t max_block;
    uint8_t *planes; /* max_block bytes: planes split for encoding, decoded planes */
    ckptio__hist hist[CKPTIO__MAX_PLANES];
    ckptio__huff_enc enc[CKPTIO__MAX_PLANES];
    ckptio__huff_enc enc4; /* a plane's other code while the two are compared */
    ckptio__huff_dec dec;
    void *zc, *zd; /* ZSTD_CCtx, ZSTD_DCtx in their own workspaces */
    void *zc_ws, *zd_ws;
    size_t zc_len, zd_len;
};

static inline uint64_t ckptio__load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only: the library assumes it throughout */
}
static inline void ckptio__store64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static inline uint32_t ckptio__load32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void ckptio__store32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Where stream k of a plane of n symbols starts: streams 0..2 hold n / 4 symbols each, stream 3
 * the rest. */
static inline uint64_t ckptio__huff_quarter(uint64_t n)
{
    return n / CKPTIO__HUFF_STREAMS;
}

/* Build length-limited canonical codes and size each stream: tables 1, one code for the counts
 * summed over the streams (the plane must have at least two distinct symbols); tables
 * CKPTIO__HUFF_STREAMS, one code per stream (each stream must have two). */
CKPTIO__HIDDEN void ckptio__huff_build(ckptio__huff_enc *h, const ckptio__hist hist,
                                       unsigned tables);
/* Code-length estimate of 256 counts without building codes: bits of a Huffman code limited to
 * CKPTIO__HUFF_MAXLEN (for the looks before coding). */
CKPTIO__HIDDEN uint64_t ckptio__huff_bits(const uint32_t count[256]);
/* Write the plane (h->size bytes: table, stream sizes, streams) for the n bytes at in to out. */
CKPTIO__HIDDEN void ckptio__huff_encode(const ckptio__huff_enc *h, const uint8_t *in, uint64_t n,
                                        uint8_t *out);
/* Parse a plane's `tables` tables (1 or CKPTIO__HUFF_STREAMS) and stream sizes from
 * src[0, avail); fill d. Returns the plane's coded size (tables, sizes and streams) or
 * CKPTIO_E_CORRUPT. */
CKPTIO__HIDDEN int64_t ckptio__huff_parse(ckptio__huff_dec *d, const uint8_t *src, uint64_t avail,
                                          unsigned tables);
/* Decode the n symbols of a parsed plane into out[0, n). `lim` is the end of the block's
 * input (the fast loop may read ahead up to it). 0 or CKPTIO_E_CORRUPT. */
CKPTIO__HIDDEN int ckptio__huff_decode(const ckptio__huff_dec *d, uint8_t *out, uint64_t n,
                                       const uint8_t *lim);

CKPTIO__HIDDEN int64_t ckptio__float_encode(ckptio__codec_ctx *c, int dtype, const uint8_t *src,
                                            uint64_t n, uint8_t *dst, uint64_t cap);
CKPTIO__HIDDEN int ckptio__float_decode(ckptio__codec_ctx *c, int dtype, const uint8_t *src,
                                        uint64_t stored, uint8_t *dst, uint64_t raw);
/* Whether the float coder knows this dtype. */
CKPTIO__HIDDEN bool ckptio__float_knows(int dtype);

CKPTIO__HIDDEN int ckptio__zstd_init(ckptio__codec_ctx *c);
CKPTIO__HIDDEN void ckptio__zstd_free(ckptio__codec_ctx *c);
/* es: the element size, for the look at the block before it is compressed. */
CKPTIO__HIDDEN int64_t ckptio__zstd_encode(ckptio__codec_ctx *c, unsigned es, const uint8_t *src,
                                           uint64_t n, uint8_t *dst, uint64_t cap);
CKPTIO__HIDDEN int ckptio__zstd_decode(ckptio__codec_ctx *c, const uint8_t *src, uint64_t stored,
                                       uint8_t *dst, uint64_t raw);

#endif
