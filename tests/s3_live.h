/* SPDX-License-Identifier: Apache-2.0 */
/* The live stores the object store test groups share: CKPTIO_TEST_S3_ENDPOINT and
 * CKPTIO_TEST_GCS_ENDPOINT, their buckets, fresh prefixes. */
#ifndef CKPTIO_TEST_S3_LIVE_H
#define CKPTIO_TEST_S3_LIVE_H

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../src/store/gcs.h"
#include "../src/store/s3.h"
#include "test.h"

/* ---- against a live store: CKPTIO_TEST_S3_ENDPOINT (and CKPTIO_TEST_S3_BUCKET, default "ckpt";
 * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, default ak / sk) ---- */

static inline const char *bucket(void)
{
    const char *b = getenv("CKPTIO_TEST_S3_BUCKET");
    return b && *b ? b : "ckpt";
}

/* The client for the live store, or T_SKIP without one; keys go under a fresh prefix. */
static inline int live_env(void)
{
    const char *ep = getenv("CKPTIO_TEST_S3_ENDPOINT");
    if (!ep || !*ep) {
        printf("CKPTIO_TEST_S3_ENDPOINT is not set: no live store to test against\n");
        return T_SKIP;
    }
    setenv("AWS_ENDPOINT_URL", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", "ak", 0);
    setenv("AWS_SECRET_ACCESS_KEY", "sk", 0);
    return 0;
}

static inline int live(ckptio__objc **c, char *prefix, size_t cap)
{
    if (live_env()) return T_SKIP;
    snprintf(prefix, cap, "ckptio-test/%d-%lld", (int)getpid(), (long long)time(NULL));
    return ckptio__s3_client(c, NULL, NULL);
}

/* A live test's start: the client c, a fresh prefix p, the bucket b; or skip. */
#define LIVE(c, p, b)                                                                          \
    ckptio__objc *c;                                                                             \
    char p[256];                                                                               \
    int live_rc = live(&c, p, sizeof p);                                                       \
    if (live_rc == T_SKIP) return T_SKIP;                                                      \
    CHECK_OK(live_rc);                                                                         \
    const char *b = bucket()

/* ---- against a live GCS (JSON API) store: CKPTIO_TEST_GCS_ENDPOINT, an emulator reached
 * without credentials (STORAGE_EMULATOR_HOST), and CKPTIO_TEST_GCS_BUCKET, default "ckpt" ---- */

static inline const char *gcs_bucket(void)
{
    const char *b = getenv("CKPTIO_TEST_GCS_BUCKET");
    return b && *b ? b : "ckpt";
}

static inline int gcs_live_env(void)
{
    const char *ep = getenv("CKPTIO_TEST_GCS_ENDPOINT");
    if (!ep || !*ep) {
        printf("CKPTIO_TEST_GCS_ENDPOINT is not set: no live GCS store to test against\n");
        return T_SKIP;
    }
    setenv("STORAGE_EMULATOR_HOST", ep, 1);
    unsetenv("GOOGLE_APPLICATION_CREDENTIALS");
    return 0;
}

/* A live GCS test's start: the client c, a fresh prefix p, the bucket b; or skip. */
#define GCS_LIVE(c, p, b)                                                                      \
    ckptio__objc *c;                                                                           \
    char p[256];                                                                               \
    if (gcs_live_env()) return T_SKIP;                                                         \
    snprintf(p, sizeof p, "ckptio-test/%d-%lld", (int)getpid(), (long long)time(NULL));        \
    CHECK_OK(ckptio__gcs_client(&c, NULL, NULL));                                              \
    const char *b = gcs_bucket()

/* "prefix/name" in a rotating buffer. */
static inline const char *k(const char *prefix, const char *name)
{
    static char bufs[4][512];
    static unsigned i;
    char *b = bufs[i++ % 4];
    snprintf(b, 512, "%s/%s", prefix, name);
    return b;
}

#endif
