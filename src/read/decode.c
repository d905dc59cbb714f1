/* SPDX-License-Identifier: Apache-2.0 */
/* Coded chunks: whole blocks read staged, decoded and verified on the workers, then scattered. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../codec/codec.h"
#include "open.h"
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
    const uint8_t *base; /* a delta block: the base's raw bytes of it, else NULL */
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

static void decoder_free(ckptio_reader *r)
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
    r->free_decoder = decoder_free;
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
    /* A delta segment's base bytes are read whole before it is decoded: at most a buffer. */
    bool delta = c->codec & CKPTIO__CODEC_DELTA;
    uint64_t B = m->csum_block, j = lo / B, jend = (hi + B - 1) / B;
    /* Whole blocks per staging buffer, leaving room for alignment on both sides. */
    uint64_t span = pl->buf_size - 2 * 4096, at = ckptio__read_block_at(m, c, j);
    proto.coded = 1;
    proto.direct = 0;
    proto.verify = ckptio__read_verifying(r, c);
    while (j < jend) {
        uint64_t k = j, end = at;
        while (k < jend && (k == j || (end + m->blocks[c->blocks + k] - at <= span &&
                                       (!delta || (k + 1 - j) * B <= pl->buf_size))))
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
    if (b->base && b->stored == b->raw) memcpy(out, b->src, b->raw);
    if (b->stored != b->raw) {
        const ckptio__mtensor *t = &m->tensors[c->tensor];
        if (ckptio__codec_decode(d->ctx[worker], CKPTIO__CODEC_ID(c->codec), (int)t->dtype,
                                 b->src, b->stored, out, b->raw) < 0) {
            b->bad = true;
            return;
        }
        raw = out;
    } else if (b->dst && !b->base) {
        memcpy(b->dst, b->src, b->raw);
    }
    if (b->base) { /* a delta: the stored block is the XOR with the base's bytes */
        for (uint64_t k = 0; k < b->raw; k++) out[k] ^= b->base[k];
        raw = out;
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

/* The base of a delta checkpoint, opened once: found where the checkpoint recorded it, and
 * the very checkpoint its deltas were made against. */
static int open_base(ckptio_reader *r, uint64_t chunk)
{
    if (r->base) return 0;
    const ckptio__manifest *m = r->m;
    const char *rel = m->strtab + m->base_path;
    char *path = NULL;
    if (asprintf(&path, "%s/%s", r->path, rel) < 0) return -ENOMEM;
    uint64_t sum = 0;
    int rc = ckptio__manifest_file_sum(path, &sum, &r->msg);
    if (rc == 0 && sum != m->base_sum)
        rc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                          "it is not the checkpoint these deltas were made against (its "
                          "manifest's checksum is %016llx, the delta checkpoint recorded %016llx)",
                          (unsigned long long)sum, (unsigned long long)m->base_sum);
    if (rc == 0 && (rc = ckptio__read_open(&r->base, path, NULL)) < 0)
        ckptio__fail(&r->msg, rc, "%s", ckptio_last_error());
    if (rc == 0) r->base->base_read = r->base_read; /* the base's own base, if it has one */
    if (rc < 0) {
        char why[sizeof r->msg.text];
        snprintf(why, sizeof why, "%s", r->msg.text);
        rc = ckptio__fail_at(&r->msg, rc == -ENOENT ? rc : CKPTIO_E_CORRUPT, tname(r, chunk),
                             r->path, NULL, CKPTIO_ERROR_NO_OFFSET,
                             "tensor '%s' of '%s' is stored as a delta against the base '%s' "
                             "(recorded as '%s'), which cannot be used: %s; put that base back "
                             "unchanged where it was, or load a full checkpoint",
                             tname(r, chunk), r->path, path, rel, why);
    }
    free(path);
    return rc;
}

/* The base's raw bytes of a delta segment's blocks. */
static int base_bytes(ckptio_reader *r, const seg *s, uint8_t *dst)
{
    const ckptio__manifest *m = r->m;
    const ckptio__mchunk *c = &m->chunks[s->chunk];
    const ckptio__mtensor *t = &m->tensors[c->tensor];
    CKPTIO__TRY(open_base(r, s->chunk));
    const char *name = m->strtab + t->name;
    int64_t i = ckptio_reader_find(r->base, name);
    ckptio_tensor_info ti = {.size = sizeof ti};
    if (i < 0 || ckptio_reader_tensor(r->base, (size_t)i, &ti) < 0 || ti.dtype != (int)t->dtype ||
        ti.ndim != t->ndim ||
        (t->ndim && memcmp(ti.shape, m->dims + t->dims, t->ndim * sizeof *ti.shape)))
        return ckptio__fail_at(&r->msg, CKPTIO_E_CORRUPT, name, r->path, NULL,
                               CKPTIO_ERROR_NO_OFFSET,
                               "tensor '%s' of '%s' is a delta, but its base '%s' holds no "
                               "tensor of that name, dtype and shape: the base is not the one "
                               "it was saved against",
                               name, r->path, ckptio_reader_path(r->base));
    uint64_t B = m->csum_block, a = s->blk0 * B, b = CKPTIO__MIN((s->blk0 + s->nblk) * B, c->raw_len);
    if (!r->base_read) /* a reader not opened by ckptio_reader_open */
        return ckptio__fail(&r->msg, CKPTIO_E_UNSUPPORTED,
                            "tensor '%s' of '%s' is a delta, which this reader cannot resolve; "
                            "open the checkpoint with ckptio_reader_open", name, r->path);
    int rc = r->base_read(r->base, name, t->ndim, ckptio_dtype_size((int)t->dtype),
                          m->dims + c->dims, a, b, dst, &r->msg);
    return rc < 0 ? rc : 0;
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
    /* Delta segments: their base bytes first, read by the base's own reader. */
    uint64_t base_len = 0;
    for (size_t k = first; k < last; k++)
        if (segs[k].coded && (m->chunks[segs[k].chunk].codec & CKPTIO__CODEC_DELTA))
            base_len += segs[k].nblk * B;
    dblock *blocks = malloc(n * sizeof *blocks);
    uint8_t *based = base_len ? malloc(base_len) : NULL;
    if (!blocks || (base_len && !based)) {
        free(blocks);
        free(based);
        return ckptio__fail(&r->msg, -ENOMEM, "out of memory decoding '%s'", r->path);
    }
    size_t i = 0;
    uint8_t *bat = based;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->coded) continue;
        const ckptio__mchunk *c = &m->chunks[s->chunk];
        const uint8_t *src = buf + (s->foff - off);
        const uint8_t *sb = NULL;
        if (c->codec & CKPTIO__CODEC_DELTA) {
            if ((rc = base_bytes(r, s, bat)) < 0) {
                free(blocks);
                free(based);
                return rc;
            }
            sb = bat;
            bat += s->nblk * B;
        }
        for (uint64_t j = s->blk0; j < s->blk0 + s->nblk; j++) {
            uint64_t raw = CKPTIO__MIN(B, c->raw_len - j * B), stored = m->blocks[c->blocks + j];
            blocks[i++] = (dblock){.s = s, .src = src, .j = j, .stored = stored, .raw = raw,
                                   .dst = block_dst(pl, s, j * B, raw),
                                   .base = sb ? sb + (j - s->blk0) * B : NULL};
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
    free(based);
    return rc;
}
