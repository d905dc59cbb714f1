/* SPDX-License-Identifier: Apache-2.0 */
/* What the credential providers (aws_creds.c, gcp_creds.c) ask with: one small HTTP request
 * over libcurl with a bounded answer, a small file's text, a path under the home directory. */
#ifndef CKPTIO_STORE_HTTP_SIMPLE_H
#define CKPTIO_STORE_HTTP_SIMPLE_H

#include <stddef.h>

#include "../common/common.h"

#define CKPTIO__HTTP_ANSWER_MAX (1u << 20) /* an answer's body, at most */
#define CKPTIO__TEXT_MAX        (1u << 20) /* what ckptio__read_text reads of a file, at most */

/* One request. Nothing in it is copied: it lives for the call. */
typedef struct ckptio__http_req {
    const char *method;         /* "GET"; "POST" with `body`; "PUT" with an empty body */
    const char *url;            /* http:// or https:// (no other protocol is followed) */
    const char *const *headers; /* NULL-terminated "Name: value" lines, or NULL */
    const char *body;           /* a POST's body: a form, unless a Content-Type header says
                                 * otherwise (libcurl's default) */
    const char *ca_bundle;      /* a PEM file of the CAs to trust for https; NULL: the system's */
    long timeout_ms;            /* the whole request */
    long connect_ms;            /* 0: the lesser of timeout_ms and 5 s */
    const char *want_header;    /* an answer header whose value to keep ("Metadata-Flavor"), or
                                 * NULL */
} ckptio__http_req;

typedef struct ckptio__http_answer {
    long status;
    char *body;       /* malloc'd, NUL-terminated; the caller frees it (wiping a secret first) */
    char header[128]; /* want_header's value, trimmed ("" when absent or too long) */
} ckptio__http_answer;

/* Send rq and wait for its answer: 0 and *ans (of any HTTP status) when one came; else < 0
 * (-ECONNREFUSED, -ETIMEDOUT, -ENOMEM, -EIO) with why in err (cap bytes) and nothing to free.
 * An answer longer than CKPTIO__HTTP_ANSWER_MAX is an error. Thread-safe; no signals. */
CKPTIO__HIDDEN int ckptio__http_simple(const ckptio__http_req *rq, ckptio__http_answer *ans,
                                       char *err, size_t cap);

/* The text of the file at path (at most CKPTIO__TEXT_MAX bytes, NUL-terminated, malloc'd) in
 * *out: 1 when it was read; 0 when there is no such file or path is NULL (*out is then "");
 * < 0 with an error naming the file when it cannot be read. */
CKPTIO__HIDDEN int ckptio__read_text(const char *path, char **out, ckptio__msg *msg);

/* "$HOME/<rel>" (malloc'd), or NULL when HOME is not set (or no memory). */
CKPTIO__HIDDEN char *ckptio__home_path(const char *rel);

#endif
