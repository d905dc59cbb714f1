/* SPDX-License-Identifier: Apache-2.0 */
/* One cold load of a saved checkpoint, or the raw O_DIRECT read of its data files, as JSON.
 * bench/read_ab.py alternates builds of this program (and the raw read) in one run.
 *
 *   build/tools/ckptio-read-ab load DIR [request_bytes queue_depth verify_threads]
 *   build/tools/ckptio-read-ab raw DIR   (16 MiB reads, 8 in flight, like `ckptio bench`'s)
 *
 * meson builds it where liburing is found (tools/meson.build); to compare another tree, copy
 * that tree's build/tools/ckptio-read-ab aside before rebuilding.
 *
 * The page cache is emptied of DIR's files (POSIX_FADV_DONTNEED) before the clock starts; the
 * load's destinations are faulted in beforehand, as `ckptio bench` does. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"

#define MIB (1ull << 20)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The data files of DIR (the manifest included: it is read too), evicted; returns how many. */
static int list_files(const char *dir, char paths[][4096], int max, int evict)
{
    char sub[4096];
    int n = 0;
    const char *where[2] = {dir, sub};
    snprintf(sub, sizeof sub, "%s/data", dir);
    for (int w = 0; w < 2; w++) {
        DIR *d = opendir(where[w]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) && n < max) {
            if (e->d_type != DT_REG) continue;
            snprintf(paths[n], 4096, "%s/%s", where[w], e->d_name);
            if (evict) {
                int fd = open(paths[n], O_RDONLY);
                if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
            }
            if (w == 1) n++;
        }
        closedir(d);
    }
    return n;
}

static int raw(const char *dir)
{
    static char paths[256][4096];
    int nf = list_files(dir, paths, 256, 1);
    const unsigned depth = 8;
    const uint64_t req = 16 * MIB;
    uint8_t *buf =
        mmap(NULL, depth * req, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    memset(buf, 1, depth * req);
    struct io_uring ring;
    if (io_uring_queue_init(depth, &ring, 0) < 0) return 1;
    uint64_t bytes = 0;
    double t0 = now();
    for (int f = 0; f < nf; f++) {
        int fd = open(paths[f], O_RDONLY | O_DIRECT);
        if (fd < 0) return 1;
        off_t size = lseek(fd, 0, SEEK_END);
        uint64_t next = 0, end = ((uint64_t)size + 4095) & ~4095ull;
        unsigned inflight = 0, free_slots[8], nfree = 0;
        for (unsigned i = 0; i < depth; i++) free_slots[nfree++] = i;
        while (next < end || inflight) {
            while (nfree && next < end) {
                unsigned s = free_slots[--nfree];
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                uint64_t len = end - next < req ? end - next : req;
                io_uring_prep_read(sqe, fd, buf + s * req, (unsigned)len, next);
                io_uring_sqe_set_data(sqe, (void *)(uintptr_t)s);
                next += len;
                inflight++;
            }
            io_uring_submit_and_wait(&ring, 1);
            struct io_uring_cqe *cqe;
            while (io_uring_peek_cqe(&ring, &cqe) == 0) {
                if (cqe->res < 0) return 1;
                bytes += (uint64_t)cqe->res;
                free_slots[nfree++] = (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);
                io_uring_cqe_seen(&ring, cqe);
                inflight--;
            }
        }
        close(fd);
    }
    double dt = now() - t0;
    printf("{\"mode\": \"raw\", \"bytes\": %" PRIu64 ", \"seconds\": %.6f}\n", bytes, dt);
    return 0;
}

static int load(const char *dir, int argc, char **argv)
{
    ckptio_params p;
    ckptio_params_init(&p);
    if (argc > 0) p.request_bytes = strtoull(argv[0], NULL, 0);
    if (argc > 1) p.queue_depth = (uint32_t)strtoul(argv[1], NULL, 0);
    if (argc > 2) p.verify_threads = (uint32_t)strtoul(argv[2], NULL, 0);
    ckptio_reader *r = NULL;
    if (ckptio_reader_open(&r, dir, &p) < 0)
        return fprintf(stderr, "%s\n", ckptio_last_error()), 1;
    size_t n = ckptio_reader_num_tensors(r);
    ckptio_region *regs = calloc(n, sizeof *regs);
    uint64_t total = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        ckptio_reader_tensor(r, i, &ti);
        uint64_t cap = (ti.nbytes + 4095) & ~4095ull;
        regs[i] = (ckptio_region){.size = sizeof regs[i], .tensor = i, .capacity = cap};
        if (!regs[i].capacity) regs[i].capacity = 4096;
        total += regs[i].capacity;
        bytes += ti.nbytes;
    }
    ckptio_reader_close(r);
    uint8_t *arena = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) return 1;
    memset(arena, 1, total);
    for (size_t i = 0, off = 0; i < n; off += regs[i].capacity, i++) regs[i].dst = arena + off;
    static char paths[256][4096];
    list_files(dir, paths, 256, 1);
    double t0 = now();
    if (ckptio_reader_open(&r, dir, &p) < 0) return 1;
    double t1 = now();
    int rc = ckptio_reader_read(r, regs, n);
    double t2 = now();
    if (rc < 0) return fprintf(stderr, "%s\n", ckptio_reader_errmsg(r)), 1;
    ckptio_read_stats rs = {.size = sizeof rs};
    ckptio_reader_read_stats(r, &rs);
    printf("{\"mode\": \"load\", \"bytes\": %" PRIu64 ", \"seconds\": %.6f, \"open_s\": %.6f, "
           "\"requests\": %" PRIu64 ", \"merged\": %" PRIu64 ", \"device_bytes\": %" PRIu64
           ", \"cache_bytes\": %" PRIu64 ", \"verify_threads\": %u}\n",
           bytes, t2 - t0, t1 - t0, rs.requests, rs.merged, rs.device_bytes, rs.cache_bytes,
           rs.verify_threads);
    ckptio_reader_close(r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) return fprintf(stderr, "usage: read_ab raw|load DIR [request depth verify]\n"), 2;
    if (!strcmp(argv[1], "raw")) return raw(argv[2]);
    return load(argv[2], argc - 3, argv + 3);
}
