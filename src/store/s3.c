/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 client: one per distinct setting, its requests signed with SigV4 (http.c sends them). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "aws_creds.h"
#include "s3_impl.h"

#define S3_XML_MAX (64ull << 20)

typedef struct ckptio__s3 ckptio__s3;
struct ckptio__s3 {
    ckptio__objc base;
    char scheme[8];
    char host[256]; /* a custom endpoint's host[:port]; else the AWS region's */
    bool custom;
    int style;      /* STYLE_*: how buckets are addressed */
    ckptio__aws_creds *creds;
    const char *region;
    ckptio__http http;
};

enum { STYLE_AUTO, STYLE_PATH, STYLE_VIRTUAL };

static ckptio__s3 *of(ckptio__objc *c)
{
    return (ckptio__s3 *)c;
}

static ckptio__s3 *of_http(ckptio__http *h)
{
    return (ckptio__s3 *)((char *)h - offsetof(ckptio__s3, http));
}

/* ---- the client ---- */

/* A forked child's client: its credentials' lock as new. */
static void client_child(ckptio__http *h)
{
    ckptio__aws_creds_after_fork(of_http(h)->creds);
}

static ckptio__http_clients clients = CKPTIO__HTTP_CLIENTS(client_child);

/* Where requests go: the settings' or the environment's endpoint, else the profile's, else AWS
 * in the region. */
static int set_endpoint(ckptio__s3 *s, const ckptio__aws_conf *conf, ckptio__msg *msg)
{
    char ep[512] = "";
    const char *from = "endpoint_url";
    if (conf->v[CKPTIO__AWS_ENDPOINT]) snprintf(ep, sizeof ep, "%s", conf->v[CKPTIO__AWS_ENDPOINT]);
    else if (ckptio__aws_profile_value(s->creds, "s3", "endpoint_url", ep, sizeof ep) != 1 &&
             ckptio__aws_profile_value(s->creds, "endpoint_url", NULL, ep, sizeof ep) != 1)
        ep[0] = 0;
    else from = "the profile's endpoint_url";
    if (!ep[0]) {
        snprintf(s->scheme, sizeof s->scheme, "https");
        snprintf(s->host, sizeof s->host, "s3.%s.amazonaws.com", s->region);
        snprintf(s->http.endpoint, sizeof s->http.endpoint, "https://%s", s->host);
        return 0;
    }
    size_t n = strlen(ep);
    while (n && ep[n - 1] == '/') ep[--n] = 0;
    const char *h = !strncmp(ep, "http://", 7) ? ep + 7 : !strncmp(ep, "https://", 8) ? ep + 8 : NULL;
    if (!h || !*h || strchr(h, '/') || strlen(h) >= sizeof s->host)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s '%s' (AWS_ENDPOINT_URL) is not of the form http[s]://host[:port]",
                            from, ep);
    snprintf(s->scheme, sizeof s->scheme, "%.*s", (int)(h - ep - 3), ep);
    snprintf(s->host, sizeof s->host, "%s", h);
    snprintf(s->http.endpoint, sizeof s->http.endpoint, "%s", ep);
    s->custom = true;
    return 0;
}

static void client_free(ckptio__s3 *s)
{
    ckptio__aws_conf_wipe_key(s->http.key);
    ckptio__http_fini(&s->http);
    ckptio__aws_creds_free(s->creds);
    free(s);
}

static const ckptio__http_proto s3_proto;

/* ckptio__http_client's make: a client from the settings in arg (a ckptio__aws_conf). */
static int client_new(void *arg, char *key, ckptio__http **out, ckptio__msg *msg)
{
    const ckptio__aws_conf *conf = arg;
    ckptio__s3 *s = calloc(1, sizeof *s);
    if (!s) return ckptio__fail(msg, -ENOMEM, "out of memory creating the S3 client");
    s->base = (ckptio__objc){&ckptio__s3_objc, &s->http};
    char v[1024];
    int rc = 0;
    const char *ca = conf->v[CKPTIO__AWS_CA], *style = conf->v[CKPTIO__AWS_ADDRESSING];
    CKPTIO__CHECK(ckptio__aws_creds_new(&s->creds, conf, msg));
    s->region = ckptio__aws_creds_region(s->creds);
    if (!ca && ckptio__aws_profile_value(s->creds, "ca_bundle", NULL, v, sizeof v) == 1) ca = v;
    ckptio__http_limits lim = {conf->v[CKPTIO__AWS_TIMEOUT], conf->v[CKPTIO__AWS_STALL],
                               conf->v[CKPTIO__AWS_FIRST_TIMEOUT], conf->v[CKPTIO__AWS_CONNS], ca};
    CKPTIO__CHECK(ckptio__http_init(&s->http, &s3_proto, &lim, msg));
    CKPTIO__CHECK(set_endpoint(s, conf, msg));
    char st[16];
    if (!style && ckptio__aws_profile_value(s->creds, "s3", "addressing_style", st, sizeof st) == 1)
        style = st;
    s->style = !style || !strcmp(style, "auto") ? STYLE_AUTO : !strcmp(style, "path") ? STYLE_PATH
               : !strcmp(style, "virtual")                  ? STYLE_VIRTUAL
                                                            : -1;
    CKPTIO__GOTO_IF(s->style < 0, ckptio__fail(msg, CKPTIO_E_USAGE,
                                               "addressing_style '%s' is none of auto, path, "
                                               "virtual", style));
    s->http.key = key;
    *out = &s->http;
    return 0;
out:
    client_free(s);
    return rc;
}

int ckptio__s3_client(ckptio__objc **out, const ckptio_store_opts *o, ckptio__msg *msg)
{
    ckptio__aws_conf conf = {0};
    ckptio__http *h = NULL;
    char *key = NULL;
    int rc = ckptio__aws_conf_read(&conf, o, msg);
    if (rc == 0 && !(key = ckptio__aws_conf_key(&conf)))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    if (rc == 0) rc = ckptio__http_client(&clients, &key, client_new, &conf, &h, msg);
    *out = h ? &of_http(h)->base : NULL;
    ckptio__aws_conf_wipe_key(key);
    ckptio__aws_conf_free(&conf);
    return rc;
}

/* ---- one request: what S3 adds to HTTP ---- */

typedef struct s3_call {
    ckptio__http_call h; /* what, method, bucket, key, extra, body, the answer... */
    const ckptio__kv *query;
    unsigned nq;
    bool sign_body;
    const char *upload; /* the multipart upload this call works on: see upload_gone */
    char *uri;          /* the canonical URI the signature covers */
    char host[600];
    char phash[65];
} s3_call;

/* The URL and the canonical URI: as addressing_style says; auto is path-style for a custom
 * endpoint and for bucket names with dots (their virtual host would not match AWS's
 * certificate), else virtual-host style. */
static int build_target(ckptio__s3 *s, s3_call *c, const char *query, char **url)
{
    const char *bucket = c->h.bucket, *key = c->h.key;
    char *ekey = ckptio__uri_encode(key ? key : "", true);
    if (!ekey) return -ENOMEM;
    bool path_style = s->style == STYLE_PATH ||
                      (s->style == STYLE_AUTO && (s->custom || strchr(bucket, '.')));
    size_t n = strlen(ekey) + strlen(bucket) + 4;
    c->uri = malloc(n);
    if (c->uri) {
        if (path_style) snprintf(c->uri, n, key ? "/%s/%s" : "/%s", bucket, ekey);
        else snprintf(c->uri, n, "/%s", ekey);
    }
    if (path_style) snprintf(c->host, sizeof c->host, "%s", s->host);
    else snprintf(c->host, sizeof c->host, "%s.%s", bucket, s->host);
    free(ekey);
    if (!c->uri) return -ENOMEM;
    size_t ul = strlen(s->scheme) + strlen(c->host) + strlen(c->uri) + strlen(query) + 8;
    *url = malloc(ul);
    if (!*url) return -ENOMEM;
    snprintf(*url, ul, "%s://%s%s%s%s", s->scheme, c->host, c->uri, *query ? "?" : "", query);
    return 0;
}

static int add_line(struct curl_slist **hl, const char *fmt, const char *v)
{
    char *line;
    if (asprintf(&line, fmt, v) < 0) return -ENOMEM;
    struct curl_slist *t = curl_slist_append(*hl, line);
    free(line);
    if (!t) return -ENOMEM;
    *hl = t;
    return 0;
}

/* SigV4 for this try: the credentials now, the clock now. */
static int s3_auth(ckptio__http *h, ckptio__http_call *hc, struct curl_slist **hl, void **cred,
                   ckptio__msg *msg)
{
    ckptio__s3 *s = of_http(h);
    s3_call *c = hc->proto;
    ckptio__aws_key *k = NULL;
    ckptio__msg cm = {0};
    int rc = ckptio__aws_creds_get(s->creds, &k, &cm);
    if (rc < 0)
        return ckptio__fail(msg, rc, "s3://%s/%s: %s: %s", hc->bucket, hc->key ? hc->key : "",
                            hc->what, cm.text);
    *cred = k;
    char date[20], auth[CKPTIO__S3_AUTH_MAX];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm);
    ckptio__kv hs[4] = {{"host", c->host}, {"x-amz-content-sha256", c->phash},
                        {"x-amz-date", date}, {"x-amz-security-token", k->token}};
    ckptio__s3_sig_in in = {hc->method, c->uri, c->query, c->nq, hs, k->token ? 4u : 3u,
                            c->phash, date, s->region, k->id, k->secret, NULL};
    rc = ckptio__s3_sign(&in, auth);
    if (rc == 0) rc = add_line(hl, "Host: %s", c->host);
    if (rc == 0) rc = add_line(hl, "x-amz-content-sha256: %s", c->phash);
    if (rc == 0) rc = add_line(hl, "x-amz-date: %s", date);
    if (rc == 0) rc = add_line(hl, "Authorization: %s", auth);
    /* A session token may be longer than a line of the others: a header of its own. */
    if (rc == 0 && k->token) rc = add_line(hl, "x-amz-security-token: %s", k->token);
    if (rc < 0) {
        curl_slist_free_all(*hl);
        *hl = NULL;
        return ckptio__fail(msg, rc, "s3://%s/%s: %s: cannot sign the request", hc->bucket,
                            hc->key ? hc->key : "", hc->what);
    }
    return 0;
}

static void s3_cred_put(void *cred)
{
    ckptio__aws_key_put(cred);
}

/* The store's word for credentials that have expired: the source is asked for newer ones. */
static bool expired_code(const char *code)
{
    return !strcmp(code, "ExpiredToken") || !strcmp(code, "TokenRefreshRequired") ||
           !strcmp(code, "ExpiredTokenException");
}

static bool retry_code(const char *code)
{
    return !strcmp(code, "SlowDown") || !strcmp(code, "RequestTimeout") ||
           !strcmp(code, "InternalError") || !strcmp(code, "ServiceUnavailable") ||
           !strcmp(code, "ConditionalRequestConflict");
}

/* What to do about an HTTP status: 0 success, else the code; *retry if it may pass. */
static int status_rc(const ckptio__http_call *c, bool *retry)
{
    long st = c->resp.status;
    const char *code = c->resp.code;
    *retry = false;
    if (st >= 200 && st < 300) return 0;
    if ((st == 404 && c->ok_404 && strcmp(code, "NoSuchBucket")) || (st == 416 && c->ok_416))
        return 0;
    if (st >= 500 || st == 429 || (st == 409 && !strcmp(code, "ConditionalRequestConflict")) ||
        retry_code(code)) {
        *retry = true;
        return -EAGAIN;
    }
    if (st == 412) return CKPTIO_E_EXISTS;
    if (st == 403 || st == 401) return -EACCES;
    if (st == 404) return !strcmp(code, "NoSuchBucket") ? -ENOENT : CKPTIO_E_NOT_FOUND;
    return -EIO;
}

static int s3_judge(ckptio__http *h, ckptio__http_call *c, const char *body, size_t len,
                    void *cred, bool *retry, bool *renew)
{
    ckptio__s3 *s = of_http(h);
    ckptio__aws_key *k = cred;
    ckptio__s3_parse_error(body, len, c->resp.code, sizeof c->resp.code);
    /* CompleteMultipartUpload may fail after its 200 has been sent: the body says. */
    if (c->resp.status == 200 && c->out && !strcmp(c->method, "POST"))
        ckptio__s3_parse_error((char *)c->out, c->out_len, c->resp.code, sizeof c->resp.code);
    if (c->resp.code[0] && c->resp.status == 200)
        c->resp.status = retry_code(c->resp.code) ? 500 : 400;
    int rc = status_rc(c, retry);
    /* Temporary credentials the store calls expired: ask their source again, at once. A HEAD's
     * answer has no body to say so: its 400 is taken as that once. */
    bool expired = expired_code(c->resp.code) ||
                   (!c->resp.code[0] && c->resp.status == 400 && !strcmp(c->method, "HEAD") &&
                    !c->renewed && k->expires);
    *renew = rc < 0 && expired && ckptio__aws_creds_expired(s->creds, k);
    return rc;
}

static void s3_hint(ckptio__http *h, const ckptio__http_call *c, int rc, char *out, size_t cap)
{
    ckptio__s3 *s = of_http(h);
    const char *code = c->resp.code;
    out[0] = 0;
    if (rc == -EACCES)
        snprintf(out, cap,
                 ": the store refused the credentials (from %s) or the access: check them, "
                 "the region and the bucket's policy",
                 ckptio__aws_creds_source(s->creds));
    else if (expired_code(code))
        snprintf(out, cap,
                 ": the credentials (from %s) have expired and their source gave no newer ones",
                 ckptio__aws_creds_source(s->creds));
    else if (rc == -ENOENT)
        snprintf(out, cap, ": the bucket does not exist: create it or fix the URL");
    else if (c->resp.status == 301 || !strcmp(code, "AuthorizationHeaderMalformed"))
        snprintf(out, cap, ": the bucket is in another region: set AWS_REGION to it");
    else if (rc == CKPTIO_E_NOT_FOUND && !strcmp(code, "NoSuchUpload"))
        snprintf(out, cap, ": the multipart upload is gone (another client aborted it)");
    else if (rc == CKPTIO_E_NOT_FOUND) snprintf(out, cap, ": no such object");
    else if (rc == CKPTIO_E_EXISTS)
        snprintf(out, cap, ": the conditional write was refused: another writer created or "
                           "replaced the object first");
}

static int s3_do(ckptio__s3 *s, s3_call *c, ckptio__msg *msg);

/* Whether the upload `c` works on is gone (aborted, or completed by an earlier try whose answer
 * was lost), asked once with ListParts when the store answered `c` with a 5xx: no retry of `c`
 * can then pass. A store may answer an upload that vanished so (rather than 404 NoSuchUpload):
 * without this question the call would be retried until CKPTIO_S3_TIMEOUT. When it is gone, `c`
 * reads as answered 404 NoSuchUpload. */
static int upload_gone(ckptio__http *h, ckptio__http_call *hc)
{
    s3_call *c = hc->proto;
    if (!c->upload || hc->resp.status < 500) return 0;
    ckptio__kv q[2] = {{"uploadId", c->upload}, {"max-parts", "1"}};
    s3_call probe = {.h = {.what = "ListParts", .method = "GET", .bucket = hc->bucket,
                           .key = hc->key, .max = S3_XML_MAX, .once = true},
                     .query = q, .nq = 2};
    bool gone = s3_do(of_http(h), &probe, NULL) == CKPTIO_E_NOT_FOUND &&
                !strcmp(probe.h.resp.code, "NoSuchUpload");
    free(probe.h.out);
    if (!gone) return 0;
    hc->resp.status = 404;
    snprintf(hc->resp.code, sizeof hc->resp.code, "NoSuchUpload");
    return CKPTIO_E_NOT_FOUND;
}

static const ckptio__http_proto s3_proto = {
    .scheme = "s3",
    .env = "CKPTIO_S3",
    .endpoint_from = "AWS_ENDPOINT_URL",
    .ca_from = "the store setting ca_bundle, or AWS_CA_BUNDLE",
    .auth = s3_auth,
    .cred_put = s3_cred_put,
    .judge = s3_judge,
    .hint = s3_hint,
    .hopeless = upload_gone,
};

static int s3_do(ckptio__s3 *s, s3_call *c, ckptio__msg *msg)
{
    char *query = ckptio__uri_query(c->query, c->nq), *url = NULL;
    int rc = 0;
    c->uri = NULL;
    if (!query || build_target(s, c, query, &url) < 0) {
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    } else {
        snprintf(c->phash, sizeof c->phash, "UNSIGNED-PAYLOAD");
        if (c->sign_body) ckptio__s3_sha256_hex(c->h.body, c->h.body_len, c->phash);
        if (c->h.body_len && !strcmp(c->h.method, "POST")) c->h.content_type = "application/xml";
        c->h.url = url;
        c->h.proto = c;
        rc = ckptio__http_do(&s->http, &c->h, msg);
    }
    free(query);
    free(url);
    free(c->uri);
    return rc;
}

/* ---- the operations ---- */

static void resp_out(ckptio__obj_resp *out, const s3_call *c)
{
    if (out) *out = c->h.resp;
}

static int s3_put(ckptio__objc *oc, const char *bucket, const char *key, const void *buf,
                   uint64_t len, const char *cond, ckptio__obj_resp *resp, ckptio__msg *msg)
{
    char hdr[200] = "";
    if (cond && !strcmp(cond, "*")) snprintf(hdr, sizeof hdr, "If-None-Match: *");
    else if (cond) snprintf(hdr, sizeof hdr, "If-Match: %s", cond);
    s3_call call = {.h = {.what = "PUT", .method = "PUT", .bucket = bucket, .key = key, .extra = {hdr[0] ? hdr : NULL}, .body = buf, .body_len = len}};
    int rc = s3_do(of(oc), &call, msg);
    resp_out(resp, &call);
    return rc;
}

static int s3_get_all(ckptio__objc *oc, const char *bucket, const char *key, uint64_t max,
                      uint8_t **buf, uint64_t *len, ckptio__obj_resp *resp, ckptio__msg *msg)
{
    s3_call call = {.h = {.what = "GET", .method = "GET", .bucket = bucket, .key = key,
                          .max = max ? max : 1}};
    int rc = s3_do(of(oc), &call, msg);
    return ckptio__http_body(&call.h, rc, buf, len, resp, msg);
}

static int s3_get_range(ckptio__objc *oc, const char *bucket, const char *key, uint64_t off,
                        uint64_t len, void *buf, uint64_t *got, ckptio__msg *msg)
{
    char range[80];
    s3_call call = {.h = {.what = "GET (range)", .method = "GET", .bucket = bucket, .key = key}};
    *got = 0;
    if (!len) return 0;
    ckptio__http_range(&call.h, off, len, buf, range);
    int rc = s3_do(of(oc), &call, msg);
    return ckptio__http_range_got(oc->http, &call.h, rc, off, got, msg);
}

static int s3_head(ckptio__objc *oc, const char *bucket, const char *key, ckptio__obj_resp *resp,
                    ckptio__msg *msg)
{
    s3_call call = {.h = {.what = "HEAD", .method = "HEAD", .bucket = bucket, .key = key}};
    int rc = s3_do(of(oc), &call, msg);
    resp_out(resp, &call);
    return rc;
}

static int s3_delete(ckptio__objc *oc, const char *bucket, const char *key, ckptio__msg *msg)
{
    s3_call call = {.h = {.what = "DELETE", .method = "DELETE", .bucket = bucket, .key = key, .ok_404 = true}};
    return s3_do(of(oc), &call, msg);
}

static int s3_list(ckptio__objc *oc, const char *bucket, const char *prefix, ckptio__obj_list_cb cb,
                    void *ctx, ckptio__msg *msg)
{
    char token[1024] = "";
    for (;;) {
        ckptio__kv q[3] = {
            {"list-type", "2"}, {"prefix", prefix}, {"continuation-token", token}};
        s3_call call = {.h = {.what = "LIST", .method = "GET", .bucket = bucket, .max = S3_XML_MAX}, .query = q, .nq = token[0] ? 3u : 2u};
        CKPTIO__TRY(s3_do(of(oc), &call, msg));
        bool more = false;
        int rc = ckptio__s3_parse_list((char *)call.h.out, call.h.out_len, cb, ctx, &more, token,
                                       sizeof token);
        free(call.h.out);
        if (rc == CKPTIO_E_CORRUPT)
            return ckptio__fail(msg, rc, "s3://%s/%s: the listing from %s is not understood",
                                bucket, prefix, oc->http->endpoint);
        if (rc || !more) return rc;
        if (!token[0])
            return ckptio__fail(msg, CKPTIO_E_CORRUPT,
                                "s3://%s/%s: a truncated listing without a continuation token",
                                bucket, prefix);
    }
}

static int s3_list_uploads(ckptio__objc *oc, const char *bucket, const char *prefix,
                            ckptio__obj_uploads_cb cb, void *ctx, ckptio__msg *msg)
{
    char key_marker[1100] = "", id_marker[1100] = "";
    for (;;) {
        ckptio__kv q[4] = {{"uploads", ""}, {"prefix", prefix}, {"key-marker", key_marker},
                           {"upload-id-marker", id_marker}};
        unsigned nq = key_marker[0] ? (id_marker[0] ? 4u : 3u) : 2u;
        s3_call call = {.h = {.what = "LIST UPLOADS", .method = "GET", .bucket = bucket, .max = S3_XML_MAX}, .query = q, .nq = nq};
        CKPTIO__TRY(s3_do(of(oc), &call, msg));
        bool more = false;
        int rc = ckptio__s3_parse_uploads((char *)call.h.out, call.h.out_len, cb, ctx, &more,
                                          key_marker, id_marker, sizeof key_marker);
        free(call.h.out);
        if (rc == CKPTIO_E_CORRUPT)
            return ckptio__fail(msg, rc, "s3://%s/%s: the upload listing from %s is not understood",
                                bucket, prefix, oc->http->endpoint);
        if (rc || !more) return rc;
    }
}

static int s3_mpu_create(ckptio__objc *oc, const char *bucket, const char *key, char **upload_id,
                          ckptio__msg *msg)
{
    ckptio__kv q[1] = {{"uploads", ""}};
    s3_call call = {.h = {.what = "CreateMultipartUpload", .method = "POST", .bucket = bucket, .key = key, .max = 1u << 20}, .query = q, .nq = 1};
    *upload_id = NULL;
    CKPTIO__TRY(s3_do(of(oc), &call, msg));
    const char *vb, *ve;
    char id[1024];
    int rc = 0;
    if (!call.h.out || !ckptio__xml_next((char *)call.h.out, (char *)call.h.out + call.h.out_len,
                                       "UploadId", &vb, &ve) ||
        ckptio__xml_text(vb, ve, id, sizeof id) <= 0)
        rc = ckptio__fail(msg, CKPTIO_E_CORRUPT, "s3://%s/%s: %s answered a multipart upload's "
                          "creation without an UploadId", bucket, key, oc->http->endpoint);
    else if (!(*upload_id = strdup(id))) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    free(call.h.out);
    return rc;
}

static int s3_mpu_part(ckptio__objc *oc, const char *bucket, const char *key,
                        const char *upload_id, unsigned part, const void *buf, uint64_t len,
                        char etag[128], ckptio__msg *msg)
{
    char num[16];
    snprintf(num, sizeof num, "%u", part);
    ckptio__kv q[2] = {{"partNumber", num}, {"uploadId", upload_id}};
    s3_call call = {.h = {.what = "UploadPart", .method = "PUT", .bucket = bucket, .key = key, .body = buf, .body_len = len}, .query = q, .nq = 2, .upload = upload_id};
    CKPTIO__TRY(s3_do(of(oc), &call, msg));
    if (!call.h.resp.etag[0])
        return ckptio__fail(msg, CKPTIO_E_CORRUPT, "s3://%s/%s: part %u: %s sent no ETag",
                            bucket, key, part, oc->http->endpoint);
    memcpy(etag, call.h.resp.etag, 128);
    return 0;
}

static int s3_mpu_complete(ckptio__objc *oc, const char *bucket, const char *key,
                            const char *upload_id, char (*etags)[128], unsigned n,
                            ckptio__msg *msg)
{
    size_t cap = 128 + (size_t)n * 220, len = 0;
    char *xml = malloc(cap);
    if (!xml) return ckptio__fail(msg, -ENOMEM, "out of memory");
    len += (size_t)snprintf(xml + len, cap - len, "<CompleteMultipartUpload>");
    for (unsigned i = 0; i < n; i++) /* ETags are hex in quotes: nothing to escape but '"' */
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", i + 1,
                                etags[i]);
    len += (size_t)snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
    ckptio__kv q[1] = {{"uploadId", upload_id}};
    s3_call call = {.h = {.what = "CompleteMultipartUpload", .method = "POST", .bucket = bucket, .key = key, .body = xml, .body_len = len, .max = 1u << 20}, .query = q, .nq = 1, .sign_body = true, .upload = upload_id};
    int rc = s3_do(of(oc), &call, msg);
    /* A retry after an answer lost on the way finds the upload gone: it completed if the
     * object now carries the ETag these parts make. */
    char want[128];
    ckptio__obj_resp head;
    if (rc == CKPTIO_E_NOT_FOUND && !strcmp(call.h.resp.code, "NoSuchUpload") &&
        ckptio__s3_mpu_etag(etags, n, want) && s3_head(oc, bucket, key, &head, NULL) == 0 &&
        !strcmp(head.etag, want))
        rc = 0;
    free(call.h.out);
    free(xml);
    return rc;
}

static int s3_mpu_abort(ckptio__objc *oc, const char *bucket, const char *key,
                         const char *upload_id, ckptio__msg *msg)
{
    ckptio__kv q[1] = {{"uploadId", upload_id}};
    s3_call call = {.h = {.what = "AbortMultipartUpload", .method = "DELETE", .bucket = bucket, .key = key, .ok_404 = true}, .query = q, .nq = 1};
    return s3_do(of(oc), &call, msg);
}

const ckptio__objc_ops ckptio__s3_objc = {
    .scheme = "s3://",
    .name = "s3",
    .min_part = CKPTIO__S3_MIN_PART,
    .max_parts = CKPTIO__S3_MAX_PARTS,
    .client = ckptio__s3_client,
    .put = s3_put,
    .get_all = s3_get_all,
    .get_range = s3_get_range,
    .head = s3_head,
    .del = s3_delete,
    .list = s3_list,
    .list_uploads = s3_list_uploads,
    .mpu_create = s3_mpu_create,
    .mpu_part = s3_mpu_part,
    .mpu_complete = s3_mpu_complete,
    .mpu_abort = s3_mpu_abort,
};
