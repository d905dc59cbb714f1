/* SPDX-License-Identifier: Apache-2.0 */
/* The merge benchmark: times merging synthetic partial manifests (many ranks, many sharded
 * tensors) as the coordinator of a multi-rank save does; JSON on stdout. A program of its own
 * because it builds manifests through the private src/format/manifest.h, which bench/ may use
 * and tools/ may not; `ckptio bench --merge` runs it (tools/bench_merge.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../src/format/manifest.h"

/* Usage: ckptio-bench-merge (or ckptio bench --merge) [--parts N] [--tensors T] [--shards S]
 * Tensor t is a bf16 [S*4, 256] split in S row blocks; block s lives in part (t*S + s) % N, so
 * every part holds T*S/N chunks in one data file, each with one xxh3 block checksum, and every
 * part carries the same metadata key. Defaults: 10,000 parts, 100,000 tensors, 10 shards (1M
 * chunks). Reports the seconds of merge (which validates), a second validate, encode and
 * decode of the result, and peak RSS before and after. */

static uint64_t arg(int argc, char **argv, const char *name, uint64_t dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtoull(argv[i + 1], NULL, 10);
    return dflt;
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

#define ROWS 4
#define COLS 256
#define ESIZE 2

typedef struct part {
    ckptio__manifest m;
    uint64_t cap_t, str_cap;
} part;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    uint64_t P = arg(argc, argv, "--parts", 10000), T = arg(argc, argv, "--tensors", 100000),
             S = arg(argc, argv, "--shards", 10);
    if (!P || !T || !S || S > P) {
        fprintf(stderr, "ckptio bench --merge: need 0 < --shards <= --parts and --tensors > 0\n");
        return 2;
    }
    uint64_t *count = calloc(P, sizeof *count);
    for (uint64_t t = 0; t < T; t++)
        for (uint64_t s = 0; s < S; s++) count[(t * S + s) % P]++;
    part *parts = xmalloc(P * sizeof *parts);
    const ckptio__manifest **ms = xmalloc(P * sizeof *ms);
    double t0 = ckptio__now();
    for (uint64_t p = 0; p < P; p++) {
        ckptio__manifest *m = &parts[p].m;
        uint64_t k = count[p];
        *m = (ckptio__manifest){.version = CKPTIO_FORMAT_VERSION,
                                .csum_algo = CKPTIO__CSUM_XXH3_64, .csum_block = 4096};
        m->files = xmalloc(sizeof *m->files);
        m->tensors = xmalloc(k * sizeof *m->tensors);
        m->chunks = xmalloc(k * sizeof *m->chunks);
        m->meta = xmalloc(sizeof *m->meta);
        m->dims = xmalloc(k * 6 * sizeof *m->dims);
        m->csums = xmalloc(k * sizeof *m->csums);
        m->strtab = xmalloc(64 + k * 32);
        ms[p] = m;
    }
    uint64_t *fill = calloc(P, sizeof *fill);
    uint64_t *str = calloc(P, sizeof *str);
    for (uint64_t p = 0; p < P; p++) {
        ckptio__manifest *m = &parts[p].m;
        int n = sprintf(m->strtab, "rank%06llu.data", (unsigned long long)p);
        m->files[0] = (ckptio__mfile){.name = 0, .name_len = (uint32_t)n};
        str[p] = (uint64_t)n + 1;
        m->n_files = 1;
        m->n_meta = 1;
    }
    uint64_t chunk_bytes = ROWS * COLS * ESIZE;
    for (uint64_t t = 0; t < T; t++)
        for (uint64_t s = 0; s < S; s++) {
            uint64_t p = (t * S + s) % P, i = fill[p]++;
            ckptio__manifest *m = &parts[p].m;
            char *nm = m->strtab + str[p];
            int n = sprintf(nm, "model.layers.%llu.w", (unsigned long long)t);
            uint64_t *d = m->dims + 6 * i;
            d[0] = S * ROWS, d[1] = COLS, d[2] = s * ROWS, d[3] = 0, d[4] = ROWS, d[5] = COLS;
            m->tensors[i] = (ckptio__mtensor){.name = str[p], .name_len = (uint32_t)n,
                                              .dtype = CKPTIO_DT_BF16, .ndim = 2, .dims = 6 * i,
                                              .chunk0 = i, .n_chunks = 1};
            m->chunks[i] = (ckptio__mchunk){.dims = 6 * i + 2, .file_off = i * chunk_bytes,
                                            .stored_len = chunk_bytes, .raw_len = chunk_bytes,
                                            .csums = i, .n_csums = 1};
            m->csums[i] = t * S + s;
            str[p] += (uint64_t)n + 1;
        }
    for (uint64_t p = 0; p < P; p++) {
        ckptio__manifest *m = &parts[p].m;
        uint64_t k = count[p];
        char *e = m->strtab + str[p];
        memcpy(e, "step\0" "1000", 10);
        m->meta[0] = (ckptio__mmeta){.key = str[p], .key_len = 4, .val = str[p] + 5, .val_len = 4};
        str[p] += 10;
        m->n_tensors = m->n_chunks = m->n_csums = k;
        m->n_dims = 6 * k;
        m->strtab_len = str[p];
        m->files[0].size = k * chunk_bytes;
    }
    double t_build = ckptio__now() - t0;
    long rss_inputs = peak_rss_kib();

    char err[1024];
    ckptio__manifest *out = NULL;
    t0 = ckptio__now();
    int rc = ckptio__manifest_merge(ms, P, &out, err, sizeof err);
    double t_merge = ckptio__now() - t0;
    if (rc < 0) {
        fprintf(stderr, "merge failed: %s\n", err);
        return 1;
    }
    long rss_merge = peak_rss_kib();
    t0 = ckptio__now();
    rc = ckptio__manifest_validate(out, err, sizeof err);
    double t_validate = ckptio__now() - t0;
    if (rc < 0) {
        fprintf(stderr, "validate failed: %s\n", err);
        return 1;
    }
    uint64_t len;
    t0 = ckptio__now();
    if (ckptio__manifest_encoded_size(out, &len) < 0) return 1;
    uint8_t *buf = xmalloc(len);
    if (ckptio__manifest_encode(out, buf, len) < 0) return 1;
    double t_encode = ckptio__now() - t0;
    ckptio__manifest *back = NULL;
    t0 = ckptio__now();
    rc = ckptio__manifest_decode(buf, len, &back, err, sizeof err);
    double t_decode = ckptio__now() - t0;
    if (rc < 0) {
        fprintf(stderr, "decode failed: %s\n", err);
        return 1;
    }
    printf("{\"parts\": %llu, \"tensors\": %llu, \"chunks\": %llu, \"files\": %llu, "
           "\"manifest_bytes\": %llu, \"build_s\": %.3f, \"merge_s\": %.3f, "
           "\"validate_s\": %.3f, \"encode_s\": %.3f, \"decode_s\": %.3f, "
           "\"peak_rss_inputs_mib\": %.1f, \"peak_rss_after_merge_mib\": %.1f, "
           "\"peak_rss_mib\": %.1f}\n",
           (unsigned long long)P, (unsigned long long)out->n_tensors,
           (unsigned long long)out->n_chunks, (unsigned long long)out->n_files,
           (unsigned long long)len, t_build, t_merge, t_validate, t_encode, t_decode,
           rss_inputs / 1024.0, rss_merge / 1024.0, peak_rss_kib() / 1024.0);
    ckptio__manifest_free(back);
    ckptio__manifest_free(out);
    free(buf);
    for (uint64_t p = 0; p < P; p++) {
        ckptio__manifest *m = &parts[p].m;
        free(m->files), free(m->tensors), free(m->chunks), free(m->meta);
        free(m->dims), free(m->csums), free(m->strtab);
    }
    free(parts), free(ms), free(count), free(fill), free(str);
    return 0;
}
