/* SPDX-License-Identifier: Apache-2.0 */
/* The table of stores, the one URL parser, and the catalog's public calls over any store. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"

/* Every kind of store, POSIX (no scheme) first. A new store is one entry here. */
static const ckptio__store_ops *const stores[] = {&ckptio__store_posix, &ckptio__store_s3,
                                                  &ckptio__store_gcs};
#define N_STORES (sizeof stores / sizeof *stores)

/* The length of path's "<scheme>://" (letters, digits, '+', '-', '.' after a letter), or 0. */
static size_t scheme_len(const char *path)
{
    size_t i = 0;
    if (!((path[0] >= 'a' && path[0] <= 'z') || (path[0] >= 'A' && path[0] <= 'Z'))) return 0;
    while ((path[i] >= 'a' && path[i] <= 'z') || (path[i] >= 'A' && path[i] <= 'Z') ||
           (path[i] >= '0' && path[i] <= '9') || path[i] == '+' || path[i] == '-' ||
           path[i] == '.')
        i++;
    return strncmp(path + i, "://", 3) ? 0 : i + 3;
}

int ckptio__store_for(const char *path, const ckptio__store_ops **out, ckptio__msg *msg)
{
    *out = NULL;
    if (!path || !*path) return ckptio__fail(msg, CKPTIO_E_USAGE, "no path or URL given");
    size_t n = scheme_len(path);
    for (size_t i = 0; i < N_STORES; i++) {
        const char *s = stores[i]->scheme;
        if (n ? s && strlen(s) == n && !strncmp(path, s, n) : !s) {
            *out = stores[i];
            return 0;
        }
    }
    char known[128] = "";
    for (size_t i = 0, at = 0; i < N_STORES && at < sizeof known; i++)
        if (stores[i]->scheme)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", at ? ", " : "",
                                   stores[i]->scheme);
    return ckptio__fail(msg, CKPTIO_E_USAGE,
                        "'%s': no store serves '%.*s' URLs (ckptio serves local paths and %s)",
                        path, (int)n, path, known);
}

int ckptio__store_remote(const char *path, ckptio__msg *msg)
{
    const ckptio__store_ops *s;
    CKPTIO__TRY(ckptio__store_for(path, &s, msg));
    return !(s->caps & CKPTIO__STORE_LOCAL);
}

int ckptio__place_open(ckptio__place *p, const char *path, const ckptio_store_opts *o,
                       ckptio__msg *msg)
{
    *p = (ckptio__place){0};
    CKPTIO__TRY(ckptio__store_for(path, &p->store, msg));
    if (!p->store->place_open)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "internal error: '%s' is on a local file system, read as files", path);
    return p->store->place_open(p, path, o, msg);
}

void ckptio__place_close(ckptio__place *p)
{
    if (p->store && p->store->place_close) p->store->place_close(p);
    free(p->path);
    *p = (ckptio__place){0};
}

/* ---- the public catalog ---- */

const char *ckptio_store_name(const char *path)
{
    const ckptio__store_ops *s;
    ckptio__msg msg = {0};
    int rc = ckptio__store_for(path, &s, &msg);
    if (rc < 0) {
        ckptio__refail(NULL, &msg, rc, "ckptio_store_name", NULL);
        return NULL;
    }
    return s->name;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ckptio_list_checkpoints(const char *prefix, ckptio_list_cb cb, void *ctx)
{
    return ckptio_list_checkpoints_with(prefix, NULL, cb, ctx);
}

int ckptio_list_checkpoints_with(const char *prefix, const ckptio_store_opts *o,
                                 ckptio_list_cb cb, void *ctx)
{
    if (!prefix || !*prefix || !cb)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_list_checkpoints: prefix and cb are required");
    ckptio__msg msg = {0};
    ckptio__names ns = {0};
    const ckptio__store_ops *s;
    int rc = ckptio__store_for(prefix, &s, &msg);
    if (rc == 0) rc = s->list(prefix, o, &ns, &msg);
    if (rc == 0 && ns.n) qsort(ns.v, ns.n, sizeof *ns.v, cmp_str);
    for (size_t i = 0; rc == 0 && i < ns.n; i++) rc = cb(ctx, ns.v[i]);
    ckptio__names_free(&ns);
    if (rc < 0 && msg.text[0]) return ckptio__refail(NULL, &msg, rc, "cannot list checkpoints", NULL);
    return rc;
}

/* A catalog call on the store of `path`: `op` picks is_checkpoint, remove or sweep (one
 * signature); `api` names the public function, `what` what failed. */
enum { CATALOG_IS, CATALOG_REMOVE, CATALOG_SWEEP };
static int catalog(const char *path, const ckptio_store_opts *o, int op, const char *api,
                   const char *what)
{
    if (!path || !*path) return ckptio__fail(NULL, CKPTIO_E_USAGE, "%s: a path is required", api);
    ckptio__msg msg = {0};
    const ckptio__store_ops *s;
    int rc = ckptio__store_for(path, &s, &msg);
    if (rc == 0)
        rc = (op == CATALOG_IS ? s->is_checkpoint : op == CATALOG_REMOVE ? s->remove : s->sweep)(
            path, o, &msg);
    return rc < 0 ? ckptio__refail(NULL, &msg, rc, what, NULL) : rc;
}

int ckptio_sweep_with(const char *prefix, const ckptio_store_opts *o)
{
    return catalog(prefix, o, CATALOG_SWEEP, "ckptio_sweep", "cannot sweep");
}

int ckptio_is_checkpoint_with(const char *path, const ckptio_store_opts *o)
{
    return catalog(path, o, CATALOG_IS, "ckptio_is_checkpoint", "cannot look for a checkpoint");
}

int ckptio_remove_checkpoint_with(const char *path, const ckptio_store_opts *o)
{
    int rc = catalog(path, o, CATALOG_REMOVE, "ckptio_remove_checkpoint",
                     "cannot remove checkpoint");
    return rc < 0 ? rc : 0;
}

int ckptio_sweep(const char *prefix)
{
    return ckptio_sweep_with(prefix, NULL);
}

int ckptio_is_checkpoint(const char *path)
{
    return ckptio_is_checkpoint_with(path, NULL);
}

int ckptio_remove_checkpoint(const char *path)
{
    return ckptio_remove_checkpoint_with(path, NULL);
}
