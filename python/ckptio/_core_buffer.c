/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.Buffer: page-aligned, uninitialized memory that loads land in without a copy. */
#include "_core.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
    Py_ssize_t exports;
    void *map; /* the mapping `data` lies in (populated buffers), else NULL: posix_memalign */
    size_t map_len;
} BufferObject;

static PyTypeObject Buffer_Type;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define BUFFER_POPULATE_THREADS 4

struct populate_part {
    char *p;
    size_t n;
};

/* Fault in every page of [p, p+n) for writing; MADV_POPULATE_WRITE where the kernel has it
 * (5.14+), else one store per page (the memory is uninitialized, so any value will do). */
static void *populate_part(void *arg)
{
    struct populate_part *a = arg;
    if (a->n == 0 || madvise(a->p, a->n, MADV_POPULATE_WRITE) == 0) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < a->n; i += page) ((volatile char *)a->p)[i] = 0;
    return NULL;
}

/* Populate [p, p+n) on a few threads: page faults are CPU-bound (zeroing, page tables), so
 * first touch scales with cores where memcpy into fresh memory would not. */
static void populate(char *p, size_t n)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t k = cpus < 1 ? 1 : (size_t)cpus;
    if (k > BUFFER_POPULATE_THREADS) k = BUFFER_POPULATE_THREADS;
    if (n < ((size_t)64 << 20)) k = 1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t piece = (n / k + page - 1) / page * page;
    struct populate_part parts[BUFFER_POPULATE_THREADS];
    pthread_t th[BUFFER_POPULATE_THREADS];
    int started[BUFFER_POPULATE_THREADS] = {0};
    for (size_t i = 0; i < k; i++) {
        size_t a = i * piece < n ? i * piece : n;
        size_t b = (i + 1) * piece < n && i + 1 < k ? (i + 1) * piece : n;
        parts[i] = (struct populate_part){p + a, b - a};
        if (i > 0) started[i] = pthread_create(&th[i], NULL, populate_part, &parts[i]) == 0;
    }
    for (size_t i = 1; i < k; i++)
        if (!started[i]) populate_part(&parts[i]);
    populate_part(&parts[0]);
    for (size_t i = 1; i < k; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

static PyObject *Buffer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nbytes", "populate", NULL};
    Py_ssize_t n;
    int pop = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|$p:Buffer", kwlist, &n, &pop)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "Buffer size %zd is negative", n);
    BufferObject *self = (BufferObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    size_t align = ckptio_alignment();
    size_t cap = ((size_t)n + align - 1) / align * align;
    if (!cap) cap = align;
    if (pop) {
        /* Its own mapping, page-aligned, so that populating touches no neighbour. Not offered
         * to huge pages: on this kind of host their compaction cost seconds per GiB at
         * allocation, for copies no faster (the sources are small pages). */
        void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            Py_DECREF(self);
            return PyErr_Format(PyExc_MemoryError, "cannot map %zd bytes", n);
        }
        self->map = m;
        self->map_len = cap;
        self->data = m;
        self->len = n;
        Py_BEGIN_ALLOW_THREADS
        populate(m, cap);
        Py_END_ALLOW_THREADS
        return (PyObject *)self;
    }
    void *p = NULL;
    if (posix_memalign(&p, align, cap) != 0) {
        Py_DECREF(self);
        return PyErr_Format(PyExc_MemoryError, "cannot allocate %zd aligned bytes", n);
    }
    self->data = p;
    self->len = n;
    return (PyObject *)self;
}

PyObject *ckptio__pybuffer_adopt(void *base, Py_ssize_t len)
{
    BufferObject *self = (BufferObject *)Buffer_Type.tp_alloc(&Buffer_Type, 0);
    if (!self) return NULL;
    self->data = base;
    self->len = len;
    return (PyObject *)self;
}

static void Buffer_dealloc(BufferObject *self)
{
    if (self->map)
        munmap(self->map, self->map_len);
    else
        free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Buffer.copy_from(src, offset=0): memcpy with the GIL released, so copies on several threads
 * run in parallel. */
static PyObject *Buffer_copy_from(BufferObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"src", "offset", NULL};
    Py_buffer v;
    Py_ssize_t off = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|n:copy_from", kwlist, &v, &off)) return NULL;
    if (off < 0 || off > self->len || v.len > self->len - off) {
        PyErr_Format(PyExc_ValueError,
                     "copy_from: %zd bytes at offset %zd do not fit in a Buffer of %zd bytes",
                     v.len, off, self->len);
        PyBuffer_Release(&v);
        return NULL;
    }
    if (v.len >= 4096) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(self->data + off, v.buf, (size_t)v.len);
        Py_END_ALLOW_THREADS
    } else if (v.len) {
        memcpy(self->data + off, v.buf, (size_t)v.len);
    }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyMethodDef Buffer_methods[] = {
    {"copy_from", (PyCFunction)(void (*)(void))Buffer_copy_from, METH_VARARGS | METH_KEYWORDS,
     "copy_from(src, offset=0): copy the bytes of the C-contiguous buffer src into this one at "
     "offset, with the GIL released."},
    {NULL, NULL, 0, NULL},
};

static int Buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags)
{
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 0, flags) < 0) return -1;
    self->exports++;
    return 0;
}

static void Buffer_releasebuffer(BufferObject *self, Py_buffer *view)
{
    (void)view;
    self->exports--;
}

static PyBufferProcs Buffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)Buffer_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Buffer_releasebuffer,
};

static Py_ssize_t Buffer_length(BufferObject *self)
{
    return self->len;
}

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_length};

static PyObject *Buffer_address(BufferObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->data);
}

static PyGetSetDef Buffer_getset[] = {
    {"address", (getter)Buffer_address, NULL, "address of the first byte (page-aligned)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Buffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Buffer(nbytes, *, populate=False): uninitialized memory aligned to "
              "ckptio_alignment(), capacity rounded up to it. populate: fault every page in now "
              "(on a few threads) so that first writes into it do not page-fault.",
    .tp_new = Buffer_new,
    .tp_getset = Buffer_getset,
    .tp_methods = Buffer_methods,
};

int ckptio__pydst(PyObject *obj, Py_ssize_t off, Py_buffer *view, int *have_view, char **ptr,
                  Py_ssize_t *avail)
{
    char *base;
    Py_ssize_t len;
    *have_view = 0;
    if (Py_IS_TYPE(obj, &Buffer_Type)) {
        base = ((BufferObject *)obj)->data;
        len = ((BufferObject *)obj)->len;
        /* A Buffer's memory extends to the next alignment boundary: usable as scratch. */
        size_t a = ckptio_alignment();
        len = (Py_ssize_t)(((size_t)len + a - 1) / a * a);
    } else {
        if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
        *have_view = 1;
        base = view->buf;
        len = view->len;
    }
    if (off < 0 || off > len) {
        if (*have_view) PyBuffer_Release(view);
        *have_view = 0;
        PyErr_Format(PyExc_ValueError, "destination offset %zd outside a buffer of %zd bytes", off,
                     len);
        return -1;
    }
    *ptr = base + off;
    *avail = len - off;
    return 0;
}

int ckptio__pybuffer_register(PyObject *m)
{
    if (PyType_Ready(&Buffer_Type) < 0) return -1;
    return PyModule_AddObjectRef(m, "Buffer", (PyObject *)&Buffer_Type);
}

PyObject *ckptio__pylandings(ckptio_block *blocks, size_t nb, const ckptio_landing *land, size_t n)
{
    /* Each block is a Buffer from here on: it frees the memory. */
    size_t b = 0;
    PyObject *res = NULL, *bufs = PyList_New((Py_ssize_t)nb);
    for (; bufs && b < nb; b++) {
        PyObject *buf = ckptio__pybuffer_adopt(blocks[b].base, (Py_ssize_t)blocks[b].len);
        if (!buf) break;
        PyList_SET_ITEM(bufs, (Py_ssize_t)b, buf);
    }
    if (b == nb) res = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; res && i < n; i++) {
        const ckptio_landing *l = &land[i];
        PyObject *buf = l->block == CKPTIO_NO_BLOCK ? Py_None : PyList_GET_ITEM(bufs, l->block);
        PyObject *t = Py_BuildValue("(OKKK)", buf, (unsigned long long)l->at,
                                    (unsigned long long)l->capacity, (unsigned long long)l->lead);
        if (!t) Py_CLEAR(res);
        else PyList_SET_ITEM(res, (Py_ssize_t)i, t);
    }
    for (size_t k = b; k < nb; k++) ckptio_block_free(blocks[k].base);
    free(blocks);
    Py_XDECREF(bufs);
    return res;
}
