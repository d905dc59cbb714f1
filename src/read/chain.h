/* SPDX-License-Identifier: Apache-2.0 */
/* Reads of the boxes of a delta checkpoint's base, through the public read. */
#ifndef CKPTIO_CHAIN_H
#define CKPTIO_CHAIN_H

#include "../common/common.h"

/* Raw bytes [a, b) (row-major over the box's own shape, whole elements of esize bytes) of the
 * box `box` (offset[ndim] then shape[ndim], in tensor coordinates) of tensor `name`, read from
 * the checkpoint open in r into dst, through the public reader (its checks, its own base).
 * 1, or a negative code with *msg naming the tensor and r's checkpoint. */
CKPTIO__HIDDEN int ckptio__base_read(ckptio_reader *r, const char *name, uint32_t ndim,
                                     uint64_t esize, const uint64_t *box, uint64_t a, uint64_t b,
                                     uint8_t *dst, ckptio__msg *msg);

#endif
