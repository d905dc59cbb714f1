/* SPDX-License-Identifier: Apache-2.0 */
/* The host-buffer pool of async saves: exact-size aligned buffers, reused by size, capped, fork-safe. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../gpu/cuda.h"
#include "writer.h"
#include "../common/forksafe.h"
#include "pool.h"

#define DEFAULT_COPY_THREADS 2

int ckptio__pool_fail_alloc_at;

struct ckptio_pool {
    pthread_mutex_t mu;
    ckptio__pbuf *bufs; /* every buffer the pool owns, lent or idle */
    uint64_t cap, held, lent, pinned_bytes, count, allocations;
    int pinned_mode;    /* the params' switch */
    bool pinned;        /* buffers made now are page-locked */
    bool user_freed;    /* ckptio_pool_free was called */
    unsigned refs;      /* the user's, plus one per snapshot */
    unsigned copy_threads;
    ckptio__workers *workers;
    ckptio_completion *pending; /* the save in flight (or finished, not yet freed) */
    int unreported_rc;          /* error of a freed save nobody waited for */
    ckptio__msg unreported;
    char reason[160];
    ckptio__forksafe fork;
};

/* The child has one thread: no copy thread, no save of its own in flight, and no CUDA. */
static void fork_child(void *obj)
{
    ckptio_pool *p = obj;
    for (ckptio__pbuf **b = &p->bufs; *b;) {
        ckptio__pbuf *x = *b;
        if (!x->lent && !x->pinned) {
            b = &x->next;
            continue;
        }
        /* Lent: its snapshot gives it back to no pool. Pinned and idle: only the parent's
         * driver could free it, so the child forgets it. */
        *b = x->next;
        p->held -= x->n;
        p->count--;
        if (x->lent) {
            p->lent -= x->n;
            x->orphan = true;
            x->next = NULL;
        } else {
            free(x);
        }
    }
    p->pinned_bytes = 0;
    p->workers = NULL; /* its threads are the parent's; the struct is left behind */
    p->pending = NULL;
    p->unreported_rc = 0;
    if (p->pinned) {
        p->pinned = false;
        snprintf(p->reason, sizeof p->reason,
                 "a forked child: the CUDA driver does not survive fork(), plain memory");
    }
}

void ckptio_pool_params_init(ckptio_pool_params *p)
{
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->pinned = CKPTIO_AUTO;
}

static uint64_t default_cap(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 4ull << 30;
    return (uint64_t)pages * (uint64_t)page / 4;
}

int ckptio_pool_new(ckptio_pool **out, const ckptio_pool_params *pp)
{
    if (!out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_pool_new: `out` is NULL");
    *out = NULL;
    ckptio_pool_params p;
    ckptio_pool_params_init(&p);
    if (pp) {
        if (pp->size < offsetof(ckptio_pool_params, copy_threads))
            return ckptio__fail(NULL, CKPTIO_E_USAGE,
                                "ckptio_pool_new: params.size %u is too small; initialize them "
                                "with ckptio_pool_params_init",
                                pp->size);
        memcpy(&p, pp, CKPTIO__MIN((size_t)pp->size, sizeof p));
        p.size = sizeof p;
    }
    if (p.pinned != CKPTIO_AUTO && p.pinned != CKPTIO_ON && p.pinned != CKPTIO_OFF)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_pool_new: pinned must be CKPTIO_AUTO, _ON or _OFF, got %d",
                            p.pinned);
    ckptio_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return ckptio__fail(NULL, -ENOMEM, "ckptio_pool_new: out of memory");
    pool->cap = p.max_bytes ? p.max_bytes : default_cap();
    pool->pinned_mode = p.pinned;
    pool->copy_threads = p.copy_threads ? p.copy_threads : DEFAULT_COPY_THREADS;
    pool->refs = 1;
    if (p.pinned == CKPTIO_OFF) {
        snprintf(pool->reason, sizeof pool->reason, "plain memory asked for (pinned = OFF)");
    } else {
        const char *why = NULL;
        const ckptio__cuda *cu = ckptio__cuda_get(&why);
        pool->pinned = cu != NULL;
        if (!cu) snprintf(pool->reason, sizeof pool->reason, "%s", why ? why : "no CUDA driver");
        if (!cu && p.pinned == CKPTIO_ON) {
            int rc = ckptio__fail(NULL, CKPTIO_E_UNSUPPORTED,
                                  "ckptio_pool_new: page-locked buffers asked for, but %s",
                                  pool->reason);
            free(pool);
            return rc;
        }
    }
    pthread_mutex_init(&pool->mu, NULL);
    pool->fork = (ckptio__forksafe){&pool->mu, fork_child, pool, NULL};
    ckptio__forksafe_add(&pool->fork);
    *out = pool;
    return 0;
}

int ckptio_pool_set_max_bytes(ckptio_pool *pool, uint64_t max_bytes)
{
    if (!pool) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_pool_set_max_bytes: NULL pool");
    pthread_mutex_lock(&pool->mu);
    pool->cap = max_bytes ? max_bytes : default_cap();
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

static void buf_release(ckptio__pbuf *b)
{
    if (b->pinned) {
        const ckptio__cuda *cu = ckptio__cuda_get(NULL);
        if (cu) cu->MemFreeHost(b->p);
    } else {
        munmap(b->p, b->n);
    }
    free(b);
}

/* Unlink and free idle buffers, largest first, while `need` more bytes would pass the cap
 * (need = UINT64_MAX: all of them). Under the lock. */
static uint64_t drop_idle(ckptio_pool *pool, uint64_t need, ckptio__pbuf **keep, size_t nkeep)
{
    uint64_t freed = 0;
    while (need == UINT64_MAX || pool->held + need > pool->cap) {
        ckptio__pbuf **best = NULL;
        for (ckptio__pbuf **b = &pool->bufs; *b; b = &(*b)->next) {
            if ((*b)->lent) continue;
            bool kept = false;
            for (size_t i = 0; i < nkeep && !kept; i++) kept = keep[i] == *b;
            if (!kept && (!best || (*b)->n > (*best)->n)) best = b;
        }
        if (!best) break;
        ckptio__pbuf *x = *best;
        *best = x->next;
        pool->held -= x->n;
        pool->count--;
        if (x->pinned) pool->pinned_bytes -= x->n;
        freed += x->n;
        buf_release(x);
    }
    return freed;
}

/* A new buffer, faulted in now so that no later copy into it page-faults. Page-locked when
 * `pinned`; where the driver refuses and the buffer is not `must` (a host copy on an AUTO
 * pool), plain memory instead, from then on, with the reason in the stats. */
static int buf_make(ckptio_pool *pool, uint64_t n, bool pinned, bool must, uint64_t dev,
                    ckptio__pbuf **out, ckptio__msg *m)
{
    ckptio__pbuf *b = calloc(1, sizeof *b);
    if (!b) return ckptio__fail(m, -ENOMEM, "out of memory for a pool buffer's record");
    b->n = n;
    if (pinned) {
        const ckptio__cuda *cu = ckptio__cuda_get(NULL);
        char e[160];
        ckptio__CUresult r = cu ? ckptio__cuda_bind(cu, dev) : 1;
        if (r == CKPTIO__CUDA_SUCCESS)
            r = cu->MemHostAlloc(&b->p, n, CKPTIO__CU_MEMHOSTALLOC_PORTABLE);
        if (r != CKPTIO__CUDA_SUCCESS && must) {
            free(b);
            return ckptio__fail(m, -ENOMEM,
                                "cannot make a page-locked buffer of %llu bytes: %s",
                                (unsigned long long)n, ckptio__cuda_errstr(cu, r, e, sizeof e));
        }
        if (r != CKPTIO__CUDA_SUCCESS) {
            pool->pinned = false;
            snprintf(pool->reason, sizeof pool->reason, "cuMemHostAlloc refused %llu bytes (%s)",
                     (unsigned long long)n, ckptio__cuda_errstr(cu, r, e, sizeof e));
            pinned = false;
        }
    }
    if (pinned) {
        b->pinned = true;
    } else {
        if (ckptio__pool_fail_alloc_at > 0 && --ckptio__pool_fail_alloc_at == 0) b->p = MAP_FAILED;
        else
            b->p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                        -1, 0);
        if (b->p == MAP_FAILED) {
            free(b);
            return ckptio__fail(m, -ENOMEM,
                                "cannot make a host buffer of %llu bytes for the snapshot (the "
                                "pool holds %llu bytes); lower max_bytes or free memory",
                                (unsigned long long)n, (unsigned long long)pool->held);
        }
    }
    pool->held += n;
    pool->count++;
    pool->allocations++;
    if (b->pinned) pool->pinned_bytes += n;
    b->next = pool->bufs;
    pool->bufs = b;
    *out = b;
    return 0;
}

int ckptio__pool_take(ckptio_pool *pool, const uint64_t *sizes, const bool *device, size_t count,
                      uint64_t dev, ckptio__pbuf **out, ckptio__msg *m)
{
    int rc = 0;
    uint64_t missing = 0;
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < count; i++) {
        out[i] = NULL;
        assert(sizes[i] > 0);
        /* A device copy needs a page-locked buffer; a host copy takes any. */
        for (ckptio__pbuf *b = pool->bufs; b && !out[i]; b = b->next)
            if (!b->lent && b->n == sizes[i] && (b->pinned || !device[i])) {
                b->lent = true; /* reserved: not matched twice */
                out[i] = b;
            }
        if (!out[i]) missing += sizes[i];
    }
    drop_idle(pool, missing, out, count);
    for (size_t i = 0; i < count && rc == 0; i++) {
        if (out[i]) continue;
        rc = buf_make(pool, sizes[i], pool->pinned || device[i],
                      device[i] || pool->pinned_mode == CKPTIO_ON, dev, &out[i], m);
        if (rc == 0) out[i]->lent = true;
    }
    for (size_t i = 0; i < count; i++) {
        if (!out[i]) continue;
        if (rc < 0) {
            out[i]->lent = false; /* made or reused, it stays idle for the next save */
            out[i] = NULL;
        } else {
            pool->lent += out[i]->n;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return rc;
}

void ckptio__pool_give(ckptio_pool *pool, ckptio__pbuf **bufs, size_t count)
{
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < count; i++) {
        ckptio__pbuf *b = bufs[i];
        if (!b) continue;
        bufs[i] = NULL;
        if (b->orphan) { /* lent by the parent before fork */
            if (!b->pinned) munmap(b->p, b->n);
            free(b);
            continue;
        }
        assert(b->lent);
        b->lent = false;
        pool->lent -= b->n;
    }
    pthread_mutex_unlock(&pool->mu);
}

uint64_t ckptio__pool_room(ckptio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    uint64_t room = pool->cap > pool->lent ? pool->cap - pool->lent : 0;
    pthread_mutex_unlock(&pool->mu);
    return room;
}

bool ckptio__pool_pinned(ckptio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    bool p = pool->pinned;
    pthread_mutex_unlock(&pool->mu);
    return p;
}

ckptio__workers *ckptio__pool_workers(ckptio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    if (!pool->workers && pool->copy_threads > 1 &&
        ckptio__workers_start(&pool->workers, pool->copy_threads) < 0)
        pool->workers = NULL; /* the caller copies alone */
    ckptio__workers *w = pool->workers;
    pthread_mutex_unlock(&pool->mu);
    return w;
}

uint64_t ckptio_pool_release(ckptio_pool *pool)
{
    if (!pool) return 0;
    pthread_mutex_lock(&pool->mu);
    uint64_t freed = drop_idle(pool, UINT64_MAX, NULL, 0);
    pthread_mutex_unlock(&pool->mu);
    return freed;
}

int ckptio_pool_stats(const ckptio_pool *pool_, ckptio_pool_usage *out)
{
    if (!pool_ || !out || out->size < offsetof(ckptio_pool_usage, reason))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_pool_stats: NULL argument, or out->size not set to "
                            "sizeof(ckptio_pool_usage)");
    ckptio_pool *pool = (ckptio_pool *)pool_;
    ckptio_pool_usage st;
    memset(&st, 0, sizeof st);
    pthread_mutex_lock(&pool->mu);
    st.pinned = pool->pinned;
    st.max_bytes = pool->cap;
    st.held = pool->held;
    st.lent = pool->lent;
    st.pinned_bytes = pool->pinned_bytes;
    st.buffers = pool->count;
    st.allocations = pool->allocations;
    snprintf(st.reason, sizeof st.reason, "%s", pool->pinned ? "" : pool->reason);
    pthread_mutex_unlock(&pool->mu);
    st.size = out->size;
    memcpy(out, &st, CKPTIO__MIN((size_t)out->size, sizeof st));
    return 0;
}

void ckptio__pool_ref(ckptio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->refs++;
    pthread_mutex_unlock(&pool->mu);
}

void ckptio__pool_unref(ckptio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    bool last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->mu);
    if (!last) return;
    ckptio__forksafe_remove(&pool->fork);
    assert(pool->lent == 0);
    drop_idle(pool, UINT64_MAX, NULL, 0);
    ckptio__workers_stop(pool->workers);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

void ckptio_pool_free(ckptio_pool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    bool twice = pool->user_freed;
    pool->user_freed = true;
    drop_idle(pool, UINT64_MAX, NULL, 0);
    pthread_mutex_unlock(&pool->mu);
    if (!twice) ckptio__pool_unref(pool);
}

void ckptio__pool_set_pending(ckptio_pool *pool, ckptio_completion *c)
{
    pthread_mutex_lock(&pool->mu);
    pool->pending = c;
    pthread_mutex_unlock(&pool->mu);
}

void ckptio__pool_forget(ckptio_pool *pool, ckptio_completion *c, int rc, const char *msg)
{
    pthread_mutex_lock(&pool->mu);
    if (pool->pending == c) {
        pool->pending = NULL;
        if (rc < 0) {
            pool->unreported_rc = rc;
            snprintf(pool->unreported.text, sizeof pool->unreported.text, "%s", msg);
        }
    }
    pthread_mutex_unlock(&pool->mu);
}

ckptio_completion *ckptio__pool_pending(ckptio_pool *pool, int *unreported_rc,
                                        ckptio__msg *unreported)
{
    pthread_mutex_lock(&pool->mu);
    ckptio_completion *c = pool->pending;
    *unreported_rc = pool->unreported_rc;
    *unreported = pool->unreported;
    pool->unreported_rc = 0;
    pthread_mutex_unlock(&pool->mu);
    return c;
}
