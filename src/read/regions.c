/* SPDX-License-Identifier: Apache-2.0 */
/* Region reads: host ones through a plan, GPU ones via the pinned ring or cuFile; verify. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reader.h"

/* ---- GPU destinations ---- */

/* Host regions of one GPU region, read one ring slot at a time. */
typedef struct gpu_get {
    ckptio_reader *r;
    const box *bx;
    uint64_t esize;
    ckptio__gpu_split sp;
    bool have;                       /* off/shape hold a sub-box not yet read (it did not fit) */
    uint64_t off[CKPTIO_MAX_NDIM], shape[CKPTIO_MAX_NDIM], bytes;
} gpu_get;

/* Fill a slot with as many whole sub-boxes as fit: each is one planned read into the slot. */
static int64_t get_pieces(void *ctx, uint8_t *host, uint64_t cap, uint64_t at)
{
    gpu_get *q = ctx;
    ckptio_reader *r = q->r;
    const ckptio__mtensor *t = &r->m->tensors[q->bx->t];
    CKPTIO__UNUSED(at);
    uint64_t used = 0;
    for (;;) {
        if (!q->have && !ckptio__gpu_split_next(&q->sp, q->off, q->shape, &q->bytes, q->esize))
            break;
        q->have = true;
        if (used + q->bytes > cap) break;
        for (uint32_t j = 0; j < t->ndim; j++) q->off[j] += q->bx->ro[j];
        ckptio_region sub = {.size = sizeof sub, .tensor = q->bx->t, .offset = q->off,
                             .shape = q->shape, .dst = host + used, .capacity = q->bytes};
        plan pl;
        ckptio__read_plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
        box b;
        int rc = ckptio__read_prepare_region(r, &sub, 0, &b);
        if (rc == 0) rc = ckptio__read_plan_region(r, &pl, &b);
        if (rc == 0) rc = ckptio__read_execute(r, &pl);
        ckptio__read_plan_free(&pl);
        CKPTIO__TRY(rc);
        used += q->bytes;
        q->have = false;
    }
    return (int64_t)used;
}

typedef struct gds_check {
    ckptio_reader *r;
    const ckptio__mchunk *c;
    const char *label;
} gds_check;

/* A staged copy of bytes cuFile put in GPU memory, checked against the stored checksums
 * (slots are whole checksum blocks). */
static int check_landed(void *ctx, uint8_t *host, uint64_t n, uint64_t at)
{
    gds_check *v = ctx;
    ckptio_reader *r = v->r;
    uint64_t B = r->m->csum_block;
    for (uint64_t x = 0; x < n; x += B) {
        uint64_t len = CKPTIO__MIN(B, n - x);
        if (ckptio__hash(host + x, len) == r->m->csums[v->c->csums + (at + x) / B]) continue;
        const char *t = tname(r, (uint64_t)(v->c - r->m->chunks));
        return ckptio__fail_at(&r->msg, CKPTIO_E_CHECKSUM, t, v->label, NULL,
                               v->c->file_off + at + x,
                               "checksum mismatch in tensor '%s': bytes %llu..%llu at offset %llu "
                               "of '%s' (read by GDS) are damaged; restore this checkpoint from "
                               "a copy or load an earlier one",
                               t,
                               (unsigned long long)(at + x), (unsigned long long)(at + x + len),
                               (unsigned long long)(v->c->file_off + at + x), v->label);
    }
    return 0;
}

/* Straight from the file into GPU memory with cuFile: a whole tensor stored as one plain
 * chunk, aligned, in a file cuFile takes. Checksums are verified on a staged copy of what
 * landed. 1: done; 0: not this way (st.reason says why); negative: failed. */
static int read_gds(ckptio_reader *r, const box *bx, uint64_t stream)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const ckptio__mchunk *c = &r->m->chunks[t->chunk0];
    if (t->n_chunks != 1 || c->codec != CKPTIO__CODEC_NONE || c->stored_len != bx->bytes)
        return 0; /* one plain chunk, read whole */
    const rfile *f = &r->files[c->file];
    ckptio__gpu *g = &r->gpu;
    if (ckptio__gpu_route(g, f->fd, f->direct, c->file_off, bx->bytes, true) != CKPTIO__ROUTE_GDS)
        return 0;
    const char *name = r->m->strtab + t->name;
    uint64_t dst = (uint64_t)(uintptr_t)bx->reg->dst;
    char label[CKPTIO__MSG_LEN / 2];
    snprintf(label, sizeof label, "%s/%s", r->path, fname(r, c->file));
    /* cuFile knows no streams: what the caller queued on dst must finish first. */
    CKPTIO__TRY(ckptio__gpu_wait_caller(g, stream, &r->msg, name));
    CKPTIO__TRY(ckptio__gpu_gds_io(g, false, dst, bx->bytes, c->file_off, &r->msg, label));
    if (ckptio__read_verifying(r, c)) {
        gds_check v = {r, c, label};
        CKPTIO__TRY(ckptio__gpu_d2h(g, dst, bx->bytes, stream, check_landed, &v, &r->msg, name));
    }
    return 1;
}

/* A region in GPU memory: planned reads into the pinned ring, each slot copied to the device
 * while the next is read; or cuFile. */
static int read_gpu_region(ckptio_reader *r, const box *bx, uint64_t stream)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const char *name = r->m->strtab + t->name;
    if (!bx->bytes) return 0;
    ckptio__gpu *g = &r->gpu;
    CKPTIO__TRY(ckptio__gpu_start(g, (uint64_t)(uintptr_t)bx->reg->dst, &r->msg, name));
    int rc = read_gds(r, bx, stream);
    if (rc != 0) {
        if (rc > 0) r->stats.bytes += bx->bytes, r->stats.tensors++;
        return rc < 0 ? rc : 0;
    }
    gpu_get q = {.r = r, .bx = bx, .esize = ckptio_dtype_size((int)t->dtype)};
    ckptio__gpu_split_init(&q.sp, bx->rs, t->ndim, q.esize, g->slot);
    uint64_t tensors = r->stats.tensors;
    rc = ckptio__gpu_h2d(g, (uint64_t)(uintptr_t)bx->reg->dst, bx->bytes, stream, get_pieces, &q,
                         &r->msg, name);
    r->stats.tensors = tensors + 1; /* one region, however many pieces it was read in */
    if (rc == 0) ckptio__gpu_count(g, false, bx->bytes);
    return rc;
}

int ckptio_reader_gpu_stats(const ckptio_reader *r, ckptio_gpu_stats *out)
{
    if (!r || !out || out->size < offsetof(ckptio_gpu_stats, reason))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_gpu_stats: NULL argument or out->size not set");
    ckptio__gpu_stats(&r->gpu, out);
    return 0;
}

/* Reads run on the reader's threads (its ring, its workers), which a forked child has none of. */
static int owned(ckptio_reader *r)
{
    if (r->hs.pid == ckptio__pid) return 0;
    return ckptio__fail(&r->msg, CKPTIO_E_STATE,
                        "the reader of '%s' belongs to process %d, which forked this one: its "
                        "threads are that process's, so here it can only be closed; open the "
                        "checkpoint again in this process",
                        r->path, r->hs.pid);
}

int ckptio__read_range(ckptio_reader *r, const ckptio_region *regions, size_t first, size_t n)
{
    CKPTIO__TRY(owned(r));
    double t0 = ckptio__now();
    plan pl;
    ckptio__read_plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
    ckptio__vec gpu; /* regions in GPU memory, read after the host ones */
    ckptio__vec_init(&gpu, sizeof(ckptio_region));
    pl.cache = r->cfg.cache;
    int rc;
    box bx;
    ckptio_region reg;
    for (size_t i = first; i < first + n; i++) {
        CKPTIO__CHECK(ckptio__read_take_sized(&r->msg, &reg, sizeof reg, REGION_V1, regions, i,
                                              "ckptio_reader_read", "ckptio_region"));
        if (reg.memory > CKPTIO_MEM_CUDA) {
            rc = ckptio__fail(&r->msg, CKPTIO_E_USAGE,
                              "region %zu: unknown memory kind %u (CKPTIO_MEM_HOST is 0)", i,
                              reg.memory);
            goto out;
        }
        CKPTIO__CHECK(ckptio__read_prepare_region(r, &reg, i, &bx));
        if (reg.memory == CKPTIO_MEM_CUDA) {
            /* Checked now, before any byte is read: a refusal leaves every destination alone. */
            if (bx.bytes) {
                const char *name = r->m->strtab + r->m->tensors[bx.t].name;
                CKPTIO__CHECK(ckptio__gpu_start(&r->gpu, (uint64_t)(uintptr_t)reg.dst, &r->msg,
                                                name));
            }
            CKPTIO__GOTO_IF(ckptio__vec_push(&gpu, &reg, 1) < 0, -ENOMEM);
            continue;
        }
        CKPTIO__CHECK(ckptio__read_plan_region(r, &pl, &bx));
    }
    CKPTIO__CHECK(ckptio__read_execute(r, &pl));
    for (size_t i = 0; i < gpu.len; i++) {
        ckptio_region *g = CKPTIO__VEC_AT(&gpu, ckptio_region, i);
        CKPTIO__CHECK(ckptio__read_prepare_region(r, g, i, &bx));
        CKPTIO__CHECK(read_gpu_region(r, &bx, g->stream));
    }
out:
    ckptio__vec_free(&gpu);
    if (rc == -ENOMEM && !r->msg.text[0]) ckptio__fail(&r->msg, rc, "out of memory reading '%s'", r->path);
    if (rc < 0) ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    ckptio__read_plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}

int ckptio_reader_read(ckptio_reader *r, const ckptio_region *regions, size_t n)
{
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_read: reader is NULL");
    ckptio__msg_clear(&r->msg);
    if (n && !regions)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "ckptio_reader_read: regions is NULL");
    return ckptio__read_range(r, regions, 0, n);
}

int ckptio_reader_read_tensor(ckptio_reader *r, const char *name, void *dst, uint64_t capacity)
{
    if (!name) return ckptio__fail(r ? &r->msg : NULL, CKPTIO_E_USAGE, "ckptio_reader_read_tensor: name is NULL");
    ckptio_region reg = {.size = sizeof reg, .name = name, .dst = dst, .capacity = capacity};
    return ckptio_reader_read(r, &reg, 1);
}

int ckptio_reader_verify(ckptio_reader *r, uint64_t *bad_chunks)
{
    if (bad_chunks) *bad_chunks = 0;
    if (!r) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_reader_verify: reader is NULL");
    ckptio__msg_clear(&r->msg);
    CKPTIO__TRY(owned(r));
    if (r->dir)
        return ckptio__fail(&r->msg, CKPTIO_E_UNSUPPORTED,
                            "'%s': safetensors files carry no checksums: there is nothing to "
                            "verify",
                            r->path);
    double t0 = ckptio__now();
    plan pl;
    ckptio__read_plan_init(&pl, r->files, r->m->csum_block, r->cfg.request, r->buf_size);
    pl.cache = r->cfg.cache;
    int rc;
    ckptio__msg first_msg; /* the text and its values */
    int first = 0;
    pl.bad = calloc(r->m->n_chunks + 1, 1);
    CKPTIO__GOTO_IF(!pl.bad, -ENOMEM);
    for (uint64_t c = 0; c < r->m->n_chunks; c++) {
        const ckptio__mchunk *mc = &r->m->chunks[c];
        if (!mc->stored_len) continue;
        rc = ckptio__read_prepare_chunk(r, c);
        if (rc == CKPTIO_E_CORRUPT) {
            if (!first) {
                first = rc;
                first_msg = r->msg;
            }
            pl.bad[c] = 1;
            pl.bad_chunks++;
            continue;
        }
        CKPTIO__CHECK(rc);
        seg proto = {.piece = NONE, .chunk = c, .file = mc->file, .iter = NONE};
        extent x = ckptio__read_chunk_extent(r, c);
        CKPTIO__CHECK(ckptio__chunk_coded(mc)
                          ? ckptio__read_plan_coded(r, &pl, proto, 0, mc->raw_len)
                          : ckptio__read_plan_staged(&pl, &x, proto, 0, mc->stored_len));
        r->stats.bytes += mc->stored_len;
    }
    ckptio__msg_clear(&r->msg);
    rc = ckptio__read_execute(r, &pl);
    if (first) { /* a truncated file found while planning is reported first */
        rc = first;
        r->msg = first_msg;
    }
    if (rc == 0 && pl.bad_chunks) rc = CKPTIO_E_CHECKSUM;
out:
    if (bad_chunks) *bad_chunks = pl.bad_chunks;
    if (rc < 0) ckptio__refail(NULL, &r->msg, rc, NULL, NULL);
    ckptio__read_plan_free(&pl);
    r->stats.seconds += ckptio__now() - t0;
    return rc < 0 ? rc : 0;
}
