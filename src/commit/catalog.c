/* SPDX-License-Identifier: Apache-2.0 */
/* What checkpoints a directory or an object-store prefix holds, and removing one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/s3.h"
#include "txn.h"

typedef struct names {
    char **v;
    size_t n, cap;
} names;

static int names_add(names *ns, const char *s, size_t len)
{
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? 2 * ns->cap : 32;
        char **v = realloc(ns->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        ns->v = v;
        ns->cap = cap;
    }
    if (!(ns->v[ns->n] = strndup(s, len))) return -ENOMEM;
    ns->n++;
    return 0;
}

static void names_free(names *ns)
{
    for (size_t i = 0; i < ns->n; i++) free(ns->v[i]);
    free(ns->v);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct list_ctx {
    size_t skip; /* length of "prefix/" */
    names *out;
} list_ctx;

/* key = prefix/<name>/manifest: a committed checkpoint called <name>. */
static int on_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    list_ctx *c = ctx;
    const char *name = key + c->skip, *slash = strchr(name, '/');
    if (!slash || slash == name || strcmp(slash, "/manifest")) return 0;
    return names_add(c->out, name, (size_t)(slash - name));
}

static int list_object(const char *url, names *out, ckptio__msg *msg)
{
    char *bucket = NULL, *key = NULL, *prefix = NULL;
    ckptio__s3 *s3;
    int rc = ckptio__s3_parse(url, &bucket, &key, msg);
    if (rc == 0) rc = ckptio__s3_client(&s3, msg);
    if (rc == 0 && asprintf(&prefix, "%s/", key) < 0) {
        prefix = NULL;
        rc = -ENOMEM;
    }
    list_ctx c = {.skip = prefix ? strlen(prefix) : 0, .out = out};
    if (rc == 0) rc = ckptio__s3_list(s3, bucket, prefix, on_key, &c, msg);
    free(bucket);
    free(key);
    free(prefix);
    return rc;
}

static int list_dir(const char *path, names *out, ckptio__msg *msg)
{
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return 0; /* no directory: no checkpoints */
        return ckptio__fail(msg, -errno, "cannot list '%s'", path);
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *m;
        if (asprintf(&m, "%s/%s/manifest", path, e->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        struct stat st;
        if (stat(m, &st) == 0 && S_ISREG(st.st_mode)) rc = names_add(out, e->d_name, strlen(e->d_name));
        free(m);
    }
    closedir(d);
    return rc;
}

int ckptio_list_checkpoints(const char *prefix, ckptio_list_cb cb, void *ctx)
{
    if (!prefix || !*prefix || !cb)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_list_checkpoints: prefix and cb are required");
    ckptio__msg msg = {0};
    names ns = {0};
    int rc = ckptio__s3_is_url(prefix) ? list_object(prefix, &ns, &msg) : list_dir(prefix, &ns, &msg);
    if (rc == 0 && ns.n) qsort(ns.v, ns.n, sizeof *ns.v, cmp_str);
    for (size_t i = 0; rc == 0 && i < ns.n; i++) rc = cb(ctx, ns.v[i]);
    names_free(&ns);
    if (rc < 0 && msg.text[0]) return ckptio__refail(NULL, &msg, rc, "cannot list checkpoints", NULL);
    return rc;
}

int ckptio_is_checkpoint(const char *path)
{
    if (!path || !*path) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_is_checkpoint: no path");
    ckptio__msg msg = {0};
    char *m = NULL, *bucket = NULL, *key = NULL;
    int rc;
    if (!ckptio__s3_is_url(path)) {
        if (asprintf(&m, "%s/manifest", path) < 0) return -ENOMEM;
        struct stat st;
        rc = stat(m, &st) == 0 && S_ISREG(st.st_mode);
        free(m);
        return rc;
    }
    ckptio__s3 *s3;
    ckptio__s3_resp r = {0};
    rc = ckptio__s3_parse(path, &bucket, &key, &msg);
    if (rc == 0) rc = ckptio__s3_client(&s3, &msg);
    if (rc == 0 && asprintf(&m, "%s/manifest", key) < 0) {
        m = NULL;
        rc = -ENOMEM;
    }
    if (rc == 0) rc = ckptio__s3_head(s3, bucket, m, &r, &msg);
    rc = rc == 0 ? 1 : rc == CKPTIO_E_NOT_FOUND ? 0 : rc;
    free(m);
    free(bucket);
    free(key);
    return rc < 0 ? ckptio__refail(NULL, &msg, rc, "cannot look for a checkpoint", NULL) : rc;
}

/* ---- remove ---- */

typedef struct rm_ctx {
    names keys;
} rm_ctx;

static int on_rm_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    rm_ctx *c = ctx;
    return names_add(&c->keys, key, strlen(key));
}

static int on_rm_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    (void)initiated;
    rm_ctx *c = ctx;
    char *v;
    if (asprintf(&v, "%s\n%s", key, upload_id) < 0) return -ENOMEM;
    int rc = names_add(&c->keys, v, strlen(v));
    free(v);
    return rc;
}

/* The manifest goes first: from that moment the checkpoint is gone as a whole, and what
 * remains are objects no manifest names (which the next save of the path sweeps if this
 * removal stops halfway). */
static int remove_object(const char *url, ckptio__msg *msg)
{
    char *bucket = NULL, *key = NULL, *mk = NULL, *prefix = NULL;
    ckptio__s3 *s3;
    rm_ctx c = {0};
    int rc = ckptio__s3_parse(url, &bucket, &key, msg);
    if (rc == 0) rc = ckptio__s3_client(&s3, msg);
    if (rc == 0 && (asprintf(&mk, "%s/manifest", key) < 0 || asprintf(&prefix, "%s/", key) < 0))
        rc = -ENOMEM;
    if (rc == 0) {
        ckptio__s3_resp r = {0};
        rc = ckptio__s3_head(s3, bucket, mk, &r, msg);
        if (rc == CKPTIO_E_NOT_FOUND)
            rc = ckptio__fail(msg, CKPTIO_E_NOT_CHECKPOINT,
                              "'%s' is not a checkpoint: there is no object '%s'", url, mk);
    }
    if (rc == 0) rc = ckptio__s3_delete(s3, bucket, mk, msg);
    if (rc == 0) rc = ckptio__s3_list(s3, bucket, prefix, on_rm_key, &c, msg);
    if (rc == 0) rc = ckptio__s3_list_uploads(s3, bucket, prefix, on_rm_upload, &c, msg);
    for (size_t i = 0; rc == 0 && i < c.keys.n; i++) {
        char *nl = strchr(c.keys.v[i], '\n');
        if (nl) {
            *nl = 0;
            rc = ckptio__s3_mpu_abort(s3, bucket, c.keys.v[i], nl + 1, msg);
        } else {
            rc = ckptio__s3_delete(s3, bucket, c.keys.v[i], msg);
        }
    }
    names_free(&c.keys);
    free(bucket);
    free(key);
    free(mk);
    free(prefix);
    return rc;
}

static int remove_dir(const char *path, ckptio__msg *msg)
{
    char *m;
    if (asprintf(&m, "%s/manifest", path) < 0) return -ENOMEM;
    struct stat st;
    int rc = stat(m, &st) == 0 && S_ISREG(st.st_mode) ? 0 : -errno;
    free(m);
    if (rc < 0)
        return ckptio__fail(msg, rc == -ENOENT ? CKPTIO_E_NOT_CHECKPOINT : rc,
                            "'%s' is not a checkpoint: it has no manifest", path);
    rc = ckptio__remove_tree(path);
    return rc < 0 ? ckptio__fail(msg, rc, "cannot remove '%s'", path) : 0;
}

int ckptio_remove_checkpoint(const char *path)
{
    if (!path || !*path)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_remove_checkpoint: path is required");
    ckptio__msg msg = {0};
    int rc = ckptio__s3_is_url(path) ? remove_object(path, &msg) : remove_dir(path, &msg);
    return rc < 0 ? ckptio__refail(NULL, &msg, rc, "cannot remove checkpoint", NULL) : 0;
}
