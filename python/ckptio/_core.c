/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core: the thin, private CPython binding of include/ckptio.h under the Python API. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"
#include "_comm.h"
#include "_st.h"
#include "_lazy.h"

/* ckptio._errors._from_code(code, name, message) -> exception instance; set at import. */
static PyObject *g_from_code;

/* Raise the ckptio.CheckpointError subclass for `code` carrying `msg` (the C context message). */
static PyObject *raise_code(int code, const char *msg)
{
    if (!msg || !msg[0]) msg = ckptio_strerror(code);
    PyObject *exc = PyObject_CallFunction(g_from_code, "iss", code, ckptio_errname(code), msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* The I/O parameters, passed by name in the dict ckptio._options.params() builds: (name, field
 * type, least and greatest value). Adding one is a line here and one in _options.py. */
#define PARAM_TABLE(X)                                                                             \
    X(io_threads, uint32_t, 0, UINT32_MAX)                                                         \
    X(queue_depth, uint32_t, 0, UINT32_MAX)                                                        \
    X(staging_bytes, uint64_t, 0, LLONG_MAX)                                                       \
    X(request_bytes, uint64_t, 0, LLONG_MAX)                                                       \
    X(backend, int, 0, INT_MAX)                                                                    \
    X(direct, int, -1, 1)                                                                          \
    X(fsync, int, -1, 1)                                                                           \
    X(checksums, int, -1, 1)                                                                       \
    X(overwrite, int, 0, 1)                                                                        \
    X(gpu, int, 0, 3)                                                                              \
    X(gpu_staging_bytes, uint64_t, 0, LLONG_MAX)                                                   \
    X(cache, int, 0, 2)                                                                            \
    X(verify_threads, uint32_t, 0, 64)

static int param_value(PyObject *d, const char *name, long long lo, long long hi, long long *out,
                       Py_ssize_t *seen)
{
    PyObject *v = PyDict_GetItemString(d, name);
    if (!v) return 0;
    (*seen)++;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < lo || x > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "I/O option %s = %lld is outside [%lld, %lld]", name, x, lo, hi);
        raise_code(CKPTIO_E_USAGE, msg);
        return -1;
    }
    *out = x;
    return 1;
}

/* `d`: None (the library's defaults) or {name: int} with names of PARAM_TABLE; absent ones
 * keep their defaults. */
static int parse_params(PyObject *d, ckptio_params *p)
{
    ckptio_params_init(p);
    if (d == NULL || d == Py_None) return 0;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "params must be a dict (ckptio._options.params())");
        return -1;
    }
    Py_ssize_t seen = 0;
    long long v;
    int rc;
#define X(name, type, lo, hi)                                                                      \
    if ((rc = param_value(d, #name, lo, hi, &v, &seen)) < 0) return -1;                            \
    if (rc) p->name = (type)v;
    PARAM_TABLE(X)
#undef X
    if (seen != PyDict_GET_SIZE(d)) {
        PyErr_Format(PyExc_TypeError, "params: unknown name in %R", d);
        return -1;
    }
    return 0;
}

/* Records handed to Python (struct sequences: tuples with named fields). */
static PyStructSequence_Field IOStats_fields[] = {
    {"bytes", "tensor bytes written or read"},
    {"io_bytes", "bytes transferred to or from the device"},
    {"tensors", "tensors (or chunks) written, or regions read"},
    {"seconds", "the library's time from open to commit or to the last read"},
    {"gbps", "bytes / seconds / 1e9"},
    {"backend", "the I/O path that ran"},
    {"direct", "whether O_DIRECT was used"},
    {"alignment", "file offset alignment of direct I/O"},
    {NULL, NULL},
};
static PyStructSequence_Desc IOStats_desc = {"ckptio._core.IOStats",
                                             "What one save or load did (ckptio_stats).",
                                             IOStats_fields, 8};
static PyTypeObject *IOStats_Type;

static PyStructSequence_Field TensorRecord_fields[] = {
    {"name", NULL}, {"dtype", "on-disk dtype code"}, {"shape", NULL},
    {"nbytes", NULL}, {"num_chunks", NULL}, {NULL, NULL},
};
static PyStructSequence_Desc TensorRecord_desc = {
    "ckptio._core.TensorRecord", "One stored tensor (ckptio_tensor_info).", TensorRecord_fields, 5};
static PyTypeObject *TensorRecord_Type;

static PyStructSequence_Field ChunkRecord_fields[] = {
    {"offset", NULL}, {"shape", NULL}, {"file", NULL}, {"file_offset", NULL},
    {"stored_bytes", NULL}, {"nbytes", NULL}, {NULL, NULL},
};
static PyStructSequence_Desc ChunkRecord_desc = {
    "ckptio._core.ChunkRecord", "One stored chunk (ckptio_chunk_info).", ChunkRecord_fields, 6};
static PyTypeObject *ChunkRecord_Type;

/* What Writer.add_many takes; Writer.add takes the same fields as arguments. */
enum { ADD_NAME, ADD_DTYPE, ADD_SHAPE, ADD_DATA, ADD_OFFSET, ADD_CHUNK_SHAPE, ADD_N };
static PyStructSequence_Field AddItem_fields[] = {
    {"name", "the tensor's name"},
    {"dtype", "on-disk dtype code"},
    {"shape", "the tensor's shape, or None for the data buffer's own"},
    {"data", "a C-contiguous buffer of the tensor's (or chunk's) bytes"},
    {"offset", "the chunk's offset in the tensor, or None"},
    {"chunk_shape", "the chunk's shape, or None"},
    {NULL, NULL},
};
static PyStructSequence_Desc AddItem_desc = {
    "ckptio._core.AddItem", "One tensor or chunk to write: AddItem((name, dtype, shape, data, "
    "offset, chunk_shape)).", AddItem_fields, ADD_N};
static PyTypeObject *AddItem_Type;

/* What Reader.read takes. */
enum { RD_TENSOR, RD_OFFSET, RD_SHAPE, RD_DST, RD_DST_OFFSET, RD_CAPACITY, RD_N };
static PyStructSequence_Field ReadRegion_fields[] = {
    {"tensor", "the tensor's index in Reader.tensors()"},
    {"offset", "the region's offset in the tensor, or None for all of it"},
    {"shape", "the region's shape, or None"},
    {"dst", "a writable buffer (a Buffer reads fastest)"},
    {"dst_offset", "where in dst the region lands"},
    {"capacity", "bytes of dst the read may use (the region's bytes, rounded up to the "
                 "alignment for in-place direct reads)"},
    {NULL, NULL},
};
static PyStructSequence_Desc ReadRegion_desc = {
    "ckptio._core.ReadRegion", "One region to read: ReadRegion((index, offset, shape, dst, "
    "dst_offset, capacity)).", ReadRegion_fields, RD_N};
static PyTypeObject *ReadRegion_Type;

static PyObject *stats_tuple(const ckptio_stats *s)
{
    PyObject *r = PyStructSequence_New(IOStats_Type);
    if (!r) return NULL;
    PyObject *v[8] = {
        PyLong_FromUnsignedLongLong(s->bytes), PyLong_FromUnsignedLongLong(s->io_bytes),
        PyLong_FromUnsignedLongLong(s->tensors), PyFloat_FromDouble(s->seconds),
        PyFloat_FromDouble(s->gbps), PyUnicode_FromString(s->backend),
        PyBool_FromLong(s->direct), PyLong_FromUnsignedLong(s->alignment),
    };
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        if (!v[i]) ok = 0;
        PyStructSequence_SetItem(r, i, v[i]);
    }
    if (!ok) Py_CLEAR(r);
    return r;
}

/* A record of type `tp` from `n` new references (stolen, NULL on a failed build). */
static PyObject *record(PyTypeObject *tp, PyObject **v, int n)
{
    PyObject *r = PyStructSequence_New(tp);
    int ok = r != NULL;
    for (int i = 0; i < n; i++) {
        if (!v[i]) ok = 0;
        if (r)
            PyStructSequence_SetItem(r, i, v[i]);
        else
            Py_XDECREF(v[i]);
    }
    if (!ok) Py_CLEAR(r);
    return r;
}

/* A tuple of ints -> uint64 dims of tensor `name`; returns ndim or -1 with an exception set.
 * `out` holds CKPTIO_MAX_NDIM values: a longer tuple is a LimitExceeded naming the tensor. */
static int parse_dims(PyObject *seq, uint64_t *out, const char *what, const char *name)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > CKPTIO_MAX_NDIM) {
        Py_DECREF(fast);
        char msg[CKPTIO_MAX_NAME + 160];
        snprintf(msg, sizeof msg, "tensor '%s': %s has %zd dimensions; ckptio allows at most %d",
                 name, what, n, CKPTIO_MAX_NDIM);
        raise_code(CKPTIO_E_LIMIT, msg);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(items[i]);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(fast);
    return (int)n;
}

static PyObject *dims_tuple(const uint64_t *d, uint32_t n)
{
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(d[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffer: page-aligned, writable, uninitialized memory that loads land in without a copy.     */
/* ------------------------------------------------------------------------------------------ */

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

/* Destination of a read: a Buffer (fast path) or any writable buffer, plus an offset. Fills
 * *ptr and *avail (bytes from ptr to the end); holds `view` if one was taken. */
static int get_dst(PyObject *obj, Py_ssize_t off, Py_buffer *view, int *have_view, char **ptr,
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

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ckptio_writer *w;
    int busy;
    /* Buffers handed to ckptio_writer_add stay exported (and their owners alive) until the
     * writer is closed: the header lets the library write aligned ones in place until commit. */
    Py_buffer *views;
    size_t n_views, cap_views;
} WriterObject;

static int busy_enter(int *busy, const char *what)
{
    if (*busy) {
        PyErr_Format(PyExc_RuntimeError, "%s is in use by another thread", what);
        return -1;
    }
    *busy = 1;
    return 0;
}

static int writer_check(WriterObject *self)
{
    if (!self->w) {
        PyErr_SetString(PyExc_ValueError, "writer is closed");
        return -1;
    }
    return busy_enter(&self->busy, "this writer");
}

static void writer_release_views(WriterObject *self)
{
    for (size_t i = 0; i < self->n_views; i++)
        PyBuffer_Release(&self->views[i]);
    PyMem_Free(self->views);
    self->views = NULL;
    self->n_views = self->cap_views = 0;
}

static void writer_close(WriterObject *self)
{
    ckptio_writer *w = self->w;
    self->w = NULL;
    if (w) {
        Py_BEGIN_ALLOW_THREADS
        ckptio_writer_close(w);
        Py_END_ALLOW_THREADS
    }
    writer_release_views(self);
}

static int Writer_init(WriterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "params", NULL};
    PyObject *path_obj = NULL, *params = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O:Writer", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &params))
        return -1;
    ckptio_params p;
    if (parse_params(params, &p) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    if (self->w) writer_close(self);
    const char *path = PyBytes_AS_STRING(path_obj);
    ckptio_writer *w = NULL;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_open(&w, path, &p);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc < 0) {
        raise_code(rc, msg);
        return -1;
    }
    self->w = w;
    return 0;
}

static void Writer_dealloc(WriterObject *self)
{
    writer_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int writer_fail(WriterObject *self, int rc)
{
    raise_code(rc, ckptio_writer_errmsg(self->w));
    return -1;
}

/* One parsed add(): everything the C call needs, so the GIL can be released around it. */
typedef struct {
    const char *name;
    int dtype;
    int ndim;
    int has_off, has_cshape;
    uint64_t shape[CKPTIO_MAX_NDIM], off[CKPTIO_MAX_NDIM], cshape[CKPTIO_MAX_NDIM];
    const void *data;
    uint64_t nbytes;
} add_item;

static int views_reserve(WriterObject *self, size_t more)
{
    if (self->n_views + more <= self->cap_views) return 0;
    size_t cap = self->cap_views ? self->cap_views * 2 : 64;
    while (cap < self->n_views + more)
        cap *= 2;
    Py_buffer *v = PyMem_Realloc(self->views, cap * sizeof *v);
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    self->views = v;
    self->cap_views = cap;
    return 0;
}

/* Parse an AddItem, or the arguments of add() (name, dtype, shape, data[, offset,
 * chunk_shape]), into *it, exporting data's buffer into the writer's view list. */
static int parse_add(WriterObject *self, PyObject *tup, add_item *it)
{
    if (!PyTuple_Check(tup) || (PyTuple_GET_SIZE(tup) != 4 && PyTuple_GET_SIZE(tup) != ADD_N)) {
        PyErr_SetString(PyExc_TypeError,
                        "add: expected (name, dtype, shape, data[, offset, chunk_shape])");
        return -1;
    }
    PyObject *name = PyTuple_GET_ITEM(tup, ADD_NAME), *shape = PyTuple_GET_ITEM(tup, ADD_SHAPE);
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "add: name must be a str");
        return -1;
    }
    it->name = PyUnicode_AsUTF8(name);
    if (!it->name) return -1;
    it->dtype = (int)PyLong_AsLong(PyTuple_GET_ITEM(tup, ADD_DTYPE));
    if (it->dtype == -1 && PyErr_Occurred()) return -1;
    it->ndim = 0;
    if (shape != Py_None && (it->ndim = parse_dims(shape, it->shape, "shape", it->name)) < 0)
        return -1;
    it->has_off = it->has_cshape = 0;
    if (PyTuple_GET_SIZE(tup) == ADD_N) {
        PyObject *o = PyTuple_GET_ITEM(tup, ADD_OFFSET), *c = PyTuple_GET_ITEM(tup, ADD_CHUNK_SHAPE);
        if (shape == Py_None && (o != Py_None || c != Py_None)) {
            char msg[CKPTIO_MAX_NAME + 80];
            snprintf(msg, sizeof msg, "tensor '%s': a chunk needs the tensor's shape", it->name);
            raise_code(CKPTIO_E_USAGE, msg);
            return -1;
        }
        if (o != Py_None) {
            int n = parse_dims(o, it->off, "chunk offset", it->name);
            if (n < 0) return -1;
            if (n != it->ndim) {
                PyErr_Format(PyExc_ValueError, "tensor '%s': chunk offset has %d dims, shape %d",
                             it->name, n, it->ndim);
                return -1;
            }
            it->has_off = 1;
        }
        if (c != Py_None) {
            int n = parse_dims(c, it->cshape, "chunk shape", it->name);
            if (n < 0) return -1;
            if (n != it->ndim) {
                PyErr_Format(PyExc_ValueError, "tensor '%s': chunk shape has %d dims, shape %d",
                             it->name, n, it->ndim);
                return -1;
            }
            it->has_cshape = 1;
        }
    }
    if (views_reserve(self, 1) < 0) return -1;
    Py_buffer *v = &self->views[self->n_views];
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(tup, ADD_DATA), v, PyBUF_C_CONTIGUOUS) < 0) {
        /* Name the tensor: "a bytes-like object is required" alone says nothing. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_TypeError, "tensor '%s': data is not a C-contiguous buffer (%S)",
                     it->name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    if (shape == Py_None) {
        if (v->ndim > CKPTIO_MAX_NDIM) {
            char msg[CKPTIO_MAX_NAME + 160];
            snprintf(msg, sizeof msg, "tensor '%s' has %d dimensions; ckptio allows at most %d",
                     it->name, v->ndim, CKPTIO_MAX_NDIM);
            PyBuffer_Release(v);
            raise_code(CKPTIO_E_LIMIT, msg);
            return -1;
        }
        it->ndim = v->ndim;
        for (int j = 0; j < v->ndim; j++)
            it->shape[j] = (uint64_t)v->shape[j];
    }
    self->n_views++;
    it->data = v->buf;
    it->nbytes = (uint64_t)v->len;
    return 0;
}

static int do_add(ckptio_writer *w, const add_item *it)
{
    return ckptio_writer_add(w, it->name, it->dtype, (uint32_t)it->ndim, it->shape,
                             it->has_off ? it->off : NULL, it->has_cshape ? it->cshape : NULL,
                             it->data, it->nbytes);
}

static PyObject *Writer_add(WriterObject *self, PyObject *args)
{
    if (writer_check(self) < 0) return NULL;
    add_item it;
    int rc = 0;
    if (parse_add(self, args, &it) < 0) goto out;
    Py_BEGIN_ALLOW_THREADS
    rc = do_add(self->w, &it);
    Py_END_ALLOW_THREADS
    if (rc < 0) writer_fail(self, rc);
out:
    self->busy = 0;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* Items are added in groups with the GIL released once per group; between groups pending
 * signals run, so Ctrl-C interrupts a long save within one group's time. */
#define GROUP_ITEMS 512
#define GROUP_BYTES (64ull << 20)

static PyObject *Writer_add_many(WriterObject *self, PyObject *seq)
{
    if (writer_check(self) < 0) return NULL;
    PyObject *fast = PySequence_Fast(seq, "add_many expects a sequence of tuples");
    add_item *group = NULL;
    if (!fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    group = PyMem_Malloc(sizeof *group * (size_t)(n < GROUP_ITEMS ? (n ? n : 1) : GROUP_ITEMS));
    if (!group) {
        PyErr_NoMemory();
        goto out;
    }
    if (views_reserve(self, (size_t)n) < 0) goto out;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t g = 0;
        uint64_t bytes = 0;
        while (i < n && g < GROUP_ITEMS && bytes < GROUP_BYTES) {
            if (parse_add(self, items[i], &group[g]) < 0) goto out;
            bytes += group[g].nbytes;
            g++, i++;
        }
        int rc = 0;
        Py_ssize_t done = 0;
        Py_BEGIN_ALLOW_THREADS
        for (; done < g; done++)
            if ((rc = do_add(self->w, &group[done])) < 0) break;
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            writer_fail(self, rc);
            goto out;
        }
        if (PyErr_CheckSignals() < 0) goto out;
    }
out:
    PyMem_Free(group);
    Py_XDECREF(fast);
    self->busy = 0;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* stage_arrays(d, prefix, ndarray, codes, names, first, items) -> (keys, values, children,
 * todo): the saver's loop over a dict, for the values that are numpy arrays (exact type
 * `ndarray`) of a dtype in `codes` exporting a C-contiguous buffer, seen for the first time.
 * Each such value at key path prefix + key is appended to `items` as AddItem(path, code, None,
 * array, None, None) and named in `names` and in `first` (the alias table, ckptio._adapters.
 * Aliases: id(array) -> path); children[i] = 0, the tree's plain-array leaf. Every other entry
 * (non-str keys, other values, paths already in `names`, arrays already in `first`) is left to
 * Python: its index goes to `todo` and children[i] is None. Python would spend a microsecond
 * per array here; this keeps saving 100,000 small arrays close to the C library's speed.
 * The keys and values are returned: children and todo refer to them, which Python uses in
 * place of the dict. */
static PyObject *mod_stage_arrays(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *d, *prefix, *ndarray, *codes, *names, *first, *items;
    if (!PyArg_ParseTuple(args, "O!UO!O!O!O!O!:stage_arrays", &PyDict_Type, &d, &prefix,
                          &PyType_Type, &ndarray, &PyDict_Type, &codes, &PySet_Type, &names,
                          &PyDict_Type, &first, &PyList_Type, &items))
        return NULL;
    /* An OrderedDict's own order, which Python's indices into `todo` refer to, is not the
     * order of its underlying dict: ask it through the mapping protocol. */
    int exact = PyDict_CheckExact(d);
    PyObject *keys = exact ? PyDict_Keys(d) : PyMapping_Keys(d);
    PyObject *vals = !keys ? NULL : exact ? PyDict_Values(d) : PyMapping_Values(d);
    if (vals && PyList_GET_SIZE(vals) != PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_RuntimeError, "stage_arrays: the dict changed size while read");
        Py_CLEAR(vals);
    }
    Py_ssize_t n = vals ? PyList_GET_SIZE(keys) : 0;
    PyObject *children = PyList_New(n), *todo = PyList_New(0), *zero = PyLong_FromLong(0);
    PyObject *dtype_name = PyUnicode_InternFromString("dtype");
    PyObject *result = NULL;
    if (!keys || !vals || !children || !todo || !zero || !dtype_name) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto out;
    }
    int plen = (int)PyUnicode_GET_LENGTH(prefix);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *val = PyList_GET_ITEM(vals, i);
        PyObject *path = NULL, *dtype = NULL, *id = NULL, *code;
        if (!PyUnicode_CheckExact(key) || !Py_IS_TYPE(val, (PyTypeObject *)ndarray)) goto python;
        path = plen ? PyUnicode_Concat(prefix, key) : Py_NewRef(key);
        if (!path) goto out;
        if (PyUnicode_GET_LENGTH(path) == 0) goto python; /* "" is the root's name: Python's */
        int known = PySet_Contains(names, path);
        if (known < 0) goto fail;
        if (known) goto python; /* a collision: Python raises the error */
        if (!(dtype = PyObject_GetAttr(val, dtype_name))) goto fail;
        if (!(code = PyDict_GetItemWithError(codes, dtype))) {
            if (PyErr_Occurred()) goto fail;
            goto python;
        }
        if (!(id = PyLong_FromVoidPtr(val))) goto fail;
        int again = PyDict_Contains(first, id);
        if (again < 0) goto fail;
        if (again) goto python; /* the same array again: Python's alias table decides */
        Py_buffer v;
        if (PyObject_GetBuffer(val, &v, PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear(); /* not C-contiguous: Python copies it */
            goto python;
        }
        int ndim = v.ndim;
        PyBuffer_Release(&v);
        if (ndim > CKPTIO_MAX_NDIM) { /* numpy allows up to 64 */
            PyObject *m = PyUnicode_FromFormat(
                "tensor '%U' has %d dimensions; ckptio allows at most %d: reshape it", path, ndim,
                CKPTIO_MAX_NDIM);
            const char *msg = m ? PyUnicode_AsUTF8(m) : NULL;
            if (msg) raise_code(CKPTIO_E_LIMIT, msg);
            Py_XDECREF(m);
            goto fail;
        }
        PyObject *f[ADD_N] = {Py_NewRef(path), Py_NewRef(code), Py_NewRef(Py_None),
                              Py_NewRef(val), Py_NewRef(Py_None), Py_NewRef(Py_None)};
        PyObject *item = record(AddItem_Type, f, ADD_N);
        int rc = item ? PyList_Append(items, item) : -1;
        Py_XDECREF(item);
        if (rc < 0 || PyDict_SetItem(first, id, path) < 0 || PySet_Add(names, path) < 0) goto fail;
        Py_DECREF(id);
        Py_DECREF(dtype);
        Py_DECREF(path);
        PyList_SET_ITEM(children, i, Py_NewRef(zero));
        continue;
    python:
        Py_XDECREF(id);
        Py_XDECREF(dtype);
        Py_XDECREF(path);
        {
            PyObject *idx = PyLong_FromSsize_t(i);
            int rc = idx ? PyList_Append(todo, idx) : -1;
            Py_XDECREF(idx);
            if (rc < 0) goto out;
        }
        PyList_SET_ITEM(children, i, Py_NewRef(Py_None));
        continue;
    fail:
        Py_XDECREF(id);
        Py_XDECREF(dtype);
        Py_XDECREF(path);
        goto out;
    }
    result = PyTuple_Pack(4, keys, vals, children, todo);
out: /* on error `children` may hold NULLs past i: list_dealloc accepts them */
    Py_XDECREF(keys);
    Py_XDECREF(vals);
    Py_XDECREF(children);
    Py_XDECREF(todo);
    Py_XDECREF(zero);
    Py_XDECREF(dtype_name);
    return result;
}

static PyObject *Writer_set_meta(WriterObject *self, PyObject *args)
{
    const char *key;
    Py_buffer val;
    if (!PyArg_ParseTuple(args, "sy*:set_meta", &key, &val)) return NULL;
    if (writer_check(self) < 0) {
        PyBuffer_Release(&val);
        return NULL;
    }
    int rc = ckptio_writer_set_meta(self->w, key, val.buf, (size_t)val.len);
    PyBuffer_Release(&val);
    self->busy = 0;
    if (rc < 0) {
        writer_fail(self, rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Writer_flush(WriterObject *self, PyObject *unused)
{
    (void)unused;
    if (writer_check(self) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_flush(self->w);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) {
        writer_fail(self, rc);
        return NULL;
    }
    writer_release_views(self); /* the header lets the caller reuse them now */
    Py_RETURN_NONE;
}

static PyObject *Writer_commit(WriterObject *self, PyObject *unused)
{
    (void)unused;
    if (writer_check(self) < 0) return NULL;
    int rc;
    ckptio_stats st;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_commit(self->w);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) {
        writer_fail(self, rc);
        return NULL;
    }
    ckptio_writer_stats(self->w, &st);
    /* The data is on the device: the sources may go now. */
    writer_release_views(self);
    return stats_tuple(&st);
}

static PyObject *Writer_stats(WriterObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->w) return PyErr_Format(PyExc_ValueError, "writer is closed");
    ckptio_stats st;
    ckptio_writer_stats(self->w, &st);
    return stats_tuple(&st);
}

static PyObject *Writer_close(WriterObject *self, PyObject *unused)
{
    (void)unused;
    if (busy_enter(&self->busy, "this writer") < 0) return NULL;
    writer_close(self);
    self->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *Writer_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *Writer_exit(WriterObject *self, PyObject *args)
{
    (void)args;
    return Writer_close(self, NULL);
}

static PyObject *Writer_closed(WriterObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->w == NULL);
}

/* Striping roots from a sequence of path-likes: *out holds their file system encodings (as
 * bytes objects in *keep, to release with Py_DECREF) for the length of the call. */
static int roots_arg(PyObject *seq, PyObject **keep, const char ***out, Py_ssize_t *n)
{
    *keep = PySequence_Fast(seq, "roots must be a sequence of paths");
    if (!*keep) return -1;
    *n = PySequence_Fast_GET_SIZE(*keep);
    PyObject *bytes = PyTuple_New(*n);
    *out = PyMem_Calloc((size_t)*n + 1, sizeof **out);
    if (!bytes || !*out) {
        Py_XDECREF(bytes);
        Py_CLEAR(*keep);
        PyMem_Free(*out);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(*keep, i), &b)) {
            Py_DECREF(bytes);
            Py_CLEAR(*keep);
            PyMem_Free(*out);
            return -1;
        }
        PyTuple_SET_ITEM(bytes, i, b);
        (*out)[i] = PyBytes_AS_STRING(b);
    }
    Py_SETREF(*keep, bytes);
    return 0;
}

/* Call a set_roots function with the roots of `seq`, the GIL released; `busy` is cleared
 * whatever happens. -1 with a Python error when seq is no sequence of paths. */
typedef int (*roots_fn)(void *handle, const char *const *roots, size_t n);
static int with_roots(PyObject *seq, roots_fn fn, void *handle, int *busy, int *rc)
{
    PyObject *keep;
    const char **roots;
    Py_ssize_t n;
    if (roots_arg(seq, &keep, &roots, &n) < 0) {
        *busy = 0;
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    *rc = fn(handle, roots, (size_t)n);
    Py_END_ALLOW_THREADS
    *busy = 0;
    PyMem_Free(roots);
    Py_DECREF(keep);
    return 0;
}

static int writer_roots(void *w, const char *const *roots, size_t n)
{
    return ckptio_writer_set_roots(w, roots, n);
}

static PyObject *Writer_set_roots(WriterObject *self, PyObject *seq)
{
    int rc = 0;
    if (writer_check(self) < 0 || with_roots(seq, writer_roots, self->w, &self->busy, &rc) < 0)
        return NULL;
    if (rc < 0) {
        writer_fail(self, rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"set_roots", (PyCFunction)Writer_set_roots, METH_O,
     "set_roots(paths): stripe the data over these directories too (before any add)"},
    {"add", (PyCFunction)Writer_add, METH_VARARGS,
     "add(name, dtype, shape, data[, offset, chunk_shape]): add one tensor or chunk"},
    {"add_many", (PyCFunction)Writer_add_many, METH_O,
     "add_many(items): add() for each AddItem, releasing the GIL once per group"},
    {"set_meta", (PyCFunction)Writer_set_meta, METH_VARARGS, "set_meta(key, value: bytes)"},
    {"flush", (PyCFunction)Writer_flush, METH_NOARGS,
     "wait until added buffers may be reused, and release them"},
    {"commit", (PyCFunction)Writer_commit, METH_NOARGS, "make durable and visible; IOStats"},
    {"stats", (PyCFunction)Writer_stats, METH_NOARGS, "IOStats so far"},
    {"close", (PyCFunction)Writer_close, METH_NOARGS, "release; aborts without a commit"},
    {"__enter__", (PyCFunction)Writer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Writer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Writer_getset[] = {
    {"closed", (getter)Writer_closed, NULL, "True once closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Writer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.Writer",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(path, params=None): a checkpoint being written (ckptio_writer).",
    .tp_methods = Writer_methods,
    .tp_getset = Writer_getset,
    .tp_init = (initproc)Writer_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ckptio_reader *r;
    int busy;
} ReaderObject;

static int reader_check(ReaderObject *self, int exclusive)
{
    if (!self->r) {
        raise_code(CKPTIO_E_STATE, "reader is closed");
        return -1;
    }
    return exclusive ? busy_enter(&self->busy, "this reader") : 0;
}

static int Reader_init(ReaderObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "params", NULL};
    PyObject *path_obj = NULL, *params = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O:Reader", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &params))
        return -1;
    ckptio_params p;
    if (parse_params(params, &p) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    ckptio_reader *r = NULL;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_open(&r, path, &p);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc < 0) {
        raise_code(rc, msg);
        return -1;
    }
    if (self->r) ckptio_reader_close(self->r);
    self->r = r;
    return 0;
}

static void Reader_dealloc(ReaderObject *self)
{
    ckptio_reader_close(self->r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* [TensorRecord(name, dtype, shape, nbytes, num_chunks), ...] in name order. */
static PyObject *Reader_tensors(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (reader_check(self, 0) < 0) return NULL;
    size_t n = ckptio_reader_num_tensors(self->r);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        int rc = ckptio_reader_tensor(self->r, i, &ti);
        if (rc < 0) {
            Py_DECREF(list);
            return raise_code(rc, ckptio_reader_errmsg(self->r));
        }
        PyObject *f[5] = {PyUnicode_FromString(ti.name), PyLong_FromLong(ti.dtype),
                          dims_tuple(ti.shape, ti.ndim), PyLong_FromUnsignedLongLong(ti.nbytes),
                          PyLong_FromUnsignedLongLong(ti.num_chunks)};
        PyObject *t = record(TensorRecord_Type, f, 5);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *Reader_find(ReaderObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:find", &name)) return NULL;
    if (reader_check(self, 0) < 0) return NULL;
    int64_t i = ckptio_reader_find(self->r, name);
    return PyLong_FromLongLong(i < 0 ? -1 : i);
}

/* [ChunkRecord(offset, shape, file, file_offset, stored_bytes, nbytes), ...] of tensor `index`. */
static PyObject *Reader_chunks(ReaderObject *self, PyObject *args)
{
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "n:chunks", &index)) return NULL;
    if (reader_check(self, 0) < 0) return NULL;
    ckptio_tensor_info ti = {.size = sizeof ti};
    int rc = index < 0 ? CKPTIO_E_NOT_FOUND : ckptio_reader_tensor(self->r, (size_t)index, &ti);
    if (rc < 0) return raise_code(rc, ckptio_reader_errmsg(self->r));
    PyObject *list = PyList_New((Py_ssize_t)ti.num_chunks);
    if (!list) return NULL;
    for (uint64_t c = 0; c < ti.num_chunks; c++) {
        ckptio_chunk_info ci;
        rc = ckptio_reader_chunk(self->r, (size_t)index, (size_t)c, &ci);
        if (rc < 0) {
            Py_DECREF(list);
            return raise_code(rc, ckptio_reader_errmsg(self->r));
        }
        PyObject *f[6] = {dims_tuple(ci.offset, ti.ndim), dims_tuple(ci.shape, ti.ndim),
                          PyUnicode_FromString(ci.file), PyLong_FromUnsignedLongLong(ci.file_offset),
                          PyLong_FromUnsignedLongLong(ci.stored_bytes),
                          PyLong_FromUnsignedLongLong(ci.nbytes)};
        PyObject *t = record(ChunkRecord_Type, f, 6);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)c, t);
    }
    return list;
}

static PyObject *Reader_meta(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (reader_check(self, 0) < 0) return NULL;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    size_t n = ckptio_reader_num_meta(self->r);
    for (size_t i = 0; i < n; i++) {
        const char *key;
        const void *val;
        size_t len;
        int rc = ckptio_reader_meta(self->r, i, &key, &val, &len);
        if (rc < 0) {
            Py_DECREF(d);
            return raise_code(rc, ckptio_reader_errmsg(self->r));
        }
        PyObject *v = PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
        if (!v || PyDict_SetItemString(d, key, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *Reader_get_meta(ReaderObject *self, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s:get_meta", &key)) return NULL;
    if (reader_check(self, 0) < 0) return NULL;
    const void *val;
    size_t len;
    int rc = ckptio_reader_get_meta(self->r, key, &val, &len);
    if (rc == CKPTIO_E_NOT_FOUND) Py_RETURN_NONE;
    if (rc < 0) return raise_code(rc, ckptio_reader_errmsg(self->r));
    return PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
}

/* read([ReadRegion, ...]): one ckptio_reader_read call for all regions, with the GIL
 * released. */
static PyObject *Reader_read(ReaderObject *self, PyObject *seq)
{
    if (reader_check(self, 1) < 0) return NULL;
    PyObject *fast = PySequence_Fast(seq, "read expects a sequence of regions");
    ckptio_region *regs = NULL;
    uint64_t *dims = NULL;
    Py_buffer *views = NULL;
    size_t n_views = 0;
    if (!fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    size_t nr = (size_t)(n ? n : 1);
    regs = PyMem_Calloc(nr, sizeof *regs);
    views = PyMem_Calloc(nr, sizeof *views);
    /* Offsets and shapes: allocated as needed in one array of 2 * ndim per region. */
    size_t n_dims = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != RD_N) {
            PyErr_SetString(
                PyExc_TypeError,
                "read: region must be (index, offset, shape, dst, dst_offset, capacity)");
            goto out;
        }
        if (PyTuple_GET_ITEM(t, RD_OFFSET) != Py_None || PyTuple_GET_ITEM(t, RD_SHAPE) != Py_None)
            n_dims += 2 * CKPTIO_MAX_NDIM;
    }
    dims = PyMem_Malloc(sizeof *dims * (n_dims ? n_dims : 1));
    if (!regs || !views || !dims) {
        PyErr_NoMemory();
        goto out;
    }
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        ckptio_region *rg = &regs[i];
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, RD_TENSOR));
        if (index == -1 && PyErr_Occurred()) goto out;
        if (index < 0) {
            PyErr_SetString(PyExc_ValueError, "read: tensor index is negative");
            goto out;
        }
        rg->size = sizeof *rg;
        rg->memory = CKPTIO_MEM_HOST;
        rg->name = NULL;
        rg->tensor = (size_t)index;
        PyObject *o = PyTuple_GET_ITEM(t, RD_OFFSET), *s = PyTuple_GET_ITEM(t, RD_SHAPE);
        if (o != Py_None || s != Py_None) {
            /* The library reads ndim values from each: a shorter tuple must not get there. */
            ckptio_tensor_info ti = {.size = sizeof ti};
            int rc = ckptio_reader_tensor(self->r, (size_t)index, &ti);
            if (rc < 0) {
                raise_code(rc, ckptio_reader_errmsg(self->r));
                goto out;
            }
            PyObject *dims_of[2] = {o, s};
            const char *what[2] = {"region offset", "region shape"};
            for (int k = 0; k < 2; k++) {
                if (dims_of[k] == Py_None) continue;
                int nd = parse_dims(dims_of[k], dims + used, what[k], ti.name);
                if (nd < 0) goto out;
                if ((uint32_t)nd != ti.ndim) {
                    char msg[CKPTIO_MAX_NAME + 160];
                    snprintf(msg, sizeof msg,
                             "%s: tensor '%s' has %u dimensions; the %s has %d values",
                             ckptio_reader_path(self->r), ti.name, ti.ndim, what[k], nd);
                    raise_code(CKPTIO_E_SHAPE, msg);
                    goto out;
                }
                if (k == 0)
                    rg->offset = dims + used;
                else
                    rg->shape = dims + used;
                used += CKPTIO_MAX_NDIM;
            }
        }
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, RD_DST_OFFSET));
        if (off == -1 && PyErr_Occurred()) goto out;
        unsigned long long cap = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, RD_CAPACITY));
        if (cap == (unsigned long long)-1 && PyErr_Occurred()) goto out;
        char *ptr;
        Py_ssize_t avail;
        int have_view;
        if (get_dst(PyTuple_GET_ITEM(t, RD_DST), off, &views[n_views], &have_view, &ptr, &avail) < 0)
            goto out;
        if (have_view) n_views++;
        if (cap > (unsigned long long)avail) {
            PyErr_Format(PyExc_ValueError,
                         "read: capacity %llu exceeds the %zd bytes left in the destination", cap,
                         avail);
            goto out;
        }
        rg->dst = ptr;
        rg->capacity = cap;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_read(self->r, regs, (size_t)n);
    Py_END_ALLOW_THREADS
    if (rc < 0) raise_code(rc, ckptio_reader_errmsg(self->r));
out:
    for (size_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(regs);
    PyMem_Free(dims);
    Py_XDECREF(fast);
    self->busy = 0;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Reader_verify(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (reader_check(self, 1) < 0) return NULL;
    uint64_t bad = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_verify(self->r, &bad);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_reader_errmsg(self->r));
    return PyLong_FromUnsignedLongLong(bad);
}

static PyObject *Reader_stats(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (reader_check(self, 0) < 0) return NULL;
    ckptio_stats st;
    ckptio_reader_stats(self->r, &st);
    return stats_tuple(&st);
}

/* read_stats() -> (cache_bytes, device_bytes, requests, merged, verify_threads) */
static PyObject *Reader_read_stats(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (reader_check(self, 0) < 0) return NULL;
    ckptio_read_stats st = {.size = sizeof st};
    ckptio_reader_read_stats(self->r, &st);
    return Py_BuildValue("(KKKKI)", (unsigned long long)st.cache_bytes,
                         (unsigned long long)st.device_bytes, (unsigned long long)st.requests,
                         (unsigned long long)st.merged, st.verify_threads);
}

static PyObject *Reader_close(ReaderObject *self, PyObject *unused)
{
    (void)unused;
    if (busy_enter(&self->busy, "this reader") < 0) return NULL;
    ckptio_reader *r = self->r;
    self->r = NULL;
    Py_BEGIN_ALLOW_THREADS
    ckptio_reader_close(r);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *Reader_exit(ReaderObject *self, PyObject *args)
{
    (void)args;
    return Reader_close(self, NULL);
}

static PyObject *Reader_closed(ReaderObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->r == NULL);
}

static PyObject *Reader_path(ReaderObject *self, void *closure)
{
    (void)closure;
    if (reader_check(self, 0) < 0) return NULL;
    return PyUnicode_DecodeFSDefault(ckptio_reader_path(self->r));
}

static int reader_roots(void *r, const char *const *roots, size_t n)
{
    return ckptio_reader_set_roots(r, roots, n);
}

static PyObject *Reader_set_roots(ReaderObject *self, PyObject *seq)
{
    int rc = 0;
    if (reader_check(self, 1) < 0 || with_roots(seq, reader_roots, self->r, &self->busy, &rc) < 0)
        return NULL;
    if (rc < 0) return raise_code(rc, ckptio_reader_errmsg(self->r));
    Py_RETURN_NONE;
}

static PyMethodDef Reader_methods[] = {
    {"set_roots", (PyCFunction)Reader_set_roots, METH_O,
     "set_roots(paths): look for a striped checkpoint's stripes in these directories"},
    {"tensors", (PyCFunction)Reader_tensors, METH_NOARGS,
     "[TensorRecord(name, dtype, shape, nbytes, num_chunks)] in name order"},
    {"find", (PyCFunction)Reader_find, METH_VARARGS, "find(name) -> index or -1"},
    {"chunks", (PyCFunction)Reader_chunks, METH_VARARGS,
     "chunks(index) -> [ChunkRecord(offset, shape, file, file_offset, stored_bytes, nbytes)]"},
    {"meta", (PyCFunction)Reader_meta, METH_NOARGS, "all metadata as {key: bytes}"},
    {"get_meta", (PyCFunction)Reader_get_meta, METH_VARARGS, "get_meta(key) -> bytes or None"},
    {"read", (PyCFunction)Reader_read, METH_O,
     "read([ReadRegion(index, offset, shape, dst, dst_offset, capacity)]): one batched read"},
    {"verify", (PyCFunction)Reader_verify, METH_NOARGS, "check every checksum"},
    {"stats", (PyCFunction)Reader_stats, METH_NOARGS, "IOStats"},
    {"read_stats", (PyCFunction)Reader_read_stats, METH_NOARGS,
     "(cache_bytes, device_bytes, requests, merged, verify_threads)"},
    {"close", (PyCFunction)Reader_close, METH_NOARGS, "release the reader"},
    {"__enter__", (PyCFunction)Writer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Reader_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"closed", (getter)Reader_closed, NULL, "True once closed", NULL},
    {"path", (getter)Reader_path, NULL, "the checkpoint directory", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Reader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.Reader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(path, params=None): a committed checkpoint open for reading.",
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
    .tp_init = (initproc)Reader_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */
/* FileWriter: a binary file object over ckptio_file_writer (for torch.save's zip archive)    */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ckptio_file_writer *f;
    int busy;
} FileWriterObject;

static int fw_check(FileWriterObject *self)
{
    if (!self->f) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on closed file");
        return -1;
    }
    return busy_enter(&self->busy, "this file");
}

static int FileWriter_init(FileWriterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "params", NULL};
    PyObject *path_obj = NULL, *params = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O:FileWriter", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &params))
        return -1;
    ckptio_params p;
    if (parse_params(params, &p) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    ckptio_file_writer *f = NULL;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_file_writer_open(&f, path, &p);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc < 0) {
        raise_code(rc, msg);
        return -1;
    }
    if (self->f) ckptio_file_writer_close(self->f);
    self->f = f;
    return 0;
}

static void FileWriter_dealloc(FileWriterObject *self)
{
    ckptio_file_writer_close(self->f);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FileWriter_write(FileWriterObject *self, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (fw_check(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    int rc;
    /* Even a small write may wait for a staging buffer to come back from the device. */
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_file_writer_write(self->f, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_file_writer_errmsg(self->f));
    if (len >= (64 << 20) && PyErr_CheckSignals() < 0) return NULL;
    return PyLong_FromSsize_t(len);
}

static PyObject *FileWriter_tell(FileWriterObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->f) return PyErr_Format(PyExc_ValueError, "I/O operation on closed file");
    return PyLong_FromUnsignedLongLong(ckptio_file_writer_tell(self->f));
}

/* seek(offset, whence=0): forward only. torch.save under torch.serialization.skip_data() seeks
 * over each storage instead of writing it; the gap is written as zeros, which is what a reader
 * of a file torch.save wrote with holes sees there. */
static PyObject *FileWriter_seek(FileWriterObject *self, PyObject *args)
{
    long long off;
    int whence = 0;
    if (!PyArg_ParseTuple(args, "L|i:seek", &off, &whence)) return NULL;
    if (fw_check(self) < 0) return NULL;
    uint64_t pos = ckptio_file_writer_tell(self->f);
    long long base;
    if (whence == 0)
        base = 0;
    else if (whence == 1 || whence == 2) /* written front to back: the end is the position */
        base = (long long)pos;
    else {
        self->busy = 0;
        return PyErr_Format(PyExc_ValueError, "invalid whence (%d, should be 0, 1 or 2)", whence);
    }
    if ((off > 0 && base > LLONG_MAX - off) || base + off < (long long)pos) {
        PyObject *io = PyImport_ImportModule("io");
        PyObject *exc = io ? PyObject_GetAttrString(io, "UnsupportedOperation") : NULL;
        Py_XDECREF(io);
        if (exc) {
            PyErr_Format(exc, "this file is written front to back: cannot seek from byte %llu "
                              "back to %lld", (unsigned long long)pos, base + off);
            Py_DECREF(exc);
        }
        self->busy = 0;
        return NULL;
    }
    uint64_t gap = (uint64_t)(base + off) - pos;
    static const char zeros[64 << 10];
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    while (gap && rc == 0) {
        size_t n = gap < sizeof zeros ? (size_t)gap : sizeof zeros;
        rc = ckptio_file_writer_write(self->f, zeros, n);
        gap -= n;
    }
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_file_writer_errmsg(self->f));
    return PyLong_FromUnsignedLongLong(ckptio_file_writer_tell(self->f));
}

static PyObject *FileWriter_flush(FileWriterObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->f) return PyErr_Format(PyExc_ValueError, "I/O operation on closed file");
    Py_RETURN_NONE; /* durability is commit's job */
}

static PyObject *FileWriter_commit(FileWriterObject *self, PyObject *unused)
{
    (void)unused;
    if (fw_check(self) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_file_writer_commit(self->f);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_file_writer_errmsg(self->f));
    ckptio_stats st;
    ckptio_file_writer_stats(self->f, &st);
    return stats_tuple(&st);
}

static PyObject *FileWriter_close(FileWriterObject *self, PyObject *unused)
{
    (void)unused;
    if (busy_enter(&self->busy, "this file") < 0) return NULL;
    ckptio_file_writer *f = self->f;
    self->f = NULL;
    Py_BEGIN_ALLOW_THREADS
    ckptio_file_writer_close(f);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *FileWriter_exit(FileWriterObject *self, PyObject *args)
{
    (void)args;
    return FileWriter_close(self, NULL);
}

static PyObject *ret_true(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    Py_RETURN_TRUE;
}

static PyObject *ret_false(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    Py_RETURN_FALSE;
}

static PyObject *FileWriter_closed(FileWriterObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->f == NULL);
}

static PyMethodDef FileWriter_methods[] = {
    {"write", (PyCFunction)FileWriter_write, METH_O,
     "write(b): append bytes (copied before returning); returns len(b)"},
    {"tell", (PyCFunction)FileWriter_tell, METH_NOARGS, "bytes written so far"},
    {"seek", (PyCFunction)FileWriter_seek, METH_VARARGS,
     "seek(offset, whence=0): forward only, the gap written as zeros; returns the position"},
    {"flush", (PyCFunction)FileWriter_flush, METH_NOARGS, "no-op: commit() makes the file durable"},
    {"commit", (PyCFunction)FileWriter_commit, METH_NOARGS,
     "make the file durable and visible at its path; stats tuple"},
    {"close", (PyCFunction)FileWriter_close, METH_NOARGS, "release; without commit, discard"},
    {"writable", (PyCFunction)ret_true, METH_NOARGS, NULL},
    {"readable", (PyCFunction)ret_false, METH_NOARGS, NULL},
    {"seekable", (PyCFunction)ret_false, METH_NOARGS, NULL},
    {"__enter__", (PyCFunction)Writer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)FileWriter_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FileWriter_getset[] = {
    {"closed", (getter)FileWriter_closed, NULL, "True once closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FileWriter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.FileWriter",
    .tp_basicsize = sizeof(FileWriterObject),
    .tp_dealloc = (destructor)FileWriter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FileWriter(path, params=None): a write-only binary file committed atomically.",
    .tp_methods = FileWriter_methods,
    .tp_getset = FileWriter_getset,
    .tp_init = (initproc)FileWriter_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------ */
/* Module functions                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* file_read(path, [(file_offset, length, dst, dst_offset)], params) -> stats tuple */
static PyObject *mod_file_read(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *seq, *params = Py_None, *result = NULL, *fast = NULL;
    ckptio_range *ranges = NULL;
    Py_buffer *views = NULL;
    size_t n_views = 0;
    if (!PyArg_ParseTuple(args, "O&O|O:file_read", PyUnicode_FSConverter, &path_obj, &seq, &params))
        return NULL;
    ckptio_params p;
    if (parse_params(params, &p) < 0) goto out;
    fast = PySequence_Fast(seq, "file_read expects a sequence of ranges");
    if (!fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    ranges = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ranges);
    views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    if (!ranges || !views) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long off, len;
        PyObject *dst;
        Py_ssize_t doff;
        if (!PyArg_ParseTuple(items[i], "KKOn;range must be (offset, length, dst, dst_offset)",
                              &off, &len, &dst, &doff))
            goto out;
        char *ptr;
        Py_ssize_t avail;
        int have_view;
        if (get_dst(dst, doff, &views[n_views], &have_view, &ptr, &avail) < 0) goto out;
        if (have_view) n_views++;
        if (len > (unsigned long long)avail) {
            PyErr_Format(PyExc_ValueError, "file_read: %llu bytes do not fit in %zd", len, avail);
            goto out;
        }
        ranges[i] = (ckptio_range){.size = sizeof(ckptio_range), .offset = off, .len = len,
                                   .dst = ptr};
    }
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_file_read(PyBytes_AS_STRING(path_obj), ranges, (size_t)n, &p, &st);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        raise_code(rc, msg);
        goto out;
    }
    result = stats_tuple(&st);
out:
    for (size_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(ranges);
    Py_XDECREF(fast);
    Py_XDECREF(path_obj);
    return result;
}

/* read_region(tensor, offset, shape, dst, dst_offset, capacity) -> ReadRegion: a load
 * builds one per tensor, and calling the type costs several times more. */
static PyObject *mod_read_region(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    (void)mod;
    if (n != RD_N) {
        PyErr_SetString(PyExc_TypeError,
                        "read_region(tensor, offset, shape, dst, dst_offset, capacity)");
        return NULL;
    }
    PyObject *r = PyStructSequence_New(ReadRegion_Type);
    if (!r) return NULL;
    for (Py_ssize_t i = 0; i < RD_N; i++)
        PyStructSequence_SetItem(r, i, Py_NewRef(args[i]));
    return r;
}

static PyObject *mod_describe_system(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *dir_obj = NULL;
    if (!PyArg_ParseTuple(args, "|O&:describe_system", PyUnicode_FSConverter, &dir_obj))
        return NULL;
    const char *dir = dir_obj ? PyBytes_AS_STRING(dir_obj) : NULL;
    char small[4096];
    int need;
    Py_BEGIN_ALLOW_THREADS
    need = ckptio_describe_system(dir, small, sizeof small);
    Py_END_ALLOW_THREADS
    PyObject *res;
    if (need < (int)sizeof small) {
        res = PyUnicode_FromString(small);
    } else {
        char *big = PyMem_Malloc((size_t)need + 1);
        if (!big) {
            Py_XDECREF(dir_obj);
            return PyErr_NoMemory();
        }
        ckptio_describe_system(dir, big, (size_t)need + 1);
        res = PyUnicode_FromString(big);
        PyMem_Free(big);
    }
    Py_XDECREF(dir_obj);
    return res;
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    (void)mod;
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    return Py_BuildValue("ss", ckptio_errname(code), ckptio_strerror(code));
}

static PyObject *mod_dtypes(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define X(name, value, text, size)                                                                 \
    do {                                                                                           \
        PyObject *v = Py_BuildValue("(ii)", value, (int)ckptio_dtype_size(value));                 \
        if (!v || PyDict_SetItemString(d, text, v) < 0) {                                          \
            Py_XDECREF(v);                                                                         \
            Py_DECREF(d);                                                                          \
            return NULL;                                                                           \
        }                                                                                          \
        Py_DECREF(v);                                                                              \
    } while (0);
    CKPTIO_DTYPE_TABLE(X)
#undef X
    return d;
}

/* {"CKPTIO_E_USAGE": -4001, ...}: the library's error table, so Python never restates it. */
static PyObject *mod_errors(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define X(name, value, text)                                                                       \
    do {                                                                                           \
        PyObject *v = PyLong_FromLong(value);                                                      \
        if (!v || PyDict_SetItemString(d, "CKPTIO_E_" #name, v) < 0) {                             \
            Py_XDECREF(v);                                                                         \
            Py_DECREF(d);                                                                          \
            return NULL;                                                                           \
        }                                                                                          \
        Py_DECREF(v);                                                                              \
    } while (0);
    CKPTIO_ERROR_TABLE(X)
#undef X
    return d;
}

/* One parsed save_dist item: its dims and buffer live here while the GIL is released. */
typedef struct {
    uint64_t shape[CKPTIO_MAX_NDIM], off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    Py_buffer view;
    int has_view;
} dist_slot;

static int dist_dims(PyObject *o, uint64_t *out, uint32_t ndim, const char *what, const char *name)
{
    int n = parse_dims(o, out, what, name);
    if (n < 0) return -1;
    if ((uint32_t)n != ndim) {
        PyErr_Format(PyExc_ValueError, "tensor '%s': %s has %d dims, shape %u", name, what, n,
                     ndim);
        return -1;
    }
    return 0;
}

/* save_dist(path, comm, items, meta, params, timeout) -> IOStats: ckptio_save_dist on the
 * communicator `comm` (a ckptio._comm.Communicator) with the GIL released. items: [(name,
 * dtype code, global shape, data (C-contiguous), offset or None, box or None, flags)], or for
 * an item in GPU memory the same with data the device pointer (int) followed by (nbytes,
 * CUstream, owner) (10 fields; the owner is not used here); meta:
 * [(key, bytes)] (used on rank 0 only). Collective: every rank calls it. */
static PyObject *mod_save_dist(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *comm_obj, *items, *meta, *params;
    double timeout;
    if (!PyArg_ParseTuple(args, "O&OOOOd:save_dist", PyUnicode_FSConverter, &path_obj, &comm_obj,
                          &items, &meta, &params, &timeout))
        return NULL;
    PyObject *result = NULL, *fitems = NULL, *fmeta = NULL;
    ckptio_dist_item *ds = NULL;
    dist_slot *slots = NULL;
    const char **mkeys = NULL;
    const void **mvals = NULL;
    size_t *mlens = NULL;
    Py_ssize_t n = 0, nm = 0;
    ckptio_comm *c = NULL;
    ckptio_params p;
    if (parse_params(params, &p) < 0) goto out;
    fitems = PySequence_Fast(items, "save_dist: items must be a sequence");
    fmeta = fitems ? PySequence_Fast(meta, "save_dist: meta must be a sequence") : NULL;
    if (!fmeta) goto out;
    n = PySequence_Fast_GET_SIZE(fitems);
    nm = PySequence_Fast_GET_SIZE(fmeta);
    ds = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ds);
    slots = PyMem_Calloc((size_t)(n ? n : 1), sizeof *slots);
    mkeys = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *mkeys);
    mvals = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *mvals);
    mlens = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *mlens);
    if (!ds || !slots || !mkeys || !mvals || !mlens) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(fitems, i);
        if (!PyTuple_Check(t) || (PyTuple_GET_SIZE(t) != 7 && PyTuple_GET_SIZE(t) != 10)) {
            PyErr_SetString(PyExc_TypeError, "save_dist: each item is (name, dtype, shape, data, "
                                             "offset, box, flags[, nbytes, stream, owner])");
            goto out;
        }
        ckptio_dist_item *d = &ds[i];
        dist_slot *s = &slots[i];
        d->size = sizeof *d;
        d->name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
        if (!d->name) goto out;
        d->dtype = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
        if (d->dtype == -1 && PyErr_Occurred()) goto out;
        int nd = parse_dims(PyTuple_GET_ITEM(t, 2), s->shape, "shape", d->name);
        if (nd < 0) goto out;
        d->ndim = (uint32_t)nd;
        d->shape = s->shape;
        if (PyTuple_GET_ITEM(t, 4) != Py_None) {
            if (dist_dims(PyTuple_GET_ITEM(t, 4), s->off, d->ndim, "offset", d->name) < 0) goto out;
            d->offset = s->off;
        }
        if (PyTuple_GET_ITEM(t, 5) != Py_None) {
            if (dist_dims(PyTuple_GET_ITEM(t, 5), s->box, d->ndim, "box", d->name) < 0) goto out;
            d->box = s->box;
        }
        unsigned long flags = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 6));
        if (flags == (unsigned long)-1 && PyErr_Occurred()) goto out;
        d->flags = (uint32_t)flags;
        if (PyTuple_GET_SIZE(t) == 10) { /* GPU memory: a device pointer, its size and stream */
            unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 3));
            unsigned long long nb = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 7));
            unsigned long long st = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 8));
            if (PyErr_Occurred()) goto out;
            d->data = (const void *)(uintptr_t)ptr;
            d->nbytes = nb;
            d->memory = CKPTIO_MEM_CUDA;
            d->stream = st;
            continue;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 3), &s->view, PyBUF_C_CONTIGUOUS) < 0) goto out;
        s->has_view = 1;
        d->data = s->view.buf;
        d->nbytes = (uint64_t)s->view.len;
    }
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *kv = PySequence_Fast_GET_ITEM(fmeta, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(kv, 1))) {
            PyErr_SetString(PyExc_TypeError, "save_dist: meta is [(str, bytes)]");
            goto out;
        }
        mkeys[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kv, 0));
        if (!mkeys[i]) goto out;
        mvals[i] = PyBytes_AS_STRING(PyTuple_GET_ITEM(kv, 1));
        mlens[i] = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(kv, 1));
    }
    c = ckptio__pycomm_new(comm_obj);
    if (!c) goto out;
    const char *path = PyBytes_AS_STRING(path_obj);
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_save_dist(path, c, ds, (size_t)n, mkeys, mvals, mlens, (size_t)nm, &p, timeout,
                          &st);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        ckptio__pycomm_raise(c, rc);
    else
        result = stats_tuple(&st);
out:
    if (c) ckptio_comm_free(c);
    for (Py_ssize_t i = 0; slots && i < n; i++)
        if (slots[i].has_view) PyBuffer_Release(&slots[i].view);
    PyMem_Free(ds);
    PyMem_Free(slots);
    PyMem_Free(mkeys);
    PyMem_Free(mvals);
    PyMem_Free(mlens);
    Py_XDECREF(fitems);
    Py_XDECREF(fmeta);
    Py_XDECREF(path_obj);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* GPU memory (doc/gpu.md): device pointers as ints, the caller's CUstream as an int            */
/* ------------------------------------------------------------------------------------------ */

static PyObject *gpu_stats_tuple(const ckptio_gpu_stats *g)
{
    return Py_BuildValue("(sKKKs)", g->path, (unsigned long long)g->device_bytes,
                         (unsigned long long)g->gds_bytes, (unsigned long long)g->staging_bytes,
                         g->reason);
}

/* gpu_add(writer, name, dtype, shape, offset, chunk_shape, ptr, nbytes, stream): one tensor
 * (or chunk: offset and chunk_shape not None) from GPU memory. */
static PyObject *mod_gpu_add(PyObject *mod, PyObject *args)
{
    (void)mod;
    WriterObject *self;
    const char *name;
    int dtype;
    PyObject *shape, *off_obj, *cs_obj;
    unsigned long long ptr, nbytes, stream;
    if (!PyArg_ParseTuple(args, "O!siOOOKKK:gpu_add", &Writer_Type, &self, &name, &dtype, &shape,
                          &off_obj, &cs_obj, &ptr, &nbytes, &stream))
        return NULL;
    uint64_t dims[CKPTIO_MAX_NDIM], off[CKPTIO_MAX_NDIM], cs[CKPTIO_MAX_NDIM];
    int ndim = parse_dims(shape, dims, "shape", name);
    if (ndim < 0) return NULL;
    if (off_obj != Py_None && parse_dims(off_obj, off, "chunk offset", name) != ndim)
        return PyErr_Occurred() ? NULL : raise_code(CKPTIO_E_USAGE, "gpu_add: offset rank");
    if (cs_obj != Py_None && parse_dims(cs_obj, cs, "chunk shape", name) != ndim)
        return PyErr_Occurred() ? NULL : raise_code(CKPTIO_E_USAGE, "gpu_add: chunk shape rank");
    if (writer_check(self) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_add_mem(self->w, name, dtype, (uint32_t)ndim, dims,
                               off_obj != Py_None ? off : NULL, cs_obj != Py_None ? cs : NULL,
                               (const void *)(uintptr_t)ptr, nbytes, CKPTIO_MEM_CUDA, stream);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_writer_errmsg(self->w));
    Py_RETURN_NONE;
}

/* gpu_read(reader, index, offset, shape, ptr, capacity, stream): one region into GPU memory. */
static PyObject *mod_gpu_read(PyObject *mod, PyObject *args)
{
    (void)mod;
    ReaderObject *self;
    Py_ssize_t index;
    PyObject *off_obj, *shape_obj;
    unsigned long long ptr, cap, stream;
    if (!PyArg_ParseTuple(args, "O!nOOKKK:gpu_read", &Reader_Type, &self, &index, &off_obj,
                          &shape_obj, &ptr, &cap, &stream))
        return NULL;
    uint64_t off[CKPTIO_MAX_NDIM], shp[CKPTIO_MAX_NDIM];
    if (off_obj != Py_None && parse_dims(off_obj, off, "region offset", "") < 0) return NULL;
    if (shape_obj != Py_None && parse_dims(shape_obj, shp, "region shape", "") < 0) return NULL;
    if (reader_check(self, 1) < 0) return NULL;
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .tensor = (size_t)index,
                         .offset = off_obj != Py_None ? off : NULL,
                         .shape = shape_obj != Py_None ? shp : NULL,
                         .dst = (void *)(uintptr_t)ptr, .capacity = cap, .stream = stream};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_read(self->r, &reg, 1);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc < 0) return raise_code(rc, ckptio_reader_errmsg(self->r));
    Py_RETURN_NONE;
}

/* gpu_stats(writer or reader) -> (path, device_bytes, gds_bytes, staging_bytes, reason) */
static PyObject *mod_gpu_stats(PyObject *mod, PyObject *obj)
{
    (void)mod;
    ckptio_gpu_stats g = {.size = sizeof g};
    int rc = CKPTIO_E_STATE;
    if (Py_IS_TYPE(obj, &Writer_Type) && ((WriterObject *)obj)->w)
        rc = ckptio_writer_gpu_stats(((WriterObject *)obj)->w, &g);
    else if (Py_IS_TYPE(obj, &Reader_Type) && ((ReaderObject *)obj)->r)
        rc = ckptio_reader_gpu_stats(((ReaderObject *)obj)->r, &g);
    if (rc < 0) return raise_code(rc, "gpu_stats: an open Writer or Reader is needed");
    return gpu_stats_tuple(&g);
}

/* gpu_probe(dir, params=None) -> (mode, why): the path GPU buffers would take. */
static PyObject *mod_gpu_probe(PyObject *mod, PyObject *args)
{
    (void)mod;
    const char *dir = NULL;
    PyObject *params = Py_None;
    if (!PyArg_ParseTuple(args, "|zO:gpu_probe", &dir, &params)) return NULL;
    ckptio_params p;
    if (parse_params(params, &p) < 0) return NULL;
    char why[1024];
    int mode;
    Py_BEGIN_ALLOW_THREADS
    mode = ckptio_gpu_probe(dir, &p, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (mode < 0) return raise_code(mode, why);
    return Py_BuildValue("(is)", mode, why);
}

static int leftovers_remove(void *path, const char *const *roots, size_t n)
{
    uint64_t found = 0;
    int rc = ckptio_stripe_leftovers(path, roots, n, 1, &found);
    return rc < 0 ? rc : found > INT32_MAX ? INT32_MAX : (int)found;
}

/* remove_stripes(path, roots): remove the stripes a save to `path` left in `roots` that the
 * checkpoint at `path` (if any) does not use: what pruning a striped step leaves. */
static PyObject *mod_remove_stripes(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *seq;
    if (!PyArg_ParseTuple(args, "O&O:remove_stripes", PyUnicode_FSConverter, &path_obj, &seq))
        return NULL;
    int busy = 1, rc = 0;
    int ok = with_roots(seq, leftovers_remove, PyBytes_AS_STRING(path_obj), &busy, &rc);
    Py_DECREF(path_obj);
    if (ok < 0) return NULL;
    if (rc < 0) return raise_code(rc, ckptio_last_error());
    return PyLong_FromLong(rc);
}

static PyMethodDef module_methods[] = {
    {"gpu_add", mod_gpu_add, METH_VARARGS,
     "gpu_add(writer, name, dtype, shape, offset, chunk_shape, ptr, nbytes, stream)"},
    {"gpu_read", mod_gpu_read, METH_VARARGS,
     "gpu_read(reader, index, offset, shape, ptr, capacity, stream): a region into GPU memory"},
    {"gpu_stats", mod_gpu_stats, METH_O,
     "gpu_stats(writer or reader) -> (path, device_bytes, gds_bytes, staging_bytes, reason)"},
    {"gpu_probe", mod_gpu_probe, METH_VARARGS, "gpu_probe(dir=None, params=None) -> (mode, why)"},
    {"remove_stripes", mod_remove_stripes, METH_VARARGS,
     "remove_stripes(path, roots) -> how many unused stripes of path were removed"},
    {"save_dist", mod_save_dist, METH_VARARGS,
     "save_dist(path, comm, items, meta, params, timeout) -> IOStats (collective)"},
    {"stage_arrays", mod_stage_arrays, METH_VARARGS,
     "stage_arrays(d, prefix, ndarray, codes, names, first, items) -> (keys, values, children, "
     "todo)"},
    {"read_region", (PyCFunction)(void (*)(void))mod_read_region, METH_FASTCALL,
     "read_region(tensor, offset, shape, dst, dst_offset, capacity) -> ReadRegion"},
    {"file_read", mod_file_read, METH_VARARGS,
     "file_read(path, [(offset, length, dst, dst_offset)], params=None) -> stats tuple"},
    {"describe_system", mod_describe_system, METH_VARARGS, "describe_system(dir=None) -> str"},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> (name, description)"},
    {"dtypes", mod_dtypes, METH_NOARGS, "{name: (code, itemsize)} of the library's dtypes"},
    {"errors", mod_errors, METH_NOARGS, "{name: code} of the library's CKPTIO_E_* codes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ckptio._core",
    .m_doc = "Private binding of libckptio; use the ckptio package instead.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *errors = PyImport_ImportModule("ckptio._errors");
    if (!errors) return NULL;
    g_from_code = PyObject_GetAttrString(errors, "_from_code");
    Py_DECREF(errors);
    if (!g_from_code) return NULL;
    if (PyType_Ready(&Buffer_Type) < 0 || PyType_Ready(&Writer_Type) < 0 ||
        PyType_Ready(&Reader_Type) < 0 || PyType_Ready(&FileWriter_Type) < 0)
        return NULL;
    struct {
        PyTypeObject **type;
        PyStructSequence_Desc *desc;
    } records[] = {{&IOStats_Type, &IOStats_desc},
                   {&TensorRecord_Type, &TensorRecord_desc},
                   {&ChunkRecord_Type, &ChunkRecord_desc},
                   {&AddItem_Type, &AddItem_desc},
                   {&ReadRegion_Type, &ReadRegion_desc}};
    for (size_t i = 0; i < sizeof records / sizeof records[0]; i++)
        if (!*records[i].type && !(*records[i].type = PyStructSequence_NewType(records[i].desc)))
            return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    static const char *const param_names[] = {
#define X(name, type, lo, hi) #name,
        PARAM_TABLE(X)
#undef X
    };
    const Py_ssize_t n_params = (Py_ssize_t)(sizeof param_names / sizeof param_names[0]);
    PyObject *names = PyTuple_New(n_params);
    for (Py_ssize_t i = 0; names && i < n_params; i++) {
        PyObject *v = PyUnicode_InternFromString(param_names[i]);
        if (!v) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, i, v);
    }
    int rc = names ? PyModule_AddObjectRef(m, "PARAMS", names) : -1;
    Py_XDECREF(names);
    if (rc < 0) {
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < sizeof records / sizeof records[0]; i++) {
        const char *dot = strrchr(records[i].desc->name, '.');
        if (PyModule_AddObjectRef(m, dot + 1, (PyObject *)*records[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddObjectRef(m, "Buffer", (PyObject *)&Buffer_Type) < 0 ||
        PyModule_AddObjectRef(m, "Writer", (PyObject *)&Writer_Type) < 0 ||
        PyModule_AddObjectRef(m, "Reader", (PyObject *)&Reader_Type) < 0 ||
        PyModule_AddObjectRef(m, "FileWriter", (PyObject *)&FileWriter_Type) < 0 ||
        PyModule_AddStringConstant(m, "version", ckptio_version_string()) < 0 ||
        PyModule_AddIntConstant(m, "format_version", (long)ckptio_format_version()) < 0 ||
        PyModule_AddIntConstant(m, "alignment", (long)ckptio_alignment()) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NDIM", CKPTIO_MAX_NDIM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NAME", CKPTIO_MAX_NAME) < 0 ||
        ckptio__pycomm_register(m) < 0 || ckptio__pyst_register(m) < 0 ||
        ckptio__pylazy_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
