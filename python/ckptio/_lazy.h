/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's binding of the mapper (ckptio_mapper_*), for mapped (lazy) loads. */
#ifndef CKPTIO_PY_LAZY_H
#define CKPTIO_PY_LAZY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add the type Mapper to module `m`, from its init. 0, or -1 with an exception set. */
int ckptio__pylazy_register(PyObject *m);

#endif /* CKPTIO_PY_LAZY_H */
