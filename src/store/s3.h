/* SPDX-License-Identifier: Apache-2.0 */
/* Object storage: S3-compatible stores over libcurl, and objects as the engine's "files". */
#ifndef CKPTIO_STORE_S3_H
#define CKPTIO_STORE_S3_H

#include "../common/common.h"
#include "../io/engine.h"

/* Addresses are "s3://bucket/key". A client is made from the store's settings
 * (ckptio_store_opts), else what the AWS SDKs read (aws_creds.h): credentials from their chain,
 * the region (AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1), the endpoint
 * (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL: a custom endpoint, addressed path-style unless
 * addressing_style says virtual: <endpoint>/<bucket>/<key>; without one,
 * https://<bucket>.s3.<region>.amazonaws.com/<key>, or path-style on
 * https://s3.<region>.amazonaws.com for a bucket name with dots), the CAs to trust
 * (AWS_CA_BUNDLE, else the system's). Requests are signed with
 * SigV4 (payload UNSIGNED-PAYLOAD: the data is proven by ckptio's own block checksums; the
 * small XML body of CompleteMultipartUpload is signed with its SHA256).
 *
 * Every request has a deadline. A failure that may pass — no connection, a reset, a stall
 * (no byte moving for CKPTIO_S3_STALL seconds, default 20), HTTP 500/502/503/504, 429,
 * SlowDown, RequestTimeout, InternalError — is retried with exponential backoff and full
 * jitter (0.1 s doubling, at most 5 s apart), and so is 409 ConditionalRequestConflict, until
 * CKPTIO_S3_TIMEOUT seconds (default 120) have passed since the first try; then it fails with
 * -ETIMEDOUT (the store kept answering with errors) or the last connection error. While the
 * client has had no answer from the store at all, the deadline is CKPTIO_S3_FIRST_TIMEOUT
 * (default 10 s) instead: a wrong endpoint or a store that is down fails in seconds. A single
 * try never outlives that deadline either; connecting has 5 s. Credentials the store calls
 * expired (ExpiredToken) are asked of their source again and the request is sent again. A
 * certificate that does not verify fails at once (-EACCES). Anything else fails at once. Failures name the bucket and key and say what to do:
 *   403 (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied) -> -EACCES,
 *   NoSuchBucket -> -ENOENT ("bucket 'b' does not exist: create it or fix the URL"),
 *   404 on an object -> CKPTIO_E_NOT_FOUND (the callers turn it into their own message),
 *   412 on a conditional write -> CKPTIO_E_EXISTS (no retry), unreachable endpoint ->
 *   -ECONNREFUSED/-EHOSTUNREACH/-ETIMEDOUT naming the endpoint.
 *
 * Thread safety: a client is shared by every thread of a writer or reader; each call takes a
 * connection (a CURL easy handle, kept alive between calls) from the client's cache and gives
 * it back; one that saw a network error is closed instead. At most CKPTIO_S3_CONNECTIONS
 * requests (default 16) are in flight at once in a process: a call beyond that waits for a
 * connection. All functions are blocking. */

typedef struct ckptio__s3 ckptio__s3;

/* Whether `path` starts with "s3://". */
CKPTIO__HIDDEN bool ckptio__s3_is_url(const char *path);

/* Split "s3://bucket/key/parts" into malloc'd bucket and key ("key/parts": no leading or
 * trailing slash, never empty). A URL without a bucket or key, or with an empty component,
 * is CKPTIO_E_USAGE. */
CKPTIO__HIDDEN int ckptio__s3_parse(const char *url, char **bucket, char **key, ckptio__msg *msg);

/* The client for settings o (NULL: the environment's), read now: one per distinct setting and
 * environment, made on first use and kept (its connections, its credentials) until exit; safe
 * from any thread. Credentials are looked for at the first request (missing ones fail it with
 * CKPTIO_E_USAGE naming the sources tried). libcurl's global init happens here, once. */
CKPTIO__HIDDEN int ckptio__s3_client(ckptio__s3 **out, const ckptio_store_opts *o,
                                     ckptio__msg *msg);

/* The endpoint requests go to ("http://127.0.0.1:8333", "https://s3.us-east-1.amazonaws.com"),
 * for messages and stats. */
CKPTIO__HIDDEN const char *ckptio__s3_endpoint(const ckptio__s3 *c);
/* Requests the client lets be in flight at once (CKPTIO_S3_CONNECTIONS, default 16): what a
 * writer's or reader's thread pool is sized to. */
CKPTIO__HIDDEN unsigned ckptio__s3_connections(const ckptio__s3 *c);

/* What one request learned. */
typedef struct ckptio__s3_resp {
    long status;     /* HTTP status of the last try; 0 when no response came */
    char etag[128];  /* ETag header, quotes kept ("\"9b2c...\""), or "" */
    uint64_t size;   /* HEAD / whole GET: the object's length; ranged GET: bytes received */
    int64_t mtime;   /* Last-Modified, seconds since the epoch (server clock), or 0 */
    int64_t date;    /* Date header: the server's clock when it answered, or 0 */
    char code[64];   /* S3 error code from the XML body ("NoSuchKey", "SlowDown"...), or "" */
} ckptio__s3_resp;

/* PUT one object from memory. cond: NULL (unconditional), "*" (If-None-Match: *: only if no
 * object exists at key), or an ETag (If-Match: only if the object's ETag is this one). A
 * failed condition is CKPTIO_E_EXISTS. resp (may be NULL) gets the new ETag. */
CKPTIO__HIDDEN int ckptio__s3_put(ckptio__s3 *c, const char *bucket, const char *key,
                                  const void *buf, uint64_t len, const char *cond,
                                  ckptio__s3_resp *resp, ckptio__msg *msg);

/* GET the whole object into a malloc'd buffer (*buf, *len); more than `max` bytes is
 * CKPTIO_E_LIMIT. resp (may be NULL) gets its ETag and mtime. */
CKPTIO__HIDDEN int ckptio__s3_get_all(ckptio__s3 *c, const char *bucket, const char *key,
                                      uint64_t max, uint8_t **buf, uint64_t *len,
                                      ckptio__s3_resp *resp, ckptio__msg *msg);

/* GET bytes [off, off + len) into buf; *got = bytes received (< len only at the object's
 * end; 0 when off is at or past it). */
CKPTIO__HIDDEN int ckptio__s3_get_range(ckptio__s3 *c, const char *bucket, const char *key,
                                        uint64_t off, uint64_t len, void *buf, uint64_t *got,
                                        ckptio__msg *msg);

/* HEAD: size, ETag, mtime into resp. A missing object is CKPTIO_E_NOT_FOUND (resp->date is
 * set all the same: callers use it as "now" on the server's clock). */
CKPTIO__HIDDEN int ckptio__s3_head(ckptio__s3 *c, const char *bucket, const char *key,
                                   ckptio__s3_resp *resp, ckptio__msg *msg);

/* DELETE one object; a missing one is success. */
CKPTIO__HIDDEN int ckptio__s3_delete(ckptio__s3 *c, const char *bucket, const char *key,
                                     ckptio__msg *msg);

/* ListObjectsV2 of every key starting with `prefix` (all pages), in key order. The callback
 * returns 0 to go on, anything else stops the listing and is returned. */
typedef int (*ckptio__s3_list_cb)(void *ctx, const char *key, uint64_t size, int64_t mtime);
CKPTIO__HIDDEN int ckptio__s3_list(ckptio__s3 *c, const char *bucket, const char *prefix,
                                   ckptio__s3_list_cb cb, void *ctx, ckptio__msg *msg);

/* ListMultipartUploads under `prefix` (all pages): key, upload id, initiated (server clock). */
typedef int (*ckptio__s3_uploads_cb)(void *ctx, const char *key, const char *upload_id,
                                     int64_t initiated);
CKPTIO__HIDDEN int ckptio__s3_list_uploads(ckptio__s3 *c, const char *bucket, const char *prefix,
                                           ckptio__s3_uploads_cb cb, void *ctx,
                                           ckptio__msg *msg);

/* Multipart uploads. Parts are numbered from 1; every part but the last must be at least
 * 5 MiB (S3's rule). complete takes the parts' ETags in order. */
CKPTIO__HIDDEN int ckptio__s3_mpu_create(ckptio__s3 *c, const char *bucket, const char *key,
                                         char **upload_id, ckptio__msg *msg);
CKPTIO__HIDDEN int ckptio__s3_mpu_part(ckptio__s3 *c, const char *bucket, const char *key,
                                       const char *upload_id, unsigned part, const void *buf,
                                       uint64_t len, char etag[128], ckptio__msg *msg);
CKPTIO__HIDDEN int ckptio__s3_mpu_complete(ckptio__s3 *c, const char *bucket, const char *key,
                                           const char *upload_id, char (*etags)[128],
                                           unsigned n, ckptio__msg *msg);
CKPTIO__HIDDEN int ckptio__s3_mpu_abort(ckptio__s3 *c, const char *bucket, const char *key,
                                        const char *upload_id, ckptio__msg *msg);

/* ---- objects as the engine's files ----
 *
 * An object opened here gets a descriptor of io/vfd.h that engine requests carry in req->fd:
 * the psync backend hands them to this file instead of pread/pwrite, so the sink and the read
 * ring drive parallel part uploads and ranged GETs through the same code as files.
 *
 * Writing: the object is a multipart upload created at open. A write request is one part:
 * its offset must be a multiple of part_size and its length part_size, except the last part,
 * which may be shorter (the sink in object mode sends exactly that). Parts upload in
 * parallel, each retried on its own. finish completes the upload (the object appears);
 * ckptio__fd_close without finish aborts it. Objects larger than part_size * 10000 are refused
 * (-EFBIG), so callers roll over to a new object before that.
 *
 * Reading: open HEADs the object for its size; a read request is one ranged GET (short at
 * the object's end, like pread). */
#define CKPTIO__S3_MAX_PARTS 10000u
#define CKPTIO__S3_MIN_PART (8ull << 20) /* ckptio's floor: S3 allows 5 MiB */

CKPTIO__HIDDEN int ckptio__obj_open_write(ckptio__s3 *c, const char *bucket, const char *key,
                                          uint64_t part_size, int *fd, ckptio__msg *msg);
/* *size: in, the object's length where the caller knows it (no HEAD is sent), else
 * UINT64_MAX; out, its length. */
CKPTIO__HIDDEN int ckptio__obj_open_read(ckptio__s3 *c, const char *bucket, const char *key,
                                         uint64_t *size, int *fd, ckptio__msg *msg);
/* After every write request on fd has completed: complete the multipart upload of `len`
 * bytes (the parts must cover [0, len) exactly). */
CKPTIO__HIDDEN int ckptio__obj_finish(int fd, uint64_t len, ckptio__msg *msg);
/* Whether fd is an object descriptor from this file. */
CKPTIO__HIDDEN bool ckptio__obj_is(int fd);

#endif
