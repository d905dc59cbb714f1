/* SPDX-License-Identifier: Apache-2.0 */
/* A single background thread that turns queued byte ranges into block checksums. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "hasher.h"

#define QUEUE 256u /* bounded: a producer faster than the hash waits */

typedef struct job {
    const uint8_t *src;
    uint64_t n;
    uint64_t *out;
} job;

struct ckptio__hasher {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t more, done;
    job ring[QUEUE];
    unsigned head, count; /* jobs queued and not yet taken */
    unsigned busy;        /* jobs taken and not finished */
    bool stop;
    uint64_t block;
    int pid; /* the process whose thread it is */
};

static void *run(void *arg)
{
    ckptio__hasher *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->count && !h->stop) pthread_cond_wait(&h->more, &h->mu);
        if (!h->count && h->stop) break;
        job j = h->ring[h->head];
        h->head = (h->head + 1) % QUEUE;
        h->count--;
        h->busy++;
        pthread_cond_broadcast(&h->done); /* a slot is free */
        pthread_mutex_unlock(&h->mu);
        for (uint64_t i = 0, k = 0; i < j.n; i += h->block, k++)
            j.out[k] = ckptio__hash(j.src + i, CKPTIO__MIN(h->block, j.n - i));
        pthread_mutex_lock(&h->mu);
        h->busy--;
        pthread_cond_broadcast(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int ckptio__hasher_start(ckptio__hasher **out, uint64_t block)
{
    ckptio__hasher *h = calloc(1, sizeof *h);
    if (h) h->pid = (int)getpid();
    if (!h) return -ENOMEM;
    h->block = block;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->more, NULL);
    pthread_cond_init(&h->done, NULL);
    /* The thread must not take the application's signals (Ctrl-C belongs to the caller). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&h->thread, NULL, run, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->more);
        pthread_cond_destroy(&h->done);
        free(h);
        return -rc;
    }
    *out = h;
    return 0;
}

int ckptio__hasher_push(ckptio__hasher *h, const void *src, uint64_t n, uint64_t *out)
{
    pthread_mutex_lock(&h->mu);
    while (h->count == QUEUE) pthread_cond_wait(&h->done, &h->mu);
    h->ring[(h->head + h->count) % QUEUE] = (job){src, n, out};
    h->count++;
    pthread_cond_signal(&h->more);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

void ckptio__hasher_wait(ckptio__hasher *h)
{
    if (!h || ckptio__forked(h->pid)) return; /* a forked child has no thread to wait for */
    pthread_mutex_lock(&h->mu);
    while (h->count || h->busy) pthread_cond_wait(&h->done, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void ckptio__hasher_stop(ckptio__hasher *h)
{
    if (!h) return;
    if (ckptio__forked(h->pid)) { /* the thread, and maybe the lock, are the parent's */
        free(h);
        return;
    }
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->more);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->more);
    pthread_cond_destroy(&h->done);
    free(h);
}
