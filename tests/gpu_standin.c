/* SPDX-License-Identifier: Apache-2.0 */
/* TEST-ONLY stand-in for libcuda.so.1 and libcufile.so.0: "device memory" is host memory. */
/* Built only for the tests and loaded through ckptio's own dlopen path (CKPTIO_CUDA_LIBRARY,
 * CKPTIO_CUFILE_LIBRARY). It emulates what ckptio relies on: streams that run their work in
 * order on a thread each, events, cross-stream waits, pinned allocations, pointer queries,
 * and cuFile reads and writes (pread/pwrite). Failure injection and accounting go through the
 * standin_* functions and these variables:
 *   CKPTIO_STANDIN_FAIL_COPY=N   the Nth copy (1-based, either direction) fails (error 700)
 *   CKPTIO_STANDIN_FAIL_ALLOC=1  pinned allocations and registrations fail (error 2)
 *   CKPTIO_STANDIN_NO_DEVICE=1   cuDeviceGetCount says 0
 *   CKPTIO_STANDIN_COPY_US=N     every copy takes N microseconds more
 *   CKPTIO_STANDIN_GDS=1         cuFileDriverOpen succeeds (else it fails)
 * It is never installed and never part of libckptio. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { OP_COPY, OP_FILL, OP_RECORD, OP_WAIT };

typedef struct event {
    uint64_t recorded; /* generation of the last record */
    uint64_t done;     /* generation reached */
    struct stream *stream;
    uint64_t seq_at;   /* stream's copy count when recorded */
    unsigned refs;     /* queued records and waits naming it */
    bool dead;         /* destroyed with refs left: the last of them frees it, as CUDA does */
} event;

typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int byte;
    unsigned delay_us;
    event *ev;
    uint64_t gen;
    struct op *next;
} op;

typedef struct stream {
    pthread_t th;
    op *head, *tail;
    int busy, quit;
    CUresult err;          /* sticky error of a failed copy */
    uint64_t copies;       /* copies enqueued */
    uint64_t observed;     /* copies whose completion the host has seen */
    uint64_t max_ahead;    /* most copies enqueued and not yet seen by the host */
} stream;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static stream *legacy; /* the legacy default stream (handle 0) */

typedef struct alloc {
    uint8_t *p;
    size_t n;
    struct alloc *next;
} alloc;
static alloc *devs;
static long copies_started, pinned_now, pinned_peak, streams_live, events_live, copy_fail_at;
static long max_ahead_all;
/* Host memory registered (cuMemHostRegister) now and at most; device-to-host bytes that landed
 * in registered memory and in cuMemHostAlloc'd memory (ckptio's ring). */
static long registered_now, registered_peak, dtoh_registered, dtoh_allocated;
static __thread void *cur_ctx;
static int ctx_token;

static long envl(const char *k)
{
    const char *v = getenv(k);
    return v && *v ? atol(v) : 0;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static void *worker(void *arg)
{
    stream *s = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->quit) pthread_cond_wait(&cv, &mu);
        if (!s->head) break;
        op *o = s->head;
        s->busy = 1;
        if (o->kind == OP_WAIT) {
            while (o->ev->done < o->gen) pthread_cond_wait(&cv, &mu);
        } else if (o->kind == OP_RECORD) {
            o->ev->done = o->gen;
        } else if (!s->err) {
            int fail = 0;
            if (o->kind == OP_COPY && ++copies_started == copy_fail_at) fail = 1;
            pthread_mutex_unlock(&mu);
            if (o->delay_us) sleep_us(o->delay_us);
            if (!fail) {
                if (o->kind == OP_COPY) memcpy(o->dst, o->src, o->n);
                else memset(o->dst, o->byte, o->n);
            }
            pthread_mutex_lock(&mu);
            if (fail) s->err = 700;
        }
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 0;
        if (o->ev && --o->ev->refs == 0 && o->ev->dead) free(o->ev);
        free(o);
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static stream *new_stream(void)
{
    stream *s = calloc(1, sizeof *s);
    pthread_create(&s->th, NULL, worker, s);
    return s;
}

/* 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name the default stream: one here. */
static stream *S(void *h)
{
    if ((uintptr_t)h > 2) return h;
    if (!legacy) legacy = new_stream();
    return legacy;
}

/* Called with mu held. */
static void push(stream *s, op *o)
{
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&cv);
}

static alloc *find(const void *p)
{
    for (alloc *a = devs; a; a = a->next)
        if ((const uint8_t *)p >= a->p && (const uint8_t *)p < a->p + a->n) return a;
    return NULL;
}

/* ---- the test's side ---- */

API void *standin_malloc(size_t n)
{
    alloc *a = calloc(1, sizeof *a);
    if (posix_memalign((void **)&a->p, 4096, n ? n : 1)) return NULL;
    a->n = n ? n : 1;
    pthread_mutex_lock(&mu);
    a->next = devs;
    devs = a;
    pthread_mutex_unlock(&mu);
    return a->p;
}

API void standin_free(void *p)
{
    pthread_mutex_lock(&mu);
    for (alloc **a = &devs; *a; a = &(*a)->next)
        if ((*a)->p == p) {
            alloc *x = *a;
            *a = x->next;
            free(x->p);
            free(x);
            break;
        }
    pthread_mutex_unlock(&mu);
}

/* A "kernel" on stream h: after delay_us, set n bytes at p to byte. */
API void standin_fill(void *h, void *p, int byte, size_t n, unsigned delay_us)
{
    op *o = calloc(1, sizeof *o);
    *o = (op){.kind = OP_FILL, .dst = p, .n = n, .byte = byte, .delay_us = delay_us};
    pthread_mutex_lock(&mu);
    push(S(h), o);
    pthread_mutex_unlock(&mu);
}

/* A copy queued on stream h (what a kernel reading the data would see). */
API void standin_copy(void *h, void *dst, const void *src, size_t n)
{
    op *o = calloc(1, sizeof *o);
    *o = (op){.kind = OP_COPY, .dst = dst, .src = src, .n = n};
    pthread_mutex_lock(&mu);
    copies_started--; /* not one of ckptio's: not counted for failure injection */
    push(S(h), o);
    pthread_mutex_unlock(&mu);
}

API void *standin_stream(void)
{
    pthread_mutex_lock(&mu);
    stream *s = new_stream();
    pthread_mutex_unlock(&mu);
    return s;
}

API void standin_sync(void *h)
{
    pthread_mutex_lock(&mu);
    stream *s = S(h);
    while (s->head || s->busy) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

typedef struct standin_stats {
    long pinned_now, pinned_peak, streams_live, events_live, max_ahead, copies;
    long registered_now, registered_peak, dtoh_registered, dtoh_allocated;
} standin_stats;

API void standin_get_stats(standin_stats *out)
{
    pthread_mutex_lock(&mu);
    *out = (standin_stats){pinned_now,      pinned_peak,     streams_live,    events_live,
                           max_ahead_all,   copies_started,  registered_now,  registered_peak,
                           dtoh_registered, dtoh_allocated};
    pthread_mutex_unlock(&mu);
}

static int in_list(const struct alloc *list, const void *p, size_t n);
static struct alloc *registered;

/* Whether [p, p + n) lies in host memory registered with cuMemHostRegister. */
API int standin_is_registered(const void *p, size_t n)
{
    pthread_mutex_lock(&mu);
    int r = in_list(registered, p, n);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- the driver API ---- */

API CUresult cuInit(unsigned flags)
{
    (void)flags;
    copy_fail_at = envl("CKPTIO_STANDIN_FAIL_COPY");
    return 0;
}
API CUresult cuDeviceGetCount(int *n)
{
    *n = envl("CKPTIO_STANDIN_NO_DEVICE") ? 0 : 1;
    return 0;
}
API CUresult cuDeviceGet(int *d, int ordinal)
{
    *d = ordinal;
    return ordinal == 0 ? 0 : 101;
}
API CUresult cuCtxGetCurrent(void **c)
{
    *c = cur_ctx;
    return 0;
}
API CUresult cuCtxSetCurrent(void *c)
{
    cur_ctx = c;
    return 0;
}
API CUresult cuDevicePrimaryCtxRetain(void **c, int d)
{
    (void)d;
    *c = &ctx_token;
    return 0;
}
static alloc *pinned;

/* Called with mu held: a is pinned now (allocated or registered). */
static void track(alloc **list, alloc *a, long *now, long *peak)
{
    a->next = *list;
    *list = a;
    *now += (long)a->n;
    if (*now > *peak) *peak = *now;
}

/* Called with mu held: the range starting at p is no longer pinned (its memory freed if ours);
 * 0 if it never was. */
static int untrack(alloc **list, void *p, long *now, int ours)
{
    for (alloc **a = list; *a; a = &(*a)->next)
        if ((*a)->p == p) {
            alloc *x = *a;
            *a = x->next;
            *now -= (long)x->n;
            if (ours) free(x->p);
            free(x);
            return 1;
        }
    return 0;
}

API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    if (!cur_ctx) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (envl("CKPTIO_STANDIN_FAIL_ALLOC")) return 2;
    alloc *a = calloc(1, sizeof *a);
    if (!a || posix_memalign((void **)&a->p, 4096, n)) return 2;
    a->n = n;
    pthread_mutex_lock(&mu);
    track(&pinned, a, &pinned_now, &pinned_peak);
    pthread_mutex_unlock(&mu);
    *p = a->p;
    return 0;
}

API CUresult cuMemFreeHost(void *p)
{
    pthread_mutex_lock(&mu);
    CUresult r = untrack(&pinned, p, &pinned_now, 1) ? 0 : 1;
    pthread_mutex_unlock(&mu);
    return r;
}

static int in_list(const alloc *list, const void *p, size_t n)
{
    for (const alloc *a = list; a; a = a->next)
        if ((const uint8_t *)p >= a->p && (const uint8_t *)p + n <= a->p + a->n) return 1;
    return 0;
}

static int is_pinned(const void *p, size_t n)
{
    return in_list(pinned, p, n) || in_list(registered, p, n);
}

/* Like the driver: the caller's memory becomes pinned; ranges may not overlap. */
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
    (void)flags;
    if (!cur_ctx) return 201;
    if (envl("CKPTIO_STANDIN_FAIL_ALLOC")) return 2;
    pthread_mutex_lock(&mu);
    for (alloc *a = registered; a; a = a->next)
        if ((uint8_t *)p < a->p + a->n && a->p < (uint8_t *)p + n) {
            pthread_mutex_unlock(&mu);
            return 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
        }
    alloc *a = calloc(1, sizeof *a);
    *a = (alloc){.p = p, .n = n};
    track(&registered, a, &registered_now, &registered_peak);
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuMemHostUnregister(void *p)
{
    pthread_mutex_lock(&mu);
    int was = untrack(&registered, p, &registered_now, 0);
    pthread_mutex_unlock(&mu);
    return was ? 0 : 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
}

static CUresult copy(void *dst, const void *src, size_t n, void *h, int d2h)
{
    pthread_mutex_lock(&mu);
    /* Like the driver: the device side must be device memory, the host side (for truly
     * asynchronous copies, which ckptio wants) pinned. */
    const void *dev = d2h ? src : dst, *host = d2h ? dst : src;
    alloc *a = find(dev);
    if (!a || (const uint8_t *)dev + n > a->p + a->n || !is_pinned(host, n)) {
        pthread_mutex_unlock(&mu);
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    }
    stream *s = S(h);
    if (s->err) {
        pthread_mutex_unlock(&mu);
        return s->err;
    }
    op *o = calloc(1, sizeof *o);
    *o = (op){.kind = OP_COPY, .dst = dst, .src = src, .n = n,
              .delay_us = (unsigned)envl("CKPTIO_STANDIN_COPY_US")};
    s->copies++;
    if (d2h) *(in_list(registered, dst, n) ? &dtoh_registered : &dtoh_allocated) += (long)n;
    if (s->copies - s->observed > s->max_ahead) s->max_ahead = s->copies - s->observed;
    if ((long)s->max_ahead > max_ahead_all) max_ahead_all = (long)s->max_ahead;
    push(s, o);
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *h)
{
    return copy(dst, (const void *)(uintptr_t)src, n, h, 1);
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *h)
{
    return copy((void *)(uintptr_t)dst, src, n, h, 0);
}

API CUresult cuStreamCreate(void **h, unsigned flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    *h = new_stream();
    streams_live++;
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuStreamSynchronize(void *h)
{
    pthread_mutex_lock(&mu);
    stream *s = S(h);
    while (s->head || s->busy) pthread_cond_wait(&cv, &mu);
    s->observed = s->copies;
    CUresult r = s->err;
    pthread_mutex_unlock(&mu);
    return r;
}

API CUresult cuStreamDestroy_v2(void *h)
{
    stream *s = h;
    pthread_mutex_lock(&mu);
    while (s->head || s->busy) pthread_cond_wait(&cv, &mu);
    s->quit = 1;
    pthread_cond_broadcast(&cv);
    streams_live--;
    pthread_mutex_unlock(&mu);
    pthread_join(s->th, NULL);
    free(s);
    return 0;
}

API CUresult cuEventCreate(void **e, unsigned flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    *e = calloc(1, sizeof(event));
    events_live++;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* An event whose record is still queued is freed by the stream once it is done with it. */
API CUresult cuEventDestroy_v2(void *e_)
{
    event *e = e_;
    pthread_mutex_lock(&mu);
    events_live--;
    if (e->refs) e->dead = true;
    else free(e);
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuEventRecord(void *e_, void *h)
{
    event *e = e_;
    pthread_mutex_lock(&mu);
    stream *s = S(h);
    op *o = calloc(1, sizeof *o);
    *o = (op){.kind = OP_RECORD, .ev = e, .gen = ++e->recorded};
    e->refs++;
    e->stream = s;
    e->seq_at = s->copies;
    push(s, o);
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuEventSynchronize(void *e_)
{
    event *e = e_;
    pthread_mutex_lock(&mu);
    while (e->done < e->recorded) pthread_cond_wait(&cv, &mu);
    CUresult r = 0;
    if (e->stream) {
        if (e->seq_at > e->stream->observed) e->stream->observed = e->seq_at;
        r = e->stream->err;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

API CUresult cuEventQuery(void *e_)
{
    event *e = e_;
    pthread_mutex_lock(&mu);
    CUresult r = e->done < e->recorded ? 600 : e->stream ? e->stream->err : 0;
    pthread_mutex_unlock(&mu);
    return r;
}

API CUresult cuStreamWaitEvent(void *h, void *e_, unsigned flags)
{
    event *e = e_;
    (void)flags;
    pthread_mutex_lock(&mu);
    op *o = calloc(1, sizeof *o);
    *o = (op){.kind = OP_WAIT, .ev = e, .gen = e->recorded};
    e->refs++;
    push(S(h), o);
    pthread_mutex_unlock(&mu);
    return 0;
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    pthread_mutex_lock(&mu);
    alloc *a = find((const void *)(uintptr_t)p);
    pthread_mutex_unlock(&mu);
    if (!a) return 1; /* host memory the driver never saw: CUDA_ERROR_INVALID_VALUE */
    if (attr == 2) *(unsigned *)data = 2;  /* MEMORY_TYPE: DEVICE */
    else if (attr == 9) *(int *)data = 0;  /* DEVICE_ORDINAL */
    else return 1;
    return 0;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == 700 ? "an illegal memory access was encountered (stand-in)"
         : r == 2 ? "out of memory (stand-in)"
         : r == 1 ? "invalid argument (stand-in)"
                  : "error (stand-in)";
    return 0;
}

/* ---- cuFile ---- */

typedef struct { int err, cu_err; } CUfileError_t;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } CUfileDescr_t;

API CUfileError_t cuFileDriverOpen(void)
{
    return (CUfileError_t){envl("CKPTIO_STANDIN_GDS") ? 0 : 5001, 0};
}
API CUfileError_t cuFileDriverClose_v2(void) { return (CUfileError_t){0, 0}; }
/* A handle remembers which file it was registered for: like the real one, it is bound to that
 * file, not to a descriptor number that a later open may reuse. */
typedef struct fhandle {
    int fd;
    dev_t dev;
    ino_t ino;
} fhandle;

API CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
    struct stat st;
    if (d->type != 1 || d->handle.fd < 0 || fstat(d->handle.fd, &st) < 0)
        return (CUfileError_t){5002, 0};
    fhandle *h = malloc(sizeof *h);
    *h = (fhandle){d->handle.fd, st.st_dev, st.st_ino};
    *fh = h;
    return (CUfileError_t){0, 0};
}
API void cuFileHandleDeregister(void *fh) { free(fh); }

/* The descriptor of a live handle, or -1 (EBADF) when its file is no longer behind it. */
static int handle_fd(void *fh)
{
    fhandle *h = fh;
    struct stat st;
    if (fstat(h->fd, &st) < 0 || st.st_dev != h->dev || st.st_ino != h->ino) {
        errno = EBADF;
        return -1;
    }
    return h->fd;
}
API CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags)
{
    (void)p, (void)n, (void)flags;
    return (CUfileError_t){0, 0};
}
API CUfileError_t cuFileBufDeregister(const void *p)
{
    (void)p;
    return (CUfileError_t){0, 0};
}
API ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t off, off_t boff)
{
    int fd = handle_fd(fh);
    return fd < 0 ? -1 : pwrite(fd, (const uint8_t *)base + boff, n, off);
}
API ssize_t cuFileRead(void *fh, void *base, size_t n, off_t off, off_t boff)
{
    int fd = handle_fd(fh);
    return fd < 0 ? -1 : pread(fd, (uint8_t *)base + boff, n, off);
}
