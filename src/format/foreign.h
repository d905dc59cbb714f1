/* SPDX-License-Identifier: Apache-2.0 */
/* Foreign checkpoints (safetensors files, Hugging Face shards) as manifests: pure code, no I/O. */
#ifndef CKPTIO_FOREIGN_H
#define CKPTIO_FOREIGN_H

#include "manifest.h"
#include "safetensors.h"

/* One parsed safetensors file: its name (as the index names it, or its name in the directory),
 * its size and its header. */
typedef struct ckptio__foreign_file {
    const char *name;
    uint64_t size;
    const ckptio__st_header *h;
} ckptio__foreign_file;

/* The manifest a reader serves for `n` safetensors files: every tensor one chunk (file, offset
 * data_start + begin, length end - begin, codec none, no checksums: csum_algo NONE), tensors
 * sorted by name, no roots. With an index `ix`, the tensors are those of its weight_map, each
 * from the file the map names (files[] must hold every file it names, by name); without one,
 * every tensor of every file, and a name in two files is CKPTIO_E_DUPLICATE. A dtype ckptio has
 * no code for is served as CKPTIO_DT_BYTES: 8-bit ones (F8_E8M0, the FNUZ float8s) with a
 * trailing dimension of 1, sub-byte ones (F4, F6_*) as a vector of their bytes; every tensor's
 * safetensors dtype is kept in its `reserved` field. Metadata: the index's, then each file's
 * __metadata__ in file order, the first value of a key kept. The result is one allocation
 * (ckptio__manifest_free) that is NOT a valid checkpoint manifest (its extents are unaligned,
 * its file names free): it is never encoded or validated. On failure CKPTIO_E_CORRUPT (the
 * index names a tensor its file does not hold), CKPTIO_E_DUPLICATE, CKPTIO_E_LIMIT or -ENOMEM
 * with err naming the tensor and files. */
CKPTIO__HIDDEN int ckptio__foreign_manifest(const ckptio__foreign_file *files, size_t n,
                                            const ckptio__st_index *ix, ckptio__manifest **out,
                                            char *err, size_t errlen);

#endif
