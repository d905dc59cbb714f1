/* SPDX-License-Identifier: Apache-2.0 */
/* RFC 3986 encoding: names in URL paths, query strings and forms. */
#include "uri.h"

#include <stdlib.h>
#include <string.h>

static bool unreserved(unsigned char c, bool keep_slash)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
}

char *ckptio__uri_encode(const char *s, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += unreserved(*p, keep_slash) ? 1 : 3;
    char *out = malloc(n), *o = out;
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (unreserved(*p, keep_slash)) {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = 0;
    return out;
}

typedef struct enc_pair {
    char *name, *value;
} enc_pair;

static int cmp_pair(const void *a, const void *b)
{
    const enc_pair *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

char *ckptio__uri_query(const ckptio__kv *kv, unsigned n)
{
    /* The encoded pairs, sorted by their encoded forms. */
    enc_pair *e = calloc(n ? n : 1, sizeof *e);
    char *out = NULL;
    if (!e) return NULL;
    size_t len = 1;
    bool ok = true;
    for (unsigned i = 0; i < n; i++) {
        e[i].name = ckptio__uri_encode(kv[i].name, false);
        e[i].value = ckptio__uri_encode(kv[i].value ? kv[i].value : "", false);
        if (!e[i].name || !e[i].value) ok = false;
        else len += strlen(e[i].name) + strlen(e[i].value) + 2;
    }
    if (ok && (out = malloc(len))) {
        qsort(e, n, sizeof *e, cmp_pair);
        char *o = out;
        for (unsigned i = 0; i < n; i++) {
            if (i) *o++ = '&';
            size_t a = strlen(e[i].name), b = strlen(e[i].value);
            memcpy(o, e[i].name, a), o += a;
            *o++ = '=';
            memcpy(o, e[i].value, b), o += b;
        }
        *o = 0;
    }
    for (unsigned i = 0; i < n; i++) {
        free(e[i].name);
        free(e[i].value);
    }
    free(e);
    return out;
}
