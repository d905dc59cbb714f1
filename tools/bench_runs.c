/* SPDX-License-Identifier: Apache-2.0 */
/* The timed ckptio runs of `ckptio bench`: a durable save and a cold load of the state, the
 * resident checkpoint's load and verify, and many tiny tensors, through the public API. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"

/* Save every tensor durably; returns the seconds from open to commit's return, or < 0. */
static double save_all(const char *path, const tensor *ts, size_t n, const char *label,
                       ckptio_stats *st)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    ckptio_writer *w = NULL;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++)
        total += ts[i].nbytes;
    cli_progress_begin(total, "%s", label);
    double t0 = cli_now();
    int rc = ckptio_writer_open(&w, path, &p);
    if (rc < 0) {
        bench_fail("cannot start the checkpoint %s: %s", path, ckptio_last_error());
        return -1;
    }
    for (size_t i = 0; i < n && !bench_interrupted; i++) {
        const tensor *t = &ts[i];
        rc = ckptio_writer_add(w, t->name, t->dtype, t->ndim, t->shape, NULL, NULL, t->data,
                               t->nbytes);
        if (rc < 0) {
            bench_fail("saving tensor '%s' to %s failed: %s", t->name, path,
                       ckptio_writer_errmsg(w));
            ckptio_writer_close(w);
            return -1;
        }
        done += t->nbytes;
        cli_progress_set(done);
    }
    if (bench_interrupted) {
        cli_progress_end();
        ckptio_writer_close(w);
        return -1;
    }
    rc = ckptio_writer_commit(w);
    double t1 = cli_now();
    cli_progress_end();
    if (rc < 0) {
        bench_fail("committing the checkpoint %s failed: %s", path, ckptio_writer_errmsg(w));
        ckptio_writer_close(w);
        return -1;
    }
    ckptio_writer_stats(w, st);
    ckptio_writer_close(w);
    return t1 - t0;
}

/* Name the data file behind a tensor, for messages about wrong data (the bench writes every
 * tensor as one chunk). */
static void locate(ckptio_reader *r, const char *name, char *out, size_t n)
{
    snprintf(out, n, "data file unknown");
    int64_t ti = ckptio_reader_find(r, name);
    ckptio_chunk_info ci;
    if (ti >= 0 && ckptio_reader_chunk(r, (size_t)ti, 0, &ci) >= 0)
        snprintf(out, n, "data file %s, chunk at offset %" PRIu64, ci.file, ci.file_offset);
}

/* Load every tensor with one read call; returns seconds from open to the read's end, or < 0.
 * With `check`, compares the loaded bytes with the saved ones afterwards (not timed). */
static double load_all(const char *path, const tensor *ts, const ckptio_region *regions, size_t n,
                       const char *label, bool check, ckptio_stats *st)
{
    /* One library call does the work, so the progress line can only show that time passes. */
    cli_progress_begin(0, "%s", label);
    double t0 = cli_now();
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, path, NULL);
    if (rc < 0) {
        bench_fail("cannot open the checkpoint %s: %s", path, ckptio_last_error());
        return -1;
    }
    rc = ckptio_reader_read(r, regions, n);
    double t1 = cli_now();
    cli_progress_end();
    if (rc < 0) {
        bench_fail("loading %s failed: %s", path, ckptio_reader_errmsg(r));
        ckptio_reader_close(r);
        return -1;
    }
    ckptio_reader_stats(r, st);
    for (size_t i = 0; check && i < n; i++) {
        const tensor *t = &ts[i];
        if (!memcmp(t->data, t->dst, t->nbytes)) continue;
        uint64_t k = 0;
        while (k < t->nbytes && t->data[k] == t->dst[k])
            k++;
        char where[PATH_MAX + 96];
        locate(r, t->name, where, sizeof where);
        bench_fail("tensor '%s' loaded from %s (%s) differs from what was saved, first at byte "
                   "%" PRIu64 " of %" PRIu64 ", and the library reported no error: please "
                   "report this with the output of `ckptio doctor %s`",
                   t->name, path, where, k, t->nbytes, path);
        ckptio_reader_close(r);
        return -1;
    }
    ckptio_reader_close(r);
    return t1 - t0;
}

int bench_ckptio_run(bench *b, unsigned run)
{
    char label[96];
    /* Each save writes a fresh checkpoint, as a training job's next step would. */
    bench_remove_tree(b->ckpt);
    bench_settle(b->dir);
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    snprintf(label, sizeof label, "run %u/%u: ckptio save", run + 1, b->runs);
    double s = save_all(b->ckpt, b->t, b->n, label, &st);
    if (s < 0) return CLI_FAIL;
    memcpy(b->backend, st.backend, sizeof b->backend);
    b->backend[sizeof b->backend - 1] = 0;
    b->direct = st.direct;
    b->save_s.v[b->save_s.n++] = s;
    b->save.v[b->save.n++] = (double)b->bytes / s / 1e9;

    bench_evict(b->ckpt);
    memset(&st, 0, sizeof st);
    snprintf(label, sizeof label, "run %u/%u: ckptio load", run + 1, b->runs);
    double l = load_all(b->ckpt, b->t, b->regions, b->n, label, run == 0, &st);
    if (l < 0) return CLI_FAIL;
    memcpy(b->load_backend, st.backend, sizeof b->load_backend);
    b->load_backend[sizeof b->load_backend - 1] = 0;
    b->load_direct = st.direct;
    b->load_s.v[b->load_s.n++] = l;
    b->load.v[b->load.n++] = (double)b->bytes / l / 1e9;
    return CLI_OK;
}

static int warm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (type != FTW_F) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
    return 0;
}

/* Seconds for a verify (load: a read of every tensor) of the resident checkpoint, or < 0. */
static double warm_pass(bench *b, uint32_t threads, bool load, ckptio_read_stats *rs)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.verify_threads = threads;
    ckptio_reader *r = NULL;
    double t0 = cli_now();
    if (ckptio_reader_open(&r, b->ckpt, &p) < 0) {
        bench_fail("cannot open the checkpoint %s: %s", b->ckpt, ckptio_last_error());
        return -1;
    }
    int rc = load ? ckptio_reader_read(r, b->regions, b->n) : ckptio_reader_verify(r, NULL);
    double t = cli_now() - t0;
    if (rc < 0) bench_fail("%s %s failed: %s", load ? "loading" : "verifying", b->ckpt,
                           ckptio_reader_errmsg(r));
    *rs = (ckptio_read_stats){.size = sizeof *rs};
    ckptio_reader_read_stats(r, rs);
    ckptio_reader_close(r);
    return rc < 0 ? -1 : t;
}

/* The checkpoint read back through the page cache (after a buffered read of its files): what
 * a second load of a resident checkpoint costs, and the checksum rate on 1 and on N threads. */
int bench_warm_run(bench *b)
{
    cli_progress_begin(0, "warm load and verify");
    nftw(b->ckpt, warm_one, 16, FTW_PHYS);
    ckptio_read_stats rs;
    double l = warm_pass(b, 0, true, &rs);
    double v1 = l < 0 ? -1 : warm_pass(b, 1, false, &rs);
    double vn = v1 < 0 ? -1 : warm_pass(b, 0, false, &rs);
    cli_progress_end();
    if (vn < 0) return CLI_FAIL;
    b->warm_load = (double)b->bytes / l / 1e9;
    b->warm_verify1 = (double)b->bytes / v1 / 1e9;
    b->warm_verify_n = (double)b->bytes / vn / 1e9;
    b->verify_threads = rs.verify_threads;
    b->warm_cache_bytes = rs.cache_bytes;
    return CLI_OK;
}

/* 100000 tensors of 1..64 f32 elements: the per-tensor cost, which bandwidth hides. */
int bench_tiny_run(bench *b)
{
    size_t n = (size_t)b->tiny;
    tensor *ts = calloc(n, sizeof *ts);
    ckptio_region *regs = calloc(n, sizeof *regs);
    char *names = malloc(n * 32);
    uint64_t x = 0x5DEECE66Dull, len = 0;
    uint32_t *elems = malloc(n * sizeof *elems);
    if (!ts || !regs || !names || !elems) {
        free(ts), free(regs), free(names), free(elems);
        return bench_fail("out of memory for %zu tiny tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        elems[i] = 1 + (uint32_t)(x % 64);
        len += bench_align_up(elems[i] * 4u, 64);
    }
    unsigned char *src = malloc(len), *dst = malloc(len);
    int ret = CLI_FAIL;
    if (!src || !dst) {
        bench_fail("out of memory for %zu tiny tensors", n);
        goto out;
    }
    bench_fill_random(src, len, 77);
    memset(dst, 0, len);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tensor *t = &ts[i];
        snprintf(names + i * 32, 32, "tiny.%06zu", i);
        t->name = names + i * 32;
        t->dtype = CKPTIO_DT_F32;
        t->ndim = 1;
        t->shape[0] = elems[i];
        t->nbytes = elems[i] * 4u;
        t->data = src + off;
        t->dst = dst + off;
        regs[i] = (ckptio_region){.size = sizeof(ckptio_region), .name = t->name, .dst = t->dst,
                                  .capacity = t->nbytes};
        off += bench_align_up(t->nbytes, 64);
    }
    b->tiny_bytes = 0;
    for (size_t i = 0; i < n; i++)
        b->tiny_bytes += ts[i].nbytes;
    bench_remove_tree(b->tinydir);
    bench_settle(b->dir);
    ckptio_stats st;
    double s = save_all(b->tinydir, ts, n, "tiny tensors: save", &st);
    if (s < 0) goto out;
    bench_evict(b->tinydir);
    double l = load_all(b->tinydir, ts, regs, n, "tiny tensors: load", true, &st);
    if (l < 0) goto out;
    b->tiny_save_s = s;
    b->tiny_load_s = l;
    ret = CLI_OK;
out:
    free(src), free(dst), free(ts), free(regs), free(names), free(elems);
    return ret;
}
