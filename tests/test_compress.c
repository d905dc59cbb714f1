/* SPDX-License-Identifier: Apache-2.0 */
/* Compressed checkpoints: round trips of every dtype, region reads, damage found, raw fallback. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "../src/write/writer.h"

/* Float-like elements: exponents in a narrow band (as trained weights have), random sign and
 * mantissa, with NaNs (payloads kept), -0.0, infinities and subnormals sprinkled in. */
static void fill_floats(void *buf, size_t n, int dtype, uint64_t seed)
{
    size_t es = ckptio_dtype_size(dtype);
    t_fill(buf, n * es, seed);
    uint8_t *b = buf;
    for (size_t i = 0; i < n; i++) {
        uint8_t *e = b + i * es;
        unsigned r = e[0];
        switch (dtype) {
        case CKPTIO_DT_F32: {
            uint32_t v;
            memcpy(&v, e, 4);
            v = (v & 0x807fffffu) | ((uint32_t)(118 + r % 8) << 23);
            if (i % 997 == 1) v = 0x7fc12345u;  /* NaN with a payload */
            if (i % 997 == 2) v = 0x80000000u;  /* -0.0 */
            if (i % 997 == 3) v = 0xff800000u;  /* -inf */
            if (i % 997 == 4) v = 0x00000123u;  /* subnormal */
            memcpy(e, &v, 4);
            break;
        }
        case CKPTIO_DT_BF16: {
            uint16_t v;
            memcpy(&v, e, 2);
            v = (uint16_t)((v & 0x807fu) | ((unsigned)(118 + r % 8) << 7));
            if (i % 997 == 1) v = 0x7fc5;
            if (i % 997 == 2) v = 0x8000;
            if (i % 997 == 3) v = 0x7f80;
            if (i % 997 == 4) v = 0x0003;
            memcpy(e, &v, 2);
            break;
        }
        case CKPTIO_DT_F16: {
            uint16_t v;
            memcpy(&v, e, 2);
            v = (uint16_t)((v & 0x83ffu) | ((unsigned)(9 + r % 5) << 10));
            if (i % 997 == 1) v = 0x7e01;
            if (i % 997 == 2) v = 0x8000;
            if (i % 997 == 3) v = 0xfc00;
            if (i % 997 == 4) v = 0x0001;
            memcpy(e, &v, 2);
            break;
        }
        case CKPTIO_DT_F64: {
            uint64_t v;
            memcpy(&v, e, 8);
            v = (v & 0x800fffffffffffffull) | ((uint64_t)(1016 + r % 8) << 52);
            if (i % 997 == 1) v = 0x7ff8000000abcdefull;
            if (i % 997 == 2) v = 0x8000000000000000ull;
            memcpy(e, &v, 8);
            break;
        }
        case CKPTIO_DT_F8_E4M3FN:
        case CKPTIO_DT_F8_E5M2:
            e[0] = (uint8_t)((e[0] & 0x87u) | ((2 + r % 4) << 3));
            if (i % 997 == 1) e[0] = 0x7f;
            break;
        default: /* integers: small values, compressible by zstd */
            memset(e, 0, es);
            e[0] = (uint8_t)(r % 7);
        }
    }
}

static ckptio_params params(int compress)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.backend = CKPTIO_BACKEND_AUTO;
    p.compress = compress;
    return p;
}

static int manifest_major(const char *ckpt)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest", ckpt);
    unsigned char *m = NULL;
    long n = t_read_file(path, &m);
    int major = n >= 10 ? m[8] | m[9] << 8 : -1;
    free(m);
    return major;
}

static const char *tensor_codec(ckptio_reader *r, const char *name, uint64_t *stored)
{
    ckptio_tensor_info ti = {.size = sizeof ti};
    int64_t i = ckptio_reader_find(r, name);
    if (i < 0 || ckptio_reader_tensor(r, (size_t)i, &ti) < 0) return "?";
    if (stored) *stored = ti.stored_bytes;
    return ti.codec;
}

/* Tensor `name` reads back as `want` (n bytes), and every checksum of the checkpoint holds. */
static int reads_back(ckptio_reader *r, const char *name, const void *want, uint64_t n)
{
    uint8_t *got = malloc(n);
    CHECK(got);
    CHECK_OK(ckptio_reader_read_tensor(r, name, got, n));
    CHECK(memcmp(got, want, n) == 0);
    free(got);
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    return 0;
}

/* Every dtype, 2.5 blocks long (a short last block), in both modes, read back bit for bit. */
static int t_roundtrip_dtypes(void)
{
    static const int dtypes[] = {CKPTIO_DT_F32,  CKPTIO_DT_BF16, CKPTIO_DT_F16,
                                 CKPTIO_DT_F64,  CKPTIO_DT_F8_E4M3FN, CKPTIO_DT_F8_E5M2,
                                 CKPTIO_DT_I64,  CKPTIO_DT_U8,   CKPTIO_DT_I32,
                                 CKPTIO_DT_BOOL, CKPTIO_DT_C64,  CKPTIO_DT_BYTES};
    const size_t nd = sizeof dtypes / sizeof dtypes[0];
    for (int mode = CKPTIO_COMPRESS_AUTO; mode <= CKPTIO_COMPRESS_ALL; mode++) {
        ckptio_params p = params(mode);
        const char *ck = t_path(mode == CKPTIO_COMPRESS_ALL ? "all" : "auto");
        ckptio_writer *w;
        CHECK_OK(ckptio_writer_open(&w, ck, &p));
        void *bufs[16];
        uint64_t lens[16];
        for (size_t k = 0; k < nd; k++) {
            size_t es = ckptio_dtype_size(dtypes[k]);
            uint64_t n = ((5ull << 19) + 3 * 4096) / es; /* 2.5 MiB and a bit */
            lens[k] = n * es;
            bufs[k] = malloc(lens[k]);
            CHECK(bufs[k]);
            if (dtypes[k] == CKPTIO_DT_C64) fill_floats(bufs[k], 2 * n, CKPTIO_DT_F32, k);
            else fill_floats(bufs[k], n, dtypes[k], 7 + k);
            char name[32];
            snprintf(name, sizeof name, "t%02zu.%s", k, ckptio_dtype_name(dtypes[k]));
            CHECK_OK(ckptio_writer_add(w, name, dtypes[k], 1, &n, NULL, NULL, bufs[k], lens[k]));
        }
        CHECK_OK(ckptio_writer_commit(w));
        ckptio_writer_close(w);
        CHECK(manifest_major(ck) == 3);
        ckptio_reader *r;
        CHECK_OK(ckptio_reader_open(&r, ck, &p));
        for (size_t k = 0; k < nd; k++) {
            char name[32];
            snprintf(name, sizeof name, "t%02zu.%s", k, ckptio_dtype_name(dtypes[k]));
            uint64_t stored = 0;
            const char *codec = tensor_codec(r, name, &stored);
            if (mode == CKPTIO_COMPRESS_ALL) {
                if (strcmp(codec, "none") == 0 || stored >= lens[k]) {
                    fprintf(stderr, "%s: codec %s, %llu of %llu bytes\n", name, codec,
                            (unsigned long long)stored, (unsigned long long)lens[k]);
                    return 1;
                }
            }
            uint8_t *got = malloc(lens[k]);
            CHECK(got);
            CHECK_OK(ckptio_reader_read_tensor(r, name, got, lens[k]));
            CHECK(memcmp(got, bufs[k], lens[k]) == 0);
            free(got);
            free(bufs[k]);
        }
        uint64_t bad = 1;
        CHECK_OK(ckptio_reader_verify(r, &bad));
        CHECK(bad == 0);
        ckptio_reader_close(r);
    }
    return 0;
}

/* Boxes of a compressed matrix whose rows (2800 bytes) straddle its 1 MiB blocks. */
static int t_region_reads(void)
{
    enum { R = 1500, C = 700 };
    float *a = malloc((size_t)R * C * 4);
    CHECK(a);
    fill_floats(a, (size_t)R * C, CKPTIO_DT_F32, 3);
    ckptio_params p = params(CKPTIO_COMPRESS_ALL);
    ckptio_writer *w;
    uint64_t shape[2] = {R, C};
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    /* Two chunks: rows [0, 900) and [900, 1500). */
    uint64_t o1[2] = {0, 0}, s1[2] = {900, C}, o2[2] = {900, 0}, s2[2] = {600, C};
    CHECK_OK(ckptio_writer_add(w, "m", CKPTIO_DT_F32, 2, shape, o1, s1, a, 900ull * C * 4));
    CHECK_OK(ckptio_writer_add(w, "m", CKPTIO_DT_F32, 2, shape, o2, s2, a + 900 * C,
                               600ull * C * 4));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    CHECK(strcmp(tensor_codec(r, "m", NULL), "float") == 0);
    static const uint64_t boxes[][4] = {
        {374, 0, 1, C},     {374, 300, 2, 100}, {0, 0, R, 1},      {0, 699, R, 1},
        {880, 10, 40, 600}, {899, 0, 2, C},     {1499, 0, 1, C},   {100, 100, 1, 1},
        {0, 0, R, C},       {750, 350, 700, 1}, {1, 2, 1498, 697},
    };
    for (size_t b = 0; b < sizeof boxes / sizeof boxes[0]; b++) {
        const uint64_t *bx = boxes[b];
        uint64_t off[2] = {bx[0], bx[1]}, shp[2] = {bx[2], bx[3]};
        size_t n = (size_t)(bx[2] * bx[3]);
        float *got = malloc(n * 4);
        CHECK(got);
        ckptio_region reg = {.size = sizeof reg, .name = "m", .offset = off, .shape = shp,
                             .dst = got, .capacity = n * 4};
        CHECK_OK(ckptio_reader_read(r, &reg, 1));
        for (uint64_t i = 0; i < bx[2]; i++)
            if (memcmp(got + i * bx[3], a + (bx[0] + i) * C + bx[1], bx[3] * 4)) {
                fprintf(stderr, "box %zu row %llu differs\n", b, (unsigned long long)i);
                return 1;
            }
        free(got);
    }
    /* Several regions in one call. */
    float *x = malloc(C * 4), *y = malloc(C * 4);
    CHECK(x && y);
    uint64_t ox[2] = {5, 0}, oy[2] = {1200, 0}, sh[2] = {1, C};
    ckptio_region regs[2] = {
        {.size = sizeof regs[0], .name = "m", .offset = ox, .shape = sh, .dst = x, .capacity = C * 4},
        {.size = sizeof regs[0], .name = "m", .offset = oy, .shape = sh, .dst = y, .capacity = C * 4},
    };
    CHECK_OK(ckptio_reader_read(r, regs, 2));
    CHECK(memcmp(x, a + 5 * C, C * 4) == 0 && memcmp(y, a + 1200 * C, C * 4) == 0);
    free(x);
    free(y);
    ckptio_reader_close(r);
    free(a);
    return 0;
}

/* Random bytes do not shrink: every block is stored as it is, the chunk uncoded, the
 * checkpoint plain format 1 and no larger than without compression. */
static int t_random_stays_raw(void)
{
    uint64_t n = 3ull << 20;
    uint8_t *a = malloc(n);
    CHECK(a);
    t_fill(a, n, 11);
    for (int mode = CKPTIO_COMPRESS_AUTO; mode <= CKPTIO_COMPRESS_ALL; mode++) {
        /* AUTO stops trying after the first round of blocks and writes the rest in place. */
        ckptio_params p = params(mode);
        ckptio_writer *w;
        CHECK_OK(ckptio_writer_open(&w, t_path(mode == CKPTIO_COMPRESS_AUTO ? "auto" : "all"), &p));
        CHECK_OK(ckptio_writer_add(w, "r", CKPTIO_DT_U8, 1, &n, NULL, NULL, a, n));
        CHECK_OK(ckptio_writer_add(w, "f", CKPTIO_DT_F32, 1, (uint64_t[]){n / 4}, NULL, NULL, a, n));
        CHECK_OK(ckptio_writer_commit(w));
        ckptio_writer_close(w);
        const char *ck = t_path(mode == CKPTIO_COMPRESS_AUTO ? "auto" : "all");
        CHECK(manifest_major(ck) == 1);
        ckptio_reader *r;
        CHECK_OK(ckptio_reader_open(&r, ck, &p));
        uint64_t stored = 0;
        CHECK(strcmp(tensor_codec(r, "r", &stored), "none") == 0 && stored == n);
        CHECK(strcmp(tensor_codec(r, "f", &stored), "none") == 0 && stored == n);
        CHECK(reads_back(r, "r", a, n) == 0);
        ckptio_reader_close(r);
    }
    free(a);
    return 0;
}

/* A flipped bit anywhere in a compressed chunk is found by read and verify, naming the tensor,
 * the data file and an offset in it. */
static int t_flipped_bit(void)
{
    uint64_t n = 3ull << 18; /* 3 MiB of f32 */
    float *a = malloc(n * 4);
    CHECK(a);
    fill_floats(a, n, CKPTIO_DT_F32, 5);
    ckptio_params p = params(CKPTIO_COMPRESS_ALL);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "layer.w", CKPTIO_DT_F32, 1, &n, NULL, NULL, a, n * 4));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, 0, 0, &ci));
    CHECK(ci.stored_bytes < ci.nbytes);
    char file[4096], rel[256];
    snprintf(file, sizeof file, "%s/%s", t_path("ck"), ci.file);
    snprintf(rel, sizeof rel, "%s", ci.file); /* ci's strings live in the reader */
    ckptio_reader_close(r);
    /* Three places: the first block's header, the middle, the last byte. */
    const uint64_t at[] = {ci.file_offset + 3, ci.file_offset + ci.stored_bytes / 2,
                           ci.file_offset + ci.stored_bytes - 1};
    for (size_t k = 0; k < 3; k++) {
        int fd = open(file, O_RDWR);
        CHECK(fd >= 0);
        uint8_t b;
        CHECK(pread(fd, &b, 1, (off_t)at[k]) == 1);
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, (off_t)at[k]) == 1);
        CHECK(close(fd) == 0);
        CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
        float *got = malloc(n * 4);
        CHECK(got);
        CHECK_ERR(ckptio_reader_read_tensor(r, "layer.w", got, n * 4), CKPTIO_E_CHECKSUM);
        const char *msg = ckptio_reader_errmsg(r);
        CHECK(t_contains(msg, "layer.w") && t_contains(msg, rel) && t_contains(msg, "offset"));
        uint64_t bad = 0;
        CHECK_ERR(ckptio_reader_verify(r, &bad), CKPTIO_E_CHECKSUM);
        CHECK(bad == 1);
        free(got);
        ckptio_reader_close(r);
        fd = open(file, O_RDWR); /* put it back for the next place */
        CHECK(fd >= 0);
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, (off_t)at[k]) == 1);
        CHECK(close(fd) == 0);
    }
    free(a);
    return 0;
}

/* AUTO with a coder that keeps the device waiting (its share of untried blocks at the top):
 * a probing chunk is coded for one round and the rest written as it is, through the sink (it
 * stays coded: its first block shrank), the chunks after it go whole and in place; all read
 * back exactly and verify. */
static int t_auto_busy_coder(void)
{
    float *warm = malloc(1u << 20);
    CHECK(warm);
    fill_floats(warm, 1u << 18, CKPTIO_DT_F32, 8);
    ckptio_params p = params(CKPTIO_COMPRESS_AUTO);
    ckptio_writer *w;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "warm", CKPTIO_DT_F32, 1, (uint64_t[]){1u << 18}, NULL, NULL,
                               warm, 1u << 20));
    CHECK(w->coder);
    w->coder->skip = SKIP_OF - 1; /* as if the device had been idle round after round */
    w->coder->unprobed = PROBE_BYTES; /* and the next chunk the one that looks again */
    uint64_t n = (uint64_t)(w->coder->slots + 4) << 18; /* a round of 1 MiB blocks, and 4 more */
    float *a = malloc(n * 4);
    CHECK(a);
    fill_floats(a, n, CKPTIO_DT_F32, 9);
    CHECK_OK(ckptio_writer_add(w, "big", CKPTIO_DT_F32, 1, &n, NULL, NULL, a, n * 4));
    /* Still busy: the next chunk goes as it is, whole, in place. */
    w->coder->skip = SKIP_OF - 1;
    CHECK_OK(ckptio_writer_add(w, "next", CKPTIO_DT_F32, 1, &n, NULL, NULL, a, n * 4));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), &p));
    uint64_t stored = 0;
    CHECK(strcmp(tensor_codec(r, "big", &stored), "float") == 0);
    /* One block coded (the first; the others of its round were left untried), the rest raw. */
    CHECK(stored < n * 4 && stored > n * 4 - (1u << 20));
    CHECK(strcmp(tensor_codec(r, "next", &stored), "none") == 0 && stored == n * 4);
    CHECK(reads_back(r, "big", a, n * 4) == 0 && reads_back(r, "next", a, n * 4) == 0);
    ckptio_reader_close(r);
    free(a);
    free(warm);
    return 0;
}

const ckptio_test tests_compress[] = {
    {"compress/roundtrip_dtypes", t_roundtrip_dtypes, T_PER_BACKEND, 120},
    {"compress/region_reads", t_region_reads, T_PER_BACKEND, 0},
    {"compress/random_stays_raw", t_random_stays_raw, 0, 0},
    {"compress/flipped_bit", t_flipped_bit, 0, 0},
    {"compress/auto_busy_coder", t_auto_busy_coder, T_PER_BACKEND, 0},
    {0},
};
