/* SPDX-License-Identifier: Apache-2.0 */
/* The commit transaction: a temporary sibling of the target, published by one atomic rename. */
#ifndef CKPTIO_COMMIT_TXN_H
#define CKPTIO_COMMIT_TXN_H

#include <sys/types.h>

#include "../common/common.h"
#include "../io/params.h"
#include "../store/store.h"

/* Every writer commits the same way: begin resolves the target (through symlinks), checks what
 * is there may be replaced, and creates `<target>.tmp-<pid>.<n>` beside it (a rename cannot
 * cross file systems); the caller fills it; publish renames it over the target and fsyncs the
 * parent; abort removes it and leaves the target as it was. A transaction knows nothing of
 * writers: which files go into a temporary directory, and their fsyncs, are the caller's. It
 * makes durable only what it created itself (the temporary directory's own entries, or the
 * temporary file) before the rename exposes it.
 *
 * Room for the publishes still to come:
 * - many ranks: one process begins (creates the temporary directory); the others
 *   ckptio__txn_join() it by name, write their files through tmp_fd and fini without touching
 *   it; once all have reported (a barrier outside this room), the creator publishes. Publish
 *   never lists or checks what is in the directory, so it does not assume one caller wrote it.
 * - async: a background thread runs ckptio__txn_publish() on a transaction handed to it; the
 *   struct holds no pointer into a writer, so it may outlive the writer that filled it.
 * - object storage: no rename there; a publish variant writes the manifest object last (its
 *   presence is the commit) in place of publish_dir()'s rename, behind the same begin/abort.
 *
 * Layering: uses src/io (vfs, file_open, fsync) and src/common; used by src/write and src/read. */

enum {
    CKPTIO__TXN_DIR = 1,  /* a checkpoint directory; tmp_fd is the temporary directory */
    CKPTIO__TXN_FILE = 2, /* one file; fd is the temporary file, opened for writing */
};

/* begin's flags */
#define CKPTIO__TXN_OVERWRITE 1u /* replace what is at the target (a checkpoint, an empty
                                  * directory, or for FILE a file); else CKPTIO_E_EXISTS */
#define CKPTIO__TXN_FSYNC 2u     /* fsync the temporary directory or file before the rename and
                                  * the parent after it */

/* What was at the target when the transaction began. */
enum {
    CKPTIO__AT_NOTHING = 0,
    CKPTIO__AT_EMPTY_DIR,   /* DIR: an empty directory (rename(2) replaces it atomically) */
    CKPTIO__AT_CHECKPOINT,  /* DIR: a directory with a manifest */
    CKPTIO__AT_FILE,        /* FILE: something that is not a directory; found_mode says what */
};

typedef struct ckptio__txn {
    int kind;          /* CKPTIO__TXN_DIR / _FILE; 0 before begin */
    unsigned flags;    /* CKPTIO__TXN_* */
    char *path;        /* the target, after following symlinks (messages name it) */
    char *parent;      /* its directory, fsynced after the rename */
    char *tmp_path;    /* <path>.tmp-<pid>.<n> */
    char *old_path;    /* DIR: where publish moved the replaced checkpoint, until removed */
    int tmp_fd;        /* DIR: the temporary directory, flock(LOCK_EX)ed while open */
    int fd;            /* FILE: the temporary file, until publish closes it */
    int direct;        /* FILE: whether fd has O_DIRECT */
    int found;         /* CKPTIO__AT_*: what begin found at path */
    mode_t found_mode; /* its st_mode (0 for AT_NOTHING) */
    bool owner;        /* created tmp_path: publish and abort are ours */
    struct ckptio__objtxn *obj; /* an object store's transaction (objtxn.c), or NULL */
    bool published;    /* the rename happened: nothing is undone after it */
} ckptio__txn;

/* Start a transaction for `path`. DIR: trailing slashes are dropped, a final "." or ".." or an
 * empty name is CKPTIO_E_USAGE, and stale temporary directories of the same name are removed
 * (the rules are ckptio_writer_open's, in ckptio.h). FILE: a directory at the target is refused
 * even with OVERWRITE; `direct` (CKPTIO_AUTO / ON / OFF) is the temporary file's O_DIRECT. On
 * failure msg says why and ckptio__txn_fini() still has to be called. */
CKPTIO__HIDDEN int ckptio__txn_begin(ckptio__txn *t, const char *path, int kind, unsigned flags,
                                     int direct, ckptio__msg *msg);

/* Join the temporary directory `tmp_path` that another process began for `path` (DIR only): the
 * transaction gets tmp_fd to write into; it may not publish, and abort or fini leave the
 * directory to its creator. */
CKPTIO__HIDDEN int ckptio__txn_join(ckptio__txn *t, const char *path, const char *tmp_path,
                                    unsigned flags, ckptio__msg *msg);

/* Make the temporary directory or file durable (FSYNC) and rename it over the target, atomically:
 * a checkpoint is swapped in (RENAME_EXCHANGE, or moved aside and back where that is missing)
 * and removed once the swap is durable; a replaced file's mode is kept. Then the parent is
 * fsynced. Fails with nothing changed at the target, except CKPTIO_E_NOT_DURABLE: the rename
 * happened (t->published), only its directory entry may not survive a crash. */
CKPTIO__HIDDEN int ckptio__txn_publish(ckptio__txn *t, ckptio__msg *msg);

/* Remove what begin created (an owner's temporary directory or file) unless published; the
 * target is untouched. Safe to call more than once. */
CKPTIO__HIDDEN void ckptio__txn_abort(ckptio__txn *t);

/* Abort if not published, close the descriptors (dropping the lock) and free. Accepts a
 * zeroed or half-begun transaction. */
CKPTIO__HIDDEN void ckptio__txn_fini(ckptio__txn *t);

/* ---- in an object store (objtxn.c) ----
 *
 * For an "s3://bucket/key" target, begin and join hand over to these (kind DIR only): begin
 * checks the manifest object (CKPTIO_E_EXISTS without OVERWRITE), remembers its ETag and the
 * data it names, and picks this save's data component "d-<id>"; tmp_path is then
 * "s3://bucket/key/d-<id>" (what joining ranks are given), tmp_fd stays -1. Data objects are
 * created with open_data; publish_object PUTs the manifest conditionally (a racing save that
 * committed first: CKPTIO_E_EXISTS) and then deletes the replaced checkpoint's data and what
 * interrupted saves left. abort deletes this save's objects and uploads. */
CKPTIO__HIDDEN bool ckptio__txn_is_object(const ckptio__txn *t);
CKPTIO__HIDDEN int ckptio__objtxn_begin(ckptio__txn *t, const char *url, unsigned flags,
                                        ckptio__msg *msg);
CKPTIO__HIDDEN int ckptio__objtxn_join(ckptio__txn *t, const char *url, const char *tmp_url,
                                       unsigned flags, ckptio__msg *msg);
/* This save's data component, "d-<id>". */
CKPTIO__HIDDEN const char *ckptio__objtxn_save(const ckptio__txn *t);
/* Create data object `name` (relative to the checkpoint: "d-<id>/...") for writing in parts of
 * `part` bytes: *fd is an object descriptor (store/s3.h). */
CKPTIO__HIDDEN int ckptio__objtxn_open_data(ckptio__txn *t, const char *name, uint64_t part,
                                            int *fd, ckptio__msg *msg);
CKPTIO__HIDDEN int ckptio__objtxn_publish(ckptio__txn *t, const uint8_t *man, uint64_t len,
                                          ckptio__msg *msg);
CKPTIO__HIDDEN void ckptio__objtxn_abort(ckptio__txn *t);
/* A joined rank's objects no manifest can name (its part never reached the coordinator): its
 * abort deletes those of this save whose names start with `prefix` ("r00003-"). A rank that
 * fails after the coordinator's own sweep would otherwise leave them behind. */
CKPTIO__HIDDEN void ckptio__objtxn_drop(ckptio__txn *t, const char *prefix);
CKPTIO__HIDDEN void ckptio__objtxn_fini(ckptio__txn *t);

/* ---- path helpers, shared with the readers ---- */

/* A process-wide counter for unique temporary names (<path>.tmp-<pid>.<n>). */
CKPTIO__HIDDEN unsigned ckptio__tmp_id(void);
/* The directory holding `path` (malloc'd; "." or "/" where it has no other). */
CKPTIO__HIDDEN char *ckptio__parent_dir(const char *path);

/* Follow `path` while its last component is a symlink (a relative target taken from the link's
 * own directory, up to 40 links: else -ELOOP) and return the path of what it finally names,
 * malloc'd in *out; that may not exist (a dangling link names where to create). A path that is
 * no symlink, or cannot be inspected, comes back as it is. Writers save to the target, as
 * open(2) in torch.save would, so a link stays a link. */
CKPTIO__HIDDEN int ckptio__follow_links(const char *path, char **out);


/* The commit transaction's flags for these settings. */
static inline unsigned ckptio__cfg_txn_flags(const ckptio__cfg *c)
{
    return (c->overwrite ? CKPTIO__TXN_OVERWRITE : 0) | (c->fsync ? CKPTIO__TXN_FSYNC : 0);
}

#endif
