/* SPDX-License-Identifier: Apache-2.0 */
/* The writer's data files: their names, rolling to the next, striping lanes over roots. */
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

#include "../common/box.h"
#include "../io/engine.h"
#include "../io/vfd.h"
#include "../io/vfs.h"
#include "writer.h"

/* Register data file number n_files in root `root` and create it: *fd, *direct, *label. */
int ckptio__writer_new_file(ckptio_writer *w, uint32_t root, int *fd, int *direct, char **label,
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
    const char *where = root ? w->stripes[root - 1].path : w->txn.where;
    CKPTIO__RET_IF(asprintf(label, "%s/%s", where, name) < 0, -ENOMEM);
    int rc = root ? ckptio__file_open(w->stripes[root - 1].fd, name, CKPTIO__F_WRITE,
                                      w->cfg.direct, fd, direct)
                  : ckptio__txn_open_data(&w->txn, name, w->part, w->cfg.direct, fd, direct,
                                          &w->msg);
    if (rc < 0) {
        free(*label);
        *label = NULL;
        *fd = -1;
        if (!root) return rc;
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
int ckptio__writer_finish_file(ckptio_writer *w, ckptio__sink *s, int *fd, const char *label,
                               uint32_t file)
{
    CKPTIO__TRY(ckptio__sink_finish(s));
    int rc = ckptio__txn_finish_data(&w->txn, *fd, s->cursor, label, &w->msg);
    if (rc < 0 && !w->parts) return rc; /* a file stays open for close to release */
    if (w->gpu.gds_fd == *fd) ckptio__gpu_gds_forget(&w->gpu); /* cuFile lets go of it first */
    ckptio__fd_close(*fd);
    *fd = -1;
    w->sizes[file] = s->cursor;
    return rc;
}

/* Finish the current data file and go on in the next one of the same root, through the same
 * sink. */
int ckptio__writer_roll_file(ckptio_writer *w)
{
    if (w->n_files >= CKPTIO__MAX_FILES)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT,
                            "'%s' would need more than %u data files; raise max_file_bytes",
                            w->path, CKPTIO__MAX_FILES);
    CKPTIO__TRY(ckptio__writer_finish_file(w, &w->sink, &w->fd, w->data_label, w->cur_file));
    char *label;
    int direct = 0;
    uint32_t f;
    CKPTIO__TRY(ckptio__writer_new_file(w, (uint32_t)w->cur_lane, &w->fd, &direct, &label, &f));
    w->cur_file = f;
    int rc = ckptio__sink_switch(&w->sink, w->fd, direct, label);
    free(w->data_label);
    w->data_label = label;
    return rc;
}

/* Make lane k current, parking the current one with its writes in flight; a lane's first use
 * starts its engine and creates its first file. */
int ckptio__writer_lane_enter(ckptio_writer *w, size_t k)
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
    CKPTIO__TRY(ckptio__writer_new_file(w, (uint32_t)k, &w->fd, &direct, &w->data_label, &f));
    w->cur_file = f;
    return ckptio__sink_init(&w->sink, w->fd, direct, w->cfg.backend, w->cfg.depth,
                             w->cfg.threads, w->cfg.staging, w->cfg.request, w->data_label,
                             &w->msg);
}

/* The lane for a chunk of n bytes: the one given the fewest bytes so far (equal chunks go
 * round-robin), so each root receives an equal share. */
size_t ckptio__writer_pick_lane(ckptio_writer *w, uint64_t n)
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
    CKPTIO__TRY(ckptio__writer_check_usable(w));
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
        int rc = asprintf(&label, "%s/%s", w->txn.where, to) < 0 ? -ENOMEM : 0;
        if (rc < 0) label = NULL;
        else rc = ckptio__txn_rename_data(&w->txn, &w->fd, from, to, w->part, &w->msg);
        if (rc < 0) {
            free(label);
            free(p);
            w->file_prefix = was;
            return rc;
        }
        w->sink.fd = w->fd; /* nothing is written yet: the store may have made a new one */
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


/* ---- striping (issue 12) ---- */

int ckptio_writer_set_roots(ckptio_writer *w, const char *const *roots, size_t n)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_set_roots: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    if (n && !roots)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "ckptio_writer_set_roots: roots is NULL");
    if (w->chunks.len || w->n_files > 1 || w->n_stripes)
        return ckptio__fail(&w->msg, CKPTIO_E_STATE,
                            "writer for '%s': set the roots once, before the first "
                            "ckptio_writer_add",
                            w->path);
    if (w->is_part || (n && !(ckptio__txn_caps(&w->txn) & CKPTIO__STORE_LOCAL)))
        return ckptio__fail(&w->msg, CKPTIO_E_UNSUPPORTED,
                            "'%s': a %s cannot be striped over roots", w->path,
                            w->is_part ? "multi-rank save" : "checkpoint in an object store");
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

void ckptio__writer_close_data(int fd)
{
    ckptio__fd_close(fd);
}
