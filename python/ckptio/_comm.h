/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's bridge from Python communicators (ckptio.ranks._comm) to ckptio_comm tables. */
#ifndef CKPTIO_PY_COMM_H
#define CKPTIO_PY_COMM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"

/* Add the communicator functions (_comm_new, _comm_selftest) to module `m`, from its init.
 * 0, or -1 with an exception set. */
int ckptio__pycomm_register(PyObject *m);

/* A table whose callbacks call `obj` (a ckptio.ranks._comm.Communicator: rank, size, barrier,
 * broadcast, gather), holding a reference to it. Called with the GIL held; the table may then
 * be used with the GIL released (each callback takes it). Free with ckptio_comm_free(), GIL held
 * or not. NULL with an exception set on failure. */
ckptio_comm *ckptio__pycomm_new(PyObject *obj);

/* After a ckptio call on `c` (a table from ckptio__pycomm_new) returned `code` < 0, with the
 * GIL held: raise the ckptio.CheckpointError for `code` whose message is ckptio_last_error()
 * followed by the first exception a callback raised, which also becomes its __cause__. Clears
 * that exception from the table. Returns NULL. */
PyObject *ckptio__pycomm_raise(ckptio_comm *c, int code);

#endif /* CKPTIO_PY_COMM_H */
