/* SPDX-License-Identifier: Apache-2.0 */
/* The mapper: a checkpoint's data files handed out for mmap, and checks of mapped bytes. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../codec/codec.h"
#include "../format/manifest.h"
#include "../io/engine.h"
#include "../io/vfs.h"
#include "open.h"
#include "stripes.h"

typedef struct mfile {
    int fd; /* -1 until a chunk of it is asked for */
    struct stat st;
} mfile;

struct ckptio_mapper {
    ckptio__msg msg;
    char *path;
    int dirfd;
    dev_t dev;
    ino_t ino;
    ckptio__manifest *m;
    mfile *files;
    ckptio__stripes stripes; /* format 2: ckptio_mapper_set_roots, the stripe directories */
    bool handed; /* a descriptor was handed out: the roots are fixed */
};

static const char *fname(const ckptio_mapper *m, uint32_t file)
{
    return m->m->strtab + m->m->files[file].name;
}

static const char *tname(const ckptio_mapper *m, size_t tensor)
{
    return m->m->strtab + m->m->tensors[tensor].name;
}

/* Open data file i once and remember its size and times; the error names the file (or the
 * stripe it lies in) and the way out. */
static int open_mfile(ckptio_mapper *m, uint32_t i)
{
    mfile *f = &m->files[i];
    if (f->fd >= 0) return 0;
    uint32_t root = m->m->files[i].root;
    int at = root ? ckptio__stripes_dir(&m->stripes, m->m, root - 1) : m->dirfd, direct = 0;
    if (at < 0)
        return ckptio__stripes_fail(&m->stripes, &m->msg, at, m->m, root - 1, m->path, fname(m, i),
                                    "ckptio_mapper_set_roots");
    int rc = ckptio__file_open(at, fname(m, i), CKPTIO__F_READ, CKPTIO_OFF, &f->fd, &direct);
    if (rc == 0 && fstat(f->fd, &f->st) < 0) rc = -errno;
    if (rc < 0) {
        if (f->fd >= 0) close(f->fd);
        f->fd = -1;
        return ckptio__fail_at(&m->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc, NULL, m->path,
                               fname(m, i), CKPTIO_ERROR_NO_OFFSET,
                               "cannot open data file '%s/%s'%s", m->path, fname(m, i),
                               rc == -ENOENT ? ": it is missing" : "");
    }
    return 0;
}

int ckptio_mapper_open(ckptio_mapper **out, const char *path)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_mapper_open: out and path are required");
    }
    *out = NULL;
    ckptio_mapper *m = calloc(1, sizeof *m);
    if (!m) return ckptio__fail(NULL, -ENOMEM, "out of memory opening '%s'", path);
    m->dirfd = -1;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc;
    struct stat st;
    m->path = strdup(path);
    CKPTIO__GOTO_IF(!m->path, -ENOMEM);
    m->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (m->dirfd < 0 || fstat(m->dirfd, &st) < 0) {
        rc = ckptio__fail(&m->msg, -errno, "cannot open checkpoint directory '%s'", path);
        goto out;
    }
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    CKPTIO__CHECK(ckptio__read_manifest(m->dirfd, m->path, &m->msg, &buf, &len));
    char err[512] = "";
    rc = ckptio__manifest_decode(buf, len, &m->m, err, sizeof err);
    if (rc < 0) {
        ckptio__fail(&m->msg, rc, "'%s/manifest' %s: %s", path,
                     rc == CKPTIO_E_FORMAT ? "needs a newer ckptio" : "is corrupt", err);
        goto out;
    }
    m->files = calloc(m->m->n_files + 1, sizeof *m->files);
    CKPTIO__GOTO_IF(!m->files, -ENOMEM);
    for (uint64_t i = 0; i < m->m->n_files; i++) m->files[i].fd = -1;
    CKPTIO__CHECK(ckptio__stripes_init(&m->stripes, m->m->n_roots));
    /* Every data file now, while the directory is surely this checkpoint's: a later save that
     * replaces it unlinks them, and open files stay readable. One that cannot be opened is
     * reported by the first ckptio_mapper_chunk that needs it. */
    for (uint64_t i = 0; i < m->m->n_files; i++) (void)open_mfile(m, (uint32_t)i);
    ckptio__msg_clear(&m->msg);
    free(buf);
    *out = m;
    return 0;
out:
    free(buf);
    {
        ckptio__msg keep = m->msg;
        ckptio_mapper_close(m);
        return ckptio__refail(NULL, &keep, rc, "cannot open checkpoint", NULL);
    }
}

void ckptio_mapper_close(ckptio_mapper *m)
{
    if (!m) return;
    if (m->files)
        for (uint64_t i = 0; i < m->m->n_files; i++)
            if (m->files[i].fd >= 0) close(m->files[i].fd);
    free(m->files);
    ckptio__stripes_free(&m->stripes);
    if (m->m) ckptio__manifest_free(m->m);
    if (m->dirfd >= 0) close(m->dirfd);
    free(m->path);
    free(m);
}

int ckptio_mapper_same(const ckptio_mapper *m, const char *path)
{
    if (!m || !path) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_mapper_same: NULL argument");
    struct stat st;
    if (stat(path, &st) < 0) return ckptio__fail(NULL, -errno, "cannot stat '%s'", path);
    /* The mapper holds its directory open, so its inode number cannot be reused meanwhile. */
    return st.st_dev == m->dev && st.st_ino == m->ino;
}

int ckptio_mapper_set_roots(ckptio_mapper *m, const char *const *roots, size_t n)
{
    if (!m || (n && !roots))
        return ckptio__fail(m ? &m->msg : NULL, CKPTIO_E_USAGE,
                            "ckptio_mapper_set_roots: NULL argument");
    CKPTIO__TRY(ckptio__stripes_check(roots, n, &m->msg, "ckptio_mapper_set_roots"));
    /* Python maps each descriptor once, by number: one handed out must stay what it is. */
    if (m->handed)
        return ckptio__fail(&m->msg, CKPTIO_E_STATE,
                            "ckptio_mapper_set_roots: '%s' has handed out data files already; "
                            "set the roots before the first ckptio_mapper_chunk", m->path);
    CKPTIO__TRY(ckptio__stripes_set(&m->stripes, roots, n, &m->msg, "ckptio_mapper_set_roots"));
    /* The stripes again, from the given roots first: opened now, as ckptio_mapper_open opens
     * them, so that a later save replacing the checkpoint cannot take them away. */
    for (uint64_t i = 0; i < m->m->n_files; i++) {
        if (!m->m->files[i].root) continue;
        if (m->files[i].fd >= 0) close(m->files[i].fd);
        m->files[i].fd = -1;
        (void)open_mfile(m, (uint32_t)i);
    }
    ckptio__msg_clear(&m->msg);
    return 0;
}

static int find_chunk(ckptio_mapper *m, size_t tensor, size_t chunk, const ckptio__mchunk **out)
{
    if (!m || tensor >= m->m->n_tensors || chunk >= m->m->tensors[tensor].n_chunks)
        return ckptio__fail(m ? &m->msg : NULL, CKPTIO_E_NOT_FOUND,
                            "no chunk %zu of tensor %zu in '%s'", chunk, tensor,
                            m ? m->path : "(null)");
    *out = &m->m->chunks[m->m->tensors[tensor].chunk0 + chunk];
    return 0;
}

int ckptio_mapper_chunk(ckptio_mapper *m, size_t tensor, size_t chunk, int *fd,
                        uint64_t *file_offset, uint64_t *stored_bytes)
{
    const ckptio__mchunk *c = NULL;
    CKPTIO__TRY(find_chunk(m, tensor, chunk, &c));
    mfile *f = &m->files[c->file];
    int rc = open_mfile(m, c->file);
    if (rc < 0) {
        ckptio__msg_name(&m->msg, tname(m, tensor), NULL, NULL, c->file_off);
        return rc;
    }
    uint64_t want = m->m->files[c->file].size;
    if ((uint64_t)f->st.st_size < want)
        return ckptio__fail_at(&m->msg, CKPTIO_E_CORRUPT, tname(m, tensor), m->path,
                               fname(m, c->file), c->file_off,
                               "data file '%s/%s' is truncated: it has %llu bytes, the manifest "
                               "says %llu (tensor '%s' is stored at bytes %llu..%llu); the "
                               "checkpoint is damaged, load another one",
                               m->path, fname(m, c->file), (unsigned long long)f->st.st_size,
                               (unsigned long long)want, tname(m, tensor),
                               (unsigned long long)c->file_off,
                               (unsigned long long)(c->file_off + c->stored_len));
    if (c->codec != CKPTIO__CODEC_NONE)
        return ckptio__fail_at(&m->msg, CKPTIO_E_UNSUPPORTED, tname(m, tensor), m->path,
                               fname(m, c->file), c->file_off,
                               "tensor '%s' is stored compressed (codec %s) in '%s': its file "
                               "bytes are not its data; read it with ckptio_reader_read instead",
                               tname(m, tensor), ckptio__codec_name(CKPTIO__CODEC_ID(c->codec)),
                               m->path);
    m->handed = true;
    if (fd) *fd = f->fd;
    if (file_offset) *file_offset = c->file_off;
    if (stored_bytes) *stored_bytes = c->stored_len;
    return 0;
}

int ckptio_mapper_check(ckptio_mapper *m, size_t tensor, size_t chunk, const void *data,
                        uint64_t len)
{
    const ckptio__mchunk *c = NULL;
    CKPTIO__TRY(find_chunk(m, tensor, chunk, &c));
    if (len != c->stored_len || (len && !data))
        return ckptio__fail(&m->msg, len != c->stored_len ? CKPTIO_E_SHAPE : CKPTIO_E_USAGE,
                            "ckptio_mapper_check: chunk %zu of tensor '%s' has %llu stored "
                            "bytes; got %llu", chunk, tname(m, tensor),
                            (unsigned long long)c->stored_len, (unsigned long long)len);
    if (m->m->csum_algo == CKPTIO__CSUM_NONE) return 0;
    const uint8_t *p = data;
    uint64_t B = m->m->csum_block;
    for (uint64_t x = 0; x < len; x += B) {
        uint64_t n = CKPTIO__MIN(B, len - x);
        if (ckptio__hash(p + x, n) == m->m->csums[c->csums + x / B]) continue;
        return ckptio__fail_at(&m->msg, CKPTIO_E_CHECKSUM, tname(m, tensor), m->path,
                               fname(m, c->file), c->file_off + x,
                               "checksum mismatch in tensor '%s': bytes %llu..%llu of its chunk "
                               "at offset %llu of '%s/%s' are damaged (or were changed after "
                               "loading); restore this checkpoint from a copy or load an "
                               "earlier one",
                               tname(m, tensor), (unsigned long long)x,
                               (unsigned long long)(x + n), (unsigned long long)(c->file_off + x),
                               m->path, fname(m, c->file));
    }
    return 0;
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

int ckptio_mapper_unchanged(ckptio_mapper *m)
{
    if (!m) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_mapper_unchanged: NULL argument");
    for (uint64_t i = 0; i < m->m->n_files; i++) {
        const mfile *f = &m->files[i];
        if (f->fd < 0) continue;
        struct stat st;
        if (fstat(f->fd, &st) < 0)
            return ckptio__fail(&m->msg, -errno, "cannot stat data file '%s/%s'", m->path,
                                fname(m, (uint32_t)i));
        /* Not the status change time: unlinking the file (a later save replacing this
         * checkpoint) changes it, and leaves the mapped bytes intact. */
        if (st.st_size != f->st.st_size || !same_time(&st.st_mtim, &f->st.st_mtim))
            return ckptio__fail(&m->msg, CKPTIO_E_CORRUPT,
                                "data file '%s/%s' changed on disk after it was mapped (written "
                                "in place: ckptio never does so); tensors mapped from it may "
                                "mix old and new bytes: load the checkpoint again",
                                m->path, fname(m, (uint32_t)i));
    }
    return 0;
}

const char *ckptio_mapper_errmsg(const ckptio_mapper *m)
{
    return m ? m->msg.text : "";
}

int ckptio_mapper_error_info(const ckptio_mapper *m, ckptio_error_info *out)
{
    if (!m) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_mapper_error_info: NULL handle");
    return ckptio__msg_info(&m->msg, out, "ckptio_mapper_error_info");
}
