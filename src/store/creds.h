/* SPDX-License-Identifier: Apache-2.0 */
/* What every cloud credential provider (aws_creds.c, gcp_creds.c) shares: its fields as a
 * cache key, the list of sources its chain tried, and the credential it caches and refreshes
 * before it expires. */
#ifndef CKPTIO_STORE_CREDS_H
#define CKPTIO_STORE_CREDS_H

#include <pthread.h>
#include <stdint.h>

#include "../common/common.h"

/* ---- a provider's fields (n malloc'd strings or NULL) ---- */

/* The fields as one malloc'd string ("<i>=<value>\n"...), a client cache's key; NULL: no
 * memory. It holds secrets: wipe it before freeing (ckptio__fields_wipe_key). */
CKPTIO__HIDDEN char *ckptio__fields_key(char *const *v, int n);
CKPTIO__HIDDEN void ckptio__fields_wipe_key(char *key);
/* Wipe and free each field, leaving NULLs. */
CKPTIO__HIDDEN void ckptio__fields_free(char **v, int n);

/* ---- the sources a chain tried, for the message that says none answered ---- */

typedef struct ckptio__tried {
    char text[1536]; /* "environment (AWS_ACCESS_KEY_ID is not set); ..." */
} ckptio__tried;

/* Append one source and why it did not answer (cut when the list is full). */
CKPTIO__HIDDEN void ckptio__tried_add(ckptio__tried *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A source that failed after others did not answer: msg (its failure) gains the list; rc. */
CKPTIO__HIDDEN int ckptio__tried_fail(const ckptio__tried *t, ckptio__msg *msg, int rc);

/* ---- one credential, cached and refreshed ----
 *
 * The credential is the provider's own type, shared by reference (a request holds one while it
 * uses it); the cache holds one reference to the current one. */
typedef struct ckptio__cred_cache {
    /* Ask the provider's source: 0 with a new credential (one reference, for the cache) and its
     * expiry in seconds since the epoch (0: it does not expire), or < 0 with msg set. Called
     * without the lock, by one thread at a time. */
    int (*load)(void *owner, void **out, int64_t *expires, ckptio__msg *msg);
    void (*hold)(void *cred); /* one reference more (atomically) */
    void (*put)(void *cred);  /* one reference less */
    void *owner;
    pthread_mutex_t lock;
    pthread_cond_t loaded;
    bool loading;
    void *cur;       /* or NULL */
    int64_t expires; /* cur's */
    int64_t margin;  /* refresh cur this long before it expires */
} ckptio__cred_cache;

CKPTIO__HIDDEN void ckptio__cred_cache_init(ckptio__cred_cache *c, void *owner,
                                            int (*load)(void *, void **, int64_t *, ckptio__msg *),
                                            void (*hold)(void *), void (*put)(void *));
/* The current credential (a reference, for the caller to put): loaded on the first call, and
 * again once it is about to expire (a quarter of its life, at most 5 minutes, before) by one
 * caller while the others go on with the still-valid one. A load that fails while the old one
 * is still valid keeps it; else it fails with the load's message. Thread-safe. */
CKPTIO__HIDDEN int ckptio__cred_cache_get(ckptio__cred_cache *c, void **out, ckptio__msg *msg);
/* The store refused cred: when it is still the current one, the next get loads anew. */
CKPTIO__HIDDEN void ckptio__cred_cache_drop(ckptio__cred_cache *c, const void *cred);
/* In a forked child: the lock as new (another thread of the parent may have held it). */
CKPTIO__HIDDEN void ckptio__cred_cache_after_fork(ckptio__cred_cache *c);
CKPTIO__HIDDEN void ckptio__cred_cache_free(ckptio__cred_cache *c);

#endif
