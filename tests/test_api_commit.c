/* SPDX-License-Identifier: Apache-2.0 */
/* The commit protocol through the public API: abort, exists and overwrite, failed overwrites. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "api_helpers.h"
#include "test.h"

/* Print the entries of a directory (for failure logs). */
static void list_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    fprintf(stderr, "  entries of %s:", dir);
    while ((de = readdir(d))) fprintf(stderr, " '%s'", de->d_name);
    fputc('\n', stderr);
    closedir(d);
}

/* No `<name>.tmp-*` sibling of checkpoint `name` in t_dir(). */
static int no_tmp(const char *name)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s.tmp", name);
    int n = count_entries(t_dir(), prefix);
    if (n != 0) list_dir(t_dir());
    return n == 0;
}

/* Find the name of the temporary sibling of `name` (a `<name>.tmp-*` entry of t_dir()). */
static int find_tmp(const char *name, char *out, size_t len)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s.tmp-", name);
    DIR *d = opendir(t_dir());
    if (!d) return -1;
    int found = -1;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix))) {
            snprintf(out, len, "%s", de->d_name);
            found = 0;
        }
    closedir(d);
    return found;
}

/* Closing without commit aborts: nothing at the path, no `<name>.tmp-*` sibling, whether
 * nothing, something, or flushed data was added. While the writer is open the path stays
 * absent and the temporary sibling is not a checkpoint. */
static int test_abort(void)
{
    T_SEED(0xAB0);
    const uint64_t n = 2 * MiB + 3;
    unsigned char *a = malloc(n);
    CHECK(a);
    t_fill(a, n, seed);
    uint64_t shape[1] = {n};
    for (int mode = 0; mode < 3; mode++) {
        ckptio_writer *w = NULL;
        CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
        if (mode >= 1) {
            CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
            CHECK_OK(ckptio_writer_set_meta(w, "k", "v", 1));
        }
        if (mode == 2) {
            CHECK_OK(ckptio_writer_flush(w));
            CHECK(!exists(t_path("ck")));
            char tmp[512];
            CHECKF(find_tmp("ck", tmp, sizeof tmp) == 0, "no ck.tmp-* while writing");
            char want[64];
            snprintf(want, sizeof want, "ck.tmp-%d.", (int)getpid());
            CHECKF(!strncmp(tmp, want, strlen(want)), "temporary directory '%s', expected "
                   "'%s<n>'", tmp, want);
            ckptio_reader *r = (ckptio_reader *)&r;
            CHECK_FAIL(ckptio_reader_open(&r, t_path(tmp), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
            CHECK(r == NULL);
        }
        CHECK(!exists(t_path("ck")));
        ckptio_writer_close(w);
        CHECKF(!exists(t_path("ck")), "mode %d: aborted checkpoint is visible", mode);
        CHECKF(no_tmp("ck"), "mode %d: temporary directory left behind", mode);
        CHECKF(count_entries(t_dir(), "") == 0, "mode %d: something was left in t_dir()", mode);
    }
    /* an aborted overwrite leaves the old checkpoint as it was */
    CHECK_OK(save1(t_path("ck"), "old", CKPTIO_DT_U8, 1, shape, a, n, NULL));
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "new", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_flush(w));
    ckptio_writer_close(w);
    CHECK(no_tmp("ck"));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1 && ckptio_reader_find(r, "new") == CKPTIO_E_NOT_FOUND);
    if (load_cmp(r, "old", a, n)) return 1;
    ckptio_reader_close(r);
    free(a);
    return 0;
}

/* Opening a writer on an existing checkpoint (or directory) without overwrite fails with
 * CKPTIO_E_EXISTS and changes nothing; with overwrite the new content replaces the old at
 * commit, with no siblings left; overwrite of a path that does not exist just creates it. */
static int test_exists_overwrite(void)
{
    T_SEED(0xE715);
    const uint64_t n = 100000;
    unsigned char *a = malloc(n), *b = malloc(n), *c = malloc(n);
    CHECK(a && b && c);
    t_fill(a, n, seed), t_fill(b, n, seed + 1), t_fill(c, n, seed + 2);
    uint64_t shape[1] = {n};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_add(w, "b", CKPTIO_DT_U8, 1, shape, NULL, NULL, b, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    struct stat st;
    CHECK(stat(t_path("ck/manifest"), &st) == 0 && S_ISREG(st.st_mode));
    CHECK(stat(t_path("ck/data"), &st) == 0 && S_ISDIR(st.st_mode));

    w = (ckptio_writer *)&w;
    CHECK_FAIL(ckptio_writer_open(&w, t_path("ck"), NULL), CKPTIO_E_EXISTS, "ck");
    CHECK(w == NULL);
    CHECK(mkdir(t_path("plain"), 0700) == 0);
    w = (ckptio_writer *)&w;
    CHECK_FAIL(ckptio_writer_open(&w, t_path("plain"), NULL), CKPTIO_E_EXISTS, NULL);
    CHECK(w == NULL);
    CHECK(no_tmp("ck") && no_tmp("plain"));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    if (load_cmp(r, "a", a, n) || load_cmp(r, "b", b, n)) return 1;
    ckptio_reader_close(r);

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "c", CKPTIO_DT_U8, 1, shape, NULL, NULL, c, n));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "2", 1));
    /* until commit the old checkpoint is what a reader sees */
    CHECK_OK(ckptio_writer_flush(w));
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_find(r, "a") >= 0 && ckptio_reader_find(r, "c") == CKPTIO_E_NOT_FOUND);
    ckptio_reader_close(r);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1);
    CHECK(ckptio_reader_find(r, "a") == CKPTIO_E_NOT_FOUND);
    if (load_cmp(r, "c", c, n)) return 1;
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "gen", &v, &len));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    CHECKF(count_entries(t_dir(), "") == 2, "leftovers after an overwrite");
    CHECK(stat(t_path("ck/manifest"), &st) == 0 && S_ISREG(st.st_mode));

    /* overwrite ON where nothing exists yet */
    CHECK_OK(save1(t_path("fresh"), "a", CKPTIO_DT_U8, 1, shape, a, n, &p));
    CHECK_OK(ckptio_reader_open(&r, t_path("fresh"), NULL));
    if (load_cmp(r, "a", a, n)) return 1;
    ckptio_reader_close(r);
    CHECKF(count_entries(t_dir(), "") == 3, "leftovers after a fresh save");
    free(a), free(b), free(c);
    return 0;
}

/* An overwrite whose commit fails (a tensor missing a chunk: CKPTIO_E_INCOMPLETE) leaves the
 * old checkpoint loadable bit-exact and no temporary directory; the writer takes no more
 * calls but close. */
static int test_overwrite_fail(void)
{
    T_SEED(0x0F41);
    const uint64_t n = MiB + 11;
    unsigned char *a = malloc(n), *x = malloc(n);
    CHECK(a && x);
    t_fill(a, n, seed), t_fill(x, n, seed + 1);
    uint64_t shape[1] = {n};
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "1", 1));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    unsigned char *m0 = NULL;
    long m0len = t_read_file(t_path("ck/manifest"), &m0);
    CHECK(m0len > 0);

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, t_path("ck"), &p));
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, shape, NULL, NULL, x, n));
    uint64_t off[1] = {0}, half[1] = {n / 2};
    CHECK_OK(ckptio_writer_add(w, "holey", CKPTIO_DT_U8, 1, shape, off, half, x, n / 2));
    CHECK_OK(ckptio_writer_set_meta(w, "gen", "2", 1));
    CHECK_FAIL(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE, "holey");
    CHECK_NEG(ckptio_writer_add(w, "more", CKPTIO_DT_U8, 1, shape, NULL, NULL, x, n));
    CHECK_NEG(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    CHECK(no_tmp("ck"));
    CHECKF(count_entries(t_dir(), "") == 1, "leftovers after a failed overwrite");
    unsigned char *m1 = NULL;
    long m1len = t_read_file(t_path("ck/manifest"), &m1);
    CHECK(m1len == m0len && !memcmp(m0, m1, (size_t)m0len));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, t_path("ck"), NULL));
    CHECK(ckptio_reader_num_tensors(r) == 1);
    if (load_cmp(r, "a", a, n)) return 1;
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "gen", &v, &len));
    CHECK(len == 1 && *(const char *)v == '1');
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);

    /* the same failure on a fresh path leaves nothing */
    CHECK_OK(ckptio_writer_open(&w, t_path("ck2"), NULL));
    CHECK_OK(ckptio_writer_add(w, "holey", CKPTIO_DT_U8, 1, shape, off, half, x, n / 2));
    CHECK_FAIL(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE, "holey");
    ckptio_writer_close(w);
    CHECK(!exists(t_path("ck2")) && no_tmp("ck2"));
    free(a), free(x), free(m0), free(m1);
    return 0;
}

/* Opening what is not a checkpoint: a directory without a manifest (NOT_CHECKPOINT), a
 * missing path (-ENOENT), a regular file (some failure). */
static int test_open_errors(void)
{
    T_SEED(0);
    (void)seed;
    ckptio_reader *r = (ckptio_reader *)&r;
    CHECK(mkdir(t_path("empty"), 0700) == 0);
    CHECK_FAIL(ckptio_reader_open(&r, t_path("empty"), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
    CHECK(r == NULL);
    CHECK(mkdir(t_path("empty/data"), 0700) == 0);
    CHECK_FAIL(ckptio_reader_open(&r, t_path("empty"), NULL), CKPTIO_E_NOT_CHECKPOINT, NULL);
    r = (ckptio_reader *)&r;
    CHECK_FAIL(ckptio_reader_open(&r, t_path("nonexistent"), NULL), -ENOENT, NULL);
    CHECK(r == NULL);
    CHECK(t_write_file(t_path("file"), "hello", 5) == 0);
    CHECK_NEG(ckptio_reader_open(&r, t_path("file"), NULL));
    CHECK(r == NULL);
    return 0;
}

const ckptio_test tests_api_commit[] = {
    {"api_abort", test_abort, T_PER_BACKEND, 0},
    {"api_exists_overwrite", test_exists_overwrite, T_PER_BACKEND, 0},
    {"api_overwrite_fail", test_overwrite_fail, T_PER_BACKEND, 0},
    {"api_open_errors", test_open_errors, T_PER_BACKEND, 0},
    {0},
};
