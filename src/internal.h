/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by save.c, file.c and load.c: resolved parameters and path helpers. */
#ifndef CKPTIO_INTERNAL_H
#define CKPTIO_INTERNAL_H

#include "commit/txn.h" /* also the path helpers: readers follow links as writers do */
#include "common/common.h"

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
} ckptio__cfg;

CKPTIO__HIDDEN int ckptio__cfg_resolve(const ckptio_params *p, ckptio__cfg *c, ckptio__msg *m);
/* Name reported in stats: "buffered" when asked for, else the engine's. */
CKPTIO__HIDDEN void ckptio__stats_backend(char dst[16], int backend, const char *engine_name);

/* The commit transaction's flags for these settings. */
static inline unsigned ckptio__cfg_txn_flags(const ckptio__cfg *c)
{
    return (c->overwrite ? CKPTIO__TXN_OVERWRITE : 0) | (c->fsync ? CKPTIO__TXN_FSYNC : 0);
}

/* The writer's data files (ckptio_writer_set_data_files): a multi-rank save gives each rank's
 * writer its own prefix, so that rank R's files are data/rNNNNN-000000.ckd, ... */
CKPTIO__HIDDEN int ckptio__writer_set_data_files(ckptio_writer *w, const char *prefix,
                                                 uint64_t max_file_bytes);

/* ---- the writer's hooks for distributed saves (save.c, used by save_dist.c) ---- */

/* A writer for rank `rank`'s share of a distributed save of `path`, in its own data file
 * data/r<rank, 5 digits>-000000.ckd. join NULL: begin the temporary directory (the
 * coordinator; ckptio__writer_tmp_path() then gives its absolute path for the others); else
 * write into the temporary directory `join` that the coordinator began, never removing it. */
CKPTIO__HIDDEN int ckptio__writer_open_part(ckptio_writer **out, const char *path,
                                            const char *join, uint32_t rank,
                                            const ckptio_params *p);
CKPTIO__HIDDEN const char *ckptio__writer_tmp_path(const ckptio_writer *w);
/* Flush and fsync this rank's data file and its directory entry, and put its partial manifest
 * (every chunk it wrote, its file, its metadata) into `part`. Nothing is published. */
CKPTIO__HIDDEN int ckptio__writer_finish_part(ckptio_writer *w, ckptio_bytes *part);
/* Device bytes [src, src + n) through the writer's GPU staging ring (started as for a
 * CKPTIO_MEM_CUDA add), after the work queued on `stream`: fn gets each piece as it lands, at
 * offsets that are multiples of `block` (which must divide the writer's checksum block). Used
 * to hash replicas in GPU memory; nothing is written. The message is in the writer's. */
CKPTIO__HIDDEN int ckptio__writer_gpu_read(ckptio_writer *w, uint64_t src, uint64_t n,
                                           uint64_t stream, uint64_t block,
                                           int (*fn)(void *, uint8_t *, uint64_t, uint64_t),
                                           void *ctx, const char *what);
/* The coordinator, after finish_part: write `man` (the merged manifest) into the temporary
 * directory and publish it, as ckptio_writer_commit() does. */
CKPTIO__HIDDEN int ckptio__writer_publish_manifest(ckptio_writer *w, const uint8_t *man,
                                                   uint64_t len);

/* Striping (src/save_stripe.c). The absolute path that stripes of the checkpoint at `target`
 * record as their owner (malloc'd; NULL when its parent cannot be resolved). */
CKPTIO__HIDDEN char *ckptio__stripe_owner_of(const char *target);
/* Remove (dry: count) the stripes of `owner` in `root` that no live save holds and that the
 * checkpoint published at `owner` does not name. */
CKPTIO__HIDDEN int ckptio__stripe_collect_owned(const char *owner, const char *root, bool dry,
                                                unsigned *found);
/* The roots recorded by the checkpoint published at `dir` (none for format 1 or no
 * checkpoint); free each and the array. */
CKPTIO__HIDDEN int ckptio__stripe_recorded_roots(const char *dir, char ***roots, size_t *n);

#endif
