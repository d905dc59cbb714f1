/* SPDX-License-Identifier: Apache-2.0 */
/* The raw device bandwidth `ckptio bench` sets ckptio against (large O_DIRECT writes and
 * reads through io_uring, or a thread pool), and the page-cache and file chores around every
 * timed phase. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "ckptio_config.h"
#include "cli.h"

#if CKPTIO_HAVE_IO_URING
#include <liburing.h>
#endif

typedef struct raw_io {
    int fd;
    bool write;
    uint64_t bytes, req;
    unsigned depth;
    unsigned char *buf;
    atomic_uint_fast64_t next, done;
    atomic_int err;
    uint64_t err_off;
} raw_io;

static void raw_set_err(raw_io *io, int err, uint64_t off)
{
    int zero = 0;
    if (atomic_compare_exchange_strong(&io->err, &zero, err)) io->err_off = off;
}

typedef struct raw_thread_arg {
    raw_io *io;
    unsigned slot;
} raw_thread_arg;

static void *raw_thread(void *arg)
{
    raw_thread_arg *a = arg;
    raw_io *io = a->io;
    unsigned char *buf = io->buf + (size_t)a->slot * io->req;
    while (!atomic_load(&io->err) && !bench_interrupted) {
        uint64_t off = atomic_fetch_add(&io->next, io->req);
        if (off >= io->bytes) break;
        uint64_t len = io->bytes - off < io->req ? io->bytes - off : io->req;
        for (uint64_t pos = 0; pos < len;) {
            ssize_t n = io->write ? pwrite(io->fd, buf + pos, len - pos, (off_t)(off + pos))
                                  : pread(io->fd, buf + pos, len - pos, (off_t)(off + pos));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                raw_set_err(io, n < 0 ? errno : EIO, off + pos);
                return NULL;
            }
            pos += (uint64_t)n;
        }
        cli_progress_set(atomic_fetch_add(&io->done, len) + len);
    }
    return NULL;
}

/* A pool of `depth` threads, each with one request in flight: the fallback without io_uring. */
static int raw_threads(raw_io *io)
{
    pthread_t th[32];
    raw_thread_arg args[32];
    unsigned started = 0;
    for (; started < io->depth; started++) {
        args[started] = (raw_thread_arg){io, started};
        if (pthread_create(&th[started], NULL, raw_thread, &args[started]) != 0) break;
    }
    if (!started) return -EAGAIN;
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return -atomic_load(&io->err);
}

#if CKPTIO_HAVE_IO_URING
/* Keeps `depth` requests in flight until the file is covered; retries short transfers. */
static int raw_uring(raw_io *io)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(io->depth, &ring, 0);
    if (rc < 0) return rc;
    uint64_t s_off[32], s_len[32], s_pos[32];
    unsigned free_slots[32], nfree = 0, retry[32], nretry = 0, inflight = 0;
    for (unsigned i = 0; i < io->depth; i++)
        free_slots[nfree++] = io->depth - 1 - i;
    uint64_t next = 0, done = 0;
    rc = 0;
    while ((next < io->bytes || inflight) && rc == 0) {
        while (rc == 0 && !bench_interrupted && (nretry || (nfree && next < io->bytes))) {
            unsigned s;
            if (nretry) {
                s = retry[--nretry];
            } else {
                s = free_slots[--nfree];
                s_off[s] = next;
                s_len[s] = io->bytes - next < io->req ? io->bytes - next : io->req;
                s_pos[s] = 0;
                next += s_len[s];
            }
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe) {
                retry[nretry++] = s;
                break;
            }
            unsigned char *p = io->buf + (size_t)s * io->req + s_pos[s];
            unsigned len = (unsigned)(s_len[s] - s_pos[s]);
            uint64_t off = s_off[s] + s_pos[s];
            if (io->write)
                io_uring_prep_write(sqe, io->fd, p, len, off);
            else
                io_uring_prep_read(sqe, io->fd, p, len, off);
            io_uring_sqe_set_data(sqe, (void *)(uintptr_t)s);
            inflight++;
        }
        if (bench_interrupted) rc = -EINTR;
        if (!inflight) break;
        int sr = io_uring_submit_and_wait(&ring, 1);
        if (sr < 0 && sr != -EINTR) {
            rc = sr;
            break;
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            unsigned s = (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            if (res == -EINTR || res == -EAGAIN) {
                retry[nretry++] = s;
            } else if (res < 0 || (res == 0 && !io->write)) {
                if (!rc) rc = res < 0 ? res : -EIO, io->err_off = s_off[s] + s_pos[s];
            } else if ((s_pos[s] += (uint64_t)res) < s_len[s]) {
                retry[nretry++] = s;
            } else {
                done += s_len[s];
                free_slots[nfree++] = s;
                cli_progress_set(done);
            }
        }
    }
    /* Never leave the kernel writing into buffers we are about to reuse. */
    while (inflight) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    io_uring_queue_exit(&ring);
    return rc;
}
#endif

/* Run one pass over the raw file; sets *engine to what moved the bytes. */
static int raw_pass(bench *b, raw_io *io, const char **engine)
{
#if CKPTIO_HAVE_IO_URING
    int rc = raw_uring(io);
    if (rc == 0 || (rc != -ENOSYS && rc != -EPERM && rc != -ENOMEM && rc != -EOPNOTSUPP)) {
        *engine = "io_uring";
        return rc;
    }
#endif
    (void)b;
    *engine = "pwrite/pread threads";
    atomic_store(&io->next, 0);
    atomic_store(&io->done, 0);
    atomic_store(&io->err, 0);
    return raw_threads(io);
}

static int raw_open(const char *path, bool write, int *direct)
{
    int flags = write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
    int fd = open(path, flags | O_CLOEXEC | O_DIRECT, 0644);
    *direct = fd >= 0;
    /* tmpfs and some FUSE file systems refuse O_DIRECT: measure through the page cache. */
    if (fd < 0 && errno == EINVAL) fd = open(path, flags | O_CLOEXEC, 0644);
    return fd;
}

int bench_raw_run(bench *b, unsigned run)
{
    raw_io io = {.write = true,
                 .bytes = b->raw_bytes,
                 .req = RAW_WRITE_REQ,
                 .depth = RAW_WRITE_DEPTH,
                 .buf = b->raw_buf};
    int direct = 0;
    cli_progress_begin(b->raw_bytes, "run %u/%u: raw write", run + 1, b->runs);
    double t0 = cli_now();
    io.fd = raw_open(b->raw, true, &direct);
    if (io.fd < 0)
        return bench_fail("cannot create %s for the raw measurement: %s", b->raw, strerror(errno));
    int rc = raw_pass(b, &io, &b->raw_engine);
    if (rc == -EINVAL && direct) {
        /* O_DIRECT accepted at open but refused on write: measure buffered instead. */
        close(io.fd);
        io.fd = raw_open(b->raw, true, &direct);
        if (io.fd >= 0) {
            int fl = fcntl(io.fd, F_GETFL);
            fcntl(io.fd, F_SETFL, fl & ~O_DIRECT);
        }
        direct = 0;
        t0 = cli_now();
        rc = io.fd < 0 ? -errno : raw_pass(b, &io, &b->raw_engine);
    }
    if (rc == 0 && fsync(io.fd) < 0) rc = -errno, io.err_off = b->raw_bytes;
    double t1 = cli_now();
    if (io.fd >= 0) close(io.fd);
    cli_progress_end();
    if (bench_interrupted) return CLI_FAIL;
    if (rc < 0)
        return bench_fail("raw write of %s failed at offset %" PRIu64 ": %s; check free space "
                          "and the device, or try a smaller --size",
                          b->raw, io.err_off, strerror(-rc));
    b->raw_direct = direct;
    b->raw_w.v[b->raw_w.n++] = (double)b->raw_bytes / (t1 - t0) / 1e9;

    bench_evict(b->raw);
    raw_io rio = {.write = false,
                  .bytes = b->raw_bytes,
                  .req = RAW_READ_REQ,
                  .depth = RAW_READ_DEPTH,
                  .buf = b->raw_buf};
    cli_progress_begin(b->raw_bytes, "run %u/%u: raw read", run + 1, b->runs);
    t0 = cli_now();
    rio.fd = raw_open(b->raw, false, &direct);
    if (rio.fd < 0)
        return bench_fail("cannot open %s for the raw measurement: %s", b->raw, strerror(errno));
    if (!b->raw_direct) {
        int fl = fcntl(rio.fd, F_GETFL);
        fcntl(rio.fd, F_SETFL, fl & ~O_DIRECT);
    }
    rc = raw_pass(b, &rio, &b->raw_engine);
    t1 = cli_now();
    close(rio.fd);
    cli_progress_end();
    unlink(b->raw);
    bench_settle(b->dir);
    if (bench_interrupted) return CLI_FAIL;
    if (rc < 0)
        return bench_fail("raw read of %s failed at offset %" PRIu64 ": %s", b->raw, rio.err_off,
                          strerror(-rc));
    b->raw_r.v[b->raw_r.n++] = (double)b->raw_bytes / (t1 - t0) / 1e9;
    return CLI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int evict_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (type != FTW_F) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    /* Dirty pages cannot be dropped, so sync them first. */
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return 0;
}

/* Drop a file's or a directory tree's pages from the page cache, so the next read is cold. */
void bench_evict(const char *path)
{
    nftw(path, evict_one, 16, FTW_PHYS);
}

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

void bench_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Let the file system finish freeing what was just deleted (journal commits, discards) before
 * the next timed phase, so neither contender pays for the other's leftovers. */
void bench_settle(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    syncfs(fd);
    close(fd);
}
