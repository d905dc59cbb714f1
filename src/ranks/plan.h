/* SPDX-License-Identifier: Apache-2.0 */
/* The plan of a multi-rank save: what each rank holds, checked and assigned by rank 0 (pure). */
#ifndef CKPTIO_DIST_PLAN_H
#define CKPTIO_DIST_PLAN_H

#include "../common/common.h"

/* A distributed save (issue 10) starts with a plan. Every rank encodes what it holds — per
 * item: tensor name, dtype, global shape, the box it holds (offset and shape in the global
 * tensor), its byte count and an XXH3-64 of the box's bytes — and sends it to the coordinator,
 * rank 0 (a gather: each rank sends bytes proportional to what it holds, not to N). The
 * coordinator decodes every rank's holdings (untrusted: they cross process boundaries) and
 * plans:
 *  - items are grouped by stored name; all items of a name must agree on dtype, rank and global
 *    shape (else CKPTIO_E_SHAPE naming the tensor and two ranks);
 *  - identical boxes of one tensor from several ranks are replicas of one piece: their hashes
 *    must agree (else CKPTIO_E_DUPLICATE naming the tensor, two ranks and the box: a plain
 *    tensor saved from every rank must be identical on all of them); one rank listing a box
 *    twice is CKPTIO_E_DUPLICATE;
 *  - the distinct boxes of a tensor must tile its global shape: an overlap is
 *    CKPTIO_E_DUPLICATE naming both ranks and boxes, a hole CKPTIO_E_INCOMPLETE naming the
 *    ranks that hold some of it and, when the boxes split one dimension, the missing box;
 *  - a rank-local item (CKPTIO__HOLD_RANK_LOCAL) is stored under its own name per rank,
 *    "<name>@rank<R>" (R in decimal, no padding), never compared with other ranks' and never
 *    deduplicated; a plain tensor of that same stored name is CKPTIO_E_DUPLICATE;
 *  - each distinct box is assigned to one of its holders. Boxes held by one rank go to it;
 *    then replicated boxes, largest first (ties in name and box order), go to the least-loaded
 *    holder (ties: lowest rank) — except that a replicated box of at least 2 x
 *    CKPTIO__PLAN_MIN_SLAB bytes is split along dimension 0 into k = min(holders, rows,
 *    bytes / CKPTIO__PLAN_MIN_SLAB) slabs of near-equal rows, given to the k least-loaded
 *    holders. So each of H ranks holding replicated state writes about 1/H of it. The plan is
 *    a function of the holdings' structure only: every rank that decodes it sees the same.
 * The plan, or the planner's error, is then broadcast (ckptio__plan_encode): every rank learns
 * its assignments, or every rank raises the same error, before any byte is written.
 *
 * Planning is O(M log M) in the total number M of items, memory O(M) (about 100 bytes per item
 * besides the decoded holdings). The broadcast plan holds 24 bytes per assigned piece (the
 * distinct boxes, plus the extra slabs of split ones) and its header: all ranks' assignments,
 * so that there is one broadcast; it grows with the checkpoint's pieces, not with N x holdings. */

#define CKPTIO__HOLD_RANK_LOCAL 1u
#define CKPTIO__HOLD_FLAGS 1u /* every flag defined */

/* Replicated boxes smaller than 2 slabs are written whole by one holder. */
#define CKPTIO__PLAN_MIN_SLAB (4ull << 20)

/* One item a rank holds. */
typedef struct ckptio__hold {
    const char *name; /* UTF-8, no NUL; NUL-terminated when decoded */
    uint32_t name_len;
    uint32_t dtype; /* CKPTIO_DT_* */
    uint32_t ndim;
    uint32_t flags;        /* CKPTIO__HOLD_* */
    const uint64_t *shape; /* global shape, ndim entries */
    const uint64_t *offset; /* the box's offset, ndim entries */
    const uint64_t *box;   /* the box's shape, ndim entries */
    uint64_t nbytes;       /* volume(box) * dtype size */
    uint64_t hash;         /* XXH3-64 of the box's bytes, row-major (ckptio__hash), or 0:
                            * ckptio_save_dist compares replicas after writing instead */
} ckptio__hold;

/* One rank's holdings, decoded: items and their dims and names in one arena. A rank that failed
 * before planning (an invalid item, a hash it could not compute) sends its error instead:
 * code < 0 and msg, with no items. */
typedef struct ckptio__holdings {
    uint64_t n;
    ckptio__hold *items;
    int code;
    uint32_t flags;  /* with code < 0: CKPTIO_ERROR_REFUSED when the rank refused to take part */
    const char *msg; /* "" unless code < 0 */
} ckptio__holdings;

/* Check items (names, dtypes, ndim, box inside shape, nbytes = box volume x dtype size: the
 * same rules as decode) and encode them into out (replacing its contents). Errors name the
 * item and its tensor: CKPTIO_E_USAGE, _DTYPE, _SHAPE, _RANGE, _LIMIT, or -ENOMEM. */
CKPTIO__HIDDEN int ckptio__holdings_encode(const ckptio__hold *items, size_t n, ckptio_bytes *out,
                                           char *err, size_t errlen);
/* Encode a rank's failure (code < 0, msg may be NULL; flags: CKPTIO_ERROR_REFUSED when it
 * refused, ckptio_save_dist_refuse) in place of its holdings. */
CKPTIO__HIDDEN int ckptio__holdings_encode_error(int code, const char *msg, uint32_t flags,
                                                 ckptio_bytes *out);
/* Parse and check `len` bytes. On success *out is one allocation (free with
 * ckptio__holdings_free); on failure CKPTIO_E_CORRUPT (or _LIMIT, -ENOMEM) with the reason in
 * err. Never reads outside buf; allocates at most about 3 x len + a constant. */
CKPTIO__HIDDEN int ckptio__holdings_decode(const uint8_t *buf, uint64_t len,
                                           ckptio__holdings **out, char *err, size_t errlen);
CKPTIO__HIDDEN void ckptio__holdings_free(ckptio__holdings *h);

/* One piece a rank writes: rows [start, start + rows) along dimension 0 of the box of its item
 * number `item` (the whole box when rows equals the box's first dimension; start = rows = 0
 * for a scalar). */
typedef struct ckptio__assign {
    uint32_t rank;
    uint32_t item;
    uint64_t start;
    uint64_t rows;
} ckptio__assign;

/* The coordinator's plan. Assignments are sorted by rank, then item, then start. */
typedef struct ckptio__plan {
    uint32_t nranks;
    uint64_t n_assign;
    ckptio__assign *assign;
    uint64_t *rank_bytes; /* nranks entries: bytes each rank is to write */
    uint64_t tensors;     /* distinct stored names */
    /* Replica groups (boxes held by more than one rank), for the checks a cached plan still
     * makes: members rep[rep_first[g] .. rep_first[g + 1]) as (rank, item) pairs. */
    uint64_t n_rep;
    uint64_t *rep_first; /* n_rep + 1 entries */
    uint32_t *rep;       /* 2 entries per member: rank, item */
    uint64_t *rep_slabs; /* n_rep entries: the slabs each group is written as (1: whole) */
} ckptio__plan;

/* Plans are cached while the structure of what the ranks hold (everything but the hashes) does
 * not change: a save of the same tree skips grouping, agreement, tiling and assignment, and
 * only compares the replicas' hashes again. Zero-initialize; free with ckptio__plan_cache_free.
 * `hits` counts plans served from the cache. */
typedef struct ckptio__plan_cache {
    ckptio__plan *plan;
    uint8_t *key; /* the structure the plan was made for */
    uint64_t key_len;
    uint64_t hits;
} ckptio__plan_cache;

/* Plan over the holdings of ranks 0 .. nranks-1 (`ranks[r]` from rank r). A rank that sent an
 * error (one that failed, or refused: ckptio_save_dist_refuse) makes the plan fail with its code
 * and "rank R: <its message>". On failure `blame` (may be NULL) says who, as values: rank R for
 * a rank's own error or a box listed twice; the two ranks named (rank, other_rank, in the
 * message's order) for a disagreement, an overlap or diverging replicas; and the tensor's
 * stored name, with no rank for a hole. On success *out points
 * at the plan, owned by `cache` (valid until the cache's next use or free). On failure the
 * code and a one-line message in err; the cache keeps its previous plan only if the structure
 * was the same (only hashes differed). */
CKPTIO__HIDDEN int ckptio__plan_make(ckptio__plan_cache *cache,
                                     const ckptio__holdings *const *ranks, uint32_t nranks,
                                     const ckptio__plan **out, char *err, size_t errlen,
                                     ckptio_error_info *blame);
CKPTIO__HIDDEN void ckptio__plan_cache_free(ckptio__plan_cache *cache);

/* What the coordinator broadcasts: the plan (code 0) or the error every rank is to raise
 * (code < 0, msg, and blame's rank, other_rank and tensor, may be NULL; plan may be NULL).
 * Replaces out's contents. */
CKPTIO__HIDDEN int ckptio__plan_encode(const ckptio__plan *plan, int code, const char *msg,
                                       const ckptio_error_info *blame, ckptio_bytes *out);
/* Rank `rank`'s share of an encoded plan, checked against its own holdings `mine` (item
 * indices, row ranges): its assignments are appended to `out` (a vec of ckptio__assign).
 * Returns the plan's code: 0, or the coordinator's error with its message in err and who is
 * to blame in `blame` (may be NULL); or
 * CKPTIO_E_CORRUPT for bytes that are no valid plan for these holdings. */
CKPTIO__HIDDEN int ckptio__plan_decode_rank(const uint8_t *buf, uint64_t len, uint32_t rank,
                                            const ckptio__holdings *mine, ckptio__vec *out,
                                            char *err, size_t errlen, ckptio_error_info *blame);

/* One of a rank's items that other ranks hold too, and the number of slabs k it is written
 * as: slab j is rows [rows * j / k, rows * (j + 1) / k) of its box along dimension 0 (the
 * whole box when k is 1). Every holder hashes the slabs it does not write, after planning,
 * so that the coordinator can compare replicas with the writer's block checksums. */
typedef struct ckptio__replica {
    uint32_t item;
    uint64_t slabs;
} ckptio__replica;

/* Rank `rank`'s replicated items in an encoded plan (16 bytes per holder of a replicated box,
 * after the assignments), checked against its holdings, appended to `out` (a vec of
 * ckptio__replica). 0, or CKPTIO_E_CORRUPT. */
CKPTIO__HIDDEN int ckptio__plan_decode_replicas(const uint8_t *buf, uint64_t len, uint32_t rank,
                                                const ckptio__holdings *mine, ckptio__vec *out,
                                                char *err, size_t errlen);

/* The code an encoded plan carries (0, or the coordinator's error, the same for every rank), or
 * 1 when the bytes are no plan at all. */
CKPTIO__HIDDEN int ckptio__plan_status(const uint8_t *buf, uint64_t len);

/* The name rank `rank` stores rank-local item `name` under ("<name>@rank<R>"), into buf;
 * returns its length, or 0 when it does not fit in cap - 1 bytes. */
CKPTIO__HIDDEN size_t ckptio__rank_local_name(char *buf, size_t cap, const char *name,
                                              size_t name_len, uint32_t rank);

#endif
