/* SPDX-License-Identifier: Apache-2.0 */
/* A rank's part of a multi-rank save: the writer's hooks that src/ranks/save_dist.c drives. */
#ifndef CKPTIO_WRITE_PART_H
#define CKPTIO_WRITE_PART_H

#include "../common/common.h"

/* The writer's data files (ckptio_writer_set_data_files): a multi-rank save gives each rank's
 * writer its own prefix, so that rank R's files are data/rNNNNN-000000.ckd, ... */
CKPTIO__HIDDEN int ckptio__writer_set_data_files(ckptio_writer *w, const char *prefix,
                                                 uint64_t max_file_bytes);

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
/* This joined rank's part will never be handed to the coordinator (it failed before sending
 * it): in an object store, close deletes this rank's data objects, which no manifest can name
 * and which may have appeared after the coordinator's own clean-up. A no-op elsewhere (the
 * coordinator removes the temporary directory with every rank's files). */
CKPTIO__HIDDEN void ckptio__writer_drop_part(ckptio_writer *w);
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

#endif
