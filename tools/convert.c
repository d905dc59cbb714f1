/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio convert`: the arguments, then one call of the library's convert engine
 * (ckptio_convert); when a side is torch or DCP, Python runs the same engine with its sources. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPTIO_EXPERIMENTAL
#include "ckptio.h"
#include "cli.h"
#include "commands.h"

/* torch files and DCP directories are parsed by torch, in Python: `python -m ckptio._convert`
 * runs the whole conversion through the same engine, its torch or DCP side handed in as a
 * source or sink. It replaces this process. CKPTIO_PYTHON names the interpreter (`python -m
 * ckptio` sets it to itself), else python3 from PATH. Returns only on failure. */
static int run_python(const char *src, const char *dst, int from, int to, bool overwrite,
                      const char *max_shard, const char *compress)
{
    const char *py = getenv("CKPTIO_PYTHON");
    if (!py || !*py) py = "python3";
    const char *argv[16];
    int n = 0;
    argv[n++] = py;
    argv[n++] = "-m";
    argv[n++] = "ckptio._convert";
    argv[n++] = "--from";
    argv[n++] = ckptio_convert_format_name(from);
    argv[n++] = "--to";
    argv[n++] = ckptio_convert_format_name(to);
    if (overwrite) argv[n++] = "--overwrite";
    if (max_shard) argv[n++] = "--max-shard-size", argv[n++] = max_shard;
    if (compress) argv[n++] = "--compress", argv[n++] = compress;
    argv[n++] = "--";
    argv[n++] = src;
    argv[n++] = dst;
    argv[n] = NULL;
    fflush(NULL);
    execvp(py, (char *const *)argv);
    cli_fail("convert",
             "converting %s -> %s needs Python with ckptio and torch, and '%s' cannot be run "
             "(%s); set CKPTIO_PYTHON to a Python that has them (pip install ckptio torch)",
             ckptio_convert_format_name(from), ckptio_convert_format_name(to), py,
             strerror(errno));
    fprintf(stderr, "ckptio convert: nothing was written at %s\n", dst);
    return CLI_FAIL;
}

/* --compress's value: an enum ckptio_compress, or -1. */
static int compress_mode(const char *s)
{
    static const char *const names[] = {"none", "auto", "all"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static void convert_usage(FILE *f)
{
    fputs("usage: ckptio convert [--from FMT] [--to FMT] [--max-shard-size SIZE]\n"
          "                      [--compress[=auto|all|none]] [--overwrite]\n"
          "                      [--src-option KEY=VALUE]... [--dst-option KEY=VALUE]... SRC DST\n"
          "\n"
          "Copy every tensor of SRC into a new DST of another format, streaming through a\n"
          "bounded buffer. Formats (FMT):\n"
          "  ckptio       a ckptio checkpoint directory (checksums verified as it is read)\n"
          "  safetensors  one .safetensors file\n"
          "  hf           a Hugging Face directory: model-00001-of-0000N.safetensors shards and\n"
          "               model.safetensors.index.json\n"
          "  torch        a torch.save file (.pt/.pth/.bin), read weights-only: no pickled code\n"
          "               runs\n"
          "  dcp          a torch.distributed.checkpoint directory (.metadata, __N_M.distcp)\n"
          "SRC's format is detected from its contents; DST's from its name (.safetensors,\n"
          ".pt/.pth/.bin/.ckpt, .dcp; with --max-shard-size: hf; else ckptio).\n"
          "torch and dcp need Python with ckptio and torch (CKPTIO_PYTHON, else python3),\n"
          "which runs the same conversion engine, reading or writing them itself.\n"
          "\n"
          "options:\n"
          "  --from FMT, --to FMT    override the detected formats\n"
          "  --max-shard-size SIZE   hf: largest shard (e.g. 5G, 500M; default 5G)\n"
          "  --compress[=MODE]       ckptio: compress tensors block by block (format 3.0,\n"
          "                          which ckptio before 0.3 refuses). auto (the default of\n"
          "                          --compress): blocks that shrink by 2 %, never slower than\n"
          "                          without; all: every block tried (smallest, at the coder's\n"
          "                          speed); none. CKPTIO_COMPRESS overrides it\n"
          "  --overwrite             replace an existing DST of the same kind\n"
          "  --src-option KEY=VALUE, --dst-option KEY=VALUE\n"
          "                          a setting of the object store SRC or DST is in\n"
          "                          (endpoint_url, region, profile, ca_bundle...; doc/s3.md),\n"
          "                          for a copy between two stores\n"
          "\n"
          "Nothing appears at DST unless the whole conversion succeeds.\n",
          f);
}

static int convert_run(const char *const *pos, const char *from, const char *to,
                       const char *max_shard, const char *compress, bool overwrite,
                       ckptio_store_opts *const *so);

int cmd_convert(int argc, char **argv)
{
    const char *pos[2] = {NULL, NULL}, *from = NULL, *to = NULL, *max_shard = NULL;
    const char *compress = NULL;
    int npos = 0, done = -1;
    bool opts = true, overwrite = false;
    ckptio_store_opts *so[2] = {NULL, NULL}; /* the source's and the destination's stores */
    for (int i = 1; i < argc && done < 0; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            return convert_usage(stdout), CLI_OK;
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && !strcmp(a, "--overwrite"))
            overwrite = true;
        else if (opts && !strcmp(a, "--from") && has_val)
            from = argv[++i];
        else if (opts && !strcmp(a, "--to") && has_val)
            to = argv[++i];
        else if (opts && !strcmp(a, "--max-shard-size") && has_val)
            max_shard = argv[++i];
        else if (opts && !strcmp(a, "--compress"))
            compress = "auto";
        else if (opts && !strncmp(a, "--compress=", 11))
            compress = a + 11;
        else if (opts && (!strcmp(a, "--src-option") || !strcmp(a, "--dst-option")) && has_val)
            done = cli_store_option("convert", &so[a[2] == 'd'], argv[++i]);
        else if (opts && a[0] == '-' && a[1])
            done = cli_usage_error("convert: unknown option '%s' (or its value is missing)", a);
        else if (npos < 2)
            pos[npos++] = a;
        else
            done = cli_usage_error("convert: more than two paths ('%s')", a);
    }
    if (done < 0 && npos < 2)
        done = cli_usage_error("convert: which source and destination? (ckptio convert SRC DST)");
    if (done < 0) done = convert_run(pos, from, to, max_shard, compress, overwrite, so);
    ckptio_store_opts_free(so[0]);
    ckptio_store_opts_free(so[1]);
    return done;
}

/* The conversion cmd_convert parsed; so: the source's and destination's store settings. */
static int convert_run(const char *const *pos, const char *from, const char *to,
                       const char *max_shard, const char *compress, bool overwrite,
                       ckptio_store_opts *const *so)
{
    ckptio_convert_args a = {.size = sizeof a, .src = pos[0], .dst = pos[1],
                             .overwrite = overwrite, .flags = CKPTIO_CONVERT_PROGRESS,
                             .src_store = so[0], .dst_store = so[1]};
    if (compress && (a.compress = compress_mode(compress)) < 0)
        return cli_usage_error("convert: --compress=%s: pass auto, all or none", compress);
    if (max_shard && (cli_parse_size(max_shard, &a.max_shard_bytes) < 0 || !a.max_shard_bytes))
        return cli_usage_error("convert: --max-shard-size '%s' is not a size (5G, 500M)", max_shard);
    if (from && (a.from = ckptio_convert_format_parse(from)) < 0)
        return cli_usage_error("convert: unknown format '%s'", from);
    if (to && (a.to = ckptio_convert_format_parse(to)) < 0)
        return cli_usage_error("convert: unknown format '%s'", to);
    /* A source in an object store (ckptio or safetensors there) is told apart by the engine,
     * which asks the store with its settings. */
    const char *store = ckptio_store_name(a.src);
    if (!store) return cli_fail("convert", "%s", ckptio_last_error());
    if (!a.from && !strcmp(store, "posix") && (a.from = ckptio_convert_detect(a.src, 0, 0)) < 0)
        return cli_fail("convert", "%s", ckptio_last_error());
    if (!a.to) a.to = ckptio_convert_detect(a.dst, 1, max_shard != NULL);
    if (a.to < 0) return cli_fail("convert", "%s", ckptio_last_error());
    if (max_shard && a.to != CKPTIO_CONVERT_HF)
        return cli_usage_error("convert: --max-shard-size applies to hf destinations only");
    if (a.compress && a.to != CKPTIO_CONVERT_CKPTIO)
        return cli_usage_error("convert: --compress applies to ckptio destinations only");
    if (a.from >= CKPTIO_CONVERT_TORCH || a.to >= CKPTIO_CONVERT_TORCH)
        return run_python(a.src, a.dst, a.from, a.to, overwrite, max_shard,
                          a.compress ? compress : NULL);
    /* CKPTIO_CONVERT_BUFFER (bytes, at least 4096) sets the copy buffer: tests split tensors. */
    const char *buf = getenv("CKPTIO_CONVERT_BUFFER");
    if (buf && (cli_parse_size(buf, &a.piece_bytes) < 0 || a.piece_bytes < 4096)) a.piece_bytes = 0;
    double t0 = cli_now();
    ckptio_convert_result res = {.size = sizeof res};
    if (ckptio_convert(&a, &res) < 0) {
        fprintf(stderr, "ckptio convert: %s\n", ckptio_last_error());
        fprintf(stderr, "ckptio convert: nothing was written at %s\n", a.dst);
        return CLI_FAIL;
    }
    if (isatty(STDOUT_FILENO)) {
        char hb[32];
        cli_human(hb, sizeof hb, (double)res.nbytes);
        printf("converted %s (%s) -> %s (%s): %zu tensors, %s in %.2f s\n", a.src,
               ckptio_convert_format_name(res.from), a.dst, ckptio_convert_format_name(res.to),
               res.n_tensors, hb, cli_now() - t0);
    }
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
