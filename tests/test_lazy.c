/* SPDX-License-Identifier: Apache-2.0 */
/* The mapper: data files for mmap, checks of mapped bytes, replaced and rewritten checkpoints. */
#define CKPTIO_EXPERIMENTAL
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

#define N 20000 /* floats: 80000 bytes, two checksum blocks */

/* A checkpoint at `path` with tensors "a" (N floats of `seed`) and "b" (N floats of -seed). */
static int save(const char *path, float seed, int overwrite)
{
    static float a[N], b[N];
    for (int i = 0; i < N; i++) a[i] = seed + (float)i, b[i] = -seed - (float)i;
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = overwrite;
    p.fsync = 0;
    p.request_bytes = 65536; /* and so 64 KiB checksum blocks */
    ckptio_writer *w;
    uint64_t shape[1] = {N};
    CHECK_OK(ckptio_writer_open(&w, path, &p));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_F32, 1, shape, NULL, NULL, a, sizeof a));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_F32, 1, shape, NULL, NULL, b, sizeof b));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    return 0;
}

/* Map chunk 0 of tensor t whole (MAP_PRIVATE), returning the address of its first byte. */
static const float *map_chunk(ckptio_mapper *m, size_t t, void **base, size_t *len)
{
    int fd;
    uint64_t off, n;
    if (ckptio_mapper_chunk(m, t, 0, &fd, &off, &n) < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) return NULL;
    *len = (size_t)st.st_size;
    *base = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (*base == MAP_FAILED) return NULL;
    return (const float *)((char *)*base + off);
}

static int test_map_and_check(void)
{
    const char *path = t_path("ckpt");
    if (save(path, 1.0f, 0)) return 1;
    ckptio_mapper *m;
    CHECK_OK(ckptio_mapper_open(&m, path));
    CHECK(ckptio_mapper_same(m, path) == 1);
    void *base;
    size_t len;
    const float *b = map_chunk(m, 1, &base, &len); /* tensors in name order: a, b */
    CHECK(b && b[0] == -1.0f && b[N - 1] == -1.0f - (float)(N - 1));
    CHECK_OK(ckptio_mapper_check(m, 1, 0, b, N * sizeof(float)));
    CHECK_ERR(ckptio_mapper_check(m, 1, 0, b, 4), CKPTIO_E_SHAPE);
    CHECK_ERR(ckptio_mapper_chunk(m, 2, 0, NULL, NULL, NULL), CKPTIO_E_NOT_FOUND);
    /* A private write is a difference from the checkpoint: found, naming the tensor. */
    ((float *)b)[17000] = 7.0f;
    CHECK_ERR(ckptio_mapper_check(m, 1, 0, b, N * sizeof(float)), CKPTIO_E_CHECKSUM);
    CHECK(t_contains(ckptio_mapper_errmsg(m), "tensor 'b'"));
    CHECK(t_contains(ckptio_mapper_errmsg(m), "bytes 65536..80000"));
    CHECK_OK(ckptio_mapper_unchanged(m)); /* the file itself is as it was */
    munmap(base, len);
    ckptio_mapper_close(m);
    ckptio_mapper_close(NULL);
    return 0;
}

/* A later save replacing the checkpoint: the old files stay readable through the mapper
 * and its mapping, unchanged; `same` tells that the path now names another directory. */
static int test_replaced(void)
{
    const char *path = t_path("ckpt");
    if (save(path, 1.0f, 0)) return 1;
    ckptio_mapper *m;
    CHECK_OK(ckptio_mapper_open(&m, path));
    if (save(path, 100.0f, 1)) return 1;
    CHECK(ckptio_mapper_same(m, path) == 0);
    void *base;
    size_t len;
    const float *a = map_chunk(m, 0, &base, &len); /* the file was open before */
    CHECK(a && a[0] == 1.0f && a[N - 1] == 1.0f + (float)(N - 1));
    CHECK_OK(ckptio_mapper_check(m, 0, 0, a, N * sizeof(float)));
    CHECK_OK(ckptio_mapper_unchanged(m));
    munmap(base, len);
    ckptio_mapper_close(m);
    return 0;
}

/* A data file written in place after it was opened: unchanged() names it; a truncated one
 * is refused before anything could be mapped past its end. */
static int test_rewritten_and_truncated(void)
{
    const char *path = t_path("ckpt");
    if (save(path, 1.0f, 0)) return 1;
    const char *file = t_path("ckpt/data/000000.ckd");
    ckptio_mapper *m;
    CHECK_OK(ckptio_mapper_open(&m, path));
    CHECK_OK(ckptio_mapper_chunk(m, 0, 0, NULL, NULL, NULL));
    int fd = open(file, O_WRONLY);
    CHECK(fd >= 0);
    struct timespec later[2] = {{0, UTIME_OMIT}, {0, 0}};
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    later[1].tv_sec = st.st_mtim.tv_sec + 10; /* a coarse clock could hide the write */
    CHECK(pwrite(fd, "xxxx", 4, 0) == 4);
    CHECK(futimens(fd, later) == 0);
    close(fd);
    CHECK_ERR(ckptio_mapper_unchanged(m), CKPTIO_E_CORRUPT);
    CHECK(t_contains(ckptio_mapper_errmsg(m), "000000.ckd"));
    ckptio_mapper_close(m);

    CHECK(truncate(file, 4096) == 0);
    CHECK_OK(ckptio_mapper_open(&m, path));
    CHECK_ERR(ckptio_mapper_chunk(m, 1, 0, NULL, NULL, NULL), CKPTIO_E_CORRUPT);
    CHECK(t_contains(ckptio_mapper_errmsg(m), "truncated"));
    ckptio_mapper_close(m);
    return 0;
}

/* Opening what is not a checkpoint fails with the reader's codes and leaks nothing. */
static int test_open_errors(void)
{
    ckptio_mapper *m = (ckptio_mapper *)1;
    CHECK_ERR(ckptio_mapper_open(&m, t_path("nothing")), -ENOENT);
    CHECK(m == NULL);
    CHECK(mkdir(t_path("empty"), 0755) == 0);
    CHECK_ERR(ckptio_mapper_open(&m, t_path("empty")), CKPTIO_E_NOT_CHECKPOINT);
    CHECK(t_contains(ckptio_last_error(), "manifest"));
    if (save(t_path("ckpt"), 1.0f, 0)) return 1;
    CHECK(t_write_file(t_path("ckpt/manifest"), "garbage", 7) == 0);
    CHECK_ERR(ckptio_mapper_open(&m, t_path("ckpt")), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio_mapper_open(NULL, t_path("ckpt")), CKPTIO_E_USAGE);
    return 0;
}

const ckptio_test tests_lazy[] = {
    {"lazy/open_errors", test_open_errors, 0, 30},
    {"lazy/map_and_check", test_map_and_check, 0, 30},
    {"lazy/replaced", test_replaced, 0, 30},
    {"lazy/rewritten_and_truncated", test_rewritten_and_truncated, 0, 30},
    {0},
};
