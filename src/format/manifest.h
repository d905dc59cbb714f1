/* SPDX-License-Identifier: Apache-2.0 */
/* The manifest of format v1 as structures, and its encoding: pure code, no I/O (fuzzed). */
#ifndef CKPTIO_MANIFEST_H
#define CKPTIO_MANIFEST_H

#include "../common/common.h"

/* Everything is held in flat arrays and referenced by index, so the writer can grow the arrays
 * while it adds chunks and the decoder can fill them from one parse. Strings (names, keys,
 * metadata values) live in `strtab`, each followed by one NUL byte, on disk as in memory, so
 * strtab + offset is a C string (metadata values may hold NULs of their own: use val_len).
 *
 * Invariants established by ckptio__manifest_validate() (and so by decode):
 *  - tensors sorted by name (bytewise), names unique and valid UTF-8 without NUL;
 *  - tensor t's chunks are chunks[t.chunk0 .. t.chunk0 + t.n_chunks), each of t's dtype,
 *    inside t's shape, pairwise disjoint, volumes summing to t's volume (so they tile it);
 *    the tensors' ranges partition chunks[] (in any order; decode lays them out in order);
 *  - a tensor of volume 0 has exactly one chunk, covering its shape at offset 0, with
 *    stored_len 0 and file_off 0; every other chunk has volume >= 1;
 *  - every chunk's file index is valid, an empty chunk's included;
 *  - chunk extents lie inside their file's recorded size, start 64-aligned, start
 *    4096-aligned when stored_len >= 4096, and never overlap one another within a file;
 *  - n_csums of a chunk = ceil(stored_len / csum_block) (0 when checksums are off or the chunk
 *    is empty), all indices within their arrays, all sizes free of overflow;
 *  - every string (offset, len) lies in strtab and strtab[offset + len] == 0;
 *  - metadata keys sorted and unique; file names are relative paths of [A-Za-z0-9._-]
 *    components separated by '/', without empty, "." or ".." components. */

#define CKPTIO__CODEC_NONE 0u
#define CKPTIO__CSUM_NONE 0u
#define CKPTIO__CSUM_XXH3_64 1u

#define CKPTIO__SMALL_ALIGN 64u   /* chunks shorter than CKPTIO__EXTENT_ALIGN */
#define CKPTIO__EXTENT_ALIGN 4096u /* chunks of at least this many bytes */

/* Bounds enforced before allocation. */
#define CKPTIO__MAX_MANIFEST_BYTES (1ull << 31)
#define CKPTIO__MAX_FILES (1u << 20)
#define CKPTIO__MAX_TENSORS (1u << 26)
#define CKPTIO__MAX_CHUNKS (1ull << 28)
#define CKPTIO__MAX_META (1u << 20)
#define CKPTIO__MAX_FILE_NAME 255u

typedef struct ckptio__mfile {
    uint64_t name;     /* strtab offset */
    uint32_t name_len;
    uint32_t reserved;
    uint64_t size;     /* true length of the file in bytes */
} ckptio__mfile;

typedef struct ckptio__mtensor {
    uint64_t name;     /* strtab offset */
    uint32_t name_len;
    uint32_t dtype;    /* CKPTIO_DT_* */
    uint32_t ndim;
    uint32_t reserved;
    uint64_t dims;     /* index into dims[]: global shape, ndim entries */
    uint64_t chunk0;   /* first chunk in chunks[] */
    uint64_t n_chunks;
} ckptio__mtensor;

typedef struct ckptio__mchunk {
    uint64_t dims;       /* index into dims[]: offset (ndim entries) then shape (ndim entries) */
    uint64_t file_off;   /* start of the stored bytes in the file */
    uint64_t stored_len; /* bytes on disk */
    uint64_t raw_len;    /* bytes once decoded = volume * dtype size */
    uint64_t csums;      /* index into csums[] of the first block checksum */
    uint64_t n_csums;
    uint32_t file;       /* index into files[] */
    uint32_t codec;      /* CKPTIO__CODEC_* */
    uint32_t tensor;     /* owning tensor (redundant, not stored: filled by decode) */
    uint32_t reserved;
} ckptio__mchunk;

typedef struct ckptio__mmeta {
    uint64_t key; /* strtab offset */
    uint32_t key_len;
    uint32_t reserved;
    uint64_t val; /* strtab offset */
    uint64_t val_len;
} ckptio__mmeta;

typedef struct ckptio__manifest {
    uint32_t version;    /* format version (1) */
    uint32_t csum_algo;  /* CKPTIO__CSUM_* */
    uint64_t csum_block; /* bytes per checksum block, a power of two in [4096, 64 MiB] (may be
                          * 0 when csum_algo is NONE) */
    uint64_t n_files, n_tensors, n_chunks, n_meta, n_dims, n_csums, strtab_len;
    ckptio__mfile *files;
    ckptio__mtensor *tensors;
    ckptio__mchunk *chunks;
    ckptio__mmeta *meta;
    uint64_t *dims;
    uint64_t *csums;
    char *strtab;
    void *arena; /* decode: one allocation holding all of the above; NULL when caller-owned */
} ckptio__manifest;

/* Check every invariant above; on failure return CKPTIO_E_CORRUPT (or CKPTIO_E_LIMIT) and put
 * a one-line reason naming the tensor or file into err. Used by decode and, before encoding,
 * by the writer. Allocates scratch (-ENOMEM possible); O(n log n). */
CKPTIO__HIDDEN int ckptio__manifest_validate(const ckptio__manifest *m, char *err, size_t errlen);

/* Exact encoded size of m. */
CKPTIO__HIDDEN int ckptio__manifest_encoded_size(const ckptio__manifest *m, uint64_t *out);
/* Encode m (already valid) into buf of at least encoded_size bytes. */
CKPTIO__HIDDEN int ckptio__manifest_encode(const ckptio__manifest *m, uint8_t *buf, uint64_t len);

/* Parse and fully validate `len` bytes. On success *out is a manifest whose arrays live in one
 * arena (free with ckptio__manifest_free). On
 * failure returns CKPTIO_E_CORRUPT, CKPTIO_E_FORMAT (newer version) or CKPTIO_E_LIMIT, or
 * -ENOMEM, with the reason in err. Never reads outside buf, never allocates more than a
 * small multiple of len. */
CKPTIO__HIDDEN int ckptio__manifest_decode(const uint8_t *buf, uint64_t len,
                                           ckptio__manifest **out, char *err, size_t errlen);
CKPTIO__HIDDEN void ckptio__manifest_free(ckptio__manifest *m);

#endif
