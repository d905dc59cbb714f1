/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoints in a live S3 store through the public API: round trips, the commit, races, damage. */
#define CKPTIO_EXPERIMENTAL
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "../src/ranks/comm.h"
#include "s3_live.h"
#include "test.h"

#define MIB (1ull << 20)

/* "s3://bucket/prefix/name" in a rotating buffer. */
static const char *url(const char *prefix, const char *name)
{
    static char bufs[4][600];
    static unsigned i;
    char *b = bufs[i++ % 4];
    snprintf(b, 600, "s3://%s/%s/%s", bucket(), prefix, name);
    return b;
}

/* ---- what a prefix holds ---- */

#define MAX_KEYS 64
typedef struct keys {
    char v[MAX_KEYS][320]; /* relative to the listed prefix */
    uint64_t size[MAX_KEYS];
    unsigned n, uploads;
    size_t skip;
} keys;

static int on_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)mtime;
    keys *k = ctx;
    if (k->n >= MAX_KEYS) return -1;
    snprintf(k->v[k->n], sizeof k->v[0], "%s", key + k->skip);
    k->size[k->n++] = size;
    return 0;
}

static int on_upload(void *ctx, const char *key, const char *id, int64_t initiated)
{
    (void)key, (void)id, (void)initiated;
    ((keys *)ctx)->uploads++;
    return 0;
}

/* The objects and open uploads under prefix/name/ (names relative to it). */
static int list_under(ckptio__objc *c, const char *prefix, const char *name, keys *out)
{
    char pre[512];
    snprintf(pre, sizeof pre, "%s/%s/", prefix, name);
    memset(out, 0, sizeof *out);
    out->skip = strlen(pre);
    CHECK_OK(ckptio__obj_list(c, bucket(), pre, on_key, out, NULL));
    CHECK_OK(ckptio__obj_list_uploads(c, bucket(), pre, on_upload, out, NULL));
    for (unsigned i = 0; i < out->n; i++) printf("  %s%s (%llu bytes)\n", pre, out->v[i],
                                                 (unsigned long long)out->size[i]);
    return 0;
}

/* The save components ("d-...") the listed keys fall under, distinct; 0 when some key is
 * neither the manifest nor under one. */
static unsigned components(const keys *k, char (*out)[64], unsigned cap)
{
    unsigned n = 0;
    for (unsigned i = 0; i < k->n; i++) {
        if (!strcmp(k->v[i], "manifest")) continue;
        const char *slash = strchr(k->v[i], '/');
        if (strncmp(k->v[i], "d-", 2) || !slash || slash - k->v[i] >= 64) return 0;
        char c[64];
        snprintf(c, sizeof c, "%.*s", (int)(slash - k->v[i]), k->v[i]);
        bool seen = false;
        for (unsigned j = 0; j < n && !seen; j++) seen = !strcmp(out[j], c);
        if (!seen && n < cap) snprintf(out[n++], 64, "%s", c);
    }
    return n;
}

/* ---- a standard checkpoint: a large f32 tensor, a middling one from an unaligned buffer
 * (staged), small ones and a scalar, and metadata; all derived from a seed ---- */

typedef struct model {
    uint64_t rows; /* of "big", 4096 f32 columns */
    float *big;
    uint8_t *mid_mem, *mid; /* mid = mid_mem + 1: never aligned */
    uint64_t mid_len;
    float s0[10];
    uint8_t s1[3];
    int64_t s2[5][7];
    int64_t step;
} model;

#define COLS 4096u

static int model_make(model *m, uint64_t rows, uint64_t mid_len, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->rows = rows;
    m->mid_len = mid_len;
    m->big = t_alloc(rows * COLS * 4);
    m->mid_mem = malloc(mid_len + 1);
    CHECK(m->big && m->mid_mem);
    m->mid = m->mid_mem + 1;
    t_fill(m->big, rows * COLS * 4, seed);
    t_fill(m->mid, mid_len, seed + 1);
    t_fill(m->s0, sizeof m->s0, seed + 2);
    t_fill(m->s1, sizeof m->s1, seed + 3);
    t_fill(m->s2, sizeof m->s2, seed + 4);
    m->step = (int64_t)seed * 1000;
    return 0;
}

static void model_free(model *m)
{
    t_free(m->big, m->rows * COLS * 4);
    free(m->mid_mem);
}

static int model_add(ckptio_writer *w, const model *m)
{
    uint64_t sb[2] = {m->rows, COLS}, sm[1] = {m->mid_len}, s0[1] = {10}, s1[1] = {3},
             s2[2] = {5, 7};
    CHECK_OK(ckptio_writer_add(w, "big", CKPTIO_DT_F32, 2, sb, NULL, NULL, m->big,
                               m->rows * COLS * 4));
    CHECK_OK(ckptio_writer_add(w, "mid", CKPTIO_DT_U8, 1, sm, NULL, NULL, m->mid, m->mid_len));
    CHECK_OK(ckptio_writer_add(w, "small/s0", CKPTIO_DT_F32, 1, s0, NULL, NULL, m->s0,
                               sizeof m->s0));
    CHECK_OK(ckptio_writer_add(w, "small/s1", CKPTIO_DT_U8, 1, s1, NULL, NULL, m->s1,
                               sizeof m->s1));
    CHECK_OK(ckptio_writer_add(w, "small/s2", CKPTIO_DT_I64, 2, s2, NULL, NULL, m->s2,
                               sizeof m->s2));
    CHECK_OK(ckptio_writer_add(w, "step", CKPTIO_DT_I64, 0, NULL, NULL, NULL, &m->step, 8));
    CHECK_OK(ckptio_writer_set_meta(w, "framework", "c-test", 6));
    return 0;
}

static int model_save(const char *u, const model *m, const ckptio_params *p)
{
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, u, p));
    if (model_add(w, m)) return 1;
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    return 0;
}

/* Every tensor of m at u, whole; rows [rows/3, +5) x columns [7, 1007) of "big" as a region;
 * every checksum. */
static int model_check(const char *u, const model *m)
{
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, u, NULL));
    CHECK(ckptio_reader_num_tensors(r) == 6);
    uint64_t nb = m->rows * COLS * 4;
    float *big = t_alloc(nb);
    uint8_t *mid = malloc(m->mid_len + 3);
    CHECK(big && mid);
    CHECK_OK(ckptio_reader_read_tensor(r, "big", big, nb));
    CHECK(!memcmp(big, m->big, nb));
    CHECK_OK(ckptio_reader_read_tensor(r, "mid", mid + 3, m->mid_len));
    CHECK(!memcmp(mid + 3, m->mid, m->mid_len));
    float s0[10];
    uint8_t s1[3];
    int64_t s2[5][7], step = 0;
    CHECK_OK(ckptio_reader_read_tensor(r, "small/s0", s0, sizeof s0));
    CHECK_OK(ckptio_reader_read_tensor(r, "small/s1", s1, sizeof s1));
    CHECK_OK(ckptio_reader_read_tensor(r, "small/s2", s2, sizeof s2));
    CHECK_OK(ckptio_reader_read_tensor(r, "step", &step, sizeof step));
    CHECK(!memcmp(s0, m->s0, sizeof s0) && !memcmp(s1, m->s1, sizeof s1) &&
          !memcmp(s2, m->s2, sizeof s2) && step == m->step);

    uint64_t off[2] = {m->rows / 3, 7}, shp[2] = {5, 1000};
    float sub[5][1000];
    ckptio_region reg = {.size = sizeof reg, .name = "big", .offset = off, .shape = shp,
                         .dst = sub, .capacity = sizeof sub};
    CHECK_OK(ckptio_reader_read(r, &reg, 1));
    for (uint64_t i = 0; i < 5; i++)
        CHECK(!memcmp(sub[i], m->big + (off[0] + i) * COLS + 7, sizeof sub[i]));
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_get_meta(r, "framework", &v, &len));
    CHECK(len == 6 && !memcmp(v, "c-test", 6));
    uint64_t bad = 99;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    t_free(big, nb);
    free(mid);
    return 0;
}

/* ---- tests ---- */

/* Several tensors, one of 25 MiB: the data object is a multipart upload of 8 MiB parts. */
static int test_roundtrip(void)
{
    LIVE(c, p, b);
    (void)b;
    model m;
    if (model_make(&m, 1601, 9 * MIB + 5, 1)) return 1; /* big: 25.02 MiB */
    ckptio_params prm;
    ckptio_params_init(&prm);
    CHECK(!ckptio_is_checkpoint(url(p, "ck")));
    if (model_save(url(p, "ck"), &m, &prm)) return 1;
    CHECK(ckptio_is_checkpoint(url(p, "ck")) == 1);
    if (model_check(url(p, "ck"), &m)) return 1;

    keys k;
    if (list_under(c, p, "ck", &k)) return 1;
    char comp[4][64];
    CHECK(components(&k, comp, 4) == 1 && k.uploads == 0);
    unsigned data = 0;
    for (unsigned i = 0; i < k.n; i++) {
        if (!strcmp(k.v[i], "manifest")) continue;
        data++;
        char key[700];
        snprintf(key, sizeof key, "%s/ck/%s", p, k.v[i]);
        ckptio__obj_resp r;
        CHECK_OK(ckptio__obj_head(c, bucket(), key, &r, NULL));
        const char *dash = strrchr(r.etag, '-');
        unsigned long want = (unsigned long)((r.size + 8 * MIB - 1) / (8 * MIB));
        printf("%s: %llu bytes, ETag %s (%lu parts of 8 MiB expected)\n", k.v[i],
               (unsigned long long)r.size, r.etag, want);
        CHECK(r.size > 34 * MIB && dash && strtoul(dash + 1, NULL, 10) == want);
    }
    CHECK(data == 1);
    model_free(&m);
    return 0;
}

/* Refused without overwrite; with it, the old checkpoint stays whole until the commit and its
 * objects are gone after. */
static int test_overwrite(void)
{
    LIVE(c, p, b);
    (void)b;
    model m1, m2;
    if (model_make(&m1, 600, 3 * MIB, 1) || model_make(&m2, 700, 2 * MIB, 2)) return 1;
    ckptio_params prm;
    ckptio_params_init(&prm);
    if (model_save(url(p, "ck"), &m1, &prm)) return 1;
    keys k1;
    char old[4][64];
    if (list_under(c, p, "ck", &k1)) return 1;
    CHECK(components(&k1, old, 4) == 1);

    ckptio_writer *w = (ckptio_writer *)1;
    CHECK_ERR(ckptio_writer_open(&w, url(p, "ck"), &prm), CKPTIO_E_EXISTS);
    CHECK(w == NULL && t_contains(ckptio_last_error(), url(p, "ck")));
    printf("%s\n", ckptio_last_error());

    prm.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, url(p, "ck"), &prm));
    if (model_add(w, &m2)) return 1;
    CHECK_OK(ckptio_writer_flush(w));
    if (model_check(url(p, "ck"), &m1)) return 1; /* the old one, whole, until the commit */
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    if (model_check(url(p, "ck"), &m2)) return 1;

    keys k2;
    char now[4][64];
    if (list_under(c, p, "ck", &k2)) return 1;
    CHECK(components(&k2, now, 4) == 1 && strcmp(now[0], old[0]) && k2.uploads == 0);
    for (unsigned i = 0; i < k2.n; i++) CHECK(!t_contains(k2.v[i], old[0]));
    model_free(&m1);
    model_free(&m2);
    return 0;
}

/* A writer closed without commit: no manifest while it runs, no object or upload after; an
 * overwrite closed so leaves the old checkpoint as it was. */
static int test_uncommitted(void)
{
    LIVE(c, p, b);
    (void)b;
    model m1, m2;
    if (model_make(&m1, 1100, 1 * MIB, 1) || model_make(&m2, 900, 1 * MIB, 2)) return 1;
    ckptio_params prm;
    ckptio_params_init(&prm);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "new"), &prm));
    if (model_add(w, &m1)) return 1;
    CHECK_OK(ckptio_writer_flush(w));
    keys k;
    if (list_under(c, p, "new", &k)) return 1;
    printf("while writing: %u objects, %u open uploads\n", k.n, k.uploads);
    CHECK(k.uploads >= 1); /* the parts went up */
    for (unsigned i = 0; i < k.n; i++) CHECK(strcmp(k.v[i], "manifest"));
    CHECK(ckptio_is_checkpoint(url(p, "new")) == 0);
    ckptio_reader *r = NULL;
    CHECK_ERR(ckptio_reader_open(&r, url(p, "new"), NULL), CKPTIO_E_NOT_CHECKPOINT);
    ckptio_writer_close(w);
    if (list_under(c, p, "new", &k)) return 1;
    CHECK(k.n == 0 && k.uploads == 0);

    if (model_save(url(p, "old"), &m1, &prm)) return 1;
    keys before, after;
    if (list_under(c, p, "old", &before)) return 1;
    prm.overwrite = CKPTIO_ON;
    CHECK_OK(ckptio_writer_open(&w, url(p, "old"), &prm));
    if (model_add(w, &m2)) return 1;
    CHECK_OK(ckptio_writer_flush(w));
    ckptio_writer_close(w);
    if (list_under(c, p, "old", &after)) return 1;
    CHECK(after.n == before.n && after.uploads == 0);
    for (unsigned i = 0; i < after.n; i++) CHECK(!strcmp(after.v[i], before.v[i]));
    if (model_check(url(p, "old"), &m1)) return 1;
    model_free(&m1);
    model_free(&m2);
    return 0;
}

typedef struct racer {
    ckptio_writer *w;
    pthread_barrier_t *go;
    int rc;
    char msg[1024];
} racer;

static void *race_commit(void *arg)
{
    racer *x = arg;
    pthread_barrier_wait(x->go);
    x->rc = ckptio_writer_commit(x->w);
    snprintf(x->msg, sizeof x->msg, "%s", ckptio_writer_errmsg(x->w));
    return NULL;
}

/* Two writers on one path, both written, committing at once: one wins, the other gets
 * CKPTIO_E_EXISTS and removes its objects; the winner's checkpoint reads back, and nothing
 * else is left under the path (with overwrite, the replaced checkpoint's data neither). */
static int race(ckptio__objc *c, const char *p, bool overwrite, uint64_t seed)
{
    model m[2];
    if (model_make(&m[0], 500, 2 * MIB, seed) || model_make(&m[1], 500, 2 * MIB, seed + 1))
        return 1;
    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.overwrite = overwrite ? CKPTIO_ON : CKPTIO_OFF;
    racer x[2];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    for (int i = 0; i < 2; i++) {
        x[i] = (racer){.go = &go};
        CHECK_OK(ckptio_writer_open(&x[i].w, url(p, "ck"), &prm));
        if (model_add(x[i].w, &m[i])) return 1;
        CHECK_OK(ckptio_writer_flush(x[i].w));
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, race_commit, &x[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 2; i++) {
        printf("writer %d: %s %s\n", i, ckptio_errname(x[i].rc), x[i].msg);
        ckptio_writer_close(x[i].w);
    }
    int win = x[0].rc == 0 ? 0 : 1;
    CHECK(x[win].rc == 0 && x[1 - win].rc == CKPTIO_E_EXISTS);
    CHECK(t_contains(x[1 - win].msg, url(p, "ck")));
    if (model_check(url(p, "ck"), &m[win])) return 1;
    keys k;
    char comp[4][64];
    if (list_under(c, p, "ck", &k)) return 1;
    CHECK(components(&k, comp, 4) == 1 && k.uploads == 0);
    model_free(&m[0]);
    model_free(&m[1]);
    return 0;
}

static int test_race(void)
{
    LIVE(c, p, b);
    (void)b;
    return race(c, p, false, 1) || race(c, p, true, 3);
}

/* What an interrupted save left (an object and an open upload under a data component no
 * manifest names) goes with the next save of the path that commits, as that save began after
 * it; what a save begun later puts there stays (it may still commit). */
static int test_sweep(void)
{
    LIVE(c, p, b);
    char *id = NULL;
    CHECK_OK(ckptio__obj_put(c, b, k(p, "ck/d-1-dead/000000.ckd"), "x", 1, NULL, NULL, NULL));
    CHECK_OK(ckptio__obj_mpu_create(c, b, k(p, "ck/d-1-dead/000001.ckd"), &id, NULL));
    free(id);
    sleep(2); /* the server's clock, in whole seconds, moves a second past them */
    model m;
    if (model_make(&m, 300, MIB, 1)) return 1;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "ck"), NULL));
    if (model_add(w, &m)) return 1;
    CHECK_OK(ckptio_writer_flush(w));
    CHECK_OK(ckptio__obj_put(c, b, k(p, "ck/d-2-later/000000.ckd"), "y", 1, NULL, NULL, NULL));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    keys kk;
    char comp[4][64];
    if (list_under(c, p, "ck", &kk)) return 1;
    CHECK(components(&kk, comp, 4) == 2 && kk.uploads == 0);
    CHECK(!strcmp(comp[0], "d-2-later") || !strcmp(comp[1], "d-2-later"));
    for (unsigned i = 0; i < kk.n; i++) CHECK(!t_contains(kk.v[i], "d-1-dead"));
    if (model_check(url(p, "ck"), &m)) return 1;
    model_free(&m);
    return 0;
}

/* A data object overwritten with one byte changed: the read fails with CKPTIO_E_CHECKSUM,
 * naming the tensor and the object; the other tensor still reads. */
static int test_corrupt(void)
{
    LIVE(c, p, b);
    const uint64_t n = 3 * MIB;
    uint8_t *victim = t_alloc(n), *other = t_alloc(n), *back = t_alloc(n);
    CHECK(victim && other && back);
    t_fill(victim, n, 5);
    t_fill(other, n, 6);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "ck"), NULL));
    CHECK_OK(ckptio_writer_add(w, "layer/victim", CKPTIO_DT_U8, 1, &n, NULL, NULL, victim, n));
    CHECK_OK(ckptio_writer_add(w, "layer/other", CKPTIO_DT_U8, 1, &n, NULL, NULL, other, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, url(p, "ck"), NULL));
    int64_t ti = ckptio_reader_find(r, "layer/victim");
    CHECK_OK(ti);
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, (size_t)ti, 0, &ci));
    char file[256], key[700];
    snprintf(file, sizeof file, "%s", ci.file);
    snprintf(key, sizeof key, "%s/ck/%s", p, ci.file);
    ckptio_reader_close(r);

    uint8_t *obj = NULL;
    uint64_t len = 0;
    CHECK_OK(ckptio__obj_get_all(c, b, key, 64 * MIB, &obj, &len, NULL, NULL));
    uint64_t at = ci.file_offset + 2 * MIB + 17;
    CHECK(at < len);
    obj[at] ^= 0x40;
    CHECK_OK(ckptio__obj_put(c, b, key, obj, len, NULL, NULL, NULL));
    free(obj);

    CHECK_OK(ckptio_reader_open(&r, url(p, "ck"), NULL));
    CHECK_ERR(ckptio_reader_read_tensor(r, "layer/victim", back, n), CKPTIO_E_CHECKSUM);
    const char *msg = ckptio_reader_errmsg(r);
    printf("%s\n", msg);
    CHECK(t_contains(msg, "layer/victim") && t_contains(msg, file) &&
          t_contains(msg, url(p, "ck")));
    ckptio_error_info info = {.size = sizeof info};
    CHECK_OK(ckptio_reader_error_info(r, &info));
    printf("info: tensor %s, file %s, offset %llu\n", info.tensor, info.file,
           (unsigned long long)info.offset);
    CHECK(!strcmp(info.tensor, "layer/victim") && t_contains(info.file, file));
    CHECK(info.offset <= at && at < info.offset + MIB);
    CHECK_OK(ckptio_reader_read_tensor(r, "layer/other", back, n));
    CHECK(!memcmp(back, other, n));
    uint64_t bad = 0;
    CHECK_ERR(ckptio_reader_verify(r, &bad), CKPTIO_E_CHECKSUM);
    CHECK(bad == 1 && t_contains(ckptio_reader_errmsg(r), "layer/victim"));
    ckptio_reader_close(r);
    t_free(victim, n);
    t_free(other, n);
    t_free(back, n);
    return 0;
}

/* Every block tried by the coders: smooth floats, zeros and random bytes round trip, whole and
 * as regions, and the compressible ones are stored smaller. */
static int test_compressed(void)
{
    LIVE(c, p, b);
    (void)c, (void)b;
    const uint64_t rows = 1200, nf = rows * COLS; /* 18.75 MiB of f32: three parts */
    float *smooth = t_alloc(nf * 4), *fback = t_alloc(nf * 4);
    const uint64_t nz = 5 * MIB + 11, nr = 3 * MIB + 1;
    uint8_t *zeros = t_alloc(nz), *rnd = t_alloc(nr), *bback = t_alloc(nz + nr);
    CHECK(smooth && fback && zeros && rnd && bback);
    for (uint64_t i = 0; i < nf; i++) smooth[i] = (float)(i % 977) * 0.001f + 1.0f;
    t_fill(rnd, nr, 9);
    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.compress = CKPTIO_COMPRESS_ALL;
    ckptio_writer *w = NULL;
    uint64_t sf[2] = {rows, COLS};
    CHECK_OK(ckptio_writer_open(&w, url(p, "ck"), &prm));
    CHECK_OK(ckptio_writer_add(w, "smooth", CKPTIO_DT_F32, 2, sf, NULL, NULL, smooth, nf * 4));
    CHECK_OK(ckptio_writer_add(w, "zeros", CKPTIO_DT_U8, 1, &nz, NULL, NULL, zeros, nz));
    CHECK_OK(ckptio_writer_add(w, "random", CKPTIO_DT_U8, 1, &nr, NULL, NULL, rnd, nr));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, url(p, "ck"), NULL));
    const char *names[3] = {"random", "smooth", "zeros"};
    for (size_t i = 0; i < 3; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        CHECK_OK(ckptio_reader_tensor(r, i, &ti));
        printf("%s: %llu -> %llu bytes, codec %s\n", ti.name, (unsigned long long)ti.nbytes,
               (unsigned long long)ti.stored_bytes, ti.codec);
        CHECK(!strcmp(ti.name, names[i]));
        if (i) CHECK(ti.stored_bytes < ti.nbytes && strcmp(ti.codec, "none"));
    }
    CHECK_OK(ckptio_reader_read_tensor(r, "smooth", fback, nf * 4));
    CHECK(!memcmp(fback, smooth, nf * 4));
    memset(bback, 1, nz);
    CHECK_OK(ckptio_reader_read_tensor(r, "zeros", bback, nz));
    CHECK(!memcmp(bback, zeros, nz));
    CHECK_OK(ckptio_reader_read_tensor(r, "random", bback, nr));
    CHECK(!memcmp(bback, rnd, nr));
    uint64_t off[2] = {555, 100}, shp[2] = {300, 2000}, zo[1] = {4 * MIB}, zs[1] = {MIB + 11};
    ckptio_region regs[2] = {
        {.size = sizeof regs[0], .name = "smooth", .offset = off, .shape = shp, .dst = fback,
         .capacity = nf * 4},
        {.size = sizeof regs[0], .name = "zeros", .offset = zo, .shape = zs, .dst = bback,
         .capacity = nz}};
    memset(bback, 1, nz);
    CHECK_OK(ckptio_reader_read(r, regs, 2));
    for (uint64_t i = 0; i < shp[0]; i++)
        CHECK(!memcmp(fback + i * shp[1], smooth + (off[0] + i) * COLS + off[1], shp[1] * 4));
    CHECK(!memcmp(bback, zeros, zs[0]));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    t_free(smooth, nf * 4);
    t_free(fback, nf * 4);
    t_free(zeros, nz);
    t_free(rnd, nr);
    t_free(bback, nz + nr);
    return 0;
}

/* Commits on ckptio's threads: two checkpoints in flight at once, then an overwrite. */
static int test_async(void)
{
    LIVE(c, p, b);
    (void)c, (void)b;
    model m[2];
    if (model_make(&m[0], 700, 3 * MIB, 1) || model_make(&m[1], 600, 5 * MIB, 2)) return 1;
    const char *names[2] = {"a", "b"};
    ckptio_completion *done[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        ckptio_writer *w = NULL;
        CHECK_OK(ckptio_writer_open(&w, url(p, names[i]), NULL));
        if (model_add(w, &m[i])) return 1;
        CHECK_OK(ckptio_writer_commit_async(w, &done[i]));
    }
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ckptio_completion_wait(done[i], 120));
        ckptio_completion_free(done[i]);
    }
    if (model_check(url(p, "a"), &m[0]) || model_check(url(p, "b"), &m[1])) return 1;
    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.overwrite = CKPTIO_ON;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "a"), &prm));
    if (model_add(w, &m[1])) return 1;
    CHECK_OK(ckptio_writer_commit_async(w, &done[0]));
    CHECK_OK(ckptio_completion_wait(done[0], 120));
    ckptio_completion_free(done[0]);
    if (model_check(url(p, "a"), &m[1])) return 1;
    model_free(&m[0]);
    model_free(&m[1]);
    return 0;
}

typedef struct names {
    char v[8][64];
    unsigned n, stop_at;
} names;

static int on_name(void *ctx, const char *name)
{
    names *ns = ctx;
    if (ns->n < 8) snprintf(ns->v[ns->n++], 64, "%s", name);
    return ns->stop_at && ns->n == ns->stop_at ? 7 : 0;
}

static int save_one(const char *u, uint8_t v)
{
    ckptio_writer *w = NULL;
    uint64_t n = 1000;
    uint8_t buf[1000];
    memset(buf, v, sizeof buf);
    CHECK_OK(ckptio_writer_open(&w, u, NULL));
    CHECK_OK(ckptio_writer_add(w, "t", CKPTIO_DT_U8, 1, &n, NULL, NULL, buf, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    return 0;
}

/* ckptio_list_checkpoints, ckptio_remove_checkpoint and ckptio_is_checkpoint on a prefix with
 * committed checkpoints, an unfinished save and stray objects. */
static int test_catalog(void)
{
    LIVE(c, p, b);
    char run[300];
    snprintf(run, sizeof run, "%s/run", p);
    if (save_one(url(run, "step-2"), 2) || save_one(url(run, "step-10"), 10) ||
        save_one(url(run, "step-1"), 1))
        return 1;
    ckptio_writer *pending = NULL;
    uint64_t n = 9 * MIB;
    uint8_t *big = t_alloc(n);
    CHECK(big);
    CHECK_OK(ckptio_writer_open(&pending, url(run, "step-3"), NULL));
    CHECK_OK(ckptio_writer_add(pending, "t", CKPTIO_DT_U8, 1, &n, NULL, NULL, big, n));
    CHECK_OK(ckptio_writer_flush(pending));
    CHECK_OK(ckptio__obj_put(c, b, k(run, "notes.txt"), "x", 1, NULL, NULL, NULL));
    CHECK_OK(ckptio__obj_put(c, b, k(run, "stray/file"), "x", 1, NULL, NULL, NULL));

    names ns = {0};
    char where[600];
    snprintf(where, sizeof where, "s3://%s/%s", b, run);
    CHECK_OK(ckptio_list_checkpoints(where, on_name, &ns));
    CHECK(ns.n == 3 && !strcmp(ns.v[0], "step-1") && !strcmp(ns.v[1], "step-10") &&
          !strcmp(ns.v[2], "step-2"));
    ns = (names){.stop_at = 2};
    CHECK(ckptio_list_checkpoints(where, on_name, &ns) == 7 && ns.n == 2);
    ns = (names){0};
    CHECK_OK(ckptio_list_checkpoints(url(p, "nothing-here"), on_name, &ns));
    CHECK(ns.n == 0);

    CHECK(ckptio_is_checkpoint(url(run, "step-10")) == 1);
    CHECK(ckptio_is_checkpoint(url(run, "step-3")) == 0);
    CHECK(ckptio_is_checkpoint(url(run, "stray")) == 0);
    CHECK(ckptio_is_checkpoint(url(run, "step-4")) == 0);

    CHECK_OK(ckptio_remove_checkpoint(url(run, "step-10")));
    CHECK(ckptio_is_checkpoint(url(run, "step-10")) == 0);
    keys kk;
    if (list_under(c, run, "step-10", &kk)) return 1;
    CHECK(kk.n == 0 && kk.uploads == 0);
    CHECK_ERR(ckptio_remove_checkpoint(url(run, "step-10")), CKPTIO_E_NOT_CHECKPOINT);
    CHECK_ERR(ckptio_remove_checkpoint(url(run, "step-3")), CKPTIO_E_NOT_CHECKPOINT);
    CHECK(t_contains(ckptio_last_error(), url(run, "step-3")));
    ns = (names){0};
    CHECK_OK(ckptio_list_checkpoints(where, on_name, &ns));
    CHECK(ns.n == 2 && !strcmp(ns.v[0], "step-1") && !strcmp(ns.v[1], "step-2"));

    /* The unfinished save is untouched by all this, and commits. */
    CHECK_OK(ckptio_writer_commit(pending));
    ckptio_writer_close(pending);
    ns = (names){0};
    CHECK_OK(ckptio_list_checkpoints(where, on_name, &ns));
    CHECK(ns.n == 3 && !strcmp(ns.v[2], "step-3"));
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, url(run, "step-2"), NULL));
    uint8_t got[1000];
    CHECK_OK(ckptio_reader_read_tensor(r, "t", got, sizeof got));
    CHECK(got[0] == 2 && got[999] == 2);
    ckptio_reader_close(r);
    t_free(big, n);
    return 0;
}

/* Shapes at the edges: a checkpoint of metadata alone, a zero-byte tensor, a data object that
 * ends exactly on a part boundary, 16 MiB parts with staging for just two, and a key with a
 * space and a plus in it. */
static int test_edges(void)
{
    LIVE(c, p, b);
    (void)c, (void)b;
    ckptio_writer *w = NULL;
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "empty"), NULL));
    CHECK_OK(ckptio_writer_set_meta(w, "only", "meta", 4));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_reader_open(&r, url(p, "empty"), NULL));
    const void *v;
    size_t len;
    CHECK(ckptio_reader_num_tensors(r) == 0);
    CHECK_OK(ckptio_reader_get_meta(r, "only", &v, &len));
    CHECK(len == 4 && !memcmp(v, "meta", 4));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);

    const uint64_t n = 8 * MIB, zero[2] = {0, 5};
    uint8_t *a = t_alloc(2 * n), *back = t_alloc(2 * n);
    CHECK(a && back);
    t_fill(a, 2 * n, 31);
    CHECK_OK(ckptio_writer_open(&w, url(p, "edge"), NULL));
    CHECK_OK(ckptio_writer_add(w, "none", CKPTIO_DT_F32, 2, zero, NULL, NULL, a, 0));
    CHECK_OK(ckptio_writer_add(w, "part", CKPTIO_DT_U8, 1, &n, NULL, NULL, a, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK_OK(ckptio_reader_open(&r, url(p, "edge"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(r, "none", back, 0));
    CHECK_OK(ckptio_reader_read_tensor(r, "part", back, n));
    CHECK(!memcmp(back, a, n));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);

    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.request_bytes = 16 * MIB;
    prm.staging_bytes = 1 * MIB; /* raised to two parts */
    const uint64_t n2 = 2 * n + 4097;
    uint8_t *c2 = malloc(n2 + 1);
    CHECK(c2);
    t_fill(c2 + 1, n2, 32);
    CHECK_OK(ckptio_writer_open(&w, url(p, "a b+c"), &prm));
    CHECK_OK(ckptio_writer_add(w, "x y", CKPTIO_DT_U8, 1, &n2, NULL, NULL, c2 + 1, n2));
    CHECK_OK(ckptio_writer_add(w, "z", CKPTIO_DT_U8, 1, &n, NULL, NULL, a + 1, n));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    CHECK(ckptio_is_checkpoint(url(p, "a b+c")) == 1);
    uint8_t *b2 = malloc(n2);
    CHECK(b2);
    CHECK_OK(ckptio_reader_open(&r, url(p, "a b+c"), &prm));
    CHECK_OK(ckptio_reader_read_tensor(r, "x y", b2, n2));
    CHECK(!memcmp(b2, c2 + 1, n2));
    CHECK_OK(ckptio_reader_read_tensor(r, "z", back, n));
    CHECK(!memcmp(back, a + 1, n));
    ckptio_reader_close(r);
    CHECK_OK(ckptio_remove_checkpoint(url(p, "a b+c")));
    CHECK(ckptio_is_checkpoint(url(p, "a b+c")) == 0);
    free(b2);
    free(c2);
    t_free(a, 2 * n);
    t_free(back, 2 * n);
    return 0;
}

/* ---- several ranks (threads of one process, a local communicator) ---- */

#define NR 3
#define W_ROWS 1536u /* 24 MiB of f32 with COLS columns: 8 MiB per rank */

typedef struct rank_job {
    const ckptio_comm *comm;
    const char *url;
    const float *w;
    const int64_t *b;
    uint8_t rng[8];
    const ckptio_params *prm;
    int rc;
    char msg[1024];
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    int r = j->comm->rank;
    static const uint64_t ws[2] = {W_ROWS, COLS}, bs[1] = {16}, rs[1] = {8};
    uint64_t rows = W_ROWS / NR, off[2] = {rows * (uint64_t)r, 0}, box[2] = {rows, COLS};
    ckptio_dist_item it[3] = {
        {sizeof it[0], 0, "w", CKPTIO_DT_F32, 2, ws, off, box, j->w + off[0] * COLS,
         rows * COLS * 4, CKPTIO_MEM_HOST, 0},
        {sizeof it[0], 0, "b", CKPTIO_DT_I64, 1, bs, NULL, NULL, j->b, 16 * 8, CKPTIO_MEM_HOST, 0},
        {sizeof it[0], CKPTIO_DIST_RANK_LOCAL, "rng", CKPTIO_DT_U8, 1, rs, NULL, NULL, j->rng, 8,
         CKPTIO_MEM_HOST, 0}};
    const char *mkeys[1] = {"step"};
    const void *vals[1] = {"77"};
    size_t lens[1] = {2};
    j->rc = ckptio_save_dist(j->url, j->comm, it, 3, mkeys, vals, lens, r == 0 ? 1 : 0, j->prm,
                             20, NULL);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? ckptio_last_error() : "");
    return NULL;
}

/* Every rank of NR saves its rows of w, b and its own rng at u; rank `dies` (-1: none) dies
 * once it has written its objects (its fourth operation on the communicator). */
static int dist_run(rank_job *J, const char *u, const float *w, const int64_t *bias,
                    const ckptio_params *prm, int dies)
{
    ckptio__comm_local *g = NULL;
    CHECK_OK(ckptio__comm_local_new(&g, NR));
    if (dies >= 0) ckptio__comm_local_kill_at(g, dies, 3);
    pthread_t th[NR];
    for (int r = 0; r < NR; r++) {
        J[r] = (rank_job){.comm = ckptio__comm_local_rank(g, r), .url = u, .w = w, .b = bias,
                          .prm = prm};
        t_fill(J[r].rng, 8, 100 + (uint64_t)r);
        CHECK(pthread_create(&th[r], NULL, rank_main, &J[r]) == 0);
    }
    for (int r = 0; r < NR; r++) pthread_join(th[r], NULL);
    ckptio__comm_local_free(g);
    for (int r = 0; r < NR; r++) printf("rank %d: %d %s\n", r, J[r].rc, J[r].msg);
    return 0;
}

/* Every rank uploads its rows and its own state; rank 0 commits; one process reads it all. */
static int test_dist(void)
{
    LIVE(c, p, b);
    (void)b;
    uint64_t nw = (uint64_t)W_ROWS * COLS * 4;
    float *w = t_alloc(nw), *back = t_alloc(nw);
    int64_t bias[16];
    CHECK(w && back);
    t_fill(w, nw, 11);
    t_fill(bias, sizeof bias, 12);
    rank_job J[NR];
    if (dist_run(J, url(p, "ck"), w, bias, NULL, -1)) return 1;
    for (int r = 0; r < NR; r++) CHECK_OK(J[r].rc);

    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, url(p, "ck"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", back, nw));
    CHECK(!memcmp(back, w, nw));
    int64_t bb[16];
    CHECK_OK(ckptio_reader_read_tensor(rd, "b", bb, sizeof bb));
    CHECK(!memcmp(bb, bias, sizeof bb));
    for (int r = 0; r < NR; r++) {
        char name[32];
        uint8_t rng[8];
        snprintf(name, sizeof name, "rng@rank%d", r);
        CHECK_OK(ckptio_reader_read_tensor(rd, name, rng, 8));
        CHECK(!memcmp(rng, J[r].rng, 8));
    }
    /* Rows 500..520 straddle rank 0's and rank 1's objects. */
    uint64_t off[2] = {500, 0}, shp[2] = {20, COLS};
    ckptio_region reg = {.size = sizeof reg, .name = "w", .offset = off, .shape = shp,
                         .dst = back, .capacity = nw};
    CHECK_OK(ckptio_reader_read(rd, &reg, 1));
    CHECK(!memcmp(back, w + 500 * COLS, 20 * COLS * 4));
    CHECK_OK(ckptio_reader_verify(rd, NULL));
    ckptio_reader_close(rd);

    keys k;
    char comp[4][64];
    if (list_under(c, p, "ck", &k)) return 1;
    CHECK(components(&k, comp, 4) == 1 && k.uploads == 0);
    unsigned ranks_seen = 0;
    for (int r = 0; r < NR; r++) {
        char tag[16];
        snprintf(tag, sizeof tag, "/r%05d-", r);
        for (unsigned i = 0; i < k.n; i++)
            if (t_contains(k.v[i], tag)) {
                ranks_seen++;
                break;
            }
    }
    CHECK(ranks_seen == NR);
    t_free(w, nw);
    t_free(back, nw);
    return 0;
}

/* An overwrite in which a rank dies after uploading: every rank fails, the old checkpoint
 * reads back whole, and none of the failed save's objects or uploads stay. */
static int test_dist_dies(void)
{
    /* The coordinator's clean-up may abort an upload that a slower rank is completing; moto
     * answers that complete with 500s, retried until this deadline (S3 says 404 at once). */
    setenv("CKPTIO_S3_TIMEOUT", "15", 1);
    LIVE(c, p, b);
    (void)b;
    uint64_t nw = (uint64_t)W_ROWS * COLS * 4;
    float *w = t_alloc(nw), *w2 = t_alloc(nw), *back = t_alloc(nw);
    int64_t bias[16];
    CHECK(w && w2 && back);
    t_fill(w, nw, 11);
    t_fill(w2, nw, 13);
    t_fill(bias, sizeof bias, 12);
    rank_job J[NR];
    if (dist_run(J, url(p, "ck"), w, bias, NULL, -1)) return 1;
    for (int r = 0; r < NR; r++) CHECK_OK(J[r].rc);
    keys k;
    char before[4][64], after[4][64];
    if (list_under(c, p, "ck", &k)) return 1;
    CHECK(components(&k, before, 4) == 1);

    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.overwrite = CKPTIO_ON;
    if (dist_run(J, url(p, "ck"), w2, bias, &prm, 2)) return 1;
    for (int r = 0; r < NR; r++) CHECK(J[r].rc < 0);
    if (list_under(c, p, "ck", &k)) return 1;
    CHECK(components(&k, after, 4) == 1 && !strcmp(after[0], before[0]) && k.uploads == 0);
    ckptio_reader *rd = NULL;
    CHECK_OK(ckptio_reader_open(&rd, url(p, "ck"), NULL));
    CHECK_OK(ckptio_reader_read_tensor(rd, "w", back, nw));
    CHECK(!memcmp(back, w, nw));
    CHECK_OK(ckptio_reader_verify(rd, NULL));
    ckptio_reader_close(rd);
    t_free(w, nw);
    t_free(w2, nw);
    t_free(back, nw);
    return 0;
}

/* ---- device memory through the driver stand-in ---- */

/* Device tensors (one spanning parts, one small) and a host one saved to an object through
 * the stand-in CUDA driver, then read back to the host and into device memory. */
static int test_gpu(void)
{
    const char *real = getenv("CKPTIO_TEST_REAL_GPU");
    if (real && *real == '1') return T_SKIP; /* the stand-in's memory is host memory */
    LIVE(c, p, b);
    (void)c, (void)b;
    setenv("CKPTIO_CUDA_LIBRARY", CKPTIO_GPU_STANDIN, 1);
    setenv("CKPTIO_CUFILE_LIBRARY", CKPTIO_GPU_STANDIN, 1);
    void *lib = dlopen(CKPTIO_GPU_STANDIN, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cannot load the stand-in: %s\n", dlerror());
        return 1;
    }
    void *(*dmalloc)(size_t);
    void (*dfree)(void *);
    *(void **)&dmalloc = dlsym(lib, "standin_malloc");
    *(void **)&dfree = dlsym(lib, "standin_free");
    CHECK(dmalloc && dfree);

    const size_t big = 10 * MIB + 3, mid = 5000, small = 100;
    uint8_t *hb = malloc(big), *hm = malloc(mid), *hs = malloc(small), *back = malloc(big);
    uint8_t *db = dmalloc(big), *dm = dmalloc(mid), *dd = dmalloc(big);
    CHECK(hb && hm && hs && back && db && dm && dd);
    t_fill(hb, big, 21);
    t_fill(hm, mid, 22);
    t_fill(hs, small, 23);
    memcpy(db, hb, big); /* the stand-in's device memory is addressable */
    memcpy(dm, hm, mid);
    ckptio_params prm;
    ckptio_params_init(&prm);
    prm.gpu = CKPTIO_GPU_STAGED;
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, url(p, "ck"), &prm));
    uint64_t sm[1] = {mid}, ss[1] = {small}, sb[2] = {big, 1};
    CHECK_OK(ckptio_writer_add(w, "host", CKPTIO_DT_U8, 1, ss, NULL, NULL, hs, small));
    CHECK_OK(ckptio_writer_add_mem(w, "dev/big", CKPTIO_DT_U8, 2, sb, NULL, NULL, db, big,
                                   CKPTIO_MEM_CUDA, 0));
    CHECK_OK(ckptio_writer_add_mem(w, "dev/mid", CKPTIO_DT_U8, 1, sm, NULL, NULL, dm, mid,
                                   CKPTIO_MEM_CUDA, 0));
    ckptio_gpu_stats gs = {.size = sizeof gs};
    CHECK_OK(ckptio_writer_gpu_stats(w, &gs));
    printf("writer: path %s, %llu device bytes\n", gs.path, (unsigned long long)gs.device_bytes);
    CHECK(gs.device_bytes == big + mid && t_contains(gs.path, "staged"));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);

    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, url(p, "ck"), &prm));
    CHECK_OK(ckptio_reader_read_tensor(r, "dev/big", back, big));
    CHECK(!memcmp(back, hb, big));
    CHECK_OK(ckptio_reader_read_tensor(r, "dev/mid", back, mid));
    CHECK(!memcmp(back, hm, mid));
    CHECK_OK(ckptio_reader_read_tensor(r, "host", back, small));
    CHECK(!memcmp(back, hs, small));
    uint64_t off[2] = {3 * MIB + 1, 0}, shp[2] = {MIB, 1};
    ckptio_region regs[2] = {
        {.size = sizeof regs[0], .memory = CKPTIO_MEM_CUDA, .name = "dev/big", .dst = dd,
         .capacity = big},
        {.size = sizeof regs[0], .memory = CKPTIO_MEM_CUDA, .name = "dev/big", .offset = off,
         .shape = shp, .dst = NULL, .capacity = MIB}};
    CHECK_OK(ckptio_reader_read(r, &regs[0], 1));
    CHECK(!memcmp(dd, hb, big));
    uint8_t *dsub = dmalloc(MIB);
    CHECK(dsub);
    regs[1].dst = dsub;
    CHECK_OK(ckptio_reader_read(r, &regs[1], 1));
    CHECK(!memcmp(dsub, hb + off[0], MIB));
    CHECK_OK(ckptio_reader_verify(r, NULL));
    ckptio_reader_close(r);
    dfree(db);
    dfree(dm);
    dfree(dd);
    dfree(dsub);
    free(hb);
    free(hm);
    free(hs);
    free(back);
    return 0;
}

const ckptio_test tests_s3ckpt[] = {
    {"s3ckpt/roundtrip", test_roundtrip, 0, 300},
    {"s3ckpt/overwrite", test_overwrite, 0, 300},
    {"s3ckpt/uncommitted", test_uncommitted, 0, 300},
    {"s3ckpt/race", test_race, 0, 300},
    {"s3ckpt/sweep", test_sweep, 0, 300},
    {"s3ckpt/corrupt", test_corrupt, 0, 300},
    {"s3ckpt/compressed", test_compressed, 0, 300},
    {"s3ckpt/async", test_async, 0, 300},
    {"s3ckpt/catalog", test_catalog, 0, 300},
    {"s3ckpt/edges", test_edges, 0, 300},
    {"s3ckpt/dist", test_dist, 0, 300},
    {"s3ckpt/dist_dies", test_dist_dies, 0, 300},
    {"s3ckpt/gpu", test_gpu, 0, 300},
    {0, 0, 0, 0},
};
