/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the communicators: the single-rank one, the in-process group, agree and faults. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "../src/ranks/comm.h"
#include "test.h"

/* --- running one function on every rank of a local group, one thread each ----------------- */

typedef int (*rank_fn)(const ckptio_comm *c, void *arg);

typedef struct rank_job {
    const ckptio_comm *c;
    rank_fn fn;
    void *arg;
    int result;
} rank_job;

static void *rank_main(void *p)
{
    rank_job *j = p;
    j->result = j->fn(j->c, j->arg);
    return NULL;
}

/* Run fn on every rank; 0 if every rank returned 0. `setup` may inject faults first. */
static int run_group(int32_t n, rank_fn fn, void *arg, void (*setup)(ckptio__comm_local *))
{
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, n));
    if (setup) setup(g);
    rank_job jobs[16];
    pthread_t th[16];
    CHECK(n <= 16);
    for (int32_t r = 0; r < n; r++) {
        jobs[r] = (rank_job){ckptio__comm_local_rank(g, r), fn, arg, -1};
        CHECK(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0);
    }
    int bad = 0;
    for (int32_t r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].result != 0) {
            fprintf(stderr, "rank %d of %d failed\n", r, n);
            bad = 1;
        }
    }
    ckptio__comm_local_free(g);
    return bad;
}

/* --- the operations on 1, 2, 4, 8 ranks ---------------------------------------------------- */

/* Rank r's message in round k: lengths 0..10, some empty, contents from (r, k). */
static size_t msg_len(int32_t r, int k)
{
    return (r + k) % 3 == 0 ? 0 : (size_t)(r * 7 + k * 3) % 11;
}

static int exchange_rounds(const ckptio_comm *c, void *arg)
{
    CKPTIO__UNUSED(arg);
    int32_t n = c->nranks, me = c->rank;
    ckptio_bytes out = CKPTIO_BYTES_INIT, buf = CKPTIO_BYTES_INIT;
    uint64_t lens[16];
    unsigned char mine[16], want[16];
    for (int k = 0; k < 12; k++) {
        int32_t root = k % n;
        t_fill(mine, sizeof mine, (uint64_t)me * 1000 + (uint64_t)k);
        CHECK_OK(ckptio_comm_gather(c, root, mine, msg_len(me, k), &out, lens, 5.0));
        if (me == root) {
            size_t at = 0;
            for (int32_t i = 0; i < n; i++) {
                CHECK(lens[i] == msg_len(i, k));
                t_fill(want, sizeof want, (uint64_t)i * 1000 + (uint64_t)k);
                CHECK(lens[i] == 0 || memcmp((unsigned char *)out.data + at, want, lens[i]) == 0);
                at += lens[i];
            }
            CHECK(at == out.len);
        }
        /* Non-roots start with stale bytes of another length: the broadcast must replace them. */
        size_t blen = (size_t)(k * 5) % 9;
        if (me == root) {
            CHECK_OK(ckptio_bytes_resize(&buf, blen));
            t_fill(buf.data, blen, 77 + (uint64_t)k);
        } else {
            CHECK_OK(ckptio_bytes_set(&buf, "stale-bytes", 11));
        }
        CHECK_OK(ckptio_comm_broadcast(c, root, &buf, 5.0));
        t_fill(want, sizeof want, 77 + (uint64_t)k);
        CHECK(buf.len == blen && (blen == 0 || memcmp(buf.data, want, blen) == 0));
        CHECK_OK(ckptio_comm_barrier(c, 5.0));
    }
    CHECK(ckptio_comm_agree(c, 0, NULL, 5.0) == 0);
    /* Two ranks fail; every rank gets the lower one's code and message. */
    int32_t first = n / 2, second = n - 1;
    char msg[64];
    snprintf(msg, sizeof msg, "disk full under rank %d", me);
    int code = me == first ? -ENOSPC : me == second ? -EIO : 0;
    CHECK_ERR(ckptio_comm_agree(c, code, code ? msg : NULL, 5.0), -ENOSPC);
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d of %d: disk full under rank %d", first, n, first);
    if (!t_contains(ckptio_last_error(), expect)) {
        fprintf(stderr, "rank %d: last error \"%s\"\n", me, ckptio_last_error());
        return 1;
    }
    ckptio_bytes_free(&out);
    ckptio_bytes_free(&buf);
    return 0;
}

static int test_local_ranks(void)
{
    for (int32_t n = 1; n <= 8; n *= 2) {
        fprintf(stderr, "%d ranks\n", n);
        CHECK(run_group(n, exchange_rounds, NULL, NULL) == 0);
    }
    return 0;
}

static int test_single(void)
{
    ckptio_comm *c = NULL;
    CHECK_OK(ckptio_comm_single(&c));
    CHECK(c->rank == 0 && c->nranks == 1);
    CHECK(exchange_rounds(c, NULL) == 0);
    ckptio_comm_free(c);
    ckptio_comm_free(NULL);
    return 0;
}

/* --- faults -------------------------------------------------------------------------------- */

/* `absent` skips the barrier (a rank that never arrives); the others time out, and from then on
 * every operation on every rank fails at once, the absent rank's included. */
static int32_t absent;
static atomic_int gave_up; /* ranks that saw the timeout */

static int missing_barrier(const ckptio_comm *c, void *arg)
{
    CKPTIO__UNUSED(arg);
    if (c->rank != absent) {
        CHECK_ERR(ckptio_comm_barrier(c, 0.5), -ETIMEDOUT);
        CHECK(t_contains(ckptio_last_error(), "did not all arrive within 0.5 s"));
        atomic_fetch_add(&gave_up, 1);
    }
    /* The absent rank comes once the others gave up; a long timeout that must not be waited
     * for, since the group is broken now. */
    while (atomic_load(&gave_up) < c->nranks - 1) sched_yield();
    CHECK_ERR(ckptio_comm_barrier(c, 30.0), -ETIMEDOUT);
    CHECK_ERR(ckptio_comm_agree(c, 0, NULL, 30.0), -ETIMEDOUT);
    return 0;
}

static int missing_agree(const ckptio_comm *c, void *arg)
{
    CKPTIO__UNUSED(arg);
    CHECK_OK(ckptio_comm_barrier(c, 5.0));
    if (c->rank == absent) return 0;
    /* No rank may read success when one never reported. */
    CHECK_ERR(ckptio_comm_agree(c, 0, NULL, 0.5), -ETIMEDOUT);
    CHECK(t_contains(ckptio_last_error(), "agree (timeout 0.5 s) found no common result"));
    return 0;
}

static int test_local_missing_rank(void)
{
    int32_t who[] = {0, 2, 3};
    for (size_t i = 0; i < 3; i++) {
        absent = who[i];
        atomic_store(&gave_up, 0);
        CHECK(run_group(4, missing_barrier, NULL, NULL) == 0);
        CHECK(run_group(4, missing_agree, NULL, NULL) == 0);
    }
    return 0;
}

/* Rank 1 dies at its third operation: the others, in long-timeout operations, fail at once with
 * -ECONNRESET (the test's own time limit would catch a wait for the 60 s). */
static void kill_rank1(ckptio__comm_local *g)
{
    ckptio__comm_local_kill_at(g, 1, 2);
}

static int dead_rank(const ckptio_comm *c, void *arg)
{
    CKPTIO__UNUSED(arg);
    CHECK_OK(ckptio_comm_barrier(c, 60.0));
    CHECK_OK(ckptio_comm_barrier(c, 60.0));
    int rc = ckptio_comm_barrier(c, 60.0);
    if (rc == 0) rc = ckptio_comm_agree(c, 0, NULL, 60.0); /* the dead rank may come last */
    CHECK_ERR(rc, -ECONNRESET);
    return 0;
}

static int test_local_dead_rank(void)
{
    return run_group(4, dead_rank, NULL, kill_rank1);
}

/* Ranks that disagree on the sequence of operations all get CKPTIO_E_USAGE, none hangs. */
static int mismatched(const ckptio_comm *c, void *arg)
{
    CKPTIO__UNUSED(arg);
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    int rc = c->rank == 0 ? ckptio_comm_barrier(c, 60.0) : ckptio_comm_broadcast(c, 0, &b, 60.0);
    CHECK_ERR(rc, CKPTIO_E_USAGE);
    ckptio_bytes_free(&b);
    return 0;
}

static int test_local_mismatch(void)
{
    return run_group(4, mismatched, NULL, NULL);
}

/* --- the checked entry points -------------------------------------------------------------- */

static int bad_gather(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                      uint64_t *lens, double timeout)
{
    CKPTIO__UNUSED(ctx), CKPTIO__UNUSED(root), CKPTIO__UNUSED(timeout);
    CKPTIO__TRY(ckptio_bytes_set(out, data, len));
    lens[0] = len + 1; /* lies about the length */
    return 0;
}

static int positive_barrier(void *ctx, double timeout)
{
    CKPTIO__UNUSED(ctx), CKPTIO__UNUSED(timeout);
    return 1;
}

static int test_checks(void)
{
    ckptio_comm *s = NULL;
    CHECK_OK(ckptio_comm_single(&s));
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    uint64_t lens[1];
    CHECK_ERR(ckptio_comm_barrier(NULL, 1.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_barrier(s, 0.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_barrier(s, -1.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_barrier(s, NAN), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_broadcast(s, 1, &b, 1.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_gather(s, -1, "x", 1, &b, lens, 1.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_gather(s, 0, "x", 1, NULL, lens, 1.0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_comm_agree(s, 5, NULL, 1.0), CKPTIO_E_USAGE);

    /* A caller-made table: too small a size, a lying gather, a positive return. */
    ckptio_comm t = *s;
    t.release = NULL;
    t.size = 8;
    CHECK_ERR(ckptio_comm_barrier(&t, 1.0), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "size = sizeof(ckptio_comm)"));
    t.size = sizeof t;
    t.gather = bad_gather;
    CHECK_ERR(ckptio_comm_gather(&t, 0, "abc", 3, &b, lens, 1.0), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "fix its gather callback"));
    t.barrier = positive_barrier;
    CHECK_ERR(ckptio_comm_barrier(&t, 1.0), CKPTIO_E_USAGE);
    t.rank = 1;
    CHECK_ERR(ckptio_comm_barrier(&t, 1.0), CKPTIO_E_USAGE);
    ckptio_comm_free(&t); /* release NULL: left alone */

    CHECK_OK(ckptio_bytes_set(&b, NULL, 0));
    CHECK(b.len == 0);
    ckptio_bytes_free(&b);
    ckptio_bytes_free(NULL);
    ckptio_comm_free(s);
    return 0;
}

const ckptio_test tests_comm[] = {
    {"comm/single", test_single, 0, 20},
    {"comm/checks", test_checks, 0, 20},
    {"comm/local_ranks", test_local_ranks, 0, 30},
    {"comm/local_missing_rank", test_local_missing_rank, 0, 30},
    {"comm/local_dead_rank", test_local_dead_rank, 0, 20},
    {"comm/local_mismatch", test_local_mismatch, 0, 20},
    {0},
};
