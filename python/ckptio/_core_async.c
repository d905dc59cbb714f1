/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's async saves: Pool (ckptio_pool), take -> Snapshot, commit_async -> Completion. */
#include "_core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "_comm.h"

/* Pool, Snapshot and Completion are not opened on a path, so they do not use the handle table
 * of _core_handle.c: each is a pointer the C API frees, and their errors go through
 * ckptio__pyraise like the handles'. Their type objects differ only in these. */
#define ASYNC_TYPE(name, obj, dealloc, doc, methods)                                             \
    {                                                                                            \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = name, .tp_basicsize = sizeof(obj),              \
        .tp_dealloc = dealloc, .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = doc,                    \
        .tp_methods = methods,                                                                   \
    }

static PyStructSequence_Field PoolUsage_fields[] = {
    {"pinned", "True if buffers made from now on are page-locked"},
    {"max_bytes", "the cap"},
    {"held", "bytes of every buffer the pool owns, lent or idle"},
    {"lent", "of which lent to snapshots and saves not yet done"},
    {"pinned_bytes", "of held, page-locked"},
    {"buffers", "buffers held"},
    {"allocations", "buffers made since the pool was made"},
    {"reason", "why buffers are plain, or ''"},
    {NULL, NULL},
};
static PyStructSequence_Desc PoolUsage_desc = {
    "ckptio._core.PoolUsage", "A pool's accounting (ckptio_pool_usage).", PoolUsage_fields, 8};
static PyTypeObject *PoolUsage_Type;

static PyStructSequence_Field TakeStats_fields[] = {
    {"split", "items split between a copy and a write"},
    {"copied_bytes", "bytes copied into the pool's buffers"},
    {"device_bytes", "of which from device memory"},
    {"written_bytes", "bytes written through the writer during the take"},
    {"allocations", "buffers the pool had to make for this take"},
    {"seconds", "the take's wall time"},
    {NULL, NULL},
};
static PyStructSequence_Desc TakeStats_desc = {
    "ckptio._core.TakeStats", "What a take did (ckptio_take_stats).", TakeStats_fields, 6};
static PyTypeObject *TakeStats_Type;

/* The message of the last failed call on this thread, copied before the GIL is taken back. */
typedef struct {
    char text[1024];
} errbuf;

static void errbuf_keep(errbuf *e, int rc)
{
    if (rc < 0) snprintf(e->text, sizeof e->text, "%s", ckptio_last_error());
}

/* --- Pool -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ckptio_pool *pool;
} PoolObject;

static PyTypeObject Pool_Type;

static int Pool_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pinned", "max_bytes", "copy_threads", NULL};
    ckptio_pool_params p;
    ckptio_pool_params_init(&p);
    int pinned = p.pinned;
    unsigned long long max_bytes = p.max_bytes;
    unsigned int threads = p.copy_threads;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iKI:Pool", kwlist, &pinned, &max_bytes, &threads))
        return -1;
    p.pinned = pinned;
    p.max_bytes = max_bytes;
    p.copy_threads = threads;
    ckptio_pool *pool = NULL;
    errbuf e = {""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_pool_new(&pool, &p);
    errbuf_keep(&e, rc);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ckptio__pyraise(rc, e.text, NULL);
        return -1;
    }
    PoolObject *o = (PoolObject *)self;
    ckptio_pool_free(o->pool);
    o->pool = pool;
    return 0;
}

static void Pool_dealloc(PyObject *self)
{
    ckptio_pool *pool = ((PoolObject *)self)->pool;
    Py_BEGIN_ALLOW_THREADS
    ckptio_pool_free(pool);
    Py_END_ALLOW_THREADS
    Py_TYPE(self)->tp_free(self);
}

static ckptio_pool *pool_of(PyObject *self)
{
    if (!PyObject_TypeCheck(self, &Pool_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a ckptio._core.Pool");
        return NULL;
    }
    ckptio_pool *pool = ((PoolObject *)self)->pool;
    if (!pool) PyErr_SetString(PyExc_ValueError, "Pool was not initialized");
    return pool;
}

static PyObject *Pool_set_max_bytes(PyObject *self, PyObject *arg)
{
    ckptio_pool *pool = pool_of(self);
    unsigned long long n = pool ? PyLong_AsUnsignedLongLong(arg) : 0;
    if (!pool || (n == (unsigned long long)-1 && PyErr_Occurred())) return NULL;
    int rc = ckptio_pool_set_max_bytes(pool, n);
    if (rc < 0) return ckptio__pyraise(rc, ckptio_last_error(), NULL);
    Py_RETURN_NONE;
}

static PyObject *Pool_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_pool *pool = pool_of(self);
    if (!pool) return NULL;
    uint64_t freed;
    Py_BEGIN_ALLOW_THREADS
    freed = ckptio_pool_release(pool);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(freed);
}

static PyObject *Pool_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_pool *pool = pool_of(self);
    if (!pool) return NULL;
    ckptio_pool_usage u;
    memset(&u, 0, sizeof u);
    u.size = sizeof u;
    int rc = ckptio_pool_stats(pool, &u);
    if (rc < 0) return ckptio__pyraise(rc, ckptio_last_error(), NULL);
    PyObject *v[] = {
        PyBool_FromLong(u.pinned),
        PyLong_FromUnsignedLongLong(u.max_bytes),
        PyLong_FromUnsignedLongLong(u.held),
        PyLong_FromUnsignedLongLong(u.lent),
        PyLong_FromUnsignedLongLong(u.pinned_bytes),
        PyLong_FromUnsignedLongLong(u.buffers),
        PyLong_FromUnsignedLongLong(u.allocations),
        PyUnicode_DecodeUTF8(u.reason, (Py_ssize_t)strnlen(u.reason, sizeof u.reason), "replace"),
    };
    return ckptio__pyrecord(PoolUsage_Type, v, 8);
}

static PyMethodDef Pool_methods[] = {
    {"set_max_bytes", Pool_set_max_bytes, METH_O,
     "set_max_bytes(n): the cap for the next snapshots (0: a quarter of physical memory)"},
    {"release", Pool_release, METH_NOARGS, "free every idle buffer; returns the bytes freed"},
    {"stats", Pool_stats, METH_NOARGS, "the pool's accounting: PoolUsage (thread-safe)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Pool_Type = ASYNC_TYPE(
    "ckptio._core.Pool", PoolObject, Pool_dealloc,
    "Pool(pinned=SWITCH_AUTO, max_bytes=0, copy_threads=0): host buffers for snapshots "
    "(ckptio_pool).",
    Pool_methods);

/* --- Snapshot ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ckptio_snapshot *s; /* NULL once freed or handed to a background save */
} SnapshotObject;

static PyTypeObject Snapshot_Type;

static ckptio_snapshot *snapshot_of(PyObject *self)
{
    if (!PyObject_TypeCheck(self, &Snapshot_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a ckptio._core.Snapshot");
        return NULL;
    }
    ckptio_snapshot *s = ((SnapshotObject *)self)->s;
    if (!s)
        ckptio__pyraise(CKPTIO_E_STATE, "the snapshot was freed or handed to a save", NULL);
    return s;
}

static void snapshot_free(SnapshotObject *o)
{
    ckptio_snapshot *s = o->s;
    o->s = NULL;
    Py_BEGIN_ALLOW_THREADS
    ckptio_snapshot_free(s);
    Py_END_ALLOW_THREADS
}

static void Snapshot_dealloc(PyObject *self)
{
    snapshot_free((SnapshotObject *)self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *Snapshot_free(PyObject *self, PyObject *unused)
{
    (void)unused;
    snapshot_free((SnapshotObject *)self);
    Py_RETURN_NONE;
}

/* [(name, dtype, shape, offset, box, flags, nbytes)]: what the snapshot holds copies of. */
static PyObject *Snapshot_items(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_snapshot *s = snapshot_of(self);
    if (!s) return NULL;
    const ckptio_dist_item *its;
    size_t n;
    int rc = ckptio_snapshot_items(s, &its, &n);
    if (rc < 0) return ckptio__pyraise(rc, ckptio_last_error(), NULL);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        const ckptio_dist_item *d = &its[i];
        PyObject *off = d->offset ? ckptio__pydims_tuple(d->offset, d->ndim) : Py_NewRef(Py_None);
        PyObject *box = d->box ? ckptio__pydims_tuple(d->box, d->ndim) : Py_NewRef(Py_None);
        PyObject *t = Py_BuildValue("(siNNNIK)", d->name, d->dtype,
                                    ckptio__pydims_tuple(d->shape, d->ndim), off, box, d->flags,
                                    (unsigned long long)d->nbytes);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *Snapshot_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_snapshot *s = snapshot_of(self);
    if (!s) return NULL;
    ckptio_take_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    int rc = ckptio_snapshot_stats(s, &st);
    if (rc < 0) return ckptio__pyraise(rc, ckptio_last_error(), NULL);
    PyObject *v[] = {
        PyLong_FromUnsignedLong(st.split),
        PyLong_FromUnsignedLongLong(st.copied_bytes),
        PyLong_FromUnsignedLongLong(st.device_bytes),
        PyLong_FromUnsignedLongLong(st.written_bytes),
        PyLong_FromUnsignedLongLong(st.allocations),
        PyFloat_FromDouble(st.seconds),
    };
    return ckptio__pyrecord(TakeStats_Type, v, 6);
}

static PyMethodDef Snapshot_methods[] = {
    {"items", Snapshot_items, METH_NOARGS,
     "items() -> [(name, dtype, shape, offset, box, flags, nbytes)] held as copies"},
    {"stats", Snapshot_stats, METH_NOARGS, "stats() -> TakeStats"},
    {"free", Snapshot_free, METH_NOARGS, "give the buffers back to the pool"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Snapshot_Type =
    ASYNC_TYPE("ckptio._core.Snapshot", SnapshotObject, Snapshot_dealloc,
               "A copy of tensors in a Pool's buffers (ckptio_snapshot); made by take().",
               Snapshot_methods);

/* The Writer object given as `obj`, marked busy; NULL with an exception set otherwise. */
static ckptio_writer *writer_enter(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &ckptio__pyWriter_Type.type)) {
        PyErr_SetString(PyExc_TypeError, "expected a ckptio._core.Writer");
        return NULL;
    }
    return ckptio__pyhandle_enter(obj);
}

/* take(pool, items, writer=None) -> Snapshot: ckptio_snapshot_take with the GIL released.
 * items as save_dist's. */
static PyObject *mod_take(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *pool_obj, *items, *wobj = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:take", &pool_obj, &items, &wobj)) return NULL;
    ckptio_pool *pool = pool_of(pool_obj);
    if (!pool) return NULL;
    ckptio__pydist d;
    PyObject *empty = PyTuple_New(0);
    if (!empty) return NULL;
    int prc = ckptio__pydist_parse(items, empty, &d);
    Py_DECREF(empty);
    if (prc < 0) return NULL;
    ckptio_writer *w = NULL;
    if (wobj != Py_None && !(w = writer_enter(wobj))) {
        ckptio__pydist_release(&d);
        return NULL;
    }
    ckptio_snapshot *s = NULL;
    errbuf e = {""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_snapshot_take(&s, pool, d.items, d.n, w);
    errbuf_keep(&e, rc);
    Py_END_ALLOW_THREADS
    ckptio__pydist_release(&d);
    PyObject *path = NULL;
    if (w) {
        ((ckptio__pyhandle *)wobj)->busy = 0;
        path = ((ckptio__pyhandle *)wobj)->path;
    }
    if (rc < 0) return ckptio__pyraise(rc, e.text, &(ckptio__pywhere){.path = path});
    SnapshotObject *o = PyObject_New(SnapshotObject, &Snapshot_Type);
    if (!o) {
        ckptio_snapshot_free(s);
        return NULL;
    }
    o->s = s;
    return (PyObject *)o;
}

/* --- Completion -------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ckptio_completion *c; /* NULL once closed */
    ckptio_comm *comm;    /* a collective save's communicator table, or NULL */
    PyObject *path;       /* str: the checkpoint (an error's `path`) */
    int waiters;          /* threads inside wait() with the GIL released */
} CompletionObject;

static PyTypeObject Completion_Type;

static PyObject *completion_new(ckptio_completion *c, ckptio_comm *comm, PyObject *path)
{
    CompletionObject *o = PyObject_New(CompletionObject, &Completion_Type);
    if (!o) return NULL;
    o->c = c;
    o->comm = comm;
    o->path = Py_NewRef(path);
    o->waiters = 0;
    return (PyObject *)o;
}

static ckptio_completion *completion_get(PyObject *self)
{
    ckptio_completion *c = ((CompletionObject *)self)->c;
    if (!c) PyErr_SetString(PyExc_ValueError, "completion is closed");
    return c;
}

/* Free the completion (waiting for a save still running: it owns buffers in use), then the
 * communicator table its thread used. */
static void completion_close(CompletionObject *o)
{
    ckptio_completion *c = o->c;
    ckptio_comm *comm = o->comm;
    o->c = NULL;
    o->comm = NULL;
    Py_BEGIN_ALLOW_THREADS
    ckptio_completion_free(c);
    Py_END_ALLOW_THREADS
    if (comm) ckptio_comm_free(comm);
}

static void Completion_dealloc(PyObject *self)
{
    CompletionObject *o = (CompletionObject *)self;
    completion_close(o);
    Py_CLEAR(o->path);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *Completion_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    CompletionObject *o = (CompletionObject *)self;
    if (o->waiters) {
        PyErr_SetString(PyExc_RuntimeError, "completion is being waited for by another thread");
        return NULL;
    }
    completion_close(o);
    Py_RETURN_NONE;
}

/* wait(timeout=None) -> IOStats, or None while the save still runs after `timeout` seconds;
 * raises the save's error. */
static PyObject *Completion_wait(PyObject *self, PyObject *args)
{
    PyObject *t_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O:wait", &t_obj)) return NULL;
    double timeout = t_obj == Py_None ? -1.0 : PyFloat_AsDouble(t_obj);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    if (timeout < 0 && t_obj != Py_None) timeout = 0;
    CompletionObject *o = (CompletionObject *)self;
    ckptio_completion *c = completion_get(self);
    if (!c) return NULL;
    o->waiters++;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_completion_wait(c, timeout);
    Py_END_ALLOW_THREADS
    o->waiters--;
    if (rc == -ETIMEDOUT && !ckptio_completion_done(c)) Py_RETURN_NONE;
    if (rc < 0) {
        /* The failure as values too (~8 KiB, so not on the stack); without memory, text only. */
        ckptio_error_info *info = PyMem_Malloc(sizeof *info);
        if (info) {
            info->size = sizeof *info;
            if (ckptio_completion_error_info(c, info) < 0 || info->code != rc) info->code = 0;
        }
        if (o->comm) {
            PyObject *b = PyUnicode_EncodeFSDefault(o->path);
            if (b) ckptio__pydist_raise(o->comm, rc, PyBytes_AS_STRING(b), info);
            Py_XDECREF(b);
        } else {
            ckptio__pyraise(rc, ckptio_completion_errmsg(c),
                            &(ckptio__pywhere){.path = o->path,
                                               .info = info && info->code ? info : NULL});
        }
        PyMem_Free(info);
        return NULL;
    }
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    ckptio_completion_stats(c, &st);
    return ckptio__pystats(&st);
}

static PyObject *Completion_done(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_completion *c = completion_get(self);
    return c ? PyBool_FromLong(ckptio_completion_done(c)) : NULL;
}

static PyObject *Completion_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_completion *c = completion_get(self);
    if (!c) return NULL;
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    int rc = ckptio_completion_stats(c, &st);
    if (rc < 0)
        return ckptio__pyraise(rc, "the save is still running",
                               &(ckptio__pywhere){.path = ((CompletionObject *)self)->path});
    return ckptio__pystats(&st);
}

static PyMethodDef Completion_methods[] = {
    {"wait", Completion_wait, METH_VARARGS,
     "wait(timeout=None) -> IOStats, or None if still running; raises the save's error"},
    {"done", Completion_done, METH_NOARGS, "True once the save has finished"},
    {"stats", Completion_stats, METH_NOARGS, "IOStats of the finished save"},
    {"close", Completion_close, METH_NOARGS, "wait if still running, then release"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Completion_Type =
    ASYNC_TYPE("ckptio._core.Completion", CompletionObject, Completion_dealloc,
               "A save running on a thread of ckptio's (ckptio_completion).", Completion_methods);

/* commit_async(snapshot, writer) -> Completion. On success the completion owns both: the
 * Writer object is left closed, the Snapshot freed. */
static PyObject *mod_commit_async(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *sobj, *wobj;
    if (!PyArg_ParseTuple(args, "OO:commit_async", &sobj, &wobj)) return NULL;
    ckptio_snapshot *s = snapshot_of(sobj);
    ckptio_writer *w = s ? writer_enter(wobj) : NULL;
    if (!w) return NULL;
    ckptio__pyhandle *wh = (ckptio__pyhandle *)wobj;
    ckptio_completion *c = NULL;
    errbuf e = {""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_snapshot_commit_async(s, w, &c);
    errbuf_keep(&e, rc);
    Py_END_ALLOW_THREADS
    wh->busy = 0;
    if (rc < 0) return ckptio__pyraise(rc, e.text, &(ckptio__pywhere){.path = wh->path});
    PyObject *out = completion_new(c, NULL, wh->path);
    if (!out) {
        ckptio_completion_free(c);
        return NULL;
    }
    /* The writer is the completion's now; what Python lent it was flushed by the take. */
    ((SnapshotObject *)sobj)->s = NULL;
    wh->h = NULL;
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(wobj);
    if (t->release) t->release(wh);
    return out;
}

/* save_dist_async(snapshot, path, comm, meta, params, timeout) -> Completion: collective, as
 * save_dist, on a thread of ckptio's that calls `comm` (taking the GIL for each call). */
static PyObject *mod_save_dist_async(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *sobj, *path_obj = NULL, *comm_obj, *meta, *params;
    double timeout;
    if (!PyArg_ParseTuple(args, "OO&OOOd:save_dist_async", &sobj, PyUnicode_FSConverter,
                          &path_obj, &comm_obj, &meta, &params, &timeout))
        return NULL;
    PyObject *result = NULL, *spath = NULL;
    ckptio__pydist d = {0};
    ckptio_comm *comm = NULL;
    ckptio_params p;
    PyObject *empty = PyTuple_New(0);
    ckptio_snapshot *s = empty ? snapshot_of(sobj) : NULL;
    if (!s || ckptio__pyparams(params, &p) < 0 || ckptio__pydist_parse(empty, meta, &d) < 0)
        goto out;
    const char *path = PyBytes_AS_STRING(path_obj);
    spath = PyUnicode_DecodeFSDefault(path);
    comm = spath ? ckptio__pycomm_new(comm_obj) : NULL;
    if (!comm) goto out;
    ckptio_completion *c = NULL;
    errbuf e = {""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_snapshot_save_dist_async(s, path, comm, d.mkeys, d.mvals, d.mlens, d.n_meta, &p,
                                         timeout, &c);
    errbuf_keep(&e, rc);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ckptio__pyraise(rc, e.text, &(ckptio__pywhere){.path = spath});
        goto out;
    }
    result = completion_new(c, comm, spath);
    if (!result) {
        ckptio_completion_free(c);
        goto out;
    }
    comm = NULL; /* the completion's */
    ((SnapshotObject *)sobj)->s = NULL;
out:
    if (comm) ckptio_comm_free(comm);
    ckptio__pydist_release(&d);
    Py_XDECREF(empty);
    Py_XDECREF(spath);
    Py_XDECREF(path_obj);
    return result;
}

/* zip_async(snapshot, zip_writer, records) -> Completion: ckptio_snapshot_zip_async. records:
 * (name, data, align, crc) each, data bytes-like (copied) or an int (the snapshot's item). On
 * success the completion owns both: the ZipWriter object is left closed, the Snapshot freed. */
static PyObject *mod_zip_async(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *sobj, *zobj, *seq_obj;
    if (!PyArg_ParseTuple(args, "OOO:zip_async", &sobj, &zobj, &seq_obj)) return NULL;
    ckptio_snapshot *s = snapshot_of(sobj);
    if (!s) return NULL;
    if (!PyObject_TypeCheck(zobj, &ckptio__pyZipWriter_Type->type)) {
        PyErr_SetString(PyExc_TypeError, "expected a ckptio._core.ZipWriter");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(seq_obj, "zip_async: records must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ckptio_zip_record *rec = PyMem_Calloc((size_t)n + 1, sizeof *rec);
    Py_buffer *views = PyMem_Calloc((size_t)n + 1, sizeof *views);
    Py_ssize_t held = 0;
    PyObject *out = NULL;
    if (!rec || !views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *data;
        unsigned int align;
        int crc;
        rec[i].size = sizeof rec[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sOIp:zip_async record",
                              &rec[i].name, &data, &align, &crc))
            goto done;
        rec[i].align = align;
        rec[i].flags = crc ? 0 : CKPTIO_ZIP_NO_CRC;
        if (PyLong_Check(data)) {
            rec[i].item = PyLong_AsUnsignedLongLong(data);
            if (PyErr_Occurred()) goto done;
            continue;
        }
        if (PyObject_GetBuffer(data, &views[held], PyBUF_SIMPLE) < 0) goto done;
        /* A zero-length record still gives bytes: data NULL would name an item. */
        rec[i].data = views[held].len ? views[held].buf : "";
        rec[i].len = (uint64_t)views[held].len;
        held++;
    }
    ckptio_zip_writer *z = ckptio__pyhandle_enter(zobj);
    if (!z) goto done;
    ckptio__pyhandle *zh = (ckptio__pyhandle *)zobj;
    ckptio_completion *c = NULL;
    errbuf e = {""};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_snapshot_zip_async(s, z, rec, (size_t)n, &c);
    errbuf_keep(&e, rc);
    Py_END_ALLOW_THREADS
    zh->busy = 0;
    if (rc < 0) {
        ckptio__pyraise(rc, e.text, &(ckptio__pywhere){.path = zh->path});
        goto done;
    }
    out = completion_new(c, NULL, zh->path);
    if (!out) {
        ckptio_completion_free(c);
        goto done;
    }
    ((SnapshotObject *)sobj)->s = NULL;
    zh->h = NULL; /* the completion's now */
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(zobj);
    if (t->release) t->release(zh);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(rec);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef async_functions[] = {
    {"zip_async", mod_zip_async, METH_VARARGS,
     "zip_async(snapshot, zip_writer, records) -> Completion: write records (name, bytes or "
     "item index, align, crc) as a zip archive and commit it in the background (both become "
     "the completion's)"},
    {"take", mod_take, METH_VARARGS,
     "take(pool, items, writer=None) -> Snapshot: copy items (as save_dist's) into the pool; "
     "what does not fit is written through writer now"},
    {"commit_async", mod_commit_async, METH_VARARGS,
     "commit_async(snapshot, writer) -> Completion: add the snapshot to writer and commit in "
     "the background (both become the completion's)"},
    {"save_dist_async", mod_save_dist_async, METH_VARARGS,
     "save_dist_async(snapshot, path, comm, meta, params, timeout) -> Completion (collective)"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyasync_register(PyObject *m)
{
    Pool_Type.tp_init = Pool_init;
    Pool_Type.tp_new = PyType_GenericNew;
    PyTypeObject *types[] = {&Pool_Type, &Snapshot_Type, &Completion_Type};
    const char *names[] = {"Pool", "Snapshot", "Completion"};
    for (size_t i = 0; i < 3; i++)
        if (PyType_Ready(types[i]) < 0 ||
            PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
            return -1;
    if (ckptio__pyrecord_type(m, &PoolUsage_Type, &PoolUsage_desc) < 0 ||
        ckptio__pyrecord_type(m, &TakeStats_Type, &TakeStats_desc) < 0 ||
        PyModule_AddIntConstant(m, "SWITCH_AUTO", CKPTIO_AUTO) < 0 ||
        PyModule_AddIntConstant(m, "SWITCH_OFF", CKPTIO_OFF) < 0 ||
        PyModule_AddIntConstant(m, "SWITCH_ON", CKPTIO_ON) < 0)
        return -1;
    return PyModule_AddFunctions(m, async_functions);
}
