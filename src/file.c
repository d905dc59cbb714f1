/* SPDX-License-Identifier: Apache-2.0 */
/* The single-file writer: a foreign-format file written at device speed, published atomically. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "io/engine.h"
#include "io/sink.h"
#include "io/vfs.h"

enum { F_OPEN, F_COMMITTED, F_FAILED };

struct ckptio_file_writer {
    ckptio__msg msg;
    ckptio__cfg cfg;
    int state, err;
    char *path, *tmp_path, *parent;
    int fd;
    bool tmp_created;
    ckptio__sink sink;
    double t_open;
    ckptio_stats stats;
};

static int fw_fail(ckptio_file_writer *f, int code)
{
    if (f->state == F_OPEN) {
        f->state = F_FAILED;
        f->err = code;
    }
    return code;
}

static int fw_usable(ckptio_file_writer *f)
{
    if (f->state == F_FAILED)
        return ckptio__fail(&f->msg, f->err, "writer for '%s' failed earlier (%s); close it and "
                            "save again", f->path, ckptio_strerror(f->err));
    if (f->state != F_OPEN)
        return ckptio__fail(&f->msg, CKPTIO_E_STATE, "'%s' was already committed", f->path);
    return 0;
}

int ckptio_file_writer_open(ckptio_file_writer **out, const char *path, const ckptio_params *p)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_open: out and path are required");
    }
    *out = NULL;
    ckptio_file_writer *f = calloc(1, sizeof *f);
    if (!f) return ckptio__fail(NULL, -ENOMEM, "out of memory");
    f->fd = -1;
    f->t_open = ckptio__now();
    int rc, direct = 0;
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &f->cfg, &f->msg));
    /* Saving to a symlink writes through to its target, as torch.save does: the temporary file
     * goes beside the target (a rename cannot cross file systems) and replaces it; the link
     * stays a link. */
    rc = ckptio__follow_links(path, &f->path);
    if (rc < 0) {
        ckptio__fail(&f->msg, rc, "cannot save to '%s'%s", path,
                     rc == -ELOOP ? ": too many levels of symbolic links" : "");
        goto out;
    }
    f->parent = ckptio__parent_dir(f->path);
    size_t tlen = strlen(f->path) + 64;
    f->tmp_path = malloc(tlen);
    CKPTIO__GOTO_IF(!f->parent || !f->tmp_path, -ENOMEM);
    struct stat st;
    if (lstat(f->path, &st) == 0 && (!f->cfg.overwrite || S_ISDIR(st.st_mode))) {
        rc = ckptio__fail(&f->msg, CKPTIO_E_EXISTS, "'%s'%s%s%s already exists%s", path,
                          strcmp(path, f->path) ? " (a symlink to '" : "",
                          strcmp(path, f->path) ? f->path : "",
                          strcmp(path, f->path) ? "')" : "",
                          S_ISDIR(st.st_mode) ? " and is a directory; refusing to replace it"
                                              : "; pass overwrite to replace it");
        goto out;
    }
    for (int tries = 0;; tries++) {
        snprintf(f->tmp_path, tlen, "%s.tmp-%d.%u", f->path, (int)getpid(), ckptio__tmp_id());
        rc = ckptio__file_open(AT_FDCWD, f->tmp_path, CKPTIO__F_WRITE_USER, f->cfg.direct,
                               &f->fd, &direct);
        if (rc != -EEXIST || tries > 1000) break;
    }
    if (rc < 0) {
        f->fd = -1;
        ckptio__fail(&f->msg, rc, "cannot create a temporary file next to '%s'", f->path);
        goto out;
    }
    f->tmp_created = true;
    CKPTIO__CHECK(ckptio__sink_init(&f->sink, f->fd, direct, f->cfg.backend, f->cfg.depth,
                                    f->cfg.threads, f->cfg.staging, f->cfg.request, f->tmp_path,
                                    &f->msg));
    ckptio__stats_backend(f->stats.backend, f->cfg.backend, ckptio__engine_name(f->sink.eng));
    f->stats.direct = direct;
    f->stats.alignment = f->sink.off_align;
    *out = f;
    return 0;
out:
    if (rc == -ENOMEM && !f->msg.text[0]) ckptio__fail(&f->msg, rc, "out of memory");
    {
        char keep[CKPTIO__MSG_LEN];
        memcpy(keep, f->msg.text, sizeof keep);
        ckptio_file_writer_close(f);
        ckptio__fail(NULL, rc, "%s", keep);
    }
    return rc;
}

int ckptio_file_writer_write(ckptio_file_writer *f, const void *data, size_t len)
{
    if (!f) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_write: writer is NULL");
    CKPTIO__TRY(fw_usable(f));
    if (len && !data) return ckptio__fail(&f->msg, CKPTIO_E_USAGE, "ckptio_file_writer_write: data is NULL");
    int rc = ckptio__sink_write(&f->sink, data, len);
    if (rc < 0) return fw_fail(f, rc);
    f->stats.bytes += len;
    return 0;
}

uint64_t ckptio_file_writer_tell(const ckptio_file_writer *f)
{
    return f ? f->sink.cursor : 0;
}

/* A replaced file keeps its mode, as it would if written in place (a 0600 file stays 0600). */
static int keep_mode(ckptio_file_writer *f)
{
    struct stat st;
    if (!f->cfg.overwrite || stat(f->path, &st) < 0 || !S_ISREG(st.st_mode)) return 0;
    if (fchmod(f->fd, st.st_mode & 07777) == 0) return 0;
    return ckptio__fail(&f->msg, -errno, "cannot give '%s' the mode %03o of the file it replaces",
                        f->tmp_path, (unsigned)(st.st_mode & 07777));
}

int ckptio_file_writer_commit(ckptio_file_writer *f)
{
    if (!f) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_commit: writer is NULL");
    CKPTIO__TRY(fw_usable(f));
    int rc;
    CKPTIO__CHECK(ckptio__sink_finish(&f->sink));
    CKPTIO__CHECK(keep_mode(f));
    if (f->cfg.fsync && (rc = ckptio__fsync(f->fd)) < 0) {
        ckptio__fail(&f->msg, rc, "fsync of '%s' failed: the data may not be on the device",
                     f->tmp_path);
        goto out;
    }
    close(f->fd);
    f->fd = -1;
    /* rename() replaces a file atomically; without overwrite, never clobber one that appeared
     * since open. */
    if (f->cfg.overwrite) rc = CKPTIO__VFS->renameat2(AT_FDCWD, f->tmp_path, AT_FDCWD, f->path, 0);
    else {
        rc = CKPTIO__VFS->renameat2(AT_FDCWD, f->tmp_path, AT_FDCWD, f->path, RENAME_NOREPLACE);
        if (rc < 0 && errno == EINVAL) { /* no RENAME_NOREPLACE here: link() never replaces */
            rc = link(f->tmp_path, f->path);
            if (rc == 0) unlink(f->tmp_path);
        }
    }
    if (rc < 0) {
        rc = errno == EEXIST ? CKPTIO_E_EXISTS : -errno;
        ckptio__fail(&f->msg, rc, "cannot publish '%s' as '%s'", f->tmp_path, f->path);
        goto out;
    }
    f->state = F_COMMITTED;
    f->stats.io_bytes = f->sink.io_bytes;
    f->stats.seconds = ckptio__now() - f->t_open;
    f->stats.gbps = f->stats.seconds > 0 ? (double)f->stats.bytes / f->stats.seconds / 1e9 : 0;
    /* Past the rename nothing is undone: the file is complete and visible, only its directory
     * entry may not survive a crash, which is not the same as "not saved". */
    if (f->cfg.fsync && (rc = ckptio__fsync_path(f->parent)) < 0)
        return ckptio__fail(&f->msg, CKPTIO_E_NOT_DURABLE,
                            "published at '%s', but its directory entry may not be durable: "
                            "fsync of '%s' failed: %s; the file is complete; re-run sync or "
                            "save again",
                            f->path, f->parent, strerror(-rc));
    rc = 0;
out:
    if (rc < 0) fw_fail(f, rc);
    return rc;
}

void ckptio_file_writer_close(ckptio_file_writer *f)
{
    if (!f) return;
    ckptio__sink_fini(&f->sink);
    if (f->fd >= 0) close(f->fd);
    if (f->state != F_COMMITTED && f->tmp_created) unlink(f->tmp_path);
    free(f->path);
    free(f->tmp_path);
    free(f->parent);
    free(f);
}

int ckptio_file_writer_stats(const ckptio_file_writer *f, ckptio_stats *out)
{
    if (!f || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_stats: NULL argument");
    *out = f->stats;
    return 0;
}

const char *ckptio_file_writer_errmsg(const ckptio_file_writer *f)
{
    return f ? f->msg.text : "";
}
