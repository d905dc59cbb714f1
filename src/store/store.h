/* SPDX-License-Identifier: Apache-2.0 */
/* The store interface: one table of operations per kind of store, found by the one URL parser. */
#ifndef CKPTIO_STORE_STORE_H
#define CKPTIO_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/common.h"

/* Where checkpoints live. A path without a scheme is a directory of a local file system
 * (POSIX); "<scheme>://..." is served by the store of that scheme ("s3://bucket/key"). An
 * unknown scheme is an error, never a relative directory named "gs:". Everything above this
 * room asks a store through its table and never which kind it has: a new kind of store is one
 * file and one entry in store.c's table, and passes tests/test_store.c. */

/* ---- a save in progress: the commit transaction's state ----
 *
 * commit/txn.h drives it (begin, join, publish, abort, fini); the store fills it. The fields
 * are what the rooms above may read; `impl` is the store's own. */

enum {
    CKPTIO__TXN_DIR = 1,  /* a checkpoint: a manifest and data beside it */
    CKPTIO__TXN_FILE = 2, /* one file (safetensors, a torch archive); fd is the file */
};

/* begin's flags */
#define CKPTIO__TXN_OVERWRITE 1u /* replace what is at the target (a checkpoint, an empty
                                  * directory, or for FILE a file); else CKPTIO_E_EXISTS */
#define CKPTIO__TXN_FSYNC 2u     /* make what is published durable before and after it shows */

/* What was at the target when the transaction began. */
enum {
    CKPTIO__AT_NOTHING = 0,
    CKPTIO__AT_EMPTY_DIR,   /* DIR: an empty directory (rename(2) replaces it atomically) */
    CKPTIO__AT_CHECKPOINT,  /* DIR: a committed checkpoint */
    CKPTIO__AT_FILE,        /* FILE: something that is not a directory; found_mode says what */
};

/* What a store asks of the writers above it (ckptio__store_ops.caps). */
#define CKPTIO__STORE_PARTS 1u /* data goes in whole parts of at least part_min bytes, at most
                                * max_parts of them per data file, through io/vfd.h descriptors
                                * (an object upload): nothing in place, no truncation, no
                                * O_DIRECT, no fsync */
#define CKPTIO__STORE_LOCAL 2u /* a local file system: paths resolve (realpath, symlinks),
                                * stripes over other roots, bases of incremental saves */

struct ckptio__store_ops;

/* ---- reads from a store that is no local file system (caps without LOCAL) ----
 *
 * A place is a checkpoint's prefix, or a folder of safetensors files: names are relative to
 * it ("manifest", "d-<id>/000000.ckd", "model.safetensors"). A local file system needs none of
 * this: readers open its files themselves (O_DIRECT, the page cache, mapped loads). */
typedef struct ckptio__place {
    const struct ckptio__store_ops *store;
    char *path;        /* as given, without trailing slashes */
    unsigned parallel; /* reads in flight the store serves at once */
    void *impl;        /* the store's own */
} ckptio__place;

/* Called with each name directly under a place (not deeper); nonzero stops the listing. */
typedef int (*ckptio__names_cb)(void *ctx, const char *name);

typedef struct ckptio__txn {
    const struct ckptio__store_ops *store;
    int kind;          /* CKPTIO__TXN_DIR / _FILE; 0 before begin */
    unsigned flags;    /* CKPTIO__TXN_* */
    char *path;        /* the target, as the store names it (messages name it) */
    char *tmp_path;    /* where this save's data goes until published: what joining ranks are
                        * given (a directory, or the URL of the save's data component) */
    const char *where; /* what data names are relative to, for messages */
    char data_dir[48]; /* the data files' folder in the checkpoint ("data", "d-<id>") */
    char *parent;      /* LOCAL: the target's directory, fsynced after the rename */
    char *old_path;    /* LOCAL DIR: where publish moved the replaced checkpoint, until removed */
    int tmp_fd;        /* LOCAL DIR: the temporary directory, flock(LOCK_EX)ed while open */
    int fd;            /* FILE: the temporary file, until publish closes it */
    int direct;        /* FILE: whether fd has O_DIRECT */
    int found;         /* CKPTIO__AT_*: what begin found at path */
    unsigned found_mode; /* LOCAL: its st_mode (0 for AT_NOTHING) */
    bool owner;        /* began it: publish and abort are ours */
    bool published;    /* the commit happened: nothing is undone after it */
    int pid;           /* the process that began or joined it: a forked child's copy neither
                        * publishes nor aborts (what it names is the parent's save) */
    void *impl;        /* the store's own state */
} ckptio__txn;

typedef struct ckptio__store_ops {
    const char *name;   /* "posix", "s3": what ckptio_store_name() answers */
    const char *scheme; /* "s3://": the addresses it serves; NULL: paths without a scheme */

    /* ---- the catalog ---- */
    /* Add to *out the names of the committed checkpoints directly under `prefix` (entries
     * that hold a manifest), in any order; a prefix that does not exist holds none. */
    int (*list)(const char *prefix, const ckptio_store_opts *o, ckptio__names *out,
                ckptio__msg *msg);
    /* 1 when `path` holds a committed checkpoint (its manifest), 0 when not. */
    int (*is_checkpoint)(const char *path, const ckptio_store_opts *o, ckptio__msg *msg);
    /* Remove the checkpoint at `path` whole (CKPTIO_E_NOT_CHECKPOINT when it has no manifest):
     * it leaves every listing at once and durably (a crash never brings back part of it),
     * then its data goes; what a crash leaves, sweep removes. */
    int (*remove)(const char *path, const ckptio_store_opts *o, ckptio__msg *msg);
    /* Remove what killed saves and removals left directly under `prefix` that no live one
     * still owns (ckptio_sweep says which, per store); the number of leftovers removed. */
    int (*sweep)(const char *prefix, const ckptio_store_opts *o, ckptio__msg *msg);

    /* ---- saves: commit/txn.h's contract, each op for one store ---- */
    unsigned caps;      /* CKPTIO__STORE_* */
    uint64_t part_min;  /* PARTS: the smallest part */
    unsigned max_parts; /* PARTS: parts per data file at most */
    /* Start a save of `path` (t zeroed): check what is there may be replaced (EXISTS
     * otherwise), make where the data goes. FILE: `direct` is the file's O_DIRECT wish. `o`:
     * the store's settings (NULL: the environment's), needed only until begin returns. */
    int (*begin)(ckptio__txn *t, const char *path, int kind, unsigned flags, int direct,
                 const ckptio_store_opts *o, ckptio__msg *msg);
    /* Take part in the save another process began (DIR): write into tmp_path, never publish. */
    int (*join)(ckptio__txn *t, const char *path, const char *tmp_path, unsigned flags,
                const ckptio_store_opts *o, ckptio__msg *msg);
    /* How many writes in flight the store serves at once (PARTS: what the sink is sized to). */
    unsigned (*parallel)(const ckptio__txn *t);
    /* Create data file `name` (relative to the checkpoint: "<data_dir>/...") for writing:
     * PARTS in parts of `part` bytes; else with O_DIRECT as `want_direct` asks (*direct: in
     * effect). */
    int (*open_data)(ckptio__txn *t, const char *name, uint64_t part, int want_direct, int *fd,
                     int *direct, ckptio__msg *msg);
    /* Every write to data file fd (`len` bytes long) has completed: make it whole (an upload
     * completed; a file fsynced under FSYNC). The caller closes fd (ckptio__fd_close). */
    int (*finish_data)(ckptio__txn *t, int fd, uint64_t len, const char *label, ckptio__msg *msg);
    /* Data file `from`, open as *fd with nothing of it written out yet, is renamed `to`;
     * *fd may become another descriptor. */
    int (*rename_data)(ckptio__txn *t, int *fd, const char *from, const char *to, uint64_t part,
                       ckptio__msg *msg);
    /* The entries of the data files this process made durable (under FSYNC): a rank's share
     * of a save, before its part is reported. */
    int (*seal)(ckptio__txn *t, ckptio__msg *msg);
    /* Commit: the manifest `man` (NULL: already in place, written by the caller into
     * tmp_fd) goes in last and the whole checkpoint shows at once, or nothing does; a racing
     * commit that won is CKPTIO_E_EXISTS. CKPTIO_E_NOT_DURABLE: published, not durable. */
    int (*publish)(ckptio__txn *t, const uint8_t *man, uint64_t len, ckptio__msg *msg);
    /* Remove what begin made, unless published; the target untouched. Twice is harmless. */
    void (*abort)(ckptio__txn *t);
    /* The save failed with `rc` (msg says how): the store's own reason when it knows a truer
     * one (another save committed the path and swept this one's data: CKPTIO_E_EXISTS), else
     * rc. NULL: rc always. */
    int (*failed)(ckptio__txn *t, int rc, ckptio__msg *msg);
    /* A joined rank's data that no manifest will name (its part never reached the
     * coordinator): its abort removes the data files whose names start with `prefix`. */
    void (*drop)(ckptio__txn *t, const char *prefix);
    /* Free the store's state (after abort). */
    void (*fini)(ckptio__txn *t);

    /* ---- reads (stores without LOCAL) ---- */
    /* Open the place `path` (p zeroed but for store) with the store's settings `o` (NULL: the
     * environment's); place_close releases even a failed one. */
    int (*place_open)(ckptio__place *p, const char *path, const ckptio_store_opts *o,
                      ckptio__msg *msg);
    void (*place_close)(ckptio__place *p);
    /* The whole of `name` (at most max bytes: else CKPTIO_E_LIMIT) in malloc'd *buf; a name
     * that is not there is CKPTIO_E_NOT_FOUND. */
    int (*read_all)(ckptio__place *p, const char *name, uint64_t max, uint8_t **buf,
                    uint64_t *len, ckptio__msg *msg);
    /* The size of `name` (CKPTIO_E_NOT_FOUND when it is not there). */
    int (*size_of)(ckptio__place *p, const char *name, uint64_t *size, ckptio__msg *msg);
    /* Bytes [off, off + len) of `name` into buf; *got short only at its end. */
    int (*read_range)(ckptio__place *p, const char *name, uint64_t off, uint64_t len, void *buf,
                      uint64_t *got, ckptio__msg *msg);
    /* `name` opened for the engine's reads (a descriptor of io/vfd.h; ckptio__fd_close). *size:
     * in, its length where the caller knows it (a checkpoint's manifest records its data
     * files'), so the store need not ask (a missing one then fails at its first read), or
     * UINT64_MAX; out, its length. */
    int (*open_read)(ckptio__place *p, const char *name, int *fd, uint64_t *size,
                     ckptio__msg *msg);
    /* The names directly under the place, in any order. */
    int (*list_names)(ckptio__place *p, ckptio__names_cb cb, void *ctx, ckptio__msg *msg);
} ckptio__store_ops;

/* The store serving `path` (its scheme, else POSIX): CKPTIO_E_USAGE naming the schemes there
 * are, for a "<scheme>://" no store serves. */
CKPTIO__HIDDEN int ckptio__store_for(const char *path, const ckptio__store_ops **out,
                                     ckptio__msg *msg);

/* 1 when `path` is in a store that is no local file system (its reads go through a place),
 * 0 for a local path, < 0 (msg says why) when no store serves its scheme. */
CKPTIO__HIDDEN int ckptio__store_remote(const char *path, ckptio__msg *msg);
/* Open the place `path` in whichever store serves it (store_for, then its place_open):
 * CKPTIO_E_USAGE for a store that is a local file system (readers open those themselves). */
CKPTIO__HIDDEN int ckptio__place_open(ckptio__place *p, const char *path,
                                      const ckptio_store_opts *o, ckptio__msg *msg);
/* Release a place; accepts a zeroed or failed one. */
CKPTIO__HIDDEN void ckptio__place_close(ckptio__place *p);

/* ---- settings (opts.c) ---- */

/* The value of setting `key` in o (NULL when o is NULL or has none): the store then reads the
 * environment, at the moment it needs the setting. */
CKPTIO__HIDDEN const char *ckptio__opt(const ckptio_store_opts *o, const char *key);
/* The hex digits of prefix spreading a prefix_spread value asks for: 0 (NULL, "" or "0"), 1
 * or 2; -1 for any other value. */
CKPTIO__HIDDEN int ckptio__spread_digits(const char *v);
/* The settings in key order: the i-th into *key, *value; CKPTIO_E_NOT_FOUND past the end. */
CKPTIO__HIDDEN size_t ckptio__opts_count(const ckptio_store_opts *o);
CKPTIO__HIDDEN int ckptio__opts_at(const ckptio_store_opts *o, size_t i, const char **key,
                                   const char **value);

/* The stores (store.c's table entries). */
CKPTIO__HIDDEN extern const ckptio__store_ops ckptio__store_posix;
CKPTIO__HIDDEN extern const ckptio__store_ops ckptio__store_s3;
CKPTIO__HIDDEN extern const ckptio__store_ops ckptio__store_gcs;

/* ---- the POSIX store's path helpers, which other rooms share (posix.c) ---- */

/* Remove a directory tree without following symlinks (openat/unlinkat); best effort, returns
 * the first error. */
CKPTIO__HIDDEN int ckptio__remove_tree(const char *path);
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

#endif
