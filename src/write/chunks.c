/* SPDX-License-Identifier: Apache-2.0 */
/* Chunks into the writer: added, split over stripes, hashed, streamed from host or GPU. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/box.h"
#include "../io/engine.h"
#include "../io/vfs.h"
#include "writer.h"

/* ---- GPU chunks ---- */

typedef struct gpu_put {
    ckptio_writer *w;
    uint64_t csum_at;
    uint64_t write_from; /* bytes of the chunk before this went to the file by GDS */
    bool hash;
} gpu_put;

/* A piece of a device chunk landed in the pinned ring, on the GDS path: hashed while in cache,
 * and what cuFile does not write (the tail under 4 KiB) copied into the sink's staging: the
 * one host-to-host copy left on the save path, counted. Pieces are whole checksum blocks but
 * the last. */
static int put_staged(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    gpu_put *p = ctx;
    ckptio_writer *w = p->w;
    uint64_t B = w->cfg.csum_block;
    for (uint64_t i = 0; i < n; i += B) {
        uint64_t len = CKPTIO__MIN(B, n - i), skip = 0;
        if (at + i < p->write_from) skip = CKPTIO__MIN(p->write_from - (at + i), len);
        if (skip < len) {
            CKPTIO__TRY(ckptio__sink_write(&w->sink, host + i + skip, len - skip));
            w->gpu.host_copied += len - skip;
        }
        if (p->hash)
            *CKPTIO__VEC_AT(&w->csums, uint64_t, p->csum_at + (at + i) / B) =
                ckptio__hash(host + i, len);
    }
    return 0;
}

/* A device chunk on the staged path lands straight in the sink's staging windows (registered
 * with the driver once): each window a piece fills is held back until the piece has landed
 * and been hashed there, then sent from there, in file order. */
typedef struct gpu_land {
    ckptio_writer *w;
    uint64_t csum_at;
    bool hash;
    ckptio__sink_win held[CKPTIO__GPU_SLOTS]; /* per piece in flight: the window it filled */
    uint64_t queued, landed;                  /* pieces given a place / handed back landed */
} gpu_land;

static int land_dest(void *ctx, uint64_t at, uint64_t left, uint8_t **dst, uint64_t *len)
{
    gpu_land *l = ctx;
    uint64_t room;
    int rc = ckptio__sink_claim(&l->w->sink, dst, &room);
    if (rc) return rc;
    *len = CKPTIO__MIN(room, left);
    /* Whole checksum blocks but the chunk's last piece: write_chunk_gpu placed it so. */
    assert(!l->hash || *len == left || (at + *len) % l->w->cfg.csum_block == 0);
    (void)at;
    ckptio__sink_advance(&l->w->sink, *len, &l->held[l->queued++ % CKPTIO__GPU_SLOTS]);
    return 0;
}

static int land_piece(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    gpu_land *l = ctx;
    ckptio_writer *w = l->w;
    uint64_t first = l->csum_at + at / w->cfg.csum_block;
    if (l->hash) ckptio__writer_hash_blocks(w, host, n, CKPTIO__VEC_AT(&w->csums, uint64_t, first));
    ckptio__sink_win *win = &l->held[l->landed++ % CKPTIO__GPU_SLOTS];
    return win->buf ? ckptio__sink_send(&w->sink, win) : 0;
}

static int write_chunk_staged(ckptio_writer *w, uint64_t src, uint64_t n, uint64_t off,
                              uint64_t csum_at, uint64_t n_csums, uint64_t stream,
                              const char *name)
{
    ckptio__gpu *g = &w->gpu;
    ckptio__sink *s = &w->sink;
    const uint64_t B = w->cfg.csum_block;
    assert(s->pool.buf_size % B == 0);
    CKPTIO__TRY(ckptio__gpu_register(g, s->pool.base, (uint64_t)s->pool.buf_size * s->pool.count,
                                     &w->msg, name));
    /* Every piece but the last must be whole blocks, to be hashed where it lands: a chunk
     * running past an open window whose rest is not whole blocks starts a window of its own
     * (only chunks of 4 KiB or more, at aligned offsets, run past: add_mem sees to it). */
    uint64_t end = ckptio__sink_window_end(s);
    if (n_csums && end != UINT64_MAX && off + n > end && (end - off) % B)
        CKPTIO__TRY(ckptio__sink_skip(s, 0));
    gpu_land l = {.w = w, .csum_at = csum_at, .hash = n_csums > 0};
    int rc = ckptio__gpu_d2h_to(g, src, n, stream, land_dest, land_piece, &l, &w->msg, name);
    /* After a failure the stream is drained: windows still held go back unsent. */
    for (; l.landed < l.queued; l.landed++)
        ckptio__sink_drop(s, &l.held[l.landed % CKPTIO__GPU_SLOTS]);
    return rc;
}

static int write_chunk_gpu(ckptio_writer *w, uint64_t src, uint64_t n, uint64_t off,
                           uint64_t csum_at, uint64_t n_csums, uint64_t stream, const char *name)
{
    ckptio__gpu *g = &w->gpu;
    CKPTIO__TRY(ckptio__sink_seek(&w->sink, off));
    gpu_put p = {.w = w, .csum_at = csum_at, .hash = n_csums > 0};
    if (ckptio__gpu_route(g, w->fd, w->sink.direct, off, n, false) == CKPTIO__ROUTE_GDS) {
        /* cuFile writes the 4 KiB-aligned body; the tail goes through the sink, after it, so
         * that the sink's next window starts where cuFile's bytes end. */
        uint64_t body = n / 4096 * 4096;
        CKPTIO__TRY(ckptio__sink_skip(&w->sink, body));
        p.write_from = body;
        /* Checksums come from a staged copy, taken first: it also orders us after the
         * caller's stream, as cuFile (synchronous, stream-less) cannot. */
        if (p.hash) {
            CKPTIO__TRY(ckptio__gpu_d2h(g, src, n, stream, put_staged, &p, &w->msg, name));
        } else {
            CKPTIO__TRY(ckptio__gpu_wait_caller(g, stream, &w->msg, name));
            p.write_from = 0;
            if (n > body)
                CKPTIO__TRY(ckptio__gpu_d2h(g, src + body, n - body, stream, put_staged, &p,
                                            &w->msg, name));
        }
        if (n > body) ckptio__gpu_count(g, false, n - body);
        return ckptio__gpu_gds_io(g, true, src, body, off, &w->msg, w->data_label);
    }
    CKPTIO__TRY(write_chunk_staged(w, src, n, off, csum_at, n_csums, stream, name));
    ckptio__gpu_count(g, false, n);
    return 0;
}


/* ---- add ---- */

static int find_or_add_tensor(ckptio_writer *w, const char *name, size_t name_len, int dtype,
                              uint32_t ndim, const uint64_t *shape, uint64_t *index)
{
    uint64_t idx;
    if (ckptio__strmap_get(&w->names, name, name_len, &idx)) {
        wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, idx);
        const uint64_t *gs = CKPTIO__VEC_AT(&w->dims, uint64_t, t->dims);
        if (t->dtype != (uint32_t)dtype || t->ndim != ndim ||
            (ndim && memcmp(gs, shape, ndim * sizeof *shape))) {
            char a[256], b[256];
            ckptio__fmt_dims(a, sizeof a, gs, t->ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, shape, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                                "tensor '%s': this chunk says %s [%s] but an earlier chunk said "
                                "%s [%s]; every chunk must give the same dtype and global shape",
                                name, ckptio_dtype_name(dtype), b, ckptio_dtype_name((int)t->dtype),
                                a);
        }
        *index = idx;
        return 0;
    }
    const char *stored = ckptio__writer_arena_dup(w, name, name_len);
    CKPTIO__RET_IF(!stored, -ENOMEM);
    int64_t d = ckptio__vec_push(&w->dims, shape, ndim);
    CKPTIO__TRY(d);
    wtensor t = {.name = stored, .name_len = (uint32_t)name_len, .dtype = (uint32_t)dtype,
                 .ndim = ndim, .dims = (uint64_t)d, .head = UINT64_MAX, .tail = UINT64_MAX};
    int64_t ti = ckptio__vec_push(&w->tensors, &t, 1);
    CKPTIO__TRY(ti);
    idx = (uint64_t)ti;
    int rc = ckptio__strmap_put(&w->names, stored, name_len, &idx);
    if (rc < 0) {
        w->tensors.len--;
        return rc;
    }
    *index = idx;
    return 0;
}

/* A failure while writing the chunk of tensor `name`: the writer is poisoned. */
static int add_failed(ckptio_writer *w, int rc, const char *name)
{
    ckptio__writer_settle_hashes(w); /* nothing may still read the caller's buffer once we fail */
    ckptio__refail(&w->msg, &w->msg, rc, "write failed", "saving tensor '%s': ", name);
    return ckptio__writer_poison(w, rc);
}

static int add_split(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                     const uint64_t *shape, const uint64_t *chunk_offset,
                     const uint64_t *chunk_shape, const void *data, uint64_t nbytes);

static int add_mem(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                   const uint64_t *shape, const uint64_t *chunk_offset,
                   const uint64_t *chunk_shape, const void *data, uint64_t nbytes,
                   uint32_t memory, uint64_t stream)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_add: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    if (w->n_stripes && memory == CKPTIO_MEM_HOST && nbytes >= 2 * STRIPE_PIECE_MIN &&
        !w->splitting)
        return add_split(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes);
    if (!name) return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "ckptio_writer_add: name is NULL");
    size_t name_len = strlen(name);
    if (!ckptio__valid_name(name, name_len, CKPTIO_MAX_NAME))
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor name '%.64s' is not valid: names are 1..%d bytes of UTF-8",
                            name, CKPTIO_MAX_NAME);
    size_t esize = ckptio_dtype_size(dtype);
    if (!esize)
        return ckptio__fail(&w->msg, CKPTIO_E_DTYPE, "tensor '%s': unknown dtype %d", name, dtype);
    if (ndim > CKPTIO_MAX_NDIM)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "tensor '%s' has %u dimensions; at most %d",
                            name, ndim, CKPTIO_MAX_NDIM);
    if (ndim && !shape)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "tensor '%s': shape is NULL", name);
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    const uint64_t *co = chunk_offset ? chunk_offset : zeros;
    const uint64_t *cs = chunk_shape ? chunk_shape : shape;
    uint64_t tvol, cvol, cbytes;
    if (!ckptio__volume(shape, ndim, esize, &tvol) || !ckptio__volume(cs, ndim, esize, &cbytes))
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "tensor '%s': size overflows 64 bits", name);
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t end;
        if (!ckptio__add(co[i], cs[i], &end) || end > shape[i]) {
            char a[256], b[256], c[256];
            ckptio__fmt_dims(a, sizeof a, co, ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, cs, ndim, "scalar");
            ckptio__fmt_dims(c, sizeof c, shape, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                                "tensor '%s': chunk at offset [%s] of shape [%s] lies outside "
                                "the tensor's shape [%s]",
                                name, a, b, c);
        }
    }
    if (cbytes != nbytes)
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s': %llu bytes given but the chunk holds %llu (%s × %llu "
                            "elements)",
                            name, (unsigned long long)nbytes, (unsigned long long)cbytes,
                            ckptio_dtype_name(dtype), (unsigned long long)(cbytes / esize));
    cvol = cbytes / esize;
    tvol /= esize;
    if (nbytes && !data)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "tensor '%s': data is NULL", name);
    if (tvol == 0 && (chunk_shape && memcmp(cs, shape, ndim * sizeof *cs)))
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s' is empty: give it as one chunk covering its whole shape",
                            name);
    if (tvol != 0 && cvol == 0)
        return ckptio__fail(&w->msg, CKPTIO_E_SHAPE,
                            "tensor '%s': an empty chunk of a non-empty tensor", name);

    if (memory > CKPTIO_MEM_CUDA)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor '%s': unknown memory kind %u (CKPTIO_MEM_HOST or _CUDA)", name,
                            memory);
    if (memory == CKPTIO_MEM_CUDA && nbytes)
        CKPTIO__TRY(ckptio__gpu_start(&w->gpu, (uint64_t)(uintptr_t)data, &w->msg, name));

    uint64_t ti = 0;
    CKPTIO__TRY(find_or_add_tensor(w, name, name_len, dtype, ndim, shape, &ti));
    wtensor *t = CKPTIO__VEC_AT(&w->tensors, wtensor, ti);
    for (uint64_t c = t->head; c != UINT64_MAX; c = *CKPTIO__VEC_AT(&w->next, uint64_t, c)) {
        const ckptio__mchunk *mc = CKPTIO__VEC_AT(&w->chunks, ckptio__mchunk, c);
        const uint64_t *d = CKPTIO__VEC_AT(&w->dims, uint64_t, mc->dims);
        if (tvol == 0 || ckptio__boxes_overlap(d, d + ndim, co, cs, ndim)) {
            char a[256], b[256];
            ckptio__fmt_dims(a, sizeof a, co, ndim, "scalar");
            ckptio__fmt_dims(b, sizeof b, cs, ndim, "scalar");
            return ckptio__fail(&w->msg, CKPTIO_E_DUPLICATE,
                                "tensor '%s': chunk at offset [%s] shape [%s] overlaps a chunk "
                                "already added (duplicate tensor name?)",
                                name, a, b);
        }
    }

    /* Record the chunk, then stream its bytes. */
    uint64_t n_csums = (w->cfg.checksums && nbytes) ? (nbytes + w->cfg.csum_block - 1) / w->cfg.csum_block : 0;
    /* A coded chunk's stored length is known only once it is written: it starts on a 4096
     * boundary, right for any length. */
    unsigned codec = ckptio__writer_codec(w, dtype, nbytes, memory == CKPTIO_MEM_HOST);
    uint64_t align = nbytes >= CKPTIO__EXTENT_ALIGN || codec ? CKPTIO__EXTENT_ALIGN
                                                             : CKPTIO__SMALL_ALIGN;
    if (nbytes && w->n_stripes) {
        int rc = ckptio__writer_lane_enter(w, ckptio__writer_pick_lane(w, nbytes));
        if (rc < 0) return add_failed(w, rc, name);
    }
    if (nbytes && w->max_file_bytes && w->sink.cursor) {
        uint64_t at = ckptio__align_up(w->sink.cursor, align);
        int rc = at >= w->max_file_bytes || nbytes > w->max_file_bytes - at ? ckptio__writer_roll_file(w) : 0;
        if (rc < 0) return add_failed(w, rc, name); /* the tensor may be in the map: fatal */
    }
    uint64_t off = nbytes ? ckptio__align_up(w->sink.cursor, align) : 0;
    if (memory == CKPTIO_MEM_CUDA && w->parts && nbytes >= CKPTIO__EXTENT_ALIGN) {
        /* Windows of whole parts (an object's), ending on block boundaries, and can only be
         * sent full: a device chunk starting on a block boundary lands in whole blocks of
         * them (write_chunk_staged), at most a block of padding per chunk. */
        off = ckptio__align_up(off, w->cfg.csum_block);
    } else if (memory == CKPTIO_MEM_CUDA && nbytes && nbytes < CKPTIO__EXTENT_ALIGN) {
        /* A small device chunk never straddles two staging windows: it lands whole in one, to
         * be hashed there (write_chunk_staged). At most 4 KiB of padding per window. */
        uint64_t end = ckptio__sink_window_end(&w->sink);
        if (off < end && off + nbytes > end) off = end;
    }
    int64_t di = ckptio__vec_push(&w->dims, co, ndim);
    int64_t di2 = di >= 0 ? ckptio__vec_push(&w->dims, cs, ndim) : di;
    int64_t ci = di2 >= 0 ? ckptio__vec_push(&w->csums, NULL, n_csums) : di2;
    if (ci < 0) /* the tensor may already be in the name map: out of memory is fatal */
        return ckptio__writer_poison(w, ckptio__fail(&w->msg, -ENOMEM, "out of memory adding tensor '%s'", name));
    ckptio__mchunk mc = {.dims = (uint64_t)di, .file_off = off, .stored_len = nbytes,
                         .raw_len = nbytes, .csums = (uint64_t)ci, .n_csums = n_csums,
                         .file = w->cur_file, .codec = CKPTIO__CODEC_NONE,
                         .tensor = (uint32_t)ti};
    int64_t chunk = ckptio__vec_push(&w->chunks, &mc, 1);
    uint64_t none = UINT64_MAX;
    if (chunk < 0 || ckptio__vec_push(&w->next, &none, 1) < 0)
        return ckptio__writer_poison(w, ckptio__fail(&w->msg, -ENOMEM, "out of memory adding tensor '%s'", name));
    t = CKPTIO__VEC_AT(&w->tensors, wtensor, ti);
    if (t->tail == UINT64_MAX) t->head = (uint64_t)chunk;
    else *CKPTIO__VEC_AT(&w->next, uint64_t, t->tail) = (uint64_t)chunk;
    t->tail = (uint64_t)chunk;
    t->n_chunks++;
    t->covered += cvol;
    w->stats.bytes += nbytes;
    if (!nbytes) return 0;
    int rc = codec && memory == CKPTIO_MEM_CUDA
                 ? ckptio__writer_put_coded_gpu(w, (uint64_t)chunk, (uint64_t)(uintptr_t)data,
                                                nbytes, (uint64_t)ci, codec, dtype, stream, name)
             : codec ? ckptio__writer_put_coded(w, (uint64_t)chunk, data, nbytes, (uint64_t)ci,
                                                codec, dtype)
             : memory == CKPTIO_MEM_CUDA
                 ? write_chunk_gpu(w, (uint64_t)(uintptr_t)data, nbytes, off, (uint64_t)ci,
                                   n_csums, stream, name)
                 : ckptio__writer_put_raw(w, data, nbytes, off, (uint64_t)ci, n_csums);
    return rc < 0 ? add_failed(w, rc, name) : 0;
}

/* Every failure of an add is about this tensor (and the data file it was going to). */
static int add_named(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                     const uint64_t *shape, const uint64_t *chunk_offset,
                     const uint64_t *chunk_shape, const void *data, uint64_t nbytes,
                     uint32_t memory, uint64_t stream)
{
    int rc = add_mem(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes,
                     memory, stream);
    if (CKPTIO__UNLIKELY(rc < 0) && w)
        ckptio__msg_name(&w->msg, name, w->data_label, NULL, CKPTIO_ERROR_NO_OFFSET);
    return rc;
}

int ckptio_writer_add(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                      const uint64_t *shape, const uint64_t *chunk_offset,
                      const uint64_t *chunk_shape, const void *data, uint64_t nbytes)
{
    return add_named(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes,
                     CKPTIO_MEM_HOST, 0);
}

int ckptio_writer_add_mem(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                          const uint64_t *shape, const uint64_t *chunk_offset,
                          const uint64_t *chunk_shape, const void *data, uint64_t nbytes,
                          uint32_t memory, uint64_t stream)
{
    return add_named(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data, nbytes,
                     memory, stream);
}

int ckptio__writer_gpu_read(ckptio_writer *w, uint64_t src, uint64_t n, uint64_t stream,
                            uint64_t block, int (*fn)(void *, uint8_t *, uint64_t, uint64_t),
                            void *ctx, const char *what)
{
    ckptio__msg_clear(&w->msg);
    if (!block || w->cfg.csum_block % block)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "tensor '%s': replicas hashed in blocks of %llu bytes, the GPU ring "
                            "in blocks of %llu; give every rank the same params",
                            what, (unsigned long long)block,
                            (unsigned long long)w->cfg.csum_block);
    if (!n) return 0;
    CKPTIO__TRY(ckptio__gpu_start(&w->gpu, src, &w->msg, what));
    CKPTIO__TRY(ckptio__gpu_d2h(&w->gpu, src, n, stream, fn, ctx, &w->msg, what));
    return 0;
}

int ckptio_writer_gpu_stats(const ckptio_writer *w, ckptio_gpu_stats *out)
{
    if (!w || !out || out->size < offsetof(ckptio_gpu_stats, reason))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_writer_gpu_stats: NULL argument or out->size not set");
    ckptio__gpu_stats(&w->gpu, out);
    return 0;
}

int ckptio_writer_set_meta(ckptio_writer *w, const char *key, const void *value, size_t len)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_set_meta: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    if (!key || !ckptio__valid_name(key, strlen(key), CKPTIO_MAX_NAME))
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE,
                            "metadata key is not valid: keys are 1..%d bytes of UTF-8",
                            CKPTIO_MAX_NAME);
    if (len > CKPTIO_MAX_META_VALUE)
        return ckptio__fail(&w->msg, CKPTIO_E_LIMIT, "metadata '%s': value of %zu bytes exceeds %u",
                            key, len, CKPTIO_MAX_META_VALUE);
    if (len && !value)
        return ckptio__fail(&w->msg, CKPTIO_E_USAGE, "metadata '%s': value is NULL", key);
    uint8_t *v = malloc(len ? len : 1);
    CKPTIO__RET_IF(!v, -ENOMEM);
    if (len) memcpy(v, value, len);
    size_t klen = strlen(key);
    for (size_t i = 0; i < w->meta.len; i++) {
        wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, i);
        if (m->key_len == klen && !memcmp(m->key, key, klen)) {
            free(m->val);
            m->val = v;
            m->val_len = len;
            return 0;
        }
    }
    wmeta m = {.key = strdup(key), .key_len = klen, .val = v, .val_len = len};
    if (!m.key || ckptio__vec_push(&w->meta, &m, 1) < 0) {
        free(m.key);
        free(v);
        return -ENOMEM;
    }
    return 0;
}

int ckptio_writer_flush(ckptio_writer *w)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_flush: writer is NULL");
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    int rc = ckptio__sink_drain(&w->sink);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        int r2 = w->lanes[k].fd >= 0 ? ckptio__sink_drain(&w->lanes[k].sink) : 0;
        if (r2 < 0 && rc == 0) rc = r2;
    }
    ckptio__writer_settle_hashes(w);
    return rc < 0 ? ckptio__writer_poison(w, rc) : 0;
}

/* A striped writer balances whole chunks over the roots, so a checkpoint of a few huge tensors
 * would load one root: a chunk of at least two pieces' worth is cut along its first dimension
 * into row blocks (contiguous in the caller's memory), at most one per root and none much
 * under STRIPE_PIECE_MIN bytes, each added as a chunk of its own. Anything odd is left to the plain
 * add, which reports it. */
static int add_split(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                     const uint64_t *shape, const uint64_t *chunk_offset,
                     const uint64_t *chunk_shape, const void *data, uint64_t nbytes)
{
    static const uint64_t zeros[CKPTIO_MAX_NDIM];
    const uint64_t *cs = chunk_shape ? chunk_shape : shape;
    size_t esize = ckptio_dtype_size(dtype);
    uint64_t bytes = 0;
    bool plain = !esize || ndim == 0 || ndim > CKPTIO_MAX_NDIM || !shape || !data || !name ||
                 !ckptio__volume(cs, ndim, esize, &bytes) || bytes != nbytes || cs[0] < 2;
    uint64_t pieces =
        plain ? 1 : CKPTIO__MIN(w->n_stripes + 1, (nbytes - 1) / STRIPE_PIECE_MIN + 1);
    pieces = CKPTIO__MIN(pieces, cs[0]);
    w->splitting = true;
    int rc;
    if (pieces < 2) {
        rc = ckptio_writer_add(w, name, dtype, ndim, shape, chunk_offset, chunk_shape, data,
                               nbytes);
        w->splitting = false;
        return rc;
    }
    const uint64_t *co = chunk_offset ? chunk_offset : zeros;
    uint64_t row = nbytes / cs[0], off[CKPTIO_MAX_NDIM], ps[CKPTIO_MAX_NDIM];
    memcpy(off, co, ndim * sizeof *off);
    memcpy(ps, cs, ndim * sizeof *ps);
    /* Row blocks that start on a 4096-byte boundary of the source when rows allow it, so that an
     * aligned source is written in place. */
    uint64_t step = 1;
    while (step <= cs[0] / pieces && (step * row) % CKPTIO__EXTENT_ALIGN) step *= 2;
    if (step > cs[0] / pieces) step = 1; /* no aligned cut leaves every piece some rows */
    uint64_t done = 0;
    rc = 0;
    for (uint64_t k = 0; k < pieces && rc >= 0; k++) {
        uint64_t end = k + 1 == pieces ? cs[0] : cs[0] / pieces * (k + 1) / step * step;
        if (end <= done) continue;
        off[0] = co[0] + done;
        ps[0] = end - done;
        rc = ckptio_writer_add(w, name, dtype, ndim, shape, off, ps,
                               (const uint8_t *)data + done * row, (end - done) * row);
        if (rc < 0 && done && w->hs.state == CKPTIO__H_OPEN) {
            /* Some rows are in: the caller's chunk cannot be taken back whole. */
            char why[sizeof w->msg.text];
            snprintf(why, sizeof why, "%s", w->msg.text);
            rc = ckptio__writer_poison(w, ckptio__fail(&w->msg, rc,
                                        "tensor '%s': rows %llu.. of a chunk cut for striping "
                                        "were refused, the writer cannot go on: %s",
                                        name, (unsigned long long)off[0], why));
        }
        done = end;
    }
    w->splitting = false;
    return rc;
}
