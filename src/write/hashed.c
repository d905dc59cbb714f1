/* SPDX-License-Identifier: Apache-2.0 */
/* A chunk's bytes into the data file through the sink, their block checksums taken on the way
 * (here, or on the hasher thread for large chunks). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "writer.h"

void ckptio__writer_hash_blocks(ckptio_writer *w, const uint8_t *src, uint64_t n, uint64_t *out)
{
    uint64_t B = w->cfg.csum_block;
    for (uint64_t i = 0, k = 0; i < n; i += B, k++) out[k] = ckptio__hash(src + i, CKPTIO__MIN(B, n - i));
}

/* Wait for the hasher and move its results into place. */
void ckptio__writer_settle_hashes(ckptio_writer *w)
{
    if (!w->pending.len) return;
    ckptio__hasher_wait(w->hasher);
    for (size_t i = 0; i < w->pending.len; i++) {
        pending_csums *p = CKPTIO__VEC_AT(&w->pending, pending_csums, i);
        memcpy(CKPTIO__VEC_AT(&w->csums, uint64_t, p->at), p->buf, p->n * sizeof *p->buf);
        free(p->buf);
    }
    w->pending.len = 0;
}

typedef struct hash_ctx {
    ckptio_writer *w;
    uint64_t csum_at; /* the chunk's first checksum */
} hash_ctx;

/* The sink's hook: checksums of the blocks of one piece, `at` bytes into the chunk (pieces
 * start on block boundaries). */
static void hash_piece(void *ctx, const uint8_t *piece, uint64_t n, uint64_t at)
{
    hash_ctx *h = ctx;
    ckptio__writer_hash_blocks(h->w, piece, n,
                CKPTIO__VEC_AT(&h->w->csums, uint64_t, h->csum_at + at / h->w->cfg.csum_block));
}

/* Write one chunk's bytes at `off`; its block checksums go to csums[csum_at...]. Large chunks
 * are hashed by the hasher thread from the caller's memory while this thread copies and
 * submits, which the buffer lifetime rule (valid until flush or commit) allows. */
int ckptio__writer_put_raw(ckptio_writer *w, const uint8_t *src, uint64_t n, uint64_t off,
                           uint64_t csum_at, uint64_t n_csums)
{
    uint64_t B = w->cfg.csum_block;
    bool async = n_csums && n >= ASYNC_HASH_MIN;
    if (async) {
        if (!w->hasher) CKPTIO__TRY(ckptio__hasher_start(&w->hasher, B));
        pending_csums p = {.at = csum_at, .n = n_csums, .buf = malloc(n_csums * sizeof(uint64_t))};
        if (!p.buf || ckptio__vec_push(&w->pending, &p, 1) < 0) {
            free(p.buf);
            return -ENOMEM;
        }
        CKPTIO__TRY(ckptio__hasher_push(w->hasher, src, n, p.buf));
    }
    CKPTIO__TRY(ckptio__sink_seek(&w->sink, off));
    hash_ctx h = {.w = w, .csum_at = csum_at};
    return ckptio__sink_put(&w->sink, src, n, B, n_csums && !async ? hash_piece : NULL, &h);
}
