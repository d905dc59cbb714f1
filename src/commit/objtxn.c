/* SPDX-License-Identifier: Apache-2.0 */
/* The commit transaction in an object store: unique data names, the manifest written last. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../format/manifest.h"
#include "../store/s3.h"
#include "txn.h"

/* A checkpoint at s3://bucket/key is the object key/manifest plus data objects under
 * key/d-<save>/, <save> unique to each save. Nothing is renamed: the manifest's conditional
 * PUT is the commit (If-None-Match: * for a new checkpoint, If-Match on the ETag of the one it
 * replaces), so a checkpoint is visible whole or not at all, and of two racing saves exactly
 * one wins. After it, the winner deletes the replaced checkpoint's data and what interrupted
 * saves left behind; never the objects of a save that may still be running (see sweep). */

struct ckptio__objtxn {
    ckptio__s3 *s3;
    char *bucket, *key;
    char save[48];       /* "d-<id>": this save's data component */
    char etag[128];      /* the replaced manifest's ETag, "" when none */
    int64_t t0;          /* the server's clock when the save began (0: unknown) */
    char **old;          /* data components the replaced manifest names */
    size_t n_old;
    char drop[16];       /* a joined rank's file prefix whose objects abort deletes, or "" */
};

/* Largest manifest read back from a store (the format's own limits are far below). */
#define MANIFEST_MAX CKPTIO__MAX_MANIFEST_BYTES

bool ckptio__txn_is_object(const ckptio__txn *t)
{
    return t->obj != NULL;
}

/* "d-<seconds in hex>-<random>": unique among saves, sortable by the client's clock. */
static void make_save_id(char *out, size_t cap)
{
    uint64_t r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&r, sizeof r, 1, f) != 1)
        r = (uint64_t)getpid() << 32 ^ (uint64_t)ckptio__tmp_id() ^ (uint64_t)clock();
    if (f) fclose(f);
    snprintf(out, cap, "d-%llx-%016llx", (unsigned long long)time(NULL), (unsigned long long)r);
}

/* The first path component of `name` (a manifest file name, "d-.../r00000-000000.ckd"). */
static bool component(const char *name, char *out, size_t cap)
{
    const char *slash = strchr(name, '/');
    size_t n = slash ? (size_t)(slash - name) : 0;
    if (!n || n >= cap) return false;
    memcpy(out, name, n);
    out[n] = 0;
    return true;
}

/* Remember which data components the manifest being replaced names. */
static int note_old(struct ckptio__objtxn *o, const uint8_t *buf, uint64_t len)
{
    ckptio__manifest *m = NULL;
    char err[256];
    if (ckptio__manifest_decode(buf, len, &m, err, sizeof err) < 0) return 0; /* sweep's job */
    for (uint64_t i = 0; i < m->n_files; i++) {
        char c[64];
        if (!component(m->strtab + m->files[i].name, c, sizeof c)) continue;
        bool seen = false;
        for (size_t k = 0; k < o->n_old && !seen; k++) seen = !strcmp(o->old[k], c);
        if (seen) continue;
        char **n = realloc(o->old, (o->n_old + 1) * sizeof *n);
        if (!n) break;
        o->old = n;
        if (!(o->old[o->n_old] = strdup(c))) break;
        o->n_old++;
    }
    ckptio__manifest_free(m);
    return 0;
}

static int obj_init(ckptio__txn *t, const char *url, unsigned flags, ckptio__msg *msg)
{
    memset(t, 0, sizeof *t);
    t->kind = CKPTIO__TXN_DIR;
    t->flags = flags;
    t->tmp_fd = t->fd = -1;
    struct ckptio__objtxn *o = calloc(1, sizeof *o);
    if (!o) return ckptio__fail(msg, -ENOMEM, "out of memory");
    t->obj = o;
    CKPTIO__TRY(ckptio__s3_parse(url, &o->bucket, &o->key, msg));
    CKPTIO__TRY(ckptio__s3_client(&o->s3, msg));
    if (asprintf(&t->path, "s3://%s/%s", o->bucket, o->key) < 0) {
        t->path = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    return 0;
}

static char *manifest_key(const struct ckptio__objtxn *o)
{
    char *k;
    return asprintf(&k, "%s/manifest", o->key) < 0 ? NULL : k;
}

int ckptio__objtxn_begin(ckptio__txn *t, const char *url, unsigned flags, ckptio__msg *msg)
{
    CKPTIO__TRY(obj_init(t, url, flags, msg));
    struct ckptio__objtxn *o = t->obj;
    char *mk = manifest_key(o);
    if (!mk) return ckptio__fail(msg, -ENOMEM, "out of memory");
    ckptio__s3_resp r = {0};
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc = ckptio__s3_head(o->s3, o->bucket, mk, &r, msg);
    o->t0 = r.date;
    if (rc == 0 && (flags & CKPTIO__TXN_OVERWRITE)) {
        /* The ETag the commit will insist on comes with the bytes it names. */
        rc = ckptio__s3_get_all(o->s3, o->bucket, mk, MANIFEST_MAX, &buf, &len, &r, msg);
        if (rc == 0) {
            snprintf(o->etag, sizeof o->etag, "%s", r.etag);
            note_old(o, buf, len);
        }
        free(buf);
    }
    free(mk);
    if (rc == CKPTIO_E_NOT_FOUND) { /* a new checkpoint (leftovers of dead saves are no checkpoint) */
        rc = 0;
        t->found = CKPTIO__AT_NOTHING;
    } else if (rc == 0) {
        t->found = CKPTIO__AT_CHECKPOINT;
        if (!(flags & CKPTIO__TXN_OVERWRITE))
            return ckptio__fail(msg, CKPTIO_E_EXISTS,
                                "'%s' already holds a checkpoint; pass overwrite=True to replace "
                                "it, or save under another key",
                                t->path);
    }
    CKPTIO__TRY(rc);
    make_save_id(o->save, sizeof o->save);
    if (asprintf(&t->tmp_path, "%s/%s", t->path, o->save) < 0) {
        t->tmp_path = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    t->owner = true;
    return 0;
}

int ckptio__objtxn_join(ckptio__txn *t, const char *url, const char *tmp_url, unsigned flags,
                        ckptio__msg *msg)
{
    CKPTIO__TRY(obj_init(t, url, flags, msg));
    struct ckptio__objtxn *o = t->obj;
    size_t n = strlen(t->path);
    const char *save = tmp_url + n + 1;
    if (strncmp(tmp_url, t->path, n) || tmp_url[n] != '/' || strncmp(save, "d-", 2) ||
        strchr(save, '/') || strlen(save) >= sizeof o->save)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "internal error: '%s' is no save of '%s'",
                            tmp_url, t->path);
    snprintf(o->save, sizeof o->save, "%s", save);
    t->tmp_path = strdup(tmp_url);
    return t->tmp_path ? 0 : ckptio__fail(msg, -ENOMEM, "out of memory");
}

const char *ckptio__objtxn_save(const ckptio__txn *t)
{
    return t->obj->save;
}

int ckptio__objtxn_open_data(ckptio__txn *t, const char *name, uint64_t part, int *fd,
                             ckptio__msg *msg)
{
    struct ckptio__objtxn *o = t->obj;
    char *k;
    if (asprintf(&k, "%s/%s", o->key, name) < 0) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_open_write(o->s3, o->bucket, k, part, fd, msg);
    free(k);
    return rc;
}

/* ---- after the commit: sweep ---- */

typedef struct sweep_ctx {
    struct ckptio__objtxn *o;
    bool own; /* everything listed goes: the listing is this save's own component */
    size_t prefix_len;
    char **doomed;
    size_t n, cap;
} sweep_ctx;

static bool is_old(const struct ckptio__objtxn *o, const char *c)
{
    for (size_t k = 0; k < o->n_old; k++)
        if (!strcmp(o->old[k], c)) return true;
    return false;
}

/* Whether the data component `c`, last touched at `when` on the server's clock, may go: the
 * replaced checkpoint's data always; another save's only when it began before this one did,
 * so that it can no longer commit (the manifest it would replace is gone) — a save begun after
 * this one may still be writing, and may still win the next commit. One second of slack for
 * the clocks' whole-second resolution. */
static bool doomed(const struct ckptio__objtxn *o, const char *c, int64_t when)
{
    if (!strcmp(c, o->save) || strncmp(c, "d-", 2)) return false;
    return is_old(o, c) || (o->t0 && when && when < o->t0 - 1);
}

static int push(sweep_ctx *s, const char *key, const char *extra)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **d = realloc(s->doomed, cap * sizeof *d);
        if (!d) return -ENOMEM;
        s->doomed = d;
        s->cap = cap;
    }
    char *v;
    if (asprintf(&v, "%s%s%s", key, extra ? "\n" : "", extra ? extra : "") < 0) return -ENOMEM;
    s->doomed[s->n++] = v;
    return 0;
}

static int on_object(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    sweep_ctx *s = ctx;
    char c[64];
    if (s->own || (component(key + s->prefix_len, c, sizeof c) && doomed(s->o, c, mtime)))
        return push(s, key, NULL);
    return 0;
}

static int on_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    sweep_ctx *s = ctx;
    char c[64];
    if (s->own || (component(key + s->prefix_len, c, sizeof c) && doomed(s->o, c, initiated)))
        return push(s, key, upload_id);
    return 0;
}

static void free_doomed(sweep_ctx *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->doomed[i]);
    free(s->doomed);
    s->doomed = NULL;
    s->n = s->cap = 0;
}

/* Delete the objects and abort the uploads that `doomed` allows under key/, or (own) every
 * one of this save's whose name starts with `sub` ("": all). Best effort: a failure leaves
 * objects no manifest names, for the next save to find. */
static void sweep(struct ckptio__objtxn *o, bool own, const char *sub)
{
    ckptio__msg m = {0};
    char *prefix;
    int n = own ? asprintf(&prefix, "%s/%s/%s", o->key, o->save, sub)
                : asprintf(&prefix, "%s/", o->key);
    if (n < 0) return;
    sweep_ctx s = {.o = o, .own = own, .prefix_len = strlen(o->key) + 1};
    ckptio__s3_list(o->s3, o->bucket, prefix, on_object, &s, &m);
    ckptio__s3_list_uploads(o->s3, o->bucket, prefix, on_upload, &s, &m);
    for (size_t i = 0; i < s.n; i++) {
        char *nl = strchr(s.doomed[i], '\n');
        if (nl) {
            *nl = 0;
            ckptio__s3_mpu_abort(o->s3, o->bucket, s.doomed[i], nl + 1, &m);
        } else {
            ckptio__s3_delete(o->s3, o->bucket, s.doomed[i], &m);
        }
    }
    free_doomed(&s);
    free(prefix);
}

/* ---- publish, abort ---- */

int ckptio__objtxn_publish(ckptio__txn *t, const uint8_t *man, uint64_t len, ckptio__msg *msg)
{
    struct ckptio__objtxn *o = t->obj;
    if (!t->owner || t->published)
        return ckptio__fail(msg, CKPTIO_E_STATE,
                            "internal error: '%s' cannot be published by this transaction", t->path);
    char *mk = manifest_key(o);
    if (!mk) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__s3_put(o->s3, o->bucket, mk, man, len, o->etag[0] ? o->etag : "*", NULL, msg);
    free(mk);
    if (rc == CKPTIO_E_EXISTS)
        return ckptio__fail(msg, CKPTIO_E_EXISTS,
                            "'%s' was committed by another save while this one ran (a racing "
                            "writer); this save was not published and its data is being removed",
                            t->path);
    CKPTIO__TRY(rc);
    t->published = true;
    sweep(o, false, ""); /* the replaced checkpoint's data, and what dead saves left */
    return 0;
}

void ckptio__objtxn_abort(ckptio__txn *t)
{
    struct ckptio__objtxn *o = t->obj;
    if (!t->owner && o->drop[0]) {
        sweep(o, true, o->drop);
        o->drop[0] = 0;
    }
    if (!t->owner || t->published) return;
    sweep(o, true, "");
    t->owner = false;
}

void ckptio__objtxn_drop(ckptio__txn *t, const char *prefix)
{
    if (t->obj && !t->owner && prefix && *prefix)
        snprintf(t->obj->drop, sizeof t->obj->drop, "%s", prefix);
}

void ckptio__objtxn_fini(ckptio__txn *t)
{
    struct ckptio__objtxn *o = t->obj;
    free(o->bucket);
    free(o->key);
    for (size_t k = 0; k < o->n_old; k++) free(o->old[k]);
    free(o->old);
    free(o);
    t->obj = NULL;
}
