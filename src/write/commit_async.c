/* SPDX-License-Identifier: Apache-2.0 */
/* Background commits: ckptio_writer_commit() on a thread of ckptio's, with a completion to wait on. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "writer.h"

struct ckptio_completion {
    ckptio_writer *w;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done; /* under lock; the fields below are written before it is set */
    int rc;
    ckptio__msg msg;
    ckptio_stats stats;
};

static void *commit_thread(void *arg)
{
    ckptio_completion *c = arg;
    int rc = ckptio_writer_commit(c->w);
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    (void)ckptio_writer_stats(c->w, &st);
    pthread_mutex_lock(&c->lock);
    c->rc = rc;
    c->stats = st;
    if (rc < 0) c->msg = c->w->msg; /* the text and its values */
    c->done = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int ckptio_writer_commit_async(ckptio_writer *w, ckptio_completion **out)
{
    if (out) *out = NULL;
    if (!w || !out)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_writer_commit_async: the writer and `out` must not be NULL");
    ckptio_completion *c = calloc(1, sizeof *c);
    if (!c)
        return ckptio__fail(NULL, -ENOMEM,
                            "ckptio_writer_commit_async: out of memory for the completion");
    c->w = w;
    pthread_condattr_t ca;
    int e = pthread_condattr_init(&ca);
    if (!e) {
        /* Timeouts are measured on the monotonic clock: a clock change never cuts a wait. */
        e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (!e) e = pthread_cond_init(&c->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (e) {
        free(c);
        return ckptio__fail(NULL, -e, "ckptio_writer_commit_async: cannot make a condition "
                                      "variable; the writer is unchanged, commit it directly");
    }
    pthread_mutex_init(&c->lock, NULL);
    /* The commit thread takes no signals: they stay with the caller's threads, whose
     * handlers (Python's Ctrl-C among them) expect them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&c->thread, NULL, commit_thread, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return ckptio__fail(NULL, -e,
                            "ckptio_writer_commit_async: cannot start a thread (%s); the writer "
                            "is unchanged: commit it directly, or retry with fewer threads",
                            strerror(e));
    }
    *out = c;
    return 0;
}

int ckptio_completion_wait(ckptio_completion *c, double timeout)
{
    if (!c || timeout != timeout)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_completion_wait: NULL completion or NaN timeout");
    pthread_mutex_lock(&c->lock);
    if (timeout < 0) {
        while (!c->done) pthread_cond_wait(&c->cond, &c->lock);
    } else if (!c->done) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        double whole = timeout > 1e9 ? 1e9 : timeout;
        time_t s = (time_t)whole;
        long ns = (long)((whole - (double)s) * 1e9);
        dl.tv_sec += s;
        dl.tv_nsec += ns;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        while (!c->done)
            if (pthread_cond_timedwait(&c->cond, &c->lock, &dl) == ETIMEDOUT) break;
    }
    int done = c->done, rc = c->rc;
    pthread_mutex_unlock(&c->lock);
    if (!done)
        return ckptio__fail(NULL, -ETIMEDOUT,
                            "the background commit is still running after %.3g s; wait again, "
                            "and keep the buffers given to the writer unchanged until it is done",
                            timeout);
    if (rc < 0) return ckptio__refail(NULL, &c->msg, rc, ckptio_strerror(rc), NULL);
    return rc;
}

int ckptio_completion_done(const ckptio_completion *c)
{
    if (!c) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    int d = c->done;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    return d;
}

const char *ckptio_completion_errmsg(const ckptio_completion *c)
{
    return c && ckptio_completion_done(c) ? c->msg.text : "";
}

int ckptio_completion_error_info(const ckptio_completion *c, ckptio_error_info *out)
{
    static const ckptio__msg none; /* a completion has no failure until it is done */
    if (!c) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_completion_error_info: NULL");
    return ckptio__msg_info(ckptio_completion_done(c) ? &c->msg : &none, out,
                            "ckptio_completion_error_info");
}

int ckptio_completion_stats(const ckptio_completion *c, ckptio_stats *out)
{
    if (!c || !out)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_completion_stats: NULL argument");
    if (!ckptio_completion_done(c))
        return ckptio__fail(NULL, CKPTIO_E_STATE,
                            "ckptio_completion_stats: the commit is still running; wait first");
    *out = c->stats;
    return 0;
}

void ckptio_completion_free(ckptio_completion *c)
{
    if (!c) return;
    pthread_join(c->thread, NULL);
    ckptio_writer_close(c->w);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
