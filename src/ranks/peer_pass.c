/* SPDX-License-Identifier: Apache-2.0 */
/* One pass over a part's files: each file read once and sent to every peer and written to
 * every directory of ckptio_part_spread (and to a fetching peer). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#include "../common/common.h"
#include "peer.h"

/* ---- a pass over a part's files: each file read once, sent or written to every sink ---- */

/* Where a pass sends a part: a peer's connection, or a transaction's directory. */

#define SPREAD_CHUNK (4u << 20) /* a slot of the ring of a pass with several sinks */
#define SPREAD_SLOTS 4u         /* chunks read ahead of the slowest sink */
#define SPREAD_ALIGN 4096u      /* what O_DIRECT reads of the part are aligned to */

int ckptio__peer_sink_fail(sink *s, int rc, const char *rel)
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
        int fd = ckptio__peer_create_in(s->t->tmp_fd, rel, false, &s->m, s->t->tmp_path);
        if (fd < 0) s->rc = fd;
        else s->out = fd;
        return;
    }
    size_t len = strlen(rel);
    uint8_t h[12];
    ckptio__peer_put32(h, (uint32_t)len);
    ckptio__peer_put64(h + 4, size);
    int rc = ckptio__peer_send_all(s->sock, h, 4);
    if (rc == 0) rc = ckptio__peer_send_all(s->sock, rel, len);
    if (rc == 0) rc = ckptio__peer_send_all(s->sock, h + 4, 8);
    if (rc < 0) ckptio__peer_sink_fail(s, rc, rel);
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
    int rc = s->sock >= 0 ? ckptio__peer_send_all(s->sock, buf, n) : ckptio__peer_write_all(s->out, buf, n);
    if (rc < 0) ckptio__peer_sink_fail(s, rc, rel);
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
        if (n < 0 && s->sock >= 0) ckptio__peer_sink_fail(s, errno == EAGAIN ? -ETIMEDOUT : -errno, rel);
        else if (n < 0)
            s->rc = ckptio__fail(&s->m, -errno, "cannot copy '%s' to '%s': %s", path,
                                 s->t->tmp_path, strerror(errno));
        else if (n == 0)
            s->rc = ckptio__fail(&s->m, CKPTIO_E_CORRUPT, "'%s' shrank while it was copied", path);
        else {
            left -= (uint64_t)n;
            s->bytes += (uint64_t)n;
            ckptio__peer_pace(pc, (uint64_t)n);
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
        ckptio__peer_pace(pc, (uint64_t)got);
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
int ckptio__peer_send_pass(const char *dir, sink *s, size_t n, pacer *pc, ckptio__msg *m)
{
    files f = {0};
    uint8_t *ring = NULL;
    size_t chunk = pc->rate ? 64u << 10 : SPREAD_CHUNK;
    int rc = ckptio__peer_list_files(dir, "", &f, m);
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
        int r = s[k].rc == 0 && s[k].sock >= 0 ? ckptio__peer_send_all(s[k].sock, end, 4) : 0;
        if (r < 0) ckptio__peer_sink_fail(&s[k], r, "the end record");
    }
    free(ring);
    ckptio__peer_files_free(&f);
    return rc;
}
