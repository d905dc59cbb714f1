/* SPDX-License-Identifier: Apache-2.0 */
/* Distributed saves: every rank's pieces of global tensors into one checkpoint, atomically. */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "plan.h"
#include "../format/manifest.h"
#include "../io/params.h"
#include "../write/part.h"

/* The coordinator's plan cache, one per process: a job saves through one communicator, and
 * a save through another (or with another rank count) simply plans afresh. */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static ckptio__plan_cache cache;
static const void *cache_ctx;
static int32_t cache_nranks;

/* The first version of ckptio_dist_item ends with nbytes; later fields read as zero. */
#define DIST_ITEM_V1 (offsetof(ckptio_dist_item, nbytes) + sizeof(uint64_t))

/* The caller's items (their stride is items[0].size: an older caller's array is of smaller
 * structs) into our own layout. */
static int take_items(const ckptio_dist_item *items, size_t n, ckptio_dist_item *out, char *why,
                      size_t wl)
{
    if (n && !items) return snprintf(why, wl, "items missing for %zu items", n), CKPTIO_E_USAGE;
    uint32_t stride = 0;
    if (n) memcpy(&stride, items, sizeof stride);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = (const uint8_t *)items + i * (size_t)stride;
        uint32_t size;
        memcpy(&size, e, sizeof size);
        if (stride < DIST_ITEM_V1 || size != stride) {
            snprintf(why, wl,
                     "item %zu: size %u (item 0: %u), expected %zu; set every size to "
                     "sizeof(ckptio_dist_item)", i, size, stride, sizeof *out);
            return CKPTIO_E_USAGE;
        }
        memset(&out[i], 0, sizeof out[i]);
        memcpy(&out[i], e, CKPTIO__MIN((size_t)size, sizeof out[i]));
    }
    return 0;
}

/* Items in, holdings out: checks the public struct. The holdings carry no hashes: replicas are
 * compared after the writes (see the replica checks below). */
static int make_holds(const ckptio_dist_item *items, size_t n, ckptio__hold *h, uint64_t *zeros,
                      char *why, size_t wl)
{
    for (size_t i = 0; i < n; i++) {
        const ckptio_dist_item *it = &items[i];
        if (it->memory > CKPTIO_MEM_CUDA) {
            snprintf(why, wl, "item %zu ('%.200s'): unknown memory kind %u (CKPTIO_MEM_HOST or "
                     "CKPTIO_MEM_CUDA)", i, it->name ? it->name : "", it->memory);
            return CKPTIO_E_USAGE;
        }
        if (!it->name || it->ndim > CKPTIO_MAX_NDIM || (it->ndim && !it->shape) ||
            (it->nbytes && !it->data)) {
            snprintf(why, wl, "item %zu ('%.200s'): name, shape or data missing, or over %u "
                     "dimensions", i, it->name ? it->name : "", CKPTIO_MAX_NDIM);
            return it->ndim > CKPTIO_MAX_NDIM ? CKPTIO_E_LIMIT : CKPTIO_E_USAGE;
        }
        size_t nl = strlen(it->name);
        uint32_t fl = it->flags & CKPTIO_DIST_RANK_LOCAL ? CKPTIO__HOLD_RANK_LOCAL : 0;
        h[i] = (ckptio__hold){.name = it->name,
                              .name_len = nl > UINT32_MAX ? UINT32_MAX : (uint32_t)nl,
                              .dtype = (uint32_t)it->dtype, .ndim = it->ndim,
                              .flags = fl,
                              .shape = it->shape, .offset = it->offset ? it->offset : zeros,
                              .box = it->box ? it->box : it->shape, .nbytes = it->nbytes};
        if (it->flags & ~CKPTIO_DIST_RANK_LOCAL) {
            snprintf(why, wl, "item %zu ('%.200s'): unknown flags 0x%x", i, it->name, it->flags);
            return CKPTIO_E_USAGE;
        }
    }
    return 0;
}

/* ---- replica checks ----
 * A holder of a replicated box hashes, per 1 block of csum_block bytes, each slab of it that
 * it does not write (and the ones it writes too when its checksums are off), on a thread of
 * its own while the writes run. The hashes travel after its partial manifest; the coordinator
 * compares them with the writer's block checksums before it publishes. */

static inline void put64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t get64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* One slab to hash (this rank), or one received (the coordinator). */
typedef struct rcheck {
    const char *name;
    uint32_t name_len, ndim, rank;
    uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    const uint8_t *data; /* a device address when cuda */
    uint64_t nbytes, block, n, at; /* n hashes at hashes[at] */
    uint64_t stream;
    bool cuda;
} rcheck;

typedef struct rhash {
    rcheck *c;
    size_t n;
    uint64_t *hashes;
    pthread_t tid;
    bool started;
} rhash;

static void *rhash_run(void *arg)
{
    rhash *h = arg;
    for (size_t i = 0; i < h->n; i++) {
        const rcheck *c = &h->c[i];
        if (c->cuda) continue; /* hashed through the writer's GPU ring: rhash_device */
        for (uint64_t k = 0; k < c->n; k++)
            h->hashes[c->at + k] = ckptio__hash(c->data + k * c->block,
                                                CKPTIO__MIN(c->block, c->nbytes - k * c->block));
    }
    return NULL;
}

/* The slabs this rank hashes, from the plan's replica list and its own assignments; the hashing
 * starts on a thread (inline if none can be started). */
static int rhash_start(rhash *rh, const ckptio_dist_item *items, const ckptio__hold *holds,
                       const ckptio__vec *reps, const ckptio__vec *assign, const ckptio__cfg *cfg)
{
    size_t cap = 0, n = 0;
    uint64_t total = 0, B = cfg->csum_block;
    for (size_t i = 0; i < reps->len; i++)
        cap += CKPTIO__VEC_AT(reps, ckptio__replica, i)->slabs;
    rh->c = calloc(cap + 1, sizeof *rh->c);
    if (!rh->c) return -ENOMEM;
    for (size_t i = 0; i < reps->len; i++) {
        const ckptio__replica *r = CKPTIO__VEC_AT(reps, ckptio__replica, i);
        const ckptio__hold *h = &holds[r->item];
        uint64_t rows = h->ndim ? h->box[0] : 0, row = rows ? h->nbytes / rows : 0;
        for (uint64_t j = 0; j < r->slabs; j++) {
            uint64_t lo = (uint64_t)((unsigned __int128)rows * j / r->slabs);
            uint64_t hi = (uint64_t)((unsigned __int128)rows * (j + 1) / r->slabs);
            bool writes = false;
            for (size_t a = 0; a < assign->len && !writes; a++) {
                const ckptio__assign *x = CKPTIO__VEC_AT(assign, ckptio__assign, a);
                writes = x->item == r->item && x->start == lo;
            }
            uint64_t nb = r->slabs == 1 ? h->nbytes : (hi - lo) * row;
            if ((writes && cfg->checksums) || nb == 0) continue;
            rcheck *c = &rh->c[n++];
            *c = (rcheck){.name = h->name, .name_len = h->name_len, .ndim = h->ndim,
                          .data = (const uint8_t *)items[r->item].data + lo * row, .nbytes = nb,
                          .block = B, .n = (nb + B - 1) / B, .at = total,
                          .cuda = items[r->item].memory == CKPTIO_MEM_CUDA,
                          .stream = items[r->item].stream};
            memcpy(c->off, h->offset, h->ndim * 8);
            memcpy(c->box, h->box, h->ndim * 8);
            if (h->ndim) c->off[0] += lo, c->box[0] = hi - lo;
            total += c->n;
        }
    }
    rh->n = n;
    rh->hashes = malloc(total * sizeof *rh->hashes + 1);
    if (!rh->hashes) return -ENOMEM;
    if (n && pthread_create(&rh->tid, NULL, rhash_run, rh) == 0) rh->started = true;
    else rhash_run(rh);
    return 0;
}

/* A piece of a device slab, landed in the writer's pinned ring: whole blocks but the last. */
typedef struct dhash {
    uint64_t *out, block;
} dhash;

static int dhash_piece(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    dhash *d = ctx;
    for (uint64_t i = 0; i < n; i += d->block)
        d->out[(at + i) / d->block] = ckptio__hash(host + i, CKPTIO__MIN(d->block, n - i));
    return 0;
}

/* The replicated slabs in GPU memory: copied through the writer's pinned ring (host memory
 * stays bounded by it) and hashed as each piece lands, on this thread, after the writes. */
static int rhash_device(rhash *rh, ckptio_writer *w, char *why, size_t wl)
{
    for (size_t i = 0; i < rh->n; i++) {
        const rcheck *c = &rh->c[i];
        if (!c->cuda) continue;
        dhash d = {.out = rh->hashes + c->at, .block = c->block};
        int rc = ckptio__writer_gpu_read(w, (uint64_t)(uintptr_t)c->data, c->nbytes, c->stream,
                                         c->block, dhash_piece, &d, c->name);
        if (rc < 0) {
            snprintf(why, wl, "hashing a replica of tensor '%.*s': %s",
                     (int)CKPTIO__MIN(c->name_len, 200u), c->name, ckptio_writer_errmsg(w));
            return rc;
        }
    }
    return 0;
}

static void rhash_join(rhash *rh)
{
    if (rh->started) pthread_join(rh->tid, NULL);
    rh->started = false;
}

static void rhash_free(rhash *rh)
{
    rhash_join(rh);
    free(rh->c);
    free(rh->hashes);
}

/* What a rank sends: [8: part length][part][8: checks] then per check: name length, ndim,
 * block, hash count, the name, offset and box, the hashes. */
static int pack_part(const ckptio_bytes *part, const rhash *rh, ckptio_bytes *out)
{
    uint64_t len = 16 + part->len;
    for (size_t i = 0; i < rh->n; i++)
        len += 24 + rh->c[i].name_len + 16ull * rh->c[i].ndim + 8 * rh->c[i].n;
    CKPTIO__TRY(ckptio_bytes_resize(out, (size_t)len));
    uint8_t *p = out->data;
    put64le(p, part->len), p += 8;
    if (part->len) memcpy(p, part->data, part->len);
    p += part->len;
    put64le(p, rh->n), p += 8;
    for (size_t i = 0; i < rh->n; i++) {
        const rcheck *c = &rh->c[i];
        put64le(p, (uint64_t)c->ndim << 32 | c->name_len), put64le(p + 8, c->block);
        put64le(p + 16, c->n), p += 24;
        memcpy(p, c->name, c->name_len), p += c->name_len;
        for (uint32_t d = 0; d < c->ndim; d++, p += 8) put64le(p, c->off[d]);
        for (uint32_t d = 0; d < c->ndim; d++, p += 8) put64le(p, c->box[d]);
        for (uint64_t k = 0; k < c->n; k++, p += 8) put64le(p, rh->hashes[c->at + k]);
    }
    return 0;
}

/* The coordinator: rank r's checks from p[0 .. len), appended to *cs (hashes into *hs). */
static int unpack_checks(const uint8_t *p, uint64_t len, uint32_t r, ckptio__vec *cs,
                         ckptio__vec *hs, char *why, size_t wl)
{
    const uint8_t *end = p + len;
    if (len < 8) return snprintf(why, wl, "rank %u sent no replica checks", r), CKPTIO_E_CORRUPT;
    uint64_t n = get64le(p);
    p += 8;
    for (uint64_t i = 0; i < n; i++) {
        rcheck c = {.rank = r};
        if ((uint64_t)(end - p) < 24) goto bad;
        c.name_len = (uint32_t)get64le(p), c.ndim = (uint32_t)(get64le(p) >> 32);
        c.block = get64le(p + 8), c.n = get64le(p + 16);
        p += 24;
        if (c.name_len > CKPTIO_MAX_NAME || c.ndim > CKPTIO_MAX_NDIM || c.block == 0 ||
            (uint64_t)(end - p) < c.name_len + 16ull * c.ndim ||
            c.n > ((uint64_t)(end - p) - c.name_len - 16ull * c.ndim) / 8)
            goto bad;
        c.name = (const char *)p, p += c.name_len;
        for (uint32_t d = 0; d < c.ndim; d++, p += 8) c.off[d] = get64le(p);
        for (uint32_t d = 0; d < c.ndim; d++, p += 8) c.box[d] = get64le(p);
        int64_t at = ckptio__vec_push(hs, NULL, c.n);
        if (at < 0) return snprintf(why, wl, "out of memory checking replicas"), -ENOMEM;
        c.at = (uint64_t)at;
        for (uint64_t k = 0; k < c.n; k++, p += 8)
            *CKPTIO__VEC_AT(hs, uint64_t, c.at + k) = get64le(p);
        if (ckptio__vec_push(cs, &c, 1) < 0)
            return snprintf(why, wl, "out of memory checking replicas"), -ENOMEM;
    }
    if (p == end) return 0;
bad:
    snprintf(why, wl, "rank %u's replica checks are malformed", r);
    return CKPTIO_E_CORRUPT;
}

static int rcheck_cmp(const void *pa, const void *pb)
{
    const rcheck *a = pa, *b = pb;
    int c = ckptio__name_cmp(a->name, a->name_len, b->name, b->name_len);
    if (c) return c;
    if (a->ndim != b->ndim) return a->ndim < b->ndim ? -1 : 1;
    for (uint32_t d = 0; d < a->ndim; d++) {
        if (a->off[d] != b->off[d]) return a->off[d] < b->off[d] ? -1 : 1;
        if (a->box[d] != b->box[d]) return a->box[d] < b->box[d] ? -1 : 1;
    }
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static bool same_slab(const rcheck *a, const rcheck *b)
{
    rcheck x = *a;
    x.rank = b->rank;
    return rcheck_cmp(&x, b) == 0;
}

/* The merged chunk written for a slab, and the rank whose part it came from. */
static const ckptio__mchunk *find_chunk(const ckptio__manifest *m,
                                        const ckptio__manifest *const *parts, uint32_t nparts,
                                        const rcheck *c, uint32_t *rank)
{
    uint64_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const ckptio__mtensor *t = &m->tensors[mid];
        int k = ckptio__name_cmp(m->strtab + t->name, t->name_len, c->name, c->name_len);
        if (k == 0) {
            if (t->ndim != c->ndim) return NULL;
            for (uint64_t i = t->chunk0; i < t->chunk0 + t->n_chunks; i++) {
                const uint64_t *d = m->dims + m->chunks[i].dims;
                if (memcmp(d, c->off, 8ull * c->ndim) || memcmp(d + c->ndim, c->box, 8ull * c->ndim))
                    continue;
                uint64_t f = m->chunks[i].file;
                for (uint32_t p = 0; p < nparts; f -= parts[p]->n_files, p++)
                    if (f < parts[p]->n_files) return *rank = p, &m->chunks[i];
                return NULL;
            }
            return NULL;
        }
        if (k < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Every slab's holders against the lowest-ranked one: the writer's block checksums (or its own
 * hashes when its checksums are off) and the other holders' hashes. */
/* Who a failed replica check is about: ranks a and b, tensor name. */
static void blame_pair(ckptio_error_info *b, uint32_t ra, uint32_t rb, const char *name,
                       uint32_t name_len)
{
    if (!b) return;
    ckptio__info_none(b);
    b->rank = (int32_t)ra;
    b->other_rank = (int32_t)rb;
    snprintf(b->tensor, sizeof b->tensor, "%.*s",
             (int)CKPTIO__MIN(name_len, sizeof b->tensor - 1), name);
}

static int check_replicas(const ckptio__manifest *m, const ckptio__manifest *const *parts,
                          uint32_t nparts, ckptio__vec *cs, const ckptio__vec *hs, char *why,
                          size_t wl, ckptio_error_info *blame)
{
    if (cs->len) qsort(cs->items, cs->len, sizeof(rcheck), rcheck_cmp); /* NULL when empty */
    char b1[256], b2[256];
    for (size_t g0 = 0, g1; g0 < cs->len; g0 = g1) {
        const rcheck *f = CKPTIO__VEC_AT(cs, rcheck, g0);
        for (g1 = g0 + 1; g1 < cs->len && same_slab(CKPTIO__VEC_AT(cs, rcheck, g1), f); g1++) {}
        uint32_t wr = 0;
        const ckptio__mchunk *ch = find_chunk(m, parts, nparts, f, &wr);
        bool wr_listed = false;
        for (size_t i = g0; i < g1; i++) wr_listed |= CKPTIO__VEC_AT(cs, rcheck, i)->rank == wr;
        if (!ch)
            return snprintf(why, wl, "tensor '%.*s': no rank wrote the replicated box [offset %s "
                            "shape %s] rank %u holds (ranks disagree on the plan?)",
                            (int)CKPTIO__MIN(f->name_len, 200u), f->name,
                            ckptio__fmt_dims(b1, sizeof b1, f->off, f->ndim, "scalar"),
                            ckptio__fmt_dims(b2, sizeof b2, f->box, f->ndim, "scalar"), f->rank),
                   CKPTIO_E_CORRUPT;
        /* The members in rank order; the writer's checksums slot in at its rank. */
        rcheck w = {.rank = wr, .block = m->csum_block, .n = ch->n_csums};
        bool use_w = !wr_listed && m->csum_algo == CKPTIO__CSUM_XXH3_64;
        if (!wr_listed && !use_w)
            return snprintf(why, wl, "tensor '%.*s': rank %u wrote a replicated box without "
                            "checksums and sent no hashes of it",
                            (int)CKPTIO__MIN(f->name_len, 200u), f->name, wr), CKPTIO_E_CORRUPT;
        const rcheck *ref = use_w && wr < f->rank ? &w : f;
        const uint64_t *rh = ref == &w ? m->csums + ch->csums : CKPTIO__VEC_AT(hs, uint64_t, f->at);
        size_t i = g0;
        for (bool wdone = !use_w;;) {
            const rcheck *c;
            if (!wdone && (i >= g1 || CKPTIO__VEC_AT(cs, rcheck, i)->rank > wr)) c = &w, wdone = true;
            else if (i < g1) c = CKPTIO__VEC_AT(cs, rcheck, i++);
            else break;
            if (c == ref) continue;
            const uint64_t *ch_h = c == &w ? m->csums + ch->csums : CKPTIO__VEC_AT(hs, uint64_t, c->at);
            if (c->block != ref->block)
                return blame_pair(blame, ref->rank, c->rank, f->name, f->name_len),
                       snprintf(why, wl, "tensor '%.*s': ranks %u and %u hash replicas in blocks "
                                "of %llu and %llu bytes; give every rank the same params",
                                (int)CKPTIO__MIN(f->name_len, 200u), f->name, ref->rank, c->rank,
                                (unsigned long long)ref->block, (unsigned long long)c->block),
                       CKPTIO_E_USAGE;
            if (c->n != ref->n || memcmp(ch_h, rh, 8 * c->n)) {
                uint32_t a = CKPTIO__MIN(ref->rank, c->rank), b = CKPTIO__MAX(ref->rank, c->rank);
                blame_pair(blame, a, b, f->name, f->name_len);
                return snprintf(why, wl,
                                "tensor '%.*s': ranks %u and %u hold different values for the "
                                "same box [offset %s shape %s]; a plain tensor saved from every "
                                "rank must be identical on all ranks — save rank-specific "
                                "values as rank-local",
                                (int)CKPTIO__MIN(f->name_len, 200u), f->name, a, b,
                                ckptio__fmt_dims(b1, sizeof b1, f->off, f->ndim, "scalar"),
                                ckptio__fmt_dims(b2, sizeof b2, f->box, f->ndim, "scalar")),
                       CKPTIO_E_DUPLICATE;
            }
        }
    }
    return 0;
}

/* Rank 0: decode every rank's holdings and plan; the plan's bytes, or the error, into planb. */
static void coordinate(const ckptio_comm *comm, const ckptio_bytes *all, const uint64_t *lens,
                       ckptio_bytes *planb)
{
    uint32_t n = (uint32_t)comm->nranks;
    ckptio__holdings **h = calloc(n, sizeof *h);
    char why[CKPTIO__MSG_LEN], sub[CKPTIO__MSG_LEN];
    ckptio_error_info *blame = malloc(sizeof *blame); /* who, for every rank's exception */
    int rc = 0;
    if (blame) ckptio__info_none(blame);
    if (!h) {
        rc = -ENOMEM;
        snprintf(why, sizeof why, "out of memory planning for %u ranks", n);
        goto out;
    }
    uint64_t at = 0;
    for (uint32_t r = 0; r < n; r++) {
        rc = ckptio__holdings_decode((const uint8_t *)all->data + at, lens[r], &h[r], sub,
                                     sizeof sub);
        at += lens[r];
        if (rc < 0) {
            snprintf(why, sizeof why, "rank %u: %.900s", r, sub);
            if (blame) blame->rank = (int32_t)r;
            goto out;
        }
    }
    pthread_mutex_lock(&cache_mu);
    if (cache_ctx != comm->ctx || cache_nranks != comm->nranks) {
        ckptio__plan_cache_free(&cache);
        cache_ctx = comm->ctx;
        cache_nranks = comm->nranks;
    }
    const ckptio__plan *pl = NULL;
    rc = ckptio__plan_make(&cache, (const ckptio__holdings *const *)h, n, &pl, why, sizeof why,
                           blame);
    if (rc == 0) rc = ckptio__plan_encode(pl, 0, NULL, NULL, planb);
    pthread_mutex_unlock(&cache_mu);
    if (rc == 0) goto done;
    if (rc == -ENOMEM && !why[0]) snprintf(why, sizeof why, "out of memory encoding the plan");
out:
    if (ckptio__plan_encode(NULL, rc, why, blame, planb) < 0) ckptio_bytes_free(planb);
done:
    for (uint32_t r = 0; h && r < n; r++) ckptio__holdings_free(h[r]);
    free(h);
    free(blame);
}

/* One assigned piece into the writer: a slab of rows of an item's box. */
static int write_piece(ckptio_writer *w, const ckptio_dist_item *it, const ckptio__hold *h,
                       const ckptio__assign *a, uint32_t rank, char *why, size_t wl)
{
    char lname[CKPTIO_MAX_NAME + 32];
    const char *name = it->name;
    if (h->flags & CKPTIO__HOLD_RANK_LOCAL) {
        if (!ckptio__rank_local_name(lname, sizeof lname, h->name, h->name_len, rank))
            return snprintf(why, wl, "rank-local name too long"), CKPTIO_E_LIMIT;
        name = lname;
    }
    uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    const uint8_t *data = it->data;
    uint64_t nbytes = h->nbytes;
    if (h->ndim) {
        memcpy(off, h->offset, h->ndim * 8);
        memcpy(box, h->box, h->ndim * 8);
        if (h->box[0]) {
            uint64_t row = h->nbytes / h->box[0];
            data += a->start * row;
            nbytes = a->rows * row;
        }
        off[0] += a->start;
        box[0] = a->rows;
    }
    int rc = ckptio_writer_add_mem(w, name, it->dtype, h->ndim, h->shape, off, box, data, nbytes,
                                   it->memory, it->stream);
    if (rc < 0) snprintf(why, wl, "%s", ckptio_writer_errmsg(w));
    return rc;
}

/* Rank 0, once every part is in: decode, merge, publish. */
static int publish(const ckptio_comm *comm, ckptio_writer *w, const ckptio_bytes *all,
                   const uint64_t *lens, char *why, size_t wl, ckptio_error_info *blame)
{
    uint32_t n = (uint32_t)comm->nranks;
    ckptio__manifest **parts = calloc(n, sizeof *parts), *merged = NULL;
    uint8_t *buf = NULL;
    char sub[CKPTIO__MSG_LEN];
    int rc = 0;
    ckptio__vec cs, hs;
    ckptio__vec_init(&cs, sizeof(rcheck));
    ckptio__vec_init(&hs, sizeof(uint64_t));
    if (!parts) return snprintf(why, wl, "out of memory merging"), -ENOMEM;
    uint64_t at = 0, len = 0;
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *b = (const uint8_t *)all->data + at;
        uint64_t pl = lens[r] >= 8 ? get64le(b) : UINT64_MAX;
        at += lens[r];
        if (pl > lens[r] - 8) {
            rc = CKPTIO_E_CORRUPT;
            snprintf(why, wl, "rank %u's partial manifest is cut short", r);
            goto out;
        }
        rc = ckptio__manifest_decode_ex(b + 8, pl, CKPTIO__MANIFEST_PARTIAL, &parts[r], sub,
                                        sizeof sub);
        if (rc < 0) {
            snprintf(why, wl, "rank %u's partial manifest: %.900s", r, sub);
            goto out;
        }
        rc = unpack_checks(b + 8 + pl, lens[r] - 8 - pl, r, &cs, &hs, why, wl);
        if (rc < 0) goto out;
    }
    rc = ckptio__manifest_merge((const ckptio__manifest *const *)parts, n, &merged, sub,
                                sizeof sub);
    if (rc < 0) {
        snprintf(why, wl, "merging the ranks' manifests (part N is rank N): %.900s", sub);
        goto out;
    }
    /* Diverging replicas fail the save here, before anything is published. */
    rc = check_replicas(merged, (const ckptio__manifest *const *)parts, n, &cs, &hs, why, wl,
                        blame);
    if (rc < 0) goto out;
    rc = ckptio__manifest_encoded_size(merged, &len);
    if (rc == 0 && !(buf = malloc(len))) rc = -ENOMEM;
    if (rc == 0) rc = ckptio__manifest_encode(merged, buf, len);
    if (rc < 0) {
        snprintf(why, wl, "encoding the merged manifest: %s", ckptio_strerror(rc));
        goto out;
    }
    rc = ckptio__writer_publish_manifest(w, buf, len);
    if (rc < 0) snprintf(why, wl, "%s", ckptio_writer_errmsg(w));
out:
    for (uint32_t r = 0; r < n; r++) ckptio__manifest_free(parts[r]);
    free(parts);
    ckptio__vec_free(&cs);
    ckptio__vec_free(&hs);
    ckptio__manifest_free(merged);
    free(buf);
    return rc;
}

/* After the last agreement failed with the coordinator's own error (publish: replicas that
 * differ, ...), rank 0 tells every rank whom it blames, so that every rank's error carries the
 * same values. One more broadcast, made by every rank that holds the verdict "rank 0 failed"
 * (all of them, unless the verdict's own broadcast failed somewhere: then the others wait at
 * most `timeout` more). Raises the error again with the values. */
static void share_blame(const ckptio_comm *comm, int rc, const ckptio_error_info *mine,
                        double timeout)
{
    ckptio__msg *last = malloc(sizeof *last);
    if (!last) return;
    ckptio__msg_last(last);
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    if (last->info.rank != 0) goto out; /* not the coordinator's, or no verdict */
    size_t tl = mine ? strlen(mine->tensor) : 0;
    if (comm->rank == 0 && ckptio_bytes_resize(&b, 8 + tl) == 0) {
        put64le(b.data, mine ? (uint64_t)(uint32_t)mine->other_rank << 32 | (uint32_t)mine->rank
                             : UINT64_MAX);
        memcpy((uint8_t *)b.data + 8, mine ? mine->tensor : "", tl);
    }
    if (ckptio_comm_broadcast(comm, 0, &b, timeout) < 0 || b.len < 8 ||
        b.len - 8 >= sizeof last->info.tensor)
        goto out;
    uint64_t who = get64le(b.data);
    int32_t ra = (int32_t)(uint32_t)who, rb = (int32_t)(uint32_t)(who >> 32);
    if (ra < 0 || ra >= comm->nranks) goto out; /* nobody in particular: the coordinator */
    last->info.rank = ra;
    last->info.other_rank = rb >= 0 && rb < comm->nranks ? rb : CKPTIO_ERROR_NO_RANK;
    memcpy(last->info.tensor, (uint8_t *)b.data + 8, b.len - 8);
    last->info.tensor[b.len - 8] = 0;
out:
    ckptio__refail(NULL, last, rc, "", NULL);
    ckptio_bytes_free(&b);
    free(last);
}

/* ckptio_save_dist; with refused < 0, this rank takes part with that error (and refuse_msg)
 * in place of its items. */
static int save_dist(const char *path, const ckptio_comm *comm, const ckptio_dist_item *items,
                     size_t n, const char *const *meta_keys, const void *const *meta_vals,
                     const size_t *meta_lens, size_t n_meta, const ckptio_params *p,
                     double timeout, ckptio_stats *out, int refused, const char *refuse_msg)
{
    if (!comm || comm->nranks < 1 || comm->rank < 0 || comm->rank >= comm->nranks)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_save_dist: no usable communicator");
    if (!(timeout > 0))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_save_dist: timeout must be > 0 seconds");
    uint32_t rank = (uint32_t)comm->rank, nranks = (uint32_t)comm->nranks;
    char why[CKPTIO__MSG_LEN] = "";
    int rc = 0, local = 0;
    bool handed = false;
    ckptio_bytes mine = CKPTIO_BYTES_INIT, all = CKPTIO_BYTES_INIT, planb = CKPTIO_BYTES_INIT,
                 tmpb = CKPTIO_BYTES_INIT;
    uint64_t *lens = rank == 0 ? calloc(nranks, sizeof *lens) : NULL;
    uint64_t zeros[CKPTIO_MAX_NDIM] = {0};
    ckptio__hold *holds = calloc(n + 1, sizeof *holds);
    ckptio_dist_item *its = calloc(n + 1, sizeof *its);
    ckptio__vec assign, reps;
    ckptio__vec_init(&assign, sizeof(ckptio__assign));
    ckptio__vec_init(&reps, sizeof(ckptio__replica));
    rhash rh = {0};
    ckptio_writer *w = NULL;
    ckptio_bytes part = CKPTIO_BYTES_INIT, packed = CKPTIO_BYTES_INIT;
    double t0 = ckptio__now();
    if (!holds || !its || (rank == 0 && !lens)) {
        local = -ENOMEM;
        snprintf(why, sizeof why, "out of memory");
    }
    if (local == 0 && refused < 0) {
        local = refused;
        snprintf(why, sizeof why, "%s", refuse_msg ? refuse_msg : ckptio_strerror(refused));
    }

    /* 1. Holdings to the coordinator; the plan or its error back. */
    if (local == 0) local = take_items(items, n, its, why, sizeof why);
    if (local == 0) local = make_holds(its, n, holds, zeros, why, sizeof why);
    if (local == 0) local = ckptio__holdings_encode(holds, n, &mine, why, sizeof why);
    if (local < 0 && ckptio__holdings_encode_error(local, why,
                                                   refused < 0 ? CKPTIO_ERROR_REFUSED : 0,
                                                   &mine) < 0)
        ckptio_bytes_free(&mine);
    CKPTIO__CHECK(ckptio_comm_gather(comm, 0, mine.data, mine.len, &all, lens, timeout));
    if (rank == 0) coordinate(comm, &all, lens, &planb);
    CKPTIO__CHECK(ckptio_comm_broadcast(comm, 0, &planb, timeout));
    {
        ckptio__holdings view = {.n = local < 0 ? 0 : n, .items = holds, .msg = ""};
        ckptio_error_info *blame = malloc(sizeof *blame); /* ~8 KiB */
        int pc = ckptio__plan_decode_rank(planb.data, planb.len, rank, &view, &assign, why,
                                          sizeof why, blame);
        /* A failed plan is the same bytes on every rank: every rank stops here, nothing written,
         * with the same message and blame. Anything else wrong with it is this rank's own
         * failure, told at the agreement. */
        if (pc < 0 && ckptio__plan_status(planb.data, planb.len) < 0) {
            rc = ckptio__fail_info(NULL, pc, blame, "%s", why);
            free(blame);
            goto out;
        }
        free(blame);
        if (pc == 0)
            pc = ckptio__plan_decode_replicas(planb.data, planb.len, rank, &view, &reps, why,
                                              sizeof why);
        if (pc < 0 && local == 0) local = pc;
    }
    /* The replicas' hashes, on a thread of their own while this rank writes. */
    if (local == 0 && reps.len) {
        ckptio__cfg cfg;
        ckptio__msg m;
        local = ckptio__cfg_resolve(p, &cfg, &m);
        if (local < 0) snprintf(why, sizeof why, "%s", m.text);
        if (local == 0 && !cfg.csum_block) cfg.csum_block = 1u << 20;
        if (local == 0 && (local = rhash_start(&rh, its, holds, &reps, &assign, &cfg)) < 0)
            snprintf(why, sizeof why, "out of memory hashing replicas");
    }

    /* 2. The coordinator begins the temporary directory; the others join it. */
    if (rank == 0) {
        int bc = ckptio__writer_open_part(&w, path, NULL, 0, p);
        const char *s = bc < 0 ? ckptio_last_error() : ckptio__writer_tmp_path(w);
        size_t sl = strlen(s);
        if (ckptio_bytes_resize(&tmpb, sl + 5) < 0) {
            bc = -ENOMEM;
            s = "out of memory", sl = 13;
            (void)ckptio_bytes_resize(&tmpb, sl + 5);
        }
        if (tmpb.data) {
            int32_t code = bc;
            memcpy(tmpb.data, &code, 4);
            memcpy((char *)tmpb.data + 4, s, sl + 1);
        }
    }
    CKPTIO__CHECK(ckptio_comm_broadcast(comm, 0, &tmpb, timeout));
    if (tmpb.len < 5 || ((char *)tmpb.data)[tmpb.len - 1] != 0) {
        rc = ckptio__fail(NULL, CKPTIO_E_CORRUPT, "rank 0 sent no temporary directory");
        goto out;
    }
    {
        int32_t code;
        memcpy(&code, tmpb.data, 4);
        if (code < 0) {
            rc = ckptio__fail(NULL, code, "rank 0 of %u: %s", nranks, (char *)tmpb.data + 4);
            goto out;
        }
    }
    if (rank != 0 && local == 0) {
        local = ckptio__writer_open_part(&w, path, (char *)tmpb.data + 4, rank, p);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_last_error());
    }

    /* 3. Write this rank's pieces and describe them in a partial manifest. */
    for (size_t i = 0; i < assign.len && local == 0; i++) {
        const ckptio__assign *a = CKPTIO__VEC_AT(&assign, ckptio__assign, i);
        local = write_piece(w, &its[a->item], &holds[a->item], a, rank, why, sizeof why);
    }
    if (local == 0) local = rhash_device(&rh, w, why, sizeof why);
    for (size_t i = 0; rank == 0 && i < n_meta && local == 0; i++) {
        local = ckptio_writer_set_meta(w, meta_keys ? meta_keys[i] : NULL,
                                       meta_vals ? meta_vals[i] : NULL,
                                       meta_lens ? meta_lens[i] : 0);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_writer_errmsg(w));
    }
    if (local == 0) {
        local = ckptio__writer_finish_part(w, &part);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_writer_errmsg(w));
    }
    rhash_join(&rh);
    if (local == 0 && pack_part(&part, &rh, &packed) < 0) {
        local = -ENOMEM;
        snprintf(why, sizeof why, "out of memory packing the partial manifest");
    }
    rc = ckptio_comm_agree(comm, local, why, timeout);
    handed = rc == 0; /* from here the coordinator may hold this rank's part and publish it */
    if (rc == 0) rc = ckptio_comm_gather(comm, 0, packed.data, packed.len, &all, lens, timeout);
    ckptio_bytes_free(&part);
    ckptio_bytes_free(&packed);
    if (rc < 0) goto out;

    /* 4. The coordinator merges and publishes; every rank returns its outcome. */
    local = 0;
    ckptio_error_info *blame = rank == 0 ? malloc(sizeof *blame) : NULL;
    if (blame) ckptio__info_none(blame);
    if (rank == 0) local = publish(comm, w, &all, lens, why, sizeof why, blame);
    rc = ckptio_comm_agree(comm, local, why, timeout);
    if (rc < 0) share_blame(comm, rc, blame, timeout);
    free(blame);
out:
    if (out) {
        memset(out, 0, sizeof *out);
        if (w) ckptio_writer_stats(w, out);
        out->seconds = ckptio__now() - t0;
        out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    }
    /* The coordinator's close removes the temporary directory unless it published; joined
     * writers leave it to the coordinator. */
    if (w && rank != 0 && !handed) ckptio__writer_drop_part(w);
    if (w) {
        ckptio__msg *keep = malloc(sizeof *keep); /* the text and its values (~9 KiB) */
        if (keep) ckptio__msg_last(keep);
        ckptio_writer_close(w);
        if (rc < 0 && keep) ckptio__refail(NULL, keep, rc, "", NULL);
        free(keep);
    }
    ckptio_bytes_free(&mine);
    ckptio_bytes_free(&all);
    ckptio_bytes_free(&planb);
    ckptio_bytes_free(&tmpb);
    ckptio_bytes_free(&part);
    ckptio_bytes_free(&packed);
    rhash_free(&rh);
    ckptio__vec_free(&assign);
    ckptio__vec_free(&reps);
    free(lens);
    free(holds);
    free(its);
    return rc;
}

int ckptio_save_dist(const char *path, const ckptio_comm *comm, const ckptio_dist_item *items,
                     size_t n, const char *const *meta_keys, const void *const *meta_vals,
                     const size_t *meta_lens, size_t n_meta, const ckptio_params *p,
                     double timeout, ckptio_stats *out)
{
    return save_dist(path, comm, items, n, meta_keys, meta_vals, meta_lens, n_meta, p, timeout,
                     out, 0, NULL);
}

int ckptio_save_dist_refuse(const char *path, const ckptio_comm *comm, int code, const char *msg,
                            const ckptio_params *p, double timeout)
{
    return save_dist(path, comm, NULL, 0, NULL, NULL, NULL, 0, p, timeout, NULL,
                     code < 0 ? code : CKPTIO_E_USAGE, msg);
}
