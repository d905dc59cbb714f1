/* SPDX-License-Identifier: Apache-2.0 */
/* The `ckptio bench` command's private parts, shared by its files: the synthetic state
 * (bench_state.c), the raw device measurement (bench_raw.c), the timed ckptio runs
 * (bench_runs.c), the report (bench_report.c) and the command itself (bench.c). */
#ifndef CKPTIO_TOOLS_BENCH_H
#define CKPTIO_TOOLS_BENCH_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

/* The raw measurement follows what the development disk rewards (DESIGN.md): 8 MiB writes
 * 16 deep, 16 MiB reads 8 deep, 128 MiB in flight either way. */
enum { RAW_WRITE_DEPTH = 16, RAW_READ_DEPTH = 8 };
#define RAW_WRITE_REQ (8 * MIB)
#define RAW_READ_REQ  (16 * MIB)
#define RAW_ARENA     (128 * MIB)
#define RAW_MIN_BYTES (2 * GIB)
#define LAYERS        48
#define LARGE_TENSOR  MIB

typedef struct tensor {
    const char *name;
    int dtype;
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t nbytes;
    unsigned char *data; /* the "training state" */
    unsigned char *dst;  /* where the load lands: 4096-aligned, capacity rounded up */
    uint64_t cap;
} tensor;

typedef struct series {
    double v[64];
    unsigned n;
} series;

typedef struct bench {
    const char *dir;
    uint64_t size, tiny;
    unsigned runs;
    bool json, keep, raw_only;

    bool made_dir;
    char ckpt[PATH_MAX], raw[PATH_MAX], tinydir[PATH_MAX];

    tensor *t;
    size_t n, cap, n_large;
    char *names;
    size_t names_len, names_cap;
    uint64_t bytes, dst_len;
    unsigned hidden;
    uint64_t vocab;
    unsigned char *dst_arena, *raw_buf;
    ckptio_region *regions;
    double gen_s;

    series raw_w, raw_r, save, load, save_s, load_s;
    uint64_t raw_bytes;
    int raw_direct;
    const char *raw_engine;
    char backend[16], load_backend[16];
    int direct, load_direct;
    double peak_extra_mib;
    double tiny_save_s, tiny_load_s;
    uint64_t tiny_bytes;
    /* the checkpoint resident in the page cache: a load, and verify on 1 and on the default
     * number of threads (page-cache copy + XXH3) */
    double warm_load, warm_verify1, warm_verify_n;
    uint32_t verify_threads;
    uint64_t warm_cache_bytes;
} bench;

/* A run of memory to fill: `seed` 0 zeroes it (touching its pages), any other seed fills it
 * with bench_fill_random's bytes. */
typedef struct piece {
    unsigned char *p;
    uint64_t len, seed;
} piece;

/* Set by SIGINT/SIGTERM: every loop stops at its next step and the files are still removed. */
extern volatile sig_atomic_t bench_interrupted;

/* Print "ckptio bench: <message>" to stderr (ending any progress line); returns CLI_FAIL. */
int bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline uint64_t bench_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* bench_state.c: plan the GPT-shaped state that lands on b->size (names, shapes, no memory),
 * then allocate and fill it, its load destinations and the raw I/O buffers. Each returns 0 or
 * -ENOMEM; bench_free_state releases whatever was allocated. */
int bench_plan_state(bench *b);
int bench_alloc_state(bench *b);
void bench_free_state(bench *b);
/* Cheap non-constant bytes from `seed`, and the filling of many pieces on every core. */
void bench_fill_random(unsigned char *p, uint64_t n, uint64_t seed);
int bench_fill_parallel(piece *pieces, size_t n);

/* bench_raw.c: one raw write (+ fsync) and cold read of b->raw_bytes in b->dir, appended to
 * b->raw_w and b->raw_r; CLI_OK or CLI_FAIL (reported). */
int bench_raw_run(bench *b, unsigned run);
/* bench_raw.c: the page cache and the bench's files. Drop a file's or tree's cached pages;
 * remove a tree; let the file system finish freeing what was deleted (syncfs). */
void bench_evict(const char *path);
void bench_remove_tree(const char *path);
void bench_settle(const char *dir);

/* bench_runs.c: one durable save and one cold load of the state (the first load compared
 * with what was saved); the resident checkpoint's load and verify rates; the tiny tensors'
 * save and load. Each returns CLI_OK or CLI_FAIL (reported). */
int bench_ckptio_run(bench *b, unsigned run);
int bench_warm_run(bench *b);
int bench_tiny_run(bench *b);

/* bench_report.c: the report on stdout, as a table or as JSON; bench_report_raw for
 * --raw-only. */
void bench_report_json(const bench *b);
void bench_report_text(const bench *b);
void bench_report_raw(const bench *b);

#endif
