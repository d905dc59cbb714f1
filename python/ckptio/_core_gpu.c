/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core's GPU memory functions (doc/gpu.md): device pointers and CUstreams as ints. */
#include "_core.h"

static PyStructSequence_Field GpuStats_fields[] = {
    {"path", "\"none\" (no GPU buffer yet), \"staged\", \"gds\" or \"gds+staged\""},
    {"device_bytes", "bytes moved from or to GPU memory"},
    {"gds_bytes", "of which by cuFile straight between GPU memory and the file"},
    {"staging_bytes", "pinned host memory held for the staging ring"},
    {"reason", "why GDS was not used (or not for every file), or \"\""},
    {NULL, NULL},
};
static PyStructSequence_Desc GpuStats_desc = {
    "ckptio._core.GpuStats", "How a handle moved GPU memory (ckptio_gpu_stats).", GpuStats_fields,
    5};
static PyTypeObject *GpuStats_Type;

/* gpu_add(writer, name, dtype, shape, offset, chunk_shape, ptr, nbytes, stream): one tensor
 * (or chunk: offset and chunk_shape not None) from GPU memory. */
static PyObject *mod_gpu_add(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *self;
    const char *name;
    int dtype;
    PyObject *shape, *off_obj, *cs_obj;
    unsigned long long ptr, nbytes, stream;
    if (!PyArg_ParseTuple(args, "O!siOOOKKK:gpu_add", &ckptio__pyWriter_Type.type, &self, &name,
                          &dtype, &shape, &off_obj, &cs_obj, &ptr, &nbytes, &stream))
        return NULL;
    uint64_t dims[CKPTIO_MAX_NDIM], off[CKPTIO_MAX_NDIM], cs[CKPTIO_MAX_NDIM];
    int ndim = ckptio__pydims(shape, dims, "shape", name);
    if (ndim < 0) return NULL;
    const ckptio__pywhere at = {.tensor = name};
    if (off_obj != Py_None && ckptio__pydims(off_obj, off, "chunk offset", name) != ndim)
        return PyErr_Occurred() ? NULL
                                : ckptio__pyraise(CKPTIO_E_USAGE, "gpu_add: offset rank", &at);
    if (cs_obj != Py_None && ckptio__pydims(cs_obj, cs, "chunk shape", name) != ndim)
        return PyErr_Occurred() ? NULL
                                : ckptio__pyraise(CKPTIO_E_USAGE, "gpu_add: chunk shape rank", &at);
    ckptio_writer *w = ckptio__pyhandle_enter(self);
    if (!w) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_writer_add_mem(w, name, dtype, (uint32_t)ndim, dims,
                               off_obj != Py_None ? off : NULL, cs_obj != Py_None ? cs : NULL,
                               (const void *)(uintptr_t)ptr, nbytes, CKPTIO_MEM_CUDA, stream);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, name) < 0) return NULL;
    Py_RETURN_NONE;
}

/* gpu_read(reader, index, offset, shape, ptr, capacity, stream): one region into GPU memory. */
static PyObject *mod_gpu_read(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *self;
    Py_ssize_t index;
    PyObject *off_obj, *shape_obj;
    unsigned long long ptr, cap, stream;
    if (!PyArg_ParseTuple(args, "O!nOOKKK:gpu_read", &ckptio__pyReader_Type.type, &self, &index,
                          &off_obj, &shape_obj, &ptr, &cap, &stream))
        return NULL;
    uint64_t off[CKPTIO_MAX_NDIM], shp[CKPTIO_MAX_NDIM];
    if (off_obj != Py_None && ckptio__pydims(off_obj, off, "region offset", "") < 0) return NULL;
    if (shape_obj != Py_None && ckptio__pydims(shape_obj, shp, "region shape", "") < 0)
        return NULL;
    ckptio_reader *r = ckptio__pyhandle_enter(self);
    if (!r) return NULL;
    ckptio_region reg = {.size = sizeof reg, .memory = CKPTIO_MEM_CUDA, .tensor = (size_t)index,
                         .offset = off_obj != Py_None ? off : NULL,
                         .shape = shape_obj != Py_None ? shp : NULL,
                         .dst = (void *)(uintptr_t)ptr, .capacity = cap, .stream = stream};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_read(r, &reg, 1);
    Py_END_ALLOW_THREADS
    ckptio_tensor_info ti = {.size = sizeof ti};
    const char *tensor =
        rc < 0 && ckptio_reader_tensor(r, (size_t)index, &ti) == 0 ? ti.name : NULL;
    if (ckptio__pyhandle_leave(self, rc, tensor) < 0) return NULL;
    Py_RETURN_NONE;
}

/* gpu_stats(writer or reader) -> GpuStats(path, device_bytes, gds_bytes, staging_bytes, reason) */
static PyObject *mod_gpu_stats(PyObject *mod, PyObject *obj)
{
    (void)mod;
    ckptio_gpu_stats g = {.size = sizeof g};
    int rc = CKPTIO_E_STATE;
    int writer = Py_IS_TYPE(obj, &ckptio__pyWriter_Type.type);
    void *h = writer || Py_IS_TYPE(obj, &ckptio__pyReader_Type.type) ? ((ckptio__pyhandle *)obj)->h
                                                                      : NULL;
    if (h) rc = writer ? ckptio_writer_gpu_stats(h, &g) : ckptio_reader_gpu_stats(h, &g);
    if (rc < 0) return ckptio__pyraise(rc, "gpu_stats: an open Writer or Reader is needed", NULL);
    PyObject *f[5] = {PyUnicode_FromString(g.path), PyLong_FromUnsignedLongLong(g.device_bytes),
                      PyLong_FromUnsignedLongLong(g.gds_bytes),
                      PyLong_FromUnsignedLongLong(g.staging_bytes),
                      PyUnicode_FromString(g.reason)};
    return ckptio__pyrecord(GpuStats_Type, f, 5);
}

/* (mode, why) of ckptio_gpu_probe or ckptio_gpu_route, the GIL released; raises on an error. */
static PyObject *route_answer(int (*fn)(const char *, const ckptio_params *, char *, size_t),
                              const char *dir, const ckptio_params *p)
{
    char why[1024];
    int mode;
    Py_BEGIN_ALLOW_THREADS
    mode = fn(dir, p, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (mode < 0) return ckptio__pyraise(mode, why, NULL);
    return Py_BuildValue("(is)", mode, why);
}

/* gpu_probe(dir, params=None) -> (mode, why): the path GPU buffers would take. */
static PyObject *mod_gpu_probe(PyObject *mod, PyObject *args)
{
    (void)mod;
    const char *dir = NULL;
    PyObject *params = Py_None;
    if (!PyArg_ParseTuple(args, "|zO:gpu_probe", &dir, &params)) return NULL;
    ckptio_params p;
    if (ckptio__pyparams(params, &p) < 0) return NULL;
    return route_answer(ckptio_gpu_probe, dir, &p);
}

/* gpu_route(dir, gpu) -> (mode, why): ckptio_gpu_route with params.gpu = gpu (an int,
 * enum ckptio_gpu_mode): GDS or STAGED (ckptio's path), or OFF (a host copy, and why); raises
 * Unsupported when a path asked for by name cannot run. */
static PyObject *mod_gpu_route(PyObject *mod, PyObject *args)
{
    (void)mod;
    const char *dir = NULL;
    int gpu = CKPTIO_GPU_AUTO;
    if (!PyArg_ParseTuple(args, "zi:gpu_route", &dir, &gpu)) return NULL;
    ckptio_params p;
    ckptio_params_init(&p);
    p.gpu = gpu;
    return route_answer(ckptio_gpu_route, dir, &p);
}

static PyMethodDef gpu_functions[] = {
    {"gpu_add", mod_gpu_add, METH_VARARGS,
     "gpu_add(writer, name, dtype, shape, offset, chunk_shape, ptr, nbytes, stream)"},
    {"gpu_read", mod_gpu_read, METH_VARARGS,
     "gpu_read(reader, index, offset, shape, ptr, capacity, stream): a region into GPU memory"},
    {"gpu_stats", mod_gpu_stats, METH_O,
     "gpu_stats(writer or reader) -> (path, device_bytes, gds_bytes, staging_bytes, reason)"},
    {"gpu_probe", mod_gpu_probe, METH_VARARGS, "gpu_probe(dir=None, params=None) -> (mode, why)"},
    {"gpu_route", mod_gpu_route, METH_VARARGS,
     "gpu_route(dir, gpu) -> (mode, why): ckptio's GPU path (GDS, STAGED) or a host copy (OFF)"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pygpu_register(PyObject *m)
{
    if (ckptio__pyrecord_type(NULL, &GpuStats_Type, &GpuStats_desc) < 0) return -1;
    return PyModule_AddFunctions(m, gpu_functions);
}
