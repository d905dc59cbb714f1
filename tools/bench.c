/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio bench`: save and load a synthetic training state and report it as a fraction of the
 * raw device bandwidth measured in the same directory, in the same run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckptio.h"
#include "ckptio_config.h"
#include "cli.h"
#include "commands.h"

#if CKPTIO_HAVE_IO_URING
#include <liburing.h>
#endif

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

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bench_fail(const char *fmt, ...)
{
    cli_progress_end();
    va_list ap;
    va_start(ap, fmt);
    fputs("ckptio bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_FAIL;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* ------------------------------------------------------------------------------------------ */
/* The synthetic state                                                                        */
/* ------------------------------------------------------------------------------------------ */

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
static int plan_state(bench *b)
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
static void fill_random(unsigned char *p, uint64_t n, uint64_t seed)
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

typedef struct piece {
    unsigned char *p;
    uint64_t len, seed; /* seed 0: zero the bytes (touching the pages) */
} piece;

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
            fill_random(pc->p, pc->len, pc->seed);
        else
            memset(pc->p, 0, pc->len);
    }
    return NULL;
}

/* Generation is spread over the cores so it does not dominate the run; pieces of at most
 * 64 MiB keep one large embedding from leaving the other threads idle. */
static int fill_parallel(piece *pieces, size_t n)
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

static int alloc_state(bench *b)
{
    size_t align = ckptio_alignment();
    b->dst_len = 0;
    for (size_t i = 0; i < b->n; i++) {
        tensor *t = &b->t[i];
        /* Large tensors get page-aligned memory as a framework's allocator gives them; small
         * ones 64-byte alignment, as PyTorch's CPU allocator does. */
        size_t a = t->nbytes >= align ? align : 64;
        void *p = NULL;
        if (posix_memalign(&p, a, align_up(t->nbytes ? t->nbytes : 1, a)) != 0) return -ENOMEM;
        t->data = p;
        t->cap = align_up(t->nbytes ? t->nbytes : 1, align);
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
    fill_parallel(pieces, np);
    free(pieces);
    return 0;
}

static void free_state(bench *b)
{
    for (size_t i = 0; i < b->n; i++)
        free(b->t[i].data);
    if (b->dst_arena) munmap(b->dst_arena, b->dst_len);
    if (b->raw_buf) munmap(b->raw_buf, RAW_ARENA);
    free(b->regions);
    free(b->t);
    free(b->names);
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int evict_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (type != FTW_F) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    /* Dirty pages cannot be dropped, so sync them first. */
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return 0;
}

/* Drop a file's or a directory tree's pages from the page cache, so the next read is cold. */
static void evict(const char *path)
{
    nftw(path, evict_one, 16, FTW_PHYS);
}

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Let the file system finish freeing what was just deleted (journal commits, discards) before
 * the next timed phase, so neither contender pays for the other's leftovers. */
static void settle(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    syncfs(fd);
    close(fd);
}

static bool vm_kib(const char *field, uint64_t *out)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return false;
    char line[256];
    size_t fl = strlen(field);
    bool ok = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (!strncmp(line, field, fl) && sscanf(line + fl, ": %llu", &v) == 1) {
            *out = v;
            ok = true;
            break;
        }
    }
    fclose(f);
    return ok;
}

static uint64_t peak_rss_kib(void)
{
    uint64_t v;
    if (vm_kib("VmHWM", &v)) return v;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss;
}

static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return UINT64_MAX;
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            found = true;
            break;
        }
    fclose(f);
    return found ? (uint64_t)kib * 1024 : UINT64_MAX;
}

/* ------------------------------------------------------------------------------------------ */
/* Raw device bandwidth                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct raw_io {
    int fd;
    bool write;
    uint64_t bytes, req;
    unsigned depth;
    unsigned char *buf;
    atomic_uint_fast64_t next, done;
    atomic_int err;
    uint64_t err_off;
} raw_io;

static void raw_set_err(raw_io *io, int err, uint64_t off)
{
    int zero = 0;
    if (atomic_compare_exchange_strong(&io->err, &zero, err)) io->err_off = off;
}

typedef struct raw_thread_arg {
    raw_io *io;
    unsigned slot;
} raw_thread_arg;

static void *raw_thread(void *arg)
{
    raw_thread_arg *a = arg;
    raw_io *io = a->io;
    unsigned char *buf = io->buf + (size_t)a->slot * io->req;
    while (!atomic_load(&io->err) && !interrupted) {
        uint64_t off = atomic_fetch_add(&io->next, io->req);
        if (off >= io->bytes) break;
        uint64_t len = io->bytes - off < io->req ? io->bytes - off : io->req;
        for (uint64_t pos = 0; pos < len;) {
            ssize_t n = io->write ? pwrite(io->fd, buf + pos, len - pos, (off_t)(off + pos))
                                  : pread(io->fd, buf + pos, len - pos, (off_t)(off + pos));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                raw_set_err(io, n < 0 ? errno : EIO, off + pos);
                return NULL;
            }
            pos += (uint64_t)n;
        }
        cli_progress_set(atomic_fetch_add(&io->done, len) + len);
    }
    return NULL;
}

/* A pool of `depth` threads, each with one request in flight: the fallback without io_uring. */
static int raw_threads(raw_io *io)
{
    pthread_t th[32];
    raw_thread_arg args[32];
    unsigned started = 0;
    for (; started < io->depth; started++) {
        args[started] = (raw_thread_arg){io, started};
        if (pthread_create(&th[started], NULL, raw_thread, &args[started]) != 0) break;
    }
    if (!started) return -EAGAIN;
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return -atomic_load(&io->err);
}

#if CKPTIO_HAVE_IO_URING
/* Keeps `depth` requests in flight until the file is covered; retries short transfers. */
static int raw_uring(raw_io *io)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(io->depth, &ring, 0);
    if (rc < 0) return rc;
    uint64_t s_off[32], s_len[32], s_pos[32];
    unsigned free_slots[32], nfree = 0, retry[32], nretry = 0, inflight = 0;
    for (unsigned i = 0; i < io->depth; i++)
        free_slots[nfree++] = io->depth - 1 - i;
    uint64_t next = 0, done = 0;
    rc = 0;
    while ((next < io->bytes || inflight) && rc == 0) {
        while (rc == 0 && !interrupted && (nretry || (nfree && next < io->bytes))) {
            unsigned s;
            if (nretry) {
                s = retry[--nretry];
            } else {
                s = free_slots[--nfree];
                s_off[s] = next;
                s_len[s] = io->bytes - next < io->req ? io->bytes - next : io->req;
                s_pos[s] = 0;
                next += s_len[s];
            }
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe) {
                retry[nretry++] = s;
                break;
            }
            unsigned char *p = io->buf + (size_t)s * io->req + s_pos[s];
            unsigned len = (unsigned)(s_len[s] - s_pos[s]);
            uint64_t off = s_off[s] + s_pos[s];
            if (io->write)
                io_uring_prep_write(sqe, io->fd, p, len, off);
            else
                io_uring_prep_read(sqe, io->fd, p, len, off);
            io_uring_sqe_set_data(sqe, (void *)(uintptr_t)s);
            inflight++;
        }
        if (interrupted) rc = -EINTR;
        if (!inflight) break;
        int sr = io_uring_submit_and_wait(&ring, 1);
        if (sr < 0 && sr != -EINTR) {
            rc = sr;
            break;
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            unsigned s = (unsigned)(uintptr_t)io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            if (res == -EINTR || res == -EAGAIN) {
                retry[nretry++] = s;
            } else if (res < 0 || (res == 0 && !io->write)) {
                if (!rc) rc = res < 0 ? res : -EIO, io->err_off = s_off[s] + s_pos[s];
            } else if ((s_pos[s] += (uint64_t)res) < s_len[s]) {
                retry[nretry++] = s;
            } else {
                done += s_len[s];
                free_slots[nfree++] = s;
                cli_progress_set(done);
            }
        }
    }
    /* Never leave the kernel writing into buffers we are about to reuse. */
    while (inflight) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    io_uring_queue_exit(&ring);
    return rc;
}
#endif

/* Run one pass over the raw file; sets *engine to what moved the bytes. */
static int raw_pass(bench *b, raw_io *io, const char **engine)
{
#if CKPTIO_HAVE_IO_URING
    int rc = raw_uring(io);
    if (rc == 0 || (rc != -ENOSYS && rc != -EPERM && rc != -ENOMEM && rc != -EOPNOTSUPP)) {
        *engine = "io_uring";
        return rc;
    }
#endif
    (void)b;
    *engine = "pwrite/pread threads";
    atomic_store(&io->next, 0);
    atomic_store(&io->done, 0);
    atomic_store(&io->err, 0);
    return raw_threads(io);
}

static int raw_open(const char *path, bool write, int *direct)
{
    int flags = write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
    int fd = open(path, flags | O_CLOEXEC | O_DIRECT, 0644);
    *direct = fd >= 0;
    /* tmpfs and some FUSE file systems refuse O_DIRECT: measure through the page cache. */
    if (fd < 0 && errno == EINVAL) fd = open(path, flags | O_CLOEXEC, 0644);
    return fd;
}

static int raw_run(bench *b, unsigned run)
{
    raw_io io = {.write = true,
                 .bytes = b->raw_bytes,
                 .req = RAW_WRITE_REQ,
                 .depth = RAW_WRITE_DEPTH,
                 .buf = b->raw_buf};
    int direct = 0;
    cli_progress_begin(b->raw_bytes, "run %u/%u: raw write", run + 1, b->runs);
    double t0 = cli_now();
    io.fd = raw_open(b->raw, true, &direct);
    if (io.fd < 0)
        return bench_fail("cannot create %s for the raw measurement: %s", b->raw, strerror(errno));
    int rc = raw_pass(b, &io, &b->raw_engine);
    if (rc == -EINVAL && direct) {
        /* O_DIRECT accepted at open but refused on write: measure buffered instead. */
        close(io.fd);
        io.fd = raw_open(b->raw, true, &direct);
        if (io.fd >= 0) {
            int fl = fcntl(io.fd, F_GETFL);
            fcntl(io.fd, F_SETFL, fl & ~O_DIRECT);
        }
        direct = 0;
        t0 = cli_now();
        rc = io.fd < 0 ? -errno : raw_pass(b, &io, &b->raw_engine);
    }
    if (rc == 0 && fsync(io.fd) < 0) rc = -errno, io.err_off = b->raw_bytes;
    double t1 = cli_now();
    if (io.fd >= 0) close(io.fd);
    cli_progress_end();
    if (interrupted) return CLI_FAIL;
    if (rc < 0)
        return bench_fail("raw write of %s failed at offset %" PRIu64 ": %s; check free space "
                          "and the device, or try a smaller --size",
                          b->raw, io.err_off, strerror(-rc));
    b->raw_direct = direct;
    b->raw_w.v[b->raw_w.n++] = (double)b->raw_bytes / (t1 - t0) / 1e9;

    evict(b->raw);
    raw_io rio = {.write = false,
                  .bytes = b->raw_bytes,
                  .req = RAW_READ_REQ,
                  .depth = RAW_READ_DEPTH,
                  .buf = b->raw_buf};
    cli_progress_begin(b->raw_bytes, "run %u/%u: raw read", run + 1, b->runs);
    t0 = cli_now();
    rio.fd = raw_open(b->raw, false, &direct);
    if (rio.fd < 0)
        return bench_fail("cannot open %s for the raw measurement: %s", b->raw, strerror(errno));
    if (!b->raw_direct) {
        int fl = fcntl(rio.fd, F_GETFL);
        fcntl(rio.fd, F_SETFL, fl & ~O_DIRECT);
    }
    rc = raw_pass(b, &rio, &b->raw_engine);
    t1 = cli_now();
    close(rio.fd);
    cli_progress_end();
    unlink(b->raw);
    settle(b->dir);
    if (interrupted) return CLI_FAIL;
    if (rc < 0)
        return bench_fail("raw read of %s failed at offset %" PRIu64 ": %s", b->raw, rio.err_off,
                          strerror(-rc));
    b->raw_r.v[b->raw_r.n++] = (double)b->raw_bytes / (t1 - t0) / 1e9;
    return CLI_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* ckptio save and load                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Save every tensor durably; returns the seconds from open to commit's return, or < 0. */
static double save_all(const char *path, const tensor *ts, size_t n, const char *label,
                       ckptio_stats *st)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    ckptio_writer *w = NULL;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++)
        total += ts[i].nbytes;
    cli_progress_begin(total, "%s", label);
    double t0 = cli_now();
    int rc = ckptio_writer_open(&w, path, &p);
    if (rc < 0) {
        bench_fail("cannot start the checkpoint %s: %s", path, ckptio_last_error());
        return -1;
    }
    for (size_t i = 0; i < n && !interrupted; i++) {
        const tensor *t = &ts[i];
        rc = ckptio_writer_add(w, t->name, t->dtype, t->ndim, t->shape, NULL, NULL, t->data,
                               t->nbytes);
        if (rc < 0) {
            bench_fail("saving tensor '%s' to %s failed: %s", t->name, path,
                       ckptio_writer_errmsg(w));
            ckptio_writer_close(w);
            return -1;
        }
        done += t->nbytes;
        cli_progress_set(done);
    }
    if (interrupted) {
        cli_progress_end();
        ckptio_writer_close(w);
        return -1;
    }
    rc = ckptio_writer_commit(w);
    double t1 = cli_now();
    cli_progress_end();
    if (rc < 0) {
        bench_fail("committing the checkpoint %s failed: %s", path, ckptio_writer_errmsg(w));
        ckptio_writer_close(w);
        return -1;
    }
    ckptio_writer_stats(w, st);
    ckptio_writer_close(w);
    return t1 - t0;
}

/* Name the data file behind a tensor, for messages about wrong data (the bench writes every
 * tensor as one chunk). */
static void locate(ckptio_reader *r, const char *name, char *out, size_t n)
{
    snprintf(out, n, "data file unknown");
    int64_t ti = ckptio_reader_find(r, name);
    ckptio_chunk_info ci;
    if (ti >= 0 && ckptio_reader_chunk(r, (size_t)ti, 0, &ci) >= 0)
        snprintf(out, n, "data file %s, chunk at offset %" PRIu64, ci.file, ci.file_offset);
}

/* Load every tensor with one read call; returns seconds from open to the read's end, or < 0.
 * With `check`, compares the loaded bytes with the saved ones afterwards (not timed). */
static double load_all(const char *path, const tensor *ts, const ckptio_region *regions, size_t n,
                       const char *label, bool check, ckptio_stats *st)
{
    /* One library call does the work, so the progress line can only show that time passes. */
    cli_progress_begin(0, "%s", label);
    double t0 = cli_now();
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, path, NULL);
    if (rc < 0) {
        bench_fail("cannot open the checkpoint %s: %s", path, ckptio_last_error());
        return -1;
    }
    rc = ckptio_reader_read(r, regions, n);
    double t1 = cli_now();
    cli_progress_end();
    if (rc < 0) {
        bench_fail("loading %s failed: %s", path, ckptio_reader_errmsg(r));
        ckptio_reader_close(r);
        return -1;
    }
    ckptio_reader_stats(r, st);
    for (size_t i = 0; check && i < n; i++) {
        const tensor *t = &ts[i];
        if (!memcmp(t->data, t->dst, t->nbytes)) continue;
        uint64_t k = 0;
        while (k < t->nbytes && t->data[k] == t->dst[k])
            k++;
        char where[PATH_MAX + 96];
        locate(r, t->name, where, sizeof where);
        bench_fail("tensor '%s' loaded from %s (%s) differs from what was saved, first at byte "
                   "%" PRIu64 " of %" PRIu64 ", and the library reported no error: please "
                   "report this with the output of `ckptio doctor %s`",
                   t->name, path, where, k, t->nbytes, path);
        ckptio_reader_close(r);
        return -1;
    }
    ckptio_reader_close(r);
    return t1 - t0;
}

static int ckptio_run(bench *b, unsigned run)
{
    char label[96];
    /* Each save writes a fresh checkpoint, as a training job's next step would. */
    remove_tree(b->ckpt);
    settle(b->dir);
    ckptio_stats st;
    memset(&st, 0, sizeof st);
    snprintf(label, sizeof label, "run %u/%u: ckptio save", run + 1, b->runs);
    double s = save_all(b->ckpt, b->t, b->n, label, &st);
    if (s < 0) return CLI_FAIL;
    memcpy(b->backend, st.backend, sizeof b->backend);
    b->backend[sizeof b->backend - 1] = 0;
    b->direct = st.direct;
    b->save_s.v[b->save_s.n++] = s;
    b->save.v[b->save.n++] = (double)b->bytes / s / 1e9;

    evict(b->ckpt);
    memset(&st, 0, sizeof st);
    snprintf(label, sizeof label, "run %u/%u: ckptio load", run + 1, b->runs);
    double l = load_all(b->ckpt, b->t, b->regions, b->n, label, run == 0, &st);
    if (l < 0) return CLI_FAIL;
    memcpy(b->load_backend, st.backend, sizeof b->load_backend);
    b->load_backend[sizeof b->load_backend - 1] = 0;
    b->load_direct = st.direct;
    b->load_s.v[b->load_s.n++] = l;
    b->load.v[b->load.n++] = (double)b->bytes / l / 1e9;
    return CLI_OK;
}

static int warm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (type != FTW_F) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
    return 0;
}

/* Seconds for a verify (load: a read of every tensor) of the resident checkpoint, or < 0. */
static double warm_pass(bench *b, uint32_t threads, bool load, ckptio_read_stats *rs)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.verify_threads = threads;
    ckptio_reader *r = NULL;
    double t0 = cli_now();
    if (ckptio_reader_open(&r, b->ckpt, &p) < 0) {
        bench_fail("cannot open the checkpoint %s: %s", b->ckpt, ckptio_last_error());
        return -1;
    }
    int rc = load ? ckptio_reader_read(r, b->regions, b->n) : ckptio_reader_verify(r, NULL);
    double t = cli_now() - t0;
    if (rc < 0) bench_fail("%s %s failed: %s", load ? "loading" : "verifying", b->ckpt,
                           ckptio_reader_errmsg(r));
    *rs = (ckptio_read_stats){.size = sizeof *rs};
    ckptio_reader_read_stats(r, rs);
    ckptio_reader_close(r);
    return rc < 0 ? -1 : t;
}

/* The checkpoint read back through the page cache (after a buffered read of its files): what
 * a second load of a resident checkpoint costs, and the checksum rate on 1 and on N threads. */
static int warm_run(bench *b)
{
    cli_progress_begin(0, "warm load and verify");
    nftw(b->ckpt, warm_one, 16, FTW_PHYS);
    ckptio_read_stats rs;
    double l = warm_pass(b, 0, true, &rs);
    double v1 = l < 0 ? -1 : warm_pass(b, 1, false, &rs);
    double vn = v1 < 0 ? -1 : warm_pass(b, 0, false, &rs);
    cli_progress_end();
    if (vn < 0) return CLI_FAIL;
    b->warm_load = (double)b->bytes / l / 1e9;
    b->warm_verify1 = (double)b->bytes / v1 / 1e9;
    b->warm_verify_n = (double)b->bytes / vn / 1e9;
    b->verify_threads = rs.verify_threads;
    b->warm_cache_bytes = rs.cache_bytes;
    return CLI_OK;
}

/* 100000 tensors of 1..64 f32 elements: the per-tensor cost, which bandwidth hides. */
static int tiny_run(bench *b)
{
    size_t n = (size_t)b->tiny;
    tensor *ts = calloc(n, sizeof *ts);
    ckptio_region *regs = calloc(n, sizeof *regs);
    char *names = malloc(n * 32);
    uint64_t x = 0x5DEECE66Dull, len = 0;
    uint32_t *elems = malloc(n * sizeof *elems);
    if (!ts || !regs || !names || !elems) {
        free(ts), free(regs), free(names), free(elems);
        return bench_fail("out of memory for %zu tiny tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        elems[i] = 1 + (uint32_t)(x % 64);
        len += align_up(elems[i] * 4u, 64);
    }
    unsigned char *src = malloc(len), *dst = malloc(len);
    int ret = CLI_FAIL;
    if (!src || !dst) {
        bench_fail("out of memory for %zu tiny tensors", n);
        goto out;
    }
    fill_random(src, len, 77);
    memset(dst, 0, len);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tensor *t = &ts[i];
        snprintf(names + i * 32, 32, "tiny.%06zu", i);
        t->name = names + i * 32;
        t->dtype = CKPTIO_DT_F32;
        t->ndim = 1;
        t->shape[0] = elems[i];
        t->nbytes = elems[i] * 4u;
        t->data = src + off;
        t->dst = dst + off;
        regs[i] = (ckptio_region){.size = sizeof(ckptio_region), .name = t->name, .dst = t->dst,
                                  .capacity = t->nbytes};
        off += align_up(t->nbytes, 64);
    }
    b->tiny_bytes = 0;
    for (size_t i = 0; i < n; i++)
        b->tiny_bytes += ts[i].nbytes;
    remove_tree(b->tinydir);
    settle(b->dir);
    ckptio_stats st;
    double s = save_all(b->tinydir, ts, n, "tiny tensors: save", &st);
    if (s < 0) goto out;
    evict(b->tinydir);
    double l = load_all(b->tinydir, ts, regs, n, "tiny tensors: load", true, &st);
    if (l < 0) goto out;
    b->tiny_save_s = s;
    b->tiny_load_s = l;
    ret = CLI_OK;
out:
    free(src), free(dst), free(ts), free(regs), free(names), free(elems);
    return ret;
}

/* ------------------------------------------------------------------------------------------ */
/* Report                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(const series *s, double *med, double *lo, double *hi)
{
    double v[64];
    memcpy(v, s->v, s->n * sizeof v[0]);
    qsort(v, s->n, sizeof v[0], cmp_double);
    *lo = s->n ? v[0] : 0;
    *hi = s->n ? v[s->n - 1] : 0;
    *med = !s->n ? 0 : s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
}

static void json_series(const char *key, const series *s)
{
    double m, lo, hi;
    stats(s, &m, &lo, &hi);
    printf("  \"%s\": %.4f, \"%s_min\": %.4f, \"%s_max\": %.4f, \"%s_runs\": [", key, m, key, lo,
           key, hi, key);
    for (unsigned i = 0; i < s->n; i++)
        printf("%s%.4f", i ? ", " : "", s->v[i]);
    printf("],\n");
}

static void report_json(const bench *b)
{
    double rw, rr, sv, ld, lo, hi;
    stats(&b->raw_w, &rw, &lo, &hi);
    stats(&b->raw_r, &rr, &lo, &hi);
    stats(&b->save, &sv, &lo, &hi);
    stats(&b->load, &ld, &lo, &hi);
    char abs[PATH_MAX];
    const char *dir = realpath(b->dir, abs) ? abs : b->dir;
    printf("{\n  \"ckptio_version\": \"%s\",\n  \"dir\": ", ckptio_version_string());
    cli_json_str(stdout, dir, strlen(dir));
    printf(",\n  \"bytes\": %" PRIu64 ", \"tensors\": %zu, \"large_tensors\": %zu, "
           "\"hidden\": %u, \"layers\": %u, \"vocab\": %" PRIu64 ",\n",
           b->bytes, b->n, b->n_large, b->hidden, LAYERS, b->vocab);
    printf("  \"runs\": %u, \"order\": \"interleaved\", \"generate_seconds\": %.3f,\n", b->runs,
           b->gen_s);
    printf("  \"raw_bytes\": %" PRIu64 ", \"raw_engine\": \"%s\", \"raw_direct\": %s,\n",
           b->raw_bytes, b->raw_engine ? b->raw_engine : "", b->raw_direct ? "true" : "false");
    json_series("raw_write_gbps", &b->raw_w);
    json_series("raw_read_gbps", &b->raw_r);
    json_series("save_gbps", &b->save);
    json_series("load_gbps", &b->load);
    json_series("save_seconds", &b->save_s);
    json_series("load_seconds", &b->load_s);
    printf("  \"save_fraction\": %.4f, \"load_fraction\": %.4f,\n", rw > 0 ? sv / rw : 0,
           rr > 0 ? ld / rr : 0);
    printf("  \"backend\": \"%s\", \"direct\": %s, \"load_backend\": \"%s\", "
           "\"load_direct\": %s,\n",
           b->backend, b->direct ? "true" : "false", b->load_backend,
           b->load_direct ? "true" : "false");
    printf("  \"verified\": true, \"peak_extra_mib\": %.1f,\n", b->peak_extra_mib);
    printf("  \"warm_load_gbps\": %.4f, \"warm_verify_gbps_1\": %.4f, \"warm_verify_gbps_n\": "
           "%.4f, \"verify_threads\": %u, \"warm_cache_bytes\": %" PRIu64 ",\n",
           b->warm_load, b->warm_verify1, b->warm_verify_n, b->verify_threads,
           b->warm_cache_bytes);
    printf("  \"tiny_tensors\": %" PRIu64 ", \"tiny_bytes\": %" PRIu64
           ", \"tiny_save_seconds\": %.4f, \"tiny_load_seconds\": %.4f\n}\n",
           b->tiny, b->tiny_bytes, b->tiny_save_s, b->tiny_load_s);
}

static void report_text(const bench *b)
{
    char hb[32], hr[32];
    cli_human(hb, sizeof hb, (double)b->bytes);
    cli_human(hr, sizeof hr, (double)b->raw_bytes);
    char abs[PATH_MAX];
    const char *dir = realpath(b->dir, abs) ? abs : b->dir;
    printf("ckptio bench %s in %s\n", ckptio_version_string(), dir);
    printf("state: %s in %zu tensors (%zu of 1 MiB or more), hidden %u, %u layers, vocab %" PRIu64
           "\n       bf16 weights, f32 Adam moments, 0-d f32 steps; generated in %.1f s\n",
           hb, b->n, b->n_large, b->hidden, LAYERS, b->vocab, b->gen_s);
    printf("ckptio: %s backend, O_DIRECT %s (load: %s, O_DIRECT %s)\n", b->backend,
           b->direct ? "yes" : "no", b->load_backend, b->load_direct ? "yes" : "no");
    printf("raw:    %s, O_DIRECT %s, %s file; 8 MiB writes x16 then fsync, 16 MiB reads x8\n",
           b->raw_engine, b->raw_direct ? "yes" : "no", hr);
    printf("%u run%s, each: raw write + read, then ckptio save (durable) + load (cold cache)\n\n",
           b->runs, b->runs == 1 ? "" : "s");
    printf("                median GB/s      min - max       of raw\n");
    const struct {
        const char *name;
        const series *s;
        const series *raw;
    } rows[] = {{"raw write", &b->raw_w, NULL},
                {"raw read", &b->raw_r, NULL},
                {"ckptio save", &b->save, &b->raw_w},
                {"ckptio load", &b->load, &b->raw_r}};
    for (size_t i = 0; i < 4; i++) {
        double m, lo, hi;
        stats(rows[i].s, &m, &lo, &hi);
        if (rows[i].raw) {
            double rm, rlo, rhi;
            stats(rows[i].raw, &rm, &rlo, &rhi);
            printf("  %-12s %10.2f   %7.2f - %-7.2f   %5.2f\n", rows[i].name, m, lo, hi,
                   rm > 0 ? m / rm : 0);
        } else {
            printf("  %-12s %10.2f   %7.2f - %.2f\n", rows[i].name, m, lo, hi);
        }
    }
    double sm, lm, lo, hi;
    stats(&b->save_s, &sm, &lo, &hi);
    stats(&b->load_s, &lm, &lo, &hi);
    printf(
        "\nsave: open to durable commit, median %.2f s; load: open to last byte, median %.2f s\n",
        sm, lm);
    printf("loaded bytes match the saved state; peak memory beyond state and destinations: "
           "%.1f MiB\n",
           b->peak_extra_mib);
    printf("resident in the page cache: load %.2f GB/s; verify (cache copy + XXH3) %.2f GB/s on "
           "1 thread, %.2f GB/s on %u\n",
           b->warm_load, b->warm_verify1, b->warm_verify_n, b->verify_threads);
    if (b->tiny)
        printf("tiny tensors: %" PRIu64
               " of 1-64 f32 elements: save %.3f s (durable), load %.3f s\n",
               b->tiny, b->tiny_save_s, b->tiny_load_s);
}

/* ------------------------------------------------------------------------------------------ */

static int parse_args(bench *b, int argc, char **argv)
{
    b->dir = "ckptio-bench";
    b->size = 4 * GIB;
    b->runs = 3;
    b->tiny = 100000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        bool takes = !strcmp(a, "--dir") || !strcmp(a, "--size") || !strcmp(a, "--runs") ||
                     !strcmp(a, "--tiny");
        if (takes) {
            if (i + 1 >= argc) return cli_usage_error("bench: %s needs a value", a);
            val = argv[++i];
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--json")) {
            b->json = true;
        } else if (!strcmp(a, "--keep")) {
            b->keep = true;
        } else if (!strcmp(a, "--raw-only")) {
            b->raw_only = true;
        } else if (!strcmp(a, "--dir")) {
            if (!*val) return cli_usage_error("bench: --dir needs a directory");
            b->dir = val;
        } else if (!strcmp(a, "--size")) {
            if (cli_parse_size(val, &b->size) < 0 || b->size < MIB)
                return cli_usage_error("bench: --size '%s' is not a size of at least 1M "
                                       "(e.g. 512M, 4G)",
                                       val);
        } else if (!strcmp(a, "--runs") || !strcmp(a, "--tiny")) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(val, &end, 10);
            bool runs = !strcmp(a, "--runs");
            if (errno || end == val || *end || val[0] == '-' || (runs && (v < 1 || v > 64)) ||
                (!runs && v > 10000000))
                return cli_usage_error("bench: %s '%s' is not a number in %s", a, val,
                                       runs ? "1..64" : "0..10000000");
            if (runs)
                b->runs = (unsigned)v;
            else
                b->tiny = v;
        } else {
            return cli_usage_error("bench: unknown option '%s'", a);
        }
    }
    return CLI_OK;
}

static int setup_dir(bench *b)
{
    if (mkdir(b->dir, 0755) == 0) {
        b->made_dir = true;
    } else if (errno != EEXIST) {
        return bench_fail("cannot create the bench directory %s: %s (create its parent or pass "
                          "--dir)",
                          b->dir, strerror(errno));
    } else {
        struct stat st;
        if (stat(b->dir, &st) < 0 || !S_ISDIR(st.st_mode))
            return bench_fail("%s exists and is not a directory; pass another --dir", b->dir);
    }
    int n1 = snprintf(b->ckpt, sizeof b->ckpt, "%s/bench-state", b->dir);
    int n2 = snprintf(b->raw, sizeof b->raw, "%s/bench-raw.bin", b->dir);
    int n3 = snprintf(b->tinydir, sizeof b->tinydir, "%s/bench-tiny", b->dir);
    if (n1 >= (int)sizeof b->ckpt || n2 >= (int)sizeof b->raw || n3 >= (int)sizeof b->tinydir)
        return bench_fail("--dir %s is too long", b->dir);
    return CLI_OK;
}

static void cleanup(bench *b)
{
    unlink(b->raw);
    if (b->keep) return;
    remove_tree(b->ckpt);
    remove_tree(b->tinydir);
    if (b->made_dir) rmdir(b->dir);
}

/* --raw-only: only the raw device measurement, on a --size file (for other benchmarks, such as
 * bench/run.py, to set their figures against). */
static int run_raw_only(bench *b)
{
    b->raw_bytes = align_up(b->size, RAW_READ_REQ);
    struct statvfs sv;
    if (statvfs(b->dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < b->raw_bytes)
        return bench_fail("%s has too little free space for a --size file; pass a smaller --size",
                          b->dir);
    b->raw_buf = mmap(NULL, RAW_ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->raw_buf == MAP_FAILED) {
        b->raw_buf = NULL;
        return bench_fail("out of memory allocating the I/O buffers");
    }
    piece pieces[RAW_ARENA / (64 * MIB)];
    size_t np = 0;
    for (uint64_t o = 0; o < RAW_ARENA; o += 64 * MIB)
        pieces[np++] = (piece){b->raw_buf + o, 64 * MIB, 0xC0FFEEull + o};
    fill_parallel(pieces, np);
    for (unsigned run = 0; run < b->runs; run++)
        if (interrupted || raw_run(b, run) != CLI_OK) return CLI_FAIL;
    if (b->json) {
        printf("{\n  \"raw_bytes\": %" PRIu64 ", \"raw_engine\": \"%s\", \"raw_direct\": %s,\n",
               b->raw_bytes, b->raw_engine ? b->raw_engine : "", b->raw_direct ? "true" : "false");
        json_series("raw_write_gbps", &b->raw_w);
        json_series("raw_read_gbps", &b->raw_r);
        printf("  \"runs\": %u\n}\n", b->runs);
    } else {
        double wm, rm, wlo, whi, rlo, rhi;
        stats(&b->raw_w, &wm, &wlo, &whi);
        stats(&b->raw_r, &rm, &rlo, &rhi);
        printf("raw write %.2f GB/s (%.2f - %.2f), raw read %.2f GB/s (%.2f - %.2f); %s, "
               "O_DIRECT %s\n",
               wm, wlo, whi, rm, rlo, rhi, b->raw_engine, b->raw_direct ? "yes" : "no");
    }
    return fflush(stdout) == 0 ? CLI_OK : bench_fail("writing the report: %s", strerror(errno));
}

static int run_bench(bench *b)
{
    char hb[32], hn[32];
    if (b->raw_only) return run_raw_only(b);
    if (plan_state(b) < 0) return bench_fail("out of memory planning the state");
    b->raw_bytes = align_up(b->bytes > RAW_MIN_BYTES ? b->bytes : RAW_MIN_BYTES, RAW_READ_REQ);

    uint64_t need_mem = b->bytes * 2 + (uint64_t)b->n * 4096 + RAW_ARENA + 256 * MIB;
    uint64_t avail = mem_available();
    if (need_mem > avail) {
        cli_human(hb, sizeof hb, (double)need_mem);
        cli_human(hn, sizeof hn, (double)avail);
        return bench_fail("--size needs about %s of memory (the state, its load destinations "
                          "and I/O buffers) but %s is available; pass a smaller --size",
                          hb, hn);
    }
    struct statvfs sv;
    uint64_t state_disk = b->bytes + (uint64_t)b->n * 4096 + 64 * MIB;
    uint64_t need_disk = (state_disk > b->raw_bytes ? state_disk : b->raw_bytes) + b->tiny * 4096;
    if (statvfs(b->dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < need_disk) {
        cli_human(hb, sizeof hb, (double)need_disk);
        cli_human(hn, sizeof hn, (double)sv.f_bavail * (double)sv.f_frsize);
        return bench_fail("%s has %s free but the bench needs about %s; pass a smaller --size "
                          "or another --dir",
                          b->dir, hn, hb);
    }

    cli_progress_begin(0, "generating the state");
    double t0 = cli_now();
    if (alloc_state(b) < 0) return bench_fail("out of memory allocating the state");
    b->gen_s = cli_now() - t0;
    cli_progress_end();

    /* Everything the bench itself holds is resident now; the peak above it is the library's. */
    uint64_t base = 0;
    if (!vm_kib("VmRSS", &base)) base = peak_rss_kib();
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        /* "5" resets VmHWM to the current RSS (Linux >= 4.0). */
        if (write(fd, "5", 1) < 0) {
        }
        close(fd);
    }

    for (unsigned run = 0; run < b->runs; run++) {
        if (raw_run(b, run) != CLI_OK) return CLI_FAIL;
        if (interrupted || ckptio_run(b, run) != CLI_OK) return CLI_FAIL;
    }
    uint64_t peak = peak_rss_kib();
    b->peak_extra_mib = peak > base ? (double)(peak - base) / 1024.0 : 0.0;
    if (interrupted || warm_run(b) != CLI_OK) return CLI_FAIL;
    if (!b->keep) remove_tree(b->ckpt);
    if (b->tiny && (interrupted || tiny_run(b) != CLI_OK)) return CLI_FAIL;
    if (interrupted) return CLI_FAIL;
    if (b->json)
        report_json(b);
    else
        report_text(b);
    return fflush(stdout) == 0 ? CLI_OK : bench_fail("writing the report: %s", strerror(errno));
}

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--merge")) return cmd_bench_merge(argc, argv);
    bench *b = calloc(1, sizeof *b);
    if (!b) return cli_fail("bench", "out of memory");
    int rc = parse_args(b, argc, argv);
    if (rc != CLI_OK) {
        free(b);
        return rc < 0 ? CLI_OK : rc;
    }
    if (setup_dir(b) != CLI_OK) {
        free(b);
        return CLI_FAIL;
    }
    /* Ctrl-C stops at the next step and still removes the bench files; a second one kills. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    rc = run_bench(b);
    cli_progress_end();
    if (interrupted) {
        fprintf(stderr, "ckptio bench: interrupted; removing the bench files\n");
        rc = CLI_FAIL;
    }
    cleanup(b);
    free_state(b);
    free(b);
    return rc;
}
