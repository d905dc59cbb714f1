/* SPDX-License-Identifier: Apache-2.0 */
/* The read ring shared by the checkpoint reader and the single-file reader. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ring.h"

void ckptio__ring_fini(ckptio__ring *g)
{
    if (!g) return;
    if (g->eng) ckptio__engine_close(g->eng);
    if (g->pool.base) ckptio__pool_fini(&g->pool);
    free(g->slots);
    free(g->free_slots);
    free(g->free_slices);
    ckptio__msg *msg = g->msg;
    const char *label = g->label;
    memset(g, 0, sizeof *g);
    g->msg = msg;
    g->label = label;
}

/* All or nothing: a ring left with an engine but no slots would wait forever for requests it
 * can never issue. */
int ckptio__ring_init(ckptio__ring *g, int backend, unsigned depth, unsigned threads,
                      uint64_t staging, uint64_t buf_size, const char *label, ckptio__msg *msg)
{
    memset(g, 0, sizeof *g);
    g->msg = msg;
    g->label = label;
    int rc = ckptio__engine_open(&g->eng, backend, depth, threads);
    if (rc < 0) {
        g->eng = NULL;
        return ckptio__fail(msg, rc, "cannot start the I/O backend to read '%s'", label);
    }
    /* The caller bounds buf_size; the mapping is still checked against the machine, as
     * params.staging_bytes is the caller's. */
    g->buf_size = buf_size;
    uint64_t nbuf = CKPTIO__MAX(2u, staging / buf_size), total = 0;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    if (nbuf > UINT32_MAX || !ckptio__mul(nbuf, buf_size, &total) || total > ram) {
        rc = ckptio__fail(msg, -ENOMEM,
                          "reading '%s' needs %llu MiB of staging memory, more than this "
                          "machine has (%llu MiB): params.staging_bytes is too large; lower it "
                          "(0 picks the default, 64 MiB)",
                          label, (unsigned long long)(total ? total >> 20 : UINT64_MAX >> 20),
                          (unsigned long long)(ram >> 20));
        goto fail;
    }
    rc = ckptio__pool_init(&g->pool, (unsigned)nbuf, buf_size);
    if (rc < 0) {
        ckptio__fail(msg, rc,
                     "cannot allocate %llu MiB of staging memory to read '%s': lower "
                     "params.staging_bytes (0 picks the default, 64 MiB)",
                     (unsigned long long)(total >> 20), label);
        goto fail;
    }
    g->slots = calloc(depth, sizeof *g->slots);
    g->free_slots = calloc(depth, sizeof *g->free_slots);
    if (!g->slots || !g->free_slots) {
        rc = ckptio__fail(msg, -ENOMEM, "out of memory reading '%s'", label);
        goto fail;
    }
    g->depth = depth;
    for (unsigned i = 0; i < depth; i++) g->free_slots[g->n_free++] = i;
    /* Small staged reads lie between large direct ones in file order: holding a whole buffer
     * each, a few KiB would let the pool, not the depth, bound what is in flight, and the
     * device would see a short queue of small requests. One buffer of several is cut into
     * slices for them instead. */
    unsigned n_slices = (unsigned)CKPTIO__MIN(buf_size / CKPTIO__RING_SLICE, depth);
    if (nbuf >= 3 && n_slices >= 2) {
        g->free_slices = calloc(n_slices, sizeof *g->free_slices);
        if (g->free_slices) {
            g->slices = ckptio__pool_get(&g->pool);
            for (unsigned i = n_slices; i-- > 0;) g->free_slices[g->n_free_slices++] = i;
        }
    }
    return 0;
fail:
    ckptio__ring_fini(g);
    return rc;
}

static void fill(ckptio__ring *g, const ckptio__ring_io *ios, size_t n, size_t *next, int *first,
                 ckptio__ring_done done, void *ctx);

/* Give a finished read's staging back (a slice, a pool buffer, or none). */
static void put_staging(ckptio__ring *g, uint8_t *staging, bool slice)
{
    if (slice)
        g->free_slices[g->n_free_slices++] =
            (unsigned)((staging - g->slices) / CKPTIO__RING_SLICE);
    else if (staging)
        ckptio__pool_put(&g->pool, staging);
}

/* Hand one read to the caller. Its slot is free again before the call: the reads it lets
 * start reach the device while the caller verifies and copies (see ckptio__ring_run). */
static int complete(ckptio__ring *g, ckptio__ring_slot *sl, const ckptio__ring_io *ios,
                    ckptio__ring_done done, void *ctx, int *first, size_t *next, size_t n)
{
    size_t i = sl->io;
    void *buf = sl->req.buf;
    int64_t res = sl->req.res;
    uint8_t *staging = sl->staging;
    bool slice = sl->slice;
    sl->staging = NULL;
    sl->slice = false;
    g->free_slots[g->n_free++] = (unsigned)(sl - g->slots);
    if (next) fill(g, ios, n, next, first, done, ctx);
    int rc = done(ctx, i, &ios[i], buf, res);
    put_staging(g, staging, slice);
    return rc < 0 ? rc : 0;
}

/* Submit ios[*next..n) while slots and staging last and nothing failed. */
static void fill(ckptio__ring *g, const ckptio__ring_io *ios, size_t n, size_t *next, int *first,
                 ckptio__ring_done done, void *ctx)
{
    while (*next < n && !*first && g->n_free) {
        const ckptio__ring_io *io = &ios[*next];
        ckptio__ring_slot *sl = &g->slots[g->free_slots[g->n_free - 1]];
        sl->staging = NULL;
        sl->slice = false;
        if (!io->dst && io->len <= CKPTIO__RING_SLICE && g->n_free_slices) {
            unsigned k = g->free_slices[--g->n_free_slices];
            sl->staging = g->slices + (size_t)k * CKPTIO__RING_SLICE;
            sl->slice = true;
        } else if (!io->dst) {
            sl->staging = ckptio__pool_get(&g->pool);
            if (!sl->staging) break;
        }
        sl->req = (ckptio__req){.fd = io->fd, .op = CKPTIO__OP_READ, .off = io->off,
                                .len = io->len, .buf = io->dst ? io->dst : sl->staging};
        sl->io = (*next)++;
        g->n_free--;
        int rc = ckptio__engine_submit(g->eng, &sl->req);
        if (rc < 0) {
            sl->req.res = rc;
            rc = complete(g, sl, ios, done, ctx, first, NULL, n);
            if (!*first) *first = rc < 0 ? rc : -EIO;
        }
    }
}

int ckptio__ring_run(ckptio__ring *g, const ckptio__ring_io *ios, size_t n, ckptio__ring_done done,
                     void *ctx)
{
    size_t next = 0;
    int first = 0;
    unsigned reap_failures = 0;
    while ((next < n && !first) || g->eng->inflight) {
        fill(g, ios, n, &next, &first, done, ctx);
        if (!g->eng->inflight) continue;
        ckptio__req *got_reqs[64];
        int got = ckptio__engine_reap(g->eng, got_reqs, 64, 1);
        if (got < 0) {
            /* Requests still land in the caller's memory and in staging, so we keep reaping
             * before returning; a backend that never recovers is shut down instead, which
             * waits for (psync) or cancels (io_uring) what it holds, and the next run
             * starts a new ring rather than meet this one's completions. */
            if (!first)
                first = ckptio__fail(g->msg, got, "waiting for reads from '%s' failed", g->label);
            if (++reap_failures >= CKPTIO__REAP_TRIES) {
                ckptio__ring_fini(g);
                return first;
            }
            continue;
        }
        reap_failures = 0;
        /* Each slot is refilled before its read is verified and scattered: the device keeps
         * its queue while the caller's checks run on the CPU. */
        for (int i = 0; i < got; i++) {
            ckptio__ring_slot *sl = (ckptio__ring_slot *)got_reqs[i];
            int rc = complete(g, sl, ios, done, ctx, &first, &next, n);
            if (rc < 0 && !first) first = rc;
        }
    }
    return first;
}
