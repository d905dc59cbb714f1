/* SPDX-License-Identifier: Apache-2.0 */
/* Async saves on the C engine: the host-buffer pool, snapshots, background saves, errors, fork. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CKPTIO_EXPERIMENTAL
#include "../src/ranks/comm.h"
#include "../src/io/vfs.h"
#include "../src/write/pool.h"
#include "test.h"

#define MiB (1ull << 20)

/* test_async.c's vfs: fsync blocks while the gate is shut, then fails with `err` (0: passes). */
void gate_install(int open, int err);
void gate_release(void);
int fsyncs_seen(void);

/* A state of tensors: "a" (rows x 4096 u8), "b" (1-D u8), "empty" (0 x 3 f32), "s" (f64
 * scalar), host memory filled from `seed`. */
typedef struct state {
    uint64_t a_shape[2], b_shape[1], e_shape[2];
    unsigned char *a, *b;
    double s;
    uint64_t an, bn;
    ckptio_dist_item it[4];
} state;

static void state_make(state *st, uint64_t a_rows, uint64_t bn, uint64_t seed)
{
    memset(st, 0, sizeof *st);
    st->a_shape[0] = a_rows;
    st->a_shape[1] = 4096;
    st->an = a_rows * 4096;
    st->bn = bn;
    st->b_shape[0] = bn;
    st->e_shape[0] = 0;
    st->e_shape[1] = 3;
    st->a = t_alloc(st->an);
    st->b = t_alloc(bn);
    t_fill(st->a, st->an, seed);
    t_fill(st->b, bn, seed + 1);
    st->s = 3.25 + (double)seed;
    ckptio_dist_item base = {.size = sizeof base};
    st->it[0] = base;
    st->it[0].name = "a";
    st->it[0].dtype = CKPTIO_DT_U8;
    st->it[0].ndim = 2;
    st->it[0].shape = st->a_shape;
    st->it[0].data = st->a;
    st->it[0].nbytes = st->an;
    st->it[1] = base;
    st->it[1].name = "b";
    st->it[1].dtype = CKPTIO_DT_U8;
    st->it[1].ndim = 1;
    st->it[1].shape = st->b_shape;
    st->it[1].data = st->b;
    st->it[1].nbytes = bn;
    st->it[2] = base;
    st->it[2].name = "empty";
    st->it[2].dtype = CKPTIO_DT_F32;
    st->it[2].ndim = 2;
    st->it[2].shape = st->e_shape;
    st->it[3] = base;
    st->it[3].name = "s";
    st->it[3].dtype = CKPTIO_DT_F64;
    st->it[3].data = &st->s;
    st->it[3].nbytes = 8;
}

static void state_free(state *st)
{
    t_free(st->a, st->an);
    t_free(st->b, st->bn);
}

/* The checkpoint at `path` holds the state made from `seed`. */
static int check_state(const char *path, uint64_t a_rows, uint64_t bn, uint64_t seed)
{
    state want;
    state_make(&want, a_rows, bn, seed);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    CHECK(ckptio_reader_num_tensors(r) == 4);
    unsigned char *a = t_alloc(want.an), *b = t_alloc(bn);
    double s = 0;
    CHECK_OK(ckptio_reader_read_tensor(r, "a", a, want.an));
    CHECK_OK(ckptio_reader_read_tensor(r, "b", b, bn));
    CHECK_OK(ckptio_reader_read_tensor(r, "s", &s, 8));
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "step", &v, &len));
    CHECK(len == 2 && !memcmp(v, "10", 2));
    CHECK(!memcmp(a, want.a, want.an));
    CHECK(!memcmp(b, want.b, bn));
    CHECK(s == want.s);
    int64_t e = ckptio_reader_find(r, "empty");
    CHECK(e >= 0);
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, (size_t)e, &ti));
    CHECK(ti.nbytes == 0 && ti.ndim == 2 && ti.shape[1] == 3);
    ckptio_reader_close(r);
    t_free(a, want.an);
    t_free(b, bn);
    state_free(&want);
    return 0;
}

static ckptio_pool *pool_make(uint64_t cap)
{
    ckptio_pool_params pp;
    ckptio_pool_params_init(&pp);
    pp.pinned = CKPTIO_OFF;
    pp.max_bytes = cap;
    ckptio_pool *pool = NULL;
    if (ckptio_pool_new(&pool, &pp) < 0) return NULL;
    return pool;
}

/* A plain pool of `cap` bytes and a state to save into it. */
static ckptio_pool *begin(uint64_t cap, state *st, uint64_t a_rows, uint64_t bn, uint64_t seed)
{
    state_make(st, a_rows, bn, seed);
    return pool_make(cap);
}

static ckptio_pool_usage usage(const ckptio_pool *pool)
{
    ckptio_pool_usage u = {.size = sizeof u};
    if (ckptio_pool_stats(pool, &u) < 0) memset(&u, 0xff, sizeof u);
    return u;
}

/* Snapshot `st` into `pool` (writing through a writer for `path` what does not fit), then
 * change the caller's tensors, and start the background commit. */
static int save_async(ckptio_pool *pool, state *st, const char *path, ckptio_completion **c,
                      ckptio_take_stats *ts)
{
    ckptio_writer *w;
    ckptio_params p;
    ckptio_params_init(&p);
    p.staging_bytes = 4 * MiB;
    CHECK_OK(ckptio_writer_open(&w, path, &p));
    ckptio_snapshot *s;
    int rc = ckptio_snapshot_take(&s, pool, st->it, 4, w);
    if (rc < 0) {
        ckptio_writer_close(w);
        return rc;
    }
    if (ts) {
        ts->size = sizeof *ts;
        CHECK_OK(ckptio_snapshot_stats(s, ts));
    }
    /* The snapshot holds the values as they were: the caller may change its tensors now. */
    memset(st->a, 0xee, st->an);
    memset(st->b, 0xee, st->bn);
    st->s = -1;
    CHECK_OK(ckptio_writer_set_meta(w, "step", "10", 2));
    CHECK_OK(ckptio_snapshot_commit_async(s, w, c));
    return 0;
}

/* Every tensor copied into exact-size buffers and committed in the background; once wait has
 * returned, every buffer is back in the pool (idle) and the pool holds exactly the copies. */
static int test_pool_round_trip(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, 3 * MiB + 5, 1);
    CHECK(pool);
    ckptio_completion *c;
    ckptio_take_stats ts;
    CHECK(save_async(pool, &st, t_path("ck"), &c, &ts) == 0);
    CHECK(ts.copied_bytes == st.an + st.bn + 8 && ts.written_bytes == 0 && ts.split == 0);
    CHECK(ts.allocations == 3); /* a, b, s: nothing for the empty tensor */
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_pool_usage u = usage(pool);
    CHECK(u.lent == 0 && u.held == st.an + st.bn + 8 && u.buffers == 3 && !u.pinned);
    CHECK(t_contains(u.reason, "OFF"));
    ckptio_completion_free(c);
    CHECK(check_state(t_path("ck"), 16, 3 * MiB + 5, 1) == 0);
    CHECK(ckptio_pool_release(pool) == st.an + st.bn + 8);
    CHECK(usage(pool).held == 0);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* The same state saved twice: the second snapshot reuses every buffer and makes none. */
static int test_pool_reuse(void)
{
    ckptio_pool *pool = pool_make(64 * MiB);
    CHECK(pool);
    for (int i = 0; i < 3; i++) {
        state st;
        state_make(&st, 16, 2 * MiB, 7 + (uint64_t)i);
        char name[16];
        snprintf(name, sizeof name, "ck%d", i);
        ckptio_completion *c;
        ckptio_take_stats ts;
        CHECK(save_async(pool, &st, t_path(name), &c, &ts) == 0);
        CHECK(ts.allocations == (i == 0 ? 3u : 0u));
        CHECK_OK(ckptio_completion_wait(c, 60));
        ckptio_completion_free(c);
        CHECK(usage(pool).allocations == 3 && usage(pool).held == st.an + st.bn + 8);
        CHECK(check_state(t_path(name), 16, 2 * MiB, 7 + (uint64_t)i) == 0);
        state_free(&st);
    }
    ckptio_pool_free(pool);
    return 0;
}

/* Under a cap: "a" (8 MiB) fits whole, "b" (16 x 1 MiB rows) only in part: its first rows are
 * copied, the rest written during the call; a tensor with no room left at all is written
 * whole. The pool never holds more than its cap, and the checkpoint is whole. */
static int test_pool_cap_split(void)
{
    uint64_t cap = 8 * MiB + 5 * MiB + MiB / 2;
    ckptio_pool *pool = pool_make(cap);
    CHECK(pool);
    state st;
    state_make(&st, 2048, 16 * MiB, 3); /* a: 8 MiB, b: 16 MiB, s: 8 bytes */
    uint64_t b_shape_2d[2] = {16, MiB};
    st.it[1].ndim = 2;
    st.it[1].shape = b_shape_2d;
    ckptio_completion *c;
    ckptio_take_stats ts;
    CHECK(save_async(pool, &st, t_path("ck"), &c, &ts) == 0);
    CHECK(ts.split == 1);
    CHECK(ts.copied_bytes == 8 * MiB + 5 * MiB + 8);
    CHECK(ts.written_bytes == 11 * MiB);
    CHECK(usage(pool).held <= cap);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, (size_t)ckptio_reader_find(r, "b"), &ti));
    CHECK(ti.num_chunks == 2);
    ckptio_reader_close(r);
    state want;
    state_make(&want, 2048, 16 * MiB, 3);
    unsigned char *got = t_alloc(16 * MiB);
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(r, "b", got, 16 * MiB));
    CHECK(!memcmp(got, want.b, 16 * MiB));
    CHECK_OK(ckptio_reader_read_tensor(r, "a", got, want.an));
    CHECK(!memcmp(got, want.a, want.an));
    ckptio_reader_close(r);
    t_free(got, 16 * MiB);
    state_free(&want);

    /* A cap below 1 MiB: nothing splits, everything but the scalar is written now; a second
     * save after lowering the cap frees idle buffers rather than passing it. */
    CHECK_OK(ckptio_pool_set_max_bytes(pool, MiB / 2));
    state st2;
    state_make(&st2, 2048, 16 * MiB, 4);
    CHECK(save_async(pool, &st2, t_path("ck2"), &c, &ts) == 0);
    CHECK(ts.split == 0 && ts.copied_bytes == 8 && ts.written_bytes == 24 * MiB);
    CHECK(usage(pool).held <= MiB / 2);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    CHECK(check_state(t_path("ck2"), 2048, 16 * MiB, 4) == 0);
    state_free(&st2);
    state_free(&st);
    ckptio_pool_free(pool);
    return 0;
}

/* Without a writer (a multi-rank save) what does not fit is refused before anything is lent. */
static int test_pool_cap_no_writer(void)
{
    state st;
    ckptio_pool *pool = begin(2 * MiB, &st, 16, 4 * MiB, 5);
    CHECK(pool);
    ckptio_snapshot *s = (ckptio_snapshot *)&s;
    CHECK_ERR(ckptio_snapshot_take(&s, pool, st.it, 4, NULL), CKPTIO_E_LIMIT);
    CHECK(s == NULL);
    CHECK(t_contains(ckptio_last_error(), "'b'"));
    ckptio_pool_usage u = usage(pool);
    CHECK(u.lent == 0 && u.held == 0);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* A buffer that cannot be made fails the take with -ENOMEM and lends nothing; the buffers made
 * before it stay idle, counted, and the next take reuses them. */
static int test_pool_alloc_failure(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, 2 * MiB, 6);
    CHECK(pool);
    ckptio__pool_fail_alloc_at = 2;
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    ckptio_snapshot *s;
    CHECK_ERR(ckptio_snapshot_take(&s, pool, st.it, 4, w), -ENOMEM);
    CHECK(t_contains(ckptio_last_error(), "host buffer"));
    ckptio_pool_usage u = usage(pool);
    CHECK(u.lent == 0 && u.buffers == 1 && u.allocations == 1);
    uint64_t first = u.held;
    CHECK(first == st.an || first == st.bn || first == 8);
    CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, w));
    ckptio_take_stats ts = {.size = sizeof ts};
    CHECK_OK(ckptio_snapshot_stats(s, &ts));
    CHECK(ts.allocations == 2);
    CHECK(usage(pool).lent == st.an + st.bn + 8);
    /* A snapshot freed without a save gives its buffers back. */
    ckptio_snapshot_free(s);
    u = usage(pool);
    CHECK(u.lent == 0 && u.held == st.an + st.bn + 8);
    ckptio_writer_close(w);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* A commit that fails (the disk is full at fsync) reports its error on wait, and the buffers
 * are back in the pool before wait returns. */
static int test_pool_failed_commit(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, MiB, 8);
    CHECK(pool);
    gate_install(1, ENOSPC);
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("ck"), &c, NULL) == 0);
    CHECK_ERR(ckptio_completion_wait(c, 60), -ENOSPC);
    ckptio_pool_usage u = usage(pool);
    CHECK(u.lent == 0 && u.held == st.an + st.bn + 8);
    ckptio_completion_free(c);
    struct stat sb;
    CHECK(stat(t_path("ck"), &sb) < 0);
    ckptio__vfs_set(NULL);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* The error of a save nobody waited for is reported once, by the next take on the pool, which
 * then starts nothing; the take after it works. */
static int test_pool_unreported_error(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, MiB, 9);
    CHECK(pool);
    gate_install(1, ENOSPC);
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("ck"), &c, NULL) == 0);
    ckptio_completion_free(c); /* never waited for */
    ckptio__vfs_set(NULL);
    state_free(&st);
    state_make(&st, 16, MiB, 10);
    CHECK_ERR(save_async(pool, &st, t_path("ck2"), &c, NULL), -ENOSPC);
    CHECK(t_contains(ckptio_last_error(), "nobody waited"));
    CHECK(usage(pool).lent == 0);
    /* Still failing and not waited for, but not freed: the next take waits for it. */
    gate_install(1, EIO);
    CHECK(save_async(pool, &st, t_path("ck2"), &c, NULL) == 0);
    state_free(&st);
    state_make(&st, 16, MiB, 11);
    ckptio_completion *c2;
    CHECK_ERR(save_async(pool, &st, t_path("ck3"), &c2, NULL), -EIO);
    CHECK_ERR(ckptio_completion_wait(c, 0), -EIO); /* still the completion's own result */
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    state_free(&st);
    state_make(&st, 16, MiB, 12);
    CHECK(save_async(pool, &st, t_path("ck3"), &c, NULL) == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    CHECK(check_state(t_path("ck3"), 16, MiB, 12) == 0);
    state_free(&st);
    ckptio_pool_free(pool);
    return 0;
}

/* In a child forked with a save in flight: the parent's completion reports CKPTIO_E_STATE at
 * once (one that had finished, its result) and is freed without joining the parent's thread;
 * the child's own save works, on copy threads of its own; the parent's save completes. */
static int child_after_fork(ckptio_pool *pool, ckptio_completion *parents, uint64_t seed,
                            int want)
{
    CHECK(ckptio_completion_done(parents) == 1); /* never left waiting on the parent */
    CHECK_ERR(ckptio_completion_wait(parents, -1), want);
    if (want) CHECK(t_contains(ckptio_last_error(), "parent"));
    ckptio_pool_usage u = usage(pool);
    CHECK(u.lent == 0);
    ckptio__vfs_set(NULL);
    state st;
    state_make(&st, 4096, 48 * MiB, seed); /* 16 MiB + 48 MiB: copied on the copy threads */
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("child"), &c, NULL) == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    ckptio_completion_free(parents); /* the parent's: forgotten, never joined */
    CHECK(check_state(t_path("child"), 4096, 48 * MiB, seed) == 0);
    state_free(&st);
    ckptio_pool_free(pool);
    return 0;
}

static int run_child(ckptio_pool *pool, ckptio_completion *parents, uint64_t seed, int want)
{
#if defined(__SANITIZE_THREAD__)
    /* TSan cannot follow a child of a threaded process that starts threads (the child's save
     * does): ASan and the plain build run these. */
    (void)pool, (void)parents, (void)seed, (void)want;
    printf("skipped under TSan\n");
    return T_SKIP;
#endif
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(child_after_fork(pool, parents, seed, want));
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}

static int test_pool_fork_in_flight(void)
{
    int rc;
    state st;
    ckptio_pool *pool = begin(256 * MiB, &st, 16, MiB, 13);
    CHECK(pool);
    gate_install(0, 0);
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("parent"), &c, NULL) == 0);
    while (fsyncs_seen() == 0) usleep(1000); /* the commit is inside its first fsync */
    CHECK(usage(pool).lent > 0);
    rc = run_child(pool, c, 14, CKPTIO_E_STATE);
    CHECK(rc == 0 || rc == T_SKIP);
    gate_release();
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    CHECK(check_state(t_path("parent"), 16, MiB, 13) == 0);
    state_free(&st);
    ckptio_pool_free(pool);
    return rc; /* T_SKIP where the child could not run */
}

/* After a finished save large enough to start the copy threads, a forked child's save (on
 * those threads, which it does not have) works. */
static int test_pool_fork_after(void)
{
    state st;
    ckptio_pool *pool = begin(256 * MiB, &st, 4096, 48 * MiB, 15);
    CHECK(pool);
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("parent"), &c, NULL) == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    int rc = run_child(pool, c, 16, 0); /* the parent's finished completion, not yet freed */
    CHECK(rc == 0 || rc == T_SKIP);
    ckptio_completion_free(c);
    CHECK(check_state(t_path("parent"), 4096, 48 * MiB, 15) == 0);
    /* The parent's pool still works, and reuses its buffers. */
    state_free(&st);
    state_make(&st, 4096, 48 * MiB, 17);
    ckptio_take_stats ts;
    CHECK(save_async(pool, &st, t_path("parent2"), &c, &ts) == 0);
    CHECK(ts.allocations == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    state_free(&st);
    ckptio_pool_free(pool);
    return rc; /* T_SKIP where the child could not run */
}

/* A multi-rank save (one rank here) from the pool's copies, in the background. */
static int test_pool_dist(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, MiB, 18);
    CHECK(pool);
    ckptio_snapshot *s;
    CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, NULL));
    const ckptio_dist_item *its;
    size_t n;
    CHECK_OK(ckptio_snapshot_items(s, &its, &n));
    CHECK(n == 4 && its[0].data != st.a && !memcmp(its[0].data, st.a, st.an));
    memset(st.a, 0, st.an);
    ckptio_comm *comm;
    CHECK_OK(ckptio_comm_single(&comm));
    const char *keys[] = {"step"};
    const void *vals[] = {"10"};
    size_t lens[] = {2};
    ckptio_completion *c;
    CHECK_OK(ckptio_snapshot_save_dist_async(s, t_path("ck"), comm, keys, vals, lens, 1, NULL,
                                             30, &c));
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_stats sst;
    CHECK_OK(ckptio_completion_stats(c, &sst));
    CHECK(sst.bytes == st.an + st.bn + 8);
    CHECK(usage(pool).lent == 0);
    ckptio_completion_free(c);
    ckptio_comm_free(comm);
    CHECK(check_state(t_path("ck"), 16, MiB, 18) == 0);
    state_free(&st);
    ckptio_pool_free(pool);
    return 0;
}

/* Two ranks (threads of one process) each snapshot their rows of "w" and a replica of "b",
 * change their tensors, and save together from their background threads. */
static int test_pool_dist_two_ranks(void)
{
    enum { ROWS = 128, COLS = 1024 };
    static float w[ROWS * COLS], want[ROWS * COLS];
    static unsigned char b[2][8192];
    t_fill(w, sizeof w, 21);
    memcpy(want, w, sizeof w);
    ckptio__comm_local *g;
    CHECK_OK(ckptio__comm_local_new(&g, 2));
    uint64_t wshape[2] = {ROWS, COLS}, bshape[1] = {8192}, box[2] = {ROWS / 2, COLS};
    uint64_t off[2][2] = {{0, 0}, {ROWS / 2, 0}};
    ckptio_pool *pools[2];
    ckptio_completion *c[2];
    for (int r = 0; r < 2; r++) {
        t_fill(b[r], sizeof b[r], 22); /* replicas hold the same bytes */
        pools[r] = pool_make(16 * MiB);
        CHECK(pools[r]);
        ckptio_dist_item its[2] = {
            {.size = sizeof its[0], .name = "w", .dtype = CKPTIO_DT_F32, .ndim = 2,
             .shape = wshape, .offset = off[r], .box = box, .data = w + (size_t)r * ROWS / 2 * COLS,
             .nbytes = sizeof w / 2},
            {.size = sizeof its[1], .name = "b", .dtype = CKPTIO_DT_U8, .ndim = 1,
             .shape = bshape, .data = b[r], .nbytes = sizeof b[r]},
        };
        ckptio_snapshot *s;
        CHECK_OK(ckptio_snapshot_take(&s, pools[r], its, 2, NULL));
        memset(b[r], 0, sizeof b[r]);
        CHECK_OK(ckptio_snapshot_save_dist_async(s, t_path("ck"), ckptio__comm_local_rank(g, r),
                                                 NULL, NULL, NULL, 0, NULL, 30, &c[r]));
    }
    memset(w, 0, sizeof w);
    for (int r = 0; r < 2; r++) {
        CHECK_OK(ckptio_completion_wait(c[r], 60));
        ckptio_completion_free(c[r]);
        CHECK(usage(pools[r]).lent == 0);
        ckptio_pool_free(pools[r]);
    }
    ckptio__comm_local_free(g);
    ckptio_reader *rd;
    CHECK_OK(ckptio_reader_open(&rd, t_path("ck"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", w, sizeof w));
    CHECK(!memcmp(w, want, sizeof w));
    unsigned char got[8192], ref[8192];
    t_fill(ref, sizeof ref, 22);
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", got, sizeof got));
    CHECK(!memcmp(got, ref, sizeof got));
    ckptio_reader_close(rd);
    return 0;
}

static int test_pool_usage_errors(void)
{
    ckptio_pool *pool = NULL;
    ckptio_pool_params pp;
    ckptio_pool_params_init(&pp);
    pp.pinned = 7;
    CHECK_ERR(ckptio_pool_new(&pool, &pp), CKPTIO_E_USAGE);
    CHECK(pool == NULL);
    pool = pool_make(MiB);
    CHECK(pool);
    ckptio_snapshot *s;
    ckptio_dist_item bad = {.size = sizeof bad, .name = "x", .dtype = CKPTIO_DT_F32, .ndim = 1};
    uint64_t shape[1] = {4};
    float data[4] = {1, 2, 3, 4};
    bad.shape = shape;
    bad.nbytes = 15;
    bad.data = data;
    CHECK_ERR(ckptio_snapshot_take(&s, pool, &bad, 1, NULL), CKPTIO_E_SHAPE);
    CHECK_ERR(ckptio_snapshot_take(NULL, pool, &bad, 1, NULL), CKPTIO_E_USAGE);
    CHECK(usage(pool).lent == 0 && usage(pool).held == 0);
    /* A pool outlives its user's free while a snapshot holds its buffers. */
    bad.nbytes = 16;
    CHECK_OK(ckptio_snapshot_take(&s, pool, &bad, 1, NULL));
    ckptio_pool_free(pool);
    ckptio_snapshot_free(s);
    ckptio_pool_free(NULL);
    ckptio_snapshot_free(NULL);
    return 0;
}

/* ---- a snapshot written as a zip archive (torch.save's layout) ---- */

/* The records of an archive of `st` (taken without a writer): a pickle given now, then the
 * items "a", "b", "empty", "s" by index, and a version string. */
static void zip_records(ckptio_zip_record rec[6])
{
    static const char *names[] = {"ar/data.pkl", "ar/data/0", "ar/data/1", "ar/data/2",
                                  "ar/data/3", "ar/version"};
    for (size_t i = 0; i < 6; i++) {
        rec[i] = (ckptio_zip_record){.size = sizeof rec[i], .name = names[i], .align = 4096,
                                     .item = i - 1};
    }
    rec[0].data = "pickle bytes";
    rec[0].len = 12;
    rec[0].align = 64;
    rec[5].data = "3\n";
    rec[5].len = 2;
}

/* Python's zipfile reads the archive at `path`: names in order, CRCs right, and each item
 * record holding the bytes of `want` (seed's state). */
static int zip_holds(const char *path, const state *want)
{
    CHECK(t_sh("python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
               "assert z.testzip() is None; got = \",\".join(z.namelist()); "
               "assert got == \"ar/data.pkl,ar/data/0,ar/data/1,ar/data/2,ar/data/3,"
               "ar/version\", got; assert z.read(\"ar/data.pkl\") == b\"pickle bytes\"; "
               "assert z.getinfo(\"ar/data/2\").file_size == 0' '%s'", path) == 0);
    unsigned char *f = NULL;
    long n = t_read_file(path, &f);
    CHECK(n > 0);
    CHECK(memmem(f, (size_t)n, want->a, want->an) && memmem(f, (size_t)n, want->b, want->bn));
    CHECK(memmem(f, (size_t)n, &want->s, 8));
    free(f);
    return 0;
}

/* The archive holds the tensors as they were at the take (the caller changes them at once),
 * the pool gets its buffers back, and the same pool then saves the next archive. */
static int test_pool_zip(void)
{
    state st, want;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, 3 * MiB + 5, 21);
    CHECK(pool);
    state_make(&want, 16, 3 * MiB + 5, 21);
    for (int round = 0; round < 2; round++) {
        ckptio_snapshot *s;
        CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, NULL));
        memset(st.a, 0xee, st.an);
        memset(st.b, 0xee, st.bn);
        ckptio_zip_writer *z;
        ckptio_params p;
        ckptio_params_init(&p);
        p.overwrite = 1;
        CHECK_OK(ckptio_zip_writer_open(&z, t_path("a.pt"), &p));
        ckptio_zip_record rec[6];
        zip_records(rec);
        ckptio_completion *c;
        CHECK_OK(ckptio_snapshot_zip_async(s, z, rec, 6, &c));
        rec[0].data = "changed"; /* the records were copied */
        CHECK_OK(ckptio_completion_wait(c, 60));
        ckptio_stats stats;
        CHECK_OK(ckptio_completion_stats(c, &stats));
        CHECK(stats.io_bytes >= st.an + st.bn + 8);
        CHECK(usage(pool).lent == 0 && usage(pool).held == st.an + st.bn + 8);
        ckptio_completion_free(c);
        CHECK(zip_holds(t_path("a.pt"), &want) == 0);
        state_free(&st);
        state_free(&want);
        state_make(&st, 16, 3 * MiB + 5, 22);
        state_make(&want, 16, 3 * MiB + 5, 22);
    }
    state_free(&st);
    state_free(&want);
    ckptio_pool_free(pool);
    return 0;
}

/* Records that name no item, a snapshot that wrote part of itself, NULLs: refused before
 * anything starts, the snapshot and the zip writer still the caller's. A write that fails in
 * the background is wait's error, and no file is published. */
static int test_pool_zip_errors(void)
{
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 16, MiB, 23);
    CHECK(pool);
    ckptio_snapshot *s;
    CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, NULL));
    ckptio_zip_writer *z;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("bad.pt"), NULL));
    ckptio_zip_record rec[6];
    zip_records(rec);
    ckptio_completion *c = (ckptio_completion *)&rec; /* set to NULL on failure */
    rec[3].item = 4;
    CHECK_ERR(ckptio_snapshot_zip_async(s, z, rec, 6, &c), CKPTIO_E_USAGE);
    CHECK(c == NULL && t_contains(ckptio_last_error(), "record 3 ('ar/data/2') reads item 4"));
    zip_records(rec);
    rec[2].name = "";
    CHECK_ERR(ckptio_snapshot_zip_async(s, z, rec, 6, &c), CKPTIO_E_USAGE);
    rec[2].name = "ar/data/1";
    rec[4].size = 8;
    CHECK_ERR(ckptio_snapshot_zip_async(s, z, rec, 6, &c), CKPTIO_E_USAGE);
    rec[4].size = sizeof rec[4];
    CHECK_ERR(ckptio_snapshot_zip_async(NULL, z, rec, 6, &c), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_snapshot_zip_async(s, z, NULL, 6, &c), CKPTIO_E_USAGE);
    CHECK(usage(pool).lent == st.an + st.bn + 8);
    /* Both still usable: the same call, right this time, but the disk fills. */
    gate_install(1, ENOSPC);
    CHECK_OK(ckptio_snapshot_zip_async(s, z, rec, 6, &c));
    CHECK_ERR(ckptio_completion_wait(c, 60), -ENOSPC);
    CHECK(t_contains(ckptio_last_error(), "bad.pt"));
    CHECK(usage(pool).lent == 0);
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    struct stat sb;
    CHECK(stat(t_path("bad.pt"), &sb) < 0);
    /* A snapshot that wrote what the cap could not hold has no whole items to give. */
    CHECK_OK(ckptio_pool_set_max_bytes(pool, 512 << 10)); /* "b" (1 MiB) is written */
    ckptio_writer *w;
    ckptio_params p;
    ckptio_params_init(&p);
    p.staging_bytes = 4 * MiB;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, w));
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("bad.pt"), NULL));
    CHECK_ERR(ckptio_snapshot_zip_async(s, z, rec, 6, &c), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "without a writer"));
    ckptio_zip_writer_close(z);
    ckptio_snapshot_free(s);
    ckptio_writer_close(w);
    CHECK(stat(t_path("bad.pt"), &sb) < 0);
    state_free(&st);
    ckptio_pool_free(pool);
    return 0;
}

/* A child forked while an archive is being written has no part in it (CKPTIO_E_STATE at
 * once, its free leaves the parent's zip writer and threads alone) and saves as any
 * process; the parent's archive is complete. */
static int test_pool_zip_fork_in_flight(void)
{
    state st, want;
    ckptio_pool *pool = begin(256 * MiB, &st, 16, MiB, 24);
    CHECK(pool);
    state_make(&want, 16, MiB, 24);
    gate_install(0, 0);
    ckptio_snapshot *s;
    CHECK_OK(ckptio_snapshot_take(&s, pool, st.it, 4, NULL));
    ckptio_zip_writer *z;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("a.pt"), NULL));
    ckptio_zip_record rec[6];
    zip_records(rec);
    ckptio_completion *c;
    CHECK_OK(ckptio_snapshot_zip_async(s, z, rec, 6, &c));
    while (fsyncs_seen() == 0) usleep(1000); /* the commit is inside its fsync */
    int rc = run_child(pool, c, 25, CKPTIO_E_STATE);
    CHECK(rc == 0 || rc == T_SKIP);
    gate_release();
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    CHECK(zip_holds(t_path("a.pt"), &want) == 0);
    state_free(&st);
    state_free(&want);
    ckptio_pool_free(pool);
    return rc; /* T_SKIP where the child could not run */
}

/* ---- GPU memory, against the stand-in driver (or a real GPU with CKPTIO_TEST_REAL_GPU=1) ---- */

static struct {
    int real;
    void *lib;
    void *(*malloc_)(size_t);
    void (*free_)(void *);
    void *(*stream)(void);
    void (*sync)(void *);
    int (*cuInit)(unsigned);
    int (*cuDeviceGet)(int *, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuMemAlloc)(unsigned long long *, size_t);
    int (*cuMemcpyHtoD)(unsigned long long, const void *, size_t);
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamSynchronize)(void *);
} G;

#define GSYM(f, name) *(void **)&G.f = dlsym(G.lib, name)

static int gpu_open(void)
{
    const char *real = getenv("CKPTIO_TEST_REAL_GPU");
    G.real = real && *real == '1';
    if (G.real) {
        G.lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!G.lib) return T_SKIP;
        GSYM(cuInit, "cuInit");
        GSYM(cuDeviceGet, "cuDeviceGet");
        GSYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        GSYM(cuCtxSetCurrent, "cuCtxSetCurrent");
        GSYM(cuMemAlloc, "cuMemAlloc_v2");
        GSYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
        GSYM(cuStreamCreate, "cuStreamCreate");
        GSYM(cuStreamSynchronize, "cuStreamSynchronize");
        int dev;
        void *ctx;
        if (G.cuInit(0) || G.cuDeviceGet(&dev, 0) || G.cuDevicePrimaryCtxRetain(&ctx, dev) ||
            G.cuCtxSetCurrent(ctx))
            return T_SKIP;
        return 0;
    }
    setenv("CKPTIO_CUDA_LIBRARY", CKPTIO_GPU_STANDIN, 1);
    G.lib = dlopen(CKPTIO_GPU_STANDIN, RTLD_NOW);
    CHECK(G.lib);
    GSYM(malloc_, "standin_malloc");
    GSYM(free_, "standin_free");
    GSYM(stream, "standin_stream");
    GSYM(sync, "standin_sync");
    return 0;
}

/* Device memory holding `src`'s n bytes. */
static void *gpu_copy_of(const void *src, size_t n)
{
    if (!G.real) {
        void *p = G.malloc_(n);
        if (p) memcpy(p, src, n);
        return p;
    }
    unsigned long long p = 0;
    if (G.cuMemAlloc(&p, n) || G.cuMemcpyHtoD(p, src, n)) return NULL;
    return (void *)(uintptr_t)p;
}

static void *gpu_stream(void)
{
    void *s = NULL;
    if (G.real) G.cuStreamCreate(&s, 1);
    else s = G.stream();
    return s;
}

/* Device tensors land straight in page-locked pool buffers; a failed device copy fails the
 * take and lends nothing. */
static int test_pool_gpu(void)
{
    setenv("CKPTIO_STANDIN_FAIL_COPY", "3", 1); /* read by the stand-in's cuInit */
    int rc = gpu_open();
    if (rc) return rc;
    ckptio_pool *pool;
    CHECK_OK(ckptio_pool_new(&pool, NULL)); /* AUTO: the driver is there */
    ckptio_pool_usage u = usage(pool);
    CHECK(u.pinned == 1 && u.reason[0] == '\0');
    state st;
    state_make(&st, 256, 3 * MiB, 19);
    void *da = gpu_copy_of(st.a, st.an), *db = gpu_copy_of(st.b, st.bn);
    CHECK(da && db);
    void *stream = gpu_stream();
    st.it[0].data = da;
    st.it[0].memory = CKPTIO_MEM_CUDA;
    st.it[0].stream = (uint64_t)(uintptr_t)stream;
    st.it[1].data = db;
    st.it[1].memory = CKPTIO_MEM_CUDA;
    ckptio_completion *c;
    ckptio_take_stats ts;
    CHECK(save_async(pool, &st, t_path("ck"), &c, &ts) == 0);
    CHECK(ts.device_bytes == st.an + st.bn && ts.written_bytes == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    u = usage(pool);
    CHECK(u.pinned_bytes == u.held && u.held == st.an + st.bn + 8 && u.lent == 0);
    CHECK(check_state(t_path("ck"), 256, 3 * MiB, 19) == 0);
    if (!G.real) { /* the third device copy, of this second take */
        ckptio_writer *w;
        CHECK_OK(ckptio_writer_open(&w, t_path("ck2"), NULL));
        ckptio_snapshot *s;
        CHECK_ERR(ckptio_snapshot_take(&s, pool, st.it, 4, w), -EIO);
        CHECK(t_contains(ckptio_last_error(), "from GPU memory failed"));
        CHECK(usage(pool).lent == 0);
        ckptio_writer_close(w);
    }
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* With plain buffers (pinned OFF) device tensors are written through the writer's GPU path
 * during the take. */
static int test_pool_gpu_plain(void)
{
    int rc = gpu_open();
    if (rc) return rc;
    state st;
    ckptio_pool *pool = begin(64 * MiB, &st, 256, MiB, 20);
    CHECK(pool);
    void *da = gpu_copy_of(st.a, st.an);
    CHECK(da);
    st.it[0].data = da;
    st.it[0].memory = CKPTIO_MEM_CUDA;
    ckptio_completion *c;
    ckptio_take_stats ts;
    CHECK(save_async(pool, &st, t_path("ck"), &c, &ts) == 0);
    CHECK(ts.device_bytes == 0 && ts.written_bytes == st.an);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    CHECK(check_state(t_path("ck"), 256, MiB, 20) == 0);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

/* Where the driver refuses page-locked memory, an AUTO pool copies host tensors into plain
 * buffers and says why; a device tensor, which needs page-locked memory, fails the take. */
static int test_pool_gpu_pin_refused(void)
{
    setenv("CKPTIO_STANDIN_FAIL_ALLOC", "1", 1);
    int rc = gpu_open();
    if (rc) return rc;
    if (G.real) return T_SKIP;
    state st;
    ckptio_pool *pool;
    state_make(&st, 16, MiB, 23);
    CHECK_OK(ckptio_pool_new(&pool, NULL));
    CHECK(usage(pool).pinned == 1);
    ckptio_completion *c;
    CHECK(save_async(pool, &st, t_path("ck"), &c, NULL) == 0);
    CHECK_OK(ckptio_completion_wait(c, 60));
    ckptio_completion_free(c);
    ckptio_pool_usage u = usage(pool);
    CHECK(u.pinned == 0 && u.pinned_bytes == 0 && u.held == st.an + st.bn + 8);
    CHECK(t_contains(u.reason, "cuMemHostAlloc"));
    CHECK(check_state(t_path("ck"), 16, MiB, 23) == 0);
    void *da = gpu_copy_of(st.a, st.an);
    CHECK(da);
    st.it[0].data = da;
    st.it[0].memory = CKPTIO_MEM_CUDA;
    ckptio_snapshot *s;
    CHECK_ERR(ckptio_snapshot_take(&s, pool, st.it, 4, NULL), CKPTIO_E_LIMIT);
    CHECK(t_contains(ckptio_last_error(), "page-locked"));
    CHECK(usage(pool).lent == 0);
    ckptio_pool_free(pool);
    state_free(&st);
    return 0;
}

const ckptio_test tests_async_pool[] = {
    {"async/pool-round-trip", test_pool_round_trip, T_PER_BACKEND, 60},
    {"async/pool-reuse", test_pool_reuse, 0, 60},
    {"async/pool-cap-split", test_pool_cap_split, T_PER_BACKEND, 120},
    {"async/pool-cap-no-writer", test_pool_cap_no_writer, 0, 60},
    {"async/pool-alloc-failure", test_pool_alloc_failure, 0, 60},
    {"async/pool-failed-commit", test_pool_failed_commit, 0, 60},
    {"async/pool-unreported-error", test_pool_unreported_error, 0, 60},
    {"async/pool-fork-in-flight", test_pool_fork_in_flight, 0, 120},
    {"async/pool-fork-after", test_pool_fork_after, 0, 120},
    {"async/pool-dist", test_pool_dist, 0, 60},
    {"async/pool-dist-two-ranks", test_pool_dist_two_ranks, 0, 60},
    {"async/pool-usage", test_pool_usage_errors, 0, 60},
    {"async/pool-zip", test_pool_zip, 0, 60},
    {"async/pool-zip-errors", test_pool_zip_errors, 0, 60},
    {"async/pool-zip-fork-in-flight", test_pool_zip_fork_in_flight, 0, 120},
    {"async/pool-gpu", test_pool_gpu, 0, 60},
    {"async/pool-gpu-plain", test_pool_gpu_plain, 0, 60},
    {"async/pool-gpu-pin-refused", test_pool_gpu_pin_refused, 0, 60},
    {0},
};
