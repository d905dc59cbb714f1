/* SPDX-License-Identifier: Apache-2.0 */
/* Striping: one checkpoint spread over several roots, read back, moved, crashed and replaced. */
#define CKPTIO_EXPERIMENTAL
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/format/manifest.h"
#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define N_T 12

/* Twelve tensors: ten of 512 KiB (so equal chunks alternate over the roots) and two odd ones. */
static const uint64_t sizes[N_T] = {512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB,
                                   512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB,
                                   100,       3 * KIB + 5};

static unsigned char *data[N_T];

static int make_data(void)
{
    for (int i = 0; i < N_T; i++) {
        data[i] = t_alloc(sizes[i]);
        if (!data[i]) return -1;
        t_fill(data[i], sizes[i], (uint64_t)i + 11);
    }
    return 0;
}

static void free_data(void)
{
    for (int i = 0; i < N_T; i++) t_free(data[i], sizes[i]);
}

static const char *tname(int i)
{
    static char b[16];
    snprintf(b, sizeof b, "t%02d", i);
    return b;
}

/* Save the tensors at path striped over roots (n of them); seed changes the bytes. */
static int save(const char *path, const char *const *roots, size_t n, int overwrite,
                uint64_t bound)
{
    ckptio_params p = fparams(overwrite);
    ckptio_writer *w = NULL;
    int rc = ckptio_writer_open(&w, path, &p);
    if (rc >= 0 && n) rc = ckptio_writer_set_roots(w, roots, n);
    if (rc >= 0 && bound) rc = ckptio_writer_set_data_files(w, NULL, bound);
    for (int i = 0; rc >= 0 && i < N_T; i++) {
        uint64_t shape = sizes[i];
        rc = ckptio_writer_add(w, tname(i), CKPTIO_DT_U8, 1, &shape, NULL, NULL, data[i],
                               sizes[i]);
    }
    if (rc >= 0) rc = ckptio_writer_commit(w);
    if (rc < 0) fprintf(stderr, "save '%s': %s\n", path, ckptio_last_error());
    ckptio_writer_close(w);
    return rc;
}

/* Read tensor i whole into dst. */
static int read_tensor(ckptio_reader *r, int i, void *dst, uint64_t cap)
{
    ckptio_region reg;
    memset(&reg, 0, sizeof reg);
    reg.size = sizeof reg;
    reg.name = tname(i);
    reg.dst = dst;
    reg.capacity = cap;
    return ckptio_reader_read(r, &reg, 1);
}

/* The mapper (mapped loads) finds the same stripes: every whole tensor, read through the
 * descriptor it hands out, is the saved bytes and passes its checksums. */
static int check_mapped(const char *path, const char *const *roots, size_t n)
{
    ckptio_mapper *m = NULL;
    CHECK_OK(ckptio_mapper_open(&m, path));
    if (n) CHECK_OK(ckptio_mapper_set_roots(m, roots, n));
    for (int i = 0; i < N_T; i++) {
        int fd = -1;
        uint64_t off = 0, len = 0;
        CHECK_OK(ckptio_mapper_chunk(m, (size_t)i, 0, &fd, &off, &len));
        CHECK(len == sizes[i]);
        unsigned char *got = t_alloc(len);
        CHECK(got && pread(fd, got, len, (off_t)off) == (ssize_t)len);
        CHECK(memcmp(got, data[i], len) == 0);
        CHECK_OK(ckptio_mapper_check(m, (size_t)i, 0, got, len));
        t_free(got, len);
    }
    /* A descriptor handed out stays what it is: the roots are fixed from then on. */
    CHECK_ERR(ckptio_mapper_set_roots(m, roots, n), CKPTIO_E_STATE);
    ckptio_mapper_close(m);
    return 0;
}

/* Read every tensor of path back (with roots= when n) and compare, eagerly and mapped. */
static int check_load(const char *path, const char *const *roots, size_t n)
{
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    if (n) CHECK_OK(ckptio_reader_set_roots(r, roots, n));
    CHECK(ckptio_reader_num_tensors(r) == N_T);
    for (int i = 0; i < N_T; i++) {
        unsigned char *got = t_alloc(sizes[i]);
        CHECK(got);
        int rc = read_tensor(r, i, got, sizes[i]);
        if (rc < 0) {
            fprintf(stderr, "read %s: %s\n", tname(i), ckptio_reader_errmsg(r));
            ckptio_reader_close(r);
            return rc;
        }
        CHECK(memcmp(got, data[i], sizes[i]) == 0);
        t_free(got, sizes[i]);
    }
    ckptio_reader_close(r);
    return check_mapped(path, roots, n);
}

/* The stripe directories in `root` whose name starts with `stem.`: count, and the last name. */
static int stripes_in(const char *root, const char *stem, char *name, size_t cap)
{
    DIR *d = opendir(root);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    size_t sl = strlen(stem);
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len > 14 && !strncmp(de->d_name, stem, sl) && de->d_name[sl] == '.' &&
            !strcmp(de->d_name + len - 14, ".ckptio-stripe")) {
            n++;
            if (name) snprintf(name, cap, "%s", de->d_name);
        }
    }
    closedir(d);
    return n;
}

/* Total bytes of the regular files in dir (not recursive). */
static uint64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st; /* by the directory's descriptor: no path to build (or to truncate) */
        if (fstatat(dirfd(d), de->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    }
    closedir(d);
    return sum;
}

static int manifest_major(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/manifest", path);
    unsigned char *buf = NULL;
    long n = t_read_file(p, &buf);
    int major = n >= 10 ? buf[8] | buf[9] << 8 : -1;
    free(buf);
    return major;
}

static int mkdirs(const char *a, const char *b, const char *c)
{
    const char *d[] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (d[i] && mkdir(d[i], 0755) < 0) return -1;
    return 0;
}

/* Round trip over the checkpoint's own directory and two roots: each gets a third of the bytes
 * (equal chunks alternate), the manifest is format 2, and everything reads back. */
static int test_round_trip(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", NULL) == 0);
    const char *roots[] = {t_path("r1"), "r2"}; /* absolute and relative both work */
    CHECK_OK(save("ck", roots, 2, 0, 0));
    CHECK(manifest_major("ck") == 2);
    char s1[256], s2[256], p[4096];
    CHECK(stripes_in("r1", "ck", s1, sizeof s1) == 1);
    CHECK(stripes_in("r2", "ck", s2, sizeof s2) == 1);
    snprintf(p, sizeof p, "r1/%s/data", s1);
    uint64_t b1 = dir_bytes(p);
    snprintf(p, sizeof p, "r2/%s/data", s2);
    uint64_t b2 = dir_bytes(p);
    uint64_t b0 = dir_bytes("ck/data");
    printf("bytes per root: %llu %llu %llu\n", (unsigned long long)b0, (unsigned long long)b1,
           (unsigned long long)b2);
    /* 10 x 512 KiB over 3 roots: 4, 3, 3 chunks, the odd small ones on the lighter roots. */
    uint64_t lo = 3 * 512 * KIB, hi = 4 * 512 * KIB + 8 * KIB;
    CHECK(b0 >= lo && b0 <= hi && b1 >= lo && b1 <= hi && b2 >= lo && b2 <= hi);
    CHECK(check_load("ck", NULL, 0) == 0);
    free_data();
    return 0;
}

/* Several files per root (a size bound) and a root given as the checkpoint's own parent. */
static int test_rolls_and_parent_root(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", NULL, NULL) == 0);
    const char *roots[] = {t_dir(), "r1"};
    CHECK_OK(save("ck", roots, 2, 0, 1 * MIB));
    char s1[256], p[4096];
    CHECK(stripes_in("r1", "ck", s1, sizeof s1) == 1);
    CHECK(stripes_in(t_dir(), "ck", NULL, 0) == 0); /* the parent is the checkpoint's share */
    snprintf(p, sizeof p, "r1/%s/data", s1);
    uint64_t b1 = dir_bytes(p), b0 = dir_bytes("ck/data");
    CHECK(b0 >= 5 * 512 * KIB && b1 >= 5 * 512 * KIB);
    CHECK(check_load("ck", NULL, 0) == 0);
    /* Only the parent: nothing to stripe, format 1 as before. */
    const char *only[] = {"."};
    CHECK_OK(save("plain", only, 1, 0, 0));
    CHECK(manifest_major("plain") == 1);
    CHECK(check_load("plain", NULL, 0) == 0);
    free_data();
    return 0;
}

/* A missing root names the checkpoint, the root and what to do; roots= finds moved stripes, in
 * any order, the recorded root still serving a stripe that did not move. */
static int test_missing_and_relocated(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", "elsewhere") == 0);
    const char *roots[] = {"r1", "r2"};
    CHECK_OK(save("ck", roots, 2, 0, 0));
    CHECK(rename("r2", "elsewhere/r2") == 0);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ck", NULL)); /* the manifest alone opens */
    const char *bad[] = {"elsewhere", NULL};
    CHECK_ERR(ckptio_reader_set_roots(r, bad, 2), CKPTIO_E_USAGE); /* refused whole */
    int rc = 0;
    char buf[512 * KIB];
    for (int i = 0; i < N_T && rc >= 0; i++) rc = read_tensor(r, i, buf, sizeof buf);
    CHECK(rc == -ENOENT);
    const char *msg = ckptio_reader_errmsg(r);
    printf("%s\n", msg);
    CHECK(t_contains(msg, t_path("r2")));
    CHECK(t_contains(msg, "'ck'"));
    CHECK(t_contains(msg, "roots="));
    CHECK(t_contains(msg, "mount"));
    ckptio_reader_close(r);
    /* Relocated: roots= names the new place (r1 is found where it was recorded). */
    const char *moved[] = {"elsewhere/r2"};
    CHECK(check_load("ck", moved, 1) == 0);
    /* Both moved, listed in the other order. */
    CHECK(rename("r1", "elsewhere/r1") == 0);
    const char *both[] = {"elsewhere/r2", "elsewhere/r1"};
    CHECK(check_load("ck", both, 2) == 0);
    free_data();
    return 0;
}

/* A save that dies before its publish leaves no checkpoint; its stripes are found and removed
 * by the next save to the same path, while another checkpoint's stripes (same name, other
 * directory, same root) stay. */
static int test_crash_then_next_save(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", "sub") == 0);
    const char *roots[] = {"r1", "r2"};
    CHECK_OK(save("sub/ck", roots, 2, 0, 0));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        ckptio_params p = fparams(0);
        ckptio_writer *w = NULL;
        if (ckptio_writer_open(&w, "ck", &p) < 0 || ckptio_writer_set_roots(w, roots, 2) < 0)
            _exit(2);
        for (int i = 0; i < N_T; i++) {
            uint64_t shape = sizes[i];
            if (ckptio_writer_add(w, tname(i), CKPTIO_DT_U8, 1, &shape, NULL, NULL, data[i],
                                  sizes[i]) < 0)
                _exit(3);
        }
        ckptio_writer_flush(w);
        _exit(0); /* the crash: no commit, no close */
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct stat sb;
    CHECK(stat("ck", &sb) < 0 && errno == ENOENT);
    CHECK(stripes_in("r1", "ck", NULL, 0) == 2); /* sub/ck's and the dead save's */
    CHECK(stripes_in("r2", "ck", NULL, 0) == 2);
    CHECK_OK(save("ck", roots, 2, 0, 0));
    CHECK(stripes_in("r1", "ck", NULL, 0) == 2); /* sub/ck's and the new one */
    CHECK(stripes_in("r2", "ck", NULL, 0) == 2);
    CHECK(check_load("ck", NULL, 0) == 0);
    CHECK(check_load("sub/ck", NULL, 0) == 0);
    free_data();
    return 0;
}

/* A writer closed without commit, or whose commit fails, removes its stripes. */
static int test_abort(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", NULL, NULL) == 0);
    const char *roots[] = {"r1"};
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_set_roots(w, roots, 1));
    for (int i = 0; i < N_T; i++) {
        uint64_t shape = sizes[i];
        CHECK_OK(ckptio_writer_add(w, tname(i), CKPTIO_DT_U8, 1, &shape, NULL, NULL, data[i],
                                   sizes[i]));
    }
    CHECK(stripes_in("r1", "ck", NULL, 0) == 1);
    ckptio_writer_close(w);
    CHECK(stripes_in("r1", "ck", NULL, 0) == 0);
    /* An incomplete tensor fails the commit: nothing published, the stripe goes at close. */
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_set_roots(w, roots, 1));
    uint64_t shape = 2 * sizes[0], off = 0, cs = sizes[0];
    CHECK_OK(ckptio_writer_add(w, "half", CKPTIO_DT_U8, 1, &shape, &off, &cs, data[0], sizes[0]));
    CHECK_ERR(ckptio_writer_commit(w), CKPTIO_E_INCOMPLETE);
    ckptio_writer_close(w);
    CHECK(stripes_in("r1", "ck", NULL, 0) == 0);
    struct stat sb;
    CHECK(stat("ck", &sb) < 0);
    free_data();
    return 0;
}

/* Overwriting a striped checkpoint replaces its stripes; so does overwriting it with a plain
 * one. The old stripes stay until the new checkpoint is published. */
static int test_overwrite(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", "r3") == 0);
    const char *roots[] = {"r1", "r2"};
    CHECK_OK(save("ck", roots, 2, 0, 0));
    char old1[256], now1[256];
    CHECK(stripes_in("r1", "ck", old1, sizeof old1) == 1);
    /* Without overwrite: refused, the old stripes untouched. */
    CHECK_ERR(save("ck", roots, 2, 0, 0), CKPTIO_E_EXISTS);
    CHECK(stripes_in("r1", "ck", now1, sizeof now1) == 1 && !strcmp(old1, now1));
    t_fill(data[0], sizes[0], 99);
    const char *other[] = {"r2", "r3"};
    CHECK_OK(save("ck", other, 2, 1, 0));
    CHECK(stripes_in("r1", "ck", NULL, 0) == 0); /* an old root the new save does not use */
    CHECK(stripes_in("r2", "ck", now1, sizeof now1) == 1);
    CHECK(stripes_in("r3", "ck", NULL, 0) == 1);
    CHECK(check_load("ck", NULL, 0) == 0);
    CHECK_OK(save("ck", NULL, 0, 1, 0));
    CHECK(manifest_major("ck") == 1);
    CHECK(stripes_in("r2", "ck", NULL, 0) == 0);
    CHECK(stripes_in("r3", "ck", NULL, 0) == 0);
    CHECK(check_load("ck", NULL, 0) == 0);
    free_data();
    return 0;
}

static int test_usage(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", NULL, NULL) == 0);
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    const char *missing[] = {"nope"};
    CHECK_ERR(ckptio_writer_set_roots(w, missing, 1), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_writer_errmsg(w), "nope"));
    const char *twice[] = {"r1", "./r1"};
    CHECK_ERR(ckptio_writer_set_roots(w, twice, 2), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_writer_errmsg(w), "twice"));
    CHECK(stripes_in("r1", "ck", NULL, 0) == 0); /* a refused call leaves nothing behind */
    uint64_t shape = sizes[0];
    CHECK_OK(ckptio_writer_add(w, "a", CKPTIO_DT_U8, 1, &shape, NULL, NULL, data[0], sizes[0]));
    const char *one[] = {"r1"};
    CHECK_ERR(ckptio_writer_set_roots(w, one, 1), CKPTIO_E_STATE);
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK(manifest_major("ck") == 1);
    free_data();
    return 0;
}

/* The engine keeps writes in flight to every root at once: seen from the requests it has
 * submitted and not yet reaped, by the root each one's file lies in. */
static int in_flight[1024], by_root[3], max_roots;

static int root_of(int fd)
{
    char l[64], p[4096];
    snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(l, p, sizeof p - 1);
    if (n < 0) return 0;
    p[n] = 0;
    return strstr(p, "/r1/") ? 1 : strstr(p, "/r2/") ? 2 : 0;
}

static int count_submit(struct ckptio__req *r)
{
    if (r->fd >= 0 && r->fd < 1024 && r->op == CKPTIO__OP_WRITE) {
        in_flight[r->fd]++;
        by_root[root_of(r->fd)]++;
        int busy = (by_root[0] > 0) + (by_root[1] > 0) + (by_root[2] > 0);
        if (busy > max_roots) max_roots = busy;
    }
    return 0;
}

static void count_done(struct ckptio__req *r)
{
    if (r->fd >= 0 && r->fd < 1024 && r->op == CKPTIO__OP_WRITE && in_flight[r->fd] > 0) {
        in_flight[r->fd]--;
        by_root[root_of(r->fd)]--;
    }
}

static int test_overlap(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", NULL) == 0);
    static ckptio__vfs v;
    v = ckptio__vfs_real;
    v.req_submit = count_submit;
    v.req_done = count_done;
    ckptio__vfs_set(&v);
    const char *roots[] = {"r1", "r2"};
    int rc = save("ck", roots, 2, 0, 0);
    ckptio__vfs_set(NULL);
    CHECK_OK(rc);
    printf("roots with writes in flight at once: %d\n", max_roots);
    CHECK(max_roots == 3);
    CHECK(check_load("ck", NULL, 0) == 0);
    free_data();
    return 0;
}

/* Format 2: roots survive encode/decode; a file naming a root that is not listed, a relative
 * root path and roots in a format-1 manifest are corrupt. */
static int test_format(void)
{
    char err[256];
    char strtab[] = "data/000000.ckd\0data/000001.ckd\0/mnt/a\0ck.00.ckptio-stripe\0";
    ckptio__mfile files[2] = {{.name = 0, .name_len = 15, .root = 0, .size = 0},
                              {.name = 16, .name_len = 15, .root = 1, .size = 0}};
    ckptio__mroot roots[1] = {{.path = 32, .path_len = 6, .name = 39, .name_len = 19}};
    ckptio__manifest m = {.version = CKPTIO__FORMAT_STRIPED, .csum_algo = CKPTIO__CSUM_NONE,
                          .n_files = 2, .files = files, .strtab = strtab,
                          .strtab_len = sizeof strtab - 1, .n_roots = 1, .roots = roots};
    CHECK_OK(ckptio__manifest_validate(&m, err, sizeof err));
    uint64_t len = 0;
    CHECK_OK(ckptio__manifest_encoded_size(&m, &len));
    uint8_t *buf = malloc(len);
    CHECK(buf);
    CHECK_OK(ckptio__manifest_encode(&m, buf, len));
    CHECK(buf[8] == 2 && buf[9] == 0);
    ckptio__manifest *d = NULL;
    CHECK_OK(ckptio__manifest_decode(buf, len, &d, err, sizeof err));
    CHECK(d->version == 2 && d->n_roots == 1 && d->files[1].root == 1 && d->files[0].root == 0);
    CHECK(!strcmp(d->strtab + d->roots[0].path, "/mnt/a"));
    CHECK(!strcmp(d->strtab + d->roots[0].name, "ck.00.ckptio-stripe"));
    ckptio__manifest_free(d);
    /* One byte cut from the roots' records: the counts no longer fit. */
    free(buf);
    files[1].root = 2;
    CHECK_ERR(ckptio__manifest_validate(&m, err, sizeof err), CKPTIO_E_CORRUPT);
    CHECK(t_contains(err, "root 2"));
    files[1].root = 1;
    strtab[32] = 'x'; /* "xmnt/a": not absolute */
    CHECK_ERR(ckptio__manifest_validate(&m, err, sizeof err), CKPTIO_E_CORRUPT);
    CHECK(t_contains(err, "absolute"));
    strtab[32] = '/';
    m.version = 1;
    CHECK_ERR(ckptio__manifest_validate(&m, err, sizeof err), CKPTIO_E_CORRUPT);
    CHECK(t_contains(err, "1 roots"));
    return 0;
}

/* Two ext4 file systems on loop devices as roots (root only; skipped where mounting is not
 * permitted or the tools are missing): the round trip, and each file system's used blocks
 * growing by its share. */
static int test_loop_mounts(void)
{
    if (geteuid() != 0 || access("/sbin/mkfs.ext4", X_OK) != 0) return T_SKIP;
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return T_SKIP;
    for (int i = 1; i <= 2; i++)
        if (t_sh("truncate -s 64M img%d && mkfs.ext4 -q -F img%d && mkdir -p m%d && "
                 "mount -o loop img%d m%d",
                 i, i, i, i, i) != 0) {
            t_sh("umount m1 m2 2>/dev/null");
            return T_SKIP;
        }
    CHECK(make_data() == 0);
    const char *roots[] = {"m1", "m2"};
    int rc = save("ck", roots, 2, 0, 0);
    int ok = rc >= 0 && check_load("ck", NULL, 0) == 0 && stripes_in("m1", "ck", NULL, 0) == 1 &&
             stripes_in("m2", "ck", NULL, 0) == 1;
    t_sh("df -k m1 m2");
    /* Unmounted and mounted again (what a reboot does): still whole. */
    ok = ok && t_sh("umount m1 m2 && mount -o loop img1 m1 && mount -o loop img2 m2") == 0 &&
         check_load("ck", NULL, 0) == 0;
    t_sh("umount m1 m2");
    free_data();
    CHECK(ok);
    return 0;
}

/* One chunk far larger than the others would load one root: a chunk of 64 MiB and more is cut
 * into row blocks of about 32 MiB or more, at most one per root, recorded as chunks of their
 * own; reads across the cuts work. */
static int test_split_large(void)
{
    CHECK(mkdirs("r1", "r2", NULL) == 0);
    const uint64_t rows = 3001, cols = 33541, n = rows * cols; /* odd rows: no aligned cut */
    unsigned char *big = t_alloc(n), *got = t_alloc(n);
    CHECK(big && got);
    t_fill(big, n, 5);
    const char *roots[] = {"r1", "r2"};
    ckptio_params p = fparams(0);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, "ck", &p));
    CHECK_OK(ckptio_writer_set_roots(w, roots, 2));
    uint64_t shape[2] = {rows, cols}, small = 4096;
    CHECK_OK(ckptio_writer_add(w, "big", CKPTIO_DT_U8, 2, shape, NULL, NULL, big, n));
    CHECK_OK(ckptio_writer_add(w, "small", CKPTIO_DT_U8, 1, &small, NULL, NULL, big, small));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    char s1[256], s2[256], path[4096];
    CHECK(stripes_in("r1", "ck", s1, sizeof s1) == 1 && stripes_in("r2", "ck", s2, sizeof s2) == 1);
    snprintf(path, sizeof path, "r1/%s/data", s1);
    uint64_t b1 = dir_bytes(path);
    snprintf(path, sizeof path, "r2/%s/data", s2);
    uint64_t b2 = dir_bytes(path), b0 = dir_bytes("ck/data");
    printf("bytes per root: %llu %llu %llu\n", (unsigned long long)b0, (unsigned long long)b1,
           (unsigned long long)b2);
    uint64_t third = rows / 3 * cols;
    CHECK(b0 >= third && b1 >= third && b2 >= third);
    CHECK(b0 <= third + 2 * cols + 8192 && b1 <= third + 2 * cols + 8192 &&
          b2 <= third + 2 * cols + 8192);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ck", NULL));
    ckptio_tensor_info ti = {.size = sizeof ti};
    CHECK_OK(ckptio_reader_tensor(r, (size_t)ckptio_reader_find(r, "big"), &ti));
    CHECK(ti.num_chunks == 3 && ti.stored_bytes == n);
    CHECK_OK(ckptio_reader_read(r, &(ckptio_region){.size = sizeof(ckptio_region), .name = "big",
                                                    .dst = got, .capacity = n},
                                1));
    CHECK(memcmp(got, big, n) == 0);
    /* rows 998..1003 span the first cut */
    uint64_t o[2] = {998, 7}, sh[2] = {5, 1000};
    CHECK_OK(ckptio_reader_read(r, &(ckptio_region){.size = sizeof(ckptio_region), .name = "big",
                                                    .offset = o, .shape = sh, .dst = got,
                                                    .capacity = 5000},
                                1));
    for (uint64_t i = 0; i < 5; i++)
        CHECK(!memcmp(got + i * 1000, big + (998 + i) * cols + 7, 1000));
    ckptio_reader_close(r);
    t_free(big, n);
    t_free(got, n);
    return 0;
}

/* Run `ckptio ARGS` with its output in out.txt; its exit status, the output in *out. */
static int run_cli(const char *args, char **out)
{
    int st = t_sh("%s %s > out.txt 2>&1", CKPTIO_EXE, args);
    unsigned char *buf = NULL;
    long n = t_read_file("out.txt", &buf);
    *out = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (*out) {
        memcpy(*out, buf, (size_t)n);
        (*out)[n] = 0; /* a C string, for t_contains */
        printf("%s", *out);
    }
    free(buf);
    return st;
}

/* `ckptio verify` reads every stripe, takes --roots for moved ones and names leftover stripes
 * of the checkpoint (a save that died) without removing them. */
static int test_cli_verify(void)
{
    CHECK(make_data() == 0);
    CHECK(mkdirs("r1", "r2", "moved") == 0);
    const char *roots[] = {"r1", "r2"};
    CHECK_OK(save("ck", roots, 2, 0, 0));
    char *o = NULL;
    CHECK(run_cli("verify ck", &o) == 0 && o && t_contains(o, "OK") && !t_contains(o, "note"));
    free(o);
    /* a dead save's stripes beside the checkpoint's */
    ckptio_params p = fparams(1);
    ckptio_writer *w = NULL;
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (ckptio_writer_open(&w, "ck", &p) < 0 || ckptio_writer_set_roots(w, roots, 2) < 0)
            _exit(2);
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(stripes_in("r1", "ck", NULL, 0) == 2);
    CHECK(run_cli("verify ck", &o) == 0 && o && t_contains(o, "note: 2 stripe directories"));
    free(o);
    uint64_t found = 0;
    CHECK_OK(ckptio_stripe_leftovers("ck", NULL, 0, 0, &found));
    CHECK(found == 2 && stripes_in("r1", "ck", NULL, 0) == 2);
    CHECK_OK(ckptio_stripe_leftovers("ck/", roots, 2, 1, &found));
    CHECK(found == 2 && stripes_in("r1", "ck", NULL, 0) == 1);
    CHECK(check_load("ck", NULL, 0) == 0);
    /* a moved root: verify fails naming it, then passes with --roots */
    CHECK(rename("r2", "moved/r2") == 0);
    CHECK(run_cli("verify ck", &o) == 1 && o && t_contains(o, "roots="));
    free(o);
    CHECK(run_cli("verify --roots moved/r2 ck", &o) == 0 && o && t_contains(o, "OK"));
    free(o);
    free_data();
    return 0;
}

const ckptio_test tests_stripe[] = {
    {"stripe/cli_verify", test_cli_verify, 0, 60},
    {"stripe/round_trip", test_round_trip, T_PER_BACKEND, 60},
    {"stripe/rolls_and_parent_root", test_rolls_and_parent_root, 0, 60},
    {"stripe/missing_and_relocated", test_missing_and_relocated, 0, 60},
    {"stripe/crash_then_next_save", test_crash_then_next_save, 0, 60},
    {"stripe/abort", test_abort, 0, 60},
    {"stripe/overwrite", test_overwrite, 0, 60},
    {"stripe/usage", test_usage, 0, 30},
    {"stripe/overlap", test_overlap, T_PER_BACKEND, 60},
    {"stripe/format", test_format, 0, 30},
    {"stripe/split_large", test_split_large, 0, 120},
    {"stripe/loop_mounts", test_loop_mounts, 0, 120},
    {0},
};
