/* SPDX-License-Identifier: Apache-2.0 */
/* Reader and engine failures that once hung or misreported: bad staging, broken reaps, verify's count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/io/engine.h"
#include "../src/io/vfs.h"
#include "model.h"
#include "test.h"

/* ---- a backend whose reap can be made to fail ---- */

/* Reap calls fail_from, fail_from + 1, ... fail with EIO (fail_count of them; 0: all of them),
 * moving nothing. outstanding counts requests submitted and not yet handed back; live counts
 * started engines not yet finished. */
static struct {
    unsigned reap_calls, fail_from, fail_count, failed;
    long outstanding;
    int live;
} W;
static const ckptio__backend_ops *w_real;
static ckptio__backend_ops w_ops;

static int w_init(ckptio__engine *e)
{
    int rc = w_real->init(e);
    if (rc == 0) W.live++;
    return rc;
}
static int w_submit(ckptio__engine *e, ckptio__req *r)
{
    int rc = w_real->submit(e, r);
    if (rc == 0) W.outstanding++;
    return rc;
}
static int w_reap(ckptio__engine *e, ckptio__req **out, unsigned max, unsigned min)
{
    unsigned k = ++W.reap_calls;
    if (W.fail_from && k >= W.fail_from && (!W.fail_count || k < W.fail_from + W.fail_count)) {
        W.failed++;
        return -EIO;
    }
    int n = w_real->reap(e, out, max, min);
    if (n > 0) W.outstanding -= n;
    return n;
}
static void w_fini(ckptio__engine *e)
{
    w_real->fini(e);
    W.live--;
}
static const ckptio__backend_ops *wrap(const ckptio__backend_ops *real)
{
    w_real = real;
    w_ops = *real;
    w_ops.init = w_init;
    w_ops.submit = w_submit;
    w_ops.reap = w_reap;
    w_ops.fini = w_fini;
    return &w_ops;
}

/* Read tensor i of the model into fresh memory; 0 bit-exact, 1 different, <0 the error. */
static int read_one(ckptio_reader *r, const model *m, int i)
{
    uint64_t cap = (tsizes[i] + 4095) & ~4095ull;
    unsigned char *buf = t_alloc(cap);
    if (!buf) return -ENOMEM;
    int rc = ckptio_reader_read_tensor(r, tnames[i], buf, cap);
    if (rc == 0) rc = memcmp(buf, m->t[i] + (i == 0 ? 1 : 0), tsizes[i]) != 0;
    t_free(buf, cap);
    return rc;
}

/* ---- tests ---- */

/* Staging that cannot be had: every read fails with ENOMEM and says which parameter to lower,
 * again and again; none waits forever on an engine that has no slots (the runner's timeout
 * fails this test if one does). */
static int test_staging_too_large(void)
{
    model m;
    CHECK(model_make(&m, 41) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &m, 0, NULL, 0));
    ckptio_params p;
    ckptio_params_init(&p);
    p.staging_bytes = 1ull << 46;
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, &p));
    for (int k = 0; k < 3; k++) {
        int rc = read_one(r, &m, k % NT);
        CHECK_ERR(rc, -ENOMEM);
        CHECK(t_contains(ckptio_reader_errmsg(r), "staging_bytes"));
        CHECK(t_contains(ckptio_last_error(), ck));
    }
    uint64_t bad = 7;
    CHECK_ERR(ckptio_reader_verify(r, &bad), -ENOMEM);
    CHECK(bad == 0);
    printf("%s\n", ckptio_reader_errmsg(r));
    ckptio_reader_close(r);
    model_free(&m);
    return leak_check();
}

/* A few failed reaps in the middle of a read: the read reports EIO, but only once every
 * request it issued has come back (none may still land in the caller's memory), and the next
 * reads, of other tensors and of the same, return exact bytes. */
static int test_reap_fails_briefly(void)
{
    model m;
    CHECK(model_make(&m, 42) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &m, 0, NULL, 0));
    ckptio_params p = fparams(0);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, &p));
    memset(&W, 0, sizeof W);
    ckptio__backend_wrap = wrap;
    W.fail_from = 2;
    W.fail_count = 3;
    int rc = read_one(r, &m, 0);
    long left = W.outstanding;
    CHECK_ERR(rc, -EIO);
    CHECK(W.failed == 3);
    CHECK(t_contains(ckptio_reader_errmsg(r), ck));
    if (left) fprintf(stderr, "the failed read returned with %ld requests in flight\n", left);
    CHECK(left == 0);
    for (int i = NT; i-- > 0;) CHECK(read_one(r, &m, i) == 0);
    CHECK(W.outstanding == 0 && W.live == 1);
    ckptio_reader_close(r);
    CHECK(W.live == 0);
    ckptio__backend_wrap = NULL;
    model_free(&m);
    return leak_check();
}

/* Reaping never works again: the read gives up after a bounded number of tries, shuts the
 * engine down before returning (its requests are waited for or cancelled there), and a later
 * read on a healthy backend starts a new engine and returns exact bytes. */
static int test_reap_fails_forever(void)
{
    model m;
    CHECK(model_make(&m, 43) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &m, 0, NULL, 0));
    ckptio_params p = fparams(0);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, &p));
    memset(&W, 0, sizeof W);
    ckptio__backend_wrap = wrap;
    W.fail_from = 2;
    CHECK_ERR(read_one(r, &m, 0), -EIO);
    if (W.live) fprintf(stderr, "the failed read left its engine running, %ld requests out\n",
                        W.outstanding);
    CHECK(W.live == 0);
    CHECK(W.failed <= 2 * CKPTIO__REAP_TRIES);
    W.fail_from = 0;
    for (int i = 0; i < NT; i++) CHECK(read_one(r, &m, i) == 0);
    uint64_t bad = 1;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    CHECK(W.live == 0);
    ckptio__backend_wrap = NULL;
    model_free(&m);
    return leak_check();
}

/* The writer's side: reaping never works again during a save. The save fails with EIO after
 * a bounded number of tries (it used to wait forever in the drain), leaves no temporary
 * directory, and the checkpoint already there still loads. */
static int test_writer_reap_fails_forever(void)
{
    model old, neu;
    CHECK(model_make(&old, 44) == 0 && model_make(&neu, 45) == 0);
    const char *ck = t_path("ck");
    CHECK_OK(save_model(ck, &old, 0, NULL, 0));
    static const unsigned from[] = {1, 3, 8};
    for (size_t k = 0; k < sizeof from / sizeof from[0]; k++) {
        memset(&W, 0, sizeof W);
        ckptio__backend_wrap = wrap;
        W.fail_from = from[k];
        char msg[CKPTIO__MSG_LEN];
        int rc = save_model(ck, &neu, 1, msg, sizeof msg);
        ckptio__backend_wrap = NULL;
        if (!W.failed) continue; /* the save needed fewer reaps */
        CHECK_ERR(rc, -EIO);
        CHECK(t_contains(msg, ck));
        CHECK(W.live == 0);
        CHECK(count_prefix("ck.tmp-") == 0);
        CHECK(load_model(ck, &old) == 0);
        printf("reap failing from call %u: %s\n", from[k], msg);
    }
    model_free(&old);
    model_free(&neu);
    return leak_check();
}

/* ---- verify's count of damaged chunks ---- */

static void short_read(ckptio__req *r)
{
    if (r->op == CKPTIO__OP_READ && r->res > 0) r->res = 0; /* as if the file ended */
}

/* One chunk read by more than 256 requests, every one of which comes back short: verify
 * counts one damaged chunk (a per-chunk byte counter used to wrap and count it twice). */
static int test_verify_count_no_wrap(void)
{
    const uint64_t size = 40ull << 20;
    unsigned char *data = t_alloc(size);
    CHECK(data);
    t_fill(data, size, 46);
    const char *ck = t_path("ck");
    ckptio_params p;
    ckptio_params_init(&p);
    p.request_bytes = 64u << 10; /* also the checksum block: 64 KiB */
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, ck, &p));
    CHECK_OK(ckptio_writer_add(w, "big", CKPTIO_DT_U8, 1, &size, NULL, NULL, data, size));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    /* 128 KiB per request, all 320 of them in flight at once */
    p.queue_depth = 512;
    p.staging_bytes = 64ull << 20;
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, ck, &p));
    ckptio__vfs v = ckptio__vfs_real;
    v.req_done = short_read;
    ckptio__vfs_set(&v);
    uint64_t bad = 0;
    int rc = ckptio_reader_verify(r, &bad);
    ckptio__vfs_set(NULL);
    printf("verify -> %s, %llu bad chunks: %s\n", ckptio_errname(rc), (unsigned long long)bad,
           ckptio_reader_errmsg(r));
    CHECK_ERR(rc, CKPTIO_E_CORRUPT);
    CHECK(bad == 1);
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK(bad == 0);
    ckptio_reader_close(r);
    t_free(data, size);
    return leak_check();
}

/* ckptio_file_read runs its ranges through the read ring with no stand-in checkpoint: a file
 * that comes back short (cut while being read) fails with CKPTIO_E_CORRUPT naming the caller's
 * path, with nothing left in flight, and the next read of it returns exact bytes. */
static int test_file_read_short(void)
{
    const uint64_t len = (3u << 20) + 5;
    unsigned char *want = t_alloc(len), *got = t_alloc(len + 4096);
    CHECK(want && got);
    t_fill(want, len, 48);
    const char *path = t_path("foreign.bin");
    CHECK(t_write_file(path, want, len) == 0);
    /* one aligned range (read in place) and one odd one (staged) */
    ckptio_range rg[2] = {{.size = sizeof(ckptio_range), .offset = 0, .len = 2u << 20, .dst = got},
                          {.size = sizeof(ckptio_range), .offset = (2u << 20) + 3,
                           .len = len - (2u << 20) - 3, .dst = got + (2u << 20) + 3}};
    ckptio_params p = fparams(0);
    p.cache = CKPTIO_CACHE_NEVER; /* the file is resident: make the ring read it */
    ckptio__vfs v = ckptio__vfs_real;
    v.req_done = short_read;
    ckptio__vfs_set(&v);
    memset(&W, 0, sizeof W);
    ckptio__backend_wrap = wrap;
    int rc = ckptio_file_read(path, rg, 2, &p, NULL);
    ckptio__backend_wrap = NULL;
    ckptio__vfs_set(NULL);
    printf("short: %s: %s\n", ckptio_errname(rc), ckptio_last_error());
    CHECK_ERR(rc, CKPTIO_E_CORRUPT);
    CHECK(t_contains(ckptio_last_error(), path));
    CHECK(W.outstanding == 0 && W.live == 0);
    memset(got, 0, len);
    CHECK_OK(ckptio_file_read(path, rg, 2, &p, NULL));
    CHECK(!memcmp(got, want, 2u << 20));
    CHECK(!memcmp(got + (2u << 20) + 3, want + (2u << 20) + 3, len - (2u << 20) - 3));
    t_free(want, len);
    t_free(got, len + 4096);
    return leak_check();
}

const ckptio_test tests_reader_bugs[] = {
    {"reader_bugs/staging_too_large", test_staging_too_large, 0, 30},
    {"reader_bugs/reap_fails_briefly", test_reap_fails_briefly, T_PER_BACKEND, 30},
    {"reader_bugs/reap_fails_forever", test_reap_fails_forever, T_PER_BACKEND, 30},
    {"reader_bugs/writer_reap_fails_forever", test_writer_reap_fails_forever, T_PER_BACKEND, 30},
    {"reader_bugs/verify_count_no_wrap", test_verify_count_no_wrap, T_PER_BACKEND, 60},
    {"reader_bugs/file_read_short", test_file_read_short, T_PER_BACKEND, 30},
    {0},
};
