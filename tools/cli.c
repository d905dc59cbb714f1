/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers every `ckptio` subcommand uses: usage and errors, sizes, JSON strings, arguments. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

void cli_usage(FILE *f)
{
    fputs("usage: ckptio <command> [options]\n"
          "\n"
          "commands:\n"
          "  inspect DIR [--json]   list a checkpoint's tensors (name, dtype, shape, chunks,\n"
          "                         stored bytes), totals and metadata\n"
          "  verify [--roots A,B] DIR  read every stored byte and check every checksum (--roots:\n"
          "                         where a striped checkpoint's stripes are now)\n"
          "  (inspect and verify take --option KEY=VALUE, convert --src-option and --dst-option:\n"
          "   the settings of an object store, e.g. endpoint_url=https://... profile=training;\n"
          "   doc/s3.md)\n"
          "  doctor [DIR]           describe this build and system: backends, io_uring,\n"
          "                         O_DIRECT and alignment for DIR (default: .)\n"
          "  bench [--dir D] [--size 4G] [--runs 3] [--json] [--keep] [--tiny N] [--raw-only]\n"
          "                         save and load a synthetic training state and compare\n"
          "                         with the device's raw bandwidth (default dir ./ckptio-bench)\n"
          "                         (--raw-only: only the raw device figures, on a --size file)\n"
          "  bench --merge [--parts 10000] [--tensors 100000] [--shards 10]\n"
          "                         time the coordinator's merge of that many ranks' partial\n"
          "                         manifests (tensors cut in --shards row blocks)\n"
          "  convert SRC DST [--from F] [--to F] [--max-shard-size S] [--compress[=M]]\n"
          "          [--overwrite]  copy a checkpoint between ckptio, safetensors, hf (sharded\n"
          "                         safetensors), torch and dcp; --compress: a compressed\n"
          "                         ckptio checkpoint (ckptio convert --help)\n"
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

int cli_store_option(const char *cmd, ckptio_store_opts **o, const char *kv)
{
    const char *eq = kv ? strchr(kv, '=') : NULL;
    if (!eq || eq == kv)
        return cli_usage_error("%s: --option takes KEY=VALUE (endpoint_url=..., profile=...)", cmd);
    if (!*o && ckptio_store_opts_new(o) < 0) return cli_fail(cmd, "out of memory");
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
    if (ckptio_store_opts_set(*o, key, eq + 1) < 0)
        return cli_usage_error("%s: --option %s: %s", cmd, key, ckptio_last_error());
    return -1;
}

int cli_one_dir_arg(int argc, char **argv, const char *cmd, const char **dir,
                    ckptio_store_opts **store)
{
    bool opts = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int done;
        if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            return cli_usage(stdout), CLI_OK;
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && store && !strcmp(a, "--option") && i + 1 < argc) {
            if ((done = cli_store_option(cmd, store, argv[++i])) >= 0) return done;
        }
        else if (opts && a[0] == '-' && a[1])
            return cli_usage_error("%s: unknown option '%s'", cmd, a);
        else if (*dir)
            return cli_usage_error("%s: more than one directory ('%s', '%s')", cmd, *dir, a);
        else
            *dir = a;
    }
    return -1;
}

ckptio_reader *cli_open_reader(const char *cmd, const char *dir, const ckptio_store_opts *store)
{
    ckptio_reader *r = NULL;
    ckptio_params p;
    ckptio_params_init(&p);
    p.store = store;
    int rc = ckptio_reader_open(&r, dir, &p);
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
