/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the partial-manifest merge: tilings from many parts, each conflict, the corpus. */
#include <errno.h>
#include <stdlib.h>

#include "../src/format/manifest.h"
#include "test.h"

#ifndef CKPTIO_SOURCE_ROOT
#define CKPTIO_SOURCE_ROOT "."
#endif

/* ---- a part builder, the way one rank grows its manifest ----------------------------------- */

typedef struct part {
    ckptio__manifest m;
    ckptio__vec files, tensors, chunks, meta, dims, csums, strtab;
    uint64_t cursor[8]; /* next free byte of each file */
} part;

static void must(int64_t r)
{
    if (r < 0) abort();
}

static void p_init(part *b, uint32_t csum_algo, uint64_t csum_block)
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

static void p_free(part *b)
{
    ckptio__vec_free(&b->files);
    ckptio__vec_free(&b->tensors);
    ckptio__vec_free(&b->chunks);
    ckptio__vec_free(&b->meta);
    ckptio__vec_free(&b->dims);
    ckptio__vec_free(&b->csums);
    ckptio__vec_free(&b->strtab);
}

static uint64_t p_str(part *b, const void *s, size_t len)
{
    uint64_t off = b->strtab.len;
    must(ckptio__vec_push(&b->strtab, s, len));
    must(ckptio__vec_push(&b->strtab, NULL, 1));
    return off;
}

static uint32_t p_file(part *b, const char *name)
{
    ckptio__mfile f = {.name = p_str(b, name, strlen(name)), .name_len = (uint32_t)strlen(name)};
    uint32_t i = (uint32_t)b->files.len;
    must(ckptio__vec_push(&b->files, &f, 1));
    return i;
}

static void p_tensor(part *b, const char *name, int dtype, uint32_t ndim, const uint64_t *shape)
{
    ckptio__mtensor t = {.name = p_str(b, name, strlen(name)),
                         .name_len = (uint32_t)strlen(name), .dtype = (uint32_t)dtype,
                         .ndim = ndim, .dims = b->dims.len, .chunk0 = b->chunks.len};
    if (ndim) must(ckptio__vec_push(&b->dims, shape, ndim));
    must(ckptio__vec_push(&b->tensors, &t, 1));
}

/* A chunk of the last tensor at the next aligned offset of `file`; NULL shape = whole. */
static void p_chunk(part *b, const uint64_t *off, const uint64_t *shp, uint32_t file)
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
            uint64_t h = ckptio__hash(&c, sizeof c) + i + b->strtab.len;
            must(ckptio__vec_push(&b->csums, &h, 1));
        }
    }
    must(ckptio__vec_push(&b->chunks, &c, 1));
    t = CKPTIO__VEC_AT(&b->tensors, ckptio__mtensor, b->tensors.len - 1);
    t->n_chunks++;
}

static void p_meta(part *b, const char *key, const char *val)
{
    ckptio__mmeta e = {.key = p_str(b, key, strlen(key)), .key_len = (uint32_t)strlen(key)};
    e.val = p_str(b, val, strlen(val));
    e.val_len = strlen(val);
    must(ckptio__vec_push(&b->meta, &e, 1));
}

/* Point the manifest at the arrays (no more pushes after this). */
static ckptio__manifest *p_done(part *b)
{
    ckptio__manifest *m = &b->m;
    m->files = b->files.items;
    m->n_files = b->files.len;
    for (uint64_t i = 0; i < m->n_files && i < 8; i++) m->files[i].size = b->cursor[i];
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
    return m;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static char errbuf[1024];

static int merge(part *p, size_t n, ckptio__manifest **out)
{
    const ckptio__manifest *ms[16];
    for (size_t i = 0; i < n; i++) ms[i] = p_done(&p[i]);
    int rc = ckptio__manifest_merge(ms, n, out, errbuf, sizeof errbuf);
    if (rc < 0) printf("merge: %s\n", errbuf);
    return rc;
}

static void free_parts(part *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p_free(&p[i]);
}

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

#define SAME_ARRAY(a, b, field, count)                                                         \
    ((a)->count == (b)->count &&                                                               \
     ((a)->count == 0 || !memcmp((a)->field, (b)->field, (a)->count * sizeof *(a)->field)))

/* Field for field: both laid out as decode lays a manifest out. */
static int same_manifest(const ckptio__manifest *a, const ckptio__manifest *b)
{
    return a->version == b->version && a->csum_algo == b->csum_algo &&
           a->csum_block == b->csum_block && SAME_ARRAY(a, b, files, n_files) &&
           SAME_ARRAY(a, b, tensors, n_tensors) && SAME_ARRAY(a, b, chunks, n_chunks) &&
           SAME_ARRAY(a, b, meta, n_meta) && SAME_ARRAY(a, b, dims, n_dims) &&
           SAME_ARRAY(a, b, csums, n_csums) && SAME_ARRAY(a, b, strtab, strtab_len);
}

/* encode -> decode gives back the very same manifest. */
static int round_trips(const ckptio__manifest *m)
{
    uint64_t len;
    uint8_t *buf = enc(m, &len);
    CHECK(buf);
    ckptio__manifest *d = NULL;
    int rc = ckptio__manifest_decode(buf, len, &d, errbuf, sizeof errbuf);
    if (rc < 0) printf("decode: %s\n", errbuf);
    CHECK_OK(rc);
    CHECK(same_manifest(m, d));
    ckptio__manifest_free(d);
    free(buf);
    return 0;
}

static const ckptio__mtensor *find(const ckptio__manifest *m, const char *name)
{
    for (uint64_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].name_len == strlen(name) &&
            !memcmp(m->strtab + m->tensors[i].name, name, strlen(name)))
            return &m->tensors[i];
    return NULL;
}

/* Part i of n holding rows [i*rows/n, (i+1)*rows/n) of 'w' f32 [rows, 8] in "rank<i>.data". */
static void row_part(part *b, int i, int n, uint64_t rows)
{
    char name[32];
    snprintf(name, sizeof name, "rank%d.data", i);
    uint32_t f = p_file(b, name);
    p_tensor(b, "w", CKPTIO_DT_F32, 2, (uint64_t[]){rows, 8});
    uint64_t r = rows / (uint64_t)n;
    p_chunk(b, (uint64_t[]){r * (uint64_t)i, 0}, (uint64_t[]){r, 8}, f);
}

/* ---- tests --------------------------------------------------------------------------------- */

static int test_rows(void)
{
    part p[4];
    for (int i = 0; i < 4; i++) {
        p_init(&p[i], CKPTIO__CSUM_XXH3_64, 4096);
        row_part(&p[i], 3 - i, 4, 4096); /* part i holds block 3 - i: order is free */
    }
    ckptio__manifest *m = NULL;
    CHECK_OK(merge(p, 4, &m));
    CHECK(m->n_files == 4 && m->n_tensors == 1 && m->n_chunks == 4);
    CHECK(m->csum_algo == CKPTIO__CSUM_XXH3_64 && m->csum_block == 4096);
    const ckptio__mtensor *t = find(m, "w");
    CHECK(t && t->n_chunks == 4 && t->dtype == CKPTIO_DT_F32);
    uint64_t csums = 0;
    for (uint64_t k = 0; k < 4; k++) {
        const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
        /* chunks in part order, each pointing at its own part's file, checksums carried */
        CHECK(c->file == k && m->dims[c->dims] == 1024 * (3 - k) && c->stored_len == 1024 * 32);
        CHECK(c->n_csums == 8);
        CHECK(!memcmp(m->csums + c->csums, p[k].m.csums, 8 * sizeof(uint64_t)));
        csums += c->n_csums;
    }
    CHECK(m->n_csums == csums);
    char nm[32];
    snprintf(nm, sizeof nm, "rank%d.data", 1);
    CHECK(m->files[2].name_len == strlen(nm) && !memcmp(m->strtab + m->files[2].name, nm, 10));
    CHECK(m->files[2].size == p[2].m.files[0].size);
    CHECK_OK(ckptio__manifest_validate(m, errbuf, sizeof errbuf));
    CHECK(round_trips(m) == 0);
    ckptio__manifest_free(m);
    free_parts(p, 4);
    return 0;
}

static int test_overlap(void)
{
    /* A replicated tensor saved by every part, as if each rank wrote its own copy. */
    part p[3];
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        row_part(&p[i], i, 3, 12);
        if (i != 1) {
            p_tensor(&p[i], "bias", CKPTIO_DT_F32, 1, (uint64_t[]){8});
            p_chunk(&p[i], NULL, NULL, 0);
        }
    }
    ckptio__manifest *m = NULL;
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_DUPLICATE);
    CHECK(m == NULL);
    CHECK(t_contains(errbuf, "tensor 'bias'") && t_contains(errbuf, "part 0's chunk [offset 0") &&
          t_contains(errbuf, "part 2's chunk") && t_contains(errbuf, "replicated"));
    free_parts(p, 3);

    /* Two shards that share rows. */
    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i ? "b" : "a");
        p_tensor(&p[i], "w", CKPTIO_DT_F32, 2, (uint64_t[]){10, 4});
        p_chunk(&p[i], (uint64_t[]){i ? 4 : 0, 0}, (uint64_t[]){6, 4}, 0);
    }
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(errbuf, "part 0's chunk [offset 0,0 shape 6,4] overlaps part 1's chunk "
                             "[offset 4,0 shape 6,4]"));
    free_parts(p, 2);
    /* Part 1 starts first along the rows: it is named first, whatever the part numbers. */
    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i ? "b" : "a");
        p_tensor(&p[i], "w", CKPTIO_DT_F32, 2, (uint64_t[]){10, 4});
        p_chunk(&p[i], (uint64_t[]){i ? 0 : 4, 0}, (uint64_t[]){6, 4}, 0);
    }
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(errbuf, "part 1's chunk [offset 0,0 shape 6,4] overlaps part 0's chunk "
                             "[offset 4,0 shape 6,4]"));
    free_parts(p, 2);
    return 0;
}

static int test_hole(void)
{
    part p[3];
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        row_part(&p[i], i < 2 ? i : 3, 4, 16); /* rows 8..11 (block 2) are nobody's */
    }
    ckptio__manifest *m = NULL;
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_INCOMPLETE);
    CHECK(m == NULL);
    CHECK(t_contains(errbuf, "tensor 'w' [16,8]") && t_contains(errbuf, "parts 0, 1, 2") &&
          t_contains(errbuf, "cover 96 of the 128 elements") &&
          t_contains(errbuf, "no part holds [offset 8,0 shape 4,8]"));
    free_parts(p, 3);

    /* A grid with one tile missing: the volumes are what can be said cheaply. */
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i == 0 ? "x0" : i == 1 ? "x1" : "x2");
        p_tensor(&p[i], "g", CKPTIO_DT_U8, 2, (uint64_t[]){4, 4});
        p_chunk(&p[i], (uint64_t[]){(uint64_t)(i / 2) * 2, (uint64_t)(i % 2) * 2},
                (uint64_t[]){2, 2}, 0);
    }
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_INCOMPLETE);
    CHECK(t_contains(errbuf, "tensor 'g' [4,4]: chunks from parts 0, 1, 2 cover 12 of the 16"));
    free_parts(p, 3);
    return 0;
}

static int test_disagree(void)
{
    part p[4];
    for (int i = 0; i < 4; i++) {
        p_init(&p[i], 0, 0);
        char name[8];
        snprintf(name, sizeof name, "f%d", i);
        uint32_t f = p_file(&p[i], name);
        p_tensor(&p[i], "w", i == 3 ? CKPTIO_DT_BF16 : CKPTIO_DT_F32, 2,
                 (uint64_t[]){4096, 1024});
        p_chunk(&p[i], (uint64_t[]){1024 * (uint64_t)i, 0}, (uint64_t[]){1024, 1024}, f);
    }
    ckptio__manifest *m = NULL;
    CHECK_ERR(merge(p, 4, &m), CKPTIO_E_SHAPE);
    CHECK(t_contains(errbuf, "tensor 'w': part 3 says bf16 [4096,1024], part 0 says f32 "
                             "[4096,1024]"));
    free_parts(p, 4);

    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i ? "b" : "a");
        p_tensor(&p[i], "v", CKPTIO_DT_I64, i ? 1 : 2, (uint64_t[]){8, 1});
        p_chunk(&p[i], NULL, NULL, 0);
    }
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_SHAPE);
    CHECK(t_contains(errbuf, "tensor 'v': part 1 says i64 [8], part 0 says i64 [8,1]"));
    free_parts(p, 2);
    return 0;
}

static int test_file_clash(void)
{
    part p[3];
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i == 0 ? "data.0" : "shared.bin");
        if (i == 2) p_file(&p[i], "other");
    }
    ckptio__manifest *m = NULL;
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(errbuf, "file 'shared.bin' is listed by part 1 (file 0) and part 2 (file 0)"));
    free_parts(p, 3);
    return 0;
}

static int test_meta(void)
{
    part p[3];
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        p_meta(&p[i], "step", "1000");
        if (i == 1) p_meta(&p[i], "rank1.note", "hello");
        if (i == 2) p_meta(&p[i], "a.first", "x");
    }
    ckptio__manifest *m = NULL;
    CHECK_OK(merge(p, 3, &m));
    CHECK(m->n_meta == 3);
    const char *keys[] = {"a.first", "rank1.note", "step"};
    for (int i = 0; i < 3; i++)
        CHECK(m->meta[i].key_len == strlen(keys[i]) &&
              !memcmp(m->strtab + m->meta[i].key, keys[i], strlen(keys[i])));
    CHECK(m->meta[2].val_len == 4 && !memcmp(m->strtab + m->meta[2].val, "1000", 5));
    CHECK(round_trips(m) == 0);
    ckptio__manifest_free(m);
    free_parts(p, 3);

    for (int i = 0; i < 3; i++) {
        p_init(&p[i], 0, 0);
        p_meta(&p[i], "step", i == 2 ? "1001" : "1000");
    }
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(errbuf, "metadata 'step': part 0 and part 2 give it different values"));
    free_parts(p, 3);
    return 0;
}

static int test_empty(void)
{
    /* 'e' [0,8] split over 4 parts along dim 1: every shard is empty. 'w' [2,8] split over 4
     * parts along dim 0: parts 2 and 3 hold empty shards at the end. */
    part p[4];
    for (int i = 0; i < 4; i++) {
        p_init(&p[i], CKPTIO__CSUM_XXH3_64, 4096);
        char name[8];
        snprintf(name, sizeof name, "f%d", i);
        uint32_t f = p_file(&p[i], name);
        p_tensor(&p[i], "e", CKPTIO_DT_F16, 2, (uint64_t[]){0, 8});
        p_chunk(&p[i], (uint64_t[]){0, 2 * (uint64_t)i}, (uint64_t[]){0, 2}, f);
        p_tensor(&p[i], "w", CKPTIO_DT_F16, 2, (uint64_t[]){2, 8});
        uint64_t r = i < 2 ? (uint64_t)i : 2;
        p_chunk(&p[i], (uint64_t[]){r, 0}, (uint64_t[]){i < 2 ? 1 : 0, 8}, f);
    }
    ckptio__manifest *m = NULL;
    CHECK_OK(merge(p, 4, &m));
    const ckptio__mtensor *e = find(m, "e"), *w = find(m, "w");
    CHECK(e && e->n_chunks == 1 && w && w->n_chunks == 2);
    const ckptio__mchunk *c = &m->chunks[e->chunk0];
    const uint64_t *box = m->dims + c->dims;
    CHECK(box[0] == 0 && box[1] == 0 && box[2] == 0 && box[3] == 8); /* the whole shape */
    CHECK(c->stored_len == 0 && c->n_csums == 0 && c->file == 0);
    CHECK(round_trips(m) == 0);
    ckptio__manifest_free(m);
    free_parts(p, 4);

    /* A non-empty tensor whose only chunks are empty is a hole, not a success. */
    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        p_file(&p[i], i ? "b" : "a");
        p_tensor(&p[i], "w", CKPTIO_DT_F16, 1, (uint64_t[]){4});
        p_chunk(&p[i], (uint64_t[]){4}, (uint64_t[]){0}, 0);
    }
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_INCOMPLETE);
    CHECK(t_contains(errbuf, "tensor 'w' [4]: 2 part(s) list it but none holds any of it"));
    free_parts(p, 2);
    return 0;
}

static int test_some_parts(void)
{
    /* 'w' in every part; 'head' in parts 1 and 3 only (two halves); 'emb' in part 2 only. */
    part p[4];
    for (int i = 0; i < 4; i++) {
        p_init(&p[i], 0, 0);
        row_part(&p[i], i, 4, 8);
        if (i == 1 || i == 3) {
            p_tensor(&p[i], "head", CKPTIO_DT_I32, 1, (uint64_t[]){6});
            p_chunk(&p[i], (uint64_t[]){i == 1 ? 0 : 3}, (uint64_t[]){3}, 0);
        }
        if (i == 2) {
            p_tensor(&p[i], "emb", CKPTIO_DT_U8, 1, (uint64_t[]){5});
            p_chunk(&p[i], NULL, NULL, 0);
        }
    }
    ckptio__manifest *m = NULL;
    CHECK_OK(merge(p, 4, &m));
    CHECK(m->n_tensors == 3 && m->n_chunks == 4 + 2 + 1);
    /* sorted by name: emb, head, w */
    CHECK(find(m, "emb") == &m->tensors[0] && find(m, "head") == &m->tensors[1]);
    const ckptio__mtensor *h = &m->tensors[1];
    CHECK(m->chunks[h->chunk0].file == 1 && m->chunks[h->chunk0 + 1].file == 3);
    CHECK(m->chunks[m->tensors[0].chunk0].file == 2);
    CHECK(round_trips(m) == 0);
    ckptio__manifest_free(m);
    free_parts(p, 4);

    /* Half a tensor, in one part only. */
    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        row_part(&p[i], i, 2, 8);
        if (i == 1) {
            p_tensor(&p[i], "head", CKPTIO_DT_I32, 1, (uint64_t[]){6});
            p_chunk(&p[i], (uint64_t[]){0}, (uint64_t[]){3}, 0);
        }
    }
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_INCOMPLETE);
    CHECK(t_contains(errbuf, "tensor 'head' [6]: chunks from parts 1 cover 3 of the 6 elements; "
                             "no part holds [offset 3 shape 3]"));
    free_parts(p, 2);
    return 0;
}

static int test_one_part(void)
{
    /* A complete manifest (several tensors, metadata, checksums) merged alone is itself. */
    part b;
    p_init(&b, CKPTIO__CSUM_XXH3_64, 8192);
    uint32_t f0 = p_file(&b, "d/0"), f1 = p_file(&b, "d/1");
    p_tensor(&b, "a", CKPTIO_DT_F32, 2, (uint64_t[]){64, 64});
    p_chunk(&b, (uint64_t[]){0, 0}, (uint64_t[]){64, 32}, f0);
    p_chunk(&b, (uint64_t[]){0, 32}, (uint64_t[]){64, 32}, f1);
    p_tensor(&b, "b", CKPTIO_DT_BF16, 0, NULL);
    p_chunk(&b, NULL, NULL, f1);
    p_tensor(&b, "c", CKPTIO_DT_U8, 3, (uint64_t[]){2, 0, 3});
    p_chunk(&b, NULL, NULL, f0);
    p_meta(&b, "k", "v");
    uint64_t len;
    uint8_t *buf = enc(p_done(&b), &len);
    CHECK(buf);
    ckptio__manifest *d = NULL, *m = NULL;
    CHECK_OK(ckptio__manifest_decode(buf, len, &d, errbuf, sizeof errbuf));
    const ckptio__manifest *one[1] = {d};
    CHECK_OK(ckptio__manifest_merge(one, 1, &m, errbuf, sizeof errbuf));
    CHECK(same_manifest(d, m));
    ckptio__manifest_free(m);
    /* The builder's own arrays (not decode's layout) merge to the same thing. */
    one[0] = &b.m;
    CHECK_OK(ckptio__manifest_merge(one, 1, &m, errbuf, sizeof errbuf));
    CHECK(same_manifest(d, m));
    ckptio__manifest_free(m);
    ckptio__manifest_free(d);
    free(buf);
    p_free(&b);
    return 0;
}

static int test_csums(void)
{
    part p[3];
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], i == 1 ? 0 : CKPTIO__CSUM_XXH3_64, i == 1 ? 0 : 4096);
        row_part(&p[i], i, 3, 12);
    }
    ckptio__manifest *m = NULL;
    CHECK_ERR(merge(p, 3, &m), CKPTIO_E_USAGE);
    CHECK(t_contains(errbuf, "part 1 uses none in blocks of 0 bytes, part 0 uses xxh3-64 in "
                             "blocks of 4096 bytes"));
    free_parts(p, 3);

    /* A part that stored nothing (metadata only) may say anything. */
    for (int i = 0; i < 3; i++) {
        p_init(&p[i], i == 0 ? 0 : CKPTIO__CSUM_XXH3_64, i == 0 ? 0 : 8192);
        if (i == 0)
            p_meta(&p[i], "step", "7");
        else
            row_part(&p[i], i - 1, 2, 12);
    }
    CHECK_OK(merge(p, 3, &m));
    CHECK(m->csum_algo == CKPTIO__CSUM_XXH3_64 && m->csum_block == 8192 && m->n_meta == 1);
    CHECK(round_trips(m) == 0);
    ckptio__manifest_free(m);
    free_parts(p, 3);
    return 0;
}

static int test_bad_parts(void)
{
    ckptio__manifest *m = NULL;
    CHECK_ERR(ckptio__manifest_merge(NULL, 0, &m, errbuf, sizeof errbuf), CKPTIO_E_USAGE);
    part p[2];
    for (int i = 0; i < 2; i++) {
        p_init(&p[i], 0, 0);
        row_part(&p[i], i, 2, 8);
    }
    p_done(&p[1]);
    ckptio__mchunk *c = &p[1].m.chunks[0];
    c->file = 1; /* past its own one-file table */
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "part 1: tensor 'w' chunk 0"));
    c->file = 0;
    p[1].m.dims[c->dims] = 5; /* rows 5..9 of 8 */
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_RANGE);
    CHECK(t_contains(errbuf, "part 1's chunk 0 [offset 5,0 shape 4,8] lies outside"));
    p[1].m.dims[c->dims] = 4;
    c->file_off = 100; /* misaligned: caught by validating the result */
    CHECK_ERR(merge(p, 2, &m), CKPTIO_E_CORRUPT);
    CHECK(t_contains(errbuf, "merged manifest: tensor 'w'") &&
          t_contains(errbuf, "not a multiple of 64"));
    free_parts(p, 2);
    return 0;
}

/* ---- the fuzz corpus ----------------------------------------------------------------------- */

/* The fuzzer's input: up to 8 manifests, each after its length as 4 little-endian bytes. */
static void add_piece(ckptio__vec *in, const ckptio__manifest *m, uint8_t cut)
{
    uint64_t len;
    uint8_t *buf = enc(m, &len);
    if (!buf) abort();
    uint8_t hdr[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                      cut};
    must(ckptio__vec_push(in, hdr, 4));
    must(ckptio__vec_push(in, buf, len));
    free(buf);
}

/* Seeds for fuzz/corpus/merge, written when CKPTIO_MERGE_SEEDS names a directory: each part a
 * complete manifest (decode accepts nothing less), merging or conflicting; in the last, the
 * fuzzer cuts two parts down to the complementary halves of one tensor (the word's top byte). */
static int test_seeds(void)
{
    const char *dir = getenv("CKPTIO_MERGE_SEEDS");
    static const char *const names[] = {"valid-three-parts", "valid-meta-empty",
                                        "conflict-overlap", "conflict-file", "conflict-meta",
                                        "valid-cut-shared"};
    for (int s = 0; s < 6; s++) {
        ckptio__vec in;
        ckptio__vec_init(&in, 1);
        part p[3];
        for (int i = 0; i < 3; i++) {
            p_init(&p[i], CKPTIO__CSUM_XXH3_64, 4096);
            char f[16], t[16];
            snprintf(f, sizeof f, "r%d.d", s == 3 ? 0 : i);
            snprintf(t, sizeof t, "t%d", s == 2 || (s == 5 && i < 2) ? 0 : i);
            uint32_t fi = p_file(&p[i], f);
            uint64_t cols = s == 2 || s == 5 ? 2 : 2 + (uint64_t)i;
            p_tensor(&p[i], t, CKPTIO_DT_F32, 2, (uint64_t[]){3, cols});
            p_chunk(&p[i], NULL, (uint64_t[]){1, cols}, fi);
            p_chunk(&p[i], (uint64_t[]){1, 0}, (uint64_t[]){2, cols}, fi);
            if (s == 1) {
                p_tensor(&p[i], "z", CKPTIO_DT_I8, 1, (uint64_t[]){0});
                p_chunk(&p[i], NULL, NULL, fi);
            }
            p_meta(&p[i], "step", s == 4 && i == 2 ? "2" : "1");
            uint8_t cut = s == 5 && i < 2 ? (uint8_t)(2 - i) : 0; /* drop last, first */
            add_piece(&in, p_done(&p[i]), cut);
            if (cut) {
                ckptio__mtensor *t0 = &p[i].m.tensors[0];
                t0->n_chunks = 1;
                t0->chunk0 += i;
            }
        }
        ckptio__manifest *m = NULL;
        const ckptio__manifest *ms[3] = {&p[0].m, &p[1].m, &p[2].m};
        int rc = ckptio__manifest_merge(ms, 3, &m, errbuf, sizeof errbuf);
        if (s <= 1 || s == 5) CHECK_OK(rc); /* s == 1: an empty 'z' in all three keeps one chunk */
        if (s >= 2 && s <= 4) CHECK(rc < 0);
        if (s == 5) CHECK(m->tensors[0].n_chunks == 2 && m->chunks[1].file == 1);
        ckptio__manifest_free(m);
        if (dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[s]);
            CHECK(t_write_file(path, in.items, in.len) == 0);
        }
        ckptio__vec_free(&in);
        free_parts(p, 3);
    }
    return 0;
}

#ifdef CKPTIO_FUZZ_MERGE_REPLAY
static int test_corpus(void)
{
    CHECK(t_sh("%s %s", CKPTIO_FUZZ_MERGE_REPLAY, CKPTIO_SOURCE_ROOT "/fuzz/corpus/merge") == 0);
    return 0;
}
#endif

const ckptio_test tests_merge[] = {
    {"merge/rows", test_rows, 0, 0},
    {"merge/overlap", test_overlap, 0, 0},
    {"merge/hole", test_hole, 0, 0},
    {"merge/disagree", test_disagree, 0, 0},
    {"merge/file_clash", test_file_clash, 0, 0},
    {"merge/meta", test_meta, 0, 0},
    {"merge/empty", test_empty, 0, 0},
    {"merge/some_parts", test_some_parts, 0, 0},
    {"merge/one_part", test_one_part, 0, 0},
    {"merge/csums", test_csums, 0, 0},
    {"merge/bad_parts", test_bad_parts, 0, 0},
    {"merge/seeds", test_seeds, 0, 0},
#ifdef CKPTIO_FUZZ_MERGE_REPLAY
    {"merge/corpus", test_corpus, 0, 0},
#endif
    {0, 0, 0, 0},
};
