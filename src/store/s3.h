/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 client: S3-compatible stores (AWS, SeaweedFS, MinIO...) over libcurl. */
#ifndef CKPTIO_STORE_S3_H
#define CKPTIO_STORE_S3_H

#include "../common/common.h"
#include "objc.h"

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

/* The S3 client's table (objc.h) is ckptio__s3_objc; its `client`: */
CKPTIO__HIDDEN int ckptio__s3_client(ckptio__objc **out, const ckptio_store_opts *o,
                                     ckptio__msg *msg);

/* Parts: S3 allows 5 MiB..5 GiB each, 10,000 per upload. */
#define CKPTIO__S3_MAX_PARTS 10000u
#define CKPTIO__S3_MIN_PART (8ull << 20) /* ckptio's floor: S3 allows 5 MiB */

#endif
