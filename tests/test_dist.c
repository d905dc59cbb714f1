/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of distributed saves: the planner (holdings, checks, assignment, cache), ckptio_save_dist. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>

#include "../src/ranks/plan.h"
#include "../src/format/manifest.h"
#include "../src/ranks/comm.h"
#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

/* --- holdings built by hand, sent through the wire format --------------------------------- */

#define MAXI 64

typedef struct trank {
    ckptio__hold it[MAXI];
    uint64_t dims[MAXI][3][4];
    char names[MAXI][64];
    size_t n;
} trank;

/* Add the box [off, off + box) of tensor `name` of `shape`; off/box NULL: the whole tensor. */
static void hold(trank *r, const char *name, int dt, uint32_t nd, const uint64_t *shape,
                 const uint64_t *off, const uint64_t *box, uint64_t hash, uint32_t flags)
{
    size_t i = r->n++;
    snprintf(r->names[i], sizeof r->names[i], "%s", name);
    uint64_t vol = 1;
    for (uint32_t d = 0; d < nd; d++) {
        r->dims[i][0][d] = shape[d];
        r->dims[i][1][d] = off ? off[d] : 0;
        r->dims[i][2][d] = box ? box[d] : shape[d];
        vol *= r->dims[i][2][d];
    }
    r->it[i] = (ckptio__hold){r->names[i], (uint32_t)strlen(name), (uint32_t)dt, nd, flags,
                              r->dims[i][0], r->dims[i][1], r->dims[i][2],
                              vol * ckptio_dtype_size(dt), hash};
}

/* Rows [lo, lo + rows) of a 2-D tensor [n0, n1]. */
static void hold_rows(trank *r, const char *name, int dt, uint64_t n0, uint64_t n1, uint64_t lo,
                      uint64_t rows, uint64_t hash)
{
    uint64_t shape[2] = {n0, n1}, off[2] = {lo, 0}, box[2] = {rows, n1};
    hold(r, name, dt, 2, shape, off, box, hash, 0);
}

typedef struct tplan {
    ckptio__holdings *h[16];
    uint32_t n;
    ckptio__plan_cache cache;
    char err[1024];
    ckptio_error_info blame; /* who the last failure is about */
} tplan;

static void tplan_drop(tplan *t)
{
    for (uint32_t r = 0; r < t->n; r++) ckptio__holdings_free(t->h[r]);
    t->n = 0;
}

static void tplan_free(tplan *t)
{
    tplan_drop(t);
    ckptio__plan_cache_free(&t->cache);
}

/* Encode each rank's items, decode them as the coordinator does, plan. */
static int plan_ranks(tplan *t, trank *ranks, uint32_t n, const ckptio__plan **out)
{
    tplan_drop(t);
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    for (uint32_t r = 0; r < n; r++) {
        int rc = ckptio__holdings_encode(ranks[r].it, ranks[r].n, &b, t->err, sizeof t->err);
        if (rc == 0) rc = ckptio__holdings_decode(b.data, b.len, &t->h[r], t->err, sizeof t->err);
        if (rc < 0) {
            fprintf(stderr, "rank %u: %s\n", r, t->err);
            ckptio_bytes_free(&b);
            return rc;
        }
        t->n = r + 1;
    }
    ckptio_bytes_free(&b);
    int rc = ckptio__plan_make(&t->cache, (const ckptio__holdings *const *)t->h, n, out, t->err,
                               sizeof t->err, &t->blame);
    if (rc < 0) fprintf(stderr, "plan: %s\n", t->err);
    return rc;
}

/* Every assignment's bytes, per tensor (by stored name), against the tensors' sizes: each
 * element written exactly once (the pieces of one box never overlap: they are slabs). And the
 * broadcast form gives each rank exactly its own assignments. */
static int check_cover(tplan *t, const ckptio__plan *pl)
{
    uint64_t sum = 0, want = 0, per_rank[16] = {0};
    for (uint64_t i = 0; i < pl->n_assign; i++) {
        const ckptio__assign *a = &pl->assign[i];
        CHECK(a->rank < t->n && a->item < t->h[a->rank]->n);
        const ckptio__hold *h = &t->h[a->rank]->items[a->item];
        uint64_t b = h->ndim && h->box[0] ? h->nbytes / h->box[0] * a->rows : h->nbytes;
        CHECK(!h->ndim || a->start + a->rows <= h->box[0]);
        sum += b;
        per_rank[a->rank] += b;
    }
    /* distinct (name, box) bytes: count each box once via the lowest rank holding it */
    for (uint32_t r = 0; r < t->n; r++)
        for (uint64_t i = 0; i < t->h[r]->n; i++) {
            const ckptio__hold *h = &t->h[r]->items[i];
            bool first = true;
            for (uint32_t q = 0; q < r && first && !(h->flags & CKPTIO__HOLD_RANK_LOCAL); q++)
                for (uint64_t j = 0; j < t->h[q]->n && first; j++) {
                    const ckptio__hold *o = &t->h[q]->items[j];
                    first = !(o->name_len == h->name_len &&
                              !memcmp(o->name, h->name, h->name_len) &&
                              !(o->flags & CKPTIO__HOLD_RANK_LOCAL) &&
                              !memcmp(o->offset, h->offset, 8 * h->ndim) &&
                              !memcmp(o->box, h->box, 8 * h->ndim));
                }
            if (first) want += h->nbytes;
        }
    if (sum != want) fprintf(stderr, "assigned %llu bytes, distinct boxes hold %llu\n",
                             (unsigned long long)sum, (unsigned long long)want);
    CHECK(sum == want);
    ckptio_bytes wire = CKPTIO_BYTES_INIT;
    CHECK_OK(ckptio__plan_encode(pl, 0, NULL, NULL, &wire));
    uint64_t seen = 0;
    for (uint32_t r = 0; r < t->n; r++) {
        CHECK(per_rank[r] == pl->rank_bytes[r]);
        ckptio__vec mine;
        ckptio__vec_init(&mine, sizeof(ckptio__assign));
        CHECK_OK(ckptio__plan_decode_rank(wire.data, wire.len, r, t->h[r], &mine, t->err,
                                          sizeof t->err, NULL));
        for (size_t i = 0; i < mine.len; i++) {
            const ckptio__assign *a = CKPTIO__VEC_AT(&mine, ckptio__assign, i);
            CHECK(a->rank == r);
            CHECK(!memcmp(a, &pl->assign[seen + i], sizeof *a));
        }
        seen += mine.len;
        ckptio__vec_free(&mine);
    }
    CHECK(seen == pl->n_assign);
    /* Every holder of a replicated box learns it, and how many slabs the box is written as. */
    uint64_t members = 0;
    for (uint32_t r = 0; r < t->n; r++) {
        ckptio__vec reps;
        ckptio__vec_init(&reps, sizeof(ckptio__replica));
        CHECK_OK(ckptio__plan_decode_replicas(wire.data, wire.len, r, t->h[r], &reps, t->err,
                                              sizeof t->err));
        for (size_t i = 0; i < reps.len; i++) {
            const ckptio__replica *x = CKPTIO__VEC_AT(&reps, ckptio__replica, i);
            const ckptio__hold *h = &t->h[r]->items[x->item];
            uint64_t pieces = 0;
            for (uint64_t k = 0; k < pl->n_assign; k++) {
                const ckptio__hold *o = &t->h[pl->assign[k].rank]->items[pl->assign[k].item];
                pieces += o->name_len == h->name_len && !memcmp(o->name, h->name, h->name_len) &&
                          !(o->flags & CKPTIO__HOLD_RANK_LOCAL) &&
                          !memcmp(o->offset, h->offset, 8 * h->ndim) &&
                          !memcmp(o->box, h->box, 8 * h->ndim);
            }
            CHECK(!(h->flags & CKPTIO__HOLD_RANK_LOCAL) && pieces == x->slabs);
        }
        members += reps.len;
        ckptio__vec_free(&reps);
    }
    CHECK(members == (pl->n_rep ? pl->rep_first[pl->n_rep] : 0));
    for (uint64_t len = 0; len < wire.len; len++) { /* cut short: refused, never over-read */
        ckptio__vec reps;
        ckptio__vec_init(&reps, sizeof(ckptio__replica));
        CHECK(ckptio__plan_decode_replicas(wire.data, len, 0, t->h[0], &reps, t->err,
                                           sizeof t->err) == CKPTIO_E_CORRUPT);
        ckptio__vec_free(&reps);
    }
    ckptio_bytes_free(&wire);
    return 0;
}

/* --- tests --------------------------------------------------------------------------------- */

static trank R[16];

static void reset(uint32_t n)
{
    memset(R, 0, sizeof(trank) * n);
}

/* Shard(0) of a [1024, 256] and an uneven [1000, 3] over 4 ranks; rank 3's share of a third
 * tensor is empty. Each rank writes exactly its own shards. */
static int test_plan_shard0(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++) {
        hold_rows(&R[r], "w", CKPTIO_DT_F32, 1024, 256, 256 * r, 256, 100 + r);
        uint64_t lo = r * 250 + (r > 0), rows = r == 0 ? 251 : r == 3 ? 249 : 250;
        hold_rows(&R[r], "b", CKPTIO_DT_BF16, 1000, 3, lo, rows, 200 + r);
        hold_rows(&R[r], "e", CKPTIO_DT_U8, 30, 2, r * 10, r == 3 ? 0 : 10, 300 + r);
    }
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(pl->tensors == 3);
    CHECK(pl->n_assign == 11); /* rank 3's empty box of 'e' is not written */
    CHECK(pl->n_rep == 0);
    for (uint64_t i = 0; i < pl->n_assign; i++) {
        const ckptio__assign *a = &pl->assign[i];
        CHECK(a->start == 0 && a->rows == t.h[a->rank]->items[a->item].box[0]);
    }
    CHECK(pl->rank_bytes[0] == 256 * 256 * 4 + 251 * 3 * 2 + 20);
    CHECK(pl->rank_bytes[3] == 256 * 256 * 4 + 249 * 3 * 2);
    CHECK(check_cover(&t, pl) == 0);
    tplan_free(&t);
    return 0;
}

/* Replicated state on 4 ranks: every rank holds every tensor whole. Large tensors are split
 * into slabs, small ones spread: each rank writes about a quarter (within 10%). */
static int test_plan_replicated(void)
{
    reset(4);
    static const uint64_t rows[] = {16384, 5000, 2300, 777, 256, 3, 1};
    for (uint32_t r = 0; r < 4; r++) {
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            char name[32];
            snprintf(name, sizeof name, "layer%zu.weight", i);
            hold_rows(&R[r], name, CKPTIO_DT_F32, rows[i], 1024, 0, rows[i], 7000 + i);
        }
        for (int i = 0; i < 40; i++) {
            char name[32];
            snprintf(name, sizeof name, "norm%02d", i);
            hold_rows(&R[r], name, CKPTIO_DT_F32, 25, 1024, 0, 25, 9000 + (uint64_t)i);
        }
        uint64_t s0[1] = {0};
        hold(&R[r], "empty", CKPTIO_DT_F32, 1, s0, NULL, NULL, 1, 0);
        hold(&R[r], "step", CKPTIO_DT_I64, 0, NULL, NULL, NULL, 42, 0);
    }
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(check_cover(&t, pl) == 0);
    uint64_t total = 0, lo = UINT64_MAX, hi = 0;
    for (uint32_t r = 0; r < 4; r++) {
        total += pl->rank_bytes[r];
        lo = CKPTIO__MIN(lo, pl->rank_bytes[r]);
        hi = CKPTIO__MAX(hi, pl->rank_bytes[r]);
        fprintf(stderr, "rank %u writes %llu bytes\n", r, (unsigned long long)pl->rank_bytes[r]);
    }
    CHECK(hi - lo <= total / 4 / 10);
    /* The 64 MiB tensor is split in 4 slabs, one per rank. */
    int slabs = 0;
    for (uint64_t i = 0; i < pl->n_assign; i++)
        slabs += strcmp(t.h[pl->assign[i].rank]->items[pl->assign[i].item].name,
                        "layer0.weight") == 0;
    CHECK(slabs == 4);
    CHECK(pl->n_rep == 7 + 40 + 2);
    tplan_free(&t);
    return 0;
}

/* Shard(0) x Replicate over a 2 x 2 mesh, a plain Shard(0), a replicated tensor and a 2-D
 * block sharding: each distinct box written once. */
static int test_plan_mixed(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++) {
        hold_rows(&R[r], "a", CKPTIO_DT_F16, 4096, 2048, (r / 2) * 2048, 2048, 10 + r / 2);
        hold_rows(&R[r], "s", CKPTIO_DT_F32, 64, 8, r * 16, 16, 20 + r);
        hold_rows(&R[r], "rep", CKPTIO_DT_F32, 3000, 1024, 0, 3000, 30);
        uint64_t shape[2] = {100, 60}, off[2] = {(r / 2) * 50, (r % 2) * 30}, box[2] = {50, 30};
        hold(&R[r], "blk", CKPTIO_DT_I32, 2, shape, off, box, 40 + r, 0);
    }
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(check_cover(&t, pl) == 0);
    CHECK(pl->n_rep == 3); /* a's two boxes, rep */
    tplan_free(&t);
    return 0;
}

static int test_plan_hole(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++)
        if (r != 2) hold_rows(&R[r], "w", CKPTIO_DT_F32, 1024, 256, 256 * r, 256, r);
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_INCOMPLETE);
    fprintf(stderr, "%s\n", t.err);
    CHECK(t_contains(t.err, "tensor 'w' [1024,256]"));
    CHECK(t_contains(t.err, "ranks 0, 1, 3"));
    CHECK(t_contains(t.err, "no rank holds [offset 512,0 shape 256,256]"));
    CHECK(strcmp(t.blame.tensor, "w") == 0 && t.blame.rank == CKPTIO_ERROR_NO_RANK);
    /* Not one dimension: the volumes. */
    reset(2);
    uint64_t shape[2] = {4, 4}, o0[2] = {0, 0}, b0[2] = {2, 2}, o1[2] = {2, 2};
    hold(&R[0], "m", CKPTIO_DT_U8, 2, shape, o0, b0, 1, 0);
    hold(&R[1], "m", CKPTIO_DT_U8, 2, shape, o1, b0, 2, 0);
    CHECK_ERR(plan_ranks(&t, R, 2, &pl), CKPTIO_E_INCOMPLETE);
    CHECK(t_contains(t.err, "cover 8 of its 16 elements"));
    tplan_free(&t);
    return 0;
}

static int test_plan_overlap(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++)
        hold_rows(&R[r], "w", CKPTIO_DT_F32, 1024, 256, r == 2 ? 500 : 256 * r, 256, r);
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_DUPLICATE);
    fprintf(stderr, "%s\n", t.err);
    CHECK(t_contains(t.err, "tensor 'w' [1024,256]: rank 1's box [offset 256,0 shape 256,256] "
                            "overlaps rank 2's box [offset 500,0 shape 256,256]"));
    CHECK(t.blame.rank == 1 && t.blame.other_rank == 2 && strcmp(t.blame.tensor, "w") == 0);
    /* One rank listing a box twice. */
    reset(1);
    hold_rows(&R[0], "w", CKPTIO_DT_F32, 4, 4, 0, 4, 1);
    hold_rows(&R[0], "w", CKPTIO_DT_F32, 4, 4, 0, 4, 1);
    CHECK_ERR(plan_ranks(&t, R, 1, &pl), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(t.err, "rank 0 lists the box [offset 0,0 shape 4,4] twice"));
    CHECK(t.blame.rank == 0 && t.blame.other_rank == CKPTIO_ERROR_NO_RANK);
    /* Swept along columns, which the box order (rows first) does not follow: the box met first
     * along the sweep (rank 2's, from column 3) is named first, not the lower in box order. */
    reset(3);
    uint64_t shape[2] = {4, 8};
    hold(&R[0], "g", CKPTIO_DT_U8, 2, shape, (uint64_t[]){0, 4}, (uint64_t[]){4, 4}, 1, 0);
    hold(&R[1], "g", CKPTIO_DT_U8, 2, shape, (uint64_t[]){0, 0}, (uint64_t[]){4, 2}, 2, 0);
    hold(&R[2], "g", CKPTIO_DT_U8, 2, shape, (uint64_t[]){1, 3}, (uint64_t[]){2, 2}, 3, 0);
    CHECK_ERR(plan_ranks(&t, R, 3, &pl), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(t.err, "rank 2's box [offset 1,3 shape 2,2] overlaps rank 0's box "
                            "[offset 0,4 shape 4,4]"));
    tplan_free(&t);
    return 0;
}

static int test_plan_disagree(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++)
        hold_rows(&R[r], "w", CKPTIO_DT_F32, 1024, r == 3 ? 255 : 256, 256 * r, 256, r);
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_SHAPE);
    fprintf(stderr, "%s\n", t.err);
    CHECK(t_contains(t.err, "tensor 'w': rank 0 has f32 [1024,256] but rank 3 has f32 [1024,255]"));
    reset(4);
    for (uint32_t r = 0; r < 4; r++)
        hold_rows(&R[r], "w", r == 2 ? CKPTIO_DT_BF16 : CKPTIO_DT_F32, 1024, 256, 256 * r, 256, r);
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_SHAPE);
    CHECK(t_contains(t.err, "rank 0 has f32 [1024,256] but rank 2 has bf16 [1024,256]"));
    CHECK(t.blame.rank == 0 && t.blame.other_rank == 2 && strcmp(t.blame.tensor, "w") == 0);
    tplan_free(&t);
    return 0;
}

/* Replicas whose hashes differ are named, on a fresh plan and on a cached one. */
static int test_plan_diverge(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++) {
        hold_rows(&R[r], "w", CKPTIO_DT_F32, 16, 16, 0, 16, r == 3 ? 6 : 5);
        hold_rows(&R[r], "s", CKPTIO_DT_F32, 64, 8, r * 16, 16, r);
    }
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_DUPLICATE);
    fprintf(stderr, "%s\n", t.err);
    CHECK(t_contains(t.err, "tensor 'w': ranks 0 and 3 hold different values for the same box "
                            "[offset 0,0 shape 16,16]; a plain tensor saved from every rank must "
                            "be identical on all ranks — save rank-specific values as rank-local"));
    CHECK(t.blame.rank == 0 && t.blame.other_rank == 3 && strcmp(t.blame.tensor, "w") == 0);
    /* Same structure, agreeing: planned and cached; then rank 1 diverges: the cached plan
     * still compares. */
    R[3].it[0].hash = 5;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(t.cache.hits == 0);
    R[2].it[1].hash = 77; /* a shard's hash changes nothing */
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(t.cache.hits == 1);
    R[1].it[0].hash = 9;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_DUPLICATE);
    CHECK(t_contains(t.err, "ranks 0 and 1 hold different values"));
    CHECK(t.blame.rank == 0 && t.blame.other_rank == 1 && strcmp(t.blame.tensor, "w") == 0);
    R[1].it[0].hash = 5;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(t.cache.hits == 2);
    /* A structural change plans afresh. */
    R[1].dims[0][0][1] = R[1].dims[0][2][1] = 17;
    R[1].it[0].nbytes = 16 * 17 * 4;
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_SHAPE);
    CHECK(t.cache.hits == 2);
    tplan_free(&t);
    return 0;
}

/* Rank-local items: one per rank under "<name>@rank<R>", never compared; a plain tensor of
 * such a name collides. */
static int test_plan_rank_local(void)
{
    reset(4);
    for (uint32_t r = 0; r < 4; r++) {
        uint64_t s[1] = {8};
        hold(&R[r], "rng", CKPTIO_DT_U8, 1, s, NULL, NULL, 1000 + r, CKPTIO__HOLD_RANK_LOCAL);
        hold(&R[r], "step", CKPTIO_DT_I64, 0, NULL, NULL, NULL, 3, 0);
    }
    tplan t = {0};
    const ckptio__plan *pl = NULL;
    CHECK_OK(plan_ranks(&t, R, 4, &pl));
    CHECK(check_cover(&t, pl) == 0);
    CHECK(pl->tensors == 5);
    int local = 0;
    for (uint64_t i = 0; i < pl->n_assign; i++) {
        const ckptio__hold *h = &t.h[pl->assign[i].rank]->items[pl->assign[i].item];
        local += h->flags & CKPTIO__HOLD_RANK_LOCAL ? 1 : 0;
    }
    CHECK(local == 4 && pl->n_assign == 5);
    char name[64];
    CHECK(ckptio__rank_local_name(name, sizeof name, "rng", 3, 12) == 10);
    CHECK(strcmp(name, "rng@rank12") == 0);
    CHECK(ckptio__rank_local_name(name, 8, "rng", 3, 12) == 0);
    /* Collision with a plain tensor. */
    uint64_t s[1] = {8};
    hold(&R[1], "rng@rank0", CKPTIO_DT_U8, 1, s, NULL, NULL, 5, 0);
    CHECK_ERR(plan_ranks(&t, R, 4, &pl), CKPTIO_E_DUPLICATE);
    fprintf(stderr, "%s\n", t.err);
    CHECK(t_contains(t.err, "tensor 'rng@rank0': rank 0 stores its rank-local 'rng'"));
    tplan_free(&t);
    return 0;
}

/* A rank that failed before planning sends its error; the plan fails with it, naming the rank.
 * A plan carrying an error gives every rank that error. */
static int test_plan_rank_error(void)
{
    reset(3);
    for (uint32_t r = 0; r < 3; r++) hold_rows(&R[r], "w", CKPTIO_DT_F32, 3, 4, r, 1, r);
    ckptio__holdings *h[3] = {0};
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    char err[512];
    for (uint32_t r = 0; r < 3; r++) {
        if (r == 1)
            CHECK_OK(ckptio__holdings_encode_error(-ENOSPC, "tensor 'w': no space",
                                                   CKPTIO_ERROR_REFUSED, &b));
        else
            CHECK_OK(ckptio__holdings_encode(R[r].it, R[r].n, &b, err, sizeof err));
        CHECK_OK(ckptio__holdings_decode(b.data, b.len, &h[r], err, sizeof err));
    }
    ckptio__plan_cache cache = {0};
    const ckptio__plan *pl = NULL;
    static ckptio_error_info blame, told;
    CHECK_ERR(ckptio__plan_make(&cache, (const ckptio__holdings *const *)h, 3, &pl, err,
                                sizeof err, &blame), -ENOSPC);
    CHECK(strcmp(err, "rank 1: tensor 'w': no space") == 0);
    CHECK(blame.rank == 1 && blame.flags == CKPTIO_ERROR_REFUSED && !blame.tensor[0]);
    /* The blame crosses the wire with the message. */
    snprintf(blame.tensor, sizeof blame.tensor, "w");
    blame.other_rank = 2;
    CHECK_OK(ckptio__plan_encode(NULL, -ENOSPC, err, &blame, &b));
    ckptio__vec mine;
    ckptio__vec_init(&mine, sizeof(ckptio__assign));
    char got[512];
    CHECK_ERR(ckptio__plan_decode_rank(b.data, b.len, 2, h[2], &mine, got, sizeof got, &told),
              -ENOSPC);
    CHECK(strcmp(got, err) == 0 && mine.len == 0);
    CHECK(told.rank == 1 && told.other_rank == 2 && told.flags == CKPTIO_ERROR_REFUSED &&
          strcmp(told.tensor, "w") == 0);
    /* Cut short or padded, it is no plan. */
    CHECK_ERR(ckptio__plan_decode_rank(b.data, b.len - 1, 2, h[2], &mine, got, sizeof got, NULL),
              CKPTIO_E_CORRUPT);
    CHECK(ckptio__plan_status(b.data, b.len) == -ENOSPC);
    /* Even when the coordinator's error is CORRUPT (a rank's holdings it could not decode),
     * every rank knows it for the plan's verdict, not for damage to its own copy. */
    CHECK_OK(ckptio__plan_encode(NULL, CKPTIO_E_CORRUPT, "rank 1: holdings: cut short", NULL, &b));
    CHECK(ckptio__plan_status(b.data, b.len) == CKPTIO_E_CORRUPT);
    CHECK(ckptio__plan_status(b.data, 7) == 1);
    /* An invalid item is refused by encode, naming it. */
    R[0].it[0].nbytes = 3;
    CHECK_ERR(ckptio__holdings_encode(R[0].it, R[0].n, &b, err, sizeof err), CKPTIO_E_SHAPE);
    CHECK(t_contains(err, "tensor 'w'"));
    R[0].dims[0][1][0] = 3;
    R[0].it[0].nbytes = 16;
    CHECK_ERR(ckptio__holdings_encode(R[0].it, R[0].n, &b, err, sizeof err), CKPTIO_E_RANGE);
    for (uint32_t r = 0; r < 3; r++) ckptio__holdings_free(h[r]);
    ckptio__vec_free(&mine);
    ckptio_bytes_free(&b);
    ckptio__plan_cache_free(&cache);
    return 0;
}

/* Holdings and plans cross process boundaries: every truncation and many corruptions of valid
 * bytes are refused or decode to something valid, never read out of bounds (ASan run). */
static int test_plan_wire_untrusted(void)
{
    reset(1);
    hold_rows(&R[0], "w", CKPTIO_DT_F32, 1024, 256, 0, 256, 1);
    hold(&R[0], "step", CKPTIO_DT_I64, 0, NULL, NULL, NULL, 3, CKPTIO__HOLD_RANK_LOCAL);
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    char err[512];
    CHECK_OK(ckptio__holdings_encode(R[0].it, R[0].n, &b, err, sizeof err));
    ckptio__holdings *h = NULL;
    for (size_t len = 0; len < b.len; len++) {
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, b.data, len);
        CHECK_ERR(ckptio__holdings_decode(copy, len, &h, err, sizeof err), CKPTIO_E_CORRUPT);
        free(copy);
    }
    for (size_t i = 0; i < b.len; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            uint8_t *copy = malloc(b.len);
            memcpy(copy, b.data, b.len);
            copy[i] ^= (uint8_t)(1u << bit);
            int rc = ckptio__holdings_decode(copy, b.len, &h, err, sizeof err);
            CHECK(rc == 0 || rc == CKPTIO_E_CORRUPT || rc == -ENOMEM);
            if (rc == 0) ckptio__holdings_free(h);
            free(copy);
        }
    CHECK_OK(ckptio__holdings_decode(b.data, b.len, &h, err, sizeof err));
    CHECK(h->n == 2 && strcmp(h->items[1].name, "step") == 0 && h->items[0].box[0] == 256);
    /* A plan naming an item this rank lacks, or rows outside its box. */
    ckptio__assign a[2] = {{0, 0, 0, 256}, {0, 1, 0, 0}};
    ckptio__plan pl = {.nranks = 1, .n_assign = 2, .assign = a};
    ckptio_bytes w = CKPTIO_BYTES_INIT;
    ckptio__vec mine;
    ckptio__vec_init(&mine, sizeof(ckptio__assign));
    CHECK_OK(ckptio__plan_encode(&pl, 0, NULL, NULL, &w));
    CHECK_OK(ckptio__plan_decode_rank(w.data, w.len, 0, h, &mine, err, sizeof err, NULL));
    CHECK(mine.len == 2);
    for (size_t len = 0; len < w.len; len++)
        CHECK(ckptio__plan_decode_rank(w.data, len, 0, h, &mine, err, sizeof err, NULL) ==
              CKPTIO_E_CORRUPT);
    a[0].rows = 257;
    CHECK_OK(ckptio__plan_encode(&pl, 0, NULL, NULL, &w));
    CHECK_ERR(ckptio__plan_decode_rank(w.data, w.len, 0, h, &mine, err, sizeof err, NULL),
              CKPTIO_E_CORRUPT);
    a[0].rows = 1, a[1].item = 2;
    CHECK_OK(ckptio__plan_encode(&pl, 0, NULL, NULL, &w));
    CHECK_ERR(ckptio__plan_decode_rank(w.data, w.len, 0, h, &mine, err, sizeof err, NULL),
              CKPTIO_E_CORRUPT);
    ckptio__holdings_free(h);
    ckptio__vec_free(&mine);
    ckptio_bytes_free(&w);
    ckptio_bytes_free(&b);
    return 0;
}

/* 10,000 ranks, each with a shard of two tensors, two replicated ones and a rank-local one:
 * the plan completes, twice (the second from the cache), and each rank's share of the
 * broadcast is found. No timing is asserted. */
static int test_plan_many_ranks(void)
{
    enum { N = 10000 };
    ckptio__holdings **h = calloc(N, sizeof *h);
    CHECK(h);
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    char err[512];
    uint64_t sent = 0;
    for (uint32_t r = 0; r < N; r++) {
        trank *t = &R[0];
        memset(t, 0, sizeof *t);
        hold_rows(t, "emb", CKPTIO_DT_BF16, (uint64_t)N * 64, 64, (uint64_t)r * 64, 64, r);
        hold_rows(t, "bias", CKPTIO_DT_F32, N, 1, r, 1, r);
        hold_rows(t, "ln.weight", CKPTIO_DT_F32, 1, 1024, 0, 1, 7);
        hold_rows(t, "ln.bias", CKPTIO_DT_F32, 1, 1024, 0, 1, 8);
        uint64_t s[1] = {16};
        hold(t, "rng", CKPTIO_DT_U8, 1, s, NULL, NULL, r, CKPTIO__HOLD_RANK_LOCAL);
        CHECK_OK(ckptio__holdings_encode(t->it, t->n, &b, err, sizeof err));
        CHECK(b.len < 512); /* what a rank sends does not grow with N */
        sent += b.len;
        CHECK_OK(ckptio__holdings_decode(b.data, b.len, &h[r], err, sizeof err));
    }
    ckptio__plan_cache cache = {0};
    const ckptio__plan *pl = NULL;
    for (int round = 0; round < 2; round++) {
        CHECK_OK(ckptio__plan_make(&cache, (const ckptio__holdings *const *)h, N, &pl, err,
                                   sizeof err, NULL));
        CHECK(pl->n_assign == 3ull * N + 2);
        CHECK(pl->tensors == 4ull + N);
        CHECK(cache.hits == (uint64_t)round);
    }
    CHECK_OK(ckptio__plan_encode(pl, 0, NULL, NULL, &b));
    fprintf(stderr, "sent %llu bytes in all, plan %zu bytes\n", (unsigned long long)sent, b.len);
    ckptio__vec mine;
    ckptio__vec_init(&mine, sizeof(ckptio__assign));
    CHECK_OK(ckptio__plan_decode_rank(b.data, b.len, N - 1, h[N - 1], &mine, err, sizeof err,
                                      NULL));
    CHECK(mine.len >= 3);
    ckptio__vec_free(&mine);
    ckptio__plan_cache_free(&cache);
    for (uint32_t r = 0; r < N; r++) ckptio__holdings_free(h[r]);
    free(h);
    ckptio_bytes_free(&b);
    return 0;
}

/* One rank's partial manifest: its chunks need not cover the tensor, but only in partial mode;
 * everything else is still checked (an overlap within the part is refused). */
static int test_partial_manifest(void)
{
    char strtab[] = "data/r00001-000000.ckd\0w";
    uint64_t dims[] = {4, 4, 2, 0, 2, 4, 0, 0, 2, 4};
    ckptio__mfile f = {.name = 0, .name_len = 22, .size = 4096};
    ckptio__mtensor t = {.name = 23, .name_len = 1, .dtype = CKPTIO_DT_U8, .ndim = 2, .dims = 0,
                         .chunk0 = 0, .n_chunks = 1};
    ckptio__mchunk c[2] = {{.dims = 2, .file_off = 0, .stored_len = 8, .raw_len = 8},
                           {.dims = 6, .file_off = 64, .stored_len = 8, .raw_len = 8}};
    ckptio__manifest m = {.version = CKPTIO_FORMAT_VERSION, .n_files = 1, .n_tensors = 1,
                          .n_chunks = 1, .n_dims = 10, .strtab_len = sizeof strtab,
                          .files = &f, .tensors = &t, .chunks = c, .dims = dims, .strtab = strtab};
    char err[512];
    CHECK_ERR(ckptio__manifest_validate(&m, err, sizeof err), CKPTIO_E_CORRUPT);
    CHECK(t_contains(err, "cover 8 of the 16"));
    CHECK_OK(ckptio__manifest_validate_ex(&m, CKPTIO__MANIFEST_PARTIAL, err, sizeof err));
    uint64_t len = 0;
    CHECK_OK(ckptio__manifest_encoded_size(&m, &len));
    uint8_t *buf = malloc(len);
    CHECK_OK(ckptio__manifest_encode(&m, buf, len));
    ckptio__manifest *d = NULL;
    CHECK_ERR(ckptio__manifest_decode(buf, len, &d, err, sizeof err), CKPTIO_E_CORRUPT);
    CHECK_OK(ckptio__manifest_decode_ex(buf, len, CKPTIO__MANIFEST_PARTIAL, &d, err, sizeof err));
    CHECK(d->n_chunks == 1 && d->dims[d->chunks[0].dims] == 2);
    ckptio__manifest_free(d);
    free(buf);
    /* Two chunks that overlap are refused in partial mode too. */
    m.n_chunks = t.n_chunks = 2;
    dims[6] = 1;
    CHECK(ckptio__manifest_validate_ex(&m, CKPTIO__MANIFEST_PARTIAL, err, sizeof err) < 0);
    dims[6] = 0;
    int rc = ckptio__manifest_validate(&m, err, sizeof err);
    if (rc < 0) fprintf(stderr, "%s\n", err);
    CHECK(rc == 0);
    return 0;
}

/* --- ckptio_save_dist over an in-process group of threads ---------------------------------- */

#define NR_MAX 8
#define W_ROWS 1024
#define W_COLS 300
#define BIG_ROWS 3072 /* 12 MiB of f32: split into slabs across its holders */

static float *Wd, *BIGd;
static int64_t Bd[10];
static uint8_t RNGd[NR_MAX][8];

typedef struct djob {
    const ckptio_comm *c;
    ckptio_dist_item it[8];
    uint64_t dims[8][3][2];
    size_t n;
    bool absent; /* never calls: a rank that hangs or died before the save */
    bool keep;   /* overwrite off */
    bool nosum;  /* checksums off */
    bool refuse; /* takes part refusing, with -ENOSPC (ckptio_save_dist_refuse) */
    double timeout;
    int result;
    char msg[1024];
    ckptio_error_info info; /* the failure as values */
    ckptio_stats st;
} djob;

static djob J[NR_MAX];

static void d_item(djob *j, const char *name, int dt, uint32_t nd, const uint64_t *shape,
                   const uint64_t *off, const uint64_t *box, const void *data, uint32_t flags)
{
    size_t i = j->n++;
    uint64_t vol = 1;
    for (uint32_t d = 0; d < nd; d++) {
        j->dims[i][0][d] = shape[d];
        j->dims[i][1][d] = off ? off[d] : 0;
        j->dims[i][2][d] = box ? box[d] : shape[d];
        vol *= j->dims[i][2][d];
    }
    j->it[i] = (ckptio_dist_item){sizeof(ckptio_dist_item), flags, name, dt, nd, j->dims[i][0],
                                  j->dims[i][1], j->dims[i][2], data, vol * ckptio_dtype_size(dt),
                                  CKPTIO_MEM_HOST, 0};
}

static int d_setup(void)
{
    if (!Wd) {
        Wd = t_alloc(sizeof(float) * W_ROWS * W_COLS);
        BIGd = t_alloc(sizeof(float) * BIG_ROWS * 1024);
        if (!Wd || !BIGd) return -1;
    }
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 1);
    t_fill(BIGd, sizeof(float) * BIG_ROWS * 1024, 2);
    t_fill(Bd, sizeof Bd, 3);
    t_fill(RNGd, sizeof RNGd, 4);
    memset(J, 0, sizeof J);
    for (int r = 0; r < NR_MAX; r++) J[r].timeout = 10;
    return 0;
}

/* Rank r of n: its rows of w (Shard(0)), b replicated, its own rng. */
static void d_shard(int r, int n)
{
    static const uint64_t ws[2] = {W_ROWS, W_COLS}, bs[1] = {10}, rs[1] = {8};
    uint64_t rows = W_ROWS / (uint64_t)n, off[2] = {rows * (uint64_t)r, 0}, box[2] = {rows, W_COLS};
    d_item(&J[r], "w", CKPTIO_DT_F32, 2, ws, off, box, Wd + off[0] * W_COLS, 0);
    d_item(&J[r], "b", CKPTIO_DT_I64, 1, bs, NULL, NULL, Bd, 0);
    d_item(&J[r], "rng", CKPTIO_DT_U8, 1, rs, NULL, NULL, RNGd[r], CKPTIO_DIST_RANK_LOCAL);
}

static void *d_main(void *p)
{
    djob *j = p;
    if (j->absent) return NULL;
    static const char *keys[] = {"step"};
    static const void *vals[] = {"1000"};
    static const size_t lens[] = {4};
    ckptio_params prm = fparams(!j->keep);
    if (j->nosum) prm.checksums = CKPTIO_OFF;
    if (j->refuse)
        j->result = ckptio_save_dist_refuse("ckpt", j->c, -ENOSPC, "no host memory to stage 'w'",
                                            &prm, j->timeout);
    else
        j->result = ckptio_save_dist("ckpt", j->c, j->it, j->n, keys, vals, lens, 1, &prm,
                                     j->timeout, &j->st);
    snprintf(j->msg, sizeof j->msg, "%s", j->result < 0 ? ckptio_last_error() : "");
    j->info.size = sizeof j->info;
    (void)ckptio_last_error_info(&j->info);
    return NULL;
}

/* Every rank saves; returns 0 if every present rank gave the same result, else 1. */
static int d_run(int n, void (*setup)(ckptio__comm_local *))
{
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, n));
    if (setup) setup(g);
    pthread_t th[NR_MAX];
    for (int r = 0; r < n; r++) {
        J[r].c = ckptio__comm_local_rank(g, r);
        CHECK(pthread_create(&th[r], NULL, d_main, &J[r]) == 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    ckptio__comm_local_free(g);
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (J[r].absent) continue;
        fprintf(stderr, "rank %d: %d %s\n", r, J[r].result, J[r].msg);
        if (first < 0) first = r;
        CHECK(J[r].result == J[first].result);
    }
    return 0;
}

/* The checkpoint holds w, b, the ranks' rng and the metadata, bit-exact. */
static int d_verify(int n, bool big)
{
    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, "ckpt", NULL));
    float *w = malloc(sizeof(float) * W_ROWS * W_COLS);
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", w, sizeof(float) * W_ROWS * W_COLS));
    CHECK(memcmp(w, Wd, sizeof(float) * W_ROWS * W_COLS) == 0);
    free(w);
    int64_t b[10];
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", b, sizeof b));
    CHECK(memcmp(b, Bd, sizeof b) == 0);
    for (int r = 0; r < n; r++) {
        char name[32];
        uint8_t rng[8];
        snprintf(name, sizeof name, "rng@rank%d", r);
        CHECK_OK(ckptio_reader_read_tensor(rd, name, rng, sizeof rng));
        CHECK(memcmp(rng, RNGd[r], 8) == 0);
    }
    if (big) {
        float *x = malloc(sizeof(float) * BIG_ROWS * 1024);
        CHECK_OK(ckptio_reader_read_tensor(rd, "big", x, sizeof(float) * BIG_ROWS * 1024));
        CHECK(memcmp(x, BIGd, sizeof(float) * BIG_ROWS * 1024) == 0);
        free(x);
    }
    const void *v = NULL;
    size_t vl = 0;
    CHECK_OK(ckptio_reader_get_meta(rd, "step", &v, &vl));
    CHECK(vl == 4 && memcmp(v, "1000", 4) == 0);
    CHECK(ckptio_reader_num_tensors(rd) == 2u + (unsigned)n + (big ? 1u : 0u));
    CHECK_OK(ckptio_reader_verify(rd, NULL));
    ckptio_reader_close(rd);
    CHECK(count_prefix("ckpt.tmp") == 0);
    return 0;
}

static int test_save_shard0(void)
{
    CHECK(d_setup() == 0);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    CHECK(d_run(4, NULL) == 0);
    for (int r = 0; r < 4; r++) {
        CHECK_OK(J[r].result);
        /* its rows of w, and its rng; b once, by someone */
        CHECK(J[r].st.bytes >= 256 * W_COLS * 4 + 8);
    }
    CHECK(d_verify(4, false) == 0);
    /* Again over it, same structure: the plan comes from the cache; the data changed. */
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 9);
    CHECK(d_run(4, NULL) == 0);
    CHECK_OK(J[0].result);
    CHECK(d_verify(4, false) == 0);
    return 0;
}

/* Replicated state: every rank holds w, b and a 12 MiB tensor whole; each writes a share. */
static int test_save_replicated(void)
{
    CHECK(d_setup() == 0);
    static const uint64_t ws[2] = {W_ROWS, W_COLS}, bs[1] = {10}, rs[1] = {8},
                          gs[2] = {BIG_ROWS, 1024};
    for (int r = 0; r < 4; r++) {
        d_item(&J[r], "w", CKPTIO_DT_F32, 2, ws, NULL, NULL, Wd, 0);
        d_item(&J[r], "b", CKPTIO_DT_I64, 1, bs, NULL, NULL, Bd, 0);
        d_item(&J[r], "big", CKPTIO_DT_F32, 2, gs, NULL, NULL, BIGd, 0);
        d_item(&J[r], "rng", CKPTIO_DT_U8, 1, rs, NULL, NULL, RNGd[r], CKPTIO_DIST_RANK_LOCAL);
    }
    CHECK(d_run(4, NULL) == 0);
    uint64_t total = 0, writers = 0;
    for (int r = 0; r < 4; r++) {
        CHECK_OK(J[r].result);
        total += J[r].st.bytes;
        writers += J[r].st.bytes > 4u << 20;
    }
    CHECK(total == sizeof(float) * (W_ROWS * W_COLS + BIG_ROWS * 1024) + sizeof Bd + 4 * 8);
    CHECK(writers >= 3); /* 'big' split in 3 slabs */
    CHECK(d_verify(4, true) == 0);
    return 0;
}

/* A checkpoint to keep: saved by 2 ranks. */
static int d_previous(void)
{
    CHECK(d_setup() == 0);
    for (int r = 0; r < 2; r++) d_shard(r, 2);
    CHECK(d_run(2, NULL) == 0);
    CHECK_OK(J[0].result);
    CHECK(d_verify(2, false) == 0);
    CHECK(d_setup() == 0);
    return 0;
}

/* After a failed save: the previous checkpoint is intact, no temporary directory is left. */
static int d_intact(void)
{
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 1);
    CHECK(d_verify(2, false) == 0);
    return 0;
}

/* Replicas compared after the writes: whichever rank differs (one that writes the slab, or
 * one that only hashes it), with checksums on (the writer's block checksums) or off (the
 * writer's own hashes), every rank fails naming the tensor and the ranks; nothing published. */
static int test_save_replicas_diverge(void)
{
    static const uint64_t gs[2] = {BIG_ROWS, 1024}, bs[1] = {10};
    float *other = malloc(sizeof(float) * BIG_ROWS * 1024);
    CHECK(other != NULL);
    for (int nosum = 0; nosum < 2; nosum++)
        for (int bad = 0; bad < 4; bad++) {
            CHECK(d_previous() == 0);
            memcpy(other, BIGd, sizeof(float) * BIG_ROWS * 1024);
            other[(size_t)(BIG_ROWS - 2) * 1024 + 7] += 1.0f; /* in the last slab */
            for (int r = 0; r < 4; r++) {
                d_item(&J[r], "big", CKPTIO_DT_F32, 2, gs, NULL, NULL, r == bad ? other : BIGd, 0);
                d_item(&J[r], "b", CKPTIO_DT_I64, 1, bs, NULL, NULL, Bd, 0);
                J[r].nosum = nosum;
            }
            CHECK(d_run(4, NULL) == 0);
            char want[64];
            snprintf(want, sizeof want, "tensor 'big': ranks %d and %d hold different values",
                     bad ? 0 : 1, bad ? bad : 0);
            if (bad == 0) snprintf(want, sizeof want, "tensor 'big': ranks 0 and 1 hold");
            for (int r = 0; r < 4; r++) {
                CHECK_ERR(J[r].result, CKPTIO_E_DUPLICATE);
                CHECK(t_contains(J[r].msg, want));
            }
            CHECK(d_intact() == 0);
        }
    free(other);
    /* Agreeing replicas, checksums off: saved. */
    CHECK(d_setup() == 0);
    for (int r = 0; r < 4; r++) {
        d_item(&J[r], "big", CKPTIO_DT_F32, 2, gs, NULL, NULL, BIGd, 0);
        J[r].nosum = true;
    }
    CHECK(d_run(4, NULL) == 0);
    for (int r = 0; r < 4; r++) CHECK_OK(J[r].result);
    return 0;
}

/* Rank 2 fails before writing (an invalid item): every rank returns the same error, naming it,
 * before any byte is written. Diverging replicas fail every rank before anything is
 * published. */
static int test_save_rank_error(void)
{
    CHECK(d_previous() == 0);
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 5);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    J[2].it[1].nbytes = 7;
    CHECK(d_run(4, NULL) == 0);
    CHECK_ERR(J[0].result, CKPTIO_E_SHAPE);
    for (int r = 0; r < 4; r++) {
        CHECK(strcmp(J[r].msg, J[0].msg) == 0);
        CHECK(J[r].st.bytes == 0);
    }
    CHECK(t_contains(J[0].msg, "rank 2: tensor 'b'"));
    for (int r = 0; r < 4; r++)
        CHECK(J[r].info.code == CKPTIO_E_SHAPE && J[r].info.rank == 2 && J[r].info.flags == 0);
    CHECK(d_intact() == 0);
    /* Replicas that differ. */
    CHECK(d_setup() == 0);
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 5);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    static int64_t other[10];
    memcpy(other, Bd, sizeof other);
    other[3] ^= 1;
    J[3].it[1].data = other;
    CHECK(d_run(4, NULL) == 0);
    CHECK_ERR(J[1].result, CKPTIO_E_DUPLICATE);
    CHECK(t_contains(J[1].msg, "tensor 'b': ranks 0 and 3 hold different values"));
    /* found by the coordinator after the writes: every rank learns whom it blames */
    for (int r = 0; r < 4; r++)
        CHECK(J[r].info.rank == 0 && J[r].info.other_rank == 3 &&
              !strcmp(J[r].info.tensor, "b"));
    CHECK(d_intact() == 0);
    return 0;
}

/* A rank that cannot make its items takes part refusing: every rank fails at the plan, before
 * any byte is written, with its code, its number (flagged as refused) and its message. */
static int test_save_refuse(void)
{
    CHECK(d_previous() == 0);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    J[1].refuse = true;
    CHECK(d_run(4, NULL) == 0);
    for (int r = 0; r < 4; r++) {
        CHECK_ERR(J[r].result, -ENOSPC);
        CHECK(!strcmp(J[r].msg, J[0].msg) && J[r].st.bytes == 0);
        CHECK(J[r].info.rank == 1 && J[r].info.flags == CKPTIO_ERROR_REFUSED);
        CHECK(J[r].info.other_rank == CKPTIO_ERROR_NO_RANK && !J[r].info.tensor[0]);
    }
    CHECK(t_contains(J[0].msg, "rank 1: no host memory to stage 'w'"));
    CHECK(d_intact() == 0);
    /* Two refusals: the lower rank speaks; a code >= 0 is a usage error. */
    CHECK(d_setup() == 0);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    J[3].refuse = J[2].refuse = true;
    CHECK(d_run(4, NULL) == 0);
    CHECK(J[0].info.rank == 2 && J[3].info.rank == 2);
    ckptio_comm *one = NULL;
    CHECK_OK(ckptio_comm_single(&one));
    CHECK_ERR(ckptio_save_dist_refuse("ckpt", one, 0, NULL, NULL, 5), CKPTIO_E_USAGE);
    ckptio_comm_free(one);
    CHECK(d_intact() == 0);
    return 0;
}

static void kill_rank2_writing(ckptio__comm_local *g)
{
    /* ops: gather holdings (0), plan (1), temporary dir (2), then the agreement on the
     * writes (3): rank 2 dies once it has written its files. */
    ckptio__comm_local_kill_at(g, 2, 3);
}

/* A rank dying mid-save, or never coming: the others fail within the timeout, nothing is
 * published, the coordinator removes the temporary directory. */
static int test_save_rank_dies(void)
{
    CHECK(d_previous() == 0);
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 5);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    CHECK(d_run(4, kill_rank2_writing) == 0);
    for (int r = 0; r < 4; r++) CHECK(J[r].result < 0);
    CHECK(d_intact() == 0);
    CHECK(d_setup() == 0);
    for (int r = 0; r < 4; r++) {
        d_shard(r, 4);
        J[r].timeout = 1;
    }
    J[3].absent = true;
    CHECK(d_run(4, NULL) == 0);
    for (int r = 0; r < 3; r++) CHECK_ERR(J[r].result, -ETIMEDOUT);
    CHECK(d_intact() == 0);
    return 0;
}

/* Ranks with nothing to write (replicated state smaller than a slab goes to one of them) still
 * take part; an existing checkpoint without overwrite fails every rank, from rank 0's begin. */
static int test_save_idle_ranks(void)
{
    CHECK(d_setup() == 0);
    static const uint64_t bs[1] = {10};
    for (int r = 0; r < 4; r++) d_item(&J[r], "b", CKPTIO_DT_I64, 1, bs, NULL, NULL, Bd, 0);
    CHECK(d_run(4, NULL) == 0);
    CHECK_OK(J[0].result);
    int writers = 0;
    for (int r = 0; r < 4; r++) writers += J[r].st.bytes > 0;
    CHECK(writers == 1);
    ckptio_reader *rd = NULL;
    int64_t b[10];
    CHECK_OK(ckptio_reader_open(&rd, "ckpt", NULL));
    CHECK(ckptio_reader_num_tensors(rd) == 1);
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", b, sizeof b));
    CHECK(memcmp(b, Bd, sizeof b) == 0);
    ckptio_reader_close(rd);
    for (int r = 0; r < 4; r++) J[r].keep = true;
    CHECK(d_run(4, NULL) == 0);
    CHECK_ERR(J[2].result, CKPTIO_E_EXISTS);
    CHECK(t_contains(J[2].msg, "rank 0 of 4:"));
    CHECK(count_prefix("ckpt.tmp") == 0);
    return 0;
}

/* A full disk on one rank: every rank fails with its -ENOSPC, naming it. */
static int enospc_openat(int d, const char *p, int fl, mode_t m)
{
    if ((fl & O_CREAT) && strstr(p, "r00002-")) {
        errno = ENOSPC;
        return -1;
    }
    return ckptio__vfs_real.openat(d, p, fl, m);
}

static int test_save_enospc(void)
{
    CHECK(d_previous() == 0);
    t_fill(Wd, sizeof(float) * W_ROWS * W_COLS, 5);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    ckptio__vfs v = ckptio__vfs_real;
    v.openat = enospc_openat;
    ckptio__vfs_set(&v);
    int rc = d_run(4, NULL);
    ckptio__vfs_set(NULL);
    CHECK(rc == 0);
    CHECK_ERR(J[0].result, -ENOSPC);
    CHECK(t_contains(J[3].msg, "rank 2 of 4:"));
    CHECK(d_intact() == 0);
    return 0;
}

/* ckptio_reader_open_comm: rank 0 reads the manifest, the others get its bytes; each rank's
 * reader reads the same tensor and names the same manifest; rank 0's failure is every rank's. */
typedef struct ojob {
    ckptio_comm *c;
    const char *path;
    int rc;
    char msg[512];
    unsigned char digest[32];
    int same; /* w read back equals Wd */
} ojob;

static void *o_main(void *arg)
{
    ojob *j = arg;
    ckptio_reader *r = NULL;
    j->rc = ckptio_reader_open_comm(&r, j->path, NULL, j->c, 30);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc < 0 ? ckptio_last_error() : "");
    if (j->rc == 0) {
        float *w = malloc(sizeof(float) * W_ROWS * W_COLS);
        j->same = w && ckptio_reader_read_tensor(r, "w", w, sizeof(float) * W_ROWS * W_COLS) == 0 &&
                  !memcmp(w, Wd, sizeof(float) * W_ROWS * W_COLS);
        free(w);
        (void)ckptio_reader_digest(r, j->digest);
    }
    ckptio_reader_close(r);
    return NULL;
}

static int o_run(int n, const char *path, ojob *jobs)
{
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, n));
    pthread_t th[NR_MAX];
    for (int r = 0; r < n; r++) {
        jobs[r] = (ojob){.c = ckptio__comm_local_rank(g, r), .path = path};
        CHECK(pthread_create(&th[r], NULL, o_main, &jobs[r]) == 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    ckptio__comm_local_free(g);
    return 0;
}

static int test_open_comm(void)
{
    CHECK(d_setup() == 0);
    for (int r = 0; r < 4; r++) d_shard(r, 4);
    CHECK(d_run(4, NULL) == 0);
    ojob jobs[4];
    CHECK(o_run(4, "ckpt", jobs) == 0);
    for (int r = 0; r < 4; r++) {
        CHECK_OK(jobs[r].rc);
        CHECK(jobs[r].same && !memcmp(jobs[r].digest, jobs[0].digest, 32));
    }
    CHECK(o_run(4, "no-such-ckpt", jobs) == 0);
    for (int r = 0; r < 4; r++) {
        CHECK(jobs[r].rc == jobs[0].rc && jobs[0].rc < 0);
        CHECK(t_contains(jobs[r].msg, "no-such-ckpt"));
        CHECK(r == 0 || t_contains(jobs[r].msg, "rank 0 could not open"));
    }
    return 0;
}

const ckptio_test tests_dist[] = {
    {"dist/open_comm", test_open_comm, 0, 60},
    {"dist/partial_manifest", test_partial_manifest, 0, 20},
    {"dist/plan_shard0", test_plan_shard0, 0, 20},
    {"dist/plan_replicated", test_plan_replicated, 0, 20},
    {"dist/plan_mixed", test_plan_mixed, 0, 20},
    {"dist/plan_hole", test_plan_hole, 0, 20},
    {"dist/plan_overlap", test_plan_overlap, 0, 20},
    {"dist/plan_disagree", test_plan_disagree, 0, 20},
    {"dist/plan_diverge", test_plan_diverge, 0, 20},
    {"dist/plan_rank_local", test_plan_rank_local, 0, 20},
    {"dist/plan_rank_error", test_plan_rank_error, 0, 20},
    {"dist/plan_wire_untrusted", test_plan_wire_untrusted, 0, 60},
    {"dist/plan_many_ranks", test_plan_many_ranks, 0, 120},
    {"dist/save_shard0", test_save_shard0, T_PER_BACKEND, 60},
    {"dist/save_replicated", test_save_replicated, 0, 60},
    {"dist/save_replicas_diverge", test_save_replicas_diverge, 0, 60},
    {"dist/save_rank_error", test_save_rank_error, 0, 60},
    {"dist/save_refuse", test_save_refuse, 0, 60},
    {"dist/save_rank_dies", test_save_rank_dies, 0, 60},
    {"dist/save_enospc", test_save_enospc, 0, 60},
    {"dist/save_idle_ranks", test_save_idle_ranks, 0, 60},
    {0},
};
