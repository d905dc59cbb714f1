/* SPDX-License-Identifier: Apache-2.0 */
/* The writer: opened on a temporary directory, fed chunks, committed atomically or closed. */
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

/* ---- open ---- */

/* The first data file, streamed through the sink. */
static int make_data(ckptio_writer *w)
{
    int direct = 0;
    uint32_t first;
    CKPTIO__TRY(ckptio__writer_new_file(w, 0, &w->fd, &direct, &w->data_label, &first));
    if (!w->parts)
        return ckptio__sink_init(&w->sink, w->fd, direct, w->cfg.backend, w->cfg.depth,
                                 w->cfg.threads, w->cfg.staging, w->cfg.request, w->data_label,
                                 &w->msg);
    /* One staging buffer is one part; the psync threads are the store's connections. */
    unsigned conns = ckptio__txn_parallel(&w->txn);
    CKPTIO__TRY(ckptio__sink_init(&w->sink, w->fd, 0, CKPTIO_BACKEND_PSYNC, conns, conns,
                                  CKPTIO__MAX(w->cfg.staging, 2 * w->part), w->part,
                                  w->data_label, &w->msg));
    ckptio__sink_parts(&w->sink);
    return 0;
}

/* A store of whole parts: the request size, at least the store's smallest part; a data file
 * rolls over to the next before it would need more parts than the store takes. */
static void parts_setup(ckptio_writer *w)
{
    const ckptio__store_ops *s = w->txn.store;
    w->parts = true;
    w->part = CKPTIO__MAX(w->cfg.request, s->part_min);
    w->cfg.csum_block = CKPTIO__MIN(w->cfg.csum_block, w->part);
    w->max_file_bytes = (uint64_t)(s->max_parts - 1) * w->part;
}

/* part: a rank's share of a distributed save, in its own data file; join: the temporary
 * directory that the coordinator began, to write into (NULL: begin it). */
static int open_writer(ckptio_writer **out, const char *path, const ckptio_params *p, bool part,
                       const char *join, uint32_t rank)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_open: out and path are required");
    }
    *out = NULL;
    ckptio_writer *w = calloc(1, sizeof *w);
    if (!w) return ckptio__fail(NULL, -ENOMEM, "out of memory opening a writer for '%s'", path);
    w->fd = -1;
    ckptio__handle_init(&w->hs);
    w->is_part = part;
    w->t_open = ckptio__now();
    ckptio__vec_init(&w->tensors, sizeof(wtensor));
    ckptio__vec_init(&w->chunks, sizeof(ckptio__mchunk));
    ckptio__vec_init(&w->next, sizeof(uint64_t));
    ckptio__vec_init(&w->dims, sizeof(uint64_t));
    ckptio__vec_init(&w->csums, sizeof(uint64_t));
    ckptio__vec_init(&w->blocks, sizeof(uint32_t));
    ckptio__vec_init(&w->meta, sizeof(wmeta));
    ckptio__vec_init(&w->pending, sizeof(pending_csums));
    ckptio__strmap_init(&w->names);
    int rc;
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &w->cfg, &w->msg));
    ckptio__gpu_init(&w->gpu, w->cfg.gpu, w->cfg.gpu_staging, w->cfg.csum_block);
    w->gpu.ring_on_demand = true; /* staged pieces land in the sink's windows (chunks.c) */
    /* Before the first file is made: ranks joining one directory must never share a name. */
    if (part && asprintf(&w->file_prefix, "r%05u-", rank) < 0) {
        w->file_prefix = NULL;
        CKPTIO__GOTO_IF(true, -ENOMEM);
    }
    if (join)
        CKPTIO__CHECK(ckptio__txn_join(&w->txn, path, join, ckptio__cfg_txn_flags(&w->cfg),
                                       w->cfg.store, &w->msg));
    else
        CKPTIO__CHECK(ckptio__txn_begin(&w->txn, path, CKPTIO__TXN_DIR,
                                        ckptio__cfg_txn_flags(&w->cfg), 0, w->cfg.store,
                                        &w->msg));
    w->path = w->txn.path;
    unsigned caps = ckptio__txn_caps(&w->txn);
    if (caps & CKPTIO__STORE_PARTS) parts_setup(w);
    CKPTIO__GOTO_IF(w->cfg.base && !(caps & CKPTIO__STORE_LOCAL),
                    ckptio__fail(&w->msg, CKPTIO_E_UNSUPPORTED,
                                 "'%s': incremental checkpoints (base=) are not yet supported in "
                                 "the %s store; save it whole",
                                 w->path, w->txn.store->name));
    if (w->cfg.base) CKPTIO__CHECK(ckptio__writer_open_base(w));
    if (part && !join && (caps & CKPTIO__STORE_LOCAL)) {
        w->tmp_abs = realpath(w->txn.tmp_path, NULL);
        CKPTIO__GOTO_IF(!w->tmp_abs, ckptio__fail(&w->msg, -errno, "cannot resolve '%s'",
                                                  w->txn.tmp_path));
    }
    CKPTIO__CHECK(make_data(w));
    ckptio__stats_backend(w->stats.backend, w->cfg.backend, ckptio__engine_name(w->sink.eng));
    w->stats.direct = w->sink.direct;
    w->stats.alignment = w->sink.off_align;
    *out = w;
    return 0;
out:
    if (rc == -ENOMEM && !w->msg.text[0]) ckptio__fail(&w->msg, rc, "out of memory");
    ckptio__msg keep = w->msg;
    ckptio_writer_close(w);
    return ckptio__refail(NULL, &keep, rc, "cannot open writer", NULL);
}

int ckptio_writer_open(ckptio_writer **out, const char *path, const ckptio_params *p)
{
    return open_writer(out, path, p, false, NULL, 0);
}

int ckptio__writer_open_part(ckptio_writer **out, const char *path, const char *join, uint32_t rank,
                             const ckptio_params *p)
{
    return open_writer(out, path, p, true, join, rank);
}

const char *ckptio__writer_tmp_path(const ckptio_writer *w)
{
    return w->tmp_abs ? w->tmp_abs : w->txn.tmp_path;
}

void ckptio__writer_drop_part(ckptio_writer *w)
{
    if (w && w->file_prefix) ckptio__txn_drop(&w->txn, w->file_prefix);
}

/* ---- commit ---- */

/* The manifest of everything written (format/build.c sorts, validates and encodes it). */
static int build_manifest(ckptio_writer *w, uint64_t file_size, uint8_t **buf, uint64_t *len,
                          bool partial)
{
    int rc = 0;
    char(*names)[DATA_NAME_LEN] = malloc((w->n_files + 1) * sizeof *names);
    ckptio__bfile *files = malloc((w->n_files + 1) * sizeof *files);
    ckptio__broot *roots = malloc((w->n_stripes + 1) * sizeof *roots);
    *buf = NULL;
    CKPTIO__GOTO_IF(!names || !files || !roots, -ENOMEM);
    for (uint64_t i = 0; i < w->n_files; i++) {
        data_name(w, i, names[i], sizeof names[i]);
        files[i] = (ckptio__bfile){.name = names[i], .root = w->file_roots[i],
                                   .size = i == w->cur_file ? file_size : w->sizes[i]};
    }
    for (size_t k = 0; k < w->n_stripes; k++)
        roots[k] = (ckptio__broot){.path = w->stripes[k].root, .name = w->stripes[k].name};
    ckptio__build b = {
        .tensors = w->tensors.items, .n_tensors = w->tensors.len,
        .chunks = w->chunks.items, .next = w->next.items, .n_chunks = w->chunks.len,
        .dims = w->dims.items, .n_dims = w->dims.len,
        .csums = w->csums.items, .n_csums = w->csums.len,
        .meta = w->meta.items, .n_meta = w->meta.len,
        .files = files, .n_files = w->n_files, .roots = roots, .n_roots = w->n_stripes,
        .checksums = w->cfg.checksums, .csum_block = w->cfg.csum_block, .partial = partial,
        .blocks = w->blocks.items, .n_blocks = w->blocks.len,
        .base = w->base, .base_sum = w->base_sum,
    };
    char err[CKPTIO__MSG_LEN];
    rc = ckptio__manifest_build(&b, w->path, buf, len, err, sizeof err);
    if (rc < 0 && err[0]) ckptio__fail(&w->msg, rc, "%s", err);
out:
    free(names);
    free(files);
    free(roots);
    return rc;
}



/* The transaction published: the writer is done. */
static void committed(ckptio_writer *w)
{
    w->hs.state = CKPTIO__H_COMMITTED;
    w->stats.seconds = ckptio__now() - w->t_open;
    w->stats.gbps = w->stats.seconds > 0 ? (double)w->stats.bytes / w->stats.seconds / 1e9 : 0;
}

static int publish_with(ckptio_writer *w, const uint8_t *man, uint64_t man_len)
{
    int rc;
    if (w->cfg.fsync) /* the stripes' entries durable before the commit shows them */
        for (size_t k = 0; k < w->n_stripes; k++)
            CKPTIO__TRY(ckptio__stripe_sync(&w->stripes[k], &w->msg));
    /* An overwrite replaces the old checkpoint's stripes too, once the new one is published. */
    char **old_roots = NULL;
    size_t n_old = 0;
    if (w->txn.found == CKPTIO__AT_CHECKPOINT && (ckptio__txn_caps(&w->txn) & CKPTIO__STORE_LOCAL))
        (void)ckptio__stripe_recorded_roots(w->txn.path, &old_roots, &n_old);
    rc = ckptio__txn_publish(&w->txn, man, man_len, &w->msg);
    if (w->txn.published && (ckptio__txn_caps(&w->txn) & CKPTIO__STORE_LOCAL)) {
        char *owner = ckptio__stripe_owner_of(w->txn.path);
        unsigned found;
        for (size_t k = 0; k < w->n_stripes; k++) {
            w->stripes[k].keep = true;
            if (owner) ckptio__stripe_collect_owned(owner, w->stripes[k].root, false, &found);
        }
        for (size_t k = 0; k < n_old; k++)
            if (owner) ckptio__stripe_collect_owned(owner, old_roots[k], false, &found);
        free(owner);
    }
    for (size_t k = 0; k < n_old; k++) free(old_roots[k]);
    free(old_roots);
    if (w->txn.published) committed(w); /* CKPTIO_E_NOT_DURABLE too: the checkpoint is complete */
    return rc;
}

/* The end of the data: the hasher done with the caller's memory (first, whatever happens
 * next), the sink drained, the current data file fsynced and closed. */
static int seal_data(ckptio_writer *w)
{
    ckptio__writer_settle_hashes(w);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        lane *l = &w->lanes[k];
        if (l->fd < 0) continue;
        CKPTIO__TRY(ckptio__writer_finish_file(w, &l->sink, &l->fd, l->label, l->file));
        w->stats.io_bytes += l->sink.io_bytes;
    }
    CKPTIO__TRY(ckptio__writer_finish_file(w, &w->sink, &w->fd, w->data_label, w->cur_file));
    w->stats.io_bytes += w->sink.io_bytes;
    return 0;
}

int ckptio_writer_commit(ckptio_writer *w)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_commit: writer is NULL");
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    uint8_t *man = NULL;
    uint64_t man_len = 0;
    int rc;
    CKPTIO__CHECK(seal_data(w));
    CKPTIO__CHECK(build_manifest(w, w->sink.cursor, &man, &man_len, false));
    rc = publish_with(w, man, man_len);
out:
    free(man);
    if (rc < 0 && w->hs.state == CKPTIO__H_OPEN) {
        if (!w->msg.text[0]) ckptio__fail(&w->msg, rc, "committing '%s' failed", w->path);
        rc = ckptio__writer_poison(w, rc);
        ckptio__msg_name(&w->msg, NULL, w->path, NULL, CKPTIO_ERROR_NO_OFFSET);
    }
    return rc;
}

int ckptio__writer_finish_part(ckptio_writer *w, ckptio_bytes *part)
{
    ckptio__msg_clear(&w->msg);
    CKPTIO__TRY(ckptio__writer_check_usable(w));
    uint8_t *man = NULL;
    uint64_t man_len = 0;
    int rc;
    CKPTIO__CHECK(seal_data(w));
    CKPTIO__CHECK(build_manifest(w, w->sink.cursor, &man, &man_len, true));
    CKPTIO__GOTO_IF(ckptio_bytes_set(part, man, man_len) < 0, -ENOMEM);
    CKPTIO__CHECK(ckptio__txn_seal(&w->txn, &w->msg)); /* this rank's entries durable */
    /* Closed to adds (they now say "committed"); the temporary directory stays until the
     * coordinator publishes it or its close removes it. */
    w->hs.state = CKPTIO__H_COMMITTED;
    w->part_done = true;
out:
    free(man);
    if (rc < 0 && w->hs.state == CKPTIO__H_OPEN) {
        if (!w->msg.text[0]) ckptio__fail(&w->msg, rc, "writing '%s' failed", w->data_label);
        rc = ckptio__writer_poison(w, rc);
    }
    return rc;
}

int ckptio__writer_publish_manifest(ckptio_writer *w, const uint8_t *man, uint64_t len)
{
    ckptio__msg_clear(&w->msg);
    if (!w->part_done || !w->txn.owner || w->txn.published)
        return ckptio__fail(&w->msg, CKPTIO_E_STATE,
                            "internal error: '%s' has no finished part to publish", w->path);
    int rc = publish_with(w, man, len);
    if (rc < 0 && !w->txn.published) w->part_done = false;
    return rc;
}

void ckptio_writer_close(ckptio_writer *w)
{
    if (!w) return;
    /* The GPU state goes first: it unregisters the sinks' staging (their writes done) before
     * they unmap it, and the data file from cuFile before it is closed. */
    ckptio__sink_drain(&w->sink);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) ckptio__sink_drain(&w->lanes[k].sink);
    ckptio__gpu_fini(&w->gpu);
    ckptio__sink_fini(&w->sink);
    for (size_t k = 0; w->lanes && k <= w->n_stripes; k++) {
        ckptio__sink_fini(&w->lanes[k].sink);
        ckptio__writer_close_data(w->lanes[k].fd);
        free(w->lanes[k].label);
    }
    ckptio__writer_settle_hashes(w);
    ckptio__hasher_stop(w->hasher);
    ckptio__vec_free(&w->pending);
    ckptio__writer_close_data(w->fd);
    ckptio__txn_fini(&w->txn); /* removes the temporary directory unless published */
    for (size_t k = 0; k < w->n_stripes; k++) ckptio__stripe_fini(&w->stripes[k]);
    free(w->stripes);
    free(w->lanes);
    free(w->data_label);
    free(w->tmp_abs);
    free(w->file_prefix);
    free(w->sizes);
    free(w->file_roots);
    for (size_t i = 0; i < w->meta.len; i++) {
        wmeta *m = CKPTIO__VEC_AT(&w->meta, wmeta, i);
        free(m->key);
        free(m->val);
    }
    ckptio__vec_free(&w->meta);
    ckptio__vec_free(&w->tensors);
    ckptio__vec_free(&w->chunks);
    ckptio__vec_free(&w->next);
    ckptio__vec_free(&w->dims);
    ckptio__vec_free(&w->csums);
    ckptio__vec_free(&w->blocks);
    ckptio__writer_coder_free(w);
    ckptio_reader_close(w->base_reader);
    free(w->base);
    ckptio__strmap_free(&w->names);
    while (w->arena) {
        arena_block *p = w->arena->prev;
        free(w->arena);
        w->arena = p;
    }
    free(w);
}

int ckptio_writer_stats(const ckptio_writer *w, ckptio_stats *out)
{
    if (!w || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_stats: NULL argument");
    *out = w->stats;
    out->tensors = w->tensors.len;
    if (w->hs.state != CKPTIO__H_COMMITTED) {
        out->seconds = ckptio__now() - w->t_open;
        out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    }
    return 0;
}

const char *ckptio_writer_errmsg(const ckptio_writer *w)
{
    return w ? w->msg.text : "";
}

int ckptio_writer_error_info(const ckptio_writer *w, ckptio_error_info *out)
{
    if (!w) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_writer_error_info: handle is NULL");
    return ckptio__msg_info(&w->msg, out, "ckptio_writer_error_info");
}
