/* SPDX-License-Identifier: Apache-2.0 */
/* Distributed saves: every rank's pieces of global tensors into one checkpoint, atomically. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/plan.h"
#include "format/manifest.h"
#include "internal.h"

/* The coordinator's plan cache, one per process: a job saves through one communicator, and
 * a save through another (or with another rank count) simply plans afresh. */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static ckptio__plan_cache cache;
static const void *cache_ctx;
static int32_t cache_nranks;

/* Items in, holdings out: checks the public struct, hashes each box. */
static int make_holds(const ckptio_dist_item *items, size_t n, ckptio__hold *h, uint64_t *zeros,
                      char *why, size_t wl)
{
    if (n && !items) return snprintf(why, wl, "items missing for %zu items", n), CKPTIO_E_USAGE;
    for (size_t i = 0; i < n; i++) {
        const ckptio_dist_item *it = &items[i];
        if (it->size < sizeof *it) {
            snprintf(why, wl,
                     "item %zu: size %u, expected %zu (set it to sizeof(ckptio_dist_item))", i,
                     it->size, sizeof *it);
            return CKPTIO_E_USAGE;
        }
        if (!it->name || it->ndim > CKPTIO_MAX_NDIM || (it->ndim && !it->shape) ||
            (it->nbytes && !it->data)) {
            snprintf(why, wl, "item %zu ('%.200s'): name, shape or data missing, or over %u "
                     "dimensions", i, it->name ? it->name : "", CKPTIO_MAX_NDIM);
            return it->ndim > CKPTIO_MAX_NDIM ? CKPTIO_E_LIMIT : CKPTIO_E_USAGE;
        }
        size_t nl = strlen(it->name);
        uint32_t fl = it->flags & CKPTIO_DIST_RANK_LOCAL ? CKPTIO__HOLD_RANK_LOCAL : 0;
        h[i] = (ckptio__hold){.name = it->name,
                              .name_len = nl > UINT32_MAX ? UINT32_MAX : (uint32_t)nl,
                              .dtype = (uint32_t)it->dtype, .ndim = it->ndim,
                              .flags = fl,
                              .shape = it->shape, .offset = it->offset ? it->offset : zeros,
                              .box = it->box ? it->box : it->shape, .nbytes = it->nbytes};
        if (it->flags & ~CKPTIO_DIST_RANK_LOCAL) {
            snprintf(why, wl, "item %zu ('%.200s'): unknown flags 0x%x", i, it->name, it->flags);
            return CKPTIO_E_USAGE;
        }
    }
    /* Checked before hashing, so an invalid item costs no pass over the data. */
    for (size_t i = 0; i < n; i++) {
        ckptio_bytes tmp = CKPTIO_BYTES_INIT;
        int rc = ckptio__holdings_encode(&h[i], 1, &tmp, why, wl);
        ckptio_bytes_free(&tmp);
        if (rc < 0) return rc;
    }
    for (size_t i = 0; i < n; i++) h[i].hash = ckptio__hash(items[i].data, items[i].nbytes);
    return 0;
}

/* Rank 0: decode every rank's holdings and plan; the plan's bytes, or the error, into planb. */
static void coordinate(const ckptio_comm *comm, const ckptio_bytes *all, const uint64_t *lens,
                       ckptio_bytes *planb)
{
    uint32_t n = (uint32_t)comm->nranks;
    ckptio__holdings **h = calloc(n, sizeof *h);
    char why[CKPTIO__MSG_LEN], sub[CKPTIO__MSG_LEN];
    int rc = 0;
    if (!h) {
        rc = -ENOMEM;
        snprintf(why, sizeof why, "out of memory planning for %u ranks", n);
        goto out;
    }
    uint64_t at = 0;
    for (uint32_t r = 0; r < n; r++) {
        rc = ckptio__holdings_decode((const uint8_t *)all->data + at, lens[r], &h[r], sub,
                                     sizeof sub);
        at += lens[r];
        if (rc < 0) {
            snprintf(why, sizeof why, "rank %u: %.900s", r, sub);
            goto out;
        }
    }
    pthread_mutex_lock(&cache_mu);
    if (cache_ctx != comm->ctx || cache_nranks != comm->nranks) {
        ckptio__plan_cache_free(&cache);
        cache_ctx = comm->ctx;
        cache_nranks = comm->nranks;
    }
    const ckptio__plan *pl = NULL;
    rc = ckptio__plan_make(&cache, (const ckptio__holdings *const *)h, n, &pl, why, sizeof why);
    if (rc == 0) rc = ckptio__plan_encode(pl, 0, NULL, planb);
    pthread_mutex_unlock(&cache_mu);
    if (rc == 0) goto done;
    if (rc == -ENOMEM && !why[0]) snprintf(why, sizeof why, "out of memory encoding the plan");
out:
    if (ckptio__plan_encode(NULL, rc, why, planb) < 0) ckptio_bytes_free(planb);
done:
    for (uint32_t r = 0; h && r < n; r++) ckptio__holdings_free(h[r]);
    free(h);
}

/* One assigned piece into the writer: a slab of rows of an item's box. */
static int write_piece(ckptio_writer *w, const ckptio_dist_item *it, const ckptio__hold *h,
                       const ckptio__assign *a, uint32_t rank, char *why, size_t wl)
{
    char lname[CKPTIO_MAX_NAME + 32];
    const char *name = it->name;
    if (h->flags & CKPTIO__HOLD_RANK_LOCAL) {
        if (!ckptio__rank_local_name(lname, sizeof lname, h->name, h->name_len, rank))
            return snprintf(why, wl, "rank-local name too long"), CKPTIO_E_LIMIT;
        name = lname;
    }
    uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    const uint8_t *data = it->data;
    uint64_t nbytes = h->nbytes;
    if (h->ndim) {
        memcpy(off, h->offset, h->ndim * 8);
        memcpy(box, h->box, h->ndim * 8);
        if (h->box[0]) {
            uint64_t row = h->nbytes / h->box[0];
            data += a->start * row;
            nbytes = a->rows * row;
        }
        off[0] += a->start;
        box[0] = a->rows;
    }
    int rc = ckptio_writer_add(w, name, it->dtype, h->ndim, h->shape, off, box, data, nbytes);
    if (rc < 0) snprintf(why, wl, "%s", ckptio_writer_errmsg(w));
    return rc;
}

/* Rank 0, once every part is in: decode, merge, publish. */
static int publish(const ckptio_comm *comm, ckptio_writer *w, const ckptio_bytes *all,
                   const uint64_t *lens, char *why, size_t wl)
{
    uint32_t n = (uint32_t)comm->nranks;
    ckptio__manifest **parts = calloc(n, sizeof *parts), *merged = NULL;
    uint8_t *buf = NULL;
    char sub[CKPTIO__MSG_LEN];
    int rc = 0;
    if (!parts) return snprintf(why, wl, "out of memory merging"), -ENOMEM;
    uint64_t at = 0, len = 0;
    for (uint32_t r = 0; r < n; r++) {
        rc = ckptio__manifest_decode_ex((const uint8_t *)all->data + at, lens[r],
                                        CKPTIO__MANIFEST_PARTIAL, &parts[r], sub, sizeof sub);
        at += lens[r];
        if (rc < 0) {
            snprintf(why, wl, "rank %u's partial manifest: %.900s", r, sub);
            goto out;
        }
    }
    rc = ckptio__manifest_merge((const ckptio__manifest *const *)parts, n, &merged, sub,
                                sizeof sub);
    if (rc < 0) {
        snprintf(why, wl, "merging the ranks' manifests (part N is rank N): %.900s", sub);
        goto out;
    }
    rc = ckptio__manifest_encoded_size(merged, &len);
    if (rc == 0 && !(buf = malloc(len))) rc = -ENOMEM;
    if (rc == 0) rc = ckptio__manifest_encode(merged, buf, len);
    if (rc < 0) {
        snprintf(why, wl, "encoding the merged manifest: %s", ckptio_strerror(rc));
        goto out;
    }
    rc = ckptio__writer_publish_manifest(w, buf, len);
    if (rc < 0) snprintf(why, wl, "%s", ckptio_writer_errmsg(w));
out:
    for (uint32_t r = 0; r < n; r++) ckptio__manifest_free(parts[r]);
    free(parts);
    ckptio__manifest_free(merged);
    free(buf);
    return rc;
}

int ckptio_save_dist(const char *path, const ckptio_comm *comm, const ckptio_dist_item *items,
                     size_t n, const char *const *meta_keys, const void *const *meta_vals,
                     const size_t *meta_lens, size_t n_meta, const ckptio_params *p,
                     double timeout, ckptio_stats *out)
{
    if (!comm || comm->nranks < 1 || comm->rank < 0 || comm->rank >= comm->nranks)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_save_dist: no usable communicator");
    if (!(timeout > 0))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_save_dist: timeout must be > 0 seconds");
    uint32_t rank = (uint32_t)comm->rank, nranks = (uint32_t)comm->nranks;
    char why[CKPTIO__MSG_LEN] = "";
    int rc = 0, local = 0;
    ckptio_bytes mine = CKPTIO_BYTES_INIT, all = CKPTIO_BYTES_INIT, planb = CKPTIO_BYTES_INIT,
                 tmpb = CKPTIO_BYTES_INIT;
    uint64_t *lens = rank == 0 ? calloc(nranks, sizeof *lens) : NULL;
    uint64_t zeros[CKPTIO_MAX_NDIM] = {0};
    ckptio__hold *holds = calloc(n + 1, sizeof *holds);
    ckptio__vec assign;
    ckptio__vec_init(&assign, sizeof(ckptio__assign));
    ckptio_writer *w = NULL;
    ckptio_bytes part = CKPTIO_BYTES_INIT;
    double t0 = ckptio__now();
    if (!holds || (rank == 0 && !lens)) {
        local = -ENOMEM;
        snprintf(why, sizeof why, "out of memory");
    }

    /* 1. Holdings to the coordinator; the plan or its error back. */
    if (local == 0) local = make_holds(items, n, holds, zeros, why, sizeof why);
    if (local == 0) local = ckptio__holdings_encode(holds, n, &mine, why, sizeof why);
    if (local < 0 && ckptio__holdings_encode_error(local, why, &mine) < 0) ckptio_bytes_free(&mine);
    CKPTIO__CHECK(ckptio_comm_gather(comm, 0, mine.data, mine.len, &all, lens, timeout));
    if (rank == 0) coordinate(comm, &all, lens, &planb);
    CKPTIO__CHECK(ckptio_comm_broadcast(comm, 0, &planb, timeout));
    {
        ckptio__holdings view = {.n = local < 0 ? 0 : n, .items = holds, .msg = ""};
        int pc = ckptio__plan_decode_rank(planb.data, planb.len, rank, &view, &assign, why,
                                          sizeof why);
        /* A failed plan is the same bytes on every rank: every rank stops here, nothing written.
         * Anything else wrong with it is this rank's own failure, told at the agreement. */
        if (pc < 0 && ckptio__plan_status(planb.data, planb.len) < 0) {
            rc = ckptio__fail(NULL, pc, "%s", why);
            goto out;
        }
        if (pc < 0 && local == 0) local = pc;
    }

    /* 2. The coordinator begins the temporary directory; the others join it. */
    if (rank == 0) {
        int bc = ckptio__writer_open_part(&w, path, NULL, 0, p);
        const char *s = bc < 0 ? ckptio_last_error() : ckptio__writer_tmp_path(w);
        size_t sl = strlen(s);
        if (ckptio_bytes_resize(&tmpb, sl + 5) < 0) {
            bc = -ENOMEM;
            s = "out of memory", sl = 13;
            (void)ckptio_bytes_resize(&tmpb, sl + 5);
        }
        if (tmpb.data) {
            int32_t code = bc;
            memcpy(tmpb.data, &code, 4);
            memcpy((char *)tmpb.data + 4, s, sl + 1);
        }
    }
    CKPTIO__CHECK(ckptio_comm_broadcast(comm, 0, &tmpb, timeout));
    if (tmpb.len < 5 || ((char *)tmpb.data)[tmpb.len - 1] != 0) {
        rc = ckptio__fail(NULL, CKPTIO_E_CORRUPT, "rank 0 sent no temporary directory");
        goto out;
    }
    {
        int32_t code;
        memcpy(&code, tmpb.data, 4);
        if (code < 0) {
            rc = ckptio__fail(NULL, code, "rank 0 of %u: %s", nranks, (char *)tmpb.data + 4);
            goto out;
        }
    }
    if (rank != 0 && local == 0) {
        local = ckptio__writer_open_part(&w, path, (char *)tmpb.data + 4, rank, p);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_last_error());
    }

    /* 3. Write this rank's pieces and describe them in a partial manifest. */
    for (size_t i = 0; i < assign.len && local == 0; i++) {
        const ckptio__assign *a = CKPTIO__VEC_AT(&assign, ckptio__assign, i);
        local = write_piece(w, &items[a->item], &holds[a->item], a, rank, why, sizeof why);
    }
    for (size_t i = 0; rank == 0 && i < n_meta && local == 0; i++) {
        local = ckptio_writer_set_meta(w, meta_keys ? meta_keys[i] : NULL,
                                       meta_vals ? meta_vals[i] : NULL,
                                       meta_lens ? meta_lens[i] : 0);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_writer_errmsg(w));
    }
    if (local == 0) {
        local = ckptio__writer_finish_part(w, &part);
        if (local < 0) snprintf(why, sizeof why, "%s", ckptio_writer_errmsg(w));
    }
    rc = ckptio_comm_agree(comm, local, why, timeout);
    if (rc == 0) rc = ckptio_comm_gather(comm, 0, part.data, part.len, &all, lens, timeout);
    ckptio_bytes_free(&part);
    if (rc < 0) goto out;

    /* 4. The coordinator merges and publishes; every rank returns its outcome. */
    local = 0;
    if (rank == 0) local = publish(comm, w, &all, lens, why, sizeof why);
    rc = ckptio_comm_agree(comm, local, why, timeout);
out:
    if (out) {
        memset(out, 0, sizeof *out);
        if (w) ckptio_writer_stats(w, out);
        out->seconds = ckptio__now() - t0;
        out->gbps = out->seconds > 0 ? (double)out->bytes / out->seconds / 1e9 : 0;
    }
    /* The coordinator's close removes the temporary directory unless it published; joined
     * writers leave it to the coordinator. */
    if (w) {
        char keep[CKPTIO__MSG_LEN];
        snprintf(keep, sizeof keep, "%s", ckptio_last_error());
        ckptio_writer_close(w);
        if (rc < 0) ckptio__fail(NULL, rc, "%s", keep);
    }
    ckptio_bytes_free(&mine);
    ckptio_bytes_free(&all);
    ckptio_bytes_free(&planb);
    ckptio_bytes_free(&tmpb);
    ckptio_bytes_free(&part);
    ckptio__vec_free(&assign);
    free(lens);
    free(holds);
    return rc;
}
