/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU route: whether an extent moves by GPUDirect Storage or through the pinned ring. */
#include "staged.h"

int ckptio__gpu_route(ckptio__gpu *g, int fd, int direct, uint64_t off, uint64_t n, bool whole)
{
    /* O_DIRECT's rules, whatever cuFile's mode: an aligned start (and, for a read that lands
     * whole, an aligned end); below a MiB the pinned ring is as fast and keeps one path. */
    if (n < CKPTIO__GDS_MIN || off % 4096 || (whole && n % 4096)) return CKPTIO__ROUTE_STAGED;
    return ckptio__gpu_gds_file(g, fd, direct) ? CKPTIO__ROUTE_GDS : CKPTIO__ROUTE_STAGED;
}
