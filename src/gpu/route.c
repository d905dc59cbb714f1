/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU route, parsed and decided here only: the mode asked for, then GDS or ring per extent. */
#include <stdlib.h>
#include <string.h>

#include "staged.h"

int ckptio__gpu_mode(int param, ckptio__msg *m)
{
    const char *env = getenv("CKPTIO_GPU");
    if (env && *env) {
        if (!strcmp(env, "auto")) return CKPTIO_GPU_AUTO;
        if (!strcmp(env, "gds")) return CKPTIO_GPU_GDS;
        if (!strcmp(env, "staged")) return CKPTIO_GPU_STAGED;
        if (!strcmp(env, "off")) return CKPTIO_GPU_OFF;
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "CKPTIO_GPU='%.32s' is not valid: use auto, gds, staged or off", env);
    }
    if (param < CKPTIO_GPU_AUTO || param > CKPTIO_GPU_OFF)
        return ckptio__fail(m, CKPTIO_E_USAGE,
                            "params.gpu is %d: use CKPTIO_GPU_AUTO, _GDS, _STAGED or _OFF", param);
    return param;
}

int ckptio__gpu_route(ckptio__gpu *g, int fd, int direct, uint64_t off, uint64_t n, bool whole)
{
    /* O_DIRECT's rules, whatever cuFile's mode: an aligned start (and, for a read that lands
     * whole, an aligned end); below a MiB the pinned ring is as fast and keeps one path. */
    if (n < CKPTIO__GDS_MIN || off % 4096 || (whole && n % 4096)) return CKPTIO__ROUTE_STAGED;
    return ckptio__gpu_gds_file(g, fd, direct) ? CKPTIO__ROUTE_GDS : CKPTIO__ROUTE_STAGED;
}
