/* SPDX-License-Identifier: Apache-2.0 */
/* Objects of any object store as the engine's files (io/vfd.h): a request is one part upload or
 * one ranged GET. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/vfd.h"
#include "objc.h"

typedef struct obj_t {
    ckptio__objc *c;
    char *bucket, *key;
    char *upload_id; /* writing: made at the first full part, until finished or aborted */
    int create_rc;   /* its creation's failure, for the parts that needed it too */
    bool write, finished;
    bool single; /* the object was one short part, written whole by one request */
    uint64_t size, part_size;
    pthread_mutex_t lock; /* guards what follows */
    char (*etags)[128];   /* part i + 1's ETag at i, "" until it arrives */
    uint64_t *lens;
    unsigned nparts; /* slots allocated */
    char error[CKPTIO__MSG_LEN]; /* the first failed request's message, and its code */
    int error_rc;
} obj_t;

static const ckptio__vfd_ops obj_ops;

static obj_t *lookup(int fd)
{
    return ckptio__vfd_obj(fd, &obj_ops);
}

bool ckptio__obj_is(int fd)
{
    return lookup(fd) != NULL;
}

static void obj_free(obj_t *o)
{
    if (!o) return;
    free(o->bucket);
    free(o->key);
    free(o->upload_id);
    free(o->etags);
    free(o->lens);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

static obj_t *obj_new(ckptio__objc *c, const char *bucket, const char *key, ckptio__msg *msg)
{
    obj_t *o = calloc(1, sizeof *o);
    if (o) {
        o->c = c;
        o->bucket = strdup(bucket);
        o->key = strdup(key);
        pthread_mutex_init(&o->lock, NULL);
        if (!o->bucket || !o->key) {
            obj_free(o);
            o = NULL;
        }
    }
    if (!o) ckptio__fail(msg, -ENOMEM, "out of memory opening %s%s/%s", c->ops->scheme, bucket, key);
    return o;
}

int ckptio__obj_open_write(ckptio__objc *c, const char *bucket, const char *key,
                           uint64_t part_size, int *fd, ckptio__msg *msg)
{
    *fd = -1;
    if (part_size < (5ull << 20) || part_size > (5ull << 30))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s%s/%s: part size %llu is outside 5 MiB..5 GiB", c->ops->scheme,
                            bucket, key, (unsigned long long)part_size);
    obj_t *o = obj_new(c, bucket, key, msg);
    if (!o) return -ENOMEM;
    o->write = true;
    o->part_size = part_size;
    int rc = ckptio__vfd_open(&obj_ops, o, fd, msg);
    if (rc < 0) obj_free(o);
    return rc;
}

int ckptio__obj_open_read(ckptio__objc *c, const char *bucket, const char *key, uint64_t *size,
                          int *fd, ckptio__msg *msg)
{
    *fd = -1;
    ckptio__obj_resp r = {.size = *size};
    int rc = *size == UINT64_MAX ? ckptio__obj_head(c, bucket, key, &r, msg) : 0;
    if (rc < 0) return rc;
    obj_t *o = obj_new(c, bucket, key, msg);
    if (!o) return -ENOMEM;
    o->size = r.size;
    rc = ckptio__vfd_open(&obj_ops, o, fd, msg);
    if (rc < 0) obj_free(o);
    else *size = r.size;
    return rc;
}

static int64_t keep_error(obj_t *o, const ckptio__msg *m, int rc)
{
    pthread_mutex_lock(&o->lock);
    if (!o->error[0]) {
        snprintf(o->error, sizeof o->error, "%s", m->text);
        o->error_rc = rc;
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

/* Room for part index i in the ETag and length arrays. */
static int grow_parts(obj_t *o, unsigned i)
{
    if (i < o->nparts) return 0;
    unsigned n = o->nparts ? o->nparts : 64;
    while (n <= i) n *= 2;
    if (n > o->c->ops->max_parts) n = o->c->ops->max_parts;
    char(*e)[128] = realloc(o->etags, n * sizeof *e);
    if (!e) return -ENOMEM;
    o->etags = e;
    uint64_t *l = realloc(o->lens, n * sizeof *l);
    if (!l) return -ENOMEM;
    o->lens = l;
    memset(o->etags + o->nparts, 0, (n - o->nparts) * sizeof *e);
    memset(o->lens + o->nparts, 0, (n - o->nparts) * sizeof *l);
    o->nparts = n;
    return 0;
}

static int64_t obj_write(obj_t *o, ckptio__req *r, ckptio__msg *m)
{
    if (r->off % o->part_size || !r->len || r->len > o->part_size)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "%s%s/%s: a write of %llu bytes at %llu is not one part of %llu "
                            "bytes", o->c->ops->scheme, o->bucket, o->key, (unsigned long long)r->len,
                            (unsigned long long)r->off, (unsigned long long)o->part_size);
    uint64_t idx = r->off / o->part_size;
    if (idx >= o->c->ops->max_parts)
        return ckptio__fail(m, -EFBIG, "%s%s/%s: more than %u parts of %llu bytes", o->c->ops->scheme, o->bucket,
                            o->key, o->c->ops->max_parts, (unsigned long long)o->part_size);
    /* A first part shorter than a part is the whole object: one request writes it. Else the
     * multipart upload is made by the first part that needs it (an object of one part, the
     * most common case for a rank's small share, costs one request rather than three). */
    bool single = idx == 0 && r->len < o->part_size;
    pthread_mutex_lock(&o->lock);
    int rc = grow_parts(o, (unsigned)idx);
    if (rc == 0 && !single && !o->upload_id) {
        rc = o->create_rc;
        if (rc < 0) ckptio__fail(m, rc, "%s%s/%s: the multipart upload could not be made",
                                 o->c->ops->scheme, o->bucket, o->key);
        else if ((rc = ckptio__obj_mpu_create(o->c, o->bucket, o->key, &o->upload_id, m)) < 0)
            o->create_rc = rc;
    } else if (rc < 0) {
        ckptio__fail(m, rc, "out of memory");
    }
    pthread_mutex_unlock(&o->lock);
    if (rc < 0) return rc;
    char etag[128] = "";
    rc = single ? ckptio__obj_put(o->c, o->bucket, o->key, r->buf, r->len, NULL, NULL, m)
                : ckptio__obj_mpu_part(o->c, o->bucket, o->key, o->upload_id, (unsigned)idx + 1,
                                       r->buf, r->len, etag, m);
    if (rc < 0) return rc;
    pthread_mutex_lock(&o->lock);
    memcpy(o->etags[idx], etag, sizeof etag);
    o->lens[idx] = r->len;
    o->single = o->single || single;
    pthread_mutex_unlock(&o->lock);
    return (int64_t)r->len;
}

static int64_t obj_read(obj_t *o, ckptio__req *r, ckptio__msg *m)
{
    if (r->off >= o->size) return 0;
    uint64_t len = CKPTIO__MIN(r->len, o->size - r->off), got = 0;
    int rc = ckptio__obj_get_range(o->c, o->bucket, o->key, r->off, len, r->buf, &got, m);
    if (rc == CKPTIO_E_NOT_FOUND) /* opened at a length the caller knew: the object is gone */
        rc = ckptio__fail(m, CKPTIO_E_CORRUPT, "%s%s/%s is missing", o->c->ops->scheme, o->bucket, o->key);
    return rc < 0 ? rc : (int64_t)got;
}

static void obj_io(void *obj, ckptio__req *r)
{
    obj_t *o = obj;
    ckptio__msg *m = malloc(sizeof *m); /* ~9 KiB: not on an I/O thread's stack */
    if (!m) {
        r->res = -ENOMEM;
        return;
    }
    m->text[0] = 0;
    int64_t res;
    if (r->op == CKPTIO__OP_WRITE) {
        res = o->write && !o->finished
                  ? obj_write(o, r, m)
                  : ckptio__fail(m, -EBADF, "%s%s/%s: not open for writing", o->c->ops->scheme, o->bucket, o->key);
    } else {
        res = !o->write ? obj_read(o, r, m)
                        : ckptio__fail(m, -EBADF, "%s%s/%s: not open for reading", o->c->ops->scheme, o->bucket,
                                       o->key);
    }
    if (res < 0) keep_error(o, m, (int)res);
    free(m);
    r->done_ = res > 0 ? (uint64_t)res : 0;
    r->res = res;
}

int ckptio__obj_finish(int fd, uint64_t len, ckptio__msg *msg)
{
    obj_t *o = lookup(fd);
    if (!o || !o->write || o->finished)
        return ckptio__fail(msg, -EBADF, "finishing descriptor %d: not an object being written",
                            fd);
    uint64_t n = (len + o->part_size - 1) / o->part_size;
    int rc = 0;
    pthread_mutex_lock(&o->lock);
    if (o->error[0]) rc = ckptio__fail(msg, o->error_rc, "%s", o->error);
    for (uint64_t i = 0; rc == 0 && i < o->nparts; i++) {
        uint64_t want = i + 1 < n ? o->part_size : i + 1 == n ? len - i * o->part_size : 0;
        if (o->lens[i] != want)
            rc = ckptio__fail(msg, CKPTIO_E_USAGE,
                              "%s%s/%s: part %llu holds %llu bytes, %llu expected for an "
                              "object of %llu bytes", o->c->ops->scheme, o->bucket, o->key, (unsigned long long)i + 1,
                              (unsigned long long)o->lens[i], (unsigned long long)want,
                              (unsigned long long)len);
    }
    if (rc == 0 && n > o->nparts)
        rc = ckptio__fail(msg, CKPTIO_E_USAGE, "%s%s/%s: parts %u to %llu never arrived",
                          o->c->ops->scheme, o->bucket, o->key, o->nparts + 1, (unsigned long long)n);
    pthread_mutex_unlock(&o->lock);
    if (rc < 0) return rc;
    if (n == 0) { /* an upload needs at least one part: an empty object is a plain PUT */
        if (o->upload_id) ckptio__obj_mpu_abort(o->c, o->bucket, o->key, o->upload_id, NULL);
        rc = ckptio__obj_put(o->c, o->bucket, o->key, "", 0, NULL, NULL, msg);
    } else if (o->single) { /* written whole (n is 1: the lengths were checked) */
        rc = 0;
    } else {
        rc = ckptio__obj_mpu_complete(o->c, o->bucket, o->key, o->upload_id, o->etags,
                                     (unsigned)n, msg);
    }
    if (rc == 0) o->finished = true;
    return rc;
}

/* The descriptor is being closed: an unfinished upload is aborted (best effort), unless this
 * is a forked child's copy (the upload is the parent's). */
static void obj_close(void *obj, bool forked)
{
    obj_t *o = obj;
    if (o->write && !o->finished && o->upload_id && !forked)
        ckptio__obj_mpu_abort(o->c, o->bucket, o->key, o->upload_id, NULL);
    if (o->write && !o->finished && o->single && !forked)
        ckptio__obj_delete(o->c, o->bucket, o->key, NULL);
    obj_free(o);
}

static const char *obj_error(void *obj)
{
    return ((obj_t *)obj)->error; /* written once, under the lock, before the failure shows */
}

static const ckptio__vfd_ops obj_ops = {obj_io, obj_close, obj_error};
