/* SPDX-License-Identifier: Apache-2.0 */
/* What every handle type of ckptio._core does alike: open, closed and busy checks, errors. */
#include "_core.h"

#include <stdio.h>
#include <string.h>

static void raise_closed(PyObject *self)
{
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(self);
    if (t->closed_code)
        ckptio__pyraise(t->closed_code, t->closed_msg,
                        &(ckptio__pywhere){.path = ((ckptio__pyhandle *)self)->path});
    else
        PyErr_SetString(PyExc_ValueError, t->closed_msg);
}

void *ckptio__pyhandle_get(PyObject *self)
{
    void *h = ((ckptio__pyhandle *)self)->h;
    if (!h) raise_closed(self);
    return h;
}

/* The handle is used by one thread at a time: a call from a second thread, while the first
 * runs with the GIL released, is refused rather than let into the C library. */
static int busy_enter(PyObject *self)
{
    ckptio__pyhandle *o = (ckptio__pyhandle *)self;
    if (o->busy) {
        PyErr_Format(PyExc_RuntimeError, "%s is in use by another thread",
                     ckptio__pyhandle_type_of(self)->noun);
        return -1;
    }
    o->busy = 1;
    return 0;
}

void *ckptio__pyhandle_enter(PyObject *self)
{
    void *h = ckptio__pyhandle_get(self);
    return h && busy_enter(self) == 0 ? h : NULL;
}

PyObject *ckptio__pyhandle_fail(PyObject *self, int rc, const char *tensor)
{
    ckptio__pyhandle *o = (ckptio__pyhandle *)self;
    const char *msg = o->h ? ckptio__pyhandle_type_of(self)->errmsg(o->h) : NULL;
    return ckptio__pyraise(rc, msg, &(ckptio__pywhere){.path = o->path, .tensor = tensor});
}

int ckptio__pyhandle_leave(PyObject *self, int rc, const char *tensor)
{
    ((ckptio__pyhandle *)self)->busy = 0;
    if (rc < 0) ckptio__pyhandle_fail(self, rc, tensor);
    return rc;
}

/* Close h with the GIL released (a writer's close aborts: it removes what it wrote), then drop
 * what Python lent it. */
static void close_handle(PyObject *self)
{
    ckptio__pyhandle *o = (ckptio__pyhandle *)self;
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(self);
    void *h = o->h;
    o->h = NULL;
    if (h) {
        Py_BEGIN_ALLOW_THREADS
        t->close(h);
        Py_END_ALLOW_THREADS
    }
    if (t->release) t->release(o);
}

int ckptio__pyhandle_init(PyObject *self, PyObject *args, PyObject *kw)
{
    return ckptio__pyhandle_open(self, args, kw, NULL);
}

int ckptio__pyhandle_open(PyObject *self, PyObject *args, PyObject *kw,
                          int (*open)(void **out, const char *path, const ckptio_params *p))
{
    static char *kwlist[] = {"path", "params", NULL};
    ckptio__pyhandle *o = (ckptio__pyhandle *)self;
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(self);
    const char *dot = strrchr(t->type.tp_name, '.');
    char fmt[64];
    if (!open) open = t->open;
    snprintf(fmt, sizeof fmt, "O&|O:%s", dot ? dot + 1 : t->type.tp_name);
    PyObject *path_obj = NULL, *params = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, PyUnicode_FSConverter, &path_obj,
                                     &params))
        return -1;
    ckptio_params p;
    PyObject *path = ckptio__pyparams(params, &p) < 0 ? NULL
                                                      : PyUnicode_DecodeFSDefaultAndSize(
                                                            PyBytes_AS_STRING(path_obj),
                                                            PyBytes_GET_SIZE(path_obj));
    if (!path) {
        Py_DECREF(path_obj);
        return -1;
    }
    if (t->close_first) close_handle(self);
    const char *cpath = PyBytes_AS_STRING(path_obj);
    void *h = NULL;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = open(&h, cpath, &p);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc < 0) {
        ckptio__pyraise(rc, msg, &(ckptio__pywhere){.path = path});
        Py_DECREF(path);
        return -1;
    }
    close_handle(self);
    o->h = h;
    Py_XSETREF(o->path, path);
    return 0;
}

void ckptio__pyhandle_dealloc(PyObject *self)
{
    close_handle(self);
    Py_CLEAR(((ckptio__pyhandle *)self)->path);
    Py_TYPE(self)->tp_free(self);
}

PyObject *ckptio__pyhandle_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (busy_enter(self) < 0) return NULL;
    close_handle(self);
    ((ckptio__pyhandle *)self)->busy = 0;
    Py_RETURN_NONE;
}

PyObject *ckptio__pyhandle_enter_ctx(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

PyObject *ckptio__pyhandle_exit_ctx(PyObject *self, PyObject *args)
{
    (void)args;
    return ckptio__pyhandle_close(self, NULL);
}

PyObject *ckptio__pyhandle_closed(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((ckptio__pyhandle *)self)->h == NULL);
}

PyObject *ckptio__pyhandle_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    void *h = ckptio__pyhandle_get(self);
    if (!h) return NULL;
    ckptio_stats st;
    ckptio__pyhandle_type_of(self)->stats(h, &st);
    return ckptio__pystats(&st);
}

PyObject *ckptio__pyhandle_commit(PyObject *self, PyObject *unused)
{
    (void)unused;
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(self);
    void *h = ckptio__pyhandle_enter(self);
    if (!h) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = t->commit(h);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    ckptio_stats st;
    t->stats(h, &st);
    /* The data is on the device: the sources may go now. */
    if (t->release) t->release((ckptio__pyhandle *)self);
    return ckptio__pystats(&st);
}

PyObject *ckptio__pyhandle_set_roots(PyObject *self, PyObject *seq)
{
    const ckptio__pyhandle_type *t = ckptio__pyhandle_type_of(self);
    void *h = ckptio__pyhandle_enter(self);
    if (!h) return NULL;
    ckptio__pyroots roots;
    if (ckptio__pyroots_get(seq, &roots) < 0) {
        ckptio__pyhandle_leave(self, 0, NULL);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = t->set_roots(h, roots.roots, roots.n);
    Py_END_ALLOW_THREADS
    ckptio__pyroots_free(&roots);
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}
