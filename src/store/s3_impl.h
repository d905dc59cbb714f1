/* SPDX-License-Identifier: Apache-2.0 */
/* Inside the S3 client: SigV4 signing, the XML scanner and the time parsers (s3*.c and tests). */
#ifndef CKPTIO_STORE_S3_IMPL_H
#define CKPTIO_STORE_S3_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "s3.h"
#include "uri.h" /* ckptio__kv: headers and query parameters */

/* ---- SigV4 (s3_sign.c) ---- */

/* What a signature covers. uri is the canonical URI, already encoded ("/bucket/a%20b"). query
 * (nq pairs, any order) is canonicalized here: RFC 3986-encoded and sorted. headers (nh pairs,
 * names lower case, any order) are all signed. amz_date is "YYYYMMDDTHHMMSSZ". */
typedef struct ckptio__s3_sig_in {
    const char *method, *uri;
    const ckptio__kv *query;
    unsigned nq;
    const ckptio__kv *headers;
    unsigned nh;
    const char *payload_hash; /* hex SHA256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *amz_date, *region, *access_key, *secret_key;
    const char *service; /* the scope's service: "sts"; NULL: "s3" */
} ckptio__s3_sig_in;

#define CKPTIO__S3_AUTH_MAX 1024
/* The Authorization header's value into auth (CKPTIO__S3_AUTH_MAX bytes); 0, or -ENOMEM /
 * CKPTIO_E_LIMIT when it does not fit. */
CKPTIO__HIDDEN int ckptio__s3_sign(const ckptio__s3_sig_in *in, char *auth);
/* The ETag S3 gives an object completed from n parts with these ETags: the MD5 of their MD5s,
 * "-n" ("\"<hex>-n\""). False when a part's ETag is not a quoted MD5. */
CKPTIO__HIDDEN bool ckptio__s3_mpu_etag(char (*etags)[128], unsigned n, char out[128]);
/* Lower-case hex SHA256 of a buffer into hex[65]. */
CKPTIO__HIDDEN void ckptio__s3_sha256_hex(const void *p, size_t len, char hex[65]);

/* ---- XML (s3_xml.c) ---- */

/* The next element <tag>...</tag> in [p, end): its raw text in [*vb, *ve); returns the
 * position after its closing tag, or NULL when there is none. <tag/> is an empty value. */
CKPTIO__HIDDEN const char *ckptio__xml_next(const char *p, const char *end, const char *tag,
                                            const char **vb, const char **ve);
/* Entity-decode [b, e) into out (cap bytes, NUL-terminated): &amp; &lt; &gt; &quot; &apos;
 * &#N; &#xH;. Returns the length, or -1 when it does not fit or an entity is malformed. */
CKPTIO__HIDDEN int ckptio__xml_text(const char *b, const char *e, char *out, size_t cap);

/* One page of ListObjectsV2: cb for each <Contents>; *truncated and the continuation token
 * (token, cap bytes; "" if none). 0, the callback's nonzero value, or CKPTIO_E_CORRUPT. */
CKPTIO__HIDDEN int ckptio__s3_parse_list(const char *xml, size_t len, ckptio__obj_list_cb cb,
                                         void *ctx, bool *truncated, char *token, size_t cap);
/* One page of ListMultipartUploads: cb for each <Upload>; the next key and upload-id markers. */
CKPTIO__HIDDEN int ckptio__s3_parse_uploads(const char *xml, size_t len,
                                            ckptio__obj_uploads_cb cb, void *ctx,
                                            bool *truncated, char *next_key, char *next_id,
                                            size_t cap);
/* The <Code> of an <Error> body into code (cap bytes); "" when there is none (or no body). */
CKPTIO__HIDDEN void ckptio__s3_parse_error(const char *xml, size_t len, char *code, size_t cap);

#endif
