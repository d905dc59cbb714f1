/* SPDX-License-Identifier: Apache-2.0 */
/* Destinations the reader chooses: a block of its own for each large region, slabs for the rest. */
#include <errno.h>
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

int ckptio_reader_place(ckptio_reader *r, const ckptio_region *regions, size_t n,
                        ckptio_landing *out, ckptio_block **blocks, size_t *n_blocks)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_place: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if ((n && (!regions || !out)) || !blocks || !n_blocks)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_reader_place: NULL argument");
    *blocks = NULL;
    *n_blocks = 0;
    uint32_t stride = n ? out[0].size : 0;
    if (n && stride < sizeof(ckptio_landing))
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                            "ckptio_reader_place: out[0].size is %u; set it to "
                            "sizeof(ckptio_landing) (%zu here)",
                            stride, sizeof(ckptio_landing));
    const uint64_t align = ckptio_alignment();
    ckptio__vec bv;
    ckptio__vec_init(&bv, sizeof(ckptio_block));
    int rc = 0;
    uint64_t used = 0, slab = NONE; /* the current slab: block index and bytes used */
    for (size_t i = 0; i < n; i++) {
        ckptio_region reg;
        box bx;
        CKPTIO__CHECK(ckptio__read_take_sized(&r->msg, &reg, sizeof reg, REGION_V1, regions, i,
                                              "ckptio_reader_place", "ckptio_region"));
        /* Checked as a read checks it, before any memory is taken for it. */
        reg.dst = &reg;
        reg.capacity = UINT64_MAX;
        CKPTIO__CHECK(ckptio__read_prepare_region(r, &reg, i, &bx));
        ckptio_landing l = {.size = sizeof l, .block = CKPTIO_NO_BLOCK};
        uint64_t nb = bx.bytes;
        if (nb >= OWN_BYTES) {
            uint64_t lead = lead_of(r, &bx, align);
            uint64_t len = lead ? ckptio__align_up(lead + nb, align) : nb;
            CKPTIO__CHECK(new_block(&bv, len, align));
            l = (ckptio_landing){.size = sizeof l, .block = (uint32_t)(bv.len - 1), .at = lead,
                                 .capacity = ckptio__align_up(lead + nb, align) - lead,
                                 .lead = lead};
        } else if (nb) {
            uint64_t at = ckptio__align_up(used, 64);
            if (slab == NONE || at + nb > SLAB_BYTES) {
                CKPTIO__CHECK(new_block(&bv, SLAB_BYTES, align));
                slab = bv.len - 1;
                at = 0;
            }
            used = at + nb;
            l = (ckptio_landing){.size = sizeof l, .block = (uint32_t)slab, .at = at,
                                 .capacity = nb};
        }
        memcpy((uint8_t *)out + i * (size_t)stride, &l, sizeof l);
    }
out:
    if (rc < 0) {
        for (size_t b = 0; b < bv.len; b++) free(CKPTIO__VEC_AT(&bv, ckptio_block, b)->base);
        ckptio__vec_free(&bv);
        if (rc == -ENOMEM && !r->msg.text[0])
            ckptio__fail(&r->msg, rc, "out of memory placing the tensors of '%s'", r->path);
        ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
        return rc;
    }
    *blocks = bv.items;
    *n_blocks = bv.len;
    return 0;
}
