/* SPDX-License-Identifier: Apache-2.0 */
/* Background saves: a commit or a multi-rank save on a thread of ckptio's, with a completion to wait on. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/forksafe.h"
#include "pool.h"
#include "writer.h"

struct ckptio_completion {
    ckptio__job job;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done; /* under lock; the fields below are written before it is set */
    int rc;
    ckptio__msg msg;
    ckptio_stats stats;
    bool seen;   /* wait has handed the result to someone */
    bool forked; /* in a child of the process that started it: no thread, hands off */
    ckptio__forksafe fork;
};

/* The child has no commit thread: a save still running is the parent's, never the child's. */
static void fork_child(void *obj)
{
    ckptio_completion *c = obj;
    if (!c->done) {
        c->done = 1;
        c->rc = CKPTIO_E_STATE;
        ckptio__info_none(&c->msg.info);
        c->msg.info.code = CKPTIO_E_STATE;
        snprintf(c->msg.text, sizeof c->msg.text,
                 "this background save belongs to the parent process (pid %ld), which forked "
                 "this one; it goes on there, and this process cannot wait for it",
                 (long)getppid());
    }
    c->seen = true;
    c->forked = true;
}

static void *job_thread(void *arg)
{
    ckptio_completion *c = arg;
    ckptio_stats st;
    ckptio__msg msg;
    memset(&st, 0, sizeof st);
    ckptio__msg_clear(&msg);
    int rc = c->job.run(c->job.ctx, &st, &msg);
    pthread_mutex_lock(&c->lock);
    c->rc = rc;
    c->stats = st;
    if (rc < 0) c->msg = msg;
    c->done = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int ckptio__completion_start(const ckptio__job *job, ckptio_completion **out, const char *what)
{
    ckptio_completion *c = calloc(1, sizeof *c);
    if (!c) return ckptio__fail(NULL, -ENOMEM, "%s: out of memory for the completion", what);
    c->job = *job;
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
        return ckptio__fail(NULL, -e, "%s: cannot make a condition variable; nothing was "
                                      "started", what);
    }
    pthread_mutex_init(&c->lock, NULL);
    c->fork = (ckptio__forksafe){&c->lock, fork_child, c, NULL};
    /* Listed as the thread starts, under the list's lock: a fork sees both or neither. */
    ckptio__forksafe_lock();
    /* The thread takes no signals: they stay with the caller's threads, whose handlers
     * (Python's Ctrl-C among them) expect them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&c->thread, NULL, job_thread, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!e) ckptio__forksafe_add_locked(&c->fork);
    ckptio__forksafe_unlock();
    if (e) {
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return ckptio__fail(NULL, -e,
                            "%s: cannot start a thread (%s); nothing was started: save "
                            "directly, or retry with fewer threads",
                            what, strerror(e));
    }
    if (job->pool) ckptio__pool_set_pending(job->pool, c);
    *out = c;
    return 0;
}

static int commit_run(void *ctx, ckptio_stats *st, ckptio__msg *msg)
{
    ckptio_writer *w = ctx;
    int rc = ckptio_writer_commit(w);
    (void)ckptio_writer_stats(w, st);
    if (rc < 0) *msg = w->msg; /* the text and its values */
    return rc;
}

static void commit_drop(void *ctx, bool forked)
{
    if (!forked) ckptio_writer_close(ctx); /* in a child its I/O threads are the parent's */
}

int ckptio_writer_commit_async(ckptio_writer *w, ckptio_completion **out)
{
    if (out) *out = NULL;
    if (!w || !out)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_writer_commit_async: the writer and `out` must not be NULL");
    ckptio__job job = {commit_run, commit_drop, w, NULL};
    return ckptio__completion_start(&job, out, "ckptio_writer_commit_async");
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
    if (done) c->seen = true;
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

int ckptio__completion_result(ckptio_completion *c, bool mark_seen, bool *seen, ckptio__msg *msg)
{
    pthread_mutex_lock(&c->lock);
    while (!c->done) pthread_cond_wait(&c->cond, &c->lock);
    *seen = c->seen;
    if (mark_seen) c->seen = true;
    if (c->rc < 0) *msg = c->msg;
    int rc = c->rc;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void ckptio_completion_free(ckptio_completion *c)
{
    if (!c) return;
    ckptio__forksafe_remove(&c->fork);
    /* A forked child's copy has no thread to join, and its lock and condition variable may
     * show the parent's waiters: it is only forgotten. */
    if (!c->forked) pthread_join(c->thread, NULL);
    if (c->job.pool)
        ckptio__pool_forget(c->job.pool, c, c->seen ? 0 : c->rc, c->msg.text);
    c->job.drop(c->job.ctx, c->forked);
    if (!c->forked) {
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
    }
    free(c);
}

int ckptio__pool_settle(ckptio_pool *pool, ckptio__msg *m)
{
    int rc;
    ckptio__msg old;
    ckptio_completion *c = ckptio__pool_pending(pool, &rc, &old);
    if (c) {
        /* The caller uses the pool's completions from this thread only: c stays alive. */
        bool seen = true;
        int r = ckptio__completion_result(c, true, &seen, &old);
        if (r < 0 && !seen) rc = r;
    }
    if (rc < 0)
        return ckptio__fail(m, rc,
                            "the earlier async save failed and nobody waited for it, so that "
                            "checkpoint was not written; this snapshot did not start: %s",
                            old.text);
    return 0;
}
