/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of readers over safetensors files and Hugging Face directories (open_foreign). */
#define CKPTIO_EXPERIMENTAL
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"

/* A safetensors file: the length word, `json`, then dlen bytes of `data`. */
static int write_st(const char *path, const char *json, const uint8_t *data, size_t dlen)
{
    size_t n = strlen(json);
    uint8_t *buf = malloc(8 + n + dlen);
    if (!buf) return -1;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    if (dlen) memcpy(buf + 8 + n, data, dlen);
    int rc = t_write_file(path, buf, 8 + n + dlen);
    free(buf);
    return rc;
}

/* Read tensor `name` whole into aligned memory and compare it with want. */
static int read_whole(ckptio_reader *r, const char *name, const uint8_t *want, size_t n)
{
    size_t cap = (n + 8191) / 4096 * 4096;
    uint8_t *dst = t_alloc(cap);
    CHECK(dst);
    CHECK_OK(ckptio_reader_read_tensor(r, name, dst, cap));
    CHECK(!memcmp(dst, want, n));
    t_free(dst, cap);
    return 0;
}

/* Read box (off, shape) of a row-major 2-d tensor of `cols` columns and `item`-byte elements. */
static int read_box(ckptio_reader *r, const char *name, const uint8_t *full, uint64_t cols,
                    size_t item, const uint64_t off[2], const uint64_t shape[2])
{
    size_t n = shape[0] * shape[1] * item;
    uint8_t *dst = malloc(n);
    CHECK(dst);
    ckptio_region reg = {.size = sizeof reg, .name = name, .offset = off, .shape = shape,
                         .dst = dst, .capacity = n};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    for (uint64_t i = 0; i < shape[0]; i++)
        CHECK(!memcmp(dst + i * shape[1] * item,
                      full + ((off[0] + i) * cols + off[1]) * item, shape[1] * item));
    free(dst);
    return 0;
}

/* Read tensor `name` whole into dst placed in its page as the tensor is in its block, with
 * the page before it as lead room: straight from the block below when the file is read with
 * O_DIRECT (the room then holds the file's bytes before the tensor), never past the room. */
static int read_lead(ckptio_reader *r, const char *name, const uint8_t *want, size_t n)
{
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    int64_t t = ckptio_reader_find(r, name);
    CHECK_OK(t);
    CHECK_OK(ckptio_reader_tensor(r, (size_t)t, &ti));
    CHECK_OK(ckptio_reader_chunk(r, (size_t)t, 0, &ci));
    uint64_t lead = ci.file_offset % 4096, cap = (lead + n + 8191) / 4096 * 4096;
    uint8_t *buf = t_alloc(4096 + cap);
    CHECK(buf);
    memset(buf, 0xAA, 4096 + cap);
    ckptio_region reg = {.size = sizeof reg, .name = name, .dst = buf + 4096 + lead,
                         .capacity = cap - lead, .lead = lead};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    CHECK(!memcmp(buf + 4096 + lead, want, n));
    for (size_t i = 0; i < 4096; i++) CHECK(buf[i] == 0xAA); /* nothing before the room */
    ckptio_stats st;
    CHECK_OK(ckptio_reader_stats(r, &st));
    if (st.direct && lead) { /* the room holds what precedes the tensor in the file */
        FILE *f = fopen(t_path("m.safetensors"), "rb");
        uint8_t before[4096];
        CHECK(f && fseek(f, (long)(ci.file_offset - lead), SEEK_SET) == 0);
        CHECK(fread(before, 1, lead, f) == lead);
        fclose(f);
        CHECK(!memcmp(buf + 4096, before, lead));
    }
    t_free(buf, 4096 + cap);
    return 0;
}

enum { W_ROWS = 300, W_COLS = 40, BIG = 3u << 20 };
#define W_BYTES (W_ROWS * W_COLS * 4)

static uint8_t *file_data(void)
{
    uint8_t *d = malloc(BIG + W_BYTES + 10);
    if (d) t_fill(d, BIG + W_BYTES + 10, 7);
    return d;
}

/* One file with unaligned data (its header is not padded), odd dtypes, an empty tensor. */
static int make_file(const char *path, const uint8_t *d)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"big\":{\"dtype\":\"I8\",\"shape\":[3,%u],\"data_offsets\":[0,%u]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[%u,%u],\"data_offsets\":[%u,%u]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[%u,%u]},"
             "\"e\":{\"dtype\":\"F8_E8M0\",\"shape\":[2,2],\"data_offsets\":[%u,%u]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[%u,%u]}}",
             BIG / 3, BIG, W_ROWS, W_COLS, BIG, BIG + W_BYTES, BIG + W_BYTES, BIG + W_BYTES + 6,
             BIG + W_BYTES + 6, BIG + W_BYTES + 10, BIG + W_BYTES + 10, BIG + W_BYTES + 10);
    return write_st(path, json, d, BIG + W_BYTES + 10);
}

static int test_file(void)
{
    uint8_t *d = file_data();
    CHECK(d);
    const char *path = t_path("m.safetensors");
    CHECK(make_file(path, d) == 0);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open_foreign(&r, path, NULL));
    CHECK(ckptio_reader_num_tensors(r) == 5);
    const char *names[] = {"b", "big", "e", "w", "z"};
    ckptio_tensor_info ti = {.size = sizeof ti};
    for (size_t i = 0; i < 5; i++) {
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        CHECK(!strcmp(ti.name, names[i]) && ti.num_chunks == 1);
    }
    CHECK_OK(ckptio_reader_tensor(r, 2, &ti)); /* F8_E8M0: bytes, a trailing 1 */
    CHECK(ti.dtype == CKPTIO_DT_BYTES && ti.ndim == 3 && ti.shape[2] == 1 && ti.nbytes == 4);
    CHECK(!strcmp(ckptio_st_dtype_name(ckptio_reader_st_dtype(r, 2)), "F8_E8M0"));
    CHECK(!strcmp(ckptio_st_dtype_name(ckptio_reader_st_dtype(r, 0)), "BF16"));
    CHECK_ERR(ckptio_reader_st_dtype(r, 5), CKPTIO_E_NOT_FOUND);
    CHECK_OK(ckptio_reader_tensor(r, 3, &ti));
    CHECK(ti.dtype == CKPTIO_DT_F32 && ti.ndim == 2 && ti.shape[0] == W_ROWS);
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, 3, 0, &ci));
    CHECK(!strcmp(ci.file, "m.safetensors") && ci.stored_bytes == W_BYTES);
    CHECK(ci.file_offset % 4096 != 0); /* the planner stages what O_DIRECT cannot take */
    const void *v;
    size_t vlen;
    CHECK_OK(ckptio_reader_get_meta(r, "format", &v, &vlen));
    CHECK(vlen == 2 && !memcmp(v, "pt", 2));
    CHECK(read_whole(r, "big", d, BIG) == 0);
    CHECK(read_whole(r, "w", d + BIG, W_BYTES) == 0);
    CHECK(read_whole(r, "b", d + BIG + W_BYTES, 6) == 0);
    CHECK(read_whole(r, "e", d + BIG + W_BYTES + 6, 4) == 0);
    CHECK_OK(ckptio_reader_read_tensor(r, "z", NULL, 0));
    uint64_t off[2] = {10, 5}, shape[2] = {20, 7};
    CHECK(read_box(r, "w", d + BIG, W_COLS, 4, off, shape) == 0);
    uint64_t off2[2] = {1, 1000}, shape2[2] = {2, 300000};
    CHECK(read_box(r, "big", d, BIG / 3, 1, off2, shape2) == 0);
    /* From the device (the file just written is resident), with lead room before dst. */
    ckptio_params p;
    ckptio_params_init(&p);
    p.cache = CKPTIO_CACHE_NEVER;
    ckptio_reader *rd;
    CHECK_OK(ckptio_reader_open_foreign(&rd, path, &p));
    CHECK(read_lead(rd, "w", d + BIG, W_BYTES) == 0);
    CHECK(read_lead(rd, "big", d, BIG) == 0);
    ckptio_reader_close(rd);
    /* Nothing is checksummed, and verify says so. */
    uint64_t bad = 9;
    CHECK_ERR(ckptio_reader_verify(r, &bad), CKPTIO_E_UNSUPPORTED);
    CHECK(bad == 0 && t_contains(ckptio_reader_errmsg(r), "no checksums"));
    ckptio_read_stats rs = {.size = sizeof rs};
    CHECK_OK(ckptio_reader_read_stats(r, &rs));
    CHECK(rs.device_bytes + rs.cache_bytes >= BIG);
    ckptio_reader_close(r);
    /* The ckptio open of the same file is still refused: nothing changed meaning. */
    CHECK(ckptio_reader_open(&r, path, NULL) < 0 && r == NULL);
    free(d);
    return 0;
}

static int open_fails(const char *path, int code, const char *want)
{
    ckptio_reader *r = (ckptio_reader *)1;
    CHECK_ERR(ckptio_reader_open_foreign(&r, path, NULL), code);
    CHECK(r == NULL);
    if (!t_contains(ckptio_last_error(), want)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", ckptio_last_error(), want);
        return 1;
    }
    return 0;
}

static int test_corrupt(void)
{
    uint8_t d[16] = {0};
    const char *p = t_path("cut.safetensors");
    CHECK(write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4]", d, 0) == 0);
    CHECK(open_fails(p, CKPTIO_E_CORRUPT, "cut.safetensors") == 0);
    CHECK(open_fails(p, CKPTIO_E_CORRUPT, "safetensors header") == 0);
    p = t_path("short.safetensors");
    CHECK(t_write_file(p, "abc", 3) == 0);
    CHECK(open_fails(p, CKPTIO_E_CORRUPT, "short.safetensors") == 0);
    p = t_path("size.safetensors");
    const char *small = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}}";
    CHECK(write_st(p, small, d, 8) == 0);
    CHECK(open_fails(p, CKPTIO_E_SHAPE, "size.safetensors") == 0);
    p = t_path("huge.safetensors");
    uint8_t head[16] = {0, 0, 0, 0, 0, 0, 0, 0x10, '{'};
    CHECK(t_write_file(p, head, sizeof head) == 0);
    CHECK(open_fails(p, CKPTIO_E_LIMIT, "huge.safetensors") == 0);
    CHECK(open_fails(t_path("missing.safetensors"), -ENOENT, "missing.safetensors") == 0);
    /* A ckptio checkpoint is not opened as a foreign one. */
    CHECK(t_sh("mkdir -p %s && touch %s/manifest", t_path("ck"), t_path("ck")) == 0);
    CHECK(open_fails(t_path("ck"), CKPTIO_E_FORMAT, "ckptio_reader_open") == 0);
    CHECK(open_fails(t_path("empty-dir-missing"), -ENOENT, "empty-dir-missing") == 0);
    CHECK(t_sh("mkdir -p %s", t_path("empty")) == 0);
    CHECK(open_fails(t_path("empty"), CKPTIO_E_NOT_CHECKPOINT, "no .safetensors") == 0);
    return 0;
}

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

/* Two shards (the second a link into a blob store outside the directory, as in the Hugging
 * Face cache) and their index; shard 1 also holds "extra", which the index does not map. */
static int make_hf(const char *dir, const uint8_t *d)
{
    char blob[512];
    snprintf(blob, sizeof blob, "%s-blobs", dir);
    CHECK(t_sh("mkdir -p %s %s", dir, blob) == 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/" SHARD1, dir);
    CHECK(write_st(p,
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                   "\"extra\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[24,25]},"
                   "\"__metadata__\":{\"format\":\"pt\",\"shard\":\"1\"}}",
                   d, 25) == 0);
    snprintf(p, sizeof p, "%s/sha256-2", blob);
    CHECK(write_st(p,
                   "{\"__metadata__\":{\"shard\":\"2\"},"
                   "\"b.c\":{\"dtype\":\"I64\",\"shape\":[600],\"data_offsets\":[0,4800]}}   ",
                   d + 100, 4800) == 0);
    CHECK(t_sh("ln -sf ../%s/sha256-2 %s/" SHARD2, strrchr(blob, '/') + 1, dir) == 0);
    return 0;
}

static int write_index(const char *dir, const char *json)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return t_write_file(p, json, strlen(json));
}

static int test_hf_dir(void)
{
    uint8_t *d = file_data();
    CHECK(d);
    const char *dir = t_path("hf");
    CHECK(make_hf(dir, d) == 0);
    /* Without an index: every tensor of every shard. */
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open_foreign(&r, dir, NULL));
    CHECK(ckptio_reader_num_tensors(r) == 3);
    ckptio_reader_close(r);
    CHECK(write_index(dir, "{\"metadata\":{\"total_size\":4824,\"nested\":{\"x\":[1,2]}},"
                           "\"weight_map\":{\"b.c\":\"" SHARD2 "\",\"a\":\"" SHARD1 "\"}}\n") ==
          0);
    const char *via[] = {dir, t_path("hf/model.safetensors.index.json")};
    for (size_t k = 0; k < 2; k++) {
        CHECK_OK(ckptio_reader_open_foreign(&r, via[k], NULL));
        CHECK(ckptio_reader_num_tensors(r) == 2); /* "extra" is not in the map */
        CHECK(ckptio_reader_find(r, "extra") == CKPTIO_E_NOT_FOUND);
        CHECK(read_whole(r, "a", d, 24) == 0);
        CHECK(read_whole(r, "b.c", d + 100, 4800) == 0);
        uint64_t off[1] = {17}, shape[1] = {500};
        uint8_t got[4000];
        ckptio_region reg = {.size = sizeof reg, .name = "b.c", .offset = off, .shape = shape,
                             .dst = got, .capacity = sizeof got};
        CHECK_OK(ckptio_reader_read(r, &reg, 1));
        CHECK(!memcmp(got, d + 100 + 17 * 8, 4000));
        const void *v;
        size_t len;
        CHECK_OK(ckptio_reader_get_meta(r, "total_size", &v, &len));
        CHECK(len == 4 && !memcmp(v, "4824", 4));
        CHECK_OK(ckptio_reader_get_meta(r, "nested", &v, &len));
        CHECK(len == 11 && !memcmp(v, "{\"x\":[1,2]}", 11));
        /* The first file's value: files in the order the index first names them. */
        CHECK_OK(ckptio_reader_get_meta(r, "shard", &v, &len));
        CHECK(len == 1 && !memcmp(v, "2", 1));
        CHECK(ckptio_reader_num_meta(r) == 4);
        ckptio_reader_close(r);
    }
    /* Refused: a shard outside the directory, a tensor its shard lacks, bad JSON. */
    CHECK(write_index(dir, "{\"weight_map\":{\"a\":\"../hf-blobs/sha256-2\"}}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "outside its directory") == 0);
    CHECK(write_index(dir, "{\"weight_map\":{\"a\":\"/etc/passwd\"}}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "outside its directory") == 0);
    CHECK(write_index(dir, "{\"weight_map\":{\"b.c\":\"" SHARD1 "\"}}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "does not hold it") == 0);
    CHECK(write_index(dir, "{\"weight_map\":{\"a\":\"" SHARD1 "\",}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "model.safetensors.index.json") == 0);
    CHECK(write_index(dir, "{\"metadata\":{}}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "no weight_map") == 0);
    CHECK(write_index(dir, "{\"weight_map\":{\"a\":\"missing.safetensors\"}}") == 0);
    CHECK(open_fails(dir, CKPTIO_E_CORRUPT, "missing.safetensors") == 0);
    /* Without an index, a name in two shards is ambiguous. */
    CHECK(t_sh("rm %s/model.safetensors.index.json && cp %s/" SHARD1 " %s/copy.safetensors", dir,
               dir, dir) == 0);
    CHECK(open_fails(dir, CKPTIO_E_DUPLICATE, "in both") == 0);
    free(d);
    return 0;
}

const ckptio_test tests_foreign[] = {
    {"foreign/file", test_file, T_PER_BACKEND, 120},
    {"foreign/corrupt", test_corrupt, 0, 0},
    {"foreign/hf_dir", test_hf_dir, T_PER_BACKEND, 120},
    {0, 0, 0, 0},
};
