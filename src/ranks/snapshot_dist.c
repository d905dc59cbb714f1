/* SPDX-License-Identifier: Apache-2.0 */
/* A snapshot saved by all ranks in the background: ckptio_save_dist on a thread of the pool's. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../write/pool.h"
#include "../write/writer.h"

typedef struct dist_job {
    ckptio_snapshot *s;
    char *path;
    const ckptio_comm *comm;
    char **keys;
    void **vals;
    size_t *lens, n_meta;
    ckptio_params p;
    char *base; /* p.base, owned: the caller's string may be gone when the job runs */
    bool has_p;
    double timeout;
} dist_job;

static int dist_run(void *ctx, ckptio_stats *st, ckptio__msg *msg)
{
    dist_job *j = ctx;
    const ckptio_dist_item *items;
    size_t n;
    (void)ckptio_snapshot_items(j->s, &items, &n);
    int rc = ckptio_save_dist(j->path, j->comm, items, n,
                              (const char *const *)j->keys, (const void *const *)j->vals,
                              j->lens, j->n_meta, j->has_p ? &j->p : NULL, j->timeout, st);
    if (rc < 0) ckptio__msg_last(msg); /* the text and its values */
    ckptio__snapshot_give_back(j->s);
    return rc;
}

static void dist_drop(void *ctx, bool forked)
{
    (void)forked; /* save_dist owns nothing that outlives its call */
    dist_job *j = ctx;
    if (!j) return;
    ckptio_snapshot_free(j->s);
    for (size_t i = 0; i < j->n_meta; i++) {
        if (j->keys) free(j->keys[i]);
        if (j->vals) free(j->vals[i]);
    }
    free(j->keys);
    free(j->vals);
    free(j->lens);
    free(j->path);
    free(j->base);
    free(j);
}

int ckptio_snapshot_save_dist_async(ckptio_snapshot *s, const char *path, const ckptio_comm *comm,
                                    const char *const *meta_keys, const void *const *meta_vals,
                                    const size_t *meta_lens, size_t n_meta,
                                    const ckptio_params *p, double timeout,
                                    ckptio_completion **out)
{
    if (out) *out = NULL;
    if (!s || !path || !comm || !out || (n_meta && (!meta_keys || !meta_vals || !meta_lens)))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_save_dist_async: the snapshot, path, communicator "
                            "and `out` must not be NULL, nor the metadata arrays when "
                            "n_meta > 0");
    if (!(timeout > 0))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_save_dist_async: timeout must be > 0 seconds");
    dist_job *j = calloc(1, sizeof *j);
    int rc = -ENOMEM;
    if (!j) goto fail;
    j->comm = comm;
    j->timeout = timeout;
    if (p) {
        j->p = *p;
        j->has_p = true;
        /* Only fields the caller's struct holds: p->size may predate `base`. */
        if (p->size >= offsetof(ckptio_params, base) + sizeof p->base && p->base) {
            if (!(j->base = strdup(p->base))) goto fail;
            j->p.base = j->base;
        } else {
            j->p.base = NULL;
        }
    }
    j->path = strdup(path);
    j->keys = calloc(n_meta + 1, sizeof *j->keys);
    j->vals = calloc(n_meta + 1, sizeof *j->vals);
    j->lens = calloc(n_meta + 1, sizeof *j->lens);
    if (!j->path || !j->keys || !j->vals || !j->lens) goto fail;
    for (; j->n_meta < n_meta; j->n_meta++) {
        size_t i = j->n_meta;
        j->keys[i] = meta_keys[i] ? strdup(meta_keys[i]) : NULL;
        j->vals[i] = malloc(meta_lens[i] ? meta_lens[i] : 1);
        if (!j->keys[i] || !j->vals[i]) {
            j->n_meta++;
            goto fail;
        }
        if (meta_lens[i]) memcpy(j->vals[i], meta_vals[i], meta_lens[i]);
        j->lens[i] = meta_lens[i];
    }
    j->s = NULL; /* set only once started, so that a failure leaves s the caller's */
    ckptio__job job = {dist_run, dist_drop, j, ckptio__snapshot_pool(s)};
    j->s = s;
    rc = ckptio__completion_start(&job, out, "ckptio_snapshot_save_dist_async");
    if (rc == 0) return 0;
    j->s = NULL;
    dist_drop(j, false);
    return rc;
fail:
    if (j) j->s = NULL;
    dist_drop(j, false);
    return ckptio__fail(NULL, rc, "ckptio_snapshot_save_dist_async: out of memory");
}
