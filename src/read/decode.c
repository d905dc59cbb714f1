/* SPDX-License-Identifier: Apache-2.0 */
/* Coded chunks: whole blocks read staged, decoded and verified on the workers, then scattered. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../codec/codec.h"
#include "reader.h"

typedef struct ckptio__decoder {
    unsigned n;              /* workers */
    uint64_t block;
    ckptio__codec_ctx **ctx; /* one per worker */
    uint8_t *scratch;        /* one block per worker */
} ckptio__decoder;

/* One block to decode: where its stored bytes are staged and where its raw bytes go. */
typedef struct dblock {
    const seg *s;
    const uint8_t *src;
    uint64_t j, stored, raw;
    uint8_t *dst; /* straight into the destination, or NULL: through the worker's scratch */
    bool bad;
} dblock;

typedef struct djob {
    ckptio_reader *r;
    plan *pl;
    dblock *blocks;
} djob;

bool ckptio__chunk_coded(const ckptio__mchunk *c)
{
    return c->codec != CKPTIO__CODEC_NONE;
}

uint64_t ckptio__read_block_at(const ckptio__manifest *m, const ckptio__mchunk *c, uint64_t j)
{
    uint64_t at = 0;
    for (uint64_t i = 0; i < j; i++) at += m->blocks[c->blocks + i];
    return at;
}

void ckptio__read_decoder_free(ckptio_reader *r)
{
    ckptio__decoder *d = r->dec;
    if (!d) return;
    for (unsigned i = 0; d->ctx && i < d->n; i++) ckptio__codec_ctx_free(d->ctx[i]);
    free(d->ctx);
    free(d->scratch);
    free(d);
    r->dec = NULL;
}

static int decoder_start(ckptio_reader *r, unsigned n)
{
    if (r->dec) return 0;
    ckptio__decoder *d = calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    r->dec = d;
    d->n = n;
    d->block = r->m->csum_block;
    d->ctx = calloc(n, sizeof *d->ctx);
    d->scratch = malloc((size_t)n * d->block);
    if (!d->ctx || !d->scratch) return -ENOMEM;
    for (unsigned i = 0; i < n; i++) CKPTIO__TRY(ckptio__codec_ctx_new(&d->ctx[i], d->block));
    return 0;
}

int ckptio__read_plan_coded(ckptio_reader *r, plan *pl, seg proto, uint64_t lo, uint64_t hi)
{
    const ckptio__manifest *m = r->m;
    const ckptio__mchunk *c = &m->chunks[proto.chunk];
    if (c->codec & CKPTIO__CODEC_DELTA)
        return ckptio__fail_at(&r->msg, CKPTIO_E_UNSUPPORTED, tname(r, proto.chunk), r->path,
                               fname(r, c->file), c->file_off,
                               "tensor '%s' is stored as a delta against an older checkpoint, "
                               "which this build of ckptio cannot resolve",
                               tname(r, proto.chunk));
    uint64_t B = m->csum_block, j = lo / B, jend = (hi + B - 1) / B;
    /* Whole blocks per staging buffer, leaving room for alignment on both sides. */
    uint64_t span = pl->buf_size - 2 * 4096, at = ckptio__read_block_at(m, c, j);
    proto.coded = 1;
    proto.direct = 0;
    proto.verify = ckptio__read_verifying(r, c);
    while (j < jend) {
        uint64_t k = j, end = at;
        while (k < jend && (k == j || end + m->blocks[c->blocks + k] - at <= span))
            end += m->blocks[c->blocks + k++];
        proto.a = at;
        proto.b = end;
        proto.len = end - at;
        proto.foff = c->file_off + at;
        proto.blk0 = j;
        proto.nblk = k - j;
        if (ckptio__vec_push(&pl->segs, &proto, 1) < 0) return -ENOMEM;
        at = end;
        j = k;
    }
    return 0;
}

static void decode_block(void *ctx, size_t i, unsigned worker)
{
    djob *jb = ctx;
    dblock *b = &jb->blocks[i];
    const ckptio__manifest *m = jb->r->m;
    const ckptio__mchunk *c = &m->chunks[b->s->chunk];
    ckptio__decoder *d = jb->r->dec;
    const uint8_t *raw = b->src;
    uint8_t *out = b->dst ? b->dst : d->scratch + (size_t)worker * d->block;
    if (b->stored != b->raw) {
        const ckptio__mtensor *t = &m->tensors[c->tensor];
        if (ckptio__codec_decode(d->ctx[worker], CKPTIO__CODEC_ID(c->codec), (int)t->dtype,
                                 b->src, b->stored, out, b->raw) < 0) {
            b->bad = true;
            return;
        }
        raw = out;
    } else if (b->dst) {
        memcpy(b->dst, b->src, b->raw);
    }
    if (b->s->verify && ckptio__hash(raw, b->raw) != m->csums[c->csums + b->j]) {
        b->bad = true;
        return;
    }
    if (b->dst || b->s->piece == NONE) return;
    /* Part of the block goes to the destination: scatter it as a staged segment of raw bytes. */
    uint64_t x = b->j * d->block;
    seg part = *b->s;
    part.a = x;
    part.b = x + b->raw;
    part.iter = NONE;
    ckptio__read_scatter(jb->pl, &part, raw);
}

/* Decode straight into the destination when the block lies inside a piece's single run. */
static uint8_t *block_dst(const plan *pl, const seg *s, uint64_t x, uint64_t raw)
{
    if (s->piece == NONE) return NULL;
    const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
    if (p->k != 0 || x < p->src0 || x + raw > p->src0 + p->run_len) return NULL;
    return p->dst + p->dst0 + (x - p->src0);
}

int ckptio__read_decode_io(ckptio_reader *r, plan *pl, size_t first, size_t last,
                           const uint8_t *buf, uint64_t off)
{
    const seg *segs = pl->segs.items;
    const ckptio__manifest *m = r->m;
    uint64_t B = m->csum_block, n = 0;
    for (size_t k = first; k < last; k++) n += segs[k].coded ? segs[k].nblk : 0;
    if (!n) return 0;
    int rc = decoder_start(r, ckptio__workers_count(pl->workers));
    if (rc < 0) return ckptio__fail(&r->msg, rc, "out of memory starting the block decoder");
    dblock *blocks = malloc(n * sizeof *blocks);
    if (!blocks) return ckptio__fail(&r->msg, -ENOMEM, "out of memory decoding '%s'", r->path);
    size_t i = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->coded) continue;
        const ckptio__mchunk *c = &m->chunks[s->chunk];
        const uint8_t *src = buf + (s->foff - off);
        for (uint64_t j = s->blk0; j < s->blk0 + s->nblk; j++) {
            uint64_t raw = CKPTIO__MIN(B, c->raw_len - j * B), stored = m->blocks[c->blocks + j];
            blocks[i++] = (dblock){.s = s, .src = src, .j = j, .stored = stored, .raw = raw,
                                   .dst = block_dst(pl, s, j * B, raw)};
            src += stored;
        }
    }
    djob jb = {r, pl, blocks};
    ckptio__workers_for(pl->workers, n, decode_block, &jb);
    rc = 0;
    for (i = 0; i < n; i++) {
        const dblock *b = &blocks[i];
        if (!b->bad) continue;
        uint64_t at = b->s->a + (uint64_t)(b->src - (buf + (b->s->foff - off)));
        int e = ckptio__read_note_bad(r, pl, b->s, at, b->stored);
        if (!rc) rc = e;
    }
    free(blocks);
    return rc;
}
