/* SPDX-License-Identifier: Apache-2.0 */
/* GPU memory in and out of checkpoints: the pinned staging ring, its stream, and GDS. */
#ifndef CKPTIO_GPU_STAGED_H
#define CKPTIO_GPU_STAGED_H

#include "ckptio.h"
#include "../common/common.h"
#include "cuda.h"

/* Pieces of a device buffer handed to the host side, in order: `n` bytes at `at` bytes into
 * the buffer. A negative return stops the transfer and is returned. */
typedef int (*ckptio__gpu_piece_fn)(void *ctx, uint8_t *host, uint64_t n, uint64_t at);

#define CKPTIO__GPU_SLOTS 4u

/* One handle's GPU state (a writer's or a reader's), started by the first device buffer. */
typedef struct ckptio__gpu {
    int mode;            /* CKPTIO_GPU_*, after CKPTIO_GPU and defaults */
    uint64_t ring_bytes; /* asked for */
    uint64_t block;      /* pieces are multiples of this (the checksum block) but the last */
    const ckptio__cuda *cu;
    ckptio__CUcontext ctx;
    ckptio__CUstream stream;
    ckptio__CUevent in_ev, out_ev, ev[CKPTIO__GPU_SLOTS];
    uint8_t *ring;
    uint64_t slot; /* bytes per slot; the ring is CKPTIO__GPU_SLOTS slots */
    bool busy[CKPTIO__GPU_SLOTS]; /* a host-to-device copy may still read the slot */
    uint64_t next;                /* slot of the next host-to-device piece */
    /* GPUDirect Storage: the file registered with cuFile, or why GDS is not used for it. */
    const ckptio__cufile *cf;
    int gds_fd;
    ckptio__CUfileHandle gds_fh;
    bool gds_ok;
    /* A writer's ring is made only when something needs it (GDS checksums, replicas): its
     * staged pieces land straight in its registered staging windows. */
    bool ring_on_demand;
    ckptio__vec registered; /* ckptio__gpu_reg: host memory registered with the driver */
    /* Host-to-host copies made on the save path (ring to write window): a GDS chunk's tail
     * under 4 KiB. The staged path makes none: the test suite checks it. */
    uint64_t host_copied;
    ckptio_gpu_stats st;
} ckptio__gpu;

/* A range of host memory registered (page-locked) with cuMemHostRegister. */
typedef struct ckptio__gpu_reg {
    void *base;
    uint64_t len;
} ckptio__gpu_reg;

/* Mode from params (ckptio_params.gpu) and CKPTIO_GPU=auto|gds|staged|off, which wins. */
CKPTIO__HIDDEN int ckptio__gpu_mode(int param, ckptio__msg *m);
CKPTIO__HIDDEN void ckptio__gpu_init(ckptio__gpu *g, int mode, uint64_t ring_bytes,
                                     uint64_t block);
/* Waits for ckptio's copies and releases the stream, events, ring and cuFile handle. */
CKPTIO__HIDDEN void ckptio__gpu_fini(ckptio__gpu *g);
/* Ready to move device memory at p: driver loaded, a context current, stream and ring made.
 * CKPTIO_E_UNSUPPORTED with a message saying why (mode off, no driver, not device memory). */
CKPTIO__HIDDEN int ckptio__gpu_start(ckptio__gpu *g, uint64_t p, ckptio__msg *m,
                                     const char *what);
/* Device to host: copy n bytes at device address src through the ring, the caller's stream's
 * earlier work first, and give each piece to fn as soon as it has landed, while the next
 * pieces are still copying. Returns with every copy finished (the device buffer may be reused)
 * or, after a failure, with the ring drained. The caller counts the bytes (ckptio__gpu_count). */
CKPTIO__HIDDEN int ckptio__gpu_d2h(ckptio__gpu *g, uint64_t src, uint64_t n, uint64_t stream,
                                   ckptio__gpu_piece_fn fn, void *ctx, ckptio__msg *m,
                                   const char *what);
/* Page-lock host memory [base, base + len) for device copies straight into it, once (a range
 * registered before is left as it is); unregistered by ckptio__gpu_fini, which must run
 * before the memory is unmapped. -ENOMEM with a message when the driver refuses. */
CKPTIO__HIDDEN int ckptio__gpu_register(ckptio__gpu *g, void *base, uint64_t len, ckptio__msg *m,
                                        const char *what);
/* Where the next piece of a device-to-host transfer lands: *dst for *len bytes (at most
 * `left`, at least 1) of the buffer from byte `at` on, in host memory the driver has
 * registered. Returns 0; 1 when no room can be had until an earlier piece is consumed (the
 * pipeline then waits for the oldest piece, gives it to the piece function, and asks again);
 * or a negative code. */
typedef int (*ckptio__gpu_dest_fn)(void *ctx, uint64_t at, uint64_t left, uint8_t **dst,
                                   uint64_t *len);
/* Device to host without the ring: copy n bytes at device address src into the places `dest`
 * names, the caller's stream's earlier work first, up to CKPTIO__GPU_SLOTS pieces in flight,
 * and give each piece to fn (in order, at its place) as soon as it has landed. Returns with
 * every copy finished or, after a failure, with the stream drained (nothing of ckptio's still
 * writes into host memory); the pieces not given to fn are the caller's to take back. */
CKPTIO__HIDDEN int ckptio__gpu_d2h_to(ckptio__gpu *g, uint64_t src, uint64_t n, uint64_t stream,
                                      ckptio__gpu_dest_fn dest, ckptio__gpu_piece_fn fn,
                                      void *ctx, ckptio__msg *m, const char *what);
/* Fills a slot with the bytes of the destination from `at` on, at most cap of them; returns
 * how many (> 0), or a negative code. */
typedef int64_t (*ckptio__gpu_fill_fn)(void *ctx, uint8_t *host, uint64_t cap, uint64_t at);
/* Host to device: fn fills a slot, which is then copied to dst + at while fn fills the next. At the end `stream` (0: the legacy default stream; ckptio then also waits
 * for the copies) is made to wait for the copies, so work queued on it later sees the data. */
CKPTIO__HIDDEN int ckptio__gpu_h2d(ckptio__gpu *g, uint64_t dst, uint64_t n, uint64_t stream,
                                   ckptio__gpu_fill_fn fn, void *ctx, ckptio__msg *m,
                                   const char *what);
/* Wait on the host until the work queued on the caller's `stream` before now is done. */
CKPTIO__HIDDEN int ckptio__gpu_wait_caller(ckptio__gpu *g, uint64_t stream, ckptio__msg *m,
                                           const char *what);
/* Whether cuFile may move bytes between device memory and file descriptor fd (O_DIRECT):
 * registers fd on first use; false with st.reason set otherwise. */
CKPTIO__HIDDEN bool ckptio__gpu_gds_file(ckptio__gpu *g, int fd, int direct);
/* Deregister the file from cuFile: call before closing it (its descriptor number may come
 * back for another file, which must get a handle of its own). */
CKPTIO__HIDDEN void ckptio__gpu_gds_forget(ckptio__gpu *g);
/* cuFileWrite/cuFileRead of n bytes between device address p and file offset off. */
CKPTIO__HIDDEN int ckptio__gpu_gds_io(ckptio__gpu *g, bool write, uint64_t p, uint64_t n,
                                      uint64_t off, ckptio__msg *m, const char *label);
/* Note which path moved n bytes: "staged" or "gds" (both: "gds+staged"). */
CKPTIO__HIDDEN void ckptio__gpu_count(ckptio__gpu *g, bool gds, uint64_t n);
CKPTIO__HIDDEN void ckptio__gpu_stats(const ckptio__gpu *g, ckptio_gpu_stats *out);

/* Splits a row-major box of shape[ndim] (esize-byte elements) into sub-boxes of at most
 * `max` bytes each, contiguous in the box's own layout, in order: init, then next until it
 * returns false. Each sub-box is off[] (relative to the box) and shape[]; a box with a zero
 * dimension has none. */
typedef struct ckptio__gpu_split {
    uint32_t ndim, d;
    uint64_t shape[CKPTIO_MAX_NDIM], idx[CKPTIO_MAX_NDIM], rows;
    bool done;
} ckptio__gpu_split;
CKPTIO__HIDDEN void ckptio__gpu_split_init(ckptio__gpu_split *s, const uint64_t *shape,
                                           uint32_t ndim, uint64_t esize, uint64_t max);
CKPTIO__HIDDEN bool ckptio__gpu_split_next(ckptio__gpu_split *s, uint64_t *off, uint64_t *shape,
                                           uint64_t *bytes, uint64_t esize);

/* ---- the route (src/gpu/route.c) ---- */

/* How an extent moves between a file and GPU memory. */
enum { CKPTIO__ROUTE_STAGED = 0, CKPTIO__ROUTE_GDS = 1 };
/* Extents at least this large may go through cuFile. */
#define CKPTIO__GDS_MIN (1u << 20)
/* The one decision, for reads and writes alike: CKPTIO__ROUTE_GDS when cuFile may move the `n`
 * bytes at file offset `off` of fd (opened O_DIRECT when `direct`): at least CKPTIO__GDS_MIN
 * bytes, a 4 KiB-aligned start and, when `whole` (a read lands whole; a write sends an
 * unaligned tail through the ring), a 4 KiB-aligned length, in a file cuFile takes (see
 * ckptio__gpu_gds_file, which sets st.reason when not). Else CKPTIO__ROUTE_STAGED: the pinned
 * ring. */
CKPTIO__HIDDEN int ckptio__gpu_route(ckptio__gpu *g, int fd, int direct, uint64_t off, uint64_t n,
                                     bool whole);

#endif
