/* SPDX-License-Identifier: Apache-2.0 */
/* The object stores (S3, GCS): their catalog, and their saves (data under a name unique to each
 * save, the manifest last), over any object client (objc.h). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../format/manifest.h"
#include "../io/vfd.h"
#include "gcs.h"
#include "s3.h"
#include "store.h"

const ckptio__objc_ops *ckptio__objc_for(const char *url)
{
    static const ckptio__objc_ops *const kinds[] = {&ckptio__s3_objc, &ckptio__gcs_objc};
    for (size_t i = 0; url && i < sizeof kinds / sizeof *kinds; i++)
        if (!strncmp(url, kinds[i]->scheme, strlen(kinds[i]->scheme))) return kinds[i];
    return NULL;
}

int ckptio__obj_parse(const ckptio__objc_ops *ops, const char *url, char **bucket, char **key,
                      ckptio__msg *msg)
{
    *bucket = *key = NULL;
    if (!ops || !url || strncmp(url, ops->scheme, strlen(ops->scheme)))
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' is not an object store's URL",
                            url ? url : "(null)");
    const char *s = ops->scheme, *b = url + strlen(s), *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    if (bl < 1 || bl > 255)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' names no bucket: write %sbucket/key", url,
                            s);
    for (size_t i = 0; i < bl; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_'))
            return ckptio__fail(msg, CKPTIO_E_USAGE,
                                "'%s': bucket names hold letters, digits, '-', '.' and '_' only",
                                url);
    }
    const char *k = slash ? slash + 1 : "";
    size_t kl = strlen(k);
    while (kl && k[kl - 1] == '/') kl--;
    if (!kl)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' names no key: write %sbucket/key", url, s);
    for (size_t i = 0; i < kl; i++)
        if (k[i] == '/' && (i == 0 || k[i - 1] == '/'))
            return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' has an empty path component", url);
    *bucket = strndup(b, bl);
    *key = strndup(k, kl);
    if (!*bucket || !*key) {
        free(*bucket);
        free(*key);
        *bucket = *key = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory parsing '%s'", url);
    }
    return 0;
}

/* A checkpoint at <scheme>bucket/key ("s3://b/k", "gs://b/k") is the object key/manifest plus data
 * objects under key/d-<save>/, <save> unique to each save (or spread: below). Nothing is renamed: the manifest's conditional
 * PUT is the commit (If-None-Match: * for a new checkpoint, If-Match on the ETag of the one it
 * replaces), so a checkpoint is visible whole or not at all, and of two racing saves exactly
 * one wins. After it, the winner deletes the replaced checkpoint's data and what interrupted
 * saves left behind; never the objects of a save that may still be running (see sweep). */

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

/* Prefix spreading. A store partitions its key space by prefix and serves so many requests per
 * second per partition (S3: 3,500 PUT and 5,500 GET), splitting busy ones over time. The objects
 * of successive checkpoints run/step-100/, run/step-200/, ... each land past the last, in the
 * one partition at the end of the range, however often earlier saves made it split. A save
 * with the setting prefix_spread = n (1 or 2) therefore puts each data object of the checkpoint
 * at key P/B not under P/B/ but under P/.ckptio-<h>/B/, h being n hex digits of the hash of the
 * object's file name: 16 or 256 ranges that every later save of P reuses, each its own
 * partition once split. Its data component says so ("d-<clock>-<random>-x<n>"), and the
 * manifest names the component, so readers find the objects with no setting. The save's
 * marker P/B/<component>/spread, written when it begins, is how sweeps find what a killed
 * spread save left under the spread prefixes. */
#define SPREAD_DIR ".ckptio-"

/* n of a spread data component "d-...-x<n>" (the random part before it is hex: no plain
 * component ends so), else 0. */
static unsigned spread_of(const char *comp)
{
    size_t l = strlen(comp);
    if (l < 6 || strncmp(comp, "d-", 2) || comp[l - 3] != '-' || comp[l - 2] != 'x') return 0;
    return comp[l - 1] == '1' ? 1 : comp[l - 1] == '2' ? 2 : 0;
}

/* "P/.ckptio-<h>/B/<rest>" for the checkpoint at key k = P/B (P may be empty), malloc'd. */
static char *spread_key(const char *k, unsigned n, unsigned h, const char *rest)
{
    const char *slash = strrchr(k, '/');
    int pl = slash ? (int)(slash - k + 1) : 0;
    char *out;
    return asprintf(&out, "%.*s" SPREAD_DIR "%0*x/%s/%s", pl, k, (int)n, h, k + pl, rest) < 0
               ? NULL
               : out;
}

/* The key of data name `name` ("<component>/<file>", or any other name under the checkpoint)
 * of the checkpoint at key k (malloc'd). */
static char *data_key(const char *k, const char *name)
{
    char c[64];
    unsigned n = component(name, c, sizeof c) ? spread_of(c) : 0;
    if (n) {
        const char *file = strchr(name, '/') + 1;
        unsigned h = (unsigned)(ckptio__hash(file, strlen(file)) & ((1u << 4 * n) - 1));
        return spread_key(k, n, h, name);
    }
    char *out;
    return asprintf(&out, "%s/%s", k, name) < 0 ? NULL : out;
}

typedef struct obj_txn {
    ckptio__objc *c;
    char *bucket, *key;
    char save[48];       /* "d-<id>": this save's data component */
    char etag[128];      /* the replaced manifest's ETag, "" when none */
    int64_t t0;          /* the server's clock when the save began (0: unknown) */
    char **old;          /* data components the replaced manifest names */
    size_t n_old;
    ckptio__names old_spread; /* the keys of its data objects in spread components */
    char **named;        /* a sweep's: components the manifest it keeps names */
    size_t n_named;
    char drop[16];       /* a joined rank's file prefix whose objects abort deletes, or "" */
} obj_txn;

/* Largest manifest read back from a store (the format's own limits are far below). */
#define MANIFEST_MAX CKPTIO__MAX_MANIFEST_BYTES

/* "d-<seconds in hex>-<random>": unique among saves, sortable by the client's clock; with
 * "-x<spread>" for a spread save. */
static void make_save_id(char *out, size_t cap, unsigned spread)
{
    uint64_t r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&r, sizeof r, 1, f) != 1)
        r = (uint64_t)getpid() << 32 ^ (uint64_t)ckptio__tmp_id() ^ (uint64_t)clock();
    if (f) fclose(f);
    int n = snprintf(out, cap, "d-%llx-%016llx", (unsigned long long)time(NULL),
                     (unsigned long long)r);
    if (spread && n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "-x%u", spread);
}

/* Add to (*v, *n) the data components the manifest in buf names (an undecodable one names
 * none: the sweep's rules then apply), and to *spread (when given) the keys of its data objects
 * in spread components, the manifest being the one of the checkpoint at key k. */
static void note_components(const char *k, const uint8_t *buf, uint64_t len, char ***v,
                            size_t *n, ckptio__names *spread)
{
    ckptio__manifest *m = NULL;
    char err[256];
    if (ckptio__manifest_decode(buf, len, &m, err, sizeof err) < 0) return;
    for (uint64_t i = 0; i < m->n_files; i++) {
        const char *name = m->strtab + m->files[i].name;
        char c[64];
        if (!component(name, c, sizeof c)) continue;
        char *dk = spread && spread_of(c) ? data_key(k, name) : NULL;
        if (dk) ckptio__names_add(spread, dk, strlen(dk)); /* best effort, as the rest */
        free(dk);
        bool seen = false;
        for (size_t k = 0; k < *n && !seen; k++) seen = !strcmp((*v)[k], c);
        if (seen) continue;
        char **grown = realloc(*v, (*n + 1) * sizeof *grown);
        if (!grown) break;
        *v = grown;
        if (!((*v)[*n] = strdup(c))) break;
        (*n)++;
    }
    ckptio__manifest_free(m);
}

static int obj_init(ckptio__txn *t, const char *url, const ckptio_store_opts *so,
                    ckptio__msg *msg)
{
    obj_txn *o = calloc(1, sizeof *o);
    if (!o) return ckptio__fail(msg, -ENOMEM, "out of memory");
    t->impl = o;
    const ckptio__objc_ops *ops = ckptio__objc_for(url);
    CKPTIO__TRY(ckptio__obj_parse(ops, url, &o->bucket, &o->key, msg));
    CKPTIO__TRY(ops->client(&o->c, so, msg));
    if (asprintf(&t->path, "%s%s/%s", ops->scheme, o->bucket, o->key) < 0) {
        t->path = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    return 0;
}

static char *manifest_key(const obj_txn *o)
{
    char *k;
    return asprintf(&k, "%s/manifest", o->key) < 0 ? NULL : k;
}

static void set_dir(ckptio__txn *t)
{
    snprintf(t->data_dir, sizeof t->data_dir, "%s", ((obj_txn *)t->impl)->save);
    t->where = t->path;
}

static int obj_begin(ckptio__txn *t, const char *url, int kind, unsigned flags, int direct,
                    const ckptio_store_opts *so, ckptio__msg *msg)
{
    (void)direct;
    if (kind != CKPTIO__TXN_DIR)
        return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                            "'%s': only ckptio checkpoints can be saved to an object store, not "
                            "single files (safetensors, torch); save to a local path, or save a "
                            "ckptio checkpoint",
                            url);
    CKPTIO__TRY(obj_init(t, url, so, msg));
    obj_txn *o = t->impl;
    const char *sv = ckptio__opt(so, "prefix_spread"), *from = "store setting prefix_spread";
    if (!sv) sv = getenv(from = "CKPTIO_PREFIX_SPREAD");
    int spread = ckptio__spread_digits(sv);
    if (spread < 0)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s is '%s': use 0 (off), 1 (16 prefixes) or 2 (256 prefixes)", from,
                            sv);
    const char *base = strrchr(o->key, '/');
    if (!strncmp(base ? base + 1 : o->key, SPREAD_DIR, strlen(SPREAD_DIR)))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "'%s': names starting with '" SPREAD_DIR "' hold the data of saves "
                            "with prefix_spread; save under another name",
                            t->path);
    char *mk = manifest_key(o);
    if (!mk) return ckptio__fail(msg, -ENOMEM, "out of memory");
    ckptio__obj_resp r = {0};
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc = ckptio__obj_head(o->c, o->bucket, mk, &r, msg);
    o->t0 = r.date;
    if (rc == 0 && (flags & CKPTIO__TXN_OVERWRITE)) {
        /* The ETag the commit will insist on comes with the bytes it names. */
        rc = ckptio__obj_get_all(o->c, o->bucket, mk, MANIFEST_MAX, &buf, &len, &r, msg);
        if (rc == 0) {
            snprintf(o->etag, sizeof o->etag, "%s", r.etag);
            note_components(o->key, buf, len, &o->old, &o->n_old, &o->old_spread);
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
    make_save_id(o->save, sizeof o->save, (unsigned)spread);
    if (asprintf(&t->tmp_path, "%s/%s", t->path, o->save) < 0) {
        t->tmp_path = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    t->owner = true;
    set_dir(t);
    if (spread) { /* the marker goes first: from here on, what the save leaves can be found */
        char *marker;
        if (asprintf(&marker, "%s/%s/spread", o->key, o->save) < 0)
            return ckptio__fail(msg, -ENOMEM, "out of memory");
        rc = ckptio__obj_put(o->c, o->bucket, marker, (const uint8_t *)"", 0, NULL, NULL, msg);
        free(marker);
        CKPTIO__TRY(rc);
    }
    return 0;
}

static int obj_join(ckptio__txn *t, const char *url, const char *tmp_url, unsigned flags,
                   const ckptio_store_opts *so, ckptio__msg *msg)
{
    (void)flags;
    CKPTIO__TRY(obj_init(t, url, so, msg));
    obj_txn *o = t->impl;
    size_t n = strlen(t->path);
    const char *save = tmp_url + n + 1;
    if (strncmp(tmp_url, t->path, n) || tmp_url[n] != '/' || strncmp(save, "d-", 2) ||
        strchr(save, '/') || strlen(save) >= sizeof o->save)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "internal error: '%s' is no save of '%s'",
                            tmp_url, t->path);
    snprintf(o->save, sizeof o->save, "%s", save);
    t->tmp_path = strdup(tmp_url);
    set_dir(t);
    return t->tmp_path ? 0 : ckptio__fail(msg, -ENOMEM, "out of memory");
}

/* One staging buffer is one part; the engine's threads are the connections uploading them. */
static unsigned obj_parallel(const ckptio__txn *t)
{
    return ckptio__obj_connections(((obj_txn *)t->impl)->c);
}

/* ---- data objects ---- */

static int obj_open_data(ckptio__txn *t, const char *name, uint64_t part, int want_direct,
                        int *fd, int *direct, ckptio__msg *msg)
{
    (void)want_direct;
    obj_txn *o = t->impl;
    char *k;
    *fd = -1;
    *direct = 0;
    if (!(k = data_key(o->key, name))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_open_write(o->c, o->bucket, k, part, fd, msg);
    free(k);
    return rc;
}

/* The upload completed is the object written: nothing to fsync. */
static int obj_finish_data(ckptio__txn *t, int fd, uint64_t len, const char *label,
                          ckptio__msg *msg)
{
    (void)t, (void)label;
    return ckptio__obj_finish(fd, len, msg);
}

/* Nothing is uploaded yet: start over under the new name. */
static int obj_rename_data(ckptio__txn *t, int *fd, const char *from, const char *to,
                          uint64_t part, ckptio__msg *msg)
{
    (void)from;
    int nfd = -1, direct;
    CKPTIO__TRY(obj_open_data(t, to, part, 0, &nfd, &direct, msg));
    ckptio__fd_close(*fd);
    *fd = nfd;
    return 0;
}

/* A completed upload is durable as it stands. */
static int obj_seal(ckptio__txn *t, ckptio__msg *msg)
{
    (void)t, (void)msg;
    return 0;
}

/* ---- after the commit: sweep ---- */

typedef struct sweep_ctx {
    obj_txn *o;
    bool own; /* everything listed goes: the listing is this save's own component */
    size_t prefix_len;
    ckptio__names doomed; /* keys, or "key\nupload id" for unfinished uploads */
    ckptio__names spread; /* doomed spread components, whose objects lie elsewhere */
    const char *match;    /* spread uploads: "/B/<component>/<sub>" past P/.ckptio-<h> */
    unsigned digits;      /* spread uploads: the h's */
} sweep_ctx;

static bool is_in(char *const *v, size_t n, const char *c)
{
    for (size_t k = 0; k < n; k++)
        if (!strcmp(v[k], c)) return true;
    return false;
}

/* Whether the data component `c`, last touched at `when` on the server's clock, may go: the
 * replaced checkpoint's data always; another save's only when it began before this one did,
 * so that it can no longer commit (the manifest it would replace is gone) — a save begun after
 * this one may still be writing, and may still win the next commit. One second of slack for
 * the clocks' whole-second resolution. */
static bool doomed(const obj_txn *o, const char *c, int64_t when)
{
    if (!strcmp(c, o->save) || strncmp(c, "d-", 2) || is_in(o->named, o->n_named, c))
        return false;
    return is_in(o->old, o->n_old, c) || (o->t0 && when && when < o->t0 - 1);
}

static int push(sweep_ctx *s, const char *key, const char *extra)
{
    char *v;
    if (asprintf(&v, "%s%s%s", key, extra ? "\n" : "", extra ? extra : "") < 0) return -ENOMEM;
    int rc = ckptio__names_add(&s->doomed, v, strlen(v));
    free(v);
    return rc;
}

/* Whether the object or upload `key` of a sweep goes: every one in an own sweep, else the
 * data of a doomed component (noting a spread one, whose data lies elsewhere). */
static int judge(sweep_ctx *s, const char *key, int64_t when)
{
    char c[64];
    if (s->own) return 1;
    if (!component(key + s->prefix_len, c, sizeof c) || !doomed(s->o, c, when)) return 0;
    if (spread_of(c) && !is_in(s->o->old, s->o->n_old, c) && !is_in(s->spread.v, s->spread.n, c))
        CKPTIO__TRY(ckptio__names_add(&s->spread, c, strlen(c)));
    return 1;
}

static int on_object(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    int rc = judge(ctx, key, mtime);
    return rc > 0 ? push(ctx, key, NULL) : rc;
}

static int on_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    int rc = judge(ctx, key, initiated);
    return rc > 0 ? push(ctx, key, upload_id) : rc;
}

/* Delete the keys and abort the uploads ("key\nupload id") of `doomed`, best effort: how many
 * went (*failed, when given, adds those that did not). */
static size_t drain(obj_txn *o, ckptio__names *doomed, size_t *failed)
{
    ckptio__msg m = {0};
    size_t gone = 0;
    for (size_t i = 0; i < doomed->n; i++) {
        char *nl = strchr(doomed->v[i], '\n');
        int rc;
        if (nl) {
            *nl = 0;
            rc = ckptio__obj_mpu_abort(o->c, o->bucket, doomed->v[i], nl + 1, &m);
        } else {
            rc = ckptio__obj_delete(o->c, o->bucket, doomed->v[i], &m);
        }
        gone += rc == 0 || rc == CKPTIO_E_NOT_FOUND;
    }
    if (failed) *failed += doomed->n - gone;
    ckptio__names_free(doomed);
    return gone;
}

/* A spread upload of the swept component: P/.ckptio-<h><match>... */
static int on_spread_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    (void)initiated;
    sweep_ctx *s = ctx;
    const char *rest = key + s->prefix_len;
    for (unsigned i = 0; i < s->digits; i++, rest++)
        if (!isxdigit((unsigned char)*rest)) return 0;
    return strncmp(rest, s->match, strlen(s->match)) ? 0 : push(s, key, upload_id);
}

/* Keep the marker of o's component c out of `doomed`: what it marks could not all be removed,
 * and the marker is how a later sweep finds the rest. */
static void spare(const obj_txn *o, ckptio__names *doomed, const char *c)
{
    char *marker;
    if (asprintf(&marker, "%s/%s/spread", o->key, c) < 0) return;
    for (size_t i = 0; i < doomed->n; i++)
        if (!strcmp(doomed->v[i], marker)) {
            free(doomed->v[i]);
            doomed->v[i] = doomed->v[--doomed->n];
            break;
        }
    free(marker);
}

/* Everything of spread component `comp` of o's checkpoint whose file name starts with `sub`,
 * under each of its prefixes (16 or 256 listings: only a killed or failed save's data is
 * found so, a committed one's come from its manifest); how many went into *done. False when
 * a listing or a removal failed. */
static bool spread_sweep(obj_txn *o, const char *comp, const char *sub, size_t *done)
{
    ckptio__msg m = {0};
    unsigned n = spread_of(comp);
    const char *slash = strrchr(o->key, '/'), *base = slash ? slash + 1 : o->key;
    char *rest = NULL, *all = NULL, *match = NULL;
    sweep_ctx s = {.o = o, .own = true};
    bool ok = asprintf(&rest, "%s/%s", comp, sub) >= 0;
    for (unsigned h = 0; ok && h < 1u << 4 * n; h++) {
        char *prefix = spread_key(o->key, n, h, rest);
        ok = prefix && ckptio__obj_list(o->c, o->bucket, prefix, on_object, &s, &m) == 0;
        free(prefix);
    }
    /* The uploads in one listing of P/.ckptio-, picked by what follows <h>. */
    if (ok && asprintf(&all, "%.*s" SPREAD_DIR, (int)(base - o->key), o->key) >= 0 &&
        asprintf(&match, "/%s/%s", base, rest) >= 0) {
        s.prefix_len = strlen(all);
        s.match = match;
        s.digits = n;
        ok = ckptio__obj_list_uploads(o->c, o->bucket, all, on_spread_upload, &s, &m) == 0;
    } else {
        ok = false;
    }
    free(rest);
    free(all);
    free(match);
    size_t failed = 0;
    *done += drain(o, &s.doomed, &failed);
    return ok && !failed;
}

/* Delete the objects and abort the uploads that `doomed` allows under key/, or (own) every
 * one of this save's whose name starts with `sub` ("": all). Not own, first the replaced
 * checkpoint's spread data (old_spread). Best effort: a failure leaves objects no manifest
 * names, for the next save to find; a spread component's data goes before its marker, which
 * stays while any of it does. */
static size_t sweep(obj_txn *o, bool own, const char *sub)
{
    ckptio__msg m = {0};
    char *prefix;
    size_t done = 0, failed = 0;
    if (!own) done += drain(o, &o->old_spread, &failed);
    int n = own ? asprintf(&prefix, "%s/%s/%s", o->key, o->save, sub)
                : asprintf(&prefix, "%s/", o->key);
    if (n < 0) return done;
    sweep_ctx s = {.o = o, .own = own, .prefix_len = strlen(o->key) + 1};
    ckptio__obj_list(o->c, o->bucket, prefix, on_object, &s, &m);
    ckptio__obj_list_uploads(o->c, o->bucket, prefix, on_upload, &s, &m);
    free(prefix);
    for (size_t i = 0; failed && i < o->n_old; i++)
        if (spread_of(o->old[i])) spare(o, &s.doomed, o->old[i]);
    if (own && spread_of(o->save) && !spread_sweep(o, o->save, sub, &done))
        spare(o, &s.doomed, o->save);
    for (size_t i = 0; i < s.spread.n; i++)
        if (!spread_sweep(o, s.spread.v[i], "", &done)) spare(o, &s.doomed, s.spread.v[i]);
    ckptio__names_free(&s.spread);
    return done + drain(o, &s.doomed, NULL);
}

/* ---- publish, abort ---- */

static int raced(const ckptio__txn *t, ckptio__msg *msg)
{
    return ckptio__fail(msg, CKPTIO_E_EXISTS,
                        "'%s' was committed by another save while this one ran (a racing "
                        "writer); this save was not published and its data is being removed",
                        t->path);
}

/* An object or upload of this save that vanished (CKPTIO_E_NOT_FOUND) was swept by a save that
 * committed the path after this one began (see doomed): when the manifest is no longer the one
 * begin found, that is the reason to give. */
static int obj_failed(ckptio__txn *t, int rc, ckptio__msg *msg)
{
    obj_txn *o = t->impl;
    if (rc != CKPTIO_E_NOT_FOUND || !o || !t->owner || t->published) return rc;
    char *mk = manifest_key(o);
    ckptio__obj_resp r = {0};
    bool replaced = mk && ckptio__obj_head(o->c, o->bucket, mk, &r, NULL) == 0 &&
                    strcmp(r.etag, o->etag);
    free(mk);
    return replaced ? raced(t, msg) : rc;
}

/* The conditional write of the manifest was refused: whether the manifest there is this save's
 * own, byte for byte (it names this save's data component, which no other save shares). So it
 * is when a try committed and its answer was lost (a reset, a stall): the retry then finds the
 * object it made. Taking that for a racing writer's would report a committed save as lost, and
 * its abort would delete the data the committed manifest names. */
static bool ours(obj_txn *o, const char *mk, const uint8_t *man, uint64_t len)
{
    uint8_t *buf = NULL;
    uint64_t n = 0;
    bool same = ckptio__obj_get_all(o->c, o->bucket, mk, MANIFEST_MAX, &buf, &n, NULL, NULL) == 0 &&
                n == len && !memcmp(buf, man, len);
    free(buf);
    return same;
}

static int obj_publish(ckptio__txn *t, const uint8_t *man, uint64_t len, ckptio__msg *msg)
{
    obj_txn *o = t->impl;
    if (!man)
        return ckptio__fail(msg, CKPTIO_E_STATE, "internal error: '%s' has no manifest to publish",
                            t->path);
    char *mk = manifest_key(o);
    if (!mk) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_put(o->c, o->bucket, mk, man, len, o->etag[0] ? o->etag : "*", NULL, msg);
    if (rc == CKPTIO_E_EXISTS && ours(o, mk, man, len)) rc = 0;
    free(mk);
    if (rc == CKPTIO_E_EXISTS) return raced(t, msg);
    CKPTIO__TRY(rc);
    t->published = true;
    sweep(o, false, ""); /* the replaced checkpoint's data, and what dead saves left */
    return 0;
}

static void obj_abort(ckptio__txn *t)
{
    obj_txn *o = t->impl;
    if (!o) return;
    if (!t->owner && o->drop[0]) {
        sweep(o, true, o->drop);
        o->drop[0] = 0;
    }
    if (!t->owner || t->published) return;
    sweep(o, true, "");
    t->owner = false;
}

static void obj_drop(ckptio__txn *t, const char *prefix)
{
    obj_txn *o = t->impl;
    if (o && !t->owner && prefix && *prefix) snprintf(o->drop, sizeof o->drop, "%s", prefix);
}

static void free_components(obj_txn *o)
{
    for (size_t k = 0; k < o->n_old; k++) free(o->old[k]);
    for (size_t k = 0; k < o->n_named; k++) free(o->named[k]);
    free(o->old);
    free(o->named);
    ckptio__names_free(&o->old_spread);
}

static void obj_fini(ckptio__txn *t)
{
    obj_txn *o = t->impl;
    if (!o) return;
    free(o->bucket);
    free(o->key);
    free_components(o);
    free(o);
    t->impl = NULL;
}

/* ---- the catalog ---- */

/* The client, bucket and key of an object store's URL, and "<key>/<tail>" when tail is given. */
typedef struct obj_at {
    ckptio__objc *c;
    char *bucket, *key, *sub;
} obj_at;

static int at_open(obj_at *a, const char *url, const ckptio_store_opts *so, const char *tail,
                   ckptio__msg *msg)
{
    *a = (obj_at){0};
    const ckptio__objc_ops *ops = ckptio__objc_for(url);
    int rc = ckptio__obj_parse(ops, url, &a->bucket, &a->key, msg);
    if (rc == 0) rc = ops->client(&a->c, so, msg);
    if (rc == 0 && tail && asprintf(&a->sub, "%s/%s", a->key, tail) < 0) {
        a->sub = NULL;
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    return rc;
}

static void at_close(obj_at *a)
{
    free(a->bucket);
    free(a->key);
    free(a->sub);
}

typedef struct list_ctx {
    size_t skip; /* length of "prefix/" */
    ckptio__names *out;
} list_ctx;

/* key = prefix/<name>/manifest: a committed checkpoint called <name>. */
static int on_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    list_ctx *c = ctx;
    const char *name = key + c->skip, *slash = strchr(name, '/');
    if (!slash || slash == name || strcmp(slash, "/manifest")) return 0;
    return ckptio__names_add(c->out, name, (size_t)(slash - name));
}

static int obj_list(const char *url, const ckptio_store_opts *so, ckptio__names *out,
                   ckptio__msg *msg)
{
    obj_at a;
    int rc = at_open(&a, url, so, "", msg);
    list_ctx c = {.skip = a.sub ? strlen(a.sub) : 0, .out = out};
    if (rc == 0) rc = ckptio__obj_list(a.c, a.bucket, a.sub, on_key, &c, msg);
    at_close(&a);
    return rc;
}

static int obj_is_checkpoint(const char *url, const ckptio_store_opts *so, ckptio__msg *msg)
{
    obj_at a;
    ckptio__obj_resp r = {0};
    int rc = at_open(&a, url, so, "manifest", msg);
    if (rc == 0) rc = ckptio__obj_head(a.c, a.bucket, a.sub, &r, msg);
    at_close(&a);
    return rc == 0 ? 1 : rc == CKPTIO_E_NOT_FOUND ? 0 : rc;
}

/* key, or "key\nupload id" for an unfinished upload. */
static int on_rm_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size;
    (void)mtime;
    return ckptio__names_add(ctx, key, strlen(key));
}

static int on_rm_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    (void)initiated;
    char *v;
    if (asprintf(&v, "%s\n%s", key, upload_id) < 0) return -ENOMEM;
    int rc = ckptio__names_add(ctx, v, strlen(v));
    free(v);
    return rc;
}

/* The manifest goes first: from that moment the checkpoint is gone as a whole, and what
 * remains are objects no manifest names (which the next save of the path sweeps if this
 * removal stops halfway). The data of a spread save goes by the manifest's names; that of a
 * killed spread save the removal finds by its marker. */
static int obj_remove(const char *url, const ckptio_store_opts *so, ckptio__msg *msg)
{
    obj_at a;
    ckptio__names doomed = {0};
    char *mk = NULL;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    int rc = at_open(&a, url, so, "", msg);
    if (rc == 0 && asprintf(&mk, "%s/manifest", a.key) < 0) {
        mk = NULL;
        rc = -ENOMEM;
    }
    if (rc == 0) {
        rc = ckptio__obj_get_all(a.c, a.bucket, mk, MANIFEST_MAX, &buf, &len, NULL, msg);
        if (rc == CKPTIO_E_NOT_FOUND)
            rc = ckptio__fail(msg, CKPTIO_E_NOT_CHECKPOINT,
                              "'%s' is not a checkpoint: there is no object '%s'", url, mk);
    }
    obj_txn o = {.c = a.c, .bucket = a.bucket, .key = a.key};
    if (rc == 0) note_components(a.key, buf, len, &o.old, &o.n_old, &o.old_spread);
    if (rc == 0) rc = ckptio__obj_delete(a.c, a.bucket, mk, msg);
    for (size_t i = 0; rc == 0 && i < o.old_spread.n; i++) { /* a spread checkpoint's data */
        rc = ckptio__obj_delete(a.c, a.bucket, o.old_spread.v[i], msg);
        if (rc == CKPTIO_E_NOT_FOUND) rc = 0;
    }
    size_t done = 0;
    if (rc == 0) rc = ckptio__obj_list(a.c, a.bucket, a.sub, on_rm_key, &doomed, msg);
    if (rc == 0) rc = ckptio__obj_list_uploads(a.c, a.bucket, a.sub, on_rm_upload, &doomed, msg);
    for (size_t i = 0; rc == 0 && i < doomed.n; i++) {
        char *nl = strchr(doomed.v[i], '\n'), c[64];
        if (nl) {
            *nl = 0;
            rc = ckptio__obj_mpu_abort(a.c, a.bucket, doomed.v[i], nl + 1, msg);
            continue;
        }
        const char *name = doomed.v[i] + strlen(a.sub);
        /* A killed spread save's marker goes once its data has (else the next save of the path
         * finds the rest by it); the checkpoint's own data went above. */
        if (component(name, c, sizeof c) && spread_of(c) && !is_in(o.old, o.n_old, c) &&
            !strcmp(strchr(name, '/'), "/spread") && !spread_sweep(&o, c, "", &done))
            continue;
        rc = ckptio__obj_delete(a.c, a.bucket, doomed.v[i], msg);
    }
    free_components(&o);
    ckptio__names_free(&doomed);
    free(buf);
    free(mk);
    at_close(&a);
    return rc;
}

/* ckptio_sweep under an object store's prefix: for each checkpoint <prefix>/<name>, the data of saves that
 * began before its manifest was last written and that it does not name (see doomed: the
 * manifest's Last-Modified plays the committing save's start). */
static int obj_sweep(const char *url, const ckptio_store_opts *so, ckptio__msg *msg)
{
    ckptio__names names = {0};
    int rc = obj_list(url, so, &names, msg);
    size_t removed = 0;
    for (size_t i = 0; rc == 0 && i < names.n; i++) {
        obj_at a;
        obj_txn o = {0};
        ckptio__obj_resp r = {0};
        uint8_t *buf = NULL;
        uint64_t len = 0;
        char *at = NULL;
        size_t ul = strlen(url);
        if (asprintf(&at, "%s%s%s", url, ul && url[ul - 1] == '/' ? "" : "/", names.v[i]) < 0) {
            rc = ckptio__fail(msg, -ENOMEM, "out of memory");
            break;
        }
        rc = at_open(&a, at, so, "manifest", msg);
        if (rc == 0) rc = ckptio__obj_get_all(a.c, a.bucket, a.sub, MANIFEST_MAX, &buf, &len, &r, msg);
        if (rc == CKPTIO_E_NOT_FOUND) rc = 0; /* removed since it was listed */
        else if (rc == 0 && r.mtime) {
            o = (obj_txn){.c = a.c, .bucket = a.bucket, .key = a.key, .t0 = r.mtime};
            note_components(a.key, buf, len, &o.named, &o.n_named, NULL);
            if (o.n_named) removed += sweep(&o, false, ""); /* undecodable: nothing is sure */
            free_components(&o);
        }
        free(buf);
        free(at);
        at_close(&a);
    }
    ckptio__names_free(&names);
    return rc < 0 ? rc : (int)CKPTIO__MIN(removed, (size_t)INT_MAX);
}

/* ---- reads ---- */

/* A place: the client, the bucket and the key prefix names go under ("" at a bucket's top). */
typedef struct obj_place {
    ckptio__objc *c;
    char *bucket, *prefix;
} obj_place;

static int obj_place_open(ckptio__place *p, const char *url, const ckptio_store_opts *so,
                         ckptio__msg *msg)
{
    obj_place *o = calloc(1, sizeof *o);
    if (!o) return ckptio__fail(msg, -ENOMEM, "out of memory");
    p->impl = o;
    const ckptio__objc_ops *ops = ckptio__objc_for(url);
    size_t n = strlen(url), sl = ops ? strlen(ops->scheme) : 0;
    while (n > sl && url[n - 1] == '/') n--;
    if (!(p->path = strndup(url, n))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    const char *b = p->path + sl;
    if (!ops || !*b) return ckptio__obj_parse(ops, p->path, &o->bucket, &o->prefix, msg);
    if (strchr(b, '/')) {
        CKPTIO__TRY(ckptio__obj_parse(ops, p->path, &o->bucket, &o->prefix, msg));
    } else { /* a bucket's top: checked as a bucket with a name under it would be */
        char *probe;
        if (asprintf(&probe, "%s/x", p->path) < 0) return ckptio__fail(msg, -ENOMEM, "out of memory");
        int rc = ckptio__obj_parse(ops, probe, &o->bucket, &o->prefix, msg);
        free(probe);
        CKPTIO__TRY(rc);
        o->prefix[0] = 0;
    }
    CKPTIO__TRY(ops->client(&o->c, so, msg));
    p->parallel = ckptio__obj_connections(o->c);
    return 0;
}

static void obj_place_close(ckptio__place *p)
{
    obj_place *o = p->impl;
    if (!o) return;
    free(o->bucket);
    free(o->prefix);
    free(o);
    p->impl = NULL;
}

/* The key of name under the place (malloc'd): a checkpoint's data where its component puts
 * them (data_key). */
static char *key_in(const obj_place *o, const char *name)
{
    char *k;
    if (*o->prefix) return data_key(o->prefix, name);
    return asprintf(&k, "%s", name) < 0 ? NULL : k;
}

static int obj_read_all(ckptio__place *p, const char *name, uint64_t max, uint8_t **buf,
                       uint64_t *len, ckptio__msg *msg)
{
    obj_place *o = p->impl;
    char *k = key_in(o, name);
    if (!k) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_get_all(o->c, o->bucket, k, max, buf, len, NULL, msg);
    free(k);
    return rc;
}

static int obj_size_of(ckptio__place *p, const char *name, uint64_t *size, ckptio__msg *msg)
{
    obj_place *o = p->impl;
    char *k = key_in(o, name);
    if (!k) return ckptio__fail(msg, -ENOMEM, "out of memory");
    ckptio__obj_resp r = {0};
    int rc = ckptio__obj_head(o->c, o->bucket, k, &r, msg);
    free(k);
    if (rc == 0) *size = r.size;
    return rc;
}

static int obj_read_range(ckptio__place *p, const char *name, uint64_t off, uint64_t len,
                         void *buf, uint64_t *got, ckptio__msg *msg)
{
    obj_place *o = p->impl;
    char *k = key_in(o, name);
    if (!k) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_get_range(o->c, o->bucket, k, off, len, buf, got, msg);
    free(k);
    return rc;
}

static int obj_open_read(ckptio__place *p, const char *name, int *fd, uint64_t *size,
                        ckptio__msg *msg)
{
    obj_place *o = p->impl;
    char *k = key_in(o, name);
    if (!k) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = ckptio__obj_open_read(o->c, o->bucket, k, size, fd, msg);
    free(k);
    return rc;
}

typedef struct names_ctx {
    size_t skip; /* length of "prefix/" */
    ckptio__names_cb cb;
    void *ctx;
} names_ctx;

/* An object directly under the prefix is a name; deeper ones are not. */
static int on_name(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size, (void)mtime;
    names_ctx *c = ctx;
    const char *name = key + c->skip;
    return strchr(name, '/') ? 0 : c->cb(c->ctx, name);
}

static int obj_list_names(ckptio__place *p, ckptio__names_cb cb, void *ctx, ckptio__msg *msg)
{
    obj_place *o = p->impl;
    char *prefix = key_in(o, "");
    if (!prefix) return ckptio__fail(msg, -ENOMEM, "out of memory");
    names_ctx c = {strlen(prefix), cb, ctx};
    int rc = ckptio__obj_list(o->c, o->bucket, prefix, on_name, &c, msg);
    free(prefix);
    return rc;
}

/* The store table's entries: one per kind of client, the same operations. */
#define OBJ_STORE(store_name, store_scheme, min_part, parts)                                   \
    {                                                                                          \
        .name = store_name, .scheme = store_scheme, .list = obj_list,                         \
        .is_checkpoint = obj_is_checkpoint, .remove = obj_remove, .sweep = obj_sweep,          \
        .caps = CKPTIO__STORE_PARTS, .part_min = min_part, .max_parts = parts,                \
        .begin = obj_begin, .join = obj_join, .parallel = obj_parallel,                        \
        .open_data = obj_open_data, .finish_data = obj_finish_data,                            \
        .rename_data = obj_rename_data, .seal = obj_seal, .publish = obj_publish,              \
        .abort = obj_abort, .failed = obj_failed, .drop = obj_drop, .fini = obj_fini,          \
        .place_open = obj_place_open, .place_close = obj_place_close,                          \
        .read_all = obj_read_all, .size_of = obj_size_of, .read_range = obj_read_range,        \
        .open_read = obj_open_read, .list_names = obj_list_names,                              \
    }

const ckptio__store_ops ckptio__store_s3 =
    OBJ_STORE("s3", "s3://", CKPTIO__S3_MIN_PART, CKPTIO__S3_MAX_PARTS);
const ckptio__store_ops ckptio__store_gcs =
    OBJ_STORE("gcs", "gs://", CKPTIO__GCS_MIN_PART, CKPTIO__GCS_MAX_PARTS);
