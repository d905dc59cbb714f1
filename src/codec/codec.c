/* SPDX-License-Identifier: Apache-2.0 */
/* The codec room's front: contexts, the codec a dtype gets, and dispatch to each codec. */
#include <errno.h>
#include <stdlib.h>

#include "coder.h"

int ckptio__codec_ctx_new(ckptio__codec_ctx **out, uint64_t max_block)
{
    *out = NULL;
    CKPTIO__RET_IF(!ckptio__is_pow2(max_block) || max_block < 4096 || max_block > (64u << 20),
                   CKPTIO_E_USAGE);
    ckptio__codec_ctx *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->max_block = max_block;
    c->planes = ckptio__map(max_block);
    int rc = c->planes ? ckptio__zstd_init(c) : -ENOMEM;
    if (rc < 0) {
        ckptio__codec_ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ckptio__codec_ctx_free(ckptio__codec_ctx *c)
{
    if (!c) return;
    if (c->planes) ckptio__unmap(c->planes, c->max_block);
    ckptio__zstd_free(c);
    free(c);
}

unsigned ckptio__codec_for(int dtype)
{
    return ckptio__float_knows(dtype) ? CKPTIO__CODEC_FLOAT : CKPTIO__CODEC_ZSTD;
}

int64_t ckptio__codec_encode(ckptio__codec_ctx *c, unsigned codec, int dtype, const uint8_t *src,
                             uint64_t n, uint8_t *dst, uint64_t cap)
{
    size_t esize = ckptio_dtype_size(dtype);
    CKPTIO__RET_IF(!c || !esize || n > c->max_block || n % esize || cap < n, CKPTIO_E_USAGE);
    switch (codec) {
    case CKPTIO__CODEC_ZSTD: return ckptio__zstd_encode(c, (unsigned)esize, src, n, dst, cap);
    case CKPTIO__CODEC_FLOAT: return ckptio__float_encode(c, dtype, src, n, dst, cap);
    default: return CKPTIO_E_USAGE;
    }
}

int ckptio__codec_decode(ckptio__codec_ctx *c, unsigned codec, int dtype, const uint8_t *src,
                         uint64_t stored, uint8_t *dst, uint64_t raw)
{
    CKPTIO__RET_IF(!c, CKPTIO_E_USAGE);
    CKPTIO__RET_IF(raw > c->max_block, CKPTIO_E_USAGE);
    size_t esize = ckptio_dtype_size(dtype);
    CKPTIO__RET_IF(!esize || raw % esize || !raw || !stored, CKPTIO_E_CORRUPT);
    switch (codec) {
    case CKPTIO__CODEC_ZSTD: return ckptio__zstd_decode(c, src, stored, dst, raw);
    case CKPTIO__CODEC_FLOAT: return ckptio__float_decode(c, dtype, src, stored, dst, raw);
    default: return CKPTIO_E_CORRUPT;
    }
}

const char *ckptio__codec_name(unsigned codec)
{
    switch (codec) {
    case CKPTIO__CODEC_NONE: return "none";
    case CKPTIO__CODEC_ZSTD: return "zstd";
    case CKPTIO__CODEC_FLOAT: return "float";
    default: return "?";
    }
}
