/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.Mapper: a checkpoint's data files for mmap and checks of mapped bytes. */
#include "_lazy.h"

#include <sys/mman.h>
#include <unistd.h>

#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"

typedef struct {
    PyObject_HEAD
    ckptio_mapper *m;
} MapperObject;

/* The ckptio.CheckpointError for `code` with the mapper's message (ckptio._errors._from_code,
 * as _core.c raises them). */
static PyObject *raise_mapper(int code, const char *msg)
{
    if (!msg || !msg[0]) msg = ckptio_last_error();
    if (!msg || !msg[0]) msg = ckptio_strerror(code);
    PyObject *mod = PyImport_ImportModule("ckptio._errors");
    if (!mod) return NULL;
    PyObject *exc = PyObject_CallMethod(mod, "_from_code", "iss", code, ckptio_errname(code), msg);
    Py_DECREF(mod);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static int mapper_open_check(MapperObject *self)
{
    if (self->m) return 0;
    raise_mapper(CKPTIO_E_STATE, "mapper is closed");
    return -1;
}

static int Mapper_init(MapperObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:Mapper", kwlist, PyUnicode_FSConverter, &path))
        return -1;
    ckptio_mapper_close(self->m);
    self->m = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_mapper_open(&self->m, PyBytes_AS_STRING(path));
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (rc < 0) {
        raise_mapper(rc, ckptio_last_error());
        return -1;
    }
    return 0;
}

static void Mapper_dealloc(MapperObject *self)
{
    ckptio_mapper_close(self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Mapper_same(MapperObject *self, PyObject *arg)
{
    if (mapper_open_check(self) < 0) return NULL;
    PyObject *path;
    if (!PyUnicode_FSConverter(arg, &path)) return NULL;
    int rc = ckptio_mapper_same(self->m, PyBytes_AS_STRING(path));
    Py_DECREF(path);
    if (rc < 0) return raise_mapper(rc, ckptio_last_error());
    return PyBool_FromLong(rc);
}

/* set_roots((b"dir", ...)): where a striped checkpoint's stripes are now (ckptio._mapped passes
 * the roots= of load and open, encoded). */
static PyObject *Mapper_set_roots(MapperObject *self, PyObject *arg)
{
    if (mapper_open_check(self) < 0) return NULL;
    if (!PyTuple_Check(arg)) return PyErr_Format(PyExc_TypeError, "set_roots expects a tuple");
    Py_ssize_t n = PyTuple_GET_SIZE(arg);
    const char **roots = PyMem_Calloc((size_t)n + 1, sizeof *roots);
    if (!roots) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        roots[i] = PyBytes_AsString(PyTuple_GET_ITEM(arg, i));
        if (!roots[i]) {
            PyMem_Free(roots);
            return NULL;
        }
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_mapper_set_roots(self->m, roots, (size_t)n);
    Py_END_ALLOW_THREADS
    PyMem_Free(roots);
    if (rc < 0) return raise_mapper(rc, ckptio_mapper_errmsg(self->m));
    Py_RETURN_NONE;
}

/* chunk(tensor, chunk) -> (fd, file_offset, stored_bytes); fd belongs to the mapper. */
static PyObject *Mapper_chunk(MapperObject *self, PyObject *args)
{
    Py_ssize_t t, c;
    if (!PyArg_ParseTuple(args, "nn:chunk", &t, &c)) return NULL;
    if (mapper_open_check(self) < 0) return NULL;
    int fd = -1;
    uint64_t off = 0, len = 0;
    int rc = t < 0 || c < 0 ? CKPTIO_E_NOT_FOUND
                            : ckptio_mapper_chunk(self->m, (size_t)t, (size_t)c, &fd, &off, &len);
    if (rc < 0) return raise_mapper(rc, ckptio_mapper_errmsg(self->m));
    return Py_BuildValue("iKK", fd, (unsigned long long)off, (unsigned long long)len);
}

/* check(tensor, chunk, data): hash a buffer (a mapping's bytes) with the GIL released. */
static PyObject *Mapper_check(MapperObject *self, PyObject *args)
{
    Py_ssize_t t, c;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "nny*:check", &t, &c, &v)) return NULL;
    if (mapper_open_check(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    int rc;
    if (t < 0 || c < 0) {
        rc = CKPTIO_E_NOT_FOUND;
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = ckptio_mapper_check(self->m, (size_t)t, (size_t)c, v.buf, (uint64_t)v.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&v);
    if (rc < 0) return raise_mapper(rc, ckptio_mapper_errmsg(self->m));
    Py_RETURN_NONE;
}

static PyObject *Mapper_unchanged(MapperObject *self, PyObject *unused)
{
    (void)unused;
    if (mapper_open_check(self) < 0) return NULL;
    int rc = ckptio_mapper_unchanged(self->m);
    if (rc < 0) return raise_mapper(rc, ckptio_mapper_errmsg(self->m));
    Py_RETURN_NONE;
}

static PyObject *Mapper_close(MapperObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_mapper_close(self->m);
    self->m = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Mapper_methods[] = {
    {"same", (PyCFunction)Mapper_same, METH_O,
     "same(path) -> whether path still names the directory the mapper opened"},
    {"set_roots", (PyCFunction)Mapper_set_roots, METH_O,
     "set_roots((bytes, ...)): look for a striped checkpoint's stripes in these directories"},
    {"chunk", (PyCFunction)Mapper_chunk, METH_VARARGS,
     "chunk(tensor, chunk) -> (fd, file_offset, stored_bytes); the fd belongs to the mapper"},
    {"check", (PyCFunction)Mapper_check, METH_VARARGS,
     "check(tensor, chunk, data): verify a chunk's bytes against its stored checksums"},
    {"unchanged", (PyCFunction)Mapper_unchanged, METH_NOARGS,
     "raise CorruptCheckpoint if a data file opened so far was written in place since"},
    {"close", (PyCFunction)Mapper_close, METH_NOARGS, "release (mappings stay valid)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Mapper_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.Mapper",
    .tp_basicsize = sizeof(MapperObject),
    .tp_dealloc = (destructor)Mapper_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mapper(path): a checkpoint's data files for mmap (ckptio_mapper).",
    .tp_methods = Mapper_methods,
    .tp_init = (initproc)Mapper_init,
    .tp_new = PyType_GenericNew,
};

/* prefault(buffers): fault in every page of each writable buffer for writing, in order, with
 * the GIL released: run on a thread of its own while a read fills the same buffers, it takes
 * the page faults (zeroing, page tables) off the reading thread's path. A page the read got
 * to first is left as it is (MADV_POPULATE_WRITE never replaces a present page). */
static PyObject *mod_prefault(PyObject *self, PyObject *seq)
{
    (void)self;
    PyObject *fast = PySequence_Fast(seq, "prefault expects a sequence of buffers");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    Py_ssize_t got = 0;
    if (!views) {
        PyErr_NoMemory();
        goto out;
    }
    for (; got < n; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &views[got],
                               PyBUF_WRITABLE) < 0)
            goto out;
    Py_BEGIN_ALLOW_THREADS
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (Py_ssize_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)views[i].buf / page * page;
        uintptr_t b = (uintptr_t)views[i].buf + (uintptr_t)views[i].len;
        /* Kernels before 5.14 lack it: a read of each page would map the zero page, which
         * helps nothing, and a write could race with the read landing there; do nothing. */
        if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
    }
    Py_END_ALLOW_THREADS
out:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(fast);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef lazy_functions[] = {
    {"prefault", mod_prefault, METH_O,
     "prefault([buffer, ...]): fault in each buffer's pages for writing, GIL released"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pylazy_register(PyObject *m)
{
    if (PyType_Ready(&Mapper_Type) < 0) return -1;
    if (PyModule_AddFunctions(m, lazy_functions) < 0) return -1;
    return PyModule_AddObjectRef(m, "Mapper", (PyObject *)&Mapper_Type);
}
