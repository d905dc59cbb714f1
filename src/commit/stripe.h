/* SPDX-License-Identifier: Apache-2.0 */
/* Stripe directories: the share of a striped checkpoint that lies in another storage root. */
#ifndef CKPTIO_COMMIT_STRIPE_H
#define CKPTIO_COMMIT_STRIPE_H

#include <stdbool.h>

#include "../common/common.h"

/* A checkpoint saved with roots keeps its manifest (and one share of its data) in its own
 * directory and the other shares in `<root>/<name>.<id>.ckptio-stripe/`, one per root
 * (doc/format.md section 10). A stripe directory holds `owner` (the checkpoint's absolute
 * path: which save may collect it) and `data/`. Its writer holds flock(LOCK_EX) on it from
 * creation to close, so a collector never takes a stripe that a live save is writing; a stripe
 * is kept only once the manifest naming it is published, and is removed otherwise.
 *
 * Layering: uses src/io (vfs, fsync) and src/common; knows nothing of manifests (the caller
 * says which stripes its published checkpoint names). */

#define CKPTIO__STRIPE_SUFFIX ".ckptio-stripe"
#define CKPTIO__STRIPE_OWNER "owner"

typedef struct ckptio__stripe {
    char *root;  /* the root, made absolute */
    char *name;  /* <name>.<16 hex digits>.ckptio-stripe */
    char *path;  /* root/name */
    int fd;      /* the stripe directory, locked; -1 when none */
    bool keep;   /* published: fini leaves it */
} ckptio__stripe;

/* Create a stripe directory for the checkpoint `owner` (an absolute path) in `root`, with its
 * `owner` file and `data/`; lock it. On failure msg names the root and the stripe. */
CKPTIO__HIDDEN int ckptio__stripe_create(ckptio__stripe *s, const char *root, const char *owner,
                                         ckptio__msg *msg);
/* fsync the stripe's data/, the stripe directory and the root (its entry). */
CKPTIO__HIDDEN int ckptio__stripe_sync(ckptio__stripe *s, ckptio__msg *msg);
/* Remove the stripe unless kept, unlock, free. Accepts a zeroed stripe. */
CKPTIO__HIDDEN void ckptio__stripe_fini(ckptio__stripe *s);

/* Told the name of an unlocked stripe of `owner`, after its lock is taken: true when the
 * checkpoint now published at `owner` names it (it is kept). */
typedef bool (*ckptio__stripe_named)(void *ctx, const char *name);
/* Remove (or with `dry`, only count) every stripe directory in `root` whose owner file says
 * `owner`, that no one holds locked and that `named` disowns. *found counts them; -errno only
 * when root cannot be listed. */
CKPTIO__HIDDEN int ckptio__stripe_collect(const char *root, const char *owner,
                                          ckptio__stripe_named named, void *ctx, bool dry,
                                          unsigned *found);

#endif
