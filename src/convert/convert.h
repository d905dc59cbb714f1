/* SPDX-License-Identifier: Apache-2.0 */
/* The convert engine's insides shared by its files: one conversion, its source and its sink. */
#ifndef CKPTIO_CONVERT_CONVERT_H
#define CKPTIO_CONVERT_CONVERT_H

#include "../common/common.h"

/* A piece: a box of one tensor that is contiguous in row-major order, and where it lies in
 * the copy buffer. */
typedef struct ckptio__piece {
    size_t item;
    size_t pos;      /* the item's place in the copy order */
    uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    uint64_t first;  /* byte offset of the piece inside the tensor */
    uint64_t nbytes;
    uint64_t at;     /* offset in the buffer */
} ckptio__piece;

typedef struct ckptio__conv {
    ckptio_convert_args a; /* a copy, with the defaults filled in */
    ckptio_params p;
    ckptio__msg msg;       /* the first failure, raised again once everything is closed */
    /* the source: a reader (ckptio, safetensors, hf) or the caller's */
    ckptio_reader *reader;
    const ckptio_convert_source *ext_src;
    ckptio_convert_tensor *items; /* the source's tensors (their names are the source's) */
    size_t n_items;
    size_t *order;                /* the order they are copied in (indices into items) */
    ckptio_convert_meta *meta;
    size_t n_meta;
    /* the sink: a writer, safetensors files, or the caller's */
    ckptio_writer *writer;
    ckptio_file_writer *fw;
    const ckptio_convert_sink *ext_sink;
    bool sink_begun;
    uint32_t *shard;              /* per item: its safetensors file */
    uint32_t n_shards, cur_shard;
    char *tmp;                    /* hf / external: what is built, renamed to dst at the end */
    uint64_t total, done;
    double t0, drawn;             /* the progress line */
} ckptio__conv;

/* Record the failure in c->msg (and the thread's last error); returns code. */
#define CONV_FAIL(c, code, ...) ckptio__fail(&(c)->msg, (code), __VA_ARGS__)
/* An inner call failed with rc: keep its message (already the thread's last error). */
static inline int conv_keep(ckptio__conv *c, int rc)
{
    ckptio__msg_last(&c->msg);
    return rc;
}

/* detect.c */
CKPTIO__HIDDEN char *ckptio__conv_find_index(const char *dir);
CKPTIO__HIDDEN bool ckptio__conv_ends_with(const char *s, const char *suf);
/* 1 when `path` is in a store that is no local file system (an object store), 0 when it is a
 * local path, < 0 (the error set) when no store serves its scheme. */
CKPTIO__HIDDEN int ckptio__conv_remote(const char *path);
/* ckptio_convert_detect, the source's kind asked of its store with the store's settings. */
CKPTIO__HIDDEN int ckptio__conv_detect(const char *path, int is_dst, int sharded,
                                       const ckptio_store_opts *store);

/* sinks.c: safetensors files (one, or hf shards + index) */
CKPTIO__HIDDEN int ckptio__conv_st_begin(ckptio__conv *c);
CKPTIO__HIDDEN int ckptio__conv_st_write(ckptio__conv *c, const uint8_t *buf,
                                         const ckptio__piece *pc);
CKPTIO__HIDDEN int ckptio__conv_st_end(ckptio__conv *c);

/* publish.c: the temporary sibling of dst (hf, external sinks) and its publication */
CKPTIO__HIDDEN int ckptio__conv_check_dst(ckptio__conv *c);
CKPTIO__HIDDEN int ckptio__conv_tmp_begin(ckptio__conv *c, bool dir);
CKPTIO__HIDDEN int ckptio__conv_publish(ckptio__conv *c);
CKPTIO__HIDDEN void ckptio__conv_tmp_abort(ckptio__conv *c);

#endif
