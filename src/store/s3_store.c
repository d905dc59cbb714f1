/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 store: checkpoints as a manifest object and data objects under one key. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"
#include "store.h"

/* The client, bucket and key of an s3:// URL, and "<key>/<tail>" when tail is given. */
typedef struct s3_at {
    ckptio__s3 *c;
    char *bucket, *key, *sub;
} s3_at;

static int at_open(s3_at *a, const char *url, const char *tail, ckptio__msg *msg)
{
    *a = (s3_at){0};
    int rc = ckptio__s3_parse(url, &a->bucket, &a->key, msg);
    if (rc == 0) rc = ckptio__s3_client(&a->c, msg);
    if (rc == 0 && tail && asprintf(&a->sub, "%s/%s", a->key, tail) < 0) {
        a->sub = NULL;
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    return rc;
}

static void at_close(s3_at *a)
{
    free(a->bucket);
    free(a->key);
    free(a->sub);
}

typedef struct list_ctx {
    size_t skip; /* length of "prefix/" */
    ckptio__names *out;
} list_ctx;

/* key = prefix/<name>/manifest: a committed checkpoint called <name>. */
static int on_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    list_ctx *c = ctx;
    const char *name = key + c->skip, *slash = strchr(name, '/');
    if (!slash || slash == name || strcmp(slash, "/manifest")) return 0;
    return ckptio__names_add(c->out, name, (size_t)(slash - name));
}

static int s3_list(const char *url, ckptio__names *out, ckptio__msg *msg)
{
    s3_at a;
    int rc = at_open(&a, url, "", msg);
    list_ctx c = {.skip = a.sub ? strlen(a.sub) : 0, .out = out};
    if (rc == 0) rc = ckptio__s3_list(a.c, a.bucket, a.sub, on_key, &c, msg);
    at_close(&a);
    return rc;
}

static int s3_is_checkpoint(const char *url, ckptio__msg *msg)
{
    s3_at a;
    ckptio__s3_resp r = {0};
    int rc = at_open(&a, url, "manifest", msg);
    if (rc == 0) rc = ckptio__s3_head(a.c, a.bucket, a.sub, &r, msg);
    at_close(&a);
    return rc == 0 ? 1 : rc == CKPTIO_E_NOT_FOUND ? 0 : rc;
}

/* key, or "key\nupload id" for an unfinished upload. */
static int on_rm_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    return ckptio__names_add(ctx, key, strlen(key));
}

static int on_rm_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    (void)initiated;
    char *v;
    if (asprintf(&v, "%s\n%s", key, upload_id) < 0) return -ENOMEM;
    int rc = ckptio__names_add(ctx, v, strlen(v));
    free(v);
    return rc;
}

/* The manifest goes first: from that moment the checkpoint is gone as a whole, and what
 * remains are objects no manifest names (which the next save of the path sweeps if this
 * removal stops halfway). */
static int s3_remove(const char *url, ckptio__msg *msg)
{
    s3_at a;
    ckptio__names doomed = {0};
    char *mk = NULL;
    int rc = at_open(&a, url, "", msg);
    if (rc == 0 && asprintf(&mk, "%s/manifest", a.key) < 0) {
        mk = NULL;
        rc = -ENOMEM;
    }
    if (rc == 0) {
        ckptio__s3_resp r = {0};
        rc = ckptio__s3_head(a.c, a.bucket, mk, &r, msg);
        if (rc == CKPTIO_E_NOT_FOUND)
            rc = ckptio__fail(msg, CKPTIO_E_NOT_CHECKPOINT,
                              "'%s' is not a checkpoint: there is no object '%s'", url, mk);
    }
    if (rc == 0) rc = ckptio__s3_delete(a.c, a.bucket, mk, msg);
    if (rc == 0) rc = ckptio__s3_list(a.c, a.bucket, a.sub, on_rm_key, &doomed, msg);
    if (rc == 0) rc = ckptio__s3_list_uploads(a.c, a.bucket, a.sub, on_rm_upload, &doomed, msg);
    for (size_t i = 0; rc == 0 && i < doomed.n; i++) {
        char *nl = strchr(doomed.v[i], '\n');
        if (nl) {
            *nl = 0;
            rc = ckptio__s3_mpu_abort(a.c, a.bucket, doomed.v[i], nl + 1, msg);
        } else {
            rc = ckptio__s3_delete(a.c, a.bucket, doomed.v[i], msg);
        }
    }
    ckptio__names_free(&doomed);
    free(mk);
    at_close(&a);
    return rc;
}

const ckptio__store_ops ckptio__store_s3 = {
    .name = "s3",
    .scheme = "s3://",
    .list = s3_list,
    .is_checkpoint = s3_is_checkpoint,
    .remove = s3_remove,
};
