/* SPDX-License-Identifier: Apache-2.0 */
/* Concurrency: threads saving and reading at once, and two processes racing for one path. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "model.h"
#include "test.h"

#define N_WRITERS 3
#define N_READERS 3
#define ROUNDS 3

typedef struct job {
    char path[PATH_MAX];
    const model *m[2]; /* writers alternate between the two; readers expect m[0] */
    int rc;            /* 0, or the first failure (negative: ckptio's code, 1: wrong bytes) */
    char msg[CKPTIO__MSG_LEN];
} job;

static void *writer_main(void *arg)
{
    job *j = arg;
    for (int r = 0; r < ROUNDS && !j->rc; r++)
        j->rc = save_model(j->path, j->m[r & 1], r > 0, j->msg, sizeof j->msg);
    return NULL;
}

static void *reader_main(void *arg)
{
    job *j = arg;
    for (int r = 0; r < 2 * ROUNDS && !j->rc; r++) {
        j->rc = load_model(j->path, j->m[0]);
        if (j->rc) snprintf(j->msg, sizeof j->msg, "%s", ckptio_last_error());
    }
    return NULL;
}

/* Writers save to their own paths (overwriting themselves) while readers, each with its own
 * reader, read one committed checkpoint: every save commits, every read is bit-exact, and no
 * temp dir is left. Under TSan this is the library's data-race check. */
static int test_threads(void)
{
    if (!strcmp(t_backend(), "io_uring") && !ckptio__io_uring_available())
        return T_SKIP;
#ifdef UNDER_TSAN
    /* liburing maps its rings with raw syscalls TSan cannot see, so a ring set up at the
     * address of another thread's closed ring looks like a race on the SQEs (each engine has
     * its own ring; nothing is shared). The psync and buffered runs check the library. */
    if (!strcmp(t_backend(), "io_uring")) return T_SKIP;
#endif
    model base, m[N_WRITERS][2];
    CHECK(model_make(&base, 100) == 0);
    for (int i = 0; i < N_WRITERS; i++)
        CHECK(model_make(&m[i][0], 200 + (uint64_t)i) == 0 &&
              model_make(&m[i][1], 300 + (uint64_t)i) == 0);
    CHECK_OK(save_model(t_path("base"), &base, 0, NULL, 0));

    job jobs[N_WRITERS + N_READERS];
    pthread_t th[N_WRITERS + N_READERS];
    char names[N_WRITERS][32];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < N_WRITERS + N_READERS; i++) {
        if (i < N_WRITERS) {
            snprintf(names[i], sizeof names[i], "ck-%d", i);
            snprintf(jobs[i].path, sizeof jobs[i].path, "%s", t_path(names[i]));
            jobs[i].m[0] = &m[i][0];
            jobs[i].m[1] = &m[i][1];
        } else {
            snprintf(jobs[i].path, sizeof jobs[i].path, "%s", t_path("base"));
            jobs[i].m[0] = &base;
        }
    }
    for (int i = 0; i < N_WRITERS + N_READERS; i++)
        CHECK(pthread_create(&th[i], NULL, i < N_WRITERS ? writer_main : reader_main,
                             &jobs[i]) == 0);
    for (int i = 0; i < N_WRITERS + N_READERS; i++) CHECK(pthread_join(th[i], NULL) == 0);
    for (int i = 0; i < N_WRITERS + N_READERS; i++) {
        if (jobs[i].rc) {
            fprintf(stderr, "%s of '%s' -> %d %s: %s\n", i < N_WRITERS ? "save" : "load",
                    jobs[i].path, jobs[i].rc, ckptio_errname(jobs[i].rc), jobs[i].msg);
            return 1;
        }
    }
    for (int i = 0; i < N_WRITERS; i++)
        CHECK(load_model(t_path(names[i]), &m[i][(ROUNDS - 1) & 1]) == 0);
    CHECK(load_model(t_path("base"), &base) == 0);
    CHECK(count_prefix("ck-") == N_WRITERS);
    for (int i = 0; i < N_WRITERS; i++) {
        char pre[128];
        snprintf(pre, sizeof pre, "%s.tmp-", names[i]);
        CHECK(count_prefix(pre) == 0);
    }
    printf("%d writers x %d saves, %d readers x %d loads at once: all bit-exact\n", N_WRITERS,
           ROUNDS, N_READERS, 2 * ROUNDS);
    for (int i = 0; i < N_WRITERS; i++) {
        model_free(&m[i][0]);
        model_free(&m[i][1]);
    }
    model_free(&base);
    return leak_check();
}

typedef struct race_result {
    int rc;
    char msg[CKPTIO__MSG_LEN];
} race_result;

/* Two processes, released together through a pipe, save different checkpoints to one path.
 * Results come back through files (the children's exit codes are too small for a message). */
static int race(const char *ck, const model *const ms[2], int overwrite, race_result res[2])
{
    int gate[2];
    CHECK(pipe(gate) == 0);
    pid_t pids[2];
    fflush(NULL);
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            close(gate[1]);
            char c;
            /* returns 0 (end of file) when the parent closes its end: both start together */
            while (read(gate[0], &c, 1) < 0 && errno == EINTR) {}
            race_result r = {0};
            r.rc = save_model(ck, ms[i], overwrite, r.msg, sizeof r.msg);
            char name[32];
            snprintf(name, sizeof name, "result-%d", i);
            _exit(t_write_file(t_path(name), &r, sizeof r) == 0 ? 0 : 2);
        }
    }
    close(gate[0]);
    close(gate[1]);
    for (int i = 0; i < 2; i++) {
        int st;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {}
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        char name[32];
        unsigned char *b = NULL;
        snprintf(name, sizeof name, "result-%d", i);
        CHECK(t_read_file(t_path(name), &b) == (long)sizeof *res);
        memcpy(&res[i], b, sizeof *res);
        free(b);
        unlink(t_path(name));
    }
    return 0;
}

/* Without overwrite exactly one save wins; the other fails with CKPTIO_E_EXISTS naming the
 * path, whether it lost at open or at the rename. With overwrite both commit in turn and the
 * result is one of the two, complete. Never a temp dir left, never a mixed checkpoint. */
static int test_same_path_processes(void)
{
    model a, b;
    CHECK(model_make(&a, 401) == 0 && model_make(&b, 402) == 0);
    const model *const ms[2] = {&a, &b};
    char ck[PATH_MAX]; /* t_path's buffers rotate: keep our own copy */
    snprintf(ck, sizeof ck, "%s", t_path("ck"));
    unsigned wins[2] = {0}, final[2] = {0}, at_rename = 0;
    const int rounds = 24;
    for (int round = 0; round < rounds; round++) {
        CHECK(t_sh("rm -rf '%s'", ck) == 0);
        race_result res[2];
        CHECK(race(ck, ms, 0, res) == 0);
        int w = res[0].rc == 0 ? 0 : 1, l = 1 - w;
        if (res[w].rc != 0 || res[l].rc != CKPTIO_E_EXISTS || !t_contains(res[l].msg, ck)) {
            fprintf(stderr, "round %d without overwrite: %d %s [%s] / %d %s [%s]\n", round,
                    res[0].rc, ckptio_errname(res[0].rc), res[0].msg, res[1].rc,
                    ckptio_errname(res[1].rc), res[1].msg);
            return 1;
        }
        wins[w]++;
        at_rename += t_contains(res[l].msg, "appeared while saving"); /* else at open */
        CHECK(load_model(ck, ms[w]) == 0);
        CHECK(count_prefix("ck.tmp-") == 0);

        /* Both with overwrite, over the winner's checkpoint. */
        CHECK(race(ck, ms, 1, res) == 0);
        if (res[0].rc != 0 || res[1].rc != 0) {
            fprintf(stderr, "round %d with overwrite: %s [%s] / %s [%s]\n", round,
                    ckptio_errname(res[0].rc), res[0].msg, ckptio_errname(res[1].rc),
                    res[1].msg);
            return 1;
        }
        int is_a = load_model(ck, &a) == 0;
        if (!is_a && load_model(ck, &b) != 0) {
            fprintf(stderr, "round %d with overwrite: '%s' is neither save: a -> %d, b -> %d\n",
                    round, ck, load_model(ck, &a), load_model(ck, &b));
            t_sh("ls -laR '%s' >&2", t_dir());
            return 1;
        }
        final[is_a ? 0 : 1]++;
        CHECK(count_prefix("ck.tmp-") == 0 && count_prefix("ck.old-") == 0);
    }
    printf("%d races without overwrite: one winner each (a %u, b %u), loser E_EXISTS (%u at "
           "the rename, the rest at open); with overwrite both commit, final a %u b %u, always "
           "complete\n",
           rounds, wins[0], wins[1], at_rename, final[0], final[1]);
    model_free(&a);
    model_free(&b);
    return leak_check();
}

const ckptio_test tests_concurrency[] = {
    {"concurrency/threads", test_threads, T_PER_BACKEND, 120},
    {"concurrency/same_path_processes", test_same_path_processes, 0, 120},
    {0},
};
