/* SPDX-License-Identifier: Apache-2.0 */
/* The psync backend: a fixed pool of threads doing blocking pread/pwrite for the engine. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine.h"
#include "vfd.h"
#include "vfs.h"

/* Same cap as the io_uring backend: the kernel moves at most ~2 GiB per call anyway, and a
 * power of two keeps O_DIRECT remainders aligned. */
#define PSYNC_MAX_CHUNK ((size_t)1 << 30)

typedef struct psync_state {
    pthread_mutex_t lock;
    pthread_cond_t work;     /* signalled when sq gains a request or stop is set */
    pthread_cond_t finished; /* signalled when cq gains a request */
    ckptio__req_list sq, cq; /* both guarded by lock; a request sits in at most one */
    unsigned ncq;
    bool stop;
    unsigned nthreads; /* threads started, joined in fini */
    int pid;           /* the process whose threads they are */
    pthread_t *threads;
} psync_state;

/* Move all of r, continuing short transfers; the result goes to r->res. */
static void do_io(ckptio__req *r)
{
    uint8_t *p = r->buf;
    if (ckptio__vfd_io(r)) return; /* a store's object: the store moves the bytes */
    while (r->done_ < r->len) {
        size_t n = (size_t)CKPTIO__MIN(r->len - r->done_, (uint64_t)PSYNC_MAX_CHUNK);
        off_t off = (off_t)(r->off + r->done_);
        ssize_t got = r->op == CKPTIO__OP_READ ? CKPTIO__VFS->pread(r->fd, p + r->done_, n, off)
                                               : CKPTIO__VFS->pwrite(r->fd, p + r->done_, n, off);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            r->res = -errno;
            return;
        }
        if (got == 0) { /* reads: end of file; a write that moves nothing would loop forever */
            r->res = r->op == CKPTIO__OP_READ ? (int64_t)r->done_ : -EIO;
            return;
        }
        r->done_ += (uint64_t)got;
    }
    r->res = (int64_t)r->len;
}

static void *worker(void *arg)
{
    psync_state *st = arg;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        ckptio__req *r = ckptio__list_pop(&st->sq);
        if (!r) {
            /* Queued work is finished before stopping, so fini never strands a request. */
            if (st->stop) break;
            pthread_cond_wait(&st->work, &st->lock);
            continue;
        }
        pthread_mutex_unlock(&st->lock);
        do_io(r);
        pthread_mutex_lock(&st->lock);
        ckptio__list_push(&st->cq, r);
        st->ncq++;
        pthread_cond_signal(&st->finished);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

static void psync_fini(ckptio__engine *e)
{
    psync_state *st = e->impl;
    if (!st) return;
    if (ckptio__forked(st->pid)) { /* a forked child: the threads, and maybe the lock, are the parent's */
        free(st->threads);
        free(st);
        e->impl = NULL;
        return;
    }
    pthread_mutex_lock(&st->lock);
    st->stop = true;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->lock);
    for (unsigned i = 0; i < st->nthreads; i++)
        pthread_join(st->threads[i], NULL);
    pthread_cond_destroy(&st->finished);
    pthread_cond_destroy(&st->work);
    pthread_mutex_destroy(&st->lock);
    free(st->threads);
    free(st);
    e->impl = NULL;
}

static int psync_init(ckptio__engine *e)
{
    int rc = 0;
    psync_state *st = calloc(1, sizeof *st);
    if (st) st->pid = (int)getpid();
    CKPTIO__RET_IF(!st, -ENOMEM);
    st->threads = calloc(e->threads, sizeof *st->threads);
    if (!st->threads) {
        free(st);
        return -ENOMEM;
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->work, NULL);
    pthread_cond_init(&st->finished, NULL);
    e->impl = st;

    /* Workers block every signal, so that SIGINT and friends reach the application's threads
     * (Python's Ctrl-C handling depends on it), never an I/O thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < e->threads; i++) {
        int err = pthread_create(&st->threads[i], NULL, worker, st);
        CKPTIO__GOTO_IF(err, -err);
        st->nthreads++;
    }
out:
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) psync_fini(e);
    return rc;
}

static int psync_submit(ckptio__engine *e, ckptio__req *r)
{
    psync_state *st = e->impl;
    pthread_mutex_lock(&st->lock);
    ckptio__list_push(&st->sq, r);
    pthread_cond_signal(&st->work);
    pthread_mutex_unlock(&st->lock);
    return 0;
}

static int psync_reap(ckptio__engine *e, ckptio__req **out, unsigned max, unsigned min)
{
    psync_state *st = e->impl;
    unsigned n = 0;
    pthread_mutex_lock(&st->lock);
    while (st->ncq < min)
        pthread_cond_wait(&st->finished, &st->lock);
    while (n < max && st->cq.head) {
        out[n++] = ckptio__list_pop(&st->cq);
        st->ncq--;
    }
    pthread_mutex_unlock(&st->lock);
    return (int)n;
}

CKPTIO__HIDDEN const ckptio__backend_ops ckptio__psync_ops = {
    .name = "psync",
    .init = psync_init,
    .submit = psync_submit,
    .reap = psync_reap,
    .fini = psync_fini,
};
