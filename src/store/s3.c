/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 client: one per distinct setting, kept-alive connections, signed requests retried to a
 * deadline. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../common/forksafe.h"
#include "aws_creds.h"
#include "s3_impl.h"

/* Most requests in flight at once from this process (CKPTIO_S3_CONNECTIONS): each holds one
 * connection; idle ones stay open for the next request. */
#define S3_CONNECTIONS 16u
#define S3_TIMEOUT_S 120.0
#define S3_STALL_S 20.0
/* A store that has never answered in this process (CKPTIO_S3_FIRST_TIMEOUT) fails this soon. */
#define S3_FIRST_S 10.0
#define S3_CONNECT_MS 5000L
#define S3_XML_MAX (64ull << 20)
#define S3_ERRBODY 4096

struct ckptio__s3 {
    ckptio__s3 *next;   /* the process's clients, one per distinct setting */
    char *key;          /* what it was made from (ckptio__aws_conf_key): the cache's key */
    char endpoint[512]; /* for messages */
    char scheme[8];
    char host[256]; /* a custom endpoint's host[:port]; else the AWS region's */
    bool custom;
    int style;      /* STYLE_*: how buckets are addressed */
    char *ca;       /* the CAs to trust (a PEM file), or NULL: the system's */
    ckptio__aws_creds *creds;
    const char *region;
    double timeout, stall, first;
    int answered; /* some request had an HTTP answer (atomic): the store is there */
    unsigned conns;
    pthread_mutex_t lock;
    pthread_cond_t freed;
    unsigned busy, nidle;
    CURL **idle;
};

enum { STYLE_AUTO, STYLE_PATH, STYLE_VIRTUAL };

bool ckptio__s3_is_url(const char *path)
{
    return path && !strncmp(path, "s3://", 5);
}

int ckptio__s3_parse(const char *url, char **bucket, char **key, ckptio__msg *msg)
{
    *bucket = *key = NULL;
    if (!ckptio__s3_is_url(url))
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' is not an s3:// URL", url ? url : "(null)");
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    if (bl < 1 || bl > 255)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' names no bucket: write s3://bucket/key",
                            url);
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
        return ckptio__fail(msg, CKPTIO_E_USAGE, "'%s' names no key: write s3://bucket/key", url);
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

/* ---- the client ---- */

static double seconds(const char *v, double def)
{
    char *end;
    double d = v && *v ? strtod(v, &end) : 0;
    return v && *v && !*end && d > 0 && d < 1e6 ? d : def;
}

static pthread_mutex_t client_lock = PTHREAD_MUTEX_INITIALIZER;
static ckptio__s3 *clients;

/* A forked child shares its parent's sockets: it forgets the idle connections (closing them
 * could end the parent's TLS sessions) and the locks another thread may have held. It runs on
 * the engine's one atfork list (common/forksafe.h), which holds client_lock across the fork,
 * so the list is never copied half made. */
static void after_fork_child(void *unused)
{
    (void)unused;
    for (ckptio__s3 *c = clients; c; c = c->next) {
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->freed, NULL);
        c->busy = c->nidle = 0;
        ckptio__aws_creds_after_fork(c->creds);
    }
}

static ckptio__forksafe client_fork = {&client_lock, after_fork_child, NULL, NULL};

static CURLcode global_rc = CURLE_FAILED_INIT;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    ckptio__forksafe_add(&client_fork);
}

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
        snprintf(s->endpoint, sizeof s->endpoint, "https://%s", s->host);
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
    snprintf(s->endpoint, sizeof s->endpoint, "%s", ep);
    s->custom = true;
    return 0;
}

static void client_free(ckptio__s3 *s)
{
    ckptio__aws_conf_wipe_key(s->key);
    free(s->ca);
    free(s->idle);
    ckptio__aws_creds_free(s->creds);
    free(s);
}

static int client_new(ckptio__s3 **out, const ckptio__aws_conf *conf, char *key, ckptio__msg *msg)
{
    ckptio__s3 *s = calloc(1, sizeof *s);
    if (!s) return ckptio__fail(msg, -ENOMEM, "out of memory creating the S3 client");
    s->key = key;
    char v[1024];
    int rc = 0;
    const char *ca = conf->v[CKPTIO__AWS_CA], *style = conf->v[CKPTIO__AWS_ADDRESSING];
    s->timeout = seconds(conf->v[CKPTIO__AWS_TIMEOUT], S3_TIMEOUT_S);
    s->stall = seconds(conf->v[CKPTIO__AWS_STALL], S3_STALL_S);
    s->first = CKPTIO__MIN(s->timeout, seconds(conf->v[CKPTIO__AWS_FIRST_TIMEOUT], S3_FIRST_S));
    double conns = seconds(conf->v[CKPTIO__AWS_CONNS], S3_CONNECTIONS);
    s->conns = conns >= 1 && conns <= 1024 ? (unsigned)conns : S3_CONNECTIONS;
    s->idle = calloc(s->conns, sizeof *s->idle);
    CKPTIO__GOTO_IF(!s->idle, ckptio__fail(msg, -ENOMEM, "out of memory"));
    CKPTIO__CHECK(ckptio__aws_creds_new(&s->creds, conf, msg));
    s->region = ckptio__aws_creds_region(s->creds);
    CKPTIO__CHECK(set_endpoint(s, conf, msg));
    if (!ca && ckptio__aws_profile_value(s->creds, "ca_bundle", NULL, v, sizeof v) == 1) ca = v;
    CKPTIO__GOTO_IF(ca && !(s->ca = strdup(ca)), ckptio__fail(msg, -ENOMEM, "out of memory"));
    char st[16];
    if (!style && ckptio__aws_profile_value(s->creds, "s3", "addressing_style", st, sizeof st) == 1)
        style = st;
    s->style = !style || !strcmp(style, "auto") ? STYLE_AUTO : !strcmp(style, "path") ? STYLE_PATH
               : !strcmp(style, "virtual")                  ? STYLE_VIRTUAL
                                                            : -1;
    CKPTIO__GOTO_IF(s->style < 0, ckptio__fail(msg, CKPTIO_E_USAGE,
                                               "addressing_style '%s' is none of auto, path, "
                                               "virtual", style));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->freed, NULL);
    *out = s;
    return 0;
out:
    s->key = NULL; /* the caller's still */
    client_free(s);
    return rc;
}

int ckptio__s3_client(ckptio__s3 **out, const ckptio_store_opts *o, ckptio__msg *msg)
{
    *out = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return ckptio__fail(msg, -EIO, "libcurl failed to initialize: %s",
                            curl_easy_strerror(global_rc));
    ckptio__aws_conf conf = {0};
    char *key = NULL;
    int rc = ckptio__aws_conf_read(&conf, o, msg);
    if (rc == 0 && !(key = ckptio__aws_conf_key(&conf)))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    if (rc == 0) {
        pthread_mutex_lock(&client_lock);
        ckptio__s3 *c = clients;
        while (c && strcmp(c->key, key)) c = c->next;
        if (!c && (rc = client_new(&c, &conf, key, msg)) == 0) { /* a failure is tried again */
            c->next = clients;
            clients = c;
            key = NULL; /* the client's now */
        }
        *out = c;
        pthread_mutex_unlock(&client_lock);
    }
    ckptio__aws_conf_wipe_key(key);
    ckptio__aws_conf_free(&conf);
    return rc;
}

const char *ckptio__s3_endpoint(const ckptio__s3 *c)
{
    return c ? c->endpoint : "";
}

unsigned ckptio__s3_connections(const ckptio__s3 *c)
{
    return c->conns;
}

/* A connection: waits while CKPTIO_S3_CONNECTIONS requests are in flight. NULL: no memory. */
static CURL *conn_take(ckptio__s3 *s)
{
    pthread_mutex_lock(&s->lock);
    while (s->busy >= s->conns) pthread_cond_wait(&s->freed, &s->lock);
    s->busy++;
    CURL *h = s->nidle ? s->idle[--s->nidle] : NULL;
    pthread_mutex_unlock(&s->lock);
    if (!h) h = curl_easy_init();
    return h;
}

/* A connection that saw a network error is closed rather than reused. */
static void conn_give(ckptio__s3 *s, CURL *h, bool broken)
{
    pthread_mutex_lock(&s->lock);
    s->busy--;
    if (h && !broken && s->nidle < s->conns) {
        s->idle[s->nidle++] = h;
        h = NULL;
    }
    pthread_cond_signal(&s->freed);
    pthread_mutex_unlock(&s->lock);
    if (h) curl_easy_cleanup(h);
}

/* ---- one request ---- */

typedef struct s3_call {
    const char *what; /* "PUT", "GET"... for messages */
    const char *method, *bucket, *key; /* key NULL: the bucket itself */
    const ckptio__s3_kv *query;
    unsigned nq;
    const char *extra[3]; /* unsigned headers ("Range: bytes=0-9", "If-Match: ...") */
    const void *body;
    uint64_t body_len;
    bool sign_body, ok_404, ok_416;
    bool once;          /* no retries (a probe made between another call's tries) */
    const char *upload; /* the multipart upload this call works on: see upload_gone */
    void *dst; /* ranged GET: the body goes here, at most dst_cap bytes */
    uint64_t dst_cap;
    uint64_t max; /* else, when nonzero, into a malloc'd buffer (out, out_len) of at most max */
    uint8_t *out;
    uint64_t out_len;
    ckptio__s3_resp resp;
} s3_call;

typedef struct xfer {
    s3_call *c;
    uint64_t up_pos, out_cap;
    int abort_rc; /* set by a callback that stopped the transfer */
    char errbody[S3_ERRBODY];
    size_t errlen;
} xfer;

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    ckptio__s3_header(p, size * n, &x->c->resp, !x->c->dst);
    return size * n;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    s3_call *c = x->c;
    size_t len = size * n;
    if (c->resp.status < 200 || c->resp.status >= 300) { /* an error's XML: keep its start */
        size_t k = CKPTIO__MIN(len, sizeof x->errbody - 1 - x->errlen);
        memcpy(x->errbody + x->errlen, p, k);
        x->errlen += k;
        x->errbody[x->errlen] = 0;
        return len;
    }
    if (c->dst) {
        if (len > c->dst_cap - c->resp.size) {
            x->abort_rc = -EPROTO;
            return 0;
        }
        memcpy((uint8_t *)c->dst + c->resp.size, p, len);
        c->resp.size += len;
        return len;
    }
    if (!c->max) return len;
    if (len > c->max - c->out_len) {
        x->abort_rc = CKPTIO_E_LIMIT;
        return 0;
    }
    if (c->out_len + len + 1 > x->out_cap) {
        uint64_t cap = x->out_cap ? x->out_cap : 16384;
        while (cap < c->out_len + len + 1) cap *= 2;
        uint8_t *o = realloc(c->out, cap);
        if (!o) {
            x->abort_rc = -ENOMEM;
            return 0;
        }
        c->out = o;
        x->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, len);
    c->out_len += len;
    c->out[c->out_len] = 0; /* XML is scanned as a string */
    return len;
}

static size_t on_read(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    size_t k = (size_t)CKPTIO__MIN((uint64_t)(size * n), x->c->body_len - x->up_pos);
    memcpy(p, (const uint8_t *)x->c->body + x->up_pos, k);
    x->up_pos += k;
    return k;
}

static int on_seek(void *arg, curl_off_t off, int origin)
{
    xfer *x = arg;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->c->body_len) return CURL_SEEKFUNC_FAIL;
    x->up_pos = (uint64_t)off;
    return CURL_SEEKFUNC_OK;
}

/* The URL and the canonical URI: as addressing_style says; auto is path-style for a custom
 * endpoint and for bucket names with dots (their virtual host would not match AWS's
 * certificate), else virtual-host style. */
static int build_target(ckptio__s3 *s, s3_call *c, const char *query, char **url, char **uri,
                        char *host, size_t hcap)
{
    char *ekey = ckptio__s3_uri_encode(c->key ? c->key : "", true);
    if (!ekey) return -ENOMEM;
    bool path_style = s->style == STYLE_PATH ||
                      (s->style == STYLE_AUTO && (s->custom || strchr(c->bucket, '.')));
    size_t n = strlen(ekey) + strlen(c->bucket) + 4;
    *uri = malloc(n);
    if (*uri) {
        if (path_style) snprintf(*uri, n, c->key ? "/%s/%s" : "/%s", c->bucket, ekey);
        else snprintf(*uri, n, "/%s", ekey);
    }
    if (path_style) snprintf(host, hcap, "%s", s->host);
    else snprintf(host, hcap, "%s.%s", c->bucket, s->host);
    free(ekey);
    if (!*uri) return -ENOMEM;
    size_t ul = strlen(s->scheme) + strlen(host) + strlen(*uri) + strlen(query) + 8;
    *url = malloc(ul);
    if (!*url) return -ENOMEM;
    snprintf(*url, ul, "%s://%s%s%s%s", s->scheme, host, *uri, *query ? "?" : "", query);
    return 0;
}

/* One try: 0 when a response came (its status in c->resp), else the transfer's error. */
static int try_once(ckptio__s3 *s, CURL *h, s3_call *c, xfer *x, const char *url,
                    const char *uri, const char *host, const char *phash, double left,
                    const ckptio__aws_key *k, CURLcode *cc, char *cerr)
{
    char date[20], auth[CKPTIO__S3_AUTH_MAX];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm);
    ckptio__s3_kv hs[4] = {{"host", host}, {"x-amz-content-sha256", phash}, {"x-amz-date", date},
                           {"x-amz-security-token", k->token}};
    ckptio__s3_sig_in in = {c->method, uri, c->query, c->nq, hs, k->token ? 4u : 3u, phash,
                            date, s->region, k->id, k->secret, NULL};
    int rc = ckptio__s3_sign(&in, auth);
    if (rc < 0) return rc;

    struct curl_slist *hl = NULL, *t;
    char line[CKPTIO__S3_AUTH_MAX + 64];
#define ADD_HEADER(...)                                                                       \
    do {                                                                                       \
        snprintf(line, sizeof line, __VA_ARGS__);                                              \
        t = curl_slist_append(hl, line);                                                       \
        if (!t) goto nomem;                                                                    \
        hl = t;                                                                                \
    } while (0)
    ADD_HEADER("Host: %s", host);
    ADD_HEADER("x-amz-content-sha256: %s", phash);
    ADD_HEADER("x-amz-date: %s", date);
    ADD_HEADER("Authorization: %s", auth);
    if (k->token) {
        /* A session token may be longer than a line of the others: a header of its own. */
        char *tl;
        if (asprintf(&tl, "x-amz-security-token: %s", k->token) < 0) goto nomem;
        t = curl_slist_append(hl, tl);
        free(tl);
        if (!t) goto nomem;
        hl = t;
    }
    for (unsigned i = 0; i < 3 && c->extra[i]; i++) ADD_HEADER("%s", c->extra[i]);
    ADD_HEADER("Expect:"); /* no 100-continue round trip before each part */
    ADD_HEADER(c->body_len && !strcmp(c->method, "POST") ? "Content-Type: application/xml"
                                                         : "Content-Type:");
#undef ADD_HEADER

    curl_easy_reset(h); /* keeps the connection: reused when the next URL allows */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, S3_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(left * 1000) + 1);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(s->stall + 0.999));
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L << 10);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 256L << 10);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (s->ca) curl_easy_setopt(h, CURLOPT_CAINFO, s->ca);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    if (!strcmp(c->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(c->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)c->body_len);
    } else if (!strcmp(c->method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body ? (const char *)c->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body_len);
    } else if (strcmp(c->method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
    }
    cerr[0] = 0;
    *cc = curl_easy_perform(h);
    /* The handle outlives this call in the cache: leave it no pointer into this frame. */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hl);
    return 0;
nomem:
    curl_slist_free_all(hl);
    return -ENOMEM;
}

/* A certificate this client does not trust (or a CA file it cannot use): never retried. */
static bool tls_failure(CURLcode cc)
{
    return cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
           cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_ISSUER_ERROR;
}

/* The store's word for credentials that have expired: the source is asked for newer ones. */
static bool expired_code(const char *code)
{
    return !strcmp(code, "ExpiredToken") || !strcmp(code, "TokenRefreshRequired") ||
           !strcmp(code, "ExpiredTokenException");
}

/* Connection failures that may pass, as -errno; 0 for one that will not. */
static int net_errno(CURLcode cc)
{
    switch (cc) {
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST: return -EHOSTUNREACH;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR: return -ECONNRESET;
    case CURLE_PARTIAL_FILE: return -EPIPE;
    default: return 0;
    }
}

static bool retry_code(const char *code)
{
    return !strcmp(code, "SlowDown") || !strcmp(code, "RequestTimeout") ||
           !strcmp(code, "InternalError") || !strcmp(code, "ServiceUnavailable") ||
           !strcmp(code, "ConditionalRequestConflict");
}

static double backoff(unsigned attempt)
{
    static _Thread_local uint64_t seed;
    if (!seed) seed = (uint64_t)time(NULL) ^ (uint64_t)pthread_self() ^ 0x9E3779B97F4A7C15ull;
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    double cap = attempt < 6 ? 0.1 * (double)(1u << attempt) : 5.0;
    if (cap > 5.0) cap = 5.0;
    return cap * (double)(seed >> 11) / 9007199254740992.0; /* full jitter */
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* What to do about an HTTP status: 0 success, else the code; *retry if it may pass. */
static int status_rc(s3_call *c, bool *retry)
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

static int call_fail(ckptio__s3 *s, s3_call *c, ckptio__msg *msg, int rc, CURLcode cc,
                     const char *cerr, unsigned tries, double spent)
{
    char where[1400], retried[160] = "";
    snprintf(where, sizeof where, "s3://%s%s%s: %s", c->bucket, c->key ? "/" : "",
             c->key ? c->key : "", c->what);
    bool never = !__atomic_load_n(&s->answered, __ATOMIC_ACQUIRE);
    if (tries > 1)
        snprintf(retried, sizeof retried,
                 " (gave up after %u tries in %.1f s; %s=%g s bounds the retries%s)", tries,
                 spent, never ? "CKPTIO_S3_FIRST_TIMEOUT" : "CKPTIO_S3_TIMEOUT",
                 never ? s->first : s->timeout,
                 never ? " while the store has never answered this process" : "");
    if (tls_failure(cc))
        return ckptio__fail(msg, -EACCES,
                            "%s failed: %s presented a certificate this client does not trust: "
                            "%s: give the CA that signed it (the store setting ca_bundle, or "
                            "AWS_CA_BUNDLE), or fix the endpoint",
                            where, s->endpoint, cerr[0] ? cerr : curl_easy_strerror(cc));
    if (cc != CURLE_OK)
        return ckptio__fail(msg, rc,
                            "%s failed: cannot reach %s: %s%s: check AWS_ENDPOINT_URL and that "
                            "the store is up and reachable%s",
                            where, s->endpoint, cerr[0] ? cerr : curl_easy_strerror(cc),
                            cc == CURLE_OPERATION_TIMEDOUT ? " (no answer, or no byte moving for "
                                                             "CKPTIO_S3_STALL seconds)"
                                                           : "",
                            retried);
    const char *hint = "";
    char source[300];
    if (rc == -EACCES) {
        snprintf(source, sizeof source,
                 ": the store refused the credentials (from %s) or the access: check them, "
                 "the region and the bucket's policy",
                 ckptio__aws_creds_source(s->creds));
        hint = source;
    } else if (expired_code(c->resp.code)) {
        snprintf(source, sizeof source,
                 ": the credentials (from %s) have expired and their source gave no newer ones",
                 ckptio__aws_creds_source(s->creds));
        hint = source;
    }
    else if (rc == -ENOENT)
        hint = ": the bucket does not exist: create it or fix the URL";
    else if (c->resp.status == 301 || !strcmp(c->resp.code, "AuthorizationHeaderMalformed"))
        hint = ": the bucket is in another region: set AWS_REGION to it";
    else if (rc == CKPTIO_E_NOT_FOUND && !strcmp(c->resp.code, "NoSuchUpload"))
        hint = ": the multipart upload is gone (another client aborted it)";
    else if (rc == CKPTIO_E_NOT_FOUND) hint = ": no such object";
    else if (rc == CKPTIO_E_EXISTS)
        hint = ": the conditional write was refused: another writer created or replaced the "
               "object first";
    else if (rc == -EAGAIN) {
        rc = -ETIMEDOUT;
        hint = ": the store kept failing: retry later, or raise CKPTIO_S3_TIMEOUT";
    }
    return ckptio__fail(msg, rc, "%s failed: HTTP %ld%s%s at %s%s%s", where, c->resp.status,
                        c->resp.code[0] ? " " : "", c->resp.code, s->endpoint, hint, retried);
}

static int s3_do(ckptio__s3 *s, s3_call *c, ckptio__msg *msg);

/* Whether the upload `c` works on is gone (aborted, or completed by an earlier try whose answer
 * was lost), asked once with ListParts when the store answered `c` with a 5xx: no retry of `c`
 * can then pass. A store may answer an upload that vanished so (rather than 404 NoSuchUpload):
 * without this question the call would be retried until CKPTIO_S3_TIMEOUT. When it is gone, `c`
 * reads as answered 404 NoSuchUpload. */
static bool upload_gone(ckptio__s3 *s, s3_call *c)
{
    ckptio__s3_kv q[2] = {{"uploadId", c->upload}, {"max-parts", "1"}};
    s3_call probe = {.what = "ListParts", .method = "GET", .bucket = c->bucket, .key = c->key,
                     .query = q, .nq = 2, .max = S3_XML_MAX, .once = true};
    bool gone = s3_do(s, &probe, NULL) == CKPTIO_E_NOT_FOUND &&
                !strcmp(probe.resp.code, "NoSuchUpload");
    free(probe.out);
    if (gone) {
        c->resp.status = 404;
        snprintf(c->resp.code, sizeof c->resp.code, "NoSuchUpload");
    }
    return gone;
}

static int s3_do(ckptio__s3 *s, s3_call *c, ckptio__msg *msg)
{
    char phash[65] = "UNSIGNED-PAYLOAD", host[600], cerr[CURL_ERROR_SIZE];
    char *query = ckptio__s3_query(c->query, c->nq), *url = NULL, *uri = NULL;
    int rc = 0;
    CKPTIO__GOTO_IF(!query, ckptio__fail(msg, -ENOMEM, "out of memory"));
    CKPTIO__GOTO_IF(build_target(s, c, query, &url, &uri, host, sizeof host) < 0,
                    ckptio__fail(msg, -ENOMEM, "out of memory"));
    if (c->sign_body) ckptio__s3_sha256_hex(c->body, c->body_len, phash);
    double t0 = ckptio__now();
    unsigned renewed = 0; /* credentials the store called expired, replaced */
    for (unsigned attempt = 0;; attempt++) {
        /* The deadline: the full one once the store has answered this process; else a short
         * one, so a typo in the endpoint or a store that is down fails in seconds. */
        double limit = __atomic_load_n(&s->answered, __ATOMIC_ACQUIRE) ? s->timeout : s->first;
        ckptio__aws_key *k = NULL;
        ckptio__msg cm = {0};
        int crc = ckptio__aws_creds_get(s->creds, &k, &cm);
        CKPTIO__GOTO_IF(crc < 0, ckptio__fail(msg, crc, "s3://%s/%s: %s: %s", c->bucket,
                                              c->key ? c->key : "", c->what, cm.text));
        xfer *x = calloc(1, sizeof *x);
        if (!x) ckptio__aws_key_put(k);
        CKPTIO__GOTO_IF(!x, ckptio__fail(msg, -ENOMEM, "out of memory"));
        x->c = c;
        memset(&c->resp, 0, sizeof c->resp);
        c->out_len = 0;
        free(c->out);
        c->out = NULL; /* a retry starts over: same buffer for a ranged GET, a fresh one else */
        CURL *h = conn_take(s);
        CURLcode cc = CURLE_OK;
        int trc = h ? try_once(s, h, c, x, url, uri, host, phash, limit - (ckptio__now() - t0), k,
                               &cc, cerr)
                    : -ENOMEM;
        conn_give(s, h, trc < 0 || cc != CURLE_OK);
        bool retry = false;
        if (trc < 0) {
            rc = ckptio__fail(msg, trc, "s3://%s/%s: %s: cannot build the request", c->bucket,
                              c->key ? c->key : "", c->what);
        } else if (x->abort_rc) {
            char text[160] = "the store sent more bytes than asked for";
            if (x->abort_rc == CKPTIO_E_LIMIT)
                snprintf(text, sizeof text, "the answer is larger than the bound of %llu bytes",
                         (unsigned long long)c->max);
            else if (x->abort_rc == -ENOMEM)
                snprintf(text, sizeof text, "out of memory for the answer");
            rc = ckptio__fail(msg, x->abort_rc, "s3://%s/%s: %s: %s", c->bucket,
                              c->key ? c->key : "", c->what, text);
        } else if (cc != CURLE_OK) {
            rc = net_errno(cc);
            retry = rc != 0;
            if (!rc) rc = -EIO;
        } else {
            ckptio__s3_parse_error(x->errbody, x->errlen, c->resp.code, sizeof c->resp.code);
            /* CompleteMultipartUpload may fail after its 200 has been sent: the body says. */
            if (c->resp.status == 200 && c->out && !strcmp(c->method, "POST"))
                ckptio__s3_parse_error((char *)c->out, c->out_len, c->resp.code,
                                       sizeof c->resp.code);
            if (c->resp.code[0] && c->resp.status == 200)
                c->resp.status = retry_code(c->resp.code) ? 500 : 400;
            rc = status_rc(c, &retry);
            __atomic_store_n(&s->answered, 1, __ATOMIC_RELEASE);
            /* Temporary credentials the store calls expired: ask their source again, at once.
             * A HEAD's answer has no body to say so: its 400 is taken as that once. */
            bool expired = expired_code(c->resp.code) ||
                           (!c->resp.code[0] && c->resp.status == 400 && !strcmp(c->method, "HEAD") &&
                            !renewed && k->expires);
            if (rc < 0 && expired && renewed < 3 &&
                ckptio__aws_creds_expired(s->creds, k)) {
                renewed++;
                ckptio__aws_key_put(k);
                free(x);
                continue;
            }
        }
        ckptio__aws_key_put(k);
        bool told = trc < 0 || x->abort_rc; /* those failures carry their message already */
        free(x);
        if (rc == 0 || told) goto out;
        if (!retry || c->once) {
            rc = call_fail(s, c, msg, rc, cc, cerr, attempt + 1, ckptio__now() - t0);
            goto out;
        }
        if (c->upload && c->resp.status >= 500 && upload_gone(s, c)) {
            rc = call_fail(s, c, msg, CKPTIO_E_NOT_FOUND, CURLE_OK, cerr, attempt + 1,
                           ckptio__now() - t0);
            goto out;
        }
        double spent = ckptio__now() - t0, wait = backoff(attempt);
        limit = __atomic_load_n(&s->answered, __ATOMIC_ACQUIRE) ? s->timeout : s->first;
        if (spent + wait >= limit) {
            rc = call_fail(s, c, msg, rc, cc, cerr, attempt + 1, spent);
            goto out;
        }
        sleep_s(wait);
    }
out:
    free(query);
    free(url);
    free(uri);
    if (rc < 0) {
        free(c->out);
        c->out = NULL;
    }
    return rc;
}

/* ---- the operations ---- */

static void resp_out(ckptio__s3_resp *out, const s3_call *c)
{
    if (out) *out = c->resp;
}

int ckptio__s3_put(ckptio__s3 *c, const char *bucket, const char *key, const void *buf,
                   uint64_t len, const char *cond, ckptio__s3_resp *resp, ckptio__msg *msg)
{
    char hdr[200] = "";
    if (cond && !strcmp(cond, "*")) snprintf(hdr, sizeof hdr, "If-None-Match: *");
    else if (cond) snprintf(hdr, sizeof hdr, "If-Match: %s", cond);
    s3_call call = {.what = "PUT", .method = "PUT", .bucket = bucket, .key = key,
                    .extra = {hdr[0] ? hdr : NULL}, .body = buf, .body_len = len};
    int rc = s3_do(c, &call, msg);
    resp_out(resp, &call);
    return rc;
}

int ckptio__s3_get_all(ckptio__s3 *c, const char *bucket, const char *key, uint64_t max,
                       uint8_t **buf, uint64_t *len, ckptio__s3_resp *resp, ckptio__msg *msg)
{
    s3_call call = {.what = "GET", .method = "GET", .bucket = bucket, .key = key,
                    .max = max ? max : 1};
    *buf = NULL;
    *len = 0;
    int rc = s3_do(c, &call, msg);
    if (rc == 0 && !call.out) { /* an empty object */
        call.out = malloc(1);
        if (!call.out) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    if (rc == 0) {
        *buf = call.out;
        *len = call.out_len;
        call.resp.size = call.out_len;
    }
    resp_out(resp, &call);
    return rc;
}

int ckptio__s3_get_range(ckptio__s3 *c, const char *bucket, const char *key, uint64_t off,
                         uint64_t len, void *buf, uint64_t *got, ckptio__msg *msg)
{
    *got = 0;
    if (!len) return 0;
    char range[80];
    snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    s3_call call = {.what = "GET (range)", .method = "GET", .bucket = bucket, .key = key,
                    .extra = {range}, .ok_416 = true, .dst = buf, .dst_cap = len};
    int rc = s3_do(c, &call, msg);
    if (rc == 0 && call.resp.status == 200 && off > 0) /* the Range was ignored */
        return ckptio__fail(msg, -EPROTO, "s3://%s/%s: the store at %s ignored a Range request",
                            bucket, key, c->endpoint);
    if (rc == 0) *got = call.resp.status == 416 ? 0 : call.resp.size;
    return rc;
}

int ckptio__s3_head(ckptio__s3 *c, const char *bucket, const char *key, ckptio__s3_resp *resp,
                    ckptio__msg *msg)
{
    s3_call call = {.what = "HEAD", .method = "HEAD", .bucket = bucket, .key = key};
    int rc = s3_do(c, &call, msg);
    resp_out(resp, &call);
    return rc;
}

int ckptio__s3_delete(ckptio__s3 *c, const char *bucket, const char *key, ckptio__msg *msg)
{
    s3_call call = {.what = "DELETE", .method = "DELETE", .bucket = bucket, .key = key,
                    .ok_404 = true};
    return s3_do(c, &call, msg);
}

int ckptio__s3_list(ckptio__s3 *c, const char *bucket, const char *prefix, ckptio__s3_list_cb cb,
                    void *ctx, ckptio__msg *msg)
{
    char token[1024] = "";
    for (;;) {
        ckptio__s3_kv q[3] = {
            {"list-type", "2"}, {"prefix", prefix}, {"continuation-token", token}};
        s3_call call = {.what = "LIST", .method = "GET", .bucket = bucket, .query = q,
                        .nq = token[0] ? 3u : 2u, .max = S3_XML_MAX};
        CKPTIO__TRY(s3_do(c, &call, msg));
        bool more = false;
        int rc = ckptio__s3_parse_list((char *)call.out, call.out_len, cb, ctx, &more, token,
                                       sizeof token);
        free(call.out);
        if (rc == CKPTIO_E_CORRUPT)
            return ckptio__fail(msg, rc, "s3://%s/%s: the listing from %s is not understood",
                                bucket, prefix, c->endpoint);
        if (rc || !more) return rc;
        if (!token[0])
            return ckptio__fail(msg, CKPTIO_E_CORRUPT,
                                "s3://%s/%s: a truncated listing without a continuation token",
                                bucket, prefix);
    }
}

int ckptio__s3_list_uploads(ckptio__s3 *c, const char *bucket, const char *prefix,
                            ckptio__s3_uploads_cb cb, void *ctx, ckptio__msg *msg)
{
    char key_marker[1100] = "", id_marker[1100] = "";
    for (;;) {
        ckptio__s3_kv q[4] = {{"uploads", ""}, {"prefix", prefix}, {"key-marker", key_marker},
                              {"upload-id-marker", id_marker}};
        unsigned nq = key_marker[0] ? (id_marker[0] ? 4u : 3u) : 2u;
        s3_call call = {.what = "LIST UPLOADS", .method = "GET", .bucket = bucket, .query = q,
                        .nq = nq, .max = S3_XML_MAX};
        CKPTIO__TRY(s3_do(c, &call, msg));
        bool more = false;
        int rc = ckptio__s3_parse_uploads((char *)call.out, call.out_len, cb, ctx, &more,
                                          key_marker, id_marker, sizeof key_marker);
        free(call.out);
        if (rc == CKPTIO_E_CORRUPT)
            return ckptio__fail(msg, rc, "s3://%s/%s: the upload listing from %s is not understood",
                                bucket, prefix, c->endpoint);
        if (rc || !more) return rc;
    }
}

int ckptio__s3_mpu_create(ckptio__s3 *c, const char *bucket, const char *key, char **upload_id,
                          ckptio__msg *msg)
{
    ckptio__s3_kv q[1] = {{"uploads", ""}};
    s3_call call = {.what = "CreateMultipartUpload", .method = "POST", .bucket = bucket,
                    .key = key, .query = q, .nq = 1, .max = 1u << 20};
    *upload_id = NULL;
    CKPTIO__TRY(s3_do(c, &call, msg));
    const char *vb, *ve;
    char id[1024];
    int rc = 0;
    if (!call.out || !ckptio__xml_next((char *)call.out, (char *)call.out + call.out_len,
                                       "UploadId", &vb, &ve) ||
        ckptio__xml_text(vb, ve, id, sizeof id) <= 0)
        rc = ckptio__fail(msg, CKPTIO_E_CORRUPT, "s3://%s/%s: %s answered a multipart upload's "
                          "creation without an UploadId", bucket, key, c->endpoint);
    else if (!(*upload_id = strdup(id))) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    free(call.out);
    return rc;
}

int ckptio__s3_mpu_part(ckptio__s3 *c, const char *bucket, const char *key,
                        const char *upload_id, unsigned part, const void *buf, uint64_t len,
                        char etag[128], ckptio__msg *msg)
{
    char num[16];
    snprintf(num, sizeof num, "%u", part);
    ckptio__s3_kv q[2] = {{"partNumber", num}, {"uploadId", upload_id}};
    s3_call call = {.what = "UploadPart", .method = "PUT", .bucket = bucket, .key = key,
                    .query = q, .nq = 2, .body = buf, .body_len = len, .upload = upload_id};
    CKPTIO__TRY(s3_do(c, &call, msg));
    if (!call.resp.etag[0])
        return ckptio__fail(msg, CKPTIO_E_CORRUPT, "s3://%s/%s: part %u: %s sent no ETag",
                            bucket, key, part, c->endpoint);
    memcpy(etag, call.resp.etag, 128);
    return 0;
}

int ckptio__s3_mpu_complete(ckptio__s3 *c, const char *bucket, const char *key,
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
    ckptio__s3_kv q[1] = {{"uploadId", upload_id}};
    s3_call call = {.what = "CompleteMultipartUpload", .method = "POST", .bucket = bucket,
                    .key = key, .query = q, .nq = 1, .body = xml, .body_len = len,
                    .sign_body = true, .max = 1u << 20, .upload = upload_id};
    int rc = s3_do(c, &call, msg);
    /* A retry after an answer lost on the way finds the upload gone: it completed if the
     * object now carries the ETag these parts make. */
    char want[128];
    ckptio__s3_resp head;
    if (rc == CKPTIO_E_NOT_FOUND && !strcmp(call.resp.code, "NoSuchUpload") &&
        ckptio__s3_mpu_etag(etags, n, want) && ckptio__s3_head(c, bucket, key, &head, NULL) == 0 &&
        !strcmp(head.etag, want))
        rc = 0;
    free(call.out);
    free(xml);
    return rc;
}

int ckptio__s3_mpu_abort(ckptio__s3 *c, const char *bucket, const char *key,
                         const char *upload_id, ckptio__msg *msg)
{
    ckptio__s3_kv q[1] = {{"uploadId", upload_id}};
    s3_call call = {.what = "AbortMultipartUpload", .method = "DELETE", .bucket = bucket,
                    .key = key, .query = q, .nq = 1, .ok_404 = true};
    return s3_do(c, &call, msg);
}
