/* SPDX-License-Identifier: Apache-2.0 */
/* Small HTTP and file helpers of the credential providers: a request with a bounded answer,
 * a small file read whole, a path under the home directory. */
#include "http_simple.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

typedef struct answer {
    char *p;
    size_t len;
    bool over;
    const char *want; /* the header whose value to keep */
    char *header;     /* sizeof ((ckptio__http_answer *)0)->header bytes */
} answer;

#define HEADER_CAP sizeof(((ckptio__http_answer *)0)->header)

static size_t on_body(char *d, size_t size, size_t n, void *arg)
{
    answer *a = arg;
    size_t len = size * n;
    if (a->over || len > CKPTIO__HTTP_ANSWER_MAX - a->len) {
        a->over = true;
        return 0;
    }
    /* Not realloc: an answer may hold a token, and what realloc leaves behind is not wiped. */
    char *g = malloc(a->len + len + 1);
    if (!g) return 0;
    if (a->p) {
        memcpy(g, a->p, a->len);
        OPENSSL_cleanse(a->p, a->len);
        free(a->p);
    }
    memcpy(g + a->len, d, len);
    a->p = g;
    a->len += len;
    a->p[a->len] = 0;
    return len;
}

static size_t on_header(char *d, size_t size, size_t n, void *arg)
{
    answer *a = arg;
    size_t len = size * n, k = strlen(a->want);
    if (len >= 5 && !memcmp(d, "HTTP/", 5)) a->header[0] = 0; /* a new answer (after a 100) */
    if (len > k && d[k] == ':' && !strncasecmp(d, a->want, k)) {
        const char *v = d + k + 1, *e = d + len;
        while (v < e && (*v == ' ' || *v == '\t')) v++;
        while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t')) e--;
        if ((size_t)(e - v) < HEADER_CAP) snprintf(a->header, HEADER_CAP, "%.*s", (int)(e - v), v);
    }
    return len;
}

int ckptio__http_simple(const ckptio__http_req *rq, ckptio__http_answer *ans, char *err, size_t cap)
{
    ans->status = 0;
    ans->body = NULL;
    ans->header[0] = 0;
    CURL *h = curl_easy_init();
    if (!h) return snprintf(err, cap, "out of memory"), -ENOMEM;
    struct curl_slist *hl = NULL;
    for (size_t i = 0; rq->headers && rq->headers[i]; i++) {
        struct curl_slist *t = curl_slist_append(hl, rq->headers[i]);
        if (!t) {
            curl_slist_free_all(hl);
            curl_easy_cleanup(h);
            return snprintf(err, cap, "out of memory"), -ENOMEM;
        }
        hl = t;
    }
    answer a = {.want = rq->want_header, .header = ans->header};
    char cerr[CURL_ERROR_SIZE] = "";
    long connect_ms = rq->connect_ms ? rq->connect_ms : CKPTIO__MIN(rq->timeout_ms, 5000L);
    curl_easy_setopt(h, CURLOPT_URL, rq->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, rq->timeout_ms);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
    if (rq->want_header) {
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &a);
    }
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (rq->ca_bundle) curl_easy_setopt(h, CURLOPT_CAINFO, rq->ca_bundle);
    if (!strcmp(rq->method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    } else if (rq->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->body);
    }
    CURLcode cc = curl_easy_perform(h);
    int rc = 0;
    if (cc != CURLE_OK) {
        snprintf(err, cap, "%s",
                 a.over    ? "the answer is too large"
                 : cerr[0] ? cerr
                           : curl_easy_strerror(cc));
        rc = cc == CURLE_COULDNT_CONNECT      ? -ECONNREFUSED
             : cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
                                              : -EIO;
        if (a.p) OPENSSL_cleanse(a.p, a.len);
        free(a.p);
        ans->header[0] = 0;
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &ans->status);
        ans->body = a.p ? a.p : strdup("");
        if (!ans->body) rc = -ENOMEM;
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return rc;
}

int ckptio__read_text(const char *path, char **out, ckptio__msg *msg)
{
    *out = NULL;
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0 && (!path || errno == ENOENT || errno == ENOTDIR)) {
        *out = strdup("");
        return *out ? 0 : ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    if (fd < 0) return ckptio__fail(msg, -errno, "cannot read '%s': %s", path, strerror(errno));
    char *buf = malloc(CKPTIO__TEXT_MAX + 1);
    size_t len = 0;
    ssize_t n = 1;
    while (buf && len < CKPTIO__TEXT_MAX &&
           (n = read(fd, buf + len, CKPTIO__TEXT_MAX - len)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        len += (size_t)n;
    }
    int e = errno;
    close(fd);
    if (!buf) return ckptio__fail(msg, -ENOMEM, "out of memory");
    if (n < 0) {
        OPENSSL_cleanse(buf, len);
        free(buf);
        return ckptio__fail(msg, -e, "cannot read '%s': %s", path, strerror(e));
    }
    buf[len] = 0;
    *out = buf;
    return 1;
}

char *ckptio__home_path(const char *rel)
{
    const char *home = getenv("HOME");
    char *p;
    if (!home || !*home || asprintf(&p, "%s/%s", home, rel) < 0) return NULL;
    return p;
}
