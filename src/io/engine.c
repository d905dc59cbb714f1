/* SPDX-License-Identifier: Apache-2.0 */
/* The engine front: picks a backend, bounds requests in flight, reads the CKPTIO_IO override. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio_config.h"
#include "engine.h"
#include "vfs.h"

#if CKPTIO_HAVE_IO_URING
#include <liburing.h>
#endif

#define ENGINE_DEFAULT_DEPTH   16u
#define ENGINE_DEFAULT_THREADS 4u
#define ENGINE_MAX_DEPTH       4096u /* io_uring's largest SQ ring is 32768; keep well below */

static pthread_once_t uring_once = PTHREAD_ONCE_INIT;
static bool uring_ok;

static void probe_uring(void)
{
#if CKPTIO_HAVE_IO_URING
    /* A tiny ring answers every reason for refusal at once: no syscall (old kernel, seccomp),
     * kernel.io_uring_disabled, or a locked-memory limit too small for the rings. */
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) == 0) {
        io_uring_queue_exit(&ring);
        uring_ok = true;
    }
#endif
}

bool ckptio__io_uring_available(void)
{
    pthread_once(&uring_once, probe_uring);
    return uring_ok;
}

int ckptio__backend_from_env(int requested)
{
    CKPTIO__RET_IF(requested < CKPTIO_BACKEND_AUTO || requested > CKPTIO_BACKEND_BUFFERED,
                   CKPTIO_E_USAGE);
    const char *v = getenv("CKPTIO_IO");
    if (!v || !*v) return requested;
    if (!strcmp(v, "io_uring")) return CKPTIO_BACKEND_IO_URING;
    if (!strcmp(v, "psync")) return CKPTIO_BACKEND_PSYNC;
    if (!strcmp(v, "buffered")) return CKPTIO_BACKEND_BUFFERED;
    if (!strcmp(v, "auto")) return CKPTIO_BACKEND_AUTO;
    return CKPTIO_E_USAGE;
}

double ckptio__io_timeout(void)
{
    const char *v = getenv("CKPTIO_IO_TIMEOUT");
    char *end;
    double t = v && *v ? strtod(v, &end) : 0;
    return v && *v && *end == 0 && t > 0 ? t : CKPTIO__IO_TIMEOUT_S;
}

ckptio__backend_hook ckptio__backend_wrap;

/* Start `ops` on e; on failure e is left without a backend, ready for another try. */
static int start(ckptio__engine *e, const ckptio__backend_ops *ops)
{
    e->ops = ckptio__backend_wrap ? ckptio__backend_wrap(ops) : ops;
    ops = e->ops;
    e->impl = NULL;
    e->timeout = ckptio__io_timeout();
    int rc = ops->init(e);
    if (rc < 0) e->ops = NULL;
    return rc;
}

int ckptio__engine_open(ckptio__engine **out, int backend, unsigned depth, unsigned threads)
{
    int rc = 0;
    CKPTIO__RET_IF(!out, CKPTIO_E_USAGE);
    *out = NULL;
    CKPTIO__RET_IF(backend < CKPTIO_BACKEND_AUTO || backend > CKPTIO_BACKEND_BUFFERED,
                   CKPTIO_E_USAGE);
    CKPTIO__RET_IF(depth > ENGINE_MAX_DEPTH || threads > ENGINE_MAX_DEPTH, CKPTIO_E_USAGE);
    ckptio__engine *e = calloc(1, sizeof *e);
    CKPTIO__RET_IF(!e, -ENOMEM);
    e->depth = depth ? depth : ENGINE_DEFAULT_DEPTH;
    e->threads = threads ? threads : ENGINE_DEFAULT_THREADS;

    switch (backend) {
    case CKPTIO_BACKEND_IO_URING:
        CKPTIO__GOTO_IF(!ckptio__io_uring_available(), CKPTIO_E_UNSUPPORTED);
#if CKPTIO_HAVE_IO_URING
        CKPTIO__CHECK(start(e, &ckptio__io_uring_ops));
#endif
        break;
    case CKPTIO_BACKEND_AUTO:
#if CKPTIO_HAVE_IO_URING
        /* A ring of this depth can still fail where the probe passed (memlock, ENOMEM): then
         * the thread pool does the work. */
        if (ckptio__io_uring_available() && start(e, &ckptio__io_uring_ops) == 0) break;
#endif
        CKPTIO__CHECK(start(e, &ckptio__psync_ops));
        break;
    default: /* PSYNC and BUFFERED: buffering is decided when files are opened */
        CKPTIO__CHECK(start(e, &ckptio__psync_ops));
        break;
    }
    *out = e;
    return 0;
out:
    free(e);
    return rc;
}

void ckptio__engine_close(ckptio__engine *e)
{
    if (!e) return;
    /* The caller's buffers may be freed as soon as we return, so every request the kernel or
     * a worker still holds must come back first. Only a broken backend makes us give up. */
    ckptio__req *done[64];
    while (e->inflight > 0) {
        int n = ckptio__engine_reap(e, done, 64, 1);
        if (n < 0 && n != -EINTR) break;
    }
    e->ops->fini(e);
    free(e);
}

const char *ckptio__engine_name(const ckptio__engine *e)
{
    return e && e->ops ? e->ops->name : "none";
}

int ckptio__engine_submit(ckptio__engine *e, ckptio__req *r)
{
    CKPTIO__RET_IF(!e || !r, CKPTIO_E_USAGE);
    CKPTIO__RET_IF(r->op != CKPTIO__OP_READ && r->op != CKPTIO__OP_WRITE, CKPTIO_E_USAGE);
    CKPTIO__RET_IF(r->len && !r->buf, CKPTIO_E_USAGE);
    CKPTIO__RET_IF(r->off > (uint64_t)INT64_MAX || r->len > (uint64_t)INT64_MAX - r->off, -EINVAL);
    /* Completed-but-unreaped requests still count: the caller owns at most `depth` slots. */
    CKPTIO__RET_IF(e->inflight >= e->depth, -EBUSY);
    r->res = 0;
    r->done_ = 0;
    r->next_ = NULL;
    if (CKPTIO__VFS->req_submit) CKPTIO__TRY(CKPTIO__VFS->req_submit(r));
    CKPTIO__TRY(e->ops->submit(e, r));
    e->inflight++;
    return 0;
}

int ckptio__engine_reap(ckptio__engine *e, ckptio__req **out, unsigned max, unsigned min)
{
    CKPTIO__RET_IF(!e || (max && !out), CKPTIO_E_USAGE);
    /* Waiting for more than can ever finish would block forever. */
    min = CKPTIO__MIN(min, CKPTIO__MIN(max, e->inflight));
    if (max == 0 || e->inflight == 0) return 0;
    int n = e->ops->reap(e, out, max, min);
    if (n > 0) e->inflight -= (unsigned)n;
    if (CKPTIO__VFS->req_done)
        for (int i = 0; i < n; i++) CKPTIO__VFS->req_done(out[i]);
    return n;
}
