/* SPDX-License-Identifier: Apache-2.0 */
/* The zip writer: torch.save's archive layout written at device speed, CRCs computed alongside. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/crc32.h"
#include "../common/workers.h"
#include "file_writer.h"

/* The layout is the one PyTorch's archive writer produces, so that every reader of torch.save
 * files reads ours: stored (uncompressed) records, each a local header whose CRC and sizes are
 * zero and flagged as coming later (general purpose bit 3, with bit 11: UTF-8 names), its data
 * at a multiple of the record's alignment (the gap filled by an extra field "FB" of 'Z's), then
 * a data descriptor with the CRC and sizes; the central directory; a zip64 end record and its
 * locator; the end record. A record of 4 GiB or more has a zip64 extra field with its sizes in
 * the local header and a descriptor with 8-byte sizes; the central directory gives sizes and
 * offsets past 32 bits in zip64 extra fields. Since the CRC follows the data, it is computed
 * while the data is written: a record's data is cut into pieces that CRC threads take while the
 * caller's thread hands the same bytes to the file writer. */

#define SIG_LOCAL 0x04034b50u
#define SIG_DESC 0x08074b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define SIG_END 0x06054b50u
#define FLAGS 0x0808u /* sizes and CRC in a descriptor; UTF-8 names */
#define LOCAL_LEN 30u
#define CENTRAL_LEN 46u
#define U32_MAX_FIELD 0xffffffffu
#define MAX_ALIGN (32u << 10) /* the padding is one extra field: under 64 KiB */
#define MAX_NAME 0xffffu
#define PIECE (8u << 20) /* bytes of one CRC task */
#define MAX_CRC_THREADS 4u

typedef struct zip_entry {
    char *name;
    uint64_t off; /* of the local header */
    uint64_t len;
    uint32_t crc;
} zip_entry;

/* One record's CRC in flight: pieces claimed and finished under the lock. */
typedef struct crc_job {
    const uint8_t *base;
    uint64_t len;
    size_t pieces, next, done;
    uint32_t *crcs;
} crc_job;

struct ckptio_zip_writer {
    ckptio_file_writer fw; /* first: msg, state, file */
    zip_entry *ents; /* n written; ents[n] is the open record's */
    size_t n, cap;
    int pid; /* the process whose CRC threads these are */
    bool open, crc; /* a record is open; its CRC is computed */
    uint64_t got;   /* bytes of the open record written */
    uint8_t *hdr; /* a local header or central entry being built */
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    crc_job job;
    bool stop;
    unsigned threads;
    pthread_t tid[MAX_CRC_THREADS];
};

static uint8_t *le16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    return p + 2;
}

static uint8_t *le32(uint8_t *p, uint32_t v)
{
    return le16(le16(p, v & 0xffffu), v >> 16);
}

static uint8_t *le64(uint8_t *p, uint64_t v)
{
    return le32(le32(p, (uint32_t)v), (uint32_t)(v >> 32));
}

static void *crc_thread(void *arg)
{
    ckptio_zip_writer *z = arg;
    pthread_mutex_lock(&z->mu);
    for (;;) {
        while (!z->stop && z->job.next >= z->job.pieces)
            pthread_cond_wait(&z->work, &z->mu);
        if (z->stop) break;
        size_t i = z->job.next++;
        uint64_t at = (uint64_t)i * PIECE;
        const uint8_t *p = z->job.base + at;
        size_t n = (size_t)CKPTIO__MIN((uint64_t)PIECE, z->job.len - at);
        pthread_mutex_unlock(&z->mu);
        uint32_t c = ckptio__crc32(0, p, n);
        pthread_mutex_lock(&z->mu);
        z->job.crcs[i] = c;
        if (++z->job.done == z->job.pieces) pthread_cond_signal(&z->finished);
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* A quarter of the CPUs, 1 to 4: one keeps ahead of 15 GB/s; the caller's thread copies. */
static void crc_threads_start(ckptio_zip_writer *z)
{
    unsigned want = CKPTIO__MAX(ckptio__workers_default(4 * MAX_CRC_THREADS) / 4, 1u);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (z->threads < want && pthread_create(&z->tid[z->threads], NULL, crc_thread, z) == 0)
        z->threads++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Post the CRC of `len` bytes at `base` to the threads (0: none to run it, compute inline). */
static int crc_post(ckptio_zip_writer *z, const void *base, uint64_t len)
{
    if (len < 2ull * PIECE) return 0;
    if (!z->threads) crc_threads_start(z);
    if (!z->threads) return 0;
    size_t pieces = (size_t)((len + PIECE - 1) / PIECE);
    uint32_t *crcs = malloc(pieces * sizeof *crcs);
    if (!crcs) return 0;
    pthread_mutex_lock(&z->mu);
    z->job = (crc_job){.base = base, .len = len, .pieces = pieces, .crcs = crcs};
    pthread_cond_broadcast(&z->work);
    pthread_mutex_unlock(&z->mu);
    return 1;
}

/* Wait for the posted CRC; after this no thread reads the record's data. */
static uint32_t crc_collect(ckptio_zip_writer *z)
{
    pthread_mutex_lock(&z->mu);
    while (z->job.done < z->job.pieces)
        pthread_cond_wait(&z->finished, &z->mu);
    crc_job j = z->job;
    z->job = (crc_job){0};
    pthread_mutex_unlock(&z->mu);
    uint32_t crc = 0;
    for (size_t i = 0; i < j.pieces; i++) {
        uint64_t n = CKPTIO__MIN((uint64_t)PIECE, j.len - (uint64_t)i * PIECE);
        crc = ckptio__crc32_combine(crc, j.crcs[i], n);
    }
    free(j.crcs);
    return crc;
}

int ckptio_zip_writer_open(ckptio_zip_writer **out, const char *path, const ckptio_params *p)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_zip_writer_open: out and path are required");
    }
    *out = NULL;
    ckptio_zip_writer *z = calloc(1, sizeof *z);
    if (z) z->pid = (int)getpid();
    uint8_t *hdr = malloc(LOCAL_LEN + MAX_NAME + 20 + MAX_ALIGN + 4);
    if (!z || !hdr) {
        free(z);
        free(hdr);
        return ckptio__fail(NULL, -ENOMEM, "out of memory");
    }
    z->hdr = hdr;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->work, NULL);
    pthread_cond_init(&z->finished, NULL);
    int rc = ckptio__file_writer_init(&z->fw, path, p);
    if (rc < 0) {
        ckptio__msg keep = z->fw.msg;
        ckptio_zip_writer_close(z);
        return ckptio__refail(NULL, &keep, rc, "cannot open zip writer", NULL);
    }
    *out = z;
    return 0;
}

/* The local header of a record of `len` bytes named `name` at the current end, padded so that
 * its data starts at a multiple of `align`; returns its length. */
static size_t local_header(ckptio_zip_writer *z, const char *name, size_t name_len, uint64_t len,
                           uint32_t align)
{
    bool z64 = len >= U32_MAX_FIELD;
    uint64_t at = ckptio_file_writer_tell(&z->fw);
    size_t extra = z64 ? 20 : 0;
    uint64_t data = at + LOCAL_LEN + name_len + extra;
    size_t pad = (size_t)((align - data % align) % align);
    if (pad && pad < 4) pad += align; /* room for the field's own 4 bytes */
    uint8_t *p = le32(z->hdr, SIG_LOCAL);
    p = le16(p, 0);     /* version needed, as torch.save writes it */
    p = le16(p, FLAGS);
    p = le16(p, 0);     /* stored */
    p = le32(p, 0);     /* time and date */
    p = le32(p, 0);     /* CRC: in the descriptor */
    p = le32(p, 0);     /* sizes: in the descriptor */
    p = le32(p, 0);
    p = le16(p, (uint32_t)name_len);
    p = le16(p, (uint32_t)(extra + pad));
    memcpy(p, name, name_len);
    p += name_len;
    if (z64) {
        p = le16(le16(p, 0x0001), 16);
        p = le64(le64(p, len), len);
    }
    if (pad) {
        p = le16(le16(p, 0x4246 /* "FB" */), (uint32_t)(pad - 4));
        memset(p, 'Z', pad - 4);
        p += pad - 4;
    }
    return (size_t)(p - z->hdr);
}

static int fail_record(ckptio_zip_writer *z, int rc, const char *name)
{
    if (rc >= 0) return rc;
    char keep[CKPTIO__MSG_LEN];
    snprintf(keep, sizeof keep, "%s", z->fw.msg.text);
    ckptio__fail_at(&z->fw.msg, rc, name, NULL, z->fw.txn.path, ckptio_file_writer_tell(&z->fw),
                    "zip archive '%s', record '%s': %s", z->fw.txn.path, name,
                    keep[0] ? keep : strerror(rc < 0 && rc > -4096 ? -rc : EIO));
    return ckptio__handle_poison(&z->fw.hs, rc);
}

/* The record being written: its entry is added to the directory once its bytes are all in. */
static int record_end(ckptio_zip_writer *z)
{
    zip_entry *e = &z->ents[z->n];
    uint8_t *p = le32(le32(z->hdr, SIG_DESC), e->crc);
    p = e->len >= U32_MAX_FIELD ? le64(le64(p, e->len), e->len)
                                : le32(le32(p, (uint32_t)e->len), (uint32_t)e->len);
    int rc = ckptio_file_writer_write(&z->fw, z->hdr, (size_t)(p - z->hdr));
    if (rc < 0) return fail_record(z, rc, e->name);
    z->n++;
    z->open = false;
    return 0;
}

int ckptio_zip_writer_begin(ckptio_zip_writer *z, const char *name, uint64_t len, uint32_t align,
                            unsigned flags)
{
    if (!z) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_zip_writer_begin: writer is NULL");
    CKPTIO__TRY(ckptio__handle_usable(&z->fw.hs, &z->fw.msg, z->fw.txn.path));
    size_t name_len = name ? strlen(name) : 0;
    if (!name_len || name_len > MAX_NAME)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_USAGE,
                            "ckptio_zip_writer_begin: a record name of 1 to 65535 bytes is "
                            "required (got %zu) in '%s'", name_len, z->fw.txn.path);
    if (z->open)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_STATE,
                            "ckptio_zip_writer_begin: record '%s' of '%s' still has %llu of its "
                            "bytes to come", z->ents[z->n].name, z->fw.txn.path,
                            (unsigned long long)(z->ents[z->n].len - z->got));
    if (align == 0) align = 1;
    if (align > MAX_ALIGN || (align & (align - 1)))
        return ckptio__fail(&z->fw.msg, CKPTIO_E_USAGE,
                            "ckptio_zip_writer_begin: alignment %u of record '%s' is not a power "
                            "of two up to %u", align, name, MAX_ALIGN);
    if (z->n == z->cap) {
        size_t cap = z->cap ? 2 * z->cap : 16;
        zip_entry *e = realloc(z->ents, cap * sizeof *e);
        if (!e) return fail_record(z, -ENOMEM, name);
        z->ents = e;
        z->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return fail_record(z, -ENOMEM, name);
    z->ents[z->n] = (zip_entry){.name = copy, .off = ckptio_file_writer_tell(&z->fw), .len = len};
    z->open = true; /* the entry is freed with the writer from here on, even on failure */
    z->got = 0;
    z->crc = !(flags & CKPTIO_ZIP_NO_CRC);
    size_t h = local_header(z, name, name_len, len, align);
    int rc = ckptio_file_writer_write(&z->fw, z->hdr, h);
    if (rc < 0) return fail_record(z, rc, name);
    return len ? 0 : record_end(z);
}

int ckptio_zip_writer_append(ckptio_zip_writer *z, const void *data, size_t n)
{
    if (!z) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_zip_writer_append: writer is NULL");
    CKPTIO__TRY(ckptio__handle_usable(&z->fw.hs, &z->fw.msg, z->fw.txn.path));
    if (!z->open)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_STATE,
                            "ckptio_zip_writer_append: %zu bytes given where no record is open "
                            "in '%s' (begin one first)", n, z->fw.txn.path);
    zip_entry *e = &z->ents[z->n];
    if (n > e->len - z->got)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_STATE,
                            "ckptio_zip_writer_append: %zu bytes given where record '%s' of '%s' "
                            "expects %llu", n, e->name, z->fw.txn.path,
                            (unsigned long long)(e->len - z->got));
    if (n && !data)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_USAGE, "ckptio_zip_writer_append: data is NULL");
    int posted = z->crc && crc_post(z, data, n);
    int rc = ckptio_file_writer_write(&z->fw, data, n);
    uint32_t c = 0;
    if (posted)
        c = crc_collect(z); /* also after a failure: no thread may read data past here */
    else if (z->crc && rc == 0)
        c = ckptio__crc32(0, data, n);
    if (rc < 0) return fail_record(z, rc, e->name);
    e->crc = ckptio__crc32_combine(e->crc, c, n);
    z->got += n;
    return z->got == e->len ? record_end(z) : 0;
}

int ckptio_zip_writer_add(ckptio_zip_writer *z, const char *name, const void *data, uint64_t len,
                          uint32_t align, unsigned flags)
{
    if (len && !data)
        return ckptio__fail(z ? &z->fw.msg : NULL, CKPTIO_E_USAGE,
                            "ckptio_zip_writer_add: record '%s' has no data", name ? name : "");
    CKPTIO__TRY(ckptio_zip_writer_begin(z, name, len, align, flags));
    return len ? ckptio_zip_writer_append(z, data, (size_t)len) : 0;
}

/* The central directory entry of `e`; returns its length. */
static size_t central_entry(uint8_t *buf, const zip_entry *e)
{
    size_t name_len = strlen(e->name);
    bool big = e->len >= U32_MAX_FIELD, far = e->off >= U32_MAX_FIELD;
    size_t extra = (big ? 16u : 0u) + (far ? 8u : 0u);
    uint8_t *p = le32(buf, SIG_CENTRAL);
    p = le16(p, 0); /* made by, needed: as torch.save writes them */
    p = le16(p, 0);
    p = le16(p, FLAGS);
    p = le16(p, 0);
    p = le32(p, 0);
    p = le32(p, e->crc);
    p = le32(p, big ? U32_MAX_FIELD : (uint32_t)e->len);
    p = le32(p, big ? U32_MAX_FIELD : (uint32_t)e->len);
    p = le16(p, (uint32_t)name_len);
    p = le16(p, (uint32_t)(extra ? extra + 4 : 0));
    p = le16(p, 0); /* comment */
    p = le16(p, 0); /* disk */
    p = le16(p, 0); /* internal attributes */
    p = le32(p, 0); /* external attributes */
    p = le32(p, far ? U32_MAX_FIELD : (uint32_t)e->off);
    memcpy(p, e->name, name_len);
    p += name_len;
    if (extra) {
        p = le16(le16(p, 0x0001), (uint32_t)extra);
        if (big) p = le64(le64(p, e->len), e->len);
        if (far) p = le64(p, e->off);
    }
    return (size_t)(p - buf);
}

int ckptio_zip_writer_commit(ckptio_zip_writer *z)
{
    if (!z) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_zip_writer_commit: writer is NULL");
    CKPTIO__TRY(ckptio__handle_usable(&z->fw.hs, &z->fw.msg, z->fw.txn.path));
    if (z->open)
        return ckptio__fail(&z->fw.msg, CKPTIO_E_STATE,
                            "ckptio_zip_writer_commit: record '%s' of '%s' still has %llu of its "
                            "bytes to come", z->ents[z->n].name, z->fw.txn.path,
                            (unsigned long long)(z->ents[z->n].len - z->got));
    int rc = 0;
    uint64_t cd = ckptio_file_writer_tell(&z->fw);
    for (size_t i = 0; i < z->n && rc == 0; i++)
        rc = ckptio_file_writer_write(&z->fw, z->hdr, central_entry(z->hdr, &z->ents[i]));
    if (rc < 0) return fail_record(z, rc, "(central directory)");
    uint64_t end64 = ckptio_file_writer_tell(&z->fw), cd_len = end64 - cd;
    uint8_t *p = le32(z->hdr, SIG_END64);
    p = le64(p, 44);                /* the record's size after this field */
    p = le16(p, 0x031e);            /* made by: Unix, 4.6 */
    p = le16(p, 45);                /* needed: zip64 */
    p = le32(le32(p, 0), 0);        /* this disk, the directory's disk */
    p = le64(le64(p, z->n), z->n);  /* entries on this disk, in all */
    p = le64(le64(p, cd_len), cd);
    p = le32(le32(p, SIG_LOC64), 0);
    p = le64(p, end64);
    p = le32(p, 1); /* disks */
    uint32_t n16 = z->n >= 0xffff ? 0xffffu : (uint32_t)z->n;
    p = le32(le32(p, SIG_END), 0);
    p = le16(le16(p, n16), n16);
    p = le32(p, cd_len >= U32_MAX_FIELD ? U32_MAX_FIELD : (uint32_t)cd_len);
    p = le32(p, cd >= U32_MAX_FIELD ? U32_MAX_FIELD : (uint32_t)cd);
    p = le16(p, 0);
    rc = ckptio_file_writer_write(&z->fw, z->hdr, (size_t)(p - z->hdr));
    if (rc < 0) return fail_record(z, rc, "(end of central directory)");
    return ckptio_file_writer_commit(&z->fw);
}

void ckptio_zip_writer_close(ckptio_zip_writer *z)
{
    if (!z) return;
    if (!ckptio__forked(z->pid)) { /* a forked child has none of the CRC threads */
        pthread_mutex_lock(&z->mu);
        z->stop = true;
        pthread_cond_broadcast(&z->work);
        pthread_mutex_unlock(&z->mu);
        for (unsigned i = 0; i < z->threads; i++)
            pthread_join(z->tid[i], NULL);
    }
    pthread_cond_destroy(&z->work);
    pthread_cond_destroy(&z->finished);
    pthread_mutex_destroy(&z->mu);
    ckptio__file_writer_fini(&z->fw);
    for (size_t i = 0; i < z->n + z->open; i++)
        free(z->ents[i].name);
    free(z->ents);
    free(z->hdr);
    free(z);
}

uint64_t ckptio_zip_writer_tell(const ckptio_zip_writer *z)
{
    return z ? ckptio_file_writer_tell(&z->fw) : 0;
}

int ckptio_zip_writer_stats(const ckptio_zip_writer *z, ckptio_stats *out)
{
    if (!z) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_zip_writer_stats: NULL argument");
    return ckptio_file_writer_stats(&z->fw, out);
}

const char *ckptio_zip_writer_errmsg(const ckptio_zip_writer *z)
{
    return z ? z->fw.msg.text : "";
}
