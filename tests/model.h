/* SPDX-License-Identifier: Apache-2.0 */
/* A small three-tensor checkpoint that the reliability tests save, damage and check. */
#ifndef CKPTIO_TEST_MODEL_H
#define CKPTIO_TEST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

/* UNDER_TSAN: built with -fsanitize=thread (gcc or clang), where some tests do less. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

/* An unaligned tensor (staged, saved from an odd address), a page-aligned one (written in
 * place) and a tiny one: together they exercise every path of the writer. */
#define NT 3
extern const char *const tnames[NT];
extern const uint64_t tsizes[NT];

typedef struct model {
    unsigned char *t[NT];
} model;

/* Fill the tensors from `seed` (different seeds give different bytes everywhere). */
int model_make(model *m, uint64_t seed);
void model_free(model *m);
/* Small requests and staging, so that one save makes many requests, fsyncs and renames. */
ckptio_params fparams(int overwrite);
/* Save m at path; on failure copies the writer's message into msg (may be NULL). */
int save_model(const char *path, const model *m, int overwrite, char *msg, size_t msglen);
/* 0 if path loads and verifies as m, bit-exact; 1 if it loads but differs; <0 if it fails. */
int load_model(const char *path, const model *m);
/* Entries of directory `dir` (NULL: the test directory) whose names start with prefix. */
int count_prefix_in(const char *dir, const char *prefix);
#define count_prefix(prefix) count_prefix_in(NULL, prefix)
/* Nonzero if LeakSanitizer (when built in) finds leaks now. */
int leak_check(void);

#endif
