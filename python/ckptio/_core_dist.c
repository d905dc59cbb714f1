/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's collective save (save_dist over a Python communicator) and stripe clean-up. */
#include "_core.h"

#include <limits.h>
#include <string.h>

#include "_comm.h"

/* The fields of a save_dist item; an item in GPU memory has three more. */
enum {
    DI_NAME,
    DI_DTYPE,
    DI_SHAPE,
    DI_DATA, /* a C-contiguous buffer, or in GPU memory the device pointer (int) */
    DI_OFFSET,
    DI_BOX,
    DI_FLAGS,
    DI_N_HOST,
    DI_NBYTES = DI_N_HOST,
    DI_STREAM,
    DI_OWNER, /* keeps the device memory alive; not used here */
    DI_N_GPU
};

/* One parsed item's dims and buffer, which live here while the GIL is released. */
struct ckptio__pydist_slot {
    uint64_t shape[CKPTIO_MAX_NDIM], off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    Py_buffer view;
    int has_view;
};

void ckptio__pydist_release(ckptio__pydist *d)
{
    for (size_t i = 0; d->slots && i < d->n; i++)
        if (d->slots[i].has_view) PyBuffer_Release(&d->slots[i].view);
    PyMem_Free(d->items);
    PyMem_Free(d->slots);
    PyMem_Free(d->mkeys);
    PyMem_Free(d->mvals);
    PyMem_Free(d->mlens);
    Py_XDECREF(d->fitems);
    Py_XDECREF(d->fmeta);
    memset(d, 0, sizeof *d);
}

static int parse_item(PyObject *t, ckptio_dist_item *d, struct ckptio__pydist_slot *s)
{
    Py_ssize_t nf = PyTuple_Check(t) ? PyTuple_GET_SIZE(t) : 0;
    if (nf != DI_N_HOST && nf != DI_N_GPU) {
        PyErr_SetString(PyExc_TypeError, "dist items: each item is (name, dtype, shape, data, "
                                         "offset, box, flags[, nbytes, stream, owner])");
        return -1;
    }
    d->size = sizeof *d;
    d->name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, DI_NAME));
    if (!d->name) return -1;
    d->dtype = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, DI_DTYPE));
    if (d->dtype == -1 && PyErr_Occurred()) return -1;
    int nd = ckptio__pydims(PyTuple_GET_ITEM(t, DI_SHAPE), s->shape, "shape", d->name);
    if (nd < 0) return -1;
    d->ndim = (uint32_t)nd;
    d->shape = s->shape;
    PyObject *off = PyTuple_GET_ITEM(t, DI_OFFSET), *box = PyTuple_GET_ITEM(t, DI_BOX);
    if (off != Py_None) {
        if (ckptio__pydims_n(off, s->off, d->ndim, "offset", d->name) < 0) return -1;
        d->offset = s->off;
    }
    if (box != Py_None) {
        if (ckptio__pydims_n(box, s->box, d->ndim, "box", d->name) < 0) return -1;
        d->box = s->box;
    }
    unsigned long flags = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, DI_FLAGS));
    if (flags == (unsigned long)-1 && PyErr_Occurred()) return -1;
    d->flags = (uint32_t)flags;
    if (nf == DI_N_GPU) { /* GPU memory: a device pointer, size, stream */
        unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, DI_DATA));
        unsigned long long nb = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, DI_NBYTES));
        unsigned long long st = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, DI_STREAM));
        if (PyErr_Occurred()) return -1;
        d->data = (const void *)(uintptr_t)ptr;
        d->nbytes = nb;
        d->memory = CKPTIO_MEM_CUDA;
        d->stream = st;
        return 0;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, DI_DATA), &s->view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    s->has_view = 1;
    d->data = s->view.buf;
    d->nbytes = (uint64_t)s->view.len;
    return 0;
}

int ckptio__pydist_parse(PyObject *items, PyObject *meta, ckptio__pydist *d)
{
    memset(d, 0, sizeof *d);
    d->fitems = PySequence_Fast(items, "dist items must be a sequence");
    d->fmeta = d->fitems ? PySequence_Fast(meta, "dist meta must be a sequence") : NULL;
    if (!d->fmeta) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(d->fitems);
    Py_ssize_t nm = PySequence_Fast_GET_SIZE(d->fmeta);
    d->items = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->items);
    d->slots = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->slots);
    d->mkeys = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *d->mkeys);
    d->mvals = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *d->mvals);
    d->mlens = PyMem_Calloc((size_t)(nm ? nm : 1), sizeof *d->mlens);
    if (!d->items || !d->slots || !d->mkeys || !d->mvals || !d->mlens) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        d->n = (size_t)i + 1; /* the views parsed so far are released on failure */
        if (parse_item(PySequence_Fast_GET_ITEM(d->fitems, i), &d->items[i], &d->slots[i]) < 0)
            goto fail;
    }
    d->n = (size_t)n;
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *kv = PySequence_Fast_GET_ITEM(d->fmeta, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(kv, 1))) {
            PyErr_SetString(PyExc_TypeError, "dist meta is [(str, bytes)]");
            goto fail;
        }
        d->mkeys[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kv, 0));
        if (!d->mkeys[i]) goto fail;
        d->mvals[i] = PyBytes_AS_STRING(PyTuple_GET_ITEM(kv, 1));
        d->mlens[i] = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(kv, 1));
    }
    d->n_meta = (size_t)nm;
    return 0;
fail:
    ckptio__pydist_release(d);
    return -1;
}


/* save_dist(path, comm, items, meta, params, timeout) -> IOStats: ckptio_save_dist on the
 * communicator `comm` (a ckptio.ranks._comm.Communicator) with the GIL released. items: [(name,
 * dtype code, global shape, data (C-contiguous), offset or None, box or None, flags)], or for
 * an item in GPU memory the same with data the device pointer (int) followed by (nbytes,
 * CUstream, owner) (10 fields; the owner is not used here); meta:
 * [(key, bytes)] (used on rank 0 only). Collective: every rank calls it. */
/* The CheckpointError of a failed collective call on this rank: the communicator's (with its
 * Python exception as the cause) or the library's, with the path, this rank, and the values the
 * library recorded (`info`: the rank to blame, the tensor...) when they are this failure's. */
void ckptio__pydist_raise(ckptio_comm *c, int rc, const char *path, const ckptio_error_info *info)
{
    ckptio__pycomm_raise(c, rc);
    PyObject *rank = PyLong_FromLong(c->rank);
    PyObject *where = PyUnicode_DecodeFSDefault(path);
    if (!rank || !where) PyErr_Clear(); /* the save's error is the one to keep */
    ckptio__pyerr_locate(&(ckptio__pywhere){.path = where, .rank = rank,
                                            .info = info && info->code == rc ? info : NULL});
    Py_XDECREF(rank);
    Py_XDECREF(where);
}

static PyObject *mod_save_dist(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *comm_obj, *items, *meta, *params;
    double timeout;
    if (!PyArg_ParseTuple(args, "O&OOOOd:save_dist", PyUnicode_FSConverter, &path_obj, &comm_obj,
                          &items, &meta, &params, &timeout))
        return NULL;
    PyObject *result = NULL;
    ckptio__pydist d = {0};
    ckptio_comm *c = NULL;
    ckptio_error_info *info = NULL;
    ckptio_params p;
    if (ckptio__pyparams(params, &p) < 0 || ckptio__pydist_parse(items, meta, &d) < 0) goto out;
    c = ckptio__pycomm_new(comm_obj);
    if (!c) goto out;
    info = PyMem_Malloc(sizeof *info); /* ~8 KiB; without it, no values */
    if (info) info->size = sizeof *info;
    const char *path = PyBytes_AS_STRING(path_obj);
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_save_dist(path, c, d.items, d.n, d.mkeys, d.mvals, d.mlens, d.n_meta, &p,
                          timeout, &st);
    if (rc < 0 && info && ckptio_last_error_info(info) < 0) info->code = 0;
    Py_END_ALLOW_THREADS
    if (rc < 0)
        ckptio__pydist_raise(c, rc, path, info);
    else
        result = ckptio__pystats(&st);
out:
    PyMem_Free(info);
    if (c) ckptio_comm_free(c);
    ckptio__pydist_release(&d);
    Py_XDECREF(path_obj);
    return result;
}

/* save_dist_refuse(path, comm, code, message, params, timeout): take part in the save_dist of
 * path that the other ranks are making while refusing it (ckptio_save_dist_refuse): every rank
 * fails at once with `code`, this rank's number and `message`. Always raises that error (the
 * lowest refusing or failing rank's), as save_dist does on the other ranks. Collective. */
static PyObject *mod_save_dist_refuse(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *comm_obj, *params;
    int code;
    const char *msg;
    double timeout;
    if (!PyArg_ParseTuple(args, "O&OisOd:save_dist_refuse", PyUnicode_FSConverter, &path_obj,
                          &comm_obj, &code, &msg, &params, &timeout))
        return NULL;
    ckptio_params p;
    ckptio_comm *c = NULL;
    ckptio_error_info *info = NULL;
    if (ckptio__pyparams(params, &p) < 0 || !(c = ckptio__pycomm_new(comm_obj))) goto out;
    info = PyMem_Malloc(sizeof *info);
    if (info) info->size = sizeof *info;
    const char *path = PyBytes_AS_STRING(path_obj);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_save_dist_refuse(path, c, code, msg, &p, timeout);
    if (info && ckptio_last_error_info(info) < 0) info->code = 0;
    Py_END_ALLOW_THREADS
    ckptio__pydist_raise(c, rc < 0 ? rc : CKPTIO_E_USAGE, path, info);
out:
    PyMem_Free(info);
    if (c) ckptio_comm_free(c);
    Py_XDECREF(path_obj);
    return NULL;
}

static int leftovers_remove(const char *path, const ckptio__pyroots *roots)
{
    uint64_t found = 0;
    int rc = ckptio_stripe_leftovers(path, roots->roots, roots->n, 1, &found);
    return rc < 0 ? rc : found > INT32_MAX ? INT32_MAX : (int)found;
}

/* Raise the library's last failure for `path`. */
static PyObject *raise_for(int rc, const char *msg, const char *path)
{
    PyObject *where = PyUnicode_DecodeFSDefault(path);
    if (!where) PyErr_Clear();
    ckptio__pyraise(rc, msg, &(ckptio__pywhere){.path = where});
    Py_XDECREF(where);
    return NULL;
}

/* remove_stripes(path, roots): remove the stripes a save to `path` left in `roots` that the
 * checkpoint at `path` (if any) does not use: what pruning a striped step leaves. */
static PyObject *mod_remove_stripes(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *seq;
    if (!PyArg_ParseTuple(args, "O&O:remove_stripes", PyUnicode_FSConverter, &path_obj, &seq))
        return NULL;
    ckptio__pyroots roots;
    if (ckptio__pyroots_get(seq, &roots) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = leftovers_remove(path, &roots);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    ckptio__pyroots_free(&roots);
    PyObject *ret = rc >= 0 ? PyLong_FromLong(rc) : raise_for(rc, msg, path);
    Py_DECREF(path_obj);
    return ret;
}

static int add_name(void *ctx, const char *name)
{
    PyObject *s = PyUnicode_DecodeFSDefault(name);
    if (!s) return -1;
    int rc = PyList_Append((PyObject *)ctx, s);
    Py_DECREF(s);
    return rc < 0 ? -1 : 0;
}

/* ---- StoreOptions: a store's settings (ckptio_store_opts), made once per distinct mapping ---- */

typedef struct {
    PyObject_HEAD
    ckptio_store_opts *o;
} StoreOptions;

/* StoreOptions(mapping): each str key a setting ckptio_store_opts_set takes, each value a str
 * (None: not set). Immutable once made. */
static int store_init(PyObject *self, PyObject *args, PyObject *kw)
{
    StoreOptions *s = (StoreOptions *)self;
    PyObject *map = NULL;
    static char *names[] = {"settings", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!:StoreOptions", names, &PyDict_Type, &map))
        return -1;
    if (s->o) {
        PyErr_SetString(PyExc_RuntimeError, "StoreOptions already made");
        return -1;
    }
    if (ckptio_store_opts_new(&s->o) < 0) return PyErr_NoMemory(), -1;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(map, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || (v != Py_None && !PyUnicode_Check(v))) {
            PyErr_Format(PyExc_TypeError, "storage_options: %R: keys and values must be str", k);
            return -1;
        }
        const char *ks = PyUnicode_AsUTF8(k), *vs = v == Py_None ? NULL : PyUnicode_AsUTF8(v);
        if (!ks || (v != Py_None && !vs)) return -1;
        int rc = ckptio_store_opts_set(s->o, ks, vs);
        if (rc < 0) {
            ckptio__pyraise(rc, ckptio_last_error(), NULL);
            return -1;
        }
    }
    return 0;
}

static void store_dealloc(PyObject *self)
{
    ckptio_store_opts_free(((StoreOptions *)self)->o); /* wipes the secrets it holds */
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject StoreOptionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ckptio._core.StoreOptions",
    .tp_basicsize = sizeof(StoreOptions),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StoreOptions(settings): an object store's settings (endpoint_url, region, "
              "profile, credentials, ca_bundle...), for the calls given them",
    .tp_new = PyType_GenericNew,
    .tp_init = store_init,
    .tp_dealloc = store_dealloc,
};

int ckptio__pystore(PyObject *obj, const ckptio_store_opts **out)
{
    *out = NULL;
    if (!obj || obj == Py_None) return 0;
    if (!PyObject_TypeCheck(obj, &StoreOptionsType)) {
        PyErr_Format(PyExc_TypeError, "store must be a ckptio._core.StoreOptions, not %s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = ((StoreOptions *)obj)->o;
    return 0;
}

/* list_checkpoints(prefix, store=None) -> [names]: the committed checkpoints directly under a
 * directory or an object store's prefix. The names are gathered with the GIL held (the listing
 * of a directory or a bucket is short next to a save). */
static PyObject *mod_list_checkpoints(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL, *store = Py_None;
    const ckptio_store_opts *so;
    if (!PyArg_ParseTuple(args, "O&|O:list_checkpoints", PyUnicode_FSConverter, &path_obj, &store))
        return NULL;
    if (ckptio__pystore(store, &so) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    const char *path = PyBytes_AS_STRING(path_obj);
    int rc = out ? ckptio_list_checkpoints_with(path, so, add_name, out) : -1;
    PyObject *ret = out;
    if (rc == -1 && PyErr_Occurred()) ret = NULL;
    else if (rc < 0) ret = raise_for(rc, ckptio_last_error(), path);
    if (!ret) Py_XDECREF(out);
    Py_DECREF(path_obj);
    return ret;
}

/* Call fn(path, store) without the GIL (args: a path, and optionally StoreOptions or None);
 * its result (>= 0), or the library's error raised, naming path. */
static int path_call(PyObject *args, const char *format,
                     int (*fn)(const char *, const ckptio_store_opts *))
{
    PyObject *path_obj = NULL, *store = Py_None;
    const ckptio_store_opts *so;
    if (!PyArg_ParseTuple(args, format, PyUnicode_FSConverter, &path_obj, &store)) return -1;
    if (ckptio__pystore(store, &so) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    int rc;
    char msg[1024] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = fn(path, so);
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ckptio_last_error());
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        raise_for(rc, msg, path);
        rc = -1;
    }
    Py_DECREF(path_obj);
    return rc;
}

/* remove_checkpoint(path): remove a committed checkpoint (a directory or an s3:// URL). */
static PyObject *mod_remove_checkpoint(PyObject *mod, PyObject *args)
{
    (void)mod;
    return path_call(args, "O&|O:remove_checkpoint", ckptio_remove_checkpoint_with) < 0
               ? NULL
               : Py_NewRef(Py_None);
}

/* sweep(prefix) -> int: remove what killed saves and removals left under prefix. */
static PyObject *mod_sweep(PyObject *mod, PyObject *args)
{
    (void)mod;
    int rc = path_call(args, "O&|O:sweep", ckptio_sweep_with);
    return rc < 0 ? NULL : PyLong_FromLong(rc);
}

/* is_checkpoint(path) -> bool: whether a directory or s3:// URL holds a manifest. */
static PyObject *mod_is_checkpoint(PyObject *mod, PyObject *args)
{
    (void)mod;
    int rc = path_call(args, "O&|O:is_checkpoint", ckptio_is_checkpoint_with);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* store_name(path) -> "posix" | "s3": the kind of store serving path; an unknown
 * "<scheme>://" raises (the one URL parser is the library's). */
static PyObject *mod_store_name(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&:store_name", PyUnicode_FSConverter, &path_obj)) return NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    const char *name = ckptio_store_name(path); /* no I/O: the GIL stays */
    PyObject *ret = name ? PyUnicode_FromString(name) : NULL;
    if (!name) raise_for(CKPTIO_E_USAGE, ckptio_last_error(), path);
    Py_DECREF(path_obj);
    return ret;
}

static PyMethodDef dist_functions[] = {
    {"store_name", mod_store_name, METH_VARARGS,
     "store_name(path) -> 'posix' or 's3': the kind of store that serves path"},
    {"is_checkpoint", mod_is_checkpoint, METH_VARARGS,
     "is_checkpoint(path, store=None) -> whether path (a directory or URL) holds a manifest"},
    {"list_checkpoints", mod_list_checkpoints, METH_VARARGS,
     "list_checkpoints(prefix, store=None) -> names of the committed checkpoints under prefix"},
    {"remove_checkpoint", mod_remove_checkpoint, METH_VARARGS,
     "remove_checkpoint(path, store=None): remove a committed checkpoint (a directory or URL)"},
    {"sweep", mod_sweep, METH_VARARGS,
     "sweep(prefix, store=None) -> how many leftovers of killed saves and removals under prefix "
     "were removed"},
    {"remove_stripes", mod_remove_stripes, METH_VARARGS,
     "remove_stripes(path, roots) -> how many unused stripes of path were removed"},
    {"save_dist", mod_save_dist, METH_VARARGS,
     "save_dist(path, comm, items, meta, params, timeout) -> IOStats (collective)"},
    {"save_dist_refuse", mod_save_dist_refuse, METH_VARARGS,
     "save_dist_refuse(path, comm, code, message, params, timeout): take part refusing; raises"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pydist_register(PyObject *m)
{
    if (PyType_Ready(&StoreOptionsType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "StoreOptions", (PyObject *)&StoreOptionsType) < 0) return -1;
    return PyModule_AddFunctions(m, dist_functions);
}
