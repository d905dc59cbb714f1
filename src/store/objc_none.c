/* SPDX-License-Identifier: Apache-2.0 */
/* The object clients of a build without libcurl (tests/gpu/cc-build.sh on a machine that lacks
 * it; meson always has it): s3.c, gcs.c and their HTTP and credentials are left out, and these
 * tables take their place. The URLs stay object stores' URLs (a local directory named "s3:" is
 * never made), and every use of one fails at its client with what to do. */
#include "objc.h"

static int no_client(const char *scheme, ckptio__msg *msg)
{
    return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                        "%s URLs: this build of ckptio has no object storage (it was built without "
                        "libcurl); use a build with libcurl (meson requires it)",
                        scheme);
}

static int s3_none(ckptio__objc **out, const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)o;
    *out = NULL;
    return no_client("s3://", msg);
}

static int gcs_none(ckptio__objc **out, const ckptio_store_opts *o, ckptio__msg *msg)
{
    (void)o;
    *out = NULL;
    return no_client("gs://", msg);
}

const ckptio__objc_ops ckptio__s3_objc = {.scheme = "s3://", .name = "s3", .client = s3_none};
const ckptio__objc_ops ckptio__gcs_objc = {.scheme = "gs://", .name = "gcs", .client = gcs_none};
