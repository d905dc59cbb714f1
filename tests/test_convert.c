/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the convert engine (ckptio_convert) with sources and sinks of the caller's own. */
#define CKPTIO_EXPERIMENTAL
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

/* A source in memory: three tensors (one of 60,000 bytes, so a 4 KiB buffer cuts it into runs
 * of rows), metadata, and a read that may fail at a given call. */
typedef struct {
    ckptio_convert_tensor t[3];
    ckptio_convert_meta m[1];
    uint8_t *data[3];
    int reads, fail_at; /* fail the fail_at-th read (1-based), 0: never */
} memsrc;

static int src_list(void *ctx, const ckptio_convert_tensor **t, size_t *nt,
                    const ckptio_convert_meta **m, size_t *nm)
{
    memsrc *s = ctx;
    *t = s->t, *nt = 3, *m = s->m, *nm = 1;
    return 0;
}

static int src_read(void *ctx, size_t i, uint64_t off, void *buf, size_t len)
{
    memsrc *s = ctx;
    if (++s->reads == s->fail_at) return -EIO;
    if (i >= 3 || off + len > s->t[i].nbytes) return CKPTIO_E_RANGE;
    memcpy(buf, s->data[i] + off, len);
    return 0;
}

static const char *src_errmsg(void *ctx)
{
    (void)ctx;
    return "the test's source failed on purpose";
}

static int memsrc_init(memsrc *s)
{
    static const char *const names[3] = {"w", "empty", "step"};
    static const int dtypes[3] = {CKPTIO_DT_F32, CKPTIO_DT_U8, CKPTIO_DT_I64};
    static const uint32_t ndims[3] = {2, 2, 0};
    static const uint64_t shapes[3][2] = {{300, 50}, {0, 4}, {0, 0}};
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++) {
        ckptio_convert_tensor *t = &s->t[i];
        *t = (ckptio_convert_tensor){.size = sizeof *t, .name = names[i], .dtype = dtypes[i],
                                     .ndim = ndims[i]};
        t->nbytes = ckptio_dtype_size(t->dtype);
        for (uint32_t d = 0; d < t->ndim; d++)
            t->shape[d] = shapes[i][d], t->nbytes *= shapes[i][d];
        s->data[i] = malloc(t->nbytes + 1);
        CHECK(s->data[i]);
        t_fill(s->data[i], t->nbytes, (uint64_t)i + 1);
    }
    s->m[0] = (ckptio_convert_meta){.size = sizeof s->m[0], .key = "step", .val = "7", .len = 1};
    return 0;
}

static void memsrc_free(memsrc *s)
{
    for (int i = 0; i < 3; i++)
        free(s->data[i]);
}

/* A sink that writes a file of its own layout at tmp_path: each tensor's bytes in order,
 * after checking that they come in order. */
typedef struct {
    FILE *f;
    char tmp[4096];
    const ckptio_convert_tensor *t;
    size_t n, cur, ends, aborts, fail_write;
    uint64_t at, writes;
    bool bad_order, fail_end;
} filesink;

static int sink_begin(void *ctx, const ckptio_convert_tensor *t, size_t n,
                      const ckptio_convert_meta *m, size_t nm, const char *tmp)
{
    filesink *s = ctx;
    (void)m, (void)nm;
    snprintf(s->tmp, sizeof s->tmp, "%s", tmp);
    s->t = t, s->n = n;
    s->f = fopen(tmp, "wx");
    return s->f ? 0 : -errno;
}

static int sink_write(void *ctx, size_t i, uint64_t off, const void *buf, size_t len)
{
    filesink *s = ctx;
    if (++s->writes == s->fail_write) return -ENOSPC;
    if (i != s->cur || off != s->at) s->bad_order = true;
    if (len && fwrite(buf, 1, len, s->f) != len) return -EIO;
    s->at = off + len;
    if (s->at == s->t[i].nbytes) s->cur++, s->at = 0;
    return 0;
}

static int sink_end(void *ctx)
{
    filesink *s = ctx;
    s->ends++;
    int bad = fflush(s->f) | fsync(fileno(s->f));
    bad |= fclose(s->f);
    s->f = NULL;
    return bad || s->fail_end ? -EIO : 0;
}

static void sink_abort(void *ctx)
{
    filesink *s = ctx;
    s->aborts++;
    if (s->f) fclose(s->f), s->f = NULL;
}

/* Nothing in the test's directory but `keep` (a name, or NULL). */
static int only(const char *keep)
{
    if (keep) return t_sh("test \"$(ls -A)\" = '%s'", keep);
    return t_sh("test -z \"$(ls -A)\"");
}

/* An external source into a ckptio checkpoint and back out to an external sink, in pieces. */
static int test_external(void)
{
    memsrc s;
    if (memsrc_init(&s)) return 1;
    ckptio_convert_source src = {.size = sizeof src, .ctx = &s, .list = src_list,
                                 .read = src_read, .errmsg = src_errmsg};
    ckptio_convert_args a = {.size = sizeof a, .src = "mem", .dst = "ck",
                             .from = CKPTIO_CONVERT_TORCH, .piece_bytes = 4096, .source = &src};
    ckptio_convert_result r = {.size = sizeof r};
    CHECK_OK(ckptio_convert(&a, &r));
    CHECK(r.from == CKPTIO_CONVERT_TORCH && r.to == CKPTIO_CONVERT_CKPTIO);
    CHECK(r.n_tensors == 3 && r.nbytes == 60000 + 8);
    CHECK(s.reads > 14); /* 60,000 bytes in pieces of at most 4096 */
    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, "ck", NULL));
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(rd, "step", &v, &len));
    CHECK(len == 1 && !memcmp(v, "7", 1));
    uint8_t *got = malloc(60000);
    CHECK(got);
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", got, 60000));
    CHECK(!memcmp(got, s.data[0], 60000));
    ckptio_reader_close(rd);

    /* ckptio -> a file sink: published at dst, tensors in order, each front to back. */
    filesink k = {0};
    ckptio_convert_sink sink = {.size = sizeof sink, .ctx = &k, .begin = sink_begin,
                                .write = sink_write, .end = sink_end, .abort = sink_abort};
    ckptio_convert_args b = {.size = sizeof b, .src = "ck", .dst = "out.pt",
                             .piece_bytes = 4096, .sink = &sink};
    CHECK_OK(ckptio_convert(&b, &r));
    CHECK(r.from == CKPTIO_CONVERT_CKPTIO && r.to == CKPTIO_CONVERT_TORCH);
    CHECK(k.ends == 1 && k.aborts == 0 && !k.bad_order && k.cur == 3);
    CHECK(strstr(k.tmp, "out.pt.tmp-") != NULL && access(k.tmp, F_OK) < 0);
    unsigned char *file = NULL;
    CHECK(t_read_file("out.pt", &file) == 60000 + 8);
    /* The reader lists tensors by name: empty, step, w. */
    CHECK(!memcmp(file, s.data[2], 8) && !memcmp(file + 8, s.data[0], 60000));
    free(file);
    /* Again: the destination exists. */
    CHECK_ERR(ckptio_convert(&b, NULL), CKPTIO_E_EXISTS);
    CHECK(t_contains(ckptio_last_error(), "--overwrite"));
    b.overwrite = 1;
    k = (filesink){0};
    CHECK_OK(ckptio_convert(&b, NULL));
    CHECK(only("ck\nout.pt") == 0);
    free(got);
    memsrc_free(&s);
    return 0;
}

/* A source that fails part-way and a sink that fails part-way: the error names the tensor and
 * the file, and nothing is left at the destination (a checkpoint, hf shards, a sink's file). */
static int test_failure_leaves_nothing(void)
{
    memsrc s;
    if (memsrc_init(&s)) return 1;
    ckptio_convert_source src = {.size = sizeof src, .ctx = &s, .list = src_list,
                                 .read = src_read, .errmsg = src_errmsg};
    const char *dsts[] = {"ck", "hf", "one.safetensors"};
    for (int i = 0; i < 3; i++) {
        s.reads = 0, s.fail_at = 5;
        ckptio_convert_args a = {.size = sizeof a, .src = "mem", .dst = dsts[i],
                                 .from = CKPTIO_CONVERT_DCP, .piece_bytes = 4096,
                                 .max_shard_bytes = i == 1 ? 20000 : 0, .source = &src};
        CHECK_ERR(ckptio_convert(&a, NULL), -EIO);
        CHECK(t_contains(ckptio_last_error(), "tensor 'w'"));
        CHECK(t_contains(ckptio_last_error(), "failed on purpose"));
        CHECK(only(NULL) == 0);
    }
    /* One that works, then sinks that fail while writing and while ending. */
    s.reads = 0, s.fail_at = 0;
    ckptio_convert_args a = {.size = sizeof a, .src = "mem", .dst = "ck",
                             .from = CKPTIO_CONVERT_DCP, .piece_bytes = 4096, .source = &src};
    CHECK_OK(ckptio_convert(&a, NULL));
    filesink k = {.fail_write = 3};
    ckptio_convert_sink sink = {.size = sizeof sink, .ctx = &k, .begin = sink_begin,
                                .write = sink_write, .end = sink_end, .abort = sink_abort};
    ckptio_convert_args b = {.size = sizeof b, .src = "ck", .dst = "out.pt",
                             .piece_bytes = 4096, .sink = &sink};
    CHECK_ERR(ckptio_convert(&b, NULL), -ENOSPC);
    CHECK(t_contains(ckptio_last_error(), "out.pt") && t_contains(ckptio_last_error(), "'w'"));
    CHECK(k.aborts == 1 && k.ends == 0);
    CHECK(only("ck") == 0);
    /* A sink whose end fails: the engine removes the file it left. */
    k = (filesink){.fail_end = true};
    CHECK_ERR(ckptio_convert(&b, NULL), -EIO);
    CHECK(t_contains(ckptio_last_error(), "finishing"));
    CHECK(k.ends == 1 && k.aborts == 0);
    CHECK(only("ck") == 0);
    k = (filesink){0};
    sink.begin = NULL;
    CHECK_ERR(ckptio_convert(&b, NULL), CKPTIO_E_USAGE); /* a sink without its callbacks */
    CHECK(only("ck") == 0);
    memsrc_free(&s);
    return 0;
}

static int test_detect(void)
{
    CHECK(ckptio_convert_detect("x.safetensors", 1, 0) == CKPTIO_CONVERT_SAFETENSORS);
    CHECK(ckptio_convert_detect("x.pt", 1, 0) == CKPTIO_CONVERT_TORCH);
    CHECK(ckptio_convert_detect("x.dcp/", 1, 0) == CKPTIO_CONVERT_DCP);
    CHECK(ckptio_convert_detect("out", 1, 1) == CKPTIO_CONVERT_HF);
    CHECK(ckptio_convert_detect("out", 1, 0) == CKPTIO_CONVERT_CKPTIO);
    CHECK(ckptio_convert_detect("missing", 0, 0) == -ENOENT);
    CHECK(t_write_file("z.bin", "PK\x03\x04rest", 8) == 0);
    CHECK(ckptio_convert_detect("z.bin", 0, 0) == CKPTIO_CONVERT_TORCH);
    CHECK(t_write_file("mystery", "12345678", 8) == 0);
    CHECK_ERR(ckptio_convert_detect("mystery", 0, 0), CKPTIO_E_FORMAT);
    CHECK(t_contains(ckptio_last_error(), "pass --from"));
    CHECK(mkdir("d", 0777) == 0 && t_write_file("d/.metadata", "x", 1) == 0);
    CHECK(ckptio_convert_detect("d", 0, 0) == CKPTIO_CONVERT_DCP);
    CHECK(ckptio_convert_detect("d", 1, 0) == CKPTIO_CONVERT_DCP);
    CHECK(!strcmp(ckptio_convert_format_name(CKPTIO_CONVERT_HF), "hf"));
    CHECK(ckptio_convert_format_name(9) == NULL);
    CHECK(ckptio_convert_format_parse("st") == CKPTIO_CONVERT_SAFETENSORS);
    CHECK(ckptio_convert_format_parse("zip") == CKPTIO_E_USAGE);
    /* torch and DCP without a source or sink of the caller's: what to run instead. */
    ckptio_convert_args a = {.size = sizeof a, .src = "z.bin", .dst = "ck"};
    CHECK_ERR(ckptio_convert(&a, NULL), CKPTIO_E_UNSUPPORTED);
    CHECK(t_contains(ckptio_last_error(), "python -m ckptio convert"));
    return 0;
}

/* A safetensors file (the length word, json, data) of one float tensor of 2.5 MiB with the
 * narrow exponents trained weights have, and one small integer tensor. */
static int write_float_st(const char *path, uint32_t *w, size_t n)
{
    t_fill(w, n * 4, 11);
    for (size_t i = 0; i < n; i++)
        w[i] = (w[i] & 0x807fffffu) | ((uint32_t)(120 + i % 5) << 23);
    w[3] = 0x7fc12345u, w[4] = 0x80000000u, w[5] = 0xff800000u, w[6] = 0x00000123u;
    char json[256];
    int jl = snprintf(json, sizeof json,
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[%zu,1024],\"data_offsets\":[0,%zu]},"
                      "\"n\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[%zu,%zu]}}",
                      n / 1024, n * 4, n * 4, n * 4 + 16);
    size_t len = 8 + (size_t)jl + n * 4 + 16;
    uint8_t *f = calloc(1, len);
    CHECK(f);
    for (int i = 0; i < 8; i++)
        f[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    memcpy(f + 8, json, (size_t)jl);
    memcpy(f + 8 + jl, w, n * 4);
    f[len - 16] = 42;
    int rc = t_write_file(path, f, len);
    free(f);
    return rc;
}

/* safetensors -> a compressed ckptio checkpoint: the float tensor is stored by the float coder
 * and smaller, and every tensor reads back bit for bit. --compress applies to ckptio only, and
 * a caller built before the field existed (a smaller size) gets none. */
static int test_compress(void)
{
    unsetenv("CKPTIO_COMPRESS"); /* it would override what the args ask */
    const size_t n = 640 * 1024;
    uint32_t *w = malloc(n * 4), *got = malloc(n * 4);
    CHECK(w && got);
    CHECK(write_float_st("in.safetensors", w, n) == 0);
    ckptio_convert_args a = {.size = sizeof a, .src = "in.safetensors", .dst = "ck",
                             .piece_bytes = 1 << 20, .compress = CKPTIO_COMPRESS_ALL};
    ckptio_convert_result r = {.size = sizeof r};
    CHECK_OK(ckptio_convert(&a, &r));
    CHECK(r.to == CKPTIO_CONVERT_CKPTIO && r.n_tensors == 2);
    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, "ck", NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    int64_t i = ckptio_reader_find(rd, "w");
    CHECK_OK(i);
    CHECK_OK(ckptio_reader_tensor(rd, (size_t)i, &ti));
    CHECK(ti.codec && !strcmp(ti.codec, "float"));
    CHECK(ti.stored_bytes < ti.nbytes * 95 / 100);
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", got, n * 4));
    CHECK(!memcmp(got, w, n * 4));
    int64_t small[2];
    CHECK_OK(ckptio_reader_read_tensor(rd, "n", small, sizeof small));
    CHECK(small[0] == 42 && small[1] == 0);
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(rd, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(rd);

    /* The same into safetensors: refused before anything is written. */
    a.dst = "out.safetensors";
    CHECK_ERR(ckptio_convert(&a, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "ckptio destinations only"));
    a.dst = "ck2", a.compress = 7;
    CHECK_ERR(ckptio_convert(&a, NULL), CKPTIO_E_USAGE);
    /* An older caller: its struct ends before compress, whatever lies after it. */
    a.size = offsetof(ckptio_convert_args, compress), a.compress = CKPTIO_COMPRESS_ALL;
    CHECK_OK(ckptio_convert(&a, NULL));
    CHECK_OK(ckptio_reader_open(&rd, "ck2", NULL));
    ti = (ckptio_tensor_info){.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(rd, (size_t)ckptio_reader_find(rd, "w"), &ti));
    CHECK(!strcmp(ti.codec, "none") && ti.stored_bytes == ti.nbytes);
    ckptio_reader_close(rd);
    CHECK(only("ck\nck2\nin.safetensors") == 0);
    free(w);
    free(got);
    return 0;
}

const ckptio_test tests_convert[] = {
    {"convert/external", test_external, T_PER_BACKEND, 120},
    {"convert/failure_leaves_nothing", test_failure_leaves_nothing, 0, 0},
    {"convert/detect", test_detect, 0, 0},
    {"convert/compress", test_compress, T_PER_BACKEND, 120},
    {0, 0, 0, 0},
};
