/* SPDX-License-Identifier: Apache-2.0 */
/* A file written front to back through a ring of staging buffers, many writes in flight. */
#ifndef CKPTIO_SINK_H
#define CKPTIO_SINK_H

#include "engine.h"

/* The sink owns the engine and the staging pool, not the file descriptor. Bytes go to the
 * file at `cursor`, which only moves forward (gaps are zero padding or holes). Aligned source
 * buffers of at least CKPTIO__SINK_IN_PLACE_MIN bytes may be written in place (no copy); then
 * they must stay valid until ckptio__sink_drain() returns. The first failure poisons the
 * sink: every later call returns it, and *msg describes it, naming `label`. */
#define CKPTIO__SINK_IN_PLACE_MIN (256u << 10)

typedef struct ckptio__sink_slot {
    ckptio__req req;
    uint8_t *staging; /* staging buffer to give back on completion, or NULL (in place) */
} ckptio__sink_slot;

typedef struct ckptio__sink {
    ckptio__msg *msg;
    const char *label;
    int fd, direct;
    uint32_t mem_align, off_align;
    uint64_t request;  /* bytes per request */
    uint64_t cursor;   /* logical end of the file */
    uint64_t sent_end; /* end of the furthest range submitted */
    uint64_t io_bytes; /* bytes submitted, padding included */
    double waited;     /* seconds spent blocked until a write completed (the device behind) */
    uint64_t reserved; /* file space allocated ahead of the writes (0: not possible here) */
    int err;
    bool parts;        /* every write is one whole part (ckptio__sink_parts) */
    ckptio__engine *eng;
    ckptio__pool pool;
    ckptio__sink_slot *slots;
    unsigned *free_slots, n_free, depth;
    unsigned placed; /* in-place writes in flight (they read the caller's memory) */
    /* The staging window: file bytes [win_off, win_off + pool.buf_size). Bytes below win_fill
     * hold data or zeroed padding; bytes above are stale. */
    uint8_t *win;
    uint64_t win_off, win_fill;
} ckptio__sink;

/* Start an engine (backend CKPTIO_BACKEND_*) and a pool of staging/request buffers for fd.
 * On failure everything is released again and *msg says why. */
CKPTIO__HIDDEN int ckptio__sink_init(ckptio__sink *s, int fd, int direct, int backend,
                                     unsigned depth, unsigned threads, uint64_t staging,
                                     uint64_t request, const char *label, ckptio__msg *msg);
/* The file takes whole parts (a store's object, io/vfd.h): every write is one part, so only
 * whole parts are written in place, windows are sent only when full (the last one at finish,
 * unpadded), gaps are written as zeros, and finish cuts nothing. Call right after init or
 * switch. */
CKPTIO__HIDDEN void ckptio__sink_parts(ckptio__sink *s);
/* Waits for in-flight writes and releases engine and pool (not the fd). Accepts a zeroed or
 * failed-init sink. */
CKPTIO__HIDDEN void ckptio__sink_fini(ckptio__sink *s);
/* Move the cursor forward to `off`; the bytes between become zeros. */
CKPTIO__HIDDEN int ckptio__sink_seek(ckptio__sink *s, uint64_t off);
/* Copy n bytes into staging at the cursor (the caller may reuse src at once). */
CKPTIO__HIDDEN int ckptio__sink_write(ckptio__sink *s, const void *src, uint64_t n);
/* Told of each piece of a ckptio__sink_put once it is copied or submitted: `n` bytes of the
 * source starting `at` bytes into it. */
typedef void (*ckptio__sink_hook)(void *ctx, const uint8_t *piece, uint64_t n, uint64_t at);
/* Write n bytes at the cursor, choosing the way once: a source aligned to the memory alignment,
 * of at least CKPTIO__SINK_IN_PLACE_MIN bytes, put at an aligned cursor, is written in place in
 * `request`-byte pieces (no copy; only its unaligned tail goes through staging) and must stay
 * valid and unchanged until ckptio__sink_drain() returns; so is every whole part of a source
 * that spans one (parts: its bytes before the first part boundary and after the last go
 * through staging); any other source is copied through
 * staging in `block`-byte pieces (the caller may reuse it at once). `hook`, if not NULL, sees
 * every piece in order, a staged one while it is still in cache. `block` must divide the
 * request size. */
CKPTIO__HIDDEN int ckptio__sink_put(ckptio__sink *s, const void *src, uint64_t n, uint64_t block,
                                    ckptio__sink_hook hook, void *ctx);
/* Bytes [cursor, cursor + n) are written by someone else (cuFile, from GPU memory): send the
 * window, then move the cursor past them. The cursor must be aligned. */
CKPTIO__HIDDEN int ckptio__sink_skip(ckptio__sink *s, uint64_t n);
/* A staging window taken out of the sink while its bytes are still landing (a device copy
 * writes them): file bytes [off, off + fill) at buf. */
typedef struct ckptio__sink_win {
    uint8_t *buf; /* NULL: none */
    uint64_t off, fill;
} ckptio__sink_win;
/* Room at the cursor for bytes someone else fills later (a device-to-host copy): *at and *room
 * bytes (the rest of the window, a window opened if need be, the gap before the cursor
 * zeroed). Returns 0, 1 when every staging buffer is taken out (ckptio__sink_advance) and no
 * write could return one: send or drop one first. */
CKPTIO__HIDDEN int ckptio__sink_claim(ckptio__sink *s, uint8_t **at, uint64_t *room);
/* Move the cursor past n claimed bytes. A window they fill is taken out of the sink into
 * *full (else full->buf is NULL): the caller sends it (ckptio__sink_send) once its bytes
 * have landed, in file order, or drops it (ckptio__sink_drop) after a failure. */
CKPTIO__HIDDEN void ckptio__sink_advance(ckptio__sink *s, uint64_t n, ckptio__sink_win *full);
CKPTIO__HIDDEN int ckptio__sink_send(ckptio__sink *s, ckptio__sink_win *win);
CKPTIO__HIDDEN void ckptio__sink_drop(ckptio__sink *s, ckptio__sink_win *win);
/* End of the open window's file range, or UINT64_MAX when none is open. */
CKPTIO__HIDDEN uint64_t ckptio__sink_window_end(const ckptio__sink *s);
/* Wait for every submitted write. */
CKPTIO__HIDDEN int ckptio__sink_drain(ckptio__sink *s);
/* Wait only until no in-place write is in flight (the callers' sources are free again), leaving
 * staged writes running. */
CKPTIO__HIDDEN int ckptio__sink_settle(ckptio__sink *s);
/* Send the last window, wait for everything, and cut the file to `cursor` bytes (the last
 * write was padded to the alignment). Does not fsync. */
CKPTIO__HIDDEN int ckptio__sink_finish(ckptio__sink *s);
/* After ckptio__sink_finish, go on in another file, from its offset 0, keeping the engine, the
 * staging pool and io_bytes: a writer rolling over to its next data file. */
CKPTIO__HIDDEN int ckptio__sink_switch(ckptio__sink *s, int fd, int direct, const char *label);

#endif
