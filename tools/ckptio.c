/* SPDX-License-Identifier: Apache-2.0 */
/* The `ckptio` command: inspect, verify, doctor and bench checkpoints through the public API. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "cli.h"

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                             */
/* ------------------------------------------------------------------------------------------ */

void cli_usage(FILE *f)
{
    fputs("usage: ckptio <command> [options]\n"
          "\n"
          "commands:\n"
          "  inspect DIR [--json]   list a checkpoint's tensors (name, dtype, shape, chunks,\n"
          "                         stored bytes), totals and metadata\n"
          "  verify DIR             read every stored byte and check every checksum\n"
          "  doctor [DIR]           describe this build and system: backends, io_uring,\n"
          "                         O_DIRECT and alignment for DIR (default: .)\n"
          "  bench [--dir D] [--size 4G] [--runs 3] [--json] [--keep] [--tiny N] [--raw-only]\n"
          "                         save and load a synthetic training state and compare\n"
          "                         with the device's raw bandwidth (default dir ./ckptio-bench)\n"
          "                         (--raw-only: only the raw device figures, on a --size file)\n"
          "  help                   show this text\n"
          "  --version              print the library and on-disk format versions\n"
          "\n"
          "exit status: 0 success, 1 failure, 2 usage error.\n"
          "CKPTIO_IO=io_uring|psync|buffered forces an I/O backend.\n",
          f);
}

int cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ckptio: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    cli_usage(stderr);
    return CLI_USAGE;
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckptio %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_FAIL;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_human(char *buf, size_t n, double bytes)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    unsigned u = 0;
    while (bytes >= 1000.0 && u + 1 < sizeof unit / sizeof unit[0])
        bytes /= 1000.0, u++;
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.2f %s", bytes, unit[u]);
}

int cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || !isfinite(v)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0, end++;
        break;
    case 'm':
    case 'M':
        mul = 1024.0 * 1024, end++;
        break;
    case 'g':
    case 'G':
        mul = 1024.0 * 1024 * 1024, end++;
        break;
    case 't':
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024, end++;
        break;
    default:
        break;
    }
    if (mul > 1 && (!strcmp(end, "iB") || !strcmp(end, "ib")))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end) return -1;
    v *= mul;
    if (v >= 18e18) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* Length of the UTF-8 sequence at p (at most n bytes), or 0 if it is not valid UTF-8. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0)
        k = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        k = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        k = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

int cli_is_text(const void *v, size_t n)
{
    const unsigned char *p = v;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(p + i, n - i);
        if (!k || p[i] == 0) return 0;
        i += k;
    }
    return 1;
}

void cli_json_str(FILE *f, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = utf8_len(p + i, n - i);
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f || k == 0)
            fprintf(f, "\\u%04x", c);
        else {
            fwrite(p + i, 1, k, f);
            i += k;
            continue;
        }
        i++;
    }
    fputc('"', f);
}

/* Show n bytes as one line of text with C-style escapes for control characters. */
static void text_escaped(FILE *f, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\\')
            fputs("\\\\", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc((int)c, f);
    }
}

/* ---- progress ---- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, active, quit, shown;
    char label[160];
    uint64_t done, total;
    double t0;
} prog = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void progress_draw_locked(void)
{
    double dt = cli_now() - prog.t0;
    if (!prog.active || dt < 1.0) return;
    char line[256];
    int n = snprintf(line, sizeof line, "\r\033[K%s", prog.label);
    if (prog.total && n > 0 && (size_t)n < sizeof line) {
        char a[32], b[32];
        cli_human(a, sizeof a, (double)prog.done);
        cli_human(b, sizeof b, (double)prog.total);
        n += snprintf(line + n, sizeof line - (size_t)n, "  %s / %s (%.0f%%)", a, b,
                      100.0 * (double)prog.done / (double)prog.total);
    }
    if (n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "  %.1f s", dt);
    fputs(line, stderr);
    fflush(stderr);
    prog.shown = true;
}

static void *progress_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&prog.mu);
    while (!prog.quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&prog.cv, &prog.mu, &ts);
        if (!prog.quit) progress_draw_locked();
    }
    pthread_mutex_unlock(&prog.mu);
    return NULL;
}

static void progress_stop_thread(void)
{
    pthread_mutex_lock(&prog.mu);
    prog.quit = true;
    pthread_cond_signal(&prog.cv);
    pthread_mutex_unlock(&prog.mu);
    pthread_join(prog.thread, NULL);
}

void cli_progress_begin(uint64_t total, const char *fmt, ...)
{
    /* Only a person watching a terminal wants a live line; logs and pipes get none. */
    if (!isatty(STDERR_FILENO)) return;
    pthread_mutex_lock(&prog.mu);
    if (!prog.started) {
        if (pthread_create(&prog.thread, NULL, progress_main, NULL) == 0) {
            prog.started = true;
            atexit(progress_stop_thread);
        }
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prog.label, sizeof prog.label, fmt, ap);
    va_end(ap);
    prog.total = total;
    prog.done = 0;
    prog.t0 = cli_now();
    prog.active = true;
    pthread_mutex_unlock(&prog.mu);
}

void cli_progress_set(uint64_t done)
{
    pthread_mutex_lock(&prog.mu);
    prog.done = done;
    pthread_mutex_unlock(&prog.mu);
}

void cli_progress_end(void)
{
    pthread_mutex_lock(&prog.mu);
    prog.active = false;
    if (prog.shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        prog.shown = false;
    }
    pthread_mutex_unlock(&prog.mu);
}

/* ------------------------------------------------------------------------------------------ */
/* inspect                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void shape_str(char *b, size_t n, uint32_t ndim, const uint64_t *shape)
{
    size_t k = (size_t)snprintf(b, n, "[");
    for (uint32_t i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

static void json_u64_array(FILE *f, uint32_t n, const uint64_t *v)
{
    fputc('[', f);
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, "%s%" PRIu64, i ? ", " : "", v[i]);
    fputc(']', f);
}

/* Opens `dir` for reading; prints the reason and returns NULL on failure. */
static ckptio_reader *open_or_explain(const char *cmd, const char *dir, int *rc_out)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, dir, NULL);
    *rc_out = rc;
    if (rc >= 0) return r;
    const char *msg = ckptio_last_error();
    fprintf(stderr, "ckptio %s: %s\n", cmd, *msg ? msg : ckptio_strerror(rc));
    if (rc == CKPTIO_E_NOT_CHECKPOINT && !strstr(msg, "not a committed checkpoint"))
        fprintf(stderr,
                "ckptio %s: %s is not a committed checkpoint: it has no manifest (an "
                "unfinished or failed save leaves such a directory); nothing to %s.\n",
                cmd, dir, cmd);
    return NULL;
}

static int inspect_json(ckptio_reader *r, const char *dir)
{
    FILE *f = stdout;
    size_t nt = ckptio_reader_num_tensors(r);
    uint64_t bytes = 0, stored = 0, chunks = 0;
    fputs("{\"path\": ", f);
    cli_json_str(f, dir, strlen(dir));
    fprintf(f, ", \"ckptio_version\": \"%s\", \"tensors\": [", ckptio_version_string());
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti;
        int rc = ckptio_reader_tensor(r, i, &ti);
        if (rc < 0)
            return cli_fail("inspect", "%s: tensor #%zu: %s", dir, i, ckptio_reader_errmsg(r));
        bytes += ti.nbytes, stored += ti.stored_bytes, chunks += ti.num_chunks;
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        cli_json_str(f, ti.name, strlen(ti.name));
        const char *dt = ckptio_dtype_name(ti.dtype);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": ", dt ? dt : "unknown");
        json_u64_array(f, ti.ndim, ti.shape);
        fprintf(f,
                ", \"nbytes\": %" PRIu64 ", \"stored_bytes\": %" PRIu64 ", \"num_chunks\": %" PRIu64
                ", \"chunks\": [",
                ti.nbytes, ti.stored_bytes, ti.num_chunks);
        for (uint64_t c = 0; c < ti.num_chunks; c++) {
            ckptio_chunk_info ci;
            rc = ckptio_reader_chunk(r, i, (size_t)c, &ci);
            if (rc < 0)
                return cli_fail("inspect", "%s: tensor '%s' chunk %" PRIu64 ": %s", dir, ti.name, c,
                                ckptio_reader_errmsg(r));
            fputs(c ? ", {\"offset\": " : "{\"offset\": ", f);
            json_u64_array(f, ti.ndim, ci.offset);
            fputs(", \"shape\": ", f);
            json_u64_array(f, ti.ndim, ci.shape);
            fputs(", \"file\": ", f);
            cli_json_str(f, ci.file, strlen(ci.file));
            fprintf(f,
                    ", \"file_offset\": %" PRIu64 ", \"stored_bytes\": %" PRIu64
                    ", \"nbytes\": %" PRIu64 "}",
                    ci.file_offset, ci.stored_bytes, ci.nbytes);
        }
        fputs("]}", f);
    }
    fprintf(f,
            "%s], \"num_tensors\": %zu, \"num_chunks\": %" PRIu64 ", \"bytes\": %" PRIu64
            ", \"stored_bytes\": %" PRIu64 ", \"metadata\": [",
            nt ? "\n" : "", nt, chunks, bytes, stored);
    size_t nm = ckptio_reader_num_meta(r);
    for (size_t i = 0; i < nm; i++) {
        const char *key;
        const void *val;
        size_t len;
        if (ckptio_reader_meta(r, i, &key, &val, &len) < 0)
            return cli_fail("inspect", "%s: metadata entry #%zu: %s", dir, i,
                            ckptio_reader_errmsg(r));
        fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", f);
        cli_json_str(f, key, strlen(key));
        fprintf(f, ", \"bytes\": %zu, \"value\": ", len);
        /* Binary values have no faithful JSON string form; their length is what we can show. */
        if (cli_is_text(val, len))
            cli_json_str(f, val, len);
        else
            fputs("null", f);
        fputc('}', f);
    }
    fprintf(f, "%s]}\n", nm ? "\n" : "");
    return fflush(f) == 0 ? CLI_OK : cli_fail("inspect", "writing the output: %s", strerror(errno));
}

static int inspect_text(ckptio_reader *r, const char *dir)
{
    size_t nt = ckptio_reader_num_tensors(r);
    int wname = 4, wshape = 5;
    char shape[512];
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti;
        if (ckptio_reader_tensor(r, i, &ti) < 0) continue;
        int l = (int)strlen(ti.name);
        if (l > wname) wname = l < 60 ? l : 60;
        shape_str(shape, sizeof shape, ti.ndim, ti.shape);
        l = (int)strlen(shape);
        if (l > wshape) wshape = l < 40 ? l : 40;
    }
    printf("checkpoint %s\n\n", dir);
    printf("%-*s  %-9s  %-*s  %6s  %14s\n", wname, "NAME", "DTYPE", wshape, "SHAPE", "CHUNKS",
           "STORED BYTES");
    uint64_t bytes = 0, stored = 0, chunks = 0;
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti;
        if (ckptio_reader_tensor(r, i, &ti) < 0)
            return cli_fail("inspect", "%s: tensor #%zu: %s", dir, i, ckptio_reader_errmsg(r));
        bytes += ti.nbytes, stored += ti.stored_bytes, chunks += ti.num_chunks;
        shape_str(shape, sizeof shape, ti.ndim, ti.shape);
        const char *dt = ckptio_dtype_name(ti.dtype);
        printf("%-*s  %-9s  %-*s  %6" PRIu64 "  %14" PRIu64 "\n", wname, ti.name, dt ? dt : "?",
               wshape, shape, ti.num_chunks, ti.stored_bytes);
    }
    char hb[32], hs[32];
    cli_human(hb, sizeof hb, (double)bytes);
    cli_human(hs, sizeof hs, (double)stored);
    printf("\ntotal: %zu tensors, %" PRIu64 " chunks, %" PRIu64 " bytes (%s), stored %" PRIu64
           " bytes (%s)\n",
           nt, chunks, bytes, hb, stored, hs);
    size_t nm = ckptio_reader_num_meta(r);
    printf("metadata: %zu %s\n", nm, nm == 1 ? "entry" : "entries");
    for (size_t i = 0; i < nm; i++) {
        const char *key;
        const void *val;
        size_t len;
        if (ckptio_reader_meta(r, i, &key, &val, &len) < 0)
            return cli_fail("inspect", "%s: metadata entry #%zu: %s", dir, i,
                            ckptio_reader_errmsg(r));
        fputs("  ", stdout);
        text_escaped(stdout, (const unsigned char *)key, strlen(key));
        fputs(" = ", stdout);
        if (!cli_is_text(val, len)) {
            printf("<%zu bytes>\n", len);
        } else if (len > 200) {
            /* Cut at a UTF-8 boundary so the line stays valid text. */
            size_t cut = 200;
            while (cut > 0 && (((const unsigned char *)val)[cut] & 0xC0) == 0x80)
                cut--;
            text_escaped(stdout, val, cut);
            printf("... (%zu bytes)\n", len);
        } else {
            text_escaped(stdout, val, len);
            fputc('\n', stdout);
        }
    }
    return fflush(stdout) == 0 ? CLI_OK
                               : cli_fail("inspect", "writing the output: %s", strerror(errno));
}

static int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    bool json = false, opts = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts && !strcmp(a, "--json"))
            json = true;
        else if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            return cli_usage(stdout), CLI_OK;
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && a[0] == '-' && a[1])
            return cli_usage_error("inspect: unknown option '%s'", a);
        else if (dir)
            return cli_usage_error("inspect: more than one directory ('%s', '%s')", dir, a);
        else
            dir = a;
    }
    if (!dir) return cli_usage_error("inspect: which checkpoint? (ckptio inspect DIR)");
    int rc;
    ckptio_reader *r = open_or_explain("inspect", dir, &rc);
    if (!r) return CLI_FAIL;
    int ret = json ? inspect_json(r, dir) : inspect_text(r, dir);
    ckptio_reader_close(r);
    return ret;
}

/* Parse the arguments of a command that takes at most one directory and no options.
 * Returns -1 to go on, or the exit status to return (help printed, usage error). */
static int one_dir_arg(int argc, char **argv, const char *cmd, const char **dir)
{
    bool opts = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            return cli_usage(stdout), CLI_OK;
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && a[0] == '-' && a[1])
            return cli_usage_error("%s: unknown option '%s'", cmd, a);
        else if (*dir)
            return cli_usage_error("%s: more than one directory ('%s', '%s')", cmd, *dir, a);
        else
            *dir = a;
    }
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* verify                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int cmd_verify(int argc, char **argv)
{
    const char *dir = NULL;
    int done = one_dir_arg(argc, argv, "verify", &dir);
    if (done >= 0) return done;
    if (!dir) return cli_usage_error("verify: which checkpoint? (ckptio verify DIR)");
    double t0 = cli_now();
    int rc;
    ckptio_reader *r = open_or_explain("verify", dir, &rc);
    if (!r) return CLI_FAIL;
    size_t nt = ckptio_reader_num_tensors(r);
    uint64_t stored = 0, chunks = 0;
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti;
        if (ckptio_reader_tensor(r, i, &ti) >= 0)
            stored += ti.stored_bytes, chunks += ti.num_chunks;
    }
    /* One library call does the work, so the progress line can only show that time passes. */
    cli_progress_begin(0, "verifying %s (%" PRIu64 " stored bytes)", dir, stored);
    uint64_t bad = 0;
    rc = ckptio_reader_verify(r, &bad);
    cli_progress_end();
    double dt = cli_now() - t0;
    if (rc < 0) {
        const char *msg = ckptio_reader_errmsg(r);
        printf("FAILED %s\n", *msg ? msg : ckptio_strerror(rc));
        if (bad)
            printf("%s: %" PRIu64 " of %" PRIu64 " chunks damaged; the first is named above. "
                   "Restore the checkpoint from another copy or save it again.\n",
                   dir, bad, chunks);
        else
            printf("%s: could not read the checkpoint to the end (%s).\n", dir, ckptio_errname(rc));
        ckptio_reader_close(r);
        fflush(stdout);
        return CLI_FAIL;
    }
    char hb[32];
    cli_human(hb, sizeof hb, (double)stored);
    printf("OK %s: %zu tensors, %" PRIu64 " chunks, %" PRIu64 " bytes (%s) read and checked in "
           "%.3f s, %.2f GB/s\n",
           dir, nt, chunks, stored, hb, dt, dt > 0 ? (double)stored / dt / 1e9 : 0.0);
    ckptio_reader_close(r);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

/* ------------------------------------------------------------------------------------------ */
/* doctor                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int cmd_doctor(int argc, char **argv)
{
    const char *dir = NULL;
    int done = one_dir_arg(argc, argv, "doctor", &dir);
    if (done >= 0) return done;
    char small[4096];
    int n = ckptio_describe_system(dir, small, sizeof small);
    if (n < 0) return cli_fail("doctor", "%s", ckptio_strerror(n));
    char *buf = small;
    if ((size_t)n >= sizeof small) {
        buf = malloc((size_t)n + 1);
        if (!buf) return cli_fail("doctor", "out of memory");
        ckptio_describe_system(dir, buf, (size_t)n + 1);
    }
    fputs(buf, stdout);
    if (buf != small) free(buf);
    struct stat st;
    if (dir && stat(dir, &st) < 0) return cli_fail("doctor", "%s: %s", dir, strerror(errno));
    if (dir && !S_ISDIR(st.st_mode)) return cli_fail("doctor", "%s: not a directory", dir);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

/* ------------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    if (argc < 2) return cli_usage_error("which command?");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("ckptio %s (on-disk format %u)\n", ckptio_version_string(), ckptio_format_version());
        return CLI_OK;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        cli_usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "doctor")) return cmd_doctor(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
    if (cmd[0] == '-') return cli_usage_error("unknown option '%s'", cmd);
    return cli_usage_error("unknown command '%s'", cmd);
}
