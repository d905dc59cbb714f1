/* SPDX-License-Identifier: Apache-2.0 */
/* Values crossing the language line in ckptio._core: errors, params, dims, records, dtypes. */
#include "_core.h"

#include <limits.h>
#include <string.h>

/* ckptio._errors._from_code(code, name, message) -> exception; ckptio._errors.CheckpointError. */
static PyObject *g_from_code, *g_checkpoint_error;

/* A str from the library's UTF-8 (tensor names) or file-system bytes (paths); NULL for "". */
static PyObject *info_str(const char *s, int fs)
{
    if (!s || !s[0]) return NULL;
    PyObject *o = fs ? PyUnicode_DecodeFSDefault(s)
                     : PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
    if (!o) PyErr_Clear();
    return o;
}

/* Set `path`, `tensor`, `rank` on `exc` where `where` knows them, then what the library
 * recorded: `tensor`, `file`, `offset`, `rank`, `other_rank`, `refused`. The class says None
 * for the others. An attribute that cannot be set is left out: the error itself matters more. */
static void set_where(PyObject *exc, const ckptio__pywhere *where)
{
    if (!where) return;
    const ckptio_error_info *in = where->info;
    PyObject *tensor = info_str(in ? in->tensor : NULL, 0);
    if (!tensor) tensor = info_str(where->tensor, 0);
    PyObject *file = info_str(in ? in->file : NULL, 1);
    PyObject *rank = in && in->rank >= 0 ? PyLong_FromLong(in->rank) : Py_XNewRef(where->rank);
    PyObject *other = in && in->other_rank >= 0 ? PyLong_FromLong(in->other_rank) : NULL;
    PyObject *offset = in && in->offset != CKPTIO_ERROR_NO_OFFSET
                           ? PyLong_FromUnsignedLongLong(in->offset)
                           : NULL;
    PyObject *refused = in && (in->flags & CKPTIO_ERROR_REFUSED) ? Py_NewRef(Py_True) : NULL;
    if (PyErr_Occurred()) PyErr_Clear(); /* a number that could not be made: left out */
    const struct {
        const char *name;
        PyObject *value;
    } attrs[] = {{"path", where->path}, {"tensor", tensor},      {"rank", rank},
                 {"file", file},        {"other_rank", other},   {"offset", offset},
                 {"refused", refused}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if (attrs[i].value && PyObject_SetAttrString(exc, attrs[i].name, attrs[i].value) < 0)
            PyErr_Clear();
    Py_XDECREF(tensor);
    Py_XDECREF(file);
    Py_XDECREF(rank);
    Py_XDECREF(other);
    Py_XDECREF(offset);
    Py_XDECREF(refused);
}

/* The thread's last error as values when it is the failure being raised (code and text). */
static const ckptio_error_info *last_info(int code, const char *msg, ckptio_error_info *buf)
{
    buf->size = sizeof *buf;
    if (ckptio_last_error_info(buf) < 0 || buf->code != code || !msg) return NULL;
    return strcmp(msg, ckptio_last_error()) == 0 ? buf : NULL;
}

PyObject *ckptio__pyraise(int code, const char *msg, const ckptio__pywhere *where)
{
    ckptio__pywhere w = where ? *where : (ckptio__pywhere){0};
    ckptio_error_info *buf = w.info ? NULL : PyMem_Malloc(sizeof *buf); /* ~8 KiB */
    if (buf) w.info = last_info(code, msg, buf);
    if (!msg || !msg[0]) msg = ckptio_strerror(code);
    PyObject *exc = PyObject_CallFunction(g_from_code, "iss", code, ckptio_errname(code), msg);
    if (exc) {
        set_where(exc, &w);
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    PyMem_Free(buf);
    return NULL;
}

void ckptio__pyerr_locate(const ckptio__pywhere *where)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    if (exc && PyObject_TypeCheck(exc, (PyTypeObject *)g_checkpoint_error)) set_where(exc, where);
    PyErr_SetRaisedException(exc);
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (exc && PyObject_TypeCheck(exc, (PyTypeObject *)g_checkpoint_error)) set_where(exc, where);
    PyErr_Restore(type, exc, tb);
#endif
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
    X(verify_threads, uint32_t, 0, 64)                                                         \
    X(compress, int, 0, 2)

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
        ckptio__pyraise(CKPTIO_E_USAGE, msg, NULL);
        return -1;
    }
    *out = x;
    return 1;
}

int ckptio__pyparams(PyObject *d, ckptio_params *p)
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
    /* base: a path (str), kept alive by the dict for the call that uses these params. */
    PyObject *base = PyDict_GetItemString(d, "base");
    if (base && base != Py_None) {
        if (!PyUnicode_Check(base)) {
            PyErr_SetString(PyExc_TypeError, "params: base must be a str path");
            return -1;
        }
        if (!(p->base = PyUnicode_AsUTF8(base))) return -1;
    }
    if (base) seen++;
    /* store: a StoreOptions, kept alive by the dict for the call that uses these params. */
    PyObject *store = PyDict_GetItemString(d, "store");
    if (store && ckptio__pystore(store, &p->store) < 0) return -1;
    if (store) seen++;
    if (seen != PyDict_GET_SIZE(d)) {
        PyErr_Format(PyExc_TypeError, "params: unknown name in %R", d);
        return -1;
    }
    return 0;
}

/* The tuple of the names a params dict may hold (ckptio._core.PARAMS). */
static PyObject *param_names(void)
{
    static const char *const names[] = {
#define X(name, type, lo, hi) #name,
        PARAM_TABLE(X)
#undef X
    };
    const Py_ssize_t n = (Py_ssize_t)(sizeof names / sizeof names[0]);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *v = PyUnicode_InternFromString(names[i]);
        if (!v)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

int ckptio__pydims(PyObject *seq, uint64_t *out, const char *what, const char *name)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > CKPTIO_MAX_NDIM) {
        Py_DECREF(fast);
        char msg[CKPTIO_MAX_NAME + 160];
        snprintf(msg, sizeof msg, "tensor '%s': %s has %zd dimensions; ckptio allows at most %d",
                 name, what, n, CKPTIO_MAX_NDIM);
        ckptio__pyraise(CKPTIO_E_LIMIT, msg, &(ckptio__pywhere){.tensor = name});
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

int ckptio__pydims_n(PyObject *seq, uint64_t *out, uint32_t ndim, const char *what,
                     const char *name)
{
    int n = ckptio__pydims(seq, out, what, name);
    if (n < 0) return -1;
    if ((uint32_t)n != ndim) {
        PyErr_Format(PyExc_ValueError, "tensor '%s': %s has %d dims, shape %u", name, what, n,
                     ndim);
        return -1;
    }
    return 0;
}

PyObject *ckptio__pydims_tuple(const uint64_t *d, uint32_t n)
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

PyObject *ckptio__pyrecord(PyTypeObject *tp, PyObject **v, int n)
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

int ckptio__pyrecord_type(PyObject *m, PyTypeObject **tp, PyStructSequence_Desc *desc)
{
    if (!*tp && !(*tp = PyStructSequence_NewType(desc))) return -1;
    if (!m) return 0;
    const char *dot = strrchr(desc->name, '.');
    return PyModule_AddObjectRef(m, dot ? dot + 1 : desc->name, (PyObject *)*tp);
}

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

PyObject *ckptio__pystats(const ckptio_stats *s)
{
    PyObject *v[8] = {
        PyLong_FromUnsignedLongLong(s->bytes), PyLong_FromUnsignedLongLong(s->io_bytes),
        PyLong_FromUnsignedLongLong(s->tensors), PyFloat_FromDouble(s->seconds),
        PyFloat_FromDouble(s->gbps), PyUnicode_FromString(s->backend),
        PyBool_FromLong(s->direct), PyLong_FromUnsignedLong(s->alignment),
    };
    return ckptio__pyrecord(IOStats_Type, v, 8);
}

int ckptio__pyroots_get(PyObject *seq, ckptio__pyroots *out)
{
    memset(out, 0, sizeof *out);
    PyObject *fast = PySequence_Fast(seq, "roots must be a sequence of paths");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    out->keep = PyTuple_New(n);
    out->roots = PyMem_Calloc((size_t)n + 1, sizeof *out->roots);
    if (!out->keep || !out->roots) {
        Py_DECREF(fast);
        ckptio__pyroots_free(out);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &b)) {
            Py_DECREF(fast);
            ckptio__pyroots_free(out);
            return -1;
        }
        PyTuple_SET_ITEM(out->keep, i, b);
        out->roots[i] = PyBytes_AS_STRING(b);
    }
    Py_DECREF(fast);
    out->n = (size_t)n;
    return 0;
}

void ckptio__pyroots_free(ckptio__pyroots *r)
{
    Py_CLEAR(r->keep);
    PyMem_Free(r->roots);
    r->roots = NULL;
    r->n = 0;
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    (void)mod;
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    return Py_BuildValue("ss", ckptio_errname(code), ckptio_strerror(code));
}

/* d[key] = v, v a new reference (stolen, NULL on a failed build). 0, or -1 with d released. */
static int dict_put(PyObject *d, const char *key, PyObject *v)
{
    int rc = v ? PyDict_SetItemString(d, key, v) : -1;
    Py_XDECREF(v);
    if (rc < 0) Py_DECREF(d);
    return rc;
}

/* {"CKPTIO_E_USAGE": -4001, ...}: the library's error table, so Python never restates it. */
static PyObject *mod_errors(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define X(name, value, text)                                                                       \
    if (dict_put(d, "CKPTIO_E_" #name, PyLong_FromLong(value)) < 0) return NULL;
    CKPTIO_ERROR_TABLE(X)
#undef X
    return d;
}

/* {name: (code, itemsize)} of the library's dtypes. */
static PyObject *mod_dtypes(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define X(name, value, text, size)                                                                 \
    if (dict_put(d, text, Py_BuildValue("(ii)", value, (int)ckptio_dtype_size(value))) < 0)       \
        return NULL;
    CKPTIO_DTYPE_TABLE(X)
#undef X
    return d;
}

static PyMethodDef values_methods[] = {
    {"strerror", mod_strerror, METH_O, "strerror(code) -> (name, description)"},
    {"errors", mod_errors, METH_NOARGS, "{name: code} of the library's CKPTIO_E_* codes"},
    {"dtypes", mod_dtypes, METH_NOARGS, "{name: (code, itemsize)} of the library's dtypes"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyvalues_register(PyObject *m)
{
    if (!g_from_code) {
        PyObject *errors = PyImport_ImportModule("ckptio._errors");
        if (!errors) return -1;
        g_from_code = PyObject_GetAttrString(errors, "_from_code");
        g_checkpoint_error = PyObject_GetAttrString(errors, "CheckpointError");
        Py_DECREF(errors);
        if (!g_from_code || !g_checkpoint_error) {
            Py_CLEAR(g_from_code);
            Py_CLEAR(g_checkpoint_error);
            return -1;
        }
    }
    PyObject *names = param_names();
    int rc = names ? PyModule_AddObjectRef(m, "PARAMS", names) : -1;
    Py_XDECREF(names);
    if (rc < 0 || ckptio__pyrecord_type(m, &IOStats_Type, &IOStats_desc) < 0) return -1;
    return PyModule_AddFunctions(m, values_methods);
}
