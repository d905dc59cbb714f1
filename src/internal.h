/* SPDX-License-Identifier: Apache-2.0 */
/* Declarations shared by save.c and load.c: resolved parameters and directory helpers. */
#ifndef CKPTIO_INTERNAL_H
#define CKPTIO_INTERNAL_H

#include "common/common.h"

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
} ckptio__cfg;

CKPTIO__HIDDEN int ckptio__cfg_resolve(const ckptio_params *p, ckptio__cfg *c, ckptio__msg *m);
/* Name reported in stats: "buffered" when asked for, else the engine's. */
CKPTIO__HIDDEN void ckptio__stats_backend(char dst[16], int backend, const char *engine_name);

/* A process-wide counter for unique temporary names (<path>.tmp-<pid>.<n>). */
CKPTIO__HIDDEN unsigned ckptio__tmp_id(void);
/* The directory holding `path` (malloc'd; "." or "/" where it has no other). */
CKPTIO__HIDDEN char *ckptio__parent_dir(const char *path);

/* Follow `path` while its last component is a symlink (a relative target taken from the link's
 * own directory, up to 40 links: else -ELOOP) and return the path of what it finally names,
 * malloc'd in *out; that may not exist (a dangling link names where to create). A path that is
 * no symlink, or cannot be inspected, comes back as it is. Writers save to the target, as
 * open(2) in torch.save would, so a link stays a link. */
CKPTIO__HIDDEN int ckptio__follow_links(const char *path, char **out);

/* Remove a directory tree without following symlinks (openat/unlinkat); best effort, returns
 * the first error. */
CKPTIO__HIDDEN int ckptio__remove_tree(const char *path);

/* The writer's data files (ckptio_writer_set_data_files): a multi-rank save gives each rank's
 * writer its own prefix, so that rank R's files are data/rNNNNN-000000.ckd, ... */
CKPTIO__HIDDEN int ckptio__writer_set_data_files(ckptio_writer *w, const char *prefix,
                                                 uint64_t max_file_bytes);

#endif
