/* SPDX-License-Identifier: Apache-2.0 */
/* Loads the CUDA driver and cuFile with dlopen at first use: nothing CUDA is needed to build. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"

/* Each reason is written once, inside its pthread_once, and read only after it. */
#define WHY_LEN 384
static ckptio__cuda g_cuda;
static const char *g_cuda_why;
static char g_cuda_msg[WHY_LEN];
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;

static ckptio__cufile g_cufile;
static const char *g_cufile_why;
static char g_cufile_msg[WHY_LEN];
static pthread_once_t g_cufile_once = PTHREAD_ONCE_INIT;

/* A reason that names what failed: the library's file, the entry point, the code. */
__attribute__((format(printf, 2, 3))) static const char *say(char *msg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, WHY_LEN, fmt, ap);
    va_end(ap);
    return msg;
}

/* dlerror's text, which names the file that is missing (the library or one it needs). */
static const char *dl_reason(void)
{
    const char *e = dlerror();
    return e ? e : "no reason given";
}

/* The first name the library exports: versioned names first (cuMemHostRegister_v2...), because
 * the unversioned ones are kept only for programs built against headers older than the
 * change, with the old behaviour. */
static void *sym(void *lib, const char *a, const char *b)
{
    void *f = dlsym(lib, a);
    if (!f && b) f = dlsym(lib, b);
    return f;
}

#define LOAD(field, a, b)                                                                      \
    do {                                                                                       \
        *(void **)&cu->field = sym(lib, a, b);                                                 \
        if (!cu->field) missing = a;                                                           \
    } while (0)

static void load_cuda(void)
{
    const char *name = getenv("CKPTIO_CUDA_LIBRARY");
    if (!name || !*name) name = "libcuda.so.1";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_cuda_why = say(g_cuda_msg,
                         "the CUDA driver (%s) is not installed or cannot be loaded: %s", name,
                         dl_reason());
        return;
    }
    ckptio__cuda *cu = &g_cuda;
    const char *missing = NULL;
    LOAD(Init, "cuInit", NULL);
    LOAD(DeviceGet, "cuDeviceGet", NULL);
    LOAD(DeviceGetCount, "cuDeviceGetCount", NULL);
    LOAD(CtxGetCurrent, "cuCtxGetCurrent", NULL);
    LOAD(CtxSetCurrent, "cuCtxSetCurrent", NULL);
    LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
    LOAD(MemHostAlloc, "cuMemHostAlloc", NULL);
    LOAD(MemFreeHost, "cuMemFreeHost", NULL);
    LOAD(MemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister");
    LOAD(MemHostUnregister, "cuMemHostUnregister", NULL);
    LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync");
    LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync");
    LOAD(StreamCreate, "cuStreamCreate", NULL);
    LOAD(StreamSynchronize, "cuStreamSynchronize", NULL);
    LOAD(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
    LOAD(StreamWaitEvent, "cuStreamWaitEvent", NULL);
    LOAD(EventCreate, "cuEventCreate", NULL);
    LOAD(EventRecord, "cuEventRecord", NULL);
    LOAD(EventSynchronize, "cuEventSynchronize", NULL);
    LOAD(EventQuery, "cuEventQuery", NULL);
    LOAD(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    LOAD(PointerGetAttribute, "cuPointerGetAttribute", NULL);
    LOAD(GetErrorString, "cuGetErrorString", NULL);
    if (missing) {
        g_cuda_why = say(g_cuda_msg, "the CUDA driver (%s) lacks %s, which ckptio needs (too old?)",
                         name, missing);
        dlclose(lib);
        return;
    }
    int n = 0;
    ckptio__CUresult r = cu->Init(0);
    if (r == CKPTIO__CUDA_SUCCESS) r = cu->DeviceGetCount(&n);
    if (r != CKPTIO__CUDA_SUCCESS || n < 1) {
        g_cuda_why = say(g_cuda_msg,
                         "the CUDA driver (%s) is installed but reports no usable GPU (%s, "
                         "CUresult %d)",
                         name, r != CKPTIO__CUDA_SUCCESS ? "cuInit or cuDeviceGetCount failed"
                                                         : "no device",
                         (int)r);
        dlclose(lib);
        return;
    }
    cu->lib = lib;
}

const ckptio__cuda *ckptio__cuda_get(const char **why)
{
    pthread_once(&g_cuda_once, load_cuda);
    if (!g_cuda.lib && why) *why = g_cuda_why;
    return g_cuda.lib ? &g_cuda : NULL;
}

#undef LOAD
#define LOAD(field, a, b)                                                                      \
    do {                                                                                       \
        *(void **)&cf->field = sym(lib, a, b);                                                 \
        if (!cf->field) missing = a;                                                           \
    } while (0)

static void load_cufile(void)
{
    if (!ckptio__cuda_get(&g_cufile_why)) return;
    const char *name = getenv("CKPTIO_CUFILE_LIBRARY");
    if (!name || !*name) name = "libcufile.so.0";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_cufile_why = say(g_cufile_msg,
                           "cuFile (%s, GPUDirect Storage) is not installed or cannot be loaded: "
                           "%s",
                           name, dl_reason());
        return;
    }
    ckptio__cufile *cf = &g_cufile;
    const char *missing = NULL;
    LOAD(DriverOpen, "cuFileDriverOpen", NULL);
    /* The _v2 close counts references, so closing ours leaves other users' driver open. */
    LOAD(DriverClose, "cuFileDriverClose_v2", "cuFileDriverClose");
    LOAD(HandleRegister, "cuFileHandleRegister", NULL);
    LOAD(HandleDeregister, "cuFileHandleDeregister", NULL);
    LOAD(BufRegister, "cuFileBufRegister", NULL);
    LOAD(BufDeregister, "cuFileBufDeregister", NULL);
    LOAD(Read, "cuFileRead", NULL);
    LOAD(Write, "cuFileWrite", NULL);
    if (missing) {
        g_cufile_why = say(g_cufile_msg, "cuFile (%s) lacks %s, which ckptio needs", name, missing);
        dlclose(lib);
        return;
    }
    ckptio__CUfileError e = cf->DriverOpen();
    if (e.err != 0) {
        g_cufile_why = say(g_cufile_msg,
                           "cuFileDriverOpen failed (CUfileOpError %d, CUresult %d: nvidia-fs not "
                           "loaded, or GDS disabled in cufile.json); the staged path is used",
                           (int)e.err, (int)e.cu_err);
        dlclose(lib);
        return;
    }
    /* Left open for the life of the process: the driver is shared with the frameworks. */
    cf->lib = lib;
}

const ckptio__cufile *ckptio__cufile_get(const char **why)
{
    pthread_once(&g_cufile_once, load_cufile);
    if (!g_cufile.lib && why) *why = g_cufile_why;
    return g_cufile.lib ? &g_cufile : NULL;
}

const char *ckptio__cuda_errstr(const ckptio__cuda *cu, ckptio__CUresult r, char *buf,
                                size_t len)
{
    const char *s = NULL;
    if (!cu || cu->GetErrorString(r, &s) != CKPTIO__CUDA_SUCCESS || !s) s = "unknown CUDA error";
    snprintf(buf, len, "%s (%d)", s, r);
    return buf;
}

int ckptio__cuda_is_device(const ckptio__cuda *cu, ckptio__CUdeviceptr p)
{
    unsigned type = 0;
    if (cu->PointerGetAttribute(&type, CKPTIO__CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) !=
        CKPTIO__CUDA_SUCCESS)
        return 0;
    return type == CKPTIO__CU_MEMORYTYPE_DEVICE || type == CKPTIO__CU_MEMORYTYPE_UNIFIED;
}

ckptio__CUresult ckptio__cuda_bind(const ckptio__cuda *cu, ckptio__CUdeviceptr p)
{
    ckptio__CUcontext ctx = NULL;
    ckptio__CUresult r = cu->CtxGetCurrent(&ctx);
    if (r != CKPTIO__CUDA_SUCCESS || ctx) return r;
    /* With unified addressing the owner of a pointer is known without a current context. */
    int ordinal = 0;
    if (cu->PointerGetAttribute(&ordinal, CKPTIO__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) !=
        CKPTIO__CUDA_SUCCESS)
        ordinal = 0;
    ckptio__CUdevice dev;
    if ((r = cu->DeviceGet(&dev, ordinal)) != CKPTIO__CUDA_SUCCESS) return r;
    /* Retained for the life of the process, like the frameworks' own: never released, so a
     * context they share with us is never torn down under them. */
    if ((r = cu->DevicePrimaryCtxRetain(&ctx, dev)) != CKPTIO__CUDA_SUCCESS) return r;
    return cu->CtxSetCurrent(ctx);
}
