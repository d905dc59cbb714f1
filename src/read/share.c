/* SPDX-License-Identifier: Apache-2.0 */
/* Shared reads: one load cut into parts that the readers of a host take in rotation. */
#include <errno.h>
#include <stdlib.h>

#include "reader.h"

/* Byte k * total / p of the regions, without overflowing: part k starts there. */
static uint64_t bound(uint64_t total, uint64_t k, uint64_t p)
{
    return total / p * k + total % p * k / p;
}

int ckptio_reader_read_shared(ckptio_reader *r, const ckptio_region *regions, size_t n,
                              ckptio_share *share)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_read_shared: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if ((n && !regions) || !share)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                            "ckptio_reader_read_shared: regions or share is NULL");
    if (share->size < sizeof(ckptio_share))
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                            "ckptio_reader_read_shared: share->size is %u; set it to "
                            "sizeof(ckptio_share) (%zu here)",
                            share->size, sizeof(ckptio_share));
    if (share->count == 0 || share->index >= share->count ||
        share->count > UINT32_MAX / CKPTIO_SHARE_MAX_ROUNDS)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                            "ckptio_reader_read_shared: index %u of %u readers", share->index,
                            share->count);
    /* Each region's bytes, checked as a read would, before any part is read. */
    uint64_t *bytes = malloc(sizeof *bytes * (n ? n : 1));
    if (!bytes) return ckptio__fail(&r->msg, -ENOMEM, "out of memory reading '%s'", r->path);
    int rc = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        ckptio_region reg;
        box bx;
        CKPTIO__CHECK(ckptio__read_take_sized(&r->msg, &reg, sizeof reg, REGION_V1, regions, i,
                                              "ckptio_reader_read_shared", "ckptio_region"));
        CKPTIO__CHECK(ckptio__read_prepare_region(r, &reg, i, &bx));
        bytes[i] = bx.bytes;
        total += bx.bytes;
    }
    uint64_t per = (uint64_t)share->count * CKPTIO_SHARE_PART_BYTES;
    uint64_t rounds = CKPTIO__MAX(1ull, CKPTIO__MIN((uint64_t)CKPTIO_SHARE_MAX_ROUNDS, total / per));
    uint64_t p = share->count * rounds;
    share->rounds = (uint32_t)rounds;
    share->n_parts = p;
    share->start = bound(total, share->index, p);
    /* Part j's regions start at cut[j]: the first region whose first byte is at or past its
     * bound (the last part takes every region left). */
    size_t *cut = malloc(sizeof *cut * (size_t)(p + 1));
    CKPTIO__GOTO_IF(!cut, -ENOMEM);
    uint64_t at = 0;
    size_t i = 0;
    for (uint64_t j = 0; j < p; j++) {
        cut[j] = i;
        uint64_t end = j + 1 < p ? bound(total, j + 1, p) : UINT64_MAX;
        for (; i < n && at < end; i++) at += bytes[i];
    }
    cut[p] = n;
    for (uint64_t j = 0; j < p; j++) {
        uint64_t k = (share->index + j) % p;
        ckptio_share_part part = {.first = cut[k], .count = cut[k + 1] - cut[k]};
        for (size_t x = cut[k]; x < cut[k + 1]; x++) part.bytes += bytes[x];
        if (part.count) {
            rc = ckptio__read_range(r, regions, part.first, part.count);
            if (rc < 0) break;
        }
        if (share->parts && j < share->parts_cap) share->parts[j] = part;
    }
    free(cut);
out:
    free(bytes);
    if (rc == -ENOMEM && !r->msg.text[0]) ckptio__fail(&r->msg, rc, "out of memory reading '%s'", r->path);
    if (rc < 0) ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    return rc < 0 ? rc : 0;
}
