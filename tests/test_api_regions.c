/* SPDX-License-Identifier: Apache-2.0 */
/* Regions over chunked tensors through the public API: random boxes, one per call and batched. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "api_helpers.h"
#include "test.h"

typedef struct rtensor {
    const char *name;
    int dtype;
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t seg[4][8]; /* chunk lengths along each dim (0-terminated); all zero: random */
} rtensor;

static const rtensor rtensors[] = {
    {"r1.f32", CKPTIO_DT_F32, 1, {1000}, {{7, 1, 12, 180, 800}}},
    {"r1.i64", CKPTIO_DT_I64, 1, {3000}, {{1000, 1000, 1000}}},
    {"r2.bf16", CKPTIO_DT_BF16, 2, {37, 53}, {{0}}},
    {"r3.f32", CKPTIO_DT_F32, 2, {512, 1024}, {{100, 312, 100}, {1, 511, 256, 256}}},
    {"r4.f64", CKPTIO_DT_F64, 3, {9, 10, 11}, {{0}}},
    {"r5.u8", CKPTIO_DT_U8, 4, {5, 6, 7, 8}, {{5}, {3, 3}, {7}, {2, 2, 2, 2}}},
    {"r6.c64", CKPTIO_DT_C64, 4, {4, 5, 6, 7}, {{0}}},
    {"r7.u16", CKPTIO_DT_U16, 2, {40, 6}, {{7, 1, 12, 20}, {6}}},
    {"r8.c128", CKPTIO_DT_C128, 3, {3, 4, 1000}, {{0}}},
    {"r9.bool", CKPTIO_DT_BOOL, 2, {100, 100}, {{0}}},
    {"r10.i16", CKPTIO_DT_I16, 3, {64, 33, 17}, {{16, 16, 16, 16}, {11, 11, 11}, {17}}},
    /* chunks of more than one checksum block, read in strided runs */
    {"r11.f32", CKPTIO_DT_F32, 2, {512, 2048}, {{300, 212}, {1000, 1048}}},
};
enum { NRT = sizeof rtensors / sizeof rtensors[0] };

typedef struct rchunk {
    int t;
    uint64_t off[4], shp[4];
    unsigned char *data;
    uint64_t nb;
} rchunk;

/* Segment lengths of one dim of length D: the table's, or 1-4 random ones. Returns count. */
static unsigned split_dim(rng *g, const rtensor *t, uint32_t d, uint64_t *seg)
{
    unsigned n = 0;
    if (t->seg[0][0]) {
        while (n < 8 && t->seg[d][n]) seg[n] = t->seg[d][n], n++;
        return n;
    }
    uint64_t D = t->shape[d];
    unsigned parts = 1 + (unsigned)rnd_below(g, D < 4 ? D : 4);
    unsigned char cut[1025] = {0};
    for (unsigned c = 1; c < parts;) {
        uint64_t at = 1 + rnd_below(g, D - 1);
        if (!cut[at]) cut[at] = 1, c++;
    }
    uint64_t start = 0;
    for (uint64_t i = 1; i <= D; i++)
        if (i == D || cut[i]) seg[n++] = i - start, start = i;
    return n;
}

enum { BOX_RANDOM, BOX_ELEMENT, BOX_FULL, BOX_EMPTY, BOX_COLUMN, BOX_WIDE, BOX_KINDS };

static void rand_box(rng *g, const rtensor *t, int kind, uint64_t *off, uint64_t *shp)
{
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t D = t->shape[d];
        switch (kind) {
        case BOX_ELEMENT:
            off[d] = rnd_below(g, D), shp[d] = 1;
            break;
        case BOX_FULL:
            off[d] = 0, shp[d] = D;
            break;
        case BOX_COLUMN: /* all of every dim but the last, one index of the last */
            if (d + 1 < t->ndim) off[d] = 0, shp[d] = D;
            else off[d] = rnd_below(g, D), shp[d] = 1;
            break;
        case BOX_WIDE: { /* most of every dim: crosses many chunks */
            off[d] = rnd_below(g, D / 4 + 1);
            uint64_t rem = D - off[d];
            shp[d] = rem - rnd_below(g, rem / 4 + 1);
            if (!shp[d]) shp[d] = 1;
            break;
        }
        default:
            off[d] = rnd_below(g, D);
            shp[d] = 1 + rnd_below(g, D - off[d]);
        }
    }
    if (kind == BOX_EMPTY) shp[rnd_below(g, t->ndim)] = 0;
}

/* N-d tensors of several dtypes stored as chunks (regular grids, uneven splits like
 * 7+1+12+..., random splits), added in shuffled order across tensors; then hundreds of random
 * boxes (full, single element, empty, column slices, boxes spanning many chunks) read one per
 * call and all in one batched call, compared against the reference in memory. */
static int test_regions(void)
{
    T_SEED(0x8E610);
    limit_memory(3 * GiB);
    rng g = {seed};
    unsigned char *ref[NRT];
    uint64_t nchunks[NRT] = {0};
    enum { MAXC = 4096 };
    rchunk *ch = calloc(MAXC, sizeof *ch);
    CHECK(ch);
    size_t nc = 0;
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        size_t esz = ckptio_dtype_size(rt->dtype);
        uint64_t nb = volume(rt->shape, rt->ndim) * esz;
        ref[t] = malloc(nb);
        CHECK(ref[t]);
        fill_dtype(ref[t], nb, rt->dtype, seed + (uint64_t)t);
        uint64_t seg[4][8];
        unsigned nseg[4], idx[4] = {0};
        for (uint32_t d = 0; d < rt->ndim; d++) nseg[d] = split_dim(&g, rt, d, seg[d]);
        for (;;) {
            CHECK(nc < MAXC);
            rchunk *c = &ch[nc++];
            c->t = t;
            for (uint32_t d = 0; d < rt->ndim; d++) {
                c->off[d] = 0;
                for (unsigned k = 0; k < idx[d]; k++) c->off[d] += seg[d][k];
                c->shp[d] = seg[d][idx[d]];
            }
            c->nb = volume(c->shp, rt->ndim) * esz;
            c->data = malloc(c->nb + 1);
            CHECK(c->data);
            extract(c->data, ref[t], rt->shape, c->off, c->shp, rt->ndim, esz);
            nchunks[t]++;
            int d = (int)rt->ndim - 1;
            for (; d >= 0; d--) {
                if (++idx[d] < nseg[d]) break;
                idx[d] = 0;
            }
            if (d < 0) break;
        }
    }
    size_t *order = malloc(nc * sizeof *order);
    CHECK(order);
    for (size_t i = 0; i < nc; i++) order[i] = i;
    for (size_t i = nc - 1; i > 0; i--) {
        size_t j = (size_t)rnd_below(&g, i + 1), x = order[i];
        order[i] = order[j], order[j] = x;
    }
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    for (size_t i = 0; i < nc; i++) {
        const rchunk *c = &ch[order[i]];
        const rtensor *rt = &rtensors[c->t];
        /* chunks at the origin sometimes pass offset NULL */
        int origin = 1;
        for (uint32_t d = 0; d < rt->ndim; d++) origin &= c->off[d] == 0;
        CHECK_OK(ckptio_writer_add(w, rt->name, rt->dtype, rt->ndim, rt->shape,
                                   origin && (i & 1) ? NULL : c->off, c->shp, c->data, c->nb));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    printf("%zu chunks over %d tensors\n", nc, NRT);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == NRT);
    size_t tidx[NRT];
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        int64_t i = ckptio_reader_find(r, rt->name);
        CHECKF(i >= 0, "find(%s)", rt->name);
        tidx[t] = (size_t)i;
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, tidx[t], &ti));
        CHECKF(ti.num_chunks == nchunks[t], "%s: %llu chunks, %llu added", rt->name,
               (unsigned long long)ti.num_chunks, (unsigned long long)nchunks[t]);
        for (uint64_t k = 0; k < ti.num_chunks; k++) {
            ckptio_chunk_info ci;
            CHECK_OK(ckptio_reader_chunk(r, tidx[t], k, &ci));
            int found = 0;
            for (size_t j = 0; j < nc && !found; j++) {
                if (ch[j].t != t) continue;
                found = !memcmp(ch[j].off, ci.offset, rt->ndim * 8) &&
                        !memcmp(ch[j].shp, ci.shape, rt->ndim * 8) && ch[j].nb == ci.nbytes;
            }
            CHECKF(found, "%s: chunk %llu is not one that was added", rt->name,
                   (unsigned long long)k);
        }
    }

    /* one region per call */
    unsigned char *exp = malloc(4 * MiB + 64);
    CHECK(exp);
    int nreads = 0;
    for (int t = 0; t < NRT; t++) {
        const rtensor *rt = &rtensors[t];
        size_t esz = ckptio_dtype_size(rt->dtype);
        for (int i = 0; i < 38; i++) {
            uint64_t off[4] = {0}, shp[4] = {0};
            int kind = i < 36 ? i % BOX_KINDS : BOX_FULL;
            rand_box(&g, rt, kind, off, shp);
            uint64_t n = volume(shp, rt->ndim) * esz;
            extract(exp, ref[t], rt->shape, off, shp, rt->ndim, esz);
            ckptio_region rg = {.size = sizeof(ckptio_region), .name = rt->name, .offset = off,
                                .shape = shp};
            if (i == 36) rg.offset = NULL, rg.shape = NULL; /* whole tensor */
            if (i == 37) rg.offset = NULL;                  /* whole tensor, offset NULL */
            if (i % 5 == 4) rg.name = NULL, rg.tensor = tidx[t];
            int aligned = i % 2 == 0;
            uint64_t cap = aligned ? round_up(n + 1, PAGE) : n;
            unsigned char *buf = aligned ? t_alloc(cap) : malloc(n + 2);
            CHECK(buf);
            if (!aligned) buf[0] = buf[n + 1] = GUARD_BYTE;
            rg.dst = aligned ? buf : buf + 1;
            rg.capacity = cap;
            int rc = ckptio_reader_read(r, &rg, 1);
            CHECKF(rc >= 0, "%s box %d (kind %d): %s: %s", rt->name, i, kind, ckptio_errname(rc),
                   ckptio_reader_errmsg(r));
            CHECKF(!memcmp(rg.dst, exp, n), "%s box %d (kind %d): off [%llu %llu %llu %llu] "
                   "shape [%llu %llu %llu %llu]: data differ", rt->name, i, kind,
                   (unsigned long long)off[0], (unsigned long long)off[1],
                   (unsigned long long)off[2], (unsigned long long)off[3],
                   (unsigned long long)shp[0], (unsigned long long)shp[1],
                   (unsigned long long)shp[2], (unsigned long long)shp[3]);
            if (aligned) t_free(buf, cap);
            else {
                CHECKF(buf[0] == GUARD_BYTE && buf[n + 1] == GUARD_BYTE,
                       "%s box %d: wrote outside the destination", rt->name, i);
                free(buf);
            }
            nreads++;
        }
    }

    /* 300 random boxes in one call, destinations packed in one arena with gaps */
    enum { NB = 300 };
    ckptio_region *reg = calloc(NB, sizeof *reg);
    uint64_t(*boff)[4] = calloc(NB, sizeof *boff), (*bshp)[4] = calloc(NB, sizeof *bshp);
    int *bt = calloc(NB, sizeof *bt);
    uint64_t *bpos = calloc(NB, sizeof *bpos);
    CHECK(reg && boff && bshp && bt && bpos);
    uint64_t arena_len = 0;
    for (int i = 0; i < NB; i++) {
        bt[i] = (int)rnd_below(&g, NRT);
        const rtensor *rt = &rtensors[bt[i]];
        int kind = (int)rnd_below(&g, BOX_KINDS);
        rand_box(&g, rt, kind, boff[i], bshp[i]);
        uint64_t n = volume(bshp[i], rt->ndim) * ckptio_dtype_size(rt->dtype);
        bpos[i] = round_up(arena_len, PAGE) + (i % 3 == 1 ? (uint64_t)i % 61 : 0);
        arena_len = bpos[i] + n + 16;
        reg[i] = (ckptio_region){.size = sizeof(ckptio_region), .offset = boff[i],
                                 .shape = bshp[i], .capacity = n};
        if (i % 2) reg[i].name = rt->name;
        else reg[i].tensor = tidx[bt[i]];
    }
    unsigned char *arena = t_alloc(arena_len);
    CHECK(arena);
    for (int i = 0; i < NB; i++) reg[i].dst = arena + bpos[i];
    /* the batch once with default params, once through a tiny staging pool (many requests
     * per run, runs cut across requests) */
    ckptio_params tiny;
    ckptio_params_init(&tiny);
    tiny.staging_bytes = 256 * KiB;
    tiny.request_bytes = 64 * KiB;
    tiny.queue_depth = 2;
    for (int pass = 0; pass < 2; pass++) {
        ckptio_reader *rr = r;
        if (pass == 1) CHECK_OK(ckptio_reader_open(&rr, t_path("ck"), &tiny));
        memset(arena, GUARD_BYTE, arena_len);
        double t0 = mono();
        CHECK_OK(ckptio_reader_read(rr, reg, NB));
        printf("%s: one call of %d regions (%llu bytes) in %.3f s\n",
               pass ? "tiny staging" : "defaults", NB, (unsigned long long)arena_len,
               mono() - t0);
        for (int i = 0; i < NB; i++) {
            const rtensor *rt = &rtensors[bt[i]];
            size_t esz = ckptio_dtype_size(rt->dtype);
            uint64_t n = reg[i].capacity;
            extract(exp, ref[bt[i]], rt->shape, boff[i], bshp[i], rt->ndim, esz);
            CHECKF(!memcmp(arena + bpos[i], exp, n), "pass %d: batched region %d of %s differs",
                   pass, i, rt->name);
            memset(arena + bpos[i], GUARD_BYTE, n);
        }
        for (uint64_t k = 0; k < arena_len; k++)
            CHECKF(arena[k] == GUARD_BYTE,
                   "pass %d: batched read wrote outside its regions at arena %llu", pass,
                   (unsigned long long)k);
        CHECK_OK(ckptio_reader_verify(rr, NULL));
        if (pass == 1) ckptio_reader_close(rr);
    }
    printf("%d single reads\n", nreads);
    ckptio_reader_close(r);
    t_free(arena, arena_len);
    for (size_t i = 0; i < nc; i++) free(ch[i].data);
    for (int t = 0; t < NRT; t++) free(ref[t]);
    free(ch), free(order), free(exp), free(reg), free(boff), free(bshp), free(bt), free(bpos);
    return 0;
}

const ckptio_test tests_api_regions[] = {
    {"api_regions", test_regions, T_PER_BACKEND, 120},
    {0},
};
