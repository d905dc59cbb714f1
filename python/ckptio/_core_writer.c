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

/* Nested dicts deeper than this are left to Python (its recursion limit speaks for them). */
#define STAGE_MAX_DEPTH 64

/* What one stage_arrays call shares with its walk into nested dicts. */
typedef struct stage_ctx {
    PyObject *ndarray, *codes, *names, *first, *items, *todo;
    PyObject *zero, *dtype_name, *t_key, *k_key, *v_key, *dict_str, *dot;
} stage_ctx;

/* Stage exact numpy array `val` at `path` (a new reference, consumed); 1 if staged, 0 if it
 * is Python's, -1 on error. */
static int stage_array(stage_ctx *c, PyObject *val, PyObject *path)
{
    PyObject *dtype = NULL, *id = NULL, *code;
    int out = 0;
    if (PyUnicode_GET_LENGTH(path) == 0) goto done; /* "" is the root's name: Python's */
    int known = PySet_Contains(c->names, path);
    if (known) { /* a collision: Python raises the error */
        out = known < 0 ? -1 : 0;
        goto done;
    }
    if (!(dtype = PyObject_GetAttr(val, c->dtype_name))) goto fail;
    if (!(code = PyDict_GetItemWithError(c->codes, dtype))) {
        out = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (!(id = PyLong_FromVoidPtr(val))) goto fail;
    int again = PyDict_Contains(c->first, id);
    if (again) { /* the same array again: Python's alias table decides */
        out = again < 0 ? -1 : 0;
        goto done;
    }
    Py_buffer v;
    if (PyObject_GetBuffer(val, &v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear(); /* not C-contiguous: Python copies it */
        goto done;
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
    int rc = item ? PyList_Append(c->items, item) : -1;
    Py_XDECREF(item);
    if (rc < 0 || PyDict_SetItem(c->first, id, path) < 0 || PySet_Add(c->names, path) < 0)
        goto fail;
    out = 1;
    goto done;
fail:
    out = -1;
done:
    Py_XDECREF(id);
    Py_XDECREF(dtype);
    Py_DECREF(path);
    return out;
}

/* Stage dict `d`, whose entries' key paths start with `prefix`: *keys, *vals and *children
 * (new references) as stage_arrays returns them; nested exact dicts with str keys are walked
 * here too, each becoming its node {"t": "dict", "k": keys, "v": children}. */
static int stage_level(stage_ctx *c, PyObject *d, PyObject *prefix, int depth, PyObject **keys_out,
                       PyObject **vals_out, PyObject **children_out)
{
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
    PyObject *children = vals ? PyList_New(n) : NULL;
    if (!children) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *val = PyList_GET_ITEM(vals, i);
        PyObject *child = NULL;
        if (!PyUnicode_CheckExact(key)) goto python;
        if (Py_IS_TYPE(val, (PyTypeObject *)c->ndarray)) {
            PyObject *path = PyUnicode_GET_LENGTH(prefix) ? PyUnicode_Concat(prefix, key)
                                                          : Py_NewRef(key);
            int r = path ? stage_array(c, val, path) : -1;
            if (r < 0) goto fail;
            if (r == 0) goto python;
            child = Py_NewRef(c->zero);
        } else if (PyDict_CheckExact(val) && depth < STAGE_MAX_DEPTH) {
            PyObject *path = PyUnicode_Concat(prefix, key);
            if (!path) goto fail;
            if (PyUnicode_GET_LENGTH(path) == 0) { /* a dict at the root's path: Python's */
                Py_DECREF(path);
                goto python;
            }
            PyObject *sub = PyUnicode_Concat(path, c->dot);
            Py_DECREF(path);
            PyObject *k = NULL, *v = NULL, *ch = NULL;
            int r = sub ? stage_level(c, val, sub, depth + 1, &k, &v, &ch) : -1;
            Py_XDECREF(sub);
            if (r == 0) {
                child = PyDict_New();
                if (child && (PyDict_SetItem(child, c->t_key, c->dict_str) < 0 ||
                              PyDict_SetItem(child, c->k_key, k) < 0 ||
                              PyDict_SetItem(child, c->v_key, ch) < 0))
                    Py_CLEAR(child);
            }
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_XDECREF(ch);
            if (!child) goto fail;
        } else {
            goto python;
        }
        PyList_SET_ITEM(children, i, child);
        continue;
    python: {
        /* (children, index, key, value, prefix): Python visits it, as its own walk would */
        PyObject *idx = PyLong_FromSsize_t(i);
        PyObject *t = idx ? PyTuple_Pack(5, children, idx, key, val, prefix) : NULL;
        Py_XDECREF(idx);
        int rc = t ? PyList_Append(c->todo, t) : -1;
        Py_XDECREF(t);
        if (rc < 0) goto fail;
        PyList_SET_ITEM(children, i, Py_NewRef(Py_None));
    }
    }
    *keys_out = keys;
    *vals_out = vals;
    *children_out = children;
    return 0;
fail: /* `children` may hold NULLs past i: list_dealloc accepts them */
    Py_XDECREF(keys);
    Py_XDECREF(vals);
    Py_XDECREF(children);
    return -1;
}

/* stage_arrays(d, prefix, ndarray, codes, names, first, items) -> (keys, values, children,
 * todo): the saver's loop over a dict and the exact dicts with str keys nested in it, for the
 * values that are numpy arrays (exact type `ndarray`) of a dtype in `codes` exporting a
 * C-contiguous buffer, seen for the first time. Each such value at key path prefix + key is
 * appended to `items` as AddItem(path, code, None, array, None, None) and named in `names` and
 * in `first` (the alias table, ckptio.frameworks._registry.Aliases: id(array) -> path); its
 * child is 0, the tree's plain-array leaf; a nested dict's child is its node. Every other
 * entry (non-str keys, other values, paths already in `names`, arrays already in `first`) is
 * left to Python: `todo` lists (children, index, key, value, prefix), and the child is None
 * until Python visits it. Python would spend a microsecond per array here; this keeps saving
 * 100,000 small arrays close to the C library's speed, in one call for a tree of dicts. The
 * top dict's keys and values are returned: Python uses them in place of the dict. */
static PyObject *mod_stage_arrays(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *d, *prefix;
    stage_ctx c = {0};
    if (!PyArg_ParseTuple(args, "O!UO!O!O!O!O!:stage_arrays", &PyDict_Type, &d, &prefix,
                          &PyType_Type, &c.ndarray, &PyDict_Type, &c.codes, &PySet_Type,
                          &c.names, &PyDict_Type, &c.first, &PyList_Type, &c.items))
        return NULL;
    PyObject *result = NULL, *keys = NULL, *vals = NULL, *children = NULL;
    c.todo = PyList_New(0);
    c.zero = PyLong_FromLong(0);
    c.dtype_name = PyUnicode_InternFromString("dtype");
    c.t_key = PyUnicode_InternFromString("t");
    c.k_key = PyUnicode_InternFromString("k");
    c.v_key = PyUnicode_InternFromString("v");
    c.dict_str = PyUnicode_InternFromString("dict");
    c.dot = PyUnicode_InternFromString(".");
    if (!c.todo || !c.zero || !c.dtype_name || !c.t_key || !c.k_key || !c.v_key || !c.dict_str ||
        !c.dot)
        goto out;
    if (stage_level(&c, d, prefix, 0, &keys, &vals, &children) == 0)
        result = PyTuple_Pack(4, keys, vals, children, c.todo);
out:
    Py_XDECREF(keys);
    Py_XDECREF(vals);
    Py_XDECREF(children);
    Py_XDECREF(c.todo);
    Py_XDECREF(c.zero);
    Py_XDECREF(c.dtype_name);
    Py_XDECREF(c.t_key);
    Py_XDECREF(c.k_key);
    Py_XDECREF(c.v_key);
    Py_XDECREF(c.dict_str);
    Py_XDECREF(c.dot);
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
