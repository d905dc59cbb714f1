/* SPDX-License-Identifier: Apache-2.0 */
/* The read ring: batches of positioned reads, many in flight, into caller memory or staging. */
#ifndef CKPTIO_RING_H
#define CKPTIO_RING_H

#include "engine.h"

/* The write sink's twin for reads. The ring owns the engine, a pool of staging buffers and the
 * request slots, not the file descriptors. It is started all or nothing, and a backend that
 * stops answering is shut down inside ckptio__ring_run (the ring is then as after
 * ckptio__ring_fini, and the next caller starts a new one). */

/* One read: `len` bytes at `off` of `fd`, into `dst`, or into a staging buffer of the ring when
 * dst is NULL (then len <= the ring's buf_size). For an O_DIRECT fd, off, len and dst (or the
 * staging buffer, always page aligned) follow the file's alignment. */
typedef struct ckptio__ring_io {
    int fd;
    uint64_t off, len;
    void *dst;
} ckptio__ring_io;

/* Called once per read, in completion order, with the bytes (`buf`: dst or the staging buffer)
 * and res (bytes read, fewer at end of file, or -errno). A staging buffer goes back to the pool
 * when the call returns. A negative return stops new submissions; the first one is returned
 * by ckptio__ring_run. */
typedef int (*ckptio__ring_done)(void *ctx, size_t i, const ckptio__ring_io *io, const void *buf,
                                 int64_t res);

typedef struct ckptio__ring_slot {
    ckptio__req req;
    uint8_t *staging; /* or NULL: the read went to the caller's memory */
    size_t io;        /* index in the batch */
    bool slice;       /* staging is a slice of the small-read buffer, not a pool buffer */
} ckptio__ring_slot;

/* Staged reads of at most this many bytes (the small tensors packed between large ones) take a
 * slice of one staging buffer set aside for them, not a whole buffer each. */
#define CKPTIO__RING_SLICE (64u << 10)

typedef struct ckptio__ring {
    ckptio__msg *msg;
    const char *label; /* named in messages: the checkpoint or the file */
    ckptio__engine *eng; /* NULL: not started */
    ckptio__pool pool;
    uint64_t buf_size; /* usable bytes of one staging buffer */
    ckptio__ring_slot *slots;
    unsigned *free_slots, n_free, depth;
    uint8_t *slices; /* a pool buffer cut into CKPTIO__RING_SLICE pieces, or NULL */
    unsigned *free_slices, n_free_slices;
} ckptio__ring;

/* Start an engine (CKPTIO_BACKEND_*) with `depth` slots and staging buffers of buf_size bytes,
 * as many as fit in `staging` (at least two). On failure nothing is left started and *msg says
 * what to change. */
CKPTIO__HIDDEN int ckptio__ring_init(ckptio__ring *g, int backend, unsigned depth, unsigned threads,
                                     uint64_t staging, uint64_t buf_size, const char *label,
                                     ckptio__msg *msg);
/* Shut the engine down (waiting for or cancelling what it holds) and release everything.
 * Accepts a zeroed or failed ring; leaves it zeroed. */
CKPTIO__HIDDEN void ckptio__ring_fini(ckptio__ring *g);
/* Read ios[0..n) in that order of submission, as many at once as slots and staging allow, and
 * call done for each. Returns once none is in flight: 0, or the first failure. */
CKPTIO__HIDDEN int ckptio__ring_run(ckptio__ring *g, const ckptio__ring_io *ios, size_t n,
                                    ckptio__ring_done done, void *ctx);

#endif
