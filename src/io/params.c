/* SPDX-License-Identifier: Apache-2.0 */
/* Parameter defaults and their resolution into the settings an operation runs with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"
#include "../gpu/staged.h"
#include "../common/workers.h"
#include "engine.h"

#define DEFAULT_DEPTH 64u
#define DEFAULT_THREADS 16u
#define DEFAULT_REQUEST (8ull << 20)
#define DEFAULT_STAGING (64ull << 20)
#define CSUM_BLOCK (1ull << 20)
#define DEFAULT_GPU_STAGING (256ull << 20)
#define DEFAULT_VERIFY_THREADS 8u /* XXH3 runs at several GB/s a core: a few keep up with NVMe */

void ckptio_params_init(ckptio_params *p)
{
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    p->backend = CKPTIO_BACKEND_AUTO;
    p->direct = CKPTIO_AUTO;
    p->fsync = CKPTIO_ON;
    p->checksums = CKPTIO_ON;
    p->overwrite = CKPTIO_OFF;
    p->gpu = CKPTIO_GPU_AUTO;
}

static uint64_t pow2_floor(uint64_t v)
{
    uint64_t r = 1;
    while (r <= v / 2) r *= 2;
    return r;
}

/* A mode the environment's `var` overrides: one of three names, the enum's values 0, 1, 2. */
static int env_choice(const char *var, const char *const names[3], int *mode, ckptio__msg *m)
{
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            *mode = i;
            return 0;
        }
    return ckptio__fail(m, CKPTIO_E_USAGE, "%s is '%s'; it must be '%s', '%s' or '%s'", var, v,
                        names[0], names[1], names[2]);
}

int ckptio__cfg_resolve(const ckptio_params *user, ckptio__cfg *c, ckptio__msg *m)
{
    ckptio_params p;
    ckptio_params_init(&p);
    if (user) {
        /* Honour only the fields the caller's header knew about. */
        if (user->size < offsetof(ckptio_params, reserved0) || user->size > 4096)
            return ckptio__fail(m, CKPTIO_E_USAGE,
                                "ckptio_params.size is %u: initialize params with "
                                "ckptio_params_init()",
                                user->size);
        memcpy(&p, user, CKPTIO__MIN((size_t)user->size, sizeof p));
    }
    int backend = ckptio__backend_from_env(p.backend);
    if (backend < 0 || backend > CKPTIO_BACKEND_BUFFERED)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "unknown I/O backend (CKPTIO_IO must be io_uring, psync or buffered)");
    c->backend = backend;
    c->direct = p.direct;
    if (c->direct != CKPTIO_AUTO && c->direct != CKPTIO_ON && c->direct != CKPTIO_OFF)
        return ckptio__fail(m, CKPTIO_E_USAGE, "params.direct must be CKPTIO_AUTO, _ON or _OFF");
    if (backend == CKPTIO_BACKEND_BUFFERED) c->direct = CKPTIO_OFF;
    c->depth = p.queue_depth ? p.queue_depth : DEFAULT_DEPTH;
    c->depth = CKPTIO__MIN(c->depth, 1024u);
    c->threads = p.io_threads ? p.io_threads : DEFAULT_THREADS;
    c->threads = CKPTIO__MIN(c->threads, 256u);
    c->request = p.request_bytes ? pow2_floor(p.request_bytes) : DEFAULT_REQUEST;
    c->request = CKPTIO__MAX(c->request, 64ull << 10);
    c->request = CKPTIO__MIN(c->request, 256ull << 20);
    c->staging = p.staging_bytes ? p.staging_bytes : DEFAULT_STAGING;
    c->staging = CKPTIO__MAX(c->staging, 2 * c->request);
    c->csum_block = CSUM_BLOCK;
    if (c->request < c->csum_block) c->csum_block = c->request;
    c->fsync = p.fsync != CKPTIO_OFF;
    c->checksums = p.checksums != CKPTIO_OFF;
    c->overwrite = p.overwrite == CKPTIO_ON;
    c->gpu = ckptio__gpu_mode(p.gpu, m);
    if (c->gpu < 0) return c->gpu;
    c->gpu_staging = p.gpu_staging_bytes ? p.gpu_staging_bytes : DEFAULT_GPU_STAGING;
    /* Read paths (issue 12): CKPTIO_CACHE=never|auto|fill overrides params.cache. */
    static const char *const cache_names[] = {"auto", "never", "fill"}; /* CKPTIO_CACHE_* */
    int mode = p.cache;
    CKPTIO__TRY(env_choice("CKPTIO_CACHE", cache_names, &mode, m));
    if (mode != CKPTIO_CACHE_AUTO && mode != CKPTIO_CACHE_NEVER && mode != CKPTIO_CACHE_FILL)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "params.cache must be CKPTIO_CACHE_AUTO (0), _NEVER (1) or _FILL (2)");
    c->cache = mode == CKPTIO_CACHE_NEVER ? CKPTIO__CACHE_OFF
               : mode == CKPTIO_CACHE_FILL ? CKPTIO__CACHE_FILL
                                           : CKPTIO__CACHE_RESIDENT;
    static const char *const compress_names[] = {"none", "auto", "all"}; /* CKPTIO_COMPRESS_* */
    mode = p.compress;
    CKPTIO__TRY(env_choice("CKPTIO_COMPRESS", compress_names, &mode, m));
    if (mode != CKPTIO_COMPRESS_NONE && mode != CKPTIO_COMPRESS_AUTO && mode != CKPTIO_COMPRESS_ALL)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "params.compress must be CKPTIO_COMPRESS_NONE (0), _AUTO (1) or _ALL (2)");
    c->compress = mode;
    c->base = p.base && *p.base ? p.base : NULL;
    c->store = p.store;
    if (c->base && c->compress == CKPTIO_COMPRESS_NONE)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "a base ('%s') is given but compression is off: deltas are coded, so "
                            "save with compress AUTO or ALL",
                            c->base);
    c->verify_threads = p.verify_threads ? CKPTIO__MIN(p.verify_threads, 64u)
                                         : ckptio__workers_default(DEFAULT_VERIFY_THREADS);
    return 0;
}

void ckptio__stats_backend(char dst[16], int backend, const char *engine_name)
{
    const char *n = backend == CKPTIO_BACKEND_BUFFERED ? "buffered" : engine_name;
    snprintf(dst, 16, "%s", n ? n : "none");
}
