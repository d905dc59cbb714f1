/* SPDX-License-Identifier: Apache-2.0 */
/* Pure geometry on names, shapes and boxes of tensors, shared by the writer, the format (validate,
 * merge) and the plan of a multi-rank save. */
#ifndef CKPTIO_BOX_H
#define CKPTIO_BOX_H

#include <string.h>

#include "common.h"

/* The format's name order: bytewise, a prefix first. */
static inline int ckptio__name_cmp(const char *a, uint64_t alen, const char *b, uint64_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c) return c;
    return alen < blen ? -1 : alen > blen;
}

/* Elements of a shape; false on overflow. A zero dimension makes it 0 whatever the others are,
 * so an empty [2^40, 2^40, 0] is not mistaken for an overflow. */
static inline bool ckptio__shape_volume(const uint64_t *dims, uint32_t ndim, uint64_t *out)
{
    for (uint32_t d = 0; d < ndim; d++)
        if (dims[d] == 0) {
            *out = 0;
            return true;
        }
    return ckptio__volume(dims, ndim, 1, out);
}

/* Whether boxes (offset ao, shape as) and (bo, bs) share an element. The ends must not
 * overflow: both boxes lie inside one shape. In the hot loop of validate: inline. */
static inline bool ckptio__boxes_overlap(const uint64_t *ao, const uint64_t *as,
                                         const uint64_t *bo, const uint64_t *bs, uint32_t ndim)
{
    for (uint32_t d = 0; d < ndim; d++)
        if (!(ao[d] < bo[d] + bs[d] && bo[d] < ao[d] + as[d])) return false;
    return true;
}

/* "128,1024" into buf (cap >= 8), `scalar` for ndim 0; clipped with "..." when buf is too
 * short. Returns buf. */
CKPTIO__HIDDEN const char *ckptio__fmt_dims(char *buf, size_t cap, const uint64_t *d,
                                            uint32_t ndim, const char *scalar);

#endif
