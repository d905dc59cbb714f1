/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU pipeline: device memory through a pinned ring on ckptio's own stream, or cuFile. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "staged.h"

static int cu_fail(ckptio__gpu *g, ckptio__msg *m, ckptio__CUresult r, const char *call,
                   const char *what)
{
    char e[160];
    return ckptio__fail(m, -EIO,
                        "GPU copy of tensor '%s' failed: %s: %s; the GPU or the tensor is in a "
                        "bad state (check the framework's own errors)",
                        what, call, ckptio__cuda_errstr(g->cu, r, e, sizeof e));
}

void ckptio__gpu_init(ckptio__gpu *g, int mode, uint64_t ring_bytes, uint64_t block)
{
    memset(g, 0, sizeof *g);
    g->mode = mode;
    g->ring_bytes = ring_bytes;
    g->block = block;
    g->gds_fd = -1;
    ckptio__vec_init(&g->registered, sizeof(ckptio__gpu_reg));
    g->st.size = sizeof g->st;
    snprintf(g->st.path, sizeof g->st.path, "none");
}

static void drop_stream(ckptio__gpu *g)
{
    const ckptio__cuda *cu = g->cu;
    if (!g->stream) return;
    cu->StreamSynchronize(g->stream);
    for (unsigned i = 0; i < CKPTIO__GPU_SLOTS; i++) {
        if (g->ev[i]) cu->EventDestroy(g->ev[i]);
        g->ev[i] = NULL;
        g->busy[i] = false;
    }
    if (g->in_ev) cu->EventDestroy(g->in_ev);
    if (g->out_ev) cu->EventDestroy(g->out_ev);
    cu->StreamDestroy(g->stream);
    g->in_ev = g->out_ev = NULL;
    g->stream = NULL;
}

void ckptio__gpu_fini(ckptio__gpu *g)
{
    if (g->cu) {
        /* Closing may happen on another thread (an async commit's): use the stream's context. */
        ckptio__CUcontext cur = NULL;
        g->cu->CtxGetCurrent(&cur);
        if (!cur && g->ctx) g->cu->CtxSetCurrent(g->ctx);
        drop_stream(g);
        if (g->ring) g->cu->MemFreeHost(g->ring);
        g->ring = NULL;
        for (size_t i = 0; i < g->registered.len; i++)
            g->cu->MemHostUnregister(CKPTIO__VEC_AT(&g->registered, ckptio__gpu_reg, i)->base);
        ckptio__gpu_gds_forget(g);
        if (!cur && g->ctx) g->cu->CtxSetCurrent(NULL);
    }
    ckptio__vec_free(&g->registered);
}

/* The pinned ring, made at the first use that needs it. */
static int ring_get(ckptio__gpu *g, ckptio__msg *m, const char *what)
{
    if (g->ring) return 0;
    uint64_t slot = g->ring_bytes / CKPTIO__GPU_SLOTS / g->block * g->block;
    g->slot = CKPTIO__MAX(slot, g->block);
    void *ring = NULL;
    ckptio__CUresult r =
        g->cu->MemHostAlloc(&ring, CKPTIO__GPU_SLOTS * g->slot, CKPTIO__CU_MEMHOSTALLOC_PORTABLE);
    if (r)
        return ckptio__fail(m, -ENOMEM,
                            "cannot pin %llu MiB of host memory for GPU staging (tensor '%s'); "
                            "lower gpu_staging_bytes or raise ulimit -l",
                            (unsigned long long)(CKPTIO__GPU_SLOTS * g->slot >> 20), what);
    g->ring = ring;
    g->st.staging_bytes += CKPTIO__GPU_SLOTS * g->slot;
    return 0;
}

int ckptio__gpu_register(ckptio__gpu *g, void *base, uint64_t len, ckptio__msg *m,
                         const char *what)
{
    for (size_t i = 0; i < g->registered.len; i++)
        if (CKPTIO__VEC_AT(&g->registered, ckptio__gpu_reg, i)->base == base) return 0;
    ckptio__gpu_reg reg = {base, len};
    CKPTIO__TRY(ckptio__vec_push(&g->registered, &reg, 1)); /* room first: never lose a pin */
    if (g->cu->MemHostRegister(base, (size_t)len, CKPTIO__CU_MEMHOSTREGISTER_PORTABLE)) {
        g->registered.len--;
        return ckptio__fail(m, -ENOMEM,
                            "cannot pin the writer's %llu MiB of staging memory for GPU copies "
                            "(tensor '%s'); lower staging_bytes or raise ulimit -l",
                            (unsigned long long)(len >> 20), what);
    }
    g->st.staging_bytes += len;
    return 0;
}

int ckptio__gpu_start(ckptio__gpu *g, uint64_t p, ckptio__msg *m, const char *what)
{
    if (g->mode == CKPTIO_GPU_OFF)
        return ckptio__fail(m, CKPTIO_E_UNSUPPORTED,
                            "tensor '%s' is in GPU memory but GPU transfers are off "
                            "(CKPTIO_GPU=off or params.gpu); copy it to host memory first",
                            what);
    if (!g->cu) {
        const char *why = "the CUDA driver cannot be used";
        g->cu = ckptio__cuda_get(&why);
        if (!g->cu)
            return ckptio__fail(m, CKPTIO_E_UNSUPPORTED,
                                "tensor '%s' is in GPU memory but %s; copy it to host memory "
                                "first",
                                what, why);
    }
    const ckptio__cuda *cu = g->cu;
    ckptio__CUresult r = ckptio__cuda_bind(cu, p);
    if (r) return cu_fail(g, m, r, "making a CUDA context current", what);
    if (!ckptio__cuda_is_device(cu, p))
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "tensor '%s': address %#llx is not GPU memory the CUDA driver knows; "
                            "pass host buffers as CKPTIO_MEM_HOST",
                            what, (unsigned long long)p);
    ckptio__CUcontext cur = NULL;
    if ((r = cu->CtxGetCurrent(&cur))) return cu_fail(g, m, r, "cuCtxGetCurrent", what);
    if (g->stream && cur != g->ctx) drop_stream(g); /* another device's tensor */
    if (!g->stream) {
        g->ctx = cur;
        /* Non-blocking: ckptio's copies never wait for unrelated work on the legacy default
         * stream; they wait only for the caller's stream, through in_ev. */
        if ((r = cu->StreamCreate(&g->stream, CKPTIO__CU_STREAM_NON_BLOCKING))) {
            g->stream = NULL;
            return cu_fail(g, m, r, "cuStreamCreate", what);
        }
        ckptio__CUevent *evs[CKPTIO__GPU_SLOTS + 2] = {&g->in_ev, &g->out_ev};
        for (unsigned i = 0; i < CKPTIO__GPU_SLOTS; i++) evs[2 + i] = &g->ev[i];
        for (unsigned i = 0; i < CKPTIO__GPU_SLOTS + 2; i++)
            if ((r = cu->EventCreate(evs[i], CKPTIO__CU_EVENT_DISABLE_TIMING))) {
                *evs[i] = NULL;
                drop_stream(g);
                return cu_fail(g, m, r, "cuEventCreate", what);
            }
    }
    return g->ring_on_demand ? 0 : ring_get(g, m, what);
}

/* ckptio's stream waits for what the caller queued on `stream` before the call. */
static ckptio__CUresult after_caller(ckptio__gpu *g, uint64_t stream)
{
    ckptio__CUresult r = g->cu->EventRecord(g->in_ev, (ckptio__CUstream)(uintptr_t)stream);
    return r ? r : g->cu->StreamWaitEvent(g->stream, g->in_ev, 0);
}

/* After a failure: nothing of ckptio's may still be copying into or out of the ring. */
static void drain(ckptio__gpu *g)
{
    g->cu->StreamSynchronize(g->stream);
    for (unsigned i = 0; i < CKPTIO__GPU_SLOTS; i++) g->busy[i] = false;
}

int ckptio__gpu_d2h(ckptio__gpu *g, uint64_t src, uint64_t n, uint64_t stream,
                    ckptio__gpu_piece_fn fn, void *ctx, ckptio__msg *m, const char *what)
{
    CKPTIO__TRY(ring_get(g, m, what));
    const ckptio__cuda *cu = g->cu;
    const uint64_t S = g->slot, k = (n + S - 1) / S;
    ckptio__CUresult r = after_caller(g, stream);
    const char *call = "waiting for the caller's stream";
    uint64_t issued = 0, done = 0;
    int rc = 0;
    /* The slots a host-to-device copy may still read: wait before overwriting them. */
    for (unsigned i = 0; !r && i < CKPTIO__GPU_SLOTS; i++)
        if (g->busy[i] && !(r = cu->EventSynchronize(g->ev[i]))) g->busy[i] = false;
    while (!r && done < k) {
        /* Keep every slot copying: up to CKPTIO__GPU_SLOTS pieces ahead of the consumer. */
        for (; issued < k && issued - done < CKPTIO__GPU_SLOTS; issued++) {
            unsigned s = (unsigned)(issued % CKPTIO__GPU_SLOTS);
            uint64_t len = CKPTIO__MIN(S, n - issued * S);
            call = "cuMemcpyDtoHAsync";
            if ((r = cu->MemcpyDtoHAsync(g->ring + s * S, src + issued * S, len, g->stream)))
                break;
            call = "cuEventRecord";
            if ((r = cu->EventRecord(g->ev[s], g->stream))) break;
        }
        if (r) break;
        unsigned s = (unsigned)(done % CKPTIO__GPU_SLOTS);
        call = "waiting for a device-to-host copy";
        if ((r = cu->EventSynchronize(g->ev[s]))) break;
        uint64_t len = CKPTIO__MIN(S, n - done * S);
        if ((rc = fn(ctx, g->ring + s * S, len, done * S)) < 0) break;
        done++;
    }
    if (r || rc < 0) {
        drain(g);
        return r ? cu_fail(g, m, r, call, what) : rc;
    }
    return 0;
}

int ckptio__gpu_d2h_to(ckptio__gpu *g, uint64_t src, uint64_t n, uint64_t stream,
                       ckptio__gpu_dest_fn dest, ckptio__gpu_piece_fn fn, void *ctx,
                       ckptio__msg *m, const char *what)
{
    const ckptio__cuda *cu = g->cu;
    struct {
        uint8_t *host;
        uint64_t len, at;
    } q[CKPTIO__GPU_SLOTS];
    ckptio__CUresult r = after_caller(g, stream);
    const char *call = "waiting for the caller's stream";
    uint64_t at = 0, issued = 0, done = 0;
    int rc = 0;
    /* An event slot a host-to-device copy may still use: wait before recording on it. */
    for (unsigned i = 0; !r && i < CKPTIO__GPU_SLOTS; i++)
        if (g->busy[i] && !(r = cu->EventSynchronize(g->ev[i]))) g->busy[i] = false;
    while (!r && rc >= 0 && (at < n || done < issued)) {
        /* Queue pieces while there is room, up to CKPTIO__GPU_SLOTS ahead of the consumer. */
        while (at < n && issued - done < CKPTIO__GPU_SLOTS) {
            unsigned s = (unsigned)(issued % CKPTIO__GPU_SLOTS);
            if ((rc = dest(ctx, at, n - at, &q[s].host, &q[s].len)) != 0) break;
            assert(q[s].len > 0 && q[s].len <= n - at);
            q[s].at = at;
            call = "cuMemcpyDtoHAsync";
            if ((r = cu->MemcpyDtoHAsync(q[s].host, src + at, q[s].len, g->stream))) break;
            call = "cuEventRecord";
            if ((r = cu->EventRecord(g->ev[s], g->stream))) break;
            at += q[s].len;
            issued++;
        }
        if (r || rc < 0) break;
        if (done == issued) { /* no room and nothing in flight that could make some */
            rc = ckptio__fail(m, -EIO, "internal error: no room to land tensor '%s'", what);
            break;
        }
        rc = 0;
        unsigned s = (unsigned)(done % CKPTIO__GPU_SLOTS);
        call = "waiting for a device-to-host copy";
        if ((r = cu->EventSynchronize(g->ev[s]))) break;
        if ((rc = fn(ctx, q[s].host, q[s].len, q[s].at)) < 0) break;
        done++;
    }
    if (r || rc < 0) {
        drain(g);
        return r ? cu_fail(g, m, r, call, what) : rc;
    }
    return 0;
}

int ckptio__gpu_h2d(ckptio__gpu *g, uint64_t dst, uint64_t n, uint64_t stream,
                    ckptio__gpu_fill_fn fn, void *ctx, ckptio__msg *m, const char *what)
{
    CKPTIO__TRY(ring_get(g, m, what));
    const ckptio__cuda *cu = g->cu;
    const uint64_t S = g->slot;
    ckptio__CUresult r = after_caller(g, stream);
    const char *call = "waiting for the caller's stream";
    int rc = 0;
    for (uint64_t at = 0, len = 0; !r && at < n; at += len) {
        unsigned s = (unsigned)(g->next++ % CKPTIO__GPU_SLOTS);
        call = "waiting for a host-to-device copy";
        if (g->busy[s] && (r = cu->EventSynchronize(g->ev[s]))) break;
        g->busy[s] = false;
        int64_t got = fn(ctx, g->ring + s * S, CKPTIO__MIN(S, n - at), at);
        if (got <= 0) {
            rc = got < 0 ? (int)got : -EIO;
            break;
        }
        len = (uint64_t)got;
        call = "cuMemcpyHtoDAsync";
        if ((r = cu->MemcpyHtoDAsync(dst + at, g->ring + s * S, len, g->stream))) break;
        call = "cuEventRecord";
        if ((r = cu->EventRecord(g->ev[s], g->stream))) break;
        g->busy[s] = true;
    }
    if (!r && rc == 0) {
        call = "making the caller's stream wait for ckptio's copies";
        if (!(r = cu->EventRecord(g->out_ev, g->stream)))
            r = cu->StreamWaitEvent((ckptio__CUstream)(uintptr_t)stream, g->out_ev, 0);
        if (!r && !stream) {
            call = "waiting for ckptio's copies";
            if (!(r = cu->StreamSynchronize(g->stream)))
                for (unsigned i = 0; i < CKPTIO__GPU_SLOTS; i++) g->busy[i] = false;
        }
    }
    if (r || rc < 0) {
        drain(g);
        return r ? cu_fail(g, m, r, call, what) : rc;
    }
    return 0;
}

int ckptio__gpu_wait_caller(ckptio__gpu *g, uint64_t stream, ckptio__msg *m, const char *what)
{
    ckptio__CUresult r = g->cu->EventRecord(g->in_ev, (ckptio__CUstream)(uintptr_t)stream);
    if (!r) r = g->cu->EventSynchronize(g->in_ev);
    return r ? cu_fail(g, m, r, "waiting for the caller's stream", what) : 0;
}

bool ckptio__gpu_gds_file(ckptio__gpu *g, int fd, int direct)
{
    if (g->mode != CKPTIO_GPU_AUTO && g->mode != CKPTIO_GPU_GDS) return false; /* staged */
    if (g->gds_fd == fd) return g->gds_ok;
    ckptio__gpu_gds_forget(g);
    g->gds_fd = fd;
    g->gds_ok = false;
    const char *why = "cuFile cannot be used";
    if (!g->cf && !(g->cf = ckptio__cufile_get(&why))) {
        snprintf(g->st.reason, sizeof g->st.reason, "%s", why);
        return false;
    }
    if (!direct) {
        snprintf(g->st.reason, sizeof g->st.reason,
                 "the data file is not open with O_DIRECT, which cuFile needs");
        return false;
    }
    ckptio__CUfileDescr d;
    memset(&d, 0, sizeof d);
    d.type = CKPTIO__CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    ckptio__CUfileError e = g->cf->HandleRegister(&g->gds_fh, &d);
    if (e.err) {
        g->gds_fh = NULL;
        snprintf(g->st.reason, sizeof g->st.reason,
                 "cuFileHandleRegister refused the data file (cuFile error %d): its file "
                 "system does not support GDS",
                 e.err);
        return false;
    }
    g->gds_ok = true;
    return true;
}

void ckptio__gpu_gds_forget(ckptio__gpu *g)
{
    if (g->gds_fh) g->cf->HandleDeregister(g->gds_fh);
    g->gds_fh = NULL;
    g->gds_fd = -1;
    g->gds_ok = false;
}

int ckptio__gpu_gds_io(ckptio__gpu *g, bool write, uint64_t p, uint64_t n, uint64_t off,
                       ckptio__msg *m, const char *label)
{
    uint64_t done = 0;
    while (done < n) {
        /* cuFile moves at most about 2 GiB per call, like pread. */
        size_t len = (size_t)CKPTIO__MIN(n - done, (uint64_t)1 << 30);
        ssize_t k = write ? g->cf->Write(g->gds_fh, (const void *)(uintptr_t)p, len,
                                         (off_t)(off + done), (off_t)done)
                          : g->cf->Read(g->gds_fh, (void *)(uintptr_t)p, len,
                                        (off_t)(off + done), (off_t)done);
        if (k <= 0) {
            /* -1 sets errno; other negatives are cuFile's own codes. */
            int rc = k == 0 ? -EIO : k == -1 ? -errno : -EIO;
            return ckptio__fail(m, rc,
                                "GDS %s of %llu bytes at offset %llu of '%s' failed (cuFile "
                                "returned %lld); set CKPTIO_GPU=staged to avoid GDS",
                                write ? "write" : "read", (unsigned long long)len,
                                (unsigned long long)(off + done), label, (long long)k);
        }
        done += (uint64_t)k;
    }
    ckptio__gpu_count(g, true, n);
    return 0;
}

void ckptio__gpu_count(ckptio__gpu *g, bool gds, uint64_t n)
{
    g->st.device_bytes += n;
    if (gds) g->st.gds_bytes += n;
    bool any_gds = g->st.gds_bytes > 0, any_staged = g->st.device_bytes > g->st.gds_bytes;
    snprintf(g->st.path, sizeof g->st.path, "%s",
             any_gds && any_staged ? "gds+staged" : any_gds ? "gds" : "staged");
}

void ckptio__gpu_stats(const ckptio__gpu *g, ckptio_gpu_stats *out)
{
    uint32_t size = out->size;
    ckptio_gpu_stats s = g->st;
    s.size = size;
    memcpy(out, &s, CKPTIO__MIN((size_t)size, sizeof s));
}

void ckptio__gpu_split_init(ckptio__gpu_split *s, const uint64_t *shape, uint32_t ndim,
                            uint64_t esize, uint64_t max)
{
    memset(s, 0, sizeof *s);
    s->ndim = ndim;
    uint64_t inner = esize;
    for (uint32_t i = 0; i < ndim; i++) {
        s->shape[i] = shape[i];
        if (!shape[i]) s->done = true;
    }
    /* d: the outermost dimension whose rows (all of the dimensions after it) fit in max. */
    s->d = ndim;
    while (s->d > 0 && inner * s->shape[s->d - 1] <= max) inner *= s->shape[--s->d];
    if (s->d == 0) {
        s->rows = 0; /* the whole box fits: one piece */
        return;
    }
    s->d--; /* inner: bytes of one row of dimension d */
    s->rows = CKPTIO__MAX(max / inner, (uint64_t)1);
}

bool ckptio__gpu_split_next(ckptio__gpu_split *s, uint64_t *off, uint64_t *shape,
                            uint64_t *bytes, uint64_t esize)
{
    if (s->done) return false;
    uint64_t b = esize;
    if (!s->rows) { /* one piece: the whole box */
        for (uint32_t i = 0; i < s->ndim; i++) {
            off[i] = 0;
            shape[i] = s->shape[i];
            b *= s->shape[i];
        }
        *bytes = b;
        s->done = true;
        return true;
    }
    uint32_t d = s->d;
    for (uint32_t i = 0; i < s->ndim; i++) {
        off[i] = i <= d ? s->idx[i] : 0;
        shape[i] = i < d ? 1 : i == d ? CKPTIO__MIN(s->rows, s->shape[d] - s->idx[d]) : s->shape[i];
        b *= shape[i];
    }
    *bytes = b;
    /* Advance: along d, then carry through the outer dimensions. */
    s->idx[d] += shape[d];
    for (uint32_t i = d + 1; i-- > 0;) {
        if (s->idx[i] < s->shape[i]) return true;
        if (i == 0) break;
        s->idx[i] = 0;
        s->idx[i - 1]++;
    }
    s->done = true;
    return true;
}
