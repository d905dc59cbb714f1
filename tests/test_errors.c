/* SPDX-License-Identifier: Apache-2.0 */
/* Errors as values: ckptio_error_info from the thread's last error and from each kind of handle. */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

static ckptio_error_info I; /* ~8 KiB: not on the stack */

static int ask_last(void)
{
    memset(&I, 0x5a, sizeof I);
    I.size = sizeof I;
    return ckptio_last_error_info(&I);
}

static void *fresh_thread(void *arg)
{
    *(int *)arg = ask_last() == 0 && I.code == 0 && I.rank == CKPTIO_ERROR_NO_RANK &&
                  I.other_rank == CKPTIO_ERROR_NO_RANK && I.flags == 0 &&
                  I.offset == CKPTIO_ERROR_NO_OFFSET && !I.tensor[0] && !I.file[0];
    return NULL;
}

/* Arguments, a thread with no failure yet, and a caller whose struct is older (smaller). */
static int test_info_args(void)
{
    int fresh = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, fresh_thread, &fresh) == 0);
    pthread_join(th, NULL);
    CHECK(fresh);
    CHECK_ERR(ckptio_last_error_info(NULL), CKPTIO_E_USAGE);
    ckptio_error_info *small = calloc(1, sizeof *small);
    CHECK(small);
    small->size = 8;
    CHECK_ERR(ckptio_last_error_info(small), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_reader_error_info(NULL, &I), CKPTIO_E_USAGE);
    /* A failure, then a caller that knows only the fields before the names. */
    CHECK_ERR(ckptio_reader_open(NULL, NULL, NULL), CKPTIO_E_USAGE);
    small->size = (uint32_t)offsetof(ckptio_error_info, tensor);
    memset(small->tensor, 0x5a, 4);
    CHECK_OK(ckptio_last_error_info(small));
    CHECK(small->size == offsetof(ckptio_error_info, tensor));
    CHECK(small->code == CKPTIO_E_USAGE && small->rank == CKPTIO_ERROR_NO_RANK);
    CHECK(small->tensor[0] == 0x5a); /* beyond its size: left alone */
    free(small);
    return 0;
}

/* A writer's add names the tensor (and the data file it was writing), on the handle and for
 * the thread; the next call clears the handle's. */
static int test_info_writer_add(void)
{
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t shape[1] = {4};
    float x[4] = {1, 2, 3, 4};
    CHECK_ERR(ckptio_writer_add(w, "layer.0.weight", 999, 1, shape, NULL, NULL, x, sizeof x),
              CKPTIO_E_DTYPE);
    static ckptio_error_info h;
    h.size = sizeof h;
    CHECK_OK(ckptio_writer_error_info(w, &h));
    CHECK(h.code == CKPTIO_E_DTYPE && !strcmp(h.tensor, "layer.0.weight"));
    CHECK(t_contains(h.file, "/data/") && h.offset == CKPTIO_ERROR_NO_OFFSET);
    CHECK_OK(ask_last());
    CHECK(!memcmp(&I, &h, offsetof(ckptio_error_info, tensor) + 16));
    CHECK(!strcmp(I.tensor, h.tensor) && !strcmp(I.file, h.file));
    CHECK_OK(ckptio_writer_add(w, "ok", CKPTIO_DT_F32, 1, shape, NULL, NULL, x, sizeof x));
    CHECK_OK(ckptio_writer_error_info(w, &h));
    CHECK(h.code == 0 && !h.tensor[0]);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    return 0;
}

/* A missing data file: the reader and the mapper name the file, and the tensor read from it. */
static int test_info_missing_file(void)
{
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t shape[1] = {1024};
    static float x[1024];
    CHECK_OK(ckptio_writer_add(w, "emb", CKPTIO_DT_F32, 1, shape, NULL, NULL, x, sizeof x));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, 0, 0, &ci));
    char rel[600], path[1024];
    snprintf(rel, sizeof rel, "ck/%s", ci.file);
    snprintf(path, sizeof path, "%s", t_path(rel));
    CHECK(unlink(path) == 0);

    CHECK_ERR(ckptio_reader_read_tensor(r, "emb", x, sizeof x), CKPTIO_E_CORRUPT);
    static ckptio_error_info h;
    h.size = sizeof h;
    CHECK_OK(ckptio_reader_error_info(r, &h));
    fprintf(stderr, "%s\n", ckptio_reader_errmsg(r));
    CHECK(h.code == CKPTIO_E_CORRUPT && !strcmp(h.file, path) && !strcmp(h.tensor, "emb"));
    CHECK(h.offset == ci.file_offset);
    CHECK_OK(ask_last());
    CHECK(I.code == CKPTIO_E_CORRUPT && !strcmp(I.file, path) && !strcmp(I.tensor, "emb"));

    ckptio_mapper *m = NULL;
    CHECK_OK(ckptio_mapper_open(&m, t_path("ck")));
    CHECK_ERR(ckptio_mapper_chunk(m, 0, 0, NULL, NULL, NULL), CKPTIO_E_CORRUPT);
    CHECK_OK(ckptio_mapper_error_info(m, &h));
    CHECK(h.code == CKPTIO_E_CORRUPT && !strcmp(h.file, path) && !strcmp(h.tensor, "emb"));
    ckptio_mapper_close(m);
    ckptio_reader_close(r);
    return 0;
}

/* A completion has no failure until it is done, then its commit's. */
static int test_info_completion(void)
{
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    uint64_t shape[1] = {4};
    static float x[4];
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_F32, 1, shape, NULL, NULL, x, sizeof x));
    ckptio_completion *c = NULL;
    CHECK_OK(ckptio_writer_commit_async(w, &c));
    static ckptio_error_info h;
    h.size = sizeof h;
    CHECK_OK(ckptio_completion_wait(c, -1));
    CHECK_OK(ckptio_completion_error_info(c, &h));
    CHECK(h.code == 0 && h.rank == CKPTIO_ERROR_NO_RANK);
    ckptio_completion_free(c);
    CHECK_ERR(ckptio_completion_error_info(NULL, &h), CKPTIO_E_USAGE);
    return 0;
}

const ckptio_test tests_errors[] = {
    {"errors/info_args", test_info_args, 0, 20},
    {"errors/info_writer_add", test_info_writer_add, 0, 20},
    {"errors/info_missing_file", test_info_missing_file, 0, 20},
    {"errors/info_completion", test_info_completion, 0, 20},
    {0},
};
