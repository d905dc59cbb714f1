/* SPDX-License-Identifier: Apache-2.0 */
/* Round trips through the public API: dtypes, sizes, listing, metadata, stats, names, 4 GiB. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sys/statvfs.h>

#include "api_helpers.h"
#include "test.h"

/* Make the body read-only (a source the library must not write to). */
static int gbuf_readonly(gbuf *g)
{
    return mprotect(g->map, g->maplen - PAGE, PROT_READ);
}

/* Every dtype of the table, as a 2-d tensor and as a 0-d scalar; tensor_info of each. The
 * checkpoint path is relative (the cwd is t_dir()). */
static int test_dtypes(void)
{
    T_SEED(0xD7E5);
    enum { NDT = CKPTIO_DT_BYTES };
    static const uint64_t shape[2] = {5, 13};
    unsigned char *data[NDT + 1] = {0}, *scal[NDT + 1] = {0};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", NULL));
    for (int d = CKPTIO_DT_BOOL; d <= CKPTIO_DT_BYTES; d++) {
        size_t esz = ckptio_dtype_size(d);
        CHECKF(esz > 0 && ckptio_dtype_name(d), "dtype %d", d);
        data[d] = malloc(65 * esz);
        scal[d] = malloc(esz);
        CHECK(data[d] && scal[d]);
        fill_dtype(data[d], 65 * esz, d, seed + (uint64_t)d);
        fill_dtype(scal[d], esz, d, seed + 100 + (uint64_t)d);
        char name[64];
        snprintf(name, sizeof name, "dt.%s", ckptio_dtype_name(d));
        CHECK_OK(ckptio_writer_add(w, name, d, 2, shape, NULL, NULL, data[d], 65 * esz));
        snprintf(name, sizeof name, "scalar.%s", ckptio_dtype_name(d));
        /* a scalar has no dimensions: shape may be NULL or point at nothing in particular */
        CHECK_OK(ckptio_writer_add(w, name, d, 0, (d & 1) ? NULL : shape, NULL, NULL, scal[d],
                                   esz));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ck", NULL));
    CHECK(ckptio_reader_num_tensors(r) == 2 * NDT);
    for (int d = CKPTIO_DT_BOOL; d <= CKPTIO_DT_BYTES; d++) {
        size_t esz = ckptio_dtype_size(d);
        for (int s = 0; s < 2; s++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%s", s ? "scalar" : "dt", ckptio_dtype_name(d));
            int64_t i = ckptio_reader_find(r, name);
            CHECKF(i >= 0, "find(%s) -> %lld", name, (long long)i);
            ckptio_tensor_info ti = {.size = sizeof ti};
            CHECK_OK(ckptio_reader_tensor(r, (size_t)i, &ti));
            CHECKF(!strcmp(ti.name, name), "info.name '%s' for '%s'", ti.name, name);
            CHECKF(ti.dtype == d, "%s: dtype %d", name, ti.dtype);
            CHECKF(ti.ndim == (s ? 0u : 2u), "%s: ndim %u", name, ti.ndim);
            if (!s) CHECK(ti.shape && ti.shape[0] == 5 && ti.shape[1] == 13);
            uint64_t nb = (s ? 1 : 65) * esz;
            CHECKF(ti.nbytes == nb, "%s: nbytes %llu", name, (unsigned long long)ti.nbytes);
            CHECKF(ti.num_chunks == 1, "%s: num_chunks %llu", name,
                   (unsigned long long)ti.num_chunks);
            CHECKF(ti.stored_bytes == nb, "%s: stored_bytes %llu (no codec: expected %llu)",
                   name, (unsigned long long)ti.stored_bytes, (unsigned long long)nb);
            if (load_cmp(r, name, s ? scal[d] : data[d], nb)) return 1;
        }
    }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    for (int d = 0; d <= NDT; d++) free(data[d]), free(scal[d]);
    return 0;
}

/* Small and boundary sizes (empty, 1 byte, scalars, 4095/4096/4097 bytes, ...) from sources
 * that are aligned, misaligned, or end at a guard page (read-only, so the library must not
 * write into them or read past their end), loaded into destinations aligned and misaligned,
 * with capacity exact and rounded up; bytes outside the capacity must stay untouched. */
static int test_sizes(void)
{
    T_SEED(0x5122);
    static const struct {
        const char *name;
        int dtype;
        uint32_t ndim;
        uint64_t shape[2];
    } cases[] = {
        {"empty_0x5", CKPTIO_DT_F32, 2, {0, 5}},   {"empty_5x0", CKPTIO_DT_U8, 2, {5, 0}},
        {"empty_1d", CKPTIO_DT_I64, 1, {0, 0}},    {"one_byte", CKPTIO_DT_U8, 1, {1, 0}},
        {"scalar_f64", CKPTIO_DT_F64, 0, {0, 0}},  {"scalar_u8", CKPTIO_DT_BOOL, 0, {0, 0}},
        {"b4095", CKPTIO_DT_U8, 1, {4095, 0}},     {"b4096", CKPTIO_DT_U8, 1, {4096, 0}},
        {"b4097", CKPTIO_DT_I8, 1, {4097, 0}},     {"f32_4096B", CKPTIO_DT_F32, 2, {32, 32}},
        {"c128_4112B", CKPTIO_DT_C128, 1, {257, 0}}, {"b8191", CKPTIO_DT_BYTES, 1, {8191, 0}},
        {"u16_12290B", CKPTIO_DT_U16, 2, {5, 1229}}, {"b63", CKPTIO_DT_U8, 1, {63, 0}},
        {"b65", CKPTIO_DT_U8, 1, {65, 0}},
    };
    enum { NC = sizeof cases / sizeof cases[0], NSRC = 3, NDST = 5 };
    static const size_t src_lead[NSRC] = {0, 1, LEAD_END};
    static const char *const src_tag[NSRC] = {"aligned", "plus1", "at_guard"};
    gbuf src[NC][NSRC];
    memset(src, 0, sizeof src);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t c = 0; c < NC; c++) {
        uint64_t nb = volume(cases[c].shape, cases[c].ndim) * ckptio_dtype_size(cases[c].dtype);
        for (size_t s = 0; s < NSRC; s++) {
            CHECK(gbuf_make(&src[c][s], nb, src_lead[s]) == 0);
            fill_dtype(src[c][s].p, nb, cases[c].dtype, seed + c * 7 + s);
            CHECK(gbuf_readonly(&src[c][s]) == 0);
            char name[64];
            snprintf(name, sizeof name, "%s.%s", cases[c].name, src_tag[s]);
            CHECK_OK(ckptio_writer_add(w, name, cases[c].dtype, cases[c].ndim, cases[c].shape,
                                       NULL, NULL, src[c][s].p, nb));
        }
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NC * NSRC);
    /* destinations: aligned exact, aligned rounded, +1 exact, +1 rounded, ending at a guard */
    static const size_t dst_lead[NDST] = {0, 0, 1, 1, LEAD_END};
    static const int dst_round[NDST] = {0, 1, 0, 1, 0};
    for (size_t c = 0; c < NC; c++) {
        uint64_t nb = volume(cases[c].shape, cases[c].ndim) * ckptio_dtype_size(cases[c].dtype);
        for (size_t s = 0; s < NSRC; s++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%s", cases[c].name, src_tag[s]);
            ckptio_tensor_info ti = {.size = sizeof ti};
            int64_t idx = ckptio_reader_find(r, name);
            CHECKF(idx >= 0, "find(%s)", name);
            CHECK_OK(ckptio_reader_tensor(r, (size_t)idx, &ti));
            CHECKF(ti.nbytes == nb, "%s: nbytes %llu, expected %llu", name,
                   (unsigned long long)ti.nbytes, (unsigned long long)nb);
            for (size_t k = 0; k < NDST; k++) {
                uint64_t cap = dst_round[k] ? round_up(nb ? nb : 1, PAGE) : nb;
                gbuf dst;
                CHECK(gbuf_make(&dst, cap, dst_lead[k]) == 0);
                ckptio_region whole = {.size = sizeof whole, .name = name, .dst = dst.p,
                                       .capacity = cap};
                int rc = k % 2 ? ckptio_reader_read_tensor(r, name, dst.p, cap)
                               : ckptio_reader_read(r, &whole, 1);
                CHECKF(rc >= 0, "%s into dst kind %zu (cap %llu): %s: %s", name, k,
                       (unsigned long long)cap, ckptio_errname(rc), ckptio_reader_errmsg(r));
                CHECKF(memcmp(dst.p, src[c][s].p, nb) == 0, "%s: dst kind %zu: data differ",
                       name, k);
                CHECKF(gbuf_intact(&dst, cap), "%s: dst kind %zu: bytes outside capacity %llu "
                       "were written", name, k, (unsigned long long)cap);
                gbuf_free(&dst);
            }
        }
    }
    /* all of them again in one call, each destination ending at its guard page */
    ckptio_region reg[NC * NSRC];
    gbuf dst[NC * NSRC];
    char names[NC * NSRC][64];
    for (size_t c = 0; c < NC; c++)
        for (size_t s = 0; s < NSRC; s++) {
            size_t i = c * NSRC + s;
            uint64_t nb = src[c][s].len;
            snprintf(names[i], sizeof names[i], "%s.%s", cases[c].name, src_tag[s]);
            CHECK(gbuf_make(&dst[i], nb, LEAD_END) == 0);
            reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .name = names[i],
                                     .dst = dst[i].p, .capacity = nb};
        }
    CHECK_OK(ckptio_reader_read(r, reg, NC * NSRC));
    for (size_t c = 0; c < NC; c++)
        for (size_t s = 0; s < NSRC; s++) {
            size_t i = c * NSRC + s;
            CHECKF(memcmp(dst[i].p, src[c][s].p, src[c][s].len) == 0 &&
                       gbuf_intact(&dst[i], src[c][s].len),
                   "batched read of %s", names[i]);
            gbuf_free(&dst[i]);
            gbuf_free(&src[c][s]);
        }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    return 0;
}

/* 48 MiB tensors from an aligned and a misaligned (ptr + 1) read-only source, loaded into
 * aligned, misaligned and guard-bounded destinations, whole and as a region. */
static int test_big(void)
{
    T_SEED(0xB16);
    const uint64_t na = 48 * MiB, nm = 48 * MiB + 781; /* a multiple of 7 */
    const uint64_t shape_a[1] = {na / 4}, shape_m[2] = {nm / 7, 7};
    gbuf a, m;
    CHECK(gbuf_make(&a, na, 0) == 0 && gbuf_make(&m, nm, 1) == 0);
    t_fill(a.p, na, seed);
    t_fill(m.p, nm, seed + 1);
    CHECK(gbuf_readonly(&a) == 0 && gbuf_readonly(&m) == 0);
    CHECK(nm % 7 == 0);
    ckptio_writer *w = NULL;
    double t0 = mono();
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "big.aligned", CKPTIO_DT_F32, 1, shape_a, NULL, NULL, a.p, na));
    CHECK_OK(ckptio_writer_add(w, "big.plus1", CKPTIO_DT_U8, 2, shape_m, NULL, NULL, m.p, nm));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_stats st;
    CHECK_OK(ckptio_writer_stats(w, &st));
    ckptio_writer_close(w);
    printf("saved 96 MiB in %.3f s (%s, direct %d)\n", mono() - t0, st.backend, st.direct);
    CHECKF(st.bytes == na + nm, "writer stats.bytes %llu", (unsigned long long)st.bytes);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    const char *names[2] = {"big.aligned", "big.plus1"};
    const gbuf *srcs[2] = {&a, &m};
    static const size_t lead[3] = {0, 1, LEAD_END};
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 3; k++) {
            uint64_t n = srcs[t]->len, cap = k == 0 ? round_up(n, PAGE) : n;
            gbuf d;
            CHECK(gbuf_make(&d, cap, lead[k]) == 0);
            t0 = mono();
            CHECK_OK(ckptio_reader_read_tensor(r, names[t], d.p, cap));
            printf("loaded %s into dst kind %d in %.3f s\n", names[t], k, mono() - t0);
            CHECKF(memcmp(d.p, srcs[t]->p, n) == 0, "%s dst kind %d: data differ", names[t], k);
            CHECKF(gbuf_intact(&d, cap), "%s dst kind %d: wrote outside capacity", names[t], k);
            gbuf_free(&d);
        }
    /* a region from the middle of each: rows [1000001, +2000000) of the 2-d one */
    {
        uint64_t off[2] = {1000001, 2}, shp[2] = {2000000, 5};
        uint64_t n = shp[0] * shp[1];
        unsigned char *exp = malloc(n);
        gbuf d;
        CHECK(exp && gbuf_make(&d, n, 3) == 0);
        extract(exp, m.p, shape_m, off, shp, 2, 1);
        ckptio_region rg = {.size = sizeof(ckptio_region), .name = "big.plus1", .offset = off,
                            .shape = shp, .dst = d.p,
                            .capacity = n};
        CHECK_OK(ckptio_reader_read(r, &rg, 1));
        CHECK(memcmp(d.p, exp, n) == 0 && gbuf_intact(&d, n));
        gbuf_free(&d);
        free(exp);
    }
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    gbuf_free(&a);
    gbuf_free(&m);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Listing in bytewise name order, find, tensor_info and chunk_info of one- and multi-chunk
 * tensors, reader_path; chunk extents are aligned, inside their files and disjoint. */
static int test_listing(void)
{
    T_SEED(0x1157);
    static const char *const names[] = {"zeta",  "alpha",      "Beta",    "alpha.1",
                                        "alpha/0", "\xc3\xa9t\xc3\xa9", "a",  "_x",
                                        "B",     "layer.10.w", "layer.2.w", "Z9"};
    enum { NT = sizeof names / sizeof names[0] };
    uint64_t sizes[NT];
    unsigned char *data[NT];
    ckptio_writer *w = NULL;
    const char *path = t_path("ck");
    CHECK_OK(ckptio_writer_open(&w, path, NULL));
    for (int i = 0; i < NT; i++) {
        sizes[i] = (uint64_t)(i * 3001 + (i % 3 ? 7 : 4096 * 3));
        data[i] = malloc(sizes[i]);
        CHECK(data[i]);
        t_fill(data[i], sizes[i], seed + (uint64_t)i);
        uint64_t shape[1] = {sizes[i]};
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_U8, 1, shape, NULL, NULL, data[i],
                                   sizes[i]));
    }
    /* a tensor of three chunks (rows 0-9, 10-10, 11-29 of a 30x100 i32) */
    static const uint64_t gshape[2] = {30, 100};
    int32_t *grid = malloc(30 * 100 * 4);
    CHECK(grid);
    t_fill(grid, 30 * 100 * 4, seed + 99);
    static const uint64_t rows[4] = {0, 10, 11, 30};
    for (int c = 2; c >= 0; c--) {
        uint64_t off[2] = {rows[c], 0}, shp[2] = {rows[c + 1] - rows[c], 100};
        CHECK_OK(ckptio_writer_add(w, "grid", CKPTIO_DT_I32, 2, gshape, off, shp,
                                   grid + rows[c] * 100, shp[0] * 100 * 4));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    const char *sorted[NT + 1];
    for (int i = 0; i < NT; i++) sorted[i] = names[i];
    sorted[NT] = "grid";
    qsort(sorted, NT + 1, sizeof sorted[0], cmp_str);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    CHECKF(!strcmp(ckptio_reader_path(r), path), "reader_path '%s'", ckptio_reader_path(r));
    CHECK(ckptio_reader_num_tensors(r) == NT + 1);
    struct ext {
        char file[256];
        uint64_t off, len;
    } exts[NT + 8];
    int nexts = 0;
    for (size_t i = 0; i <= NT; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        CHECKF(!strcmp(ti.name, sorted[i]), "tensor %zu is '%s', expected '%s'", i, ti.name,
               sorted[i]);
        CHECKF(ckptio_reader_find(r, sorted[i]) == (int64_t)i, "find(%s)", sorted[i]);
        int is_grid = !strcmp(ti.name, "grid");
        int k = 0;
        while (!is_grid && strcmp(names[k], ti.name)) k++;
        uint64_t nb = is_grid ? 30 * 100 * 4 : sizes[k];
        CHECK(ti.dtype == (is_grid ? CKPTIO_DT_I32 : CKPTIO_DT_U8));
        CHECK(ti.ndim == (is_grid ? 2u : 1u));
        CHECK(is_grid ? ti.shape[0] == 30 && ti.shape[1] == 100 : ti.shape[0] == nb);
        CHECKF(ti.nbytes == nb, "%s nbytes %llu", ti.name, (unsigned long long)ti.nbytes);
        CHECKF(ti.num_chunks == (is_grid ? 3u : 1u), "%s num_chunks %llu", ti.name,
               (unsigned long long)ti.num_chunks);
        CHECKF(ti.stored_bytes == nb, "%s stored_bytes %llu", ti.name,
               (unsigned long long)ti.stored_bytes);
        uint64_t stored = 0, seen_rows = 0;
        for (size_t c = 0; c < ti.num_chunks; c++) {
            ckptio_chunk_info ci;
            CHECK_OK(ckptio_reader_chunk(r, i, c, &ci));
            CHECK(ci.file && ci.file[0] && ci.file[0] != '/' && !strstr(ci.file, ".."));
            CHECKF(ci.stored_bytes == ci.nbytes, "%s chunk %zu: stored %llu, nbytes %llu",
                   ti.name, c, (unsigned long long)ci.stored_bytes,
                   (unsigned long long)ci.nbytes);
            if (is_grid) {
                CHECK(ci.offset[1] == 0 && ci.shape[1] == 100);
                int match = 0;
                for (int q = 0; q < 3; q++)
                    match |= ci.offset[0] == rows[q] && ci.shape[0] == rows[q + 1] - rows[q];
                CHECKF(match, "grid chunk %zu: offset %llu rows %llu", c,
                       (unsigned long long)ci.offset[0], (unsigned long long)ci.shape[0]);
                CHECK(ci.nbytes == ci.shape[0] * 400);
                seen_rows += ci.shape[0];
            } else {
                CHECK(ci.offset[0] == 0 && ci.shape[0] == nb && ci.nbytes == nb);
            }
            uint64_t align = ci.stored_bytes >= 4096 ? 4096 : 64;
            CHECKF(ci.file_offset % align == 0, "%s chunk %zu at %llu (%llu bytes)", ti.name, c,
                   (unsigned long long)ci.file_offset, (unsigned long long)ci.stored_bytes);
            char fp[600];
            snprintf(fp, sizeof fp, "ck/%s", ci.file);
            long long fs = file_size(t_path(fp));
            CHECKF(fs >= 0 && (uint64_t)fs >= ci.file_offset + ci.stored_bytes,
                   "%s chunk %zu: file %s of %lld bytes, extent ends at %llu", ti.name, c,
                   ci.file, fs, (unsigned long long)(ci.file_offset + ci.stored_bytes));
            CHECK(nexts < NT + 8);
            snprintf(exts[nexts].file, sizeof exts[nexts].file, "%s", ci.file);
            exts[nexts].off = ci.file_offset;
            exts[nexts++].len = ci.stored_bytes;
            stored += ci.stored_bytes;
        }
        CHECK(stored == ti.stored_bytes);
        if (is_grid) CHECK(seen_rows == 30);
        if (load_cmp(r, ti.name, is_grid ? (void *)grid : (void *)data[k], nb)) return 1;
    }
    for (int i = 0; i < nexts; i++)
        for (int j = i + 1; j < nexts; j++)
            if (!strcmp(exts[i].file, exts[j].file) && exts[i].len && exts[j].len)
                CHECKF(exts[i].off + exts[i].len <= exts[j].off ||
                           exts[j].off + exts[j].len <= exts[i].off,
                       "extents [%llu,+%llu) and [%llu,+%llu) of %s overlap",
                       (unsigned long long)exts[i].off, (unsigned long long)exts[i].len,
                       (unsigned long long)exts[j].off, (unsigned long long)exts[j].len,
                       exts[i].file);
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    CHECK_NEG(ckptio_reader_tensor(r, NT + 1, &ti));
    CHECK_NEG(ckptio_reader_chunk(r, 0, 1, &ci));
    CHECK_NEG(ckptio_reader_chunk(r, NT + 1, 0, &ci));
    CHECK(ckptio_reader_find(r, "nope") == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_find(r, "alph") == CKPTIO_E_NOT_FOUND);
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    for (int i = 0; i < NT; i++) free(data[i]);
    free(grid);
    return 0;
}

/* Metadata: binary values with NULs, an empty value, replaced keys (longer and shorter),
 * a 1 MiB value, a UTF-8 key, bytewise key order, values copied at set_meta, NOT_FOUND. */
static int test_metadata(void)
{
    T_SEED(0x3E7A);
    unsigned char *bigv = malloc(MiB), *bigc = malloc(MiB);
    CHECK(bigv && bigc);
    t_fill(bigv, MiB, seed);
    memcpy(bigc, bigv, MiB);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t step = 1000;
    CHECK_OK(ckptio_writer_set_meta(w, "step", &step, sizeof step));
    step = 2000;
    CHECK_OK(ckptio_writer_set_meta(w, "step", &step, sizeof step));
    step = 3; /* the library copied the value: this change must not show */
    CHECK_OK(ckptio_writer_set_meta(w, "name", "short", 5));
    CHECK_OK(ckptio_writer_set_meta(w, "name", "a much longer value than before", 31));
    CHECK_OK(ckptio_writer_set_meta(w, "long", "a much longer value than the next", 33));
    CHECK_OK(ckptio_writer_set_meta(w, "long", "x", 1));
    static const unsigned char bin[7] = {0, 1, 0, 255, 0, 0x80, 0};
    CHECK_OK(ckptio_writer_set_meta(w, "bin", bin, sizeof bin));
    CHECK_OK(ckptio_writer_set_meta(w, "empty", "", 0));
    CHECK_OK(ckptio_writer_set_meta(w, "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf", "k",
                                    1));
    CHECK_OK(ckptio_writer_set_meta(w, "big", bigv, MiB));
    memset(bigv, 0, MiB);
    CHECK_OK(ckptio_writer_set_meta(w, "z", "last", 4));
    CHECK_OK(ckptio_writer_set_meta(w, "A", "first", 5));
    uint64_t shape[1] = {3};
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, shape, NULL, NULL, "abc", 3));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    static const char *const keys[] = {"A",   "big",  "bin", "empty",
                                       "long", "name", "step", "z",
                                       "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf"};
    enum { NK = sizeof keys / sizeof keys[0] };
    CHECKF(ckptio_reader_num_meta(r) == NK, "num_meta %zu", ckptio_reader_num_meta(r));
    for (size_t i = 0; i < NK; i++) {
        const char *k = NULL;
        const void *v = NULL;
        size_t len = 0;
        CHECK_OK(ckptio_reader_meta(r, i, &k, &v, &len));
        CHECKF(k && !strcmp(k, keys[i]), "meta %zu key '%s', expected '%s'", i, k ? k : "(null)",
               keys[i]);
    }
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "step", &v, &len));
    uint64_t got;
    CHECK(len == 8);
    memcpy(&got, v, 8);
    CHECKF(got == 2000, "step %llu", (unsigned long long)got);
    CHECK_OK(ckptio_reader_get_meta(r, "name", &v, &len));
    CHECK(len == 31 && !memcmp(v, "a much longer value than before", 31));
    CHECK_OK(ckptio_reader_get_meta(r, "long", &v, &len));
    CHECK(len == 1 && !memcmp(v, "x", 1));
    CHECK_OK(ckptio_reader_get_meta(r, "bin", &v, &len));
    CHECK(len == sizeof bin && !memcmp(v, bin, sizeof bin));
    CHECK_OK(ckptio_reader_get_meta(r, "empty", &v, &len));
    CHECK(len == 0);
    CHECK_OK(ckptio_reader_get_meta(r, "big", &v, &len));
    CHECK(len == MiB && !memcmp(v, bigc, MiB));
    CHECK_OK(ckptio_reader_get_meta(r, "\xce\xba\xce\xbb\xce\xb5\xce\xb9\xce\xb4\xce\xaf", &v,
                                    &len));
    CHECK(len == 1 && !memcmp(v, "k", 1));
    CHECK(ckptio_reader_get_meta(r, "nokey", &v, &len) == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_get_meta(r, "ste", &v, &len) == CKPTIO_E_NOT_FOUND);
    CHECK(ckptio_reader_get_meta(r, "t", &v, &len) == CKPTIO_E_NOT_FOUND); /* a tensor, not meta */
    const char *k;
    CHECK_NEG(ckptio_reader_meta(r, NK, &k, &v, &len));
    if (load_cmp(r, "t", "abc", 3)) return 1;
    ckptio_reader_close(r);
    free(bigv);
    free(bigc);
    return 0;
}

/* A checkpoint with metadata but no tensors, and one with nothing at all: the contract does
 * not require tensors. */
static int test_empty_checkpoint(void)
{
    T_SEED(0);
    (void)seed;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("meta_only"), NULL));
    CHECK_OK(ckptio_writer_set_meta(w, "step", "7", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_writer_open(&w, t_path("nothing"), NULL));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("meta_only"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 0 && ckptio_reader_num_meta(r) == 1);
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    CHECK_OK(ckptio_reader_open(&r, t_path("nothing"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 0 && ckptio_reader_num_meta(r) == 0);
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    return 0;
}

/* Writer and reader stats: bytes, tensors/regions, backend forced by CKPTIO_IO, O_DIRECT. */
static int test_stats(void)
{
    T_SEED(0x57A7);
    const uint64_t n0 = MiB, n1 = 100 * KiB + 3, n2 = 10;
    unsigned char *a = t_alloc(n0), *b = malloc(n1 + 1), *c = malloc(n2);
    CHECK(a && b && c);
    t_fill(a, n0, seed);
    t_fill(b + 1, n1, seed + 1);
    t_fill(c, n2, seed + 2);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t s0[1] = {n0 / 8}, s1[1] = {n1}, s2[1] = {n2};
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_F64, 1, s0, NULL, NULL, a, n0));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, s1, NULL, NULL, b + 1, n1));
    CHECK_OK(ckptio_writer_add(w, "c", CKPTIO_DT_BYTES, 1, s2, NULL, NULL, c, n2));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_stats st;
    memset(&st, 0x5A, sizeof st);
    CHECK_OK(ckptio_writer_stats(w, &st));
    ckptio_writer_close(w);
    int want = expected_direct(t_dir());
    if (check_stats(&st, want, "writer")) return 1;
    CHECKF(st.bytes == n0 + n1 + n2, "writer bytes %llu", (unsigned long long)st.bytes);
    CHECKF(st.tensors == 3, "writer tensors %llu", (unsigned long long)st.tensors);
    CHECK(st.seconds > 0);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    unsigned char *da = t_alloc(n0), *db = malloc(1000);
    CHECK(da && db);
    uint64_t off[1] = {5000}, shp[1] = {1000};
    ckptio_region reg[2] = {{.size = sizeof(ckptio_region), .name = "a", .dst = da, .capacity = n0},
                            {.size = sizeof(ckptio_region), .name = "b", .offset = off,
                             .shape = shp, .dst = db,
                             .capacity = 1000}};
    CHECK_OK(ckptio_reader_read(r, reg, 2));
    CHECK(!memcmp(da, a, n0) && !memcmp(db, b + 1 + 5000, 1000));
    memset(&st, 0x5A, sizeof st);
    CHECK_OK(ckptio_reader_stats(r, &st));
    if (check_stats(&st, want, "reader")) return 1;
    CHECKF(st.bytes == n0 + 1000, "reader bytes %llu after 2 regions",
           (unsigned long long)st.bytes);
    CHECKF(st.tensors == 2, "reader tensors %llu after 2 regions", (unsigned long long)st.tensors);
    unsigned char dc[16];
    CHECK_OK(ckptio_reader_read_tensor(r, "c", dc, sizeof dc));
    CHECK(!memcmp(dc, c, n2));
    CHECK_OK(ckptio_reader_stats(r, &st));
    CHECKF(st.bytes == n0 + 1000 + n2 && st.tensors == 3, "reader bytes %llu tensors %llu",
           (unsigned long long)st.bytes, (unsigned long long)st.tensors);
    ckptio_reader_close(r);
    t_free(a, n0);
    t_free(da, n0);
    free(b);
    free(c);
    free(db);
    return 0;
}

/* 100,000 tensors of 1-16 elements of mixed dtypes and ranks, loaded in one read call of
 * 100,000 regions given in shuffled order (by name and by index). Prints the times. */
static int test_many_tiny(void)
{
    T_SEED(0x71A7);
    enum { N = 100000 };
    rng g = {seed};
    char(*names)[24] = malloc((size_t)N * 24);
    uint64_t *off = malloc(N * sizeof *off), *nb = malloc(N * sizeof *nb);
    int *dt = malloc(N * sizeof *dt);
    size_t *perm = malloc(N * sizeof *perm);
    ckptio_region *reg = malloc(N * sizeof *reg);
    CHECK(names && off && nb && dt && perm && reg);
    uint64_t total = 0;
    for (size_t i = 0; i < N; i++) {
        /* names not in index order, so listing and lookup cannot rely on insertion order */
        snprintf(names[i], 24, "p%02u/t%06zu", (unsigned)((i * 37) % 97), i);
        dt[i] = CKPTIO_DT_BOOL + (int)(i % CKPTIO_DT_BYTES);
        uint64_t elems = 1 + rnd_below(&g, 16);
        nb[i] = elems * ckptio_dtype_size(dt[i]);
        off[i] = total;
        total += nb[i];
    }
    unsigned char *src = malloc(total), *dst = malloc(total);
    CHECK(src && dst);
    t_fill(src, total, seed);
    for (size_t i = 0; i < N; i++)
        if (dt[i] == CKPTIO_DT_BOOL)
            for (uint64_t k = 0; k < nb[i]; k++) src[off[i] + k] &= 1;
    memset(dst, 0xEE, total);

    double t0 = mono();
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < N; i++) {
        uint64_t elems = nb[i] / ckptio_dtype_size(dt[i]);
        uint64_t shape[2] = {0, 0};
        uint32_t ndim;
        if (elems == 1 && i % 2) ndim = 0;
        else if (i % 3 == 0) ndim = 2, shape[0] = 1, shape[1] = elems;
        else ndim = 1, shape[0] = elems;
        CHECK_OK(ckptio_writer_add(w, names[i], dt[i], ndim, shape, NULL, NULL, src + off[i],
                                   nb[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    double t_save = mono() - t0;

    t0 = mono();
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    double t_open = mono() - t0;
    CHECK(ckptio_reader_num_tensors(r) == N);
    for (size_t i = 0; i < N; i++) perm[i] = i;
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = (size_t)rnd_below(&g, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (size_t k = 0; k < N; k++) {
        size_t i = perm[k];
        reg[k] = (ckptio_region){.size = sizeof(ckptio_region), .name = names[i],
                                 .dst = dst + off[i], .capacity = nb[i]};
        if (k % 2) {
            int64_t idx = ckptio_reader_find(r, names[i]);
            CHECKF(idx >= 0, "find(%s)", names[i]);
            reg[k].name = NULL;
            reg[k].tensor = (size_t)idx;
        }
    }
    t0 = mono();
    CHECK_OK(ckptio_reader_read(r, reg, N));
    double t_read = mono() - t0;
    for (size_t i = 0; i < N; i++)
        CHECKF(!memcmp(dst + off[i], src + off[i], nb[i]), "tensor %s differs", names[i]);
    ckptio_stats st;
    CHECK_OK(ckptio_reader_stats(r, &st));
    CHECKF(st.tensors == N && st.bytes == total, "reader stats: %llu regions, %llu bytes",
           (unsigned long long)st.tensors, (unsigned long long)st.bytes);
    ckptio_reader_close(r);
    printf("100000 tiny tensors (%llu bytes): save %.3f s, open %.3f s, one read call %.3f s\n",
           (unsigned long long)total, t_save, t_open, t_read);
    free(names), free(off), free(nb), free(dt), free(perm), free(reg), free(src), free(dst);
    return 0;
}

/* Names are opaque UTF-8 bytes: Greek, CJK, emoji (with ZWJ), combining marks (e + U+0301 is
 * not U+00E9), '/', '.', '..', spaces, and a name of exactly CKPTIO_MAX_NAME bytes. None of
 * them may create anything outside the checkpoint directory. */
static int test_unicode_names(void)
{
    T_SEED(0x0717);
    static char maxname[CKPTIO_MAX_NAME + 1];
    memset(maxname, 'n', CKPTIO_MAX_NAME);
    maxname[0] = 'M';
    const char *names[] = {
        "\xce\xb1.\xce\xb2.\xce\xb3/weight",                         /* α.β.γ/weight */
        /* 权重/层1/偏置 */
        "\xe6\x9d\x83\xe9\x87\x8d/\xe5\xb1\x82" "1/\xe5\x81\x8f\xe7\xbd\xae",
        "\xf0\x9f\x98\x80\xf0\x9f\x9a\x80 emoji",                    /* 😀🚀 emoji */
        "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", /* ZWJ family */
        "e\xcc\x81",                                                 /* e + combining acute */
        "\xc3\xa9",                                                  /* precomposed é */
        "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\x82\xe0\xa4\xa6\xe0\xa5\x80", /* हिंदी */
        "a/b/c/d",
        "./relative",
        "../not/a/path",
        "/absolute/looking",
        "dots...",
        "..",
        "spaces in a name ",
        " leading space",
        "tab\tand newline\n",
        maxname,
    };
    enum { NN = sizeof names / sizeof names[0] };
    unsigned char data[NN][40];
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < NN; i++) {
        uint64_t shape[1] = {10};
        t_fill(data[i], 40, seed + i);
        CHECK_OK(ckptio_writer_add(w, names[i], CKPTIO_DT_F32, 1, shape, NULL, NULL, data[i], 40));
    }
    CHECK_OK(ckptio_writer_set_meta(w, "\xe6\xad\xa5/step \xf0\x9f\x98\x80", "1", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECKF(count_entries(t_dir(), "") == 1, "something besides the checkpoint was created");

    const char *sorted[NN];
    memcpy(sorted, names, sizeof sorted);
    qsort(sorted, NN, sizeof sorted[0], cmp_str);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NN);
    for (size_t i = 0; i < NN; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        CHECKF(!strcmp(ti.name, sorted[i]), "tensor %zu is '%.40s', expected '%.40s'", i,
               ti.name, sorted[i]);
    }
    for (size_t i = 0; i < NN; i++) {
        CHECKF(ckptio_reader_find(r, names[i]) >= 0, "find('%.40s')", names[i]);
        if (load_cmp(r, names[i], data[i], 40)) return 1;
    }
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "\xe6\xad\xa5/step \xf0\x9f\x98\x80", &v, &len));
    CHECK(len == 1 && *(const char *)v == '1');
    ckptio_reader_close(r);
    return 0;
}

/* A data file with extents past 4 GiB: a 4 GiB + 8 KiB tensor from an mmap'ed region
 * (mostly zero pages, random patterns every 256 MiB and around the 4 GiB mark), then a random
 * tensor. Reads the second whole and regions of the first past (and across) 4 GiB. */
static int test_4gib(void)
{
    T_SEED(0x4619);
#if defined(__SANITIZE_THREAD__)
    /* TSan shadows every byte touched several times over: 4 GiB of tensor does not fit the
     * machine, and this test is about offsets, not threads (ASan runs it). */
    printf("skipped under TSan\n");
    return T_SKIP;
#endif
    struct statvfs sv;
    CHECK(statvfs(t_dir(), &sv) == 0);
    double free_b = (double)sv.f_bavail * (double)sv.f_frsize;
    if (free_b < 12e9) {
        printf("only %.1f GB free in %s: skipped\n", free_b / 1e9, t_dir());
        return T_SKIP;
    }
    const uint64_t cols = 4096, rows = (1ull << 20) + 2, total = rows * cols; /* 4 GiB + 8 KiB */
    unsigned char *big = mmap(NULL, total, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(big != MAP_FAILED);
    for (uint64_t k = 0; k <= 16; k++) t_fill(big + k * 256 * MiB, 4096, seed + k);
    t_fill(big + 4 * GiB - 4096, total - (4 * GiB - 4096), seed + 99);
    CHECK(mprotect(big, total, PROT_READ) == 0);
    const uint64_t n2 = 3 * MiB + 5;
    unsigned char *after = malloc(n2);
    CHECK(after);
    t_fill(after, n2, seed + 1000);

    double t0 = mono();
    ckptio_writer *w = NULL;
    uint64_t shape[2] = {rows, cols}, s2[1] = {n2};
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "huge", CKPTIO_DT_U8, 2, shape, NULL, NULL, big, total));
    CHECK_OK(ckptio_writer_add(w, "after", CKPTIO_DT_BYTES, 1, s2, NULL, NULL, after, n2));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    printf("saved 4 GiB + 8 KiB + 3 MiB in %.2f s\n", mono() - t0);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    ckptio_chunk_info ci;
    int64_t ih = ckptio_reader_find(r, "huge"), ia = ckptio_reader_find(r, "after");
    CHECK(ih >= 0 && ia >= 0);
    CHECK_OK(ckptio_reader_tensor(r, (size_t)ih, &ti));
    CHECKF(ti.nbytes == total, "huge nbytes %llu", (unsigned long long)ti.nbytes);
    CHECK_OK(ckptio_reader_chunk(r, (size_t)ia, 0, &ci));
    printf("'after' stored in %s at offset %llu%s\n", ci.file, (unsigned long long)ci.file_offset,
           ci.file_offset >= 4 * GiB ? " (past 4 GiB)" : "");
    if (load_cmp(r, "after", after, n2)) return 1;

    /* regions of "huge", all in one call */
    enum { NR = 17 + 4 };
    uint64_t offs[NR][2], shps[NR][2];
    for (int k = 0; k <= 16; k++) {
        offs[k][0] = (uint64_t)k * 65536, offs[k][1] = 0; /* row k * 256 MiB / 4096 */
        shps[k][0] = 1, shps[k][1] = cols;
    }
    uint64_t extra[4][4] = {
        {rows - 2, 0, 2, cols},         /* the last 8 KiB, wholly past 4 GiB */
        {rows - 3, 100, 2, 100},        /* a column slice crossing the 4 GiB mark */
        {rows - 1, cols - 1, 1, 1},     /* the last byte */
        {1000, 0, 3, cols},             /* zero pages */
    };
    for (int k = 0; k < 4; k++) {
        offs[17 + k][0] = extra[k][0], offs[17 + k][1] = extra[k][1];
        shps[17 + k][0] = extra[k][2], shps[17 + k][1] = extra[k][3];
    }
    ckptio_region reg[NR];
    unsigned char *dst[NR], *exp = malloc(3 * cols);
    CHECK(exp);
    for (int k = 0; k < NR; k++) {
        uint64_t n = shps[k][0] * shps[k][1];
        dst[k] = malloc(n + 1);
        CHECK(dst[k]);
        reg[k] = (ckptio_region){.size = sizeof(ckptio_region), .name = "huge", .offset = offs[k],
                                 .shape = shps[k],
                                 .dst = dst[k] + (k & 1), .capacity = n};
    }
    CHECK_OK(ckptio_reader_read(r, reg, NR));
    for (int k = 0; k < NR; k++) {
        uint64_t n = shps[k][0] * shps[k][1];
        extract(exp, big, shape, offs[k], shps[k], 2, 1);
        CHECKF(!memcmp(dst[k] + (k & 1), exp, n), "region %d (row %llu col %llu) differs", k,
               (unsigned long long)offs[k][0], (unsigned long long)offs[k][1]);
        free(dst[k]);
    }
    t0 = mono();
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    printf("verified in %.2f s\n", mono() - t0);
    ckptio_reader_close(r);
    munmap(big, total);
    free(after);
    free(exp);
    return 0;
}

const ckptio_test tests_api_roundtrip[] = {
    {"api_dtypes", test_dtypes, T_PER_BACKEND, 0},
    {"api_sizes", test_sizes, T_PER_BACKEND, 0},
    {"api_big", test_big, T_PER_BACKEND, 120},
    {"api_listing", test_listing, T_PER_BACKEND, 0},
    {"api_metadata", test_metadata, T_PER_BACKEND, 0},
    {"api_empty_checkpoint", test_empty_checkpoint, T_PER_BACKEND, 0},
    {"api_stats", test_stats, T_PER_BACKEND, 0},
    {"api_many_tiny", test_many_tiny, T_PER_BACKEND, 180},
    {"api_unicode_names", test_unicode_names, T_PER_BACKEND, 0},
    {"api_4gib", test_4gib, 0, 300},
    {0},
};
