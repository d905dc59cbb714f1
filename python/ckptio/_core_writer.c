/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.Writer (ckptio_writer): adds tensors and chunks, with the GIL released per group. */
#include "_core.h"

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

typedef struct {
    ckptio__pyhandle base;
    /* Buffers handed to ckptio_writer_add stay exported (and their owners alive) until the
     * writer is flushed, committed or closed: the header lets the library write aligned ones in
     * place until then. */
    Py_buffer *views;
    size_t n_views, cap_views;
} WriterObject;

static void writer_release_views(ckptio__pyhandle *base)
{
    WriterObject *self = (WriterObject *)base;
    for (size_t i = 0; i < self->n_views; i++)
        PyBuffer_Release(&self->views[i]);
    PyMem_Free(self->views);
    self->views = NULL;
    self->n_views = self->cap_views = 0;
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
    if (shape != Py_None && (it->ndim = ckptio__pydims(shape, it->shape, "shape", it->name)) < 0)
        return -1;
    it->has_off = it->has_cshape = 0;
    if (PyTuple_GET_SIZE(tup) == ADD_N) {
        PyObject *o = PyTuple_GET_ITEM(tup, ADD_OFFSET);
        PyObject *c = PyTuple_GET_ITEM(tup, ADD_CHUNK_SHAPE);
        if (shape == Py_None && (o != Py_None || c != Py_None)) {
            char msg[CKPTIO_MAX_NAME + 80];
            snprintf(msg, sizeof msg, "tensor '%s': a chunk needs the tensor's shape", it->name);
            ckptio__pyraise(CKPTIO_E_USAGE, msg, &(ckptio__pywhere){.tensor = it->name});
            return -1;
        }
        it->has_off = o != Py_None;
        it->has_cshape = c != Py_None;
        if ((it->has_off &&
             ckptio__pydims_n(o, it->off, (uint32_t)it->ndim, "chunk offset", it->name) < 0) ||
            (it->has_cshape &&
             ckptio__pydims_n(c, it->cshape, (uint32_t)it->ndim, "chunk shape", it->name) < 0))
            return -1;
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
            ckptio__pyraise(CKPTIO_E_LIMIT, msg, &(ckptio__pywhere){.tensor = it->name});
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

static PyObject *Writer_add(PyObject *self, PyObject *args)
{
    ckptio_writer *w = ckptio__pyhandle_enter(self);
    if (!w) return NULL;
    add_item it;
    int rc = 0;
    if (parse_add((WriterObject *)self, args, &it) < 0) {
        ckptio__pyhandle_leave(self, 0, NULL);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = do_add(w, &it);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, it.name) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Items are added in groups with the GIL released once per group; between groups pending
 * signals run, so Ctrl-C interrupts a long save within one group's time. */
#define GROUP_ITEMS 512
#define GROUP_BYTES (64ull << 20)

static PyObject *Writer_add_many(PyObject *self, PyObject *seq)
{
    ckptio_writer *w = ckptio__pyhandle_enter(self);
    if (!w) return NULL;
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
    if (views_reserve((WriterObject *)self, (size_t)n) < 0) goto out;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t g = 0;
        uint64_t bytes = 0;
        while (i < n && g < GROUP_ITEMS && bytes < GROUP_BYTES) {
            if (parse_add((WriterObject *)self, items[i], &group[g]) < 0) goto out;
            bytes += group[g].nbytes;
            g++, i++;
        }
        int rc = 0;
        Py_ssize_t done = 0;
        Py_BEGIN_ALLOW_THREADS
        for (; done < g; done++)
            if ((rc = do_add(w, &group[done])) < 0) break;
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            ckptio__pyhandle_fail(self, rc, group[done].name);
            goto out;
        }
        if (PyErr_CheckSignals() < 0) goto out;
    }
out:
    PyMem_Free(group);
    Py_XDECREF(fast);
    ckptio__pyhandle_leave(self, 0, NULL);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The UTF-8 of str `s`, or NULL (and no exception) where it has none. */
static const char *msg_name(PyObject *s)
{
    const char *u = PyUnicode_AsUTF8(s);
    if (!u) PyErr_Clear();
    return u;
}

/* stage_arrays(d, prefix, ndarray, codes, names, first, items) -> (keys, values, children,
 * todo): the saver's loop over a dict, for the values that are numpy arrays (exact type
 * `ndarray`) of a dtype in `codes` exporting a C-contiguous buffer, seen for the first time.
 * Each such value at key path prefix + key is appended to `items` as AddItem(path, code, None,
 * array, None, None) and named in `names` and in `first` (the alias table, ckptio.frameworks._registry.
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
            ckptio__pywhere at = {.tensor = msg ? msg_name(path) : NULL};
            if (msg) ckptio__pyraise(CKPTIO_E_LIMIT, msg, &at);
            Py_XDECREF(m);
            goto fail;
        }
        PyObject *f[ADD_N] = {Py_NewRef(path), Py_NewRef(code), Py_NewRef(Py_None),
                              Py_NewRef(val), Py_NewRef(Py_None), Py_NewRef(Py_None)};
        PyObject *item = ckptio__pyrecord(AddItem_Type, f, ADD_N);
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

static PyObject *Writer_set_meta(PyObject *self, PyObject *args)
{
    const char *key;
    Py_buffer val;
    if (!PyArg_ParseTuple(args, "sy*:set_meta", &key, &val)) return NULL;
    ckptio_writer *w = ckptio__pyhandle_enter(self);
    int rc = w ? ckptio_writer_set_meta(w, key, val.buf, (size_t)val.len) : 0;
    PyBuffer_Release(&val);
    if (!w || ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Writer_flush(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_writer *w = ckptio__pyhandle_enter(self);
    if (!w) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_flush(w);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    writer_release_views((ckptio__pyhandle *)self); /* the header lets the caller reuse them now */
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"set_roots", ckptio__pyhandle_set_roots, METH_O,
     "set_roots(paths): stripe the data over these directories too (before any add)"},
    {"add", Writer_add, METH_VARARGS,
     "add(name, dtype, shape, data[, offset, chunk_shape]): add one tensor or chunk"},
    {"add_many", Writer_add_many, METH_O,
     "add_many(items): add() for each AddItem, releasing the GIL once per group"},
    {"set_meta", Writer_set_meta, METH_VARARGS, "set_meta(key, value: bytes)"},
    {"flush", Writer_flush, METH_NOARGS,
     "wait until added buffers may be reused, and release them"},
    {"commit", ckptio__pyhandle_commit, METH_NOARGS, "make durable and visible; IOStats"},
    {"stats", ckptio__pyhandle_stats, METH_NOARGS, "IOStats so far"},
    CKPTIO_PYHANDLE_METHODS("release; aborts without a commit"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Writer_getset[] = {
    CKPTIO_PYHANDLE_CLOSED,
    {NULL, NULL, NULL, NULL, NULL},
};

CKPTIO_PYHANDLE_OPS(writer)

static int writer_commit(void *w)
{
    return ckptio_writer_commit(w);
}

static int writer_set_roots(void *w, const char *const *roots, size_t n)
{
    return ckptio_writer_set_roots(w, roots, n);
}

ckptio__pyhandle_type ckptio__pyWriter_Type = {
    .type = CKPTIO_PYHANDLE_TYPE("ckptio._core.Writer", sizeof(WriterObject),
                                 "Writer(path, params=None): a checkpoint being written "
                                 "(ckptio_writer).",
                                 Writer_methods, Writer_getset),
    .noun = "this writer",
    .closed_msg = "writer is closed",
    .close_first = 1,
    .open = writer_open_any,
    .close = writer_close_any,
    .errmsg = writer_errmsg_any,
    .stats = writer_stats_any,
    .commit = writer_commit,
    .set_roots = writer_set_roots,
    .release = writer_release_views,
};

static PyMethodDef writer_functions[] = {
    {"stage_arrays", mod_stage_arrays, METH_VARARGS,
     "stage_arrays(d, prefix, ndarray, codes, names, first, items) -> (keys, values, children, "
     "todo)"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pywriter_register(PyObject *m)
{
    if (PyType_Ready(&ckptio__pyWriter_Type.type) < 0 ||
        PyModule_AddObjectRef(m, "Writer", (PyObject *)&ckptio__pyWriter_Type.type) < 0 ||
        ckptio__pyrecord_type(m, &AddItem_Type, &AddItem_desc) < 0)
        return -1;
    return PyModule_AddFunctions(m, writer_functions);
}
