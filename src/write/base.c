/* SPDX-License-Identifier: Apache-2.0 */
/* A writer's base (incremental checkpoints): the older checkpoint, read through the public reader. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../read/chain.h"
#include "../read/open.h"
#include "writer.h"

/* The path of directory `to` relative to directory `from`, both absolute and resolved. */
static char *relative(const char *from, const char *to)
{
    size_t common = 0, i = 0;
    /* The longest common prefix ending on a component boundary. */
    for (; from[i] && from[i] == to[i]; i++)
        if (from[i] == '/') common = i;
    if (!from[i] && (to[i] == '/' || !to[i])) common = i;
    else if (!to[i] && from[i] == '/') common = i;
    size_t ups = 0;
    for (const char *p = from + common; *p; p++)
        if (*p == '/') ups++;
    const char *rest = to + common + (to[common] == '/');
    size_t len = ups * 3 + strlen(rest) + 2;
    char *out = malloc(len);
    if (!out) return NULL;
    out[0] = 0;
    for (size_t k = 0; k < ups; k++) strcat(out, k + 1 < ups || *rest ? "../" : "..");
    strcat(out, rest);
    if (!out[0]) strcpy(out, ".");
    return out;
}

int ckptio__writer_open_base(ckptio_writer *w)
{
    const char *given = w->cfg.base;
    char *base = realpath(given, NULL), *dir = NULL, *ckpt = NULL;
    int rc = 0;
    if (!base)
        return ckptio__fail(&w->msg, -errno,
                            "the base checkpoint '%s' cannot be found (%s): give an existing "
                            "checkpoint as base, or save without one",
                            given, strerror(errno));
    /* Where this checkpoint will be: its parent resolved, and its own name. */
    char *p1 = strdup(w->txn.path), *p2 = strdup(w->txn.path);
    CKPTIO__GOTO_IF(!p1 || !p2, -ENOMEM);
    dir = realpath(dirname(p1), NULL);
    CKPTIO__GOTO_IF(!dir, ckptio__fail(&w->msg, -errno, "cannot resolve the directory of '%s'",
                                       w->txn.path));
    CKPTIO__GOTO_IF(asprintf(&ckpt, "%s/%s", dir, basename(p2)) < 0, (ckpt = NULL, -ENOMEM));
    CKPTIO__GOTO_IF(!strcmp(ckpt, base),
                    ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                                 "checkpoint '%s' cannot be its own base: save to a new path",
                                 w->txn.path));
    uint64_t before = 0, after = 0;
    CKPTIO__CHECK(ckptio__manifest_file_sum(base, &before, &w->msg));
    ckptio_params p;
    ckptio_params_init(&p);
    rc = ckptio_reader_open(&w->base_reader, base, &p);
    CKPTIO__GOTO_IF(rc < 0, ckptio__fail(&w->msg, rc, "cannot open the base checkpoint '%s': %s",
                                         given, ckptio_last_error()));
    CKPTIO__CHECK(ckptio__manifest_file_sum(base, &after, &w->msg));
    CKPTIO__GOTO_IF(before != after,
                    ckptio__fail(&w->msg, CKPTIO_E_STATE,
                                 "the base checkpoint '%s' changed while it was opened; save "
                                 "again once it is complete",
                                 given));
    w->base_sum = after;
    w->base = relative(ckpt, base);
    CKPTIO__GOTO_IF(!w->base, -ENOMEM);
out:
    free(p1);
    free(p2);
    free(dir);
    free(ckpt);
    free(base);
    if (rc == -ENOMEM) ckptio__fail(&w->msg, rc, "out of memory opening the base '%s'", given);
    return rc;
}

int ckptio__writer_base_bytes(ckptio_writer *w, uint64_t chunk, uint64_t a, uint64_t b,
                              uint8_t *dst)
{
    const ckptio__mchunk *c = CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, chunk);
    const wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, c->tensor);
    ckptio_reader *r = w->base_reader;
    int64_t i = ckptio_reader_find(r, t->name);
    if (i < 0) return 0; /* not in the base: stored on its own */
    ckptio_tensor_info ti = {.size = sizeof ti};
    CKPTIO__TRY(ckptio_reader_tensor(r, (size_t)i, &ti));
    const uint64_t *shape = CKPTIO__VEC_AT(&w->dims, uint64_t, t->dims);
    if (ti.dtype != (int)t->dtype || ti.ndim != t->ndim ||
        (t->ndim && memcmp(ti.shape, shape, t->ndim * sizeof *shape)))
        return 0; /* another tensor by now */
    return ckptio__base_read(r, t->name, t->ndim, ckptio_dtype_size((int)t->dtype),
                             CKPTIO__VEC_AT(&w->dims, uint64_t, c->dims), a, b, dst, &w->msg);
}
