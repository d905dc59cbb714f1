/* SPDX-License-Identifier: Apache-2.0 */
/* Coded chunks: blocks encoded on the writer's threads, checksummed raw, stored back to back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../codec/codec.h"
#include "../common/workers.h"
#include "writer.h"

/* Threads that code blocks, the caller's included: the codec runs at 1-3 GB/s a core, so a
 * few keep up with one NVMe drive; more only cost memory (each holds a context and two
 * blocks). */
#define CODER_THREADS 8u
/* Blocks coded per round, per thread: a round's output is copied into staging while the
 * previous rounds' writes are in flight; threads take blocks one at a time, so a round waits
 * for at most one block's worth of imbalance. Memory: this many blocks per thread (half as
 * many with a base, whose bytes take as much again, and a block per thread for the XOR): at
 * most 8 threads x 4 MiB and their contexts (about 2 MiB each), within the 64 MiB ckptio
 * allows itself beside the staging. */
#define BLOCKS_PER_THREAD 4u

void ckptio__writer_coder_free(ckptio_writer *w)
{
    ckptio__coder *c = w->coder;
    if (!c) return;
    ckptio__workers_stop(c->workers);
    for (unsigned i = 0; c->ctx && i < c->threads; i++) ckptio__codec_ctx_free(c->ctx[i]);
    free(c->ctx);
    free(c->out);
    free(c->delta);
    free(c->base);
    free(c);
    w->coder = NULL;
}

static int coder_start(ckptio_writer *w)
{
    if (w->coder) return 0;
    ckptio__coder *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    w->coder = c;
    c->block = w->cfg.csum_block;
    c->threads = ckptio__workers_default(CODER_THREADS);
    c->slots = c->threads * (w->base_reader ? BLOCKS_PER_THREAD / 2 : BLOCKS_PER_THREAD);
    c->ctx = calloc(c->threads, sizeof *c->ctx);
    c->out = malloc(c->slots * c->block);
    if (w->base_reader) {
        c->delta = malloc(c->threads * c->block);
        c->base = malloc(c->slots * c->block);
    }
    if (!c->ctx || !c->out || (w->base_reader && (!c->delta || !c->base))) return -ENOMEM;
    for (unsigned i = 0; i < c->threads; i++)
        CKPTIO__TRY(ckptio__codec_ctx_new(&c->ctx[i], c->block));
    /* Without threads of its own the caller codes alone. */
    if (c->threads > 1 && ckptio__workers_start(&c->workers, c->threads) < 0) c->workers = NULL;
    return 0;
}

unsigned ckptio__writer_codec(ckptio_writer *w, int dtype, uint64_t nbytes, bool host)
{
    if (w->cfg.compress == CKPTIO_COMPRESS_NONE || nbytes < CODED_MIN) return CKPTIO__CODEC_NONE;
    ckptio__coder *c = w->coder;
    if (w->cfg.compress == CKPTIO_COMPRESS_AUTO && host && c &&
        (c->skip >= SKIP_OF / 2 || c->futile) && !w->base_reader) {
        /* The coder has been keeping the device waiting: host chunks go as they are (in
         * place, no copy), but for one in every PROBE_BYTES, coded to look again. */
        if (c->unprobed < PROBE_BYTES) {
            c->unprobed += nbytes;
            return CKPTIO__CODEC_NONE;
        }
        c->unprobed = 0;
    }
    return ckptio__codec_for(dtype);
}

/* One round: blocks [j0, j0 + count) of a chunk, whose bytes from src_at on are at src. */
typedef struct round {
    ckptio__coder *c;
    const uint8_t *src, *base; /* base: the base's bytes of the round, or NULL */
    uint64_t n, j0, src_at;
    unsigned codec;
    int dtype;
    uint64_t *csums;  /* the round's checksums, or NULL */
    uint32_t *sizes;  /* stored size of each block of the round */
    const bool *skip; /* blocks left as they are untried */
} round;

static void code_block(void *ctx, size_t i, unsigned worker)
{
    round *r = ctx;
    ckptio__coder *c = r->c;
    uint64_t at = (r->j0 + i) * c->block, len = CKPTIO__MIN(c->block, r->n - at);
    const uint8_t *raw = r->src + (at - r->src_at);
    if (r->csums) r->csums[i] = ckptio__hash(raw, len); /* checksums prove decoded bytes */
    if (r->base) {
        uint8_t *d = c->delta + (uint64_t)worker * c->block;
        const uint8_t *b = r->base + (at - r->j0 * c->block);
        for (uint64_t k = 0; k < len; k++) d[k] = raw[k] ^ b[k];
        raw = d;
    }
    int64_t got = r->skip[i] ? 0
                              : ckptio__codec_encode(c->ctx[worker], r->codec, r->dtype, raw, len,
                                                     c->out + i * c->block, c->block);
    if (got <= 0) {
        /* Stored as it is: copy it to the slot when it was XORed (the delta buffer is the
         * worker's, reused for its next block). */
        if (r->base) memcpy(c->out + i * c->block, raw, len);
        got = (int64_t)len;
    }
    r->sizes[i] = (uint32_t)got;
}

/* AUTO: after each round, see whether the device waited on the coder. Writes still in flight
 * mean the device is the bottleneck: code more blocks. None in flight means it sat idle while
 * the threads coded: leave more blocks as they are, so the save never runs slower than one
 * without compression. */
static void adapt(ckptio_writer *w, ckptio__coder *c, double waited_before)
{
    if (w->cfg.compress != CKPTIO_COMPRESS_AUTO) return;
    /* A round that had to wait for the device to finish writes: the device is the limit, so
     * code one more block in 16. Two rounds in a row that never waited: the coder is, so
     * leave one more as it is. */
    if (w->sink.waited > waited_before) {
        c->idle = 0;
        if (c->skip > 0) c->skip--;
    } else if (++c->idle >= 2 && c->skip < SKIP_OF - 1) {
        c->idle = 0;
        c->skip++;
    }
}

/* Whether the first block of a chunk codes smaller XORed with its base's bytes (at c->base). */
static bool delta_pays(ckptio__coder *c, unsigned codec, int dtype, const uint8_t *src,
                       uint64_t len)
{
    for (uint64_t k = 0; k < len; k++) c->delta[k] = src[k] ^ c->base[k];
    int64_t plain = ckptio__codec_encode(c->ctx[0], codec, dtype, src, len, c->out, c->block);
    int64_t xored = ckptio__codec_encode(c->ctx[0], codec, dtype, c->delta, len, c->out, c->block);
    return (xored > 0 ? (uint64_t)xored : len) < (plain > 0 ? (uint64_t)plain : len);
}

/* A coded chunk being written: its blocks come in pieces (all at once from host memory, a ring
 * slot at a time from a device). */
typedef struct coded_put {
    ckptio_writer *w;
    uint64_t chunk, n, csum_at, first, stored;
    unsigned codec;
    int dtype;
    bool coded, delta;
    const uint8_t *src; /* host memory: the whole chunk */
    bool auto_host;   /* AUTO from host memory: the rest may go as it is (coded_feed) */
    uint64_t raw_from; /* then: the chunk's bytes from here on are written as they are */
} coded_put;

static int coded_begin(ckptio_writer *w, coded_put *p, uint64_t chunk, uint64_t n,
                       uint64_t csum_at, unsigned codec, int dtype)
{
    int rc = coder_start(w);
    if (rc < 0) return ckptio__fail(&w->msg, rc, "out of memory starting the block coder");
    const ckptio__mchunk *mc = CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, chunk);
    CKPTIO__TRY(ckptio__sink_seek(&w->sink, mc->file_off));
    uint64_t B = w->coder->block;
    int64_t first = ckptio__vec_push(&w->blocks, NULL, (n + B - 1) / B);
    if (first < 0) return ckptio__fail(&w->msg, -ENOMEM, "out of memory for block sizes");
    *p = (coded_put){.w = w, .chunk = chunk, .n = n, .csum_at = csum_at, .first = (uint64_t)first,
                     .codec = codec, .dtype = dtype};
    return 0;
}

/* Bytes [at, at + len) of the chunk, at src: whole blocks from a block boundary (the last
 * piece may end with a short block). */
static int coded_feed(coded_put *p, const uint8_t *src, uint64_t at, uint64_t len)
{
    ckptio_writer *w = p->w;
    ckptio__coder *c = w->coder;
    uint64_t B = c->block, n = p->n, jend = (at + len + B - 1) / B;
    int rc;
    if (at == 0 && w->base_reader) {
        int has = ckptio__writer_base_bytes(w, p->chunk, 0, CKPTIO__MIN(B, n), c->base);
        if (has < 0) return has;
        p->delta = has && delta_pays(c, p->codec, p->dtype, src, CKPTIO__MIN(B, n));
    }
    uint32_t sizes[CODER_THREADS * BLOCKS_PER_THREAD];
    bool skip[CODER_THREADS * BLOCKS_PER_THREAD];
    for (uint64_t j0 = at / B; j0 < jend; j0 += c->slots) {
        unsigned k = (unsigned)CKPTIO__MIN((uint64_t)c->slots, jend - j0);
        if (p->delta && (rc = ckptio__writer_base_bytes(w, p->chunk, j0 * B,
                                                        CKPTIO__MIN((j0 + k) * B, n), c->base)) <= 0)
            return rc < 0 ? rc : ckptio__fail(&w->msg, CKPTIO_E_STATE,
                                              "the base checkpoint changed during the save");
        /* A chunk's first block is always tried: every chunk is sampled, however busy. */
        for (unsigned i = 0; i < k; i++) skip[i] = j0 + i > 0 && c->tick++ % SKIP_OF < c->skip;
        round r = {.c = c, .src = src, .src_at = at, .base = p->delta ? c->base : NULL, .n = n,
                   .j0 = j0, .codec = p->codec, .dtype = p->dtype, .sizes = sizes, .skip = skip,
                   .csums = w->cfg.checksums
                                ? CKPTIO__VEC_AT(&w->csums, uint64_t, p->csum_at + j0)
                                : NULL};
        double waited = w->sink.waited;
        ckptio__workers_for(c->workers, k, code_block, &r);
        for (unsigned i = 0; i < k; i++) {
            uint64_t x = (j0 + i) * B, bl = CKPTIO__MIN(B, n - x);
            bool as_is = sizes[i] == bl;
            const uint8_t *from = as_is && !p->delta ? src + (x - at) : c->out + (uint64_t)i * B;
            CKPTIO__TRY(ckptio__sink_write(&w->sink, from, sizes[i]));
            *CKPTIO__VEC_AT(&w->blocks, uint32_t, p->first + j0 + i) = sizes[i];
            p->stored += sizes[i];
            p->coded = p->coded || !as_is;
        }
        adapt(w, c, waited);
        if (p->auto_host && !p->delta && (!p->coded || c->skip >= SKIP_OF / 2) &&
            j0 + k < jend) {
            /* Incompressible so far (random bytes, already compressed data), or a coder that
             * keeps the device waiting: the rest goes the uncoded way, through the sink and
             * hashed beside the writes (in place, when nothing before it shrank), at no cost
             * over a save without compression. The next chunk's first round looks again. */
            p->raw_from = (j0 + k) * B;
            return 0;
        }
    }
    return 0;
}

static int coded_end(coded_put *p)
{
    ckptio_writer *w = p->w;
    ckptio__mchunk *m = CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, p->chunk);
    if (p->raw_from) {
        /* The rest as it is: its blocks' sizes are their raw lengths. Without a coded block
         * before it the extent is the raw bytes, and the chunk an uncoded one. */
        uint64_t x = p->raw_from, B = w->coder->block, off = m->file_off + p->stored;
        uint64_t n_csums = w->cfg.checksums ? (p->n - x + B - 1) / B : 0;
        for (uint64_t j = x / B; j < (p->n + B - 1) / B; j++)
            *CKPTIO__VEC_AT(&w->blocks, uint32_t, p->first + j) =
                (uint32_t)CKPTIO__MIN(B, p->n - j * B);
        p->stored += p->n - x;
        CKPTIO__TRY(ckptio__writer_put_raw(w, p->src + x, p->n - x, off, p->csum_at + x / B,
                                           n_csums));
    }
    m->stored_len = p->stored;
    if (p->auto_host) w->coder->futile = !p->coded && !p->delta;
    if (!p->coded && !p->delta) {
        /* No block shrank: the chunk is stored exactly as an uncoded one. */
        m->codec = CKPTIO__CODEC_NONE;
        w->blocks.len = (size_t)p->first;
        return 0;
    }
    m->codec = p->codec | (p->delta ? CKPTIO__CODEC_DELTA : 0);
    m->blocks = p->first;
    return 0;
}

int ckptio__writer_put_coded(ckptio_writer *w, uint64_t chunk, const uint8_t *src, uint64_t n,
                             uint64_t csum_at, unsigned codec, int dtype)
{
    coded_put p;
    CKPTIO__TRY(coded_begin(w, &p, chunk, n, csum_at, codec, dtype));
    p.auto_host = w->cfg.compress == CKPTIO_COMPRESS_AUTO;
    p.src = src;
    CKPTIO__TRY(coded_feed(&p, src, 0, n));
    return coded_end(&p);
}

/* A device chunk's ring slots, landed in pinned host memory: whole blocks but the last. */
static int feed_piece(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    return coded_feed(ctx, host, at, n);
}

int ckptio__writer_put_coded_gpu(ckptio_writer *w, uint64_t chunk, uint64_t src, uint64_t n,
                                 uint64_t csum_at, unsigned codec, int dtype, uint64_t stream,
                                 const char *name)
{
    coded_put p;
    CKPTIO__TRY(coded_begin(w, &p, chunk, n, csum_at, codec, dtype));
    CKPTIO__TRY(ckptio__gpu_d2h(&w->gpu, src, n, stream, feed_piece, &p, &w->msg, name));
    CKPTIO__TRY(coded_end(&p));
    ckptio__gpu_count(&w->gpu, false, n);
    return 0;
}
