/* SPDX-License-Identifier: Apache-2.0 */
/* The convert engine: any source to any sink, streamed through one bounded buffer, published
 * atomically, with progress (`ckptio_convert`). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"

#define PIECE_DEFAULT (32ull << 20)
#define SHARD_DEFAULT (5ull << 30)
/* The reader and writers get smaller staging pools than their defaults: the buffer here already
 * bounds what is in flight. */
#define STAGING_BYTES (16ull << 20)

/* ---- progress: the line the `ckptio` command draws for every long job ---------------------- */

static void human(char *buf, size_t n, double bytes)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    unsigned u = 0;
    while (bytes >= 1000.0 && u + 1 < sizeof unit / sizeof unit[0])
        bytes /= 1000.0, u++;
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
}

/* First after a second, then at most four times a second; `last` clears it. */
static void progress(ckptio__conv *c, bool last)
{
    if (c->a.progress && !last) c->a.progress(c->a.progress_ctx, c->done, c->total);
    if (!(c->a.flags & CKPTIO_CONVERT_PROGRESS) || !isatty(STDERR_FILENO)) return;
    double t = ckptio__now(), dt = t - c->t0;
    if (last) {
        if (c->drawn > 0) fputs("\r\033[K", stderr), fflush(stderr);
        return;
    }
    if (dt < 1.0 || t - c->drawn < 0.25) return;
    char a[32], b[32];
    human(a, sizeof a, (double)c->done);
    human(b, sizeof b, (double)c->total);
    fprintf(stderr, "\r\033[Kconverting %s -> %s  %s / %s (%.0f%%)  %.1f s", c->a.src, c->a.dst,
            a, b, c->total ? 100.0 * (double)c->done / (double)c->total : 100.0, dt);
    fflush(stderr);
    c->drawn = t;
}

/* ---- sources ------------------------------------------------------------------------------- */

static int open_reader(ckptio__conv *c)
{
    ckptio_params p = c->p; /* the source's store, not the destination's */
    p.store = c->a.src_store;
    int rc = c->a.from == CKPTIO_CONVERT_CKPTIO
                 ? ckptio_reader_open(&c->reader, c->a.src, &p)
                 : ckptio_reader_open_foreign(&c->reader, c->a.src, &p);
    if (rc < 0) return conv_keep(c, rc);
    c->n_items = ckptio_reader_num_tensors(c->reader);
    size_t nm = ckptio_reader_num_meta(c->reader);
    c->items = calloc(c->n_items + 1, sizeof *c->items);
    c->meta = calloc(nm + 1, sizeof *c->meta);
    if (!c->items || !c->meta) return CONV_FAIL(c, -ENOMEM, "out of memory");
    for (size_t i = 0; i < c->n_items; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        if ((rc = ckptio_reader_tensor(c->reader, i, &ti)) < 0) return conv_keep(c, rc);
        ckptio_convert_tensor *t = &c->items[i];
        *t = (ckptio_convert_tensor){.size = sizeof *t, .name = ti.name, .dtype = ti.dtype,
                                     .ndim = ti.ndim, .nbytes = ti.nbytes};
        memcpy(t->shape, ti.shape, ti.ndim * sizeof *ti.shape);
    }
    for (size_t i = 0; i < nm; i++) {
        ckptio_convert_meta *m = &c->meta[c->n_meta];
        *m = (ckptio_convert_meta){.size = sizeof *m};
        if ((rc = ckptio_reader_meta(c->reader, i, &m->key, &m->val, &m->len)) < 0)
            return conv_keep(c, rc);
        /* An index's total_size describes its shards, not the model: a new one is written. */
        if (c->a.from == CKPTIO_CONVERT_HF && !strcmp(m->key, "total_size")) continue;
        c->n_meta++;
    }
    return 0;
}

static int open_external(ckptio__conv *c)
{
    const ckptio_convert_tensor *t = NULL;
    const ckptio_convert_meta *m = NULL;
    size_t nt = 0, nm = 0;
    int rc = c->ext_src->list(c->ext_src->ctx, &t, &nt, &m, &nm);
    if (rc < 0) {
        const char *why = c->ext_src->errmsg ? c->ext_src->errmsg(c->ext_src->ctx) : NULL;
        return CONV_FAIL(c, rc, "%s: the source cannot list its tensors: %s", c->a.src,
                         why ? why : ckptio_strerror(rc));
    }
    /* Copies, so that the engine's own fields (the order, the sinks) never write into them. */
    c->items = calloc(nt + 1, sizeof *c->items);
    c->meta = calloc(nm + 1, sizeof *c->meta);
    if (!c->items || !c->meta) return CONV_FAIL(c, -ENOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) {
        c->items[i] = t[i];
        uint64_t n = ckptio_dtype_size(t[i].dtype);
        for (uint32_t d = 0; d < t[i].ndim && t[i].ndim <= CKPTIO_MAX_NDIM; d++)
            n *= t[i].shape[d];
        if (!t[i].name || !n != !t[i].nbytes || n != t[i].nbytes || t[i].ndim > CKPTIO_MAX_NDIM)
            return CONV_FAIL(c, CKPTIO_E_SHAPE, "%s: tensor %zu ('%s'): dtype, shape and size "
                             "disagree", c->a.src, i, t[i].name ? t[i].name : "?");
    }
    memcpy(c->meta, m, nm * sizeof *m);
    c->n_items = nt, c->n_meta = nm;
    return 0;
}

/* ---- pieces: boxes of a tensor that are contiguous in row-major order and fit the buffer ---- */

/* The piece of `it` that starts at byte `pos` (a multiple of what earlier pieces took) and
 * holds at most `cap` bytes: a run of whole rows of the largest trailing block that fits. */
static void next_piece(const ckptio_convert_tensor *it, uint64_t pos, uint64_t cap,
                       ckptio__piece *pc)
{
    uint64_t es = ckptio_dtype_size(it->dtype);
    pc->first = pos;
    if (it->nbytes <= cap || it->ndim == 0) {
        for (uint32_t d = 0; d < it->ndim; d++)
            pc->off[d] = 0, pc->box[d] = it->shape[d];
        pc->nbytes = it->nbytes;
        return;
    }
    uint32_t k = 0;
    uint64_t inner = it->nbytes / es; /* elements below dimension k, for k = -1 */
    for (k = 0; k < it->ndim; k++) {
        inner /= it->shape[k];
        if (inner * es <= cap) break;
    }
    uint64_t row = inner * es, idx = pos / es / inner;
    /* Dimensions above k index one row; dimension k takes as many as fit. */
    for (int d = (int)k; d >= 0; d--) {
        pc->off[d] = idx % it->shape[d];
        idx /= it->shape[d];
        pc->box[d] = 1;
    }
    uint64_t room = it->shape[k] - pc->off[k], fit = cap / row;
    pc->box[k] = fit < room ? fit : room;
    for (uint32_t d = k + 1; d < it->ndim; d++)
        pc->off[d] = 0, pc->box[d] = it->shape[d];
    pc->nbytes = pc->box[k] * row;
}

/* ---- the copy ------------------------------------------------------------------------------ */

static int read_batch(ckptio__conv *c, uint8_t *buf, const ckptio__piece *pcs, size_t n)
{
    if (c->reader) { /* one call, so the reads of many small tensors are planned together */
        ckptio_region *rg = calloc(n + 1, sizeof *rg);
        if (!rg) return CONV_FAIL(c, -ENOMEM, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (pcs[i].nbytes)
                rg[k++] = (ckptio_region){.size = sizeof *rg, .tensor = pcs[i].item,
                                          .offset = pcs[i].off, .shape = pcs[i].box,
                                          .dst = buf + pcs[i].at, .capacity = pcs[i].nbytes};
        int rc = k ? ckptio_reader_read(c->reader, rg, k) : 0;
        free(rg);
        return rc < 0 ? conv_keep(c, rc) : 0;
    }
    for (size_t i = 0; i < n; i++) {
        const ckptio__piece *pc = &pcs[i];
        if (!pc->nbytes) continue;
        int rc = c->ext_src->read(c->ext_src->ctx, pc->item, pc->first, buf + pc->at, pc->nbytes);
        if (rc < 0) {
            const char *why = c->ext_src->errmsg ? c->ext_src->errmsg(c->ext_src->ctx) : NULL;
            return CONV_FAIL(c, rc, "%s: tensor '%s': reading %llu bytes at %llu: %s", c->a.src,
                             c->items[pc->item].name, (unsigned long long)pc->nbytes,
                             (unsigned long long)pc->first, why ? why : ckptio_strerror(rc));
        }
    }
    return 0;
}

static int write_batch(ckptio__conv *c, const uint8_t *buf, const ckptio__piece *pcs, size_t n)
{
    int rc;
    for (size_t i = 0; i < n; i++) {
        const ckptio__piece *pc = &pcs[i];
        const ckptio_convert_tensor *it = &c->items[pc->item];
        if (c->writer) {
            rc = ckptio_writer_add(c->writer, it->name, it->dtype, it->ndim, it->shape, pc->off,
                                   pc->box, buf + pc->at, pc->nbytes);
            if (rc < 0) return conv_keep(c, rc);
        } else if (c->ext_sink) {
            rc = c->ext_sink->write(c->ext_sink->ctx, pc->item, pc->first, buf + pc->at,
                                    pc->nbytes);
            if (rc < 0) {
                const char *why = c->ext_sink->errmsg ? c->ext_sink->errmsg(c->ext_sink->ctx) : NULL;
                return CONV_FAIL(c, rc, "%s: tensor '%s': writing: %s", c->a.dst, it->name,
                                 why ? why : ckptio_strerror(rc));
            }
        } else if ((rc = ckptio__conv_st_write(c, buf, pc)) < 0) {
            return rc;
        }
    }
    /* The writer may still point into the buffer; the others copied already. */
    if (c->writer && (rc = ckptio_writer_flush(c->writer)) < 0) return conv_keep(c, rc);
    return 0;
}

static int copy_all(ckptio__conv *c)
{
    uint64_t cap = c->a.piece_bytes;
    size_t max_pieces = 4096, n = 0;
    ckptio__piece *pcs = malloc(max_pieces * sizeof *pcs);
    uint8_t *buf = NULL;
    if (!pcs || posix_memalign((void **)&buf, 4096, cap)) {
        free(pcs);
        return CONV_FAIL(c, -ENOMEM, "out of memory for the %llu-byte copy buffer",
                         (unsigned long long)cap);
    }
    int rc = 0;
    uint64_t used = 0;
    for (size_t k = 0; k <= c->n_items && !rc; k++) {
        uint64_t pos = 0;
        bool last = k == c->n_items;
        do {
            ckptio__piece pc = {.item = last ? 0 : c->order[k], .pos = k};
            if (!last) next_piece(&c->items[pc.item], pos, cap, &pc);
            uint64_t at = (used + 4095) / 4096 * 4096;
            if (last || n == max_pieces || at + pc.nbytes > cap) {
                if (n && ((rc = read_batch(c, buf, pcs, n)) < 0 ||
                          (rc = write_batch(c, buf, pcs, n)) < 0))
                    break;
                for (size_t i = 0; i < n; i++)
                    c->done += pcs[i].nbytes;
                progress(c, false);
                n = 0, used = 0, at = 0;
                if (last) break;
            }
            pc.at = at;
            used = at + pc.nbytes;
            pcs[n++] = pc;
            pos += pc.nbytes;
        } while (pos < c->items[c->order[k]].nbytes);
    }
    free(pcs);
    free(buf);
    return rc;
}

/* ---- sinks --------------------------------------------------------------------------------- */

static int begin_sink(ckptio__conv *c)
{
    int rc = ckptio__conv_check_dst(c);
    if (rc < 0) return rc;
    if (c->ext_sink) {
        if ((rc = ckptio__conv_tmp_begin(c, c->ext_sink->is_dir)) < 0) return rc;
        rc = c->ext_sink->begin(c->ext_sink->ctx, c->items, c->n_items, c->meta, c->n_meta,
                                c->tmp);
        if (rc < 0) {
            const char *why = c->ext_sink->errmsg ? c->ext_sink->errmsg(c->ext_sink->ctx) : NULL;
            return CONV_FAIL(c, rc, "%s: the destination cannot begin: %s", c->a.dst,
                             why ? why : ckptio_strerror(rc));
        }
        c->sink_begun = true;
        return 0;
    }
    if (c->a.to != CKPTIO_CONVERT_CKPTIO) return ckptio__conv_st_begin(c);
    if ((rc = ckptio_writer_open(&c->writer, c->a.dst, &c->p)) < 0) {
        if (rc == CKPTIO_E_EXISTS && !c->a.overwrite)
            return CONV_FAIL(c, rc, "%s already exists; pass --overwrite to replace it",
                             c->a.dst);
        return conv_keep(c, rc);
    }
    for (size_t i = 0; i < c->n_meta; i++)
        if ((rc = ckptio_writer_set_meta(c->writer, c->meta[i].key, c->meta[i].val,
                                         c->meta[i].len)) < 0)
            return conv_keep(c, rc);
    return 0;
}

static int end_sink(ckptio__conv *c)
{
    int rc;
    if (c->ext_sink) {
        c->sink_begun = false; /* end() is the last call either way */
        if ((rc = c->ext_sink->end(c->ext_sink->ctx)) < 0) {
            const char *why = c->ext_sink->errmsg ? c->ext_sink->errmsg(c->ext_sink->ctx) : NULL;
            return CONV_FAIL(c, rc, "%s: finishing: %s", c->a.dst, why ? why : ckptio_strerror(rc));
        }
        return ckptio__conv_publish(c);
    }
    if (c->writer) {
        rc = ckptio_writer_commit(c->writer);
        return rc < 0 && rc != CKPTIO_E_NOT_DURABLE ? conv_keep(c, rc) : 0;
    }
    return ckptio__conv_st_end(c);
}

/* ---- the entry point ----------------------------------------------------------------------- */

static int settle(ckptio__conv *c, const ckptio_convert_args *a, char **dst)
{
    /* The struct of 0.3 before compress is the smallest one taken; fields past a caller's
     * size stay 0. */
    if (!a || a->size < offsetof(ckptio_convert_args, compress) || a->size > 4096 || !a->src ||
        !a->dst || !*a->src || !*a->dst)
        return CONV_FAIL(c, CKPTIO_E_USAGE, "ckptio_convert: args, src and dst are required "
                         "(args->size = sizeof(ckptio_convert_args))");
    memcpy(&c->a, a, CKPTIO__MIN(a->size, sizeof c->a));
    /* "out/" names the directory out: its temporary sibling must not land inside it. */
    size_t dl = strlen(a->dst);
    while (dl > 1 && a->dst[dl - 1] == '/')
        dl--;
    if (!(*dst = strndup(a->dst, dl))) return CONV_FAIL(c, -ENOMEM, "out of memory");
    c->a.dst = *dst;
    int f = a->from ? a->from : ckptio__conv_detect(a->src, 0, 0, c->a.src_store);
    if (f < 0) return conv_keep(c, f);
    int t = a->to ? a->to
                  : ckptio__conv_detect(c->a.dst, 1, a->max_shard_bytes != 0, c->a.dst_store);
    if (t < 0) return conv_keep(c, t);
    if (!ckptio_convert_format_name(f) || !ckptio_convert_format_name(t))
        return CONV_FAIL(c, CKPTIO_E_USAGE, "ckptio_convert: unknown format %d", f > 0 ? t : f);
    c->a.from = f, c->a.to = t;
    c->ext_src = a->source && a->source->size >= sizeof *a->source ? a->source : NULL;
    c->ext_sink = a->sink && a->sink->size >= sizeof *a->sink ? a->sink : NULL;
    if ((c->ext_src && (!c->ext_src->list || !c->ext_src->read)) ||
        (c->ext_sink && (!c->ext_sink->begin || !c->ext_sink->write || !c->ext_sink->end)))
        return CONV_FAIL(c, CKPTIO_E_USAGE, "ckptio_convert: a source needs list and read, a "
                         "sink begin, write and end");
    if ((!c->ext_src && f >= CKPTIO_CONVERT_TORCH) || (!c->ext_sink && t >= CKPTIO_CONVERT_TORCH))
        return CONV_FAIL(c, CKPTIO_E_UNSUPPORTED,
                         "converting %s -> %s needs Python with ckptio and torch: run it with "
                         "python -m ckptio convert (pip install ckptio torch)",
                         ckptio_convert_format_name(f), ckptio_convert_format_name(t));
    if ((ckptio__conv_remote(c->a.dst) > 0 && t != CKPTIO_CONVERT_CKPTIO) ||
        (ckptio__conv_remote(a->src) > 0 && f >= CKPTIO_CONVERT_TORCH))
        return CONV_FAIL(c, CKPTIO_E_UNSUPPORTED,
                         "converting %s -> %s: in an object store ckptio reads ckptio, "
                         "safetensors and Hugging Face checkpoints and writes ckptio ones; "
                         "convert through a local directory",
                         ckptio_convert_format_name(f), ckptio_convert_format_name(t));
    if (a->max_shard_bytes && t != CKPTIO_CONVERT_HF)
        return CONV_FAIL(c, CKPTIO_E_USAGE, "--max-shard-size applies to hf destinations only");
    if (c->a.compress < CKPTIO_COMPRESS_NONE || c->a.compress > CKPTIO_COMPRESS_ALL)
        return CONV_FAIL(c, CKPTIO_E_USAGE, "ckptio_convert: compress is %d: pass an enum "
                         "ckptio_compress (none, auto, all)", c->a.compress);
    if (c->a.compress && (t != CKPTIO_CONVERT_CKPTIO || c->ext_sink))
        return CONV_FAIL(c, CKPTIO_E_USAGE, "--compress applies to ckptio destinations only "
                         "(%s stores its tensors as they are)", ckptio_convert_format_name(t));
    if (!c->a.max_shard_bytes) c->a.max_shard_bytes = SHARD_DEFAULT;
    uint64_t pb = a->piece_bytes ? a->piece_bytes : PIECE_DEFAULT;
    c->a.piece_bytes = pb < 4096 ? 4096 : pb / 4096 * 4096;
    ckptio_params_init(&c->p);
    c->p.staging_bytes = STAGING_BYTES;
    c->p.overwrite = a->overwrite != 0;
    c->p.compress = c->a.compress; /* the writer's; a reader ignores it */
    c->p.store = c->a.dst_store;
    return 0;
}

int ckptio_convert(const ckptio_convert_args *a, ckptio_convert_result *out)
{
    ckptio__conv *c = calloc(1, sizeof *c);
    if (!c) return ckptio__fail(NULL, -ENOMEM, "ckptio_convert: out of memory");
    char *dst = NULL;
    c->t0 = ckptio__now();
    int rc = settle(c, a, &dst);
    if (rc < 0) goto out;
    rc = c->ext_src ? open_external(c) : open_reader(c);
    if (rc < 0) goto out;
    if (!(c->order = malloc((c->n_items + 1) * sizeof *c->order))) {
        rc = CONV_FAIL(c, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < c->n_items; i++)
        c->order[i] = i, c->total += c->items[i].nbytes;
    if ((rc = begin_sink(c)) < 0 || (rc = copy_all(c)) < 0 || (rc = end_sink(c)) < 0) goto out;
    if (out && out->size >= sizeof *out)
        out->from = c->a.from, out->to = c->a.to, out->n_tensors = c->n_items,
        out->nbytes = c->total;
out:
    progress(c, true);
    if (c->sink_begun && c->ext_sink->abort) c->ext_sink->abort(c->ext_sink->ctx);
    ckptio__conv_tmp_abort(c);
    ckptio_file_writer_close(c->fw);
    ckptio_writer_close(c->writer);
    ckptio_reader_close(c->reader);
    /* Raised again: closing may have overwritten the thread's last error. */
    if (rc < 0) ckptio__refail(NULL, &c->msg, rc, NULL, NULL);
    free(c->items);
    free(c->meta);
    free(c->order);
    free(c->shard);
    free(dst);
    free(c);
    return rc;
}
