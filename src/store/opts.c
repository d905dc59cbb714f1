/* SPDX-License-Identifier: Apache-2.0 */
/* Settings of a store, given per call (ckptio_store_opts): named values, checked when set. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "store.h"

/* Every setting a store reads, with the stores that read it. A name not here is refused when
 * set, so a typo fails at once rather than falling back to the environment unseen. */
static const char *const known[] = {
    "access_key_id",    /* s3: with secret_access_key, static credentials (no chain) */
    "addressing_style", /* s3: auto (path-style for a custom endpoint), path, virtual */
    "ca_bundle",        /* s3, gs: a PEM file of the CAs to trust (else the system's) */
    "credentials_file", /* gs: a Google credentials file (else GOOGLE_APPLICATION_CREDENTIALS) */
    "endpoint_url",     /* s3, gs: http[s]://host[:port] of an S3- or GCS-compatible store */
    "prefix_spread",    /* s3, gs: a save's data under 16 (1) or 256 (2) prefixes (obj_store.c) */
    "profile",          /* s3: the profile of the shared config files (env credentials skipped) */
    "project",          /* gs: the Google Cloud project (else GOOGLE_CLOUD_PROJECT) */
    "region",           /* s3: the bucket's region */
    "secret_access_key",
    "session_token",
    "sts_endpoint_url", /* s3: where role credentials are asked for (else the STS of region) */
    "token",            /* gs: a static OAuth2 access token (no chain) */
};
#define N_KNOWN (sizeof known / sizeof *known)

struct ckptio_store_opts {
    size_t n;
    char **keys, **values; /* sorted by key */
};

int ckptio_store_opts_new(ckptio_store_opts **out)
{
    if (!out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_store_opts_new: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : ckptio__fail(NULL, -ENOMEM, "out of memory");
}

void ckptio_store_opts_free(ckptio_store_opts *o)
{
    if (!o) return;
    for (size_t i = 0; i < o->n; i++) {
        free(o->keys[i]);
        if (o->values[i]) OPENSSL_cleanse(o->values[i], strlen(o->values[i])); /* may be a secret */
        free(o->values[i]);
    }
    free(o->keys);
    free(o->values);
    free(o);
}

static int check(const char *key, const char *value)
{
    if (!strcmp(key, "addressing_style") && strcmp(value, "auto") && strcmp(value, "path") &&
        strcmp(value, "virtual"))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "store setting addressing_style is '%s': use auto, path or virtual",
                            value);
    if (!strcmp(key, "prefix_spread") && ckptio__spread_digits(value) < 0)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "store setting prefix_spread is '%s': use 0 (off), 1 (16 prefixes) "
                            "or 2 (256 prefixes)",
                            value);
    for (const char *p = value; *p; p++)
        if ((unsigned char)*p < 0x20)
            return ckptio__fail(NULL, CKPTIO_E_USAGE,
                                "store setting %s holds a control character", key);
    return 0;
}

int ckptio_store_opts_set(ckptio_store_opts *o, const char *key, const char *value)
{
    if (!o || !key) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_store_opts_set: o and key are required");
    size_t k = 0;
    while (k < N_KNOWN && strcmp(known[k], key)) k++;
    if (k == N_KNOWN) {
        char names[512];
        size_t at = 0;
        for (size_t i = 0; i < N_KNOWN && at < sizeof names; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", known[i]);
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "no store setting is named '%s' (there are %s)",
                            key, names);
    }
    if (value) CKPTIO__TRY(check(key, value));
    size_t i = 0;
    while (i < o->n && strcmp(o->keys[i], key) < 0) i++;
    bool have = i < o->n && !strcmp(o->keys[i], key);
    char *v = NULL;
    if (value && !(v = strdup(value))) return ckptio__fail(NULL, -ENOMEM, "out of memory");
    if (have) {
        OPENSSL_cleanse(o->values[i], strlen(o->values[i]));
        free(o->values[i]);
        if (v) {
            o->values[i] = v;
            return 0;
        }
        free(o->keys[i]); /* value NULL: the setting goes, the environment serves again */
        memmove(o->keys + i, o->keys + i + 1, (o->n - i - 1) * sizeof *o->keys);
        memmove(o->values + i, o->values + i + 1, (o->n - i - 1) * sizeof *o->values);
        o->n--;
        return 0;
    }
    if (!v) return 0;
    char **ks = realloc(o->keys, (o->n + 1) * sizeof *ks);
    if (ks) o->keys = ks;
    char **vs = ks ? realloc(o->values, (o->n + 1) * sizeof *vs) : NULL;
    if (vs) o->values = vs;
    char *kd = vs ? strdup(key) : NULL;
    if (!kd) {
        free(v);
        return ckptio__fail(NULL, -ENOMEM, "out of memory");
    }
    memmove(o->keys + i + 1, o->keys + i, (o->n - i) * sizeof *o->keys);
    memmove(o->values + i + 1, o->values + i, (o->n - i) * sizeof *o->values);
    o->keys[i] = kd;
    o->values[i] = v;
    o->n++;
    return 0;
}

int ckptio__spread_digits(const char *v)
{
    return !v || !*v || !strcmp(v, "0") ? 0 : !strcmp(v, "1") ? 1 : !strcmp(v, "2") ? 2 : -1;
}

const char *ckptio__opt(const ckptio_store_opts *o, const char *key)
{
    for (size_t i = 0; o && i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return o->values[i];
    return NULL;
}

size_t ckptio__opts_count(const ckptio_store_opts *o)
{
    return o ? o->n : 0;
}

int ckptio__opts_at(const ckptio_store_opts *o, size_t i, const char **key, const char **value)
{
    if (!o || i >= o->n) return CKPTIO_E_NOT_FOUND;
    *key = o->keys[i];
    *value = o->values[i];
    return 0;
}
