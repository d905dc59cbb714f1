/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio-codec-bench: one thread's codec speed and ratio on a file of raw elements, as JSON. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/codec/codec.h"

static int usage(void)
{
    fprintf(stderr, "usage: ckptio-codec-bench --dtype NAME [--codec float|zstd|auto] "
                    "[--block BYTES] [--repeat N] [--cpu-time] FILE\n");
    return 2;
}

/* Wall seconds, or with --cpu-time the thread's CPU seconds: on a loaded machine the latter
 * says what the codec costs where the former says what the scheduler gave it. */
static bool cpu_time;
static double now(void)
{
    if (!cpu_time) return ckptio__now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The order-0 entropy bound of the file's exponent field (doc/codecs.md): raw bytes over
 * elems * (bits - exp_bits + H_exp) / 8. Negative for dtypes without one. */
static double bound_ratio(int dtype, const uint8_t *p, uint64_t n)
{
    unsigned bits, ebits, shift; /* element bits, exponent bits, exponent's lowest bit */
    switch (dtype) {
    case CKPTIO_DT_BF16: bits = 16, ebits = 8, shift = 7; break;
    case CKPTIO_DT_F16: bits = 16, ebits = 5, shift = 10; break;
    case CKPTIO_DT_F32:
    case CKPTIO_DT_C64: bits = 32, ebits = 8, shift = 23; break;
    case CKPTIO_DT_F64:
    case CKPTIO_DT_C128: bits = 64, ebits = 11, shift = 52; break;
    case CKPTIO_DT_F8_E4M3FN: bits = 8, ebits = 4, shift = 3; break;
    case CKPTIO_DT_F8_E5M2: bits = 8, ebits = 5, shift = 2; break;
    default: return -1;
    }
    static uint64_t count[2048];
    uint64_t es = bits / 8, elems = n / es;
    for (uint64_t i = 0; i < elems; i++) {
        uint64_t v = 0;
        memcpy(&v, p + i * es, es);
        count[v >> shift & ((1u << ebits) - 1)]++;
    }
    double h = 0;
    for (unsigned s = 0; s < (1u << ebits); s++)
        if (count[s]) h -= (double)count[s] / (double)elems * log2((double)count[s] / (double)elems);
    return (double)n / ((double)elems * (bits - ebits + h) / 8);
}

int main(int argc, char **argv)
{
    const char *dname = NULL, *cname = "auto", *path = NULL;
    uint64_t block = 1u << 20;
    int repeat = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dname = argv[++i];
        else if (!strcmp(argv[i], "--codec") && i + 1 < argc) cname = argv[++i];
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) block = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-time")) cpu_time = true;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else return usage();
    }
    if (!dname || !path || repeat < 1 || repeat > 1000) return usage();
    int dtype = ckptio_dtype_from_name(dname);
    if (dtype < 0) {
        fprintf(stderr, "ckptio-codec-bench: unknown dtype %s\n", dname);
        return 2;
    }
    unsigned codec = !strcmp(cname, "float")  ? CKPTIO__CODEC_FLOAT
                     : !strcmp(cname, "zstd") ? CKPTIO__CODEC_ZSTD
                     : !strcmp(cname, "auto") ? ckptio__codec_for(dtype)
                                              : 0;
    if (!codec) return usage();
    ckptio__codec_ctx *c;
    int rc = ckptio__codec_ctx_new(&c, block);
    if (rc < 0) {
        fprintf(stderr, "ckptio-codec-bench: block %llu: %s\n", (unsigned long long)block,
                ckptio_strerror(rc));
        return 2;
    }
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "ckptio-codec-bench: %s: %s\n", path, strerror(errno));
        return 2;
    }
    uint64_t es = ckptio_dtype_size(dtype), n = (uint64_t)st.st_size / es * es;
    uint64_t nblocks = (n + block - 1) / block;
    uint8_t *src = malloc(n + 1), *enc = malloc(nblocks * block + 1), *out = malloc(n + 1);
    int64_t *len = calloc(nblocks + 1, sizeof *len);
    double *ct = calloc((size_t)repeat, sizeof *ct), *dt = calloc((size_t)repeat, sizeof *dt);
    if (!src || !enc || !out || !len || !ct || !dt) {
        fprintf(stderr, "ckptio-codec-bench: out of memory\n");
        return 2;
    }
    for (uint64_t got = 0; got < n;) {
        ssize_t r = read(fd, src + got, n - got);
        if (r <= 0) {
            fprintf(stderr, "ckptio-codec-bench: %s: %s\n", path, r ? strerror(errno) : "short");
            return 2;
        }
        got += (uint64_t)r;
    }
    close(fd);
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        for (uint64_t b = 0; b < nblocks; b++) {
            uint64_t at = b * block, m = CKPTIO__MIN(block, n - at);
            len[b] = ckptio__codec_encode(c, codec, dtype, src + at, m, enc + at, m);
            if (len[b] < 0) {
                fprintf(stderr, "ckptio-codec-bench: encode: %s\n", ckptio_strerror((int)len[b]));
                return 1;
            }
        }
        ct[r] = now() - t0;
    }
    uint64_t stored = 0, raw_blocks = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        uint64_t at = b * block, m = CKPTIO__MIN(block, n - at);
        stored += len[b] ? (uint64_t)len[b] : m;
        raw_blocks += !len[b];
    }
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        for (uint64_t b = 0; b < nblocks; b++) {
            uint64_t at = b * block, m = CKPTIO__MIN(block, n - at);
            /* A block kept raw costs a reader at most a copy into place. */
            if (!len[b]) {
                memcpy(out + at, src + at, m);
                continue;
            }
            rc = ckptio__codec_decode(c, codec, dtype, enc + at, (uint64_t)len[b], out + at, m);
            if (rc < 0) {
                fprintf(stderr, "ckptio-codec-bench: decode of block %llu: %s\n",
                        (unsigned long long)b, ckptio_strerror(rc));
                return 1;
            }
        }
        dt[r] = now() - t0;
        if (r == 0 && memcmp(out, src, n)) {
            fprintf(stderr, "ckptio-codec-bench: decoded bytes differ from %s\n", path);
            return 1;
        }
    }
    double bound = bound_ratio(dtype, src, n);
    double cs = median(ct, repeat), ds = median(dt, repeat);
    char bstr[32] = "null";
    if (bound > 0) snprintf(bstr, sizeof bstr, "%.4f", bound);
    printf("{\"dtype\": \"%s\", \"codec\": \"%s\", \"raw_bytes\": %llu, \"stored_bytes\": %llu, "
           "\"ratio\": %.4f, \"raw_blocks\": %llu, \"blocks\": %llu, \"entropy_bound_ratio\": %s, "
           "\"compress_gbps\": %.3f, \"decompress_gbps\": %.3f, \"threads\": 1}\n",
           ckptio_dtype_name(dtype), ckptio__codec_name(codec), (unsigned long long)n,
           (unsigned long long)stored, stored ? (double)n / (double)stored : 0.0,
           (unsigned long long)raw_blocks, (unsigned long long)nblocks, bstr,
           cs > 0 ? (double)n / cs / 1e9 : 0.0, ds > 0 ? (double)n / ds / 1e9 : 0.0);
    free(src);
    free(enc);
    free(out);
    free(len);
    free(ct);
    free(dt);
    ckptio__codec_ctx_free(c);
    return 0;
}
