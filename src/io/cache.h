/* SPDX-License-Identifier: Apache-2.0 */
/* Page-cache residency of file ranges: which bytes a buffered read would copy from memory. */
#ifndef CKPTIO_CACHE_H
#define CKPTIO_CACHE_H

#include "../common/common.h"

/* What the kernel says about one file. cachestat(2) (Linux 6.5) answers a range in one call;
 * where it is missing (ENOSYS, or refused by a seccomp filter: EPERM) mincore(2) on a
 * read-only mapping of the file answers instead, page by page. The answer may be stale by the
 * time the bytes are read: callers must read correctly either way (a buffered read of an
 * evicted page goes to the device). */
typedef struct ckptio__cachefile {
    int fd;        /* any descriptor of the file; not owned */
    uint64_t size; /* of the file */
    void *map;     /* mincore only: the mapping, made on first use */
    uint8_t *vec;  /* mincore only: scratch, one byte a page */
    size_t vec_len;
} ckptio__cachefile;

/* Pages of [off, off + len) (rounded out to pages and clipped to the file) that are resident;
 * *pages gets how many pages the range has. Returns 0 or -errno (then nothing is known:
 * treat the range as not resident). */
CKPTIO__HIDDEN int ckptio__cache_resident(ckptio__cachefile *cf, uint64_t off, uint64_t len,
                                          uint64_t *resident, uint64_t *pages);
/* Release the mapping and scratch; leaves fd alone. Accepts a zeroed struct. */
CKPTIO__HIDDEN void ckptio__cache_fini(ckptio__cachefile *cf);

/* Tests only: 1 forces the mincore path, as on a kernel without cachestat. */
CKPTIO__HIDDEN extern int ckptio__cache_force_mincore;

#endif
