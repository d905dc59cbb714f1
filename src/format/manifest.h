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
 *    components separated by '/', without empty, "." or ".." components;
 *  - format 3 (compressed or delta chunks, doc/format.md section 11): a chunk whose codec is
 *    not NONE has ceil(raw_len / csum_block) block sizes at blocks[c.blocks ...], each in
 *    1 .. that block's raw length, summing to stored_len (a size equal to the raw length is a
 *    block stored raw); checksums are those of the decoded blocks (n_csums from raw_len); a
 *    delta chunk needs a base; versions 1 and 2 have neither. */

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
    uint32_t root;     /* 0: the checkpoint directory; r >= 1: under roots[r - 1] (format 2) */
    uint64_t size;     /* true length of the file in bytes */
} ckptio__mfile;

/* A stripe root of a checkpoint spread over several directories (format 2, doc/format.md
 * section 10): the root's path as recorded at save, and the name of the stripe directory in it
 * that holds its files. */
typedef struct ckptio__mroot {
    uint64_t path; /* strtab offset: an absolute path */
    uint64_t name; /* strtab offset: one path component */
    uint32_t path_len;
    uint32_t name_len;
} ckptio__mroot;

/* Format 1 has no roots; a manifest with roots is format 2 (older readers refuse it); one
 * with coded chunks or a base is format 3, with or without roots. */
#define CKPTIO__FORMAT_STRIPED 2u
#define CKPTIO__FORMAT_CODED 3u
#define CKPTIO__MAX_BASE_PATH 4096u
#define CKPTIO__MAX_ROOTS 256u
#define CKPTIO__MAX_ROOT_PATH 4096u

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
    uint64_t blocks;     /* codec != NONE: index into blocks[] of the first block's size */
} ckptio__mchunk;

typedef struct ckptio__mmeta {
    uint64_t key; /* strtab offset */
    uint32_t key_len;
    uint32_t reserved;
    uint64_t val; /* strtab offset */
    uint64_t val_len;
} ckptio__mmeta;

typedef struct ckptio__manifest {
    uint32_t version;    /* format version: 1, or CKPTIO__FORMAT_STRIPED when n_roots > 0 */
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
    uint64_t n_roots;     /* stripe roots (format 2); files name them by index + 1 */
    ckptio__mroot *roots;
    uint64_t n_blocks;    /* format 3: stored sizes of the coded chunks' blocks */
    uint32_t *blocks;
    /* Format 3 with a base (delta chunks): the base checkpoint's path relative to this one's
     * directory, and the XXH3-64 of its whole manifest file. */
    bool has_base;
    uint32_t base_len;
    uint64_t base_path; /* strtab offset */
    uint64_t base_sum;
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

/* A partial manifest: one rank's share of a multi-rank save (issue 10), which the coordinator
 * merges (ckptio__manifest_merge). It obeys every invariant above but coverage: a tensor's
 * chunks are inside its shape and disjoint, but need not add up to it. */
#define CKPTIO__MANIFEST_PARTIAL 1u
/* validate and decode, with flags (0 or CKPTIO__MANIFEST_PARTIAL). */
CKPTIO__HIDDEN int ckptio__manifest_validate_ex(const ckptio__manifest *m, unsigned flags,
                                                char *err, size_t errlen);
CKPTIO__HIDDEN int ckptio__manifest_decode_ex(const uint8_t *buf, uint64_t len, unsigned flags,
                                              ckptio__manifest **out, char *err, size_t errlen);

/* ---- merging partial manifests (src/format/merge.c) ---------------------------------------- */

/* Merge the partial manifests of a multi-rank save (issue 10) into one checkpoint manifest.
 *
 * A part is what one rank saved: its own files, the chunks it wrote of each tensor it holds
 * (boxes in the tensor's global shape, file indices into its own files table), their checksums
 * and maybe metadata. A part satisfies every invariant above except coverage: its tensors need
 * not be tiled (or even have chunks), nor its tensors or keys be sorted. Only its indices are
 * checked here (so no part is ever read outside its arrays); everything else is checked on the
 * result. Parts are named "part N" (their index in `parts`) in every message; the caller maps
 * N to a rank.
 *
 * The result:
 *  - files: the parts' tables concatenated in part order (part i's file k becomes file
 *    offset_i + k); a file name listed twice (by two parts, or one) is CKPTIO_E_DUPLICATE;
 *  - tensors: one per distinct name, sorted; every part listing it must give the same dtype,
 *    rank and global shape (else CKPTIO_E_SHAPE naming the tensor and both parts); its chunks
 *    are all the parts' chunks of it, in part order. Empty chunks (a zero in their box's
 *    shape: a rank's empty shard) are dropped, except that an empty tensor keeps the first one,
 *    rewritten to cover its whole shape at offset 0 (the format's one form for it);
 *  - checksums: the parts that stored any bytes must agree on algorithm and block size (else
 *    CKPTIO_E_USAGE); a part without stored bytes has nothing checksummed and may say anything.
 *    The result takes the first such part's setting (part 0's when no part stored bytes);
 *  - metadata: the union of the keys; one key with different values in two parts is
 *    CKPTIO_E_DUPLICATE naming the key and both parts; identical values are kept once;
 *  - then each tensor's chunks must tile its shape: an overlap is CKPTIO_E_DUPLICATE naming the
 *    two parts and boxes (a replicated tensor must be saved by one part only), a hole is
 *    CKPTIO_E_INCOMPLETE giving the covered and expected volumes, the parts that hold some of
 *    it and, for row- or column-sharded tensors, the box no part holds; last, the result must
 *    pass ckptio__manifest_validate (its message is then prefixed by "merged manifest: ").
 * On success *out is one arena allocation laid out exactly as decode lays out a manifest
 * (equal to decode(encode(*out))), to free with ckptio__manifest_free; the parts are only read.
 * On failure *out is NULL and err holds one line.
 *
 * Cost: O(N log N) in the total size N of the parts (a hash over tensor and file names, sorts
 * of the distinct tensor names, metadata keys and of each tensor's chunks along one dimension).
 * Memory, besides the result (at most the sum of the parts' arrays): 16 bytes per chunk, 4 per
 * tensor listing, about 120 per distinct tensor, 40 per metadata entry, 16 per part, and
 * validate's scratch (32 bytes per chunk) - about 60 bytes per chunk in all at scale. */
CKPTIO__HIDDEN int ckptio__manifest_merge(const ckptio__manifest *const *parts, size_t n,
                                          ckptio__manifest **out, char *err, size_t errlen);

/* ---- building a manifest from what a writer collected (src/format/build.c) ------------------- */

/* A tensor as a writer collects it: its chunks, in the order added, are a list through the
 * build's next[] (UINT64_MAX ends it). */
typedef struct ckptio__btensor {
    const char *name; /* NUL-terminated */
    uint32_t name_len;
    uint32_t dtype, ndim;
    uint64_t dims;       /* global shape in dims[] */
    uint64_t head, tail; /* chunk list through next[] (UINT64_MAX = none) */
    uint64_t n_chunks;
    uint64_t covered;    /* sum of chunk volumes, elements */
} ckptio__btensor;

typedef struct ckptio__bmeta {
    char *key;
    size_t key_len;
    uint8_t *val;
    size_t val_len;
} ckptio__bmeta;

/* A data file (name relative to its root's directory) and a stripe root (format 2). */
typedef struct ckptio__bfile {
    const char *name;
    uint32_t root; /* 0: the checkpoint's directory; k: roots[k - 1] */
    uint64_t size;
} ckptio__bfile;

typedef struct ckptio__broot {
    const char *path, *name;
} ckptio__broot;

/* Everything a manifest is built from; the arrays are only read (csums is not copied: the
 * manifest points at it while it is encoded). */
typedef struct ckptio__build {
    const ckptio__btensor *tensors;
    size_t n_tensors;
    const ckptio__mchunk *chunks; /* n_chunks of them, in the order added */
    const uint64_t *next;         /* n_chunks: the tensors' chunk lists */
    uint64_t n_chunks;
    uint64_t *dims, *csums;
    uint64_t n_dims, n_csums;
    const ckptio__bmeta *meta;
    size_t n_meta;
    const ckptio__bfile *files;
    size_t n_files;
    const ckptio__broot *roots;
    size_t n_roots;
    bool checksums;
    uint64_t csum_block;
    bool partial; /* CKPTIO__MANIFEST_PARTIAL: a rank's share, tensors need not be covered */
    const uint32_t *blocks; /* the coded chunks' block sizes (chunks' .blocks index them) */
    uint64_t n_blocks;
    const char *base; /* NULL, or the base's relative path (delta chunks) */
    uint64_t base_sum;
} ckptio__build;

/* Build the manifest (tensors and metadata sorted by name, each tensor's chunks contiguous, in
 * the order added), validate and encode it into *buf (malloc'd, *len bytes). A tensor whose
 * chunks do not cover it is CKPTIO_E_INCOMPLETE (unless partial); a manifest that fails
 * validation is a bug in its builder, reported as an internal error naming `what` (the
 * checkpoint's path). err gets the message (empty for -ENOMEM). */
CKPTIO__HIDDEN int ckptio__manifest_build(const ckptio__build *b, const char *what, uint8_t **buf,
                                          uint64_t *len, char *err, size_t errlen);

#endif
