/* SPDX-License-Identifier: Apache-2.0 */
/* What a delta checkpoint and its base share: the base's identity and reads of its boxes. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "chain.h"

int ckptio__manifest_file_sum(const char *dir, uint64_t *sum, ckptio__msg *msg)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return ckptio__fail(msg, -errno, "base checkpoint '%s' has no readable manifest: %s", dir,
                            strerror(errno));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            uint8_t *b = realloc(buf, cap);
            if (!b) {
                rc = -ENOMEM;
                break;
            }
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = ckptio__fail(msg, -EIO, "reading '%s' failed", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) *sum = ckptio__hash(buf, len);
    free(buf);
    return rc;
}

int ckptio__base_read(ckptio_reader *r, const char *name, uint32_t ndim, uint64_t esize,
                      const uint64_t *box, uint64_t a, uint64_t b, uint8_t *dst, ckptio__msg *msg)
{
    const uint64_t *boff = box, *bshape = box + ndim;
    uint64_t off[CKPTIO__RANGE_BOXES_MAX * CKPTIO_MAX_NDIM];
    uint64_t shp[CKPTIO__RANGE_BOXES_MAX * CKPTIO_MAX_NDIM];
    size_t n = ckptio__range_boxes(bshape, ndim, a / esize, b / esize, off, shp);
    ckptio_region regs[CKPTIO__RANGE_BOXES_MAX];
    uint8_t *at = dst;
    for (size_t k = 0; k < n; k++) {
        uint64_t *o = off + k * ndim, *s = shp + k * ndim, bytes = esize;
        for (uint32_t d = 0; d < ndim; d++) {
            o[d] += boff[d]; /* chunk coordinates into the tensor's */
            bytes *= s[d];
        }
        regs[k] = (ckptio_region){.size = sizeof regs[k], .name = name, .offset = o, .shape = s,
                                  .dst = at, .capacity = bytes};
        at += bytes;
    }
    int rc = ckptio_reader_read(r, regs, n);
    if (rc < 0)
        return ckptio__fail(msg, rc, "reading tensor '%s' of the base checkpoint '%s' failed: %s",
                            name, ckptio_reader_path(r), ckptio_reader_errmsg(r));
    return 1;
}
