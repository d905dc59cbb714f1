/* SPDX-License-Identifier: Apache-2.0 */
/* Byte ranges of foreign files (ckptio_file_read), read through the same plan and ring. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/engine.h"
#include "../io/vfs.h"
#include "reader.h"

/* ---- byte ranges of foreign files ---- */

typedef struct file_ctx {
    const char *path;
    plan *pl;
    ckptio__msg *msg;
    uint64_t io_bytes;
} file_ctx;

/* A read of a foreign file came back: copy out its staged ranges. */
static int file_done(void *ctx, size_t i, const ckptio__ring_io *io, const void *buf, int64_t res)
{
    file_ctx *x = ctx;
    const seg *segs = x->pl->segs.items;
    size_t first, last;
    ckptio__read_io_segs(x->pl, i, &first, &last);
    if (res < 0)
        return ckptio__fail(x->msg, (int)res, "reading %llu bytes at offset %llu of '%s' failed",
                            (unsigned long long)io->len, (unsigned long long)io->off, x->path);
    x->io_bytes += (uint64_t)res;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if ((uint64_t)res < s->foff + (s->b - s->a) - io->off)
            return ckptio__fail(x->msg, CKPTIO_E_CORRUPT,
                                "'%s' ended at byte %llu while reading range %llu; the file was "
                                "truncated while being read",
                                x->path, (unsigned long long)(io->off + (uint64_t)res),
                                (unsigned long long)s->chunk);
        if (!s->direct) ckptio__read_scatter(x->pl, s, (const uint8_t *)buf + (s->foff - io->off));
    }
    return 0;
}

/* Ranges need no manifest: each is a piece of one run, planned and read like a chunk with no
 * checksums. */
int ckptio_file_read(const char *path, const ckptio_range *ranges, size_t n, const ckptio_params *p,
                     ckptio_stats *stats)
{
    if (!path || (n && !ranges))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_read: path and ranges are required");
    double t0 = ckptio__now();
    ckptio__msg msg;
    ckptio__msg_clear(&msg);
    ckptio__cfg cfg;
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    rfile file = {.fd = -1, .bfd = -1};
    ckptio__ring ring;
    memset(&ring, 0, sizeof ring);
    ckptio__workers *workers = NULL;
    int dirfd = -1;
    /* Staging as the reader sizes it for a checkpoint of 1 MiB blocks. */
    const uint64_t block = 1u << 20;
    plan pl;
    ckptio__read_plan_init(&pl, &file, block, 0, 0);
    /* A file the caller names is not confined the way a checkpoint's own files are: follow its
     * links (a Hugging Face cache entry is snapshots/<rev>/x.bin -> ../../blobs/<sha>). Messages
     * keep naming `path`. */
    char *real = NULL;
    int lrc = ckptio__follow_links(path, &real);
    const char *target = real ? real : path;
    char *dir = ckptio__parent_dir(target);
    const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    int rc;
    if (lrc < 0) {
        rc = ckptio__fail(&msg, lrc, "cannot open '%s'%s", path,
                          lrc == -ELOOP ? ": too many levels of symbolic links" : "");
        goto out;
    }
    CKPTIO__GOTO_IF(!dir, -ENOMEM);
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &cfg, &msg));
    pl.request = cfg.request;
    pl.buf_size = CKPTIO__MAX(cfg.request, 2 * block);
    dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        rc = ckptio__fail(&msg, -errno, "cannot open directory '%s'", dir);
        goto out;
    }
    rc = ckptio__read_open_rfile(&file, dirfd, base, cfg.direct, cfg.cache);
    if (rc < 0) {
        ckptio__fail(&msg, rc, "cannot open '%s'", path);
        goto out;
    }
    st.alignment = file.off_align;
    for (size_t i = 0; i < n; i++) {
        ckptio_range rg;
        const ckptio_range *g = &rg;
        CKPTIO__CHECK(ckptio__read_take_sized(&msg, &rg, sizeof rg, RANGE_V1, ranges, i,
                                              "ckptio_file_read", "ckptio_range"));
        if (!g->len) continue;
        if (!g->dst) {
            rc = ckptio__fail(&msg, CKPTIO_E_USAGE, "ckptio_file_read: range %zu has no destination", i);
            goto out;
        }
        if (g->offset > UINT64_MAX - g->len) {
            rc = ckptio__fail(&msg, CKPTIO_E_RANGE, "ckptio_file_read: range %zu overflows", i);
            goto out;
        }
        if (g->offset + g->len > file.size) {
            rc = ckptio__fail(&msg, CKPTIO_E_CORRUPT,
                              "bytes %llu..%llu lie past the end of '%s' (%llu bytes): the file is "
                              "truncated or not the one expected",
                              (unsigned long long)g->offset,
                              (unsigned long long)(g->offset + g->len), path,
                              (unsigned long long)file.size);
            goto out;
        }
        piece pc = {.dst = g->dst, .dst_cap = g->len, .dst_bytes = g->len, .chunk = i,
                    .run_len = g->len, .runs = 1};
        int64_t pi = ckptio__vec_push(&pl.pieces, &pc, 1);
        CKPTIO__GOTO_IF(pi < 0, -ENOMEM);
        extent x = {.off = g->offset, .len = g->len, .file = 0, .verify = false};
        seg proto = {.piece = (uint64_t)pi, .chunk = i, .file = 0, .iter = NONE};
        CKPTIO__CHECK(ckptio__read_plan_single_run(&pl, &x, &pc, proto));
        st.bytes += g->len;
    }
    pl.cache = cfg.cache;
    CKPTIO__CHECK(ckptio__read_plan_cache(&pl));
    CKPTIO__CHECK(ckptio__read_plan_ios(&pl));
    CKPTIO__CHECK(ckptio__ring_init(&ring, cfg.backend, cfg.depth, cfg.threads, cfg.staging,
                                    pl.buf_size, path, &msg));
    ckptio__stats_backend(st.backend, cfg.backend, ckptio__engine_name(ring.eng));
    if (pl.csegs.len) {
        CKPTIO__CHECK(ckptio__read_start_workers(&workers, cfg.verify_threads, &msg, path));
        pl.workers = workers;
        cres *res;
        CKPTIO__CHECK(ckptio__read_run_cached(&pl, NULL, &res));
        for (size_t i = 0; i < pl.csegs.len && rc >= 0; i++) {
            const seg *s = CKPTIO__VEC_AT(&pl.csegs, seg, i);
            if (res[i].rc == CKPTIO_E_CORRUPT)
                rc = ckptio__fail(&msg, CKPTIO_E_CORRUPT,
                                  "'%s' ended at byte %llu while reading range %llu; the file was "
                                  "truncated while being read",
                                  path, (unsigned long long)(s->foff + res[i].got),
                                  (unsigned long long)s->chunk);
            else if (res[i].rc < 0)
                rc = ckptio__fail(&msg, res[i].rc,
                                  "reading %llu bytes at offset %llu of '%s' from the page cache "
                                  "failed",
                                  (unsigned long long)(s->b - s->a), (unsigned long long)s->foff,
                                  path);
        }
        free(res);
        if (rc < 0) goto out;
    }
    file_ctx ctx = {.path = path, .pl = &pl, .msg = &msg};
    rc = ckptio__ring_run(&ring, pl.ios.items, pl.ios.len, file_done, &ctx);
    st.io_bytes = ctx.io_bytes;
    st.direct = file.direct && ctx.io_bytes > 0; /* every request read file.fd */
out:
    if (rc == -ENOMEM && !msg.text[0]) ckptio__fail(&msg, rc, "out of memory reading '%s'", path);
    if (rc < 0) ckptio__fail(NULL, rc, "%s", msg.text);
    if (stats) {
        st.seconds = ckptio__now() - t0;
        st.tensors = n;
        st.gbps = st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0;
        *stats = st;
    }
    ckptio__read_plan_free(&pl);
    ckptio__ring_fini(&ring);
    ckptio__workers_stop(workers);
    ckptio__read_close_rfile(&file);
    if (dirfd >= 0) close(dirfd);
    free(dir);
    free(real);
    return rc < 0 ? rc : 0;
}
