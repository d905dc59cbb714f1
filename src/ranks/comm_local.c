/* SPDX-License-Identifier: Apache-2.0 */
/* The in-process communicator: N threads as N ranks, exchanging through memory, for tests. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"

enum { OP_BARRIER = 1, OP_BROADCAST, OP_GATHER };

typedef struct local_rank {
    ckptio_comm comm;
    ckptio__comm_local *g;
    int32_t rank;
    uint64_t ops;    /* operations this rank has started */
    uint64_t kill_at; /* UINT64_MAX: never */
} local_rank;

/* One round at a time: ranks arrive (copying their bytes in), the last arrival completes it,
 * each reads what it needs and departs, and the last departure opens the next round. A rank
 * that reaches the next round early waits for the drain, so contributions are never mixed. */
struct ckptio__comm_local {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t n;
    int broken; /* 0, or the code every operation returns from now on */
    int op;
    int32_t root;
    int32_t arrived, departed;
    bool complete;
    ckptio_bytes *in; /* per rank, a copy of what it sent */
    local_rank *ranks;
};

static void break_group(ckptio__comm_local *g, int code)
{
    if (!g->broken) g->broken = code;
    pthread_cond_broadcast(&g->cv);
}

/* Wait until `done` holds or the group breaks; -ETIMEDOUT (breaking the group) at the deadline. */
static int wait_until(ckptio__comm_local *g, bool (*done)(const ckptio__comm_local *),
                      const struct timespec *deadline)
{
    while (!done(g) && !g->broken) {
        int e = pthread_cond_timedwait(&g->cv, &g->mu, deadline);
        if (e == ETIMEDOUT && !done(g)) {
            break_group(g, -ETIMEDOUT);
            break;
        }
    }
    return done(g) ? 0 : g->broken;
}

static bool accepting(const ckptio__comm_local *g)
{
    return !g->complete;
}

static bool completed(const ckptio__comm_local *g)
{
    return g->complete;
}

static struct timespec deadline_after(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (!(seconds < 1e9)) seconds = 1e9;
    time_t whole = (time_t)seconds;
    ts.tv_sec += whole;
    ts.tv_nsec += (long)((seconds - (double)whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static int run_op(local_rank *me, int op, int32_t root, const void *data, size_t len,
                  ckptio_bytes *out, uint64_t *lens, double timeout)
{
    ckptio__comm_local *g = me->g;
    struct timespec deadline = deadline_after(timeout);
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    if (me->ops++ == me->kill_at) {
        break_group(g, -ECONNRESET);
        rc = -ECONNRESET;
        goto out;
    }
    CKPTIO__GOTO_IF(g->broken, g->broken);
    CKPTIO__CHECK(wait_until(g, accepting, &deadline));
    if (g->arrived == 0) {
        g->op = op;
        g->root = root;
    } else if (g->op != op || g->root != root) {
        break_group(g, CKPTIO_E_USAGE); /* ranks disagree on the sequence of operations */
        rc = CKPTIO_E_USAGE;
        goto out;
    }
    if (ckptio_bytes_set(&g->in[me->rank], data, len) < 0) {
        break_group(g, -ENOMEM);
        rc = -ENOMEM;
        goto out;
    }
    if (++g->arrived == g->n) {
        g->complete = true;
        pthread_cond_broadcast(&g->cv);
    }
    CKPTIO__CHECK(wait_until(g, completed, &deadline));

    if (op == OP_GATHER && me->rank == root) {
        size_t total = 0;
        for (int32_t i = 0; i < g->n; i++) total += g->in[i].len;
        rc = ckptio_bytes_resize(out, total);
        size_t at = 0;
        for (int32_t i = 0; rc == 0 && i < g->n; at += g->in[i].len, i++) {
            if (g->in[i].len) memcpy((unsigned char *)out->data + at, g->in[i].data, g->in[i].len);
            lens[i] = g->in[i].len;
        }
    } else if (op == OP_BROADCAST && me->rank != root) {
        rc = ckptio_bytes_set(out, g->in[root].data, g->in[root].len);
    }
    if (++g->departed == g->n) {
        for (int32_t i = 0; i < g->n; i++) g->in[i].len = 0;
        g->arrived = g->departed = 0;
        g->complete = false;
        pthread_cond_broadcast(&g->cv);
    }
out:
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static int local_barrier(void *ctx, double timeout)
{
    return run_op(ctx, OP_BARRIER, 0, NULL, 0, NULL, NULL, timeout);
}

static int local_broadcast(void *ctx, int32_t root, ckptio_bytes *buf, double timeout)
{
    local_rank *me = ctx;
    bool is_root = me->rank == root;
    return run_op(me, OP_BROADCAST, root, is_root ? buf->data : NULL, is_root ? buf->len : 0,
                  buf, NULL, timeout);
}

static int local_gather(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                        uint64_t *lens, double timeout)
{
    return run_op(ctx, OP_GATHER, root, data, len, out, lens, timeout);
}

int ckptio__comm_local_new(ckptio__comm_local **out, int32_t nranks)
{
    *out = NULL;
    if (nranks < 1) return ckptio__fail(NULL, CKPTIO_E_USAGE, "local communicator: %d ranks",
                                        nranks);
    ckptio__comm_local *g = calloc(1, sizeof *g);
    if (!g) return -ENOMEM;
    g->n = nranks;
    g->in = calloc((size_t)nranks, sizeof *g->in);
    g->ranks = calloc((size_t)nranks, sizeof *g->ranks);
    pthread_condattr_t ca;
    bool ok = g->in && g->ranks && pthread_condattr_init(&ca) == 0;
    if (ok) {
        /* Deadlines on the monotonic clock: a wall-clock step must not stretch a timeout. */
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&g->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!ok || pthread_mutex_init(&g->mu, NULL) != 0) {
        if (ok) pthread_cond_destroy(&g->cv);
        free(g->in);
        free(g->ranks);
        free(g);
        return -ENOMEM;
    }
    for (int32_t r = 0; r < nranks; r++) {
        local_rank *lr = &g->ranks[r];
        lr->g = g;
        lr->rank = r;
        lr->kill_at = UINT64_MAX;
        lr->comm = (ckptio_comm){.size = sizeof(ckptio_comm),
                                 .rank = r,
                                 .nranks = nranks,
                                 .ctx = lr,
                                 .barrier = local_barrier,
                                 .broadcast = local_broadcast,
                                 .gather = local_gather};
    }
    *out = g;
    return 0;
}

ckptio_comm *ckptio__comm_local_rank(ckptio__comm_local *g, int32_t r)
{
    return (g && r >= 0 && r < g->n) ? &g->ranks[r].comm : NULL;
}

void ckptio__comm_local_kill_at(ckptio__comm_local *g, int32_t r, uint64_t op)
{
    pthread_mutex_lock(&g->mu);
    g->ranks[r].kill_at = op;
    pthread_mutex_unlock(&g->mu);
}

void ckptio__comm_local_free(ckptio__comm_local *g)
{
    if (!g) return;
    for (int32_t r = 0; r < g->n; r++) ckptio_bytes_free(&g->in[r]);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->in);
    free(g->ranks);
    free(g);
}
