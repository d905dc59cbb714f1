/* SPDX-License-Identifier: Apache-2.0 */
/* The reader: plans the byte ranges a set of regions needs, reads them in bulk, verifies. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/manifest.h"
#include "internal.h"
#include "io/engine.h"
#include "io/vfs.h"

/* Staged segments closer than this are read as one request: reading the gap costs less than
 * another request. */
#define GAP_BYTES (128u << 10)
#define NONE UINT64_MAX

typedef struct rfile {
    int fd; /* -1 until first used */
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
    uint64_t chunk;
    uint64_t geo; /* index in geo[]: cnt[k], ss[k], ds[k] */
    uint64_t src0, dst0, run_len, runs;
    uint32_t k;
} piece;

/* A chunk byte range [a, b) to read, as one request (direct) or part of one (staged). */
typedef struct seg {
    uint64_t foff; /* file offset of a */
    uint64_t a, b;
    uint64_t piece; /* NONE: verify only */
    uint64_t chunk;
    uint64_t iter; /* index in iters[] of the first run ending after a (k entries) */
    uint64_t len;  /* direct: request length (>= b - a when the tail may overrun into scratch) */
    uint32_t file;
    uint32_t direct;
} seg;

typedef struct rslot {
    ckptio__req req;
    uint8_t *staging;
    size_t first, last; /* segments [first, last) */
} rslot;

struct ckptio_reader {
    ckptio__msg msg;
    ckptio__cfg cfg;
    char *path;
    int dirfd;
    ckptio__manifest *m;
    rfile *files;
    ckptio__engine *eng; /* started on first read */
    ckptio__pool pool;
    size_t buf_size;
    rslot *slots;
    unsigned *free_slots, n_free_slots;
    ckptio_stats stats;
    bool raw_file; /* ckptio_file_read: a foreign file, its "chunks" are byte ranges */
};

/* One read or verify operation. */
typedef struct plan {
    ckptio__vec pieces, segs, geo, iters;
    uint8_t *bad; /* verify: per chunk, 1 once the chunk is counted in bad_chunks */
    uint64_t bad_chunks;
} plan;

static const char *tname(const ckptio_reader *r, uint64_t chunk)
{
    return r->m->strtab + r->m->tensors[r->m->chunks[chunk].tensor].name;
}

static const char *fname(const ckptio_reader *r, uint32_t file)
{
    return r->m->strtab + r->m->files[file].name;
}

/* ---- open ---- */

static int read_manifest(ckptio_reader *r, uint8_t **buf, uint64_t *len)
{
    int fd = ckptio__vfs_open(r->dirfd, "manifest", O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return ckptio__fail(&r->msg, CKPTIO_E_NOT_CHECKPOINT,
                                "'%s' has no manifest: it is not a committed checkpoint (an "
                                "interrupted save leaves such a directory; load the previous "
                                "checkpoint)",
                                r->path);
        return ckptio__fail(&r->msg, -errno, "cannot open '%s/manifest'", r->path);
    }
    struct stat st;
    int rc = 0;
    *buf = NULL;
    if (fstat(fd, &st) < 0) {
        rc = ckptio__fail(&r->msg, -errno, "cannot stat '%s/manifest'", r->path);
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > CKPTIO__MAX_MANIFEST_BYTES) {
        rc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                          "'%s/manifest' is not a regular file of at most %llu bytes", r->path,
                          (unsigned long long)CKPTIO__MAX_MANIFEST_BYTES);
        goto out;
    }
    *len = (uint64_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    CKPTIO__GOTO_IF(!*buf, -ENOMEM);
    for (uint64_t got = 0; got < *len;) {
        ssize_t n = CKPTIO__VFS->pread(fd, *buf + got, *len - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            rc = ckptio__fail(&r->msg, n < 0 ? -errno : CKPTIO_E_CORRUPT,
                              "reading '%s/manifest' failed", r->path);
            goto out;
        }
        got += (uint64_t)n;
    }
out:
    close(fd);
    if (rc < 0) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

int ckptio_reader_open(ckptio_reader **out, const char *path, const ckptio_params *p)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_open: out and path are required");
    }
    *out = NULL;
    double t0 = ckptio__now();
    ckptio_reader *r = calloc(1, sizeof *r);
    if (!r) return ckptio__fail(NULL, -ENOMEM, "out of memory opening '%s'", path);
    r->dirfd = -1;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc;
    r->path = strdup(path);
    CKPTIO__GOTO_IF(!r->path, -ENOMEM);
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &r->cfg, &r->msg));
    r->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r->dirfd < 0) {
        rc = -errno;
        ckptio__fail(&r->msg, rc, "cannot open checkpoint directory '%s'%s", path,
                     rc == -ENOTDIR ? ": not a directory" : "");
        goto out;
    }
    CKPTIO__CHECK(read_manifest(r, &buf, &len));
    char err[512] = "";
    rc = ckptio__manifest_decode(buf, len, &r->m, err, sizeof err);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc, "'%s/manifest' %s: %s", path,
                     rc == CKPTIO_E_FORMAT ? "needs a newer ckptio" : "is corrupt", err);
        goto out;
    }
    r->files = calloc(r->m->n_files + 1, sizeof *r->files);
    CKPTIO__GOTO_IF(!r->files, -ENOMEM);
    for (uint64_t i = 0; i < r->m->n_files; i++) r->files[i].fd = -1;
    r->stats.seconds = ckptio__now() - t0;
    *out = r;
    free(buf);
    return 0;
out:
    free(buf);
    {
        char keep[CKPTIO__MSG_LEN];
        memcpy(keep, r->msg.text, sizeof keep);
        ckptio_reader_close(r);
        ckptio__fail(NULL, rc, "%s", keep[0] ? keep : "cannot open checkpoint");
    }
    return rc;
}

static void stop_engine(ckptio_reader *r);

void ckptio_reader_close(ckptio_reader *r)
{
    if (!r) return;
    stop_engine(r);
    if (r->files)
        for (uint64_t i = 0; i < r->m->n_files; i++)
            if (r->files[i].fd >= 0) close(r->files[i].fd);
    free(r->files);
    if (r->m) ckptio__manifest_free(r->m);
    if (r->dirfd >= 0) close(r->dirfd);
    free(r->path);
    free(r);
}

/* Undo start_engine, whatever part of it happened: the next read starts afresh. */
static void stop_engine(ckptio_reader *r)
{
    if (r->eng) ckptio__engine_close(r->eng);
    r->eng = NULL;
    if (r->pool.base) ckptio__pool_fini(&r->pool);
    free(r->slots);
    free(r->free_slots);
    r->slots = NULL;
    r->free_slots = NULL;
    r->n_free_slots = 0;
}

/* Engine, staging and slots, on the first read. All or nothing: a reader left with an engine
 * but no slots would wait forever for requests it can never issue. */
static int start_engine(ckptio_reader *r)
{
    if (r->eng) return 0;
    int rc = ckptio__engine_open(&r->eng, r->cfg.backend, r->cfg.depth, r->cfg.threads);
    if (rc < 0) {
        r->eng = NULL;
        return ckptio__fail(&r->msg, rc, "cannot start the I/O backend to read '%s'", r->path);
    }
    /* A staging buffer must hold a whole checksum block plus alignment slack at both ends. The
     * format bounds the block (manifest.c), so none of this overflows; the mapping is still
     * checked against the machine, as params.staging_bytes is the caller's. */
    r->buf_size = CKPTIO__MAX(r->cfg.request, 2 * r->m->csum_block);
    uint64_t nbuf = CKPTIO__MAX(2u, r->cfg.staging / r->buf_size), total = 0;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    if (nbuf > UINT32_MAX || !ckptio__mul(nbuf, r->buf_size, &total) || total > ram) {
        rc = ckptio__fail(&r->msg, -ENOMEM,
                          "reading '%s' needs %llu MiB of staging memory, more than this "
                          "machine has (%llu MiB): params.staging_bytes is too large; lower it "
                          "(0 picks the default, 64 MiB)",
                          r->path, (unsigned long long)(total ? total >> 20 : UINT64_MAX >> 20),
                          (unsigned long long)(ram >> 20));
        goto fail;
    }
    rc = ckptio__pool_init(&r->pool, (unsigned)nbuf, r->buf_size);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc,
                     "cannot allocate %llu MiB of staging memory to read '%s': lower "
                     "params.staging_bytes (0 picks the default, 64 MiB)",
                     (unsigned long long)(total >> 20), r->path);
        goto fail;
    }
    r->slots = calloc(r->cfg.depth, sizeof *r->slots);
    r->free_slots = calloc(r->cfg.depth, sizeof *r->free_slots);
    if (!r->slots || !r->free_slots) {
        rc = ckptio__fail(&r->msg, -ENOMEM, "out of memory reading '%s'", r->path);
        goto fail;
    }
    for (unsigned i = 0; i < r->cfg.depth; i++) r->free_slots[r->n_free_slots++] = i;
    ckptio__stats_backend(r->stats.backend, r->cfg.backend, ckptio__engine_name(r->eng));
    return 0;
fail:
    stop_engine(r);
    return rc;
}

static int open_file(ckptio_reader *r, uint32_t i)
{
    rfile *f = &r->files[i];
    if (f->fd >= 0) return 0;
    int rc = ckptio__file_open(r->dirfd, fname(r, i), CKPTIO__F_READ, r->cfg.direct, &f->fd,
                               &f->direct);
    if (rc < 0) {
        f->fd = -1;
        if (r->raw_file) /* r->path is the foreign file itself, and missing is not corrupt */
            return ckptio__fail(&r->msg, rc, "cannot open '%s'", r->path);
        return ckptio__fail(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc,
                            "cannot open data file '%s/%s'%s", r->path, fname(r, i),
                            rc == -ENOENT ? ": it is missing" : "");
    }
    struct stat st;
    if (fstat(f->fd, &st) < 0)
        return ckptio__fail(&r->msg, -errno, "cannot stat '%s/%s'", r->path, fname(r, i));
    f->size = (uint64_t)st.st_size;
    if (f->direct) ckptio__file_dio_align(f->fd, &f->mem_align, &f->off_align);
    else f->mem_align = f->off_align = 1;
    f->off_align = CKPTIO__MIN(f->off_align, 4096u);
    r->stats.direct = f->direct;
    r->stats.alignment = f->off_align;
    return 0;
}

/* ---- queries ---- */

size_t ckptio_reader_num_tensors(const ckptio_reader *r)
{
    return r ? (size_t)r->m->n_tensors : 0;
}

int ckptio_reader_tensor(const ckptio_reader *r, size_t index, ckptio_tensor_info *out)
{
    if (!r || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_tensor: NULL argument");
    if (index >= r->m->n_tensors)
        return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND, "'%s' has %llu tensors; index %zu is past them",
                            r->path, (unsigned long long)r->m->n_tensors, index);
    const ckptio__mtensor *t = &r->m->tensors[index];
    uint64_t stored = 0;
    for (uint64_t c = 0; c < t->n_chunks; c++) stored += r->m->chunks[t->chunk0 + c].stored_len;
    out->name = r->m->strtab + t->name;
    out->dtype = (int)t->dtype;
    out->ndim = t->ndim;
    out->shape = r->m->dims + t->dims;
    ckptio__volume(out->shape, t->ndim, ckptio_dtype_size((int)t->dtype), &out->nbytes);
    out->stored_bytes = stored;
    out->num_chunks = t->n_chunks;
    return 0;
}

static int64_t find_tensor(const ckptio_reader *r, const char *name)
{
    size_t len = strlen(name), lo = 0, hi = r->m->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ckptio__mtensor *t = &r->m->tensors[mid];
        int c = memcmp(r->m->strtab + t->name, name, CKPTIO__MIN((size_t)t->name_len, len));
        if (!c) c = t->name_len < len ? -1 : t->name_len > len;
        if (!c) return (int64_t)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int64_t ckptio_reader_find(const ckptio_reader *r, const char *name)
{
    if (!r || !name) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_find: NULL argument");
    int64_t i = find_tensor(r, name);
    if (i < 0)
        return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND, "no tensor '%s' in '%s'", name, r->path);
    return i;
}

int ckptio_reader_chunk(const ckptio_reader *r, size_t tensor, size_t chunk, ckptio_chunk_info *out)
{
    if (!r || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_chunk: NULL argument");
    if (tensor >= r->m->n_tensors || chunk >= r->m->tensors[tensor].n_chunks)
        return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND, "no chunk %zu of tensor %zu in '%s'", chunk,
                            tensor, r->path);
    const ckptio__mtensor *t = &r->m->tensors[tensor];
    const ckptio__mchunk *c = &r->m->chunks[t->chunk0 + chunk];
    out->offset = r->m->dims + c->dims;
    out->shape = r->m->dims + c->dims + t->ndim;
    out->file = fname(r, c->file);
    out->file_offset = c->file_off;
    out->stored_bytes = c->stored_len;
    out->nbytes = c->raw_len;
    return 0;
}

size_t ckptio_reader_num_meta(const ckptio_reader *r)
{
    return r ? (size_t)r->m->n_meta : 0;
}

int ckptio_reader_meta(const ckptio_reader *r, size_t index, const char **key, const void **value,
                       size_t *len)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_meta: reader is NULL");
    if (index >= r->m->n_meta)
        return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND, "metadata index %zu is past the %llu entries",
                            index, (unsigned long long)r->m->n_meta);
    const ckptio__mmeta *m = &r->m->meta[index];
    if (key) *key = r->m->strtab + m->key;
    if (value) *value = r->m->strtab + m->val;
    if (len) *len = (size_t)m->val_len;
    return 0;
}

int ckptio_reader_get_meta(const ckptio_reader *r, const char *key, const void **value, size_t *len)
{
    if (!r || !key) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_get_meta: NULL argument");
    size_t klen = strlen(key), lo = 0, hi = r->m->n_meta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ckptio__mmeta *m = &r->m->meta[mid];
        int c = memcmp(r->m->strtab + m->key, key, CKPTIO__MIN((size_t)m->key_len, klen));
        if (!c) c = m->key_len < klen ? -1 : m->key_len > klen;
        if (!c) return ckptio_reader_meta(r, mid, NULL, value, len);
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND, "no metadata key '%s' in '%s'", key, r->path);
}

const char *ckptio_reader_errmsg(const ckptio_reader *r)
{
    return r ? r->msg.text : "";
}

const char *ckptio_reader_path(const ckptio_reader *r)
{
    return r ? r->path : "";
}

int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out)
{
    if (!r || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_stats: NULL argument");
    *out = r->stats;
    out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    return 0;
}

/* ---- planning ---- */

static bool verifying(const ckptio_reader *r, const ckptio__mchunk *c)
{
    return r->cfg.checksums && c->n_csums > 0 && r->m->csum_algo != CKPTIO__CSUM_NONE;
}

static int push_seg(plan *pl, const seg *s)
{
    return ckptio__vec_push(&pl->segs, s, 1) < 0 ? -ENOMEM : 0;
}

/* Longest staged segment: a buffer minus alignment slack, in whole checksum blocks. */
static uint64_t staged_span(const ckptio_reader *r, bool verify)
{
    uint64_t span = r->buf_size - 2 * 4096;
    span = verify ? ckptio__align_down(span, r->m->csum_block) : span;
    assert(span > 0); /* buf_size >= 2 blocks (start_engine), so every cut makes progress */
    return span;
}

/* Cut chunk bytes [a, b) into staged segments. */
static int plan_staged(ckptio_reader *r, plan *pl, seg proto, uint64_t a, uint64_t b)
{
    const ckptio__mchunk *c = &r->m->chunks[proto.chunk];
    uint64_t span = staged_span(r, verifying(r, c));
    for (uint64_t x = a; x < b;) {
        uint64_t y = CKPTIO__MIN(b, x + span);
        proto.a = x;
        proto.b = y;
        proto.foff = c->file_off + x;
        proto.direct = 0;
        proto.len = y - x;
        CKPTIO__TRY(push_seg(pl, &proto));
        x = y;
    }
    return 0;
}

/* A piece that is one run: read straight into dst where alignment allows. */
static int plan_single_run(ckptio_reader *r, plan *pl, const piece *p, seg proto)
{
    const ckptio__mchunk *c = &r->m->chunks[p->chunk];
    const rfile *f = &r->files[c->file];
    uint64_t B = r->m->csum_block;
    bool verify = verifying(r, c);
    uint64_t s = p->src0, e = p->src0 + p->run_len;
    uint64_t S = verify ? ckptio__align_down(s, B) : s;
    uint64_t E = verify ? CKPTIO__MIN(ckptio__align_up(e, B), c->stored_len) : e;
    uint8_t *d = p->dst + p->dst0;
    bool direct = S == s && E == e &&
                  (!f->direct || ((c->file_off + s) % f->off_align == 0 &&
                                  (uintptr_t)d % f->mem_align == 0));
    if (!direct) return plan_staged(r, pl, proto, S, E);
    /* Requests of cfg.request bytes (a multiple of the block); the tail may need care. */
    /* A request may be smaller than the checkpoint's checksum block: never below one block. */
    uint64_t step = CKPTIO__MAX(ckptio__align_down(r->cfg.request, verify ? B : 4096),
                                verify ? B : 4096);
    for (uint64_t x = s; x < e;) {
        uint64_t y = CKPTIO__MIN(e, x + step), len = y - x;
        if (f->direct && len % f->off_align) {
            uint64_t dst_end = p->dst0 + (y - s), padded = ckptio__align_up(len, f->off_align);
            bool scratch = dst_end == p->dst_bytes && p->dst0 + (x - s) + padded <= p->dst_cap;
            if (scratch) len = padded;
            else {
                /* Stage the unaligned tail (with checksums: the whole last block). */
                uint64_t body = ckptio__align_down(y - x, verify ? B : f->off_align);
                if (body) {
                    proto.a = x, proto.b = x + body, proto.len = body;
                    proto.foff = c->file_off + x, proto.direct = 1;
                    CKPTIO__TRY(push_seg(pl, &proto));
                }
                return plan_staged(r, pl, proto, x + body, y);
            }
        }
        proto.a = x, proto.b = y, proto.len = len;
        proto.foff = c->file_off + x, proto.direct = 1;
        CKPTIO__TRY(push_seg(pl, &proto));
        x = y;
    }
    return 0;
}

/* Segments for a piece of many runs: walk the runs in file order, merge near ones (whole
 * checksum blocks when verifying) and remember where each segment's first run is. */
static int plan_runs(ckptio_reader *r, plan *pl, const piece *p, seg proto)
{
    const ckptio__mchunk *c = &r->m->chunks[p->chunk];
    bool verify = verifying(r, c);
    uint64_t B = r->m->csum_block, span = staged_span(r, verify);
    const uint64_t *cnt = CKPTIO__VEC_AT(&pl->geo, uint64_t, p->geo);
    const uint64_t *ss = cnt + p->k;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    bool open = false;
    for (uint64_t n = 0; n < p->runs; n++) {
        uint64_t rs = p->src0;
        for (uint32_t j = 0; j < p->k; j++) rs += idx[j] * ss[j];
        uint64_t re = rs + p->run_len;
        uint64_t RS = verify ? ckptio__align_down(rs, B) : rs;
        uint64_t RE = verify ? CKPTIO__MIN(ckptio__align_up(re, B), c->stored_len) : re;
        if (open && RS <= proto.b + GAP_BYTES && RE - proto.a <= span) {
            proto.b = CKPTIO__MAX(proto.b, RE);
        } else {
            if (open) {
                proto.len = proto.b - proto.a;
                CKPTIO__TRY(push_seg(pl, &proto));
            }
            int64_t it = ckptio__vec_push(&pl->iters, idx, p->k);
            if (it < 0) return -ENOMEM;
            proto.iter = (uint64_t)it;
            if (RS < proto.b && open) RS = proto.b; /* blocks already read by the last one */
            /* A run longer than a buffer is cut into several segments starting in it. */
            while (RE - RS > span) {
                proto.a = RS, proto.b = RS + span, proto.len = span;
                proto.foff = c->file_off + RS;
                CKPTIO__TRY(push_seg(pl, &proto));
                RS += span;
            }
            proto.a = RS, proto.b = RE, proto.foff = c->file_off + RS;
            open = true;
        }
        for (uint32_t j = p->k; j-- > 0;) { /* next multi-index, last dimension fastest */
            if (++idx[j] < cnt[j]) break;
            idx[j] = 0;
        }
    }
    if (open) {
        proto.len = proto.b - proto.a;
        CKPTIO__TRY(push_seg(pl, &proto));
    }
    return 0;
}

static int check_extent(ckptio_reader *r, uint64_t chunk)
{
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    CKPTIO__TRY(open_file(r, c->file));
    const rfile *f = &r->files[c->file];
    if (c->file_off + c->stored_len > f->size && r->raw_file)
        return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                            "bytes %llu..%llu lie past the end of '%s' (%llu bytes): the file is "
                            "truncated or not the one expected",
                            (unsigned long long)c->file_off,
                            (unsigned long long)(c->file_off + c->stored_len), r->path,
                            (unsigned long long)f->size);
    if (c->file_off + c->stored_len > f->size)
        return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                            "data file '%s/%s' is truncated: it has %llu bytes but tensor '%s' is "
                            "stored at bytes %llu..%llu (the manifest says the file has %llu); "
                            "the checkpoint is damaged, load another one",
                            r->path, fname(r, c->file), (unsigned long long)f->size,
                            tname(r, chunk), (unsigned long long)c->file_off,
                            (unsigned long long)(c->file_off + c->stored_len),
                            (unsigned long long)r->m->files[c->file].size);
    return 0;
}

/* Intersect region (ro, rs) of tensor t with one chunk and plan its reads. */
static int plan_piece(ckptio_reader *r, plan *pl, const ckptio_region *reg, uint64_t t_idx,
                      const uint64_t *ro, const uint64_t *rs, uint64_t rbytes, uint64_t chunk)
{
    const ckptio__mtensor *t = &r->m->tensors[t_idx];
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    const uint64_t *co = r->m->dims + c->dims, *cs = co + t->ndim;
    uint32_t nd = t->ndim;
    uint64_t lo[CKPTIO_MAX_NDIM], cnt[CKPTIO_MAX_NDIM];
    for (uint32_t j = 0; j < nd; j++) {
        lo[j] = CKPTIO__MAX(co[j], ro[j]);
        uint64_t hi = CKPTIO__MIN(co[j] + cs[j], ro[j] + rs[j]);
        if (lo[j] >= hi) return 0;
        cnt[j] = hi - lo[j];
    }
    CKPTIO__TRY(check_extent(r, chunk));
    uint64_t esize = ckptio_dtype_size((int)t->dtype);
    piece p = {.dst = reg->dst, .dst_cap = reg->capacity, .dst_bytes = rbytes, .chunk = chunk};
    /* Fold trailing dimensions that are whole in both chunk and region into one run. */
    uint32_t k = nd;
    uint64_t run = esize;
    while (k > 0 && cnt[k - 1] == cs[k - 1] && cnt[k - 1] == rs[k - 1]) run *= cs[--k];
    uint64_t sstride[CKPTIO_MAX_NDIM + 1], dstride[CKPTIO_MAX_NDIM + 1];
    sstride[nd] = dstride[nd] = esize;
    for (uint32_t j = nd; j-- > 0;) {
        sstride[j] = sstride[j + 1] * cs[j];
        dstride[j] = dstride[j + 1] * rs[j];
    }
    if (k > 0) {
        run = cnt[k - 1] * sstride[k];
        k--; /* dimension k is the run's own; dims [0, k) are iterated */
    }
    p.k = k;
    p.run_len = run;
    p.runs = 1;
    for (uint32_t j = 0; j < nd; j++) {
        p.src0 += (lo[j] - co[j]) * sstride[j + 1];
        p.dst0 += (lo[j] - ro[j]) * dstride[j + 1];
    }
    int64_t g = ckptio__vec_push(&pl->geo, NULL, 3 * (size_t)k);
    if (g < 0) return -ENOMEM;
    uint64_t *geo = CKPTIO__VEC_AT(&pl->geo, uint64_t, g);
    for (uint32_t j = 0; j < k; j++) {
        geo[j] = cnt[j];
        geo[k + j] = sstride[j + 1];
        geo[2 * k + j] = dstride[j + 1];
        p.runs *= cnt[j];
    }
    p.geo = (uint64_t)g;
    int64_t pi = ckptio__vec_push(&pl->pieces, &p, 1);
    if (pi < 0) return -ENOMEM;
    seg proto = {.piece = (uint64_t)pi, .chunk = chunk, .file = c->file, .iter = NONE};
    if (p.runs == 1) return plan_single_run(r, pl, &p, proto);
    return plan_runs(r, pl, &p, proto);
}

static int plan_region(ckptio_reader *r, plan *pl, const ckptio_region *reg, size_t i)
{
    int64_t t_idx;
    if (reg->name) {
        t_idx = find_tensor(r, reg->name);
        if (t_idx < 0)
            return ckptio__fail(&r->msg, CKPTIO_E_NOT_FOUND,
                                "no tensor '%s' in '%s' (region %zu); list them with ckptio "
                                "inspect",
                                reg->name, r->path, i);
    } else {
        if (reg->tensor >= r->m->n_tensors)
            return ckptio__fail(&r->msg, CKPTIO_E_NOT_FOUND, "region %zu: tensor index %zu is past the %llu tensors of '%s'",
                                i, reg->tensor, (unsigned long long)r->m->n_tensors, r->path);
        t_idx = (int64_t)reg->tensor;
    }
    const ckptio__mtensor *t = &r->m->tensors[t_idx];
    const char *name = r->m->strtab + t->name;
    const uint64_t *shape = r->m->dims + t->dims;
    uint64_t ro[CKPTIO_MAX_NDIM], rs[CKPTIO_MAX_NDIM];
    for (uint32_t j = 0; j < t->ndim; j++) {
        ro[j] = reg->offset ? reg->offset[j] : 0;
        if (ro[j] > shape[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' starts at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)ro[j], j, (unsigned long long)shape[j]);
        rs[j] = reg->shape ? reg->shape[j] : shape[j] - ro[j];
        if (rs[j] > shape[j] - ro[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' ends at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)(ro[j] + rs[j]), j,
                                (unsigned long long)shape[j]);
    }
    uint64_t bytes;
    ckptio__volume(rs, t->ndim, ckptio_dtype_size((int)t->dtype), &bytes);
    if (reg->capacity < bytes)
        return ckptio__fail(&r->msg, CKPTIO_E_BUFFER,
                            "tensor '%s': the region needs %llu bytes but the destination holds "
                            "%llu",
                            name, (unsigned long long)bytes, (unsigned long long)reg->capacity);
    if (!bytes) return 0;
    if (!reg->dst)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "tensor '%s': destination is NULL", name);
    r->stats.bytes += bytes;
    r->stats.tensors++;
    for (uint64_t c = 0; c < t->n_chunks; c++)
        CKPTIO__TRY(plan_piece(r, pl, reg, (uint64_t)t_idx, ro, rs, bytes, t->chunk0 + c));
    return 0;
}

static int cmp_seg(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->foff < y->foff ? -1 : x->foff > y->foff;
}

/* ---- execution ---- */

static int check_blocks(ckptio_reader *r, plan *pl, const seg *s, const uint8_t *base)
{
    const ckptio__mchunk *c = &r->m->chunks[s->chunk];
    if (!verifying(r, c)) return 0;
    uint64_t B = r->m->csum_block;
    for (uint64_t x = s->a; x < s->b; x += B) {
        uint64_t len = CKPTIO__MIN(B, c->stored_len - x);
        if (ckptio__hash(base + (x - s->a), len) == r->m->csums[c->csums + x / B]) continue;
        /* verify counts damaged chunks and keeps going; the message is the first one's. */
        if (pl->bad) {
            if (pl->bad[s->chunk]) return 0;
            pl->bad[s->chunk] = 1;
            if (pl->bad_chunks++) return 0;
        }
        ckptio__fail(&r->msg, CKPTIO_E_CHECKSUM,
                            "checksum mismatch in tensor '%s': bytes %llu..%llu of its chunk at "
                            "offset %llu of '%s/%s' are damaged; restore this checkpoint from a "
                            "copy or load an earlier one",
                            tname(r, s->chunk), (unsigned long long)x,
                            (unsigned long long)(x + len), (unsigned long long)(c->file_off + x),
                            r->path, fname(r, c->file));
        return pl->bad ? 0 : CKPTIO_E_CHECKSUM;
    }
    return 0;
}

/* Copy the parts of a piece's runs that fall in [a, b) out of the staging buffer. */
static void scatter(plan *pl, const seg *s, const uint8_t *base)
{
    const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
    const uint64_t *cnt = CKPTIO__VEC_AT(&pl->geo, uint64_t, p->geo);
    const uint64_t *ss = cnt + p->k, *ds = ss + p->k;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    /* Single-run pieces carry no iterator: their one run starts at index zero. */
    if (p->k && s->iter != NONE)
        memcpy(idx, CKPTIO__VEC_AT(&pl->iters, uint64_t, s->iter), p->k * sizeof *idx);
    for (;;) {
        uint64_t rs = p->src0, rd = p->dst0;
        for (uint32_t j = 0; j < p->k; j++) rs += idx[j] * ss[j], rd += idx[j] * ds[j];
        if (rs >= s->b) return;
        uint64_t lo = CKPTIO__MAX(rs, s->a), hi = CKPTIO__MIN(rs + p->run_len, s->b);
        if (lo < hi) memcpy(p->dst + rd + (lo - rs), base + (lo - s->a), hi - lo);
        uint32_t j = p->k;
        while (j-- > 0) {
            if (++idx[j] < cnt[j]) break;
            idx[j] = 0;
        }
        if (j == UINT32_MAX) return; /* wrapped: that was the last run */
    }
}

static int finish(ckptio_reader *r, plan *pl, rslot *sl)
{
    ckptio__req *q = &sl->req;
    int rc = 0;
    const seg *segs = pl->segs.items;
    if (q->res < 0) {
        const seg *s = &segs[sl->first];
        rc = ckptio__fail(&r->msg, (int)q->res,
                          "reading %llu bytes at offset %llu of '%s/%s' (tensor '%s') failed",
                          (unsigned long long)q->len, (unsigned long long)q->off, r->path,
                          fname(r, s->file), tname(r, s->chunk));
        goto out;
    }
    r->stats.io_bytes += (uint64_t)q->res;
    for (size_t i = sl->first; i < sl->last && rc == 0; i++) {
        const seg *s = &segs[i];
        uint64_t need = s->foff + (s->b - s->a) - q->off;
        if ((uint64_t)q->res < need) {
            rc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                              "data file '%s/%s' ended at byte %llu while reading tensor '%s'; "
                              "the file is truncated",
                              r->path, fname(r, s->file),
                              (unsigned long long)(q->off + (uint64_t)q->res), tname(r, s->chunk));
            if (pl->bad && !pl->bad[s->chunk]) {
                pl->bad[s->chunk] = 1; /* a flag: counting here would wrap */
                pl->bad_chunks++;
            }
            break;
        }
        const uint8_t *base = (const uint8_t *)q->buf + (s->foff - q->off);
        int v = check_blocks(r, pl, s, base);
        if (v < 0) {
            rc = v;
            break;
        }
        if (!s->direct && s->piece != NONE) scatter(pl, s, base);
    }
out:
    if (sl->staging) ckptio__pool_put(&r->pool, sl->staging);
    sl->staging = NULL;
    r->free_slots[r->n_free_slots++] = (unsigned)(sl - r->slots);
    return rc;
}

/* Issue every segment, many requests in flight; staged neighbours share one request. */
static int execute(ckptio_reader *r, plan *pl)
{
    seg *segs = pl->segs.items;
    size_t n = pl->segs.len, next = 0;
    int first = 0;
    unsigned reap_failures = 0;
    if (n > 1) qsort(segs, n, sizeof *segs, cmp_seg);
    while ((next < n && !first) || r->eng->inflight) {
        while (next < n && !first && r->n_free_slots) {
            const seg *s = &segs[next];
            const rfile *f = &r->files[s->file];
            rslot *sl = &r->slots[r->free_slots[r->n_free_slots - 1]];
            ckptio__req *q = &sl->req;
            *q = (ckptio__req){.fd = f->fd, .op = CKPTIO__OP_READ};
            sl->first = next;
            if (s->direct) {
                const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
                q->buf = p->dst + p->dst0 + (s->a - p->src0);
                q->off = s->foff;
                q->len = s->len;
                sl->staging = NULL;
                next++;
            } else {
                uint8_t *b = ckptio__pool_get(&r->pool);
                if (!b) break;
                uint64_t al = CKPTIO__MAX(f->off_align, 1u);
                uint64_t lo = ckptio__align_down(s->foff, al), hi = s->foff + (s->b - s->a);
                size_t j = next + 1;
                while (j < n && !segs[j].direct && segs[j].file == s->file &&
                       segs[j].foff <= hi + GAP_BYTES &&
                       ckptio__align_up(CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a), al) - lo <=
                           r->buf_size) {
                    hi = CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a);
                    j++;
                }
                q->buf = b;
                q->off = lo;
                q->len = ckptio__align_up(hi, al) - lo;
                sl->staging = b;
                next = j;
            }
            sl->last = next;
            r->n_free_slots--;
            int rc = ckptio__engine_submit(r->eng, q);
            if (rc < 0) {
                q->res = rc;
                rc = finish(r, pl, sl);
                if (!first) first = rc;
            }
        }
        if (!r->eng->inflight) continue;
        ckptio__req *done[64];
        int got = ckptio__engine_reap(r->eng, done, 64, 1);
        if (got < 0) {
            /* Requests still land in the caller's memory and in staging, so we keep reaping
             * before returning; a backend that never recovers is shut down instead, which
             * waits for (psync) or cancels (io_uring) what it holds, and the next read
             * starts a new one rather than meet this read's completions. */
            if (!first)
                first = ckptio__fail(&r->msg, got, "waiting for reads from '%s' failed", r->path);
            if (++reap_failures >= CKPTIO__REAP_TRIES) {
                stop_engine(r);
                return first;
            }
            continue;
        }
        reap_failures = 0;
        for (int i = 0; i < got; i++) {
            int rc = finish(r, pl, (rslot *)done[i]);
            if (rc < 0 && !first) first = rc;
        }
    }
    return first;
}

static void plan_init(plan *pl)
{
    memset(pl, 0, sizeof *pl);
    ckptio__vec_init(&pl->pieces, sizeof(piece));
    ckptio__vec_init(&pl->segs, sizeof(seg));
    ckptio__vec_init(&pl->geo, sizeof(uint64_t));
    ckptio__vec_init(&pl->iters, sizeof(uint64_t));
}

static void plan_free(plan *pl)
{
    ckptio__vec_free(&pl->pieces);
    ckptio__vec_free(&pl->segs);
    ckptio__vec_free(&pl->geo);
    ckptio__vec_free(&pl->iters);
    free(pl->bad);
}

int ckptio_reader_read(ckptio_reader *r, const ckptio_region *regions, size_t n)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_read: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if (n && !regions)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_reader_read: regions is NULL");
    double t0 = ckptio__now();
    plan pl;
    plan_init(&pl);
    int rc;
    CKPTIO__CHECK(start_engine(r));
    for (size_t i = 0; i < n; i++) CKPTIO__CHECK(plan_region(r, &pl, &regions[i], i));
    CKPTIO__CHECK(execute(r, &pl));
out:
    if (rc == -ENOMEM && !r->msg.text[0]) ckptio__fail(&r->msg, rc, "out of memory reading '%s'", r->path);
    if (rc < 0 && r->msg.text[0]) ckptio__fail(NULL, rc, "%s", r->msg.text);
    plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}

int ckptio_reader_read_tensor(ckptio_reader *r, const char *name, void *dst, uint64_t capacity)
{
    if (!name) return ckptio__fail(r ? &r->msg : NULL, CKPTIO_E_USAGE, "ckptio_reader_read_tensor: name is NULL");
    ckptio_region reg = {.name = name, .dst = dst, .capacity = capacity};
    return ckptio_reader_read(r, &reg, 1);
}

int ckptio_reader_verify(ckptio_reader *r, uint64_t *bad_chunks)
{
    if (bad_chunks) *bad_chunks = 0;
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_verify: reader is NULL");
    ckptio__msg_clear(&r->msg);
    double t0 = ckptio__now();
    plan pl;
    plan_init(&pl);
    int rc;
    char first_msg[CKPTIO__MSG_LEN] = "";
    int first = 0;
    CKPTIO__CHECK(start_engine(r));
    pl.bad = calloc(r->m->n_chunks + 1, 1);
    CKPTIO__GOTO_IF(!pl.bad, -ENOMEM);
    for (uint64_t c = 0; c < r->m->n_chunks; c++) {
        const ckptio__mchunk *mc = &r->m->chunks[c];
        if (!mc->stored_len) continue;
        rc = check_extent(r, c);
        if (rc == CKPTIO_E_CORRUPT) {
            if (!first) {
                first = rc;
                memcpy(first_msg, r->msg.text, sizeof first_msg);
            }
            pl.bad[c] = 1;
            pl.bad_chunks++;
            continue;
        }
        CKPTIO__CHECK(rc);
        seg proto = {.piece = NONE, .chunk = c, .file = mc->file, .iter = NONE};
        CKPTIO__CHECK(plan_staged(r, &pl, proto, 0, mc->stored_len));
        r->stats.bytes += mc->stored_len;
    }
    ckptio__msg_clear(&r->msg);
    rc = execute(r, &pl);
    if (first) { /* a truncated file found while planning is reported first */
        rc = first;
        memcpy(r->msg.text, first_msg, sizeof first_msg);
    }
    if (rc == 0 && pl.bad_chunks) rc = CKPTIO_E_CHECKSUM;
out:
    if (bad_chunks) *bad_chunks = pl.bad_chunks;
    if (rc < 0 && r->msg.text[0]) ckptio__fail(NULL, rc, "%s", r->msg.text);
    plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}

/* ---- byte ranges of foreign files ---- */

/* The reader's planner serves foreign files too: each range becomes a chunk of one stand-in
 * tensor, with no checksums, read into its destination as a single run. */
int ckptio_file_read(const char *path, const ckptio_range *ranges, size_t n, const ckptio_params *p,
                     ckptio_stats *stats)
{
    if (!path || (n && !ranges))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_read: path and ranges are required");
    double t0 = ckptio__now();
    ckptio_reader rd;
    memset(&rd, 0, sizeof rd);
    ckptio_reader *r = &rd;
    ckptio__manifest m;
    memset(&m, 0, sizeof m);
    ckptio__mfile mf = {0};
    ckptio__mtensor mt = {0};
    rfile file = {.fd = -1};
    plan pl;
    plan_init(&pl);
    /* A file the caller names is not confined the way a checkpoint's own files are: follow its
     * links (a Hugging Face cache entry is snapshots/<rev>/x.bin -> ../../blobs/<sha>). Messages
     * keep naming `path`. */
    char *real = NULL;
    int lrc = ckptio__follow_links(path, &real);
    const char *target = real ? real : path;
    char *dir = ckptio__parent_dir(target);
    const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    size_t blen = strlen(base);
    m.chunks = calloc(n + 1, sizeof *m.chunks);
    m.strtab = malloc(blen + 1);
    r->path = (char *)path;
    r->dirfd = -1;
    r->raw_file = true;
    r->m = &m;
    r->files = &file;
    int rc;
    if (lrc < 0) {
        rc = ckptio__fail(&r->msg, lrc, "cannot open '%s'%s", path,
                          lrc == -ELOOP ? ": too many levels of symbolic links" : "");
        goto out;
    }
    CKPTIO__GOTO_IF(!dir || !m.chunks || !m.strtab, -ENOMEM);
    memcpy(m.strtab, base, blen + 1);
    mf.name_len = (uint32_t)blen;
    mt.name_len = (uint32_t)blen;
    m.files = &mf;
    m.tensors = &mt;
    m.n_files = m.n_tensors = 1;
    m.n_chunks = n;
    m.csum_block = 1u << 20;
    m.strtab_len = blen + 1;
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &r->cfg, &r->msg));
    r->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r->dirfd < 0) {
        rc = ckptio__fail(&r->msg, -errno, "cannot open directory '%s'", dir);
        goto out;
    }
    CKPTIO__CHECK(open_file(r, 0));
    mf.size = file.size;
    CKPTIO__CHECK(start_engine(r));
    for (size_t i = 0; i < n; i++) {
        m.chunks[i] = (ckptio__mchunk){.file_off = ranges[i].offset, .stored_len = ranges[i].len,
                                       .raw_len = ranges[i].len};
        if (!ranges[i].len) continue;
        if (!ranges[i].dst) {
            rc = ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_file_read: range %zu has no destination", i);
            goto out;
        }
        if (ranges[i].offset > UINT64_MAX - ranges[i].len) {
            rc = ckptio__fail(&r->msg, CKPTIO_E_RANGE, "ckptio_file_read: range %zu overflows", i);
            goto out;
        }
        CKPTIO__CHECK(check_extent(r, i));
        piece pc = {.dst = ranges[i].dst, .dst_cap = ranges[i].len, .dst_bytes = ranges[i].len,
                    .chunk = i, .run_len = ranges[i].len, .runs = 1};
        int64_t pi = ckptio__vec_push(&pl.pieces, &pc, 1);
        CKPTIO__GOTO_IF(pi < 0, -ENOMEM);
        seg proto = {.piece = (uint64_t)pi, .chunk = i, .file = 0, .iter = NONE};
        CKPTIO__CHECK(plan_single_run(r, &pl, &pc, proto));
        r->stats.bytes += ranges[i].len;
    }
    CKPTIO__CHECK(execute(r, &pl));
out:
    if (rc == -ENOMEM && !r->msg.text[0]) ckptio__fail(&r->msg, rc, "out of memory reading '%s'", path);
    if (rc < 0) ckptio__fail(NULL, rc, "%s", r->msg.text);
    if (stats) {
        r->stats.seconds = ckptio__now() - t0;
        r->stats.tensors = n;
        ckptio_reader_stats(r, stats);
    }
    plan_free(&pl);
    if (r->eng) ckptio__engine_close(r->eng);
    if (r->pool.base) ckptio__pool_fini(&r->pool);
    if (file.fd >= 0) close(file.fd);
    if (r->dirfd >= 0) close(r->dirfd);
    free(r->slots);
    free(r->free_slots);
    free(m.chunks);
    free(m.strtab);
    free(dir);
    free(real);
    return rc < 0 ? rc : 0;
}
