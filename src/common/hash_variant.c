/* SPDX-License-Identifier: Apache-2.0 */
/* One XXH3 variant: compiled twice, with -mavx2 and with -mavx512f, naming itself by NAME. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"

CKPTIO__HIDDEN uint64_t CKPTIO_HASH_NAME(const void *p, size_t len);

uint64_t CKPTIO_HASH_NAME(const void *p, size_t len)
{
    return XXH3_64bits(p, len);
}
