/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for the block codecs: hostile streams decode within bounds or are refused. */
#include <stdlib.h>
#include <string.h>

#include "../src/codec/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) abort();                                                                  \
    } while (0)

/* Blocks up to 256 KiB: large enough for every layout's four streams, small enough to be fast. */
#define MAX_BLOCK (256u << 10)

/* The input: a codec byte, a dtype byte, the raw size (4 bytes, little-endian), then a stream.
 * With the codec byte's top bit set, the stream is raw data instead: it is encoded with codec
 * & 0x7f and must decode back to itself. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ckptio__codec_ctx *c;
    if (!c) REQUIRE(ckptio__codec_ctx_new(&c, MAX_BLOCK) == 0);
    if (size < 6) return 0;
    unsigned codec = data[0];
    int dtype = data[1];
    uint64_t raw = (uint64_t)data[2] | (uint64_t)data[3] << 8 | (uint64_t)data[4] << 16 |
                   (uint64_t)data[5] << 24;
    const uint8_t *s = data + 6;
    uint64_t n = size - 6;
    if (codec & 0x80) {
        size_t es = ckptio_dtype_size(dtype);
        codec &= 0x7f;
        if (!es || (codec != 1 && codec != 2) || (codec == 2 && ckptio__codec_for(dtype) != 2))
            return 0;
        n = CKPTIO__MIN(n, MAX_BLOCK) / es * es;
        uint8_t *enc = malloc(n ? n : 1), *back = malloc(n ? n : 1);
        REQUIRE(enc && back);
        int64_t st = ckptio__codec_encode(c, codec, dtype, s, n, enc, n);
        REQUIRE(st >= 0 && (uint64_t)st <= n - n / 50);
        if (st > 0) {
            REQUIRE(ckptio__codec_decode(c, codec, dtype, enc, (uint64_t)st, back, n) == 0);
            REQUIRE(memcmp(back, s, n) == 0);
        }
        free(enc);
        free(back);
        return 0;
    }
    /* Exact-size copies, so a sanitizer flags any access past the stream or the block. */
    /* Past MAX_BLOCK the decoder refuses before it writes: no room is needed. */
    uint8_t *in = malloc(n ? n : 1), *out = malloc(raw && raw <= MAX_BLOCK ? raw : 1);
    REQUIRE(in && out);
    memcpy(in, s, n);
    int rc = raw > MAX_BLOCK ? CKPTIO_E_USAGE : 0;
    int got = ckptio__codec_decode(c, codec, dtype, in, n, out, raw);
    if (rc) {
        REQUIRE(got == rc);
    } else {
        REQUIRE(got == 0 || got == CKPTIO_E_CORRUPT);
        /* What decodes encodes again, and that decodes to the same bytes. */
        if (got == 0) {
            uint8_t *enc = malloc(raw), *back = malloc(raw);
            REQUIRE(enc && back);
            int64_t st = ckptio__codec_encode(c, CKPTIO__CODEC_ID(codec), dtype, out, raw, enc, raw);
            REQUIRE(st >= 0);
            if (st > 0) {
                REQUIRE(ckptio__codec_decode(c, codec, dtype, enc, (uint64_t)st, back, raw) == 0);
                REQUIRE(memcmp(back, out, raw) == 0);
            }
            free(enc);
            free(back);
        }
    }
    free(in);
    free(out);
    return 0;
}
