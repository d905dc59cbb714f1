/* SPDX-License-Identifier: Apache-2.0 */
/* An object store's client, whichever the cloud: the operations the object store (obj_store.c)
 * and objects as the engine's files (obj_file.c) are built on. S3 (s3.c) and Google Cloud
 * Storage (gcs.c) each fill the table; nothing above asks which one it has. */
#ifndef CKPTIO_STORE_OBJC_H
#define CKPTIO_STORE_OBJC_H

#include "../common/common.h"
#include "http.h"

/* Addresses are "<scheme>bucket/key" ("s3://b/k", "gs://b/k"). */

typedef struct ckptio__objc ckptio__objc;
typedef ckptio__http_resp ckptio__obj_resp;

/* Called with each object of a listing (key order); nonzero stops it and is returned. */
typedef int (*ckptio__obj_list_cb)(void *ctx, const char *key, uint64_t size, int64_t mtime);
/* Called with each unfinished multipart upload: key, upload id, initiated (server clock). */
typedef int (*ckptio__obj_uploads_cb)(void *ctx, const char *key, const char *upload_id,
                                      int64_t initiated);

typedef struct ckptio__objc_ops {
    const char *scheme; /* "s3://" */
    const char *name;   /* "s3", "gcs": the store's name */
    uint64_t min_part;  /* ckptio's smallest part of an upload */
    unsigned max_parts; /* parts per upload at most */

    /* The client for settings o (NULL: the environment's), read now: one per distinct setting
     * and environment, made on first use and kept (its connections, its credentials) until
     * exit; safe from any thread. Credentials are looked for at the first request. */
    int (*client)(ckptio__objc **out, const ckptio_store_opts *o, ckptio__msg *msg);

    /* Write one object from memory. cond: NULL (unconditional), "*" (only if no object exists
     * at key), or a version (resp->etag of an earlier answer: only if the object is still
     * that one). A failed condition is CKPTIO_E_EXISTS. resp (may be NULL) gets the new
     * version in etag. */
    int (*put)(ckptio__objc *c, const char *bucket, const char *key, const void *buf,
               uint64_t len, const char *cond, ckptio__obj_resp *resp, ckptio__msg *msg);
    /* The whole object into a malloc'd buffer (*buf, *len); more than `max` bytes is
     * CKPTIO_E_LIMIT. resp (may be NULL) gets its version (etag) and mtime. */
    int (*get_all)(ckptio__objc *c, const char *bucket, const char *key, uint64_t max,
                   uint8_t **buf, uint64_t *len, ckptio__obj_resp *resp, ckptio__msg *msg);
    /* Bytes [off, off + len) into buf; *got = bytes received (< len only at the object's end;
     * 0 when off is at or past it). */
    int (*get_range)(ckptio__objc *c, const char *bucket, const char *key, uint64_t off,
                     uint64_t len, void *buf, uint64_t *got, ckptio__msg *msg);
    /* Size, version (etag) and mtime into resp. A missing object is CKPTIO_E_NOT_FOUND
     * (resp->date is set all the same: callers use it as "now" on the server's clock). */
    int (*head)(ckptio__objc *c, const char *bucket, const char *key, ckptio__obj_resp *resp,
                ckptio__msg *msg);
    /* Delete one object; a missing one is success. */
    int (*del)(ckptio__objc *c, const char *bucket, const char *key, ckptio__msg *msg);
    /* Every key starting with `prefix` (all pages), in key order. */
    int (*list)(ckptio__objc *c, const char *bucket, const char *prefix, ckptio__obj_list_cb cb,
                void *ctx, ckptio__msg *msg);
    /* Unfinished uploads under `prefix` (all pages). NULL: the store keeps an unfinished
     * upload's parts as objects under its key ("<key>.part-<id>-..."), which list finds. */
    int (*list_uploads)(ckptio__objc *c, const char *bucket, const char *prefix,
                        ckptio__obj_uploads_cb cb, void *ctx, ckptio__msg *msg);

    /* Uploads in parts, numbered from 1, sent in any order and in parallel; every part but the
     * last holds at least min_part bytes. part's `tag` (128 bytes) is what complete needs of
     * it; complete takes the tags in order and makes the object appear whole. abort removes
     * what the upload made (a missing upload is success). */
    int (*mpu_create)(ckptio__objc *c, const char *bucket, const char *key, char **upload_id,
                      ckptio__msg *msg);
    int (*mpu_part)(ckptio__objc *c, const char *bucket, const char *key, const char *upload_id,
                    unsigned part, const void *buf, uint64_t len, char tag[128],
                    ckptio__msg *msg);
    int (*mpu_complete)(ckptio__objc *c, const char *bucket, const char *key,
                        const char *upload_id, char (*tags)[128], unsigned n, ckptio__msg *msg);
    int (*mpu_abort)(ckptio__objc *c, const char *bucket, const char *key,
                     const char *upload_id, ckptio__msg *msg);
} ckptio__objc_ops;

/* Every client starts with this. */
struct ckptio__objc {
    const ckptio__objc_ops *ops;
    ckptio__http *http; /* its connections */
};

/* The clients (s3.c, gcs.c). */
CKPTIO__HIDDEN extern const ckptio__objc_ops ckptio__s3_objc;
CKPTIO__HIDDEN extern const ckptio__objc_ops ckptio__gcs_objc;

/* The client kind serving `url` by its scheme, or NULL. */
CKPTIO__HIDDEN const ckptio__objc_ops *ckptio__objc_for(const char *url);

/* Split "<scheme>bucket/key/parts" into malloc'd bucket and key ("key/parts": no leading or
 * trailing slash, never empty). A URL of another scheme, without a bucket or key, or with an
 * empty component, is CKPTIO_E_USAGE. */
CKPTIO__HIDDEN int ckptio__obj_parse(const ckptio__objc_ops *ops, const char *url, char **bucket,
                                     char **key, ckptio__msg *msg);

/* ---- the operations, through the client's table ---- */

/* The endpoint requests go to, for messages. */
static inline const char *ckptio__obj_endpoint(const ckptio__objc *c)
{
    return c ? c->http->endpoint : "";
}
/* Requests the client lets be in flight at once: what thread pools are sized to. */
static inline unsigned ckptio__obj_connections(const ckptio__objc *c)
{
    return c->http->conns;
}
static inline int ckptio__obj_put(ckptio__objc *c, const char *bucket, const char *key,
                                  const void *buf, uint64_t len, const char *cond,
                                  ckptio__obj_resp *resp, ckptio__msg *msg)
{
    return c->ops->put(c, bucket, key, buf, len, cond, resp, msg);
}
static inline int ckptio__obj_get_all(ckptio__objc *c, const char *bucket, const char *key,
                                      uint64_t max, uint8_t **buf, uint64_t *len,
                                      ckptio__obj_resp *resp, ckptio__msg *msg)
{
    return c->ops->get_all(c, bucket, key, max, buf, len, resp, msg);
}
static inline int ckptio__obj_get_range(ckptio__objc *c, const char *bucket, const char *key,
                                        uint64_t off, uint64_t len, void *buf, uint64_t *got,
                                        ckptio__msg *msg)
{
    return c->ops->get_range(c, bucket, key, off, len, buf, got, msg);
}
static inline int ckptio__obj_head(ckptio__objc *c, const char *bucket, const char *key,
                                   ckptio__obj_resp *resp, ckptio__msg *msg)
{
    return c->ops->head(c, bucket, key, resp, msg);
}
static inline int ckptio__obj_delete(ckptio__objc *c, const char *bucket, const char *key,
                                     ckptio__msg *msg)
{
    return c->ops->del(c, bucket, key, msg);
}
static inline int ckptio__obj_list(ckptio__objc *c, const char *bucket, const char *prefix,
                                   ckptio__obj_list_cb cb, void *ctx, ckptio__msg *msg)
{
    return c->ops->list(c, bucket, prefix, cb, ctx, msg);
}
/* No unfinished uploads where the store keeps none apart from objects. */
static inline int ckptio__obj_list_uploads(ckptio__objc *c, const char *bucket,
                                           const char *prefix, ckptio__obj_uploads_cb cb,
                                           void *ctx, ckptio__msg *msg)
{
    return c->ops->list_uploads ? c->ops->list_uploads(c, bucket, prefix, cb, ctx, msg) : 0;
}
static inline int ckptio__obj_mpu_create(ckptio__objc *c, const char *bucket, const char *key,
                                         char **upload_id, ckptio__msg *msg)
{
    return c->ops->mpu_create(c, bucket, key, upload_id, msg);
}
static inline int ckptio__obj_mpu_part(ckptio__objc *c, const char *bucket, const char *key,
                                       const char *upload_id, unsigned part, const void *buf,
                                       uint64_t len, char tag[128], ckptio__msg *msg)
{
    return c->ops->mpu_part(c, bucket, key, upload_id, part, buf, len, tag, msg);
}
static inline int ckptio__obj_mpu_complete(ckptio__objc *c, const char *bucket, const char *key,
                                           const char *upload_id, char (*tags)[128], unsigned n,
                                           ckptio__msg *msg)
{
    return c->ops->mpu_complete(c, bucket, key, upload_id, tags, n, msg);
}
static inline int ckptio__obj_mpu_abort(ckptio__objc *c, const char *bucket, const char *key,
                                        const char *upload_id, ckptio__msg *msg)
{
    return c->ops->mpu_abort(c, bucket, key, upload_id, msg);
}

/* ---- objects as the engine's files ----
 *
 * An object opened here gets a descriptor of io/vfd.h that engine requests carry in req->fd:
 * the psync backend hands them to this file instead of pread/pwrite, so the sink and the read
 * ring drive parallel part uploads and ranged GETs through the same code as files.
 *
 * Writing: a write request is one part: its offset must be a multiple of part_size and its
 * length part_size, except the last part, which may be shorter (the sink in object mode sends
 * exactly that). An object shorter than one part is written whole by its one request (a plain
 * PUT); else the first part makes a multipart upload, and parts upload in parallel, each
 * retried on its own. finish completes the upload (the object appears); ckptio__fd_close
 * without finish aborts it (and deletes an object written whole). Objects larger than part_size * max_parts are
 * refused (-EFBIG), so callers roll over to a new object before that.
 *
 * Reading: a read request is one ranged GET (short at the object's end, like pread). */
CKPTIO__HIDDEN int ckptio__obj_open_write(ckptio__objc *c, const char *bucket, const char *key,
                                          uint64_t part_size, int *fd, ckptio__msg *msg);
/* *size: in, the object's length where the caller knows it (no HEAD is sent), else
 * UINT64_MAX; out, its length. */
CKPTIO__HIDDEN int ckptio__obj_open_read(ckptio__objc *c, const char *bucket, const char *key,
                                         uint64_t *size, int *fd, ckptio__msg *msg);
/* After every write request on fd has completed: complete the upload of `len` bytes (the
 * parts must cover [0, len) exactly). */
CKPTIO__HIDDEN int ckptio__obj_finish(int fd, uint64_t len, ckptio__msg *msg);
/* Whether fd is an object descriptor from obj_file.c. */
CKPTIO__HIDDEN bool ckptio__obj_is(int fd);

#endif
