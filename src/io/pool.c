/* SPDX-License-Identifier: Apache-2.0 */
/* The staging pool: equal page-aligned buffers carved from one mapping made up front. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

int ckptio__pool_init(ckptio__pool *p, unsigned count, size_t buf_size)
{
    CKPTIO__RET_IF(!p, CKPTIO_E_USAGE);
    memset(p, 0, sizeof *p);
    CKPTIO__RET_IF(count == 0 || buf_size == 0, CKPTIO_E_USAGE);
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    /* Every buffer starts on a page, so each is as aligned as the mapping (enough for any
     * O_DIRECT memory alignment); the size is rounded up and p->buf_size says by how much. */
    uint64_t sz = ckptio__align_up(buf_size, (uint64_t)page), total;
    CKPTIO__RET_IF(sz < buf_size || !ckptio__mul(sz, count, &total) || total > SIZE_MAX,
                   CKPTIO_E_LIMIT);
    p->free_list = malloc(count * sizeof *p->free_list);
    CKPTIO__RET_IF(!p->free_list, -ENOMEM);
    p->base = ckptio__map((size_t)total);
    if (!p->base) {
        free(p->free_list);
        p->free_list = NULL;
        return -ENOMEM;
    }
    p->buf_size = (size_t)sz;
    p->count = count;
    /* Stacked so that the lowest buffer comes out first. */
    for (unsigned i = 0; i < count; i++)
        p->free_list[i] = count - 1 - i;
    p->nfree = count;
    return 0;
}

void ckptio__pool_fini(ckptio__pool *p)
{
    if (!p) return;
    if (p->base) ckptio__unmap(p->base, p->buf_size * p->count);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

void *ckptio__pool_get(ckptio__pool *p)
{
    if (!p->nfree) return NULL;
    return p->base + (size_t)p->free_list[--p->nfree] * p->buf_size;
}

void ckptio__pool_put(ckptio__pool *p, void *buf)
{
    if (!buf) return;
    size_t delta = (size_t)((uint8_t *)buf - p->base);
    assert((uint8_t *)buf >= p->base && delta % p->buf_size == 0);
    assert(delta / p->buf_size < p->count && p->nfree < p->count); /* ours, and not put twice */
    p->free_list[p->nfree++] = (unsigned)(delta / p->buf_size);
}
