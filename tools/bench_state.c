/* SPDX-License-Identifier: Apache-2.0 */
/* The synthetic training state `ckptio bench` saves: a GPT-shaped model with its Adam moments
 * sized to --size, its load destinations, and the parallel filling of both. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"

/* Names live in one growing arena and are fixed up to pointers once it stops moving. */
static int add_tensor(bench *b, int dtype, uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));
static int add_tensor(bench *b, int dtype, uint32_t ndim, uint64_t d0, uint64_t d1, const char *fmt,
                      ...)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        tensor *t = realloc(b->t, cap * sizeof *t);
        if (!t) return -ENOMEM;
        b->t = t, b->cap = cap;
    }
    if (b->names_cap - b->names_len < 256) {
        size_t cap = b->names_cap ? b->names_cap * 2 : 65536;
        char *p = realloc(b->names, cap);
        if (!p) return -ENOMEM;
        b->names = p, b->names_cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(b->names + b->names_len, 256, fmt, ap);
    va_end(ap);
    if (len < 0 || len >= 256) return -ENAMETOOLONG;
    tensor *t = &b->t[b->n++];
    memset(t, 0, sizeof *t);
    t->name = (const char *)(uintptr_t)b->names_len; /* an offset until fix-up */
    b->names_len += (size_t)len + 1;
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0, t->shape[1] = d1;
    t->nbytes = ckptio_dtype_size(dtype);
    for (uint32_t i = 0; i < ndim; i++)
        t->nbytes *= t->shape[i];
    b->bytes += t->nbytes;
    return 0;
}

typedef struct param {
    const char *name;
    uint64_t rows, cols; /* cols 0: a vector */
} param;

/* bf16 weight, two f32 Adam moments and a 0-d f32 step per parameter, as PyTorch's AdamW keeps. */
static uint64_t param_bytes(uint64_t elems)
{
    return elems * 2 + elems * 4 * 2 + 4;
}

static uint64_t layer_bytes(uint64_t h)
{
    /* qkv, out, fc1, fc2 matrices; their four biases; two layer norms (weight, bias). */
    return param_bytes(3 * h * h) + param_bytes(h * h) + param_bytes(4 * h * h) +
           param_bytes(4 * h * h) + param_bytes(3 * h) + param_bytes(4 * h) + 6 * param_bytes(h);
}

static int add_param(bench *b, const char *name, uint64_t rows, uint64_t cols, param *list,
                     size_t *np)
{
    list[*np] = (param){name, rows, cols};
    (*np)++;
    return cols ? add_tensor(b, CKPTIO_DT_BF16, 2, rows, cols, "model.%s", name)
                : add_tensor(b, CKPTIO_DT_BF16, 1, rows, 0, "model.%s", name);
}

/* A GPT-shaped model of LAYERS layers whose hidden size and vocabulary make the whole state
 * (weights + optimizer) land on --size: layers take about 85%, the embedding the rest. */
int bench_plan_state(bench *b)
{
    uint64_t target = b->size, h = 8;
    while (LAYERS * layer_bytes(h + 8) <= target / 100 * 85)
        h += 8;
    if (h >= 256) h = h / 64 * 64; /* matrix sizes a real model would use */
    uint64_t fixed = LAYERS * layer_bytes(h) + 2 * param_bytes(h) + 4;
    uint64_t vocab = target > fixed ? (target - fixed) / (10 * h) : 8;
    vocab = vocab >= 16 ? vocab / 8 * 8 : 8;
    b->hidden = (unsigned)h;
    b->vocab = vocab;

    size_t nparams = 0, cap = 3 + LAYERS * 12;
    param *list = calloc(cap, sizeof *list);
    char *pnames = calloc(cap, 64);
    if (!list || !pnames) {
        free(list);
        free(pnames);
        return -ENOMEM;
    }
    int rc = add_param(b, "embed.weight", vocab, h, list, &nparams);
    static const struct {
        const char *suffix;
        unsigned rows, cols; /* multiples of h; cols 0 = vector */
    } layer[] = {
        {"attn.qkv.weight", 3, 1}, {"attn.qkv.bias", 3, 0}, {"attn.out.weight", 1, 1},
        {"attn.out.bias", 1, 0},   {"ln1.weight", 1, 0},    {"ln1.bias", 1, 0},
        {"mlp.fc1.weight", 4, 1},  {"mlp.fc1.bias", 4, 0},  {"mlp.fc2.weight", 1, 4},
        {"mlp.fc2.bias", 1, 0},    {"ln2.weight", 1, 0},    {"ln2.bias", 1, 0},
    };
    for (unsigned l = 0; l < LAYERS && rc >= 0; l++) {
        for (size_t k = 0; k < sizeof layer / sizeof layer[0] && rc >= 0; k++) {
            char *nm = pnames + nparams * 64;
            snprintf(nm, 64, "layers.%u.%s", l, layer[k].suffix);
            rc = add_param(b, nm, layer[k].rows * h, layer[k].cols * h, list, &nparams);
        }
    }
    if (rc >= 0) rc = add_param(b, "norm.weight", h, 0, list, &nparams);
    if (rc >= 0) rc = add_param(b, "norm.bias", h, 0, list, &nparams);
    /* The optimizer's state follows the model's, in the order torch's state_dict gives. */
    for (size_t i = 0; i < nparams && rc >= 0; i++) {
        const param *p = &list[i];
        uint32_t nd = p->cols ? 2 : 1;
        rc = add_tensor(b, CKPTIO_DT_F32, nd, p->rows, p->cols, "optim.%s.exp_avg", p->name);
        if (rc >= 0)
            rc = add_tensor(b, CKPTIO_DT_F32, nd, p->rows, p->cols, "optim.%s.exp_avg_sq", p->name);
        if (rc >= 0) rc = add_tensor(b, CKPTIO_DT_F32, 0, 0, 0, "optim.%s.step", p->name);
    }
    free(list);
    free(pnames);
    if (rc < 0) return rc;
    for (size_t i = 0; i < b->n; i++)
        b->t[i].name = b->names + (uintptr_t)b->t[i].name;
    return 0;
}

/* Cheap non-constant bytes: one xorshift step per 8 bytes. */
void bench_fill_random(unsigned char *p, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

typedef struct fill_job {
    piece *pieces;
    size_t n;
    atomic_size_t next;
} fill_job;

static void *fill_main(void *arg)
{
    fill_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        piece *pc = &j->pieces[i];
        if (pc->seed)
            bench_fill_random(pc->p, pc->len, pc->seed);
        else
            memset(pc->p, 0, pc->len);
    }
    return NULL;
}

/* Generation is spread over the cores so it does not dominate the run; pieces of at most
 * 64 MiB keep one large embedding from leaving the other threads idle. */
int bench_fill_parallel(piece *pieces, size_t n)
{
    fill_job j = {pieces, n, 0};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned nt = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
    pthread_t th[16];
    unsigned started = 0;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, fill_main, &j) != 0) break;
    fill_main(&j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return 0;
}

int bench_alloc_state(bench *b)
{
    size_t align = ckptio_alignment();
    b->dst_len = 0;
    for (size_t i = 0; i < b->n; i++) {
        tensor *t = &b->t[i];
        /* Large tensors get page-aligned memory as a framework's allocator gives them; small
         * ones 64-byte alignment, as PyTorch's CPU allocator does. */
        size_t a = t->nbytes >= align ? align : 64;
        void *p = NULL;
        if (posix_memalign(&p, a, bench_align_up(t->nbytes ? t->nbytes : 1, a)) != 0)
            return -ENOMEM;
        t->data = p;
        t->cap = bench_align_up(t->nbytes ? t->nbytes : 1, align);
        b->dst_len += t->cap;
        if (t->nbytes >= LARGE_TENSOR) b->n_large++;
    }
    b->dst_arena =
        mmap(NULL, b->dst_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->dst_arena == MAP_FAILED) {
        b->dst_arena = NULL;
        return -ENOMEM;
    }
    b->raw_buf = mmap(NULL, RAW_ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->raw_buf == MAP_FAILED) {
        b->raw_buf = NULL;
        return -ENOMEM;
    }
    b->regions = calloc(b->n, sizeof *b->regions);
    size_t npieces = b->n + b->dst_len / (64 * MIB) + 2 * b->n + RAW_ARENA / (64 * MIB) + 1;
    piece *pieces = calloc(npieces, sizeof *pieces);
    if (!b->regions || !pieces) {
        free(pieces);
        return -ENOMEM;
    }
    size_t np = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < b->n; i++) {
        tensor *t = &b->t[i];
        t->dst = b->dst_arena + off;
        off += t->cap;
        b->regions[i] = (ckptio_region){.size = sizeof(ckptio_region), .name = t->name,
                                        .dst = t->dst, .capacity = t->cap};
        for (uint64_t o = 0; o < t->nbytes; o += 64 * MIB) {
            uint64_t len = t->nbytes - o < 64 * MIB ? t->nbytes - o : 64 * MIB;
            pieces[np++] = (piece){t->data + o, len, (i + 1) * 1000003u + o / (64 * MIB)};
        }
    }
    for (uint64_t o = 0; o < b->dst_len; o += 64 * MIB)
        pieces[np++] =
            (piece){b->dst_arena + o, b->dst_len - o < 64 * MIB ? b->dst_len - o : 64 * MIB, 0};
    for (uint64_t o = 0; o < RAW_ARENA; o += 64 * MIB)
        pieces[np++] = (piece){b->raw_buf + o, 64 * MIB, 0xC0FFEEull + o};
    bench_fill_parallel(pieces, np);
    free(pieces);
    return 0;
}

void bench_free_state(bench *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->t[i].data);
    if (b->dst_arena) munmap(b->dst_arena, b->dst_len);
    if (b->raw_buf) munmap(b->raw_buf, RAW_ARENA);
    free(b->regions);
    free(b->t);
    free(b->names);
}
