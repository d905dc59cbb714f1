/* SPDX-License-Identifier: Apache-2.0 */
/* Background commits: ckptio_writer_commit_async and its completion (wait, done, errors, free). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/io/vfs.h"
#include "test.h"

#define N (1u << 20)

/* A vfs whose fsync fails with `fsync_err` (0: passes), or blocks while `gate` is closed. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_open = 1;
static int g_fsync_err;
static int g_fsyncs;

static int gated_fsync(int fd)
{
    pthread_mutex_lock(&g_lock);
    g_fsyncs++;
    while (!g_open) pthread_cond_wait(&g_cond, &g_lock);
    int err = g_fsync_err;
    pthread_mutex_unlock(&g_lock);
    if (err) {
        errno = err;
        return -1;
    }
    return ckptio__vfs_real.fsync(fd);
}

static ckptio__vfs g_vfs;

/* Install the vfs (before any writer exists: the I/O threads read the table unlocked). Shared
 * with test_async_pool.c, as are gate_release and fsyncs_seen. */
void gate_install(int open, int err)
{
    g_vfs = ckptio__vfs_real;
    g_vfs.fsync = gated_fsync;
    g_open = open;
    g_fsync_err = err;
    g_fsyncs = 0;
    ckptio__vfs_set(&g_vfs);
}

static void gate_fail(int err)
{
    pthread_mutex_lock(&g_lock);
    g_fsync_err = err;
    pthread_mutex_unlock(&g_lock);
}

void gate_release(void)
{
    pthread_mutex_lock(&g_lock);
    g_open = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

int fsyncs_seen(void)
{
    pthread_mutex_lock(&g_lock);
    int n = g_fsyncs;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* A writer for `path` holding tensor "t" (N bytes of `buf`, filled from `seed`). */
static int start(const char *path, unsigned char *buf, ckptio_writer **w)
{
    t_fill(buf, N, 7);
    uint64_t shape[1] = {N};
    CHECK_OK(ckptio_writer_open(w, path, NULL));
    CHECK_OK(ckptio_writer_add(*w, "t", CKPTIO_DT_U8, 1, shape, NULL, NULL, buf, N));
    CHECK_OK(ckptio_writer_set_meta(*w, "k", "v", 1));
    return 0;
}

/* The checkpoint at `path` holds exactly `buf`. */
static int check_saved(const char *path, const unsigned char *buf)
{
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    unsigned char *got = t_alloc(N);
    CHECK_OK(ckptio_reader_read_tensor(r, "t", got, N));
    int same = memcmp(got, buf, N) == 0;
    t_free(got, N);
    ckptio_reader_close(r);
    CHECK(same);
    return 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The commit runs in the background; wait returns its result and the stats are the writer's. */
static int test_async_commit(void)
{
    unsigned char *buf = t_alloc(N);
    ckptio_writer *w;
    const char *path = t_path("ck");
    CHECK(start(path, buf, &w) == 0);
    ckptio_completion *c;
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    CHECK_OK(ckptio_completion_wait(c, -1));
    CHECK(ckptio_completion_done(c) == 1);
    CHECK_OK(ckptio_completion_wait(c, 0)); /* again: the same result */
    CHECK(strcmp(ckptio_completion_errmsg(c), "") == 0);
    ckptio_stats st;
    CHECK_OK(ckptio_completion_stats(c, &st));
    CHECK(st.bytes == N && st.tensors == 1);
    ckptio_completion_free(c);
    CHECK(check_saved(path, buf) == 0);
    t_free(buf, N);
    return 0;
}

/* While the commit is held up, wait times out with -ETIMEDOUT, done says 0, stats refuse and
 * nothing is visible at the path; once let go, wait returns 0. */
static int test_async_pending(void)
{
    unsigned char *buf = t_alloc(N);
    ckptio_writer *w;
    const char *path = t_path("ck");
    gate_install(0, 0);
    CHECK(start(path, buf, &w) == 0);
    ckptio_completion *c;
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    while (fsyncs_seen() == 0) usleep(1000); /* the commit is inside its first fsync */
    CHECK_ERR(ckptio_completion_wait(c, 0.01), -ETIMEDOUT);
    CHECK(t_contains(ckptio_last_error(), "still running"));
    CHECK(ckptio_completion_done(c) == 0);
    ckptio_stats st;
    CHECK_ERR(ckptio_completion_stats(c, &st), CKPTIO_E_STATE);
    CHECK(!exists(path));
    gate_release();
    CHECK_OK(ckptio_completion_wait(c, 60));
    CHECK(ckptio_completion_done(c) == 1);
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    CHECK(check_saved(path, buf) == 0);
    t_free(buf, N);
    return 0;
}

/* A failing commit (the disk is full at fsync) reports its error and message on wait, leaves
 * nothing at the path, and an older checkpoint there intact. */
static int test_async_error_on_wait(void)
{
    unsigned char *buf = t_alloc(N);
    const char *path = t_path("ck");
    ckptio_writer *w;
    gate_install(1, 0);
    CHECK(start(path, buf, &w) == 0);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = 1;
    unsigned char *buf2 = t_alloc(N);
    t_fill(buf2, N, 8);
    uint64_t shape[1] = {N};
    CHECK_OK(ckptio_writer_open(&w, path, &p));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, shape, NULL, NULL, buf2, N));
    gate_fail(ENOSPC);
    ckptio_completion *c;
    CHECK_OK(ckptio_writer_commit_async(w, &c)); /* the call itself succeeds */
    CHECK_ERR(ckptio_completion_wait(c, -1), -ENOSPC);
    CHECK(ckptio_completion_errmsg(c)[0] != '\0');
    CHECK(strcmp(ckptio_last_error(), ckptio_completion_errmsg(c)) == 0);
    CHECK_ERR(ckptio_completion_wait(c, 0), -ENOSPC);
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    CHECK(check_saved(path, buf) == 0); /* the old checkpoint */
    t_free(buf, N);
    t_free(buf2, N);
    return 0;
}

static void *release_later(void *arg)
{
    (void)arg;
    usleep(50 * 1000);
    gate_release();
    return NULL;
}

/* Freeing a completion whose commit is still running waits for the commit, which then
 * completes: the checkpoint is at the path once free returns. */
static int test_async_free_waits(void)
{
    unsigned char *buf = t_alloc(N);
    ckptio_writer *w;
    const char *path = t_path("ck");
    gate_install(0, 0);
    CHECK(start(path, buf, &w) == 0);
    ckptio_completion *c;
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    while (fsyncs_seen() == 0) usleep(1000);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, release_later, NULL) == 0);
    ckptio_completion_free(c);
    CHECK(exists(path));
    pthread_join(th, NULL);
    ckptio__vfs_set(NULL);
    CHECK(check_saved(path, buf) == 0);
    t_free(buf, N);
    return 0;
}

/* Several threads wait on one completion at once; each gets the commit's result. */
struct waiter {
    ckptio_completion *c;
    int rc;
};

static void *wait_it(void *arg)
{
    struct waiter *x = arg;
    x->rc = ckptio_completion_wait(x->c, -1);
    return NULL;
}

static int test_async_many_waiters(void)
{
    unsigned char *buf = t_alloc(N);
    ckptio_writer *w;
    gate_install(0, 0);
    CHECK(start(t_path("ck"), buf, &w) == 0);
    ckptio_completion *c;
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    struct waiter ws[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        ws[i] = (struct waiter){c, 1};
        CHECK(pthread_create(&th[i], NULL, wait_it, &ws[i]) == 0);
    }
    gate_release();
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(ws[i].rc == 0);
    }
    ckptio_completion_free(c);
    ckptio__vfs_set(NULL);
    t_free(buf, N);
    return 0;
}

static int test_async_usage(void)
{
    ckptio_completion *c = (ckptio_completion *)&c;
    CHECK_ERR(ckptio_writer_commit_async(NULL, &c), CKPTIO_E_USAGE);
    CHECK(c == NULL);
    CHECK_ERR(ckptio_completion_wait(NULL, 0), CKPTIO_E_USAGE);
    unsigned char *buf = t_alloc(N);
    ckptio_writer *w;
    CHECK(start(t_path("ck"), buf, &w) == 0);
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    CHECK_ERR(ckptio_completion_wait(c, 0.0 / 0.0), CKPTIO_E_USAGE);
    CHECK_OK(ckptio_completion_wait(c, -1));
    ckptio_completion_free(c);
    t_free(buf, N);
    CHECK(ckptio_completion_done(NULL) == 0);
    ckptio_completion_free(NULL);
    return 0;
}

const ckptio_test tests_async[] = {
    {"async/commit", test_async_commit, T_PER_BACKEND, 60},
    {"async/pending", test_async_pending, 0, 60},
    {"async/error-on-wait", test_async_error_on_wait, T_PER_BACKEND, 60},
    {"async/free-waits", test_async_free_waits, 0, 60},
    {"async/many-waiters", test_async_many_waiters, 0, 60},
    {"async/usage", test_async_usage, 0, 60},
    {0},
};
