/* SPDX-License-Identifier: Apache-2.0 */
/* Descriptors that are no file: a store's objects, served through the engine like files. */
#ifndef CKPTIO_IO_VFD_H
#define CKPTIO_IO_VFD_H

#include "../common/common.h"
#include "engine.h"

/* A store that is no file system (an object store) opens its objects here: each gets a
 * descriptor (an eventfd: unique while open, never read or written) that the engine's requests
 * carry in req->fd like a file's. The psync backend hands a request on such a descriptor to
 * its ops->io instead of pread/pwrite, so the sink and the read ring drive uploads and ranged
 * reads through the same code as files; the engine never learns which store it serves.
 *
 * io runs on the engine's threads, several at once on one object; it sets r->res (bytes moved
 * or -errno) and r->done_. close releases the object (called once, by ckptio__fd_close);
 * `forked`: in a child forked from the process that opened it, whose object it still is (an
 * upload there goes on): free the memory only. */
typedef struct ckptio__vfd_ops {
    void (*io)(void *obj, ckptio__req *r);
    void (*close)(void *obj, bool forked);
    /* The first failed request's message (the store's own words: the object, the status), ""
     * if none; NULL: none kept. */
    const char *(*error)(void *obj);
} ckptio__vfd_ops;

/* A new descriptor serving `obj` through `ops`; the descriptor owns obj from then on. */
CKPTIO__HIDDEN int ckptio__vfd_open(const ckptio__vfd_ops *ops, void *obj, int *fd,
                                    ckptio__msg *msg);
/* The object behind fd if it was opened with `ops`, else NULL. Cheap while no such
 * descriptor is open (the common case: files only). */
CKPTIO__HIDDEN void *ckptio__vfd_obj(int fd, const ckptio__vfd_ops *ops);
/* What the first failed request on fd said (ops->error), "" for a file or none. */
CKPTIO__HIDDEN const char *ckptio__vfd_error(int fd);
/* If fd is a descriptor of this file: run r through its ops and return true. */
CKPTIO__HIDDEN bool ckptio__vfd_io(ckptio__req *r);
/* Close fd, whichever it is: a descriptor of this file releases its object through its ops
 * (an object still being written is abandoned there), anything else is close(2)d. Accepts
 * -1. */
CKPTIO__HIDDEN void ckptio__fd_close(int fd);

#endif
