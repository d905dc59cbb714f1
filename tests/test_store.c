/* SPDX-License-Identifier: Apache-2.0 */
/* The store conformance suite: every store passes the same tests through the public API. */
#define CKPTIO_EXPERIMENTAL
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "s3_live.h"
#include "test.h"

/* Each test takes the base of a fresh place in one store ("<dir>", "s3://bucket/prefix", "gs://...")
 * and works beneath it through ckptio.h alone: what a new store must do to be one. */

#define W_BYTES (9u << 20) /* more than one 8 MiB part of an object store's upload */

static const char *at(const char *base, const char *name)
{
    static char bufs[4][640];
    static unsigned i;
    char *b = bufs[i++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", base, name);
    return b;
}

static ckptio_params params(bool overwrite)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = overwrite ? CKPTIO_ON : CKPTIO_OFF;
    return p;
}

/* A writer at u holding tensor "w" (W_BYTES from seed) and "step" = seed, not committed:
 * 0, or the open's error (a refusal there is the store's answer too), or 1. */
static int open_filled(ckptio_writer **w, const char *u, uint64_t seed, bool overwrite)
{
    uint8_t *data = t_alloc(W_BYTES);
    CHECK(data);
    t_fill(data, W_BYTES, seed);
    uint64_t shape[1] = {W_BYTES}, one[1] = {1};
    int64_t step = (int64_t)seed;
    ckptio_params p = params(overwrite);
    int rc = ckptio_writer_open(w, u, &p);
    if (rc < 0) {
        t_free(data, W_BYTES);
        return rc;
    }
    CHECK_OK(ckptio_writer_add(*w, "w", CKPTIO_DT_U8, 1, shape, NULL, NULL, data, W_BYTES));
    CHECK_OK(ckptio_writer_add(*w, "step", CKPTIO_DT_I64, 1, one, NULL, NULL, &step, 8));
    CHECK_OK(ckptio_writer_flush(*w));
    t_free(data, W_BYTES);
    return 0;
}

/* Save seed's checkpoint at u: the commit's result. */
static int save(const char *u, uint64_t seed, bool overwrite)
{
    ckptio_writer *w = NULL;
    int rc = open_filled(&w, u, seed, overwrite);
    if (rc) return rc < 0 ? rc : -1000;
    rc = ckptio_writer_commit(w);
    ckptio_writer_close(w);
    return rc;
}

/* Whether u holds seed's checkpoint, every block verified. */
static int holds(const char *u, uint64_t seed)
{
    uint8_t *want = t_alloc(W_BYTES), *got = t_alloc(W_BYTES);
    CHECK(want && got);
    t_fill(want, W_BYTES, seed);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, u, NULL));
    uint64_t bad = 1;
    int64_t step = -1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK_OK(ckptio_reader_read_tensor(r, "w", got, W_BYTES));
    CHECK_OK(ckptio_reader_read_tensor(r, "step", &step, 8));
    ckptio_reader_close(r);
    CHECK(bad == 0 && step == (int64_t)seed && !memcmp(want, got, W_BYTES));
    t_free(want, W_BYTES);
    t_free(got, W_BYTES);
    return 0;
}

typedef struct listing {
    char names[8][64];
    int n;
} listing;

static int on_name(void *ctx, const char *name)
{
    listing *l = ctx;
    if (l->n == 8) return -1;
    snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
    return 0;
}

/* The names ckptio_list_checkpoints finds under base, joined by spaces ("" for none). */
static const char *listed(const char *base)
{
    static char out[8 * 64];
    listing l = {.n = 0};
    out[0] = 0;
    if (ckptio_list_checkpoints(base, on_name, &l) < 0) return "(error)";
    for (int i = 0; i < l.n; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? " " : "", l.names[i]);
    return out;
}

/* ---- the suite ---- */

static int conf_roundtrip(const char *base)
{
    CHECK(ckptio_is_checkpoint(at(base, "a")) == 0);
    CHECK_OK(save(at(base, "a"), 3, false));
    CHECK(ckptio_is_checkpoint(at(base, "a")) == 1);
    CHECK(!holds(at(base, "a"), 3));
    CHECK(!strcmp(listed(base), "a"));
    return 0;
}

/* Without overwrite an existing checkpoint is refused and stays; with it, replaced whole. */
static int conf_overwrite(const char *base)
{
    CHECK_OK(save(at(base, "a"), 3, false));
    CHECK_ERR(save(at(base, "a"), 4, false), CKPTIO_E_EXISTS);
    CHECK(!holds(at(base, "a"), 3));
    CHECK_OK(save(at(base, "a"), 5, true));
    CHECK(!holds(at(base, "a"), 5));
    CHECK(!strcmp(listed(base), "a"));
    return 0;
}

typedef struct racer {
    ckptio_writer *w;
    pthread_barrier_t *go;
    int rc;
} racer;

static void *race_commit(void *arg)
{
    racer *x = arg;
    pthread_barrier_wait(x->go);
    x->rc = ckptio_writer_commit(x->w);
    return NULL;
}

/* Two saves of one new path commit at once: exactly one wins, the other is told, and the
 * path holds the winner's checkpoint whole. */
static int conf_race(const char *base)
{
    racer x[2];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    for (int i = 0; i < 2; i++) {
        x[i] = (racer){.go = &go};
        CHECK(!open_filled(&x[i].w, at(base, "r"), 10 + (uint64_t)i, false));
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, race_commit, &x[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 2; i++) ckptio_writer_close(x[i].w);
    int win = x[0].rc == 0 ? 0 : 1;
    CHECK(x[win].rc == 0 && x[1 - win].rc == CKPTIO_E_EXISTS);
    CHECK(!holds(at(base, "r"), 10 + (uint64_t)win));
    CHECK(!strcmp(listed(base), "r"));
    return 0;
}

/* A process that opens a writer at u, writes seed's data and is killed (SIGKILL) before
 * its commit: 0 once it is reaped so. */
static int killed_writer(const char *u, uint64_t seed, bool overwrite)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        ckptio_writer *w = NULL;
        if (open_filled(&w, u, seed, overwrite)) _exit(1);
        kill(getpid(), SIGKILL);
        _exit(2);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    return 0;
}

/* A writer killed (SIGKILL) after writing its data, before its commit: nothing is listed,
 * the path is no checkpoint, and the next save there commits. */
static int conf_killed_writer(const char *base)
{
    CHECK_OK(killed_writer(at(base, "k"), 7, false));
    CHECK(ckptio_is_checkpoint(at(base, "k")) == 0);
    CHECK(!strcmp(listed(base), ""));
    CHECK_OK(save(at(base, "k"), 8, false));
    CHECK(!holds(at(base, "k"), 8));
    CHECK(!strcmp(listed(base), "k"));
    return 0;
}

/* Listing and removing: a removed checkpoint leaves the listing and is no checkpoint; what
 * is not one is refused and left alone. */
static int conf_list_remove(const char *base)
{
    CHECK(!strcmp(listed(base), ""));
    for (int i = 0; i < 3; i++) CHECK_OK(save(at(base, i == 0 ? "c" : i == 1 ? "a" : "b"), 20, false));
    CHECK(!strcmp(listed(base), "a b c"));
    CHECK_OK(ckptio_remove_checkpoint(at(base, "b")));
    CHECK(!strcmp(listed(base), "a c"));
    CHECK(ckptio_is_checkpoint(at(base, "b")) == 0);
    CHECK_ERR(ckptio_remove_checkpoint(at(base, "b")), CKPTIO_E_NOT_CHECKPOINT);
    CHECK(t_contains(ckptio_last_error(), "not a checkpoint"));
    CHECK(!holds(at(base, "a"), 20) && !holds(at(base, "c"), 20));
    CHECK_OK(save(at(base, "b"), 21, false)); /* the name is free again */
    CHECK(!holds(at(base, "b"), 21));
    return 0;
}

/* How many saves' leftovers are under base now (the store's own listing, not ckptio's): set by
 * each store's wrapper below. */
static int (*leftovers)(const char *base);
/* Objects a killed save leaves besides what leftovers counts: its marker, when spread. */
static int markers;

/* What killed saves left is swept, and nothing a live save or a checkpoint needs. B begins;
 * A begins 2 s later (whole-second clocks) and is killed; B commits 2 s after that. A's
 * leftovers outlive B's commit (A began after B: B cannot tell it from a live save), and a
 * sweep removes them; C, a save still open, keeps its data and commits after the sweep. */
static int conf_sweep(const char *base)
{
    ckptio_writer *b = NULL, *c = NULL;
    CHECK(!open_filled(&b, at(base, "s"), 30, true));
    sleep(2);
    CHECK_OK(killed_writer(at(base, "s"), 31, true));
    sleep(2);
    CHECK_OK(ckptio_writer_commit(b));
    ckptio_writer_close(b);
    CHECK(!open_filled(&c, at(base, "t"), 32, false));
    int before = leftovers(base), n = ckptio_sweep(base);
    CHECK(n >= 0 && leftovers(base) == 1); /* C's */
    CHECK(n == before - 1 + markers);
    CHECK(ckptio_sweep(base) == 0);
    CHECK(!holds(at(base, "s"), 30));
    CHECK_OK(ckptio_writer_commit(c));
    ckptio_writer_close(c);
    CHECK(!holds(at(base, "t"), 32));
    CHECK(!strcmp(listed(base), "s t"));
    CHECK(ckptio_sweep(base) == 0);
    CHECK(ckptio_sweep(at(base, "nothing-here")) == 0); /* a prefix with nothing under it */
    return 0;
}

/* ---- per store ---- */

/* A fresh directory (a file system's places exist before checkpoints go in them). */
static const char *posix_base(void)
{
    const char *b = t_path("store");
    return mkdir(b, 0755) == 0 ? b : NULL;
}

/* Temporaries of saves ("<name>.tmp-<pid>.<n>") in the directory. */
static int posix_leftovers(const char *base)
{
    DIR *d = opendir(base);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) n += strstr(de->d_name, ".tmp-") != NULL;
    closedir(d);
    return n;
}

static int count_upload(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    (void)key, (void)upload_id, (void)initiated;
    ++*(int *)ctx;
    return 0;
}

/* Unfinished uploads under the prefix (a save's data object being written). */
static int s3_leftovers(const char *base)
{
    ckptio__objc *c;
    char *b = NULL, *key = NULL, *prefix = NULL;
    int n = 0;
    if (ckptio__s3_client(&c, NULL, NULL) || ckptio__obj_parse(&ckptio__s3_objc, base, &b, &key, NULL) ||
        asprintf(&prefix, "%s/", key) < 0 ||
        ckptio__obj_list_uploads(c, b, prefix, count_upload, &n, NULL))
        n = -1;
    free(b);
    free(key);
    free(prefix);
    return n;
}

/* A fresh prefix of the live S3 store, or NULL (skip) without one. */
static const char *s3_base(void)
{
    static char b[400];
    if (live_env()) return NULL;
    snprintf(b, sizeof b, "s3://%s/ckptio-test/store-%d-%lld", bucket(), (int)getpid(),
             (long long)time(NULL));
    return b;
}

static int count_part(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)size, (void)mtime;
    *(int *)ctx += strstr(key, ".part-") != NULL;
    return 0;
}

/* Parts of unfinished uploads under the prefix (GCS keeps them as objects). */
static int gcs_leftovers(const char *base)
{
    ckptio__objc *c;
    char *b = NULL, *key = NULL, *prefix = NULL;
    int n = 0;
    if (ckptio__gcs_client(&c, NULL, NULL) || ckptio__obj_parse(&ckptio__gcs_objc, base, &b, &key, NULL) ||
        asprintf(&prefix, "%s/", key) < 0 || ckptio__obj_list(c, b, prefix, count_part, &n, NULL))
        n = -1;
    free(b);
    free(key);
    free(prefix);
    return n;
}

/* A fresh prefix of the live GCS store, or NULL (skip) without one. */
static const char *gcs_base(void)
{
    static char b[400];
    if (gcs_live_env()) return NULL;
    snprintf(b, sizeof b, "gs://%s/ckptio-test/store-%d-%lld", gcs_bucket(), (int)getpid(),
             (long long)time(NULL));
    return b;
}

/* conf_t on an object store with prefix_spread = 1 from the environment (read by every save):
 * its data under the parent's 16 spread prefixes, its marker beside the manifest. */
static int spread(int (*conf)(const char *), const char *base)
{
    if (!base) return T_SKIP;
    setenv("CKPTIO_PREFIX_SPREAD", "1", 1);
    markers = 1;
    int rc = conf(base);
    unsetenv("CKPTIO_PREFIX_SPREAD");
    markers = 0;
    return rc;
}

#define PER_STORE(t)                                                                           \
    static int posix_##t(void)                                                                 \
    {                                                                                          \
        const char *b = posix_base();                                                          \
        leftovers = posix_leftovers;                                                           \
        return b ? conf_##t(b) : 1;                                                            \
    }                                                                                          \
    static int s3_##t(void)                                                                    \
    {                                                                                          \
        const char *b = s3_base();                                                             \
        leftovers = s3_leftovers;                                                              \
        return b ? conf_##t(b) : T_SKIP;                                                       \
    }                                                                                          \
    static int gcs_##t(void)                                                                   \
    {                                                                                          \
        const char *b = gcs_base();                                                            \
        leftovers = gcs_leftovers;                                                             \
        return b ? conf_##t(b) : T_SKIP;                                                       \
    }                                                                                          \
    static int s3_spread_##t(void)                                                             \
    {                                                                                          \
        leftovers = s3_leftovers;                                                              \
        return spread(conf_##t, s3_base());                                                    \
    }                                                                                          \
    static int gcs_spread_##t(void)                                                            \
    {                                                                                          \
        leftovers = gcs_leftovers;                                                             \
        return spread(conf_##t, gcs_base());                                                   \
    }
PER_STORE(roundtrip)
PER_STORE(overwrite)
PER_STORE(race)
PER_STORE(killed_writer)
PER_STORE(list_remove)
PER_STORE(sweep)

/* The one URL parser: a path without a scheme is a directory, s3:// is S3, gs:// is GCS, and a
 * scheme no store serves is an error naming the ones there are (never a directory "az:"). */
static int test_store_names(void)
{
    CHECK(!strcmp(ckptio_store_name("/tmp/x"), "posix"));
    CHECK(!strcmp(ckptio_store_name("rel/x"), "posix"));
    CHECK(!strcmp(ckptio_store_name("s3://b/k"), "s3"));
    CHECK(!strcmp(ckptio_store_name("odd:name"), "posix"));
    CHECK(!strcmp(ckptio_store_name("gs://b/k"), "gcs"));
    CHECK(ckptio_store_name("az://b/k") == NULL);
    CHECK(t_contains(ckptio_last_error(), "no store serves 'az://' URLs"));
    CHECK(t_contains(ckptio_last_error(), "s3://, gs://"));
    CHECK(ckptio_store_name("") == NULL && ckptio_store_name(NULL) == NULL);
    CHECK_ERR(ckptio_is_checkpoint("az://b/k"), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_remove_checkpoint("az://b/k"), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_sweep("az://b/k"), CKPTIO_E_USAGE);
    return 0;
}

const ckptio_test tests_store[] = {
    {"store/names", test_store_names, 0, 0},
    {"store/posix/roundtrip", posix_roundtrip, 0, 0},
    {"store/posix/overwrite", posix_overwrite, 0, 0},
    {"store/posix/race", posix_race, 0, 0},
    {"store/posix/killed_writer", posix_killed_writer, 0, 0},
    {"store/posix/list_remove", posix_list_remove, 0, 0},
    {"store/posix/sweep", posix_sweep, 0, 0},
    {"store/s3/roundtrip", s3_roundtrip, 0, 300},
    {"store/s3/overwrite", s3_overwrite, 0, 300},
    {"store/s3/race", s3_race, 0, 300},
    {"store/s3/killed_writer", s3_killed_writer, 0, 300},
    {"store/s3/list_remove", s3_list_remove, 0, 300},
    {"store/s3/sweep", s3_sweep, 0, 300},
    {"store/gcs/roundtrip", gcs_roundtrip, 0, 300},
    {"store/gcs/overwrite", gcs_overwrite, 0, 300},
    {"store/gcs/race", gcs_race, 0, 300},
    {"store/gcs/killed_writer", gcs_killed_writer, 0, 300},
    {"store/gcs/list_remove", gcs_list_remove, 0, 300},
    {"store/gcs/sweep", gcs_sweep, 0, 300},
    {"store/s3-spread/roundtrip", s3_spread_roundtrip, 0, 300},
    {"store/s3-spread/overwrite", s3_spread_overwrite, 0, 300},
    {"store/s3-spread/race", s3_spread_race, 0, 300},
    {"store/s3-spread/killed_writer", s3_spread_killed_writer, 0, 300},
    {"store/s3-spread/list_remove", s3_spread_list_remove, 0, 300},
    {"store/s3-spread/sweep", s3_spread_sweep, 0, 300},
    {"store/gcs-spread/roundtrip", gcs_spread_roundtrip, 0, 300},
    {"store/gcs-spread/overwrite", gcs_spread_overwrite, 0, 300},
    {"store/gcs-spread/race", gcs_spread_race, 0, 300},
    {"store/gcs-spread/killed_writer", gcs_spread_killed_writer, 0, 300},
    {"store/gcs-spread/list_remove", gcs_spread_list_remove, 0, 300},
    {"store/gcs-spread/sweep", gcs_spread_sweep, 0, 300},
    {0},
};
