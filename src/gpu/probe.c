/* SPDX-License-Identifier: Apache-2.0 */
/* Which path GPU buffers take here, and why: ckptio_gpu_route for the bindings, and the probe. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "staged.h"

/* cuFile on a scratch file in dir: what a data file there would get. */
static bool gds_dir(const char *dir, char *why, size_t len)
{
    const char *w = "cuFile cannot be used";
    const ckptio__cufile *cf = ckptio__cufile_get(&w);
    if (!cf) {
        snprintf(why, len, "%s", w);
        return false;
    }
    int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, len, "cannot make an O_DIRECT scratch file in '%s' to test cuFile: %s", dir,
                 strerror(errno));
        return false;
    }
    ckptio__CUfileDescr d;
    memset(&d, 0, sizeof d);
    d.type = CKPTIO__CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    ckptio__CUfileHandle fh = NULL;
    ckptio__CUfileError e = cf->HandleRegister(&fh, &d);
    if (e.err == 0) cf->HandleDeregister(fh);
    close(fd);
    if (e.err) {
        snprintf(why, len,
                 "cuFile is open but refuses files in '%s' (cuFileHandleRegister error %d): "
                 "its file system does not support GDS",
                 dir, e.err);
        return false;
    }
    snprintf(why, len, "cuFile driver open and '%s' accepted by cuFileHandleRegister", dir);
    return true;
}

static const char *const mode_names[] = {"auto", "gds", "staged", "off"};

int ckptio_gpu_route(const char *dir, const ckptio_params *p, char *why, size_t len)
{
    char scratch[8];
    if (!why || !len) why = scratch, len = sizeof scratch;
    why[0] = 0;
    int param = CKPTIO_GPU_AUTO;
    if (p && p->size >= offsetof(ckptio_params, gpu) + sizeof p->gpu) param = p->gpu;
    ckptio__msg m;
    ckptio__msg_clear(&m);
    int mode = ckptio__gpu_mode(param, &m);
    if (mode < 0) {
        snprintf(why, len, "%s", m.text);
        return mode;
    }
    /* Who asked, in the words the caller used: the variable wins over the parameter. */
    const char *env = getenv("CKPTIO_GPU");
    const char *asked = env && *env ? "CKPTIO_GPU=" : "gpu=";
    if (mode == CKPTIO_GPU_OFF) {
        snprintf(why, len, "%soff", asked);
        return CKPTIO_GPU_OFF;
    }
    const char *w = "the CUDA driver cannot be used";
    if (!ckptio__cuda_get(&w)) {
        if (mode == CKPTIO_GPU_AUTO) {
            snprintf(why, len, "%s", w);
            return CKPTIO_GPU_OFF;
        }
        /* A path asked for by name that cannot run is an error, not a silent host copy. */
        snprintf(why, len,
                 "%s%s asks for ckptio's GPU path but %s; unset CKPTIO_GPU (or ask for auto) to "
                 "copy GPU buffers to host memory instead",
                 asked, mode_names[mode], w);
        return CKPTIO_E_UNSUPPORTED;
    }
    if (mode == CKPTIO_GPU_STAGED) {
        snprintf(why, len, "CUDA driver loaded; staged path asked for (%sstaged)", asked);
        return CKPTIO_GPU_STAGED;
    }
    char g[512];
    if (gds_dir(dir && *dir ? dir : ".", g, sizeof g)) {
        snprintf(why, len, "CUDA driver loaded; %s", g);
        return CKPTIO_GPU_GDS;
    }
    snprintf(why, len, "CUDA driver loaded; no GDS (%s), so the staged path", g);
    return CKPTIO_GPU_STAGED;
}

int ckptio_gpu_probe(const char *dir, const ckptio_params *p, char *why, size_t len)
{
    /* The route, where a path asked for by name that cannot run is "refused" (OFF). */
    int rc = ckptio_gpu_route(dir, p, why, len);
    return rc == CKPTIO_E_UNSUPPORTED ? CKPTIO_GPU_OFF : rc;
}
