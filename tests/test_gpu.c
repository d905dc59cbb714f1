/* SPDX-License-Identifier: Apache-2.0 */
/* GPU memory: the staged pipeline and GDS against the test-only driver stand-in, or a GPU. */
/* By default every test loads tests/gpu_standin.c's library through ckptio's own dlopen path
 * (CKPTIO_CUDA_LIBRARY). With CKPTIO_TEST_REAL_GPU=1 (make test-gpu) the tests that need no
 * failure injection run against the real driver instead; the others are skipped there. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPTIO_EXPERIMENTAL
#include "../src/ranks/comm.h"
#include "../src/gpu/staged.h"
#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "../src/write/writer.h"
#include "model.h"
#include "test.h"

typedef unsigned long long devptr;
typedef struct standin_stats {
    long pinned_now, pinned_peak, streams_live, events_live, max_ahead, copies;
    long registered_now, registered_peak, dtoh_registered, dtoh_allocated;
} standin_stats;

/* The device under test: the stand-in's hooks, or the real driver's calls that do the same. */
static struct {
    int real;
    void *lib;
    void *(*malloc_)(size_t);
    void (*free_)(void *);
    void (*fill)(void *s, void *p, int byte, size_t n, unsigned delay_us);
    void (*copy)(void *s, void *dst, const void *src, size_t n);
    void *(*stream)(void);
    void (*sync)(void *s);
    void (*stats)(standin_stats *);
    /* real driver */
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuMemAlloc)(devptr *, size_t);
    int (*cuMemFree)(devptr);
    int (*cuMemsetD8Async)(devptr, unsigned char, size_t, void *);
    int (*cuMemcpyDtoH)(void *, devptr, size_t);
    int (*cuMemcpyHtoD)(devptr, const void *, size_t);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamSynchronize)(void *);
    int (*cuPointerGetAttribute)(void *, int, devptr);
} D;

#define SYM(f, name) *(void **)&D.f = dlsym(D.lib, name)

/* 0, or T_SKIP when this test needs the stand-in and runs on a real GPU. */
static int dev_open(int needs_standin)
{
    const char *real = getenv("CKPTIO_TEST_REAL_GPU");
    D.real = real && *real == '1';
    if (D.real) {
        if (needs_standin) return T_SKIP;
        D.lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!D.lib) return T_SKIP;
        SYM(cuInit, "cuInit");
        SYM(cuDeviceGet, "cuDeviceGet");
        SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
        SYM(cuMemAlloc, "cuMemAlloc_v2");
        SYM(cuMemFree, "cuMemFree_v2");
        SYM(cuMemsetD8Async, "cuMemsetD8Async");
        SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
        SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
        SYM(cuStreamCreate, "cuStreamCreate");
        SYM(cuStreamSynchronize, "cuStreamSynchronize");
        SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
        int dev;
        void *ctx;
        if (D.cuInit(0) || D.cuDeviceGet(&dev, 0) || D.cuDevicePrimaryCtxRetain(&ctx, dev) ||
            D.cuCtxSetCurrent(ctx))
            return T_SKIP;
        return 0;
    }
    setenv("CKPTIO_CUDA_LIBRARY", CKPTIO_GPU_STANDIN, 1);
    setenv("CKPTIO_CUFILE_LIBRARY", CKPTIO_GPU_STANDIN, 1);
    D.lib = dlopen(CKPTIO_GPU_STANDIN, RTLD_NOW);
    if (!D.lib) {
        fprintf(stderr, "cannot load the stand-in: %s\n", dlerror());
        return 1;
    }
    SYM(malloc_, "standin_malloc");
    SYM(free_, "standin_free");
    SYM(fill, "standin_fill");
    SYM(copy, "standin_copy");
    SYM(stream, "standin_stream");
    SYM(sync, "standin_sync");
    SYM(stats, "standin_get_stats");
    return 0;
}

static void *dev_alloc(size_t n)
{
    if (!D.real) return D.malloc_(n);
    devptr p = 0;
    return D.cuMemAlloc(&p, n ? n : 1) ? NULL : (void *)(uintptr_t)p;
}
static void dev_free(void *p)
{
    if (D.real) D.cuMemFree((devptr)(uintptr_t)p);
    else D.free_(p);
}
static void dev_put(void *dst, const void *src, size_t n)
{
    if (D.real) D.cuMemcpyHtoD((devptr)(uintptr_t)dst, src, n);
    else memcpy(dst, src, n);
}
static void dev_get(void *dst, const void *src, size_t n)
{
    if (D.real) D.cuMemcpyDtoH(dst, (devptr)(uintptr_t)src, n);
    else memcpy(dst, src, n);
}
static void *dev_stream(void)
{
    void *s = NULL;
    if (D.real) D.cuStreamCreate(&s, 1);
    else s = D.stream();
    return s;
}
static void dev_sync(void *s)
{
    if (D.real) D.cuStreamSynchronize(s);
    else D.sync(s);
}
/* A slow "kernel" writing `byte` over the buffer on stream s. */
static void dev_fill_async(void *s, void *p, int byte, size_t n)
{
    if (D.real) D.cuMemsetD8Async((devptr)(uintptr_t)p, (unsigned char)byte, n, s);
    else D.fill(s, p, byte, n, 100000);
}

static void params_small(ckptio_params *p)
{
    ckptio_params_init(p);
    p->request_bytes = 1 << 20;     /* checksum blocks of 1 MiB */
    p->gpu_staging_bytes = 4 << 20; /* four 1 MiB slots */
}

/* dev_open with the stand-in's cuFile driver opening, and small params. */
static int gds_open(int needs_standin, ckptio_params *p)
{
    setenv("CKPTIO_STANDIN_GDS", "1", 1);
    params_small(p);
    return dev_open(needs_standin);
}

/* n pseudo-random bytes (seed) in device memory; *host gets a malloc'd copy. */
static void *dev_random(size_t n, uint64_t seed, uint8_t **host)
{
    *host = malloc(n);
    t_fill(*host, n, seed);
    void *d = dev_alloc(n);
    if (d) dev_put(d, *host, n);
    return d;
}

/* Save a few tensors from device memory, one from host memory; load them back to the host and
 * to the device; every byte equal; pinned memory bounded by the ring; copies overlap, at most
 * four ahead of the writes. */
static int test_gpu_staged_roundtrip(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    const size_t big = (10u << 20) + 3, small = 100;
    uint8_t *hb = malloc(big), *hs = malloc(small), *back = malloc(big);
    t_fill(hb, big, 1);
    t_fill(hs, small, 2);
    void *db = dev_alloc(big), *ds = dev_alloc(small);
    CHECK(db && ds);
    dev_put(db, hb, big);
    dev_put(ds, hs, small);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    uint64_t sb[2] = {(10u << 20) + 3, 1}, ss[1] = {small / 4};
    CHECK_OK(ckptio_writer_add_mem(w, "big", CKPTIO_DT_U8, 2, sb, NULL, NULL, db, big,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_add_mem(w, "small", CKPTIO_DT_F32, 1, ss, NULL, NULL, ds, small,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_add(w, "host", CKPTIO_DT_U8, 1, (uint64_t[]){small}, NULL, NULL, hs,
                               small));
    ckptio_gpu_stats gs = {.size = sizeof gs};
    CHECK_OK(ckptio_writer_gpu_stats(w, &gs));
    CHECK(!strcmp(gs.path, "staged") || !strcmp(gs.path, "gds+staged"));
    CHECK(gs.device_bytes == big + small);
    CHECK(gs.staging_bytes == 64u << 20); /* its staging windows (default), registered; no ring */
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_read_tensor(r, "big", back, big));
    CHECK(!memcmp(back, hb, big));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    /* Into device memory: the whole tensor, then rows 3..9 of it (a sub-box). */
    void *dd = dev_alloc(big);
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .name = "big",
                         .dst = dd, .capacity = big};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    memset(back, 0, big);
    dev_get(back, dd, big);
    CHECK(!memcmp(back, hb, big));
    uint64_t off[2] = {3, 0}, shp[2] = {7, 1};
    ckptio_region sub = {.size = sizeof sub, .memory = CKPTIO_MEM_CUDA, .name = "big",
                         .offset = off, .shape = shp, .dst = dd, .capacity = 7};
    ckptio_region both[2] = {sub, {.size = sizeof sub, .memory = CKPTIO_MEM_CUDA,
                                   .name = "small", .dst = ds, .capacity = small}};
    dev_put(ds, (uint8_t[100]){0}, small);
    CHECK_OK(ckptio_reader_read(r, both, 2));
    dev_get(back, dd, 7);
    CHECK(!memcmp(back, hb + 3, 7));
    dev_get(back, ds, small);
    CHECK(!memcmp(back, hs, small));
    CHECK_OK(ckptio_reader_gpu_stats(r, &gs));
    CHECK(gs.device_bytes == big + 7 + small);
    ckptio_reader_close(r);
    if (!D.real) {
        standin_stats st;
        D.stats(&st);
        printf("pinned peak %ld, copies ahead at most %ld\n", st.pinned_peak, st.max_ahead);
        CHECK(st.pinned_peak == 4 << 20); /* the reader's ring; the writer has none */
        CHECK(st.registered_peak == 64 << 20 && st.dtoh_allocated == 0);
        CHECK(st.pinned_now == 0 && st.registered_now == 0 && st.streams_live == 0 &&
              st.events_live == 0);
        CHECK(st.max_ahead >= 2 && st.max_ahead <= 4); /* overlap, and back-pressure */
    }
    dev_free(db);
    dev_free(ds);
    dev_free(dd);
    free(hb);
    free(hs);
    free(back);
    return 0;
}

/* The staged save makes no host-to-host copy: every device-to-host copy lands in the writer's
 * registered staging windows (none in a ring), the writes go out from that memory, the GPU
 * path memcpy's nothing, and every byte reads back equal. Tensors of every kind of placement:
 * several windows with an unaligned end, one starting mid-window whose rest is not whole
 * checksum blocks, small ones packed (some would straddle a window end) and medium ones, with
 * four windows in all, so that the pipeline waits for windows to come back. On a GPU, "the
 * writes go out from registered memory" is the driver's own answer (its memory type for the
 * first and last byte of each write is pinned host memory), the copies' destinations are not
 * seen, and the stand-in's counts are not there. */
static long reg_written;
static int (*is_registered)(const void *, size_t);
static int no_leaks(void);
static int driver_pinned(const void *p)
{
    unsigned type = 0;
    return !D.cuPointerGetAttribute(&type, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */,
                                    (devptr)(uintptr_t)p) &&
           type == 1; /* CU_MEMORYTYPE_HOST */
}
static int driver_registered(const void *p, size_t n)
{
    return n && driver_pinned(p) && driver_pinned((const char *)p + n - 1);
}
static void count_registered(ckptio__req *r)
{
    if (r->op != CKPTIO__OP_WRITE || r->res < 0) return;
    if (is_registered(r->buf, r->len))
        __atomic_fetch_add(&reg_written, (long)r->len, __ATOMIC_RELAXED);
}

static int test_gpu_staged_no_host_copy(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    if (D.real) {
        CHECK(D.cuPointerGetAttribute != NULL);
        is_registered = driver_registered;
    } else {
        *(void **)&is_registered = dlsym(D.lib, "standin_is_registered");
    }
    CHECK(is_registered != NULL);
    ckptio_params p;
    params_small(&p);
    p.gpu = CKPTIO_GPU_STAGED;
    p.staging_bytes = 4u << 20; /* four 1 MiB windows */
    ckptio__vfs v = ckptio__vfs_real;
    v.req_done = count_registered;
    ckptio__vfs_set(&v);
    enum { SMALL = 700 };
    const size_t sizes[] = {(5u << 20) + 100, 100, 6000, (3u << 20) + 7, 3000};
    const size_t nt = sizeof sizes / sizeof *sizes;
    size_t total = 0;
    for (size_t i = 0; i < nt; i++) total += sizes[i];
    total += SMALL * 3000;
    uint8_t *h;
    uint8_t *d = dev_random(total, 21, &h);
    CHECK(d != NULL && !is_registered(h, total)); /* the question can be answered "no" */
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    size_t at = 0;
    char name[16];
    for (size_t i = 0; i < nt + SMALL; i++) {
        size_t n = i < nt ? sizes[i] : 3000;
        snprintf(name, sizeof name, "t%zu", i);
        CHECK_OK(ckptio_writer_add_mem(w, name, CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL,
                                       d + at, n, CKPTIO_MEM_CUDA, 0));
        at += n;
    }
    CHECK(w->gpu.host_copied == 0);
    ckptio_gpu_stats gs = {.size = sizeof gs};
    CHECK_OK(ckptio_writer_gpu_stats(w, &gs));
    CHECK(!strcmp(gs.path, "staged") && gs.device_bytes == total);
    CHECK(gs.staging_bytes == 4u << 20);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio__vfs_set(NULL);
    printf("%ld B of %zu written from registered memory\n", reg_written, total);
    CHECK(reg_written >= (long)total);
    if (!D.real) {
        standin_stats st;
        D.stats(&st);
        printf("device-to-host: %ld B into registered windows, %ld B elsewhere; copies ahead at "
               "most %ld\n",
               st.dtoh_registered, st.dtoh_allocated, st.max_ahead);
        CHECK(st.dtoh_registered == (long)total && st.dtoh_allocated == 0);
        CHECK(st.pinned_peak == 0 && st.registered_peak == 4 << 20);
        CHECK(st.max_ahead >= 2 && st.max_ahead <= 4);
        CHECK(no_leaks());
    }
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    uint8_t *back = malloc(sizes[0]);
    at = 0;
    for (size_t i = 0; i < nt + SMALL; i++) {
        size_t n = i < nt ? sizes[i] : 3000;
        snprintf(name, sizeof name, "t%zu", i);
        CHECK_OK(ckptio_reader_read_tensor(r, name, back, n));
        CHECK(!memcmp(back, h + at, n));
        at += n;
    }
    ckptio_reader_close(r);
    dev_free(d);
    free(h);
    free(back);
    return 0;
}

/* ckptio reads a tensor only after the work queued before the call on the caller's stream
 * (here a slow "kernel" rewriting it), and loaded data is there for work queued after. */
static int test_gpu_stream_order(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    const size_t n = 3u << 20;
    uint8_t *h = malloc(n), *back = malloc(n);
    void *d = dev_alloc(n), *s = dev_stream();
    memset(h, 0xAA, n);
    dev_put(d, h, n);
    dev_fill_async(s, d, 0x55, n);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add_mem(w, "t", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL, d, n,
                                   CKPTIO_MEM_CUDA, (uint64_t)(uintptr_t)s));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_read_tensor(r, "t", back, n));
    memset(h, 0x55, n);
    CHECK(!memcmp(back, h, n));
    /* Load with the caller's stream: a copy queued on it afterwards sees the loaded bytes. */
    dev_fill_async(s, d, 0x11, n);
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .name = "t", .dst = d,
                         .capacity = n, .stream = (uint64_t)(uintptr_t)s};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    memset(back, 0, n);
    if (D.real) {
        dev_sync(s);
        dev_get(back, d, n);
    } else {
        void *out = D.malloc_(n); /* the stand-in copies between any of its buffers */
        D.copy(s, out, d, n);
        dev_sync(s);
        memcpy(back, out, n);
        D.free_(out);
    }
    CHECK(!memcmp(back, h, n));
    ckptio_reader_close(r);
    free(h);
    free(back);
    dev_free(d);
    return 0;
}

static int no_leaks(void)
{
    standin_stats st;
    D.stats(&st);
    if (st.pinned_now || st.registered_now || st.streams_live || st.events_live) {
        fprintf(stderr, "leak: pinned %ld B, registered %ld B, %ld streams, %ld events\n",
                st.pinned_now, st.registered_now, st.streams_live, st.events_live);
        return 0;
    }
    return 1;
}

/* A device-to-host copy failing half-way through a tensor fails the save cleanly: the add
 * names the tensor, the writer is poisoned, nothing is published, the ring is drained and
 * released. */
static int test_gpu_copy_fails(void)
{
    setenv("CKPTIO_STANDIN_FAIL_COPY", "5", 1);
    int rc = dev_open(1);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    const size_t n = 9u << 20;
    void *d = dev_alloc(n);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_ERR(ckptio_writer_add_mem(w, "weights", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL,
                                    d, n, CKPTIO_MEM_CUDA, 0),
              -EIO);
    printf("%s\n", ckptio_writer_errmsg(w));
    CHECK(t_contains(ckptio_writer_errmsg(w), "weights"));
    CHECK(t_contains(ckptio_writer_errmsg(w), "illegal memory access"));
    CHECK_ERR(ckptio_writer_commit(w), -EIO);
    ckptio_writer_close(w);
    struct stat st;
    CHECK(stat(t_path("ck"), &st) < 0 && errno == ENOENT);
    CHECK(no_leaks());
    dev_free(d);
    return 0;
}

/* The pinned ring cannot be allocated: a clean refusal, nothing published, no leak. */
static int test_gpu_pin_fails(void)
{
    setenv("CKPTIO_STANDIN_FAIL_ALLOC", "1", 1);
    int rc = dev_open(1);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    void *d = dev_alloc(4096);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_ERR(ckptio_writer_add_mem(w, "t", CKPTIO_DT_U8, 1, (uint64_t[]){4096}, NULL, NULL, d,
                                    4096, CKPTIO_MEM_CUDA, 0),
              -ENOMEM);
    CHECK(t_contains(ckptio_writer_errmsg(w), "pin"));
    ckptio_writer_close(w);
    CHECK(no_leaks());
    dev_free(d);
    return 0;
}

/* ENOSPC while GPU pieces are still copying: the save fails with -ENOSPC, nothing published,
 * the ring drained and released. */
static int enospc_nth;
static int enospc_seen;
static void enospc_done(ckptio__req *r)
{
    if (r->op == CKPTIO__OP_WRITE && ++enospc_seen == enospc_nth && r->res >= 0)
        r->res = -ENOSPC;
}
static int test_gpu_enospc(void)
{
    int rc = dev_open(1);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    p.backend = CKPTIO_BACKEND_PSYNC;
    p.staging_bytes = 2u << 20; /* two write buffers: the add itself must reap the failure */
    ckptio__vfs v = ckptio__vfs_real;
    v.req_done = enospc_done;
    enospc_nth = 2;
    ckptio__vfs_set(&v);
    const size_t n = 12u << 20;
    void *d = dev_alloc(n);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    int a = ckptio_writer_add_mem(w, "t", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL, d, n,
                                  CKPTIO_MEM_CUDA, 0);
    printf("add %d: %s\n", a, ckptio_writer_errmsg(w));
    CHECK_ERR(a, -ENOSPC);
    CHECK(t_contains(ckptio_writer_errmsg(w), "'t'"));
    CHECK_ERR(ckptio_writer_commit(w), -ENOSPC);
    ckptio_writer_close(w);
    ckptio__vfs_set(NULL);
    struct stat st;
    CHECK(stat(t_path("ck"), &st) < 0 && errno == ENOENT);
    CHECK(no_leaks());
    dev_free(d);
    return 0;
}

/* No driver: a GPU buffer is refused (CKPTIO_E_UNSUPPORTED, saying why), the writer stays
 * usable, host tensors save as always, and the probe says so. */
static int test_gpu_no_driver(void)
{
    setenv("CKPTIO_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    int x = 1;
    CHECK_ERR(ckptio_writer_add_mem(w, "g", CKPTIO_DT_I32, 0, NULL, NULL, NULL, &x, 4,
                                    CKPTIO_MEM_CUDA, 0),
              CKPTIO_E_UNSUPPORTED);
    CHECK(t_contains(ckptio_writer_errmsg(w), "not installed"));
    CHECK_OK(ckptio_writer_add(w, "h", CKPTIO_DT_I32, 0, NULL, NULL, NULL, &x, 4));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .name = "h", .dst = &x,
                         .capacity = 4};
    CHECK_ERR(ckptio_reader_read(r, &reg, 1), CKPTIO_E_UNSUPPORTED);
    ckptio_reader_close(r);
    char why[512];
    CHECK(ckptio_gpu_probe(t_dir(), NULL, why, sizeof why) == CKPTIO_GPU_OFF);
    CHECK(t_contains(why, "not installed"));
    /* The route: auto means a host copy, saying why; a path asked for by name is refused. */
    CHECK(ckptio_gpu_route(t_dir(), NULL, why, sizeof why) == CKPTIO_GPU_OFF);
    CHECK(t_contains(why, "not installed"));
    ckptio_params p;
    ckptio_params_init(&p);
    p.gpu = CKPTIO_GPU_STAGED;
    CHECK_ERR(ckptio_gpu_route(t_dir(), &p, why, sizeof why), CKPTIO_E_UNSUPPORTED);
    CHECK(t_contains(why, "gpu=staged asks") && t_contains(why, "not installed"));
    CHECK(ckptio_gpu_probe(t_dir(), &p, why, sizeof why) == CKPTIO_GPU_OFF);
    setenv("CKPTIO_GPU", "gds", 1);
    CHECK_ERR(ckptio_gpu_route(t_dir(), &p, why, sizeof why), CKPTIO_E_UNSUPPORTED);
    CHECK(t_contains(why, "CKPTIO_GPU=gds asks"));
    setenv("CKPTIO_GPU", "off", 1);
    CHECK(ckptio_gpu_route(t_dir(), &p, why, sizeof why) == CKPTIO_GPU_OFF);
    CHECK(!strcmp(why, "CKPTIO_GPU=off"));
    unsetenv("CKPTIO_GPU");
    p.gpu = CKPTIO_GPU_OFF;
    CHECK(ckptio_gpu_route(t_dir(), &p, why, sizeof why) == CKPTIO_GPU_OFF);
    CHECK(!strcmp(why, "gpu=off"));
    return 0;
}

/* CKPTIO_GPU: off refuses GPU buffers, an unknown value fails the open, staged skips GDS; a
 * host pointer passed as GPU memory is refused. */
static int test_gpu_modes(void)
{
    int rc = dev_open(1);
    if (rc) return rc;
    void *d = dev_alloc(64);
    ckptio_writer *w;
    setenv("CKPTIO_GPU", "bogus", 1);
    CHECK_ERR(ckptio_writer_open(&w, t_path("ck"), NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "CKPTIO_GPU"));
    setenv("CKPTIO_GPU", "off", 1);
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_ERR(ckptio_writer_add_mem(w, "g", CKPTIO_DT_U8, 1, (uint64_t[]){64}, NULL, NULL, d, 64,
                                    CKPTIO_MEM_CUDA, 0),
              CKPTIO_E_UNSUPPORTED);
    CHECK(t_contains(ckptio_writer_errmsg(w), "off"));
    ckptio_writer_close(w);
    setenv("CKPTIO_GPU", "bogus", 1);
    char why[512];
    CHECK_ERR(ckptio_gpu_route(t_dir(), NULL, why, sizeof why), CKPTIO_E_USAGE);
    CHECK(t_contains(why, "CKPTIO_GPU='bogus'"));
    setenv("CKPTIO_GPU", "staged", 1);
    CHECK(ckptio_gpu_probe(t_dir(), NULL, why, sizeof why) == CKPTIO_GPU_STAGED);
    CHECK(ckptio_gpu_route(t_dir(), NULL, why, sizeof why) == CKPTIO_GPU_STAGED);
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint8_t host[64];
    CHECK_ERR(ckptio_writer_add_mem(w, "h", CKPTIO_DT_U8, 1, (uint64_t[]){64}, NULL, NULL, host,
                                    64, CKPTIO_MEM_CUDA, 0),
              CKPTIO_E_USAGE);
    CHECK_OK(ckptio_writer_add_mem(w, "g", CKPTIO_DT_U8, 1, (uint64_t[]){64}, NULL, NULL, d, 64,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    dev_free(d);
    return 0;
}

/* GDS through the stand-in's cuFile (pwrite/pread from "device" memory): the same format,
 * checksums from a staged copy, a damaged byte caught on a GDS load; where the data file is
 * not O_DIRECT, the fallback to staged says why. */
static int test_gpu_gds(void)
{
    ckptio_params p;
    int rc = gds_open(0, &p);
    if (rc) return rc;
    const size_t n = 6u << 20;
    uint8_t *h, *back = malloc(n);
    void *d = dev_random(n, 7, &h);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add_mem(w, "t", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL, d, n,
                                   CKPTIO_MEM_CUDA, 0));
    ckptio_stats s;
    CHECK_OK(ckptio_writer_stats(w, &s));
    ckptio_gpu_stats gs = {.size = sizeof gs};
    CHECK_OK(ckptio_writer_gpu_stats(w, &gs));
    printf("direct %d: path %s, gds %llu B, reason '%s'\n", s.direct, gs.path,
           (unsigned long long)gs.gds_bytes, gs.reason);
    if (D.real) /* cuFile may or may not take this file system: either way, say which */
        CHECK((!strcmp(gs.path, "gds") && gs.gds_bytes == n) ||
              (!strcmp(gs.path, "staged") && gs.reason[0]));
    else if (s.direct)
        CHECK(!strcmp(gs.path, "gds") && gs.gds_bytes == n);
    else
        CHECK(!strcmp(gs.path, "staged") && t_contains(gs.reason, "O_DIRECT"));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_verify(r, NULL)); /* checksums of a GDS write: from the staged copy */
    void *dd = dev_alloc(n);
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .name = "t", .dst = dd,
                         .capacity = n};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    dev_get(back, dd, n);
    CHECK(!memcmp(back, h, n));
    ckptio_reader_close(r);
    if (!D.real && s.direct) {
        /* One damaged byte: the GDS load verifies its staged copy and says where. */
        int fd = open(t_path("ck/data/000000.ckd"), O_RDWR);
        CHECK(fd >= 0);
        uint8_t b;
        CHECK(pread(fd, &b, 1, 5 << 20) == 1);
        b ^= 1;
        CHECK(pwrite(fd, &b, 1, 5 << 20) == 1);
        close(fd);
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
        CHECK_ERR(ckptio_reader_read(r, &reg, 1), CKPTIO_E_CHECKSUM);
        CHECK(t_contains(ckptio_reader_errmsg(r), "GDS"));
        ckptio_reader_close(r);
    }
    dev_free(d);
    dev_free(dd);
    free(h);
    free(back);
    return 0;
}

/* GDS into a writer that starts a new data file per chunk: each file gets its own cuFile
 * handle, never the previous file's (whose descriptor number the new file may reuse). */
static int test_gpu_gds_many_files(void)
{
    ckptio_params p;
    int rc = gds_open(1, &p);
    if (rc) return rc;
    const size_t n = 2u << 20;
    uint8_t *h, *back = malloc(n);
    void *d = dev_random(3 * n, 9, &h);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_set_data_files(w, NULL, n));
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(ckptio_writer_add_mem(w, name, CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL,
                                       (uint8_t *)d + i * n, n, CKPTIO_MEM_CUDA, 0));
    }
    ckptio_stats s;
    CHECK_OK(ckptio_writer_stats(w, &s));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    if (!s.direct) return T_SKIP; /* no GDS without O_DIRECT: nothing to check here */
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(ckptio_reader_read_tensor(r, name, back, n));
        CHECK(!memcmp(back, h + i * n, n));
    }
    ckptio_reader_close(r);
    dev_free(d);
    free(h);
    free(back);
    return 0;
}

/* GDS of a chunk whose size is not a multiple of 4 KiB, then more chunks: cuFile writes the
 * aligned body, the tail goes through the writer's staging, and nothing after it overwrites
 * the body's last bytes. */
static int test_gpu_gds_unaligned_size(void)
{
    ckptio_params p;
    int rc = gds_open(1, &p);
    if (rc) return rc;
    const size_t n = (3u << 20) + 100, m = 5000;
    uint8_t *h, *back = malloc(n);
    void *d = dev_random(n + m, 11, &h), *e = dev_alloc(m);
    dev_put(e, h + n, m);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add_mem(w, "big", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL, d, n,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_add_mem(w, "next", CKPTIO_DT_U8, 1, (uint64_t[]){m}, NULL, NULL, e, m,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_add(w, "host", CKPTIO_DT_U8, 1, (uint64_t[]){m}, NULL, NULL, h + n,
                               m));
    ckptio_gpu_stats gs = {.size = sizeof gs};
    CHECK_OK(ckptio_writer_gpu_stats(w, &gs));
    ckptio_stats s;
    CHECK_OK(ckptio_writer_stats(w, &s));
    if (s.direct) CHECK(gs.gds_bytes == (3u << 20)); /* the body; the 100-byte tail staged */
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    CHECK_OK(ckptio_reader_read_tensor(r, "big", back, n));
    CHECK(!memcmp(back, h, n));
    CHECK_OK(ckptio_reader_read_tensor(r, "next", back, m));
    CHECK(!memcmp(back, h + n, m));
    CHECK_OK(ckptio_reader_read_tensor(r, "host", back, m));
    CHECK(!memcmp(back, h + n, m));
    /* Into GPU memory: an unaligned extent is staged, not given to cuFile. */
    void *dd = dev_alloc(n);
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .name = "big", .dst = dd,
                         .capacity = n};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    dev_get(back, dd, n);
    CHECK(!memcmp(back, h, n));
    dev_free(dd);
    ckptio_reader_close(r);
    dev_free(d);
    dev_free(e);
    free(h);
    free(back);
    return 0;
}

/* The splitter behind GPU loads: sub-boxes in order, each at most `max` bytes, tiling the box. */
static int test_gpu_split(void)
{
    static const struct {
        uint32_t ndim;
        uint64_t shape[3], esize, max;
    } cases[] = {
        {0, {0}, 4, 64},          {1, {100}, 4, 64},     {2, {7, 9}, 2, 20},
        {3, {3, 5, 7}, 8, 64},    {3, {3, 5, 7}, 8, 1000}, {2, {4, 0}, 4, 64},
        {3, {2, 3, 100}, 1, 50},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ckptio__gpu_split sp;
        ckptio__gpu_split_init(&sp, cases[c].shape, cases[c].ndim, cases[c].esize, cases[c].max);
        uint64_t off[3], shp[3], bytes, total = 0, want = cases[c].esize;
        for (uint32_t i = 0; i < cases[c].ndim; i++) want *= cases[c].shape[i];
        while (ckptio__gpu_split_next(&sp, off, shp, &bytes, cases[c].esize)) {
            CHECK(bytes <= CKPTIO__MAX(cases[c].max, cases[c].esize));
            /* Row-major position of the sub-box's first element = bytes so far. */
            uint64_t lin = 0;
            for (uint32_t i = 0; i < cases[c].ndim; i++) lin = lin * cases[c].shape[i] + off[i];
            CHECK(lin * cases[c].esize == total);
            total += bytes;
        }
        CHECK(total == want);
    }
    return 0;
}


/* ---- distributed saves from device memory (ckptio_save_dist, CKPTIO_MEM_CUDA items) ---- */

#define GD_RANKS 4
#define GD_W_ROWS 512
#define GD_W_COLS 300
#define GD_BIG_ROWS 3072 /* 12 MiB of f32, replicated: split into slabs across the ranks */

typedef struct gdrank {
    const ckptio_comm *c;
    ckptio_dist_item it[4];
    size_t n;
    void *dw, *dbig, *drng; /* this rank's device buffers */
    bool nosum;
    int result;
    char msg[1024];
} gdrank;

static struct {
    float *w, *big;
    int64_t b[10];
    uint8_t rng[GD_RANKS][8];
    gdrank r[GD_RANKS];
    char path[4096]; /* t_path() is not for the rank threads */
} G;

static const uint64_t gd_ws[2] = {GD_W_ROWS, GD_W_COLS}, gd_gs[2] = {GD_BIG_ROWS, 1024},
                      gd_bs[1] = {10}, gd_rs[1] = {8};
static uint64_t gd_off[GD_RANKS][2], gd_box[2] = {GD_W_ROWS / GD_RANKS, GD_W_COLS};

/* Rank r holds its rows of w (Shard(0)) and 'big' (replicated) in its own device memory,
 * 'b' (replicated) in host memory and its rng (rank-local) in device memory. `bad`: the rank
 * whose copy of 'big' differs in one byte of its last rows (-1: none). */
static int gd_setup(int bad)
{
    const size_t wb = sizeof(float) * GD_W_ROWS * GD_W_COLS, gb = sizeof(float) * GD_BIG_ROWS * 1024;
    if (!G.w) {
        G.w = malloc(wb);
        G.big = malloc(gb);
        CHECK(G.w && G.big);
    }
    t_fill(G.w, wb, 1);
    t_fill(G.big, gb, 2);
    t_fill(G.b, sizeof G.b, 3);
    t_fill(G.rng, sizeof G.rng, 4);
    snprintf(G.path, sizeof G.path, "%s", t_path("ck"));
    for (int r = 0; r < GD_RANKS; r++) {
        gdrank *k = &G.r[r];
        memset(k, 0, sizeof *k);
        uint64_t rows = GD_W_ROWS / GD_RANKS;
        gd_off[r][0] = rows * (uint64_t)r, gd_off[r][1] = 0;
        size_t nb = sizeof(float) * rows * GD_W_COLS;
        k->dw = dev_alloc(nb), k->dbig = dev_alloc(gb), k->drng = dev_alloc(8);
        CHECK(k->dw && k->dbig && k->drng);
        dev_put(k->dw, G.w + gd_off[r][0] * GD_W_COLS, nb);
        dev_put(k->dbig, G.big, gb);
        if (r == bad) {
            size_t at = sizeof(float) * ((size_t)(GD_BIG_ROWS - 2) * 1024 + 7);
            uint8_t x = (uint8_t)(((uint8_t *)G.big)[at] ^ 1);
            dev_put((uint8_t *)k->dbig + at, &x, 1);
        }
        dev_put(k->drng, G.rng[r], 8);
        k->it[0] = (ckptio_dist_item){.size = sizeof(ckptio_dist_item), .name = "w",
                                      .dtype = CKPTIO_DT_F32, .ndim = 2, .shape = gd_ws,
                                      .offset = gd_off[r], .box = gd_box, .data = k->dw,
                                      .nbytes = nb, .memory = CKPTIO_MEM_CUDA};
        k->it[1] = (ckptio_dist_item){.size = sizeof(ckptio_dist_item), .name = "big",
                                      .dtype = CKPTIO_DT_F32, .ndim = 2, .shape = gd_gs,
                                      .data = k->dbig, .nbytes = gb, .memory = CKPTIO_MEM_CUDA};
        k->it[2] = (ckptio_dist_item){.size = sizeof(ckptio_dist_item), .name = "b",
                                      .dtype = CKPTIO_DT_I64, .ndim = 1, .shape = gd_bs,
                                      .data = G.b, .nbytes = sizeof G.b};
        k->it[3] = (ckptio_dist_item){.size = sizeof(ckptio_dist_item), .name = "rng",
                                      .flags = CKPTIO_DIST_RANK_LOCAL, .dtype = CKPTIO_DT_U8,
                                      .ndim = 1, .shape = gd_rs, .data = k->drng, .nbytes = 8,
                                      .memory = CKPTIO_MEM_CUDA};
        k->n = 4;
    }
    return 0;
}

static void gd_free(void)
{
    for (int r = 0; r < GD_RANKS; r++) {
        dev_free(G.r[r].dw);
        dev_free(G.r[r].dbig);
        dev_free(G.r[r].drng);
    }
}

static void *gd_main(void *arg)
{
    gdrank *k = arg;
    ckptio_params p;
    params_small(&p);
    p.overwrite = CKPTIO_ON;
    if (k->nosum) p.checksums = CKPTIO_OFF;
    k->result = ckptio_save_dist(G.path, k->c, k->it, k->n, NULL, NULL, NULL, 0, &p, 20,
                                 NULL);
    snprintf(k->msg, sizeof k->msg, "%s", k->result < 0 ? ckptio_last_error() : "");
    return NULL;
}

/* Every rank saves on a thread of its own; 0 if they all returned the same. */
static int gd_run(void)
{
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, GD_RANKS));
    pthread_t th[GD_RANKS];
    for (int r = 0; r < GD_RANKS; r++) {
        G.r[r].c = ckptio__comm_local_rank(g, r);
        CHECK(pthread_create(&th[r], NULL, gd_main, &G.r[r]) == 0);
    }
    for (int r = 0; r < GD_RANKS; r++) pthread_join(th[r], NULL);
    ckptio__comm_local_free(g);
    for (int r = 0; r < GD_RANKS; r++) {
        fprintf(stderr, "rank %d: %d %s\n", r, G.r[r].result, G.r[r].msg);
        CHECK(G.r[r].result == G.r[0].result);
    }
    return 0;
}

static int gd_verify(void)
{
    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, t_path("ck"), NULL));
    const size_t wb = sizeof(float) * GD_W_ROWS * GD_W_COLS, gb = sizeof(float) * GD_BIG_ROWS * 1024;
    uint8_t *back = malloc(gb);
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", back, wb));
    CHECK(!memcmp(back, G.w, wb));
    CHECK_OK(ckptio_reader_read_tensor(rd, "big", back, gb));
    CHECK(!memcmp(back, G.big, gb));
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", back, sizeof G.b));
    CHECK(!memcmp(back, G.b, sizeof G.b));
    for (int r = 0; r < GD_RANKS; r++) {
        char name[32];
        snprintf(name, sizeof name, "rng@rank%d", r);
        CHECK_OK(ckptio_reader_read_tensor(rd, name, back, 8));
        CHECK(!memcmp(back, G.rng[r], 8));
    }
    CHECK_OK(ckptio_reader_verify(rd, NULL));
    ckptio_reader_close(rd);
    free(back);
    return 0;
}

/* Four ranks save sharded, replicated and rank-local state from device memory (and one item
 * from host memory): bytes exact, each rank's pinned memory is its ring (4 MiB) and no more,
 * though each holds 12 MiB of 'big'; with checksums on and off; nothing leaks. */
static int test_gpu_dist_save(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    for (int nosum = 0; nosum < 2; nosum++) {
        CHECK(gd_setup(-1) == 0);
        for (int r = 0; r < GD_RANKS; r++) G.r[r].nosum = nosum;
        CHECK(gd_run() == 0);
        for (int r = 0; r < GD_RANKS; r++) CHECK_OK(G.r[r].result);
        CHECK(gd_verify() == 0);
        gd_free();
    }
    if (!D.real) {
        standin_stats st;
        D.stats(&st);
        printf("pinned peak %ld (ring %d, %d ranks), copies %ld\n", st.pinned_peak, 4 << 20,
               GD_RANKS, st.copies);
        CHECK(st.pinned_peak <= (long)GD_RANKS * (4 << 20));
        CHECK(no_leaks());
        /* Hashing the replicas the ranks do not write went through the rings too: 'big' is
         * 12 MiB in 1 MiB pieces, every rank copies all of it once (a slab to write, the rest
         * to hash), more with checksums off (its own slab hashed as well). */
        CHECK(st.copies >= 2L * GD_RANKS * 12);
    }
    return 0;
}

/* Diverging replicas in device memory are caught whichever rank differs, the writer of the
 * slab or one that only hashes it (through its ring), with checksums on and off: every rank
 * fails naming the tensor and the ranks; nothing is published. */
static int test_gpu_dist_replicas_diverge(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    for (int nosum = 0; nosum < 2; nosum++)
        for (int bad = 0; bad < GD_RANKS; bad++) {
            CHECK(gd_setup(bad) == 0);
            for (int r = 0; r < GD_RANKS; r++) G.r[r].nosum = nosum;
            CHECK(gd_run() == 0);
            char want[80];
            snprintf(want, sizeof want, "tensor 'big': ranks %d and %d hold different values",
                     bad ? 0 : 1, bad ? bad : 0);
            if (bad == 0) snprintf(want, sizeof want, "tensor 'big': ranks 0 and 1 hold");
            for (int r = 0; r < GD_RANKS; r++) {
                CHECK_ERR(G.r[r].result, CKPTIO_E_DUPLICATE);
                CHECK(t_contains(G.r[r].msg, want));
            }
            struct stat sb;
            CHECK(stat(t_path("ck"), &sb) < 0 && errno == ENOENT);
            gd_free();
        }
    return 0;
}

/* A device-to-host copy failing half-way on one rank (a piece to write or to hash): every
 * rank fails with its -EIO, naming the tensor; nothing is published; no leak. */
static int test_gpu_dist_copy_fails(void)
{
    setenv("CKPTIO_STANDIN_FAIL_COPY", "9", 1);
    int rc = dev_open(1);
    if (rc) return rc;
    CHECK(gd_setup(-1) == 0);
    CHECK(gd_run() == 0);
    for (int r = 0; r < GD_RANKS; r++) {
        CHECK_ERR(G.r[r].result, -EIO);
        CHECK(t_contains(G.r[r].msg, "illegal memory access"));
        CHECK(t_contains(G.r[r].msg, "of 4: "));
    }
    struct stat sb;
    CHECK(stat(t_path("ck"), &sb) < 0 && errno == ENOENT);
    CHECK(count_prefix("ck.tmp") == 0);
    CHECK(no_leaks());
    gd_free();
    return 0;
}

/* A caller built against the first ckptio_dist_item (no memory, no stream: its size and its
 * array's stride are smaller) saves from host memory as before. */
static int test_gpu_dist_item_v1(void)
{
    const size_t v1 = offsetof(ckptio_dist_item, memory);
    static const uint64_t shape[1] = {16};
    uint8_t data[16];
    t_fill(data, sizeof data, 7);
    uint8_t *arr = calloc(2, v1);
    CHECK(arr != NULL);
    const char *names[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        ckptio_dist_item it = {.size = (uint32_t)v1, .name = names[i], .dtype = CKPTIO_DT_U8,
                               .ndim = 1, .shape = shape, .data = data, .nbytes = 16,
                               .memory = 0x5a5a5a5a, .stream = 77}; /* cut off below */
        memcpy(arr + i * v1, &it, v1);
    }
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, 1));
    CHECK_OK(ckptio_save_dist(t_path("ck"), ckptio__comm_local_rank(g, 0),
                              (const ckptio_dist_item *)arr, 2, NULL, NULL, NULL, 0, NULL, 10,
                              NULL));
    /* A size below the first version is refused. */
    ((ckptio_dist_item *)arr)->size = 8;
    CHECK_ERR(ckptio_save_dist(t_path("ck2"), ckptio__comm_local_rank(g, 0),
                               (const ckptio_dist_item *)arr, 2, NULL, NULL, NULL, 0, NULL, 10,
                               NULL),
              CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "sizeof(ckptio_dist_item)"));
    ckptio__comm_local_free(g);
    ckptio_reader *rd = NULL;
    uint8_t back[16];
    CHECK_OK(ckptio_reader_open(&rd, t_path("ck"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", back, 16));
    CHECK(!memcmp(back, data, 16));
    ckptio_reader_close(rd);
    free(arr);
    return 0;
}

/* A device tensor saved with compression: coded on the host from the pinned ring (a slot at a
 * time), exact when read back, and really compressed. */
static int test_gpu_compressed(void)
{
    int rc = dev_open(0);
    if (rc) return rc;
    ckptio_params p;
    params_small(&p);
    p.compress = CKPTIO_COMPRESS_ALL;
    size_t n = (9u << 20) + 4096 * 3; /* nine slots and a short one */
    uint8_t *h;
    uint8_t *d = dev_random(n, 5, &h);
    CHECK(d);
    for (size_t i = 0; i < n; i++) h[i] &= 0x3f; /* compressible */
    dev_put(d, h, n);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add_mem(w, "g", CKPTIO_DT_U8, 1, (uint64_t[]){n}, NULL, NULL, d, n,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, 0, &ti));
    CHECK(!strcmp(ti.codec, "zstd") && ti.stored_bytes < n * 4 / 5);
    uint8_t *got = malloc(n);
    CHECK(got);
    CHECK_OK(ckptio_reader_read_tensor(r, "g", got, n));
    CHECK(memcmp(got, h, n) == 0);
    ckptio_reader_close(r);
    free(got);
    free(h);
    dev_free(d);
    return 0;
}

const ckptio_test tests_gpu[] = {
    {"gpu_staged_roundtrip", test_gpu_staged_roundtrip, 0, 0},
    {"gpu_staged_no_host_copy", test_gpu_staged_no_host_copy, 0, 0},
    {"gpu_stream_order", test_gpu_stream_order, 0, 0},
    {"gpu_copy_fails", test_gpu_copy_fails, 0, 0},
    {"gpu_pin_fails", test_gpu_pin_fails, 0, 0},
    {"gpu_enospc", test_gpu_enospc, 0, 0},
    {"gpu_no_driver", test_gpu_no_driver, 0, 0},
    {"gpu_modes", test_gpu_modes, 0, 0},
    {"gpu_gds", test_gpu_gds, 0, 0},
    {"gpu_gds_many_files", test_gpu_gds_many_files, 0, 0},
    {"gpu_gds_unaligned_size", test_gpu_gds_unaligned_size, 0, 0},
    {"gpu_split", test_gpu_split, 0, 0},
    {"gpu_dist_save", test_gpu_dist_save, 0, 120},
    {"gpu_dist_replicas_diverge", test_gpu_dist_replicas_diverge, 0, 120},
    {"gpu_dist_copy_fails", test_gpu_dist_copy_fails, 0, 60},
    {"gpu_dist_item_v1", test_gpu_dist_item_v1, 0, 60},
    {"gpu_compressed", test_gpu_compressed, 0, 60},
    {0},
};
