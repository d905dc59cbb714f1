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

/* The elements [s, e) (row-major order) of an array of `shape` as boxes, each contiguous in
 * that order and following the previous one: at most 2 * ndim - 1 of them (1 for a scalar).
 * Box i is off[i * ndim ..] and shp[i * ndim ..]; returns their number. Needs s <= e <=
 * volume(shape). */
#define CKPTIO__RANGE_BOXES_MAX (2 * CKPTIO_MAX_NDIM)
CKPTIO__HIDDEN size_t ckptio__range_boxes(const uint64_t *shape, uint32_t ndim, uint64_t s,
                                          uint64_t e, uint64_t *off, uint64_t *shp);

/* One box's extent [lo, hi) along the swept dimension; k is its index in the caller's list. */
typedef struct ckptio__span {
    uint64_t lo, hi, k;
} ckptio__span;

/* Scratch of ckptio__first_overlap: zero-initialise, reuse across calls (it grows to the largest
 * n seen), free with ckptio__sweep_fini. The caller lists the boxes in off and shp (see
 * ckptio__sweep_reserve). After a call that returned 0, spans[0 .. n) hold every box along
 * dimension `dim` sorted by (lo, k), and one_dim says whether every box spans the whole shape in
 * every other dimension: the first gap between the spans (ckptio__sweep_gap) is then a box that
 * nobody holds. */
typedef struct ckptio__sweep {
    const uint64_t **off, **shp; /* box k: offset and shape, ndim entries each */
    ckptio__span *spans;
    uint64_t *active;
    uint64_t cap;
    uint32_t dim;
    bool one_dim;
} ckptio__sweep;

/* Room for n boxes in s->off and s->shp, which the caller then fills (an array of pointers
 * rather than a callback: validate sweeps a million chunks); 0 or -ENOMEM. */
CKPTIO__HIDDEN int ckptio__sweep_reserve(ckptio__sweep *s, uint64_t n);

/* Whether two of the n boxes s->off/s->shp[0 .. n) of a tensor of `shape` share an element. The
 * boxes must lie inside the shape, and empty ones are better left out (an empty box strictly
 * inside another counts as overlapping it). Sorts along the dimension most boxes split and
 * compares each box only with those whose range along it is still open, so row-, column- and
 * grid-sharded tensors stay near linear. Returns 1 with the first overlapping pair met, *i the box
 * met first along the sweep (lower start, then lower index) and *j the one that overlaps it (in
 * either index order: callers that name the lower index first swap them); 0 when the boxes are
 * disjoint. Of a scalar (ndim 0) every box holds the one element: two or more boxes return 1 with
 * the pair (0, 1), and off/shp are not read. */
CKPTIO__HIDDEN int ckptio__first_overlap(ckptio__sweep *s, const uint64_t *shape, uint32_t ndim,
                                         uint64_t n, uint64_t *i, uint64_t *j);

/* The first stretch of [0, extent) along s->dim that none of the n sorted spans of the last
 * ckptio__first_overlap covers, as [*lo, *hi); after the last span when they cover a prefix. */
CKPTIO__HIDDEN void ckptio__sweep_gap(const ckptio__sweep *s, uint64_t n, uint64_t extent,
                                      uint64_t *lo, uint64_t *hi);

CKPTIO__HIDDEN void ckptio__sweep_fini(ckptio__sweep *s);

/* "128,1024" into buf (cap >= 8), `scalar` for ndim 0; clipped with "..." when buf is too
 * short. Returns buf. */
CKPTIO__HIDDEN const char *ckptio__fmt_dims(char *buf, size_t cap, const uint64_t *d,
                                            uint32_t ndim, const char *scalar);

#endif
