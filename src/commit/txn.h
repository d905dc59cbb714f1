/* SPDX-License-Identifier: Apache-2.0 */
/* The commit transaction: a save made whole, then shown at once, in any store. */
#ifndef CKPTIO_COMMIT_TXN_H
#define CKPTIO_COMMIT_TXN_H

#include <sys/types.h>

#include "../common/common.h"
#include "../io/params.h"
#include "../store/store.h"

/* Every writer commits the same way, whatever the store (store/store.h: the store of the
 * path does each step its own way): begin checks what is at the target may be replaced and
 * makes where the data goes (a POSIX store: `<target>.tmp-<pid>.<n>` beside it, stale ones of
 * the same name removed; S3: a data component unique to the save); the writer creates its data
 * files through open_data and finishes each with finish_data; publish puts the manifest in
 * last and shows the whole checkpoint at once (a rename, or a conditional PUT), or nothing;
 * abort removes what begin made and leaves the target as it was.
 *
 * - many ranks: one process begins; the others ckptio__txn_join() its tmp_path, write their
 *   data files and seal them, and fini without publishing; once all have reported (a barrier
 *   outside this room), the creator publishes. Publish never lists what is there.
 * - async: a background thread publishes a transaction handed to it; the struct holds no
 *   pointer into a writer, so it may outlive the writer that filled it.
 *
 * Layering: stands on src/store (and io, common); used by src/write, src/ranks. */

/* Start a transaction for `path`. DIR: trailing slashes are dropped, a final "." or ".." or an
 * empty name is CKPTIO_E_USAGE, and stale temporary directories of the same name are removed
 * (the rules are ckptio_writer_open's, in ckptio.h). FILE: a directory at the target is refused
 * even with OVERWRITE; `direct` (CKPTIO_AUTO / ON / OFF) is the temporary file's O_DIRECT. `o`: the
 * store's settings (NULL: the environment's), read before begin returns. On
 * failure msg says why and ckptio__txn_fini() still has to be called. */
CKPTIO__HIDDEN int ckptio__txn_begin(ckptio__txn *t, const char *path, int kind, unsigned flags,
                                     int direct, const ckptio_store_opts *o, ckptio__msg *msg);

/* Join the temporary directory `tmp_path` that another process began for `path` (DIR only): the
 * transaction gets tmp_fd to write into; it may not publish, and abort or fini leave the
 * directory to its creator. */
CKPTIO__HIDDEN int ckptio__txn_join(ckptio__txn *t, const char *path, const char *tmp_path,
                                    unsigned flags, const ckptio_store_opts *o, ckptio__msg *msg);

/* Commit: `man` (DIR; NULL where the caller wrote the manifest into tmp_fd itself) goes in last;
 * POSIX makes the temporary directory or file durable (FSYNC) and renames it over the target,
 * atomically: a checkpoint is swapped in (RENAME_EXCHANGE, or moved aside and back where that
 * is missing) and removed once the swap is durable, a replaced file keeps its mode, then the
 * parent is fsynced; S3 PUTs the manifest on the condition that what begin found is still there.
 * Fails with nothing changed at the target, except CKPTIO_E_NOT_DURABLE: the commit happened
 * (t->published), only its directory entry may not survive a crash. */
CKPTIO__HIDDEN int ckptio__txn_publish(ckptio__txn *t, const uint8_t *man, uint64_t len,
                                       ckptio__msg *msg);

/* Remove what begin created (an owner's temporary directory or file) unless published; the
 * target is untouched. Safe to call more than once. */
CKPTIO__HIDDEN void ckptio__txn_abort(ckptio__txn *t);

/* Abort if not published, close the descriptors (dropping the lock) and free. Accepts a
 * zeroed or half-begun transaction. */
CKPTIO__HIDDEN void ckptio__txn_fini(ckptio__txn *t);

/* ---- the store's part, for the writers (store/store.h says what each does) ---- */

static inline unsigned ckptio__txn_caps(const ckptio__txn *t)
{
    return t->store->caps;
}
static inline unsigned ckptio__txn_parallel(const ckptio__txn *t)
{
    return t->store->parallel(t);
}
static inline int ckptio__txn_open_data(ckptio__txn *t, const char *name, uint64_t part,
                                        int want_direct, int *fd, int *direct, ckptio__msg *msg)
{
    return t->store->open_data(t, name, part, want_direct, fd, direct, msg);
}
static inline int ckptio__txn_finish_data(ckptio__txn *t, int fd, uint64_t len,
                                          const char *label, ckptio__msg *msg)
{
    return t->store->finish_data(t, fd, len, label, msg);
}
static inline int ckptio__txn_rename_data(ckptio__txn *t, int *fd, const char *from,
                                          const char *to, uint64_t part, ckptio__msg *msg)
{
    return t->store->rename_data(t, fd, from, to, part, msg);
}
static inline int ckptio__txn_seal(ckptio__txn *t, ckptio__msg *msg)
{
    return t->store->seal(t, msg);
}
static inline int ckptio__txn_failed(ckptio__txn *t, int rc, ckptio__msg *msg)
{
    return t->store && t->store->failed ? t->store->failed(t, rc, msg) : rc;
}
static inline void ckptio__txn_drop(ckptio__txn *t, const char *prefix)
{
    if (t->store) t->store->drop(t, prefix);
}

/* The commit transaction's flags for these settings. */
static inline unsigned ckptio__cfg_txn_flags(const ckptio__cfg *c)
{
    return (c->overwrite ? CKPTIO__TXN_OVERWRITE : 0) | (c->fsync ? CKPTIO__TXN_FSYNC : 0);
}

#endif
