/* SPDX-License-Identifier: Apache-2.0 */
/* What the reader's open shares with the mapped loads and delta saves: a checkpoint's manifest. */
#ifndef CKPTIO_READ_OPEN_H
#define CKPTIO_READ_OPEN_H

#include "../common/common.h"

/* The manifest's bytes (*buf, malloc'd, *len of them), read through the checkpoint directory's
 * descriptor `dirfd` (never by path: the checkpoint may be replaced at `path` meanwhile); the
 * failure, naming `path`, goes to msg. read/open.c. */
CKPTIO__HIDDEN int ckptio__read_manifest(int dirfd, const char *path, ckptio__msg *msg,
                                         uint8_t **buf, uint64_t *len);

/* XXH3-64 of the whole manifest file of the checkpoint at `dir`: how a delta checkpoint names
 * its base (doc/format.md section 11.3). 0 or -errno, with *msg naming the file. read/open.c. */
CKPTIO__HIDDEN int ckptio__manifest_file_sum(const char *dir, uint64_t *sum, ckptio__msg *msg);

#endif
