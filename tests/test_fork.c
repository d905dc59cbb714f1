/* SPDX-License-Identifier: Apache-2.0 */
/* Every thread and handle of the engine across fork(): the child forgets what is the parent's. */
#define CKPTIO_EXPERIMENTAL
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "s3_live.h"
#include "test.h"

/* A DataLoader's workers fork a training process every epoch, with whatever ckptio handles it
 * holds open; a child may drop them (a finalizer closes them). Each test forks with a handle
 * whose threads run, checks that the child's other calls on it are refused (not left waiting
 * on threads it does not have), lets the child close it, and checks that the child returns at
 * once and that the parent's handle goes on as if nothing happened. */

#define N (6u << 20)

/* Fork: the child runs `stmt` (closing what it inherited) and exits; the parent waits for it,
 * 10 s at most, and checks that it exited 0. */
#define IN_CHILD(stmt)                                                                         \
    do {                                                                                       \
        pid_t pid_ = fork();                                                                   \
        CHECK(pid_ >= 0);                                                                      \
        if (pid_ == 0) {                                                                       \
            stmt;                                                                              \
            _exit(0);                                                                          \
        }                                                                                      \
        CHECK(t_reap(pid_, 10) == 0);                                                          \
    } while (0)

/* In the child: every call but close on the parent's handle is refused with CKPTIO_E_STATE
 * naming the fork (its threads are the parent's), then the child closes it. */
static int refuses_writer(ckptio_writer *w, const uint8_t *a)
{
    uint64_t shape[1] = {4096};
    CHECK_ERR(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, 4096),
              CKPTIO_E_STATE);
    CHECK(t_contains(ckptio_last_error(), "forked this one"));
    CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_STATE);
    ckptio_writer_close(w);
    return 0;
}

static int refuses_reader(ckptio_reader *r, uint8_t *b)
{
    CHECK_ERR(ckptio_reader_read_tensor(r, "a", b, N), CKPTIO_E_STATE);
    CHECK(t_contains(ckptio_last_error(), "forked this one"));
    uint64_t bad = 0;
    CHECK_ERR(ckptio_reader_verify(r, &bad), CKPTIO_E_STATE);
    CHECK(ckptio_reader_num_tensors(r) == 1); /* what needs no thread still answers */
    ckptio_reader_close(r);
    return 0;
}

static int refuses_zip(ckptio_zip_writer *z, const uint8_t *a)
{
    CHECK_ERR(ckptio_zip_writer_add(z, "archive/data/9", a, 64, 64, 0), CKPTIO_E_STATE);
    CHECK_ERR(ckptio_zip_writer_commit(z), CKPTIO_E_STATE);
    ckptio_zip_writer_close(z);
    return 0;
}

/* Whether checkpoint `path` holds tensor "a" equal to a's N bytes. */
static int holds(const char *path, const uint8_t *a)
{
    uint8_t *b = t_alloc(N);
    CHECK(b);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    CHECK_OK(ckptio_reader_read_tensor(r, "a", b, N));
    ckptio_reader_close(r);
    CHECK(!memcmp(a, b, N));
    t_free(b, N);
    return 0;
}

/* A writer with its data written (hasher and sink threads started), not committed. */
static int test_writer(void)
{
    uint8_t *a = t_alloc(N);
    CHECK(a);
    t_fill(a, N, 1);
    ckptio_writer *w = NULL;
    uint64_t shape[1] = {N};
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, N));
    CHECK_OK(ckptio_writer_flush(w));
    IN_CHILD(_exit(refuses_writer(w, a))); /* the parent's: left alone */
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK(!holds(t_path("ck"), a));
    t_free(a, N);
    return 0;
}

/* A reader that has read (its verification threads and its ring's threads started). */
static int test_reader(void)
{
    uint8_t *a = t_alloc(N), *b = t_alloc(N);
    CHECK(a && b);
    t_fill(a, N, 2);
    uint64_t shape[1] = {N};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, N));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_params p;
    ckptio_params_init(&p);
    p.backend = CKPTIO_BACKEND_PSYNC; /* threads of the engine's own */
    p.verify_threads = 3;
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK_OK(ckptio_reader_read_tensor(r, "a", b, N));
    IN_CHILD(_exit(refuses_reader(r, b))); /* the parent's: left alone */
    memset(b, 0, N);
    CHECK_OK(ckptio_reader_read_tensor(r, "a", b, N));
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0 && !memcmp(a, b, N));
    ckptio_reader_close(r);
    t_free(a, N);
    t_free(b, N);
    return 0;
}

/* A torch archive being written (its CRC threads started). */
static int test_zip(void)
{
    uint8_t *a = t_alloc(N);
    CHECK(a);
    t_fill(a, N, 3);
    ckptio_zip_writer *z = NULL;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("m.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_add(z, "archive/data/0", a, N, 64, 0));
    IN_CHILD(_exit(refuses_zip(z, a))); /* the parent's: left alone */
    CHECK_OK(ckptio_zip_writer_add(z, "archive/data/1", a, 4096, 64, 0));
    CHECK_OK(ckptio_zip_writer_commit(z));
    ckptio_zip_writer_close(z);
    CHECK(t_sh("python3 -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); "
               "assert z.testzip() is None and len(z.namelist()) == 2\" '%s'", t_path("m.pt")) == 0);
    t_free(a, N);
    return 0;
}

/* A save to an object store in flight (its upload begun, the client's connections cached):
 * the child closing the writer leaves the parent's upload and objects alone, and its own save
 * uses connections of its own. */
static int test_s3(void)
{
    if (live_env()) return T_SKIP;
    char base[400];
    snprintf(base, sizeof base, "s3://%s/ckptio-test/fork-%d-%lld", bucket(), (int)getpid(),
             (long long)time(NULL));
    char mine[460], theirs[460];
    snprintf(mine, sizeof mine, "%s/parent", base);
    snprintf(theirs, sizeof theirs, "%s/child", base);
    uint8_t *a = t_alloc(N);
    CHECK(a);
    t_fill(a, N, 4);
    uint64_t shape[1] = {N};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, mine, NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, N));
    CHECK_OK(ckptio_writer_flush(w));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        ckptio_writer_close(w);
#if defined(__SANITIZE_THREAD__)
        /* TSan cannot follow a child of a threaded process that starts threads (its own save
         * would): there the child only closes. */
        _exit(0);
#endif
        ckptio_writer *c = NULL;
        int ok = ckptio_writer_open(&c, theirs, NULL) == 0 &&
                 ckptio_writer_add(c, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, N) == 0 &&
                 ckptio_writer_commit(c) == 0;
        ckptio_writer_close(c);
        _exit(ok ? 0 : 3);
    }
    CHECK(t_reap(pid, 60) == 0);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    const char *both[2] = {mine, theirs};
#if defined(__SANITIZE_THREAD__)
    const int n_saved = 1;
#else
    const int n_saved = 2;
#endif
    for (int i = 0; i < n_saved; i++) CHECK(!holds(both[i], a));
    t_free(a, N);
    return 0;
}

const ckptio_test tests_fork[] = {
    {"fork/writer", test_writer, 0, 60},
    {"fork/reader", test_reader, 0, 60},
    {"fork/zip", test_zip, 0, 60},
    {"fork/s3", test_s3, 0, 300},
    {0},
};
