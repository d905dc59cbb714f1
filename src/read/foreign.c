/* SPDX-License-Identifier: Apache-2.0 */
/* Opening safetensors files and Hugging Face directories as readers: headers in, manifest out. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../format/foreign.h"
#include "reader.h"

#define INDEX_NAME "model.safetensors.index.json"
#define INDEX_SUFFIX ".safetensors.index.json"
#define U(x) ((unsigned long long)(x))

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (s) snprintf(s, a + b + 2, "%s/%s", dir, name);
    return s;
}

/* All `len` bytes at `off`, or CKPTIO_E_CORRUPT when the file ends first (it shrank). */
static int pread_full(ckptio_reader *r, int fd, void *buf, uint64_t len, uint64_t off,
                      const char *path)
{
    for (uint64_t got = 0; got < len;) {
        ssize_t n = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return ckptio__fail(&r->msg, n < 0 ? -errno : CKPTIO_E_CORRUPT,
                                "reading '%s' at byte %llu failed%s", path, U(off + got),
                                n < 0 ? "" : ": the file ended");
        got += (uint64_t)n;
    }
    return 0;
}

/* In a store that is no file system r->dir is the place the files are read from, and `path`
 * is join(r->dir, name): the name. */
static const char *name_of(const ckptio_reader *r, const char *path)
{
    return path + strlen(r->place.path) + 1;
}

/* All `len` bytes at `off` of the file (fd >= 0) or the place's (fd < 0) `path`. */
static int read_at(ckptio_reader *r, int fd, void *buf, uint64_t len, uint64_t off,
                   const char *path)
{
    if (fd >= 0) return pread_full(r, fd, buf, len, off, path);
    uint64_t got = 0;
    CKPTIO__TRY(r->place.store->read_range(&r->place, name_of(r, path), off, len, buf, &got,
                                           &r->msg));
    return got == len ? 0
                      : ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                                     "reading '%s' at byte %llu failed: the file ended", path,
                                     U(off + got));
}

static int open_regular(ckptio_reader *r, const char *path, uint64_t max, int *fd,
                        uint64_t *size);

/* open_regular, or in a store that is no file system the size (and *fd = -1). */
static int open_src(ckptio_reader *r, const char *path, uint64_t max, int *fd, uint64_t *size)
{
    if (!r->place.store) return open_regular(r, path, max, fd, size);
    *fd = -1;
    int rc = r->place.store->size_of(&r->place, name_of(r, path), size, &r->msg);
    if (rc == CKPTIO_E_NOT_FOUND)
        return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT, "cannot open '%s': it is missing", path);
    CKPTIO__TRY(rc);
    if (max && *size > max)
        return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT, "'%s' is not a file of a readable size",
                            path);
    return 0;
}

/* Open `path` (links followed) as a regular file of at most `max` bytes (0: any). */
static int open_regular(ckptio_reader *r, const char *path, uint64_t max, int *fd, uint64_t *size)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO cannot hang the open */
    if (*fd < 0)
        return ckptio__fail(&r->msg, errno == ENOENT ? CKPTIO_E_CORRUPT : -errno,
                            "cannot open '%s'%s", path, errno == ENOENT ? ": it is missing" : "");
    struct stat st;
    if (fstat(*fd, &st) < 0 || !S_ISREG(st.st_mode) || (max && (uint64_t)st.st_size > max)) {
        close(*fd);
        *fd = -1;
        return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT, "'%s' is not a regular file%s", path,
                            max ? " of a readable size" : "");
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

/* Read and parse the header of the safetensors file at `path`. */
static int read_header(ckptio_reader *r, const char *path, uint64_t *size, ckptio__st_header **h)
{
    int fd, rc;
    uint8_t head[8], *buf = NULL;
    char err[512] = "";
    CKPTIO__TRY(open_src(r, path, 0, &fd, size));
    if (*size < 8) {
        rc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                          "'%s': %llu bytes, too short for a safetensors file", path, U(*size));
        goto out;
    }
    CKPTIO__CHECK(read_at(r, fd, head, 8, 0, path));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | head[i];
    /* A length past the limit or the file is refused by the parser before it reads a byte. */
    bool fits = n <= CKPTIO__ST_MAX_HEADER && n <= *size - 8;
    if (fits) {
        buf = malloc(n ? n : 1);
        CKPTIO__GOTO_IF(!buf, -ENOMEM);
        CKPTIO__CHECK(read_at(r, fd, buf, n, 8, path));
    }
    rc = ckptio__st_parse(fits ? buf : head, n, *size, h, err, sizeof err);
    if (rc < 0) ckptio__fail(&r->msg, rc, "'%s': %s", path, err);
out:
    free(buf);
    if (fd >= 0) close(fd);
    return rc;
}

static int read_index(ckptio_reader *r, const char *path, ckptio__st_index **ix)
{
    int fd, rc;
    uint64_t size;
    uint8_t *buf = NULL;
    char err[512] = "";
    CKPTIO__TRY(open_src(r, path, CKPTIO__ST_MAX_HEADER, &fd, &size));
    buf = malloc(size ? size : 1);
    CKPTIO__GOTO_IF(!buf, -ENOMEM);
    CKPTIO__CHECK(read_at(r, fd, buf, size, 0, path));
    rc = ckptio__st_index_parse(buf, size, ix, err, sizeof err);
    if (rc < 0)
        ckptio__fail(&r->msg, rc, "the index '%s' is not JSON that an index holds: %s", path,
                     err);
out:
    free(buf);
    if (fd >= 0) close(fd);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's entries by kind: indexes, shards, and whether a manifest is among them. */
typedef struct entries {
    ckptio__vec shards, indexes;
    bool ckptio_own;
} entries;

static int sort_entry(entries *e, const char *name)
{
    ckptio__vec *to = ends_with(name, INDEX_SUFFIX)    ? &e->indexes
                      : ends_with(name, ".safetensors") ? &e->shards
                                                        : NULL;
    e->ckptio_own |= !strcmp(name, "manifest");
    if (!to) return 0;
    char *s = strdup(name);
    if (!s || ckptio__vec_push(to, &s, 1) < 0) {
        free(s);
        return -ENOMEM;
    }
    return 0;
}

static int on_name(void *ctx, const char *name)
{
    return sort_entry(ctx, name);
}

static int gather(ckptio_reader *r, entries *e)
{
    if (r->place.store) return r->place.store->list_names(&r->place, on_name, e, &r->msg);
    DIR *d = opendir(r->dir);
    if (!d) return ckptio__fail(&r->msg, -errno, "cannot open directory '%s'", r->dir);
    int rc = 0;
    for (struct dirent *de; rc == 0 && (errno = 0, de = readdir(d));) rc = sort_entry(e, de->d_name);
    if (rc == 0 && errno) rc = ckptio__fail(&r->msg, -errno, "cannot list '%s'", r->dir);
    closedir(d);
    return rc;
}

/* The names to read in directory r->dir: an index (*index set; the shards come from it), or
 * every *.safetensors file, sorted. */
static int list_dir(ckptio_reader *r, char ***names, size_t *n, char **index)
{
    entries e = {.ckptio_own = false};
    ckptio__vec_init(&e.shards, sizeof(char *));
    ckptio__vec_init(&e.indexes, sizeof(char *));
    int rc = gather(r, &e);
    CKPTIO__GOTO_IF(rc < 0, rc);
    if (e.ckptio_own) {
        rc = ckptio__fail(&r->msg, CKPTIO_E_FORMAT,
                          "'%s' is a ckptio checkpoint (it has a manifest): open it with "
                          "ckptio_reader_open",
                          r->dir);
        goto out;
    }
    char **ix = e.indexes.items, **sh = e.shards.items;
    if (e.indexes.len > 1) qsort(ix, e.indexes.len, sizeof *ix, cmp_str);
    if (e.shards.len > 1) qsort(sh, e.shards.len, sizeof *sh, cmp_str);
    for (size_t i = 0; i < e.indexes.len && !*index; i++)
        if (!strcmp(ix[i], INDEX_NAME)) *index = strdup(ix[i]);
    if (!*index && e.indexes.len > 1) {
        rc = ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                          "'%s' holds several e.indexes ('%s', '%s'%s); open the one to read",
                          r->dir, ix[0], ix[1], e.indexes.len > 2 ? ", ..." : "");
        goto out;
    }
    if (!*index && e.indexes.len == 1) *index = strdup(ix[0]);
    CKPTIO__GOTO_IF(e.indexes.len && !*index, -ENOMEM);
    if (!*index && !e.shards.len) {
        rc = ckptio__fail(&r->msg, CKPTIO_E_NOT_CHECKPOINT,
                          "'%s' holds no .safetensors file and no index", r->dir);
        goto out;
    }
    if (!*index) {
        *names = sh;
        *n = e.shards.len;
        e.shards.items = NULL; /* now the caller's */
        e.shards.len = 0;
    }
out:
    for (size_t i = 0; i < e.indexes.len; i++) free(((char **)e.indexes.items)[i]);
    for (size_t i = 0; i < e.shards.len; i++) free(((char **)e.shards.items)[i]);
    ckptio__vec_free(&e.indexes);
    ckptio__vec_free(&e.shards);
    return rc;
}

/* The files an index names, each once in the order first named; a name that is not a plain
 * relative path inside the directory is refused. */
static int index_files(ckptio_reader *r, const ckptio__st_index *ix, const char *index,
                       char ***names, size_t *n)
{
    char **out = calloc(ix->n_map ? ix->n_map : 1, sizeof *out);
    size_t k = 0;
    if (!out) return -ENOMEM;
    for (uint64_t i = 0; i < ix->n_map; i++) {
        const char *f = ix->strtab + ix->map[i].val;
        bool bad = !*f || *f == '/';
        for (const char *c = f; !bad && c;) {
            const char *slash = strchr(c, '/');
            size_t len = slash ? (size_t)(slash - c) : strlen(c);
            bad = len == 2 && !memcmp(c, "..", 2);
            c = slash ? slash + 1 : NULL;
        }
        if (bad) {
            for (size_t j = 0; j < k; j++) free(out[j]);
            free(out);
            return ckptio__fail(&r->msg, CKPTIO_E_CORRUPT,
                                "'%s': weight_map names file '%s' outside its directory", index,
                                f);
        }
        bool seen = false;
        /* Shards are few (tens): a linear look-up per distinct name costs nothing. */
        for (size_t j = k; j-- > 0 && !seen;) seen = !strcmp(out[j], f);
        if (seen) continue;
        if (!(out[k] = strdup(f))) {
            for (size_t j = 0; j < k; j++) free(out[j]);
            free(out);
            return -ENOMEM;
        }
        k++;
    }
    *names = out;
    *n = k;
    return 0;
}

static int open_foreign(ckptio_reader *r, const char *path)
{
    struct stat st;
    char **names = NULL, *index = NULL, *full = NULL;
    size_t n = 0;
    ckptio__st_index *ix = NULL;
    ckptio__st_header **hs = NULL;
    ckptio__foreign_file *files = NULL;
    int rc = 0;
    bool dir;
    rc = ckptio__store_remote(path, &r->msg);
    CKPTIO__TRY(rc);
    bool url = rc;
    if (url) {
        /* A store that is no file system has no directories: a name that is no file's is a
         * prefix. */
        dir = !ends_with(path, ".safetensors") && !ends_with(path, INDEX_SUFFIX);
    } else {
        if (stat(path, &st) < 0) return ckptio__fail(&r->msg, -errno, "cannot open '%s'", path);
        dir = S_ISDIR(st.st_mode);
    }
    if (dir) {
        r->dir = strdup(path);
        CKPTIO__RET_IF(!r->dir, -ENOMEM);
        for (size_t k = strlen(r->dir); url && k > 6 && r->dir[k - 1] == '/';) r->dir[--k] = 0;
        if (url) CKPTIO__TRY(ckptio__read_remote_setup(r, r->dir));
        CKPTIO__CHECK(list_dir(r, &names, &n, &index));
    } else {
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        r->dir = ckptio__parent_dir(path);
        CKPTIO__RET_IF(!r->dir, -ENOMEM);
        if (url) CKPTIO__TRY(ckptio__read_remote_setup(r, r->dir));
        if (ends_with(base, INDEX_SUFFIX)) index = strdup(base);
        else if ((names = calloc(1, sizeof *names)) && (names[0] = strdup(base))) n = 1;
        CKPTIO__GOTO_IF(!index && !n, -ENOMEM);
    }
    if (index) {
        full = join(r->dir, index);
        CKPTIO__GOTO_IF(!full, -ENOMEM);
        CKPTIO__CHECK(read_index(r, full, &ix));
        CKPTIO__CHECK(index_files(r, ix, full, &names, &n));
    }
    hs = calloc(n ? n : 1, sizeof *hs);
    files = calloc(n ? n : 1, sizeof *files);
    CKPTIO__GOTO_IF(!hs || !files, -ENOMEM);
    for (size_t i = 0; i < n; i++) {
        free(full);
        full = join(r->dir, names[i]);
        CKPTIO__GOTO_IF(!full, -ENOMEM);
        files[i].name = names[i];
        CKPTIO__CHECK(read_header(r, full, &files[i].size, &hs[i]));
        files[i].h = hs[i];
    }
    char err[512] = "";
    rc = ckptio__foreign_manifest(files, n, ix, &r->m, err, sizeof err);
    if (rc < 0) ckptio__fail(&r->msg, rc, "'%s': %s", path, err);
out:
    for (size_t i = 0; hs && i < n; i++) ckptio__st_free(hs[i]);
    for (size_t i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(hs);
    free(files);
    free(full);
    free(index);
    ckptio__st_index_free(ix);
    return rc;
}

static int open_foreign_file(ckptio_reader *r, uint32_t i);

int ckptio_reader_open_foreign(ckptio_reader **out, const char *path, const ckptio_params *p)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_open_foreign: out and path are required");
    }
    *out = NULL;
    double t0 = ckptio__now();
    ckptio_reader *r = NULL;
    int rc = ckptio__read_new(path, p, &r);
    if (rc >= 0) r->open_foreign_file = open_foreign_file;
    if (rc >= 0) rc = open_foreign(r, path);
    if (rc >= 0) rc = ckptio__read_setup(r);
    if (rc < 0) return ckptio__read_fail_open(r, rc);
    r->stats.seconds = ckptio__now() - t0;
    *out = r;
    return 0;
}

int ckptio_reader_st_dtype(const ckptio_reader *r, size_t index)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_st_dtype: reader is NULL");
    if (index >= r->m->n_tensors)
        return ckptio__fail(NULL, CKPTIO_E_NOT_FOUND,
                            "'%s' has %llu tensors; index %zu is past them", r->path,
                            U(r->m->n_tensors), index);
    return r->dir ? (int)r->m->tensors[index].reserved : 0; /* foreign.c keeps it there */
}

/* Open data file i of a foreign reader: r->dir/<name>, links followed (r->open_foreign_file). */
static int open_foreign_file(ckptio_reader *r, uint32_t i)
{
    rfile *f = &r->files[i];
    char *full = join(r->dir, fname(r, i)), *real = NULL, *parent = NULL;
    int rc = 0, dfd = -1;
    CKPTIO__GOTO_IF(!full, -ENOMEM);
    if (r->place.store) {
        rc = ckptio__read_open_remote(r, f, name_of(r, full), UINT64_MAX);
        if (rc == CKPTIO_E_NOT_FOUND)
            rc = ckptio__fail(&r->msg, CKPTIO_E_CORRUPT, "cannot open '%s': it is missing", full);
        goto out;
    }
    /* Links lead anywhere, as open(2) follows them: a Hugging Face cache entry is
     * snapshots/<rev>/<name> -> ../../blobs/<sha>. */
    rc = ckptio__follow_links(full, &real);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc, "cannot open '%s'", full);
        goto out;
    }
    const char *target = real ? real : full;
    const char *slash = strrchr(target, '/');
    parent = ckptio__parent_dir(target);
    CKPTIO__GOTO_IF(!parent, -ENOMEM);
    dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    rc = dfd < 0 ? -errno
                 : ckptio__read_open_rfile(f, dfd, slash ? slash + 1 : target, r->cfg.direct,
                                           r->cfg.cache);
    if (rc < 0) {
        ckptio__fail(&r->msg, rc == -ENOENT ? CKPTIO_E_CORRUPT : rc, "cannot open '%s'%s", full,
                     rc == -ENOENT ? ": it is missing" : "");
        rc = rc == -ENOENT ? CKPTIO_E_CORRUPT : rc;
        goto out;
    }
    r->stats.alignment = f->off_align;
out:
    if (dfd >= 0) close(dfd);
    free(parent);
    free(real);
    free(full);
    return rc;
}
