/* SPDX-License-Identifier: Apache-2.0 */
/* The C test framework: tests are small functions in per-area tables, run forked by runner.c. */
#ifndef CKPTIO_TEST_H
#define CKPTIO_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ckptio.h"

/* A test returns 0 (pass), 77 (skipped: feature missing here) or anything else (fail). Each runs
 * in its own forked process, in a fresh empty temporary directory that is also the current
 * directory (t_dir()), with a timeout; the runner removes the directory afterwards. */
typedef struct ckptio_test {
    const char *name;
    int (*fn)(void);
    unsigned flags;   /* T_PER_BACKEND: run once with each of CKPTIO_IO=io_uring|psync|buffered */
    unsigned timeout; /* seconds; 0 = 60 */
} ckptio_test;

#define T_PER_BACKEND 1u
#define T_SKIP 77

/* Each tests/test_<group>.c defines `const ckptio_test tests_<group>[]` ending in {0}; the
 * groups are listed once, in tests/list.h. */
#define TEST_GROUP(g) extern const ckptio_test tests_##g[];
#ifdef CKPTIO_TEST_LIST /* a private list, to build a subset while developing */
#include CKPTIO_TEST_LIST
#else
#include "list.h"
#endif
#undef TEST_GROUP

/* Failing checks print where and what, then return 1 from the test. */
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);          \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)
/* A ckptio call that must succeed; prints the code and the last error message otherwise. */
#define CHECK_OK(expr)                                                                         \
    do {                                                                                       \
        long long t_rc_ = (long long)(expr);                                                   \
        if (t_rc_ < 0) {                                                                       \
            fprintf(stderr, "%s:%d: %s -> %lld %s: %s\n", __FILE__, __LINE__, #expr, t_rc_,    \
                    ckptio_errname((int)t_rc_), ckptio_last_error());                          \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)
/* A call that must fail with exactly `code`. */
#define CHECK_ERR(expr, code)                                                                  \
    do {                                                                                       \
        long long t_rc_ = (long long)(expr);                                                   \
        if (t_rc_ != (long long)(code)) {                                                      \
            fprintf(stderr, "%s:%d: %s -> %lld (%s), expected %s\n", __FILE__, __LINE__,       \
                    #expr, t_rc_, ckptio_errname((int)t_rc_), ckptio_errname((int)(code)));    \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* The test's private temporary directory (absolute path; also the cwd). */
const char *t_dir(void);
/* t_dir()/name into a static rotating buffer (8 slots). */
const char *t_path(const char *name);
/* Deterministic pseudo-random bytes (xorshift, from seed). */
void t_fill(void *buf, size_t len, uint64_t seed);
/* Page-aligned zeroed memory of len bytes (mmap), and its release. */
void *t_alloc(size_t len);
void t_free(void *p, size_t len);
/* The backend this run is for ("io_uring", "psync", "buffered"), or "auto". */
const char *t_backend(void);
/* Whether the string contains `needle` (for checking error messages). */
int t_contains(const char *haystack, const char *needle);
/* Read a whole small file into malloc'd memory; returns length or -1. */
long t_read_file(const char *path, unsigned char **out);
int t_write_file(const char *path, const void *data, size_t len);
/* Mount a ramfs (which refuses O_DIRECT on every kernel) at `where`, a new directory, in a
 * private mount namespace of this test's process: 0, or -1 with errno (defined in test_io.c). */
int t_mount_ramfs(const char *where);
/* Run a shell command, return its exit status (or -1). Output goes to the test log. */
int t_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The exit status of child `pid` (128 + the signal that ended it), waited for up to `seconds`;
 * -1 when it ran longer (it is killed). */
int t_reap(int pid, int seconds);

#endif
