/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio bench`: save and load a synthetic training state and report it as a fraction of the
 * raw device bandwidth measured in the same directory, in the same run. This file is the
 * command: its options, its directory, the checks before a run and the order of the phases. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "commands.h"

volatile sig_atomic_t bench_interrupted;

static void on_signal(int sig)
{
    (void)sig;
    bench_interrupted = 1;
}

int bench_fail(const char *fmt, ...)
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

/* The bench's memory: what it holds at its peak, and what the machine has available. */
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
/* Options, the bench directory and the order of the phases                                   */
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
    bench_remove_tree(b->ckpt);
    bench_remove_tree(b->tinydir);
    if (b->made_dir) rmdir(b->dir);
}

/* --raw-only: only the raw device measurement, on a --size file (for other benchmarks, such as
 * bench/run.py, to set their figures against). */
static int run_raw_only(bench *b)
{
    b->raw_bytes = bench_align_up(b->size, RAW_READ_REQ);
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
    bench_fill_parallel(pieces, np);
    for (unsigned run = 0; run < b->runs; run++)
        if (bench_interrupted || bench_raw_run(b, run) != CLI_OK) return CLI_FAIL;
    bench_report_raw(b);
    return fflush(stdout) == 0 ? CLI_OK : bench_fail("writing the report: %s", strerror(errno));
}

static int run_bench(bench *b)
{
    char hb[32], hn[32];
    if (b->raw_only) return run_raw_only(b);
    if (bench_plan_state(b) < 0) return bench_fail("out of memory planning the state");
    b->raw_bytes =
        bench_align_up(b->bytes > RAW_MIN_BYTES ? b->bytes : RAW_MIN_BYTES, RAW_READ_REQ);

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
    if (bench_alloc_state(b) < 0) return bench_fail("out of memory allocating the state");
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
        if (bench_raw_run(b, run) != CLI_OK) return CLI_FAIL;
        if (bench_interrupted || bench_ckptio_run(b, run) != CLI_OK) return CLI_FAIL;
    }
    uint64_t peak = peak_rss_kib();
    b->peak_extra_mib = peak > base ? (double)(peak - base) / 1024.0 : 0.0;
    if (bench_interrupted || bench_warm_run(b) != CLI_OK) return CLI_FAIL;
    if (!b->keep) bench_remove_tree(b->ckpt);
    if (b->tiny && (bench_interrupted || bench_tiny_run(b) != CLI_OK)) return CLI_FAIL;
    if (bench_interrupted) return CLI_FAIL;
    if (b->json)
        bench_report_json(b);
    else
        bench_report_text(b);
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
    if (bench_interrupted) {
        fprintf(stderr, "ckptio bench: interrupted; removing the bench files\n");
        rc = CLI_FAIL;
    }
    cleanup(b);
    bench_free_state(b);
    free(b);
    return rc;
}
