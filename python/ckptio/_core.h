/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of ckptio._core share: errors as values, I/O params, records, and handles. */
#ifndef CKPTIO_PY_CORE_H
#define CKPTIO_PY_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"

/* --- Errors (_core_values.c) ----------------------------------------------------------------- */

/* Where an error happened, as far as this side knows it; every field may be NULL. They reach
 * Python as the exception's `path`, `tensor` and `rank` attributes, never inside text only;
 * what the library recorded (`info`) adds `file`, `offset`, `other_rank` and `refused`, and
 * its tensor and rank win over the binding's. */
typedef struct {
    PyObject *path;     /* str (borrowed): the checkpoint or file the call was about */
    const char *tensor; /* the tensor involved */
    PyObject *rank;     /* int (borrowed): the rank that raised, in a collective call */
    const ckptio_error_info *info; /* the library's values for this failure */
} ckptio__pywhere;

/* Raise the ckptio.CheckpointError subclass for `code` (ckptio._errors._from_code) carrying `msg`
 * (ckptio_strerror(code) when empty) and `where` (may be NULL). Without where->info, the
 * thread's last error (ckptio_last_error_info) supplies the values when it is this failure:
 * same code, same text. Returns NULL. */
PyObject *ckptio__pyraise(int code, const char *msg, const ckptio__pywhere *where);

/* Add `path`, `tensor` and `rank` (and where->info's values) from `where` to the
 * CheckpointError being raised (one set by another part of the extension), leaving any other
 * exception as it is. */
void ckptio__pyerr_locate(const ckptio__pywhere *where);

/* --- I/O params, dims and records (_core_values.c) ---------------------------------------- */

/* `d`: None (the library's defaults) or the {name: int} dict ckptio._options.params() builds.
 * 0, or -1 with an exception set. */
int ckptio__pyparams(PyObject *d, ckptio_params *p);
/* The settings a ckptio._core.StoreOptions holds into *out (None: NULL); -1 with TypeError for
 * another object. The object keeps them alive. */
int ckptio__pystore(PyObject *obj, const ckptio_store_opts **out);

/* A sequence of ints -> dims of tensor `name` (`out` holds CKPTIO_MAX_NDIM); returns ndim, or -1
 * with an exception set (a longer sequence is a LimitExceeded naming the tensor). */
int ckptio__pydims(PyObject *seq, uint64_t *out, const char *what, const char *name);

/* As ckptio__pydims, and the count must be `ndim` (a ValueError otherwise). 0 or -1. */
int ckptio__pydims_n(PyObject *seq, uint64_t *out, uint32_t ndim, const char *what,
                     const char *name);

PyObject *ckptio__pydims_tuple(const uint64_t *d, uint32_t n);

/* A record (struct sequence) of type `tp` from `n` new references, stolen even on failure; a
 * NULL among them makes the result NULL (the exception is already set). */
PyObject *ckptio__pyrecord(PyTypeObject *tp, PyObject **v, int n);

/* Create the record type of `desc` into *tp (once per process) and add it to `m` (unless NULL:
 * a record only returned, a tuple to the stubs) under the last part of its dotted name. 0, or
 * -1 with an exception set. */
int ckptio__pyrecord_type(PyObject *m, PyTypeObject **tp, PyStructSequence_Desc *desc);

/* IOStats(bytes, io_bytes, tensors, seconds, gbps, backend, direct, alignment). */
PyObject *ckptio__pystats(const ckptio_stats *s);

/* Path-likes -> file system encoded C strings, valid until ckptio__pyroots_free. */
typedef struct {
    PyObject *keep; /* a tuple of the bytes objects the strings lie in */
    const char **roots;
    size_t n;
} ckptio__pyroots;
int ckptio__pyroots_get(PyObject *seq, ckptio__pyroots *out);
void ckptio__pyroots_free(ckptio__pyroots *r);

/* --- Handles (_core_handle.c) ------------------------------------------------------------- */

/* The Python object around one C handle (Writer, Reader, FileWriter); each type's object starts
 * with it. */
typedef struct {
    PyObject_HEAD
    void *h;        /* the open handle; NULL before open and once closed */
    int busy;       /* a thread is inside a call on h, perhaps with the GIL released */
    PyObject *path; /* str: what h was opened on (an error's `path`) */
} ckptio__pyhandle;

/* What differs between handle types. The type object comes first, so that the table of any
 * handle is found from its type: ckptio__pyhandle_type_of(obj). The types are final
 * (no Py_TPFLAGS_BASETYPE), so Py_TYPE(obj) is always one of these. */
typedef struct ckptio__pyhandle_type {
    PyTypeObject type;
    const char *noun;       /* "this writer": a second thread's call is refused naming it */
    int closed_code;        /* a call on a closed handle: CheckpointError(closed_code), or */
    const char *closed_msg; /*   ValueError when closed_code is 0, with this message */
    int close_first;        /* __init__ on an open handle closes it before opening the new one */
    int (*open)(void **out, const char *path, const ckptio_params *p);
    void (*close)(void *h);
    const char *(*errmsg)(const void *h);
    int (*stats)(const void *h, ckptio_stats *st);
    int (*commit)(void *h);                                          /* or NULL */
    int (*set_roots)(void *h, const char *const *roots, size_t n);   /* or NULL */
    void (*release)(ckptio__pyhandle *self); /* or NULL: drop buffers h needed, after commit,
                                                flush and close */
} ckptio__pyhandle_type;

#define ckptio__pyhandle_type_of(obj) ((const ckptio__pyhandle_type *)Py_TYPE(obj))

/* The adapters a handle type's table points to, from the C API's regular names
 * ckptio_<p>_open/close/errmsg/stats (p: writer, reader, file_writer). */
#define CKPTIO_PYHANDLE_OPS(p)                                                                     \
    static int p##_open_any(void **out, const char *path, const ckptio_params *prm)                \
    {                                                                                              \
        ckptio_##p *h = NULL;                                                                      \
        int rc = ckptio_##p##_open(&h, path, prm);                                                 \
        *out = h;                                                                                  \
        return rc;                                                                                 \
    }                                                                                              \
    static void p##_close_any(void *h) { ckptio_##p##_close(h); }                                  \
    static const char *p##_errmsg_any(const void *h) { return ckptio_##p##_errmsg(h); }            \
    static int p##_stats_any(const void *h, ckptio_stats *st) { return ckptio_##p##_stats(h, st); }

/* The PyTypeObject of a handle type: everything but its name, size, doc, methods and getset
 * is common. */
#define CKPTIO_PYHANDLE_TYPE(name, size, doc, methods, getset)                                     \
    {                                                                                              \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = name, .tp_basicsize = size,                       \
        .tp_dealloc = ckptio__pyhandle_dealloc, .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = doc,     \
        .tp_methods = methods, .tp_getset = getset, .tp_init = ckptio__pyhandle_init,              \
        .tp_new = PyType_GenericNew,                                                               \
    }

/* The methods every handle type has: close, __enter__, __exit__ (which closes). */
#define CKPTIO_PYHANDLE_METHODS(close_doc)                                                         \
    {"close", ckptio__pyhandle_close, METH_NOARGS, close_doc},                                     \
        {"__enter__", ckptio__pyhandle_enter_ctx, METH_NOARGS, NULL},                              \
        {"__exit__", ckptio__pyhandle_exit_ctx, METH_VARARGS, NULL}

#define CKPTIO_PYHANDLE_CLOSED                                                                     \
    {"closed", ckptio__pyhandle_closed, NULL, "True once closed", NULL}

/* tp_init: (path, params=None) -> open with the GIL released. */
int ckptio__pyhandle_init(PyObject *self, PyObject *args, PyObject *kw);
/* __init__ with another open than the type's (NULL: the type's), e.g. a Reader of foreign files. */
int ckptio__pyhandle_open(PyObject *self, PyObject *args, PyObject *kw,
                          int (*open)(void **out, const char *path, const ckptio_params *p));
void ckptio__pyhandle_dealloc(PyObject *self);

/* The open handle, or NULL with the type's closed error set. */
void *ckptio__pyhandle_get(PyObject *self);

/* As ckptio__pyhandle_get, and mark the handle busy until ckptio__pyhandle_leave: a second
 * thread's call is refused rather than run on a handle in use. */
void *ckptio__pyhandle_enter(PyObject *self);

/* Clear busy; a negative `rc` (the C call's result) raises the handle's error, naming `tensor`
 * (may be NULL). Returns rc. */
int ckptio__pyhandle_leave(PyObject *self, int rc, const char *tensor);

/* Raise the handle's error for `rc` < 0, naming `tensor` (may be NULL). Returns NULL. */
PyObject *ckptio__pyhandle_fail(PyObject *self, int rc, const char *tensor);

/* Shared methods (the type's table says whether it has them). */
PyObject *ckptio__pyhandle_close(PyObject *self, PyObject *unused);
PyObject *ckptio__pyhandle_enter_ctx(PyObject *self, PyObject *unused);
PyObject *ckptio__pyhandle_exit_ctx(PyObject *self, PyObject *args);
PyObject *ckptio__pyhandle_closed(PyObject *self, void *closure);
PyObject *ckptio__pyhandle_stats(PyObject *self, PyObject *unused);
PyObject *ckptio__pyhandle_commit(PyObject *self, PyObject *unused);
PyObject *ckptio__pyhandle_set_roots(PyObject *self, PyObject *seq);

/* --- Items of a collective or async save (_core_dist.c) ------------------------------------ */

/* save_dist's items [(name, dtype, shape, data, offset, box, flags[, nbytes, stream, owner])]
 * and meta [(key, bytes)], parsed into the C API's arrays; the buffers stay exported (and the
 * strings alive) until ckptio__pydist_release, so the GIL may be released in between. */
typedef struct {
    ckptio_dist_item *items;
    size_t n;
    const char **mkeys;
    const void **mvals;
    size_t *mlens;
    size_t n_meta;
    struct ckptio__pydist_slot *slots;
    PyObject *fitems, *fmeta;
} ckptio__pydist;
/* 0, or -1 with an exception set (nothing left to release). */
int ckptio__pydist_parse(PyObject *items, PyObject *meta, ckptio__pydist *d);
void ckptio__pydist_release(ckptio__pydist *d); /* accepts a zeroed or released one */
/* Raise a collective save's error `rc` on `c` (a table from ckptio__pycomm_new), locating it
 * at `path` and this rank, with the library's values (`info`, may be NULL) when they are rc's. */
void ckptio__pydist_raise(ckptio_comm *c, int rc, const char *path,
                          const ckptio_error_info *info);

/* --- The parts of the module (one file each); each adds its types and functions to `m` -- */

int ckptio__pyvalues_register(PyObject *m); /* _core_values.c: IOStats, PARAMS, errors */
int ckptio__pybuffer_register(PyObject *m); /* _core_buffer.c: Buffer */
/* A Buffer that owns `base` (from ckptio_reader_place: it frees it as ckptio_block_free does),
 * or NULL with an exception set (then `base` is still the caller's). */
PyObject *ckptio__pybuffer_adopt(void *base, Py_ssize_t len);
/* [(Buffer or None, at, capacity, lead)] for n landings in nb placed blocks (each becomes a
 * Buffer that frees it; `blocks` itself is freed), or NULL with an exception set (every block
 * freed). */
PyObject *ckptio__pylandings(ckptio_block *blocks, size_t nb, const ckptio_landing *land,
                             size_t n);
int ckptio__pywriter_register(PyObject *m); /* _core_writer.c: Writer, AddItem, stage_arrays */
int ckptio__pyreader_register(PyObject *m); /* _core_reader.c: Reader and its records */
int ckptio__pyfile_register(PyObject *m);   /* _core_file.c: FileWriter, file_read */
int ckptio__pydist_register(PyObject *m);   /* _core_dist.c: save_dist, remove_stripes */
int ckptio__pygpu_register(PyObject *m);    /* _core_gpu.c: gpu_add, gpu_read, ... */
int ckptio__pyasync_register(PyObject *m);  /* _core_async.c: Pool, take, commit_async... */
int ckptio__pyconvert_register(PyObject *m); /* _core_convert.c: convert, convert_detect */
int ckptio__pypeer_register(PyObject *m);    /* _core_peer.c: PeerServer, peer_push, ... */

/* Set by their files' register functions; gpu_* take a Writer or a Reader. */
extern ckptio__pyhandle_type ckptio__pyWriter_Type, ckptio__pyReader_Type;
/* _core_file.c's ZipWriter type (zip_async takes one). */
extern ckptio__pyhandle_type *const ckptio__pyZipWriter_Type;

/* The destination of a read (_core_buffer.c): a Buffer (fast path) or any writable buffer,
 * plus an offset. Fills *ptr and *avail (bytes from ptr to the end); takes `view` if
 * *have_view. 0, or -1 with an exception set. */
int ckptio__pydst(PyObject *obj, Py_ssize_t off, Py_buffer *view, int *have_view, char **ptr,
                  Py_ssize_t *avail);

#endif /* CKPTIO_PY_CORE_H */
