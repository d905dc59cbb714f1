/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the zip writer: torch.save's layout, CRCs, records in pieces, zip64, misuse. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/common/crc32.h"
#include "test.h"

#define MiB ((size_t)1 << 20)

static uint32_t rd16(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t rd32(const unsigned char *p)
{
    return rd16(p) | rd16(p + 2) << 16;
}

/* Python's zipfile agrees: every name in order, every CRC checked against the data. */
static int zipfile_agrees(const char *path, const char *names)
{
    return t_sh("python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
                "assert z.testzip() is None; got = \",\".join(z.namelist()); "
                "assert got == sys.argv[2], got' '%s' '%s'", path, names);
}

/* Records of every kind at two alignments: the local headers, the padding, the data where it
 * belongs, the descriptors with the CRC of the data. */
static int test_layout(void)
{
    size_t big_len = 21 * MiB + 5; /* several CRC pieces and a short last one */
    unsigned char *big = malloc(big_len);
    CHECK(big);
    t_fill(big, big_len, 7);
    ckptio_zip_writer *z = NULL;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("a.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_add(z, "a/data.pkl", "pickle", 6, 64, 0));
    CHECK_OK(ckptio_zip_writer_add(z, "a/empty", NULL, 0, 4096, 0));
    CHECK_OK(ckptio_zip_writer_add(z, "a/data/0", big, big_len, 4096, 0));
    CHECK_OK(ckptio_zip_writer_add(z, "a/version", "3\n", 2, 4096, 0));
    uint64_t end = ckptio_zip_writer_tell(z);
    CHECK_OK(ckptio_zip_writer_commit(z));
    ckptio_zip_writer_close(z);
    unsigned char *f = NULL;
    long n = t_read_file(t_path("a.pt"), &f);
    CHECK(n > (long)end);
    /* the first record: its header at 0, its data at 64 */
    CHECK(rd32(f) == 0x04034b50u && rd16(f + 6) == 0x0808 && rd32(f + 14) == 0);
    CHECK(30 + rd16(f + 26) + rd16(f + 28) == 64);
    CHECK(memcmp(f + 64, "pickle", 6) == 0);
    CHECK(rd32(f + 70) == 0x08074b50u && rd32(f + 74) == ckptio__crc32(0, "pickle", 6));
    CHECK(rd32(f + 78) == 6 && rd32(f + 82) == 6);
    /* the big record: data at a multiple of 4096 with the CRC after it */
    unsigned char *h = memmem(f, (size_t)n, "a/data/0", 8) - 30;
    size_t data = (size_t)(h - f) + 30 + rd16(h + 26) + rd16(h + 28);
    CHECK(data % 4096 == 0);
    CHECK(memcmp(f + data, big, big_len) == 0);
    CHECK(rd32(f + data + big_len + 4) == ckptio__crc32(0, big, big_len));
    CHECK(zipfile_agrees(t_path("a.pt"), "a/data.pkl,a/empty,a/data/0,a/version") == 0);
    free(f);
    free(big);
    return 0;
}

/* A record given in pieces (as a conversion streams it) is the same file as one given whole. */
static int test_pieces(void)
{
    size_t len = 37 * MiB + 11;
    unsigned char *src = malloc(len);
    CHECK(src);
    t_fill(src, len, 3);
    ckptio_zip_writer *z = NULL;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("whole.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_add(z, "w/data/0", src, len, 4096, 0));
    CHECK_OK(ckptio_zip_writer_add(z, "w/data/1", src, 1000, 64, CKPTIO_ZIP_NO_CRC));
    CHECK_OK(ckptio_zip_writer_commit(z));
    ckptio_zip_writer_close(z);
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("parts.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_begin(z, "w/data/0", len, 4096, 0));
    size_t cuts[] = {1, 4095, 17 * MiB, 3, 19 * MiB + 1};
    size_t at = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        CHECK_OK(ckptio_zip_writer_append(z, src + at, cuts[i]));
        at += cuts[i];
    }
    CHECK_OK(ckptio_zip_writer_append(z, src + at, len - at));
    CHECK_OK(ckptio_zip_writer_begin(z, "w/data/1", 1000, 64, CKPTIO_ZIP_NO_CRC));
    CHECK_OK(ckptio_zip_writer_append(z, src, 1000));
    CHECK_OK(ckptio_zip_writer_commit(z));
    ckptio_zip_writer_close(z);
    unsigned char *a = NULL, *b = NULL;
    long na = t_read_file(t_path("whole.pt"), &a), nb = t_read_file(t_path("parts.pt"), &b);
    CHECK(na > 0 && na == nb && memcmp(a, b, (size_t)na) == 0);
    /* the record without a CRC: zero in its descriptor, which zipfile then reports */
    CHECK(t_sh("python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
               "i = z.getinfo(\"w/data/1\"); assert i.CRC == 0 and i.file_size == 1000; "
               "assert z.testzip() == \"w/data/1\"' '%s'", t_path("parts.pt")) == 0);
    free(a);
    free(b);
    free(src);
    return 0;
}

/* Misuse is refused, with the writer still usable; an uncommitted archive leaves nothing. */
static int test_misuse(void)
{
    ckptio_zip_writer *z = NULL;
    CHECK_ERR(ckptio_zip_writer_open(&z, "", NULL), CKPTIO_E_USAGE);
    CHECK(z == NULL);
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("m.pt"), NULL));
    CHECK_ERR(ckptio_zip_writer_add(z, "", "x", 1, 64, 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_zip_writer_add(z, "a", "x", 1, 96, 0), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_zip_writer_errmsg(z), "power of two"));
    CHECK_ERR(ckptio_zip_writer_add(z, "a", "x", 1, 65536, 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_zip_writer_add(z, "a", NULL, 1, 64, 0), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_zip_writer_append(z, "x", 1), CKPTIO_E_STATE);
    CHECK_OK(ckptio_zip_writer_begin(z, "m/rec", 4, 64, 0));
    CHECK_ERR(ckptio_zip_writer_append(z, "12345", 5), CKPTIO_E_STATE);
    CHECK_ERR(ckptio_zip_writer_begin(z, "m/other", 1, 64, 0), CKPTIO_E_STATE);
    CHECK_ERR(ckptio_zip_writer_commit(z), CKPTIO_E_STATE);
    CHECK(t_contains(ckptio_zip_writer_errmsg(z), "m/rec"));
    CHECK_OK(ckptio_zip_writer_append(z, "1234", 4));
    ckptio_zip_writer_close(z); /* no commit */
    CHECK(access(t_path("m.pt"), F_OK) != 0);
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("m.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_add(z, "m/rec", "1234", 4, 64, 0));
    CHECK_OK(ckptio_zip_writer_commit(z));
    CHECK_ERR(ckptio_zip_writer_add(z, "m/late", "1", 1, 64, 0), CKPTIO_E_STATE);
    ckptio_zip_writer_close(z);
    CHECK(zipfile_agrees(t_path("m.pt"), "m/rec") == 0);
    /* an existing file is kept when overwrite is off */
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = 0;
    CHECK_ERR(ckptio_zip_writer_open(&z, t_path("m.pt"), &p), CKPTIO_E_EXISTS);
    return 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_INSTRUMENTED 1
#else
#define T_INSTRUMENTED 0
#endif

/* Past 4 GiB: a record of 4 GiB + 3 (zip64 sizes, a 24-byte descriptor) and one after it at an
 * offset past 32 bits, from untouched zero pages. zipfile reads the directory and the last
 * record; the big record's CRC is that of its zeros. */
static int test_zip64(void)
{
    if (T_INSTRUMENTED) return T_SKIP; /* 4 GiB through instrumented CRC code: minutes */
    size_t len = ((size_t)4 << 30) + 3;
    unsigned char *zero = t_alloc(len);
    CHECK(zero);
    ckptio_zip_writer *z = NULL;
    CHECK_OK(ckptio_zip_writer_open(&z, t_path("big.pt"), NULL));
    CHECK_OK(ckptio_zip_writer_add(z, "b/data/0", zero, len, 4096, 0));
    CHECK_OK(ckptio_zip_writer_add(z, "b/data/1", "tail", 4, 4096, 0));
    CHECK_OK(ckptio_zip_writer_commit(z));
    ckptio_zip_writer_close(z);
    uint32_t want = ckptio__crc32_parallel(0, zero, len, 2);
    t_free(zero, len);
    int rc = t_sh("python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
                  "a, b = z.infolist(); assert a.file_size == %zu and a.CRC == %u, (a.file_size, a.CRC); "
                  "assert b.header_offset > 1 << 32 and z.read(b) == b\"tail\"; "
                  "f = open(sys.argv[1], \"rb\"); f.seek(a.header_offset + 30 + 8); "
                  "x = f.read(20); assert x[:4] == bytes([1, 0, 16, 0]), x' '%s'",
                  len, want, t_path("big.pt"));
    unlink(t_path("big.pt"));
    CHECK(rc == 0);
    return 0;
}

const ckptio_test tests_zip[] = {
    {"zip/layout", test_layout, 0, 0},
    {"zip/pieces", test_pieces, 0, 0},
    {"zip/misuse", test_misuse, 0, 0},
    {"zip/zip64", test_zip64, 0, 0},
    {0},
};
