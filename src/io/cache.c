/* SPDX-License-Identifier: Apache-2.0 */
/* Residency queries: cachestat(2) where the kernel has it, mincore(2) on a mapping otherwise. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cache.h"

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif

/* The kernel's structs (include/uapi/linux/mman.h), spelled here for older headers. */
struct cs_range {
    uint64_t off, len;
};
struct cs_stat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int ckptio__cache_force_mincore;
static atomic_int no_cachestat; /* learnt once: the syscall is missing */

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

static int by_mincore(ckptio__cachefile *cf, uint64_t lo, uint64_t n, uint64_t ps,
                      uint64_t *resident)
{
    if (!cf->map) {
        void *m = mmap(NULL, (size_t)cf->size, PROT_READ, MAP_SHARED, cf->fd, 0);
        if (m == MAP_FAILED) return -errno;
        cf->map = m;
    }
    if (cf->vec_len < n) {
        uint8_t *v = realloc(cf->vec, (size_t)n);
        if (!v) return -ENOMEM;
        cf->vec = v;
        cf->vec_len = (size_t)n;
    }
    /* Mapping the file faults nothing in: mincore only reads the page cache's state. */
    if (mincore((uint8_t *)cf->map + lo, (size_t)(n * ps), cf->vec) < 0) return -errno;
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) k += cf->vec[i] & 1;
    *resident = k;
    return 0;
}

int ckptio__cache_resident(ckptio__cachefile *cf, uint64_t off, uint64_t len, uint64_t *resident,
                           uint64_t *pages)
{
    uint64_t ps = page_size();
    *resident = 0;
    *pages = 0;
    if (off >= cf->size || !len) return 0;
    uint64_t end = CKPTIO__MIN(cf->size, off + CKPTIO__MIN(len, cf->size - off));
    uint64_t lo = off / ps * ps, hi = (end + ps - 1) / ps * ps;
    uint64_t n = (hi - lo) / ps;
    *pages = n;
    if (!ckptio__cache_force_mincore && !atomic_load_explicit(&no_cachestat, memory_order_relaxed)) {
        struct cs_range r = {lo, hi - lo};
        struct cs_stat st;
        memset(&st, 0, sizeof st);
        if (syscall(__NR_cachestat, cf->fd, &r, &st, 0) == 0) {
            *resident = CKPTIO__MIN(st.nr_cache, n);
            return 0;
        }
        if (errno != ENOSYS && errno != EPERM) return -errno;
        atomic_store_explicit(&no_cachestat, 1, memory_order_relaxed);
    }
    return by_mincore(cf, lo, n, ps, resident);
}

void ckptio__cache_fini(ckptio__cachefile *cf)
{
    if (cf->map) munmap(cf->map, (size_t)cf->size);
    free(cf->vec);
    cf->map = NULL;
    cf->vec = NULL;
    cf->vec_len = 0;
}
