/* SPDX-License-Identifier: Apache-2.0 */
/* The single-file writer's state, for the writers of foreign formats built on it (zip). */
#ifndef CKPTIO_WRITE_FILE_WRITER_H
#define CKPTIO_WRITE_FILE_WRITER_H

#include "../io/params.h"
#include "../io/engine.h"
#include "../commit/txn.h"
#include "../io/sink.h"

struct ckptio_file_writer {
    ckptio__msg msg;
    ckptio__cfg cfg;
    ckptio__handle_state hs;
    ckptio__txn txn; /* the temporary file (txn.fd) and its publish */
    ckptio__sink sink;
    double t_open;
    ckptio_stats stats;
};

/* Open the file writer `f` points to (zeroed by the caller) on `path`: what
 * ckptio_file_writer_open does, in a struct the caller embeds. On failure f->msg says why and
 * ckptio__file_writer_fini cleans up. */
CKPTIO__HIDDEN int ckptio__file_writer_init(ckptio_file_writer *f, const char *path,
                                            const ckptio_params *p);
/* Release what init took; without a commit the temporary file is removed. */
CKPTIO__HIDDEN void ckptio__file_writer_fini(ckptio_file_writer *f);

#endif
