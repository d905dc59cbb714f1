/* SPDX-License-Identifier: Apache-2.0 */
/* The store interface: one table of operations per kind of store, found by the one URL parser. */
#ifndef CKPTIO_STORE_STORE_H
#define CKPTIO_STORE_STORE_H

#include <stddef.h>

#include "../common/common.h"

/* Where checkpoints live. A path without a scheme is a directory of a local file system
 * (POSIX); "<scheme>://..." is served by the store of that scheme ("s3://bucket/key"). An
 * unknown scheme is an error, never a relative directory named "gs:". Everything above this
 * room asks a store through its table and never which kind it has: a new kind of store is one
 * file and one entry in store.c's table, and passes tests/test_store.c. */

/* Malloc'd names, grown by ckptio__names_add. */
typedef struct ckptio__names {
    char **v;
    size_t n, cap;
} ckptio__names;

CKPTIO__HIDDEN int ckptio__names_add(ckptio__names *ns, const char *s, size_t len);
CKPTIO__HIDDEN void ckptio__names_free(ckptio__names *ns);

typedef struct ckptio__store_ops {
    const char *name;   /* "posix", "s3": what ckptio_store_name() answers */
    const char *scheme; /* "s3://": the addresses it serves; NULL: paths without a scheme */

    /* ---- the catalog ---- */
    /* Add to *out the names of the committed checkpoints directly under `prefix` (entries
     * that hold a manifest), in any order; a prefix that does not exist holds none. */
    int (*list)(const char *prefix, ckptio__names *out, ckptio__msg *msg);
    /* 1 when `path` holds a committed checkpoint (its manifest), 0 when not. */
    int (*is_checkpoint)(const char *path, ckptio__msg *msg);
    /* Remove the checkpoint at `path` whole (CKPTIO_E_NOT_CHECKPOINT when it has no manifest):
     * it leaves every listing at once and durably (a crash never brings back part of it),
     * then its data goes; what a crash leaves, sweep removes. */
    int (*remove)(const char *path, ckptio__msg *msg);
} ckptio__store_ops;

/* The store serving `path` (its scheme, else POSIX): CKPTIO_E_USAGE naming the schemes there
 * are, for a "<scheme>://" no store serves. */
CKPTIO__HIDDEN int ckptio__store_for(const char *path, const ckptio__store_ops **out,
                                     ckptio__msg *msg);

/* The stores (store.c's table entries). */
CKPTIO__HIDDEN extern const ckptio__store_ops ckptio__store_posix;
CKPTIO__HIDDEN extern const ckptio__store_ops ckptio__store_s3;

/* ---- the POSIX store's helpers that other rooms share (posix.c) ---- */

/* Remove a directory tree without following symlinks (openat/unlinkat); best effort, returns
 * the first error. */
CKPTIO__HIDDEN int ckptio__remove_tree(const char *path);

#endif
