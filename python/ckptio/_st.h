/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's safetensors functions (st_parse, st_encode) over src/format/safetensors.c. */
#ifndef CKPTIO_PY_ST_H
#define CKPTIO_PY_ST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add st_parse and st_encode to module `m`, from its init. 0, or -1 with an exception set. */
int ckptio__pyst_register(PyObject *m);

#endif /* CKPTIO_PY_ST_H */
