/* SPDX-License-Identifier: Apache-2.0 */
/* The writer's insides, shared by its files: data files, chunks, open and commit. */
#ifndef CKPTIO_WRITE_WRITER_H
#define CKPTIO_WRITE_WRITER_H

#include <stdio.h>

#include "../codec/codec.h"
#include "../commit/stripe.h"
#include "../common/workers.h"
#include "../commit/txn.h"
#include "../common/hasher.h"
#include "../format/manifest.h"
#include "../gpu/staged.h"
#include "../io/params.h"
#include "../io/sink.h"
#include "part.h"

/* Per-tensor bookkeeping while writing; becomes a ckptio__mtensor at commit (format/build.c). */
typedef ckptio__btensor wtensor;

/* Checksums of a large chunk, computed by the hasher into `buf`, copied into csums[at] once
 * the hasher is idle (csums may move while it works). */
typedef struct pending_csums {
    uint64_t at, n;
    uint64_t *buf;
} pending_csums;

/* Chunks at least this large are hashed on the hasher thread. */
#define ASYNC_HASH_MIN (1u << 20)

/* A metadata entry, key and value owned by the writer. */
typedef ckptio__bmeta wmeta;

/* A data file's writing state while another lane is current (striping). */
typedef struct lane {
    int fd;            /* -1: no file yet (the lane's first file is made on first use) */
    ckptio__sink sink; /* its own engine, so its writes stay in flight while others are fed */
    char *label;
    uint32_t file;     /* index of its current data file */
    uint64_t bytes;    /* chunk bytes given to it, for balancing */
} lane;

/* A block of the name arena: names never move, so the map can point at them. */
typedef struct arena_block {
    struct arena_block *prev;
    size_t used, cap;
    char data[];
} arena_block;

struct ckptio_writer {
    ckptio__msg msg;
    ckptio__cfg cfg;
    ckptio__handle_state hs;
    ckptio__txn txn;   /* the temporary directory and its publish */
    const char *path;  /* txn.path, for messages */
    int fd;            /* the data file */
    char *data_label; /* its path, for messages */
    char *tmp_abs;      /* a distributed save's temporary directory, absolute, for the ranks */
    bool part_done;     /* a rank's share is written and described; only publish may follow */
    /* The data files: file i is data/<prefix><i in 6 digits>.ckd, in the checkpoint's
     * directory or, striped, in the stripe directory of its root. Bytes go to the current one
     * (fd, sink, cur_file); sizes[i] is file i's length once it is finished. */
    char *file_prefix;       /* NULL: none */
    uint64_t max_file_bytes; /* a chunk that would pass it starts the next file; 0: no bound */
    uint64_t *sizes;
    uint32_t *file_roots;    /* 0: the checkpoint's directory; k: stripes[k - 1] */
    size_t n_files, cap_files;
    uint32_t cur_file;
    bool is_part;
    bool parts;    /* the store takes data in whole parts (CKPTIO__STORE_PARTS) */
    uint64_t part; /* parts: bytes per part (= the sink's request size) */
    bool splitting; /* add_split is adding the pieces of one chunk */
    /* Striping (ckptio_writer_set_roots): lane 0 writes into the checkpoint's own data/, lane
     * k into stripes[k - 1]. The current lane's file is fd/sink/data_label/cur_file; the others
     * wait in lanes[] (the current one's entry is empty) with their writes in flight. */
    ckptio__stripe *stripes;
    lane *lanes;
    size_t n_stripes, cur_lane;
    ckptio__sink sink;
    ckptio__hasher *hasher; /* started with the first large chunk */
    ckptio__vec pending;    /* pending_csums: checksums the hasher is still computing */

    ckptio__vec tensors; /* wtensor */
    ckptio__vec chunks;  /* ckptio__mchunk */
    ckptio__vec next;    /* uint64_t, parallel to chunks */
    ckptio__vec dims;    /* uint64_t */
    ckptio__vec csums;   /* uint64_t */
    ckptio__vec blocks;  /* uint32_t: the coded chunks' block sizes (coded.c) */
    struct ckptio__coder *coder; /* started with the first coded chunk */
    char *base;          /* params.base: the base's path, relative to the checkpoint */
    uint64_t base_sum;   /* XXH3-64 of the base's manifest */
    ckptio_reader *base_reader; /* the base, open (base.c) */
    ckptio__vec meta;    /* wmeta */
    ckptio__strmap names;
    arena_block *arena;

    ckptio__gpu gpu; /* CKPTIO_MEM_CUDA chunks: pinned ring, stream, cuFile */

    double t_open;
    ckptio_stats stats;
};

/* A striped writer cuts chunks into pieces of at least this size (add_split). */
#define STRIPE_PIECE_MIN (32ull << 20)

/* Longest data file name: "data/", a prefix, 7 digits at most (CKPTIO__MAX_FILES), ".ckd". */
#define MAX_PREFIX 64
#define DATA_NAME_LEN (MAX_PREFIX + 32)

/* Data files are <data_dir>/<prefix><n>.ckd: data/ in a directory; in an object store the
 * save's own component "d-<id>", so that no two saves ever share an object name. */
static inline void data_name(const ckptio_writer *w, uint64_t i, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s%06llu.ckd", w->txn.data_dir,
             w->file_prefix ? w->file_prefix : "", (unsigned long long)i);
}

/* Close a data file's descriptor, or forget an object's (aborting its upload if unfinished). */
CKPTIO__HIDDEN void ckptio__writer_close_data(int fd);

/* Chunks at least this large are coded when compression is on; smaller ones (norms, biases)
 * are stored as they are, where their short extents keep 64-byte alignment. */
#define CODED_MIN (64u << 10)

/* ---- hashed.c ---- */

/* Write n bytes of a chunk as they are at file offset `off` (in place when aligned, else through
 * staging), their block checksums to csums[csum_at...] (n_csums of them, 0: none). */
CKPTIO__HIDDEN int ckptio__writer_put_raw(ckptio_writer *w, const uint8_t *src, uint64_t n,
                                          uint64_t off, uint64_t csum_at, uint64_t n_csums);
/* The checksums of the csum_block-sized blocks of src[0, n), into out[]. */
CKPTIO__HIDDEN void ckptio__writer_hash_blocks(ckptio_writer *w, const uint8_t *src, uint64_t n,
                                               uint64_t *out);
/* Wait for the hasher and move its results into place. */
CKPTIO__HIDDEN void ckptio__writer_settle_hashes(ckptio_writer *w);

/* ---- coded.c ---- */

/* AUTO stores `skip` of every SKIP_OF blocks as they are without trying them; from half of
 * them on, or after a chunk in which nothing shrank, whole host chunks go as they are, but for
 * a coded one every PROBE_BYTES. */
#define SKIP_OF 16u
#define PROBE_BYTES (256ull << 20)

/* The writer's block coder (coded.c), started with its first coded chunk. */
typedef struct ckptio__coder {
    ckptio__workers *workers;
    unsigned threads, slots;
    uint64_t block;
    ckptio__codec_ctx **ctx; /* one per thread */
    uint8_t *out;            /* slots blocks: what each block of a round codes to */
    uint8_t *delta;          /* threads blocks: a block XORed with its base */
    uint8_t *base;           /* slots blocks: the base's bytes of a round (deltas) */
    unsigned skip, tick;     /* AUTO's share of blocks left as they are, and a counter */
    unsigned idle;           /* AUTO: rounds in a row that ended with no write in flight */
    uint64_t unprobed;       /* AUTO: bytes stored as they are since the last coded chunk */
    bool futile;             /* AUTO: nothing of the last coded chunk shrank */
} ckptio__coder;


/* Whether a host chunk of this dtype and size is stored coded, and with which codec (0: as it
 * is). */
CKPTIO__HIDDEN unsigned ckptio__writer_codec(ckptio_writer *w, int dtype, uint64_t nbytes,
                                             bool host);
/* Write chunk `chunk` (n bytes at src, its record already pushed with file_off = the cursor
 * aligned to 4096) coded with `codec`: its blocks encoded on the writer's threads, checksummed
 * (decoded bytes) into csums[csum_at...], stored back to back; then fill in the record's
 * stored_len, codec (NONE if no block shrank) and block sizes. With a base holding the same
 * tensor, the chunk is a delta (blocks XORed with the base's bytes before coding) when its
 * first block codes smaller that way. */
CKPTIO__HIDDEN int ckptio__writer_put_coded(ckptio_writer *w, uint64_t chunk, const uint8_t *src,
                                            uint64_t n, uint64_t csum_at, unsigned codec,
                                            int dtype);
/* The same for a chunk in device memory (a CKPTIO_MEM_CUDA pointer): its bytes come through
 * the GPU's pinned ring, a slot at a time, and are coded there (GPU codecs come later). */
CKPTIO__HIDDEN int ckptio__writer_put_coded_gpu(ckptio_writer *w, uint64_t chunk, uint64_t src,
                                                uint64_t n, uint64_t csum_at, unsigned codec,
                                                int dtype, uint64_t stream, const char *name);

/* ---- base.c ---- */

/* Open params.base (w->cfg.base) and record its relative path and manifest checksum. */
CKPTIO__HIDDEN int ckptio__writer_open_base(ckptio_writer *w);
/* Bytes [a, b) of chunk `chunk`'s box in the base: 1 (in dst), 0 when the base has no tensor
 * of that name, dtype and shape, or a negative code (w->msg says why). */
CKPTIO__HIDDEN int ckptio__writer_base_bytes(ckptio_writer *w, uint64_t chunk, uint64_t a,
                                             uint64_t b, uint8_t *dst);
CKPTIO__HIDDEN void ckptio__writer_coder_free(ckptio_writer *w);

/* ---- handle.c: the state every file of the writer shares ---- */

/* A copy of s[0, len) in the name arena, NUL-terminated; it never moves. */
CKPTIO__HIDDEN const char *ckptio__writer_arena_dup(ckptio_writer *w, const char *s, size_t len);

/* Fail the writer for good with `code`, or with the store's truer reason (ckptio__txn_failed,
 * which may rewrite w->msg): every later call but close returns the code this returns. */
CKPTIO__HIDDEN int ckptio__writer_poison(ckptio_writer *w, int code);

/* 0 while the writer may be fed or committed, else why not (in its message). */
CKPTIO__HIDDEN int ckptio__writer_check_usable(ckptio_writer *w);

/* ---- data_files.c ---- */

/* Register data file number n_files in root `root` and create it: *fd, *direct, *label. */
CKPTIO__HIDDEN int ckptio__writer_new_file(ckptio_writer *w, uint32_t root, int *fd, int *direct,
                                           char **label, uint32_t *index);

/* Finish a data file: its writes done, its length cut and recorded, fsynced, closed. */
CKPTIO__HIDDEN int ckptio__writer_finish_file(ckptio_writer *w, ckptio__sink *s, int *fd,
                                              const char *label, uint32_t file);

/* Finish the current data file and go on in the next one of the same root, through the same
 * sink. */
CKPTIO__HIDDEN int ckptio__writer_roll_file(ckptio_writer *w);

/* Make lane k current, parking the current one with its writes in flight; a lane's first use
 * starts its engine and creates its first file. */
CKPTIO__HIDDEN int ckptio__writer_lane_enter(ckptio_writer *w, size_t k);

/* The lane for a chunk of n bytes: the one given the fewest bytes so far (equal chunks go
 * round-robin), so each root receives an equal share. */
CKPTIO__HIDDEN size_t ckptio__writer_pick_lane(ckptio_writer *w, uint64_t n);


/* ---- stripe_leftovers.c ---- */

/* The absolute path that stripes of the checkpoint at `target` record as their owner
 * (malloc'd; NULL when its parent cannot be resolved). */
CKPTIO__HIDDEN char *ckptio__stripe_owner_of(const char *target);
/* Remove (dry: count) the stripes of `owner` in `root` that no live save holds and that the
 * checkpoint published at `owner` does not name. */
CKPTIO__HIDDEN int ckptio__stripe_collect_owned(const char *owner, const char *root, bool dry,
                                                unsigned *found);
/* The roots recorded by the checkpoint published at `dir` (none for format 1 or no
 * checkpoint); free each and the array. */
CKPTIO__HIDDEN int ckptio__stripe_recorded_roots(const char *dir, char ***roots, size_t *n);

#endif
