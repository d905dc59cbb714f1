/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's peer tier: PeerServer, peer_push, peer_fetch, part_copy and part_spread (ckptio_peer_*, ckptio_part_*). */
#include "_core.h"

typedef struct {
    PyObject_HEAD
    ckptio_peer *peer;
} PeerServer;

static PyObject *raise_at(int rc, const char *msg, const char *path)
{
    PyObject *where = path ? PyUnicode_DecodeFSDefault(path) : NULL;
    if (path && !where) PyErr_Clear();
    ckptio__pyraise(rc, msg, &(ckptio__pywhere){.path = where});
    Py_XDECREF(where);
    return NULL;
}

/* PeerServer(root, addr, port, key): serves and receives the parts under root. */
static int peer_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"root", "addr", "port", "key", NULL};
    PeerServer *s = (PeerServer *)self;
    PyObject *root = NULL;
    const char *addr = NULL;
    int port = 0;
    Py_buffer key = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&ziy*:PeerServer", names, PyUnicode_FSConverter,
                                     &root, &addr, &port, &key))
        return -1;
    ckptio_peer_opts o = {.key = key.buf, .key_len = (size_t)key.len};
    if (s->peer) {
        PyBuffer_Release(&key);
        Py_DECREF(root);
        PyErr_SetString(PyExc_RuntimeError, "PeerServer already open");
        return -1;
    }
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_peer_open(&s->peer, PyBytes_AS_STRING(root), addr, port, &o);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&key);
    if (rc < 0) raise_at(rc, msg, PyBytes_AS_STRING(root));
    Py_DECREF(root);
    return rc < 0 ? -1 : 0;
}

static PyObject *peer_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    PeerServer *s = (PeerServer *)self;
    ckptio_peer *p = s->peer;
    s->peer = NULL;
    Py_BEGIN_ALLOW_THREADS
    ckptio_peer_close(p);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void peer_dealloc(PyObject *self)
{
    ckptio_peer_close(((PeerServer *)self)->peer);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *peer_port(PyObject *self, void *closure)
{
    (void)closure;
    PeerServer *s = (PeerServer *)self;
    if (!s->peer) return PyErr_Format(PyExc_ValueError, "PeerServer is closed");
    return PyLong_FromLong(ckptio_peer_port(s->peer));
}

static PyMethodDef peer_methods[] = {
    {"close", peer_close, METH_NOARGS, "stop serving; transfers in progress are broken off"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef peer_getset[] = {
    {"port", peer_port, NULL, "the port it listens on", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PeerServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.PeerServer",
    .tp_basicsize = sizeof(PeerServer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PeerServer(root, addr, port, key): a rank's server of the parts under root, to "
              "the holders of the job's key (ckptio_peer_open)",
    .tp_new = PyType_GenericNew,
    .tp_init = peer_init,
    .tp_dealloc = peer_dealloc,
    .tp_methods = peer_methods,
    .tp_getset = peer_getset,
};

/* Options from (timeout, max_rate, verify, key: a buffer, or one with buf NULL). */
static ckptio_peer_opts opts_of(double timeout, unsigned long long rate, int verify, const Py_buffer *key)
{
    return (ckptio_peer_opts){.timeout = timeout, .max_rate = rate,
                              .flags = verify ? CKPTIO_PEER_VERIFY : 0, .key = key->buf,
                              .key_len = (size_t)key->len};
}

/* peer_push(src, host, port, name, timeout, max_rate, key) -> bytes sent */
static PyObject *mod_peer_push(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *src = NULL;
    const char *host, *name;
    int port;
    double timeout;
    unsigned long long rate;
    Py_buffer key = {0};
    if (!PyArg_ParseTuple(args, "O&sisdKz*:peer_push", PyUnicode_FSConverter, &src, &host, &port,
                          &name, &timeout, &rate, &key))
        return NULL;
    ckptio_peer_opts o = opts_of(timeout, rate, 1, &key);
    uint64_t bytes = 0;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_peer_push(PyBytes_AS_STRING(src), host, port, name, &o, &bytes);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&key);
    PyObject *ret = rc < 0 ? raise_at(rc, msg, PyBytes_AS_STRING(src))
                           : PyLong_FromUnsignedLongLong(bytes);
    Py_DECREF(src);
    return ret;
}

/* peer_fetch(host, port, name, dst, timeout, verify, key) -> bytes received */
static PyObject *mod_peer_fetch(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *dst = NULL;
    const char *host, *name;
    int port, verify;
    double timeout;
    Py_buffer key = {0};
    if (!PyArg_ParseTuple(args, "sisO&dpz*:peer_fetch", &host, &port, &name, PyUnicode_FSConverter,
                          &dst, &timeout, &verify, &key))
        return NULL;
    ckptio_peer_opts o = opts_of(timeout, 0, verify, &key);
    uint64_t bytes = 0;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_peer_fetch(host, port, name, PyBytes_AS_STRING(dst), &o, &bytes);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&key);
    PyObject *ret = rc < 0 ? raise_at(rc, msg, PyBytes_AS_STRING(dst))
                           : PyLong_FromUnsignedLongLong(bytes);
    Py_DECREF(dst);
    return ret;
}

/* part_copy(src, dst, verify) -> bytes copied */
static PyObject *mod_part_copy(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *src = NULL, *dst = NULL;
    int verify;
    if (!PyArg_ParseTuple(args, "O&O&p:part_copy", PyUnicode_FSConverter, &src,
                          PyUnicode_FSConverter, &dst, &verify)) {
        Py_XDECREF(src);
        return NULL;
    }
    Py_buffer none = {0};
    ckptio_peer_opts o = opts_of(0, 0, verify, &none);
    uint64_t bytes = 0;
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_part_copy(PyBytes_AS_STRING(src), PyBytes_AS_STRING(dst), &o, &bytes);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    PyObject *ret = rc < 0 ? raise_at(rc, msg, PyBytes_AS_STRING(dst))
                           : PyLong_FromUnsignedLongLong(bytes);
    Py_DECREF(src);
    Py_DECREF(dst);
    return ret;
}

/* part_spread(src, name, dests, timeout, max_rate, verify, key) -> [(rc, bytes, errname, message)]
 * dests: (host, port) for a peer, a path for a directory; one entry per dest, rc 0 for those
 * that have the part. */
static PyObject *mod_part_spread(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *src = NULL, *seq = NULL, *dests = NULL, *out = NULL;
    const char *name;
    double timeout;
    unsigned long long rate;
    int verify;
    Py_buffer key = {0};
    if (!PyArg_ParseTuple(args, "O&sOdKpz*:part_spread", PyUnicode_FSConverter, &src, &name, &dests,
                          &timeout, &rate, &verify, &key))
        return NULL;
    seq = PySequence_Fast(dests, "part_spread: dests must be a sequence");
    Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    ckptio_part_dest *d = seq && n ? PyMem_Calloc((size_t)n, sizeof *d) : NULL;
    PyObject **keep = seq && n ? PyMem_Calloc((size_t)n, sizeof *keep) : NULL; /* dst bytes */
    if (seq && n && (!d || !keep)) PyErr_NoMemory();
    for (Py_ssize_t i = 0; d && keep && !PyErr_Occurred() && i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        d[i].size = sizeof d[i];
        if (PyTuple_Check(x)) {
            if (!PyArg_ParseTuple(x, "si:part_spread destination", &d[i].host, &d[i].port)) break;
        } else if (!PyUnicode_FSConverter(x, &keep[i])) {
            break;
        } else {
            d[i].dst = PyBytes_AS_STRING(keep[i]);
        }
    }
    if (seq && !PyErr_Occurred()) {
        ckptio_peer_opts o = opts_of(timeout, rate, verify, &key);
        int rc;
        char msg[1024] = "";
        Py_BEGIN_ALLOW_THREADS
        rc = ckptio_part_spread(PyBytes_AS_STRING(src), name, d, (size_t)n, &o);
        if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
        Py_END_ALLOW_THREADS
        if (rc < 0 && (n == 0 || rc == CKPTIO_E_USAGE)) {
            raise_at(rc, msg, PyBytes_AS_STRING(src));
        } else if ((out = PyList_New(n))) {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *t = Py_BuildValue("iKzs", d[i].rc, (unsigned long long)d[i].bytes,
                                            d[i].rc ? ckptio_errname(d[i].rc) : NULL, d[i].errmsg);
                if (!t) {
                    Py_CLEAR(out);
                    break;
                }
                PyList_SET_ITEM(out, i, t);
            }
        }
    }
    for (Py_ssize_t i = 0; keep && i < n; i++) Py_XDECREF(keep[i]);
    PyMem_Free(keep);
    PyMem_Free(d);
    Py_XDECREF(seq);
    PyBuffer_Release(&key);
    Py_DECREF(src);
    return out;
}

static PyMethodDef peer_functions[] = {
    {"peer_push", mod_peer_push, METH_VARARGS,
     "peer_push(src, host, port, name, timeout, max_rate, key) -> bytes sent (the peer "
     "verified and published the part)"},
    {"peer_fetch", mod_peer_fetch, METH_VARARGS,
     "peer_fetch(host, port, name, dst, timeout, verify, key) -> bytes received"},
    {"part_copy", mod_part_copy, METH_VARARGS, "part_copy(src, dst, verify) -> bytes copied"},
    {"part_spread", mod_part_spread, METH_VARARGS,
     "part_spread(src, name, dests, timeout, max_rate, verify, key) -> [(rc, bytes, errname, "
     "message)] per destination: (host, port) a peer, a path a directory; one read of the part"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pypeer_register(PyObject *m)
{
    if (PyType_Ready(&PeerServerType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "PeerServer", (PyObject *)&PeerServerType) < 0) return -1;
    return PyModule_AddFunctions(m, peer_functions);
}
