/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP for the object stores' clients: kept-alive connections, requests retried to a deadline. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>

#include "http.h"

#define TIMEOUT_S 120.0
#define STALL_S 20.0
/* A store that has never answered in this process fails this soon. */
#define FIRST_S 10.0
#define CONNECTIONS 16u
#define CONNECT_MS 5000L
#define ERRBODY 4096

static CURLcode global_rc = CURLE_FAILED_INIT;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* In a forked child, with cs->lock held by the atfork list: every client as new. */
static void clients_child(void *obj)
{
    ckptio__http_clients *cs = obj;
    for (ckptio__http *h = cs->list; h; h = h->next) {
        pthread_mutex_init(&h->lock, NULL);
        pthread_cond_init(&h->freed, NULL);
        h->busy = h->nidle = 0;
        if (cs->child) cs->child(h);
    }
}

int ckptio__http_client(ckptio__http_clients *cs, char **key,
                        int (*make)(void *arg, char *key, ckptio__http **out, ckptio__msg *msg),
                        void *arg, ckptio__http **out, ckptio__msg *msg)
{
    *out = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return ckptio__fail(msg, -EIO, "libcurl failed to initialize: %s",
                            curl_easy_strerror(global_rc));
    if (!__atomic_load_n(&cs->listed, __ATOMIC_ACQUIRE)) {
        /* The atfork list's lock first, as fork takes them: the list's, then cs->lock. */
        ckptio__forksafe_lock();
        if (!cs->listed) {
            cs->fork = (ckptio__forksafe){&cs->lock, clients_child, cs, NULL};
            ckptio__forksafe_add_locked(&cs->fork);
            __atomic_store_n(&cs->listed, 1, __ATOMIC_RELEASE);
        }
        ckptio__forksafe_unlock();
    }
    int rc = 0;
    pthread_mutex_lock(&cs->lock);
    ckptio__http *h = cs->list;
    while (h && strcmp(h->key, *key)) h = h->next;
    if (!h && (rc = make(arg, *key, &h, msg)) == 0) {
        *key = NULL; /* the client's now */
        h->next = cs->list;
        cs->list = h;
    }
    *out = h;
    pthread_mutex_unlock(&cs->lock);
    return rc;
}

static double seconds(const char *v, double def)
{
    char *end;
    double d = v && *v ? strtod(v, &end) : 0;
    return v && *v && !*end && d > 0 && d < 1e6 ? d : def;
}

int ckptio__http_init(ckptio__http *h, const ckptio__http_proto *p, const ckptio__http_limits *l,
                      ckptio__msg *msg)
{
    h->proto = p;
    h->timeout = seconds(l->timeout, TIMEOUT_S);
    h->stall = seconds(l->stall, STALL_S);
    h->first = CKPTIO__MIN(h->timeout, seconds(l->first, FIRST_S));
    double conns = seconds(l->conns, CONNECTIONS);
    h->conns = conns >= 1 && conns <= 1024 ? (unsigned)conns : CONNECTIONS;
    h->idle = calloc(h->conns, sizeof *h->idle);
    if (!h->idle || (l->ca && !(h->ca = strdup(l->ca)))) {
        free(h->idle);
        h->idle = NULL;
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->freed, NULL);
    return 0;
}

void ckptio__http_fini(ckptio__http *h)
{
    for (unsigned i = 0; i < h->nidle; i++) curl_easy_cleanup(h->idle[i]);
    free(h->idle);
    free(h->ca);
    h->idle = NULL;
    h->ca = NULL;
}

/* A connection: waits while h->conns requests are in flight. NULL: no memory. */
static CURL *conn_take(ckptio__http *s)
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
static void conn_give(ckptio__http *s, CURL *h, bool broken)
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

typedef struct xfer {
    ckptio__http_call *c;
    uint64_t up_pos, out_cap;
    int abort_rc; /* set by a callback that stopped the transfer */
    char errbody[ERRBODY];
    size_t errlen;
} xfer;

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    ckptio__http_header(p, size * n, &x->c->resp, !x->c->dst);
    return size * n;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    ckptio__http_call *c = x->c;
    size_t len = size * n;
    if (c->resp.status < 200 || c->resp.status >= 300) { /* an error's body: keep its start */
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
    c->out[c->out_len] = 0;
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

static int add_header(struct curl_slist **hl, const char *line)
{
    struct curl_slist *t = curl_slist_append(*hl, line);
    if (!t) return -ENOMEM;
    *hl = t;
    return 0;
}

/* One try: 0 when a response came (its status in c->resp), else the transfer's error in *cc;
 * < 0 when the request could not be built. */
static int try_once(ckptio__http *s, CURL *h, ckptio__http_call *c, xfer *x, double left,
                    struct curl_slist *hl, CURLcode *cc, char *cerr)
{
    char ct[128];
    int rc = 0;
    for (unsigned i = 0; rc == 0 && i < 4 && c->extra[i]; i++) rc = add_header(&hl, c->extra[i]);
    snprintf(ct, sizeof ct, "Content-Type:%s%s", c->content_type ? " " : "",
             c->content_type ? c->content_type : "");
    if (rc == 0) rc = add_header(&hl, "Expect:"); /* no 100-continue round trip before a part */
    if (rc == 0) rc = add_header(&hl, ct);
    if (rc < 0) {
        curl_slist_free_all(hl);
        return rc;
    }
    curl_easy_reset(h); /* keeps the connection: reused when the next URL allows */
    curl_easy_setopt(h, CURLOPT_URL, c->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_MS);
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
}

/* A certificate this client does not trust (or a CA file it cannot use): never retried. */
static bool tls_failure(CURLcode cc)
{
    return cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
           cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_ISSUER_ERROR;
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

static int call_fail(ckptio__http *s, ckptio__http_call *c, ckptio__msg *msg, int rc,
                     CURLcode cc, const char *cerr, unsigned tries, double spent)
{
    const ckptio__http_proto *p = s->proto;
    char where[1400], retried[200] = "", hint[400] = "";
    snprintf(where, sizeof where, "%s://%s%s%s: %s", p->scheme, c->bucket, c->key ? "/" : "",
             c->key ? c->key : "", c->what);
    bool never = !__atomic_load_n(&s->answered, __ATOMIC_ACQUIRE);
    if (tries > 1)
        snprintf(retried, sizeof retried,
                 " (gave up after %u tries in %.1f s; %s_%s=%g s bounds the retries%s)", tries,
                 spent, p->env, never ? "FIRST_TIMEOUT" : "TIMEOUT",
                 never ? s->first : s->timeout,
                 never ? " while the store has never answered this process" : "");
    if (tls_failure(cc))
        return ckptio__fail(msg, -EACCES,
                            "%s failed: %s presented a certificate this client does not trust: "
                            "%s: give the CA that signed it (%s), or fix the endpoint",
                            where, s->endpoint, cerr[0] ? cerr : curl_easy_strerror(cc),
                            p->ca_from);
    char stalled[96] = "";
    if (cc == CURLE_OPERATION_TIMEDOUT)
        snprintf(stalled, sizeof stalled, " (no answer, or no byte moving for %s_STALL seconds)",
                 p->env);
    if (cc != CURLE_OK)
        return ckptio__fail(msg, rc,
                            "%s failed: cannot reach %s: %s%s: check %s and that the store is "
                            "up and reachable%s",
                            where, s->endpoint, cerr[0] ? cerr : curl_easy_strerror(cc), stalled,
                            p->endpoint_from, retried);
    if (rc == -EAGAIN) {
        rc = -ETIMEDOUT;
        snprintf(hint, sizeof hint, ": the store kept failing: retry later, or raise %s_TIMEOUT",
                 p->env);
    } else {
        p->hint(s, c, rc, hint, sizeof hint);
    }
    return ckptio__fail(msg, rc, "%s failed: HTTP %ld%s%s at %s%s%s", where, c->resp.status,
                        c->resp.code[0] ? " " : "", c->resp.code, s->endpoint, hint, retried);
}

int ckptio__http_do(ckptio__http *s, ckptio__http_call *c, ckptio__msg *msg)
{
    const ckptio__http_proto *p = s->proto;
    char cerr[CURL_ERROR_SIZE];
    int rc = 0;
    double t0 = ckptio__now();
    c->renewed = 0;
    for (unsigned attempt = 0;; attempt++) {
        /* The deadline: the full one once the store has answered this process; else a short
         * one, so a typo in the endpoint or a store that is down fails in seconds. */
        double limit = __atomic_load_n(&s->answered, __ATOMIC_ACQUIRE) ? s->timeout : s->first;
        struct curl_slist *hl = NULL;
        void *cred = NULL;
        CKPTIO__GOTO_IF((rc = p->auth(s, c, &hl, &cred, msg)) < 0, rc);
        xfer *x = calloc(1, sizeof *x);
        if (!x) {
            p->cred_put(cred);
            curl_slist_free_all(hl);
        }
        CKPTIO__GOTO_IF(!x, ckptio__fail(msg, -ENOMEM, "out of memory"));
        x->c = c;
        memset(&c->resp, 0, sizeof c->resp);
        c->out_len = 0;
        free(c->out);
        c->out = NULL; /* a retry starts over: same buffer for a ranged GET, a fresh one else */
        CURL *h = conn_take(s);
        CURLcode cc = CURLE_OK;
        int trc = h ? try_once(s, h, c, x, limit - (ckptio__now() - t0), hl, &cc, cerr)
                    : (curl_slist_free_all(hl), -ENOMEM);
        conn_give(s, h, trc < 0 || cc != CURLE_OK);
        bool retry = false;
        if (trc < 0) {
            rc = ckptio__fail(msg, trc, "%s://%s/%s: %s: cannot build the request", p->scheme,
                              c->bucket, c->key ? c->key : "", c->what);
        } else if (x->abort_rc) {
            char text[160] = "the store sent more bytes than asked for";
            if (x->abort_rc == CKPTIO_E_LIMIT)
                snprintf(text, sizeof text, "the answer is larger than the bound of %llu bytes",
                         (unsigned long long)c->max);
            else if (x->abort_rc == -ENOMEM)
                snprintf(text, sizeof text, "out of memory for the answer");
            rc = ckptio__fail(msg, x->abort_rc, "%s://%s/%s: %s: %s", p->scheme, c->bucket,
                              c->key ? c->key : "", c->what, text);
        } else if (cc != CURLE_OK) {
            rc = net_errno(cc);
            retry = rc != 0;
            if (!rc) rc = -EIO;
        } else {
            bool ok = c->resp.status >= 200 && c->resp.status < 300;
            bool renew = false;
            __atomic_store_n(&s->answered, 1, __ATOMIC_RELEASE);
            rc = p->judge(s, c, ok ? NULL : x->errbody, ok ? 0 : x->errlen, cred, &retry,
                          &renew);
            if (rc < 0 && renew && c->renewed < 3) { /* at once, with the newer credential */
                c->renewed++;
                p->cred_put(cred);
                free(x);
                continue;
            }
        }
        p->cred_put(cred);
        bool told = trc < 0 || x->abort_rc; /* those failures carry their message already */
        free(x);
        if (rc == 0 || told) goto out;
        if (!retry || c->once) {
            rc = call_fail(s, c, msg, rc, cc, cerr, attempt + 1, ckptio__now() - t0);
            goto out;
        }
        int hrc = p->hopeless && cc == CURLE_OK ? p->hopeless(s, c) : 0;
        if (hrc < 0) {
            rc = call_fail(s, c, msg, hrc, CURLE_OK, cerr, attempt + 1, ckptio__now() - t0);
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
    if (rc < 0) {
        free(c->out);
        c->out = NULL;
    }
    return rc;
}

/* ---- what the clients' operations share ---- */

int ckptio__http_body(ckptio__http_call *c, int rc, uint8_t **buf, uint64_t *len,
                      ckptio__http_resp *resp, ckptio__msg *msg)
{
    *buf = NULL;
    *len = 0;
    if (rc == 0 && !c->out && !(c->out = malloc(1))) /* an empty object */
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    if (rc == 0) {
        *buf = c->out;
        *len = c->out_len;
        c->resp.size = c->out_len;
    }
    if (resp) *resp = c->resp;
    return rc;
}

void ckptio__http_range(ckptio__http_call *c, uint64_t off, uint64_t len, void *buf,
                        char range[80])
{
    snprintf(range, 80, "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    c->extra[0] = range;
    c->ok_416 = true;
    c->dst = buf;
    c->dst_cap = len;
}

int ckptio__http_range_got(const ckptio__http *h, const ckptio__http_call *c, int rc,
                           uint64_t off, uint64_t *got, ckptio__msg *msg)
{
    *got = 0;
    if (rc == 0 && c->resp.status == 200 && off > 0)
        return ckptio__fail(msg, -EPROTO, "%s://%s/%s: the store at %s ignored a Range request",
                            h->proto->scheme, c->bucket, c->key, h->endpoint);
    if (rc == 0) *got = c->resp.status == 416 ? 0 : c->resp.size;
    return rc;
}

/* ---- what answers say ---- */

void ckptio__http_header(const char *p, size_t len, ckptio__http_resp *r, bool want_size)
{
    char line[512];
    if (len >= sizeof line) return; /* no header the client reads is that long */
    memcpy(line, p, len);
    line[len] = 0;
    len = strlen(line); /* a NUL inside ends the line */
    while (len && (line[len - 1] == '\r' || line[len - 1] == '\n')) line[--len] = 0;
    if (!strncmp(line, "HTTP/", 5)) { /* a new answer (after a 100 Continue): start over */
        const char *sp = strchr(line, ' ');
        long st = sp ? strtol(sp + 1, NULL, 10) : 0;
        *r = (ckptio__http_resp){.status = st >= 100 && st <= 999 ? st : 0};
        return;
    }
    char *colon = strchr(line, ':');
    if (!colon) return;
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    if (!strcasecmp(line, "etag")) snprintf(r->etag, sizeof r->etag, "%s", v);
    else if (!strcasecmp(line, "x-goog-generation")) snprintf(r->gen, sizeof r->gen, "%s", v);
    else if (!strcasecmp(line, "last-modified")) ckptio__time_http(v, &r->mtime);
    else if (!strcasecmp(line, "date")) ckptio__time_http(v, &r->date);
    else if (want_size && !strcasecmp(line, "content-length")) r->size = strtoull(v, NULL, 10);
}

static int finish_tm(struct tm *tm, int64_t *out)
{
    if (tm->tm_year < 1970 || tm->tm_mon < 1 || tm->tm_mon > 12 || tm->tm_mday < 1 ||
        tm->tm_mday > 31 || tm->tm_hour > 23 || tm->tm_min > 59 || tm->tm_sec > 60)
        return CKPTIO_E_CORRUPT;
    tm->tm_year -= 1900;
    tm->tm_mon -= 1;
    time_t t = timegm(tm);
    if (t == (time_t)-1) return CKPTIO_E_CORRUPT;
    *out = (int64_t)t;
    return 0;
}

int ckptio__time_iso(const char *s, int64_t *out)
{
    struct tm tm = {0};
    int used = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &used) != 6)
        return CKPTIO_E_CORRUPT;
    const char *r = s + used;
    if (*r == '.')
        for (r++; *r >= '0' && *r <= '9'; r++) {}
    if (strcmp(r, "Z") && strcmp(r, "+00:00") && *r) return CKPTIO_E_CORRUPT;
    return finish_tm(&tm, out);
}

int ckptio__time_http(const char *s, int64_t *out)
{
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    struct tm tm = {0};
    char mon[4] = {0}, zone[8] = {0};
    const char *comma = strchr(s, ',');
    if (!comma) return CKPTIO_E_CORRUPT;
    if (sscanf(comma + 1, " %2d %3s %4d %2d:%2d:%2d %7s", &tm.tm_mday, mon, &tm.tm_year,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, zone) != 7 ||
        strcmp(zone, "GMT"))
        return CKPTIO_E_CORRUPT;
    const char *m = strlen(mon) == 3 ? strstr(months, mon) : NULL;
    if (!m || (m - months) % 3) return CKPTIO_E_CORRUPT;
    tm.tm_mon = (int)((m - months) / 3) + 1;
    return finish_tm(&tm, out);
}
