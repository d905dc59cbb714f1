/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver and cuFile entry points ckptio uses, loaded with dlopen at first use. */
#ifndef CKPTIO_GPU_CUDA_H
#define CKPTIO_GPU_CUDA_H

#include <sys/types.h>

#include "../common/common.h"

/* Our own declarations of the few driver types we need (cuda.h is not needed to build):
 * handles are opaque pointers, device pointers 64-bit integers, results ints. */
typedef int ckptio__CUresult;
typedef int ckptio__CUdevice;
typedef struct ckptio__CUctx_st *ckptio__CUcontext;
typedef struct ckptio__CUstream_st *ckptio__CUstream;
typedef struct ckptio__CUevent_st *ckptio__CUevent;
typedef unsigned long long ckptio__CUdeviceptr;

#define CKPTIO__CUDA_SUCCESS 0
#define CKPTIO__CUDA_ERROR_NOT_READY 600
#define CKPTIO__CU_STREAM_NON_BLOCKING 0x1
#define CKPTIO__CU_EVENT_DISABLE_TIMING 0x2
#define CKPTIO__CU_MEMHOSTALLOC_PORTABLE 0x1
#define CKPTIO__CU_MEMHOSTREGISTER_PORTABLE 0x1
#define CKPTIO__CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CKPTIO__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CKPTIO__CU_MEMORYTYPE_HOST 1
#define CKPTIO__CU_MEMORYTYPE_DEVICE 2
#define CKPTIO__CU_MEMORYTYPE_UNIFIED 4

/* cuFile's types, as its public header declares them. */
typedef struct ckptio__CUfileError {
    int err;     /* CUfileOpError; 0 = success */
    int cu_err;  /* CUresult */
} ckptio__CUfileError;
typedef void *ckptio__CUfileHandle;
typedef struct ckptio__CUfileDescr {
    int type; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} ckptio__CUfileDescr;
#define CKPTIO__CU_FILE_HANDLE_TYPE_OPAQUE_FD 1

typedef struct ckptio__cuda {
    void *lib;
    ckptio__CUresult (*Init)(unsigned flags);
    ckptio__CUresult (*DeviceGet)(ckptio__CUdevice *dev, int ordinal);
    ckptio__CUresult (*DeviceGetCount)(int *n);
    ckptio__CUresult (*CtxGetCurrent)(ckptio__CUcontext *ctx);
    ckptio__CUresult (*CtxSetCurrent)(ckptio__CUcontext ctx);
    ckptio__CUresult (*DevicePrimaryCtxRetain)(ckptio__CUcontext *ctx, ckptio__CUdevice dev);
    ckptio__CUresult (*MemHostAlloc)(void **p, size_t n, unsigned flags);
    ckptio__CUresult (*MemFreeHost)(void *p);
    ckptio__CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
    ckptio__CUresult (*MemHostUnregister)(void *p);
    ckptio__CUresult (*MemcpyDtoHAsync)(void *dst, ckptio__CUdeviceptr src, size_t n,
                                        ckptio__CUstream s);
    ckptio__CUresult (*MemcpyHtoDAsync)(ckptio__CUdeviceptr dst, const void *src, size_t n,
                                        ckptio__CUstream s);
    ckptio__CUresult (*StreamCreate)(ckptio__CUstream *s, unsigned flags);
    ckptio__CUresult (*StreamSynchronize)(ckptio__CUstream s);
    ckptio__CUresult (*StreamDestroy)(ckptio__CUstream s);
    ckptio__CUresult (*StreamWaitEvent)(ckptio__CUstream s, ckptio__CUevent e, unsigned flags);
    ckptio__CUresult (*EventCreate)(ckptio__CUevent *e, unsigned flags);
    ckptio__CUresult (*EventRecord)(ckptio__CUevent e, ckptio__CUstream s);
    ckptio__CUresult (*EventSynchronize)(ckptio__CUevent e);
    ckptio__CUresult (*EventQuery)(ckptio__CUevent e);
    ckptio__CUresult (*EventDestroy)(ckptio__CUevent e);
    ckptio__CUresult (*PointerGetAttribute)(void *data, int attr, ckptio__CUdeviceptr p);
    ckptio__CUresult (*GetErrorString)(ckptio__CUresult r, const char **s);
} ckptio__cuda;

typedef struct ckptio__cufile {
    void *lib;
    ckptio__CUfileError (*DriverOpen)(void);
    ckptio__CUfileError (*DriverClose)(void);
    ckptio__CUfileError (*HandleRegister)(ckptio__CUfileHandle *fh, ckptio__CUfileDescr *d);
    void (*HandleDeregister)(ckptio__CUfileHandle fh);
    ckptio__CUfileError (*BufRegister)(const void *base, size_t len, int flags);
    ckptio__CUfileError (*BufDeregister)(const void *base);
    ssize_t (*Read)(ckptio__CUfileHandle fh, void *base, size_t n, off_t file_off, off_t buf_off);
    ssize_t (*Write)(ckptio__CUfileHandle fh, const void *base, size_t n, off_t file_off,
                     off_t buf_off);
} ckptio__cufile;

/* The driver, loaded and initialized (cuInit) once per process: libcuda.so.1, or the library
 * named by CKPTIO_CUDA_LIBRARY (test-only: ckptio's test suite points it at a stand-in).
 * NULL if it is missing or fails; *why (may be NULL) then says why, in a static string. */
CKPTIO__HIDDEN const ckptio__cuda *ckptio__cuda_get(const char **why);
/* cuFile, loaded and its driver opened once per process (libcufile.so.0, or
 * CKPTIO_CUFILE_LIBRARY, test-only), after the CUDA driver. NULL with *why otherwise. */
CKPTIO__HIDDEN const ckptio__cufile *ckptio__cufile_get(const char **why);
/* "cuMemcpyDtoHAsync failed: an illegal memory access was encountered (700)" into buf. */
CKPTIO__HIDDEN const char *ckptio__cuda_errstr(const ckptio__cuda *cu, ckptio__CUresult r,
                                               char *buf, size_t len);
/* Make a context current on this thread for device pointer `p` when none is (a thread of
 * ckptio's own, a program that never touched the driver on this thread): the primary context
 * of the device that owns p, which is what PyTorch, JAX and CuPy use. */
CKPTIO__HIDDEN ckptio__CUresult ckptio__cuda_bind(const ckptio__cuda *cu, ckptio__CUdeviceptr p);
/* 1 if p is device (or managed) memory, 0 if host memory or unknown to the driver. */
CKPTIO__HIDDEN int ckptio__cuda_is_device(const ckptio__cuda *cu, ckptio__CUdeviceptr p);

#endif
