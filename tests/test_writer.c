/* SPDX-License-Identifier: Apache-2.0 */
/* The writer's data path: several data files per checkpoint, their names, and the sink's pieces. */
#define CKPTIO_EXPERIMENTAL
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

#define MIB (1ull << 20)

/* Tensors chosen so that a 1 MiB bound rolls files between and inside them: a 3 MiB chunk
 * from an odd address (staged), an aligned 2.5 MiB chunk (in place, larger than the bound: a
 * file of its own), a row-sharded tensor of 8 x 300 KiB chunks, many tiny tensors, an empty
 * tensor and a scalar. */
typedef struct big_state {
    unsigned char *un, *al, *rows, *tiny;
    float scalar;
} big_state;

#define UN_LEN (3 * MIB + 7)
#define AL_LEN (5 * MIB / 2)
#define ROW_LEN (300u << 10)
#define N_ROWS 8
#define N_TINY 40

static int big_make(big_state *s)
{
    s->un = t_alloc(UN_LEN + 1);
    s->al = t_alloc(AL_LEN);
    s->rows = t_alloc((size_t)ROW_LEN * N_ROWS);
    s->tiny = t_alloc(N_TINY * 100);
    if (!s->un || !s->al || !s->rows || !s->tiny) return -1;
    t_fill(s->un, UN_LEN + 1, 1);
    t_fill(s->al, AL_LEN, 2);
    t_fill(s->rows, (size_t)ROW_LEN * N_ROWS, 3);
    t_fill(s->tiny, N_TINY * 100, 4);
    s->scalar = 2.5f;
    return 0;
}

static void big_free(big_state *s)
{
    t_free(s->un, UN_LEN + 1);
    t_free(s->al, AL_LEN);
    t_free(s->rows, (size_t)ROW_LEN * N_ROWS);
    t_free(s->tiny, N_TINY * 100);
}

/* Save s at path; prefix and bound as for ckptio_writer_set_data_files (skipped when both are
 * unset, so that the default path is what runs). */
static int big_save(const char *path, const big_state *s, const char *prefix, uint64_t bound)
{
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    int rc = ckptio_writer_open(&w, path, &p);
    if (rc >= 0 && (prefix || bound)) rc = ckptio_writer_set_data_files(w, prefix, bound);
    uint64_t shape[2] = {UN_LEN, 0};
    if (rc >= 0)
        rc = ckptio_writer_add(w, "a.unaligned", CKPTIO_DT_U8, 1, shape, NULL, NULL, s->un + 1,
                               UN_LEN);
    shape[0] = AL_LEN;
    if (rc >= 0)
        rc = ckptio_writer_add(w, "b.aligned", CKPTIO_DT_U8, 1, shape, NULL, NULL, s->al, AL_LEN);
    uint64_t rshape[2] = {N_ROWS, ROW_LEN}, one[2] = {1, ROW_LEN};
    for (uint64_t r = 0; rc >= 0 && r < N_ROWS; r++) {
        uint64_t off[2] = {r, 0};
        rc = ckptio_writer_add(w, "c.rows", CKPTIO_DT_U8, 2, rshape, off, one,
                               s->rows + r * ROW_LEN, ROW_LEN);
    }
    for (int i = 0; rc >= 0 && i < N_TINY; i++) {
        char name[32];
        snprintf(name, sizeof name, "d.tiny.%02d", i);
        shape[0] = 100;
        rc = ckptio_writer_add(w, name, CKPTIO_DT_U8, 1, shape, NULL, NULL, s->tiny + 100 * i,
                               100);
    }
    uint64_t empty[2] = {4, 0};
    if (rc >= 0) rc = ckptio_writer_add(w, "e.empty", CKPTIO_DT_F32, 2, empty, NULL, NULL, NULL, 0);
    if (rc >= 0)
        rc = ckptio_writer_add(w, "f.scalar", CKPTIO_DT_F32, 0, NULL, NULL, NULL, &s->scalar, 4);
    if (rc >= 0) rc = ckptio_writer_set_meta(w, "step", "9", 1);
    if (rc >= 0) rc = ckptio_writer_commit(w);
    if (rc < 0) fprintf(stderr, "save: %s\n", w ? ckptio_writer_errmsg(w) : ckptio_last_error());
    ckptio_writer_close(w);
    return rc;
}

/* 0 if path holds exactly s and verifies; prints what differs otherwise. */
static int big_check(const char *path, const big_state *s)
{
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    CHECK(ckptio_reader_num_tensors(r) == 5 + N_TINY);
    unsigned char *buf = t_alloc(4 * MIB);
    CHECK(buf);
    CHECK_OK(ckptio_reader_read_tensor(r, "a.unaligned", buf, 4 * MIB));
    CHECK(!memcmp(buf, s->un + 1, UN_LEN));
    CHECK_OK(ckptio_reader_read_tensor(r, "b.aligned", buf, 4 * MIB));
    CHECK(!memcmp(buf, s->al, AL_LEN));
    CHECK_OK(ckptio_reader_read_tensor(r, "c.rows", buf, 4 * MIB));
    CHECK(!memcmp(buf, s->rows, (size_t)ROW_LEN * N_ROWS));
    for (int i = 0; i < N_TINY; i++) {
        char name[32];
        snprintf(name, sizeof name, "d.tiny.%02d", i);
        CHECK_OK(ckptio_reader_read_tensor(r, name, buf, 4096));
        CHECK(!memcmp(buf, s->tiny + 100 * i, 100));
    }
    float f = 0;
    CHECK_OK(ckptio_reader_read_tensor(r, "f.scalar", &f, sizeof f));
    CHECK(f == s->scalar);
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    t_free(buf, 4 * MIB);
    ckptio_reader_close(r);
    return 0;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* A 1 MiB bound: many files, every chunk in one file, each file within the bound unless it
 * holds a single larger chunk; it loads back exactly, verifies, and the command sees them. */
static int test_many_files(void)
{
    big_state s;
    CHECK(big_make(&s) == 0);
    CHECK_OK(big_save("ckpt", &s, NULL, MIB));
    CHECK(big_check("ckpt", &s) == 0);
    int n = count_prefix_in(t_path("ckpt/data"), "");
    n -= 2; /* . and .. */
    printf("%d data files\n", n);
    /* 3 MiB; 2.5 MiB; rows 0-2; rows 3-5; rows 6-7 with the tiny tensors and the scalar. */
    CHECK(n == 5);
    CHECK(count_prefix_in(t_path("ckpt/data"), "0000") == n);
    char name[64];
    snprintf(name, sizeof name, "ckpt/data/%06d.ckd", n - 1);
    CHECK(file_size(t_path(name)) > 0);

    /* Each chunk of the row-sharded tensor is where the reader says, files in order. */
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ckpt", NULL));
    int64_t ti = ckptio_reader_find(r, "c.rows");
    CHECK_OK(ti);
    char prev[64] = "";
    int distinct = 0;
    for (size_t c = 0; c < N_ROWS; c++) {
        ckptio_chunk_info ci;
        CHECK_OK(ckptio_reader_chunk(r, (size_t)ti, c, &ci));
        CHECK(ci.file_offset + ci.stored_bytes <= MIB);
        if (strcmp(prev, ci.file)) {
            CHECK(strcmp(prev, ci.file) < 0);
            distinct++;
            snprintf(prev, sizeof prev, "%s", ci.file);
        }
    }
    CHECK(distinct >= 3);
    ckptio_reader_close(r);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "ckpt/data/%06d.ckd", i);
        long len = file_size(t_path(name));
        CHECK(len > 0);
        /* only the files of the two large single chunks pass the bound */
        if (len > (long)MIB) CHECK(len == (long)UN_LEN || len == (long)AL_LEN);
    }

    CHECK(t_sh("'%s' verify ckpt > verify.txt 2>&1", CKPTIO_EXE) == 0);
    CHECK(t_sh("'%s' inspect --json ckpt > inspect.txt 2>&1", CKPTIO_EXE) == 0);
    unsigned char *out = NULL;
    CHECK(t_read_file("inspect.txt", &out) > 0);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "\"data/%06d.ckd\"", i);
        CHECK(t_contains((const char *)out, name));
    }
    free(out);
    big_free(&s);
    return leak_check();
}

/* A prefix names every file; without a bound there is one. */
static int test_prefix(void)
{
    big_state s;
    CHECK(big_make(&s) == 0);
    CHECK_OK(big_save("one", &s, "r00003-", 0));
    CHECK(big_check("one", &s) == 0);
    CHECK(count_prefix_in(t_path("one/data"), "r00003-") == 1);
    CHECK(file_size(t_path("one/data/r00003-000000.ckd")) > 0);
    CHECK(count_prefix_in(t_path("one/data"), "0") == 0);

    CHECK_OK(big_save("many", &s, "r00003-", 2 * MIB));
    CHECK(big_check("many", &s) == 0);
    int n = count_prefix_in(t_path("many/data"), "r00003-");
    CHECK(n >= 3);
    CHECK(count_prefix_in(t_path("many/data"), "") == n + 2);
    CHECK(file_size(t_path("many/data/r00003-000001.ckd")) > 0);
    big_free(&s);
    return leak_check();
}

/* A bound no chunk reaches, or an empty prefix, leaves the default layout, byte for byte. */
static int test_default_unchanged(void)
{
    big_state s;
    CHECK(big_make(&s) == 0);
    CHECK_OK(big_save("plain", &s, NULL, 0));
    CHECK_OK(big_save("bounded", &s, "", 1ull << 40));
    CHECK(count_prefix_in(t_path("plain/data"), "") == 3);
    CHECK(count_prefix_in(t_path("bounded/data"), "") == 3);
    const char *files[] = {"manifest", "data/000000.ckd"};
    for (int i = 0; i < 2; i++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "plain/%s", files[i]);
        snprintf(b, sizeof b, "bounded/%s", files[i]);
        unsigned char *x = NULL, *y = NULL;
        long lx = t_read_file(t_path(a), &x), ly = t_read_file(t_path(b), &y);
        CHECK(lx > 0 && lx == ly && !memcmp(x, y, (size_t)lx));
        free(x);
        free(y);
    }
    big_free(&s);
    return leak_check();
}

static int test_set_data_files_usage(void)
{
    CHECK_ERR(ckptio_writer_set_data_files(NULL, "x", 0), CKPTIO_E_USAGE);
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ckpt", &p));
    CHECK_ERR(ckptio_writer_set_data_files(w, "../x", 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_writer_set_data_files(w, ".x", 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_writer_set_data_files(w, "a/b", 0), CKPTIO_E_USAGE);
    char longp[80];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    CHECK_ERR(ckptio_writer_set_data_files(w, longp, 0), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_writer_errmsg(w), "prefix"));
    /* renamed twice, then back: the first file follows */
    CHECK_OK(ckptio_writer_set_data_files(w, "r1-", 0));
    CHECK_OK(ckptio_writer_set_data_files(w, "r2.", 0));
    uint8_t v[16] = {1, 2, 3};
    uint64_t shape = sizeof v;
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &shape, NULL, NULL, v, sizeof v));
    CHECK_ERR(ckptio_writer_set_data_files(w, "r3-", 0), CKPTIO_E_STATE);
    CHECK(t_contains(ckptio_writer_errmsg(w), "before the first"));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK(count_prefix_in(t_path("ckpt/data"), "") == 3);
    CHECK(file_size(t_path("ckpt/data/r2.000000.ckd")) == (long)sizeof v);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ckpt", NULL));
    uint8_t back[16] = {0};
    CHECK_OK(ckptio_reader_read_tensor(r, "t", back, sizeof back));
    CHECK(!memcmp(back, v, sizeof v));
    ckptio_reader_close(r);
    return leak_check();
}

/* A source written in place whose length is no multiple of the request nor of the alignment:
 * whole requests in place, then a short piece whose tail is staged; every block checksum
 * (some from the hasher thread, some from the hook) matches. */
static int test_in_place_tails(void)
{
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ckpt", &p));
    const uint64_t lens[] = {3 * (256u << 10) + 100, (256u << 10) + 4096 + 1, 600u << 10,
                             (2 * MIB) + 4095};
    unsigned char *src[4];
    for (int i = 0; i < 4; i++) {
        src[i] = t_alloc(lens[i]);
        CHECK(src[i]);
        t_fill(src[i], lens[i], 50 + (uint64_t)i);
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(ckptio_writer_add(w, name, CKPTIO_DT_U8, 1, &lens[i], NULL, NULL, src[i],
                                   lens[i]));
    }
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ckpt", NULL));
    unsigned char *buf = t_alloc(3 * MIB);
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        CHECK_OK(ckptio_reader_read_tensor(r, name, buf, 3 * MIB));
        CHECK(!memcmp(buf, src[i], lens[i]));
        t_free(src[i], lens[i]);
    }
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    t_free(buf, 3 * MIB);
    ckptio_reader_close(r);
    return leak_check();
}

/* Opening the next data file fails (EMFILE): the add that needed it fails naming the tensor
 * and the file, the writer is poisoned, nothing is published and the temp dir goes away. */
static ckptio__vfs roll_vfs;
static int roll_openat(int d, const char *p, int fl, mode_t m)
{
    if (strstr(p, "000001.ckd")) {
        errno = EMFILE;
        return -1;
    }
    return ckptio__vfs_real.openat(d, p, fl, m);
}

static int test_roll_fails(void)
{
    big_state s;
    CHECK(big_make(&s) == 0);
    roll_vfs = ckptio__vfs_real;
    roll_vfs.openat = roll_openat;
    ckptio__vfs_set(&roll_vfs);
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ckpt", &p));
    CHECK_OK(ckptio_writer_set_data_files(w, NULL, MIB));
    uint64_t shape = UN_LEN;
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, &shape, NULL, NULL, s.un + 1, UN_LEN));
    shape = AL_LEN;
    CHECK_ERR(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, &shape, NULL, NULL, s.al, AL_LEN),
              -EMFILE);
    printf("%s\n", ckptio_writer_errmsg(w));
    CHECK(t_contains(ckptio_writer_errmsg(w), "tensor 'b'"));
    CHECK(t_contains(ckptio_writer_errmsg(w), "data/000001.ckd"));
    CHECK(ckptio_writer_commit(w) < 0);
    ckptio_writer_close(w);
    ckptio__vfs_set(NULL);
    CHECK(count_prefix("ckpt") == 0);
    big_free(&s);
    return leak_check();
}

const ckptio_test tests_writer[] = {
    {"writer/many_files", test_many_files, T_PER_BACKEND, 60},
    {"writer/prefix", test_prefix, 0, 60},
    {"writer/default_unchanged", test_default_unchanged, 0, 60},
    {"writer/set_data_files_usage", test_set_data_files_usage, 0, 30},
    {"writer/in_place_tails", test_in_place_tails, T_PER_BACKEND, 30},
    {"writer/roll_fails", test_roll_fails, 0, 30},
    {0},
};
