/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the commit transaction on its own: begin, join, publish and abort, for directories
 * and single files, without a writer. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/commit/txn.h"
#include "../src/io/vfs.h"
#include "test.h"

#define DIRF CKPTIO__TXN_DIR
#define FILEF CKPTIO__TXN_FILE
#define OVER CKPTIO__TXN_OVERWRITE
#define SYNC CKPTIO__TXN_FSYNC

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

/* Create `name` holding `text` in directory fd `dfd`. */
static int put(int dfd, const char *name, const char *text)
{
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Whether the file at `path` holds exactly `text`. */
static int holds(const char *path, const char *text)
{
    unsigned char *got = NULL;
    long n = t_read_file(path, &got);
    int ok = n == (long)strlen(text) && !memcmp(got, text, (size_t)n);
    free(got);
    return ok;
}

/* A checkpoint-looking directory: `dir`/manifest holding `text`. */
static int make_ck(const char *dir, const char *text)
{
    if (mkdir(dir, 0755) < 0) return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    int rc = put(dfd, "manifest", text);
    close(dfd);
    return rc;
}

/* A directory transaction: the temporary directory sits beside the target under the
 * documented name, is what tmp_fd opens, and publish renames it into place with what the
 * caller wrote; fini afterwards leaves the published directory alone. */
static int test_dir_publish(void)
{
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "ck//", DIRF, SYNC, 0, NULL, &msg));
    CHECK(!strcmp(t.path, "ck") && !strcmp(t.parent, "."));
    CHECK(t.found == CKPTIO__AT_NOTHING && t.owner && !t.published);
    char want[64];
    snprintf(want, sizeof want, "ck.tmp-%d.", (int)getpid());
    CHECK(!strncmp(t.tmp_path, want, strlen(want)));
    struct stat st;
    CHECK(stat(t.tmp_path, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(access("ck", F_OK) < 0);
    CHECK(put(t.tmp_fd, "manifest", "new") == 0);
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    CHECK(t.published && !t.old_path);
    CHECK(holds("ck/manifest", "new"));
    CHECK(count_names(".", ".tmp-") == 0);
    /* published once is published: a second publish is a state error, nothing moves */
    CHECK_ERR(ckptio__txn_publish(&t, NULL, 0, &msg), CKPTIO_E_STATE);
    ckptio__txn_fini(&t);
    CHECK(holds("ck/manifest", "new"));
    /* through a link whose target ends in '/': the target's parent is the link's */
    CHECK(symlink("step-1/", "latest") == 0);
    CHECK_OK(ckptio__txn_begin(&t, "latest", DIRF, 0, 0, NULL, &msg));
    CHECK(!strcmp(t.path, "step-1") && !strcmp(t.parent, "."));
    CHECK(put(t.tmp_fd, "manifest", "1") == 0);
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    ckptio__txn_fini(&t);
    CHECK(lstat("latest", &st) == 0 && S_ISLNK(st.st_mode) && holds("latest/manifest", "1"));
    /* a name that is no checkpoint directory */
    CHECK_ERR(ckptio__txn_begin(&t, "ck/..", DIRF, 0, 0, NULL, &msg), CKPTIO_E_USAGE);
    CHECK(t_contains(msg.text, "does not name a checkpoint directory"));
    ckptio__txn_fini(&t);
    return 0;
}

/* A file transaction: the temporary file is open for writing in t.fd, and publish makes it the
 * target. Without overwrite an existing file is refused at begin, and a directory even with
 * it. */
static int test_file_publish(void)
{
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "f.bin", FILEF, SYNC, CKPTIO_OFF, NULL, &msg));
    CHECK(t.fd >= 0 && t.tmp_fd < 0 && t.found == CKPTIO__AT_NOTHING && !t.direct);
    CHECK(write(t.fd, "hello", 5) == 5);
    CHECK(access("f.bin", F_OK) < 0);
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    CHECK(t.published && t.fd < 0);
    ckptio__txn_fini(&t);
    CHECK(holds("f.bin", "hello"));
    CHECK(count_names(".", ".tmp-") == 0);

    CHECK_ERR(ckptio__txn_begin(&t, "f.bin", FILEF, 0, CKPTIO_OFF, NULL, &msg), CKPTIO_E_EXISTS);
    CHECK(t_contains(msg.text, "pass overwrite"));
    ckptio__txn_fini(&t);
    CHECK(mkdir("d", 0755) == 0);
    CHECK_ERR(ckptio__txn_begin(&t, "d", FILEF, OVER, CKPTIO_OFF, NULL, &msg), CKPTIO_E_EXISTS);
    CHECK(t_contains(msg.text, "is a directory"));
    ckptio__txn_fini(&t);
    CHECK(count_names(".", ".tmp-") == 0);
    return 0;
}

/* Replacing a checkpoint: begin reports what it found; publish swaps the new one in and
 * removes the old one once the swap is durable, leaving no .tmp- or .old- entry. */
static int test_overwrite_exchange(void)
{
    CHECK(make_ck("ck", "old") == 0);
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_ERR(ckptio__txn_begin(&t, "ck", DIRF, SYNC, 0, NULL, &msg), CKPTIO_E_EXISTS);
    CHECK(t_contains(msg.text, "pass overwrite"));
    ckptio__txn_fini(&t);
    CHECK(count_names(".", ".tmp-") == 0);

    CHECK_OK(ckptio__txn_begin(&t, "ck", DIRF, OVER | SYNC, 0, NULL, &msg));
    CHECK(t.found == CKPTIO__AT_CHECKPOINT && S_ISDIR(t.found_mode));
    CHECK(put(t.tmp_fd, "manifest", "new") == 0);
    CHECK(holds("ck/manifest", "old")); /* nothing changes before publish */
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    CHECK(t.old_path != NULL && access(t.old_path, F_OK) < 0);
    ckptio__txn_fini(&t);
    CHECK(holds("ck/manifest", "new"));
    CHECK(count_names(".", ".tmp-") == 0 && count_names(".", ".old-") == 0);

    /* an empty directory is replaced; one with something else in it is refused */
    CHECK(mkdir("empty", 0755) == 0);
    CHECK_OK(ckptio__txn_begin(&t, "empty", DIRF, OVER, 0, NULL, &msg));
    CHECK(t.found == CKPTIO__AT_EMPTY_DIR);
    CHECK(put(t.tmp_fd, "manifest", "e") == 0);
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    ckptio__txn_fini(&t);
    CHECK(holds("empty/manifest", "e"));
    CHECK(mkdir("mine", 0755) == 0 && t_write_file("mine/notes", "x", 1) == 0);
    CHECK_ERR(ckptio__txn_begin(&t, "mine", DIRF, OVER, 0, NULL, &msg), CKPTIO_E_EXISTS);
    CHECK(t_contains(msg.text, "not a ckptio checkpoint"));
    ckptio__txn_fini(&t);
    CHECK(holds("mine/notes", "x"));
    return 0;
}

/* Abort removes what begin created and leaves the target exactly as it was, for both kinds;
 * a second abort and fini after it are harmless. */
static int test_abort_keeps_target(void)
{
    CHECK(make_ck("ck", "old") == 0);
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "ck", DIRF, OVER | SYNC, 0, NULL, &msg));
    CHECK(put(t.tmp_fd, "manifest", "new") == 0);
    CHECK(mkdirat(t.tmp_fd, "data", 0755) == 0);
    ckptio__txn_abort(&t);
    CHECK(count_names(".", ".tmp-") == 0);
    ckptio__txn_abort(&t);
    CHECK_ERR(ckptio__txn_publish(&t, NULL, 0, &msg), CKPTIO_E_STATE);
    ckptio__txn_fini(&t);
    CHECK(holds("ck/manifest", "old"));

    CHECK(t_write_file("f.pt", "old", 3) == 0);
    CHECK_OK(ckptio__txn_begin(&t, "f.pt", FILEF, OVER | SYNC, CKPTIO_OFF, NULL, &msg));
    CHECK(t.found == CKPTIO__AT_FILE && S_ISREG(t.found_mode));
    CHECK(write(t.fd, "new", 3) == 3);
    ckptio__txn_fini(&t); /* never published: fini aborts */
    CHECK(holds("f.pt", "old"));
    CHECK(count_names(".", ".tmp-") == 0);

    /* a zeroed transaction (begin never called) finis cleanly */
    memset(&t, 0, sizeof t);
    ckptio__txn_fini(&t);
    ckptio__txn_fini(NULL);
    return 0;
}

/* A replaced file keeps its mode; a symlinked target is written through, the link stays. */
static int test_file_mode_and_link(void)
{
    CHECK(t_write_file("secret.pt", "old", 3) == 0);
    CHECK(chmod("secret.pt", 0600) == 0);
    CHECK(symlink("secret.pt", "link.pt") == 0);
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "link.pt", FILEF, OVER, CKPTIO_OFF, NULL, &msg));
    CHECK(!strcmp(t.path, "secret.pt"));
    CHECK(write(t.fd, "new!", 4) == 4);
    CHECK_OK(ckptio__txn_publish(&t, NULL, 0, &msg));
    ckptio__txn_fini(&t);
    struct stat st;
    CHECK(lstat("link.pt", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat("secret.pt", &st) == 0 && (st.st_mode & 07777) == 0600);
    CHECK(holds("link.pt", "new!"));
    return 0;
}

/* Many writers, one publish: a second transaction joins the temporary directory by name and
 * writes into it; its fini leaves the directory to the creator, which publishes everything in
 * it. A joined transaction may not publish. */
static int test_join(void)
{
    ckptio__txn owner, member;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&owner, "ck", DIRF, SYNC, 0, NULL, &msg));
    CHECK_OK(ckptio__txn_join(&member, "ck", owner.tmp_path, SYNC, NULL, &msg));
    CHECK(!member.owner && member.tmp_fd >= 0);
    CHECK(put(member.tmp_fd, "rank1", "r1") == 0);
    CHECK_ERR(ckptio__txn_publish(&member, NULL, 0, &msg), CKPTIO_E_STATE);
    ckptio__txn_fini(&member);
    CHECK(access(owner.tmp_path, F_OK) == 0);
    CHECK(put(owner.tmp_fd, "manifest", "m") == 0);
    CHECK_OK(ckptio__txn_publish(&owner, NULL, 0, &msg));
    ckptio__txn_fini(&owner);
    CHECK(holds("ck/rank1", "r1") && holds("ck/manifest", "m"));
    CHECK_ERR(ckptio__txn_join(&member, "ck", "ck.tmp-1.1", 0, NULL, &msg), -ENOENT);
    CHECK(t_contains(msg.text, "ck.tmp-1.1"));
    ckptio__txn_fini(&member);
    return 0;
}

/* A temporary directory of the same name whose process is gone is removed by begin; one whose
 * process lives (ours: the parent of this test) is kept, as is one of another name. */
static int test_stale_cleanup(void)
{
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) _exit(0);
    CHECK(waitpid(child, NULL, 0) == child);
    char dead[64], live[64];
    snprintf(dead, sizeof dead, "ck.tmp-%d.7", (int)child);
    snprintf(live, sizeof live, "ck.tmp-%d.7", (int)getppid());
    CHECK(mkdir(dead, 0755) == 0 && mkdir(live, 0755) == 0);
    CHECK(mkdir("other.tmp-999999.1", 0755) == 0);
    ckptio__txn t;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "ck", DIRF, 0, 0, NULL, &msg));
    CHECK(access(dead, F_OK) < 0 && access(live, F_OK) == 0);
    CHECK(access("other.tmp-999999.1", F_OK) == 0);
    ckptio__txn_fini(&t);
    CHECK(count_names(".", "ck.tmp-") == 1);
    return 0;
}

/* The same for a single file's temporaries (a killed ckptio.torch.save): a dead process's is
 * removed, a live one's, one locked by a live writer, a directory or another name's are kept. */
static int test_stale_file_cleanup(void)
{
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) _exit(0);
    CHECK(waitpid(child, NULL, 0) == child);
    char dead[64], live[64], dir[64];
    snprintf(dead, sizeof dead, "m.pt.tmp-%d.3", (int)child);
    snprintf(live, sizeof live, "m.pt.tmp-%d.3", (int)getppid());
    snprintf(dir, sizeof dir, "m.pt.tmp-%d.4", (int)child);
    CHECK(t_write_file(dead, "x", 1) == 0 && t_write_file(live, "x", 1) == 0);
    CHECK(mkdir(dir, 0755) == 0);
    ckptio__txn t, u;
    ckptio__msg msg = {0};
    CHECK_OK(ckptio__txn_begin(&t, "m.pt", CKPTIO__TXN_FILE, 0, 0, NULL, &msg));
    CHECK(access(dead, F_OK) < 0 && access(live, F_OK) == 0 && access(dir, F_OK) == 0);
    /* a second writer of the same name (here: the same process) keeps t's temporary */
    char mine[256];
    snprintf(mine, sizeof mine, "%s", t.tmp_path);
    CHECK_OK(ckptio__txn_begin(&u, "m.pt", CKPTIO__TXN_FILE, 0, 0, NULL, &msg));
    CHECK(access(mine, F_OK) == 0);
    ckptio__txn_fini(&u);
    ckptio__txn_fini(&t);
    CHECK(access(mine, F_OK) < 0); /* unpublished: removed at fini */
    return 0;
}

/* ---- an fsync failure after the rename ---- */

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

/* The parent's fsync fails after the rename: publish says CKPTIO_E_NOT_DURABLE, marks the
 * transaction published, names the target and the parent, and what it published is there
 * (and a replaced checkpoint is gone). A fsync failure before the rename fails with nothing
 * published. */
static int test_not_durable(void)
{
    CHECK(mkdir("out", 0755) == 0);
    CHECK(make_ck("out/ck", "old") == 0);
    static ckptio__vfs v;
    v = ckptio__vfs_real;
    v.fsync = fsync_failing;
    struct stat st;
    CHECK(stat("out", &st) == 0);
    fail_ino = st.st_ino;
    ckptio__vfs_set(&v);

    ckptio__txn t;
    ckptio__msg msg = {0};
    for (int replace = 0; replace < 2; replace++) {
        const char *path = replace ? "out/ck" : "out/new";
        CHECK_OK(ckptio__txn_begin(&t, path, DIRF, SYNC | (replace ? OVER : 0), 0, NULL, &msg));
        CHECK(put(t.tmp_fd, "manifest", "new") == 0);
        unsigned fired = fail_fired;
        CHECK_ERR(ckptio__txn_publish(&t, NULL, 0, &msg), CKPTIO_E_NOT_DURABLE);
        CHECK(fail_fired > fired && t.published);
        CHECK(t_contains(msg.text, "published at") && t_contains(msg.text, path) &&
              t_contains(msg.text, "'out'") && t_contains(msg.text, "checkpoint is complete"));
        ckptio__txn_fini(&t);
        char man[64];
        snprintf(man, sizeof man, "%s/manifest", path);
        CHECK(holds(man, "new"));
        CHECK(count_names("out", ".tmp-") == 0 && count_names("out", ".old-") == 0);
    }

    CHECK_OK(ckptio__txn_begin(&t, "out/f.bin", FILEF, SYNC, CKPTIO_OFF, NULL, &msg));
    CHECK(write(t.fd, "abc", 3) == 3);
    CHECK_ERR(ckptio__txn_publish(&t, NULL, 0, &msg), CKPTIO_E_NOT_DURABLE);
    CHECK(t.published && t_contains(msg.text, "file is complete"));
    ckptio__txn_fini(&t);
    CHECK(holds("out/f.bin", "abc"));

    /* the temporary directory's own fsync fails: not published, abort cleans up */
    CHECK_OK(ckptio__txn_begin(&t, "out/late", DIRF, SYNC, 0, NULL, &msg));
    CHECK(fstat(t.tmp_fd, &st) == 0);
    fail_ino = st.st_ino;
    CHECK_ERR(ckptio__txn_publish(&t, NULL, 0, &msg), -EIO);
    CHECK(!t.published && t_contains(msg.text, "fsync of directory"));
    ckptio__txn_fini(&t);
    ckptio__vfs_set(NULL);
    CHECK(access("out/late", F_OK) < 0 && count_names("out", ".tmp-") == 0);
    return 0;
}

/* ---- the shared handle helpers ---- */

/* A handle fails once, with its first error; committed is a state error; re-raising a message
 * copies it into the last error, with a prefix when asked, even onto itself. */
static int test_handle_helpers(void)
{
    ckptio__handle_state h = {0};
    ckptio__msg m = {0};
    CHECK_OK(ckptio__handle_usable(&h, &m, "p"));
    CHECK(ckptio__handle_poison(&h, -EIO) == -EIO);
    CHECK(ckptio__handle_poison(&h, -ENOSPC) == -ENOSPC);
    CHECK_ERR(ckptio__handle_usable(&h, &m, "p"), -EIO);
    CHECK(t_contains(m.text, "'p' failed earlier"));
    h.state = CKPTIO__H_COMMITTED;
    CHECK_ERR(ckptio__handle_usable(&h, &m, "p"), CKPTIO_E_STATE);

    ckptio__fail(&m, -EIO, "disk said no");
    CHECK(ckptio__refail(&m, &m, -EIO, "fallback", "saving tensor '%s': ", "w") == -EIO);
    CHECK(t_contains(m.text, "saving tensor 'w': disk said no"));
    CHECK(!strcmp(ckptio_last_error(), m.text));
    ckptio__msg keep = m;
    memset(&m, 0, sizeof m);
    ckptio__fail(NULL, -EBADF, "something else");
    CHECK(ckptio__refail(NULL, &keep, -EIO, NULL, NULL) == -EIO);
    CHECK(!strcmp(ckptio_last_error(), keep.text));
    ckptio__refail(NULL, &m, -EIO, "cannot open writer", NULL);
    CHECK(t_contains(ckptio_last_error(), "cannot open writer"));
    ckptio__fail(NULL, -EBADF, "unchanged");
    ckptio__refail(NULL, &m, -EIO, NULL, NULL); /* nothing to say: nothing said */
    CHECK(t_contains(ckptio_last_error(), "unchanged"));
    return 0;
}

const ckptio_test tests_commit[] = {
    {"commit/dir_publish", test_dir_publish, 0, 0},
    {"commit/file_publish", test_file_publish, 0, 0},
    {"commit/overwrite_exchange", test_overwrite_exchange, 0, 0},
    {"commit/abort_keeps_target", test_abort_keeps_target, 0, 0},
    {"commit/file_mode_and_link", test_file_mode_and_link, 0, 0},
    {"commit/join", test_join, 0, 0},
    {"commit/stale_cleanup", test_stale_cleanup, 0, 0},
    {"commit/stale_file_cleanup", test_stale_file_cleanup, 0, 0},
    {"commit/not_durable", test_not_durable, 0, 0},
    {"commit/handle_helpers", test_handle_helpers, 0, 0},
    {0},
};
