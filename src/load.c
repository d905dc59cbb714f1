/* SPDX-License-Identifier: Apache-2.0 */
/* The reader: plans the byte ranges a set of regions needs, reads them in bulk, verifies. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/manifest.h"
#include "gpu/staged.h"
#include "internal.h"
#include "common/workers.h"
#include "io/cache.h"
#include "io/engine.h"
#include "io/ring.h"
#include "io/vfs.h"

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
} seg;

struct ckptio_reader {
    ckptio__msg msg;
    ckptio__cfg cfg;
    char *path;
    int dirfd;
    ckptio__manifest *m;
    rfile *files;
    ckptio__ring ring; /* started on first read */
    int *root_fds;     /* striped: each root's stripe directory once opened, else -1 */
    char **roots;      /* ckptio_reader_set_roots: where to look for stripes instead */
    size_t n_roots;
    uint64_t buf_size; /* of a staging buffer */
    ckptio__gpu gpu;   /* CKPTIO_MEM_CUDA regions */
    ckptio_stats stats;
    ckptio_read_stats rstats;
    ckptio__workers *workers; /* verification and cached reads; started on first read */
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

static void close_rfile(rfile *f);

static const char *tname(const ckptio_reader *r, uint64_t chunk)
{
    return r->m->strtab + r->m->tensors[r->m->chunks[chunk].tensor].name;
}

static const char *fname(const ckptio_reader *r, uint32_t file)
{
    return r->m->strtab + r->m->files[file].name;
}

/* Index of `key` among n entries sorted by name, entry i's name being at strtab + *(uint64_t
 * *)(base + i * stride + at) with length *(uint32_t *)(... + len_at), or -1. */
static int64_t find_name(const char *strtab, const void *base, size_t n, size_t stride, size_t at,
                         size_t len_at, const char *key)
{
    size_t klen = strlen(key), lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const uint8_t *e = (const uint8_t *)base + mid * stride;
        uint64_t off;
        uint32_t len;
        memcpy(&off, e + at, sizeof off);
        memcpy(&len, e + len_at, sizeof len);
        int c = memcmp(strtab + off, key, CKPTIO__MIN((size_t)len, klen));
        if (!c) c = len < klen ? -1 : len > klen;
        if (!c) return (int64_t)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* The first versions of the structs that may grow end with these fields. */
#define REGION_V1 (offsetof(ckptio_region, capacity) + sizeof(uint64_t))
#define RANGE_V1 (offsetof(ckptio_range, dst) + sizeof(void *))
#define TENSOR_INFO_V1 (offsetof(ckptio_tensor_info, num_chunks) + sizeof(uint64_t))

/* Element i of the caller's array of sized structs (stride: element 0's size) into *out, as
 * far as its size covers; the rest of *out is zero. */
static int take_sized(ckptio__msg *msg, void *out, size_t ours, size_t v1, const void *arr,
                      size_t i, const char *fn, const char *type)
{
    uint32_t stride, size;
    memcpy(&stride, arr, sizeof stride);
    if (stride < v1)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s: element 0 has .size %u; set .size = sizeof(%s) (%zu here)", fn,
                            stride, type, ours);
    const uint8_t *e = (const uint8_t *)arr + i * (size_t)stride;
    memcpy(&size, e, sizeof size);
    if (size != stride)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s: element %zu has .size %u but element 0 has %u; set every "
                            ".size = sizeof(%s)",
                            fn, i, size, stride, type);
    memset(out, 0, ours);
    memcpy(out, e, CKPTIO__MIN((size_t)size, ours));
    return 0;
}

/* ---- open ---- */

int ckptio__read_manifest(int dirfd, const char *path, ckptio__msg *msg, uint8_t **buf,
                          uint64_t *len)
{
    int fd = ckptio__vfs_open(dirfd, "manifest", O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return ckptio__fail(msg, CKPTIO_E_NOT_CHECKPOINT,
                                "'%s' has no manifest: it is not a committed checkpoint (an "
                                "interrupted save leaves such a directory; load the previous "
                                "checkpoint)",
                                path);
        return ckptio__fail(msg, -errno, "cannot open '%s/manifest'", path);
    }
    struct stat st;
    int rc = 0;
    *buf = NULL;
    if (fstat(fd, &st) < 0) {
        rc = ckptio__fail(msg, -errno, "cannot stat '%s/manifest'", path);
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > CKPTIO__MAX_MANIFEST_BYTES) {
        rc = ckptio__fail(msg, CKPTIO_E_CORRUPT,
                          "'%s/manifest' is not a regular file of at most %llu bytes", path,
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
            rc = ckptio__fail(msg, n < 0 ? -errno : CKPTIO_E_CORRUPT,
                              "reading '%s/manifest' failed", path);
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
    ckptio__gpu_init(&r->gpu, r->cfg.gpu, r->cfg.gpu_staging, r->cfg.csum_block);
    r->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r->dirfd < 0) {
        rc = -errno;
        ckptio__fail(&r->msg, rc, "cannot open checkpoint directory '%s'%s", path,
                     rc == -ENOTDIR ? ": not a directory" : "");
        goto out;
    }
    CKPTIO__CHECK(ckptio__read_manifest(r->dirfd, r->path, &r->msg, &buf, &len));
    char err[512] = "";
    rc = ckptio__manifest_decode(buf, len, &r->m, err, sizeof err);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc, "'%s/manifest' %s: %s", path,
                     rc == CKPTIO_E_FORMAT ? "needs a newer ckptio" : "is corrupt", err);
        goto out;
    }
    r->files = calloc(r->m->n_files + 1, sizeof *r->files);
    CKPTIO__GOTO_IF(!r->files, -ENOMEM);
    for (uint64_t i = 0; i < r->m->n_files; i++) r->files[i].fd = r->files[i].bfd = -1;
    r->gpu.block = r->m->csum_block ? r->m->csum_block : 4096; /* slots: whole blocks */
    /* A staging buffer holds a whole checksum block plus alignment slack at both ends; the
     * format bounds the block (manifest.c), so this does not overflow. */
    r->buf_size = CKPTIO__MAX(r->cfg.request, 2 * r->m->csum_block);
    r->stats.seconds = ckptio__now() - t0;
    *out = r;
    free(buf);
    return 0;
out:
    free(buf);
    {
        ckptio__msg keep = r->msg;
        ckptio_reader_close(r);
        return ckptio__refail(NULL, &keep, rc, "cannot open checkpoint", NULL);
    }
}

void ckptio_reader_close(ckptio_reader *r)
{
    if (!r) return;
    ckptio__ring_fini(&r->ring);
    ckptio__gpu_fini(&r->gpu);
    ckptio__workers_stop(r->workers);
    if (r->files)
        for (uint64_t i = 0; i < r->m->n_files; i++) close_rfile(&r->files[i]);
    free(r->files);
    for (uint64_t k = 0; r->root_fds && k < r->m->n_roots; k++)
        if (r->root_fds[k] >= 0) close(r->root_fds[k]);
    free(r->root_fds);
    for (size_t k = 0; k < r->n_roots; k++) free(r->roots[k]);
    free(r->roots);
    if (r->m) ckptio__manifest_free(r->m);
    if (r->dirfd >= 0) close(r->dirfd);
    free(r->path);
    free(r);
}

/* The ring, on the first read: planning does not need it. */
static int start_ring(ckptio_reader *r)
{
    if (r->ring.eng) return 0;
    CKPTIO__TRY(ckptio__ring_init(&r->ring, r->cfg.backend, r->cfg.depth, r->cfg.threads,
                                  r->cfg.staging, r->buf_size, r->path, &r->msg));
    ckptio__stats_backend(r->stats.backend, r->cfg.backend, ckptio__engine_name(r->ring.eng));
    return 0;
}

/* Open a file to read and learn its size and alignment; -errno. */
static int open_rfile(rfile *f, int dirfd, const char *name, int want_direct, int cache)
{
    if (f->fd >= 0) return 0;
    f->bfd = -1;
    int rc = ckptio__file_open(dirfd, name, CKPTIO__F_READ, want_direct, &f->fd, &f->direct);
    if (rc < 0) {
        f->fd = -1;
        return rc;
    }
    struct stat st;
    if (fstat(f->fd, &st) < 0) {
        rc = -errno;
        close(f->fd);
        f->fd = -1;
        return rc;
    }
    f->size = (uint64_t)st.st_size;
    if (f->direct) ckptio__file_dio_align(f->fd, &f->mem_align, &f->off_align);
    else f->mem_align = f->off_align = 1;
    f->off_align = CKPTIO__MIN(f->off_align, 4096u);
    /* A second, buffered descriptor copies resident pages; without one (it failed to open)
     * everything is read from the device as before. A file opened without O_DIRECT is read
     * through the cache already. */
    if (cache && f->direct) {
        int d = 0;
        if (ckptio__file_open(dirfd, name, CKPTIO__F_READ, CKPTIO_OFF, &f->bfd, &d) < 0) f->bfd = -1;
        /* It reads resident pages only: readahead would pull in from the device the very
         * bytes that O_DIRECT is reading. Filling the cache, it reads everything: ahead. */
        else
            posix_fadvise(f->bfd, 0, 0,
                          cache == CKPTIO__CACHE_FILL ? POSIX_FADV_SEQUENTIAL : POSIX_FADV_RANDOM);
        f->cf = (ckptio__cachefile){.fd = f->bfd, .size = f->size};
    }
    return 0;
}

static void close_rfile(rfile *f)
{
    if (f->fd >= 0) close(f->fd);
    if (f->bfd >= 0) close(f->bfd);
    ckptio__cache_fini(&f->cf);
    f->fd = f->bfd = -1;
}

/* ---- striped checkpoints (format 2): data files in stripe directories of other roots ---- */

/* Open data file i, which lies in the stripe directory of root m->files[i].root: looked for in
 * the roots given to ckptio_reader_set_roots, else in the recorded root. */
static int open_striped(ckptio_reader *r, uint32_t i)
{
    uint32_t k = r->m->files[i].root - 1;
    const ckptio__mroot *mr = &r->m->roots[k];
    const char *recorded = r->m->strtab + mr->path, *name = r->m->strtab + mr->name;
    if (!r->root_fds) {
        r->root_fds = malloc(r->m->n_roots * sizeof *r->root_fds);
        CKPTIO__RET_IF(!r->root_fds, -ENOMEM);
        for (uint64_t j = 0; j < r->m->n_roots; j++) r->root_fds[j] = -1;
    }
    int err = ENOENT;
    /* The given roots first, then the recorded one: a stripe that did not move is found. */
    for (size_t j = 0; r->root_fds[k] < 0 && j <= r->n_roots; j++) {
        const char *root = j < r->n_roots ? r->roots[j] : recorded;
        int at = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (at < 0) {
            err = errno;
            continue;
        }
        /* The stripe itself is no link: what it holds must be the checkpoint's own. */
        r->root_fds[k] = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (r->root_fds[k] < 0) err = errno;
        close(at);
    }
    if (r->root_fds[k] < 0)
        return ckptio__fail(&r->msg, -err,
                            "checkpoint '%s': its data file '%s' lies in stripe '%s' of root %u "
                            "(recorded as '%s'), which %s: mount that file system, or pass "
                            "roots= (ckptio_reader_set_roots) naming where the stripes are now",
                            r->path, fname(r, i), name, k + 1, recorded,
                            r->n_roots ? "is in none of the given roots" : "cannot be opened");
    rfile *f = &r->files[i];
    int rc = open_rfile(f, r->root_fds[k], fname(r, i), r->cfg.direct, r->cfg.cache);
    if (rc < 0)
        return ckptio__fail(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc,
                            "cannot open data file '%s/%s/%s' of checkpoint '%s'%s", recorded,
                            name, fname(r, i), r->path, rc == -ENOENT ? ": it is missing" : "");
    r->stats.direct = f->direct;
    r->stats.alignment = f->off_align;
    return 0;
}

int ckptio_reader_set_roots(ckptio_reader *r, const char *const *roots, size_t n)
{
    if (!r || (n && !roots))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_set_roots: NULL argument");
    for (uint64_t j = 0; r->root_fds && j < r->m->n_roots; j++) {
        if (r->root_fds[j] >= 0) close(r->root_fds[j]);
        r->root_fds[j] = -1;
    }
    for (size_t k = 0; k < r->n_roots; k++) free(r->roots[k]);
    free(r->roots);
    r->roots = NULL;
    r->n_roots = 0;
    if (!n) return 0;
    r->roots = calloc(n, sizeof *r->roots);
    CKPTIO__RET_IF(!r->roots, -ENOMEM);
    for (size_t k = 0; k < n; k++) {
        if (!roots[k] || !(r->roots[k] = strdup(roots[k]))) {
            /* Refused whole: the reader goes on with the recorded roots. */
            bool null = !roots[k];
            while (k--) free(r->roots[k]);
            free(r->roots);
            r->roots = NULL;
            return null ? ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                                       "ckptio_reader_set_roots: a root is NULL")
                        : -ENOMEM;
        }
    }
    r->n_roots = n;
    return 0;
}

/* Data files are opened when a read first needs them, before it is planned: a checkpoint with
 * a damaged file can still be inspected and its other tensors read, and a reader holds no more
 * descriptors than its reads need. */
static int open_file(ckptio_reader *r, uint32_t i)
{
    rfile *f = &r->files[i];
    if (f->fd >= 0) return 0;
    uint32_t root = r->m->files[i].root;
    if (root) return open_striped(r, i);
    int rc = open_rfile(f, r->dirfd, fname(r, i), r->cfg.direct, r->cfg.cache);
    if (rc < 0)
        return ckptio__fail(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc,
                            "cannot open data file '%s/%s'%s", r->path, fname(r, i),
                            rc == -ENOENT ? ": it is missing" : "");
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
    if (out->size < TENSOR_INFO_V1)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_tensor: out->size is %u; set it to "
                            "sizeof(ckptio_tensor_info) (%zu here) before the call",
                            out->size, sizeof(ckptio_tensor_info));
    const ckptio__mtensor *t = &r->m->tensors[index];
    uint64_t stored = 0;
    for (uint64_t c = 0; c < t->n_chunks; c++) stored += r->m->chunks[t->chunk0 + c].stored_len;
    ckptio_tensor_info ti = {.size = out->size};
    ti.name = r->m->strtab + t->name;
    ti.dtype = (int)t->dtype;
    ti.ndim = t->ndim;
    ti.shape = r->m->dims + t->dims;
    ckptio__volume(ti.shape, t->ndim, ckptio_dtype_size((int)t->dtype), &ti.nbytes);
    ti.stored_bytes = stored;
    ti.num_chunks = t->n_chunks;
    memcpy(out, &ti, CKPTIO__MIN((size_t)out->size, sizeof ti)); /* what the caller's holds */
    return 0;
}

static int64_t find_tensor(const ckptio_reader *r, const char *name)
{
    return find_name(r->m->strtab, r->m->tensors, r->m->n_tensors, sizeof(ckptio__mtensor),
                     offsetof(ckptio__mtensor, name), offsetof(ckptio__mtensor, name_len), name);
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
    int64_t i = find_name(r->m->strtab, r->m->meta, r->m->n_meta, sizeof(ckptio__mmeta),
                          offsetof(ckptio__mmeta, key), offsetof(ckptio__mmeta, key_len), key);
    if (i >= 0) return ckptio_reader_meta(r, (size_t)i, NULL, value, len);
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

int ckptio_reader_read_stats(const ckptio_reader *r, ckptio_read_stats *out)
{
    if (!r || !out)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_read_stats: NULL argument");
    if (out->size < offsetof(ckptio_read_stats, merged) + sizeof(uint64_t))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_read_stats: out->size is %u; set it to "
                            "sizeof(ckptio_read_stats) (%zu here) before the call",
                            out->size, sizeof(ckptio_read_stats));
    ckptio_read_stats st = r->rstats;
    st.size = out->size;
    st.device_bytes = r->stats.io_bytes;
    memcpy(out, &st, CKPTIO__MIN((size_t)out->size, sizeof st));
    return 0;
}

/* ---- planning ---- */

static bool verifying(const ckptio_reader *r, const ckptio__mchunk *c)
{
    return r->cfg.checksums && c->n_csums > 0 && r->m->csum_algo != CKPTIO__CSUM_NONE;
}

static extent chunk_extent(const ckptio_reader *r, uint64_t chunk)
{
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    return (extent){.off = c->file_off, .len = c->stored_len, .file = c->file,
                    .verify = verifying(r, c)};
}

static int push_seg(plan *pl, const seg *s)
{
    return ckptio__vec_push(&pl->segs, s, 1) < 0 ? -ENOMEM : 0;
}

/* Longest staged segment: a buffer minus alignment slack, in whole checksum blocks. */
static uint64_t staged_span(const plan *pl, bool verify)
{
    uint64_t span = pl->buf_size - 2 * 4096;
    span = verify ? ckptio__align_down(span, pl->block) : span;
    assert(span > 0); /* buf_size >= 2 blocks, so every cut makes progress */
    return span;
}

/* Cut extent bytes [a, b) into staged segments. */
static int plan_staged(plan *pl, const extent *x, seg proto, uint64_t a, uint64_t b)
{
    proto.verify = x->verify;
    uint64_t span = staged_span(pl, x->verify);
    for (uint64_t i = a; i < b;) {
        uint64_t j = CKPTIO__MIN(b, i + span);
        proto.a = i;
        proto.b = j;
        proto.foff = x->off + i;
        proto.direct = 0;
        proto.len = j - i;
        CKPTIO__TRY(push_seg(pl, &proto));
        i = j;
    }
    return 0;
}

/* A piece that is one run: read straight into dst where alignment allows. */
static int plan_single_run(plan *pl, const extent *x, const piece *p, seg proto)
{
    const rfile *f = &pl->files[x->file];
    assert(f->fd >= 0); /* opened before planning */
    uint64_t B = pl->block;
    bool verify = x->verify;
    uint64_t s = p->src0, e = p->src0 + p->run_len;
    uint64_t S = verify ? ckptio__align_down(s, B) : s;
    uint64_t E = verify ? CKPTIO__MIN(ckptio__align_up(e, B), x->len) : e;
    uint8_t *d = p->dst + p->dst0;
    proto.verify = verify;
    bool direct = S == s && E == e &&
                  (!f->direct || ((x->off + s) % f->off_align == 0 &&
                                  (uintptr_t)d % f->mem_align == 0));
    if (!direct) return plan_staged(pl, x, proto, S, E);
    /* Requests of pl->request bytes, never below one checksum block; the tail may need care. */
    uint64_t step = CKPTIO__MAX(ckptio__align_down(pl->request, verify ? B : 4096),
                                verify ? B : 4096);
    for (uint64_t i = s; i < e;) {
        uint64_t j = CKPTIO__MIN(e, i + step), len = j - i;
        if (f->direct && len % f->off_align) {
            uint64_t dst_end = p->dst0 + (j - s), padded = ckptio__align_up(len, f->off_align);
            bool scratch = dst_end == p->dst_bytes && p->dst0 + (i - s) + padded <= p->dst_cap;
            if (scratch) len = padded;
            else {
                /* Stage the unaligned tail (with checksums: the whole last block). */
                uint64_t body = ckptio__align_down(j - i, verify ? B : f->off_align);
                if (body) {
                    proto.a = i, proto.b = i + body, proto.len = body;
                    proto.foff = x->off + i, proto.direct = 1;
                    CKPTIO__TRY(push_seg(pl, &proto));
                }
                return plan_staged(pl, x, proto, i + body, j);
            }
        }
        proto.a = i, proto.b = j, proto.len = len;
        proto.foff = x->off + i, proto.direct = 1;
        CKPTIO__TRY(push_seg(pl, &proto));
        i = j;
    }
    return 0;
}

/* Segments for a piece of many runs: walk the runs in file order, merge near ones (whole
 * checksum blocks when verifying) and remember where each segment's first run is. */
static int plan_runs(plan *pl, const extent *x, const piece *p, seg proto)
{
    bool verify = x->verify;
    uint64_t B = pl->block, span = staged_span(pl, verify);
    const uint64_t *cnt = CKPTIO__VEC_AT(&pl->geo, uint64_t, p->geo);
    const uint64_t *ss = cnt + p->k;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    bool open = false;
    proto.verify = verify;
    for (uint64_t n = 0; n < p->runs; n++) {
        uint64_t rs = p->src0;
        for (uint32_t j = 0; j < p->k; j++) rs += idx[j] * ss[j];
        uint64_t re = rs + p->run_len;
        uint64_t RS = verify ? ckptio__align_down(rs, B) : rs;
        uint64_t RE = verify ? CKPTIO__MIN(ckptio__align_up(re, B), x->len) : re;
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
                proto.foff = x->off + RS;
                CKPTIO__TRY(push_seg(pl, &proto));
                RS += span;
            }
            proto.a = RS, proto.b = RE, proto.foff = x->off + RS;
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

static int cmp_seg(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->foff < y->foff ? -1 : x->foff > y->foff;
}

/* Where a part of s that starts at q may end: the next granule boundary, in whole checksum
 * blocks of the chunk when s is verified, else on a file offset multiple of the granule. */
static uint64_t next_cut(const plan *pl, const seg *s, uint64_t q)
{
    if (s->verify) {
        uint64_t g = CKPTIO__MAX(pl->block, CACHE_GRAN / pl->block * pl->block);
        return CKPTIO__MIN(s->b, q / g * g + g);
    }
    uint64_t f = s->foff + (q - s->a);
    return CKPTIO__MIN(s->b, q + (CACHE_GRAN - f % CACHE_GRAN));
}

static bool resident(rfile *f, uint64_t off, uint64_t len, bool *none)
{
    uint64_t res = 0, pages = 0;
    if (ckptio__cache_resident(&f->cf, off, len, &res, &pages) < 0) res = 0;
    if (none) *none = res == 0;
    return pages && res == pages;
}

/* Bytes [q, e) of s as a segment of their own. */
static int push_part(ckptio__vec *to, const seg *s, uint64_t q, uint64_t e, bool cached)
{
    seg t = *s;
    t.a = q;
    t.b = e;
    t.foff = s->foff + (q - s->a);
    t.len = e == s->b ? s->len - (q - s->a) : e - q; /* the last part keeps a padded tail */
    t.cached = cached;
    return ckptio__vec_push(to, &t, 1) < 0 ? -ENOMEM : 0;
}

/* Split the segments by page-cache residency: resident granules go to csegs, copied by the
 * workers through the buffered descriptor; runs of the others stay for the device. */
static int plan_cache(plan *pl)
{
    if (!pl->cache) return 0;
    ckptio__vec out;
    ckptio__vec_init(&out, sizeof(seg));
    int rc = 0;
    for (size_t i = 0; i < pl->segs.len; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->segs, seg, i);
        rfile *f = &pl->files[s->file];
        bool none = true, all = false;
        if (f->bfd >= 0 && pl->cache == CKPTIO__CACHE_FILL) none = !(all = true);
        else if (f->bfd >= 0) all = resident(f, s->foff, s->b - s->a, &none);
        if (f->bfd < 0 || none) {
            CKPTIO__GOTO_IF(ckptio__vec_push(&out, s, 1) < 0, -ENOMEM);
            continue;
        }
        for (uint64_t q = s->a; q < s->b;) {
            uint64_t e = next_cut(pl, s, q);
            if (all || resident(f, s->foff + (q - s->a), e - q, NULL)) {
                CKPTIO__CHECK(push_part(&pl->csegs, s, q, e, true));
                q = e;
                continue;
            }
            while (e < s->b) {
                uint64_t n = next_cut(pl, s, e);
                if (resident(f, s->foff + (e - s->a), n - e, NULL)) break;
                e = n;
            }
            /* An in-place part must lie where O_DIRECT can read it: else the cache reads it too
             * (a buffered read of pages not resident goes to the device, just as correctly). */
            bool aligned = true;
            if (s->direct && pl->files[s->file].direct) {
                const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
                uintptr_t d = (uintptr_t)(p->dst + p->dst0 + (q - p->src0));
                aligned = (s->foff + (q - s->a)) % f->off_align == 0 && d % f->mem_align == 0 &&
                          (e == s->b || (e - q) % f->off_align == 0);
            }
            CKPTIO__CHECK(push_part(aligned ? &out : &pl->csegs, s, q, e, !aligned));
            q = e;
        }
    }
    ckptio__vec_free(&pl->segs);
    pl->segs = out;
    if (pl->csegs.len > 1) qsort(pl->csegs.items, pl->csegs.len, sizeof(seg), cmp_seg);
    return 0;
out:
    ckptio__vec_free(&out);
    return rc;
}

/* Turn the segments into requests, in file order: a direct segment is one request, staged
 * neighbours share one staging buffer. */
static int plan_ios(plan *pl)
{
    seg *segs = pl->segs.items;
    size_t n = pl->segs.len;
    if (n > 1) qsort(segs, n, sizeof *segs, cmp_seg);
    /* Small in-place ranges that touch a neighbour are staged with it (merged below). */
    for (size_t k = 0; k < n; k++) {
        seg *s = &segs[k];
        if (!s->direct || s->b - s->a > MERGE_BYTES) continue;
        const uint64_t slack = 4096; /* the alignment padding between stored tensors */
        bool prev = k > 0 && segs[k - 1].file == s->file &&
                    segs[k - 1].foff + (segs[k - 1].b - segs[k - 1].a) + slack >= s->foff;
        bool next = k + 1 < n && segs[k + 1].file == s->file &&
                    s->foff + (s->b - s->a) + slack >= segs[k + 1].foff;
        if (prev || next) {
            s->direct = 0;
            pl->merged++;
        }
    }
    for (size_t next = 0; next < n;) {
        const seg *s = &segs[next];
        const rfile *f = &pl->files[s->file];
        ckptio__ring_io io = {.fd = f->fd};
        size_t first = next;
        if (s->direct) {
            const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
            io.dst = p->dst + p->dst0 + (s->a - p->src0);
            io.off = s->foff;
            io.len = s->len;
            next++;
        } else {
            uint64_t al = CKPTIO__MAX(f->off_align, 1u);
            uint64_t lo = ckptio__align_down(s->foff, al), hi = s->foff + (s->b - s->a);
            size_t j = next + 1;
            while (j < n && !segs[j].direct && segs[j].file == s->file &&
                   segs[j].foff <= hi + GAP_BYTES &&
                   ckptio__align_up(CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a), al) -
                           lo <= pl->buf_size) {
                hi = CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a);
                j++;
            }
            io.off = lo;
            io.len = ckptio__align_up(hi, al) - lo;
            next = j;
        }
        if (ckptio__vec_push(&pl->ios, &io, 1) < 0 || ckptio__vec_push(&pl->firsts, &first, 1) < 0)
            return -ENOMEM;
    }
    return ckptio__vec_push(&pl->firsts, &n, 1) < 0 ? -ENOMEM : 0;
}

/* Open the chunk's file and check that the chunk lies within it: all a read does before it is
 * planned. */
static int prepare_chunk(ckptio_reader *r, uint64_t chunk)
{
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    CKPTIO__TRY(open_file(r, c->file));
    const rfile *f = &r->files[c->file];
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

/* A region resolved against the manifest: tensor, box and size. */
typedef struct box {
    const ckptio_region *reg;
    uint64_t t;
    uint64_t bytes;
    uint64_t ro[CKPTIO_MAX_NDIM], rs[CKPTIO_MAX_NDIM];
} box;

/* The part of a chunk inside the box: lo (tensor coordinates) and cnt; false when none. */
static bool intersect(const ckptio_reader *r, const box *bx, uint64_t chunk, uint64_t *lo,
                      uint64_t *cnt)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const uint64_t *co = r->m->dims + r->m->chunks[chunk].dims, *cs = co + t->ndim;
    for (uint32_t j = 0; j < t->ndim; j++) {
        lo[j] = CKPTIO__MAX(co[j], bx->ro[j]);
        uint64_t hi = CKPTIO__MIN(co[j] + cs[j], bx->ro[j] + bx->rs[j]);
        if (lo[j] >= hi) return false;
        cnt[j] = hi - lo[j];
    }
    return true;
}

/* Plan the reads of one chunk's part of the box. */
static int plan_piece(ckptio_reader *r, plan *pl, const box *bx, uint64_t chunk)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    const uint64_t *co = r->m->dims + c->dims, *cs = co + t->ndim;
    const uint64_t *ro = bx->ro, *rs = bx->rs;
    uint32_t nd = t->ndim;
    uint64_t lo[CKPTIO_MAX_NDIM], cnt[CKPTIO_MAX_NDIM];
    if (!intersect(r, bx, chunk, lo, cnt)) return 0;
    uint64_t esize = ckptio_dtype_size((int)t->dtype);
    piece p = {.dst = bx->reg->dst, .dst_cap = bx->reg->capacity, .dst_bytes = bx->bytes,
               .chunk = chunk};
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
    extent x = chunk_extent(r, chunk);
    if (p.runs == 1) return plan_single_run(pl, &x, &p, proto);
    return plan_runs(pl, &x, &p, proto);
}

/* Check a region against the manifest, resolve it into *bx, and open the files its chunks are
 * in. */
static int prepare_region(ckptio_reader *r, const ckptio_region *reg, size_t i, box *bx)
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
    bx->reg = reg;
    bx->t = (uint64_t)t_idx;
    for (uint32_t j = 0; j < t->ndim; j++) {
        bx->ro[j] = reg->offset ? reg->offset[j] : 0;
        if (bx->ro[j] > shape[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' starts at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)bx->ro[j], j, (unsigned long long)shape[j]);
        bx->rs[j] = reg->shape ? reg->shape[j] : shape[j] - bx->ro[j];
        if (bx->rs[j] > shape[j] - bx->ro[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' ends at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)(bx->ro[j] + bx->rs[j]), j,
                                (unsigned long long)shape[j]);
    }
    ckptio__volume(bx->rs, t->ndim, ckptio_dtype_size((int)t->dtype), &bx->bytes);
    if (reg->capacity < bx->bytes)
        return ckptio__fail(&r->msg, CKPTIO_E_BUFFER,
                            "tensor '%s': the region needs %llu bytes but the destination holds "
                            "%llu",
                            name, (unsigned long long)bx->bytes, (unsigned long long)reg->capacity);
    if (!bx->bytes) return 0;
    if (!reg->dst)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "tensor '%s': destination is NULL", name);
    uint64_t lo[CKPTIO_MAX_NDIM], cnt[CKPTIO_MAX_NDIM];
    for (uint64_t c = t->chunk0; c < t->chunk0 + t->n_chunks; c++)
        if (intersect(r, bx, c, lo, cnt)) CKPTIO__TRY(prepare_chunk(r, c));
    return 0;
}

static int plan_region(ckptio_reader *r, plan *pl, const box *bx)
{
    if (!bx->bytes) return 0;
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    r->stats.bytes += bx->bytes;
    r->stats.tensors++;
    for (uint64_t c = 0; c < t->n_chunks; c++) CKPTIO__TRY(plan_piece(r, pl, bx, t->chunk0 + c));
    return 0;
}

/* ---- execution ---- */

/* A damaged block: verify counts its chunk; the lowest (file, offset) is remembered. */
static int note_bad(const ckptio_reader *r, plan *pl, const seg *s, uint64_t x, uint64_t len)
{
    const ckptio__mchunk *c = &r->m->chunks[s->chunk];
    if (pl->bad && !pl->bad[s->chunk]) {
        pl->bad[s->chunk] = 1;
        pl->bad_chunks++;
    }
    uint64_t foff = c->file_off + x;
    if (!pl->has_bad || c->file < pl->bad_file || (c->file == pl->bad_file && foff < pl->bad_foff)) {
        pl->has_bad = true;
        pl->bad_file = c->file;
        pl->bad_foff = foff;
        pl->bad_chunk = s->chunk;
        pl->bad_x = x;
        pl->bad_len = len;
    }
    return pl->bad ? 0 : CKPTIO_E_CHECKSUM;
}

static void report_bad(ckptio_reader *r, const plan *pl)
{
    ckptio__fail(&r->msg, CKPTIO_E_CHECKSUM,
                 "checksum mismatch in tensor '%s': bytes %llu..%llu of its chunk at offset %llu "
                 "of '%s/%s' are damaged; restore this checkpoint from a copy or load an earlier "
                 "one",
                 tname(r, pl->bad_chunk), (unsigned long long)pl->bad_x,
                 (unsigned long long)(pl->bad_x + pl->bad_len), (unsigned long long)pl->bad_foff,
                 r->path, fname(r, pl->bad_file));
}

/* One checksum block to hash, and the part of it a staged segment puts in its destination
 * (cp_len 0: none), copied by the same worker while the block is still in its cache. */
typedef struct hblock {
    const uint8_t *p;
    uint64_t len, hash;
    uint8_t *dst;
    uint64_t cp_off, cp_len;
} hblock;

static void hash_block(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    hblock *b = (hblock *)ctx + i;
    b->hash = ckptio__hash(b->p, b->len);
    if (b->cp_len) memcpy(b->dst, b->p + b->cp_off, b->cp_len);
}

/* A staged, verified segment whose piece is one run: its blocks are copied out as they are
 * hashed (on every worker) instead of by scatter() afterwards (on one thread). */
static bool fused(const plan *pl, const seg *s)
{
    return !s->direct && s->verify && s->piece != NONE &&
           CKPTIO__VEC_AT(&pl->pieces, piece, s->piece)->k == 0;
}

/* Verify the blocks of segments segs[first, last), all in one buffer at file offset `off`,
 * hashing on every worker; mismatches are noted in file order. */
static int check_io(ckptio_reader *r, plan *pl, size_t first, size_t last, const uint8_t *buf,
                    uint64_t off)
{
    const seg *segs = pl->segs.items;
    uint64_t B = r->m->csum_block;
    pl->blocks.len = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->verify) continue;
        const ckptio__mchunk *c = &r->m->chunks[s->chunk];
        const uint8_t *base = buf + (s->foff - off);
        const piece *p = fused(pl, s) ? CKPTIO__VEC_AT(&pl->pieces, piece, s->piece) : NULL;
        for (uint64_t x = s->a; x < s->b; x += B) {
            hblock hb = {base + (x - s->a), CKPTIO__MIN(B, c->stored_len - x), 0, NULL, 0, 0};
            if (p) {
                uint64_t lo = CKPTIO__MAX(x, p->src0);
                uint64_t hi = CKPTIO__MIN(CKPTIO__MIN(x + hb.len, s->b), p->src0 + p->run_len);
                if (lo < hi) {
                    hb.dst = p->dst + p->dst0 + (lo - p->src0);
                    hb.cp_off = lo - x;
                    hb.cp_len = hi - lo;
                }
            }
            if (ckptio__vec_push(&pl->blocks, &hb, 1) < 0) return -ENOMEM;
        }
    }
    ckptio__workers_for(pl->workers, pl->blocks.len, hash_block, pl->blocks.items);
    const hblock *hb = pl->blocks.items;
    int rc = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->verify) continue;
        const ckptio__mchunk *c = &r->m->chunks[s->chunk];
        for (uint64_t x = s->a; x < s->b; x += B, hb++)
            if (hb->hash != r->m->csums[c->csums + x / B] && !rc)
                rc = note_bad(r, pl, s, x, hb->len);
    }
    return rc;
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

/* The segments of io i, [*first, *last). */
static void io_segs(const plan *pl, size_t i, size_t *first, size_t *last)
{
    const size_t *f = pl->firsts.items;
    *first = f[i];
    *last = f[i + 1];
}

typedef struct read_ctx {
    ckptio_reader *r;
    plan *pl;
} read_ctx;

/* A checkpoint read came back: verify its blocks, then scatter the staged bytes. */
static int read_done(void *ctx, size_t i, const ckptio__ring_io *io, const void *buf, int64_t res)
{
    ckptio_reader *r = ((read_ctx *)ctx)->r;
    plan *pl = ((read_ctx *)ctx)->pl;
    const seg *segs = pl->segs.items;
    size_t first, last;
    io_segs(pl, i, &first, &last);
    if (res < 0) {
        const seg *s = &segs[first];
        return ckptio__fail(&r->msg, (int)res,
                            "reading %llu bytes at offset %llu of '%s/%s' (tensor '%s') failed",
                            (unsigned long long)io->len, (unsigned long long)io->off, r->path,
                            fname(r, s->file), tname(r, s->chunk));
    }
    r->stats.io_bytes += (uint64_t)res;
    r->rstats.requests++;
    /* Segments that the bytes cover are verified and copied out; the first one cut short ends
     * the request. */
    size_t end = last;
    int trunc = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        uint64_t need = s->foff + (s->b - s->a) - io->off;
        if ((uint64_t)res < need) {
            if (pl->bad && !pl->bad[s->chunk]) {
                pl->bad[s->chunk] = 1; /* a flag: counting here would wrap */
                pl->bad_chunks++;
            }
            trunc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                                 "data file '%s/%s' ended at byte %llu while reading tensor '%s'; "
                                 "the file is truncated",
                                 r->path, fname(r, s->file),
                                 (unsigned long long)(io->off + (uint64_t)res), tname(r, s->chunk));
            end = k;
            break;
        }
    }
    int rc = check_io(r, pl, first, end, buf, io->off);
    for (size_t k = first; k < end; k++) {
        const seg *s = &segs[k];
        if (!s->direct && s->piece != NONE && !fused(pl, s))
            scatter(pl, s, (const uint8_t *)buf + (s->foff - io->off));
    }
    return trunc ? trunc : rc;
}

static void plan_init(plan *pl, rfile *files, uint64_t block, uint64_t request,
                      uint64_t buf_size)
{
    memset(pl, 0, sizeof *pl);
    pl->files = files;
    pl->block = block;
    pl->request = request;
    pl->buf_size = buf_size;
    ckptio__vec_init(&pl->pieces, sizeof(piece));
    ckptio__vec_init(&pl->segs, sizeof(seg));
    ckptio__vec_init(&pl->geo, sizeof(uint64_t));
    ckptio__vec_init(&pl->iters, sizeof(uint64_t));
    ckptio__vec_init(&pl->ios, sizeof(ckptio__ring_io));
    ckptio__vec_init(&pl->firsts, sizeof(size_t));
    ckptio__vec_init(&pl->csegs, sizeof(seg));
    ckptio__vec_init(&pl->blocks, sizeof(hblock));
}

static void plan_free(plan *pl)
{
    ckptio__vec_free(&pl->pieces);
    ckptio__vec_free(&pl->segs);
    ckptio__vec_free(&pl->geo);
    ckptio__vec_free(&pl->iters);
    ckptio__vec_free(&pl->ios);
    ckptio__vec_free(&pl->firsts);
    ckptio__vec_free(&pl->csegs);
    ckptio__vec_free(&pl->blocks);
    free(pl->bad);
}

/* Start the ring if need be and read everything planned. */
/* What one cached segment's job found. */
typedef struct cres {
    int rc;       /* 0, -errno, or CKPTIO_E_CORRUPT: the file ended `got` bytes into the part */
    bool bad;     /* a checksum mismatch at bad_x (chunk bytes), bad_len long */
    uint64_t got, bad_x, bad_len;
} cres;

typedef struct cjob {
    plan *pl;
    const ckptio_reader *r; /* NULL: a foreign file, nothing to verify */
    uint8_t *scratch;       /* one buffer of `stride` bytes per worker, for staged parts */
    uint64_t stride;
    cres *res;
} cjob;

/* Copy one resident part from the page cache, verify it while it is still in the CPU's
 * cache, and scatter it when it was staged. Parts write disjoint destination bytes. */
static void cached_job(void *ctx, size_t i, unsigned worker)
{
    cjob *j = ctx;
    const seg *s = CKPTIO__VEC_AT(&j->pl->csegs, seg, i);
    const rfile *f = &j->pl->files[s->file];
    cres *o = &j->res[i];
    uint64_t n = s->b - s->a;
    uint8_t *dst = j->scratch + (size_t)worker * j->stride;
    if (s->direct) {
        const piece *p = CKPTIO__VEC_AT(&j->pl->pieces, piece, s->piece);
        dst = p->dst + p->dst0 + (s->a - p->src0);
    }
    for (uint64_t got = 0; got < n;) {
        ssize_t k = CKPTIO__VFS->pread(f->bfd, dst + got, (size_t)(n - got), (off_t)(s->foff + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            o->rc = k < 0 ? -errno : CKPTIO_E_CORRUPT;
            o->got = got;
            return;
        }
        got += (uint64_t)k;
    }
    if (s->verify && j->r) {
        const ckptio__mchunk *c = &j->r->m->chunks[s->chunk];
        uint64_t B = j->r->m->csum_block;
        for (uint64_t x = s->a; x < s->b; x += B) {
            uint64_t len = CKPTIO__MIN(B, c->stored_len - x);
            if (ckptio__hash(dst + (x - s->a), len) != j->r->m->csums[c->csums + x / B]) {
                o->bad = true;
                o->bad_x = x;
                o->bad_len = len;
                break;
            }
        }
    }
    if (!s->direct && s->piece != NONE) scatter(j->pl, s, dst);
}

/* Run every cached segment's job on the workers; *out (the caller frees it) says how each went. */
static int run_cached(plan *pl, const ckptio_reader *r, cres **out)
{
    size_t n = pl->csegs.len;
    *out = NULL;
    if (!n) return 0;
    cjob j = {.pl = pl, .r = r};
    for (size_t i = 0; i < n; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->csegs, seg, i);
        if (!s->direct) j.stride = CKPTIO__MAX(j.stride, s->b - s->a);
        pl->cache_bytes += s->b - s->a;
    }
    j.res = calloc(n, sizeof *j.res);
    if (j.stride) j.scratch = malloc((size_t)j.stride * ckptio__workers_count(pl->workers));
    if (!j.res || (j.stride && !j.scratch)) {
        free(j.res);
        free(j.scratch);
        return -ENOMEM;
    }
    ckptio__workers_for(pl->workers, n, cached_job, &j);
    free(j.scratch);
    *out = j.res;
    return 0;
}

static int start_workers(ckptio__workers **w, unsigned n, ckptio__msg *msg, const char *label)
{
    if (*w) return 0;
    int rc = ckptio__workers_start(w, n);
    if (rc < 0) return ckptio__fail(msg, rc, "cannot start the threads that read '%s'", label);
    return 0;
}

/* Read everything planned: resident parts by the workers, then the rest through the ring.
 * Both run to the end after a checksum mismatch, so the damaged block reported is the first
 * in file order whatever the timing. */
static int execute(ckptio_reader *r, plan *pl)
{
    CKPTIO__TRY(start_workers(&r->workers, r->cfg.verify_threads, &r->msg, r->path));
    pl->workers = r->workers;
    r->rstats.verify_threads = ckptio__workers_count(r->workers);
    CKPTIO__TRY(plan_cache(pl));
    CKPTIO__TRY(plan_ios(pl));
    r->rstats.merged += pl->merged;
    CKPTIO__TRY(start_ring(r));
    cres *res;
    CKPTIO__TRY(run_cached(pl, r, &res));
    r->rstats.cache_bytes += pl->cache_bytes;
    int rc = 0;
    for (size_t i = 0; i < pl->csegs.len; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->csegs, seg, i);
        if (res[i].rc < 0) {
            if (pl->bad && !pl->bad[s->chunk]) {
                pl->bad[s->chunk] = 1;
                pl->bad_chunks++;
            }
            rc = res[i].rc == CKPTIO_E_CORRUPT
                     ? ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                                    "data file '%s/%s' ended at byte %llu while reading tensor "
                                    "'%s'; the file is truncated",
                                    r->path, fname(r, s->file),
                                    (unsigned long long)(s->foff + res[i].got), tname(r, s->chunk))
                     : ckptio__fail(&r->msg, res[i].rc,
                                    "reading %llu bytes at offset %llu of '%s/%s' (tensor '%s') "
                                    "from the page cache failed",
                                    (unsigned long long)(s->b - s->a), (unsigned long long)s->foff,
                                    r->path, fname(r, s->file), tname(r, s->chunk));
            break;
        }
        if (res[i].bad) note_bad(r, pl, s, res[i].bad_x, res[i].bad_len);
    }
    free(res);
    if (rc < 0) return rc;
    read_ctx ctx = {r, pl};
    rc = ckptio__ring_run(&r->ring, pl->ios.items, pl->ios.len, read_done, &ctx);
    if (pl->has_bad && (rc == 0 || rc == CKPTIO_E_CHECKSUM)) {
        report_bad(r, pl);
        rc = pl->bad ? rc : CKPTIO_E_CHECKSUM;
    }
    return rc;
}

/* ---- GPU destinations ---- */

/* Host regions of one GPU region, read one ring slot at a time. */
typedef struct gpu_get {
    ckptio_reader *r;
    const box *bx;
    uint64_t esize;
    ckptio__gpu_split sp;
    bool have;                       /* off/shape hold a sub-box not yet read (it did not fit) */
    uint64_t off[CKPTIO_MAX_NDIM], shape[CKPTIO_MAX_NDIM], bytes;
} gpu_get;

/* Fill a slot with as many whole sub-boxes as fit: each is one planned read into the slot. */
static int64_t get_pieces(void *ctx, uint8_t *host, uint64_t cap, uint64_t at)
{
    gpu_get *q = ctx;
    ckptio_reader *r = q->r;
    const ckptio__mtensor *t = &r->m->tensors[q->bx->t];
    CKPTIO__UNUSED(at);
    uint64_t used = 0;
    for (;;) {
        if (!q->have && !ckptio__gpu_split_next(&q->sp, q->off, q->shape, &q->bytes, q->esize))
            break;
        q->have = true;
        if (used + q->bytes > cap) break;
        for (uint32_t j = 0; j < t->ndim; j++) q->off[j] += q->bx->ro[j];
        ckptio_region sub = {.size = sizeof sub, .tensor = q->bx->t, .offset = q->off,
                             .shape = q->shape, .dst = host + used, .capacity = q->bytes};
        plan pl;
        plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
        box b;
        int rc = prepare_region(r, &sub, 0, &b);
        if (rc == 0) rc = plan_region(r, &pl, &b);
        if (rc == 0) rc = execute(r, &pl);
        plan_free(&pl);
        CKPTIO__TRY(rc);
        used += q->bytes;
        q->have = false;
    }
    return (int64_t)used;
}

typedef struct gds_check {
    ckptio_reader *r;
    const ckptio__mchunk *c;
    const char *label;
} gds_check;

/* A staged copy of bytes cuFile put in GPU memory, checked against the stored checksums
 * (slots are whole checksum blocks). */
static int check_landed(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    gds_check *v = ctx;
    ckptio_reader *r = v->r;
    uint64_t B = r->m->csum_block;
    for (uint64_t x = 0; x < n; x += B) {
        uint64_t len = CKPTIO__MIN(B, n - x);
        if (ckptio__hash(host + x, len) == r->m->csums[v->c->csums + (at + x) / B]) continue;
        return ckptio__fail(&r->msg, CKPTIO_E_CHECKSUM,
                            "checksum mismatch in tensor '%s': bytes %llu..%llu at offset %llu "
                            "of '%s' (read by GDS) are damaged; restore this checkpoint from a "
                            "copy or load an earlier one",
                            tname(r, (uint64_t)(v->c - r->m->chunks)),
                            (unsigned long long)(at + x), (unsigned long long)(at + x + len),
                            (unsigned long long)(v->c->file_off + at + x), v->label);
    }
    return 0;
}

/* Straight from the file into GPU memory with cuFile: a whole tensor stored as one plain
 * chunk, aligned, in a file cuFile takes. Checksums are verified on a staged copy of what
 * landed. 1: done; 0: not this way (st.reason says why); negative: failed. */
static int read_gds(ckptio_reader *r, const box *bx, uint64_t stream)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const ckptio__mchunk *c = &r->m->chunks[t->chunk0];
    if (t->n_chunks != 1 || c->codec != CKPTIO__CODEC_NONE || c->stored_len != bx->bytes ||
        bx->bytes < (1u << 20) || c->file_off % 4096 || bx->bytes % 4096)
        return 0; /* whole aligned extents only: O_DIRECT's rules, whatever cuFile's mode */
    const rfile *f = &r->files[c->file];
    ckptio__gpu *g = &r->gpu;
    if (!ckptio__gpu_gds_file(g, f->fd, f->direct)) return 0;
    const char *name = r->m->strtab + t->name;
    uint64_t dst = (uint64_t)(uintptr_t)bx->reg->dst;
    char label[CKPTIO__MSG_LEN / 2];
    snprintf(label, sizeof label, "%s/%s", r->path, fname(r, c->file));
    /* cuFile knows no streams: what the caller queued on dst must finish first. */
    CKPTIO__TRY(ckptio__gpu_wait_caller(g, stream, &r->msg, name));
    CKPTIO__TRY(ckptio__gpu_gds_io(g, false, dst, bx->bytes, c->file_off, &r->msg, label));
    if (verifying(r, c)) {
        gds_check v = {r, c, label};
        CKPTIO__TRY(ckptio__gpu_d2h(g, dst, bx->bytes, stream, check_landed, &v, &r->msg, name));
    }
    return 1;
}

/* A region in GPU memory: planned reads into the pinned ring, each slot copied to the device
 * while the next is read; or cuFile. */
static int read_gpu_region(ckptio_reader *r, const box *bx, uint64_t stream)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const char *name = r->m->strtab + t->name;
    if (!bx->bytes) return 0;
    ckptio__gpu *g = &r->gpu;
    CKPTIO__TRY(ckptio__gpu_start(g, (uint64_t)(uintptr_t)bx->reg->dst, &r->msg, name));
    int rc = read_gds(r, bx, stream);
    if (rc != 0) {
        if (rc > 0) r->stats.bytes += bx->bytes, r->stats.tensors++;
        return rc < 0 ? rc : 0;
    }
    gpu_get q = {.r = r, .bx = bx, .esize = ckptio_dtype_size((int)t->dtype)};
    ckptio__gpu_split_init(&q.sp, bx->rs, t->ndim, q.esize, g->slot);
    uint64_t tensors = r->stats.tensors;
    rc = ckptio__gpu_h2d(g, (uint64_t)(uintptr_t)bx->reg->dst, bx->bytes, stream, get_pieces, &q,
                         &r->msg, name);
    r->stats.tensors = tensors + 1; /* one region, however many pieces it was read in */
    if (rc == 0) ckptio__gpu_count(g, false, bx->bytes);
    return rc;
}

int ckptio_reader_gpu_stats(const ckptio_reader *r, ckptio_gpu_stats *out)
{
    if (!r || !out || out->size < offsetof(ckptio_gpu_stats, reason))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_gpu_stats: NULL argument or out->size not set");
    ckptio__gpu_stats(&r->gpu, out);
    return 0;
}

int ckptio_reader_read(ckptio_reader *r, const ckptio_region *regions, size_t n)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_read: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if (n && !regions)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_reader_read: regions is NULL");
    double t0 = ckptio__now();
    plan pl;
    plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
    ckptio__vec gpu; /* regions in GPU memory, read after the host ones */
    ckptio__vec_init(&gpu, sizeof(ckptio_region));
    pl.cache = r->cfg.cache;
    int rc;
    box bx;
    ckptio_region reg;
    for (size_t i = 0; i < n; i++) {
        CKPTIO__CHECK(take_sized(&r->msg, &reg, sizeof reg, REGION_V1, regions, i,
                                 "ckptio_reader_read", "ckptio_region"));
        if (reg.memory > CKPTIO_MEM_CUDA) {
            rc = ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                              "region %zu: unknown memory kind %u (CKPTIO_MEM_HOST is 0)", i,
                              reg.memory);
            goto out;
        }
        CKPTIO__CHECK(prepare_region(r, &reg, i, &bx));
        if (reg.memory == CKPTIO_MEM_CUDA) {
            /* Checked now, before any byte is read: a refusal leaves every destination alone. */
            if (bx.bytes) {
                const char *name = r->m->strtab + r->m->tensors[bx.t].name;
                CKPTIO__CHECK(ckptio__gpu_start(&r->gpu, (uint64_t)(uintptr_t)reg.dst, &r->msg,
                                                name));
            }
            CKPTIO__GOTO_IF(ckptio__vec_push(&gpu, &reg, 1) < 0, -ENOMEM);
            continue;
        }
        CKPTIO__CHECK(plan_region(r, &pl, &bx));
    }
    CKPTIO__CHECK(execute(r, &pl));
    for (size_t i = 0; i < gpu.len; i++) {
        ckptio_region *g = CKPTIO__VEC_AT(&gpu, ckptio_region, i);
        CKPTIO__CHECK(prepare_region(r, g, i, &bx));
        CKPTIO__CHECK(read_gpu_region(r, &bx, g->stream));
    }
out:
    ckptio__vec_free(&gpu);
    if (rc == -ENOMEM && !r->msg.text[0]) ckptio__fail(&r->msg, rc, "out of memory reading '%s'", r->path);
    if (rc < 0) ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}

int ckptio_reader_read_tensor(ckptio_reader *r, const char *name, void *dst, uint64_t capacity)
{
    if (!name) return ckptio__fail(r ? &r->msg : NULL, CKPTIO_E_USAGE, "ckptio_reader_read_tensor: name is NULL");
    ckptio_region reg = {.size = sizeof reg, .name = name, .dst = dst, .capacity = capacity};
    return ckptio_reader_read(r, &reg, 1);
}

int ckptio_reader_verify(ckptio_reader *r, uint64_t *bad_chunks)
{
    if (bad_chunks) *bad_chunks = 0;
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_verify: reader is NULL");
    ckptio__msg_clear(&r->msg);
    double t0 = ckptio__now();
    plan pl;
    plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
    pl.cache = r->cfg.cache;
    int rc;
    char first_msg[CKPTIO__MSG_LEN] = "";
    int first = 0;
    pl.bad = calloc(r->m->n_chunks + 1, 1);
    CKPTIO__GOTO_IF(!pl.bad, -ENOMEM);
    for (uint64_t c = 0; c < r->m->n_chunks; c++) {
        const ckptio__mchunk *mc = &r->m->chunks[c];
        if (!mc->stored_len) continue;
        rc = prepare_chunk(r, c);
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
        extent x = chunk_extent(r, c);
        CKPTIO__CHECK(plan_staged(&pl, &x, proto, 0, mc->stored_len));
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
    if (rc < 0) ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}

/* ---- byte ranges of foreign files ---- */

typedef struct file_ctx {
    const char *path;
    plan *pl;
    ckptio__msg *msg;
    uint64_t io_bytes;
} file_ctx;

/* A read of a foreign file came back: copy out its staged ranges. */
static int file_done(void *ctx, size_t i, const ckptio__ring_io *io, const void *buf, int64_t res)
{
    file_ctx *x = ctx;
    const seg *segs = x->pl->segs.items;
    size_t first, last;
    io_segs(x->pl, i, &first, &last);
    if (res < 0)
        return ckptio__fail(x->msg, (int)res, "reading %llu bytes at offset %llu of '%s' failed",
                            (unsigned long long)io->len, (unsigned long long)io->off, x->path);
    x->io_bytes += (uint64_t)res;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if ((uint64_t)res < s->foff + (s->b - s->a) - io->off)
            return ckptio__fail(x->msg, CKPTIO_E_CORRUPT,
                                "'%s' ended at byte %llu while reading range %llu; the file was "
                                "truncated while being read",
                                x->path, (unsigned long long)(io->off + (uint64_t)res),
                                (unsigned long long)s->chunk);
        if (!s->direct) scatter(x->pl, s, (const uint8_t *)buf + (s->foff - io->off));
    }
    return 0;
}

/* Ranges need no manifest: each is a piece of one run, planned and read like a chunk with no
 * checksums. */
int ckptio_file_read(const char *path, const ckptio_range *ranges, size_t n, const ckptio_params *p,
                     ckptio_stats *stats)
{
    if (!path || (n && !ranges))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_read: path and ranges are required");
    double t0 = ckptio__now();
    ckptio__msg msg;
    ckptio__msg_clear(&msg);
    ckptio__cfg cfg;
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    rfile file = {.fd = -1, .bfd = -1};
    ckptio__ring ring;
    memset(&ring, 0, sizeof ring);
    ckptio__workers *workers = NULL;
    int dirfd = -1;
    /* Staging as the reader sizes it for a checkpoint of 1 MiB blocks. */
    const uint64_t block = 1u << 20;
    plan pl;
    plan_init(&pl, &file, block, 0, 0);
    /* A file the caller names is not confined the way a checkpoint's own files are: follow its
     * links (a Hugging Face cache entry is snapshots/<rev>/x.bin -> ../../blobs/<sha>). Messages
     * keep naming `path`. */
    char *real = NULL;
    int lrc = ckptio__follow_links(path, &real);
    const char *target = real ? real : path;
    char *dir = ckptio__parent_dir(target);
    const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    int rc;
    if (lrc < 0) {
        rc = ckptio__fail(&msg, lrc, "cannot open '%s'%s", path,
                          lrc == -ELOOP ? ": too many levels of symbolic links" : "");
        goto out;
    }
    CKPTIO__GOTO_IF(!dir, -ENOMEM);
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &cfg, &msg));
    pl.request = cfg.request;
    pl.buf_size = CKPTIO__MAX(cfg.request, 2 * block);
    dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        rc = ckptio__fail(&msg, -errno, "cannot open directory '%s'", dir);
        goto out;
    }
    rc = open_rfile(&file, dirfd, base, cfg.direct, cfg.cache);
    if (rc < 0) {
        ckptio__fail(&msg, rc, "cannot open '%s'", path);
        goto out;
    }
    st.direct = file.direct;
    st.alignment = file.off_align;
    for (size_t i = 0; i < n; i++) {
        ckptio_range rg;
        const ckptio_range *g = &rg;
        CKPTIO__CHECK(take_sized(&msg, &rg, sizeof rg, RANGE_V1, ranges, i, "ckptio_file_read",
                                 "ckptio_range"));
        if (!g->len) continue;
        if (!g->dst) {
            rc = ckptio__fail(&msg, CKPTIO_E_USAGE, "ckptio_file_read: range %zu has no destination", i);
            goto out;
        }
        if (g->offset > UINT64_MAX - g->len) {
            rc = ckptio__fail(&msg, CKPTIO_E_RANGE, "ckptio_file_read: range %zu overflows", i);
            goto out;
        }
        if (g->offset + g->len > file.size) {
            rc = ckptio__fail(&msg, CKPTIO_E_CORRUPT,
                              "bytes %llu..%llu lie past the end of '%s' (%llu bytes): the file is "
                              "truncated or not the one expected",
                              (unsigned long long)g->offset,
                              (unsigned long long)(g->offset + g->len), path,
                              (unsigned long long)file.size);
            goto out;
        }
        piece pc = {.dst = g->dst, .dst_cap = g->len, .dst_bytes = g->len, .chunk = i,
                    .run_len = g->len, .runs = 1};
        int64_t pi = ckptio__vec_push(&pl.pieces, &pc, 1);
        CKPTIO__GOTO_IF(pi < 0, -ENOMEM);
        extent x = {.off = g->offset, .len = g->len, .file = 0, .verify = false};
        seg proto = {.piece = (uint64_t)pi, .chunk = i, .file = 0, .iter = NONE};
        CKPTIO__CHECK(plan_single_run(&pl, &x, &pc, proto));
        st.bytes += g->len;
    }
    pl.cache = cfg.cache;
    CKPTIO__CHECK(plan_cache(&pl));
    CKPTIO__CHECK(plan_ios(&pl));
    CKPTIO__CHECK(ckptio__ring_init(&ring, cfg.backend, cfg.depth, cfg.threads, cfg.staging,
                                    pl.buf_size, path, &msg));
    ckptio__stats_backend(st.backend, cfg.backend, ckptio__engine_name(ring.eng));
    if (pl.csegs.len) {
        CKPTIO__CHECK(start_workers(&workers, cfg.verify_threads, &msg, path));
        pl.workers = workers;
        cres *res;
        CKPTIO__CHECK(run_cached(&pl, NULL, &res));
        for (size_t i = 0; i < pl.csegs.len && rc >= 0; i++) {
            const seg *s = CKPTIO__VEC_AT(&pl.csegs, seg, i);
            if (res[i].rc == CKPTIO_E_CORRUPT)
                rc = ckptio__fail(&msg, CKPTIO_E_CORRUPT,
                                  "'%s' ended at byte %llu while reading range %llu; the file was "
                                  "truncated while being read",
                                  path, (unsigned long long)(s->foff + res[i].got),
                                  (unsigned long long)s->chunk);
            else if (res[i].rc < 0)
                rc = ckptio__fail(&msg, res[i].rc,
                                  "reading %llu bytes at offset %llu of '%s' from the page cache "
                                  "failed",
                                  (unsigned long long)(s->b - s->a), (unsigned long long)s->foff,
                                  path);
        }
        free(res);
        if (rc < 0) goto out;
    }
    file_ctx ctx = {.path = path, .pl = &pl, .msg = &msg};
    rc = ckptio__ring_run(&ring, pl.ios.items, pl.ios.len, file_done, &ctx);
    st.io_bytes = ctx.io_bytes;
out:
    if (rc == -ENOMEM && !msg.text[0]) ckptio__fail(&msg, rc, "out of memory reading '%s'", path);
    if (rc < 0) ckptio__fail(NULL, rc, "%s", msg.text);
    if (stats) {
        st.seconds = ckptio__now() - t0;
        st.tensors = n;
        st.gbps = st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0;
        *stats = st;
    }
    plan_free(&pl);
    ckptio__ring_fini(&ring);
    ckptio__workers_stop(workers);
    close_rfile(&file);
    if (dirfd >= 0) close(dirfd);
    free(dir);
    free(real);
    return rc < 0 ? rc : 0;
}
