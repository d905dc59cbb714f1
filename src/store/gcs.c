/* SPDX-License-Identifier: Apache-2.0 */
/* The GCS client: one per distinct setting, JSON API requests with OAuth2 tokens (http.c sends
 * them). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../common/workers.h"
#include "conf_parse.h"
#include "creds.h"
#include "gcp_creds.h"
#include "gcs.h"
#include "uri.h"

#define GCS_JSON_MAX (64ull << 20)
#define GCS_DEFAULT "https://storage.googleapis.com"

typedef struct gcs gcs;
struct gcs {
    ckptio__objc base;
    ckptio__gcp_creds *creds;
    ckptio__http http;
};

static gcs *of(ckptio__objc *c)
{
    return (gcs *)c;
}

static gcs *of_http(ckptio__http *h)
{
    return (gcs *)((char *)h - offsetof(gcs, http));
}

/* ---- the client ---- */

/* A forked child's client: its credentials' lock as new. */
static void client_child(ckptio__http *h)
{
    ckptio__gcp_creds_after_fork(of_http(h)->creds);
}

static ckptio__http_clients clients = CKPTIO__HTTP_CLIENTS(client_child);

/* endpoint_url, else the emulator's (STORAGE_EMULATOR_HOST: "host:port" is http, as Google's
 * libraries take it), else Google's. */
static int set_endpoint(gcs *g, const ckptio__gcp_conf *conf, ckptio__msg *msg)
{
    const char *ep = conf->v[CKPTIO__GCP_ENDPOINT], *from = "endpoint_url";
    if (!ep && (ep = conf->v[CKPTIO__GCP_EMULATOR])) from = "STORAGE_EMULATOR_HOST";
    if (!ep) ep = GCS_DEFAULT;
    char *e = g->http.endpoint;
    size_t cap = sizeof g->http.endpoint;
    if (snprintf(e, cap, "%s%s", strstr(ep, "://") ? "" : "http://", ep) >= (int)cap)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "%s '%.100s...' is too long", from, ep);
    size_t n = strlen(e);
    while (n && e[n - 1] == '/') e[--n] = 0;
    const char *h = !strncmp(e, "http://", 7) ? e + 7 : !strncmp(e, "https://", 8) ? e + 8 : NULL;
    if (!h || !*h || strchr(h, '/'))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s '%s' is not of the form http[s]://host[:port]", from, ep);
    return 0;
}

static void client_free(gcs *g)
{
    ckptio__gcp_conf_wipe_key(g->http.key);
    ckptio__http_fini(&g->http);
    ckptio__gcp_creds_free(g->creds);
    free(g);
}

static const ckptio__http_proto gcs_proto;

/* ckptio__http_client's make: a client from the settings in arg (a ckptio__gcp_conf). */
static int client_new(void *arg, char *key, ckptio__http **out, ckptio__msg *msg)
{
    const ckptio__gcp_conf *conf = arg;
    gcs *g = calloc(1, sizeof *g);
    if (!g) return ckptio__fail(msg, -ENOMEM, "out of memory creating the GCS client");
    g->base = (ckptio__objc){&ckptio__gcs_objc, &g->http};
    int rc = 0;
    ckptio__http_limits lim = {conf->v[CKPTIO__GCP_TIMEOUT], conf->v[CKPTIO__GCP_STALL],
                               conf->v[CKPTIO__GCP_FIRST_TIMEOUT], conf->v[CKPTIO__GCP_CONNS],
                               conf->v[CKPTIO__GCP_CA]};
    CKPTIO__CHECK(ckptio__gcp_creds_new(&g->creds, conf, msg));
    CKPTIO__CHECK(ckptio__http_init(&g->http, &gcs_proto, &lim, msg));
    CKPTIO__CHECK(set_endpoint(g, conf, msg));
    g->http.key = key;
    *out = &g->http;
    return 0;
out:
    client_free(g);
    return rc;
}

int ckptio__gcs_client(ckptio__objc **out, const ckptio_store_opts *o, ckptio__msg *msg)
{
    ckptio__gcp_conf conf = {0};
    ckptio__http *h = NULL;
    char *key = NULL;
    int rc = ckptio__gcp_conf_read(&conf, o, msg);
    if (rc == 0 && !(key = ckptio__gcp_conf_key(&conf)))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    if (rc == 0) rc = ckptio__http_client(&clients, &key, client_new, &conf, &h, msg);
    *out = h ? &of_http(h)->base : NULL;
    ckptio__gcp_conf_wipe_key(key);
    ckptio__gcp_conf_free(&conf);
    return rc;
}

/* ---- one request: what GCS adds to HTTP ---- */

/* What a call's 404 means: its bucket is missing (uploads, listings), or its object. */
typedef struct gcs_req {
    bool bucket_404;
} gcs_req;

static int gcs_auth(ckptio__http *h, ckptio__http_call *c, struct curl_slist **hl, void **cred,
                    ckptio__msg *msg)
{
    gcs *g = of_http(h);
    ckptio__gcp_token *t = NULL;
    ckptio__msg cm = {0};
    int rc = ckptio__gcp_creds_get(g->creds, &t, &cm);
    if (rc < 0)
        return ckptio__fail(msg, rc, "gs://%s/%s: %s: %s", c->bucket, c->key ? c->key : "",
                            c->what, cm.text);
    *cred = t;
    if (!t) return 0; /* an emulator */
    char *line;
    struct curl_slist *n = NULL;
    if (asprintf(&line, "Authorization: Bearer %s", t->token) >= 0) {
        n = curl_slist_append(*hl, line);
        ckptio__fields_wipe_key(line);
    }
    if (!n) return ckptio__fail(msg, -ENOMEM, "out of memory");
    *hl = n;
    return 0;
}

static void gcs_cred_put(void *cred)
{
    ckptio__gcp_token_put(cred);
}

/* The first error's reason ("notFound", "conditionNotMet"...) of a JSON error answer. */
static int first_reason(void *ctx, const char *v, size_t n)
{
    char *code = ctx;
    return ckptio__json_str(v, n, "reason", code, 64) == 1 ? 1 : 0;
}

static int gcs_judge(ckptio__http *h, ckptio__http_call *c, const char *body, size_t len,
                     void *cred, bool *retry, bool *renew)
{
    gcs *g = of_http(h);
    long st = c->resp.status;
    const gcs_req *q = c->proto;
    *retry = *renew = false;
    if (body && len) ckptio__json_each(body, len, "error.errors", first_reason, c->resp.code);
    if (st >= 200 && st < 300) return 0;
    if ((st == 404 && c->ok_404) || (st == 416 && c->ok_416)) return 0;
    if (st >= 500 || st == 429 || st == 408) {
        *retry = true;
        return -EAGAIN;
    }
    if (st == 412) return CKPTIO_E_EXISTS;
    if (st == 401) {
        *renew = cred && ckptio__gcp_creds_expired(g->creds, cred);
        return -EACCES;
    }
    if (st == 403) return -EACCES;
    if (st == 404) return q && q->bucket_404 ? -ENOENT : CKPTIO_E_NOT_FOUND;
    return -EIO;
}

static void gcs_hint(ckptio__http *h, const ckptio__http_call *c, int rc, char *out, size_t cap)
{
    gcs *g = of_http(h);
    const char *src = ckptio__gcp_creds_source(g->creds);
    out[0] = 0;
    if (rc == -EACCES && c->resp.status == 401)
        snprintf(out, cap,
                 ": the store refused the token (from %s) and its source gave no newer one: "
                 "check the credentials (GOOGLE_APPLICATION_CREDENTIALS, the store settings "
                 "token or credentials_file)",
                 *src ? src : "no source");
    else if (rc == -EACCES)
        snprintf(out, cap,
                 ": the store refused the access (credentials from %s): check the bucket's IAM "
                 "policy and the account's roles",
                 *src ? src : "no source");
    else if (rc == -ENOENT)
        snprintf(out, cap, ": the bucket does not exist: create it or fix the URL");
    else if (rc == CKPTIO_E_NOT_FOUND) snprintf(out, cap, ": no such object");
    else if (rc == CKPTIO_E_EXISTS)
        snprintf(out, cap, ": the conditional write was refused: another writer created or "
                           "replaced the object first");
}

static const ckptio__http_proto gcs_proto = {
    .scheme = "gs",
    .env = "CKPTIO_GCS",
    .endpoint_from = "the store setting endpoint_url or STORAGE_EMULATOR_HOST",
    .ca_from = "the store setting ca_bundle",
    .auth = gcs_auth,
    .cred_put = gcs_cred_put,
    .judge = gcs_judge,
    .hint = gcs_hint,
    .hopeless = NULL,
};

/* Send c to <endpoint><api>/storage/v1/b/<bucket>/o[/<object>]<tail>[?query]: api "" (JSON)
 * or "/upload"; the object name encoded whole ('/' too), as GCS asks. */
static int gcs_do(gcs *g, ckptio__http_call *c, const char *api, const char *object,
                  const char *tail, const ckptio__kv *q, unsigned nq, bool bucket_404,
                  ckptio__msg *msg)
{
    char *eobj = object ? ckptio__uri_encode(object, false) : NULL;
    char *query = ckptio__uri_query(q, nq), *url = NULL;
    int rc = 0;
    if ((object && !eobj) || !query ||
        asprintf(&url, "%s%s/storage/v1/b/%s/o%s%s%s%s%s", g->http.endpoint, api, c->bucket,
                 object ? "/" : "", object ? eobj : "", tail, *query ? "?" : "", query) < 0) {
        url = NULL;
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    } else {
        gcs_req req = {bucket_404};
        c->url = url;
        c->proto = &req;
        rc = ckptio__http_do(&g->http, c, msg);
        c->proto = NULL;
    }
    free(eobj);
    free(query);
    free(url);
    return rc;
}

/* ---- the operations ---- */

/* The object resource a call answered with: its generation (the version: resp->etag), size,
 * and updated (resp->mtime). */
static int read_object(gcs *g, ckptio__http_call *c, ckptio__obj_resp *resp, ckptio__msg *msg)
{
    char gen[24] = "", when[64] = "";
    int64_t size = 0;
    const char *j = (const char *)c->out;
    size_t n = c->out_len;
    if (!j || ckptio__json_get(j, n, "generation", gen, sizeof gen) != 1 || !gen[0] ||
        ckptio__json_int(j, n, "size", &size) < 0 || size < 0)
        return ckptio__fail(msg, CKPTIO_E_CORRUPT,
                            "gs://%s/%s: %s: %s answered without the object's generation and "
                            "size",
                            c->bucket, c->key, c->what, g->http.endpoint);
    c->resp.size = (uint64_t)size;
    snprintf(c->resp.etag, sizeof c->resp.etag, "%s", gen);
    if (ckptio__json_str(j, n, "updated", when, sizeof when) == 1)
        ckptio__time_iso(when, &c->resp.mtime);
    if (resp) *resp = c->resp;
    return 0;
}

/* A boundary that no manifest will hold: 128 random bits. */
static void boundary(char out[48])
{
    uint64_t r[2] = {0, 0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(r, sizeof r, 1, f) != 1) {
        r[0] = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
        r[1] = (uint64_t)clock() ^ (uint64_t)(uintptr_t)out;
    }
    if (f) fclose(f);
    snprintf(out, 48, "ckptio-%016llx%016llx", (unsigned long long)r[0],
             (unsigned long long)r[1]);
}

/* A multipart upload's body: the metadata {"name": key}, then the bytes. */
static char *multipart(const char *key, const void *buf, uint64_t len, const char *b,
                       size_t *out_len)
{
    size_t kl = ckptio__json_escape(key, NULL, 0);
    char *ek = malloc(kl + 1);
    if (!ek) return NULL;
    ckptio__json_escape(key, ek, kl + 1);
    char *head, *body = NULL;
    int hl = asprintf(&head,
                      "--%s\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                      "{\"name\":\"%s\"}\r\n--%s\r\nContent-Type: application/octet-stream\r\n\r\n",
                      b, ek, b);
    free(ek);
    if (hl < 0) return NULL;
    size_t tl = strlen(b) + 8, n = (size_t)hl + len + tl;
    if ((body = malloc(n + 1))) {
        memcpy(body, head, (size_t)hl);
        if (len) memcpy(body + hl, buf, len);
        snprintf(body + hl + len, tl + 1, "\r\n--%s--\r\n", b);
        *out_len = n;
    }
    free(head);
    return body;
}

static int gcs_put(ckptio__objc *oc, const char *bucket, const char *key, const void *buf,
                   uint64_t len, const char *cond, ckptio__obj_resp *resp, ckptio__msg *msg)
{
    gcs *g = of(oc);
    ckptio__http_call call = {.what = "PUT", .method = "POST", .bucket = bucket, .key = key,
                              .max = 1u << 20};
    int rc;
    if (!cond) { /* the bytes as they are: a media upload */
        ckptio__kv q[2] = {{"name", key}, {"uploadType", "media"}};
        call.content_type = "application/octet-stream";
        call.body = buf;
        call.body_len = len;
        rc = gcs_do(g, &call, "/upload", NULL, "", q, 2, true, msg);
    } else { /* a precondition: metadata and bytes in one multipart upload */
        char b[48], ct[96];
        size_t n = 0;
        boundary(b);
        char *body = multipart(key, buf, len, b, &n);
        if (!body) return ckptio__fail(msg, -ENOMEM, "out of memory");
        snprintf(ct, sizeof ct, "multipart/related; boundary=%s", b);
        ckptio__kv q[3] = {{"ifGenerationMatch", strcmp(cond, "*") ? cond : "0"},
                           {"name", key}, /* as in the metadata: what logs show */
                           {"uploadType", "multipart"}};
        call.content_type = ct;
        call.body = body;
        call.body_len = n;
        rc = gcs_do(g, &call, "/upload", NULL, "", q, 3, true, msg);
        free(body);
    }
    if (rc == 0) rc = read_object(g, &call, resp, msg);
    free(call.out);
    return rc;
}

static int gcs_get_all(ckptio__objc *oc, const char *bucket, const char *key, uint64_t max,
                       uint8_t **buf, uint64_t *len, ckptio__obj_resp *resp, ckptio__msg *msg)
{
    ckptio__kv q[1] = {{"alt", "media"}};
    ckptio__http_call call = {.what = "GET", .method = "GET", .bucket = bucket, .key = key,
                              .max = max ? max : 1};
    int rc = gcs_do(of(oc), &call, "", key, "", q, 1, false, msg);
    snprintf(call.resp.etag, sizeof call.resp.etag, "%s", call.resp.gen);
    return ckptio__http_body(&call, rc, buf, len, resp, msg);
}

static int gcs_get_range(ckptio__objc *oc, const char *bucket, const char *key, uint64_t off,
                         uint64_t len, void *buf, uint64_t *got, ckptio__msg *msg)
{
    char range[80];
    ckptio__kv q[1] = {{"alt", "media"}};
    ckptio__http_call call = {.what = "GET (range)", .method = "GET", .bucket = bucket,
                              .key = key};
    *got = 0;
    if (!len) return 0;
    ckptio__http_range(&call, off, len, buf, range);
    int rc = gcs_do(of(oc), &call, "", key, "", q, 1, false, msg);
    return ckptio__http_range_got(oc->http, &call, rc, off, got, msg);
}

static int gcs_head(ckptio__objc *oc, const char *bucket, const char *key, ckptio__obj_resp *resp,
                    ckptio__msg *msg)
{
    gcs *g = of(oc);
    ckptio__kv q[1] = {{"fields", "generation,size,updated"}};
    ckptio__http_call call = {.what = "HEAD", .method = "GET", .bucket = bucket, .key = key,
                              .max = 1u << 20};
    int rc = gcs_do(g, &call, "", key, "", q, 1, false, msg);
    if (rc == 0) rc = read_object(g, &call, resp, msg);
    else if (resp) *resp = call.resp; /* the Date of a 404 */
    free(call.out);
    return rc;
}

static int gcs_delete(ckptio__objc *oc, const char *bucket, const char *key, ckptio__msg *msg)
{
    ckptio__http_call call = {.what = "DELETE", .method = "DELETE", .bucket = bucket, .key = key,
                              .ok_404 = true};
    return gcs_do(of(oc), &call, "", key, "", NULL, 0, false, msg);
}

typedef struct list_page {
    ckptio__obj_list_cb cb;
    void *ctx;
    int rc;
} list_page;

static int on_item(void *ctx, const char *v, size_t n)
{
    list_page *p = ctx;
    char name[1100], when[64] = "";
    int64_t size = 0, mtime = 0;
    /* An object always has a name: an item with none, or with "", is a corrupt answer, never
     * a key handed on to the listing's readers (which read, compare and delete what they get),
     * as the S3 reader refuses a <Key> that is empty. */
    if (ckptio__json_str(v, n, "name", name, sizeof name) != 1 || !name[0] ||
        ckptio__json_int(v, n, "size", &size) < 0 || size < 0)
        return p->rc = CKPTIO_E_CORRUPT;
    if (ckptio__json_str(v, n, "updated", when, sizeof when) == 1) ckptio__time_iso(when, &mtime);
    return p->rc = p->cb(p->ctx, name, (uint64_t)size, mtime);
}

int ckptio__gcs_parse_list(const char *json, size_t len, ckptio__obj_list_cb cb, void *ctx,
                           char *token, size_t cap)
{
    list_page p = {cb, ctx, 0};
    token[0] = 0;
    int rc = ckptio__json_each(json, len, "items", on_item, &p);
    if (rc) return rc;
    rc = ckptio__json_get(json, len, "nextPageToken", token, cap);
    return rc < 0 ? CKPTIO_E_CORRUPT : 0;
}

static int gcs_list(ckptio__objc *oc, const char *bucket, const char *prefix,
                    ckptio__obj_list_cb cb, void *ctx, ckptio__msg *msg)
{
    gcs *g = of(oc);
    char token[1024] = "";
    for (;;) {
        ckptio__kv q[3] = {{"fields", "items(name,size,updated),nextPageToken"},
                           {"prefix", prefix},
                           {"pageToken", token}};
        ckptio__http_call call = {.what = "LIST", .method = "GET", .bucket = bucket,
                                  .key = prefix, .max = GCS_JSON_MAX};
        CKPTIO__TRY(gcs_do(g, &call, "", NULL, "", q, token[0] ? 3u : 2u, true, msg));
        int rc = call.out ? ckptio__gcs_parse_list((char *)call.out, call.out_len, cb, ctx,
                                                   token, sizeof token)
                          : CKPTIO_E_CORRUPT;
        free(call.out);
        if (rc == CKPTIO_E_CORRUPT)
            return ckptio__fail(msg, rc, "gs://%s/%s: the listing from %s is not understood",
                                bucket, prefix, g->http.endpoint);
        if (rc || !token[0]) return rc;
    }
}

/* ---- uploads in parts: part objects, composed ---- */

static int gcs_mpu_create(ckptio__objc *oc, const char *bucket, const char *key,
                          char **upload_id, ckptio__msg *msg)
{
    (void)oc, (void)bucket, (void)key;
    char b[48];
    boundary(b); /* 128 random bits: "ckptio-<hex>" */
    *upload_id = strndup(b + 7, 16);
    return *upload_id ? 0 : ckptio__fail(msg, -ENOMEM, "out of memory");
}

/* The object holding part `n` of an upload ("<key>.part-<id>-00001"), or a compose's
 * intermediate (level > 0: "<key>.part-<id>-c1-00000"); malloc'd. */
static char *part_name(const char *key, const char *id, unsigned level, unsigned n)
{
    char *s;
    int rc = level ? asprintf(&s, "%s.part-%s-c%u-%05u", key, id, level, n)
                   : asprintf(&s, "%s.part-%s-%05u", key, id, n);
    return rc < 0 ? NULL : s;
}

static int gcs_mpu_part(ckptio__objc *oc, const char *bucket, const char *key,
                        const char *upload_id, unsigned part, const void *buf, uint64_t len,
                        char tag[128], ckptio__msg *msg)
{
    char *name = part_name(key, upload_id, 0, part);
    if (!name) return ckptio__fail(msg, -ENOMEM, "out of memory");
    ckptio__obj_resp r = {0};
    int rc = gcs_put(oc, bucket, name, buf, len, NULL, &r, msg);
    free(name);
    if (rc == 0) memcpy(tag, r.etag, 128);
    return rc;
}

/* Compose names[0..n) (each held to its generation gens[i]) into `dest`; its generation into
 * gen. */
static int compose(gcs *g, const char *bucket, const char *dest, char **names, char (*gens)[128],
                   unsigned n, char gen[128], ckptio__msg *msg)
{
    size_t cap = 128, len = 0;
    for (unsigned i = 0; i < n; i++) cap += ckptio__json_escape(names[i], NULL, 0) + 200;
    char *body = malloc(cap);
    if (!body) return ckptio__fail(msg, -ENOMEM, "out of memory");
    len += (size_t)snprintf(body + len, cap - len, "{\"sourceObjects\":[");
    for (unsigned i = 0; i < n; i++) {
        len += (size_t)snprintf(body + len, cap - len, "%s{\"name\":\"", i ? "," : "");
        len += ckptio__json_escape(names[i], body + len, cap - len);
        /* A generation is decimal digits: nothing to escape. */
        len += (size_t)snprintf(body + len, cap - len,
                                "\",\"objectPreconditions\":{\"ifGenerationMatch\":\"%s\"}}",
                                gens[i]);
    }
    len += (size_t)snprintf(body + len, cap - len,
                            "],\"destination\":{\"contentType\":\"application/octet-stream\"}}");
    ckptio__http_call call = {.what = "compose", .method = "POST", .bucket = bucket, .key = dest,
                              .content_type = "application/json", .body = body, .body_len = len,
                              .max = 1u << 20};
    ckptio__obj_resp r;
    int rc = gcs_do(g, &call, "", dest, "/compose", NULL, 0, false, msg);
    if (rc == 0) rc = read_object(g, &call, &r, msg);
    if (rc == 0) memcpy(gen, r.etag, 128);
    free(call.out);
    free(body);
    return rc;
}

static void free_names(char **v, unsigned n)
{
    for (unsigned i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

typedef struct deletes {
    ckptio__objc *c;
    const char *bucket;
    const ckptio__names *keys;
} deletes;

static void delete_one(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    deletes *d = ctx;
    gcs_delete(d->c, d->bucket, d->keys->v[i], NULL);
}

/* Delete keys, best effort, several at once (a delete is a round trip: a gigabyte in 8 MiB
 * parts is 128 of them). */
static void delete_all(ckptio__objc *c, const char *bucket, const ckptio__names *keys)
{
    deletes d = {c, bucket, keys};
    ckptio__workers *w = NULL;
    unsigned n = (unsigned)CKPTIO__MIN((size_t)CKPTIO__MIN(8u, ckptio__obj_connections(c)), keys->n);
    if (n > 1 && ckptio__workers_start(&w, n) == 0) {
        ckptio__workers_for(w, keys->n, delete_one, &d);
        ckptio__workers_stop(w);
        return;
    }
    for (size_t i = 0; i < keys->n; i++) delete_one(&d, i, 0);
}

/* Compose the parts into the object: levels of at most CKPTIO__GCS_COMPOSE_MAX sources each,
 * then the parts and the levels' objects are deleted (best effort: a part that stays lies
 * under the save's own prefix, which its abort, a later save's sweep or the checkpoint's
 * removal deletes whole). */
static int gcs_mpu_complete(ckptio__objc *oc, const char *bucket, const char *key,
                            const char *upload_id, char (*tags)[128], unsigned n,
                            ckptio__msg *msg)
{
    gcs *g = of(oc);
    const unsigned fan = CKPTIO__GCS_COMPOSE_MAX;
    ckptio__names made = {0}; /* every object composed from, to delete after */
    char **cur = calloc(n, sizeof *cur), gen[128];
    char(*gens)[128] = malloc((size_t)n * sizeof *gens);
    unsigned cn = cur ? n : 0, level = 0;
    int rc = cur && gens ? 0 : ckptio__fail(msg, -ENOMEM, "out of memory");
    for (unsigned i = 0; rc == 0 && i < n; i++) {
        if (!(cur[i] = part_name(key, upload_id, 0, i + 1)))
            rc = ckptio__fail(msg, -ENOMEM, "out of memory");
        else memcpy(gens[i], tags[i], 128);
    }
    while (rc == 0 && cn > fan) { /* a level: each group of `fan` into one object */
        unsigned m = (cn + fan - 1) / fan;
        char **next = calloc(m, sizeof *next);
        char(*ngens)[128] = malloc((size_t)m * sizeof *ngens);
        if (!next || !ngens) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
        level++;
        for (unsigned j = 0; rc == 0 && j < m; j++) {
            if (!(next[j] = part_name(key, upload_id, level, j)))
                rc = ckptio__fail(msg, -ENOMEM, "out of memory");
            else
                rc = compose(g, bucket, next[j], cur + j * fan, gens + j * fan,
                             CKPTIO__MIN(fan, cn - j * fan), ngens[j], msg);
        }
        for (unsigned i = 0; i < cn; i++)
            if (ckptio__names_add(&made, cur[i], strlen(cur[i])) < 0 && rc == 0)
                rc = ckptio__fail(msg, -ENOMEM, "out of memory");
        free_names(cur, cn);
        free(gens);
        cur = next;
        gens = ngens;
        cn = next ? m : 0;
    }
    if (rc == 0) rc = compose(g, bucket, key, cur, gens, cn, gen, msg);
    for (unsigned i = 0; i < cn; i++)
        if (cur[i]) ckptio__names_add(&made, cur[i], strlen(cur[i]));
    delete_all(oc, bucket, &made);
    ckptio__names_free(&made);
    free_names(cur, cn);
    free(gens);
    return rc;
}

static int on_part(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size, (void)mtime;
    return ckptio__names_add(ctx, key, strlen(key));
}

/* Delete the upload's part objects (and a compose's intermediates). */
static int gcs_mpu_abort(ckptio__objc *oc, const char *bucket, const char *key,
                         const char *upload_id, ckptio__msg *msg)
{
    char *prefix;
    ckptio__names keys = {0};
    if (asprintf(&prefix, "%s.part-%s-", key, upload_id) < 0)
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = gcs_list(oc, bucket, prefix, on_part, &keys, msg);
    if (rc == 0) delete_all(oc, bucket, &keys);
    ckptio__names_free(&keys);
    free(prefix);
    return rc;
}

const ckptio__objc_ops ckptio__gcs_objc = {
    .scheme = "gs://",
    .name = "gcs",
    .min_part = CKPTIO__GCS_MIN_PART,
    .max_parts = CKPTIO__GCS_MAX_PARTS,
    .client = ckptio__gcs_client,
    .put = gcs_put,
    .get_all = gcs_get_all,
    .get_range = gcs_get_range,
    .head = gcs_head,
    .del = gcs_delete,
    .list = gcs_list,
    .list_uploads = NULL,
    .mpu_create = gcs_mpu_create,
    .mpu_part = gcs_mpu_part,
    .mpu_complete = gcs_mpu_complete,
    .mpu_abort = gcs_mpu_abort,
};
