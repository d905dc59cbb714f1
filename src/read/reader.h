/* SPDX-License-Identifier: Apache-2.0 */
/* The reader's insides, shared by its files: open, plan, execute, regions and file reads. */
#ifndef CKPTIO_READ_READER_H
#define CKPTIO_READ_READER_H

#include <stddef.h>

#include "../store/store.h"
#include "../common/workers.h"
#include "../format/manifest.h"
#include "../gpu/staged.h"
#include "../commit/txn.h"
#include "../io/params.h"
#include "../io/cache.h"
#include "../io/ring.h"
#include "open.h"
#include "stripes.h"

/* Staged segments closer than this are read as one request: reading the gap costs less than
 * another request. */
#define GAP_BYTES (128u << 10)
#define NONE UINT64_MAX
/* Residency is asked, and cached bytes are copied and verified, in pieces of this size: big
 * enough that a syscall per piece costs nothing, small enough to spread over the workers. */
#define CACHE_GRAN (1ull << 20)
/* An in-place read at most this long that touches a neighbouring range of the same file is
 * staged with it instead: one request for many small tensors, at the cost of one copy. */
#define MERGE_BYTES (256u << 10)

typedef struct rfile {
    int fd; /* -1 until a read needs the file */
    int bfd; /* a buffered descriptor for the resident ranges of a direct file, or -1 */
    ckptio__cachefile cf; /* residency of the file's pages, asked through bfd */
    int direct;
    uint32_t mem_align, off_align;
    uint64_t size; /* actual size on disk */
} rfile;

/* One (region, chunk) intersection. Its bytes in the chunk form `runs`: R = prod(cnt[0..k))
 * runs of run_len bytes, contiguous in the chunk and in dst, at src0 + sum(i_j * ss_j) and
 * dst0 + sum(i_j * ds_j). */
typedef struct piece {
    uint8_t *dst;
    uint64_t dst_cap, dst_bytes;
    uint64_t lead; /* bytes before dst the read may overwrite (ckptio_region.lead) */
    uint64_t chunk;
    uint64_t geo; /* index in geo[]: cnt[k], ss[k], ds[k] */
    uint64_t src0, dst0, run_len, runs;
    uint32_t k;
} piece;

/* Where a chunk's (or a foreign file's range's) stored bytes are, and whether they are checked. */
typedef struct extent {
    uint64_t off, len;
    uint32_t file;
    bool verify;
} extent;

/* A chunk byte range [a, b) to read, as one request (direct) or part of one (staged). */
typedef struct seg {
    uint64_t foff; /* file offset of a */
    uint64_t a, b;
    uint64_t piece; /* NONE: verify only */
    uint64_t chunk;
    uint64_t iter; /* index in iters[] of the first run ending after a (k entries) */
    uint64_t len;  /* direct: request length (>= b - a when the tail may overrun into scratch) */
    uint32_t file;
    uint8_t direct;
    uint8_t verify; /* whole checksum blocks: a and b lie on block boundaries (b: or chunk end) */
    uint8_t cached; /* resident when planned: read by the workers from the page cache */
    uint8_t coded;  /* [a, b) are the stored bytes of whole blocks blk0.. of a coded chunk */
    uint32_t head;  /* direct: the request starts this many bytes before a (and before dst) */
    uint64_t blk0, nblk;
} seg;

struct ckptio_reader {
    ckptio__msg msg;
    ckptio__cfg cfg;
    char *path;
    int dirfd;
    ckptio__manifest *m;
    uint8_t digest[32]; /* SHA-256 of the manifest's bytes (ckptio_reader_digest) */
    bool has_digest;    /* a checkpoint of ckptio's own (a foreign reader has none) */
    rfile *files;
    ckptio__ring ring; /* started on first read */
    ckptio__stripes stripes; /* striped: ckptio_reader_set_roots, the stripe directories */
    uint64_t buf_size; /* of a staging buffer */
    ckptio__gpu gpu;   /* CKPTIO_MEM_CUDA regions */
    ckptio_stats stats;
    ckptio_read_stats rstats;
    ckptio__workers *workers; /* verification and cached reads; started on first read */
    struct ckptio__decoder *dec; /* coded chunks: a codec context and a block per worker */
    ckptio_reader *base;         /* delta chunks: the base checkpoint, opened on first use */
    /* ckptio_reader_open_foreign: the directory the manifest's file names are relative to
     * (their links followed wherever they lead), NULL for a checkpoint of ckptio's own. */
    char *dir;
    /* A checkpoint or files in a store that is no local file system (store/store.h): the
     * place names are read from (its store NULL otherwise). */
    ckptio__place place;
    ckptio__handle_state hs; /* its pid only: the process whose threads its reads use */
    /* Calls back up the read room, set by the files above open.c (calls go down otherwise):
     * freeing the decoder (decode.c, once it made one), opening data file i of a foreign
     * reader (foreign.c), and reading a box of the base checkpoint through the public read
     * (chain.c: set by ckptio_reader_open, and given by a delta reader to the base it opens;
     * NULL in a reader of safetensors files, which hold no deltas). */
    void (*free_decoder)(ckptio_reader *r);
    int (*open_foreign_file)(ckptio_reader *r, uint32_t i);
    int (*base_read)(ckptio_reader *r, const char *name, uint32_t ndim, uint64_t esize,
                     const uint64_t *box, uint64_t a, uint64_t b, uint8_t *dst,
                     ckptio__msg *msg);
};

/* One read or verify operation: what to read (pieces, segs), then how (ios, in file order;
 * io i covers segs [firsts[i], firsts[i + 1])). Planning reads nothing: the files are open. */
typedef struct plan {
    rfile *files;
    uint64_t block;    /* checksum block */
    uint64_t request;  /* bytes per direct request */
    uint64_t buf_size; /* of a staging buffer */
    ckptio__vec pieces, segs, geo, iters, ios, firsts;
    ckptio__vec csegs; /* cached segments, in file order: read by the workers, not the ring */
    ckptio__vec blocks; /* scratch for one request's checksum blocks */
    uint8_t *bad; /* verify: per chunk, 1 once the chunk is counted in bad_chunks */
    uint64_t bad_chunks;
    /* The damaged block of lowest (file, offset) seen so far: the one reported, whatever the
     * order in which reads complete. */
    bool has_bad;
    uint32_t bad_file;
    uint64_t bad_foff, bad_chunk, bad_x, bad_len;
    int cache; /* CKPTIO__CACHE_*: split segments by residency, or read them all buffered */
    ckptio__workers *workers;
    uint64_t cache_bytes, requests, merged;
} plan;

/* A region resolved against the manifest: tensor, box and size. */
typedef struct box {
    const ckptio_region *reg;
    uint64_t t;
    uint64_t bytes;
    uint64_t ro[CKPTIO_MAX_NDIM], rs[CKPTIO_MAX_NDIM];
} box;

/* What one cached segment's job found. */
typedef struct cres {
    int rc;       /* 0, -errno, or CKPTIO_E_CORRUPT: the file ended `got` bytes into the part */
    bool bad;     /* a checksum mismatch at bad_x (chunk bytes), bad_len long */
    uint64_t got, bad_x, bad_len;
} cres;

/* Stores that are no local file system (open.c; ckptio__store_remote tells): set r up to read
 * from the place `path` there (its reads on the psync threads, as many as the store serves at
 * once; no page cache, no O_DIRECT); open `name` of the place as file f, `known` its length
 * where the manifest records it (else UINT64_MAX: the store is asked). */
CKPTIO__HIDDEN int ckptio__read_remote_setup(ckptio_reader *r, const char *path);
CKPTIO__HIDDEN int ckptio__read_open_remote(ckptio_reader *r, rfile *f, const char *name,
                                            uint64_t known);

/* The first versions of the structs that may grow end with these fields. */
#define REGION_V1 (offsetof(ckptio_region, capacity) + sizeof(uint64_t))
#define RANGE_V1 (offsetof(ckptio_range, dst) + sizeof(void *))
#define TENSOR_INFO_V1 (offsetof(ckptio_tensor_info, num_chunks) + sizeof(uint64_t))

static inline const char *tname(const ckptio_reader *r, uint64_t chunk)
{
    return r->m->strtab + r->m->tensors[r->m->chunks[chunk].tensor].name;
}

static inline const char *fname(const ckptio_reader *r, uint32_t file)
{
    return r->m->strtab + r->m->files[file].name;
}

/* ---- open.c: opening the files ---- */

/* Element i of the caller's array of sized structs (stride: element 0's size) into *out, as
 * far as its size covers; the rest of *out is zero. */
CKPTIO__HIDDEN int ckptio__read_take_sized(ckptio__msg *msg, void *out, size_t ours, size_t v1,
                                           const void *arr, size_t i, const char *fn,
                                           const char *type);

/* The ring, on the first read: planning does not need it. */
CKPTIO__HIDDEN int ckptio__read_start_ring(ckptio_reader *r);

/* Open a file to read and learn its size and alignment; -errno. */
CKPTIO__HIDDEN int ckptio__read_open_rfile(rfile *f, int dirfd, const char *name, int want_direct,
                                           int cache);

CKPTIO__HIDDEN void ckptio__read_close_rfile(rfile *f);

/* Data files are opened when a read first needs them, before it is planned: a checkpoint with
 * a damaged file can still be inspected and its other tensors read, and a reader holds no more
 * descriptors than its reads need. */
CKPTIO__HIDDEN int ckptio__read_open_file(ckptio_reader *r, uint32_t i);

CKPTIO__HIDDEN int64_t ckptio__read_find_tensor(const ckptio_reader *r, const char *name);

/* ckptio_reader_open without its base_read hook (chain.c's public open sets it). */
CKPTIO__HIDDEN int ckptio__read_open(ckptio_reader **out, const char *path, const ckptio_params *p);
/* The same, with the manifest's bytes `given` (another rank read them; copied, checked as if
 * read here) instead of reading them; keep (may be NULL): on success, the manifest's bytes (the
 * given ones or those read), malloc'd, for the caller to free. */
CKPTIO__HIDDEN int ckptio__read_open_with(ckptio_reader **out, const char *path,
                                          const ckptio_params *p, const uint8_t *given,
                                          uint64_t given_len, uint8_t **keep, uint64_t *keep_len);

/* Whether chunk c's reads verify its checksums. */
CKPTIO__HIDDEN bool ckptio__read_verifying(const ckptio_reader *r, const ckptio__mchunk *c);

/* A reader for `path` with its options resolved and nothing open yet: *out is set, even on
 * failure (then close it with ckptio__read_fail_open). */
CKPTIO__HIDDEN int ckptio__read_new(const char *path, const ckptio_params *p, ckptio_reader **out);
/* Once r->m is set: the data file table and the staging size. */
CKPTIO__HIDDEN int ckptio__read_setup(ckptio_reader *r);
/* Close the half-open r (may be NULL) and raise its message as the open's failure. */
CKPTIO__HIDDEN int ckptio__read_fail_open(ckptio_reader *r, int rc);

/* ---- scatter.c: what reads and decodes share ---- */

/* Damaged bytes [x, x + len) of the segment's chunk (stored offsets): verify counts the chunk;
 * the lowest (file, offset) is remembered for the report. CKPTIO_E_CHECKSUM, or 0 when the
 * plan counts damage instead of failing (verify). */
CKPTIO__HIDDEN int ckptio__read_note_bad(const ckptio_reader *r, plan *pl, const seg *s,
                                         uint64_t x, uint64_t len);

/* Copy the parts of a piece's runs that fall in [a, b) out of the staging buffer. */
CKPTIO__HIDDEN void ckptio__read_scatter(plan *pl, const seg *s, const uint8_t *base);

/* ---- plan.c: planning ---- */

CKPTIO__HIDDEN extent ckptio__read_chunk_extent(const ckptio_reader *r, uint64_t chunk);

/* Cut extent bytes [a, b) into staged segments. */
CKPTIO__HIDDEN int ckptio__read_plan_staged(plan *pl, const extent *x, seg proto, uint64_t a,
                                            uint64_t b);

/* A piece that is one run: read straight into dst where alignment allows. */
CKPTIO__HIDDEN int ckptio__read_plan_single_run(plan *pl, const extent *x, const piece *p,
                                                seg proto);

/* Split the segments by page-cache residency: resident granules go to csegs, copied by the
 * workers through the buffered descriptor; runs of the others stay for the device. */
CKPTIO__HIDDEN int ckptio__read_plan_cache(plan *pl);

/* Turn the segments into requests, in file order: a direct segment is one request, staged
 * neighbours share one staging buffer. */
CKPTIO__HIDDEN int ckptio__read_plan_ios(plan *pl);

/* Open the chunk's file and check that the chunk lies within it: all a read does before it is
 * planned. */
CKPTIO__HIDDEN int ckptio__read_prepare_chunk(ckptio_reader *r, uint64_t chunk);

/* Check a region against the manifest, resolve it into *bx, and open the files its chunks are
 * in. */
CKPTIO__HIDDEN int ckptio__read_prepare_region(ckptio_reader *r, const ckptio_region *reg, size_t i,
                                               box *bx);

CKPTIO__HIDDEN int ckptio__read_plan_region(ckptio_reader *r, plan *pl, const box *bx);

/* ---- regions.c: region reads ---- */

/* Regions [first, first + n) of the caller's array (`regions`, strided by element 0's size),
 * planned and read together: ckptio_reader_read once its arguments are checked. */
CKPTIO__HIDDEN int ckptio__read_range(ckptio_reader *r, const ckptio_region *regions, size_t first,
                                      size_t n);

/* ---- decode.c: coded chunks (format 3) ---- */

/* Stored offset of block j of coded chunk c: the sum of the sizes before it. */
CKPTIO__HIDDEN uint64_t ckptio__read_block_at(const ckptio__manifest *m, const ckptio__mchunk *c,
                                              uint64_t j);
/* Plan chunk bytes [lo, hi) (raw) of a coded chunk as staged segments of whole blocks. */
CKPTIO__HIDDEN int ckptio__read_plan_coded(ckptio_reader *r, plan *pl, seg proto, uint64_t lo,
                                           uint64_t hi);
/* Decode, verify and scatter the coded segments segs[first, last), staged in buf (file offset
 * off), on the workers. Damage is noted as a checksum mismatch would be. */
CKPTIO__HIDDEN int ckptio__read_decode_io(ckptio_reader *r, plan *pl, size_t first, size_t last,
                                          const uint8_t *buf, uint64_t off);
/* A coded chunk cannot be handed out as file bytes (mmap, GDS): CKPTIO_E_UNSUPPORTED. */
CKPTIO__HIDDEN bool ckptio__chunk_coded(const ckptio__mchunk *c);

/* ---- execute.c: running a plan ---- */

/* The segments of io i, [*first, *last). */
CKPTIO__HIDDEN void ckptio__read_io_segs(const plan *pl, size_t i, size_t *first, size_t *last);

CKPTIO__HIDDEN void ckptio__read_plan_init(plan *pl, rfile *files, uint64_t block, uint64_t request,
                                           uint64_t buf_size);

CKPTIO__HIDDEN void ckptio__read_plan_free(plan *pl);

/* Run every cached segment's job on the workers; *out (the caller frees it) says how each went. */
CKPTIO__HIDDEN int ckptio__read_run_cached(plan *pl, const ckptio_reader *r, cres **out);

CKPTIO__HIDDEN int ckptio__read_start_workers(ckptio__workers **w, unsigned n, ckptio__msg *msg,
                                              const char *label);

/* Read everything planned: resident parts by the workers, then the rest through the ring.
 * Both run to the end after a checksum mismatch, so the damaged block reported is the first
 * in file order whatever the timing. */
CKPTIO__HIDDEN int ckptio__read_execute(ckptio_reader *r, plan *pl);

#endif
