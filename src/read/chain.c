/* SPDX-License-Identifier: Apache-2.0 */
/* The public open, whose reader reads the boxes of a delta checkpoint's base through the
 * public read (the top of the read room: it calls down into every other file of it). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "chain.h"
#include "reader.h"

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

int ckptio_reader_open(ckptio_reader **out, const char *path, const ckptio_params *p)
{
    int rc = ckptio__read_open(out, path, p);
    if (rc == 0) (*out)->base_read = ckptio__base_read;
    return rc;
}
