/* SPDX-License-Identifier: Apache-2.0 */
/* Per-block codecs: float-aware (exponent field entropy-coded), zstd, none. Pure code, fuzzed. */
#ifndef CKPTIO_CODEC_H
#define CKPTIO_CODEC_H

#include "../common/common.h"

/* A chunk of a compressed checkpoint is cut into blocks of the checkpoint's block size (its
 * checksum block, 1 MiB by default), each encoded on its own, so a region read decodes only the
 * blocks it overlaps. A block's raw bytes are always a whole number of elements (block sizes
 * are powers of two >= 4096, element sizes divide them, and a chunk's last block ends with
 * its last element). The codec ids (CKPTIO__CODEC_*) are format constants: common.h.
 *
 * Encoding never allocates: a context holds one thread's scratch for blocks up to its
 * max_block bytes. Decoding is safe on hostile input: it reads only src[0, stored), writes
 * only dst[0, raw), and produces exactly `raw` bytes or fails with CKPTIO_E_CORRUPT; no input
 * can make it expand past `raw` (no decompression bomb). The stream formats are in
 * doc/codecs.md. */

typedef struct ckptio__codec_ctx ckptio__codec_ctx;

/* A context for blocks of at most max_block raw bytes (a power of two, 4096 .. 64 MiB).
 * Returns 0, -ENOMEM, or CKPTIO_E_USAGE for a bad max_block. */
CKPTIO__HIDDEN int ckptio__codec_ctx_new(ckptio__codec_ctx **out, uint64_t max_block);
/* Accepts NULL. */
CKPTIO__HIDDEN void ckptio__codec_ctx_free(ckptio__codec_ctx *c);

/* The codec a tensor of this dtype gets when compression is asked for: CKPTIO__CODEC_FLOAT
 * for the float dtypes the float coder knows, CKPTIO__CODEC_ZSTD for everything else. */
CKPTIO__HIDDEN unsigned ckptio__codec_for(int dtype);

/* Encode one block of n raw bytes (n <= max_block, a multiple of the dtype's size) of `dtype`
 * with `codec` (not NONE) into dst, which has room for cap >= n bytes. Returns the stored size
 * when it saves at least 2 % (stored <= n - n / 50), or 0 when the block is to be stored raw
 * (it would not shrink enough, or a cheap look at it said so before any coding was spent).
 * Negative only for misuse (CKPTIO_E_USAGE). */
CKPTIO__HIDDEN int64_t ckptio__codec_encode(ckptio__codec_ctx *c, unsigned codec, int dtype,
                                            const uint8_t *src, uint64_t n, uint8_t *dst,
                                            uint64_t cap);

/* Decode the `stored` bytes of one block encoded with `codec` for `dtype` into exactly `raw`
 * bytes at dst (raw <= max_block). 0, or CKPTIO_E_CORRUPT for anything inconsistent (unknown
 * codec, truncated or overlong stream, sizes that disagree, raw not a multiple of the
 * element size); CKPTIO_E_USAGE for raw > max_block. A block stored raw (stored == raw) is
 * not passed here: the caller copies it. */
CKPTIO__HIDDEN int ckptio__codec_decode(ckptio__codec_ctx *c, unsigned codec, int dtype,
                                        const uint8_t *src, uint64_t stored, uint8_t *dst,
                                        uint64_t raw);

/* A short name for messages and `ckptio inspect`: "none", "zstd", "float"; "?" otherwise. */
CKPTIO__HIDDEN const char *ckptio__codec_name(unsigned codec);

#endif
