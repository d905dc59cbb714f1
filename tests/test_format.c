/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of src/format: manifest round trips, every validation rule, bounded decoding, corpus. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>

#include "../src/format/manifest.h"
#include "test.h"

#ifndef CKPTIO_SOURCE_ROOT
#define CKPTIO_SOURCE_ROOT "."
#endif

/* ---- a manifest builder, the way a writer grows one ---------------------------------------- */

typedef struct mb {
    ckptio__manifest m;
    ckptio__vec files, tensors, chunks, meta, dims, csums, strtab;
    uint64_t cursor[64]; /* next free byte of each file */
    int fixed_size[64];  /* file size given explicitly */
} mb;

static void mb_init(mb *b, uint32_t csum_algo, uint64_t csum_block)
{
    memset(b, 0, sizeof *b);
    b->m.version = CKPTIO_FORMAT_VERSION;
    b->m.csum_algo = csum_algo;
    b->m.csum_block = csum_block;
    ckptio__vec_init(&b->files, sizeof(ckptio__mfile));
    ckptio__vec_init(&b->tensors, sizeof(ckptio__mtensor));
    ckptio__vec_init(&b->chunks, sizeof(ckptio__mchunk));
    ckptio__vec_init(&b->meta, sizeof(ckptio__mmeta));
    ckptio__vec_init(&b->dims, sizeof(uint64_t));
    ckptio__vec_init(&b->csums, sizeof(uint64_t));
    ckptio__vec_init(&b->strtab, 1);
}

static void mb_free(mb *b)
{
    ckptio__vec_free(&b->files);
    ckptio__vec_free(&b->tensors);
    ckptio__vec_free(&b->chunks);
    ckptio__vec_free(&b->meta);
    ckptio__vec_free(&b->dims);
    ckptio__vec_free(&b->csums);
    ckptio__vec_free(&b->strtab);
}

static void must(int64_t r)
{
    if (r < 0) abort();
}

static uint64_t mb_str(mb *b, const void *s, size_t len)
{
    uint64_t off = b->strtab.len;
    must(ckptio__vec_push(&b->strtab, s, len));
    must(ckptio__vec_push(&b->strtab, NULL, 1));
    return off;
}

static uint32_t mb_file_n(mb *b, const char *name, size_t len)
{
    ckptio__mfile f = {.name = mb_str(b, name, len), .name_len = (uint32_t)len};
    uint32_t i = (uint32_t)b->files.len;
    must(ckptio__vec_push(&b->files, &f, 1));
    return i;
}

static uint32_t mb_file(mb *b, const char *name)
{
    return mb_file_n(b, name, strlen(name));
}

static void mb_tensor_n(mb *b, const char *name, size_t len, int dtype, uint32_t ndim,
                        const uint64_t *shape)
{
    ckptio__mtensor t = {.name = mb_str(b, name, len), .name_len = (uint32_t)len,
                         .dtype = (uint32_t)dtype, .ndim = ndim, .dims = b->dims.len,
                         .chunk0 = b->chunks.len};
    if (ndim) must(ckptio__vec_push(&b->dims, shape, ndim));
    must(ckptio__vec_push(&b->tensors, &t, 1));
}

static void mb_tensor(mb *b, const char *name, int dtype, uint32_t ndim, const uint64_t *shape)
{
    mb_tensor_n(b, name, strlen(name), dtype, ndim, shape);
}

/* A chunk of the last tensor, placed at the next properly aligned offset of `file`. */
static void mb_chunk(mb *b, const uint64_t *off, const uint64_t *shp, uint32_t file)
{
    ckptio__mtensor *t = CKPTIO__VEC_AT(&b->tensors, ckptio__mtensor, b->tensors.len - 1);
    uint32_t nd = t->ndim;
    uint64_t zeros[CKPTIO_MAX_NDIM] = {0}, tshape[CKPTIO_MAX_NDIM];
    if (nd) memcpy(tshape, CKPTIO__VEC_AT(&b->dims, uint64_t, t->dims), nd * 8);
    if (!off) off = zeros;
    if (!shp) shp = tshape;
    ckptio__mchunk c = {.dims = b->dims.len, .file = file,
                        .tensor = (uint32_t)(b->tensors.len - 1)};
    if (nd) {
        must(ckptio__vec_push(&b->dims, off, nd));
        must(ckptio__vec_push(&b->dims, shp, nd));
    }
    uint64_t vol = 1;
    for (uint32_t d = 0; d < nd; d++) vol *= shp[d];
    c.raw_len = c.stored_len = vol * ckptio_dtype_size((int)t->dtype);
    if (c.stored_len) {
        uint64_t a = c.stored_len >= 4096 ? 4096 : 64;
        c.file_off = ckptio__align_up(b->cursor[file], a);
        b->cursor[file] = c.file_off + c.stored_len;
    }
    c.csums = b->csums.len;
    if (b->m.csum_algo && c.stored_len) {
        c.n_csums = (c.stored_len + b->m.csum_block - 1) / b->m.csum_block;
        for (uint64_t i = 0; i < c.n_csums; i++) {
            uint64_t h = ckptio__hash(&c, sizeof c) + i;
            must(ckptio__vec_push(&b->csums, &h, 1));
        }
    }
    must(ckptio__vec_push(&b->chunks, &c, 1));
    t = CKPTIO__VEC_AT(&b->tensors, ckptio__mtensor, b->tensors.len - 1);
    t->n_chunks++;
}

static void mb_meta(mb *b, const char *key, const void *val, size_t len)
{
    ckptio__mmeta e = {.key = mb_str(b, key, strlen(key)), .key_len = (uint32_t)strlen(key)};
    e.val = mb_str(b, val, len);
    e.val_len = len;
    must(ckptio__vec_push(&b->meta, &e, 1));
}

static const char *sort_strtab;
static int tensor_by_name(const void *pa, const void *pb)
{
    const ckptio__mtensor *a = pa, *b = pb;
    size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(sort_strtab + a->name, sort_strtab + b->name, n);
    return c ? c : (a->name_len > b->name_len) - (a->name_len < b->name_len);
}

/* Point the manifest at the arrays; `sort` orders tensors by name as a writer must (their chunk
 * ranges then no longer follow one another, which the format allows in memory). */
static ckptio__manifest *mb_done(mb *b, int sort)
{
    ckptio__manifest *m = &b->m;
    m->files = b->files.items;
    m->n_files = b->files.len;
    for (uint64_t i = 0; i < m->n_files && i < 64; i++)
        if (!b->fixed_size[i]) m->files[i].size = b->cursor[i];
    m->tensors = b->tensors.items;
    m->n_tensors = b->tensors.len;
    m->chunks = b->chunks.items;
    m->n_chunks = b->chunks.len;
    m->meta = b->meta.items;
    m->n_meta = b->meta.len;
    m->dims = b->dims.items;
    m->n_dims = b->dims.len;
    m->csums = b->csums.items;
    m->n_csums = b->csums.len;
    m->strtab = b->strtab.items;
    m->strtab_len = b->strtab.len;
    if (sort && m->n_tensors > 1) {
        sort_strtab = m->strtab;
        qsort(m->tensors, m->n_tensors, sizeof *m->tensors, tensor_by_name);
        for (uint64_t i = 0; i < m->n_tensors; i++)
            for (uint64_t k = 0; k < m->tensors[i].n_chunks; k++)
                m->chunks[m->tensors[i].chunk0 + k].tensor = (uint32_t)i;
    }
    return m;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static char errbuf[1024];

/* Encode m into a malloc'd buffer; NULL on failure. */
static uint8_t *enc(const ckptio__manifest *m, uint64_t *len)
{
    if (ckptio__manifest_encoded_size(m, len) < 0) return NULL;
    uint8_t *buf = malloc(*len);
    if (buf && ckptio__manifest_encode(m, buf, *len) < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Recompute both checksums of an encoded manifest after a test patched it. */
static void fix_sums(uint8_t *buf, uint64_t len)
{
    uint32_t hsize;
    memcpy(&hsize, buf + 12, 4);
    if (hsize < 128 || hsize > len) return;
    uint64_t body = ckptio__hash(buf + hsize, len - hsize);
    memcpy(buf + 24, &body, 8);
    uint64_t head = ckptio__hash(buf, hsize - 8);
    memcpy(buf + hsize - 8, &head, 8);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Equal runs of two u64 arrays; empty runs are equal even when an array is NULL. */
static int u64_eq(const uint64_t *a, uint64_t ai, const uint64_t *b, uint64_t bi, uint64_t n)
{
    return n == 0 || !memcmp(a + ai, b + bi, n * 8);
}

static int str_eq(const ckptio__manifest *a, uint64_t ao, const ckptio__manifest *b, uint64_t bo,
                  uint64_t len)
{
    return !memcmp(a->strtab + ao, b->strtab + bo, len);
}

/* Deep equality of two manifests, index fields aside (they may be laid out differently). */
static int same(const ckptio__manifest *a, const ckptio__manifest *b)
{
    CHECK(a->version == b->version && a->csum_algo == b->csum_algo &&
          a->csum_block == b->csum_block);
    CHECK(a->n_files == b->n_files && a->n_tensors == b->n_tensors && a->n_meta == b->n_meta);
    for (uint64_t i = 0; i < a->n_files; i++) {
        const ckptio__mfile *x = &a->files[i], *y = &b->files[i];
        CHECK(x->name_len == y->name_len && x->size == y->size);
        CHECK(str_eq(a, x->name, b, y->name, x->name_len));
    }
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const ckptio__mtensor *x = &a->tensors[i], *y = &b->tensors[i];
        CHECK(x->name_len == y->name_len && str_eq(a, x->name, b, y->name, x->name_len));
        CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->n_chunks == y->n_chunks);
        CHECK(u64_eq(a->dims, x->dims, b->dims, y->dims, x->ndim));
        for (uint64_t k = 0; k < x->n_chunks; k++) {
            const ckptio__mchunk *c = &a->chunks[x->chunk0 + k], *d = &b->chunks[y->chunk0 + k];
            CHECK(u64_eq(a->dims, c->dims, b->dims, d->dims, 2 * (uint64_t)x->ndim));
            CHECK(c->file == d->file && c->codec == d->codec && c->file_off == d->file_off);
            CHECK(c->stored_len == d->stored_len && c->raw_len == d->raw_len);
            CHECK(c->n_csums == d->n_csums);
            CHECK(u64_eq(a->csums, c->csums, b->csums, d->csums, c->n_csums));
            CHECK(d->tensor == i); /* b is the decoded one */
        }
    }
    for (uint64_t i = 0; i < a->n_meta; i++) {
        const ckptio__mmeta *x = &a->meta[i], *y = &b->meta[i];
        CHECK(x->key_len == y->key_len && str_eq(a, x->key, b, y->key, x->key_len));
        CHECK(x->val_len == y->val_len && str_eq(a, x->val, b, y->val, x->val_len));
        CHECK(b->strtab[y->val + y->val_len] == 0);
    }
    return 0;
}

/* validate, encode, decode, compare, re-encode: the bytes must come back identical. */
static int roundtrip(const ckptio__manifest *m)
{
    int rc = ckptio__manifest_validate(m, errbuf, sizeof errbuf);
    if (rc < 0) fprintf(stderr, "validate: %s\n", errbuf);
    CHECK_OK(rc);
    uint64_t len, len2;
    uint8_t *buf = enc(m, &len);
    CHECK(buf);
    ckptio__manifest *d = NULL;
    rc = ckptio__manifest_decode(buf, len, &d, errbuf, sizeof errbuf);
    if (rc < 0) fprintf(stderr, "decode: %s\n", errbuf);
    CHECK_OK(rc);
    CHECK(d && d->arena);
    CHECK(same(m, d) == 0);
    uint8_t *buf2 = enc(d, &len2);
    CHECK(buf2 && len2 == len && !memcmp(buf, buf2, len));
    ckptio__manifest_free(d);
    free(buf);
    free(buf2);
    return 0;
}

/* validate must fail with `code` and a message holding `msg`; then, when the indices are sane
 * enough to encode (`encode`), decoding the encoded bytes must fail with `code` as well. */
static int expect(const ckptio__manifest *m, int code, const char *msg, int encode)
{
    errbuf[0] = 0;
    int rc = ckptio__manifest_validate(m, errbuf, sizeof errbuf);
    if (rc != code || !t_contains(errbuf, msg)) {
        fprintf(stderr, "validate -> %d %s '%s', expected %s '%s'\n", rc, ckptio_errname(rc),
                errbuf, ckptio_errname(code), msg);
        return 1;
    }
    if (!encode) return 0;
    uint64_t len;
    uint8_t *buf = enc(m, &len);
    CHECK(buf);
    ckptio__manifest *d = NULL;
    rc = ckptio__manifest_decode(buf, len, &d, errbuf, sizeof errbuf);
    free(buf);
    if (rc != code || d) {
        fprintf(stderr, "decode -> %d %s '%s', expected %s (%s)\n", rc, ckptio_errname(rc),
                errbuf, ckptio_errname(code), msg);
        ckptio__manifest_free(d);
        return 1;
    }
    return 0;
}

static int decode_rc(const uint8_t *buf, uint64_t len)
{
    ckptio__manifest *d = NULL;
    int rc = ckptio__manifest_decode(buf, len, &d, errbuf, sizeof errbuf);
    if (rc == 0 && !d) return -9999;
    if (rc != 0 && d) return -9998;
    ckptio__manifest_free(d);
    return rc;
}

/* A small manifest exercising most features: 2 files, 5 tensors, metadata, checksums. */
static ckptio__manifest *small(mb *b, uint32_t algo)
{
    mb_init(b, algo, algo ? 4096 : 0);
    uint32_t f0 = mb_file(b, "data/000000.ckd"), f1 = mb_file(b, "data/000001.ckd");
    uint64_t s2[2] = {64, 48}, s1[1] = {5000}, z[1] = {0};
    mb_tensor(b, "a.bias", CKPTIO_DT_F32, 1, s1);
    mb_chunk(b, NULL, (uint64_t[]){2500}, f0);
    mb_chunk(b, (uint64_t[]){2500}, (uint64_t[]){2500}, f1);
    mb_tensor(b, "a.empty", CKPTIO_DT_I64, 1, z);
    mb_chunk(b, NULL, NULL, f0);
    mb_tensor(b, "a.weight", CKPTIO_DT_BF16, 2, s2);
    for (uint64_t r = 0; r < 64; r += 16) mb_chunk(b, (uint64_t[]){r, 0}, (uint64_t[]){16, 48}, f1);
    mb_tensor(b, "step", CKPTIO_DT_I64, 0, NULL);
    mb_chunk(b, NULL, NULL, f0);
    mb_tensor(b, "tok", CKPTIO_DT_BYTES, 1, (uint64_t[]){10});
    mb_chunk(b, NULL, NULL, f0);
    mb_meta(b, "framework", "numpy", 5);
    mb_meta(b, "step", "\x10\x00\x00\x00", 4);
    return mb_done(b, 0);
}

/* ---- round trips --------------------------------------------------------------------------- */

static int test_roundtrip_dtypes(void)
{
    mb b;
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 4096);
    uint32_t f = mb_file(&b, "data/000000.ckd");
    char name[64];
    for (int dt = CKPTIO_DT_BOOL; dt <= CKPTIO_DT_BYTES; dt++) {
        /* Per dtype: a scalar, an empty tensor, a one-chunk and a multi-chunk tensor. */
        snprintf(name, sizeof name, "%s.scalar", ckptio_dtype_name(dt));
        mb_tensor(&b, name, dt, 0, NULL);
        mb_chunk(&b, NULL, NULL, f);
        snprintf(name, sizeof name, "%s.empty", ckptio_dtype_name(dt));
        mb_tensor(&b, name, dt, 3, (uint64_t[]){3, 0, 5});
        mb_chunk(&b, NULL, NULL, f);
        snprintf(name, sizeof name, "%s.whole", ckptio_dtype_name(dt));
        mb_tensor(&b, name, dt, 2, (uint64_t[]){33, 65});
        mb_chunk(&b, NULL, NULL, f);
        snprintf(name, sizeof name, "%s.grid", ckptio_dtype_name(dt));
        mb_tensor(&b, name, dt, 3, (uint64_t[]){10, 1000, 2});
        for (uint64_t r = 0; r < 10; r += 5)
            for (uint64_t c = 0; c < 1000; c += 300)
                mb_chunk(&b, (uint64_t[]){r, c, 0}, (uint64_t[]){5, c == 900 ? 100 : 300, 2}, f);
    }
    ckptio__manifest *m = mb_done(&b, 1);
    CHECK(m->n_tensors == 4 * 18);
    CHECK(roundtrip(m) == 0);
    mb_free(&b);
    return 0;
}

static int test_roundtrip_names_meta(void)
{
    mb b;
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 1 << 20);
    uint32_t f = mb_file(&b, "data/000000.ckd");
    const char *names[] = {"layers.0.w", "\xc3\xa9t\xc3\xa9",              /* été */
                           "\xe6\x9d\x83\xe9\x87\x8d",                      /* CJK */
                           "\xf0\x9f\x98\x80.emoji", "with space/and slash"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mb_tensor(&b, names[i], CKPTIO_DT_F16, 1, (uint64_t[]){3000});
        mb_chunk(&b, NULL, NULL, f);
    }
    /* A 4096-byte name, the longest allowed. */
    char *longname = malloc(CKPTIO_MAX_NAME);
    CHECK(longname);
    memset(longname, 'z', CKPTIO_MAX_NAME);
    mb_tensor_n(&b, longname, CKPTIO_MAX_NAME, CKPTIO_DT_U8, 1, (uint64_t[]){1});
    mb_chunk(&b, NULL, NULL, f);
    uint8_t bin[300];
    for (int i = 0; i < 300; i++) bin[i] = (uint8_t)(i * 7);
    bin[0] = 0;
    mb_meta(&b, "binary", bin, sizeof bin);
    mb_meta(&b, "empty", "", 0);
    mb_meta(&b, "nul\xc3\xa9", "\0\0\0", 3);
    size_t big = 200000;
    char *bigval = malloc(big);
    CHECK(bigval);
    t_fill(bigval, big, 5);
    mb_meta(&b, "zbig", bigval, big);
    ckptio__manifest *m = mb_done(&b, 1);
    CHECK(roundtrip(m) == 0);
    free(longname);
    free(bigval);
    mb_free(&b);
    return 0;
}

static int test_roundtrip_shapes(void)
{
    /* Empty checkpoint: no files, no tensors. */
    mb b;
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 1 << 20);
    ckptio__manifest *m = mb_done(&b, 0);
    CHECK(roundtrip(m) == 0);
    uint64_t len;
    CHECK_OK(ckptio__manifest_encoded_size(m, &len));
    CHECK(len == 128);
    mb_free(&b);

    /* Checksums off (block 0 and a block size kept without meaning), small and large. */
    mb_init(&b, CKPTIO__CSUM_NONE, 0);
    CHECK(roundtrip(small(&b, CKPTIO__CSUM_NONE)) == 0);
    b.m.csum_block = 1 << 20;
    CHECK(roundtrip(&b.m) == 0);
    mb_free(&b);
    CHECK(roundtrip(small(&b, CKPTIO__CSUM_XXH3_64)) == 0);
    mb_free(&b);

    /* Checksum blocks: a chunk of exactly k blocks and one with a short last block. */
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 4096);
    uint32_t f = mb_file(&b, "x.ckd");
    mb_tensor(&b, "empty.wide", CKPTIO_DT_C128, 3, (uint64_t[]){1ull << 40, 1ull << 40, 0});
    mb_chunk(&b, NULL, NULL, f); /* its volume is 0, not an overflow */
    mb_tensor(&b, "exact", CKPTIO_DT_U8, 1, (uint64_t[]){3 * 4096});
    mb_chunk(&b, NULL, NULL, f);
    mb_tensor(&b, "short", CKPTIO_DT_U8, 1, (uint64_t[]){3 * 4096 + 1});
    mb_chunk(&b, NULL, NULL, f);
    m = mb_done(&b, 0);
    CHECK(m->chunks[1].n_csums == 3 && m->chunks[2].n_csums == 4);
    CHECK(roundtrip(m) == 0);
    mb_free(&b);

    /* 32 dimensions, 64 files, chunk counts that vary per tensor. */
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 65536);
    char name[32];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "stripe%02d/data/%06d.ckd", i % 4, i);
        mb_file(&b, name);
    }
    uint64_t shape[32];
    for (int d = 0; d < 32; d++) shape[d] = d < 3 ? 4 : 1;
    mb_tensor(&b, "deep", CKPTIO_DT_F64, 32, shape);
    mb_chunk(&b, NULL, NULL, 63);
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "t%04d", i);
        uint64_t rows = (uint64_t)(i % 7) + 1;
        mb_tensor(&b, name, CKPTIO_DT_F32, 2, (uint64_t[]){rows * 8, 32});
        for (uint64_t r = 0; r < rows; r++)
            mb_chunk(&b, (uint64_t[]){r * 8, 0}, (uint64_t[]){8, 32}, (uint32_t)((i + r) % 64));
    }
    CHECK(roundtrip(mb_done(&b, 0)) == 0);
    mb_free(&b);
    return 0;
}

/* In memory a writer's arrays may hold slack and any order; the encoding is canonical. */
static int test_writer_layout(void)
{
    mb b;
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 4096);
    uint32_t f = mb_file(&b, "data/000000.ckd");
    mb_str(&b, "garbage", 7);
    uint64_t junk[3] = {9, 9, 9};
    must(ckptio__vec_push(&b.dims, junk, 3));
    mb_tensor(&b, "zeta", CKPTIO_DT_F32, 1, (uint64_t[]){8192});
    mb_chunk(&b, (uint64_t[]){4096}, (uint64_t[]){4096}, f);
    mb_chunk(&b, NULL, (uint64_t[]){4096}, f);
    mb_tensor(&b, "alpha", CKPTIO_DT_U8, 2, (uint64_t[]){2, 2});
    mb_chunk(&b, NULL, NULL, f);
    mb_tensor(&b, "mid", CKPTIO_DT_U8, 1, (uint64_t[]){100});
    mb_chunk(&b, NULL, NULL, f);
    ckptio__manifest *m = mb_done(&b, 1);
    CHECK(m->tensors[0].chunk0 == 2 && m->tensors[2].chunk0 == 0); /* not consecutive */
    m->tensors[1].name = mb_str(&b, "mid", 3); /* strings in any order, with garbage between */
    m = mb_done(&b, 0);
    CHECK(roundtrip(m) == 0);
    mb_free(&b);
    return 0;
}

/* ---- header, truncation, counts ------------------------------------------------------------ */

static int test_header(void)
{
    mb b;
    uint64_t len;
    uint8_t *buf = enc(small(&b, CKPTIO__CSUM_XXH3_64), &len);
    CHECK(buf);
    CHECK(decode_rc(buf, len) == 0);
    uint8_t *c = malloc(len + 4096);
    CHECK(c);

    memcpy(c, buf, len);
    c[1] ^= 0x20; /* "cKPTIO" */
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "magic"));
    CHECK_ERR(decode_rc((const uint8_t *)"PK\x03\x04", 4), CKPTIO_E_CORRUPT);

    /* A newer major version is named as such, whatever follows, even truncated. */
    memcpy(c, buf, len);
    c[8] = 4; /* 2 (striped) and 3 (coded) are formats this library reads */
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_FORMAT);
    CHECK(t_contains(errbuf, "4.0"));
    CHECK_ERR(decode_rc(c, 12), CKPTIO_E_FORMAT);
    c[8] = 0xff, c[9] = 0xff;
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_FORMAT);
    c[8] = 0, c[9] = 0;
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);

    /* Checksums: one flipped bit anywhere is caught. */
    for (uint64_t i = 0; i < len; i += 7) {
        memcpy(c, buf, len);
        c[i] ^= 0x10;
        CHECK_ERR(decode_rc(c, len), i >= 8 && i < 10 ? CKPTIO_E_FORMAT : CKPTIO_E_CORRUPT);
    }
    memcpy(c, buf, len);
    c[len - 1] ^= 1;
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "body checksum"));
    memcpy(c, buf, len);
    c[50] ^= 1;
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "header checksum"));

    /* Trailing bytes, reserved fields, header size. */
    memcpy(c, buf, len);
    c[len] = 0;
    CHECK_ERR(decode_rc(c, len + 1), CKPTIO_E_CORRUPT);
    put_u64(c + 16, len + 1 - 128);
    fix_sums(c, len + 1);
    CHECK_ERR(decode_rc(c, len + 1), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "after its string table"));
    memcpy(c, buf, len);
    c[36] = 1;
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    memcpy(c, buf, len);
    c[110] = 1;
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    memcpy(c, buf, len);
    c[128 + 4] = 1; /* file 0's reserved word */
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    memcpy(c, buf, len);
    c[12] = 136;
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);

    /* A later minor version may grow the header and append to the body: still readable, and
     * re-encoding gives this version's canonical bytes. */
    memcpy(c, buf, 120);
    memset(c + 120, 0xab, 64);                 /* header extension */
    memcpy(c + 192, buf + 128, len - 128);     /* body */
    memset(c + 192 + len - 128, 0xcd, 24);     /* body extension */
    c[10] = 1;                                 /* 1.1 */
    c[12] = 192;
    put_u64(c + 16, len - 128 + 24);
    fix_sums(c, len + 88);
    ckptio__manifest *d = NULL;
    CHECK_OK(ckptio__manifest_decode(c, len + 88, &d, errbuf, sizeof errbuf));
    uint64_t len2;
    uint8_t *buf2 = enc(d, &len2);
    CHECK(buf2 && len2 == len && !memcmp(buf2, buf, len));
    free(buf2);
    ckptio__manifest_free(d);

    /* Over the size limit: refused before reading past the header. */
    CHECK_ERR(decode_rc(buf, CKPTIO__MAX_MANIFEST_BYTES + 1), CKPTIO_E_LIMIT);
    ckptio__manifest_free(NULL);
    free(c);
    free(buf);
    mb_free(&b);
    return 0;
}

static int test_truncated(void)
{
    mb b;
    uint64_t len;
    uint8_t *buf = enc(small(&b, CKPTIO__CSUM_XXH3_64), &len);
    CHECK(buf);
    for (uint64_t n = 0; n < len; n++) {
        uint8_t *c = malloc(n ? n : 1); /* exact size: ASan catches any read past n */
        CHECK(c);
        memcpy(c, buf, n);
        CHECK_ERR(decode_rc(c, n), CKPTIO_E_CORRUPT);
        /* The same, with the header made to agree with the shorter body. */
        if (n >= 128) {
            put_u64(c + 16, n - 128);
            fix_sums(c, n);
            CHECK_ERR(decode_rc(c, n), CKPTIO_E_CORRUPT);
        }
        free(c);
    }
    free(buf);
    mb_free(&b);
    return 0;
}

static int test_huge_counts(void)
{
    mb b;
    uint64_t len;
    uint8_t *buf = enc(small(&b, CKPTIO__CSUM_XXH3_64), &len);
    CHECK(buf);
    uint8_t *c = malloc(len);
    CHECK(c);
    const uint64_t limits[7] = {CKPTIO__MAX_FILES, CKPTIO__MAX_TENSORS, CKPTIO__MAX_CHUNKS,
                                CKPTIO__MAX_META, 0, 0, 0};
    const uint64_t evil[] = {UINT64_MAX,       UINT64_MAX / 8 + 1, 1ull << 61, 1ull << 32,
                             (1ull << 28) + 1, 1ull << 28,         len,        len / 8};
    for (int i = 0; i < 7; i++) {
        for (size_t e = 0; e < sizeof evil / sizeof evil[0]; e++) {
            memcpy(c, buf, len);
            put_u64(c + 48 + 8 * i, evil[e]);
            fix_sums(c, len);
            int want = limits[i] && evil[e] > limits[i] ? CKPTIO_E_LIMIT : CKPTIO_E_CORRUPT;
            CHECK_ERR(decode_rc(c, len), want);
        }
        /* One more or one fewer than the records hold. */
        for (int delta = -1; delta <= 1; delta += 2) {
            memcpy(c, buf, len);
            uint64_t v = get_u64(c + 48 + 8 * i);
            if (v == 0 && delta < 0) continue;
            put_u64(c + 48 + 8 * i, v + (uint64_t)(int64_t)delta);
            fix_sums(c, len);
            CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
        }
    }
    memcpy(c, buf, len);
    put_u64(c + 16, UINT64_MAX - 64);
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);

    /* A tensor record claiming 2^60 chunks, or 2^40 dims, inside a consistent header. */
    uint64_t tens = 128 + 2 * 16; /* first tensor record */
    memcpy(c, buf, len);
    put_u64(c + tens + 16, 1ull << 60);
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    memcpy(c, buf, len);
    c[tens + 8] = 33; /* ndim */
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_LIMIT);
    memcpy(c, buf, len);
    memcpy(c + tens, "\xf0\xff\xff\xff", 4); /* name_len */
    fix_sums(c, len);
    CHECK_ERR(decode_rc(c, len), CKPTIO_E_CORRUPT);
    free(c);
    free(buf);
    mb_free(&b);
    return 0;
}

/* ---- validation rules ---------------------------------------------------------------------- */

/* Each case starts again from small() and breaks one thing. */
#define FRESH() (mb_free(&b), m = small(&b, CKPTIO__CSUM_XXH3_64))

static int test_reject_tensors(void)
{
    mb b;
    ckptio__manifest *m;
    m = small(&b, CKPTIO__CSUM_XXH3_64);
    CHECK_OK(ckptio__manifest_validate(m, errbuf, sizeof errbuf));
    /* tensors: 0 a.bias [5000] f32 (2 chunks), 1 a.empty [0], 2 a.weight [64,48] bf16 (4),
     * 3 step (scalar), 4 tok [10] bytes. Chunks in that order: 0-1, 2, 3-6, 7, 8. */

    FRESH();
    m->tensors[2].name = m->tensors[0].name; /* duplicate */
    m->tensors[2].name_len = m->tensors[0].name_len;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "listed after", 1) == 0); /* a.bias after a.empty */
    FRESH();
    m->tensors[1].name = m->tensors[0].name;
    m->tensors[1].name_len = m->tensors[0].name_len;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'a.bias' is listed twice", 1) == 0);
    FRESH();
    ckptio__mtensor tmp = m->tensors[3];
    m->tensors[3] = m->tensors[4], m->tensors[4] = tmp;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'step' is listed after 'tok'", 1) == 0);

    /* Names: NUL, invalid UTF-8, empty, too long, outside strtab, no NUL after. */
    FRESH();
    m->strtab[m->tensors[4].name + 1] = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "not valid UTF-8", 1) == 0);
    FRESH();
    m->strtab[m->tensors[4].name + 1] = (char)0xc3;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "not valid UTF-8", 1) == 0);
    FRESH();
    m->strtab[m->tensors[4].name + 1] = (char)0xff;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "not valid UTF-8", 1) == 0);
    FRESH();
    m->tensors[0].name_len = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "tensor 0: name", 0) == 0);
    FRESH();
    m->tensors[4].name_len = CKPTIO_MAX_NAME + 1;
    CHECK(expect(m, CKPTIO_E_LIMIT, "exceeds the limit", 0) == 0);
    FRESH();
    m->tensors[4].name = m->strtab_len - 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "of the string table", 0) == 0);
    FRESH();
    m->tensors[4].name_len = 2; /* "to" followed by 'k', not NUL */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "of the string table", 0) == 0);

    /* dtype, ndim, shape overflow. */
    FRESH();
    m->tensors[4].dtype = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "unknown dtype 0", 1) == 0);
    FRESH();
    m->tensors[4].dtype = 19;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "unknown dtype 19", 1) == 0);
    FRESH();
    m->tensors[4].ndim = 33;
    CHECK(expect(m, CKPTIO_E_LIMIT, "33 dimensions", 0) == 0);
    FRESH();
    m->dims[m->tensors[2].dims] = 1ull << 62; /* 2^62 * 48 elements overflow */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overflows 64 bits", 1) == 0);
    FRESH();
    m->tensors[0].dtype = CKPTIO_DT_C128; /* 5000 * 16 fits: raw_len now mismatches */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "raw length", 1) == 0);
    FRESH();
    m->dims[m->tensors[2].dims] = UINT64_MAX / 96 + 1; /* elements fit, bytes do not */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overflows 64 bits", 1) == 0);

    /* Chunk ranges and ownership. */
    FRESH();
    m->tensors[4].n_chunks = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "has no chunks", 0) == 0);
    FRESH();
    m->tensors[4].n_chunks = 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "lie outside the 9 chunks", 0) == 0);
    FRESH();
    m->tensors[3].chunk0 = 8; /* step claims tok's chunk */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "", 0) == 0);
    FRESH();
    m->tensors[2].n_chunks = 3; /* a.weight's last chunk belongs to nobody */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'a.weight': chunks cover 2304 of the 3072", 0) == 0);
    FRESH();
    m->tensors[2].chunk0 = 4, m->tensors[2].n_chunks = 3; /* chunk 3 orphaned */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "", 0) == 0);
    FRESH();
    m->tensors[4].dims = m->n_dims;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "shape index", 0) == 0);
    FRESH();
    m->chunks[8].dims = m->n_dims - 1;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "dims index", 0) == 0);
    mb_free(&b);
    return 0;
}

static int test_reject_chunks(void)
{
    mb b;
    ckptio__manifest *m = small(&b, CKPTIO__CSUM_XXH3_64);
    uint64_t *w; /* a.weight chunk boxes: chunk k of a.weight is chunks[3 + k] */
#define WBOX(k) (w = m->dims + m->chunks[3 + (k)].dims)

    FRESH();
    WBOX(1)[0] = 56; /* rows 56..72 of 64 */
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "tensor 'a.weight': chunk 1 [offset 56,0 shape 16,48] lies outside shape 64,48",
                 1) == 0);
    FRESH();
    WBOX(1)[1] = UINT64_MAX; /* offset + shape wraps */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "lies outside", 1) == 0);
    FRESH();
    WBOX(1)[0] = 8; /* overlaps chunks 0 and 1 */
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "tensor 'a.weight': chunk 0 [offset 0,0 shape 16,48] overlaps chunk 1 [offset "
                 "8,0 shape 16,48]",
                 1) == 0);
    FRESH();
    WBOX(3)[0] = 0; /* chunk 3 duplicates chunk 0 */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overlaps", 1) == 0);
    FRESH();
    WBOX(3)[2] = 8, WBOX(3)[3] = 24; /* chunk 3 shrinks: rows 48..56 uncovered */
    m->chunks[6].raw_len = m->chunks[6].stored_len = 8 * 24 * 2;
    m->chunks[6].n_csums = 1;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "cover 2496 of the 3072 elements of shape 64,48", 1) == 0);
    FRESH();
    WBOX(3)[2] = 0;
    m->chunks[6].raw_len = m->chunks[6].stored_len = 0;
    m->chunks[6].n_csums = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "is empty", 1) == 0);
    FRESH();
    m->tensors[3].n_chunks = 2; /* the scalar claims tok's chunk too */
    m->chunks[8].raw_len = m->chunks[8].stored_len = 8;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'step': chunks 0 and 1 overlap (scalar", 0) == 0);

    /* Empty tensors: one chunk covering the shape, nothing stored. */
    FRESH();
    m->chunks[2].stored_len = m->chunks[2].raw_len = 64;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "empty tensor's chunk", 0) == 0);
    FRESH();
    m->chunks[2].file_off = 64;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "empty tensor's chunk", 1) == 0);
    FRESH();
    m->tensors[1].n_chunks = 2; /* claims a.weight's first chunk as well */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "instead of 1", 0) == 0);

    /* Lengths, codec, checksums. */
    FRESH();
    m->chunks[8].raw_len = m->chunks[8].stored_len = 11;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "raw length 11", 1) == 0);
    FRESH();
    m->chunks[8].stored_len = 9;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "stored length 9", 1) == 0);
    FRESH();
    m->chunks[8].codec = 1;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "codec 1", 1) == 0);
    FRESH();
    m->chunks[0].n_csums = 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "chunk 0 has 2 checksums, expected 3", 1) == 0);
    FRESH();
    m->chunks[0].csums = m->n_csums;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "outside the", 0) == 0);
    FRESH();
    m->csum_algo = CKPTIO__CSUM_NONE; /* chunks still list checksums */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "expected 0", 1) == 0);
    FRESH();
    m->csum_algo = 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "checksum algorithm 2", 1) == 0);
    /* above 64 MiB: a reader would have to stage gigabytes for one block (issue 7) */
    const uint64_t blocks[] = {0,          2048,       4096 + 512, 12288,     1ull << 27,
                               1ull << 30, 1ull << 31, UINT64_MAX};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        FRESH();
        m->csum_block = blocks[i];
        CHECK(expect(m, CKPTIO_E_CORRUPT, "checksum block", 1) == 0);
    }
    FRESH();
    m->version = 4; /* 2 (striped) and 3 (coded) are formats this library reads */
    CHECK(expect(m, CKPTIO_E_FORMAT, "newer", 0) == 0);
    FRESH();
    m->version = 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "with 0 roots", 0) == 0);
    FRESH();
    m->version = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "version 0", 0) == 0);
    mb_free(&b);
    return 0;
}

static int test_reject_extents(void)
{
    mb b;
    ckptio__manifest *m = small(&b, CKPTIO__CSUM_XXH3_64);
    /* File 0 holds a.bias chunk 0 (10000 bytes at 0), the empty chunk, step (8 bytes at 10048),
     * tok (10 at 10112); file 1: a.bias chunk 1 at 0, a.weight's 1536-byte chunks from 10048. */
    CHECK(m->chunks[7].file_off == 10048 && m->chunks[8].file_off == 10112);
    CHECK(m->files[0].size == 10122 && m->chunks[4].file_off == 10048 + 1536);

    FRESH();
    m->chunks[8].file_off = 10048; /* tok on top of step */
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "file 'data/000000.ckd': bytes 10048..10056 of tensor 'step' chunk 0 overlap "
                 "bytes 10048..10058 of tensor 'tok' chunk 0",
                 1) == 0);
    FRESH();
    m->chunks[7].file_off = 8192 - 64; /* step inside a.bias's 10000 bytes */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overlap", 1) == 0);
    FRESH();
    m->chunks[4].file_off = m->chunks[3].file_off + 64; /* 1536-byte chunks, 64-aligned */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overlap", 1) == 0);
    FRESH();
    m->chunks[1].file = 0; /* a.bias chunk 1 moves onto chunk 0 in file 0 */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "overlap", 1) == 0);
    FRESH();
    m->chunks[7].file_off = 10048 + 32; /* misaligned small chunk */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "not a multiple of 64", 1) == 0);
    FRESH();
    m->chunks[1].file_off = 64; /* 10000-byte chunk on a 64 boundary */
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "offset 64 in file 'data/000001.ckd' is not a multiple of 4096", 1) == 0);
    FRESH();
    m->files[0].size = 10112 + 9; /* tok's last byte past the end */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "past the end of file 'data/000000.ckd'", 1) == 0);
    FRESH();
    m->chunks[8].file_off = UINT64_MAX - 63;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "past the end", 1) == 0);
    FRESH();
    m->chunks[8].file = 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "names file 2 of 2", 1) == 0);
    FRESH();
    m->files[1].size = 1ull << 63;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "too large", 1) == 0);
    /* Extents may touch, and padding between them is fine. */
    FRESH();
    m->chunks[8].file_off = 10048 + 128;
    m->files[0].size = 1 << 20;
    CHECK_OK(ckptio__manifest_validate(m, errbuf, sizeof errbuf));
    mb_free(&b);
    return 0;
}

static int test_reject_files_meta(void)
{
    mb b;
    ckptio__manifest *m = small(&b, CKPTIO__CSUM_XXH3_64);
    const char *bad[] = {"../x",  "/abs",     "a//b",  "a/./b", "a/../b", "a/",   ".",
                         "..",    "a/b/..",   "a\\b",  "a b",   "a:b",    "\xc3\xa9", "manifest",
                         "data/x\n", "a/.", "./a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FRESH();
        m->files[1].name = mb_str(&b, bad[i], strlen(bad[i]));
        m->files[1].name_len = (uint32_t)strlen(bad[i]);
        m = mb_done(&b, 0);
        if (expect(m, CKPTIO_E_CORRUPT, "file 1: name is not a relative path", 1)) {
            fprintf(stderr, "file name '%s' accepted\n", bad[i]);
            return 1;
        }
    }
    const char *good[] = {"a", "...", "a/..b/c", "stripe-1/data/000001.ckd", "A_b.c-D"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        FRESH();
        m->files[1].name = mb_str(&b, good[i], strlen(good[i]));
        m->files[1].name_len = (uint32_t)strlen(good[i]);
        m = mb_done(&b, 0);
        CHECK(roundtrip(m) == 0);
    }
    FRESH();
    m->files[1].name_len = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "file 1", 0) == 0);
    FRESH();
    char longname[300];
    memset(longname, 'x', sizeof longname);
    m->files[1].name = mb_str(&b, longname, 256);
    m->files[1].name_len = 256;
    m = mb_done(&b, 0);
    CHECK(expect(m, CKPTIO_E_LIMIT, "256 bytes exceeds", 1) == 0);
    FRESH();
    m->files[1].name = m->files[0].name;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "both named 'data/000000.ckd'", 1) == 0);

    /* Metadata: sorted unique valid keys, bounded values. */
    FRESH();
    ckptio__mmeta tmp = m->meta[0];
    m->meta[0] = m->meta[1], m->meta[1] = tmp;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'framework' is listed after 'step'", 1) == 0);
    FRESH();
    m->meta[1] = m->meta[0];
    CHECK(expect(m, CKPTIO_E_CORRUPT, "'framework' is listed twice", 1) == 0);
    FRESH();
    m->strtab[m->meta[0].key + 2] = (char)0x80;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "not valid UTF-8", 1) == 0);
    FRESH();
    m->meta[0].key_len = 0;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "metadata 0: key", 0) == 0);
    FRESH();
    m->meta[1].val_len = CKPTIO_MAX_META_VALUE + 1ull;
    CHECK(expect(m, CKPTIO_E_LIMIT, "value of 67108865 bytes", 0) == 0);
    FRESH();
    m->meta[1].val_len = 5; /* no NUL after */
    CHECK(expect(m, CKPTIO_E_CORRUPT, "value is not a NUL-terminated", 0) == 0);
    FRESH();
    m->meta[1].val = UINT64_MAX - 2;
    CHECK(expect(m, CKPTIO_E_CORRUPT, "value is not a NUL-terminated", 0) == 0);

    /* Counts over the limits are refused before any array is touched. */
    const uint64_t over[4] = {CKPTIO__MAX_FILES + 1ull, CKPTIO__MAX_TENSORS + 1ull,
                              CKPTIO__MAX_CHUNKS + 1, CKPTIO__MAX_META + 1ull};
    for (int i = 0; i < 4; i++) {
        FRESH();
        uint64_t *cnt[4] = {&m->n_files, &m->n_tensors, &m->n_chunks, &m->n_meta};
        *cnt[i] = over[i];
        CHECK(expect(m, CKPTIO_E_LIMIT, "exceed the format's limits", 0) == 0);
    }
    FRESH();
    m->meta = NULL;
    CHECK(expect(m, CKPTIO_E_USAGE, "missing", 0) == 0);
    mb_free(&b);
    return 0;
}

/* Messages name the tensor and the chunk's box, on one line. */
static int test_message(void)
{
    mb b;
    mb_init(&b, CKPTIO__CSUM_XXH3_64, 1 << 20);
    uint32_t f = mb_file(&b, "data/000000.ckd");
    mb_tensor(&b, "layers.3.w", CKPTIO_DT_F32, 2, (uint64_t[]){128, 1024});
    mb_chunk(&b, NULL, (uint64_t[]){128, 512}, f);
    mb_chunk(&b, (uint64_t[]){0, 512}, (uint64_t[]){128, 256}, f);
    mb_chunk(&b, (uint64_t[]){0, 768}, (uint64_t[]){128, 512}, f);
    ckptio__manifest *m = mb_done(&b, 0);
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "tensor 'layers.3.w': chunk 2 [offset 0,768 shape 128,512] lies outside shape "
                 "128,1024",
                 1) == 0);
    m->dims[m->chunks[2].dims + 1] = 512;
    CHECK(expect(m, CKPTIO_E_CORRUPT,
                 "tensor 'layers.3.w': chunk 1 [offset 0,512 shape 128,256] overlaps chunk 2 "
                 "[offset 0,512 shape 128,512]",
                 1) == 0);
    CHECK(!strchr(errbuf, '\n'));
    mb_free(&b);

    /* Long names are clipped so that the line stays readable. */
    mb_init(&b, CKPTIO__CSUM_NONE, 0);
    char name[CKPTIO_MAX_NAME];
    memset(name, 'n', sizeof name);
    mb_file(&b, "f");
    mb_tensor_n(&b, name, sizeof name, CKPTIO_DT_U8, 1, (uint64_t[]){2});
    mb_chunk(&b, NULL, (uint64_t[]){1}, 0);
    CHECK(expect(mb_done(&b, 0), CKPTIO_E_CORRUPT, "cover 1 of the 2", 1) == 0);
    CHECK(strlen(errbuf) < 400);
    mb_free(&b);
    return 0;
}

/* Sharding patterns with many chunks must stay near-linear (the runner's timeout catches a
 * quadratic sweep: 200,000 chunks squared is 2e10 comparisons). */
static int test_many_chunks(void)
{
    enum { N = 200000 };
    for (int pattern = 0; pattern < 3; pattern++) {
        mb b;
        mb_init(&b, CKPTIO__CSUM_NONE, 0);
        uint32_t f = mb_file(&b, "data/000000.ckd");
        if (pattern == 0) { /* rows */
            mb_tensor(&b, "t", CKPTIO_DT_U8, 2, (uint64_t[]){N, 64});
            for (uint64_t i = 0; i < N; i++)
                mb_chunk(&b, (uint64_t[]){i, 0}, (uint64_t[]){1, 64}, f);
        } else if (pattern == 1) { /* columns */
            mb_tensor(&b, "t", CKPTIO_DT_U8, 2, (uint64_t[]){64, N});
            for (uint64_t i = 0; i < N; i++)
                mb_chunk(&b, (uint64_t[]){0, i}, (uint64_t[]){64, 1}, f);
        } else { /* a 400 x 500 grid */
            mb_tensor(&b, "t", CKPTIO_DT_U8, 2, (uint64_t[]){400 * 8, 500 * 8});
            for (uint64_t r = 0; r < 400; r++)
                for (uint64_t c = 0; c < 500; c++)
                    mb_chunk(&b, (uint64_t[]){r * 8, c * 8}, (uint64_t[]){8, 8}, f);
        }
        ckptio__manifest *m = mb_done(&b, 0);
        CHECK_OK(ckptio__manifest_validate(m, errbuf, sizeof errbuf));
        /* One overlap among them is still found: chunk N/2 slides onto its neighbour. */
        uint64_t *box = m->dims + m->chunks[N / 2].dims;
        box[pattern == 1 ? 1 : 0] -= pattern == 2 ? 8 : 1;
        CHECK_ERR(ckptio__manifest_validate(m, errbuf, sizeof errbuf), CKPTIO_E_CORRUPT);
        CHECK(t_contains(errbuf, "overlaps"));
        mb_free(&b);
    }
    return 0;
}

/* ---- the fuzz corpus, replayed ------------------------------------------------------------- */

static int test_corpus(void)
{
    const char *dir = CKPTIO_SOURCE_ROOT "/fuzz/corpus/manifest";
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "no corpus at %s: %s\n", dir, strerror(errno));
        return 1;
    }
    unsigned n = 0, valid = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unsigned char *buf = NULL;
        long len = t_read_file(path, &buf);
        CHECK(len >= 0);
        ckptio__manifest *m = NULL;
        int rc = ckptio__manifest_decode(buf, (uint64_t)len, &m, errbuf, sizeof errbuf);
        /* Seeds say what they are: valid-* decode (and round-trip when they are v1.0),
         * invalid-* are refused; the fuzzer's finds must merely not crash. */
        if (!strncmp(e->d_name, "valid-", 6)) {
            if (rc < 0) fprintf(stderr, "%s: %s\n", e->d_name, errbuf);
            CHECK_OK(rc);
            uint64_t len2;
            uint8_t *again = enc(m, &len2);
            CHECK(again);
            if (buf[10] == 0 && buf[11] == 0)
                CHECK(len2 == (uint64_t)len && !memcmp(again, buf, len2));
            free(again);
            valid++;
        } else if (!strncmp(e->d_name, "invalid-", 8)) {
            if (rc >= 0) fprintf(stderr, "%s: accepted\n", e->d_name);
            CHECK(rc < 0);
        }
        ckptio__manifest_free(m);
        free(buf);
        n++;
    }
    closedir(d);
    printf("replayed %u corpus files (%u valid)\n", n, valid);
    CHECK(n >= 10 && valid >= 5);
    return 0;
}

const ckptio_test tests_format[] = {
    {"format/roundtrip_dtypes", test_roundtrip_dtypes, 0, 0},
    {"format/roundtrip_names_meta", test_roundtrip_names_meta, 0, 0},
    {"format/roundtrip_shapes", test_roundtrip_shapes, 0, 0},
    {"format/writer_layout", test_writer_layout, 0, 0},
    {"format/header", test_header, 0, 0},
    {"format/truncated", test_truncated, 0, 0},
    {"format/huge_counts", test_huge_counts, 0, 0},
    {"format/reject_tensors", test_reject_tensors, 0, 0},
    {"format/reject_chunks", test_reject_chunks, 0, 0},
    {"format/reject_extents", test_reject_extents, 0, 0},
    {"format/reject_files_meta", test_reject_files_meta, 0, 0},
    {"format/message", test_message, 0, 0},
    {"format/many_chunks", test_many_chunks, 0, 120},
    {"format/corpus", test_corpus, 0, 0},
    {0, 0, 0, 0},
};
