/* SPDX-License-Identifier: Apache-2.0 */
/* The report of `ckptio bench` on stdout: medians and ranges of each series as a table or as
 * JSON, each figure set against the raw device measured in the same run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

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

void bench_report_json(const bench *b)
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

void bench_report_text(const bench *b)
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

void bench_report_raw(const bench *b)
{
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
}
