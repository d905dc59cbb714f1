/* SPDX-License-Identifier: Apache-2.0 */
/* What reads and decodes share: bytes scattered from a staging buffer, damage noted. */
#include <string.h>

#include "reader.h"

int ckptio__read_note_bad(const ckptio_reader *r, plan *pl, const seg *s, uint64_t x, uint64_t len)
{
    const ckptio__mchunk *c = &r->m->chunks[s->chunk];
    if (pl->bad && !pl->bad[s->chunk]) {
        pl->bad[s->chunk] = 1;
        pl->bad_chunks++;
    }
    uint64_t foff = c->file_off + x;
    if (!pl->has_bad || c->file < pl->bad_file || (c->file == pl->bad_file && foff < pl->bad_foff)) {
        pl->has_bad = true;
        pl->bad_file = c->file;
        pl->bad_foff = foff;
        pl->bad_chunk = s->chunk;
        pl->bad_x = x;
        pl->bad_len = len;
    }
    return pl->bad ? 0 : CKPTIO_E_CHECKSUM;
}

/* Copy the parts of a piece's runs that fall in [a, b) out of the staging buffer. */
void ckptio__read_scatter(plan *pl, const seg *s, const uint8_t *base)
{
    const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
    const uint64_t *cnt = CKPTIO__VEC_AT(&pl->geo, uint64_t, p->geo);
    const uint64_t *ss = cnt + p->k, *ds = ss + p->k;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    /* Single-run pieces carry no iterator: their one run starts at index zero. */
    if (p->k && s->iter != NONE)
        memcpy(idx, CKPTIO__VEC_AT(&pl->iters, uint64_t, s->iter), p->k * sizeof *idx);
    for (;;) {
        uint64_t rs = p->src0, rd = p->dst0;
        for (uint32_t j = 0; j < p->k; j++) rs += idx[j] * ss[j], rd += idx[j] * ds[j];
        if (rs >= s->b) return;
        uint64_t lo = CKPTIO__MAX(rs, s->a), hi = CKPTIO__MIN(rs + p->run_len, s->b);
        if (lo < hi) memcpy(p->dst + rd + (lo - rs), base + (lo - s->a), hi - lo);
        uint32_t j = p->k;
        while (j-- > 0) {
            if (++idx[j] < cnt[j]) break;
            idx[j] = 0;
        }
        if (j == UINT32_MAX) return; /* wrapped: that was the last run */
    }
}

/* The segments of io i, [*first, *last). */
