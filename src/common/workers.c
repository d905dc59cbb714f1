/* SPDX-License-Identifier: Apache-2.0 */
/* Fork-join over a fixed set of threads: a loop's iterations handed out by one atomic counter. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "workers.h"

typedef struct thread_arg {
    ckptio__workers *w;
    unsigned id;
} thread_arg;

struct ckptio__workers {
    pthread_mutex_t mu;
    pthread_cond_t go, idle;
    unsigned n;         /* threads in all, the caller's included */
    unsigned started;   /* threads of our own that run */
    uint64_t gen;       /* loops posted so far: a thread joins each generation once */
    unsigned active;    /* our threads still inside the current loop */
    bool stop;
    int pid; /* the process whose threads these are */
    /* the current loop */
    ckptio__work_fn fn;
    void *ctx;
    size_t count;
    atomic_size_t next;
    pthread_t *threads;
    thread_arg *args;
};

static void drain(ckptio__workers *w, ckptio__work_fn fn, void *ctx, size_t count, unsigned id)
{
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed);
        if (i >= count) return;
        fn(ctx, i, id);
    }
}

static void *run(void *arg)
{
    thread_arg *a = arg;
    ckptio__workers *w = a->w;
    uint64_t seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->gen == seen && !w->stop) pthread_cond_wait(&w->go, &w->mu);
        if (w->stop) break;
        seen = w->gen;
        ckptio__work_fn fn = w->fn;
        void *ctx = w->ctx;
        size_t count = w->count;
        pthread_mutex_unlock(&w->mu);
        drain(w, fn, ctx, count, a->id);
        pthread_mutex_lock(&w->mu);
        if (--w->active == 0) pthread_cond_signal(&w->idle);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

unsigned ckptio__workers_default(unsigned cap)
{
    long n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
    return (unsigned)CKPTIO__MIN((unsigned long)n, (unsigned long)CKPTIO__MAX(cap, 1u));
}

int ckptio__workers_start(ckptio__workers **out, unsigned n)
{
    *out = NULL;
    ckptio__workers *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->pid = (int)getpid();
    w->n = CKPTIO__MAX(n, 1u);
    w->threads = calloc(w->n, sizeof *w->threads);
    w->args = calloc(w->n, sizeof *w->args);
    if (!w->threads || !w->args) {
        free(w->threads);
        free(w->args);
        free(w);
        return -ENOMEM;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->go, NULL);
    pthread_cond_init(&w->idle, NULL);
    /* The threads must not take the application's signals (Ctrl-C belongs to the caller). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (unsigned i = 1; i < w->n; i++) {
        w->args[i] = (thread_arg){w, i};
        rc = pthread_create(&w->threads[i], NULL, run, &w->args[i]);
        if (rc) break;
        w->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc && !w->started) {
        ckptio__workers_stop(w);
        return -rc;
    }
    w->n = w->started + 1; /* fewer threads than asked still work */
    *out = w;
    return 0;
}

unsigned ckptio__workers_count(const ckptio__workers *w)
{
    return w ? w->n : 1;
}

void ckptio__workers_for(ckptio__workers *w, size_t count, ckptio__work_fn fn, void *ctx)
{
    if (!count) return;
    if (!w || !w->started || count == 1) {
        for (size_t i = 0; i < count; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->fn = fn;
    w->ctx = ctx;
    w->count = count;
    atomic_store_explicit(&w->next, 0, memory_order_relaxed);
    w->active = w->started;
    w->gen++;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    drain(w, fn, ctx, count, 0);
    /* Every thread leaves the loop before the next one is posted: a late one must not take
     * an index of the next loop with this loop's fn. */
    pthread_mutex_lock(&w->mu);
    while (w->active) pthread_cond_wait(&w->idle, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void ckptio__workers_stop(ckptio__workers *w)
{
    if (!w) return;
    if (ckptio__forked(w->pid)) { /* a forked child: the threads, and maybe the lock, are the parent's */
        free(w->threads);
        free(w->args);
        free(w);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->go);
    pthread_mutex_unlock(&w->mu);
    for (unsigned i = 1; i <= w->started; i++) pthread_join(w->threads[i], NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->go);
    pthread_cond_destroy(&w->idle);
    free(w->threads);
    free(w->args);
    free(w);
}
