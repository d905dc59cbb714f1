/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP for the object stores' clients (s3.c, gcs.c): a client's connections, and one request
 * sent to a deadline and retried while its failure may pass. What differs between the stores —
 * how a request is authenticated, what an error answer means, what a failure should tell the
 * user — is the client's protocol (ckptio__http_proto). */
#ifndef CKPTIO_STORE_HTTP_H
#define CKPTIO_STORE_HTTP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/common.h"
#include "../common/forksafe.h"

struct curl_slist;

/* What one request learned. */
typedef struct ckptio__http_resp {
    long status;     /* HTTP status of the last try; 0 when no response came */
    char etag[128];  /* ETag header, quotes kept ("\"9b2c...\""), or "" */
    char gen[24];    /* X-Goog-Generation (GCS: the object's generation), or "" */
    uint64_t size;   /* HEAD / whole GET: the object's length; ranged GET: bytes received */
    int64_t mtime;   /* Last-Modified, seconds since the epoch (server clock), or 0 */
    int64_t date;    /* Date header: the server's clock when it answered, or 0 */
    char code[64];   /* the store's error code ("NoSuchKey", "SlowDown", "notFound"...), or "" */
} ckptio__http_resp;

/* One request. The caller fills what it asks; resp and the answer's body come back. */
typedef struct ckptio__http_call {
    const char *what;          /* "PUT", "GET"... for messages */
    const char *bucket, *key;  /* for messages: "<scheme>://bucket/key"; key NULL: the bucket */
    const char *method, *url;
    const char *extra[4];      /* header lines ("Range: bytes=0-9"), NULL-ended */
    const char *content_type;  /* of the body; NULL: none sent */
    const void *body;
    uint64_t body_len;
    bool ok_404, ok_416; /* answers that are success for this call */
    bool once;           /* no retries (a probe made between another call's tries) */
    void *proto;         /* the protocol's own per-call data (S3: what the signature covers) */
    void *dst;           /* the body goes here, at most dst_cap bytes (a ranged GET) */
    uint64_t dst_cap;
    uint64_t max; /* else, when nonzero, into a malloc'd buffer (out, out_len) of at most max,
                   * NUL-terminated (answers are scanned as strings) */
    uint8_t *out;
    uint64_t out_len;
    ckptio__http_resp resp;
    unsigned renewed; /* credentials the store refused as expired and replaced, so far */
} ckptio__http_call;

typedef struct ckptio__http ckptio__http;

/* What a kind of store does to requests. */
typedef struct ckptio__http_proto {
    const char *scheme; /* "s3", "gs": addresses in messages */
    const char *env;    /* "CKPTIO_S3": the prefix of the limits' variables, in messages */
    const char *endpoint_from; /* where the endpoint is set, for "check ..." hints */
    const char *ca_from;       /* where the CAs are set, for the certificate hint */
    /* Before each try: append the headers that authenticate it to *hl, holding a credential
     * in *cred (given back with cred_put after the try). */
    int (*auth)(ckptio__http *h, ckptio__http_call *c, struct curl_slist **hl, void **cred,
                ckptio__msg *msg);
    void (*cred_put)(void *cred);
    /* An answer came (c->resp.status set; body: an error answer's start, or NULL for a 2xx
     * whose body is in c->out): read the store's error code into c->resp.code and say what
     * it means: 0 success, else the error, *retry when it may pass, *renew when the store
     * refused `cred` as expired (true only when a newer one will be got). */
    int (*judge)(ckptio__http *h, ckptio__http_call *c, const char *body, size_t len,
                 void *cred, bool *retry, bool *renew);
    /* What to tell the user after "... failed: HTTP 404 NoSuchKey at <endpoint>" for rc (the
     * call's error); "" for nothing. */
    void (*hint)(ckptio__http *h, const ckptio__http_call *c, int rc, char *out, size_t cap);
    /* After an answer that is to be retried: 0, or the error to fail with at once when no
     * retry can pass (S3: the call's multipart upload is gone; c->resp then reads as the
     * answer that says so). NULL: never. */
    int (*hopeless)(ckptio__http *h, ckptio__http_call *c);
} ckptio__http_proto;

/* A client's connections and limits; part of the client (its first member is not required). */
struct ckptio__http {
    ckptio__http *next; /* the kind's other clients (ckptio__http_clients) */
    char *key;          /* what it was made from: its cache key (the kind frees it) */
    const ckptio__http_proto *proto;
    char endpoint[512]; /* where requests go, for messages ("http://127.0.0.1:8333") */
    char *ca;           /* the CAs to trust (a PEM file), or NULL: the system's */
    double timeout, stall, first;
    int answered; /* some request had an HTTP answer (atomic): the store is there */
    unsigned conns;
    pthread_mutex_t lock;
    pthread_cond_t freed;
    unsigned busy, nidle;
    void **idle; /* CURL easy handles */
};

/* A kind of store's clients: one per distinct key (the settings and environment it was made
 * from), made on first use and kept, with its connections and credentials, until exit. In a
 * forked child each forgets its idle connections (closing them could end the parent's TLS
 * sessions) and the locks another thread may have held; `child` fixes up the kind's own part
 * (its credentials). Define one statically: CKPTIO__HTTP_CLIENTS(child). */
typedef struct ckptio__http_clients {
    pthread_mutex_t lock;
    ckptio__http *list;
    void (*child)(ckptio__http *h);
    ckptio__forksafe fork;
    int listed; /* fork is on the engine's atfork list (atomic) */
} ckptio__http_clients;
#define CKPTIO__HTTP_CLIENTS(child_fn) {PTHREAD_MUTEX_INITIALIZER, NULL, child_fn, {0}, 0}

/* The client whose key is *key: found, or made by make(arg, *key, &h, msg) (which takes the key
 * over on success: *key is then NULL; a failure is tried again at the next call). libcurl's
 * global init happens here, once. Thread-safe. */
CKPTIO__HIDDEN int ckptio__http_client(ckptio__http_clients *cs, char **key,
                                       int (*make)(void *arg, char *key, ckptio__http **out,
                                                   ckptio__msg *msg),
                                       void *arg, ckptio__http **out, ckptio__msg *msg);

/* Limits from their settings' text (NULL or invalid: the default): the deadline of a request's
 * retries (timeout, default 120 s), of a stall (no byte moving, default 20 s), the deadline
 * while the store has never answered this process (first, default 10 s, at most timeout), and
 * the requests in flight at once (conns, default 16, 1..1024). ca: a PEM file, or NULL. */
typedef struct ckptio__http_limits {
    const char *timeout, *stall, *first, *conns, *ca;
} ckptio__http_limits;
CKPTIO__HIDDEN int ckptio__http_init(ckptio__http *h, const ckptio__http_proto *p,
                                     const ckptio__http_limits *l, ckptio__msg *msg);
CKPTIO__HIDDEN void ckptio__http_fini(ckptio__http *h);

/* Send c, retrying a failure that may pass (no connection, a reset, a stall, what the protocol
 * calls passing) with exponential backoff and full jitter (0.1 s doubling, at most 5 s apart)
 * until the deadline: h->timeout once the store has answered this process, else h->first.
 * A certificate that does not verify fails at once (-EACCES). Failures name the bucket and key,
 * the endpoint, and what to do. On failure c->out is freed. Thread-safe. */
CKPTIO__HIDDEN int ckptio__http_do(ckptio__http *h, ckptio__http_call *c, ckptio__msg *msg);

/* ---- what the clients' operations share ---- */

/* After a whole-object GET (c->max set) ended with rc: on success the body into *buf (malloc'd,
 * also for an empty object) and *len, its length into c->resp.size; resp (may be NULL) gets
 * c->resp. Returns rc, or -ENOMEM. */
CKPTIO__HIDDEN int ckptio__http_body(ckptio__http_call *c, int rc, uint8_t **buf, uint64_t *len,
                                     ckptio__http_resp *resp, ckptio__msg *msg);
/* Make c a ranged GET of [off, off + len) into buf (len > 0): its Range header (written into
 * range, 80 bytes, which must outlive the call), 416 success. */
CKPTIO__HIDDEN void ckptio__http_range(ckptio__http_call *c, uint64_t off, uint64_t len,
                                       void *buf, char range[80]);
/* After that call ended with rc: *got, the bytes received (0 for a 416: off at or past the
 * end); a 200 for off > 0 (the store ignored the Range) is -EPROTO. */
CKPTIO__HIDDEN int ckptio__http_range_got(const ckptio__http *h, const ckptio__http_call *c,
                                          int rc, uint64_t off, uint64_t *got, ckptio__msg *msg);

/* One line of an answer's head (len bytes, CRLF or not; not NUL-terminated) into r: a status
 * line ("HTTP/1.1 200 OK") starts a new answer (after a 100 Continue: r zeroed but for the
 * status); ETag, X-Goog-Generation, Last-Modified and Date are read, Content-Length when
 * want_size; other lines, and lines of 512 bytes or more, are skipped. */
CKPTIO__HIDDEN void ckptio__http_header(const char *p, size_t len, ckptio__http_resp *r,
                                        bool want_size);
/* "2009-10-12T17:50:30.000Z" (RFC 3339 / ISO 8601, UTC, any fraction) and "Wed, 12 Oct 2009
 * 17:50:30 GMT" (RFC 1123) into seconds since the epoch; 0, or CKPTIO_E_CORRUPT when the text
 * is not such a time. */
CKPTIO__HIDDEN int ckptio__time_iso(const char *s, int64_t *out);
CKPTIO__HIDDEN int ckptio__time_http(const char *s, int64_t *out);

#endif
