/* SPDX-License-Identifier: Apache-2.0 */
/* The parts of a credential provider that do not depend on the cloud: cache keys, the list of
 * sources tried, one credential refreshed ahead of its expiry by one loader at a time. */
#include "creds.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#define REFRESH_MAX_S 300 /* refresh this long before expiry, at most */

char *ckptio__fields_key(char *const *v, int n)
{
    size_t len = 1;
    for (int i = 0; i < n; i++)
        if (v[i]) len += strlen(v[i]) + 8;
    char *k = malloc(len), *at = k;
    if (!k) return NULL;
    for (int i = 0; i < n; i++)
        if (v[i]) at += snprintf(at, len - (size_t)(at - k), "%d=%s\n", i, v[i]);
    *at = 0;
    return k;
}

void ckptio__fields_wipe_key(char *key)
{
    if (key) OPENSSL_cleanse(key, strlen(key));
    free(key);
}

void ckptio__fields_free(char **v, int n)
{
    for (int i = 0; i < n; i++) {
        if (v[i]) OPENSSL_cleanse(v[i], strlen(v[i]));
        free(v[i]);
        v[i] = NULL;
    }
}

void ckptio__tried_add(ckptio__tried *t, const char *fmt, ...)
{
    size_t at = strlen(t->text);
    if (at >= sizeof t->text - 1) return;
    if (at) at += (size_t)snprintf(t->text + at, sizeof t->text - at, "; ");
    if (at >= sizeof t->text - 1) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->text + at, sizeof t->text - at, fmt, ap);
    va_end(ap);
}

int ckptio__tried_fail(const ckptio__tried *t, ckptio__msg *msg, int rc)
{
    if (!t->text[0]) return rc;
    char why[sizeof msg->text];
    snprintf(why, sizeof why, "%s", msg->text);
    return ckptio__fail(msg, rc, "%s (sources tried before it: %s)", why, t->text);
}

void ckptio__cred_cache_init(ckptio__cred_cache *c, void *owner,
                             int (*load)(void *, void **, int64_t *, ckptio__msg *),
                             void (*hold)(void *), void (*put)(void *))
{
    *c = (ckptio__cred_cache){.load = load, .hold = hold, .put = put, .owner = owner};
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->loaded, NULL);
}

/* Whether cur serves until now + margin (fresh) or at least one more second (valid). */
static bool serves(const ckptio__cred_cache *c, int64_t now, int64_t margin)
{
    return c->cur && (!c->expires || now < c->expires - margin);
}

int ckptio__cred_cache_get(ckptio__cred_cache *c, void **out, ckptio__msg *msg)
{
    pthread_mutex_lock(&c->lock);
    for (;;) {
        int64_t now = (int64_t)time(NULL);
        /* Being refreshed by another thread: a still-valid one serves meanwhile. */
        if (serves(c, now, c->margin) || (c->loading && serves(c, now, 1))) {
            c->hold(c->cur);
            *out = c->cur;
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
        if (!c->loading) break;
        pthread_cond_wait(&c->loaded, &c->lock);
    }
    c->loading = true;
    pthread_mutex_unlock(&c->lock);
    void *fresh = NULL;
    int64_t expires = 0;
    ckptio__msg m = {0};
    int rc = c->load(c->owner, &fresh, &expires, &m);
    pthread_mutex_lock(&c->lock);
    c->loading = false;
    pthread_cond_broadcast(&c->loaded);
    int64_t now = (int64_t)time(NULL);
    if (rc == 0) {
        if (c->cur) c->put(c->cur);
        c->cur = fresh;
        c->expires = expires;
        c->margin = CKPTIO__MIN((int64_t)REFRESH_MAX_S, (expires ? expires - now : 0) / 4);
        if (c->margin < 1) c->margin = 1;
    }
    if (rc < 0 && serves(c, now, 1))
        rc = 0; /* a refresh ahead of time failed: the old one serves */
    if (rc == 0) {
        c->hold(c->cur);
        *out = c->cur;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc < 0 && msg) *msg = m;
    return rc;
}

void ckptio__cred_cache_drop(ckptio__cred_cache *c, const void *cred)
{
    pthread_mutex_lock(&c->lock);
    if (cred && c->cur == cred) {
        c->put(c->cur);
        c->cur = NULL;
    }
    pthread_mutex_unlock(&c->lock);
}

void ckptio__cred_cache_after_fork(ckptio__cred_cache *c)
{
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->loaded, NULL);
    c->loading = false;
}

void ckptio__cred_cache_free(ckptio__cred_cache *c)
{
    if (c->cur) c->put(c->cur);
    c->cur = NULL;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->loaded);
}
