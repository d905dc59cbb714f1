/* SPDX-License-Identifier: Apache-2.0 */
/* The commit transaction over the store interface: begin or join, publish or abort, fini. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "txn.h"

static int bad(ckptio__msg *msg)
{
    return ckptio__fail(msg, CKPTIO_E_USAGE, "internal error: bad commit transaction");
}

static int start(ckptio__txn *t, const char *path, int kind, unsigned flags, ckptio__msg *msg)
{
    memset(t, 0, sizeof *t);
    t->tmp_fd = t->fd = -1;
    t->pid = (int)getpid();
    t->kind = kind;
    t->flags = flags;
    if (!path || !*path || (kind != CKPTIO__TXN_DIR && kind != CKPTIO__TXN_FILE)) return bad(msg);
    return ckptio__store_for(path, &t->store, msg);
}

int ckptio__txn_begin(ckptio__txn *t, const char *path, int kind, unsigned flags, int direct,
                      const ckptio_store_opts *o, ckptio__msg *msg)
{
    CKPTIO__TRY(start(t, path, kind, flags, msg));
    return t->store->begin(t, path, kind, flags, direct, o, msg);
}

int ckptio__txn_join(ckptio__txn *t, const char *path, const char *tmp_path, unsigned flags,
                     const ckptio_store_opts *o, ckptio__msg *msg)
{
    CKPTIO__TRY(start(t, path, CKPTIO__TXN_DIR, flags, msg));
    if (!tmp_path) return bad(msg);
    return t->store->join(t, path, tmp_path, flags, o, msg);
}

int ckptio__txn_publish(ckptio__txn *t, const uint8_t *man, uint64_t len, ckptio__msg *msg)
{
    if (!t->store || !t->owner || t->published)
        return ckptio__fail(msg, CKPTIO_E_STATE,
                            "internal error: '%s' cannot be published by this transaction",
                            t->path ? t->path : "?");
    if (ckptio__forked(t->pid))
        return ckptio__fail(msg, CKPTIO_E_STATE,
                            "the save of '%s' belongs to the process that began it (pid %d), "
                            "which forked this one: it commits there",
                            t->path, t->pid);
    return t->store->publish(t, man, len, msg);
}

void ckptio__txn_abort(ckptio__txn *t)
{
    if (t->store && !ckptio__forked(t->pid)) t->store->abort(t);
}

void ckptio__txn_fini(ckptio__txn *t)
{
    if (!t || !t->store) return;
    ckptio__txn_abort(t);
    t->store->fini(t);
    free(t->path);
    free(t->parent);
    free(t->tmp_path);
    free(t->old_path);
    memset(t, 0, sizeof *t);
    t->tmp_fd = t->fd = -1;
}
