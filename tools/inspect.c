/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio inspect`: list a checkpoint's tensors, chunks, totals and metadata, as text or JSON. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

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

static int inspect_json(ckptio_reader *r, const char *dir)
{
    FILE *f = stdout;
    size_t nt = ckptio_reader_num_tensors(r);
    uint64_t bytes = 0, stored = 0, chunks = 0;
    fputs("{\"path\": ", f);
    cli_json_str(f, dir, strlen(dir));
    fprintf(f, ", \"ckptio_version\": \"%s\", \"tensors\": [", ckptio_version_string());
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
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
                ", \"nbytes\": %" PRIu64 ", \"stored_bytes\": %" PRIu64 ", \"codec\": \"%s\""
                ", \"delta\": %s, \"ratio\": %.4f, \"num_chunks\": %" PRIu64 ", \"chunks\": [",
                ti.nbytes, ti.stored_bytes, ti.codec, ti.delta ? "true" : "false",
                ti.stored_bytes ? (double)ti.nbytes / (double)ti.stored_bytes : 1.0, ti.num_chunks);
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
            ", \"stored_bytes\": %" PRIu64 ", \"ratio\": %.4f, \"base\": ",
            nt ? "\n" : "", nt, chunks, bytes, stored,
            stored ? (double)bytes / (double)stored : 1.0);
    const char *base = ckptio_reader_base(r);
    if (base) cli_json_str(f, base, strlen(base));
    else fputs("null", f);
    fputs(", \"metadata\": [", f);
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
        ckptio_tensor_info ti = {.size = sizeof ti};
        if (ckptio_reader_tensor(r, i, &ti) < 0) continue;
        int l = (int)strlen(ti.name);
        if (l > wname) wname = l < 60 ? l : 60;
        shape_str(shape, sizeof shape, ti.ndim, ti.shape);
        l = (int)strlen(shape);
        if (l > wshape) wshape = l < 40 ? l : 40;
    }
    printf("checkpoint %s\n\n", dir);
    printf("%-*s  %-9s  %-*s  %6s  %14s  %-11s  %6s\n", wname, "NAME", "DTYPE", wshape, "SHAPE",
           "CHUNKS", "STORED BYTES", "CODEC", "RATIO");
    uint64_t bytes = 0, stored = 0, chunks = 0;
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        if (ckptio_reader_tensor(r, i, &ti) < 0)
            return cli_fail("inspect", "%s: tensor #%zu: %s", dir, i, ckptio_reader_errmsg(r));
        bytes += ti.nbytes, stored += ti.stored_bytes, chunks += ti.num_chunks;
        shape_str(shape, sizeof shape, ti.ndim, ti.shape);
        const char *dt = ckptio_dtype_name(ti.dtype);
        char codec[24];
        snprintf(codec, sizeof codec, "%s%s", ti.codec, ti.delta ? "+delta" : "");
        printf("%-*s  %-9s  %-*s  %6" PRIu64 "  %14" PRIu64 "  %-11s  %5.2fx\n", wname, ti.name,
               dt ? dt : "?", wshape, shape, ti.num_chunks, ti.stored_bytes, codec,
               ti.stored_bytes ? (double)ti.nbytes / (double)ti.stored_bytes : 1.0);
    }
    char hb[32], hs[32];
    cli_human(hb, sizeof hb, (double)bytes);
    cli_human(hs, sizeof hs, (double)stored);
    printf("\ntotal: %zu tensors, %" PRIu64 " chunks, %" PRIu64 " bytes (%s), stored %" PRIu64
           " bytes (%s), ratio %.2fx\n",
           nt, chunks, bytes, hb, stored, hs, stored ? (double)bytes / (double)stored : 1.0);
    const char *base = ckptio_reader_base(r);
    if (base) {
        fputs("base: ", stdout);
        text_escaped(stdout, (const unsigned char *)base, strlen(base));
        fputs(" (its +delta tensors need it there, unchanged)\n", stdout);
    }
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

int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    bool json = false, opts = true;
    ckptio_store_opts *store = NULL;
    int done = -1;
    for (int i = 1; i < argc && done < 0; i++) {
        const char *a = argv[i];
        if (opts && !strcmp(a, "--json"))
            json = true;
        else if (opts && !strcmp(a, "--option") && i + 1 < argc)
            done = cli_store_option("inspect", &store, argv[++i]);
        else if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            done = (cli_usage(stdout), CLI_OK);
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && a[0] == '-' && a[1])
            done = cli_usage_error("inspect: unknown option '%s'", a);
        else if (dir)
            done = cli_usage_error("inspect: more than one directory ('%s', '%s')", dir, a);
        else
            dir = a;
    }
    if (done < 0 && !dir) done = cli_usage_error("inspect: which checkpoint? (ckptio inspect DIR)");
    if (done >= 0) {
        ckptio_store_opts_free(store);
        return done;
    }
    ckptio_reader *r = cli_open_reader("inspect", dir, store);
    ckptio_store_opts_free(store); /* read while the reader opened */
    if (!r) return CLI_FAIL;
    int ret = json ? inspect_json(r, dir) : inspect_text(r, dir);
    ckptio_reader_close(r);
    return ret;
}
