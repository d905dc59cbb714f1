/* SPDX-License-Identifier: Apache-2.0 */
/* Block checksums computed on a background thread, so hashing overlaps copying and I/O. */
#ifndef CKPTIO_HASHER_H
#define CKPTIO_HASHER_H

#include "common.h"

typedef struct ckptio__hasher ckptio__hasher;

/* Start the thread. `block` is the checksum block size. */
CKPTIO__HIDDEN int ckptio__hasher_start(ckptio__hasher **out, uint64_t block);
/* Queue the hash of src[0, n) in blocks into out[0, ceil(n / block)). src and out must stay
 * valid and unchanged until ckptio__hasher_wait() returns. Blocks while the queue is full. */
CKPTIO__HIDDEN int ckptio__hasher_push(ckptio__hasher *h, const void *src, uint64_t n,
                                       uint64_t *out);
/* Wait until every queued hash is done. */
CKPTIO__HIDDEN void ckptio__hasher_wait(ckptio__hasher *h);
/* Wait, stop the thread and free. Accepts NULL. */
CKPTIO__HIDDEN void ckptio__hasher_stop(ckptio__hasher *h);

#endif
