/* SPDX-License-Identifier: Apache-2.0 */
/* The zstd codec: one zstd frame per block, level 1, its window no larger than the block. */
#define ZSTD_STATIC_LINKING_ONLY /* contexts in workspaces we own: encoding never allocates */
#include <errno.h>
#include <stdlib.h>
#include <zstd.h>

#include "coder.h"

int ckptio__zstd_init(ckptio__codec_ctx *c)
{
    ZSTD_compressionParameters cp = ZSTD_getCParams(1, c->max_block, 0);
    c->zc_len = ZSTD_estimateCCtxSize_usingCParams(cp);
    c->zd_len = ZSTD_estimateDCtxSize();
    c->zc_ws = malloc(c->zc_len);
    c->zd_ws = malloc(c->zd_len);
    if (!c->zc_ws || !c->zd_ws) return -ENOMEM;
    c->zc = ZSTD_initStaticCCtx(c->zc_ws, c->zc_len);
    c->zd = ZSTD_initStaticDCtx(c->zd_ws, c->zd_len);
    if (!c->zc || !c->zd) return -ENOMEM;
    /* A frame asking for a window past the largest block is no frame this codec wrote. */
    unsigned wlog = 10;
    while ((1ull << wlog) < c->max_block) wlog++;
    if (ZSTD_isError(ZSTD_DCtx_setParameter(c->zd, ZSTD_d_windowLogMax, (int)wlog)))
        return -ENOMEM;
    return 0;
}

void ckptio__zstd_free(ckptio__codec_ctx *c)
{
    free(c->zc_ws);
    free(c->zd_ws);
}

/* A look at a sample (one 64-byte line in eight) before any compression is spent: the block
 * is taken for incompressible when its bytes cost above 98 % of 8 bits each under an order-0
 * code and hardly any byte repeats the same byte of the element before (random data: 1 in 256;
 * counters and other integers repeat their high bytes). */
static bool looks_random(const uint8_t *src, uint64_t n, unsigned es)
{
    uint32_t count[256] = {0};
    uint64_t seen = 0, same = 0;
    uint64_t step = n <= 65536 ? 64 : 512;
    for (uint64_t at = 0; at < n; at += step) {
        uint64_t end = CKPTIO__MIN(n, at + 64);
        for (uint64_t i = at; i < end; i++) {
            count[src[i]]++;
            same += i >= at + es && src[i] == src[i - es];
        }
        seen += end - at;
    }
    if (same * 64 > seen) return false;
    return ckptio__huff_bits(count) * 50 > seen * 8 * 49;
}

int64_t ckptio__zstd_encode(ckptio__codec_ctx *c, unsigned es, const uint8_t *src, uint64_t n,
                            uint8_t *dst, uint64_t cap)
{
    if (!n || looks_random(src, n, es)) return 0;
    uint64_t room = CKPTIO__MIN(cap, n - n / 50);
    size_t r = ZSTD_compressCCtx(c->zc, dst, room, src, n, 1);
    /* Too large for the room (or any other refusal): the block is stored raw. */
    if (ZSTD_isError(r) || r > room) return 0;
    return (int64_t)r;
}

int ckptio__zstd_decode(ckptio__codec_ctx *c, const uint8_t *src, uint64_t stored, uint8_t *dst,
                        uint64_t raw)
{
    /* The frame must declare exactly `raw` bytes and be exactly `stored` long. */
    unsigned long long declared = ZSTD_getFrameContentSize(src, stored);
    CKPTIO__RET_IF(declared != raw, CKPTIO_E_CORRUPT);
    size_t len = ZSTD_findFrameCompressedSize(src, stored);
    CKPTIO__RET_IF(ZSTD_isError(len) || len != stored, CKPTIO_E_CORRUPT);
    size_t r = ZSTD_decompressDCtx(c->zd, dst, raw, src, stored);
    CKPTIO__RET_IF(ZSTD_isError(r) || r != raw, CKPTIO_E_CORRUPT);
    return 0;
}
