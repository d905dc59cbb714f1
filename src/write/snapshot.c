/* SPDX-License-Identifier: Apache-2.0 */
/* Snapshots of async saves: tensors copied into pool buffers (or written now), then saved in the background. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu/cuda.h"
#include "writer.h"
#include "pool.h"

/* Host copies are cut into pieces of this size, handed out to the pool's copy threads. */
#define COPY_PIECE (64ull << 20)
/* An item is split (head copied, tail written now) only if at least this much of it fits. */
#define MIN_SPLIT (1ull << 20)
/* The first version of ckptio_dist_item ends with nbytes; later fields read as zero. */
#define ITEM_V1 (offsetof(ckptio_dist_item, nbytes) + sizeof(uint64_t))

struct ckptio_snapshot {
    ckptio_pool *pool;
    ckptio_dist_item *items; /* what was copied, pointing into bufs */
    size_t n;
    char **names;
    uint64_t *dims;      /* per item: shape, offset, box (CKPTIO_MAX_NDIM each) */
    ckptio__pbuf **bufs; /* one per item, NULL for zero-byte ones */
    ckptio_take_stats st;
};

enum { COPY, SPLIT, WRITE };

typedef struct plan {
    int how;
    uint64_t head; /* bytes copied (COPY: all, SPLIT: the first `rows` rows) */
    uint64_t rows;
} plan;

typedef struct piece {
    uint8_t *dst;
    const uint8_t *src;
    uint64_t n;
} piece;

static void copy_piece(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    const piece *p = &((const piece *)ctx)[i];
    memcpy(p->dst, p->src, p->n);
}

/* Copy the public items (any size field up to ours) and check each alone. */
static int read_items(const ckptio_dist_item *items, size_t n, ckptio_dist_item *out,
                      ckptio__msg *m)
{
    if (n && !items) return ckptio__fail(m, CKPTIO_E_USAGE, "ckptio_snapshot_take: items NULL");
    /* Every element is as long as the first says: a caller built against an older header
     * passes shorter ones, whose missing fields read as zero. */
    const size_t stride = n ? items->size : 0;
    for (size_t i = 0; i < n; i++) {
        const ckptio_dist_item *e = (const void *)((const uint8_t *)items + i * stride);
        if (stride < ITEM_V1 || e->size != stride)
            return ckptio__fail(m, CKPTIO_E_USAGE,
                                "item %zu: size %u (item 0: %zu); set every size to "
                                "sizeof(ckptio_dist_item)",
                                i, e->size, stride);
        memset(&out[i], 0, sizeof out[i]);
        memcpy(&out[i], e, CKPTIO__MIN(stride, sizeof out[i]));
        const ckptio_dist_item *it = &out[i];
        size_t es = ckptio_dtype_size(it->dtype);
        uint64_t vol = 0;
        if (!it->name || !es || it->ndim > CKPTIO_MAX_NDIM || (it->ndim && !it->shape) ||
            it->memory > CKPTIO_MEM_CUDA)
            return ckptio__fail(m, CKPTIO_E_USAGE,
                                "item %zu ('%.200s'): needs a name, a known dtype, at most %d "
                                "dimensions with a shape, and memory HOST or CUDA",
                                i, it->name ? it->name : "", CKPTIO_MAX_NDIM);
        if (!ckptio__volume(it->box ? it->box : it->shape, it->ndim, es, &vol) ||
            vol != it->nbytes)
            return ckptio__fail(m, CKPTIO_E_SHAPE,
                                "item %zu ('%.200s'): %llu bytes given, its box holds %llu", i,
                                it->name, (unsigned long long)it->nbytes,
                                (unsigned long long)vol);
        if (it->nbytes && !it->data)
            return ckptio__fail(m, CKPTIO_E_USAGE, "item %zu ('%.200s'): data is NULL", i,
                                it->name);
    }
    return 0;
}

/* How much of `it` to copy with `room` bytes left: all of it, its first rows, or none. */
static plan plan_item(const ckptio_dist_item *it, uint64_t room, bool can_write, bool pinned)
{
    plan p = {COPY, it->nbytes, 0};
    if (!it->nbytes) return p;
    if (it->memory == CKPTIO_MEM_CUDA && !pinned) return (plan){WRITE, 0, 0};
    if (it->nbytes <= room) return p;
    const uint64_t *box = it->box ? it->box : it->shape;
    if (!can_write || it->ndim == 0 || box[0] < 2 || room < MIN_SPLIT) return (plan){WRITE, 0, 0};
    uint64_t row = it->nbytes / box[0];
    uint64_t k = CKPTIO__MIN(room / row, box[0] - 1);
    if (k < 1) return (plan){WRITE, 0, 0};
    return (plan){SPLIT, k * row, k};
}

/* Keep item i (its head when split) in the snapshot, with strings and dims of its own. */
static int keep_item(ckptio_snapshot *s, const ckptio_dist_item *it, const plan *p)
{
    size_t i = s->n;
    uint64_t *d = s->dims + (size_t)3 * CKPTIO_MAX_NDIM * i;
    uint64_t *shape = d, *off = d + CKPTIO_MAX_NDIM, *box = d + 2 * CKPTIO_MAX_NDIM;
    for (uint32_t k = 0; k < it->ndim; k++) {
        shape[k] = it->shape[k];
        off[k] = it->offset ? it->offset[k] : 0;
        box[k] = it->box ? it->box[k] : it->shape[k];
    }
    if (p->how == SPLIT) box[0] = p->rows;
    s->names[i] = strdup(it->name);
    if (!s->names[i]) return -ENOMEM;
    ckptio_dist_item *o = &s->items[i];
    *o = *it;
    o->size = sizeof *o;
    o->name = s->names[i];
    o->shape = shape;
    o->offset = off;
    o->box = box;
    o->nbytes = p->head;
    o->memory = CKPTIO_MEM_HOST;
    o->stream = 0;
    o->data = NULL;
    s->n++;
    return 0;
}

void ckptio_snapshot_free(ckptio_snapshot *s)
{
    if (!s) return;
    ckptio__pool_give(s->pool, s->bufs, s->n);
    for (size_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    free(s->items);
    free(s->dims);
    free(s->bufs);
    ckptio__pool_unref(s->pool);
    free(s);
}

/* The device copies: issued on each item's stream (after the caller's work on it), then
 * waited for. Errors name the tensor. */
static int device_copy(const ckptio_dist_item *src, const ckptio_dist_item *dst, size_t n,
                       bool wait, ckptio__msg *m)
{
    const ckptio__cuda *cu = NULL;
    int rc = 0;
    char e[160];
    for (size_t i = 0; i < n; i++) {
        if (src[i].memory != CKPTIO_MEM_CUDA || !dst[i].nbytes) continue;
        if (!cu) {
            const char *why = "";
            cu = ckptio__cuda_get(&why);
            if (!cu) return ckptio__fail(m, CKPTIO_E_UNSUPPORTED, "tensor '%s': %s", src[i].name, why);
        }
        ckptio__CUdeviceptr p = (ckptio__CUdeviceptr)(uintptr_t)src[i].data;
        ckptio__CUstream st = (ckptio__CUstream)(uintptr_t)src[i].stream;
        ckptio__CUresult r = wait ? cu->StreamSynchronize(st) : ckptio__cuda_bind(cu, p);
        if (!wait && r == CKPTIO__CUDA_SUCCESS)
            r = cu->MemcpyDtoHAsync((void *)dst[i].data, p, dst[i].nbytes, st);
        if (r != CKPTIO__CUDA_SUCCESS && rc == 0)
            rc = ckptio__fail(m, -EIO, "tensor '%s': the copy of %llu bytes from GPU memory "
                                       "failed: %s",
                              src[i].name, (unsigned long long)dst[i].nbytes,
                              ckptio__cuda_errstr(cu, r, e, sizeof e));
        if (r != CKPTIO__CUDA_SUCCESS && !wait) return rc; /* nothing later was queued */
    }
    return rc;
}

static int host_copy(ckptio_pool *pool, const ckptio_dist_item *src, const ckptio_dist_item *dst,
                     size_t n, ckptio__msg *m)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (src[i].memory == CKPTIO_MEM_HOST) count += (dst[i].nbytes + COPY_PIECE - 1) / COPY_PIECE;
    if (!count) return 0;
    piece *ps = calloc(count, sizeof *ps);
    if (!ps) return ckptio__fail(m, -ENOMEM, "out of memory planning the snapshot's copies");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i].memory != CKPTIO_MEM_HOST) continue;
        for (uint64_t a = 0; a < dst[i].nbytes; a += COPY_PIECE)
            ps[k++] = (piece){(uint8_t *)dst[i].data + a, (const uint8_t *)src[i].data + a,
                              CKPTIO__MIN(COPY_PIECE, dst[i].nbytes - a)};
    }
    assert(k == count);
    ckptio__workers_for(count > 1 ? ckptio__pool_workers(pool) : NULL, count, copy_piece, ps);
    free(ps);
    return 0;
}

/* What the cap could not hold, written through `w` now: whole items, and tails of split ones. */
static int write_now(ckptio_writer *w, const ckptio_dist_item *its, const plan *pl, size_t n,
                     uint64_t *bytes, ckptio__msg *m)
{
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const ckptio_dist_item *it = &its[i];
        if (pl[i].how == COPY) continue;
        uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
        for (uint32_t k = 0; k < it->ndim; k++) {
            off[k] = it->offset ? it->offset[k] : 0;
            box[k] = it->box ? it->box[k] : it->shape[k];
        }
        off[0] += pl[i].rows;
        box[0] -= pl[i].rows;
        uint64_t nb = it->nbytes - pl[i].head;
        rc = ckptio_writer_add_mem(w, it->name, it->dtype, it->ndim, it->shape, off, box,
                                   (const uint8_t *)it->data + pl[i].head, nb, it->memory,
                                   it->stream);
        *bytes += nb;
    }
    if (rc == 0) rc = ckptio_writer_flush(w);
    if (rc < 0)
        rc = ckptio__fail(m, rc, "writing what did not fit in the pool during the take: %s",
                          ckptio_writer_errmsg(w));
    return rc;
}

int ckptio_snapshot_take(ckptio_snapshot **out, ckptio_pool *pool, const ckptio_dist_item *items,
                         size_t n, ckptio_writer *w)
{
    if (!out || !pool)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_snapshot_take: `out` and the pool "
                                                  "must not be NULL");
    *out = NULL;
    double t0 = ckptio__now();
    ckptio__msg m = {0};
    int rc = ckptio__pool_settle(pool, &m);
    if (rc < 0) return rc;
    ckptio_dist_item *its = calloc(n + 1, sizeof *its);
    plan *pl = calloc(n + 1, sizeof *pl);
    uint64_t *sizes = calloc(n + 1, sizeof *sizes);
    bool *dev = calloc(n + 1, sizeof *dev);
    ckptio_snapshot *s = calloc(1, sizeof *s);
    size_t nsizes = 0;
    if (s) {
        s->items = calloc(n + 1, sizeof *s->items);
        s->names = calloc(n + 1, sizeof *s->names);
        s->dims = calloc((n + 1) * 3 * CKPTIO_MAX_NDIM, sizeof *s->dims);
        s->bufs = calloc(n + 1, sizeof *s->bufs);
        s->pool = pool;
        ckptio__pool_ref(pool);
    }
    ckptio__pbuf **taken = calloc(n + 1, sizeof *taken);
    ckptio_dist_item *srcs = calloc(n + 1, sizeof *srcs);
    if (!its || !pl || !sizes || !dev || !s || !s->items || !s->names || !s->dims || !s->bufs ||
        !taken || !srcs)
        CKPTIO__GOTO_IF(1, ckptio__fail(&m, -ENOMEM, "ckptio_snapshot_take: out of memory"));
    CKPTIO__CHECK(read_items(items, n, its, &m));

    uint64_t room = ckptio__pool_room(pool), used = 0;
    bool pinned = ckptio__pool_pinned(pool);
    for (size_t i = 0; i < n; i++) {
        pl[i] = plan_item(&its[i], room - used, w != NULL, pinned);
        if (pl[i].how != COPY && !w)
            CKPTIO__GOTO_IF(1, ckptio__fail(
                                   &m, CKPTIO_E_LIMIT,
                                   "tensor '%s' (%llu bytes) does not fit in the pool (%llu of "
                                   "%llu bytes left%s) and no writer was given to write it "
                                   "now; save during the call, or raise max_bytes",
                                   its[i].name, (unsigned long long)its[i].nbytes,
                                   (unsigned long long)(room - used), (unsigned long long)room,
                                   its[i].memory == CKPTIO_MEM_CUDA && !pinned
                                       ? "; device tensors need page-locked buffers"
                                       : ""));
        used += pl[i].head;
        s->st.split += pl[i].how == SPLIT;
        if (pl[i].head) {
            sizes[nsizes] = pl[i].head;
            dev[nsizes++] = its[i].memory == CKPTIO_MEM_CUDA;
        }
    }
    ckptio_pool_usage ps = {.size = sizeof ps};
    ckptio_pool_stats(pool, &ps);
    uint64_t allocs0 = ps.allocations, devptr = 0;
    for (size_t i = 0; i < n && !devptr; i++)
        if (its[i].memory == CKPTIO_MEM_CUDA) devptr = (uint64_t)(uintptr_t)its[i].data;
    CKPTIO__CHECK(ckptio__pool_take(pool, sizes, dev, nsizes, devptr, taken, &m));
    size_t b = 0;
    for (size_t i = 0; i < n; i++) {
        if (pl[i].how == WRITE) continue;
        size_t k = s->n;
        CKPTIO__GOTO_IF(keep_item(s, &its[i], &pl[i]) < 0,
                        ckptio__fail(&m, -ENOMEM, "ckptio_snapshot_take: out of memory"));
        srcs[k] = its[i];
        srcs[k].nbytes = pl[i].head;
        if (pl[i].head) {
            s->bufs[k] = taken[b];
            taken[b] = NULL; /* the snapshot's now: given back by its free */
            s->items[k].data = s->bufs[k]->p;
            b++;
        }
    }
    /* Device copies first: they run while the host copies do. Whatever fails, every copy
     * queued has finished before a buffer goes back to the pool. */
    rc = device_copy(srcs, s->items, s->n, false, &m);
    int rc2 = rc < 0 ? 0 : host_copy(pool, srcs, s->items, s->n, &m);
    int rc3 = device_copy(srcs, s->items, s->n, true, &m);
    CKPTIO__CHECK(rc < 0 ? rc : rc2 < 0 ? rc2 : rc3);
    for (size_t i = 0; i < s->n; i++) {
        s->st.copied_bytes += s->items[i].nbytes;
        if (srcs[i].memory == CKPTIO_MEM_CUDA) s->st.device_bytes += s->items[i].nbytes;
    }
    if (w) CKPTIO__CHECK(write_now(w, its, pl, n, &s->st.written_bytes, &m));
    ckptio_pool_stats(pool, &ps);
    s->st.allocations = ps.allocations - allocs0;

out:
    if (taken) ckptio__pool_give(pool, taken, nsizes); /* those not handed to s */
    free(taken);
    free(sizes);
    free(dev);
    free(its);
    free(srcs);
    free(pl);
    if (rc < 0) {
        ckptio_snapshot_free(s);
        return rc; /* its message is the thread's last error already */
    }
    s->st.seconds = ckptio__now() - t0;
    *out = s;
    return 0;
}

int ckptio_snapshot_items(const ckptio_snapshot *s, const ckptio_dist_item **items, size_t *n)
{
    if (!s || !items || !n)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_snapshot_items: NULL argument");
    *items = s->items;
    *n = s->n;
    return 0;
}

int ckptio_snapshot_stats(const ckptio_snapshot *s, ckptio_take_stats *out)
{
    if (!s || !out || out->size < offsetof(ckptio_take_stats, seconds))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_stats: NULL argument, or out->size not set to "
                            "sizeof(ckptio_take_stats)");
    ckptio_take_stats st = s->st;
    st.size = out->size;
    memcpy(out, &st, CKPTIO__MIN((size_t)out->size, sizeof st));
    return 0;
}

/* ---- the background part ---- */

typedef struct commit_job {
    ckptio_snapshot *s;
    ckptio_writer *w; /* NULL once closed by the job */
} commit_job;

/* Add the copies, commit, close, and only then give the buffers back: a writer that failed
 * may still have writes from them in flight until it is closed. */
static int commit_run(void *ctx, ckptio_stats *st, ckptio__msg *msg)
{
    commit_job *j = ctx;
    ckptio_snapshot *s = j->s;
    int rc = 0;
    for (size_t i = 0; i < s->n && rc == 0; i++) {
        const ckptio_dist_item *it = &s->items[i];
        rc = ckptio_writer_add(j->w, it->name, it->dtype, it->ndim, it->shape, it->offset,
                               it->box, it->data, it->nbytes);
    }
    if (rc == 0) rc = ckptio_writer_commit(j->w);
    (void)ckptio_writer_stats(j->w, st);
    if (rc < 0) *msg = j->w->msg; /* the text and its values */
    ckptio_writer_close(j->w);
    j->w = NULL;
    ckptio__pool_give(s->pool, s->bufs, s->n);
    return rc;
}

static void commit_drop(void *ctx, bool forked)
{
    commit_job *j = ctx;
    /* In a forked child an unfinished job's writer has the parent's I/O threads: left be. */
    if (!forked) ckptio_writer_close(j->w);
    ckptio_snapshot_free(j->s);
    free(j);
}

int ckptio_snapshot_commit_async(ckptio_snapshot *s, ckptio_writer *w, ckptio_completion **out)
{
    if (out) *out = NULL;
    if (!s || !w || !out)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_snapshot_commit_async: the snapshot, "
                                                  "the writer and `out` must not be NULL");
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i].flags & CKPTIO_DIST_RANK_LOCAL)
            return ckptio__fail(NULL, CKPTIO_E_USAGE,
                                "ckptio_snapshot_commit_async: item '%s' is rank-local state, "
                                "which only ckptio_snapshot_save_dist_async saves",
                                s->items[i].name);
    commit_job *j = calloc(1, sizeof *j);
    if (!j) return ckptio__fail(NULL, -ENOMEM, "ckptio_snapshot_commit_async: out of memory");
    *j = (commit_job){s, w};
    ckptio__job job = {commit_run, commit_drop, j, s->pool};
    int rc = ckptio__completion_start(&job, out, "ckptio_snapshot_commit_async");
    if (rc < 0) free(j);
    return rc;
}

ckptio_pool *ckptio__snapshot_pool(const ckptio_snapshot *s)
{
    return s->pool;
}

void ckptio__snapshot_give_back(ckptio_snapshot *s)
{
    ckptio__pool_give(s->pool, s->bufs, s->n);
}
