/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio._core.Reader (ckptio_reader): a checkpoint's tensors, chunks and metadata, and reads. */
#include "_core.h"
#include "_comm.h"

#include <stdio.h>

static PyStructSequence_Field TensorRecord_fields[] = {
    {"name", NULL}, {"dtype", "on-disk dtype code"}, {"shape", NULL},
    {"nbytes", NULL}, {"num_chunks", NULL}, {NULL, NULL},
};
static PyStructSequence_Desc TensorRecord_desc = {
    "ckptio._core.TensorRecord", "One stored tensor (ckptio_tensor_info).", TensorRecord_fields, 5};
static PyTypeObject *TensorRecord_Type;

static PyStructSequence_Field ChunkRecord_fields[] = {
    {"offset", NULL}, {"shape", NULL}, {"file", NULL}, {"file_offset", NULL},
    {"stored_bytes", NULL}, {"nbytes", NULL}, {NULL, NULL},
};
static PyStructSequence_Desc ChunkRecord_desc = {
    "ckptio._core.ChunkRecord", "One stored chunk (ckptio_chunk_info).", ChunkRecord_fields, 6};
static PyTypeObject *ChunkRecord_Type;

/* What Reader.read takes. */
enum { RD_TENSOR, RD_OFFSET, RD_SHAPE, RD_DST, RD_DST_OFFSET, RD_CAPACITY, RD_LEAD, RD_N };
static PyStructSequence_Field ReadRegion_fields[] = {
    {"tensor", "the tensor's index in Reader.tensors()"},
    {"offset", "the region's offset in the tensor, or None for all of it"},
    {"shape", "the region's shape, or None"},
    {"dst", "a writable buffer (a Buffer reads fastest)"},
    {"dst_offset", "where in dst the region lands"},
    {"capacity", "bytes of dst the read may use (the region's bytes, rounded up to the "
                 "alignment for in-place direct reads)"},
    {"lead", "bytes of dst before dst_offset that the read may overwrite (ckptio_region.lead)"},
    {NULL, NULL},
};
static PyStructSequence_Desc ReadRegion_desc = {
    "ckptio._core.ReadRegion", "One region to read: ReadRegion((index, offset, shape, dst, "
    "dst_offset, capacity, lead)).", ReadRegion_fields, RD_N};
static PyTypeObject *ReadRegion_Type;

static PyStructSequence_Field ReadStats_fields[] = {
    {"cache_bytes", "stored bytes copied from the page cache"},
    {"device_bytes", "bytes read through the I/O backend"},
    {"requests", "requests handed to the I/O backend"},
    {"merged", "small in-place reads of neighbouring ranges merged into others"},
    {"verify_threads", "threads that verified and copied cached ranges"},
    {NULL, NULL},
};
static PyStructSequence_Desc ReadStats_desc = {
    "ckptio._core.ReadStats", "Where a reader's bytes came from (ckptio_read_stats).",
    ReadStats_fields, 5};
static PyTypeObject *ReadStats_Type;


/* The name of tensor `index` (valid while the reader is open), or NULL: an error about one
 * region names its tensor. */
static const char *tensor_name(const ckptio_reader *r, size_t index)
{
    ckptio_tensor_info ti = {.size = sizeof ti};
    return ckptio_reader_tensor(r, index, &ti) == 0 ? ti.name : NULL;
}

/* [TensorRecord(name, dtype, shape, nbytes, num_chunks), ...] in name order. */
static PyObject *Reader_tensors(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    size_t n = ckptio_reader_num_tensors(r);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        int rc = ckptio_reader_tensor(r, i, &ti);
        if (rc < 0) {
            Py_DECREF(list);
            return ckptio__pyhandle_fail(self, rc, NULL);
        }
        PyObject *f[5] = {PyUnicode_FromString(ti.name), PyLong_FromLong(ti.dtype),
                          ckptio__pydims_tuple(ti.shape, ti.ndim),
                          PyLong_FromUnsignedLongLong(ti.nbytes),
                          PyLong_FromUnsignedLongLong(ti.num_chunks)};
        PyObject *t = ckptio__pyrecord(TensorRecord_Type, f, 5);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *Reader_find(PyObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:find", &name)) return NULL;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    int64_t i = ckptio_reader_find(r, name);
    return PyLong_FromLongLong(i < 0 ? -1 : i);
}

/* [ChunkRecord(offset, shape, file, file_offset, stored_bytes, nbytes), ...] of tensor `index`. */
static PyObject *Reader_chunks(PyObject *self, PyObject *args)
{
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "n:chunks", &index)) return NULL;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    ckptio_tensor_info ti = {.size = sizeof ti};
    int rc = index < 0 ? CKPTIO_E_NOT_FOUND : ckptio_reader_tensor(r, (size_t)index, &ti);
    if (rc < 0) return ckptio__pyhandle_fail(self, rc, NULL);
    PyObject *list = PyList_New((Py_ssize_t)ti.num_chunks);
    if (!list) return NULL;
    for (uint64_t c = 0; c < ti.num_chunks; c++) {
        ckptio_chunk_info ci;
        rc = ckptio_reader_chunk(r, (size_t)index, (size_t)c, &ci);
        if (rc < 0) {
            Py_DECREF(list);
            return ckptio__pyhandle_fail(self, rc, ti.name);
        }
        PyObject *f[6] = {ckptio__pydims_tuple(ci.offset, ti.ndim),
                          ckptio__pydims_tuple(ci.shape, ti.ndim), PyUnicode_FromString(ci.file),
                          PyLong_FromUnsignedLongLong(ci.file_offset),
                          PyLong_FromUnsignedLongLong(ci.stored_bytes),
                          PyLong_FromUnsignedLongLong(ci.nbytes)};
        PyObject *t = ckptio__pyrecord(ChunkRecord_Type, f, 6);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)c, t);
    }
    return list;
}

static PyObject *Reader_meta(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    size_t n = ckptio_reader_num_meta(r);
    for (size_t i = 0; i < n; i++) {
        const char *key;
        const void *val;
        size_t len;
        int rc = ckptio_reader_meta(r, i, &key, &val, &len);
        if (rc < 0) {
            Py_DECREF(d);
            return ckptio__pyhandle_fail(self, rc, NULL);
        }
        PyObject *v = PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
        if (!v || PyDict_SetItemString(d, key, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *Reader_get_meta(PyObject *self, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s:get_meta", &key)) return NULL;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    const void *val;
    size_t len;
    int rc = ckptio_reader_get_meta(r, key, &val, &len);
    if (rc == CKPTIO_E_NOT_FOUND) Py_RETURN_NONE;
    if (rc < 0) return ckptio__pyhandle_fail(self, rc, NULL);
    return PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
}

static PyObject *Reader_digest(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    unsigned char d[32];
    int rc = ckptio_reader_digest(r, d);
    if (rc < 0) return ckptio__pyhandle_fail(self, rc, NULL);
    return PyBytes_FromStringAndSize((const char *)d, sizeof d);
}

/* Tensor, offset and shape of region tuple t (ReadRegion's first three fields) into *rg; its
 * offset and shape go to dims + *used. */
static int parse_box(PyObject *self, ckptio_reader *r, PyObject *t, ckptio_region *rg,
                     uint64_t *dims, size_t *used_)
{
    size_t used = *used_;
    Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, RD_TENSOR));
    if (index == -1 && PyErr_Occurred()) return -1;
    if (index < 0) {
        PyErr_SetString(PyExc_ValueError, "read: tensor index is negative");
        return -1;
    }
    rg->size = sizeof *rg;
    rg->memory = CKPTIO_MEM_HOST;
    rg->name = NULL;
    rg->tensor = (size_t)index;
    PyObject *o = PyTuple_GET_ITEM(t, RD_OFFSET), *s = PyTuple_GET_ITEM(t, RD_SHAPE);
    if (o != Py_None || s != Py_None) {
        /* The library reads ndim values from each: a shorter tuple must not get there. */
        ckptio_tensor_info ti = {.size = sizeof ti};
        int rc = ckptio_reader_tensor(r, (size_t)index, &ti);
        if (rc < 0) {
            ckptio__pyhandle_fail(self, rc, NULL);
            return -1;
        }
        PyObject *dims_of[2] = {o, s};
        const char *what[2] = {"region offset", "region shape"};
        for (int k = 0; k < 2; k++) {
            if (dims_of[k] == Py_None) continue;
            int nd = ckptio__pydims(dims_of[k], dims + used, what[k], ti.name);
            if (nd < 0) return -1;
            if ((uint32_t)nd != ti.ndim) {
                char msg[CKPTIO_MAX_NAME + 160];
                snprintf(msg, sizeof msg,
                         "%s: tensor '%s' has %u dimensions; the %s has %d values",
                         ckptio_reader_path(r), ti.name, ti.ndim, what[k], nd);
                ckptio__pywhere at = {.path = ((ckptio__pyhandle *)self)->path,
                                      .tensor = ti.name};
                ckptio__pyraise(CKPTIO_E_SHAPE, msg, &at);
                return -1;
            }
            if (k == 0)
                rg->offset = dims + used;
            else
                rg->shape = dims + used;
            used += CKPTIO_MAX_NDIM;
        }
    }
    *used_ = used;
    return 0;
}

/* One ckptio_reader_read call for all regions, with the GIL released; with `share`, one
 * ckptio_reader_read_shared call. */
static int read_regions(PyObject *self, PyObject *seq, ckptio_share *share)
{
    ckptio_reader *r = ckptio__pyhandle_enter(self);
    if (!r) return -1;
    PyObject *fast = PySequence_Fast(seq, "read expects a sequence of regions");
    ckptio_region *regs = NULL;
    uint64_t *dims = NULL;
    Py_buffer *views = NULL;
    size_t n_views = 0;
    if (!fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    size_t nr = (size_t)(n ? n : 1);
    regs = PyMem_Calloc(nr, sizeof *regs);
    views = PyMem_Calloc(nr, sizeof *views);
    /* Offsets and shapes: allocated as needed in one array of 2 * ndim per region. */
    size_t n_dims = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        if (!PyTuple_Check(t) || (PyTuple_GET_SIZE(t) != RD_N && PyTuple_GET_SIZE(t) != RD_LEAD)) {
            PyErr_SetString(PyExc_TypeError, "read: region must be (index, offset, shape, dst, "
                                             "dst_offset, capacity[, lead])");
            goto out;
        }
        if (PyTuple_GET_ITEM(t, RD_OFFSET) != Py_None || PyTuple_GET_ITEM(t, RD_SHAPE) != Py_None)
            n_dims += 2 * CKPTIO_MAX_NDIM;
    }
    dims = PyMem_Malloc(sizeof *dims * (n_dims ? n_dims : 1));
    if (!regs || !views || !dims) {
        PyErr_NoMemory();
        goto out;
    }
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        ckptio_region *rg = &regs[i];
        if (parse_box(self, r, t, rg, dims, &used) < 0) goto out;
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, RD_DST_OFFSET));
        if (off == -1 && PyErr_Occurred()) goto out;
        unsigned long long cap = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, RD_CAPACITY));
        if (cap == (unsigned long long)-1 && PyErr_Occurred()) goto out;
        unsigned long long lead = 0; /* a plain 6-tuple has no lead */
        if (PyTuple_GET_SIZE(t) == RD_N) {
            lead = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, RD_LEAD));
            if (lead == (unsigned long long)-1 && PyErr_Occurred()) goto out;
        }
        if (lead > (unsigned long long)off) {
            PyErr_SetString(PyExc_ValueError, "read: lead is larger than dst_offset");
            goto out;
        }
        rg->lead = lead;
        char *ptr;
        Py_ssize_t avail;
        int have_view;
        if (ckptio__pydst(PyTuple_GET_ITEM(t, RD_DST), off, &views[n_views], &have_view, &ptr,
                          &avail) < 0)
            goto out;
        if (have_view) n_views++;
        if (cap > (unsigned long long)avail) {
            PyErr_Format(PyExc_ValueError,
                         "read: capacity %llu exceeds the %zd bytes left in the destination", cap,
                         avail);
            goto out;
        }
        rg->dst = ptr;
        rg->capacity = cap;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = share ? ckptio_reader_read_shared(r, regs, (size_t)n, share)
               : ckptio_reader_read(r, regs, (size_t)n);
    Py_END_ALLOW_THREADS
    if (rc < 0) ckptio__pyhandle_fail(self, rc, n == 1 ? tensor_name(r, regs[0].tensor) : NULL);
out:
    for (size_t i = 0; i < n_views; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(regs);
    PyMem_Free(dims);
    Py_XDECREF(fast);
    ckptio__pyhandle_leave(self, 0, NULL);
    return PyErr_Occurred() ? -1 : 0;
}

/* read([ReadRegion, ...]): one batched read. */
static PyObject *Reader_read(PyObject *self, PyObject *seq)
{
    if (read_regions(self, seq, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

/* read_shared(regions, index, count) -> (rounds, start, [(first, count, bytes), ...]): the
 * regions read in parts taken in rotation (ckptio_reader_read_shared), and the parts in the
 * order they were read. */
static PyObject *Reader_read_shared(PyObject *self, PyObject *args)
{
    PyObject *seq;
    unsigned int index, count;
    if (!PyArg_ParseTuple(args, "OII:read_shared", &seq, &index, &count)) return NULL;
    ckptio_share sh = {.size = sizeof sh, .index = index, .count = count};
    if (count && count <= UINT32_MAX / CKPTIO_SHARE_MAX_ROUNDS) {
        sh.parts_cap = (uint64_t)count * CKPTIO_SHARE_MAX_ROUNDS;
        sh.parts = PyMem_Calloc((size_t)sh.parts_cap, sizeof *sh.parts);
        if (!sh.parts) return PyErr_NoMemory();
    }
    PyObject *parts = NULL, *out = NULL;
    if (read_regions(self, seq, &sh) < 0) goto out;
    parts = PyList_New((Py_ssize_t)(sh.n_parts < sh.parts_cap ? sh.n_parts : sh.parts_cap));
    for (Py_ssize_t j = 0; parts && j < PyList_GET_SIZE(parts); j++) {
        const ckptio_share_part *p = &sh.parts[j];
        PyObject *t = Py_BuildValue("(KKK)", (unsigned long long)p->first,
                                    (unsigned long long)p->count, (unsigned long long)p->bytes);
        if (!t) goto out;
        PyList_SET_ITEM(parts, j, t);
    }
    if (parts) out = Py_BuildValue("(IKO)", sh.rounds, (unsigned long long)sh.start, parts);
out:
    Py_XDECREF(parts);
    PyMem_Free(sh.parts);
    return out;
}

/* place([(index, offset, shape), ...]) -> [(Buffer or None, at, capacity, lead), ...]: memory
 * the library chose for each region (ckptio_reader_place), its blocks as Buffers; with `read`,
 * the regions are read into it too (one call: place_read). */
static PyObject *place_regions(PyObject *self, PyObject *seq, int read)
{
    ckptio_reader *r = ckptio__pyhandle_enter(self);
    if (!r) return NULL;
    PyObject *fast = PySequence_Fast(seq, "place expects a sequence of (index, offset, shape)");
    ckptio_region *regs = NULL;
    ckptio_landing *land = NULL;
    uint64_t *dims = NULL;
    ckptio_block *blocks = NULL;
    size_t nb = 0;
    PyObject *res = NULL;
    if (!fast) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    size_t nr = (size_t)(n ? n : 1);
    regs = PyMem_Calloc(nr, sizeof *regs);
    land = PyMem_Calloc(nr, sizeof *land);
    dims = PyMem_Malloc(sizeof *dims * nr * 2 * CKPTIO_MAX_NDIM);
    if (!regs || !land || !dims) {
        PyErr_NoMemory();
        goto out;
    }
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyTuple_Check(items[i]) || PyTuple_GET_SIZE(items[i]) < 3) {
            PyErr_SetString(PyExc_TypeError, "place: region must be (index, offset, shape)");
            goto out;
        }
        if (parse_box(self, r, items[i], &regs[i], dims, &used) < 0) goto out;
    }
    land[0].size = sizeof *land;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_place(r, regs, (size_t)n, land, &blocks, &nb);
    for (Py_ssize_t i = 0; read && rc == 0 && i < n; i++) {
        const ckptio_landing *l = &land[i];
        if (l->block == CKPTIO_NO_BLOCK) continue; /* no bytes: dst stays NULL */
        regs[i].dst = (uint8_t *)blocks[l->block].base + l->at;
        regs[i].capacity = l->capacity;
        regs[i].lead = l->lead;
    }
    if (read && rc == 0) rc = ckptio_reader_read(r, regs, (size_t)n);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        for (size_t b = 0; b < nb; b++) ckptio_block_free(blocks[b].base);
        free(blocks);
        blocks = NULL;
        ckptio__pyhandle_fail(self, rc, n == 1 ? tensor_name(r, regs[0].tensor) : NULL);
        goto out;
    }
    res = ckptio__pylandings(blocks, nb, land, (size_t)n);
    blocks = NULL; /* the Buffers' now, or freed */
out:
    PyMem_Free(regs);
    PyMem_Free(land);
    PyMem_Free(dims);
    Py_XDECREF(fast);
    ckptio__pyhandle_leave(self, 0, NULL);
    if (PyErr_Occurred()) Py_CLEAR(res);
    return res;
}

static PyObject *Reader_place(PyObject *self, PyObject *seq)
{
    return place_regions(self, seq, 0);
}

/* place_read([(index, offset, shape), ...]) -> as place, the regions read into that memory. */
static PyObject *Reader_place_read(PyObject *self, PyObject *seq)
{
    return place_regions(self, seq, 1);
}

static PyObject *Reader_verify(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_reader *r = ckptio__pyhandle_enter(self);
    if (!r) return NULL;
    uint64_t bad = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ckptio_reader_verify(r, &bad);
    Py_END_ALLOW_THREADS
    if (ckptio__pyhandle_leave(self, rc, NULL) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(bad);
}

/* read_stats() -> ReadStats(cache_bytes, device_bytes, requests, merged, verify_threads) */
static PyObject *Reader_read_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    ckptio_read_stats st = {.size = sizeof st};
    ckptio_reader_read_stats(r, &st);
    PyObject *f[5] = {PyLong_FromUnsignedLongLong(st.cache_bytes),
                      PyLong_FromUnsignedLongLong(st.device_bytes),
                      PyLong_FromUnsignedLongLong(st.requests),
                      PyLong_FromUnsignedLongLong(st.merged),
                      PyLong_FromUnsignedLong(st.verify_threads)};
    return ckptio__pyrecord(ReadStats_Type, f, 5);
}

static PyObject *Reader_path(PyObject *self, void *closure)
{
    (void)closure;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    return r ? PyUnicode_DecodeFSDefault(ckptio_reader_path(r)) : NULL;
}

/* The safetensors dtype names of a foreign reader's tensors (None for a ckptio checkpoint's). */
static PyObject *Reader_st_dtypes(PyObject *self, PyObject *unused)
{
    (void)unused;
    const ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    size_t n = ckptio_reader_num_tensors(r);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        const char *name = ckptio_st_dtype_name(ckptio_reader_st_dtype(r, i));
        PyList_SET_ITEM(out, (Py_ssize_t)i, name ? PyUnicode_FromString(name) : Py_NewRef(Py_None));
        if (!PyList_GET_ITEM(out, (Py_ssize_t)i)) Py_CLEAR(out);
    }
    return out;
}

static PyObject *Reader_base(PyObject *self, void *closure)
{
    (void)closure;
    ckptio_reader *r = ckptio__pyhandle_get(self);
    if (!r) return NULL;
    const char *b = ckptio_reader_base(r);
    return b ? PyUnicode_DecodeFSDefault(b) : Py_NewRef(Py_None);
}

static PyMethodDef Reader_methods[] = {
    {"set_roots", ckptio__pyhandle_set_roots, METH_O,
     "set_roots(paths): look for a striped checkpoint's stripes in these directories"},
    {"tensors", Reader_tensors, METH_NOARGS,
     "[TensorRecord(name, dtype, shape, nbytes, num_chunks)] in name order"},
    {"find", Reader_find, METH_VARARGS, "find(name) -> index or -1"},
    {"chunks", Reader_chunks, METH_VARARGS,
     "chunks(index) -> [ChunkRecord(offset, shape, file, file_offset, stored_bytes, nbytes)]"},
    {"meta", Reader_meta, METH_NOARGS, "all metadata as {key: bytes}"},
    {"get_meta", Reader_get_meta, METH_VARARGS, "get_meta(key) -> bytes or None"},
    {"digest", Reader_digest, METH_NOARGS, "digest() -> the SHA-256 of the manifest read (32 bytes)"},
    {"read", Reader_read, METH_O,
     "read([ReadRegion(index, offset, shape, dst, dst_offset, capacity, lead)]): one batched read"},
    {"read_shared", Reader_read_shared, METH_VARARGS,
     "read_shared(regions, index, count) -> (rounds, start, [(first, count, bytes)]): the read "
     "in parts taken in rotation by `count` readers, this one starting at part `index`"},
    {"place", Reader_place, METH_O,
     "place([(index, offset, shape)]) -> [(Buffer or None, at, capacity, lead)]: memory the "
     "library chose for each region, to read into"},
    {"place_read", Reader_place_read, METH_O,
     "place_read([(index, offset, shape)]) -> as place, each region read into its memory: "
     "one plan, one batched read"},
    {"verify", Reader_verify, METH_NOARGS, "check every checksum"},
    {"st_dtypes", Reader_st_dtypes, METH_NOARGS,
     "[safetensors dtype name or None] in tensor order (open_foreign readers)"},
    {"stats", ckptio__pyhandle_stats, METH_NOARGS, "IOStats"},
    {"read_stats", Reader_read_stats, METH_NOARGS,
     "(cache_bytes, device_bytes, requests, merged, verify_threads)"},
    CKPTIO_PYHANDLE_METHODS("release the reader"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reader_getset[] = {
    CKPTIO_PYHANDLE_CLOSED,
    {"path", Reader_path, NULL, "the checkpoint directory", NULL},
    {"base", Reader_base, NULL,
     "the base of a delta checkpoint, relative to its directory, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

CKPTIO_PYHANDLE_OPS(reader)

static int reader_set_roots(void *r, const char *const *roots, size_t n)
{
    return ckptio_reader_set_roots(r, roots, n);
}

ckptio__pyhandle_type ckptio__pyReader_Type = {
    .type = CKPTIO_PYHANDLE_TYPE("ckptio._core.Reader", sizeof(ckptio__pyhandle),
                                 "Reader(path, params=None): a committed checkpoint open for "
                                 "reading.",
                                 Reader_methods, Reader_getset),
    .noun = "this reader",
    .closed_code = CKPTIO_E_STATE,
    .closed_msg = "reader is closed",
    .open = reader_open_any,
    .close = reader_close_any,
    .errmsg = reader_errmsg_any,
    .stats = reader_stats_any,
    .set_roots = reader_set_roots,
};

/* read_region(tensor, offset, shape, dst, dst_offset, capacity, lead=0) -> ReadRegion: a
 * load builds one per tensor, and calling the type costs several times more. */
static PyObject *mod_read_region(PyObject *mod, PyObject *const *args, Py_ssize_t n)
{
    (void)mod;
    if (n != RD_N && n != RD_LEAD) {
        PyErr_SetString(PyExc_TypeError,
                        "read_region(tensor, offset, shape, dst, dst_offset, capacity, lead=0)");
        return NULL;
    }
    PyObject *r = PyStructSequence_New(ReadRegion_Type);
    if (!r) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyStructSequence_SetItem(r, i, Py_NewRef(args[i]));
    if (n == RD_LEAD) {
        PyObject *zero = PyLong_FromLong(0);
        if (!zero) return Py_DECREF(r), NULL;
        PyStructSequence_SetItem(r, RD_LEAD, zero);
    }
    return r;
}

static int reader_open_foreign(void **out, const char *path, const ckptio_params *p)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open_foreign(&r, path, p);
    *out = r;
    return rc;
}

/* open_foreign(path, params=None) -> Reader over safetensors files (ckptio_reader_open_foreign). */
static PyObject *mod_open_foreign(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    PyObject *self = PyType_GenericNew(&ckptio__pyReader_Type.type, NULL, NULL);
    if (self && ckptio__pyhandle_open(self, args, kw, reader_open_foreign) < 0) Py_CLEAR(self);
    return self;
}

/* open_comm's communicator and timeout, for the open callback below: it runs on the thread
 * that called open_comm (with the GIL released), so a thread-local carries them there. */
static _Thread_local struct {
    ckptio_comm *c;
    double timeout;
} comm_arg;

static int reader_open_comm(void **out, const char *path, const ckptio_params *p)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open_comm(&r, path, p, comm_arg.c, comm_arg.timeout);
    *out = r;
    return rc;
}

/* open_comm(path, params, comm, timeout) -> Reader, on every rank of comm at once
 * (ckptio_reader_open_comm: rank 0 reads the manifest and sends it to the others). */
static PyObject *mod_open_comm(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *path, *params, *comm_obj, *self = NULL;
    double timeout;
    if (!PyArg_ParseTuple(args, "OOOd:open_comm", &path, &params, &comm_obj, &timeout))
        return NULL;
    ckptio_comm *c = ckptio__pycomm_new(comm_obj);
    PyObject *pargs = c ? PyTuple_Pack(2, path, params) : NULL;
    if (pargs) self = PyType_GenericNew(&ckptio__pyReader_Type.type, NULL, NULL);
    if (self) {
        comm_arg.c = c, comm_arg.timeout = timeout;
        /* a failure names the path, and what the communicator said (ckptio_last_error) */
        if (ckptio__pyhandle_open(self, pargs, NULL, reader_open_comm) < 0) Py_CLEAR(self);
        comm_arg.c = NULL;
    }
    Py_XDECREF(pargs);
    if (c) ckptio_comm_free(c);
    return self;
}

static PyMethodDef reader_functions[] = {
    {"open_foreign", (PyCFunction)(void (*)(void))mod_open_foreign, METH_VARARGS | METH_KEYWORDS,
     "open_foreign(path, params=None) -> Reader of a safetensors file or Hugging Face directory"},
    {"open_comm", mod_open_comm, METH_VARARGS,
     "open_comm(path, params, comm, timeout) -> Reader opened on every rank of comm at once: "
     "the manifest read by rank 0, sent to the others"},
    {"read_region", (PyCFunction)(void (*)(void))mod_read_region, METH_FASTCALL,
     "read_region(tensor, offset, shape, dst, dst_offset, capacity, lead=0) -> ReadRegion"},
    {NULL, NULL, 0, NULL},
};

int ckptio__pyreader_register(PyObject *m)
{
    if (PyType_Ready(&ckptio__pyReader_Type.type) < 0 ||
        PyModule_AddObjectRef(m, "Reader", (PyObject *)&ckptio__pyReader_Type.type) < 0 ||
        ckptio__pyrecord_type(m, &TensorRecord_Type, &TensorRecord_desc) < 0 ||
        ckptio__pyrecord_type(m, &ChunkRecord_Type, &ChunkRecord_desc) < 0 ||
        ckptio__pyrecord_type(m, &ReadRegion_Type, &ReadRegion_desc) < 0 ||
        ckptio__pyrecord_type(NULL, &ReadStats_Type, &ReadStats_desc) < 0)
        return -1;
    return PyModule_AddFunctions(m, reader_functions);
}
