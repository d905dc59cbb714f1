/* SPDX-License-Identifier: Apache-2.0 */
/* The planner of a multi-rank save: holdings on the wire, the coordinator's checks, assignment. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Box geometry (common/), the same the format validates with: plan and merge agree on tiling. */
#include "../common/box.h"
#include "plan.h"

#define U(x) ((unsigned long long)(x))
#define NAME_SHOWN 200 /* bytes of a name quoted in a message */
/* A box or shape in a message: "4096,1024", "scalar" for ndim 0. */
#define DIMS(buf, d, n) ckptio__fmt_dims(buf, sizeof buf, d, n, "scalar")
#define MSG_MAX 4096u  /* bytes of an error message carried in holdings or a plan */

#define HOLD_MAGIC 0x444c484bu /* "KHLD" */
#define PLAN_MAGIC 0x4c504b43u /* "CKPL" */
#define WIRE_VERSION 2u /* 2: a failed plan carries who is to blame */
#define HOLD_HEAD 24u /* magic, version, code, msg_len, n */
#define HOLD_ITEM 24u /* name_len, dtype, ndim, flags, nbytes; then name and 3 x ndim dims */
#define PLAN_HEAD 32u /* magic, version, code, msg_len, nranks, n_rep members, n_assign */
/* A failed plan (code < 0) has no assignments: its header says instead which ranks are to blame
 * (rank, other rank; 0xffffffff: none), the length of the tensor's name, which follows the
 * message, and the blame's flags (CKPTIO_ERROR_REFUSED). A rank's failed holdings carry those
 * flags in place of their item count. */
#define PLAN_ENTRY 24u
#define PLAN_REP 16u /* rank, item, slabs: one holder of a replicated box */

/* ---- bytes: little-endian whatever the host ---- */

static inline uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}
static inline void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

#define fail ckptio__errf /* report into the caller's err buffer (common/error.c) */

/* Who a planning failure is about, for ckptio_error_info (b may be NULL). */
static void blame(ckptio_error_info *b, int64_t rank, int64_t other, const char *name,
                  uint32_t name_len)
{
    if (!b) return;
    ckptio__info_none(b);
    b->flags = 0;
    b->rank = rank < 0 ? CKPTIO_ERROR_NO_RANK : (int32_t)rank;
    b->other_rank = other < 0 ? CKPTIO_ERROR_NO_RANK : (int32_t)other;
    if (name)
        snprintf(b->tensor, sizeof b->tensor, "%.*s",
                 (int)CKPTIO__MIN(name_len, sizeof b->tensor - 1), name);
}
#define NONE (-1)

static const char *dt_name(uint32_t dt)
{
    const char *s = ckptio_dtype_name((int)dt);
    return s ? s : "unknown-dtype";
}

size_t ckptio__rank_local_name(char *buf, size_t cap, const char *name, size_t name_len,
                               uint32_t rank)
{
    int k = snprintf(buf, cap, "%.*s@rank%u", (int)CKPTIO__MIN(name_len, (size_t)INT32_MAX), name,
                     rank);
    return k < 0 || (size_t)k >= cap ? 0 : (size_t)k;
}

/* ---- holdings ---- */

/* The rules an item obeys on both sides of the wire. */
static int check_hold(const ckptio__hold *h, uint64_t i, char *err, size_t errlen)
{
    char b1[256], b2[256], b3[256];
    if (!h->name || !ckptio__valid_name(h->name, h->name_len, CKPTIO_MAX_NAME))
        return fail(err, errlen, CKPTIO_E_USAGE,
                    "item %llu: the tensor name is missing, empty, longer than %u bytes, holds "
                    "a NUL or is not UTF-8", U(i), CKPTIO_MAX_NAME);
    int nl = (int)CKPTIO__MIN(h->name_len, NAME_SHOWN);
    size_t es = ckptio_dtype_size((int)h->dtype);
    if (!es)
        return fail(err, errlen, CKPTIO_E_DTYPE, "tensor '%.*s': unknown dtype %u", nl, h->name,
                    h->dtype);
    if (h->ndim > CKPTIO_MAX_NDIM)
        return fail(err, errlen, CKPTIO_E_LIMIT, "tensor '%.*s': %u dimensions (at most %u)", nl,
                    h->name, h->ndim, CKPTIO_MAX_NDIM);
    if (h->flags & ~CKPTIO__HOLD_FLAGS)
        return fail(err, errlen, CKPTIO_E_USAGE, "tensor '%.*s': unknown flags 0x%x", nl,
                    h->name, h->flags);
    if (h->ndim && (!h->shape || !h->offset || !h->box))
        return fail(err, errlen, CKPTIO_E_USAGE, "tensor '%.*s': shape, offset or box missing",
                    nl, h->name);
    uint64_t vol = 0, bvol = 0, bytes = 0;
    if (!ckptio__shape_volume(h->shape, h->ndim, &vol) || !ckptio__mul(vol, es, &bytes))
        return fail(err, errlen, CKPTIO_E_LIMIT, "tensor '%.*s' [%s]: its size overflows", nl,
                    h->name, DIMS(b1, h->shape, h->ndim));
    for (uint32_t d = 0; d < h->ndim; d++)
        if (h->offset[d] > h->shape[d] || h->box[d] > h->shape[d] - h->offset[d])
            return fail(err, errlen, CKPTIO_E_RANGE,
                        "tensor '%.*s' [%s]: box [offset %s shape %s] lies outside it", nl,
                        h->name, DIMS(b1, h->shape, h->ndim),
                        DIMS(b2, h->offset, h->ndim),
                        DIMS(b3, h->box, h->ndim));
    (void)ckptio__shape_volume(h->box, h->ndim, &bvol);
    if (bvol * es != h->nbytes)
        return fail(err, errlen, CKPTIO_E_SHAPE,
                    "tensor '%.*s': box [shape %s] of %s is %llu bytes, not %llu", nl, h->name,
                    DIMS(b1, h->box, h->ndim), dt_name(h->dtype), U(bvol * es),
                    U(h->nbytes));
    return 0;
}

int ckptio__holdings_encode(const ckptio__hold *items, size_t n, ckptio_bytes *out, char *err,
                            size_t errlen)
{
    if (n && !items) return fail(err, errlen, CKPTIO_E_USAGE, "items missing for %zu items", n);
    uint64_t len = HOLD_HEAD;
    for (size_t i = 0; i < n; i++) {
        CKPTIO__TRY(check_hold(&items[i], i, err, errlen));
        len += HOLD_ITEM + items[i].name_len + 24ull * items[i].ndim + 8;
    }
    if (len > SIZE_MAX) return fail(err, errlen, CKPTIO_E_LIMIT, "holdings too large");
    if (ckptio_bytes_resize(out, (size_t)len) < 0)
        return fail(err, errlen, -ENOMEM, "out of memory encoding %zu items", n);
    uint8_t *p = out->data, *hashes = p + len - 8 * (uint64_t)n;
    put32(p, HOLD_MAGIC);
    put32(p + 4, WIRE_VERSION);
    put32(p + 8, 0);
    put32(p + 12, 0);
    put64(p + 16, n);
    p += HOLD_HEAD;
    for (size_t i = 0; i < n; i++) {
        const ckptio__hold *h = &items[i];
        put32(p, h->name_len);
        put32(p + 4, h->dtype);
        put32(p + 8, h->ndim);
        put32(p + 12, h->flags);
        put64(p + 16, h->nbytes);
        memcpy(p + HOLD_ITEM, h->name, h->name_len);
        p += HOLD_ITEM + h->name_len;
        for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->shape[d]);
        for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->offset[d]);
        for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->box[d]);
        /* Hashes go last, apart from the structure, which the plan cache compares as bytes. */
        put64(hashes + 8 * i, h->hash);
    }
    return 0;
}

int ckptio__holdings_encode_error(int code, const char *msg, uint32_t flags, ckptio_bytes *out)
{
    size_t ml = msg ? strnlen(msg, MSG_MAX) : 0;
    if (code >= 0) code = CKPTIO_E_USAGE;
    CKPTIO__TRY(ckptio_bytes_resize(out, HOLD_HEAD + ml));
    uint8_t *p = out->data;
    put32(p, HOLD_MAGIC);
    put32(p + 4, WIRE_VERSION);
    put32(p + 8, (uint32_t)code);
    put32(p + 12, (uint32_t)ml);
    put64(p + 16, flags & CKPTIO_ERROR_REFUSED); /* no items: the count's place holds flags */
    if (ml) memcpy(p + HOLD_HEAD, msg, ml);
    return 0;
}

int ckptio__holdings_decode(const uint8_t *buf, uint64_t len, ckptio__holdings **out, char *err,
                            size_t errlen)
{
    *out = NULL;
    if (!buf || len < HOLD_HEAD)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "holdings: %llu bytes, too short", U(len));
    if (get32(buf) != HOLD_MAGIC || get32(buf + 4) != WIRE_VERSION)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "holdings: not ckptio holdings of version %u (ranks run different versions?)",
                    WIRE_VERSION);
    int code = (int)get32(buf + 8);
    uint32_t ml = get32(buf + 12);
    uint64_t n = get64(buf + 16), flags = 0;
    if (code > 0 || ml > MSG_MAX || (code == 0 && ml) ||
        (code < 0 && ((n & ~(uint64_t)CKPTIO_ERROR_REFUSED) || len != HOLD_HEAD + ml)))
        return fail(err, errlen, CKPTIO_E_CORRUPT, "holdings: inconsistent header");
    if (code < 0) flags = n, n = 0;
    if (n > (len - HOLD_HEAD) / (HOLD_ITEM + 1 + 8))
        return fail(err, errlen, CKPTIO_E_CORRUPT, "holdings: %llu items cannot fit in %llu bytes",
                    U(n), U(len));
    uint64_t body_end = len - 8 * n;
    /* Upper bounds from the byte count: dims and names never take more than the body. */
    uint64_t asz = sizeof(ckptio__holdings) + n * sizeof(ckptio__hold) + (body_end + 8) +
                   (body_end + n + 1) + ml + 1;
    uint8_t *a = calloc(1, asz);
    if (!a) return fail(err, errlen, -ENOMEM, "holdings: out of memory for %llu bytes", U(len));
    ckptio__holdings *h = (ckptio__holdings *)a;
    h->items = (ckptio__hold *)(a + sizeof *h);
    uint64_t *dims = (uint64_t *)(h->items + n);
    char *names = (char *)(dims + body_end / 8 + 1);
    char *msg = names + body_end + n + 1;
    memcpy(msg, buf + HOLD_HEAD, code < 0 ? ml : 0);
    h->n = n;
    h->code = code;
    h->flags = (uint32_t)flags;
    h->msg = msg;
    if (code < 0) {
        *out = h;
        return 0;
    }
    const uint8_t *p = buf + HOLD_HEAD;
    int rc = 0;
    for (uint64_t i = 0; i < n; i++) {
        ckptio__hold *it = &h->items[i];
        CKPTIO__GOTO_IF((uint64_t)(buf + body_end - p) < HOLD_ITEM,
                        fail(err, errlen, CKPTIO_E_CORRUPT, "holdings: item %llu is cut short",
                             U(i)));
        it->name_len = get32(p);
        it->dtype = get32(p + 4);
        it->ndim = get32(p + 8);
        it->flags = get32(p + 12);
        it->nbytes = get64(p + 16);
        p += HOLD_ITEM;
        CKPTIO__GOTO_IF(it->ndim > CKPTIO_MAX_NDIM || it->name_len > CKPTIO_MAX_NAME ||
                            (uint64_t)(buf + body_end - p) < it->name_len + 24ull * it->ndim,
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "holdings: item %llu is cut short or out of bounds", U(i)));
        memcpy(names, p, it->name_len);
        names[it->name_len] = 0;
        it->name = names;
        names += it->name_len + 1;
        p += it->name_len;
        for (uint32_t d = 0; d < 3 * it->ndim; d++, p += 8) dims[d] = get64(p);
        it->shape = dims;
        it->offset = dims + it->ndim;
        it->box = dims + 2 * it->ndim;
        dims += 3 * it->ndim;
        it->hash = get64(buf + body_end + 8 * i);
        char why[512];
        rc = check_hold(it, i, why, sizeof why);
        CKPTIO__GOTO_IF(rc < 0, fail(err, errlen, rc == -ENOMEM ? rc : CKPTIO_E_CORRUPT,
                                     "holdings: %s", why));
    }
    CKPTIO__GOTO_IF(p != buf + body_end,
                    fail(err, errlen, CKPTIO_E_CORRUPT, "holdings: %llu stray bytes",
                         U(buf + body_end - p)));
    *out = h;
    return 0;
out:
    free(a);
    return rc;
}

void ckptio__holdings_free(ckptio__holdings *h)
{
    free(h);
}

/* ---- planning ---- */

/* One item of one rank, under the name it is stored as. */
typedef struct pitem {
    const ckptio__hold *h;
    const char *name;
    uint32_t name_len;
    uint32_t rank, item;
} pitem;

/* One distinct box of a tensor: items it[first .. first + n) hold it (replicas). */
typedef struct dbox {
    uint64_t first, n, bytes;
    uint64_t seq; /* position in name and box order: the tie-break of the assignment */
} dbox;

typedef struct pctx {
    const ckptio__holdings *const *ranks;
    uint32_t nranks;
    char *err;
    size_t errlen;
    ckptio_error_info *blame; /* may be NULL */
    pitem *it;
    uint64_t n_it;
    char *lnames; /* stored names of rank-local items */
    dbox *box;
    uint64_t n_box;
    uint64_t *live; /* the non-empty boxes of the tensor being checked, in box order */
    ckptio__sweep sweep;
    uint64_t *load;
    ckptio__vec assign;
} pctx;

static int cmp_dims(const uint64_t *a, const uint64_t *b, uint32_t n)
{
    for (uint32_t d = 0; d < n; d++)
        if (a[d] != b[d]) return a[d] < b[d] ? -1 : 1;
    return 0;
}

static int pitem_cmp(const void *pa, const void *pb)
{
    const pitem *a = pa, *b = pb;
    int c = ckptio__name_cmp(a->name, a->name_len, b->name, b->name_len);
    if (c) return c;
    if (a->h->ndim != b->h->ndim) return a->h->ndim < b->h->ndim ? -1 : 1;
    if ((c = cmp_dims(a->h->offset, b->h->offset, a->h->ndim))) return c;
    if ((c = cmp_dims(a->h->box, b->h->box, a->h->ndim))) return c;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    return (a->item > b->item) - (a->item < b->item);
}

static bool same_box(const pitem *a, const pitem *b)
{
    return cmp_dims(a->h->offset, b->h->offset, a->h->ndim) == 0 &&
           cmp_dims(a->h->box, b->h->box, a->h->ndim) == 0;
}

#define TNAME(p) (int)CKPTIO__MIN((p)->name_len, NAME_SHOWN), (p)->name

static int diverge(char *err, size_t errlen, ckptio_error_info *b, const char *name,
                   uint32_t name_len, const ckptio__hold *h, uint32_t ra, uint32_t rb)
{
    char b1[256], b2[256];
    blame(b, ra, rb, name, name_len);
    return fail(err, errlen, CKPTIO_E_DUPLICATE,
                "tensor '%.*s': ranks %u and %u hold different values for the same box [offset "
                "%s shape %s]; a plain tensor saved from every rank must be identical on all "
                "ranks — save rank-specific values as rank-local",
                (int)CKPTIO__MIN(name_len, NAME_SHOWN), name, ra, rb,
                DIMS(b1, h->offset, h->ndim), DIMS(b2, h->box, h->ndim));
}

/* Stored names, the error a rank sent, and every item into x->it. */
static int collect(pctx *x)
{
    uint64_t n = 0, lbytes = 0;
    for (uint32_t r = 0; r < x->nranks; r++) {
        const ckptio__holdings *h = x->ranks[r];
        if (!h || h->code < 0 || h->n > UINT32_MAX) blame(x->blame, r, NONE, NULL, 0);
        if (h && h->code < 0 && x->blame) x->blame->flags = h->flags;
        if (!h) return fail(x->err, x->errlen, CKPTIO_E_USAGE, "rank %u's holdings are missing", r);
        if (h->code < 0)
            return fail(x->err, x->errlen, h->code, "rank %u: %s", r,
                        h->msg[0] ? h->msg : ckptio_strerror(h->code));
        if (h->n > UINT32_MAX)
            return fail(x->err, x->errlen, CKPTIO_E_LIMIT, "rank %u holds %llu items", r, U(h->n));
        n += h->n;
        for (uint64_t i = 0; i < h->n; i++)
            if (h->items[i].flags & CKPTIO__HOLD_RANK_LOCAL) lbytes += h->items[i].name_len + 17;
    }
    x->it = malloc(n * sizeof *x->it + 1);
    x->lnames = malloc(lbytes + 1);
    if (!x->it || !x->lnames) return fail(x->err, x->errlen, -ENOMEM, "out of memory planning");
    char *ln = x->lnames;
    for (uint32_t r = 0; r < x->nranks; r++)
        for (uint64_t i = 0; i < x->ranks[r]->n; i++) {
            const ckptio__hold *h = &x->ranks[r]->items[i];
            pitem *p = &x->it[x->n_it++];
            *p = (pitem){h, h->name, h->name_len, r, (uint32_t)i};
            if (!(h->flags & CKPTIO__HOLD_RANK_LOCAL)) continue;
            size_t k = ckptio__rank_local_name(ln, h->name_len + 17, h->name, h->name_len, r);
            if (k == 0 || k > CKPTIO_MAX_NAME) {
                blame(x->blame, r, NONE, p->name, p->name_len);
                return fail(x->err, x->errlen, CKPTIO_E_LIMIT,
                            "rank %u: rank-local tensor '%.*s': its stored name "
                            "'<name>@rank%u' is longer than %u bytes",
                            r, TNAME(p), r, CKPTIO_MAX_NAME);
            }
            p->name = ln;
            p->name_len = (uint32_t)k;
            ln += k + 1;
        }
    return 0;
}

/* Every item of a tensor against the first: rank-locality, dtype, rank and global shape. */
static int check_agreement(pctx *x, uint64_t g0, uint64_t g1)
{
    const pitem *f = &x->it[g0];
    char b1[256], b2[256];
    for (uint64_t k = g0 + 1; k < g1; k++) {
        const pitem *p = &x->it[k];
        bool fl = f->h->flags & CKPTIO__HOLD_RANK_LOCAL, pl = p->h->flags & CKPTIO__HOLD_RANK_LOCAL;
        if (fl != pl) {
            const pitem *l = fl ? f : p, *o = fl ? p : f;
            blame(x->blame, l->rank, o->rank, f->name, f->name_len);
            return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                        "tensor '%.*s': rank %u stores its rank-local '%.*s' under this name, and "
                        "rank %u saves a plain tensor of the same name; rename one",
                        TNAME(f), l->rank, (int)CKPTIO__MIN(l->h->name_len, NAME_SHOWN),
                        l->h->name, o->rank);
        }
        if (f->h->dtype != p->h->dtype || f->h->ndim != p->h->ndim ||
            cmp_dims(f->h->shape, p->h->shape, f->h->ndim)) {
            const pitem *a = f->rank < p->rank ? f : p, *b = f->rank < p->rank ? p : f;
            blame(x->blame, a->rank, b->rank, f->name, f->name_len);
            return fail(x->err, x->errlen, CKPTIO_E_SHAPE,
                        "tensor '%.*s': rank %u has %s [%s] but rank %u has %s [%s]; every rank "
                        "must give a tensor the same dtype and global shape",
                        TNAME(f), a->rank, dt_name(a->h->dtype),
                        DIMS(b1, a->h->shape, a->h->ndim), b->rank,
                        dt_name(b->h->dtype), DIMS(b2, b->h->shape, b->h->ndim));
        }
    }
    return 0;
}

/* "0, 1, 3" : the first holders of the tensor's boxes, distinct, at most 8. */
static const char *fmt_ranks(char *buf, size_t cap, const pctx *x, uint64_t b0, uint64_t b1)
{
    uint32_t shown[8];
    unsigned n_shown = 0;
    size_t used = 0;
    bool more = false;
    buf[0] = 0;
    for (uint64_t b = b0; b < b1; b++) {
        uint32_t r = x->it[x->box[b].first].rank;
        bool seen = false;
        for (unsigned i = 0; i < n_shown; i++) seen = seen || shown[i] == r;
        if (seen) continue;
        if (n_shown == 8) {
            more = true;
            break;
        }
        shown[n_shown++] = r;
        int w = snprintf(buf + used, cap - used, "%s%u", n_shown > 1 ? ", " : "", r);
        if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
    }
    if (more) snprintf(buf + used, cap - used, ", ...");
    return buf;
}

/* The distinct boxes box[b0 .. b1) of one tensor must tile its shape: disjoint (a sweep along
 * the dimension split most often) and covering it (disjoint boxes inside the shape whose
 * volumes add up to the shape's). Empty boxes hold nothing and take no part. */
static int check_tiling(pctx *x, uint64_t b0, uint64_t b1)
{
    const pitem *f = &x->it[x->box[b0].first];
    const uint64_t *shape = f->h->shape;
    uint32_t nd = f->h->ndim;
    uint64_t tvol = 0, covered = 0, n = 0, ka = 0, kb = 0;
    char b1s[256], b2s[256], b3s[256], b4s[256], b5s[256];
    (void)ckptio__shape_volume(shape, nd, &tvol);
    if (tvol == 0) return 0;
    if (ckptio__sweep_reserve(&x->sweep, b1 - b0))
        return fail(x->err, x->errlen, -ENOMEM, "out of memory planning");
    for (uint64_t b = b0; b < b1; b++) {
        const ckptio__hold *h = x->it[x->box[b].first].h;
        uint64_t v = 0;
        (void)ckptio__shape_volume(h->box, nd, &v);
        if (v == 0) continue;
        covered = covered + v < covered ? UINT64_MAX : covered + v;
        x->live[n] = b;
        x->sweep.off[n] = h->offset;
        x->sweep.shp[n++] = h->box;
    }
    /* Distinct boxes of a scalar: one at most, so no overlap to look for. */
    if (nd > 0 && ckptio__first_overlap(&x->sweep, shape, nd, n, &ka, &kb)) {
        /* ka is met first along the sweep: named first, as the rank that already holds it */
        const pitem *a = &x->it[x->box[x->live[ka]].first], *b = &x->it[x->box[x->live[kb]].first];
        blame(x->blame, a->rank, b->rank, f->name, f->name_len);
        return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                    "tensor '%.*s' [%s]: rank %u's box [offset %s shape %s] overlaps "
                    "rank %u's box [offset %s shape %s]; the boxes saved of a tensor "
                    "must be disjoint or identical (replicas)",
                    TNAME(f), DIMS(b5s, shape, nd), a->rank, DIMS(b1s, a->h->offset, nd),
                    DIMS(b2s, a->h->box, nd), b->rank, DIMS(b3s, b->h->offset, nd),
                    DIMS(b4s, b->h->box, nd));
    }
    if (covered == tvol) return 0;
    blame(x->blame, NONE, NONE, f->name, f->name_len); /* a hole: nobody's in particular */
    char ranks[128];
    snprintf(b4s, sizeof b4s, "the boxes of ranks %s cover %llu of its %llu elements",
             fmt_ranks(ranks, sizeof ranks, x, b0, b1), U(covered), U(tvol));
    if (nd == 0 || !x->sweep.one_dim)
        return fail(x->err, x->errlen, CKPTIO_E_INCOMPLETE,
                    "tensor '%.*s' [%s]: %s; every element must be held by some rank", TNAME(f),
                    DIMS(b1s, shape, nd), b4s);
    /* Split along one dimension: the first gap in the sorted spans is a box nobody holds. */
    uint32_t d = x->sweep.dim;
    uint64_t lo, hi, off[CKPTIO_MAX_NDIM] = {0}, shp[CKPTIO_MAX_NDIM];
    ckptio__sweep_gap(&x->sweep, n, shape[d], &lo, &hi);
    memcpy(shp, shape, nd * 8);
    off[d] = lo, shp[d] = hi - lo;
    return fail(x->err, x->errlen, CKPTIO_E_INCOMPLETE,
                "tensor '%.*s' [%s]: %s; no rank holds [offset %s shape %s]", TNAME(f),
                DIMS(b1s, shape, nd), b4s, DIMS(b2s, off, nd), DIMS(b3s, shp, nd));
}

/* The items of one tensor, it[g0 .. g1): agreement, replicas, distinct boxes, tiling. */
static int plan_tensor(pctx *x, uint64_t g0, uint64_t g1, uint64_t *seq)
{
    CKPTIO__TRY(check_agreement(x, g0, g1));
    uint64_t b0 = x->n_box, tvol = 0;
    (void)ckptio__shape_volume(x->it[g0].h->shape, x->it[g0].h->ndim, &tvol);
    for (uint64_t k = g0; k < g1;) {
        uint64_t e = k + 1;
        const pitem *f = &x->it[k];
        for (; e < g1 && same_box(&x->it[e], f); e++) {
            const pitem *p = &x->it[e];
            char b1[256], b2[256];
            if (p->rank == x->it[e - 1].rank) {
                blame(x->blame, p->rank, NONE, f->name, f->name_len);
                return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                            "tensor '%.*s': rank %u lists the box [offset %s shape %s] twice",
                            TNAME(f), p->rank, DIMS(b1, f->h->offset, f->h->ndim),
                            DIMS(b2, f->h->box, f->h->ndim));
            }
            if (p->h->hash != f->h->hash)
                return diverge(x->err, x->errlen, x->blame, f->name, f->name_len, f->h, f->rank,
                               p->rank);
        }
        x->box[x->n_box++] = (dbox){k, e - k, f->h->nbytes, (*seq)++};
        k = e;
    }
    CKPTIO__TRY(check_tiling(x, b0, x->n_box));
    /* Empty boxes are not written; an empty tensor is, once, for the manifest to list it. */
    uint64_t kept = b0;
    for (uint64_t b = b0; b < x->n_box; b++) {
        uint64_t v = 0;
        (void)ckptio__shape_volume(x->it[x->box[b].first].h->box, x->it[g0].h->ndim, &v);
        if (v > 0 || (tvol == 0 && kept == b0)) x->box[kept++] = x->box[b];
    }
    x->n_box = kept;
    return 0;
}

static int push_assign(pctx *x, const pitem *p, uint64_t start, uint64_t rows, uint64_t bytes)
{
    ckptio__assign a = {p->rank, p->item, start, rows};
    if (ckptio__vec_push(&x->assign, &a, 1) < 0)
        return fail(x->err, x->errlen, -ENOMEM, "out of memory planning");
    x->load[p->rank] += bytes;
    return 0;
}

typedef struct holder {
    uint64_t load;
    uint64_t k; /* index into x->it */
} holder;

static int holder_cmp(const void *pa, const void *pb)
{
    const holder *a = pa, *b = pb;
    if (a->load != b->load) return a->load < b->load ? -1 : 1;
    return (a->k > b->k) - (a->k < b->k); /* items of a box are in rank order */
}

static int order_cmp(const void *pa, const void *pb)
{
    const dbox *a = pa, *b = pb;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

static int whole_rows(const ckptio__hold *h, uint64_t *rows)
{
    *rows = h->ndim ? h->box[0] : 0;
    return 0;
}

/* How many slabs a replicated box of `holders` holders is written as (1: whole). */
static uint64_t slab_count(const ckptio__hold *h, uint64_t bytes, uint64_t holders)
{
    uint64_t rows = h->ndim ? h->box[0] : 0, k = 1;
    if (h->ndim && bytes >= 2 * CKPTIO__PLAN_MIN_SLAB)
        k = CKPTIO__MIN(CKPTIO__MIN(holders, rows), bytes / CKPTIO__PLAN_MIN_SLAB);
    return k ? k : 1;
}

/* Boxes held by one rank go to it; replicated boxes, largest first, to the least loaded
 * holders, split into slabs along dimension 0 when large. */
static int assign_all(pctx *x)
{
    uint64_t most = 1;
    for (uint64_t b = 0; b < x->n_box; b++) {
        const dbox *d = &x->box[b];
        uint64_t rows = 0;
        whole_rows(x->it[d->first].h, &rows);
        if (d->n == 1) CKPTIO__TRY(push_assign(x, &x->it[d->first], 0, rows, d->bytes));
        most = CKPTIO__MAX(most, d->n);
    }
    uint64_t n_rep = 0;
    for (uint64_t b = 0; b < x->n_box; b++)
        if (x->box[b].n > 1) x->box[n_rep++] = x->box[b];
    qsort(x->box, n_rep, sizeof *x->box, order_cmp);
    holder *hs = malloc(most * sizeof *hs);
    if (!hs) return fail(x->err, x->errlen, -ENOMEM, "out of memory planning");
    int rc = 0;
    for (uint64_t b = 0; b < n_rep; b++) {
        const dbox *d = &x->box[b];
        const ckptio__hold *h = x->it[d->first].h;
        uint64_t rows = 0, k = slab_count(h, d->bytes, d->n);
        whole_rows(h, &rows);
        if (k <= 1) {
            uint64_t best = d->first;
            for (uint64_t i = d->first + 1; i < d->first + d->n; i++)
                if (x->load[x->it[i].rank] < x->load[x->it[best].rank]) best = i;
            CKPTIO__CHECK(push_assign(x, &x->it[best], 0, rows, d->bytes));
            continue;
        }
        for (uint64_t i = 0; i < d->n; i++)
            hs[i] = (holder){x->load[x->it[d->first + i].rank], d->first + i};
        qsort(hs, d->n, sizeof *hs, holder_cmp);
        uint64_t row_bytes = d->bytes / rows;
        for (uint64_t j = 0; j < k; j++) {
            uint64_t lo = (uint64_t)((unsigned __int128)rows * j / k);
            uint64_t hi = (uint64_t)((unsigned __int128)rows * (j + 1) / k);
            CKPTIO__CHECK(push_assign(x, &x->it[hs[j].k], lo, hi - lo, (hi - lo) * row_bytes));
        }
    }
out:
    free(hs);
    return rc;
}

static int assign_cmp(const void *pa, const void *pb)
{
    const ckptio__assign *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->item != b->item) return a->item < b->item ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

/* Everything but the hashes, as bytes: equal keys, equal plans. */
static uint8_t *structure_key(const ckptio__holdings *const *ranks, uint32_t nranks, uint64_t *len)
{
    uint64_t n = 8;
    for (uint32_t r = 0; r < nranks; r++) {
        n += 8;
        for (uint64_t i = 0; i < ranks[r]->n; i++)
            n += 24 + ranks[r]->items[i].name_len + 24ull * ranks[r]->items[i].ndim;
    }
    uint8_t *k = malloc(n), *p = k;
    if (!k) return NULL;
    put64(p, nranks), p += 8;
    for (uint32_t r = 0; r < nranks; r++) {
        put64(p, ranks[r]->n), p += 8;
        for (uint64_t i = 0; i < ranks[r]->n; i++) {
            const ckptio__hold *h = &ranks[r]->items[i];
            put32(p, h->name_len), put32(p + 4, h->dtype), put32(p + 8, h->ndim);
            put32(p + 12, h->flags), put64(p + 16, h->nbytes), p += 24;
            memcpy(p, h->name, h->name_len), p += h->name_len;
            for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->shape[d]);
            for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->offset[d]);
            for (uint32_t d = 0; d < h->ndim; d++, p += 8) put64(p, h->box[d]);
        }
    }
    *len = n;
    return k;
}

/* The one check a cached plan still makes: replicas hold equal bytes. */
static int check_replicas(const ckptio__plan *pl, const ckptio__holdings *const *ranks,
                          char *err, size_t errlen, ckptio_error_info *b)
{
    for (uint64_t g = 0; g < pl->n_rep; g++) {
        const uint32_t *m = pl->rep + 2 * pl->rep_first[g];
        const ckptio__hold *f = &ranks[m[0]]->items[m[1]];
        for (uint64_t i = 1; i < pl->rep_first[g + 1] - pl->rep_first[g]; i++) {
            const ckptio__hold *h = &ranks[m[2 * i]]->items[m[2 * i + 1]];
            if (h->hash != f->hash)
                return diverge(err, errlen, b, f->name, f->name_len, f, m[0], m[2 * i]);
        }
    }
    return 0;
}

static void plan_free(ckptio__plan *pl)
{
    if (!pl) return;
    free(pl->assign);
    free(pl->rank_bytes);
    free(pl->rep_first);
    free(pl->rep);
    free(pl->rep_slabs);
    free(pl);
}

/* The replica groups are the boxes with several holders; recorded before assignment reorders
 * x->box. */
static int record_replicas(pctx *x, ckptio__plan *pl)
{
    uint64_t groups = 0, members = 0;
    for (uint64_t b = 0; b < x->n_box; b++)
        if (x->box[b].n > 1) groups++, members += x->box[b].n;
    pl->rep_first = malloc((groups + 1) * sizeof *pl->rep_first);
    pl->rep = malloc(2 * members * sizeof *pl->rep + 1);
    pl->rep_slabs = malloc(groups * sizeof *pl->rep_slabs + 1);
    if (!pl->rep_first || !pl->rep || !pl->rep_slabs)
        return fail(x->err, x->errlen, -ENOMEM, "out of memory planning");
    uint64_t at = 0;
    for (uint64_t b = 0; b < x->n_box; b++) {
        if (x->box[b].n < 2) continue;
        pl->rep_slabs[pl->n_rep] = slab_count(x->it[x->box[b].first].h, x->box[b].bytes,
                                              x->box[b].n);
        pl->rep_first[pl->n_rep++] = at;
        for (uint64_t i = 0; i < x->box[b].n; i++, at++) {
            pl->rep[2 * at] = x->it[x->box[b].first + i].rank;
            pl->rep[2 * at + 1] = x->it[x->box[b].first + i].item;
        }
    }
    pl->rep_first[pl->n_rep] = at;
    return 0;
}

int ckptio__plan_make(ckptio__plan_cache *cache, const ckptio__holdings *const *ranks,
                      uint32_t nranks, const ckptio__plan **out, char *err, size_t errlen,
                      ckptio_error_info *b)
{
    if (err && errlen) err[0] = 0;
    blame(b, NONE, NONE, NULL, 0);
    if (!cache || !out || !ranks || nranks == 0)
        return fail(err, errlen, CKPTIO_E_USAGE, "plan: no cache, output or ranks");
    *out = NULL;
    pctx x = {.ranks = ranks, .nranks = nranks, .err = err, .errlen = errlen, .blame = b};
    ckptio__vec_init(&x.assign, sizeof(ckptio__assign));
    ckptio__plan *pl = NULL;
    uint8_t *key = NULL;
    uint64_t klen = 0;
    int rc = 0;
    for (uint32_t r = 0; r < nranks; r++) {
        if (!ranks[r] || ranks[r]->code < 0) blame(b, r, NONE, NULL, 0);
        if (ranks[r] && ranks[r]->code < 0 && b) b->flags = ranks[r]->flags;
        CKPTIO__GOTO_IF(!ranks[r], fail(err, errlen, CKPTIO_E_USAGE,
                                        "rank %u's holdings are missing", r));
        CKPTIO__GOTO_IF(ranks[r]->code < 0,
                        fail(err, errlen, ranks[r]->code, "rank %u: %s", r,
                             ranks[r]->msg[0] ? ranks[r]->msg : ckptio_strerror(ranks[r]->code)));
    }
    key = structure_key(ranks, nranks, &klen);
    CKPTIO__GOTO_IF(!key, fail(err, errlen, -ENOMEM, "out of memory planning"));
    if (cache->plan && cache->key_len == klen && memcmp(cache->key, key, klen) == 0) {
        CKPTIO__CHECK(check_replicas(cache->plan, ranks, err, errlen, b));
        cache->hits++;
        *out = cache->plan;
        goto out;
    }
    CKPTIO__CHECK(collect(&x));
    qsort(x.it, x.n_it, sizeof *x.it, pitem_cmp);
    x.box = malloc(x.n_it * sizeof *x.box + 1);
    x.live = malloc(x.n_it * sizeof *x.live + 1);
    x.load = calloc(nranks, sizeof *x.load);
    pl = calloc(1, sizeof *pl);
    CKPTIO__GOTO_IF(!x.box || !x.live || !x.load || !pl,
                    fail(err, errlen, -ENOMEM, "out of memory planning"));
    uint64_t seq = 0;
    for (uint64_t g0 = 0; g0 < x.n_it;) {
        uint64_t g1 = g0 + 1;
        while (g1 < x.n_it && ckptio__name_cmp(x.it[g1].name, x.it[g1].name_len, x.it[g0].name,
                                       x.it[g0].name_len) == 0)
            g1++;
        CKPTIO__CHECK(plan_tensor(&x, g0, g1, &seq));
        pl->tensors++;
        g0 = g1;
    }
    CKPTIO__CHECK(record_replicas(&x, pl));
    CKPTIO__CHECK(assign_all(&x));
    pl->nranks = nranks;
    pl->n_assign = x.assign.len;
    pl->assign = x.assign.items;
    ckptio__vec_init(&x.assign, sizeof(ckptio__assign));
    qsort(pl->assign, pl->n_assign, sizeof *pl->assign, assign_cmp);
    pl->rank_bytes = x.load;
    x.load = NULL;
    plan_free(cache->plan);
    free(cache->key);
    cache->plan = pl;
    cache->key = key;
    cache->key_len = klen;
    *out = pl;
    pl = NULL;
    key = NULL;
out:
    plan_free(pl);
    free(key);
    free(x.it);
    free(x.lnames);
    free(x.box);
    free(x.live);
    ckptio__sweep_fini(&x.sweep);
    free(x.load);
    ckptio__vec_free(&x.assign);
    return rc;
}

void ckptio__plan_cache_free(ckptio__plan_cache *cache)
{
    if (!cache) return;
    plan_free(cache->plan);
    free(cache->key);
    *cache = (ckptio__plan_cache){0};
}

/* ---- the plan on the wire ---- */

int ckptio__plan_encode(const ckptio__plan *plan, int code, const char *msg,
                        const ckptio_error_info *b, ckptio_bytes *out)
{
    size_t ml = code < 0 && msg ? strnlen(msg, MSG_MAX) : 0;
    size_t tl = code < 0 && b ? strnlen(b->tensor, CKPTIO_MAX_NAME) : 0;
    uint64_t n = code < 0 || !plan ? 0 : plan->n_assign;
    uint64_t nr = code < 0 || !plan || !plan->n_rep ? 0 : plan->rep_first[plan->n_rep];
    if (code >= 0 && !plan) return CKPTIO_E_USAGE;
    if (n > (SIZE_MAX - PLAN_HEAD - ml) / PLAN_ENTRY / 2 || nr > UINT32_MAX ||
        nr > (SIZE_MAX - PLAN_HEAD - ml) / PLAN_REP / 2)
        return CKPTIO_E_LIMIT;
    CKPTIO__TRY(ckptio_bytes_resize(out, PLAN_HEAD + ml + tl + n * PLAN_ENTRY + nr * PLAN_REP));
    uint8_t *p = out->data;
    put32(p, PLAN_MAGIC);
    put32(p + 4, WIRE_VERSION);
    put32(p + 8, (uint32_t)(code < 0 ? code : 0));
    put32(p + 12, (uint32_t)ml);
    if (code < 0) {
        put32(p + 16, b ? (uint32_t)b->rank : UINT32_MAX);
        put32(p + 20, b ? (uint32_t)b->other_rank : UINT32_MAX);
        put32(p + 24, (uint32_t)tl);
        put32(p + 28, b ? b->flags & CKPTIO_ERROR_REFUSED : 0);
    } else {
        put32(p + 16, plan->nranks);
        put32(p + 20, (uint32_t)nr);
        put64(p + 24, n);
    }
    if (ml) memcpy(p + PLAN_HEAD, msg, ml);
    if (tl) memcpy(p + PLAN_HEAD + ml, b->tensor, tl);
    p += PLAN_HEAD + ml + tl;
    for (uint64_t i = 0; i < n; i++, p += PLAN_ENTRY) {
        const ckptio__assign *a = &plan->assign[i];
        put32(p, a->rank);
        put32(p + 4, a->item);
        put64(p + 8, a->start);
        put64(p + 16, a->rows);
    }
    for (uint64_t g = 0; nr && g < plan->n_rep; g++)
        for (uint64_t i = plan->rep_first[g]; i < plan->rep_first[g + 1]; i++, p += PLAN_REP) {
            put32(p, plan->rep[2 * i]);
            put32(p + 4, plan->rep[2 * i + 1]);
            put64(p + 8, plan->rep_slabs[g]);
        }
    return 0;
}

int ckptio__plan_status(const uint8_t *buf, uint64_t len)
{
    if (!buf || len < PLAN_HEAD || get32(buf) != PLAN_MAGIC || get32(buf + 4) != WIRE_VERSION)
        return 1;
    int code = (int)get32(buf + 8);
    return code > 0 ? 1 : code;
}

/* A rank number from a failed plan's header: UINT32_MAX (or anything out of range) is none. */
static int32_t wire_rank(uint32_t v)
{
    return v > INT32_MAX ? CKPTIO_ERROR_NO_RANK : (int32_t)v;
}

int ckptio__plan_decode_rank(const uint8_t *buf, uint64_t len, uint32_t rank,
                             const ckptio__holdings *mine, ckptio__vec *out, char *err,
                             size_t errlen, ckptio_error_info *b)
{
    if (err && errlen) err[0] = 0;
    blame(b, NONE, NONE, NULL, 0);
    if (!buf || len < PLAN_HEAD || get32(buf) != PLAN_MAGIC || get32(buf + 4) != WIRE_VERSION)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: not a ckptio plan of version %u",
                    WIRE_VERSION);
    int code = (int)get32(buf + 8);
    uint32_t ml = get32(buf + 12), nranks = get32(buf + 16), nr = get32(buf + 20);
    uint64_t n = get64(buf + 24);
    if (code < 0) { /* the blame instead of assignments */
        uint32_t tl = get32(buf + 24), flags = get32(buf + 28);
        if (ml > MSG_MAX || tl > CKPTIO_MAX_NAME || len - PLAN_HEAD != (uint64_t)ml + tl ||
            (flags & ~CKPTIO_ERROR_REFUSED))
            return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: inconsistent header");
        blame(b, wire_rank(nranks), wire_rank(nr), tl ? (const char *)buf + PLAN_HEAD + ml : NULL,
              tl);
        if (b) b->flags = flags;
        return fail(err, errlen, code, "%.*s", (int)ml, (const char *)buf + PLAN_HEAD);
    }
    if (code > 0 || ml > MSG_MAX || len - PLAN_HEAD < ml ||
        (len - PLAN_HEAD - ml) / PLAN_ENTRY < n ||
        len - PLAN_HEAD - ml - n * PLAN_ENTRY != (uint64_t)nr * PLAN_REP)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: inconsistent header");
    if (rank >= nranks)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: made for %u ranks, this is rank %u",
                    nranks, rank);
    const uint8_t *p = buf + PLAN_HEAD + ml;
    for (uint64_t i = 0; i < n; i++, p += PLAN_ENTRY) {
        ckptio__assign a = {get32(p), get32(p + 4), get64(p + 8), get64(p + 16)};
        if (a.rank != rank) continue;
        if (a.item >= mine->n)
            return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: rank %u has no item %u", rank,
                        a.item);
        const ckptio__hold *h = &mine->items[a.item];
        uint64_t rows = h->ndim ? h->box[0] : 0;
        if (a.start > rows || a.rows > rows - a.start || (a.rows == 0 && rows != 0))
            return fail(err, errlen, CKPTIO_E_CORRUPT,
                        "plan: rows %llu+%llu of tensor '%.*s' lie outside its box", U(a.start),
                        U(a.rows), (int)CKPTIO__MIN(h->name_len, NAME_SHOWN), h->name);
        if (ckptio__vec_push(out, &a, 1) < 0) return fail(err, errlen, -ENOMEM, "out of memory");
    }
    return 0;
}

int ckptio__plan_decode_replicas(const uint8_t *buf, uint64_t len, uint32_t rank,
                                 const ckptio__holdings *mine, ckptio__vec *out, char *err,
                                 size_t errlen)
{
    if (ckptio__plan_status(buf, len) != 0)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: no valid plan");
    uint32_t ml = get32(buf + 12), nr = get32(buf + 20);
    uint64_t n = get64(buf + 24);
    if (len - PLAN_HEAD < ml || (len - PLAN_HEAD - ml) / PLAN_ENTRY < n ||
        len - PLAN_HEAD - ml - n * PLAN_ENTRY != (uint64_t)nr * PLAN_REP)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: inconsistent header");
    const uint8_t *p = buf + PLAN_HEAD + ml + n * PLAN_ENTRY;
    for (uint32_t i = 0; i < nr; i++, p += PLAN_REP) {
        ckptio__replica r = {get32(p + 4), get64(p + 8)};
        if (get32(p) != rank) continue;
        if (r.item >= mine->n)
            return fail(err, errlen, CKPTIO_E_CORRUPT, "plan: rank %u has no item %u", rank,
                        r.item);
        const ckptio__hold *h = &mine->items[r.item];
        uint64_t rows = h->ndim ? h->box[0] : 0;
        if (r.slabs == 0 || r.slabs > CKPTIO__MAX(rows, 1))
            return fail(err, errlen, CKPTIO_E_CORRUPT,
                        "plan: %llu slabs of tensor '%.*s' for %llu rows", U(r.slabs),
                        (int)CKPTIO__MIN(h->name_len, NAME_SHOWN), h->name, U(rows));
        if (ckptio__vec_push(out, &r, 1) < 0) return fail(err, errlen, -ENOMEM, "out of memory");
    }
    return 0;
}
