/* SPDX-License-Identifier: Apache-2.0 */
/* What the host-buffer pool, the snapshot and the background commit share inside the library. */
#ifndef CKPTIO_WRITE_POOL_H
#define CKPTIO_WRITE_POOL_H

#include "ckptio.h"

#include "../common/common.h"
#include "../common/workers.h"

/* One exact-size buffer of a pool. `orphan`: lent when the process forked, so in the child it
 * belongs to no pool; giving it back only releases its memory (plain) or forgets it (pinned). */
typedef struct ckptio__pbuf {
    void *p;
    uint64_t n;
    bool pinned, lent, orphan;
    struct ckptio__pbuf *next;
} ckptio__pbuf;

/* Lend `count` buffers of exactly sizes[i] bytes (0 < sizes[i]; sum within the cap less what
 * is lent already), device[i] asking for page-locked memory. `dev` (0: none) is a device
 * pointer of the save: page-locked memory is made in its device's context when the calling
 * thread has none current, not in device 0's. Idle buffers of other sizes are
 * freed first when new ones would pass the cap. On failure nothing is lent and the held count
 * is exact (buffers made before the failure stay idle for the next save). */
CKPTIO__HIDDEN int ckptio__pool_take(ckptio_pool *pool, const uint64_t *sizes, const bool *device,
                                     size_t count, uint64_t dev, ckptio__pbuf **out,
                                     ckptio__msg *m);
/* Give lent buffers back (NULL entries skipped). */
CKPTIO__HIDDEN void ckptio__pool_give(ckptio_pool *pool, ckptio__pbuf **bufs, size_t count);
/* Bytes that a new snapshot may take: the cap less what other snapshots hold. */
CKPTIO__HIDDEN uint64_t ckptio__pool_room(ckptio_pool *pool);
/* Whether buffers made now are page-locked (cuMemHostAlloc). */
CKPTIO__HIDDEN bool ckptio__pool_pinned(ckptio_pool *pool);
/* The pool's copy threads, started at first need (again in a forked child). NULL: the caller
 * copies alone. */
CKPTIO__HIDDEN ckptio__workers *ckptio__pool_workers(ckptio_pool *pool);
/* References held by snapshots: the pool is freed when the last one goes. */
CKPTIO__HIDDEN void ckptio__pool_ref(ckptio_pool *pool);
CKPTIO__HIDDEN void ckptio__pool_unref(ckptio_pool *pool);

/* The one save in flight per pool, and the error of a finished one nobody waited for. */
CKPTIO__HIDDEN void ckptio__pool_set_pending(ckptio_pool *pool, ckptio_completion *c);
/* A completion being freed: forget it; if it failed and nobody waited, keep its error. */
CKPTIO__HIDDEN void ckptio__pool_forget(ckptio_pool *pool, ckptio_completion *c, int rc,
                                        const char *msg);
/* The save in flight (NULL: none) and the error of a finished one nobody waited for (0:
 * none), which is handed out once. */
CKPTIO__HIDDEN ckptio_completion *ckptio__pool_pending(ckptio_pool *pool, int *unreported_rc,
                                                       ckptio__msg *unreported);
/* Before a new snapshot: wait for the save in flight; 0, or the error nobody saw (reported
 * once, with a note that the new save did not start). In commit_async.c, which owns the
 * completions. */
CKPTIO__HIDDEN int ckptio__pool_settle(ckptio_pool *pool, ckptio__msg *m);

/* Test hook: the Nth plain allocation from now on fails with ENOMEM (0: none). */
CKPTIO__HIDDEN extern int ckptio__pool_fail_alloc_at;

/* A background job for a completion: run() on ckptio's thread, returning the result and
 * filling stats and (on failure) msg; drop(ctx, forked) afterwards, from free (forked: in a
 * child of the process that started it, whose threads and writers it must not touch). */
typedef struct ckptio__job {
    int (*run)(void *ctx, ckptio_stats *st, ckptio__msg *msg);
    void (*drop)(void *ctx, bool forked);
    void *ctx;
    ckptio_pool *pool; /* the pool whose save this is, or NULL */
} ckptio__job;
CKPTIO__HIDDEN int ckptio__completion_start(const ckptio__job *job, ckptio_completion **out,
                                            const char *what);

/* ---- snapshot.c: what a background save of a snapshot needs beside the public calls ---- */

/* The pool the snapshot's buffers are lent from. */
CKPTIO__HIDDEN ckptio_pool *ckptio__snapshot_pool(const ckptio_snapshot *s);
/* Give the buffers back to the pool now (the save that read them is done); the items'
 * descriptions stay until ckptio_snapshot_free. */
CKPTIO__HIDDEN void ckptio__snapshot_give_back(ckptio_snapshot *s);
/* Whether wait has returned this completion's result to someone (the error was seen). */
CKPTIO__HIDDEN int ckptio__completion_result(ckptio_completion *c, bool mark_seen,
                                             bool *seen, ckptio__msg *msg);

#endif
