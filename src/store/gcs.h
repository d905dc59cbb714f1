/* SPDX-License-Identifier: Apache-2.0 */
/* The Google Cloud Storage client: gs://bucket/key over GCS's JSON API, with libcurl. */
#ifndef CKPTIO_STORE_GCS_H
#define CKPTIO_STORE_GCS_H

#include "../common/common.h"
#include "objc.h"

/* A client is made from the store's settings (ckptio_store_opts), else what Google's client
 * libraries read (gcp_creds.h): an OAuth2 token from Application Default Credentials; the
 * endpoint endpoint_url, else STORAGE_EMULATOR_HOST (an emulator: "host:port" or a URL; no
 * credentials sent unless the settings give some), else https://storage.googleapis.com; the
 * CAs to trust (ca_bundle, else the system's). Limits as S3's (s3.h), named CKPTIO_GCS_TIMEOUT,
 * CKPTIO_GCS_STALL, CKPTIO_GCS_FIRST_TIMEOUT and CKPTIO_GCS_CONNECTIONS.
 *
 * How objc.h's operations map onto the JSON API:
 *  - put: a media upload (uploadType=media); a conditional one is a multipart upload
 *    (metadata and bytes in one request) with ifGenerationMatch: 0 for "*" (no live object),
 *    else the generation the caller read. An object's version (objc.h's etag) is its
 *    generation.
 *  - get_all, get_range: alt=media downloads (X-Goog-Generation is the version); head: the
 *    object's metadata.
 *  - Uploads in parts: GCS has no multipart upload that takes parts in parallel through its
 *    JSON API, so each part is an object of its own, "<key>.part-<upload>-<n>", and complete
 *    composes them (at most 32 sources per compose: a tree of composes above that, each
 *    source held to the generation its upload made), then deletes them. An upload that never
 *    completes leaves part objects under the save's own prefix, where a save's abort and the
 *    sweep of later saves find them (list_uploads is NULL).
 *  - Errors: 401 asks the credentials' source for a new token and sends again; 403 -EACCES;
 *    404 CKPTIO_E_NOT_FOUND (-ENOENT naming the bucket on uploads and listings); 412
 *    CKPTIO_E_EXISTS; 408, 429 and 5xx are retried. */

CKPTIO__HIDDEN int ckptio__gcs_client(ckptio__objc **out, const ckptio_store_opts *o,
                                      ckptio__msg *msg);

#define CKPTIO__GCS_MAX_PARTS 10000u
#define CKPTIO__GCS_MIN_PART (8ull << 20)
#define CKPTIO__GCS_COMPOSE_MAX 32u /* sources per compose: GCS's limit */

/* One page of objects.list (JSON): cb for each of "items" (name, size, updated), and the
 * page's nextPageToken into token (cap bytes; "" on the last page). 0, the callback's nonzero
 * value, or CKPTIO_E_CORRUPT. */
CKPTIO__HIDDEN int ckptio__gcs_parse_list(const char *json, size_t len, ckptio__obj_list_cb cb,
                                          void *ctx, char *token, size_t cap);

#endif
