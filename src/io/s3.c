/* SPDX-License-Identifier: Apache-2.0 */
/* Object storage over libcurl (being built: every call refuses for now). */
#include "s3.h"

bool ckptio__s3_is_url(const char *path)
{
    (void)path;
    return false;
}

int ckptio__s3_parse(const char *url, char **bucket, char **key, ckptio__msg *msg)
{
    (void)url;
    (void)bucket;
    (void)key;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_client(ckptio__s3 **out, ckptio__msg *msg)
{
    (void)out;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

const char *ckptio__s3_endpoint(const ckptio__s3 *c)
{
    (void)c;
    return "";
}

int ckptio__s3_put(ckptio__s3 *c, const char *bucket, const char *key, const void *buf, uint64_t len, const char *cond, ckptio__s3_resp *resp, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)buf;
    (void)len;
    (void)cond;
    (void)resp;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_get_all(ckptio__s3 *c, const char *bucket, const char *key, uint64_t max, uint8_t **buf, uint64_t *len, ckptio__s3_resp *resp, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)max;
    (void)buf;
    (void)len;
    (void)resp;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_get_range(ckptio__s3 *c, const char *bucket, const char *key, uint64_t off, uint64_t len, void *buf, uint64_t *got, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)off;
    (void)len;
    (void)buf;
    (void)got;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_head(ckptio__s3 *c, const char *bucket, const char *key, ckptio__s3_resp *resp, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)resp;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_delete(ckptio__s3 *c, const char *bucket, const char *key, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_list(ckptio__s3 *c, const char *bucket, const char *prefix, ckptio__s3_list_cb cb, void *ctx, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)prefix;
    (void)cb;
    (void)ctx;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_list_uploads(ckptio__s3 *c, const char *bucket, const char *prefix, ckptio__s3_uploads_cb cb, void *ctx, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)prefix;
    (void)cb;
    (void)ctx;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_mpu_create(ckptio__s3 *c, const char *bucket, const char *key, char **upload_id, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)upload_id;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_mpu_part(ckptio__s3 *c, const char *bucket, const char *key, const char *upload_id, unsigned part, const void *buf, uint64_t len, char etag[128], ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)upload_id;
    (void)part;
    (void)buf;
    (void)len;
    (void)etag;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_mpu_complete(ckptio__s3 *c, const char *bucket, const char *key, const char *upload_id, char (*etags)[128], unsigned n, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)upload_id;
    (void)etags;
    (void)n;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__s3_mpu_abort(ckptio__s3 *c, const char *bucket, const char *key, const char *upload_id, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)upload_id;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__obj_open_write(ckptio__s3 *c, const char *bucket, const char *key, uint64_t part_size, int *fd, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)part_size;
    (void)fd;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__obj_open_read(ckptio__s3 *c, const char *bucket, const char *key, uint64_t *size, int *fd, ckptio__msg *msg)
{
    (void)c;
    (void)bucket;
    (void)key;
    (void)size;
    (void)fd;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

int ckptio__obj_finish(int fd, uint64_t len, ckptio__msg *msg)
{
    (void)fd;
    (void)len;
    (void)msg;
    return CKPTIO_E_UNSUPPORTED;
}

void ckptio__obj_close(int fd)
{
    (void)fd;
}

bool ckptio__obj_is(int fd)
{
    (void)fd;
    return false;
}

void ckptio__obj_io(ckptio__req *r)
{
    (void)r;
}

const char *ckptio__obj_error(int fd)
{
    (void)fd;
    return "";
}
