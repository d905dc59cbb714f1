/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's transport: a rank's server for its node's checkpoint parts, pushes, fetches and copies that publish only verified parts. */
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

#include "../commit/txn.h"
#include "../common/forksafe.h"
#include "../io/params.h"
#include "../store/store.h"

/* The wire, little-endian, one request per connection:
 *   request  "CKPR" u32 version u32 op u32 name_len name
 *   PUT      request, then the part's files, then the server's reply
 *   GET      request; the server replies, then (status 0) sends the part's files
 *   files    per file: u32 path_len path u64 size bytes; a path_len of 0 ends them
 *   reply    i32 status u32 msg_len msg
 * Paths are relative to the part ("manifest", "data/000000.ckd"). What arrives goes into a
 * commit transaction of the target (a "<name>.tmp-<pid>.<n>" directory), is verified and only
 * then renamed into place: a sender or receiver that dies halfway leaves no part behind. */
#define PEER_MAGIC 0x52504b43u /* "CKPR" */
#define PEER_VERSION 1u
#define PEER_PUT 1u
#define PEER_GET 2u
#define PEER_MAX_NAME 4096u
#define PEER_CHUNK (1u << 20)
#define PEER_SERVE_TIMEOUT 120.0 /* seconds a server waits on a silent connection */

struct ckptio_peer {
    char *root;
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

/* ---- bytes on a socket ---- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int set_timeout(int fd, double seconds)
{
    if (seconds <= 0) return 0;
    struct timeval tv = {.tv_sec = (time_t)seconds,
                         .tv_usec = (suseconds_t)((seconds - (double)(time_t)seconds) * 1e6)};
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1000;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
        return -errno;
    return 0;
}

static int send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* -EPIPE when the other side closed before `len` bytes came. */
static int recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        if (n == 0) return -EPIPE;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_reply(int fd, int status, const char *msg)
{
    size_t len = msg ? strlen(msg) : 0;
    uint8_t h[8];
    put32(h, (uint32_t)status);
    put32(h + 4, (uint32_t)len);
    int rc = send_all(fd, h, sizeof h);
    return rc < 0 || !len ? rc : send_all(fd, msg, len);
}

/* The other side's reply: its status, its message into m when it failed. */
static int recv_reply(int fd, const char *who, ckptio__msg *m)
{
    uint8_t h[8];
    int rc = recv_all(fd, h, sizeof h);
    if (rc < 0) return ckptio__fail(m, rc, "%s sent no reply (%s)", who, strerror(-rc));
    int status = (int)get32(h);
    uint32_t len = get32(h + 4);
    char text[CKPTIO__MSG_LEN];
    size_t keep = CKPTIO__MIN((size_t)len, sizeof text - 1);
    if ((rc = recv_all(fd, text, keep)) < 0) return ckptio__fail(m, rc, "%s: reply cut short", who);
    text[keep] = '\0';
    for (uint32_t left = len - (uint32_t)keep; left;) { /* drain what did not fit */
        char sink[256];
        uint32_t n = CKPTIO__MIN(left, (uint32_t)sizeof sink);
        if (recv_all(fd, sink, n) < 0) break;
        left -= n;
    }
    if (status >= 0) return 0;
    return ckptio__fail(m, status, "%s: %s", who, text);
}

/* ---- the files of a part ---- */

typedef struct files {
    char **rel; /* paths relative to the part */
    uint64_t *size;
    size_t n, cap;
} files;

static void files_free(files *f)
{
    for (size_t i = 0; i < f->n; i++) free(f->rel[i]);
    free(f->rel);
    free(f->size);
    memset(f, 0, sizeof *f);
}

static int files_add(files *f, const char *rel, uint64_t size)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        char **r = realloc(f->rel, cap * sizeof *r);
        if (!r) return -ENOMEM;
        f->rel = r;
        uint64_t *s = realloc(f->size, cap * sizeof *s);
        if (!s) return -ENOMEM;
        f->size = s;
        f->cap = cap;
    }
    if (!(f->rel[f->n] = strdup(rel))) return -ENOMEM;
    f->size[f->n++] = size;
    return 0;
}

/* The regular files under `dir`/`sub`, recursively. */
static int list_files(const char *dir, const char *sub, files *f, ckptio__msg *m)
{
    char *path = NULL;
    if (asprintf(&path, "%s%s%s", dir, *sub ? "/" : "", sub) < 0) return -ENOMEM;
    DIR *d = opendir(path);
    if (!d) {
        int rc = ckptio__fail(m, -errno, "cannot list '%s': %s", path, strerror(errno));
        free(path);
        return rc;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *rel = NULL;
        if (asprintf(&rel, "%s%s%s", sub, *sub ? "/" : "", e->d_name) < 0) {
            rc = -ENOMEM;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            rc = ckptio__fail(m, -errno, "cannot stat '%s/%s': %s", dir, rel, strerror(errno));
        else if (S_ISDIR(st.st_mode))
            rc = list_files(dir, rel, f, m);
        else if (S_ISREG(st.st_mode))
            rc = files_add(f, rel, (uint64_t)st.st_size);
        free(rel);
    }
    closedir(d);
    free(path);
    return rc;
}

/* A relative path a part may hold: components of ordinary names, no "." or "..". */
static bool safe_rel(const char *rel)
{
    if (!*rel || *rel == '/') return false;
    for (const char *p = rel; *p;) {
        const char *q = strchr(p, '/');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += len + (q != NULL);
        if (q && !*p) return false;
    }
    return true;
}

/* Create `rel` for writing in the transaction's directory, making its directories. */
static int create_in(int dirfd, const char *rel, ckptio__msg *m, const char *where)
{
    char buf[PATH_MAX];
    if (strlen(rel) >= sizeof buf) return ckptio__fail(m, CKPTIO_E_CORRUPT, "%s: path too long", where);
    strcpy(buf, rel);
    for (char *s = strchr(buf, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(dirfd, buf, 0755) < 0 && errno != EEXIST)
            return ckptio__fail(m, -errno, "%s: cannot create '%s': %s", where, buf, strerror(errno));
        *s = '/';
    }
    int fd = openat(dirfd, rel, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ckptio__fail(m, -errno, "%s: cannot create '%s': %s", where, rel, strerror(errno));
    return fd;
}

/* Every block of the part at `path` against its checksum: 0, or CKPTIO_E_CHECKSUM naming how
 * many failed. */
static int verify_part(const char *path, const char *what, ckptio__msg *m)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, path, NULL);
    if (rc < 0) {
        ckptio__msg last;
        ckptio__msg_last(&last);
        return ckptio__fail(m, rc, "%s is not a readable checkpoint: %s", what, last.text);
    }
    uint64_t bad = 0;
    rc = ckptio_reader_verify(r, &bad);
    if (rc < 0 && bad)
        rc = ckptio__fail(m, CKPTIO_E_CHECKSUM, "%s: %llu block(s) fail their checksums", what,
                          (unsigned long long)bad);
    else if (rc < 0)
        rc = ckptio__fail(m, rc, "%s: %s", what, ckptio_reader_errmsg(r));
    ckptio_reader_close(r);
    return rc;
}

/* `dir` and the directories above it, as mkdir -p. */
static int make_dirs(const char *dir, ckptio__msg *m)
{
    char buf[PATH_MAX];
    if (strlen(dir) >= sizeof buf) return ckptio__fail(m, -ENAMETOOLONG, "'%s': path too long", dir);
    strcpy(buf, dir);
    for (char *s = buf + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return ckptio__fail(m, -errno, "cannot create '%s': %s", buf, strerror(errno));
        if (!c) return 0;
        *s = c;
    }
}

/* Begin the transaction of part `dst` (its parent directories made), replacing what is there
 * only once the new part is published. */
static int begin_part(ckptio__txn *t, const char *dst, ckptio__msg *m)
{
    char *parent = ckptio__parent_dir(dst);
    if (!parent) return -ENOMEM;
    int rc = make_dirs(parent, m);
    free(parent);
    if (rc < 0) return rc;
    return ckptio__txn_begin(t, dst, CKPTIO__TXN_DIR, CKPTIO__TXN_OVERWRITE | CKPTIO__TXN_FSYNC,
                             CKPTIO_OFF, m);
}

/* Verify (when asked) what the transaction's directory holds, then publish it. */
static int finish_part(ckptio__txn *t, unsigned flags, const char *what, ckptio__msg *m)
{
    if (flags & CKPTIO_PEER_VERIFY) CKPTIO__TRY(verify_part(t->tmp_path, what, m));
    return ckptio__txn_publish(t, NULL, 0, m);
}

/* ---- sending and receiving a part's files ---- */

typedef struct pacer {
    uint64_t rate; /* bytes per second; 0: no limit */
    uint64_t sent;
    double t0;
} pacer;

static void pace(pacer *p, uint64_t n)
{
    p->sent += n;
    if (!p->rate) return;
    double ahead = (double)p->sent / (double)p->rate - (ckptio__now() - p->t0);
    if (ahead > 0) {
        struct timespec ts = {.tv_sec = (time_t)ahead,
                              .tv_nsec = (long)((ahead - (double)(time_t)ahead) * 1e9)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
    }
}

/* sendfile(2) has no MSG_NOSIGNAL: while it runs, SIGPIPE is blocked in this thread, and one it
 * raised is taken off the thread's pending set before the mask is restored, so that a peer that
 * goes away fails the call (-EPIPE) instead of killing the process. */
typedef struct nopipe {
    sigset_t old;
    bool was_pending;
} nopipe;

static void nopipe_begin(nopipe *np)
{
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    np->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &np->old);
}

static void nopipe_end(nopipe *np)
{
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    if (!np->was_pending && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &np->old, NULL);
}

/* ---- a pass over a part's files: each file read once, sent or written to every sink ---- */

/* Where a pass sends a part: a peer's connection, or a transaction's directory. */
typedef struct sink {
    int sock;        /* a connection (>= 0), or -1 */
    ckptio__txn *t;  /* else: the files are created in t's directory */
    int out;         /* t: the file being written (-1: none) */
    int rc;          /* 0 while it takes the part; else why it stopped (m says) */
    uint64_t bytes;  /* bytes sent or written */
    const char *who; /* "the peer at host:port", or the part's path */
    ckptio__msg m;
} sink;

#define SPREAD_CHUNK (4u << 20) /* a slot of the ring of a pass with several sinks */
#define SPREAD_SLOTS 4u         /* chunks read ahead of the slowest sink */
#define SPREAD_ALIGN 4096u      /* what O_DIRECT reads of the part are aligned to */

static int write_all(int fd, const uint8_t *p, size_t n);

static int sink_fail(sink *s, int rc, const char *rel)
{
    if (s->sock >= 0)
        return s->rc = ckptio__fail(&s->m, rc, "sending '%s' to %s broke off: %s", rel, s->who,
                                    strerror(-rc));
    return s->rc = ckptio__fail(&s->m, rc, "cannot write '%s/%s': %s", s->t->tmp_path, rel,
                                strerror(-rc));
}

/* Start file `rel` of `size` bytes on sink s (its record on a connection; a file created in a
 * transaction's directory). */
static void sink_begin(sink *s, const char *rel, uint64_t size)
{
    if (s->sock < 0) {
        int fd = create_in(s->t->tmp_fd, rel, &s->m, s->t->tmp_path);
        if (fd < 0) s->rc = fd;
        else s->out = fd;
        return;
    }
    size_t len = strlen(rel);
    uint8_t h[12];
    put32(h, (uint32_t)len);
    put64(h + 4, size);
    int rc = send_all(s->sock, h, 4);
    if (rc == 0) rc = send_all(s->sock, rel, len);
    if (rc == 0) rc = send_all(s->sock, h + 4, 8);
    if (rc < 0) sink_fail(s, rc, rel);
}

/* End the file on sink s: a written file is fsynced and closed. */
static void sink_end(sink *s, const char *rel)
{
    if (s->out < 0) return;
    if (s->rc == 0 && fdatasync(s->out) < 0)
        s->rc = ckptio__fail(&s->m, -errno, "cannot fsync '%s/%s': %s", s->t->tmp_path, rel,
                             strerror(errno));
    close(s->out);
    s->out = -1;
}

static void sink_put(sink *s, const uint8_t *buf, size_t n, const char *rel)
{
    int rc = s->sock >= 0 ? send_all(s->sock, buf, n) : write_all(s->out, buf, n);
    if (rc < 0) sink_fail(s, rc, rel);
    else s->bytes += n;
}

/* The whole file `in` to one sink, copied by the kernel: sendfile(2) to a connection,
 * copy_file_range(2) to a file (sendfile between the files where it refuses: EXDEV across
 * file systems on older kernels). */
static void sink_move(sink *s, int in, uint64_t size, const char *path, const char *rel, pacer *pc)
{
    bool in_kernel = s->sock < 0;
    for (uint64_t left = size; s->rc == 0 && left;) {
        size_t want = (size_t)CKPTIO__MIN(left, (uint64_t)(pc->rate ? 64u << 10 : 64u << 20));
        ssize_t n = in_kernel ? copy_file_range(in, NULL, s->out, NULL, want, 0)
                              : sendfile(s->sock >= 0 ? s->sock : s->out, in, NULL, want);
        if (n < 0 && in_kernel && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                                   errno == EOPNOTSUPP)) {
            in_kernel = false;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && s->sock >= 0) sink_fail(s, errno == EAGAIN ? -ETIMEDOUT : -errno, rel);
        else if (n < 0)
            s->rc = ckptio__fail(&s->m, -errno, "cannot copy '%s' to '%s': %s", path,
                                 s->t->tmp_path, strerror(errno));
        else if (n == 0)
            s->rc = ckptio__fail(&s->m, CKPTIO_E_CORRUPT, "'%s' shrank while it was copied", path);
        else {
            left -= (uint64_t)n;
            s->bytes += (uint64_t)n;
            pace(pc, (uint64_t)n);
        }
    }
}

/* A file of the part, read by a pass with several sinks: O_DIRECT where the file system takes
 * it (a local tier on NVMe that the save wrote with O_DIRECT is read from the device, not
 * through the page cache), else through the page cache (tmpfs). */
typedef struct source {
    int fd;
    bool direct;
} source;

static int source_open(source *src, const char *path, ckptio__msg *m)
{
    src->direct = true;
    src->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (src->fd < 0 && errno == EINVAL) {
        src->direct = false;
        src->fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    return src->fd < 0 ? ckptio__fail(m, -errno, "cannot open '%s': %s", path, strerror(errno)) : 0;
}

/* Up to `want` bytes at `off` (aligned for O_DIRECT); fewer only at the file's end. */
static ssize_t source_read(source *src, uint8_t *buf, size_t want, uint64_t off)
{
    for (;;) {
        size_t ask = src->direct ? ckptio__align_up(want, SPREAD_ALIGN) : want;
        ssize_t n = pread(src->fd, buf, ask, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL && src->direct) { /* unaligned after a short read */
            int flags = fcntl(src->fd, F_GETFL);
            if (flags < 0 || fcntl(src->fd, F_SETFL, flags & ~O_DIRECT) < 0) return -errno;
            src->direct = false;
            continue;
        }
        return n < 0 ? -errno : (ssize_t)CKPTIO__MIN((size_t)n, want);
    }
}

/* One file's chunks, read once by the caller into a ring of slots and taken by every sink on
 * a thread of its own: the read runs ahead of the slowest sink by the ring's slots, and no sink
 * waits on another (a push is not held back by the persistent copy's disk, nor by a slower
 * peer). */
typedef struct relay {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint8_t *slot[SPREAD_SLOTS];
    size_t len[SPREAD_SLOTS];
    uint64_t filled; /* chunks read so far */
    bool ended;      /* no more: the file's end, or its read failed */
    const char *rel;
} relay;

typedef struct taker {
    relay *r;
    sink *s;
    uint64_t taken; /* chunks this sink has sent or written; UINT64_MAX once it failed */
    pthread_t thread;
    bool started;
} taker;

static void *take_chunks(void *arg)
{
    taker *k = arg;
    relay *r = k->r;
    for (uint64_t c = 0;; c++) {
        pthread_mutex_lock(&r->lock);
        while (r->filled <= c && !r->ended) pthread_cond_wait(&r->cond, &r->lock);
        bool have = r->filled > c;
        const uint8_t *p = r->slot[c % SPREAD_SLOTS];
        size_t len = r->len[c % SPREAD_SLOTS];
        pthread_mutex_unlock(&r->lock);
        if (!have) break;
        sink_put(k->s, p, len, r->rel);
        pthread_mutex_lock(&r->lock);
        k->taken = k->s->rc == 0 ? c + 1 : UINT64_MAX;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        if (k->s->rc) break;
    }
    return NULL;
}

/* Whether chunk c may be read into its slot (every sink has taken the chunk that was there),
 * and how many sinks still take chunks. Under the lock. */
static bool slot_free(const taker *k, size_t nk, uint64_t c, size_t *live)
{
    bool free_ = true;
    *live = 0;
    for (size_t i = 0; i < nk; i++) {
        if (k[i].taken == UINT64_MAX) continue;
        ++*live;
        if (c >= SPREAD_SLOTS && k[i].taken < c + 1 - SPREAD_SLOTS) free_ = false;
    }
    return free_;
}

/* File `path` (`size` bytes) to every live sink through a relay over `ring` (SPREAD_SLOTS
 * chunks of `chunk` bytes). < 0 (m says why) when the file cannot be read. */
static int relay_file(const char *path, const char *rel, uint64_t size, sink *s, size_t n,
                      uint8_t *ring, size_t chunk, pacer *pc, ckptio__msg *m)
{
    source src = {-1, false};
    CKPTIO__TRY(source_open(&src, path, m));
    relay r = {.rel = rel};
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.cond, NULL);
    for (unsigned i = 0; i < SPREAD_SLOTS; i++) r.slot[i] = ring + (size_t)i * chunk;
    taker *k = calloc(n, sizeof *k);
    size_t nk = 0;
    if (!k) {
        close(src.fd);
        return ckptio__fail(m, -ENOMEM, "out of memory sending '%s'", path);
    }
    /* The takers block every signal: the application's (Ctrl-C) belong to the caller. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (size_t i = 0; i < n; i++) {
        if (s[i].rc) continue;
        k[nk] = (taker){.r = &r, .s = &s[i]};
        int e = pthread_create(&k[nk].thread, NULL, take_chunks, &k[nk]);
        if (e) {
            s[i].rc = ckptio__fail(&s[i].m, -e, "cannot start a thread to send '%s' to %s: %s",
                                   rel, s[i].who, strerror(e));
            continue;
        }
        k[nk++].started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    int rc = 0;
    for (uint64_t c = 0, off = 0; off < size; c++) {
        size_t live;
        pthread_mutex_lock(&r.lock);
        while (!slot_free(k, nk, c, &live)) pthread_cond_wait(&r.cond, &r.lock);
        pthread_mutex_unlock(&r.lock);
        if (!live) break;
        size_t want = (size_t)CKPTIO__MIN(size - off, (uint64_t)chunk);
        ssize_t got = source_read(&src, r.slot[c % SPREAD_SLOTS], want, off);
        if (got <= 0) {
            rc = got < 0 ? ckptio__fail(m, (int)got, "cannot read '%s': %s", path, strerror((int)-got))
                         : ckptio__fail(m, CKPTIO_E_CORRUPT, "'%s' shrank while it was sent", path);
            break;
        }
        pthread_mutex_lock(&r.lock);
        r.len[c % SPREAD_SLOTS] = (size_t)got;
        r.filled = c + 1;
        pthread_cond_broadcast(&r.cond);
        pthread_mutex_unlock(&r.lock);
        off += (uint64_t)got;
        pace(pc, (uint64_t)got);
    }
    pthread_mutex_lock(&r.lock);
    r.ended = true;
    pthread_cond_broadcast(&r.cond);
    pthread_mutex_unlock(&r.lock);
    for (size_t i = 0; i < nk; i++) pthread_join(k[i].thread, NULL);
    free(k);
    pthread_cond_destroy(&r.cond);
    pthread_mutex_destroy(&r.lock);
    close(src.fd);
    return rc;
}

/* Send the files of the part at `dir` to every sink, each file read once: with one sink left,
 * by the kernel (sink_move); with more, through a relay (relay_file). A sink that fails stops
 * there (its rc and m say why) and the others go on; an end record closes each connection's
 * stream. < 0 (m says why) only when the part itself cannot be read: then no sink has it. */
static int send_pass(const char *dir, sink *s, size_t n, pacer *pc, ckptio__msg *m)
{
    files f = {0};
    uint8_t *ring = NULL;
    size_t chunk = pc->rate ? 64u << 10 : SPREAD_CHUNK;
    int rc = list_files(dir, "", &f, m);
    for (size_t i = 0; rc == 0 && i < f.n; i++) {
        const char *rel = f.rel[i];
        size_t live = 0;
        for (size_t k = 0; k < n; k++)
            if (s[k].rc == 0 && (sink_begin(&s[k], rel, f.size[i]), s[k].rc == 0)) live++;
        if (!live) break;
        char *path = NULL;
        if (asprintf(&path, "%s/%s", dir, rel) < 0) {
            rc = -ENOMEM;
            break;
        }
        if (live == 1) {
            int in = open(path, O_RDONLY | O_CLOEXEC);
            if (in < 0) rc = ckptio__fail(m, -errno, "cannot open '%s': %s", path, strerror(errno));
            for (size_t k = 0; in >= 0 && k < n; k++)
                if (s[k].rc == 0) sink_move(&s[k], in, f.size[i], path, rel, pc);
            if (in >= 0) close(in);
        } else if (!ring && posix_memalign((void **)&ring, SPREAD_ALIGN, (size_t)SPREAD_SLOTS * chunk)) {
            ring = NULL;
            rc = ckptio__fail(m, -ENOMEM, "out of memory sending '%s'", path);
        } else {
            rc = relay_file(path, rel, f.size[i], s, n, ring, chunk, pc, m);
        }
        for (size_t k = 0; k < n; k++) sink_end(&s[k], rel);
        free(path);
    }
    for (size_t k = 0; rc == 0 && k < n; k++) {
        uint8_t end[4] = {0};
        int r = s[k].rc == 0 && s[k].sock >= 0 ? send_all(s[k].sock, end, 4) : 0;
        if (r < 0) sink_fail(&s[k], r, "the end record");
    }
    free(ring);
    files_free(&f);
    return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

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
                    int rc = write_all(fd, tmp, (size_t)r);
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

/* Receive file records into the transaction's directory until the end record. */
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
        if ((rc = recv_all(sock, h, 4)) < 0) break;
        uint32_t len = get32(h);
        if (len == 0) break;
        char rel[PATH_MAX];
        if (len >= sizeof rel) {
            rc = ckptio__fail(m, CKPTIO_E_CORRUPT, "%s sent a file name of %u bytes", who, len);
            break;
        }
        if ((rc = recv_all(sock, rel, len)) < 0 || (rc = recv_all(sock, h, 8)) < 0) break;
        rel[len] = '\0';
        if (!safe_rel(rel) || strlen(rel) != len) {
            rc = ckptio__fail(m, CKPTIO_E_CORRUPT, "%s sent a file name that is not a plain relative path", who);
            break;
        }
        uint64_t size = get64(h);
        int fd = create_in(t->tmp_fd, rel, m, t->tmp_path);
        if (fd < 0) {
            rc = fd;
            break;
        }
        uint64_t left = size;
        if (pp[0] >= 0) rc = splice_in(sock, pp, fd, &left, bytes);
        if (rc == -EINVAL) rc = 0; /* this file system takes no splice: the rest by copies */
        while (rc == 0 && left) {
            size_t n = (size_t)CKPTIO__MIN(left, (uint64_t)PEER_CHUNK);
            if ((rc = recv_all(sock, buf, n)) < 0) break;
            rc = write_all(fd, buf, n);
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

static int send_request(int sock, uint32_t op, const char *name)
{
    size_t len = strlen(name);
    uint8_t h[16];
    put32(h, PEER_MAGIC);
    put32(h + 4, PEER_VERSION);
    put32(h + 8, op);
    put32(h + 12, (uint32_t)len);
    int rc = send_all(sock, h, sizeof h);
    return rc < 0 ? rc : send_all(sock, name, len);
}

/* The part `name` under root, after checking it is a relative name of the root's. */
static int part_path(const char *root, const char *name, char **out)
{
    if (!safe_rel(name)) return CKPTIO_E_USAGE;
    return asprintf(out, "%s/%s", root, name) < 0 ? -ENOMEM : 0;
}

/* ---- the server ---- */

typedef struct conn {
    ckptio_peer *p;
    int fd;
} conn;

static void serve_put(int fd, const char *name, const char *path)
{
    ckptio__msg m = {0};
    ckptio__txn t = {0};
    uint64_t bytes = 0;
    int rc = begin_part(&t, path, &m);
    if (rc == 0) rc = recv_files(fd, &t, "the sending rank", &bytes, &m);
    if (rc == 0) rc = finish_part(&t, CKPTIO_PEER_VERIFY, path, &m);
    ckptio__txn_fini(&t); /* not published: its directory goes */
    if (rc < 0 && !m.text[0]) snprintf(m.text, sizeof m.text, "%s", strerror(-rc));
    if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET) {
        char text[CKPTIO__MSG_LEN + 64];
        snprintf(text, sizeof text, "part '%s' not kept: %s", name, m.text);
        send_reply(fd, rc, text);
        return;
    }
    if (rc == 0) send_reply(fd, 0, "");
}

static void serve_get(int fd, const char *path)
{
    ckptio__msg m = {0};
    if (ckptio_is_checkpoint(path) != 1) {
        char text[PATH_MAX + 64];
        snprintf(text, sizeof text, "no committed part at '%s'", path);
        send_reply(fd, -ENOENT, text);
        return;
    }
    if (send_reply(fd, 0, "") < 0) return;
    pacer pc = {0, 0, ckptio__now()};
    sink s = {.sock = fd, .out = -1, .who = "the fetching rank"};
    nopipe np;
    nopipe_begin(&np);
    send_pass(path, &s, 1, &pc, &m); /* a failure shows as a short stream there */
    nopipe_end(&np);
}

static void *conn_thread(void *arg)
{
    conn *c = arg;
    ckptio_peer *p = c->p;
    int fd = c->fd;
    free(c);
    set_timeout(fd, PEER_SERVE_TIMEOUT);
    uint8_t h[16];
    if (recv_all(fd, h, sizeof h) == 0 && get32(h) == PEER_MAGIC && get32(h + 4) == PEER_VERSION &&
        get32(h + 12) < PEER_MAX_NAME) {
        uint32_t op = get32(h + 8), len = get32(h + 12);
        char *name = calloc(1, (size_t)len + 1);
        char *path = NULL;
        if (name && recv_all(fd, name, len) == 0) {
            int rc = part_path(p->root, name, &path);
            if (rc < 0) send_reply(fd, rc, "not a part name of this root");
            else if (op == PEER_PUT) serve_put(fd, name, path);
            else if (op == PEER_GET) serve_get(fd, path);
            else send_reply(fd, CKPTIO_E_USAGE, "unknown request");
        }
        free(path);
        free(name);
    }
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->nconns; i++)
        if (p->conns[i] == fd) p->conns[i] = p->conns[--p->nconns];
    close(fd);
    p->active--;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
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
        int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
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
        if (grown && !p->stopping) {
            c->p = p;
            c->fd = fd;
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

int ckptio_peer_open(ckptio_peer **out, const char *root, const char *addr, int port)
{
    if (!out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_open: out is required");
    *out = NULL;
    if (!root || !*root || port < 0 || port > 65535)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_open: a root and a port in 0..65535 are required");
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
        set_timeout(fd, timeout);
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
static int dest_check(ckptio_part_dest *d, const char *name)
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
    if (d->host && (!name || !safe_rel(name)))
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
    for (size_t i = 0; i < n; i++) CKPTIO__TRY(dest_check(&d[i], name));
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
    nopipe_begin(&np);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        s[i].who = who[i];
        if (d[i].host) {
            snprintf(who[i], sizeof who[i], "the peer at %s:%d", d[i].host, d[i].port);
            int fd = dial(d[i].host, d[i].port, o ? o->timeout : 0, &s[i].m);
            if (fd < 0) s[i].rc = fd;
            else if ((s[i].sock = fd, s[i].rc = send_request(fd, PEER_PUT, name)) < 0)
                sink_fail(&s[i], s[i].rc, "the request");
        } else {
            snprintf(who[i], sizeof who[i], "%s", d[i].dst);
            s[i].t = &t[i];
            s[i].rc = begin_part(&t[i], d[i].dst, &s[i].m);
        }
    }
    pacer pc = {o ? o->max_rate : 0, 0, ckptio__now()};
    if (rc == 0) rc = send_pass(src, s, n, &pc, &m);
    for (size_t i = 0; i < n; i++) {
        if (rc < 0 && s[i].rc == 0) s[i].rc = ckptio__refail(&s[i].m, &m, rc, NULL, NULL);
        /* A peer's reply says why, even when it stopped reading early. */
        if (s[i].sock >= 0 && (s[i].rc == 0 || s[i].rc == -EPIPE || s[i].rc == -ECONNRESET)) {
            int r2 = recv_reply(s[i].sock, s[i].who, &s[i].m);
            if (s[i].rc == 0 || r2 < 0) s[i].rc = r2;
        }
        if (s[i].t && s[i].rc == 0) s[i].rc = finish_part(&t[i], o ? o->flags : 0, d[i].dst, &s[i].m);
        if (s[i].sock >= 0) close(s[i].sock);
        if (s[i].t) ckptio__txn_fini(&t[i]);
        d[i].rc = s[i].rc;
        d[i].bytes = s[i].bytes;
        snprintf(d[i].errmsg, sizeof d[i].errmsg, "%s",
                 s[i].rc == 0 ? "" : s[i].m.text[0] ? s[i].m.text : strerror(-s[i].rc));
    }
    nopipe_end(&np);
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

int ckptio_peer_fetch(const char *host, int port, const char *name, const char *dst,
                      const ckptio_peer_opts *o, uint64_t *bytes)
{
    if (!dst || !host || !name || port <= 0 || port > 65535)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_peer_fetch: host, port, name and dst are required");
    ckptio__msg m = {0};
    ckptio__txn t = {0};
    uint64_t got = 0;
    char who[128];
    snprintf(who, sizeof who, "the peer at %s:%d", host, port);
    int fd = -1;
    int rc = begin_part(&t, dst, &m);
    if (rc == 0) rc = fd = dial(host, port, o ? o->timeout : 0, &m);
    if (rc >= 0) rc = send_request(fd, PEER_GET, name);
    if (rc == 0) rc = recv_reply(fd, who, &m);
    if (rc == 0) rc = recv_files(fd, &t, who, &got, &m);
    if (rc == 0) rc = finish_part(&t, o ? o->flags : 0, dst, &m);
    if (fd >= 0) close(fd);
    ckptio__txn_fini(&t);
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
