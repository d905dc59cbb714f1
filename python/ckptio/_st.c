/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's safetensors functions: the C header parser and encoder, for ckptio.safetensors. */
#include "_st.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"

/* Raise the ckptio.CheckpointError for `code` with `msg` (ckptio._errors._from_code). */
static PyObject *st_raise(int code, const char *msg)
{
    if (code == -ENOMEM && !msg[0]) return PyErr_NoMemory();
    PyObject *mod = PyImport_ImportModule("ckptio._errors");
    PyObject *exc = NULL;
    if (mod) {
        exc = PyObject_CallMethod(mod, "_from_code", "iss", code, ckptio_errname(code),
                                  msg[0] ? msg : ckptio_strerror(code));
        Py_DECREF(mod);
    }
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *st_str(const char *s, uint64_t n)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict"); /* the parser checked UTF-8 */
}

/* st_parse(header, file_size, declared=len(header)) -> ([(name, dtype, code, shape, begin,
 * end)] in file order, {key: value} or None). `declared` is the length word of the file: when
 * the caller could not read that many bytes, the parser's length checks explain why. */
static PyObject *mod_st_parse(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer hdr;
    unsigned long long file_size, declared = ULLONG_MAX;
    if (!PyArg_ParseTuple(args, "y*K|K:st_parse", &hdr, &file_size, &declared)) return NULL;
    uint64_t n = declared == ULLONG_MAX ? (uint64_t)hdr.len : declared;
    char err[512] = "";
    ckptio_st_header *h = NULL;
    int rc;
    if (n > (uint64_t)hdr.len && n <= CKPTIO_ST_MAX_HEADER && file_size >= 8 &&
        n <= file_size - 8) {
        rc = CKPTIO_E_CORRUPT; /* the file shrank under the caller */
        snprintf(err, sizeof err,
                 "safetensors header of %llu bytes ends after the file's %zd readable bytes: "
                 "the file is truncated",
                 (unsigned long long)n, hdr.len);
    } else if (n > (uint64_t)hdr.len) {
        /* A length the parser refuses before it reads a byte of the header. */
        static const uint8_t none[1] = {0};
        rc = ckptio_st_parse(none, n, file_size, &h, err, sizeof err);
        assert(rc < 0);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = ckptio_st_parse(hdr.buf, n, file_size, &h, err, sizeof err);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&hdr);
    if (rc < 0) return st_raise(rc, err);
    PyObject *tensors = PyList_New((Py_ssize_t)h->n_tensors), *meta = NULL, *out = NULL;
    for (uint64_t i = 0; tensors && i < h->n_tensors; i++) {
        const ckptio_st_tensor *t = &h->tensors[i];
        PyObject *shape = PyTuple_New(t->ndim);
        for (uint32_t k = 0; shape && k < t->ndim; k++) {
            PyObject *d = PyLong_FromUnsignedLongLong(h->dims[t->dims + k]);
            if (!d) Py_CLEAR(shape);
            else PyTuple_SET_ITEM(shape, k, d);
        }
        PyObject *name = shape ? st_str(h->strtab + t->name, t->name_len) : NULL;
        PyObject *rec = name ? Py_BuildValue("(NsiNKK)", name,
                                             ckptio_st_dtype_name((int)t->st_dtype), t->dtype,
                                             shape, (unsigned long long)t->begin,
                                             (unsigned long long)t->end)
                             : NULL;
        if (!rec) {
            if (!name) Py_XDECREF(shape);
            Py_CLEAR(tensors);
            break;
        }
        PyList_SET_ITEM(tensors, (Py_ssize_t)i, rec);
    }
    if (tensors && h->n_meta) {
        meta = PyDict_New();
        for (uint64_t i = 0; meta && i < h->n_meta; i++) {
            const ckptio_st_meta *m = &h->meta[i];
            PyObject *k = st_str(h->strtab + m->key, m->key_len);
            PyObject *v = k ? st_str(h->strtab + m->val, m->val_len) : NULL;
            if (!v || PyDict_SetItem(meta, k, v) < 0) Py_CLEAR(meta);
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
    } else if (tensors) {
        meta = Py_NewRef(Py_None);
    }
    if (tensors && meta) out = PyTuple_Pack(2, tensors, meta);
    Py_XDECREF(tensors);
    Py_XDECREF(meta);
    ckptio_st_free(h);
    return out;
}

/* The CKPTIO_ST_* of a safetensors dtype name, or 0. */
static uint32_t st_dtype_of(const char *name)
{
    for (int i = 1; i < CKPTIO_ST_COUNT; i++)
        if (!strcmp(ckptio_st_dtype_name(i), name)) return (uint32_t)i;
    return 0;
}

/* A string appended to the encoder's string table (each followed by a NUL). */
static int st_put(char *strtab, uint64_t *at, PyObject *s, uint64_t *off, uint64_t *len,
                  const char *what, Py_ssize_t i)
{
    Py_ssize_t n;
    const char *u = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &n) : NULL;
    if (!u) {
        PyErr_Clear();
        char msg[160];
        snprintf(msg, sizeof msg, "safetensors encode: %s %zd is not a str encodable as UTF-8",
                 what, i);
        st_raise(CKPTIO_E_USAGE, msg);
        return -1;
    }
    if (strtab) memcpy(strtab + *at, u, (size_t)n + 1);
    *off = *at;
    *len = (uint64_t)n;
    *at += (uint64_t)n + 1;
    return 0;
}

/* st_encode([(name, dtype, shape, begin, end)], [(key, value)] or None, align) -> bytes: the
 * length word and the JSON header, padded with spaces to a multiple of `align`. */
static PyObject *mod_st_encode(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *tseq, *mseq;
    unsigned long long align;
    if (!PyArg_ParseTuple(args, "OOK:st_encode", &tseq, &mseq, &align)) return NULL;
    PyObject *ft = PySequence_Fast(tseq, "st_encode: tensors must be a sequence");
    PyObject *fm = !ft ? NULL
                   : mseq == Py_None
                       ? PyTuple_New(0)
                       : PySequence_Fast(mseq, "st_encode: metadata must be a sequence of pairs");
    PyObject *out = NULL;
    ckptio_st_header h;
    memset(&h, 0, sizeof h);
    h.size = sizeof h;
    char *arena = NULL;
    if (!fm) goto done;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(ft), nm = PySequence_Fast_GET_SIZE(fm);
    /* First pass sizes the string table; the second fills it. */
    uint64_t str_bytes = 0, n_dims = 0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(ft, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5 ||
            !PyTuple_Check(PyTuple_GET_ITEM(t, 2))) {
            PyErr_SetString(PyExc_TypeError,
                            "st_encode: each tensor is (name, dtype, shape tuple, begin, end)");
            goto done;
        }
        uint64_t off, len;
        if (st_put(NULL, &str_bytes, PyTuple_GET_ITEM(t, 0), &off, &len, "tensor name", i) < 0)
            goto done;
        n_dims += (uint64_t)PyTuple_GET_SIZE(PyTuple_GET_ITEM(t, 2));
    }
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *kv = PySequence_Fast_GET_ITEM(fm, i);
        uint64_t off, len;
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
            PyErr_SetString(PyExc_TypeError, "st_encode: metadata is [(str, str)]");
            goto done;
        }
        if (st_put(NULL, &str_bytes, PyTuple_GET_ITEM(kv, 0), &off, &len, "metadata key", i) < 0 ||
            st_put(NULL, &str_bytes, PyTuple_GET_ITEM(kv, 1), &off, &len, "metadata value", i) < 0)
            goto done;
    }
    size_t bytes = (size_t)nt * sizeof(ckptio_st_tensor) + (size_t)nm * sizeof(ckptio_st_meta) +
                   (size_t)n_dims * sizeof(uint64_t) + (size_t)str_bytes + 1;
    arena = PyMem_Calloc(1, bytes);
    if (!arena) {
        PyErr_NoMemory();
        goto done;
    }
    h.tensors = (ckptio_st_tensor *)arena;
    h.meta = (ckptio_st_meta *)(h.tensors + nt);
    h.dims = (uint64_t *)(h.meta + nm);
    h.strtab = (char *)(h.dims + n_dims);
    uint64_t at = 0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(ft, i);
        ckptio_st_tensor *e = &h.tensors[i];
        uint64_t off = 0, len = 0;
        st_put(h.strtab, &at, PyTuple_GET_ITEM(t, 0), &off, &len, "tensor name", i);
        e->name = off;
        e->name_len = (uint32_t)len;
        const char *dt = PyUnicode_Check(PyTuple_GET_ITEM(t, 1))
                             ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 1))
                             : NULL;
        if (!dt) {
            PyErr_Clear();
            dt = "";
        }
        e->st_dtype = st_dtype_of(dt);
        if (!e->st_dtype) {
            char msg[256];
            snprintf(msg, sizeof msg, "safetensors encode: tensor %zd: unknown dtype '%.40s'", i,
                     dt);
            st_raise(CKPTIO_E_DTYPE, msg);
            goto done;
        }
        PyObject *shape = PyTuple_GET_ITEM(t, 2);
        e->ndim = (uint32_t)PyTuple_GET_SIZE(shape);
        e->dims = h.n_dims;
        for (uint32_t k = 0; k < e->ndim; k++) {
            unsigned long long d = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, k));
            if (d == (unsigned long long)-1 && PyErr_Occurred()) goto done;
            h.dims[h.n_dims++] = d;
        }
        e->begin = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 3));
        if (e->begin == (uint64_t)-1 && PyErr_Occurred()) goto done;
        e->end = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 4));
        if (e->end == (uint64_t)-1 && PyErr_Occurred()) goto done;
    }
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *kv = PySequence_Fast_GET_ITEM(fm, i);
        ckptio_st_meta *m = &h.meta[i];
        uint64_t len = 0;
        st_put(h.strtab, &at, PyTuple_GET_ITEM(kv, 0), &m->key, &len, "metadata key", i);
        m->key_len = (uint32_t)len;
        st_put(h.strtab, &at, PyTuple_GET_ITEM(kv, 1), &m->val, &m->val_len, "metadata value", i);
    }
    h.n_tensors = (uint64_t)nt;
    h.n_meta = (uint64_t)nm;
    h.strtab_len = at;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    char err[512] = "";
    int rc = ckptio_st_encode(&h, align, &buf, &len, err, sizeof err);
    if (rc < 0) {
        st_raise(rc, err);
        goto done;
    }
    out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    free(buf);
done:
    PyMem_Free(arena);
    Py_XDECREF(ft);
    Py_XDECREF(fm);
    return out;
}

/* st_dtypes() -> [(name, ckptio code or 0)]: the library's table of safetensors dtypes. */
static PyObject *mod_st_dtypes(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *out = PyList_New(0);
    for (int i = 1; out && i < CKPTIO_ST_COUNT; i++) {
        PyObject *t = Py_BuildValue("(si)", ckptio_st_dtype_name(i), ckptio_st_dtype_ckptio(i));
        if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
    return out;
}

static PyMethodDef st_methods[] = {
    {"st_dtypes", mod_st_dtypes, METH_NOARGS,
     "st_dtypes() -> [(safetensors dtype name, ckptio dtype code or 0)]"},
    {"st_parse", mod_st_parse, METH_VARARGS,
     "st_parse(header, file_size, declared=len(header)) -> ([(name, dtype, code, shape, begin, "
     "end)] in file order, metadata dict or None)"},
    {"st_encode", mod_st_encode, METH_VARARGS,
     "st_encode([(name, dtype, shape, begin, end)], [(key, value)] or None, align) -> bytes"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyst_register(PyObject *m)
{
    return PyModule_AddFunctions(m, st_methods);
}
