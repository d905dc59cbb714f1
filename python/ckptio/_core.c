/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core: the thin, private CPython binding of include/ckptio.h under the Python API. */
#include "_core.h"

#include "_comm.h"
#include "_lazy.h"
#include "_st.h"

/* The module is put together from one file per object: _core_values.c (errors, params,
 * records), _core_handle.c (what Writer, Reader and FileWriter share), _core_buffer.c,
 * _core_writer.c, _core_reader.c, _core_file.c, _core_dist.c, _core_gpu.c, _core_async.c and _core_convert.c; _comm.c, _st.c
 * and _lazy.c add the communicators, the safetensors header and the Mapper. */

static PyObject *mod_describe_system(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *dir_obj = NULL;
    if (!PyArg_ParseTuple(args, "|O&:describe_system", PyUnicode_FSConverter, &dir_obj))
        return NULL;
    const char *dir = dir_obj ? PyBytes_AS_STRING(dir_obj) : NULL;
    char small[4096];
    int need;
    Py_BEGIN_ALLOW_THREADS
    need = ckptio_describe_system(dir, small, sizeof small);
    Py_END_ALLOW_THREADS
    PyObject *res;
    if (need < (int)sizeof small) {
        res = PyUnicode_FromString(small);
    } else {
        char *big = PyMem_Malloc((size_t)need + 1);
        if (!big) {
            Py_XDECREF(dir_obj);
            return PyErr_NoMemory();
        }
        ckptio_describe_system(dir, big, (size_t)need + 1);
        res = PyUnicode_FromString(big);
        PyMem_Free(big);
    }
    Py_XDECREF(dir_obj);
    return res;
}

static PyMethodDef module_methods[] = {
    {"describe_system", mod_describe_system, METH_VARARGS, "describe_system(dir=None) -> str"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ckptio._core",
    .m_doc = "Private binding of libckptio; use the ckptio package instead.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__core(void)
{
    /* Values first: every other part raises its errors through them. */
    int (*const parts[])(PyObject *) = {
        ckptio__pyvalues_register, ckptio__pybuffer_register, ckptio__pywriter_register,
        ckptio__pyreader_register, ckptio__pyfile_register,   ckptio__pydist_register,
        ckptio__pygpu_register,    ckptio__pyasync_register, ckptio__pycomm_register,   ckptio__pyst_register,
        ckptio__pylazy_register,   ckptio__pyconvert_register, ckptio__pypeer_register,
    };
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i](m) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    if (PyModule_AddStringConstant(m, "version", ckptio_version_string()) < 0 ||
        PyModule_AddIntConstant(m, "format_version", (long)ckptio_format_version()) < 0 ||
        PyModule_AddIntConstant(m, "alignment", (long)ckptio_alignment()) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NDIM", CKPTIO_MAX_NDIM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NAME", CKPTIO_MAX_NAME) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
