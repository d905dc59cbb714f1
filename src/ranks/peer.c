/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's transport: a rank's server for its node's checkpoint parts, pushes, fetches and copies that publish only verified parts. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "../commit/txn.h"
#include "../common/forksafe.h"
#include "../io/params.h"
#include "peer.h"
#include "../store/store.h"

struct ckptio_peer {
    char *root;
    unsigned char key[CKPTIO_PEER_KEY_MAX]; /* the job's */
    size_t key_len;
    double timeout; /* seconds a connection may stay silent */
    int lfd;
    int port;
    int wake[2]; /* closing writes here: the accept loop wakes and ends */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int active;  /* connection threads still running (under lock) */
    int *conns;  /* their sockets, shut down by close (under lock) */
    int nconns;
    bool stopping;
    bool forked; /* this copy is a forked child's: its threads stayed in the parent */
    ckptio__forksafe fork;
};


/* Move up to *left bytes from the socket into the file through the pipe `pp` (no copy through
 * user memory); *left is what remains. -EINVAL: the file takes no splice (nothing was moved, the
 * caller copies instead); -EPIPE: the socket closed early. */
static int splice_in(int sock, const int pp[2], int fd, uint64_t *left, uint64_t *bytes)
{
    while (*left) {
        ssize_t n = splice(sock, NULL, pp[1], NULL, (size_t)CKPTIO__MIN(*left, (uint64_t)PEER_CHUNK),
                           SPLICE_F_MOVE | SPLICE_F_MORE);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == EAGAIN ? -ETIMEDOUT : -errno;
        if (n == 0) return -EPIPE;
        for (ssize_t in_pipe = n; in_pipe;) {
            ssize_t w = splice(pp[0], NULL, fd, NULL, (size_t)in_pipe, SPLICE_F_MOVE);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && errno == EINVAL) {
                /* the file refuses splice: what is in the pipe goes by read and write */
                uint8_t tmp[65536];
                while (in_pipe) {
                    ssize_t r = read(pp[0], tmp, (size_t)CKPTIO__MIN(in_pipe, (ssize_t)sizeof tmp));
                    if (r <= 0) return r < 0 ? -errno : -EIO;
                    int rc = ckptio__peer_write_all(fd, tmp, (size_t)r);
                    if (rc < 0) return rc;
                    in_pipe -= r;
                }
                *left -= (uint64_t)n;
                *bytes += (uint64_t)n;
                return -EINVAL;
            }
            if (w <= 0) return w < 0 ? -errno : -EIO;
            in_pipe -= w;
        }
        *left -= (uint64_t)n;
        *bytes += (uint64_t)n;
    }
    return 0;
}

/* Receive file records into the transaction's directory until the end record (owner-only
 * files: a part received goes into a node's local tier). */
static int recv_files(int sock, ckptio__txn *t, const char *who, uint64_t *bytes, ckptio__msg *m)
{
    uint8_t *buf = malloc(PEER_CHUNK);
    if (!buf) return -ENOMEM;
    int rc = 0;
    int pp[2] = {-1, -1};
    if (pipe2(pp, O_CLOEXEC) == 0) fcntl(pp[1], F_SETPIPE_SZ, (int)PEER_CHUNK);
    else pp[0] = pp[1] = -1;
    for (;;) {
        uint8_t h[8];
        if ((rc = ckptio__peer_recv_all(sock, h, 4)) < 0) break;
        uint32_t len = ckptio__peer_get32(h);
        if (len == 0) break;
        char rel[PATH_MAX];
        if (len >= sizeof rel) {
            rc = ckptio__fail(m, CKPTIO_E_CORRUPT, "%s sent a file name of %u bytes", who, len);
            break;
        }
        if ((rc = ckptio__peer_recv_all(sock, rel, len)) < 0 || (rc = ckptio__peer_recv_all(sock, h, 8)) < 0) break;
        rel[len] = '\0';
        if (!ckptio__peer_safe_rel(rel) || strlen(rel) != len) {
            rc = ckptio__fail(m, CKPTIO_E_CORRUPT, "%s sent a file name that is not a plain relative path", who);
            break;
        }
        uint64_t size = ckptio__peer_get64(h);
        int fd = ckptio__peer_create_in(t->tmp_fd, rel, true, m, t->tmp_path);
        if (fd < 0) {
            rc = fd;
            break;
        }
        uint64_t left = size;
        if (pp[0] >= 0) rc = splice_in(sock, pp, fd, &left, bytes);
        if (rc == -EINVAL) rc = 0; /* this file system takes no splice: the rest by copies */
        while (rc == 0 && left) {
            size_t n = (size_t)CKPTIO__MIN(left, (uint64_t)PEER_CHUNK);
            if ((rc = ckptio__peer_recv_all(sock, buf, n)) < 0) break;
            rc = ckptio__peer_write_all(fd, buf, n);
            left -= n;
            *bytes += n;
        }
        if (rc < 0 && rc != -EPIPE && rc != -ETIMEDOUT && rc != -ECONNRESET && !m->text[0])
            ckptio__fail(m, rc, "cannot write '%s/%s': %s", t->tmp_path, rel, strerror(-rc));
        if (rc == 0 && fdatasync(fd) < 0)
            rc = ckptio__fail(m, -errno, "cannot fsync '%s/%s': %s", t->tmp_path, rel, strerror(errno));
        close(fd);
        if (rc < 0) break;
    }
    if (pp[0] >= 0) {
        close(pp[0]);
        close(pp[1]);
    }
    free(buf);
    if (rc < 0 && !m->text[0])
        ckptio__fail(m, rc, "%s: the transfer broke off (%s); nothing of it was kept", who,
                     rc == -EPIPE ? "connection closed" : strerror(-rc));
    return rc;
}
/* The part `name` under root, after checking it is a relative name of the root's. */
static int part_path(const char *root, const char *name, char **out)
{
    if (!ckptio__peer_safe_rel(name)) return CKPTIO_E_USAGE;
    return asprintf(out, "%s/%s", root, name) < 0 ? -ENOMEM : 0;
}

/* ---- the server ---- */

typedef struct conn {
    ckptio_peer *p;
    int fd;
    char from[INET6_ADDRSTRLEN + 16]; /* the client's address and port, for the log */
} conn;

static void serve_put(int fd, const char *name, const char *path)
{
    ckptio__msg m = {0};
    ckptio__txn t = {0};
    uint64_t bytes = 0;
    int rc = ckptio__peer_begin_part(&t, path, true, &m);
    if (rc == 0) rc = recv_files(fd, &t, "the sending rank", &bytes, &m);
    if (rc == 0) rc = ckptio__peer_finish_part(&t, CKPTIO_PEER_VERIFY, path, &m);
    ckptio__txn_fini(&t); /* not published: its directory goes */
    if (rc < 0 && !m.text[0]) snprintf(m.text, sizeof m.text, "%s", strerror(-rc));
    if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET) {
        char text[CKPTIO__MSG_LEN + 64];
        snprintf(text, sizeof text, "part '%s' not kept: %s", name, m.text);
        ckptio__peer_send_reply(fd, rc, text);
        return;
    }
    if (rc == 0) ckptio__peer_send_reply(fd, 0, "");
}

static void serve_get(int fd, const char *name, const char *path)
{
    ckptio__msg m = {0};
    if (ckptio_is_checkpoint(path) != 1) {
        char text[PEER_MAX_NAME + 64];
        snprintf(text, sizeof text, "it holds no committed part '%s'", name);
        ckptio__peer_send_reply(fd, -ENOENT, text);
        return;
    }
    if (ckptio__peer_send_reply(fd, 0, "") < 0) return;
    pacer pc = {0, 0, ckptio__now()};
    sink s = {.sock = fd, .out = -1, .who = "the fetching rank"};
    nopipe np;
    ckptio__peer_nopipe_begin(&np);
    ckptio__peer_send_pass(path, &s, 1, &pc, &m); /* a failure shows as a short stream there */
    ckptio__peer_nopipe_end(&np);
}

/* A refused client is told nothing of the server (not its root, not what it holds), and
 * the server's log names the client. */
static void refuse(int fd, const char *from, const char *why)
{
    fprintf(stderr, "ckptio peer server: refused the connection from %s: %s\n", from, why);
    ckptio__peer_send_reply(fd, -EACCES, "not authenticated");
}

void ckptio__peer_serve(const char *root, const unsigned char *key, size_t klen, int fd, const char *from)
{
    uint8_t session[PEER_MAC], mac[PEER_MAC];
    const char *why = NULL;
    double end = ckptio__now() + PEER_AUTH_SECONDS; /* for the authentication and the request */
    int rc = ckptio__peer_server_auth(fd, key, klen, end, session, &why);
    if (rc == -EACCES) refuse(fd, from, why);
    if (rc < 0) return;
    uint8_t h[16 + PEER_MAX_NAME];
    if (ckptio__peer_recv_by(fd, h, 16, end) < 0) return;
    uint32_t op = ckptio__peer_get32(h + 8), len = ckptio__peer_get32(h + 12);
    if (ckptio__peer_get32(h) != PEER_MAGIC || ckptio__peer_get32(h + 4) != PEER_VERSION || len >= PEER_MAX_NAME) {
        refuse(fd, from, "its request is malformed");
        return;
    }
    if (ckptio__peer_recv_by(fd, h + 16, len, end) < 0 || ckptio__peer_recv_by(fd, mac, sizeof mac, end) < 0) return;
    uint8_t want[PEER_MAC];
    if (ckptio__peer_mac(session, h, 16 + len, want) < 0 || !ckptio__peer_mac_equal(want, mac)) {
        refuse(fd, from, "its request does not carry this session's MAC (replayed, or altered on the way)");
        return;
    }
    char name[PEER_MAX_NAME + 1];
    memcpy(name, h + 16, len);
    name[len] = '\0';
    char *path = NULL;
    rc = strlen(name) == len ? part_path(root, name, &path) : CKPTIO_E_USAGE;
    if (rc < 0) ckptio__peer_send_reply(fd, rc, "not a part name");
    else if (op == PEER_PUT) serve_put(fd, name, path);
    else if (op == PEER_GET) serve_get(fd, name, path);
    else ckptio__peer_send_reply(fd, CKPTIO_E_USAGE, "unknown request");
    free(path);
}

static void *conn_thread(void *arg)
{
    conn *c = arg;
    ckptio_peer *p = c->p;
    int fd = c->fd;
    ckptio__peer_set_timeout(fd, p->timeout);
    ckptio__peer_serve(p->root, p->key, p->key_len, fd, c->from);
    free(c);
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->nconns; i++)
        if (p->conns[i] == fd) p->conns[i] = p->conns[--p->nconns];
    close(fd);
    p->active--;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* "host:port" of a client. */
static void name_addr(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
    } else if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
    }
    snprintf(out, n, "%s:%d", host, port);
}

static void *accept_thread(void *arg)
{
    ckptio_peer *p = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        struct pollfd pf[2] = {{.fd = p->lfd, .events = POLLIN}, {.fd = p->wake[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[1].revents) break;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(p->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn *c = malloc(sizeof *c);
        pthread_mutex_lock(&p->lock);
        int *grown = c ? realloc(p->conns, (size_t)(p->nconns + 1) * sizeof *grown) : NULL;
        if (grown) p->conns = grown;
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        bool full = p->nconns >= PEER_MAX_CONNS; /* each one's authentication is bounded */
        if (grown && !p->stopping && !full) {
            c->p = p;
            c->fd = fd;
            name_addr(&ss, c->from, sizeof c->from);
            p->conns[p->nconns++] = fd;
            p->active++;
            if (pthread_create(&t, &at, conn_thread, c) != 0) {
                p->nconns--;
                p->active--;
                grown = NULL;
            }
        } else {
            grown = NULL;
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&p->lock);
        if (!grown) {
            if (full) {
                char from[INET6_ADDRSTRLEN + 16];
                name_addr(&ss, from, sizeof from);
                fprintf(stderr, "ckptio peer server: refused the connection from %s: %d "
                        "connections are open already\n", from, PEER_MAX_CONNS);
            }
            free(c);
            close(fd);
        }
    }
    return NULL;
}

/* Resolve host:port into an IPv4/IPv6 address. */
static int resolve(const char *host, int port, int passive, struct addrinfo **out, ckptio__msg *m)
{
    char svc[16];
    snprintf(svc, sizeof svc, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    int e = getaddrinfo(host && *host ? host : NULL, svc, &hints, out);
    if (e != 0)
        return ckptio__fail(m, -EHOSTUNREACH, "cannot resolve '%s': %s", host ? host : "", gai_strerror(e));
    return 0;
}

/* In a forked child (p->lock held, one thread): the server's threads stayed in the parent, so
 * this copy must never wake, join or shut down anything of theirs; the child's copies of the
 * listening socket and of the connections are closed here, so that the port and the
 * connections end when the parent's do, whatever the child does next. */
static void fork_child(void *obj)
{
    ckptio_peer *p = obj;
    int fds[3] = {p->lfd, p->wake[0], p->wake[1]};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0) close(fds[i]);
    for (int i = 0; i < p->nconns; i++) close(p->conns[i]);
    p->lfd = p->wake[0] = p->wake[1] = -1;
    p->nconns = p->active = 0;
    p->stopping = p->forked = true;
}

int ckptio_peer_open(ckptio_peer **out, const char *root, const char *addr, int port,
                     const ckptio_peer_opts *o)
{
    if (!out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_open: out is required");
    *out = NULL;
    if (!root || !*root || port < 0 || port > 65535)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_open: a root and a port in 0..65535 are required");
    CKPTIO__TRY(ckptio__peer_key_check(o ? o->key : NULL, o ? o->key_len : 0, "ckptio_peer_open"));
    ckptio__msg m = {0};
    struct addrinfo *ai = NULL;
    int rc = resolve(addr, port, 1, &ai, &m);
    if (rc < 0) return ckptio__refail(NULL, &m, rc, "ckptio_peer_open", NULL);
    ckptio_peer *p = calloc(1, sizeof *p);
    if (!p || !(p->root = strdup(root))) {
        freeaddrinfo(ai);
        free(p);
        return ckptio__fail(NULL, -ENOMEM, "out of memory");
    }
    memcpy(p->key, o->key, o->key_len);
    p->key_len = o->key_len;
    p->timeout = o->timeout > 0 ? o->timeout : PEER_SERVE_TIMEOUT;
    p->lfd = p->wake[0] = p->wake[1] = -1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (p->lfd < 0 || setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(p->lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(p->lfd, 64) < 0) {
        rc = ckptio__fail(&m, -errno, "cannot listen on %s:%d: %s", addr && *addr ? addr : "*",
                          port, strerror(errno));
        goto out;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(p->lfd, (struct sockaddr *)&ss, &sl);
    p->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    if (pipe2(p->wake, O_CLOEXEC) < 0) {
        rc = ckptio__fail(&m, -errno, "pipe: %s", strerror(errno));
        goto out;
    }
    /* Listed as the thread starts, under the list's lock: a fork sees both or neither. */
    p->fork = (ckptio__forksafe){&p->lock, fork_child, p, NULL};
    ckptio__forksafe_lock();
    int e = pthread_create(&p->thread, NULL, accept_thread, p);
    if (!e) ckptio__forksafe_add_locked(&p->fork);
    ckptio__forksafe_unlock();
    if (e) {
        rc = ckptio__fail(&m, -EAGAIN, "cannot start the peer server's thread");
        goto out;
    }
    freeaddrinfo(ai);
    *out = p;
    return 0;
out:
    freeaddrinfo(ai);
    if (p->lfd >= 0) close(p->lfd);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    OPENSSL_cleanse(p->key, sizeof p->key);
    free(p->root);
    free(p);
    return ckptio__refail(NULL, &m, rc, "ckptio_peer_open", NULL);
}

int ckptio_peer_port(const ckptio_peer *p)
{
    return p ? p->port : CKPTIO_E_USAGE;
}

void ckptio_peer_close(ckptio_peer *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    bool forked = p->forked;
    p->stopping = true;
    pthread_mutex_unlock(&p->lock);
    if (!forked) {
        ssize_t w;
        do w = write(p->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(p->thread, NULL);
        pthread_mutex_lock(&p->lock);
        for (int i = 0; i < p->nconns; i++) shutdown(p->conns[i], SHUT_RDWR);
        while (p->active) pthread_cond_wait(&p->cond, &p->lock);
        /* closed under the lock, so that a fork from here on finds them closed */
        close(p->lfd);
        close(p->wake[0]);
        close(p->wake[1]);
        p->lfd = p->wake[0] = p->wake[1] = -1;
        pthread_mutex_unlock(&p->lock);
    }
    ckptio__forksafe_remove(&p->fork); /* the list's lock before p->lock, as fork takes them */
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p->conns);
    free(p->root);
    OPENSSL_cleanse(p->key, sizeof p->key);
    free(p);
}

/* ---- the client ---- */

/* The outcome of a connect(2) that returned -1 with `err`: 0 once connected, else an errno. A
 * signal handled on this thread interrupts it (EINTR, even with SA_RESTART, since the socket
 * has a timeout) while the connection goes on being made: wait for it, up to `timeout`. */
static int connect_rest(int fd, int err, double timeout)
{
    if (err != EINTR && err != EINPROGRESS) return err;
    double end = ckptio__now() + (timeout > 0 ? timeout : 3600.0);
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int ms = (int)CKPTIO__MAX((end - ckptio__now()) * 1e3, 0.0);
        int n = poll(&pf, 1, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return ETIMEDOUT;
        int so = 0;
        socklen_t len = sizeof so;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) < 0) return errno;
        return so;
    }
}

static int dial(const char *host, int port, double timeout, ckptio__msg *m)
{
    struct addrinfo *ai = NULL;
    CKPTIO__TRY(resolve(host, port, 0, &ai, m));
    int fd = -1, err = ECONNREFUSED;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        ckptio__peer_set_timeout(fd, timeout);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && (err = connect_rest(fd, errno, timeout))) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) return ckptio__fail(m, -err, "cannot connect to the peer at %s:%d: %s", host, port, strerror(err));
    return fd;
}

/* Check a destination of ckptio_part_spread; its outcome cleared. */
static int dest_check(ckptio_part_dest *d, const char *name, const ckptio_peer_opts *o)
{
    if (d->size < sizeof *d)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: a destination's size is %u, "
                            "not sizeof(ckptio_part_dest) = %zu", d->size, sizeof *d);
    d->rc = 0;
    d->bytes = 0;
    d->errmsg[0] = '\0';
    if (d->host && (d->port <= 0 || d->port > 65535))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: port %d of '%s' is not a TCP port",
                            d->port, d->host);
    if (d->host) CKPTIO__TRY(ckptio__peer_key_check(o ? o->key : NULL, o ? o->key_len : 0, "ckptio_part_spread"));
    if (d->host && (!name || !ckptio__peer_safe_rel(name)))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: '%s' is not a relative part name",
                            name ? name : "(null)");
    if (!d->host && !d->dst)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: a destination needs a host or a dst");
    int remote = d->host ? 0 : ckptio__store_remote(d->dst, NULL);
    if (remote < 0) return remote;
    if (remote)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: '%s' is in an object store; a part "
                            "goes there through ckptio_convert (ckptio to ckptio)", d->dst);
    return 0;
}

int ckptio_part_spread(const char *src, const char *name, ckptio_part_dest *d, size_t n,
                       const ckptio_peer_opts *o)
{
    ckptio__msg m = {0};
    if (!src || !d || !n) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_spread: src and destinations are required");
    for (size_t i = 0; i < n; i++) CKPTIO__TRY(dest_check(&d[i], name, o));
    sink *s = calloc(n, sizeof *s);
    ckptio__txn *t = calloc(n, sizeof *t);
    char (*who)[160] = calloc(n, sizeof *who);
    if (!s || !t || !who) {
        free(s);
        free(t);
        free(who);
        return ckptio__fail(NULL, -ENOMEM, "ckptio_part_spread: out of memory");
    }
    for (size_t i = 0; i < n; i++) s[i].sock = s[i].out = -1;
    int rc = 0;
    if (ckptio_is_checkpoint(src) != 1)
        rc = ckptio__fail(&m, CKPTIO_E_NOT_CHECKPOINT, "'%s' is not a committed checkpoint to send", src);
    nopipe np;
    ckptio__peer_nopipe_begin(&np);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        s[i].who = who[i];
        if (d[i].host) {
            snprintf(who[i], sizeof who[i], "the peer at %s:%d", d[i].host, d[i].port);
            uint8_t session[PEER_MAC];
            int fd = dial(d[i].host, d[i].port, o->timeout, &s[i].m);
            if (fd < 0) s[i].rc = fd;
            else if ((s[i].sock = fd, s[i].rc = ckptio__peer_client_auth(fd, o->key, o->key_len, s[i].who, session, &s[i].m)) < 0)
                s[i].sock = (close(fd), -1); /* a server refused or unproven hears nothing more */
            else if ((s[i].rc = ckptio__peer_send_request(fd, session, PEER_PUT, name)) < 0)
                ckptio__peer_sink_fail(&s[i], s[i].rc, "the request");
        } else {
            snprintf(who[i], sizeof who[i], "%s", d[i].dst);
            s[i].t = &t[i];
            s[i].rc = ckptio__peer_begin_part(&t[i], d[i].dst, false, &s[i].m);
        }
    }
    pacer pc = {o ? o->max_rate : 0, 0, ckptio__now()};
    if (rc == 0) rc = ckptio__peer_send_pass(src, s, n, &pc, &m);
    for (size_t i = 0; i < n; i++) {
        if (rc < 0 && s[i].rc == 0) s[i].rc = ckptio__refail(&s[i].m, &m, rc, NULL, NULL);
        /* A peer's reply says why, even when it stopped reading early. */
        if (s[i].sock >= 0 && (s[i].rc == 0 || s[i].rc == -EPIPE || s[i].rc == -ECONNRESET)) {
            int r2 = ckptio__peer_recv_reply(s[i].sock, s[i].who, &s[i].m);
            if (s[i].rc == 0 || r2 < 0) s[i].rc = r2;
        }
        if (s[i].t && s[i].rc == 0) s[i].rc = ckptio__peer_finish_part(&t[i], o ? o->flags : 0, d[i].dst, &s[i].m);
        if (s[i].sock >= 0) close(s[i].sock);
        if (s[i].t) ckptio__txn_fini(&t[i]);
        d[i].rc = s[i].rc;
        d[i].bytes = s[i].bytes;
        snprintf(d[i].errmsg, sizeof d[i].errmsg, "%s",
                 s[i].rc == 0 ? "" : s[i].m.text[0] ? s[i].m.text : strerror(-s[i].rc));
    }
    ckptio__peer_nopipe_end(&np);
    size_t bad = 0;
    while (bad < n && d[bad].rc == 0) bad++;
    rc = bad < n ? ckptio__refail(NULL, &s[bad].m, d[bad].rc, d[bad].errmsg, NULL) : 0;
    free(s);
    free(t);
    free(who);
    return rc;
}

int ckptio_peer_push(const char *src, const char *host, int port, const char *name,
                     const ckptio_peer_opts *o, uint64_t *bytes)
{
    if (!host) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_push: src, host, port and name are required");
    ckptio_part_dest d = {.size = sizeof d, .host = host, .port = port};
    int rc = ckptio_part_spread(src, name, &d, 1, o);
    if (bytes) *bytes = d.bytes;
    return rc;
}

int ckptio__peer_fetch_on(int fd, const unsigned char *key, size_t klen, const char *name,
                          const char *dst, unsigned flags, const char *who, uint64_t *bytes,
                          ckptio__msg *m)
{
    ckptio__txn t = {0};
    uint8_t session[PEER_MAC];
    int rc = ckptio__peer_client_auth(fd, key, klen, who, session, m);
    if (rc == 0) rc = ckptio__peer_begin_part(&t, dst, true, m);
    if (rc == 0 && (rc = ckptio__peer_send_request(fd, session, PEER_GET, name)) < 0)
        ckptio__fail(m, rc, "%s: cannot send the request (%s)", who, strerror(-rc));
    if (rc == 0) rc = ckptio__peer_recv_reply(fd, who, m);
    if (rc == 0) rc = recv_files(fd, &t, who, bytes, m);
    if (rc == 0) rc = ckptio__peer_finish_part(&t, flags, dst, m);
    ckptio__txn_fini(&t);
    return rc;
}

int ckptio_peer_fetch(const char *host, int port, const char *name, const char *dst,
                      const ckptio_peer_opts *o, uint64_t *bytes)
{
    if (!dst || !host || !name || port <= 0 || port > 65535)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_fetch: host, port, name and dst are required");
    CKPTIO__TRY(ckptio__peer_key_check(o ? o->key : NULL, o ? o->key_len : 0, "ckptio_peer_fetch"));
    ckptio__msg m = {0};
    uint64_t got = 0;
    char who[128];
    snprintf(who, sizeof who, "the peer at %s:%d", host, port);
    int fd = dial(host, port, o->timeout, &m);
    int rc = fd < 0 ? fd : ckptio__peer_fetch_on(fd, o->key, o->key_len, name, dst, o->flags, who, &got, &m);
    if (fd >= 0) close(fd);
    if (bytes) *bytes = got;
    return rc < 0 ? ckptio__refail(NULL, &m, rc, "fetching a part from a peer", NULL) : 0;
}

int ckptio_part_copy(const char *src, const char *dst, const ckptio_peer_opts *o, uint64_t *bytes)
{
    if (!dst) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_part_copy: src and dst are required");
    ckptio_part_dest d = {.size = sizeof d, .dst = dst};
    int rc = ckptio_part_spread(src, NULL, &d, 1, o);
    if (bytes) *bytes = d.bytes;
    return rc;
}
