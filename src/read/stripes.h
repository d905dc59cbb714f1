/* SPDX-License-Identifier: Apache-2.0 */
/* Finding a striped checkpoint's stripe directories, for the reader and the mapper alike. */
#ifndef CKPTIO_READ_STRIPES_H
#define CKPTIO_READ_STRIPES_H

#include "../format/manifest.h"

/* The roots given to ckptio_reader_set_roots or ckptio_mapper_set_roots, and each stripe
 * root's stripe directory once opened. Zeroed, it holds nothing; init sizes it. */
typedef struct ckptio__stripes {
    int *fds;       /* per stripe root of the manifest (n of them): -1 until opened */
    uint64_t n;
    char **roots;   /* where to look first, in order; the recorded root comes last */
    size_t n_roots;
} ckptio__stripes;

/* Room for the n stripe roots a manifest records, none opened; -ENOMEM. */
CKPTIO__HIDDEN int ckptio__stripes_init(ckptio__stripes *s, uint64_t n);

/* Close every stripe directory and free the roots. Accepts a zeroed holder. */
CKPTIO__HIDDEN void ckptio__stripes_free(ckptio__stripes *s);

/* 0 if none of the n roots is NULL, else CKPTIO_E_USAGE (naming `fn`) in msg. */
CKPTIO__HIDDEN int ckptio__stripes_check(const char *const *roots, size_t n, ckptio__msg *msg,
                                         const char *fn);

/* Look for the stripes in `roots` (n of them, copied) first from now on; n = 0: only where
 * the save recorded them. The stripe directories opened so far are closed. Refused whole (the
 * holder stays as it was): a NULL root is CKPTIO_E_USAGE, naming `fn`, in msg; or -ENOMEM. */
CKPTIO__HIDDEN int ckptio__stripes_set(ckptio__stripes *s, const char *const *roots, size_t n,
                                       ckptio__msg *msg, const char *fn);

/* The directory of stripe root k (0-based) of manifest m: looked for by name in the given
 * roots, in order, then in the root the save recorded; opened once. The stripe itself is no
 * link: what it holds must be this checkpoint's own. A descriptor the holder owns, or -errno
 * (the last failure seen). */
CKPTIO__HIDDEN int ckptio__stripes_dir(ckptio__stripes *s, const ckptio__manifest *m, uint32_t k);

/* The failure of ckptio__stripes_dir (rc) for data file `file` of the checkpoint at `path`
 * (the message names the stripe, both roots and the way out: `setter`, the call that gives
 * roots); returns rc. */
CKPTIO__HIDDEN int ckptio__stripes_fail(const ckptio__stripes *s, ckptio__msg *msg, int rc,
                                        const ckptio__manifest *m, uint32_t k, const char *path,
                                        const char *file, const char *setter);

#endif
