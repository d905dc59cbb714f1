/* SPDX-License-Identifier: Apache-2.0 */
/* The writer: streams chunks into a data file through the staging ring and commits atomically. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commit/stripe.h"
#include "commit/txn.h"
#include "common/hasher.h"
#include "common/box.h"
#include "format/manifest.h"
#include "gpu/staged.h"
#include "internal.h"
#include "io/engine.h"
#include "io/sink.h"
#include "io/vfs.h"

/* Per-tensor bookkeeping while writing; becomes a ckptio__mtensor at commit. */
typedef struct wtensor {
    const char *name; /* in the name arena, NUL-terminated */
    uint32_t name_len;
    uint32_t dtype, ndim;
    uint64_t dims;       /* global shape in w->dims */
    uint64_t head, tail; /* chunk list through w->next (UINT64_MAX = none) */
    uint64_t n_chunks;
    uint64_t covered;    /* sum of chunk volumes, elements */
} wtensor;

/* Checksums of a large chunk, computed by the hasher into `buf`, copied into csums[at] once
 * the hasher is idle (csums may move while it works). */
typedef struct pending_csums {
    uint64_t at, n;
    uint64_t *buf;
} pending_csums;

/* Chunks at least this large are hashed on the hasher thread. */
#define ASYNC_HASH_MIN (1u << 20)

typedef struct wmeta {
    char *key;
    size_t key_len;
    uint8_t *val;
    size_t val_len;
} wmeta;

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
    ckptio__vec meta;    /* wmeta */
    ckptio__strmap names;
    arena_block *arena;

    ckptio__gpu gpu; /* CKPTIO_MEM_CUDA chunks: pinned ring, stream, cuFile */

    double t_open;
    ckptio_stats stats;
};

/* ---- small helpers ---- */

static const char *arena_dup(ckptio_writer *w, const char *s, size_t len)
{
    arena_block *b = w->arena;
    if (!b || b->cap - b->used < len + 1) {
        size_t cap = CKPTIO__MAX((size_t)1 << 20, len + 1);
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->prev = b;
        nb->used = 0;
        nb->cap = cap;
        w->arena = b = nb;
    }
    char *p = b->data + b->used;
    memcpy(p, s, len);
    p[len] = 0;
    b->used += len + 1;
    return p;
}

static int poison(ckptio_writer *w, int code)
{
    return ckptio__handle_poison(&w->hs, code);
}

static int check_usable(ckptio_writer *w)
{
    return ckptio__handle_usable(&w->hs, &w->msg, w->path);
}

/* A striped writer cuts chunks into pieces of at least this size (add_split). */
#define STRIPE_PIECE_MIN (32ull << 20)

/* Longest data file name: "data/", a prefix, 7 digits at most (CKPTIO__MAX_FILES), ".ckd". */
#define MAX_PREFIX 64
#define DATA_NAME_LEN (MAX_PREFIX + 32)

static void data_name(const ckptio_writer *w, uint64_t i, char *buf, size_t cap)
{
    snprintf(buf, cap, "data/%s%06llu.ckd", w->file_prefix ? w->file_prefix : "",
             (unsigned long long)i);
}

/* Register data file number n_files in root `root` and create it: *fd, *direct, *label. */
static int new_file(ckptio_writer *w, uint32_t root, int *fd, int *direct, char **label,
                    uint32_t *index)
{
    *fd = -1;
    *label = NULL;
    if (w->n_files >= CKPTIO__MAX_FILES)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT,
                            "'%s' would need more than %u data files; raise max_file_bytes",
                            w->path, CKPTIO__MAX_FILES);
    if (w->n_files == w->cap_files) {
        size_t cap = w->cap_files ? 2 * w->cap_files : 16;
        uint64_t *d = realloc(w->sizes, cap * sizeof *d);
        if (d) w->sizes = d;
        uint32_t *r = d ? realloc(w->file_roots, cap * sizeof *r) : NULL;
        if (r) w->file_roots = r;
        CKPTIO__RET_IF(!r, -ENOMEM);
        w->cap_files = cap;
    }
    char name[DATA_NAME_LEN];
    data_name(w, w->n_files, name, sizeof name);
    int dir = root ? w->stripes[root - 1].fd : w->txn.tmp_fd;
    const char *where = root ? w->stripes[root - 1].path : w->txn.tmp_path;
    CKPTIO__RET_IF(asprintf(label, "%s/%s", where, name) < 0, -ENOMEM);
    int rc = ckptio__file_open(dir, name, CKPTIO__F_WRITE, w->cfg.direct, fd, direct);
    if (rc < 0) {
        free(*label);
        *label = NULL;
        *fd = -1;
        return ckptio__fail(&w->msg, rc, "cannot create data file '%s/%s'%s", where, name,
                            rc == -EINVAL ? ": the file system refuses O_DIRECT; use direct=auto"
                                          : "");
    }
    w->sizes[w->n_files] = 0;
    w->file_roots[w->n_files] = root;
    *index = (uint32_t)w->n_files++;
    return 0;
}

/* Finish a data file: its writes done, its length cut and recorded, fsynced, closed. */
static int finish_file(ckptio_writer *w, ckptio__sink *s, int *fd, const char *label,
                       uint32_t file)
{
    CKPTIO__TRY(ckptio__sink_finish(s));
    int rc;
    if (w->cfg.fsync && (rc = ckptio__fsync(*fd)) < 0)
        return ckptio__fail(&w->msg, rc, "fsync of '%s' failed: the data may not be on the device",
                            label);
    if (w->gpu.gds_fd == *fd) ckptio__gpu_gds_forget(&w->gpu); /* cuFile lets go of it first */
    close(*fd);
    *fd = -1;
    w->sizes[file] = s->cursor;
    return 0;
}

/* Finish the current data file and go on in the next one of the same root, through the same
 * sink. */
static int roll_file(ckptio_writer *w)
{
    if (w->n_files >= CKPTIO__MAX_FILES)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT,
                            "'%s' would need more than %u data files; raise max_file_bytes",
                            w->path, CKPTIO__MAX_FILES);
    CKPTIO__TRY(finish_file(w, &w->sink, &w->fd, w->data_label, w->cur_file));
    char *label;
    int direct = 0;
    uint32_t f;
    CKPTIO__TRY(new_file(w, (uint32_t)w->cur_lane, &w->fd, &direct, &label, &f));
    w->cur_file = f;
    int rc = ckptio__sink_switch(&w->sink, w->fd, direct, label);
    free(w->data_label);
    w->data_label = label;
    return rc;
}

/* Make lane k current, parking the current one with its writes in flight; a lane's first use
 * starts its engine and creates its first file. */
static int lane_enter(ckptio_writer *w, size_t k)
{
    if (k == w->cur_lane) return 0;
    lane *from = &w->lanes[w->cur_lane], *to = &w->lanes[k];
    from->fd = w->fd;
    from->sink = w->sink;
    from->label = w->data_label;
    from->file = w->cur_file;
    w->cur_lane = k;
    w->fd = to->fd;
    w->sink = to->sink;
    w->data_label = to->label;
    w->cur_file = to->file;
    to->fd = -1;
    memset(&to->sink, 0, sizeof to->sink);
    to->label = NULL;
    if (w->fd >= 0) return 0;
    int direct = 0;
    uint32_t f;
    CKPTIO__TRY(new_file(w, (uint32_t)k, &w->fd, &direct, &w->data_label, &f));
    w->cur_file = f;
    return ckptio__sink_init(&w->sink, w->fd, direct, w->cfg.backend, w->cfg.depth,
                             w->cfg.threads, w->cfg.staging, w->cfg.request, w->data_label,
                             &w->msg);
}

/* The lane for a chunk of n bytes: the one given the fewest bytes so far (equal chunks go
 * round-robin), so each root receives an equal share. */
static size_t pick_lane(ckptio_writer *w, uint64_t n)
{
    size_t best = 0;
    for (size_t k = 1; k <= w->n_stripes; k++)
        if (w->lanes[k].bytes < w->lanes[best].bytes) best = k;
    w->lanes[best].bytes += n;
    return best;
}

int ckptio__writer_set_data_files(ckptio_writer *w, const char *prefix, uint64_t max_file_bytes)
{
    if (!w)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_set_data_files: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    if (w->chunks.len || w->n_files > 1)
        return ckptio__fail(&w->msg, CKPTIO_E_STATE,
                            "writer for '%s': set the data files before the first "
                            "ckptio_writer_add",
                            w->path);
    size_t len = prefix ? strlen(prefix) : 0;
    bool ok = len <= MAX_PREFIX;
    for (size_t i = 0; ok && i < len; i++) {
        char c = prefix[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || (c == '.' && i > 0);
    }
    if (!ok)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "data file prefix '%.80s' is not valid: at most %d of [A-Za-z0-9._-], "
                            "not starting with '.'",
                            prefix, MAX_PREFIX);
    const char *old = w->file_prefix ? w->file_prefix : "";
    if (strcmp(old, len ? prefix : "") != 0) {
        /* The first data file exists since open: give it its new name. */
        char from[DATA_NAME_LEN], to[DATA_NAME_LEN], *label, *p = len ? strdup(prefix) : NULL;
        CKPTIO__RET_IF(len && !p, -ENOMEM);
        data_name(w, 0, from, sizeof from);
        char *was = w->file_prefix;
        w->file_prefix = p;
        data_name(w, 0, to, sizeof to);
        if (asprintf(&label, "%s/%s", w->txn.tmp_path, to) < 0) label = NULL;
        if (!label || CKPTIO__VFS->renameat2(w->txn.tmp_fd, from, w->txn.tmp_fd, to, 0) < 0) {
            int rc = label ? -errno : -ENOMEM;
            free(label);
            free(p);
            w->file_prefix = was;
            return ckptio__fail(&w->msg, rc, "cannot rename '%s/%s' to '%s'", w->txn.tmp_path, from,
                                to);
        }
        free(was);
        free(w->data_label);
        w->data_label = label;
        w->sink.label = label;
    }
    w->max_file_bytes = max_file_bytes;
    return 0;
}

int ckptio_writer_set_data_files(ckptio_writer *w, const char *prefix, uint64_t max_file_bytes)
{
    return ckptio__writer_set_data_files(w, prefix, max_file_bytes);
}

static void hash_blocks(ckptio_writer *w, const uint8_t *src, uint64_t n, uint64_t *out)
{
    uint64_t B = w->cfg.csum_block;
    for (uint64_t i = 0, k = 0; i < n; i += B, k++) out[k] = ckptio__hash(src + i, CKPTIO__MIN(B, n - i));
}

/* Wait for the hasher and move its results into place. */
static void settle_hashes(ckptio_writer *w)
{
    if (!w->pending.len) return;
    ckptio__hasher_wait(w->hasher);
    for (size_t i = 0; i < w->pending.len; i++) {
        pending_csums *p = CKPTIO__VEC_AT(&w->pending, pending_csums, i);
        memcpy(CKPTIO__VEC_AT(&w->csums, uint64_t, p->at), p->buf, p->n * sizeof *p->buf);
        free(p->buf);
    }
    w->pending.len = 0;
}

typedef struct hash_ctx {
    ckptio_writer *w;
    uint64_t csum_at; /* the chunk's first checksum */
} hash_ctx;

/* The sink's hook: checksums of the blocks of one piece, `at` bytes into the chunk (pieces
 * start on block boundaries). */
static void hash_piece(void *ctx, const uint8_t *piece, uint64_t n, uint64_t at)
{
    hash_ctx *h = ctx;
    hash_blocks(h->w, piece, n,
                CKPTIO__VEC_AT(&h->w->csums, uint64_t, h->csum_at + at / h->w->cfg.csum_block));
}

/* Write one chunk's bytes at `off`; its block checksums go to csums[csum_at...]. Large chunks
 * are hashed by the hasher thread from the caller's memory while this thread copies and
 * submits, which the buffer lifetime rule (valid until flush or commit) allows. */
static int write_chunk(ckptio_writer *w, const uint8_t *src, uint64_t n, uint64_t off,
                       uint64_t csum_at, uint64_t n_csums)
{
    uint64_t B = w->cfg.csum_block;
    bool async = n_csums && n >= ASYNC_HASH_MIN;
    if (async) {
        if (!w->hasher) CKPTIO__TRY(ckptio__hasher_start(&w->hasher, B));
        pending_csums p = {.at = csum_at, .n = n_csums, .buf = malloc(n_csums * sizeof(uint64_t))};
        if (!p.buf || ckptio__vec_push(&w->pending, &p, 1) < 0) {
            free(p.buf);
            return -ENOMEM;
        }
        CKPTIO__TRY(ckptio__hasher_push(w->hasher, src, n, p.buf));
    }
    CKPTIO__TRY(ckptio__sink_seek(&w->sink, off));
    hash_ctx h = {.w = w, .csum_at = csum_at};
    return ckptio__sink_put(&w->sink, src, n, B, n_csums && !async ? hash_piece : NULL, &h);
}

/* ---- GPU chunks ---- */

/* Chunks at least this large, at 4 KiB aligned offsets, go through cuFile where it works. */
#define GDS_MIN (1u << 20)

typedef struct gpu_put {
    ckptio_writer *w;
    uint64_t csum_at;
    uint64_t write_from; /* bytes of the chunk before this went to the file by GDS */
    bool hash;
} gpu_put;

/* A piece of a device chunk, landed in the pinned ring: copied into the sink's staging (never
 * written from in place: the slot is reused at once) and hashed while in cache. Pieces are
 * whole checksum blocks but the last. */
static int put_staged(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    gpu_put *p = ctx;
    ckptio_writer *w = p->w;
    uint64_t B = w->cfg.csum_block;
    for (uint64_t i = 0; i < n; i += B) {
        uint64_t len = CKPTIO__MIN(B, n - i), skip = 0;
        if (at + i < p->write_from) skip = CKPTIO__MIN(p->write_from - (at + i), len);
        if (skip < len) CKPTIO__TRY(ckptio__sink_write(&w->sink, host + i + skip, len - skip));
        if (p->hash)
            *CKPTIO__VEC_AT(&w->csums, uint64_t, p->csum_at + (at + i) / B) =
                ckptio__hash(host + i, len);
    }
    return 0;
}

static int write_chunk_gpu(ckptio_writer *w, uint64_t src, uint64_t n, uint64_t off,
                           uint64_t csum_at, uint64_t n_csums, uint64_t stream, const char *name)
{
    ckptio__gpu *g = &w->gpu;
    CKPTIO__TRY(ckptio__sink_seek(&w->sink, off));
    gpu_put p = {.w = w, .csum_at = csum_at, .hash = n_csums > 0};
    if (n >= GDS_MIN && off % 4096 == 0 && ckptio__gpu_gds_file(g, w->fd, w->sink.direct)) {
        /* cuFile writes the 4 KiB-aligned body; the tail goes through the sink, after it, so
         * that the sink's next window starts where cuFile's bytes end. */
        uint64_t body = n / 4096 * 4096;
        CKPTIO__TRY(ckptio__sink_skip(&w->sink, body));
        p.write_from = body;
        /* Checksums come from a staged copy, taken first: it also orders us after the
         * caller's stream, as cuFile (synchronous, stream-less) cannot. */
        if (p.hash) {
            CKPTIO__TRY(ckptio__gpu_d2h(g, src, n, stream, put_staged, &p, &w->msg, name));
        } else {
            CKPTIO__TRY(ckptio__gpu_wait_caller(g, stream, &w->msg, name));
            p.write_from = 0;
            if (n > body)
                CKPTIO__TRY(ckptio__gpu_d2h(g, src + body, n - body, stream, put_staged, &p,
                                            &w->msg, name));
        }
        if (n > body) ckptio__gpu_count(g, false, n - body);
        return ckptio__gpu_gds_io(g, true, src, body, off, &w->msg, w->data_label);
    }
    CKPTIO__TRY(ckptio__gpu_d2h(g, src, n, stream, put_staged, &p, &w->msg, name));
    ckptio__gpu_count(g, false, n);
    return 0;
}

/* ---- open ---- */

/* The temporary directory's contents: data/ and the data file, streamed through the sink. */
static int make_data(ckptio_writer *w)
{
    const char *tmp = w->txn.tmp_path;
    char file[DATA_NAME_LEN];
    data_name(w, 0, file, sizeof file);
    /* The ranks of a distributed save share data/: whoever comes first makes it. */
    if (CKPTIO__VFS->mkdirat(w->txn.tmp_fd, "data", 0755) < 0 &&
        !(!w->txn.owner && errno == EEXIST))
        return ckptio__fail(&w->msg, -errno, "cannot create '%s/data'", tmp);
    int direct = 0;
    uint32_t first;
    CKPTIO__TRY(new_file(w, 0, &w->fd, &direct, &w->data_label, &first));
    return ckptio__sink_init(&w->sink, w->fd, direct, w->cfg.backend, w->cfg.depth,
                             w->cfg.threads, w->cfg.staging, w->cfg.request, w->data_label,
                             &w->msg);
}

/* part: a rank's share of a distributed save, in its own data file; join: the temporary
 * directory that the coordinator began, to write into (NULL: begin it). */
static int open_writer(ckptio_writer **out, const char *path, const ckptio_params *p, bool part,
                       const char *join, uint32_t rank)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_open: out and path are required");
    }
    *out = NULL;
    ckptio_writer *w = calloc(1, sizeof *w);
    if (!w) return ckptio__fail(NULL, -ENOMEM, "out of memory opening a writer for '%s'", path);
    w->fd = -1;
    w->is_part = part;
    w->t_open = ckptio__now();
    ckptio__vec_init(&w->tensors, sizeof(wtensor));
    ckptio__vec_init(&w->chunks, sizeof(ckptio__mchunk));
    ckptio__vec_init(&w->next, sizeof(uint64_t));
    ckptio__vec_init(&w->dims, sizeof(uint64_t));
    ckptio__vec_init(&w->csums, sizeof(uint64_t));
    ckptio__vec_init(&w->meta, sizeof(wmeta));
    ckptio__vec_init(&w->pending, sizeof(pending_csums));
    ckptio__strmap_init(&w->names);
    int rc;
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &w->cfg, &w->msg));
    ckptio__gpu_init(&w->gpu, w->cfg.gpu, w->cfg.gpu_staging, w->cfg.csum_block);
    /* Before the first file is made: ranks joining one directory must never share a name. */
    if (part && asprintf(&w->file_prefix, "r%05u-", rank) < 0) {
        w->file_prefix = NULL;
        CKPTIO__GOTO_IF(true, -ENOMEM);
    }
    if (join)
        CKPTIO__CHECK(ckptio__txn_join(&w->txn, path, join, ckptio__cfg_txn_flags(&w->cfg),
                                       &w->msg));
    else
        CKPTIO__CHECK(ckptio__txn_begin(&w->txn, path, CKPTIO__TXN_DIR,
                                        ckptio__cfg_txn_flags(&w->cfg), 0, &w->msg));
    w->path = w->txn.path;
    if (part && !join) {
        w->tmp_abs = realpath(w->txn.tmp_path, NULL);
        CKPTIO__GOTO_IF(!w->tmp_abs, ckptio__fail(&w->msg, -errno, "cannot resolve '%s'",
                                                  w->txn.tmp_path));
    }
    CKPTIO__CHECK(make_data(w));
    ckptio__stats_backend(w->stats.backend, w->cfg.backend, ckptio__engine_name(w->sink.eng));
    w->stats.direct = w->sink.direct;
    w->stats.alignment = w->sink.off_align;
    *out = w;
    return 0;
out:
    if (rc == -ENOMEM && !w->msg.text[0]) ckptio__fail(&w->msg, rc, "out of memory");
    ckptio__msg keep = w->msg;
    ckptio_writer_close(w);
    return ckptio__refail(NULL, &keep, rc, "cannot open writer", NULL);
}

int ckptio_writer_open(ckptio_writer **out, const char *path, const ckptio_params *p)
{
    return open_writer(out, path, p, false, NULL, 0);
}

int ckptio__writer_open_part(ckptio_writer **out, const char *path, const char *join,
                             uint32_t rank, const ckptio_params *p)
{
    return open_writer(out, path, p, true, join, rank);
}

const char *ckptio__writer_tmp_path(const ckptio_writer *w)
{
    return w->tmp_abs ? w->tmp_abs : w->txn.tmp_path;
}

/* ---- add ---- */

static int find_or_add_tensor(ckptio_writer *w, const char *name, size_t name_len, int dtype,
                              uint32_t ndim, const uint64_t *shape, uint64_t *index)
{
    uint64_t idx;
    if (ckptio__strmap_get(&w->names, name, name_len, &idx)) {
        wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, idx);
        const uint64_t *gs = CKPTIO__VEC_AT(&w->dims, uint64_t, t->dims);
        if (t->dtype != (uint32_t)dtype || t->ndim != ndim ||
            (ndim && memcmp(gs, shape, ndim * sizeof *shape))) {
            char a[256], b[256];
            ckptio__fmt_dims(a, sizeof a, gs, t->ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, shape, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                                "tensor '%s': this chunk says %s [%s] but an earlier chunk said "
                                "%s [%s]; every chunk must give the same dtype and global shape",
                                name, ckptio_dtype_name(dtype), b, ckptio_dtype_name((int)t->dtype),
                                a);
        }
        *index = idx;
        return 0;
    }
    const char *stored = arena_dup(w, name, name_len);
    CKPTIO__RET_IF(!stored, -ENOMEM);
    int64_t d = ckptio__vec_push(&w->dims, shape, ndim);
    CKPTIO__TRY(d);
    wtensor t = {.name = stored, .name_len = (uint32_t)name_len, .dtype = (uint32_t)dtype,
                 .ndim = ndim, .dims = (uint64_t)d, .head = UINT64_MAX, .tail = UINT64_MAX};
    int64_t ti = ckptio__vec_push(&w->tensors, &t, 1);
    CKPTIO__TRY(ti);
    idx = (uint64_t)ti;
    int rc = ckptio__strmap_put(&w->names, stored, name_len, &idx);
    if (rc < 0) {
        w->tensors.len--;
        return rc;
    }
    *index = idx;
    return 0;
}

/* A failure while writing the chunk of tensor `name`: the writer is poisoned. */
static int add_failed(ckptio_writer *w, int rc, const char *name)
{
    settle_hashes(w); /* nothing may still read the caller's buffer once we fail */
    ckptio__refail(&w->msg, &w->msg, rc, "write failed", "saving tensor '%s': ", name);
    return poison(w, rc);
}

static int add_split(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                     const uint64_t *shape, const uint64_t *chunk_offset,
                     const uint64_t *chunk_shape, const void *data, uint64_t nbytes);

static int add_mem(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                   const uint64_t *shape, const uint64_t *chunk_offset,
                   const uint64_t *chunk_shape, const void *data, uint64_t nbytes,
                   uint32_t memory, uint64_t stream)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_add: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    if (w->n_stripes && memory == CKPTIO_MEM_HOST && nbytes >= 2 * STRIPE_PIECE_MIN &&
        !w->splitting)
        return add_split(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes);
    if (!name) return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "ckptio_writer_add: name is NULL");
    size_t name_len = strlen(name);
    if (!ckptio__valid_name(name, name_len, CKPTIO_MAX_NAME))
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor name '%.64s' is not valid: names are 1..%d bytes of UTF-8",
                            name, CKPTIO_MAX_NAME);
    size_t esize = ckptio_dtype_size(dtype);
    if (!esize)
        return ckptio__fail(&w->msg, CKPTIO_E_DTYPE, "tensor '%s': unknown dtype %d", name, dtype);
    if (ndim > CKPTIO_MAX_NDIM)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "tensor '%s' has %u dimensions; at most %d",
                            name, ndim, CKPTIO_MAX_NDIM);
    if (ndim && !shape)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "tensor '%s': shape is NULL", name);
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    const uint64_t *co = chunk_offset ? chunk_offset : zeros;
    const uint64_t *cs = chunk_shape ? chunk_shape : shape;
    uint64_t tvol, cvol, cbytes;
    if (!ckptio__volume(shape, ndim, esize, &tvol) || !ckptio__volume(cs, ndim, esize, &cbytes))
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "tensor '%s': size overflows 64 bits", name);
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t end;
        if (!ckptio__add(co[i], cs[i], &end) || end > shape[i]) {
            char a[256], b[256], c[256];
            ckptio__fmt_dims(a, sizeof a, co, ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, cs, ndim, "scalar");
            ckptio__fmt_dims(c, sizeof c, shape, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                                "tensor '%s': chunk at offset [%s] of shape [%s] lies outside "
                                "the tensor's shape [%s]",
                                name, a, b, c);
        }
    }
    if (cbytes != nbytes)
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s': %llu bytes given but the chunk holds %llu (%s × %llu "
                            "elements)",
                            name, (unsigned long long)nbytes, (unsigned long long)cbytes,
                            ckptio_dtype_name(dtype), (unsigned long long)(cbytes / esize));
    cvol = cbytes / esize;
    tvol /= esize;
    if (nbytes && !data)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "tensor '%s': data is NULL", name);
    if (tvol == 0 && (chunk_shape && memcmp(cs, shape, ndim * sizeof *cs)))
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s' is empty: give it as one chunk covering its whole shape",
                            name);
    if (tvol != 0 && cvol == 0)
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s': an empty chunk of a non-empty tensor", name);

    if (memory > CKPTIO_MEM_CUDA)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor '%s': unknown memory kind %u (CKPTIO_MEM_HOST or _CUDA)", name,
                            memory);
    if (memory == CKPTIO_MEM_CUDA && nbytes)
        CKPTIO__TRY(ckptio__gpu_start(&w->gpu, (uint64_t)(uintptr_t)data, &w->msg, name));

    uint64_t ti = 0;
    CKPTIO__TRY(find_or_add_tensor(w, name, name_len, dtype, ndim, shape, &ti));
    wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, ti);
    for (uint64_t c = t->head; c != UINT64_MAX; c = *CKPTIO__VEC_AT(&w->next, uint64_t, c)) {
        const ckptio__mchunk *mc = CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, c);
        const uint64_t *d = CKPTIO__VEC_AT(&w->dims, uint64_t, mc->dims);
        if (tvol == 0 || ckptio__boxes_overlap(d, d + ndim, co, cs, ndim)) {
            char a[256], b[256];
            ckptio__fmt_dims(a, sizeof a, co, ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, cs, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_DUPLICATE,
                                "tensor '%s': chunk at offset [%s] shape [%s] overlaps a chunk "
                                "already added (duplicate tensor name?)",
                                name, a, b);
        }
    }

    /* Record the chunk, then stream its bytes. */
    uint64_t n_csums = (w->cfg.checksums && nbytes) ? (nbytes + w->cfg.csum_block - 1) / w->cfg.csum_block : 0;
    uint64_t align = nbytes >= CKPTIO__EXTENT_ALIGN ? CKPTIO__EXTENT_ALIGN : CKPTIO__SMALL_ALIGN;
    if (nbytes && w->n_stripes) {
        int rc = lane_enter(w, pick_lane(w, nbytes));
        if (rc < 0) return add_failed(w, rc, name);
    }
    if (nbytes && w->max_file_bytes && w->sink.cursor) {
        uint64_t at = ckptio__align_up(w->sink.cursor, align);
        int rc = at >= w->max_file_bytes || nbytes > w->max_file_bytes - at ? roll_file(w) : 0;
        if (rc < 0) return add_failed(w, rc, name); /* the tensor may be in the map: fatal */
    }
    uint64_t off = nbytes ? ckptio__align_up(w->sink.cursor, align) : 0;
    int64_t di = ckptio__vec_push(&w->dims, co, ndim);
    int64_t di2 = di >= 0 ? ckptio__vec_push(&w->dims, cs, ndim) : di;
    int64_t ci = di2 >= 0 ? ckptio__vec_push(&w->csums, NULL, n_csums) : di2;
    if (ci < 0) /* the tensor may already be in the name map: out of memory is fatal */
        return poison(w, ckptio__fail(&w->msg, -ENOMEM, "out of memory adding tensor '%s'", name));
    ckptio__mchunk mc = {.dims = (uint64_t)di, .file_off = off, .stored_len = nbytes,
                         .raw_len = nbytes, .csums = (uint64_t)ci, .n_csums = n_csums,
                         .file = w->cur_file, .codec = CKPTIO__CODEC_NONE,
                         .tensor = (uint32_t)ti};
    int64_t chunk = ckptio__vec_push(&w->chunks, &mc, 1);
    uint64_t none = UINT64_MAX;
    if (chunk < 0 || ckptio__vec_push(&w->next, &none, 1) < 0)
        return poison(w, ckptio__fail(&w->msg, -ENOMEM, "out of memory adding tensor '%s'", name));
    t = CKPTIO__VEC_AT(&w->tensors, wtensor, ti);
    if (t->tail == UINT64_MAX) t->head = (uint64_t)chunk;
    else *CKPTIO__VEC_AT(&w->next, uint64_t, t->tail) = (uint64_t)chunk;
    t->tail = (uint64_t)chunk;
    t->n_chunks++;
    t->covered += cvol;
    w->stats.bytes += nbytes;
    if (!nbytes) return 0;
    int rc = memory == CKPTIO_MEM_CUDA
                 ? write_chunk_gpu(w, (uint64_t)(uintptr_t)data, nbytes, off, (uint64_t)ci,
                                   n_csums, stream, name)
                 : write_chunk(w, data, nbytes, off, (uint64_t)ci, n_csums);
    return rc < 0 ? add_failed(w, rc, name) : 0;
}

int ckptio_writer_add(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                      const uint64_t *shape, const uint64_t *chunk_offset,
                      const uint64_t *chunk_shape, const void *data, uint64_t nbytes)
{
    return add_mem(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes,
                   CKPTIO_MEM_HOST, 0);
}

int ckptio_writer_add_mem(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                          const uint64_t *shape, const uint64_t *chunk_offset,
                          const uint64_t *chunk_shape, const void *data, uint64_t nbytes,
                          uint32_t memory, uint64_t stream)
{
    return add_mem(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes, memory,
                   stream);
}

int ckptio__writer_gpu_read(ckptio_writer *w, uint64_t src, uint64_t n, uint64_t stream,
                            uint64_t block, int (*fn)(void *, uint8_t *, uint64_t, uint64_t),
                            void *ctx, const char *what)
{
    ckptio__msg_clear(&w->msg);
    if (!block || w->cfg.csum_block % block)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor '%s': replicas hashed in blocks of %llu bytes, the GPU ring "
                            "in blocks of %llu; give every rank the same params",
                            what, (unsigned long long)block,
                            (unsigned long long)w->cfg.csum_block);
    if (!n) return 0;
    CKPTIO__TRY(ckptio__gpu_start(&w->gpu, src, &w->msg, what));
    CKPTIO__TRY(ckptio__gpu_d2h(&w->gpu, src, n, stream, fn, ctx, &w->msg, what));
    return 0;
}

int ckptio_writer_gpu_stats(const ckptio_writer *w, ckptio_gpu_stats *out)
{
    if (!w || !out || out->size < offsetof(ckptio_gpu_stats, reason))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_writer_gpu_stats: NULL argument or out->size not set");
    ckptio__gpu_stats(&w->gpu, out);
    return 0;
}

int ckptio_writer_set_meta(ckptio_writer *w, const char *key, const void *value, size_t len)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_set_meta: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    if (!key || !ckptio__valid_name(key, strlen(key), CKPTIO_MAX_NAME))
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "metadata key is not valid: keys are 1..%d bytes of UTF-8",
                            CKPTIO_MAX_NAME);
    if (len > CKPTIO_MAX_META_VALUE)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "metadata '%s': value of %zu bytes exceeds %u",
                            key, len, CKPTIO_MAX_META_VALUE);
    if (len && !value)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "metadata '%s': value is NULL", key);
    uint8_t *v = malloc(len ? len : 1);
    CKPTIO__RET_IF(!v, -ENOMEM);
    if (len) memcpy(v, value, len);
    size_t klen = strlen(key);
    for (size_t i = 0; i < w->meta.len; i++) {
        wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, i);
        if (m->key_len == klen && !memcmp(m->key, key, klen)) {
            free(m->val);
            m->val = v;
            m->val_len = len;
            return 0;
        }
    }
    wmeta m = {.key = strdup(key), .key_len = klen, .val = v, .val_len = len};
    if (!m.key || ckptio__vec_push(&w->meta, &m, 1) < 0) {
        free(m.key);
        free(v);
        return -ENOMEM;
    }
    return 0;
}

int ckptio_writer_flush(ckptio_writer *w)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_flush: writer is NULL");
    CKPTIO__TRY(check_usable(w));
    int rc = ckptio__sink_drain(&w->sink);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        int r2 = w->lanes[k].fd >= 0 ? ckptio__sink_drain(&w->lanes[k].sink) : 0;
        if (r2 < 0 && rc == 0) rc = r2;
    }
    settle_hashes(w);
    return rc < 0 ? poison(w, rc) : 0;
}

/* ---- commit ---- */

typedef struct name_ref {
    const char *s;
    size_t len;
    size_t index;
} name_ref;

static int cmp_name(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    return ckptio__name_cmp(x->s, x->len, y->s, y->len);
}

static int push_str(ckptio__vec *strtab, const void *s, size_t len, uint64_t *off)
{
    int64_t at = ckptio__vec_push(strtab, s, len);
    CKPTIO__TRY(at);
    char nul = 0;
    CKPTIO__TRY(ckptio__vec_push(strtab, &nul, 1));
    *off = (uint64_t)at;
    return 0;
}

/* Build the manifest (tensors sorted by name, their chunks contiguous) and encode it. */
static int build_manifest(ckptio_writer *w, uint64_t file_size, uint8_t **buf, uint64_t *len,
                          bool partial)
{
    int rc = 0;
    size_t nt = w->tensors.len, nm = w->meta.len;
    name_ref *order = malloc((nt + nm + 1) * sizeof *order);
    ckptio__mtensor *mt = malloc((nt + 1) * sizeof *mt);
    ckptio__mchunk *mc = malloc((w->chunks.len + 1) * sizeof *mc);
    ckptio__mmeta *mm = malloc((nm + 1) * sizeof *mm);
    ckptio__mfile *files = NULL;
    ckptio__mroot *roots = NULL;
    ckptio__vec strtab;
    ckptio__vec_init(&strtab, 1);
    *buf = NULL;
    CKPTIO__GOTO_IF(!order || !mt || !mc || !mm, -ENOMEM);
    for (size_t i = 0; i < nt; i++) {
        const wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, i);
        order[i] = (name_ref){t->name, t->name_len, i};
    }
    qsort(order, nt, sizeof *order, cmp_name);
    uint64_t nc = 0;
    for (size_t i = 0; i < nt; i++) {
        const wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, order[i].index);
        uint64_t volume;
        ckptio__shape_volume(CKPTIO__VEC_AT(&w->dims, uint64_t, t->dims), t->ndim, &volume);
        if (t->covered != volume && !partial) {
            rc = ckptio__fail(&w->msg, CKPTIO_E_INCOMPLETE,
                              "tensor '%s': its chunks cover %llu of %llu elements; add the "
                              "missing chunks before commit",
                              t->name, (unsigned long long)t->covered,
                              (unsigned long long)volume);
            goto out;
        }
        mt[i] = (ckptio__mtensor){.name_len = t->name_len, .dtype = t->dtype, .ndim = t->ndim,
                                  .dims = t->dims, .chunk0 = nc, .n_chunks = t->n_chunks};
        CKPTIO__CHECK(push_str(&strtab, t->name, t->name_len, &mt[i].name));
        for (uint64_t c = t->head; c != UINT64_MAX; c = *CKPTIO__VEC_AT(&w->next, uint64_t, c)) {
            mc[nc] = *CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, c);
            mc[nc++].tensor = (uint32_t)i;
        }
    }
    for (size_t i = 0; i < nm; i++) {
        const wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, i);
        order[i] = (name_ref){m->key, m->key_len, i};
    }
    qsort(order, nm, sizeof *order, cmp_name);
    for (size_t i = 0; i < nm; i++) {
        const wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, order[i].index);
        mm[i] = (ckptio__mmeta){.key_len = (uint32_t)m->key_len, .val_len = m->val_len};
        CKPTIO__CHECK(push_str(&strtab, m->key, m->key_len, &mm[i].key));
        CKPTIO__CHECK(push_str(&strtab, m->val, m->val_len, &mm[i].val));
    }
    uint64_t nf = w->n_files;
    files = malloc(nf * sizeof *files);
    roots = malloc((w->n_stripes + 1) * sizeof *roots);
    CKPTIO__GOTO_IF(!files || !roots, -ENOMEM);
    for (uint64_t i = 0; i < nf; i++) {
        char name[DATA_NAME_LEN];
        data_name(w, i, name, sizeof name);
        files[i] = (ckptio__mfile){.name_len = (uint32_t)strlen(name), .root = w->file_roots[i],
                                   .size = i == w->cur_file ? file_size : w->sizes[i]};
        CKPTIO__CHECK(push_str(&strtab, name, files[i].name_len, &files[i].name));
    }
    for (size_t k = 0; k < w->n_stripes; k++) {
        const ckptio__stripe *st = &w->stripes[k];
        roots[k] = (ckptio__mroot){.path_len = (uint32_t)strlen(st->root),
                                   .name_len = (uint32_t)strlen(st->name)};
        CKPTIO__CHECK(push_str(&strtab, st->root, roots[k].path_len, &roots[k].path));
        CKPTIO__CHECK(push_str(&strtab, st->name, roots[k].name_len, &roots[k].name));
    }

    ckptio__manifest m = {
        .version = w->n_stripes ? CKPTIO__FORMAT_STRIPED : CKPTIO_FORMAT_VERSION,
        .n_roots = w->n_stripes, .roots = roots,
        .csum_algo = w->cfg.checksums ? CKPTIO__CSUM_XXH3_64 : CKPTIO__CSUM_NONE,
        .csum_block = w->cfg.csum_block,
        .n_files = nf, .n_tensors = nt, .n_chunks = nc, .n_meta = nm,
        .n_dims = w->dims.len, .n_csums = w->csums.len, .strtab_len = strtab.len,
        .files = files, .tensors = mt, .chunks = mc, .meta = mm,
        .dims = w->dims.items, .csums = w->csums.items, .strtab = strtab.items,
    };
    char err[512];
    rc = ckptio__manifest_validate_ex(&m, partial ? CKPTIO__MANIFEST_PARTIAL : 0, err, sizeof err);
    if (rc < 0) {
        /* The writer checked every input already, so this is a bug in ckptio itself. */
        ckptio__fail(&w->msg, rc, "internal error: the manifest built for '%s' is invalid: %s",
                     w->path, err);
        goto out;
    }
    CKPTIO__CHECK(ckptio__manifest_encoded_size(&m, len));
    *buf = malloc(*len ? *len : 1);
    CKPTIO__GOTO_IF(!*buf, -ENOMEM);
    CKPTIO__CHECK(ckptio__manifest_encode(&m, *buf, *len));
out:
    if (rc < 0) {
        free(*buf);
        *buf = NULL;
    }
    free(order);
    free(mt);
    free(mc);
    free(mm);
    free(files);
    free(roots);
    ckptio__vec_free(&strtab);
    return rc;
}

static int write_all(int fd, const uint8_t *p, uint64_t n)
{
    while (n) {
        ssize_t k = CKPTIO__VFS->write(fd, p, CKPTIO__MIN(n, (uint64_t)1 << 30));
        if (k < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += k;
        n -= (uint64_t)k;
    }
    return 0;
}

static int write_manifest(ckptio_writer *w, const uint8_t *buf, uint64_t len)
{
    int fd = ckptio__vfs_open(w->txn.tmp_fd, "manifest", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                              0644);
    if (fd < 0)
        return ckptio__fail(&w->msg, -errno, "cannot create '%s/manifest'", w->txn.tmp_path);
    int rc = write_all(fd, buf, len);
    if (rc == 0 && w->cfg.fsync) rc = ckptio__fsync(fd);
    if (close(fd) < 0 && rc == 0) rc = -errno;
    if (rc < 0)
        return ckptio__fail(&w->msg, rc, "writing '%s/manifest' failed%s", w->txn.tmp_path,
                            rc == -ENOSPC ? ": the device is full" : "");
    return 0;
}

/* Write the manifest into the temporary directory and publish it: the end of every commit. */
static int publish_with(ckptio_writer *w, const uint8_t *man, uint64_t man_len)
{
    int rc;
    CKPTIO__TRY(write_manifest(w, man, man_len));
    /* data/'s entry must be durable before the rename exposes it; the transaction syncs the
     * temporary directory itself. */
    if (w->cfg.fsync) {
        char data_dir[PATH_MAX];
        snprintf(data_dir, sizeof data_dir, "%s/data", w->txn.tmp_path);
        if ((rc = ckptio__fsync_path(data_dir)) < 0)
            return ckptio__fail(&w->msg, rc, "fsync of directory '%s' failed", w->txn.tmp_path);
        for (size_t k = 0; k < w->n_stripes; k++)
            CKPTIO__TRY(ckptio__stripe_sync(&w->stripes[k], &w->msg));
    }
    /* An overwrite replaces the old checkpoint's stripes too, once the new one is published. */
    char **old_roots = NULL;
    size_t n_old = 0;
    if (w->txn.found == CKPTIO__AT_CHECKPOINT)
        (void)ckptio__stripe_recorded_roots(w->txn.path, &old_roots, &n_old);
    rc = ckptio__txn_publish(&w->txn, &w->msg);
    if (w->txn.published) {
        char *owner = ckptio__stripe_owner_of(w->txn.path);
        unsigned found;
        for (size_t k = 0; k < w->n_stripes; k++) {
            w->stripes[k].keep = true;
            if (owner) ckptio__stripe_collect_owned(owner, w->stripes[k].root, false, &found);
        }
        for (size_t k = 0; k < n_old; k++)
            if (owner) ckptio__stripe_collect_owned(owner, old_roots[k], false, &found);
        free(owner);
    }
    for (size_t k = 0; k < n_old; k++) free(old_roots[k]);
    free(old_roots);
    if (w->txn.published) { /* CKPTIO_E_NOT_DURABLE too: the checkpoint is complete */
        w->hs.state = CKPTIO__H_COMMITTED;
        w->stats.seconds = ckptio__now() - w->t_open;
        w->stats.gbps =
            w->stats.seconds > 0 ? (double)w->stats.bytes / w->stats.seconds / 1e9 : 0;
    }
    return rc;
}

/* The end of the data: the hasher done with the caller's memory (first, whatever happens
 * next), the sink drained, the current data file fsynced and closed. */
static int seal_data(ckptio_writer *w)
{
    settle_hashes(w);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        lane *l = &w->lanes[k];
        if (l->fd < 0) continue;
        CKPTIO__TRY(finish_file(w, &l->sink, &l->fd, l->label, l->file));
        w->stats.io_bytes += l->sink.io_bytes;
    }
    CKPTIO__TRY(finish_file(w, &w->sink, &w->fd, w->data_label, w->cur_file));
    w->stats.io_bytes += w->sink.io_bytes;
    return 0;
}

int ckptio_writer_commit(ckptio_writer *w)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_commit: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    uint8_t *man = NULL;
    uint64_t man_len = 0;
    int rc;
    CKPTIO__CHECK(seal_data(w));
    CKPTIO__CHECK(build_manifest(w, w->sink.cursor, &man, &man_len, false));
    rc = publish_with(w, man, man_len);
out:
    free(man);
    if (rc < 0 && w->hs.state == CKPTIO__H_OPEN) {
        if (!w->msg.text[0]) ckptio__fail(&w->msg, rc, "committing '%s' failed", w->path);
        poison(w, rc);
    }
    return rc;
}

int ckptio__writer_finish_part(ckptio_writer *w, ckptio_bytes *part)
{
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    uint8_t *man = NULL;
    uint64_t man_len = 0;
    int rc;
    CKPTIO__CHECK(seal_data(w));
    CKPTIO__CHECK(build_manifest(w, w->sink.cursor, &man, &man_len, true));
    CKPTIO__GOTO_IF(ckptio_bytes_set(part, man, man_len) < 0, -ENOMEM);
    if (w->cfg.fsync) {
        /* Each rank makes its own entry durable: on a shared file system the coordinator's
         * fsync of data/ need not cover what another client created. */
        char data_dir[PATH_MAX];
        snprintf(data_dir, sizeof data_dir, "%s/data", w->txn.tmp_path);
        if ((rc = ckptio__fsync_path(data_dir)) < 0) {
            ckptio__fail(&w->msg, rc, "fsync of directory '%s' failed", data_dir);
            goto out;
        }
    }
    /* Closed to adds (they now say "committed"); the temporary directory stays until the
     * coordinator publishes it or its close removes it. */
    w->hs.state = CKPTIO__H_COMMITTED;
    w->part_done = true;
out:
    free(man);
    if (rc < 0 && w->hs.state == CKPTIO__H_OPEN) {
        if (!w->msg.text[0]) ckptio__fail(&w->msg, rc, "writing '%s' failed", w->data_label);
        poison(w, rc);
    }
    return rc;
}

int ckptio__writer_publish_manifest(ckptio_writer *w, const uint8_t *man, uint64_t len)
{
    ckptio__msg_clear(&w->msg);
    if (!w->part_done || !w->txn.owner || w->txn.published)
        return ckptio__fail(&w->msg, CKPTIO_E_STATE,
                            "internal error: '%s' has no finished part to publish", w->path);
    int rc = publish_with(w, man, len);
    if (rc < 0 && !w->txn.published) w->part_done = false;
    return rc;
}

void ckptio_writer_close(ckptio_writer *w)
{
    if (!w) return;
    ckptio__sink_fini(&w->sink);
    ckptio__gpu_fini(&w->gpu); /* deregisters the data file from cuFile before it is closed */
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        ckptio__sink_fini(&w->lanes[k].sink);
        if (w->lanes[k].fd >= 0) close(w->lanes[k].fd);
        free(w->lanes[k].label);
    }
    settle_hashes(w);
    ckptio__hasher_stop(w->hasher);
    ckptio__vec_free(&w->pending);
    if (w->fd >= 0) close(w->fd);
    ckptio__txn_fini(&w->txn); /* removes the temporary directory unless published */
    for (size_t k = 0; k < w->n_stripes; k++) ckptio__stripe_fini(&w->stripes[k]);
    free(w->stripes);
    free(w->lanes);
    free(w->data_label);
    free(w->tmp_abs);
    free(w->file_prefix);
    free(w->sizes);
    free(w->file_roots);
    for (size_t i = 0; i < w->meta.len; i++) {
        wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, i);
        free(m->key);
        free(m->val);
    }
    ckptio__vec_free(&w->meta);
    ckptio__vec_free(&w->tensors);
    ckptio__vec_free(&w->chunks);
    ckptio__vec_free(&w->next);
    ckptio__vec_free(&w->dims);
    ckptio__vec_free(&w->csums);
    ckptio__strmap_free(&w->names);
    while (w->arena) {
        arena_block *p = w->arena->prev;
        free(w->arena);
        w->arena = p;
    }
    free(w);
}

int ckptio_writer_stats(const ckptio_writer *w, ckptio_stats *out)
{
    if (!w || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_stats: NULL argument");
    *out = w->stats;
    out->tensors = w->tensors.len;
    if (w->hs.state != CKPTIO__H_COMMITTED) {
        out->seconds = ckptio__now() - w->t_open;
        out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    }
    return 0;
}

const char *ckptio_writer_errmsg(const ckptio_writer *w)
{
    return w ? w->msg.text : "";
}

/* ---- striping (issue 12) ---- */

int ckptio_writer_set_roots(ckptio_writer *w, const char *const *roots, size_t n)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_set_roots: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(check_usable(w));
    if (n && !roots)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "ckptio_writer_set_roots: roots is NULL");
    if (w->chunks.len || w->n_files > 1 || w->n_stripes)
        return ckptio__fail(&w->msg, CKPTIO_E_STATE,
                            "writer for '%s': set the roots once, before the first "
                            "ckptio_writer_add",
                            w->path);
    if (w->is_part)
        return ckptio__fail(&w->msg, CKPTIO_E_UNSUPPORTED,
                            "'%s': a multi-rank save cannot be striped over roots", w->path);
    if (n > CKPTIO__MAX_ROOTS)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "'%s': %zu roots, at most %u", w->path, n,
                            CKPTIO__MAX_ROOTS);
    char *owner = ckptio__stripe_owner_of(w->txn.path);
    if (!owner)
        return ckptio__fail(&w->msg, -errno ? -errno : -ENOMEM, "cannot resolve the parent of '%s'",
                            w->path);
    struct stat *seen = calloc(n + 1, sizeof *seen);
    w->stripes = calloc(n + 1, sizeof *w->stripes);
    w->lanes = calloc(n + 1, sizeof *w->lanes);
    int rc = 0;
    CKPTIO__GOTO_IF(!seen || !w->stripes || !w->lanes, -ENOMEM);
    for (size_t k = 0; k <= n; k++) w->lanes[k].fd = w->stripes[k].fd = -1;
    /* The checkpoint's own directory is always a root; a root naming its parent is that one. */
    if (stat(w->txn.parent, &seen[0]) < 0) {
        rc = ckptio__fail(&w->msg, -errno, "cannot inspect '%s'", w->txn.parent);
        goto out;
    }
    size_t n_seen = 1;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (!roots[i] || stat(roots[i], &st) < 0 || !S_ISDIR(st.st_mode)) {
            rc = ckptio__fail(&w->msg, roots[i] && errno != ENOENT ? -errno : CKPTIO_E_USAGE,
                              "root '%s' for '%s' is not an existing directory",
                              roots[i] ? roots[i] : "(null)", w->path);
            goto out;
        }
        bool dup = false;
        for (size_t k = 0; k < n_seen && !dup; k++)
            dup = seen[k].st_dev == st.st_dev && seen[k].st_ino == st.st_ino;
        /* The parent given again is the checkpoint's own share; any other repeat would give
         * one directory two shares. */
        if (dup && seen[0].st_dev == st.st_dev && seen[0].st_ino == st.st_ino) continue;
        if (dup) {
            rc = ckptio__fail(&w->msg, CKPTIO_E_USAGE, "root '%s' for '%s' is given twice",
                              roots[i], w->path);
            goto out;
        }
        seen[n_seen++] = st;
        /* Leftovers of an earlier save to this path that never published (a crash). */
        unsigned found;
        (void)ckptio__stripe_collect_owned(owner, roots[i], false, &found);
        CKPTIO__CHECK(ckptio__stripe_create(&w->stripes[w->n_stripes], roots[i], owner, &w->msg));
        w->n_stripes++;
    }
out:
    free(owner);
    free(seen);
    if (rc < 0) {
        for (size_t k = 0; k < w->n_stripes; k++) ckptio__stripe_fini(&w->stripes[k]);
        ckptio__stripe_fini(&w->stripes[w->n_stripes]); /* half made */
        w->n_stripes = 0;
        free(w->stripes);
        free(w->lanes);
        w->stripes = NULL;
        w->lanes = NULL;
    }
    return rc;
}

/* A striped writer balances whole chunks over the roots, so a checkpoint of a few huge tensors
 * would load one root: a chunk of at least two pieces' worth is cut along its first dimension
 * into row blocks (contiguous in the caller's memory), at most one per root and none much
 * under STRIPE_PIECE_MIN bytes, each added as a chunk of its own. Anything odd is left to the plain
 * add, which reports it. */
static int add_split(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                     const uint64_t *shape, const uint64_t *chunk_offset,
                     const uint64_t *chunk_shape, const void *data, uint64_t nbytes)
{
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    const uint64_t *cs = chunk_shape ? chunk_shape : shape;
    size_t esize = ckptio_dtype_size(dtype);
    uint64_t bytes = 0;
    bool plain = !esize || ndim == 0 || ndim > CKPTIO_MAX_NDIM || !shape || !data || !name ||
                 !ckptio__volume(cs, ndim, esize, &bytes) || bytes != nbytes || cs[0] < 2;
    uint64_t pieces =
        plain ? 1 : CKPTIO__MIN(w->n_stripes + 1, (nbytes - 1) / STRIPE_PIECE_MIN + 1);
    pieces = CKPTIO__MIN(pieces, cs[0]);
    w->splitting = true;
    int rc;
    if (pieces < 2) {
        rc = ckptio_writer_add(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data,
                               nbytes);
        w->splitting = false;
        return rc;
    }
    const uint64_t *co = chunk_offset ? chunk_offset : zeros;
    uint64_t row = nbytes / cs[0], off[CKPTIO_MAX_NDIM], ps[CKPTIO_MAX_NDIM];
    memcpy(off, co, ndim * sizeof *off);
    memcpy(ps, cs, ndim * sizeof *ps);
    /* Row blocks that start on a 4096-byte boundary of the source when rows allow it, so that an
     * aligned source is written in place. */
    uint64_t step = 1;
    while (step <= cs[0] / pieces && (step * row) % CKPTIO__EXTENT_ALIGN) step *= 2;
    if (step > cs[0] / pieces) step = 1; /* no aligned cut leaves every piece some rows */
    uint64_t done = 0;
    rc = 0;
    for (uint64_t k = 0; k < pieces && rc >= 0; k++) {
        uint64_t end = k + 1 == pieces ? cs[0] : cs[0] / pieces * (k + 1) / step * step;
        if (end <= done) continue;
        off[0] = co[0] + done;
        ps[0] = end - done;
        rc = ckptio_writer_add(w, name, dtype, ndim, shape, off, ps,
                               (const uint8_t *)data + done * row, (end - done) * row);
        if (rc < 0 && done && w->hs.state == CKPTIO__H_OPEN) {
            /* Some rows are in: the caller's chunk cannot be taken back whole. */
            char why[sizeof w->msg.text];
            snprintf(why, sizeof why, "%s", w->msg.text);
            rc = poison(w, ckptio__fail(&w->msg, rc,
                                        "tensor '%s': rows %llu.. of a chunk cut for striping "
                                        "were refused, the writer cannot go on: %s",
                                        name, (unsigned long long)off[0], why));
        }
        done = end;
    }
    w->splitting = false;
    return rc;
}