/* SPDX-License-Identifier: Apache-2.0 */
/* The sequential write ring shared by the checkpoint writer and the single-file writer. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sink.h"
#include "vfs.h"

static int poison(ckptio__sink *s, int code)
{
    if (!s->err) s->err = code;
    return code;
}

/* Handle one completion: give back its slot and staging buffer, poison on error. */
static int complete(ckptio__sink *s, ckptio__req *r)
{
    ckptio__sink_slot *slot = (ckptio__sink_slot *)r;
    int rc = 0;
    if (r->res < 0 || (uint64_t)r->res != r->len) {
        rc = r->res < 0 ? (int)r->res : -EIO;
        if (!s->err)
            ckptio__fail(s->msg, rc, "writing %llu bytes at offset %llu of '%s' failed%s",
                         (unsigned long long)r->len, (unsigned long long)r->off, s->label,
                         rc == -ENOSPC ? ": the device is full; free space and save again" : "");
        poison(s, rc);
    }
    if (slot->staging) ckptio__pool_put(&s->pool, slot->staging);
    else s->placed--;
    slot->staging = NULL;
    s->free_slots[s->n_free++] = (unsigned)(slot - s->slots);
    return rc;
}

/* Reap at least `min` completions. */
static int reap(ckptio__sink *s, unsigned min)
{
    ckptio__req *done[64];
    int first = 0;
    unsigned got = 0;
    double t0 = min ? ckptio__now() : 0;
    do {
        int n = ckptio__engine_reap(s->eng, done, 64, CKPTIO__MIN(min - got, 64u));
        if (n < 0) {
            ckptio__fail(s->msg, n, "waiting for writes to '%s' failed%s", s->label,
                         n == -ETIMEDOUT ? CKPTIO__IO_TIMEOUT_HINT : "");
            return poison(s, n);
        }
        for (int i = 0; i < n; i++) {
            int rc = complete(s, done[i]);
            if (rc < 0 && !first) first = rc;
        }
        got += (unsigned)n;
    } while (got < min);
    if (min) s->waited += ckptio__now() - t0;
    return first;
}

/* Reap until nothing (all) or no in-place write (!all) is in flight. */
static int wait_for(ckptio__sink *s, bool all)
{
    int first = 0;
    unsigned failures = 0;
    while (s->eng && (all ? s->eng->inflight : s->placed)) {
        unsigned before = s->eng->inflight;
        int rc = reap(s, 1);
        if (rc < 0 && !first) first = rc;
        if (s->eng->inflight < before) {
            failures = 0;
        } else if (++failures >= CKPTIO__REAP_TRIES) {
            /* The backend is broken: shutting it down is the only way left to get the
             * requests, and the buffers they read from, back. */
            ckptio__fail(s->msg, rc < 0 ? rc : -EIO,
                         "waiting for writes to '%s' failed %u times in a row with %u still in "
                         "flight; the I/O backend was shut down",
                         s->label, failures, s->eng->inflight);
            if (!first) first = rc < 0 ? rc : -EIO;
            poison(s, first);
            ckptio__engine_close(s->eng);
            s->eng = NULL;
            s->placed = 0;
            break;
        }
    }
    return first ? first : s->err;
}

int ckptio__sink_drain(ckptio__sink *s)
{
    return wait_for(s, true);
}

int ckptio__sink_settle(ckptio__sink *s)
{
    return wait_for(s, false);
}

/* Space is reserved ahead of the writes in large steps: ext4 serializes O_DIRECT writes that
 * extend a file but runs writes inside its allocated size in parallel. Commit cuts the file to
 * its true length. Where fallocate is unsupported or the device is nearly full, writes simply
 * extend the file as they go. */
#define RESERVE_STEP (256ull << 20)

static void reserve(ckptio__sink *s, uint64_t end)
{
    if (s->reserved == UINT64_MAX || end <= s->reserved) return;
    uint64_t want = ckptio__align_up(end, RESERVE_STEP);
    int rc;
    do
        rc = CKPTIO__VFS->fallocate(s->fd, 0, (off_t)s->reserved, (off_t)(want - s->reserved));
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
        s->reserved = want;
    else
        s->reserved = UINT64_MAX; /* EOPNOTSUPP, ENOSPC...: stop trying */
}

static int submit(ckptio__sink *s, void *buf, uint64_t off, uint64_t len, uint8_t *staging)
{
    if (s->direct) reserve(s, off + len);
    while (!s->n_free) CKPTIO__TRY(reap(s, 1));
    ckptio__sink_slot *slot = &s->slots[s->free_slots[--s->n_free]];
    slot->staging = staging;
    if (!staging) s->placed++;
    slot->req = (ckptio__req){.fd = s->fd, .op = CKPTIO__OP_WRITE, .buf = buf, .off = off, .len = len};
    int rc = ckptio__engine_submit(s->eng, &slot->req);
    if (rc < 0) {
        slot->req.res = rc;
        return complete(s, &slot->req);
    }
    s->io_bytes += len;
    s->sent_end = CKPTIO__MAX(s->sent_end, off + len);
    return 0;
}

static int window_open(ckptio__sink *s, uint64_t off)
{
    /* Windows never reach back into bytes already sent: the file is written front to back. */
    assert(off % s->off_align == 0 && off >= s->sent_end);
    void *b;
    while (!(b = ckptio__pool_get(&s->pool))) CKPTIO__TRY(reap(s, 1));
    s->win = b;
    s->win_off = off;
    s->win_fill = 0;
    return 0;
}

/* Send a window's filled part, padded with zeros to the alignment. */
static int send_window(ckptio__sink *s, uint8_t *b, uint64_t off, uint64_t fill)
{
    uint64_t len = ckptio__align_up(fill, s->off_align);
    if (len == 0) {
        ckptio__pool_put(&s->pool, b);
        return 0;
    }
    memset(b + fill, 0, len - fill);
    return submit(s, b, off, len, b);
}

static int window_submit(ckptio__sink *s)
{
    if (!s->win) return 0;
    uint8_t *b = s->win;
    s->win = NULL;
    return send_window(s, b, s->win_off, s->win_fill);
}

int ckptio__sink_claim(ckptio__sink *s, uint8_t **at, uint64_t *room)
{
    CKPTIO__TRY(s->err);
    if (!s->win) {
        /* A buffer comes back only from a staged write in flight (in-place ones hold none). */
        if (!s->pool.nfree && s->eng->inflight <= s->placed) return 1;
        CKPTIO__TRY(window_open(s, ckptio__align_down(s->cursor, s->off_align)));
    }
    uint64_t pos = s->cursor - s->win_off;
    assert(pos < s->pool.buf_size);
    if (pos > s->win_fill) memset(s->win + s->win_fill, 0, pos - s->win_fill);
    *at = s->win + pos;
    *room = s->pool.buf_size - pos;
    return 0;
}

void ckptio__sink_advance(ckptio__sink *s, uint64_t n, ckptio__sink_win *full)
{
    uint64_t pos = s->cursor - s->win_off;
    assert(s->win && pos + n <= s->pool.buf_size);
    s->win_fill = pos + n;
    s->cursor += n;
    *full = (ckptio__sink_win){0};
    if (s->win_fill < s->pool.buf_size) return;
    *full = (ckptio__sink_win){s->win, s->win_off, s->win_fill};
    s->win = NULL;
}

int ckptio__sink_send(ckptio__sink *s, ckptio__sink_win *win)
{
    uint8_t *b = win->buf;
    win->buf = NULL;
    if (s->err) { /* poisoned meanwhile: the bytes go nowhere */
        ckptio__pool_put(&s->pool, b);
        return s->err;
    }
    return send_window(s, b, win->off, win->fill);
}

void ckptio__sink_drop(ckptio__sink *s, ckptio__sink_win *win)
{
    ckptio__pool_put(&s->pool, win->buf);
    win->buf = NULL;
}

uint64_t ckptio__sink_window_end(const ckptio__sink *s)
{
    return s->win ? s->win_off + s->pool.buf_size : UINT64_MAX;
}

int ckptio__sink_write(ckptio__sink *s, const void *src_, uint64_t n)
{
    const uint8_t *src = src_;
    size_t cap = s->pool.buf_size;
    CKPTIO__TRY(s->err);
    while (n) {
        if (!s->win) CKPTIO__TRY(window_open(s, ckptio__align_down(s->cursor, s->off_align)));
        uint64_t pos = s->cursor - s->win_off;
        if (pos > s->win_fill) memset(s->win + s->win_fill, 0, pos - s->win_fill);
        uint64_t take = CKPTIO__MIN(n, cap - pos);
        memcpy(s->win + pos, src, take);
        s->win_fill = pos + take;
        s->cursor += take;
        src += take;
        n -= take;
        if (s->win_fill == cap) CKPTIO__TRY(window_submit(s));
    }
    return 0;
}

int ckptio__sink_seek(ckptio__sink *s, uint64_t off)
{
    CKPTIO__TRY(s->err);
    assert(off >= s->cursor);
    if (s->parts) { /* parts are whole windows: the gap is sent as zeros */
        static const uint8_t zeros[4096];
        while (s->cursor < off)
            CKPTIO__TRY(ckptio__sink_write(s, zeros, CKPTIO__MIN(off - s->cursor, sizeof zeros)));
        return 0;
    }
    /* A window ending before the new position is padded and sent; otherwise the next write
     * zero-fills the gap inside it. */
    if (s->win && off >= s->win_off + s->pool.buf_size) CKPTIO__TRY(window_submit(s));
    s->cursor = off;
    return 0;
}

static bool can_place(const ckptio__sink *s, const uint8_t *src, uint64_t n)
{
    return !s->parts && n >= CKPTIO__SINK_IN_PLACE_MIN && s->cursor % s->off_align == 0 &&
           (uintptr_t)src % s->mem_align == 0;
}

/* Parts (an object): the bytes up to the next part boundary complete the open window through
 * staging, then every whole part goes straight from src (one copy less a byte: the upload reads
 * the source), and the tail through staging again. The hook hashes the source in `block`
 * pieces first, as the pieces it is told of must start on block boundaries of src and the
 * parts need not. 1 when it is not worth it: less than a whole part past the boundary. */
static int put_parts(ckptio__sink *s, const uint8_t *src, uint64_t n, uint64_t block,
                     ckptio__sink_hook hook, void *ctx)
{
    uint64_t part = s->request, head = (part - s->cursor % part) % part, i;
    if (n < head + part) return 1;
    for (i = 0; hook && i < n; i += block) hook(ctx, src + i, CKPTIO__MIN(block, n - i), i);
    if (head) CKPTIO__TRY(ckptio__sink_write(s, src, head)); /* fills the window: sent */
    assert(!s->win && s->cursor % part == 0);
    for (i = head; n - i >= part; i += part) {
        CKPTIO__TRY(submit(s, (void *)(uintptr_t)(src + i), s->cursor, part, NULL));
        s->cursor += part;
    }
    return i < n ? ckptio__sink_write(s, src + i, n - i) : 0;
}

int ckptio__sink_put(ckptio__sink *s, const void *src_, uint64_t n, uint64_t block,
                     ckptio__sink_hook hook, void *ctx)
{
    const uint8_t *src = src_;
    CKPTIO__TRY(s->err);
    int placed = s->parts ? put_parts(s, src, n, block, hook, ctx) : 1;
    if (placed <= 0) return placed;
    if (!can_place(s, src, n)) {
        uint64_t step = hook ? block : n;
        for (uint64_t i = 0; i < n; i += step) {
            uint64_t len = CKPTIO__MIN(step, n - i);
            CKPTIO__TRY(ckptio__sink_write(s, src + i, len));
            if (hook) hook(ctx, src + i, len, i);
        }
        return 0;
    }
    assert(s->request % block == 0);
    CKPTIO__TRY(window_submit(s));
    /* Every piece but the last is a whole request, so the cursor stays aligned. */
    for (uint64_t i = 0; i < n; i += s->request) {
        uint64_t len = CKPTIO__MIN(s->request, n - i);
        uint64_t body =
            len >= CKPTIO__SINK_IN_PLACE_MIN ? ckptio__align_down(len, s->off_align) : 0;
        if (body) {
            CKPTIO__TRY(submit(s, (void *)(uintptr_t)(src + i), s->cursor, body, NULL));
            s->cursor += body;
        }
        if (body < len) CKPTIO__TRY(ckptio__sink_write(s, src + i + body, len - body));
        if (hook) hook(ctx, src + i, len, i);
    }
    return 0;
}

int ckptio__sink_skip(ckptio__sink *s, uint64_t n)
{
    CKPTIO__TRY(s->err);
    assert(s->cursor % s->off_align == 0);
    if (s->parts)
        return ckptio__fail(s->msg, CKPTIO_E_UNSUPPORTED,
                            "'%s' is an object: bytes cannot be written around the sink", s->label);
    CKPTIO__TRY(window_submit(s));
    s->cursor += n;
    s->sent_end = CKPTIO__MAX(s->sent_end, s->cursor);
    s->io_bytes += n;
    return 0;
}

int ckptio__sink_finish(ckptio__sink *s)
{
    CKPTIO__TRY(s->err);
    int rc = window_submit(s);
    int d = ckptio__sink_drain(s);
    if (rc == 0) rc = d;
    if (rc < 0 || s->parts) return rc;
    int t;
    do /* ftruncate may be interrupted (signal while the file system blocks) */
        t = CKPTIO__VFS->ftruncate(s->fd, (off_t)s->cursor);
    while (t < 0 && errno == EINTR);
    if (t < 0) {
        rc = -errno;
        ckptio__fail(s->msg, rc, "cannot set the length of '%s'", s->label);
        return poison(s, rc);
    }
    return 0;
}

static void set_file(ckptio__sink *s, int fd, int direct, const char *label)
{
    s->fd = fd;
    s->direct = direct;
    s->label = label;
    if (s->parts) s->mem_align = s->off_align = 1; /* parts end where the data ends */
    else if (direct) ckptio__file_dio_align(fd, &s->mem_align, &s->off_align);
    else s->mem_align = s->off_align = 512; /* harmless for buffered I/O; one code path */
    s->off_align = CKPTIO__MIN(s->off_align, 4096u); /* the format guarantees no more */
}

void ckptio__sink_parts(ckptio__sink *s)
{
    s->parts = true;
    set_file(s, s->fd, 0, s->label);
}

int ckptio__sink_switch(ckptio__sink *s, int fd, int direct, const char *label)
{
    CKPTIO__TRY(s->err);
    assert(!s->win && !s->eng->inflight);
    set_file(s, fd, direct, label);
    s->cursor = s->sent_end = s->reserved = 0;
    return 0;
}

int ckptio__sink_init(ckptio__sink *s, int fd, int direct, int backend, unsigned depth,
                      unsigned threads, uint64_t staging, uint64_t request, const char *label,
                      ckptio__msg *msg)
{
    memset(s, 0, sizeof *s);
    set_file(s, fd, direct, label);
    s->msg = msg;
    s->request = request;
    s->depth = depth;
    int rc = ckptio__engine_open(&s->eng, backend, depth, threads);
    if (rc < 0) {
        s->eng = NULL;
        return ckptio__fail(msg, rc, "cannot start the %s I/O backend for '%s'",
                            backend == CKPTIO_BACKEND_IO_URING ? "io_uring" : "requested", label);
    }
    unsigned nbuf = (unsigned)CKPTIO__MAX(2u, staging / request);
    rc = ckptio__pool_init(&s->pool, nbuf, request);
    if (rc < 0) {
        ckptio__fail(msg, rc, "cannot allocate %llu MiB of staging memory",
                     (unsigned long long)((uint64_t)nbuf * request >> 20));
        goto fail;
    }
    s->slots = calloc(depth, sizeof *s->slots);
    s->free_slots = calloc(depth, sizeof *s->free_slots);
    if (!s->slots || !s->free_slots) {
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
        goto fail;
    }
    for (unsigned i = 0; i < depth; i++) s->free_slots[s->n_free++] = depth - 1 - i;
    return 0;
fail:
    ckptio__sink_fini(s);
    return rc;
}

void ckptio__sink_fini(ckptio__sink *s)
{
    if (s->eng) {
        ckptio__sink_drain(s);
        ckptio__engine_close(s->eng);
        s->eng = NULL;
    }
    if (s->pool.base) ckptio__pool_fini(&s->pool);
    memset(&s->pool, 0, sizeof s->pool);
    free(s->slots);
    free(s->free_slots);
    s->slots = NULL;
    s->free_slots = NULL;
}
