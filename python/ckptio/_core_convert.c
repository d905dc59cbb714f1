/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.convert: the library's convert engine, with Python objects as source or sink. */
#include "_core.h"

#include <string.h>

/* A conversion's Python side. The engine runs with the GIL released; each callback takes it
 * back, calls the object, and on an exception keeps it (the first one) and fails the
 * conversion, so that _core.convert raises it again as it was: a ConvertError from a torch
 * source reaches the command with its own words. */
typedef struct {
    PyObject *src, *sink; /* the objects (borrowed), or NULL */
    PyObject *keep;       /* a list holding what the C arrays point into */
    ckptio_convert_tensor *tensors;
    ckptio_convert_meta *meta;
    size_t n_tensors, n_meta;
    PyObject *exc[3];     /* the first exception a callback raised: type, value, traceback */
} pyconv;

static int keep_exc(pyconv *c)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb); /* Python 3.11: no PyErr_GetRaisedException yet */
    if (!c->exc[0]) {
        c->exc[0] = t, c->exc[1] = v, c->exc[2] = tb;
    } else {
        Py_XDECREF(t);
        Py_XDECREF(v);
        Py_XDECREF(tb);
    }
    return CKPTIO_E_INTERRUPTED;
}

/* A memoryview over the engine's buffer for the length of one call: released after it, so an
 * object that kept it sees an error rather than bytes that changed. */
static PyObject *view(void *buf, size_t len, int flags)
{
    static char empty;
    return PyMemoryView_FromMemory(len ? buf : &empty, (Py_ssize_t)len, flags);
}

static void release(PyObject *mv)
{
    PyObject *r = PyObject_CallMethod(mv, "release", NULL);
    if (!r) PyErr_Clear(); /* still exported by the callee: it goes with the object */
    Py_XDECREF(r);
    Py_DECREF(mv);
}

static int src_list(void *ctx, const ckptio_convert_tensor **t, size_t *nt,
                    const ckptio_convert_meta **m, size_t *nm)
{
    pyconv *c = ctx;
    *t = c->tensors, *nt = c->n_tensors, *m = c->meta, *nm = c->n_meta;
    return 0;
}

/* obj.method(index, offset, memoryview of buf): a source's read, a sink's write. */
static int call_io(pyconv *c, PyObject *obj, const char *method, size_t index, uint64_t offset,
                   void *buf, size_t len, int flags)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    PyObject *mv = view(buf, len, flags), *r = NULL;
    if (mv) r = PyObject_CallMethod(obj, method, "nKO", (Py_ssize_t)index,
                                    (unsigned long long)offset, mv);
    if (!r || PyErr_CheckSignals() < 0) rc = keep_exc(c);
    Py_XDECREF(r);
    if (mv) release(mv);
    PyGILState_Release(g);
    return rc;
}

static int src_read(void *ctx, size_t index, uint64_t offset, void *buf, size_t len)
{
    pyconv *c = ctx;
    return call_io(c, c->src, "read", index, offset, buf, len, PyBUF_WRITE);
}

static PyObject *tensor_tuple(const ckptio_convert_tensor *t)
{
    return Py_BuildValue("(siN)", t->name, t->dtype, ckptio__pydims_tuple(t->shape, t->ndim));
}

static int sink_begin(void *ctx, const ckptio_convert_tensor *t, size_t nt,
                      const ckptio_convert_meta *m, size_t nm, const char *tmp_path)
{
    pyconv *c = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    PyObject *lst = PyList_New((Py_ssize_t)nt), *meta = PyDict_New(), *r = NULL;
    for (size_t i = 0; lst && i < nt; i++) {
        PyObject *x = tensor_tuple(&t[i]);
        if (!x) goto out;
        PyList_SET_ITEM(lst, (Py_ssize_t)i, x);
    }
    for (size_t i = 0; meta && i < nm; i++) {
        PyObject *v = PyBytes_FromStringAndSize(m[i].val, (Py_ssize_t)m[i].len);
        int bad = !v || PyDict_SetItemString(meta, m[i].key, v) < 0;
        Py_XDECREF(v);
        if (bad) goto out;
    }
    if (lst && meta) r = PyObject_CallMethod(c->sink, "begin", "OOs", lst, meta, tmp_path);
out:
    if (!r) rc = keep_exc(c);
    Py_XDECREF(r);
    Py_XDECREF(lst);
    Py_XDECREF(meta);
    PyGILState_Release(g);
    return rc;
}

static int sink_write(void *ctx, size_t index, uint64_t offset, const void *buf, size_t len)
{
    pyconv *c = ctx;
    /* read-only: the view is PyBUF_READ, the cast only fits the one signature */
    return call_io(c, c->sink, "write", index, offset, (void *)buf, len, PyBUF_READ);
}

static int sink_call(pyconv *c, const char *method)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(c->sink, method, NULL);
    int rc = r ? 0 : keep_exc(c);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

static int sink_end(void *ctx) { return sink_call(ctx, "end"); }
static void sink_abort(void *ctx) { sink_call(ctx, "abort"); }

/* source.tensors [(name, dtype, shape)] and source.metadata {str: bytes} into C arrays. */
static int parse_source(pyconv *c)
{
    PyObject *ts = PyObject_GetAttrString(c->src, "tensors");
    PyObject *fast = ts ? PySequence_Fast(ts, "source.tensors must be a sequence") : NULL;
    Py_XDECREF(ts);
    if (!fast) return -1;
    if (PyList_Append(c->keep, fast) < 0) return Py_DECREF(fast), -1;
    Py_DECREF(fast);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    c->tensors = PyMem_Calloc((size_t)n + 1, sizeof *c->tensors);
    if (!c->tensors) return PyErr_NoMemory(), -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        ckptio_convert_tensor *t = &c->tensors[i];
        PyObject *name, *shape;
        int dtype;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "UiO", &name, &dtype, &shape))
            return -1;
        t->size = sizeof *t;
        if (!(t->name = PyUnicode_AsUTF8(name))) return -1;
        int nd = ckptio__pydims(shape, t->shape, "shape", t->name);
        if (nd < 0) return -1;
        t->ndim = (uint32_t)nd, t->dtype = dtype;
        t->nbytes = ckptio_dtype_size(dtype);
        for (int d = 0; d < nd; d++)
            t->nbytes *= t->shape[d];
    }
    c->n_tensors = (size_t)n;
    PyObject *md = PyObject_GetAttrString(c->src, "metadata");
    PyObject *items = md ? PyMapping_Items(md) : NULL;
    Py_XDECREF(md);
    if (!items) return -1;
    if (PyList_Append(c->keep, items) < 0) return Py_DECREF(items), -1;
    Py_DECREF(items);
    n = PyList_GET_SIZE(items);
    c->meta = PyMem_Calloc((size_t)n + 1, sizeof *c->meta);
    if (!c->meta) return PyErr_NoMemory(), -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        ckptio_convert_meta *m = &c->meta[i];
        PyObject *key, *val;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(items, i), "US", &key, &val)) return -1;
        m->size = sizeof *m;
        if (!(m->key = PyUnicode_AsUTF8(key))) return -1;
        m->val = PyBytes_AS_STRING(val), m->len = (size_t)PyBytes_GET_SIZE(val);
    }
    c->n_meta = (size_t)n;
    return 0;
}

static int opt_int(PyObject *opts, const char *key, long long *out)
{
    PyObject *v = opts ? PyDict_GetItemString(opts, key) : NULL;
    if (!v || v == Py_None) return 0;
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int opt_format(PyObject *opts, const char *key, int *out)
{
    PyObject *v = opts ? PyDict_GetItemString(opts, key) : NULL;
    if (!v || v == Py_None) return 0;
    const char *s = PyUnicode_AsUTF8(v);
    if (!s) return -1;
    if ((*out = ckptio_convert_format_parse(s)) < 0) {
        PyErr_Format(PyExc_ValueError, "unknown format '%s'", s);
        return -1;
    }
    return 0;
}

/* convert(src, dst, opts, source=None, sink=None) -> (from, to, n_tensors, nbytes). */
static PyObject *mod_convert(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *src_b = NULL, *dst_b = NULL, *opts = NULL, *res = NULL;
    pyconv c = {0};
    if (!PyArg_ParseTuple(args, "O&O&O!|OO:convert", PyUnicode_FSConverter, &src_b,
                          PyUnicode_FSConverter, &dst_b, &PyDict_Type, &opts, &c.src, &c.sink))
        goto out;
    c.src = c.src == Py_None ? NULL : c.src;
    c.sink = c.sink == Py_None ? NULL : c.sink;
    ckptio_convert_args a = {.size = sizeof a, .src = PyBytes_AS_STRING(src_b),
                             .dst = PyBytes_AS_STRING(dst_b)};
    long long overwrite = 0, shard = 0, piece = 0, progress = 0, compress = 0;
    if (opt_format(opts, "from", &a.from) < 0 || opt_format(opts, "to", &a.to) < 0 ||
        opt_int(opts, "overwrite", &overwrite) < 0 || opt_int(opts, "max_shard_bytes", &shard) < 0 ||
        opt_int(opts, "piece_bytes", &piece) < 0 || opt_int(opts, "progress", &progress) < 0 ||
        opt_int(opts, "compress", &compress) < 0)
        goto out;
    /* an enum ckptio_compress: the engine refuses another value */
    a.compress = compress < 0 || compress > 2 ? -1 : (int)compress;
    /* src_store, dst_store: StoreOptions, kept alive by opts for the call */
    if (ckptio__pystore(PyDict_GetItemString(opts, "src_store"), &a.src_store) < 0 ||
        ckptio__pystore(PyDict_GetItemString(opts, "dst_store"), &a.dst_store) < 0)
        goto out;
    a.overwrite = overwrite != 0;
    a.max_shard_bytes = shard > 0 ? (uint64_t)shard : 0;
    a.piece_bytes = piece > 0 ? (uint64_t)piece : 0;
    a.flags = progress ? CKPTIO_CONVERT_PROGRESS : 0;
    if (!(c.keep = PyList_New(0))) goto out;
    ckptio_convert_source source = {.size = sizeof source, .ctx = &c, .list = src_list,
                                    .read = src_read};
    ckptio_convert_sink sink = {.size = sizeof sink, .ctx = &c, .begin = sink_begin,
                                .write = sink_write, .end = sink_end, .abort = sink_abort};
    if (c.src) {
        if (parse_source(&c) < 0) goto out;
        a.source = &source;
    }
    if (c.sink) {
        PyObject *d = PyObject_GetAttrString(c.sink, "is_dir");
        int is_dir = d ? PyObject_IsTrue(d) : -1;
        Py_XDECREF(d);
        if (is_dir < 0) goto out;
        sink.is_dir = is_dir;
        a.sink = &sink;
    }
    ckptio_convert_result r = {.size = sizeof r};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_convert(&a, &r);
    Py_END_ALLOW_THREADS
    if (c.exc[0]) {
        PyErr_Restore(c.exc[0], c.exc[1], c.exc[2]);
        c.exc[0] = c.exc[1] = c.exc[2] = NULL;
    } else if (rc < 0) {
        ckptio__pywhere where = {.path = NULL};
        ckptio__pyraise(rc, ckptio_last_error(), &where);
    } else {
        res = Py_BuildValue("(ssnK)", ckptio_convert_format_name(r.from),
                            ckptio_convert_format_name(r.to), (Py_ssize_t)r.n_tensors,
                            (unsigned long long)r.nbytes);
    }
out:
    for (int i = 0; i < 3; i++)
        Py_XDECREF(c.exc[i]);
    Py_XDECREF(c.keep);
    PyMem_Free(c.tensors);
    PyMem_Free(c.meta);
    Py_XDECREF(src_b);
    Py_XDECREF(dst_b);
    return res;
}

/* convert_detect(path, is_dst, sharded=False) -> format name. */
static PyObject *mod_convert_detect(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_b = NULL;
    int is_dst = 0, sharded = 0;
    if (!PyArg_ParseTuple(args, "O&p|p:convert_detect", PyUnicode_FSConverter, &path_b, &is_dst,
                          &sharded))
        return NULL;
    int f = ckptio_convert_detect(PyBytes_AS_STRING(path_b), is_dst, sharded);
    Py_DECREF(path_b);
    if (f < 0) return ckptio__pyraise(f, ckptio_last_error(), NULL);
    return PyUnicode_FromString(ckptio_convert_format_name(f));
}

static PyMethodDef convert_methods[] = {
    {"convert", mod_convert, METH_VARARGS,
     "convert(src, dst, opts, source=None, sink=None) -> (from, to, n_tensors, nbytes)"},
    {"convert_detect", mod_convert_detect, METH_VARARGS,
     "convert_detect(path, is_dst, sharded=False) -> format name"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyconvert_register(PyObject *m)
{
    return PyModule_AddFunctions(m, convert_methods);
}
