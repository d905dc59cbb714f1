/* SPDX-License-Identifier: Apache-2.0 */
/* Opening a checkpoint to read: its manifest, its data files (striped ones too), queries. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/engine.h"
#include "../io/vfd.h"
#include "../io/vfs.h"
#include "../codec/codec.h"
#include "open.h"
#include "reader.h"

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
/* Element i of the caller's array of sized structs (stride: element 0's size) into *out, as
 * far as its size covers; the rest of *out is zero. */
int ckptio__read_take_sized(ckptio__msg *msg, void *out, size_t ours, size_t v1, const void *arr,
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

int ckptio__read_remote_setup(ckptio_reader *r, const char *path)
{
    CKPTIO__TRY(ckptio__place_open(&r->place, path, r->cfg.store, &r->msg));
    unsigned conns = r->place.parallel ? r->place.parallel : 1;
    r->cfg.backend = CKPTIO_BACKEND_PSYNC;
    r->cfg.threads = conns;
    r->cfg.depth = 2 * conns;
    r->cfg.direct = CKPTIO_OFF;
    r->cfg.cache = CKPTIO__CACHE_OFF;
    return 0;
}

/* A checkpoint in a store that is no file system: the manifest's bytes. */
static int open_remote(ckptio_reader *r, uint8_t **buf, uint64_t *len)
{
    CKPTIO__TRY(ckptio__read_remote_setup(r, r->path));
    int rc = r->place.store->read_all(&r->place, "manifest", CKPTIO__MAX_MANIFEST_BYTES, buf, len,
                                      &r->msg);
    if (rc == CKPTIO_E_NOT_FOUND)
        return ckptio__fail(&r->msg, CKPTIO_E_NOT_CHECKPOINT,
                            "'%s' is not a committed checkpoint: there is no '%s/manifest' "
                            "(an unfinished or failed save leaves none)",
                            r->path, r->place.path);
    return rc;
}

int ckptio__read_open(ckptio_reader **out, const char *path, const ckptio_params *p)
{
    return ckptio__read_open_with(out, path, p, NULL, 0, NULL, NULL);
}

int ckptio__read_open_with(ckptio_reader **out, const char *path, const ckptio_params *p,
                           const uint8_t *given, uint64_t given_len, uint8_t **keep,
                           uint64_t *keep_len)
{
    if (keep) *keep = NULL;
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_open: out and path are required");
    }
    *out = NULL;
    double t0 = ckptio__now();
    ckptio_reader *r = NULL;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc = ckptio__read_new(path, p, &r);
    if (rc < 0) goto out;
    rc = ckptio__store_remote(path, &r->msg);
    if (rc < 0) goto out;
    bool remote = rc;
    if (given) { /* another rank read them: a copy, checked as if read here */
        CKPTIO__GOTO_IF(!(buf = malloc(given_len ? given_len : 1)), -ENOMEM);
        memcpy(buf, given, given_len);
        len = given_len;
        if (remote) CKPTIO__CHECK(ckptio__read_remote_setup(r, r->path));
    } else if (remote) {
        CKPTIO__CHECK(open_remote(r, &buf, &len));
    }
    if (!remote) {
        r->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (r->dirfd < 0) {
            rc = -errno;
            ckptio__fail(&r->msg, rc, "cannot open checkpoint directory '%s'%s", path,
                         rc == -ENOTDIR ? ": not a directory" : "");
            goto out;
        }
        if (!given) CKPTIO__CHECK(ckptio__read_manifest(r->dirfd, r->path, &r->msg, &buf, &len));
    }
    unsigned dn = 0;
    r->has_digest = EVP_Digest(buf, (size_t)len, r->digest, &dn, EVP_sha256(), NULL) && dn == 32;
    char err[512] = "";
    rc = ckptio__manifest_decode(buf, len, &r->m, err, sizeof err);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc, "'%s/manifest' %s: %s", path,
                     rc == CKPTIO_E_FORMAT ? "needs a newer ckptio" : "is corrupt", err);
        goto out;
    }
    CKPTIO__CHECK(ckptio__read_setup(r));
    r->stats.seconds = ckptio__now() - t0;
    *out = r;
    if (keep) {
        *keep = buf, *keep_len = len;
        return 0;
    }
    free(buf);
    return 0;
out:
    free(buf);
    return ckptio__read_fail_open(r, rc);
}

bool ckptio__read_verifying(const ckptio_reader *r, const ckptio__mchunk *c)
{
    return r->cfg.checksums && c->n_csums > 0 && r->m->csum_algo != CKPTIO__CSUM_NONE;
}

int ckptio__read_new(const char *path, const ckptio_params *p, ckptio_reader **out)
{
    ckptio_reader *r = *out = calloc(1, sizeof *r);
    if (!r) return ckptio__fail(NULL, -ENOMEM, "out of memory opening '%s'", path);
    r->dirfd = -1;
    ckptio__handle_init(&r->hs);
    r->path = strdup(path);
    CKPTIO__RET_IF(!r->path, -ENOMEM);
    CKPTIO__TRY(ckptio__cfg_resolve(p, &r->cfg, &r->msg));
    ckptio__gpu_init(&r->gpu, r->cfg.gpu, r->cfg.gpu_staging, r->cfg.csum_block);
    return 0;
}

int ckptio__read_setup(ckptio_reader *r)
{
    r->files = calloc(r->m->n_files + 1, sizeof *r->files);
    CKPTIO__RET_IF(!r->files, -ENOMEM);
    for (uint64_t i = 0; i < r->m->n_files; i++) r->files[i].fd = r->files[i].bfd = -1;
    CKPTIO__TRY(ckptio__stripes_init(&r->stripes, r->m->n_roots));
    r->gpu.block = r->m->csum_block ? r->m->csum_block : 4096; /* slots: whole blocks */
    /* A staging buffer holds a whole checksum block plus alignment slack at both ends; the
     * format bounds the block (manifest.c), so this does not overflow. */
    r->buf_size = CKPTIO__MAX(r->cfg.request, 2 * r->m->csum_block);
    return 0;
}

int ckptio__read_fail_open(ckptio_reader *r, int rc)
{
    if (!r) return rc; /* its allocation failed, and said so */
    ckptio__msg keep = r->msg;
    ckptio_reader_close(r);
    return ckptio__refail(NULL, &keep, rc, "cannot open checkpoint", NULL);
}

void ckptio_reader_close(ckptio_reader *r)
{
    if (!r) return;
    ckptio__ring_fini(&r->ring);
    ckptio__gpu_fini(&r->gpu);
    ckptio__workers_stop(r->workers);
    if (r->free_decoder) r->free_decoder(r);
    ckptio_reader_close(r->base);
    if (r->files)
        for (uint64_t i = 0; i < r->m->n_files; i++) ckptio__read_close_rfile(&r->files[i]);
    free(r->files);
    ckptio__stripes_free(&r->stripes);
    if (r->m) ckptio__manifest_free(r->m);
    if (r->dirfd >= 0) close(r->dirfd);
    free(r->path);
    free(r->dir);
    ckptio__place_close(&r->place);
    free(r);
}

/* The ring, on the first read: planning does not need it. */
int ckptio__read_start_ring(ckptio_reader *r)
{
    if (r->ring.eng) return 0;
    CKPTIO__TRY(ckptio__ring_init(&r->ring, r->cfg.backend, r->cfg.depth, r->cfg.threads,
                                  r->cfg.staging, r->buf_size, r->path, &r->msg));
    ckptio__stats_backend(r->stats.backend, r->cfg.backend, ckptio__engine_name(r->ring.eng));
    return 0;
}

/* Open a file to read and learn its size and alignment; -errno. */
int ckptio__read_open_rfile(rfile *f, int dirfd, const char *name, int want_direct, int cache)
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

void ckptio__read_close_rfile(rfile *f)
{
    ckptio__fd_close(f->fd);
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
    int at = ckptio__stripes_dir(&r->stripes, r->m, k);
    if (at < 0)
        return ckptio__stripes_fail(&r->stripes, &r->msg, at, r->m, k, r->path, fname(r, i),
                                    "ckptio_reader_set_roots");
    const ckptio__mroot *mr = &r->m->roots[k];
    const char *recorded = r->m->strtab + mr->path, *name = r->m->strtab + mr->name;
    rfile *f = &r->files[i];
    int rc = ckptio__read_open_rfile(f, at, fname(r, i), r->cfg.direct, r->cfg.cache);
    if (rc < 0)
        return ckptio__fail_at(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc, NULL, recorded,
                               name, CKPTIO_ERROR_NO_OFFSET,
                               "cannot open data file '%s/%s/%s' of checkpoint '%s'%s", recorded,
                               name, fname(r, i), r->path,
                               rc == -ENOENT ? ": it is missing" : "");
    r->stats.alignment = f->off_align;
    return 0;
}

int ckptio_reader_set_roots(ckptio_reader *r, const char *const *roots, size_t n)
{
    if (!r || (n && !roots))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_set_roots: NULL argument");
    /* Refused whole, the reader goes on with the recorded roots: the old ones go first. */
    (void)ckptio__stripes_set(&r->stripes, NULL, 0, &r->msg, "ckptio_reader_set_roots");
    return ckptio__stripes_set(&r->stripes, roots, n, &r->msg, "ckptio_reader_set_roots");
}

int ckptio__read_open_remote(ckptio_reader *r, rfile *f, const char *name, uint64_t known)
{
    f->size = known;
    int rc = r->place.store->open_read(&r->place, name, &f->fd, &f->size, &r->msg);
    if (rc < 0) {
        f->fd = -1;
        return rc;
    }
    f->bfd = -1;
    f->direct = 0;
    f->mem_align = f->off_align = 1;
    return 0;
}

/* Data file i of a checkpoint in a store that is no file system. */
static int open_remote_file(ckptio_reader *r, uint32_t i)
{
    rfile *f = &r->files[i];
    int rc = ckptio__read_open_remote(r, f, fname(r, i), r->m->files[i].size);
    if (rc < 0) {
        f->fd = -1;
        if (rc == CKPTIO_E_NOT_FOUND)
            return ckptio__fail_at(&r->msg, CKPTIO_E_CORRUPT, NULL, r->path, fname(r, i),
                                   CKPTIO_ERROR_NO_OFFSET,
                                   "data file '%s/%s' of checkpoint '%s' is missing", r->path,
                                   fname(r, i), r->path);
        ckptio__msg_name(&r->msg, NULL, r->path, fname(r, i), CKPTIO_ERROR_NO_OFFSET);
        return rc;
    }
    return 0;
}

/* Data files are opened when a read first needs them, before it is planned: a checkpoint with
 * a damaged file can still be inspected and its other tensors read, and a reader holds no more
 * descriptors than its reads need. */
int ckptio__read_open_file(ckptio_reader *r, uint32_t i)
{
    rfile *f = &r->files[i];
    if (f->fd >= 0) return 0;
    uint32_t root = r->m->files[i].root;
    if (r->dir) return r->open_foreign_file(r, i);
    if (r->place.store) return open_remote_file(r, i);
    if (root) return open_striped(r, i);
    int rc = ckptio__read_open_rfile(f, r->dirfd, fname(r, i), r->cfg.direct, r->cfg.cache);
    if (rc < 0)
        return ckptio__fail_at(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc, NULL, r->path,
                               fname(r, i), CKPTIO_ERROR_NO_OFFSET,
                               "cannot open data file '%s/%s'%s", r->path, fname(r, i),
                               rc == -ENOENT ? ": it is missing" : "");
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
    unsigned codec = CKPTIO__CODEC_ID(r->m->chunks[t->chunk0].codec);
    bool mixed = false, delta = false;
    for (uint64_t c = 0; c < t->n_chunks; c++) {
        const ckptio__mchunk *mc = &r->m->chunks[t->chunk0 + c];
        stored += mc->stored_len;
        mixed = mixed || CKPTIO__CODEC_ID(mc->codec) != codec;
        delta = delta || (mc->codec & CKPTIO__CODEC_DELTA);
    }
    ckptio_tensor_info ti = {.size = out->size};
    ti.codec = mixed ? "mixed" : ckptio__codec_name(codec);
    ti.delta = delta;
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

int64_t ckptio__read_find_tensor(const ckptio_reader *r, const char *name)
{
    return find_name(r->m->strtab, r->m->tensors, r->m->n_tensors, sizeof(ckptio__mtensor),
                     offsetof(ckptio__mtensor, name), offsetof(ckptio__mtensor, name_len), name);
}

int64_t ckptio_reader_find(const ckptio_reader *r, const char *name)
{
    if (!r || !name) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_find: NULL argument");
    int64_t i = ckptio__read_find_tensor(r, name);
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

int ckptio_reader_error_info(const ckptio_reader *r, ckptio_error_info *out)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_error_info: handle is NULL");
    return ckptio__msg_info(&r->msg, out, "ckptio_reader_error_info");
}

const char *ckptio_reader_base(const ckptio_reader *r)
{
    return r && r->m && r->m->has_base ? r->m->strtab + r->m->base_path : NULL;
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

int ckptio_reader_digest(const ckptio_reader *r, unsigned char out[32])
{
    if (!r || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_digest: r and out are required");
    if (!r->has_digest)
        return ckptio__fail(NULL, CKPTIO_E_UNSUPPORTED, "'%s' has no manifest of ckptio's to digest", r->path);
    memcpy(out, r->digest, sizeof r->digest);
    return 0;
}

int ckptio__manifest_file_sum(const char *dir, uint64_t *sum, ckptio__msg *msg)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return ckptio__fail(msg, -errno, "base checkpoint '%s' has no readable manifest: %s", dir,
                            strerror(errno));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            uint8_t *b = realloc(buf, cap);
            if (!b) {
                rc = -ENOMEM;
                break;
            }
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = ckptio__fail(msg, -EIO, "reading '%s' failed", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) *sum = ckptio__hash(buf, len);
    free(buf);
    return rc;
}
