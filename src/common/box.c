/* SPDX-License-Identifier: Apache-2.0 */
/* Box helpers that are not inline (see box.h): the overlap sweep and how shapes are printed. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "box.h"

static int span_cmp(const void *pa, const void *pb)
{
    const ckptio__span *a = pa, *b = pb;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return (a->k > b->k) - (a->k < b->k);
}

/* Most tensors have a handful of boxes, often already in order: skip qsort for those. Spans are
 * made in k order, so lo already ascending means sorted by (lo, k). */
static void sort_spans(ckptio__span *s, uint64_t n)
{
    if (n > 32) {
        for (uint64_t i = 1; i < n; i++)
            if (s[i].lo < s[i - 1].lo) {
                qsort(s, n, sizeof *s, span_cmp);
                return;
            }
        return;
    }
    for (uint64_t i = 1; i < n; i++) {
        ckptio__span x = s[i];
        uint64_t j = i;
        for (; j > 0 && span_cmp(&s[j - 1], &x) > 0; j--) s[j] = s[j - 1];
        s[j] = x;
    }
}

int ckptio__sweep_reserve(ckptio__sweep *s, uint64_t n)
{
    if (n <= s->cap) return 0;
    ckptio__sweep_fini(s);
    s->spans = malloc(n * sizeof *s->spans);
    s->active = malloc(n * sizeof *s->active);
    s->off = malloc(n * sizeof *s->off);
    s->shp = malloc(n * sizeof *s->shp);
    if (!s->spans || !s->active || !s->off || !s->shp) {
        ckptio__sweep_fini(s);
        return -ENOMEM;
    }
    s->cap = n;
    return 0;
}

int ckptio__first_overlap(ckptio__sweep *s, const uint64_t *shape, uint32_t ndim, uint64_t n,
                          uint64_t *i, uint64_t *j)
{
    assert(ndim <= CKPTIO_MAX_NDIM);
    s->dim = 0;
    s->one_dim = false;
    if (ndim == 0) {
        if (n < 2) return 0;
        *i = 0, *j = 1;
        return 1;
    }
    assert(n <= s->cap);
    uint64_t best = 0, count[CKPTIO_MAX_NDIM] = {0};
    for (uint64_t k = 0; k < n; k++)
        for (uint32_t d = 0; d < ndim; d++) count[d] += s->shp[k][d] < shape[d];
    uint32_t dim = 0;
    for (uint32_t d = 0; d < ndim; d++)
        if (count[d] > best) best = count[d], dim = d;
    bool one_dim = true;
    for (uint32_t d = 0; d < ndim; d++) one_dim = one_dim && (d == dim || count[d] == 0);
    s->dim = dim;
    s->one_dim = one_dim;
    for (uint64_t k = 0; k < n; k++)
        s->spans[k] = (ckptio__span){s->off[k][dim], s->off[k][dim] + s->shp[k][dim], k};
    sort_spans(s->spans, n);
    uint64_t n_active = 0;
    for (uint64_t a = 0; a < n; a++) {
        const ckptio__span *sa = &s->spans[a];
        const uint64_t *ao = s->off[sa->k], *as = s->shp[sa->k];
        uint64_t kept = 0;
        for (uint64_t b = 0; b < n_active; b++) {
            const ckptio__span *sb = &s->spans[s->active[b]];
            if (sb->hi <= sa->lo) continue; /* closed for good: spans arrive in lo order */
            s->active[kept++] = s->active[b];
            if (ckptio__boxes_overlap(ao, as, s->off[sb->k], s->shp[sb->k], ndim)) {
                *i = sb->k, *j = sa->k;
                return 1;
            }
        }
        n_active = kept;
        s->active[n_active++] = a;
    }
    return 0;
}

void ckptio__sweep_gap(const ckptio__sweep *s, uint64_t n, uint64_t extent, uint64_t *lo,
                       uint64_t *hi)
{
    uint64_t cur = 0;
    *lo = *hi = 0;
    for (uint64_t k = 0; k < n && *hi == 0; k++) {
        if (s->spans[k].lo > cur) *lo = cur, *hi = s->spans[k].lo;
        cur = CKPTIO__MAX(cur, s->spans[k].hi);
    }
    if (*hi == 0) *lo = cur, *hi = extent;
}

void ckptio__sweep_fini(ckptio__sweep *s)
{
    free(s->spans);
    free(s->active);
    free(s->off);
    free(s->shp);
    *s = (ckptio__sweep){0};
}

const char *ckptio__fmt_dims(char *buf, size_t cap, const uint64_t *d, uint32_t ndim,
                             const char *scalar)
{
    if (ndim == 0) {
        snprintf(buf, cap, "%s", scalar);
        return buf;
    }
    size_t used = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < ndim; i++) {
        int n = snprintf(buf + used, cap - used, i ? ",%llu" : "%llu", (unsigned long long)d[i]);
        if (n < 0 || (size_t)n >= cap - used) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), cap > 4 ? 4 : cap, "...");
            break;
        }
        used += (size_t)n;
    }
    return buf;
}

/* Boxes of [s, e) in the array of shape[0 .. ndim) (row-major), prefixed by `lead` leading
 * coordinates already fixed (written into every box's first `lead` entries). */
static size_t range_boxes(const uint64_t *shape, uint32_t ndim, uint32_t lead, uint64_t s,
                          uint64_t e, const uint64_t *pre, uint64_t *off, uint64_t *shp, size_t n)
{
    uint32_t full = lead + ndim;
    if (s >= e) return n;
    if (ndim == 0) { /* a scalar */
        if (lead) memcpy(off + n * full, pre, lead * sizeof *pre);
        for (uint32_t d = 0; d < lead; d++) shp[n * full + d] = 1;
        return n + 1;
    }
    uint64_t row = 1;
    for (uint32_t d = 1; d < ndim; d++) row *= shape[d];
    uint64_t r0 = s / row, r1 = e / row;
    uint64_t p[CKPTIO_MAX_NDIM];
    if (lead) memcpy(p, pre, lead * sizeof *p);
    if (s % row) { /* a partial first row */
        uint64_t end = CKPTIO__MIN(e, (r0 + 1) * row);
        p[lead] = r0;
        n = range_boxes(shape + 1, ndim - 1, lead + 1, s - r0 * row, end - r0 * row, p, off, shp, n);
        if (end == e) return n;
        r0++;
    }
    if (r1 > r0) { /* whole rows */
        if (lead) memcpy(off + n * full, pre, lead * sizeof *pre);
        for (uint32_t d = 0; d < lead; d++) shp[n * full + d] = 1;
        off[n * full + lead] = r0;
        shp[n * full + lead] = r1 - r0;
        for (uint32_t d = 1; d < ndim; d++) {
            off[n * full + lead + d] = 0;
            shp[n * full + lead + d] = shape[d];
        }
        n++;
    }
    if (e % row && r1 >= r0) { /* a partial last row */
        p[lead] = r1;
        n = range_boxes(shape + 1, ndim - 1, lead + 1, 0, e - r1 * row, p, off, shp, n);
    }
    return n;
}

size_t ckptio__range_boxes(const uint64_t *shape, uint32_t ndim, uint64_t s, uint64_t e,
                           uint64_t *off, uint64_t *shp)
{
    return range_boxes(shape, ndim, 0, s, e, NULL, off, shp, 0);
}
