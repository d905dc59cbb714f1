/* SPDX-License-Identifier: Apache-2.0 */
/* A snapshot written as a zip archive (torch.save's layout) on a thread of ckptio's. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "writer.h"

/* The first version of ckptio_zip_record; later fields would read as zero. */
#define RECORD_V1 (offsetof(ckptio_zip_record, reserved) + sizeof(uint32_t))

/* A record as the job keeps it: its name and given bytes copied, or an item's index. */
typedef struct zip_rec {
    char *name;
    void *bytes; /* owned; NULL: the snapshot's item `item` */
    uint64_t len;
    size_t item;
    uint32_t align;
    unsigned flags;
} zip_rec;

typedef struct zip_job {
    ckptio_snapshot *s;
    ckptio_zip_writer *z;
    zip_rec *recs;
    size_t n;
} zip_job;

static int zip_run(void *ctx, ckptio_stats *st, ckptio__msg *msg)
{
    zip_job *j = ctx;
    const ckptio_dist_item *items;
    size_t n_items;
    (void)ckptio_snapshot_items(j->s, &items, &n_items);
    int rc = 0;
    for (size_t i = 0; i < j->n && rc == 0; i++) {
        const zip_rec *r = &j->recs[i];
        const void *data = r->bytes ? r->bytes : items[r->item].data;
        uint64_t len = r->bytes ? r->len : items[r->item].nbytes;
        rc = ckptio_zip_writer_add(j->z, r->name, data, len, r->align, r->flags);
    }
    if (rc == 0) rc = ckptio_zip_writer_commit(j->z);
    if (rc < 0) ckptio__msg_last(msg); /* the text and its values */
    (void)ckptio_zip_writer_stats(j->z, st);
    ckptio__snapshot_give_back(j->s);
    return rc;
}

static void zip_drop(void *ctx, bool forked)
{
    zip_job *j = ctx;
    if (!j) return;
    ckptio_snapshot_free(j->s);
    if (!forked) ckptio_zip_writer_close(j->z); /* in a child its threads are the parent's */
    for (size_t i = 0; i < j->n; i++) {
        free(j->recs[i].name);
        free(j->recs[i].bytes);
    }
    free(j->recs);
    free(j);
}

/* Check record i against the snapshot's n_items items and copy it into r. */
static int read_record(const ckptio_zip_record *e, size_t i, size_t n_items, zip_rec *r)
{
    if (!e->name || !e->name[0])
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_zip_async: record %zu has no name", i);
    if (!e->data && e->item >= n_items)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_zip_async: record %zu ('%.200s') reads item %llu "
                            "of a snapshot of %zu items",
                            i, e->name, (unsigned long long)e->item, n_items);
    if (e->data && e->len > SIZE_MAX)
        return ckptio__fail(NULL, CKPTIO_E_LIMIT,
                            "ckptio_snapshot_zip_async: record %zu ('%.200s') gives %llu bytes",
                            i, e->name, (unsigned long long)e->len);
    r->name = strdup(e->name);
    if (!r->name) return -ENOMEM;
    r->flags = e->flags;
    r->align = e->align;
    if (!e->data) {
        r->item = (size_t)e->item;
        return 0;
    }
    r->len = e->len;
    r->bytes = malloc(e->len ? (size_t)e->len : 1);
    if (!r->bytes) return -ENOMEM;
    if (e->len) memcpy(r->bytes, e->data, (size_t)e->len);
    return 0;
}

int ckptio_snapshot_zip_async(ckptio_snapshot *s, ckptio_zip_writer *z,
                              const ckptio_zip_record *records, size_t n,
                              ckptio_completion **out)
{
    if (out) *out = NULL;
    if (!s || !z || !out || (n && !records))
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_zip_async: the snapshot, zip writer and `out` must "
                            "not be NULL, nor the records when n > 0");
    ckptio_take_stats ts = {.size = sizeof ts};
    (void)ckptio_snapshot_stats(s, &ts);
    if (ts.written_bytes || ts.split)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_zip_async: the snapshot wrote %llu bytes through a "
                            "writer during its take; a zip archive reads whole items: take it "
                            "without a writer",
                            (unsigned long long)ts.written_bytes);
    const size_t stride = n ? records->size : 0;
    if (n && stride < RECORD_V1)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_snapshot_zip_async: record size %zu; set every size to "
                            "sizeof(ckptio_zip_record)", stride);
    const ckptio_dist_item *items;
    size_t n_items;
    (void)ckptio_snapshot_items(s, &items, &n_items);
    zip_job *j = calloc(1, sizeof *j);
    int rc = -ENOMEM;
    if (!j || !(j->recs = calloc(n ? n : 1, sizeof *j->recs))) goto fail;
    for (; j->n < n; j->n++) {
        const ckptio_zip_record *e = (const void *)((const uint8_t *)records + j->n * stride);
        if (e->size != stride) {
            rc = ckptio__fail(NULL, CKPTIO_E_USAGE,
                              "ckptio_snapshot_zip_async: record %zu has size %u (record 0: "
                              "%zu); set every size to sizeof(ckptio_zip_record)",
                              j->n, e->size, stride);
            goto fail;
        }
        rc = read_record(e, j->n, n_items, &j->recs[j->n]);
        if (rc < 0) {
            j->n++; /* its name may be held */
            goto fail;
        }
    }
    j->z = z;
    ckptio__job job = {zip_run, zip_drop, j, ckptio__snapshot_pool(s)};
    j->s = s; /* set only now: a failure before leaves s and z the caller's */
    rc = ckptio__completion_start(&job, out, "ckptio_snapshot_zip_async");
    if (rc == 0) return 0;
fail:
    if (j) j->s = NULL;
    zip_drop(j, true); /* "forked": z is left alone, still the caller's; the copies go */
    if (rc == -ENOMEM) return ckptio__fail(NULL, rc, "ckptio_snapshot_zip_async: out of memory");
    return rc;
}
