/* SPDX-License-Identifier: Apache-2.0 */
/* RFC 3986 encoding for the object stores' clients and credential flows: an object's name in a
 * URL path, a query string, an OAuth form (a form is a query string). */
#ifndef CKPTIO_STORE_URI_H
#define CKPTIO_STORE_URI_H

#include <stdbool.h>

#include "../common/common.h"

/* One header, query parameter or form field, unencoded. */
typedef struct ckptio__kv {
    const char *name;
    const char *value; /* NULL: "" */
} ckptio__kv;

/* RFC 3986 encoding of s (unreserved bytes kept, every other byte %XX), keeping '/' when
 * keep_slash; malloc'd (NULL: no memory). */
CKPTIO__HIDDEN char *ckptio__uri_encode(const char *s, bool keep_slash);
/* n pairs as a query string: each name and value encoded, the pairs sorted ("a=1&b="), as SigV4
 * canonicalizes them and any server accepts them; malloc'd (NULL: no memory). */
CKPTIO__HIDDEN char *ckptio__uri_query(const ckptio__kv *kv, unsigned n);

#endif
