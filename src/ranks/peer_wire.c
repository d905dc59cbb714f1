/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's wire: bytes on a socket, requests and replies, the files of a part, the
 * transaction a received or copied part is published through, pacing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#include "../store/store.h"
#include "peer.h"

/* ---- bytes on a socket ---- */

void ckptio__peer_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void ckptio__peer_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint32_t ckptio__peer_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t ckptio__peer_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int ckptio__peer_set_timeout(int fd, double seconds)
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

int ckptio__peer_send_all(int fd, const void *buf, size_t len)
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
int ckptio__peer_recv_all(int fd, void *buf, size_t len)
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

int ckptio__peer_recv_by(int fd, void *buf, size_t len, double end)
{
    uint8_t *p = buf;
    while (len) {
        double left = end - ckptio__now();
        if (left <= 0) return -ETIMEDOUT;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int k = poll(&pf, 1, (int)(left * 1e3) + 1);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -errno;
        if (k == 0) continue; /* the deadline decides */
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n < 0) return -errno;
        if (n == 0) return -EPIPE;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ckptio__peer_send_reply(int fd, int status, const char *msg)
{
    size_t len = msg ? strlen(msg) : 0;
    uint8_t h[8];
    ckptio__peer_put32(h, (uint32_t)status);
    ckptio__peer_put32(h + 4, (uint32_t)len);
    int rc = ckptio__peer_send_all(fd, h, sizeof h);
    return rc < 0 || !len ? rc : ckptio__peer_send_all(fd, msg, len);
}

/* The other side's reply: its status, its message into m when it failed. What the other side
 * sends is checked, not trusted: a status is 0 or an error code of ckptio's or an errno (else
 * -EPROTO), a message at most PEER_MAX_REPLY bytes, its control characters shown as '?'. */
int ckptio__peer_recv_reply(int fd, const char *who, ckptio__msg *m)
{
    uint8_t h[8];
    int rc = ckptio__peer_recv_all(fd, h, sizeof h);
    if (rc < 0) return ckptio__fail(m, rc, "%s sent no reply (%s)", who, strerror(-rc));
    int32_t status = (int32_t)ckptio__peer_get32(h);
    uint32_t len = ckptio__peer_get32(h + 4);
    if (len > PEER_MAX_REPLY || status > 0 || status < -PEER_MAX_CODE)
        return ckptio__fail(m, -EPROTO, "%s sent no reply of ckptio's peer protocol (status %d, "
                            "%u bytes)", who, (int)status, len);
    char text[CKPTIO__MSG_LEN];
    size_t keep = CKPTIO__MIN((size_t)len, sizeof text - 1);
    if ((rc = ckptio__peer_recv_all(fd, text, keep)) < 0) return ckptio__fail(m, rc, "%s: reply cut short", who);
    text[keep] = '\0';
    for (size_t i = 0; i < keep; i++)
        if ((unsigned char)text[i] < 0x20 || text[i] == 0x7f) text[i] = '?';
    for (uint32_t left = len - (uint32_t)keep; left;) { /* drain what did not fit */
        char sink[256];
        uint32_t n = CKPTIO__MIN(left, (uint32_t)sizeof sink);
        if (ckptio__peer_recv_all(fd, sink, n) < 0) break;
        left -= n;
    }
    if (status == 0) return 0;
    return ckptio__fail(m, status, "%s: %s", who, text);
}

/* ---- the files of a part ---- */


void ckptio__peer_files_free(files *f)
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
int ckptio__peer_list_files(const char *dir, const char *sub, files *f, ckptio__msg *m)
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
            rc = ckptio__peer_list_files(dir, rel, f, m);
        else if (S_ISREG(st.st_mode))
            rc = files_add(f, rel, (uint64_t)st.st_size);
        free(rel);
    }
    closedir(d);
    free(path);
    return rc;
}

/* A relative path a part may hold: components of ordinary names, no "." or "..". */
bool ckptio__peer_safe_rel(const char *rel)
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

/* Create `rel` for writing in the transaction's directory, making its directories; private:
 * owner-only (a part received into a node's local tier). */
int ckptio__peer_create_in(int dirfd, const char *rel, bool private_, ckptio__msg *m, const char *where)
{
    char buf[PATH_MAX];
    if (strlen(rel) >= sizeof buf) return ckptio__fail(m, CKPTIO_E_CORRUPT, "%s: path too long", where);
    strcpy(buf, rel);
    for (char *s = strchr(buf, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(dirfd, buf, private_ ? 0700 : 0755) < 0 && errno != EEXIST)
            return ckptio__fail(m, -errno, "%s: cannot create '%s': %s", where, buf, strerror(errno));
        *s = '/';
    }
    int fd = openat(dirfd, rel, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, private_ ? 0600 : 0644);
    if (fd < 0) return ckptio__fail(m, -errno, "%s: cannot create '%s': %s", where, rel, strerror(errno));
    return fd;
}

/* The part at `path` opens as a checkpoint (its manifest read and checked) and, with `blocks`,
 * every block matches its checksum: 0, or CKPTIO_E_CHECKSUM naming how many failed. */
static int verify_part(const char *path, bool blocks, const char *what, ckptio__msg *m)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, path, NULL);
    if (rc < 0) {
        ckptio__msg last;
        ckptio__msg_last(&last);
        return ckptio__fail(m, rc, "%s is not a readable checkpoint: %s", what, last.text);
    }
    uint64_t bad = 0;
    rc = blocks ? ckptio_reader_verify(r, &bad) : 0;
    if (rc < 0 && bad)
        rc = ckptio__fail(m, CKPTIO_E_CHECKSUM, "%s: %llu block(s) fail their checksums", what,
                          (unsigned long long)bad);
    else if (rc < 0)
        rc = ckptio__fail(m, rc, "%s: %s", what, ckptio_reader_errmsg(r));
    ckptio_reader_close(r);
    return rc;
}

/* `dir` and the directories above it, as mkdir -p. */
static int make_dirs(const char *dir, mode_t mode, ckptio__msg *m)
{
    char buf[PATH_MAX];
    if (strlen(dir) >= sizeof buf) return ckptio__fail(m, -ENAMETOOLONG, "'%s': path too long", dir);
    strcpy(buf, dir);
    for (char *s = buf + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            return ckptio__fail(m, -errno, "cannot create '%s': %s", buf, strerror(errno));
        if (!c) return 0;
        *s = c;
    }
}

/* Begin the transaction of part `dst` (its parent directories made), replacing what is there
 * only once the new part is published; private: the directories made and the temporary one
 * owner-only, whatever the umask (a part received into a node's local tier). */
int ckptio__peer_begin_part(ckptio__txn *t, const char *dst, bool private_, ckptio__msg *m)
{
    char *parent = ckptio__parent_dir(dst);
    if (!parent) return -ENOMEM;
    int rc = make_dirs(parent, private_ ? 0700 : 0755, m);
    free(parent);
    if (rc < 0) return rc;
    CKPTIO__TRY(ckptio__txn_begin(t, dst, CKPTIO__TXN_DIR, CKPTIO__TXN_OVERWRITE | CKPTIO__TXN_FSYNC,
                                  CKPTIO_OFF, NULL, m));
    if (private_ && fchmod(t->tmp_fd, 0700) < 0)
        return ckptio__fail(m, -errno, "cannot make '%s' private: %s", t->tmp_path, strerror(errno));
    return 0;
}

/* Verify what the transaction's directory holds (every block when asked, else that it is a
 * checkpoint whose manifest reads), then publish it. */
int ckptio__peer_finish_part(ckptio__txn *t, unsigned flags, const char *what, ckptio__msg *m)
{
    CKPTIO__TRY(verify_part(t->tmp_path, flags & CKPTIO_PEER_VERIFY, what, m));
    return ckptio__txn_publish(t, NULL, 0, m);
}

/* ---- sending and receiving a part's files ---- */


void ckptio__peer_pace(pacer *p, uint64_t n)
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

void ckptio__peer_nopipe_begin(nopipe *np)
{
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    np->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &np->old);
}

void ckptio__peer_nopipe_end(nopipe *np)
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

int ckptio__peer_write_all(int fd, const uint8_t *p, size_t n)
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
