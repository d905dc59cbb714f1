/* SPDX-License-Identifier: Apache-2.0 */
/* A small pool of threads that runs the iterations of one loop at a time, the caller helping. */
#ifndef CKPTIO_WORKERS_H
#define CKPTIO_WORKERS_H

#include "common.h"

typedef struct ckptio__workers ckptio__workers;

/* fn(ctx, i) for one i; iterations of one loop run concurrently, in any order. */
typedef void (*ckptio__work_fn)(void *ctx, size_t i, unsigned worker);

/* Start a pool for loops spread over `n` threads in all: n - 1 of its own plus the caller of
 * ckptio__workers_for (n = 1 starts none; the caller does everything). The threads block every
 * signal. Returns 0 or -errno. */
CKPTIO__HIDDEN int ckptio__workers_start(ckptio__workers **out, unsigned n);
/* Run fn(ctx, i, worker) for every i in [0, count) and return when all have returned. `worker`
 * is in [0, n): the caller is 0, so per-worker scratch can be indexed by it. One loop at a
 * time: calls on one pool are made by one thread at a time. */
CKPTIO__HIDDEN void ckptio__workers_for(ckptio__workers *w, size_t count, ckptio__work_fn fn,
                                        void *ctx);
/* Threads in all, the caller's included. */
CKPTIO__HIDDEN unsigned ckptio__workers_count(const ckptio__workers *w);
/* Stop the threads and free. Accepts NULL. */
CKPTIO__HIDDEN void ckptio__workers_stop(ckptio__workers *w);
/* The default count for verification: the CPUs this process may run on, at most `cap`. */
CKPTIO__HIDDEN unsigned ckptio__workers_default(unsigned cap);

#endif
