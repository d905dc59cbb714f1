/* SPDX-License-Identifier: Apache-2.0 */
/* The io_uring backend: one ring per engine, one SQE per request at a time, remainders resent. */
#include "ckptio_config.h"

#if CKPTIO_HAVE_IO_URING
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>

#include "engine.h"

/* One SQE moves at most this much: the kernel caps a single read/write near 2 GiB and the SQE
 * length is 32 bits. A power of two, so O_DIRECT remainders stay aligned. */
#define URING_MAX_CHUNK (1u << 30)

/* A wait for completions wakes at least this often (seconds) to look at the CQ ring itself,
 * so a wake-up the kernel never delivers costs one tick, not the process. */
#define URING_TICK_S 1
/* After this long (seconds, or half the timeout if that is shorter) without a completion while
 * requests are out, everything still in the kernel is cancelled once and sent again: a request
 * parked in the kernel's worker queue gets another chance. */
#define URING_NUDGE_S 10

typedef struct uring_state {
    struct io_uring ring;
    ckptio__req_list done;  /* finished, waiting to be handed back by reap */
    ckptio__req_list retry; /* need another SQE: a short transfer's remainder, or EINTR/EAGAIN */
    double since;    /* ckptio__now() of the last progress, or of the start of a wait */
    double timeout;  /* seconds without progress before reap fails with -ETIMEDOUT */
    bool stalling;   /* a wait ran a tick without progress; cleared by progress */
    bool nudged;     /* this stall's cancel-and-resend was sent */
    bool cancelled;  /* a cancel was ever sent: -ECANCELED means send the request again */
} uring_state;

/* user_data of the cancel request itself, told apart from every ckptio__req. */
static char cancel_tag;

/* Queue the SQE for what is left of r. False if the SQ ring is full, which cannot happen
 * while the engine keeps at most `depth` (<= SQ entries) requests and each holds one SQE. */
static bool prep(uring_state *st, ckptio__req *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);
    if (!sqe) return false;
    uint64_t left = r->len - r->done_;
    unsigned n = (unsigned)CKPTIO__MIN(left, (uint64_t)URING_MAX_CHUNK);
    uint8_t *p = (uint8_t *)r->buf + r->done_;
    if (r->op == CKPTIO__OP_READ)
        io_uring_prep_read(sqe, r->fd, p, n, r->off + r->done_);
    else
        io_uring_prep_write(sqe, r->fd, p, n, r->off + r->done_);
    io_uring_sqe_set_data(sqe, r);
    return true;
}

/* Hand prepared SQEs to the kernel. Transient refusals leave them in the SQ ring for the next
 * call (io_uring_submit always sends everything pending). */
static int flush(uring_state *st)
{
    while (io_uring_sq_ready(&st->ring) > 0) {
        int rc = io_uring_submit(&st->ring);
        if (rc > 0) continue;
        if (rc == 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) return 0;
        return rc;
    }
    return 0;
}

static void complete(uring_state *st, ckptio__req *r, int64_t res)
{
    r->res = res;
    ckptio__list_push(&st->done, r);
}

/* Sort every available CQE into done or retry. */
static void harvest(uring_state *st)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&st->ring, head, cqe)
    {
        ckptio__req *r = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        seen++;
        if ((void *)r == (void *)&cancel_tag) continue;
        if (res == -ECANCELED && st->cancelled) {
            ckptio__list_push(&st->retry, r);
            continue;
        }
        st->stalling = st->nudged = false; /* progress */
        if (res == -EINTR || res == -EAGAIN)
            ckptio__list_push(&st->retry, r);
        else if (res < 0)
            complete(st, r, res);
        else if (res == 0) /* reads: end of file; a write that moves nothing would loop forever */
            complete(st, r, r->op == CKPTIO__OP_READ ? (int64_t)r->done_ : -EIO);
        else if ((r->done_ += (uint64_t)res) >= r->len)
            complete(st, r, (int64_t)r->len);
        else
            ckptio__list_push(&st->retry, r);
    }
    io_uring_cq_advance(&st->ring, seen);
}

static int uring_init(ckptio__engine *e)
{
    uring_state *st = calloc(1, sizeof *st);
    CKPTIO__RET_IF(!st, -ENOMEM);
    struct io_uring_params p = {0};
    /* The CQ ring defaults to twice the SQ ring, so `depth` outstanding requests never
     * overflow it. */
    p.flags = IORING_SETUP_CLAMP;
    /* One SQE more than `depth`: the cancel request of a stall needs its own. */
    int rc = io_uring_queue_init_params(e->depth + 1, &st->ring, &p);
    if (rc < 0) {
        free(st);
        return rc;
    }
    if (p.sq_entries <= e->depth) e->depth = CKPTIO__MAX(p.sq_entries - 1, 1u); /* clamped */
    st->timeout = e->timeout;
    e->impl = st;
    return 0;
}

static int uring_submit(ckptio__engine *e, ckptio__req *r)
{
    uring_state *st = e->impl;
    if (r->len == 0) {
        complete(st, r, 0);
        return 0;
    }
    if (!prep(st, r)) ckptio__list_push(&st->retry, r);
    /* Submitted now rather than batched at reap: the caller may spend a while filling the
     * next buffer, and the device should not idle meanwhile. A hard error is reported by
     * the next reap; the request stays queued. */
    (void)flush(st);
    return 0;
}

/* Called after a wait that brought nothing. 0 to wait again, -ETIMEDOUT when the requests out
 * have made no progress for st->timeout seconds. */
static int stalled(uring_state *st)
{
    if (!st->stalling) st->since = ckptio__now() - URING_TICK_S;
    st->stalling = true;
    double idle = ckptio__now() - st->since;
    if (idle >= st->timeout) return -ETIMEDOUT;
    if (idle >= CKPTIO__MIN((double)URING_NUDGE_S, st->timeout / 2) && !st->nudged) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);
        if (sqe) {
            io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
            io_uring_sqe_set_data(sqe, &cancel_tag);
            st->nudged = st->cancelled = true;
        }
    }
    return 0;
}

static int uring_reap(ckptio__engine *e, ckptio__req **out, unsigned max, unsigned min)
{
    uring_state *st = e->impl;
    unsigned n = 0;
    /* A stall is measured across calls (st->stalling): a caller that retries a timed-out reap
     * is told again after one tick, not after another full timeout. */
    for (;;) {
        harvest(st);
        for (ckptio__req *r; st->retry.head && (r = st->retry.head, prep(st, r));)
            ckptio__list_pop(&st->retry);
        int rc = flush(st);
        if (rc < 0 && n == 0) return rc;
        while (n < max && st->done.head)
            out[n++] = ckptio__list_pop(&st->done);
        if (n >= min || rc < 0) return (int)n;
        struct __kernel_timespec tick = {.tv_sec = URING_TICK_S};
        struct io_uring_cqe *cqe;
        rc = io_uring_submit_and_wait_timeout(&st->ring, &cqe, 1, &tick, NULL);
        if (rc == -ETIME && io_uring_cq_ready(&st->ring) == 0) {
            rc = stalled(st);
            if (rc < 0) return n ? (int)n : rc;
        } else if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
            return n ? (int)n : rc;
        }
    }
}

static void uring_fini(ckptio__engine *e)
{
    uring_state *st = e->impl;
    if (!st) return;
    io_uring_queue_exit(&st->ring);
    free(st);
    e->impl = NULL;
}

CKPTIO__HIDDEN const ckptio__backend_ops ckptio__io_uring_ops = {
    .name = "io_uring",
    .init = uring_init,
    .submit = uring_submit,
    .reap = uring_reap,
    .fini = uring_fini,
};

#endif
