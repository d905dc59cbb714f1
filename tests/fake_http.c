/* SPDX-License-Identifier: Apache-2.0 */
/* The tests' scripted HTTP server (fake_http.h): one thread accepts, one per connection answers. */
#include "fake_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/common/common.h"

/* One request from fd, kept in slot *k (FAKE_KEPT and above: counted, not kept); false when the
 * peer closed. */
static bool fake_read(fake *f, int fd, unsigned *k)
{
    char buf[16384], body[sizeof f->bodies[0]];
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        if (len + 1 >= sizeof buf) return false;
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0) return false;
        len += (size_t)n;
        buf[len] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    char *cl = strcasestr(buf, "\r\ncontent-length:");
    size_t want = cl && cl < end ? strtoull(cl + 17, NULL, 10) : 0;
    size_t have = len - (size_t)(end + 4 - buf), kept = CKPTIO__MIN(have, sizeof body - 1);
    memcpy(body, end + 4, kept);
    char *ex = strcasestr(buf, "\r\nexpect: 100-continue");
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (ex && ex < end && have < want && write(fd, cont, sizeof cont - 1) < 0) return false;
    for (char tmp[65536]; have < want;) {
        ssize_t n = read(fd, tmp, CKPTIO__MIN(sizeof tmp, want - have));
        if (n <= 0) return false;
        size_t take = CKPTIO__MIN((size_t)n, sizeof body - 1 - kept);
        memcpy(body + kept, tmp, take);
        kept += take;
        have += (size_t)n;
    }
    body[kept] = 0;
    pthread_mutex_lock(&f->lock);
    *k = f->next++;
    if (*k < FAKE_KEPT) {
        snprintf(f->lines[*k], sizeof f->lines[0], "%.*s", (int)(strstr(buf, "\r\n") - buf), buf);
        snprintf(f->heads[*k], sizeof f->heads[0], "%.*s", (int)(end + 2 - buf), buf);
        memcpy(f->bodies[*k], body, kept + 1);
    }
    pthread_mutex_unlock(&f->lock);
    return true;
}

typedef struct fake_conn {
    fake *f;
    int fd;
} fake_conn;

/* One connection's requests, in order; connections are served in parallel. */
static void *fake_serve(void *arg)
{
    fake_conn *fc = arg;
    fake *f = fc->f;
    int fd = fc->fd;
    free(fc);
    unsigned k;
    while (fake_read(f, fd, &k)) {
        unsigned i = k < f->n ? k : f->n - 1;
        const fake_reply *r = &f->script[i];
        if (r->action == FAKE_RESET) {
            struct linger lg = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            break;
        }
        char head[2048], etag[64];
        const char *body = r->body ? r->body : "";
        snprintf(etag, sizeof etag, "\"e%u\"", i);
        if (r->action == FAKE_ETAG) {
            snprintf(etag, sizeof etag, "%s", body);
            body = "";
        }
        int hl = snprintf(
            head, sizeof head,
            "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nETag: %s\r\n"
            "Date: Mon, 12 Oct 2009 17:50:30 GMT\r\n%s\r\n",
            r->status, strlen(body) + (r->action == FAKE_STALL || r->action == FAKE_CUT ? 100 : 0),
            etag, f->headers ? f->headers : "");
        if (write(fd, head, (size_t)hl) < 0 || write(fd, body, strlen(body)) < 0) break;
        if (r->action == FAKE_STALL) sleep(3);
        if (r->action == FAKE_STALL || r->action == FAKE_CUT) break;
    }
    close(fd);
    return NULL;
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    int fd;
    while ((fd = accept(f->lfd, NULL, NULL)) >= 0) {
        fake_conn *fc = malloc(sizeof *fc);
        pthread_t th;
        if (!fc) break;
        *fc = (fake_conn){f, fd};
        if (pthread_create(&th, NULL, fake_serve, fc) == 0) pthread_detach(th);
    }
    return NULL;
}

int fake_listen(fake *f, const fake_reply *script, unsigned n, const char *headers)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    f->script = script;
    f->n = n;
    f->headers = headers;
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(f->lfd, 16) != 0 || getsockname(f->lfd, (struct sockaddr *)&a, &al) != 0) {
        fprintf(stderr, "fake_listen: cannot listen on 127.0.0.1\n");
        return -1;
    }
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->th, NULL, fake_main, f) == 0 ? 0 : -1;
}

unsigned fake_count(fake *f)
{
    pthread_mutex_lock(&f->lock);
    unsigned n = f->next;
    pthread_mutex_unlock(&f->lock);
    return n;
}
