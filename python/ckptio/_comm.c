/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's Python communicators: a ckptio_comm table whose callbacks call a Python object. */
#include "_comm.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pycomm {
    ckptio_comm table; /* ctx points back here */
    PyObject *obj;     /* the Python communicator, a strong reference */
    PyObject *exc;     /* the first exception a callback raised (the cause; later ones are
                        * usually its consequences), or NULL */
} pycomm;

#define CKPTIO_TRY_(expr)                                                                          \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0) return rc_;                                                                   \
    } while (0)

static PyObject *g_from_code;     /* ckptio._errors._from_code */
static PyObject *g_checkpoint_error; /* ckptio._errors.CheckpointError */

static int load_errors(void)
{
    if (g_from_code) return 0;
    PyObject *mod = PyImport_ImportModule("ckptio._errors");
    if (!mod) return -1;
    g_from_code = PyObject_GetAttrString(mod, "_from_code");
    g_checkpoint_error = PyObject_GetAttrString(mod, "CheckpointError");
    Py_DECREF(mod);
    if (!g_from_code || !g_checkpoint_error) {
        Py_CLEAR(g_from_code);
        Py_CLEAR(g_checkpoint_error);
        return -1;
    }
    return 0;
}

static PyObject *fetch_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type) return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

/* The code for the exception a callback raised (GIL held, exception set): kept in p->exc for
 * the final error. Anything unrecognized is a transport failure (-ECOMM) rather than -EIO, so
 * that it never reads as a disk error in a save's message. */
static int callback_failed(pycomm *p, int other)
{
    PyObject *e = fetch_exception();
    if (!e) return other;
    int rc = other;
    if (PyErr_GivenExceptionMatches(e, PyExc_TimeoutError)) {
        rc = -ETIMEDOUT;
    } else if (PyErr_GivenExceptionMatches(e, PyExc_ConnectionResetError) ||
               PyErr_GivenExceptionMatches(e, PyExc_ConnectionAbortedError) ||
               PyErr_GivenExceptionMatches(e, PyExc_BrokenPipeError)) {
        rc = -ECONNRESET;
    } else if (PyErr_GivenExceptionMatches(e, PyExc_MemoryError)) {
        rc = -ENOMEM;
    } else if (PyErr_GivenExceptionMatches(e, PyExc_KeyboardInterrupt)) {
        rc = CKPTIO_E_INTERRUPTED;
    } else if (g_checkpoint_error && PyErr_GivenExceptionMatches(e, g_checkpoint_error)) {
        PyObject *code = PyObject_GetAttrString(e, "code");
        long v = code && PyLong_Check(code) ? PyLong_AsLong(code) : 0;
        Py_XDECREF(code);
        PyErr_Clear();
        if (v < 0 && v > INT_MIN) rc = (int)v;
    }
    if (!p->exc)
        p->exc = e;
    else
        Py_DECREF(e);
    return rc;
}

static int cb_barrier(void *ctx, double timeout)
{
    pycomm *p = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(p->obj, "barrier", "d", timeout);
    int rc = r ? 0 : callback_failed(p, -ECOMM);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

/* Copy a Python buffer into b; an object that is no buffer is the communicator's bug. */
static int copy_buffer(pycomm *p, PyObject *obj, const char *what, ckptio_bytes *b)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s returned %.80s, not bytes", what, Py_TYPE(obj)->tp_name);
        return callback_failed(p, CKPTIO_E_USAGE);
    }
    int rc = ckptio_bytes_set(b, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (rc < 0) {
        PyErr_NoMemory();
        return callback_failed(p, rc);
    }
    return 0;
}

static int cb_broadcast(void *ctx, int32_t root, ckptio_bytes *buf, double timeout)
{
    pycomm *p = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    bool is_root = root == p->table.rank;
    PyObject *data = is_root ? PyBytes_FromStringAndSize(buf->data, (Py_ssize_t)buf->len)
                             : Py_NewRef(Py_None);
    PyObject *r = data ? PyObject_CallMethod(p->obj, "broadcast", "iOd", (int)root, data, timeout)
                       : NULL;
    Py_XDECREF(data);
    if (!r)
        rc = callback_failed(p, -ECOMM);
    else if (!is_root) /* the root's bytes are already in place */
        rc = copy_buffer(p, r, "broadcast", buf);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

/* The root's result of gather: one buffer per rank, concatenated into out with their lengths. */
static int gathered(pycomm *p, PyObject *r, ckptio_bytes *out, uint64_t *lens)
{
    int32_t n = p->table.nranks;
    PyObject *seq = PySequence_Fast(r, "gather returned no sequence on the root");
    if (!seq) return callback_failed(p, CKPTIO_E_USAGE);
    int rc = 0;
    Py_buffer *views = NULL;
    Py_ssize_t got = 0;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "gather returned %zd items on the root, not one per rank (%d)",
                     PySequence_Fast_GET_SIZE(seq), (int)n);
        rc = callback_failed(p, CKPTIO_E_USAGE);
        goto out;
    }
    views = PyMem_Calloc((size_t)n, sizeof *views);
    if (!views) {
        PyErr_NoMemory();
        rc = callback_failed(p, -ENOMEM);
        goto out;
    }
    size_t total = 0;
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        if (PyObject_GetBuffer(item, &views[got], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Format(PyExc_TypeError, "gather returned %.80s for rank %zd, not bytes",
                         Py_TYPE(item)->tp_name, got);
            rc = callback_failed(p, CKPTIO_E_USAGE);
            goto out;
        }
        total += (size_t)views[got].len;
    }
    if ((rc = ckptio_bytes_resize(out, total)) < 0) {
        PyErr_NoMemory();
        rc = callback_failed(p, rc);
        goto out;
    }
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        if (views[i].len) memcpy((char *)out->data + at, views[i].buf, (size_t)views[i].len);
        at += (size_t)views[i].len;
        lens[i] = (uint64_t)views[i].len;
    }
out:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return rc;
}

static int cb_gather(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                     uint64_t *lens, double timeout)
{
    pycomm *p = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    PyObject *bytes = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    PyObject *r = bytes ? PyObject_CallMethod(p->obj, "gather", "iOd", (int)root, bytes, timeout)
                        : NULL;
    Py_XDECREF(bytes);
    if (!r)
        rc = callback_failed(p, -ECOMM);
    else if (root == p->table.rank)
        rc = gathered(p, r, out, lens);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

static void pycomm_release(void *ctx)
{
    pycomm *p = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(p->obj);
    Py_XDECREF(p->exc);
    PyGILState_Release(g);
    free(p);
}

static int int_attr(PyObject *obj, const char *name, long lo, long hi, int32_t *out)
{
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (!v) return -1;
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "communicator %s %ld is outside [%ld, %ld]", name, x, lo, hi);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

ckptio_comm *ckptio__pycomm_new(PyObject *obj)
{
    if (load_errors() < 0) return NULL;
    int32_t size, rank;
    if (int_attr(obj, "size", 1, INT32_MAX, &size) < 0 ||
        int_attr(obj, "rank", 0, (long)size - 1, &rank) < 0)
        return NULL;
    pycomm *p = calloc(1, sizeof *p);
    if (!p) return (ckptio_comm *)PyErr_NoMemory();
    p->table.size = sizeof p->table;
    p->table.rank = rank;
    p->table.nranks = size;
    p->table.ctx = p;
    p->table.barrier = cb_barrier;
    p->table.broadcast = cb_broadcast;
    p->table.gather = cb_gather;
    p->table.release = pycomm_release;
    p->obj = Py_NewRef(obj);
    return &p->table;
}

PyObject *ckptio__pycomm_raise(ckptio_comm *c, int code)
{
    pycomm *p = c->ctx;
    PyObject *cause = p->exc;
    p->exc = NULL;
    PyObject *msg = NULL, *err = NULL;
    if (cause)
        msg = PyUnicode_FromFormat("%s (the communicator raised %s: %S)", ckptio_last_error(),
                                   Py_TYPE(cause)->tp_name, cause);
    else
        msg = PyUnicode_FromString(ckptio_last_error());
    if (msg)
        err = PyObject_CallFunction(g_from_code, "isO", code, ckptio_errname(code), msg);
    if (err) {
        if (cause) PyException_SetCause(err, Py_NewRef(cause));
        PyErr_SetObject((PyObject *)Py_TYPE(err), err);
    }
    Py_XDECREF(err);
    Py_XDECREF(msg);
    Py_XDECREF(cause);
    return NULL;
}

/* --- Python-visible functions --------------------------------------------------------------- */

static void capsule_free(PyObject *cap)
{
    ckptio_comm_free(PyCapsule_GetPointer(cap, "ckptio.comm"));
}

static PyObject *mod_comm_new(PyObject *self, PyObject *obj)
{
    (void)self;
    ckptio_comm *c = ckptio__pycomm_new(obj);
    if (!c) return NULL;
    PyObject *cap = PyCapsule_New(c, "ckptio.comm", capsule_free);
    if (!cap) ckptio_comm_free(c);
    return cap;
}

/* Rank r's payload in the self-test: varied lengths, rank 1's empty. */
static size_t selftest_len(int32_t r)
{
    return r == 1 ? 0 : ((size_t)r * 4099 + 5) % 20011;
}

static void selftest_fill(unsigned char *d, size_t len, int32_t r)
{
    for (size_t i = 0; i < len; i++) d[i] = (unsigned char)(r * 31 + i * 7);
}

/* The root's gather result as [bytes per rank]. */
static PyObject *split(const ckptio_bytes *all, const uint64_t *lens, int32_t n)
{
    PyObject *list = PyList_New(n);
    size_t at = 0;
    for (int32_t i = 0; list && i < n; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)all->data + at, (Py_ssize_t)lens[i]);
        if (!b)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, b);
        at += lens[i];
    }
    return list;
}

typedef struct selftest {
    const ckptio_comm *c;
    double timeout;
    int fail_rank;
    ckptio_bytes all, last, summary, empty;
    uint64_t *lens, *lens_last;
    int agree_ok, agree_fail;
    char agree_msg[512];
    const char *step; /* the step that failed */
} selftest;

/* The C side of the self-test, run with the GIL released as a save would. */
static int selftest_run(selftest *t)
{
    const ckptio_comm *c = t->c;
    int32_t rank = c->rank, n = c->nranks;
    size_t len = selftest_len(rank);
    unsigned char *payload = malloc(len ? len : 1), me = (unsigned char)rank;
    if (!payload) return -ENOMEM;
    selftest_fill(payload, len, rank);
    int rc;
    t->step = "gather to rank 0";
    rc = ckptio_comm_gather(c, 0, payload, len, &t->all, t->lens, t->timeout);
    free(payload);
    if (rc < 0) return rc;
    t->step = "gather to the last rank";
    CKPTIO_TRY_(ckptio_comm_gather(c, n - 1, &me, 1, &t->last, t->lens_last, t->timeout));

    /* Non-roots start with stale bytes that the broadcast must replace. */
    char text[128] = "stale";
    if (rank == 0) {
        uint32_t sum = 0;
        for (size_t i = 0; i < t->all.len; i++) sum += ((const unsigned char *)t->all.data)[i];
        snprintf(text, sizeof text, "%d ranks, %zu bytes, sum %u", (int)n, t->all.len, sum);
    }
    t->step = "broadcast from rank 0";
    CKPTIO_TRY_(ckptio_bytes_set(&t->summary, text, strlen(text)));
    CKPTIO_TRY_(ckptio_comm_broadcast(c, 0, &t->summary, t->timeout));
    t->step = "broadcast of nothing from the last rank";
    if (rank != n - 1) CKPTIO_TRY_(ckptio_bytes_set(&t->empty, "stale", 5));
    CKPTIO_TRY_(ckptio_comm_broadcast(c, n - 1, &t->empty, t->timeout));
    t->step = "barrier";
    CKPTIO_TRY_(ckptio_comm_barrier(c, t->timeout));
    t->step = "agree";
    t->agree_ok = ckptio_comm_agree(c, 0, NULL, t->timeout);
    if (t->agree_ok < 0) return t->agree_ok;
    if (t->fail_rank >= 0) {
        char msg[64];
        snprintf(msg, sizeof msg, "failure injected on rank %d", (int)rank);
        t->agree_fail = ckptio_comm_agree(c, rank == t->fail_rank ? CKPTIO_E_CORRUPT : 0, msg,
                                          t->timeout);
        snprintf(t->agree_msg, sizeof t->agree_msg, "%s", ckptio_last_error());
    }
    t->step = NULL;
    return 0;
}

/* _comm_selftest(comm, timeout, fail_rank=-1): collective; runs through the C entry points, with
 * the GIL released, a gather of varied payloads to rank 0 and one to the last rank, a broadcast
 * of a summary from rank 0 and of nothing from the last rank, a barrier, an agree on success
 * and, if fail_rank >= 0, an agree where that rank fails. Returns what this rank saw; a failed
 * step raises the ckptio error (its __cause__ the communicator's exception). */
static PyObject *mod_comm_selftest(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *obj;
    selftest t = {.fail_rank = -1};
    if (!PyArg_ParseTuple(args, "Od|i", &obj, &t.timeout, &t.fail_rank)) return NULL;
    ckptio_comm *c = ckptio__pycomm_new(obj);
    if (!c) return NULL;
    t.c = c;
    PyObject *result = NULL;
    t.lens = calloc((size_t)c->nranks, sizeof *t.lens);
    t.lens_last = calloc((size_t)c->nranks, sizeof *t.lens_last);
    if (!t.lens || !t.lens_last) {
        PyErr_NoMemory();
        goto out;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = selftest_run(&t);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ckptio__pycomm_raise(c, rc);
        if (t.step) { /* name the step in a note, keeping the library's message intact */
            PyObject *e = fetch_exception();
            if (e) {
                PyObject *r = PyObject_CallMethod(e, "add_note", "s", t.step);
                Py_XDECREF(r);
                PyErr_Clear();
                PyErr_SetObject((PyObject *)Py_TYPE(e), e);
                Py_DECREF(e);
            }
        }
        goto out;
    }
    bool root0 = c->rank == 0, root_last = c->rank == c->nranks - 1;
    PyObject *gathered0 = root0 ? split(&t.all, t.lens, c->nranks) : Py_NewRef(Py_None);
    PyObject *gathered_last = root_last ? split(&t.last, t.lens_last, c->nranks)
                                        : Py_NewRef(Py_None);
    if (gathered0 && gathered_last)
        result = Py_BuildValue("{s:i,s:i,s:O,s:O,s:y#,s:y#,s:i,s:(is)}", "rank", (int)c->rank,
                               "size", (int)c->nranks, "gathered", gathered0, "gathered_last",
                               gathered_last, "summary", t.summary.data ? (const char *)t.summary.data : "",
                               (Py_ssize_t)t.summary.len, "empty", t.empty.data ? (const char *)t.empty.data : "",
                               (Py_ssize_t)t.empty.len, "agree", t.agree_ok, "agree_fail",
                               t.agree_fail, t.agree_msg);
    Py_XDECREF(gathered0);
    Py_XDECREF(gathered_last);
out:
    ckptio_bytes_free(&t.all);
    ckptio_bytes_free(&t.last);
    ckptio_bytes_free(&t.summary);
    ckptio_bytes_free(&t.empty);
    free(t.lens);
    free(t.lens_last);
    ckptio_comm_free(c);
    return result;
}

static PyMethodDef comm_methods[] = {
    {"_comm_new", mod_comm_new, METH_O,
     "_comm_new(comm) -> capsule 'ckptio.comm' holding a ckptio_comm table over comm"},
    {"_comm_selftest", mod_comm_selftest, METH_VARARGS,
     "_comm_selftest(comm, timeout, fail_rank=-1) -> dict (collective; for the tests)"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pycomm_register(PyObject *m)
{
    if (load_errors() < 0) return -1;
    return PyModule_AddFunctions(m, comm_methods);
}
