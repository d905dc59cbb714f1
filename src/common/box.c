/* SPDX-License-Identifier: Apache-2.0 */
/* Box helpers that are not inline (see box.h): how shapes are printed. */
#include <stdio.h>

#include "box.h"

const char *ckptio__fmt_dims(char *buf, size_t cap, const uint64_t *d, uint32_t ndim,
                             const char *scalar)
{
    if (ndim == 0) {
        snprintf(buf, cap, "%s", scalar);
        return buf;
    }
    size_t used = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < ndim; i++) {
        int n = snprintf(buf + used, cap - used, i ? ",%llu" : "%llu", (unsigned long long)d[i]);
        if (n < 0 || (size_t)n >= cap - used) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), cap > 4 ? 4 : cap, "...");
            break;
        }
        used += (size_t)n;
    }
    return buf;
}
