/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.FileWriter and ZipWriter, files written and committed atomically, and file_read. */
#include "_core.h"

#include <limits.h>
#include <string.h>

/* fn(handle, bytes of `arg`) with the GIL released (even a small write may wait for a staging
 * buffer to come back from the device); a large one checks for Ctrl-C after. Returns the byte
 * count, or -1 with an exception set. */
static Py_ssize_t buffer_call(PyObject *self, PyObject *arg,
                              int (*fn)(void *h, const void *data, size_t n))
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    void *h = ckptio__pyhandle_enter(self);
    if (!h) {
        PyBuffer_Release(&v);
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(h, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return -1;
    if (len >= (64 << 20) && PyErr_CheckSignals() < 0) return -1;
    return len;
}

static int file_write_fn(void *h, const void *data, size_t n)
{
    return ckptio_file_writer_write(h, data, n);
}

static PyObject *FileWriter_write(PyObject *self, PyObject *arg)
{
    Py_ssize_t len = buffer_call(self, arg, file_write_fn);
    return len < 0 ? NULL : PyLong_FromSsize_t(len);
}

static PyObject *FileWriter_tell(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_file_writer *f = ckptio__pyhandle_get(self);
    return f ? PyLong_FromUnsignedLongLong(ckptio_file_writer_tell(f)) : NULL;
}

/* seek(offset, whence=0): forward only. torch.save under torch.serialization.skip_data() seeks
 * over each storage instead of writing it; the gap is written as zeros, which is what a reader
 * of a file torch.save wrote with holes sees there. */
static PyObject *FileWriter_seek(PyObject *self, PyObject *args)
{
    long long off;
    int whence = 0;
    if (!PyArg_ParseTuple(args, "L|i:seek", &off, &whence)) return NULL;
    ckptio_file_writer *f = ckptio__pyhandle_enter(self);
    if (!f) return NULL;
    uint64_t pos = ckptio_file_writer_tell(f);
    long long base;
    if (whence == 0)
        base = 0;
    else if (whence == 1 || whence == 2) /* written front to back: the end is the position */
        base = (long long)pos;
    else {
        ckptio__pyhandle_leave(self, 0, NULL);
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
        ckptio__pyhandle_leave(self, 0, NULL);
        return NULL;
    }
    uint64_t gap = (uint64_t)(base + off) - pos;
    static const char zeros[64 << 10];
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    while (gap && rc == 0) {
        size_t n = gap < sizeof zeros ? (size_t)gap : sizeof zeros;
        rc = ckptio_file_writer_write(f, zeros, n);
        gap -= n;
    }
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(ckptio_file_writer_tell(f));
}

static PyObject *FileWriter_flush(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (!ckptio__pyhandle_get(self)) return NULL;
    Py_RETURN_NONE; /* durability is commit's job */
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

static PyMethodDef FileWriter_methods[] = {
    {"write", FileWriter_write, METH_O,
     "write(b): append bytes (copied before returning); returns len(b)"},
    {"tell", FileWriter_tell, METH_NOARGS, "bytes written so far"},
    {"seek", FileWriter_seek, METH_VARARGS,
     "seek(offset, whence=0): forward only, the gap written as zeros; returns the position"},
    {"flush", FileWriter_flush, METH_NOARGS, "no-op: commit() makes the file durable"},
    {"commit", ckptio__pyhandle_commit, METH_NOARGS,
     "make the file durable and visible at its path; stats tuple"},
    {"writable", ret_true, METH_NOARGS, NULL},
    {"readable", ret_false, METH_NOARGS, NULL},
    {"seekable", ret_false, METH_NOARGS, NULL},
    CKPTIO_PYHANDLE_METHODS("release; without commit, discard"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FileWriter_getset[] = {
    CKPTIO_PYHANDLE_CLOSED,
    {NULL, NULL, NULL, NULL, NULL},
};

/* The handle type of a single-file writer ckptio_<p>_*: open, close, errmsg, stats, commit. */
#define FILE_HANDLE_TYPE(p, var, name, doc, methods, noun_, closed)                                \
    CKPTIO_PYHANDLE_OPS(p)                                                                     \
    static int p##_commit_any(void *h) { return ckptio_##p##_commit(h); }                     \
    static ckptio__pyhandle_type var = {                                                       \
        .type = CKPTIO_PYHANDLE_TYPE(name, sizeof(ckptio__pyhandle), doc, methods,             \
                                     FileWriter_getset),                                       \
        .noun = noun_, .closed_msg = closed, .open = p##_open_any, .close = p##_close_any,     \
        .errmsg = p##_errmsg_any, .stats = p##_stats_any, .commit = p##_commit_any,            \
    };

FILE_HANDLE_TYPE(file_writer, FileWriter_Type, "ckptio._core.FileWriter",
                 "FileWriter(path, params=None): a write-only binary file committed atomically.",
                 FileWriter_methods, "this file", "I/O operation on closed file")

/* ZipWriter.add(name, data, align=64, crc=True): one record, written before returning. */
static PyObject *ZipWriter_add(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "data", "align", "crc", NULL};
    const char *name;
    Py_buffer v;
    unsigned int align = 64;
    int crc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*|Ip:add", kwlist, &name, &v, &align, &crc))
        return NULL;
    ckptio_zip_writer *z = ckptio__pyhandle_enter(self);
    if (!z) {
        PyBuffer_Release(&v);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_zip_writer_add(z, name, v.buf, (uint64_t)v.len, align, crc ? 0 : CKPTIO_ZIP_NO_CRC);
    Py_END_ALLOW_THREADS
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    if (len >= (64 << 20) && PyErr_CheckSignals() < 0) return NULL;
    Py_RETURN_NONE;
}

/* ZipWriter.begin(name, length, align=64, crc=True): a record whose bytes append() gives. */
static PyObject *ZipWriter_begin(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "length", "align", "crc", NULL};
    const char *name;
    unsigned long long len;
    unsigned int align = 64;
    int crc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|Ip:begin", kwlist, &name, &len, &align, &crc))
        return NULL;
    ckptio_zip_writer *z = ckptio__pyhandle_enter(self);
    if (!z) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_zip_writer_begin(z, name, len, align, crc ? 0 : CKPTIO_ZIP_NO_CRC);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static int zip_append_fn(void *h, const void *data, size_t n)
{
    return ckptio_zip_writer_append(h, data, n);
}

static PyObject *ZipWriter_append(PyObject *self, PyObject *arg)
{
    if (buffer_call(self, arg, zip_append_fn) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *ZipWriter_tell(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_zip_writer *z = ckptio__pyhandle_get(self);
    return z ? PyLong_FromUnsignedLongLong(ckptio_zip_writer_tell(z)) : NULL;
}

static PyMethodDef ZipWriter_methods[] = {
    {"add", (PyCFunction)(void (*)(void))ZipWriter_add, METH_VARARGS | METH_KEYWORDS,
     "add(name, data, align=64, crc=True): append a record (data is not kept)"},
    {"begin", (PyCFunction)(void (*)(void))ZipWriter_begin, METH_VARARGS | METH_KEYWORDS,
     "begin(name, length, align=64, crc=True): a record whose bytes append() gives in order"},
    {"append", ZipWriter_append, METH_O, "append(data): the next bytes of the open record"},
    {"tell", ZipWriter_tell, METH_NOARGS, "bytes written so far"},
    {"commit", ckptio__pyhandle_commit, METH_NOARGS,
     "write the central directory; make the archive durable and visible at its path; stats tuple"},
    CKPTIO_PYHANDLE_METHODS("release; without commit, discard"),
    {NULL, NULL, 0, NULL},
};

FILE_HANDLE_TYPE(zip_writer, ZipWriter_Type, "ckptio._core.ZipWriter",
                 "ZipWriter(path, params=None): a zip archive in torch.save's layout, committed "
                 "atomically.",
                 ZipWriter_methods, "this archive", "I/O operation on closed zip writer")

ckptio__pyhandle_type *const ckptio__pyZipWriter_Type = &ZipWriter_Type;

/* file_place([(file_offset, length)]) -> [(Buffer or None, at, capacity, lead)]: memory the
 * library chose for each range of a file (ckptio_file_place), its blocks as Buffers. */
static PyObject *mod_file_place(PyObject *mod, PyObject *seq)
{
    (void)mod;
    PyObject *fast = PySequence_Fast(seq, "file_place expects a sequence of (offset, length)");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    ckptio_range *rg = PyMem_Calloc((size_t)n + 1, sizeof *rg);
    ckptio_landing *land = PyMem_Calloc((size_t)n + 1, sizeof *land);
    PyObject *res = NULL;
    if (!rg || !land) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long off, len;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "KK:file_place range", &off,
                              &len))
            goto out;
        rg[i] = (ckptio_range){.size = sizeof rg[i], .offset = off, .len = len};
    }
    land[0].size = sizeof *land;
    ckptio_block *blocks = NULL;
    size_t nb = 0;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_file_place(rg, (size_t)n, land, &blocks, &nb);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ckptio__pyraise(rc, msg, NULL);
        goto out;
    }
    res = ckptio__pylandings(blocks, nb, land, (size_t)n);
out:
    PyMem_Free(rg);
    PyMem_Free(land);
    Py_DECREF(fast);
    return res;
}

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
    if (ckptio__pyparams(params, &p) < 0) goto out;
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
        if (ckptio__pydst(dst, doff, &views[n_views], &have_view, &ptr, &avail) < 0) goto out;
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
        PyObject *path = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(path_obj));
        if (!path) PyErr_Clear();
        ckptio__pyraise(rc, msg, &(ckptio__pywhere){.path = path});
        Py_XDECREF(path);
        goto out;
    }
    result = ckptio__pystats(&st);
out:
    for (size_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(ranges);
    Py_XDECREF(fast);
    Py_XDECREF(path_obj);
    return result;
}

static PyMethodDef file_functions[] = {
    {"file_place", mod_file_place, METH_O,
     "file_place([(offset, length)]) -> [(Buffer or None, at, capacity, lead)]: memory the "
     "library chose for each range of a file"},
    {"file_read", mod_file_read, METH_VARARGS,
     "file_read(path, [(offset, length, dst, dst_offset)], params=None) -> stats tuple"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyfile_register(PyObject *m)
{
    if (PyType_Ready(&FileWriter_Type.type) < 0 ||
        PyModule_AddObjectRef(m, "FileWriter", (PyObject *)&FileWriter_Type.type) < 0 ||
        PyType_Ready(&ZipWriter_Type.type) < 0 ||
        PyModule_AddObjectRef(m, "ZipWriter", (PyObject *)&ZipWriter_Type.type) < 0)
        return -1;
    return PyModule_AddFunctions(m, file_functions);
}
