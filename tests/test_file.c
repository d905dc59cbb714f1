/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of what commit publishes and where: the single-file API, symlinked paths, and fsync
 * failures after the rename. */
#define CKPTIO_EXPERIMENTAL
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/io/vfs.h"
#include "test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* Entries of directory `dir` whose name contains `needle` (-1 if it cannot be read). */
static int count_names(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, needle)) n++;
    closedir(d);
    return n;
}

static ckptio_params params(int overwrite)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = overwrite ? CKPTIO_ON : CKPTIO_OFF;
    return p;
}

/* Write `len` bytes of t_fill(seed) to `path` through the single-file writer, in pieces of
 * odd sizes so that staging, not only whole requests, is exercised. */
static int write_file(const char *path, size_t len, uint64_t seed, int overwrite)
{
    unsigned char *data = malloc(len ? len : 1);
    CHECK(data);
    t_fill(data, len, seed);
    ckptio_params p = params(overwrite);
    ckptio_file_writer *f = NULL;
    CHECK_OK(ckptio_file_writer_open(&f, path, &p));
    static const size_t pieces[] = {1, 4095, 4096, 3 * MiB + 17, 100, MiB};
    size_t at = 0;
    for (size_t i = 0; at < len; i = (i + 1) % (sizeof pieces / sizeof pieces[0])) {
        size_t n = pieces[i] < len - at ? pieces[i] : len - at;
        CHECK_OK(ckptio_file_writer_write(f, data + at, n));
        at += n;
        CHECK(ckptio_file_writer_tell(f) == at);
    }
    CHECK_OK(ckptio_file_writer_commit(f));
    ckptio_file_writer_close(f);
    free(data);
    return 0;
}

/* Whether the file at `path` holds exactly t_fill(seed) of `len` bytes. */
static int holds(const char *path, size_t len, uint64_t seed)
{
    unsigned char *got = NULL, *want = malloc(len ? len : 1);
    long n = t_read_file(path, &got);
    int ok = want && n == (long)len;
    if (ok) {
        t_fill(want, len, seed);
        ok = !memcmp(got, want, len);
    }
    free(got);
    free(want);
    return ok;
}

/* ---- the single-file writer and reader ---- */

/* Written in odd pieces, committed, read back by ckptio_file_read in ranges: aligned and
 * unaligned destinations, ranges at the start, straddling requests, at the very end, empty. A
 * range past the end is CKPTIO_E_CORRUPT naming the file. */
static int test_roundtrip(void)
{
    const size_t len = 21 * MiB + 333;
    const char *path = t_path("model.bin");
    CHECK_OK(write_file(path, len, 11, 0));
    CHECK(count_names(t_dir(), ".tmp-") == 0);
    CHECK(holds(path, len, 11));

    unsigned char *want = malloc(len);
    CHECK(want);
    t_fill(want, len, 11);
    struct {
        uint64_t off, len;
        int aligned;
    } rs[] = {{0, 4096, 1},          {0, 1000, 0},       {4096, 9 * MiB, 1}, {77, 5 * MiB + 3, 0},
              {len - 333, 333, 0},   {len - 8 * MiB, 8 * MiB, 1},           {12345, 0, 0},
              {20 * MiB, MiB + 333, 1}};
    enum { N = sizeof rs / sizeof rs[0] };
    ckptio_range ranges[N];
    unsigned char *bufs[N];
    size_t caps[N];
    for (size_t i = 0; i < N; i++) {
        caps[i] = (size_t)rs[i].len + 2 * 4096;
        bufs[i] = t_alloc(caps[i]);
        CHECK(bufs[i]);
        ranges[i] = (ckptio_range){.size = sizeof(ckptio_range), .offset = rs[i].off,
                                   .len = rs[i].len,
                                   .dst = bufs[i] + (rs[i].aligned ? 0 : 1)};
    }
    ckptio_stats st;
    CHECK_OK(ckptio_file_read(path, ranges, N, NULL, &st));
    uint64_t total = 0;
    for (size_t i = 0; i < N; i++) {
        CHECK(!memcmp(ranges[i].dst, want + rs[i].off, rs[i].len));
        total += rs[i].len;
    }
    CHECK(st.bytes == total);

    ckptio_range past = {.size = sizeof(ckptio_range), .offset = len - 10, .len = 20,
                         .dst = bufs[0]};
    CHECK_ERR(ckptio_file_read(path, &past, 1, NULL, NULL), CKPTIO_E_CORRUPT);
    CHECK(t_contains(ckptio_last_error(), path));
    for (size_t i = 0; i < N; i++) t_free(bufs[i], caps[i]);
    free(want);
    return 0;
}

/* Without overwrite an existing file is refused at open, and left as it was; a directory is
 * refused even with overwrite. */
static int test_exists(void)
{
    const char *path = t_path("f.pt");
    CHECK(t_write_file(path, "old", 3) == 0);
    ckptio_params p = params(0);
    ckptio_file_writer *f = (ckptio_file_writer *)1;
    CHECK_ERR(ckptio_file_writer_open(&f, path, &p), CKPTIO_E_EXISTS);
    CHECK(f == NULL && t_contains(ckptio_last_error(), path));
    unsigned char *got = NULL;
    CHECK(t_read_file(path, &got) == 3 && !memcmp(got, "old", 3));
    free(got);
    CHECK(mkdir(t_path("d"), 0755) == 0);
    p = params(1);
    CHECK_ERR(ckptio_file_writer_open(&f, t_path("d"), &p), CKPTIO_E_EXISTS);
    CHECK(count_names(t_dir(), ".tmp-") == 0);
    return 0;
}

/* A writer closed without commit leaves nothing: no file at the path, no temporary file; an
 * older file at the path is untouched. */
static int test_close_uncommitted(void)
{
    unsigned char buf[10000];
    t_fill(buf, sizeof buf, 3);
    ckptio_file_writer *f = NULL;
    CHECK_OK(ckptio_file_writer_open(&f, t_path("new.pt"), NULL));
    CHECK_OK(ckptio_file_writer_write(f, buf, sizeof buf));
    CHECK(count_names(t_dir(), ".tmp-") == 1);
    ckptio_file_writer_close(f);
    CHECK(access(t_path("new.pt"), F_OK) < 0 && errno == ENOENT);
    CHECK(count_names(t_dir(), ".tmp-") == 0);

    CHECK_OK(write_file(t_path("old.pt"), 5000, 4, 0));
    ckptio_params p = params(1);
    CHECK_OK(ckptio_file_writer_open(&f, t_path("old.pt"), &p));
    CHECK_OK(ckptio_file_writer_write(f, buf, sizeof buf));
    ckptio_file_writer_close(f);
    CHECK(holds(t_path("old.pt"), 5000, 4));
    CHECK(count_names(t_dir(), ".tmp-") == 0);
    ckptio_file_writer_close(NULL);
    return 0;
}

/* As with open(2) in torch.save: a new file gets 0666 less the umask, a replaced one keeps
 * its mode. */
static int test_mode(void)
{
    static const mode_t masks[] = {022, 027, 0, 077};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%zu.pt", i);
        umask(masks[i]);
        CHECK_OK(write_file(t_path(name), 100, i, 0));
        struct stat st;
        CHECK(stat(t_path(name), &st) == 0);
        if ((st.st_mode & 07777) != (0666 & ~masks[i])) {
            fprintf(stderr, "umask %03o: new file has mode %03o, expected %03o\n",
                    (unsigned)masks[i], (unsigned)(st.st_mode & 07777),
                    (unsigned)(0666 & ~masks[i]));
            return 1;
        }
    }
    umask(022);
    static const mode_t kept[] = {0600, 0640, 0444, 0755};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        const char *path = t_path("keep.pt");
        CHECK_OK(write_file(path, 100, 1, 1));
        CHECK(chmod(path, kept[i]) == 0);
        CHECK_OK(write_file(path, 5000, 2, 1));
        struct stat st;
        CHECK(stat(path, &st) == 0 && holds(path, 5000, 2));
        if ((st.st_mode & 07777) != kept[i]) {
            fprintf(stderr, "a %03o file became %03o when replaced\n", (unsigned)kept[i],
                    (unsigned)(st.st_mode & 07777));
            return 1;
        }
    }
    return 0;
}

/* ---- symlinks ---- */

/* The Hugging Face cache: snapshots/<rev>/model.bin -> ../../blobs/<sha>. A file named by the
 * user is read through its symlinks, like open(2) would; so is a chain of two links. */
static int test_read_symlink(void)
{
    CHECK(t_sh("mkdir -p hf/blobs hf/snapshots/rev") == 0);
    CHECK_OK(write_file(t_path("hf/blobs/abc123"), 3 * MiB + 5, 8, 0));
    CHECK(symlink("../../blobs/abc123", "hf/snapshots/rev/model.bin") == 0);
    CHECK(symlink("hf/snapshots/rev/model.bin", "again.bin") == 0);
    const char *names[] = {"hf/snapshots/rev/model.bin", "again.bin"};
    unsigned char *want = malloc(3 * MiB + 5), *got = t_alloc(3 * MiB + 4096);
    CHECK(want && got);
    t_fill(want, 3 * MiB + 5, 8);
    for (size_t i = 0; i < 2; i++) {
        for (int rel = 0; rel < 2; rel++) {
            const char *path = rel ? names[i] : t_path(names[i]);
            memset(got, 0, 3 * MiB + 5);
            ckptio_range r = {.size = sizeof(ckptio_range), .offset = 0, .len = 3 * MiB + 5,
                              .dst = got};
            CHECK_OK(ckptio_file_read(path, &r, 1, NULL, NULL));
            CHECK(!memcmp(got, want, 3 * MiB + 5));
            /* errors still name the path the caller gave */
            ckptio_range past = {.size = sizeof(ckptio_range), .offset = 3 * MiB, .len = 4096,
                                 .dst = got};
            CHECK_ERR(ckptio_file_read(path, &past, 1, NULL, NULL), CKPTIO_E_CORRUPT);
            CHECK(t_contains(ckptio_last_error(), path));
        }
    }
    CHECK(symlink("nowhere", "dangling.bin") == 0);
    ckptio_range r = {.size = sizeof(ckptio_range), .offset = 0, .len = 1, .dst = got};
    CHECK_ERR(ckptio_file_read("dangling.bin", &r, 1, NULL, NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "dangling.bin"));
    CHECK(symlink("loop.bin", "loop.bin") == 0);
    CHECK_ERR(ckptio_file_read("loop.bin", &r, 1, NULL, NULL), -ELOOP);
    t_free(got, 3 * MiB + 4096);
    free(want);
    return 0;
}

/* Saving to a symlink writes through, as torch.save does: the target is replaced (its
 * temporary file made next to it, not next to the link), the link stays a link. A dangling
 * link creates its target. */
static int test_write_symlink(void)
{
    CHECK(mkdir("store", 0755) == 0 && mkdir("view", 0755) == 0);
    CHECK_OK(write_file(t_path("store/target.pt"), 1000, 1, 0));
    CHECK(chmod("store/target.pt", 0600) == 0);
    CHECK(symlink("../store/target.pt", "view/link.pt") == 0);
    CHECK(symlink("view/link.pt", "link2.pt") == 0);
    const char *links[] = {"view/link.pt", "link2.pt"};
    for (size_t i = 0; i < 2; i++) {
        ckptio_file_writer *f = NULL;
        ckptio_params p = params(0);
        CHECK_ERR(ckptio_file_writer_open(&f, links[i], &p), CKPTIO_E_EXISTS);
        CHECK_OK(write_file(links[i], 2 * MiB + 9, 20 + i, 1));
        struct stat st;
        CHECK(lstat("view/link.pt", &st) == 0 && S_ISLNK(st.st_mode));
        CHECK(lstat("link2.pt", &st) == 0 && S_ISLNK(st.st_mode));
        CHECK(lstat("store/target.pt", &st) == 0 && S_ISREG(st.st_mode));
        CHECK((st.st_mode & 07777) == 0600);
        CHECK(holds("store/target.pt", 2 * MiB + 9, 20 + i));
        CHECK(count_names("view", ".tmp-") == 0 && count_names("store", ".tmp-") == 0 &&
              count_names(".", ".tmp-") == 0);
    }
    /* the temporary file lives beside the target: a rename from beside the link could cross
     * file systems */
    ckptio_file_writer *f = NULL;
    ckptio_params p = params(1);
    CHECK_OK(ckptio_file_writer_open(&f, "view/link.pt", &p));
    CHECK(count_names("store", "target.pt.tmp-") == 1 && count_names("view", ".tmp-") == 0);
    ckptio_file_writer_close(f);
    CHECK(count_names("store", ".tmp-") == 0);

    CHECK(symlink("store/fresh.pt", "dangling.pt") == 0);
    CHECK_OK(write_file("dangling.pt", 100, 5, 0));
    struct stat st;
    CHECK(lstat("dangling.pt", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(holds("store/fresh.pt", 100, 5));
    return 0;
}

/* ---- checkpoints ---- */

static int save_ck(const char *path, uint64_t n, uint64_t seed, int overwrite)
{
    unsigned char *data = malloc(n);
    CHECK(data);
    t_fill(data, n, seed);
    ckptio_params p = params(overwrite);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, path, &p));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &n, NULL, NULL, data, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    free(data);
    return 0;
}

/* Whether the checkpoint at `path` loads and holds save_ck(n, seed). */
static int ck_holds(const char *path, uint64_t n, uint64_t seed)
{
    ckptio_reader *r = NULL;
    if (ckptio_reader_open(&r, path, NULL) < 0) {
        fprintf(stderr, "open '%s': %s\n", path, ckptio_last_error());
        return 0;
    }
    unsigned char *got = malloc(n), *want = malloc(n);
    int ok = got && want && ckptio_reader_read_tensor(r, "t", got, n) == 0;
    if (ok) {
        t_fill(want, n, seed);
        ok = !memcmp(got, want, n);
    }
    ckptio_reader_close(r);
    free(got);
    free(want);
    return ok;
}

/* `latest -> step-1000` opens. With overwrite, saving to the link replaces the checkpoint it
 * points to and keeps the link; without, the link's target exists, so it is refused. */
static int test_ck_symlink(void)
{
    CHECK_OK(save_ck("step-1000", 5000, 1, 0));
    CHECK(symlink("step-1000", "latest") == 0);
    CHECK(ck_holds("latest", 5000, 1) && ck_holds(t_path("latest"), 5000, 1));
    CHECK(ck_holds("latest/", 5000, 1));

    ckptio_params p = params(0);
    ckptio_writer *w = NULL;
    CHECK_ERR(ckptio_writer_open(&w, "latest", &p), CKPTIO_E_EXISTS);
    CHECK_OK(save_ck("latest", 7000, 2, 1));
    struct stat st;
    CHECK(lstat("latest", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat("step-1000", &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(ck_holds("step-1000", 7000, 2) && ck_holds("latest", 7000, 2));
    CHECK(count_names(".", ".tmp-") == 0 && count_names(".", ".old-") == 0);

    /* a link to a link, given with a trailing slash, from another directory */
    CHECK(mkdir("runs", 0755) == 0 && symlink("../latest", "runs/best") == 0);
    CHECK_OK(save_ck(t_path("runs/best/"), 3000, 3, 1));
    CHECK(lstat("runs/best", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(ck_holds("step-1000", 3000, 3));
    CHECK(count_names("runs", ".tmp-") == 0);

    /* a dangling link: the checkpoint is created where it points */
    CHECK(symlink("step-2000", "next") == 0);
    CHECK_OK(save_ck("next", 100, 4, 0));
    CHECK(lstat("next", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(ck_holds("step-2000", 100, 4));
    return 0;
}

/* Inside a checkpoint nothing is followed out of it: a data file that is a symlink to a
 * faithful copy outside is refused (the save's own bytes, so a reader that followed it would
 * succeed). */
static int test_ck_data_symlink_escapes(void)
{
    CHECK_OK(save_ck("ck", 100000, 6, 0));
    CHECK(t_sh("cp ck/data/000000.ckd outside.ckd") == 0);
    const char *targets[] = {"../../outside.ckd", NULL};
    char abs[4200];
    snprintf(abs, sizeof abs, "%s", t_path("outside.ckd"));
    targets[1] = abs;
    for (size_t i = 0; i < 2; i++) {
        CHECK(unlink("ck/data/000000.ckd") == 0);
        CHECK(symlink(targets[i], "ck/data/000000.ckd") == 0);
        ckptio_reader *r = NULL;
        unsigned char *got = malloc(100000);
        CHECK(got);
        int rc = ckptio_reader_open(&r, "ck", NULL);
        if (rc == 0) rc = ckptio_reader_read_tensor(r, "t", got, 100000);
        CHECK(rc < 0);
        const char *msg = r ? ckptio_reader_errmsg(r) : ckptio_last_error();
        CHECK(t_contains(msg, "000000.ckd"));
        ckptio_reader_close(r);
        free(got);
    }
    return 0;
}

/* With overwrite, an empty directory at the path is replaced only by the commit: a writer
 * closed without commit, or whose commit fails, leaves the very same directory there. */
static int test_ck_empty_dir_kept(void)
{
    struct stat before, after;
    CHECK(mkdir("ck", 0700) == 0 && stat("ck", &before) == 0);
    ckptio_params p = params(1);
    unsigned char data[4096];
    t_fill(data, sizeof data, 9);
    uint64_t shape = sizeof data, half = sizeof data / 2;

    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &shape, NULL, NULL, data, shape));
    CHECK(stat("ck", &after) == 0 && after.st_ino == before.st_ino);
    ckptio_writer_close(w);
    CHECK(stat("ck", &after) == 0 && after.st_ino == before.st_ino && S_ISDIR(after.st_mode));

    /* the commit fails: half a tensor */
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &shape, NULL, &half, data, half));
    CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE);
    ckptio_writer_close(w);
    CHECK(stat("ck", &after) == 0 && after.st_ino == before.st_ino);
    CHECK(count_names(".", ".tmp-") == 0);

    /* something appeared in it meanwhile: the commit refuses to replace it */
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &shape, NULL, NULL, data, shape));
    CHECK(t_write_file("ck/notes.txt", "mine", 4) == 0);
    CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_EXISTS);
    CHECK(t_contains(ckptio_writer_errmsg(w), "ck"));
    ckptio_writer_close(w);
    CHECK(stat("ck", &after) == 0 && after.st_ino == before.st_ino);
    CHECK(access("ck/notes.txt", F_OK) == 0);
    CHECK(unlink("ck/notes.txt") == 0);

    /* a commit that succeeds replaces it */
    CHECK_OK(save_ck("ck", 4096, 9, 1));
    CHECK(ck_holds("ck", 4096, 9));
    CHECK(count_names(".", ".tmp-") == 0);
    return 0;
}

/* ---- an fsync failure after the rename ---- */

/* The vfs fails (EIO) every fsync of the directory whose inode is fail_ino. */
static ino_t fail_ino;
static unsigned fail_fired;
static int fsync_failing(int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_ino == fail_ino) {
        fail_fired++;
        errno = EIO;
        return -1;
    }
    return ckptio__vfs_real.fsync(fd);
}

static int arm_dir_fsync_failure(const char *dir)
{
    static ckptio__vfs v;
    v = ckptio__vfs_real;
    v.fsync = fsync_failing;
    struct stat st;
    CHECK(stat(dir, &st) == 0);
    fail_ino = st.st_ino;
    fail_fired = 0;
    ckptio__vfs_set(&v);
    return 0;
}

/* The rename is done and the file or checkpoint complete, but the parent directory's fsync
 * fails: commit says so with CKPTIO_E_NOT_DURABLE (not a plain -EIO, which would read as "not
 * saved"), names the path and the directory, and what it published is there and loads. */
static int test_not_durable(void)
{
    CHECK(mkdir("out", 0755) == 0);
    CHECK_OK(save_ck("out/ck", 3000, 1, 0));
    CHECK_OK(write_file("out/f.pt", 3000, 1, 0));
    CHECK_OK(arm_dir_fsync_failure("out"));
    unsigned char data[8192];
    t_fill(data, sizeof data, 2);
    uint64_t n = sizeof data;

    for (int replace = 0; replace < 2; replace++) {
        const char *path = replace ? "out/ck" : "out/ck-new";
        ckptio_params p = params(replace);
        ckptio_writer *w = NULL;
        CHECK_OK(ckptio_writer_open(&w, path, &p));
        CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &n, NULL, NULL, data, n));
        unsigned fired = fail_fired;
        CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_NOT_DURABLE);
        CHECK(fail_fired > fired);
        const char *msg = ckptio_writer_errmsg(w);
        fprintf(stderr, "%s\n", msg);
        CHECK(t_contains(msg, "published at") && t_contains(msg, path) &&
              t_contains(msg, "may not be durable") && t_contains(msg, "fsync of"));
        CHECK(t_contains(ckptio_last_error(), path));
        /* the writer is done: it was committed */
        CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_STATE);
        ckptio_writer_close(w);
        CHECK(ck_holds(path, n, 2));
        CHECK(count_names("out", ".tmp-") == 0 && count_names("out", ".old-") == 0);
    }

    for (int replace = 0; replace < 2; replace++) {
        const char *path = replace ? "out/f.pt" : "out/g.pt";
        ckptio_params p = params(replace);
        ckptio_file_writer *f = NULL;
        CHECK_OK(ckptio_file_writer_open(&f, path, &p));
        CHECK_OK(ckptio_file_writer_write(f, data, sizeof data));
        unsigned fired = fail_fired;
        CHECK_ERR(ckptio_file_writer_commit(f), CKPTIO_E_NOT_DURABLE);
        CHECK(fail_fired > fired);
        const char *msg = ckptio_file_writer_errmsg(f);
        fprintf(stderr, "%s\n", msg);
        CHECK(t_contains(msg, "published at") && t_contains(msg, path) &&
              t_contains(msg, "may not be durable"));
        CHECK_ERR(ckptio_file_writer_commit(f), CKPTIO_E_STATE);
        ckptio_file_writer_close(f);
        CHECK(holds(path, sizeof data, 2));
        CHECK(count_names("out", ".tmp-") == 0);
    }
    ckptio__vfs_set(NULL);
    CHECK(!strcmp(ckptio_errname(CKPTIO_E_NOT_DURABLE), "CKPTIO_E_NOT_DURABLE") ||
          t_contains(ckptio_errname(CKPTIO_E_NOT_DURABLE), "NOT_DURABLE"));
    return 0;
}

const ckptio_test tests_file[] = {
    {"file/roundtrip", test_roundtrip, T_PER_BACKEND, 0},
    {"file/exists", test_exists, 0, 0},
    {"file/close_uncommitted", test_close_uncommitted, T_PER_BACKEND, 0},
    {"file/mode", test_mode, 0, 0},
    {"file/read_symlink", test_read_symlink, T_PER_BACKEND, 0},
    {"file/write_symlink", test_write_symlink, T_PER_BACKEND, 0},
    {"file/ck_symlink", test_ck_symlink, T_PER_BACKEND, 0},
    {"file/ck_data_symlink_escapes", test_ck_data_symlink_escapes, 0, 0},
    {"file/ck_empty_dir_kept", test_ck_empty_dir_kept, 0, 0},
    {"file/not_durable", test_not_durable, T_PER_BACKEND, 0},
    {0},
};
