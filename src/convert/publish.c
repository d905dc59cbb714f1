/* SPDX-License-Identifier: Apache-2.0 */
/* The convert engine's atomic publish: a temporary sibling of the destination, renamed over it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../commit/txn.h"
#include "convert.h"

/* Destinations that are no ckptio checkpoint: the writers of ckptio checkpoints and of single
 * safetensors files run their own transaction (src/commit), these are published here. */

static bool empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

static bool is_dir_of(const char *dir, const char *name)
{
    char *p = NULL;
    bool ok = asprintf(&p, "%s/%s", dir, name) >= 0 && access(p, F_OK) == 0;
    free(p);
    return ok;
}

/* What --overwrite may replace: a destination of the same kind, never an arbitrary directory
 * or file. Returns 0, or fails naming what is there. */
static int replaceable(ckptio__conv *c, const struct stat *st)
{
    const char *dst = c->a.dst, *what = NULL;
    switch (c->a.to) {
    case CKPTIO_CONVERT_HF:
        if (S_ISDIR(st->st_mode)) {
            char *idx = ckptio__conv_find_index(dst);
            if (idx || empty_dir(dst)) return free(idx), 0;
        }
        what = "a Hugging Face safetensors directory (nor empty)";
        break;
    case CKPTIO_CONVERT_DCP:
        if (S_ISDIR(st->st_mode) && (is_dir_of(dst, ".metadata") || empty_dir(dst))) return 0;
        what = "a DCP directory (nor empty)";
        break;
    default: /* one file: safetensors, torch */
        if (S_ISREG(st->st_mode)) return 0;
        what = "a file";
        break;
    }
    return CONV_FAIL(c, CKPTIO_E_EXISTS, "%s exists and is not %s; refusing to replace it", dst,
                     what);
}

int ckptio__conv_check_dst(ckptio__conv *c)
{
    struct stat st;
    if (c->a.to == CKPTIO_CONVERT_CKPTIO || lstat(c->a.dst, &st) < 0) return 0;
    if (!c->a.overwrite)
        return CONV_FAIL(c, CKPTIO_E_EXISTS, "%s already exists; pass --overwrite to replace it",
                         c->a.dst);
    if (stat(c->a.dst, &st) < 0) return 0; /* a dangling link: replaced like nothing */
    return replaceable(c, &st);
}

int ckptio__conv_tmp_begin(ckptio__conv *c, bool dir)
{
    if (asprintf(&c->tmp, "%s.tmp-%d.%u", c->a.dst, (int)getpid(), ckptio__tmp_id()) < 0) {
        c->tmp = NULL;
        return CONV_FAIL(c, -ENOMEM, "%s: out of memory", c->a.dst);
    }
    if (dir && mkdir(c->tmp, 0777) < 0) {
        int e = errno;
        free(c->tmp);
        c->tmp = NULL;
        return CONV_FAIL(c, -e, "%s: cannot create the temporary directory beside it: %s",
                         c->a.dst, strerror(e));
    }
    return 0;
}

static void fsync_path(const char *path, int flags)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | flags);
    if (fd >= 0) fsync(fd), close(fd);
}

int ckptio__conv_publish(ckptio__conv *c)
{
    struct stat st;
    bool dir = stat(c->tmp, &st) == 0 && S_ISDIR(st.st_mode);
    /* The files inside are the sink's to fsync; the directory's entries are ours. */
    fsync_path(c->tmp, dir ? O_DIRECTORY : 0);
    char *parent = ckptio__parent_dir(c->a.dst);
    int rc = 0;
    if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->a.dst, RENAME_NOREPLACE) == 0) goto done;
    if (errno != EEXIST) {
        rc = CONV_FAIL(c, -errno, "%s: publishing: %s", c->a.dst, strerror(errno));
        goto out;
    }
    if (!c->a.overwrite) {
        rc = CONV_FAIL(c, CKPTIO_E_EXISTS, "%s already exists; pass --overwrite to replace it",
                       c->a.dst);
        goto out;
    }
    if (stat(c->a.dst, &st) < 0 || (rc = replaceable(c, &st)) < 0) {
        rc = rc < 0 ? rc : CONV_FAIL(c, -errno, "%s: %s", c->a.dst, strerror(errno));
        goto out;
    }
    /* A file is replaced by rename(2) itself; a directory is swapped with the new one, and the
     * old one, now under the temporary name, removed once the swap is durable. */
    if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->a.dst, dir ? RENAME_EXCHANGE : 0) < 0) {
        rc = CONV_FAIL(c, -errno, "%s: replacing: %s", c->a.dst, strerror(errno));
        goto out;
    }
    if (parent) fsync_path(parent, O_DIRECTORY);
    if (dir) ckptio__remove_tree(c->tmp);
    free(c->tmp);
    c->tmp = NULL;
    goto out;
done:
    if (parent) fsync_path(parent, O_DIRECTORY);
    free(c->tmp);
    c->tmp = NULL;
out:
    free(parent);
    return rc;
}

void ckptio__conv_tmp_abort(ckptio__conv *c)
{
    if (!c->tmp) return;
    struct stat st;
    if (lstat(c->tmp, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            ckptio__remove_tree(c->tmp);
        else
            unlink(c->tmp);
    }
    free(c->tmp);
    c->tmp = NULL;
}
