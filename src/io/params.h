/* SPDX-License-Identifier: Apache-2.0 */
/* Resolved parameters: what the writers and the reader run with, after defaults and limits. */
#ifndef CKPTIO_IO_PARAMS_H
#define CKPTIO_IO_PARAMS_H

#include "../common/common.h"

/* How a reader uses the page cache (ckptio__cfg.cache, from ckptio_params.cache). */
enum { CKPTIO__CACHE_OFF = 0, CKPTIO__CACHE_RESIDENT = 1, CKPTIO__CACHE_FILL = 2 };

/* Parameters after defaults, CKPTIO_IO and sanity limits have been applied. */
typedef struct ckptio__cfg {
    int backend;       /* CKPTIO_BACKEND_IO_URING / PSYNC / BUFFERED / AUTO (engine decides) */
    int direct;        /* CKPTIO_AUTO / ON / OFF; OFF whenever backend is BUFFERED */
    unsigned depth;    /* requests in flight */
    unsigned threads;  /* psync pool threads */
    uint64_t request;  /* bytes per request: a power of two, >= 64 KiB */
    uint64_t staging;  /* bytes of staging: >= 2 requests */
    uint64_t csum_block;
    bool fsync, checksums, overwrite;
    int gpu;              /* CKPTIO_GPU_*, after CKPTIO_GPU */
    uint64_t gpu_staging; /* bytes of the pinned GPU staging ring */
    int cache;               /* reader: 0 device only, 1 resident ranges from the page cache,
                              * 2 everything through the cache (CKPTIO__CACHE_*) */
    unsigned verify_threads; /* reader: threads that verify and copy cached ranges, caller's included */
    int compress;            /* writer: CKPTIO_COMPRESS_*, after CKPTIO_COMPRESS */
    const char *base;        /* writer: the base checkpoint's path as given, or NULL */
    const ckptio_store_opts *store; /* the caller's store settings (valid while the handle
                                     * opens), or NULL */
} ckptio__cfg;

CKPTIO__HIDDEN int ckptio__cfg_resolve(const ckptio_params *p, ckptio__cfg *c, ckptio__msg *m);
/* Name reported in stats: "buffered" when asked for, else the engine's. */
CKPTIO__HIDDEN void ckptio__stats_backend(char dst[16], int backend, const char *engine_name);

#endif
