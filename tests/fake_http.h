/* SPDX-License-Identifier: Apache-2.0 */
/* A scripted HTTP/1.1 server on 127.0.0.1 for the tests of the cloud clients and credentials:
 * each request takes the script's next reply, and what came is kept for the test to check. */
#ifndef CKPTIO_TEST_FAKE_HTTP_H
#define CKPTIO_TEST_FAKE_HTTP_H

#include <pthread.h>

/* FAKE_STALL and FAKE_CUT promise 100 bytes more than the body: the first then waits 3 s, the
 * second closes the connection at once. FAKE_ETAG: 200, the body as the ETag, no body.
 * FAKE_RESET: the connection is reset instead of answered. */
enum { FAKE_REPLY, FAKE_RESET, FAKE_STALL, FAKE_CUT, FAKE_ETAG };
typedef struct fake_reply {
    int action;
    int status;
    const char *body; /* also the Content-Length */
} fake_reply;

#define FAKE_KEPT 16 /* requests whose line, head and body are kept: the first ones */

typedef struct fake {
    int lfd, port;
    pthread_t th;
    const fake_reply *script;
    unsigned n;
    const char *headers;          /* header lines every answer carries, each ending in "\r\n" */
    pthread_mutex_t lock;         /* over next and what is kept */
    unsigned next;                /* requests that came (read it with fake_count) */
    char lines[FAKE_KEPT][600];   /* each request's first line */
    char heads[FAKE_KEPT][2048];  /* its head, from the first line to the blank line's CRLF */
    char bodies[FAKE_KEPT][4096]; /* its body (the start of it) */
} fake;

/* Listen on a free port of 127.0.0.1 (f->port) and serve until the process ends: each
 * connection in its own thread, each request answered with the script's next reply (the last
 * one once it runs out) and the header lines `headers` (NULL: none); a 100 Continue first when
 * the request asks for one. 0, or -1. */
int fake_listen(fake *f, const fake_reply *script, unsigned n, const char *headers);
/* How many requests came; what was kept of them may be read once counted. */
unsigned fake_count(fake *f);

#endif
