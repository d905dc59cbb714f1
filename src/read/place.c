/* SPDX-License-Identifier: Apache-2.0 */
/* Destinations the reader chooses: a block of its own for each large region, slabs for the rest. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "reader.h"

/* Regions smaller than this share slabs instead of taking a page each; slabs are this big. */
#define OWN_BYTES 4096u
#define SLAB_BYTES (4u << 20)

void ckptio_block_free(void *base)
{
    free(base);
}

/* A block of `len` bytes, its memory rounded up to the alignment (usable as read scratch). */
static int new_block(ckptio__vec *blocks, uint64_t len, uint64_t align)
{
    void *p = NULL;
    if (posix_memalign(&p, align, ckptio__align_up(len ? len : 1, align)) != 0) return -ENOMEM;
    ckptio_block b = {p, len};
    if (ckptio__vec_push(blocks, &b, 1) < 0) {
        free(p);
        return -ENOMEM;
    }
    return 0;
}

/* Bytes before a whole tensor's first byte that its read may overwrite: its file offset's
 * distance from the block boundary below (a stock safetensors file's tensors start anywhere),
 * so the read starts there and lands in place; 0 where that would misalign the elements. */
static uint64_t lead_of(const ckptio_reader *r, const box *bx, uint64_t align)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const uint64_t *shape = r->m->dims + t->dims;
    if (t->n_chunks != 1) return 0;
    for (uint32_t j = 0; j < t->ndim; j++)
        if (bx->ro[j] || bx->rs[j] != shape[j]) return 0;
    uint64_t lead = r->m->chunks[t->chunk0].file_off % align;
    uint64_t es = CKPTIO__MAX(ckptio_dtype_size((int)t->dtype), (size_t)1);
    return lead % es ? 0 : lead;
}

/* Where the next region of `nb` bytes lands (`lead` bytes before it usable: its file offset's
 * distance from the alignment below), in a block of its own or the current slab. */
typedef struct placer {
    ckptio__vec blocks;
    uint64_t used, slab, align; /* the current slab: block index and bytes used */
} placer;

static int place_next(placer *pl, uint64_t nb, uint64_t lead, ckptio_landing *l)
{
    *l = (ckptio_landing){.size = sizeof *l, .block = CKPTIO_NO_BLOCK};
    if (nb >= OWN_BYTES) {
        uint64_t len = lead ? ckptio__align_up(lead + nb, pl->align) : nb;
        CKPTIO__TRY(new_block(&pl->blocks, len, pl->align));
        *l = (ckptio_landing){.size = sizeof *l, .block = (uint32_t)(pl->blocks.len - 1),
                              .at = lead, .capacity = ckptio__align_up(lead + nb, pl->align) - lead,
                              .lead = lead};
    } else if (nb) {
        uint64_t at = ckptio__align_up(pl->used, 64);
        if (pl->slab == NONE || at + nb > SLAB_BYTES) {
            CKPTIO__TRY(new_block(&pl->blocks, SLAB_BYTES, pl->align));
            pl->slab = pl->blocks.len - 1;
            at = 0;
        }
        pl->used = at + nb;
        *l = (ckptio_landing){.size = sizeof *l, .block = (uint32_t)pl->slab, .at = at,
                              .capacity = nb};
    }
    return 0;
}

static void placer_init(placer *pl)
{
    ckptio__vec_init(&pl->blocks, sizeof(ckptio_block));
    pl->used = 0;
    pl->slab = NONE;
    pl->align = ckptio_alignment();
}

/* Hand the blocks over (rc 0) or free them. */
static int placer_end(placer *pl, int rc, ckptio_block **blocks, size_t *n_blocks)
{
    if (rc < 0) {
        for (size_t b = 0; b < pl->blocks.len; b++)
            free(CKPTIO__VEC_AT(&pl->blocks, ckptio_block, b)->base);
        ckptio__vec_free(&pl->blocks);
        return rc;
    }
    *blocks = pl->blocks.items;
    *n_blocks = pl->blocks.len;
    return 0;
}

/* The caller's landing array: its stride, from out[0].size. */
static int landing_stride(ckptio__msg *m, const char *fn, size_t n, const ckptio_landing *out,
                          uint32_t *stride)
{
    *stride = n ? out[0].size : 0;
    if (n && *stride < sizeof(ckptio_landing))
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "%s: out[0].size is %u; set it to sizeof(ckptio_landing) (%zu here)",
                            fn, *stride, sizeof(ckptio_landing));
    return 0;
}

int ckptio_reader_place(ckptio_reader *r, const ckptio_region *regions, size_t n,
                        ckptio_landing *out, ckptio_block **blocks, size_t *n_blocks)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_place: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if ((n && (!regions || !out)) || !blocks || !n_blocks)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_reader_place: NULL argument");
    *blocks = NULL;
    *n_blocks = 0;
    uint32_t stride;
    CKPTIO__TRY(landing_stride(&r->msg, "ckptio_reader_place", n, out, &stride));
    placer pl;
    placer_init(&pl);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        ckptio_region reg;
        box bx;
        CKPTIO__CHECK(ckptio__read_take_sized(&r->msg, &reg, sizeof reg, REGION_V1, regions, i,
                                              "ckptio_reader_place", "ckptio_region"));
        /* Checked as a read checks it, before any memory is taken for it. */
        reg.dst = &reg;
        reg.capacity = UINT64_MAX;
        CKPTIO__CHECK(ckptio__read_prepare_region(r, &reg, i, &bx));
        ckptio_landing l;
        uint64_t lead = bx.bytes >= OWN_BYTES ? lead_of(r, &bx, pl.align) : 0;
        CKPTIO__CHECK(place_next(&pl, bx.bytes, lead, &l));
        memcpy((uint8_t *)out + i * (size_t)stride, &l, sizeof l);
    }
out:
    if (rc < 0) {
        if (rc == -ENOMEM && !r->msg.text[0])
            ckptio__fail(&r->msg, rc, "out of memory placing the tensors of '%s'", r->path);
        ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    }
    return placer_end(&pl, rc, blocks, n_blocks);
}

int ckptio_file_place(const ckptio_range *ranges, size_t n, ckptio_landing *out,
                      ckptio_block **blocks, size_t *n_blocks)
{
    if ((n && (!ranges || !out)) || !blocks || !n_blocks)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_place: NULL argument");
    *blocks = NULL;
    *n_blocks = 0;
    uint32_t stride;
    CKPTIO__TRY(landing_stride(NULL, "ckptio_file_place", n, out, &stride));
    const uint32_t rstride = n ? ranges[0].size : 0;
    if (n && rstride < offsetof(ckptio_range, dst) + sizeof(void *))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_file_place: ranges[0].size is %u; set it to "
                            "sizeof(ckptio_range) (%zu here)", rstride, sizeof(ckptio_range));
    placer pl;
    placer_init(&pl);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const ckptio_range *g = (const void *)((const uint8_t *)ranges + i * (size_t)rstride);
        ckptio_landing l;
        rc = place_next(&pl, g->len, g->offset % pl.align, &l);
        if (rc == 0) memcpy((uint8_t *)out + i * (size_t)stride, &l, sizeof l);
    }
    if (rc < 0) ckptio__fail(NULL, rc, "ckptio_file_place: out of memory for %zu ranges", n);
    return placer_end(&pl, rc, blocks, n_blocks);
}
