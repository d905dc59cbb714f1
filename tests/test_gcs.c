/* SPDX-License-Identifier: Apache-2.0 */
/* The GCS client (gcs.c): its JSON readers, its requests against a scripted server (tokens, the
 * answers it retries and the ones it refuses), and against a live emulator (gcs/live_*). */
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../src/store/conf_parse.h"
#include "fake_http.h"
#include "s3_live.h"
#include "test.h"

#define N_OF(a) (sizeof(a) / sizeof *(a))

typedef struct seen {
    char names[8][128];
    uint64_t sizes[8];
    int64_t mtimes[8];
    int n, stop_at;
} seen;

static int on_obj(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    seen *s = ctx;
    if (s->n < 8) {
        snprintf(s->names[s->n], sizeof s->names[0], "%s", key);
        s->sizes[s->n] = size;
        s->mtimes[s->n] = mtime;
    }
    return ++s->n == s->stop_at ? 7 : 0;
}

/* A page of objects.list: names decoded, sizes as GCS sends them (strings), updated times with
 * microseconds, the next page's token; an empty page; what is not a listing. */
static int test_parse_list(void)
{
    static const char page[] =
        "{\"kind\":\"storage#objects\",\"nextPageToken\":\"CgNh\\u0062Yw==\",\"items\":["
        "{\"name\":\"ck/a b\\/\\u00fc\",\"size\":\"12\",\"updated\":\"2026-12-07T07:58:45.958604Z\"},"
        "{\"kind\":\"storage#object\",\"name\":\"ck/m\",\"size\":0,\"bucket\":\"b\"}]}";
    seen s = {0};
    char token[64];
    CHECK_OK(ckptio__gcs_parse_list(page, sizeof page - 1, on_obj, &s, token, sizeof token));
    CHECK(s.n == 2 && !strcmp(s.names[0], "ck/a b/\xc3\xbc") && s.sizes[0] == 12);
    CHECK(s.mtimes[0] == 1796630325 && !strcmp(s.names[1], "ck/m") && s.sizes[1] == 0 &&
          s.mtimes[1] == 0);
    CHECK(!strcmp(token, "CgNhbYw=="));

    static const char empty[] = "{\"kind\":\"storage#objects\"}";
    s = (seen){0};
    strcpy(token, "stale");
    CHECK_OK(ckptio__gcs_parse_list(empty, sizeof empty - 1, on_obj, &s, token, sizeof token));
    CHECK(s.n == 0 && token[0] == 0);

    s = (seen){.stop_at = 1};
    CHECK(ckptio__gcs_parse_list(page, sizeof page - 1, on_obj, &s, token, sizeof token) == 7);
    CHECK(s.n == 1);

    static const char *const bad[] = {
        "{\"items\":[{\"size\":\"1\"}]}",                 /* no name */
        "{\"items\":[{\"name\":\"\",\"size\":0}]}",       /* an empty name */
        "{\"items\":[{\"name\":\"a\",\"size\":\"x\"}]}",  /* a size that is no number */
        "{\"items\":[{\"name\":\"a\",\"size\":\"-1\"}]}", /* a negative size */
        "{\"items\":[{\"name\":\"a\",\"size\":1}",        /* cut */
        "[]",
        "{\"items\":[],\"nextPageToken\":\"\\ud800\"}", /* an unpaired surrogate */
    };
    for (size_t i = 0; i < N_OF(bad); i++) {
        s = (seen){0};
        CHECK_ERR(ckptio__gcs_parse_list(bad[i], strlen(bad[i]), on_obj, &s, token, sizeof token),
                  CKPTIO_E_CORRUPT);
    }
    return 0;
}

typedef struct spans {
    char v[4][64];
    int n;
} spans;

static int on_elem(void *ctx, const char *v, size_t n)
{
    spans *s = ctx;
    if (s->n < 4) snprintf(s->v[s->n], sizeof s->v[0], "%.*s", (int)n, v);
    s->n++;
    return 0;
}

/* Arrays' elements, each once, as their raw text: at a path, at the top, nested, absent. */
static int test_json_each(void)
{
    static const char t[] = "{\"a\":{\"b\":[1, \"x,]\", {\"c\":[2]} ,[]]},\"e\":[],\"s\":\"[\"}";
    spans s = {0};
    CHECK_OK(ckptio__json_each(t, sizeof t - 1, "a.b", on_elem, &s));
    CHECK(s.n == 4 && !strcmp(s.v[0], "1") && !strcmp(s.v[1], "\"x,]\"") &&
          !strcmp(s.v[2], "{\"c\":[2]}") && !strcmp(s.v[3], "[]"));
    s = (spans){0};
    CHECK_OK(ckptio__json_each(t, sizeof t - 1, "e", on_elem, &s));
    CHECK(s.n == 0);
    CHECK_OK(ckptio__json_each(t, sizeof t - 1, "s", on_elem, &s)); /* a string: no array */
    CHECK_OK(ckptio__json_each(t, sizeof t - 1, "nope", on_elem, &s));
    CHECK(s.n == 0);
    static const char top[] = " [ {\"k\":1}, 2 ] ";
    CHECK_OK(ckptio__json_each(top, sizeof top - 1, NULL, on_elem, &s));
    CHECK(s.n == 2 && !strcmp(s.v[0], "{\"k\":1}"));
    CHECK_ERR(ckptio__json_each("[1,]", 4, NULL, on_elem, &s), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__json_each("{\"a\":[1}", 8, "a", on_elem, &s), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__json_each("[1] x", 5, NULL, on_elem, &s), CKPTIO_E_CORRUPT);
    return 0;
}

/* ---- against a scripted server ---- */

/* No Google setting from the caller's environment; no gcloud file; no metadata server. */
static void env_clear(void)
{
    static const char *const vars[] = {"GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG",
                                       "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
                                       "GCE_METADATA_IP"};
    for (size_t i = 0; i < N_OF(vars); i++) unsetenv(vars[i]);
    setenv("HOME", t_dir(), 1);
    setenv("NO_GCE_CHECK", "true", 1);
}

/* A client for the scripted store f, with the settings o (may be NULL; endpoint_url is set). */
static int client_at(ckptio__objc **c, const fake *f, ckptio_store_opts *o)
{
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", f->port);
    CHECK_OK(ckptio_store_opts_set(o, "endpoint_url", ep));
    CHECK_OK(ckptio__gcs_client(c, o, NULL));
    return 0;
}

#define OBJECT_JSON(gen)                                                                       \
    "{\"kind\":\"storage#object\",\"name\":\"k/m\",\"size\":\"5\",\"generation\":\"" gen      \
    "\",\"updated\":\"2026-12-07T07:58:45Z\"}"

/* Tokens from the metadata server: a 401 gets a new one and the request is sent again at once;
 * 503 and 429 are retried; the request's form (JSON API paths, the name encoded whole). */
static int test_token_refresh(void)
{
    static const fake_reply meta[] = {
        {FAKE_REPLY, 200, "{\"access_token\": \"ya29.one\", \"expires_in\": 3599}"},
        {FAKE_REPLY, 200, "{\"access_token\": \"ya29.two\", \"expires_in\": 3599}"},
    };
    static const fake_reply store[] = {
        {FAKE_REPLY, 401,
         "{\"error\":{\"code\":401,\"message\":\"Invalid Credentials\",\"errors\":[{\"domain\":"
         "\"global\",\"reason\":\"authError\",\"message\":\"Invalid Credentials\"}]}}"},
        {FAKE_REPLY, 503, "{\"error\":{\"code\":503,\"message\":\"Backend Error\"}}"},
        {FAKE_REPLY, 429, ""},
        {FAKE_REPLY, 200, OBJECT_JSON("1796630325958634")},
    };
    env_clear();
    unsetenv("NO_GCE_CHECK");
    fake m, f;
    CHECK(fake_listen(&m, meta, N_OF(meta), "Metadata-Flavor: Google\r\n") == 0);
    CHECK(fake_listen(&f, store, N_OF(store), NULL) == 0);
    char host[64];
    snprintf(host, sizeof host, "127.0.0.1:%d", m.port);
    setenv("GCE_METADATA_HOST", host, 1);
    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    ckptio__objc *c;
    CHECK(client_at(&c, &f, o) == 0);
    ckptio__obj_resp r;
    CHECK_OK(ckptio__obj_head(c, "bkt", "k/a b+ü", &r, NULL));
    CHECK(r.size == 5 && !strcmp(r.etag, "1796630325958634") && r.mtime == 1796630325);
    CHECK(fake_count(&m) == 2 && fake_count(&f) == 4);
    CHECK(t_contains(f.lines[0], "GET /storage/v1/b/bkt/o/k%2Fa%20b%2B%C3%BC?fields="));
    CHECK(t_contains(f.heads[0], "\r\nAuthorization: Bearer ya29.one\r\n"));
    for (int i = 1; i < 4; i++) CHECK(t_contains(f.heads[i], "\r\nAuthorization: Bearer ya29.two\r\n"));
    ckptio_store_opts_free(o);
    unsetenv("GCE_METADATA_HOST");
    setenv("NO_GCE_CHECK", "true", 1);
    return 0;
}

/* What the store refuses, and what each refusal says: a static token refused (401: it cannot
 * be renewed), 403, a missing bucket on an upload and on a listing, a missing object, a failed
 * precondition; the precondition's form (a multipart upload with ifGenerationMatch). */
static int test_refusals(void)
{
    static const fake_reply store[] = {
        {FAKE_REPLY, 401, "{\"error\":{\"code\":401,\"errors\":[{\"reason\":\"authError\"}]}}"},
        {FAKE_REPLY, 403, "{\"error\":{\"code\":403,\"errors\":[{\"reason\":\"forbidden\"}]}}"},
        {FAKE_REPLY, 404, "{\"error\":{\"code\":404,\"errors\":[{\"reason\":\"notFound\"}]}}"},
        {FAKE_REPLY, 404, "{\"error\":{\"code\":404,\"errors\":[{\"reason\":\"notFound\"}]}}"},
        {FAKE_REPLY, 404, "Not Found"},
        {FAKE_REPLY, 412,
         "{\"error\":{\"code\":412,\"errors\":[{\"reason\":\"conditionNotMet\"}]}}"},
        {FAKE_REPLY, 200, ""}, /* a DELETE answered 200 with a body of "null" or nothing */
    };
    env_clear();
    fake f;
    CHECK(fake_listen(&f, store, N_OF(store), NULL) == 0);
    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    CHECK_OK(ckptio_store_opts_set(o, "token", "ya29.given"));
    ckptio__objc *c;
    CHECK(client_at(&c, &f, o) == 0);
    ckptio__obj_resp r;
    uint8_t *buf;
    uint64_t len;
    CHECK_ERR(ckptio__obj_head(c, "bkt", "k", &r, NULL), -EACCES);
    CHECK(t_contains(ckptio_last_error(), "gs://bkt/k: HEAD failed: HTTP 401 authError") &&
          t_contains(ckptio_last_error(), "refused the token (from the store's settings"));
    CHECK_ERR(ckptio__obj_get_all(c, "bkt", "k", 100, &buf, &len, NULL, NULL), -EACCES);
    CHECK(t_contains(ckptio_last_error(), "403 forbidden") &&
          t_contains(ckptio_last_error(), "IAM policy"));
    CHECK_ERR(ckptio__obj_put(c, "bkt", "k", "abc", 3, NULL, NULL, NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "the bucket does not exist"));
    CHECK_ERR(ckptio__obj_list(c, "bkt", "k/", on_obj, &(seen){0}, NULL), -ENOENT);
    CHECK_ERR(ckptio__obj_get_all(c, "bkt", "k", 100, &buf, &len, NULL, NULL),
              CKPTIO_E_NOT_FOUND);
    CHECK_ERR(ckptio__obj_put(c, "bkt", "k/man", "abc", 3, "1796", NULL, NULL), CKPTIO_E_EXISTS);
    CHECK(t_contains(ckptio_last_error(), "another writer created or replaced"));
    CHECK_OK(ckptio__obj_delete(c, "bkt", "k", NULL));
    CHECK(fake_count(&f) == 7);
    CHECK(t_contains(f.lines[2], "POST /upload/storage/v1/b/bkt/o?name=k&uploadType=media "));
    CHECK(t_contains(f.lines[3], "GET /storage/v1/b/bkt/o?fields="));
    CHECK(t_contains(f.lines[5], "POST /upload/storage/v1/b/bkt/o?ifGenerationMatch=1796&"
                                 "name=k%2Fman&uploadType=multipart "));
    CHECK(t_contains(f.heads[5], "Content-Type: multipart/related; boundary=ckptio-"));
    CHECK(t_contains(f.bodies[5], "{\"name\":\"k/man\"}") && t_contains(f.bodies[5], "\r\nabc\r\n--"));
    CHECK(t_contains(f.lines[6], "DELETE /storage/v1/b/bkt/o/k "));
    ckptio_store_opts_free(o);
    return 0;
}

/* A store that has never answered fails within CKPTIO_GCS_FIRST_TIMEOUT, naming the endpoint
 * and what sets it; an endpoint that is no URL is refused at once. */
static int test_unreachable(void)
{
    env_clear();
    setenv("CKPTIO_GCS_FIRST_TIMEOUT", "1", 1);
    setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1", 1);
    ckptio__objc *c;
    CHECK_OK(ckptio__gcs_client(&c, NULL, NULL));
    CHECK(!strcmp(ckptio__obj_endpoint(c), "http://127.0.0.1:1"));
    double t0 = ckptio__now();
    ckptio__obj_resp r;
    CHECK_ERR(ckptio__obj_head(c, "b", "k", &r, NULL), -ECONNREFUSED);
    CHECK(ckptio__now() - t0 < 5);
    CHECK(t_contains(ckptio_last_error(), "cannot reach http://127.0.0.1:1") &&
          t_contains(ckptio_last_error(), "STORAGE_EMULATOR_HOST") &&
          t_contains(ckptio_last_error(), "CKPTIO_GCS_FIRST_TIMEOUT"));
    unsetenv("CKPTIO_GCS_FIRST_TIMEOUT");
    setenv("STORAGE_EMULATOR_HOST", "ftp://x/y", 1);
    CHECK_ERR(ckptio__gcs_client(&c, NULL, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "STORAGE_EMULATOR_HOST 'ftp://x/y'"));
    unsetenv("STORAGE_EMULATOR_HOST");
    return 0;
}

/* ---- against a live emulator ---- */

/* Objects: conditional writes by generation, whole and ranged reads, metadata, deletes. */
static int test_live_objects(void)
{
    GCS_LIVE(c, p, b);
    ckptio__obj_resp r1, r2, h;
    CHECK_OK(ckptio__obj_put(c, b, k(p, "m"), "hello", 5, "*", &r1, NULL));
    CHECK(r1.etag[0] && r1.size == 5);
    CHECK_ERR(ckptio__obj_put(c, b, k(p, "m"), "again", 5, "*", NULL, NULL), CKPTIO_E_EXISTS);
    CHECK_OK(ckptio__obj_put(c, b, k(p, "m"), "world!", 6, r1.etag, &r2, NULL));
    CHECK(strcmp(r1.etag, r2.etag));
    CHECK_ERR(ckptio__obj_put(c, b, k(p, "m"), "stale", 5, r1.etag, NULL, NULL), CKPTIO_E_EXISTS);
    uint8_t *buf;
    uint64_t len;
    ckptio__obj_resp g;
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "m"), 100, &buf, &len, &g, NULL));
    CHECK(len == 6 && !memcmp(buf, "world!", 6) && !strcmp(g.etag, r2.etag) && g.mtime > 0);
    free(buf);
    CHECK_ERR(ckptio__obj_get_all(c, b, k(p, "m"), 3, &buf, &len, NULL, NULL), CKPTIO_E_LIMIT);
    CHECK_OK(ckptio__obj_head(c, b, k(p, "m"), &h, NULL));
    CHECK(h.size == 6 && !strcmp(h.etag, r2.etag) && h.mtime > 0 && h.date > 0);
    char part[8] = {0};
    uint64_t got;
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "m"), 2, 3, part, &got, NULL));
    CHECK(got == 3 && !memcmp(part, "rld", 3));
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "m"), 4, 8, part, &got, NULL));
    CHECK(got == 2 && !memcmp(part, "d!", 2));
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "m"), 6, 8, part, &got, NULL));
    CHECK(got == 0);
    CHECK_OK(ckptio__obj_put(c, b, k(p, "empty"), "", 0, NULL, NULL, NULL));
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "empty"), 100, &buf, &len, NULL, NULL));
    CHECK(len == 0);
    free(buf);
    CHECK_OK(ckptio__obj_put(c, b, k(p, "d/a b+%ü"), "x", 1, NULL, NULL, NULL));
    seen s = {0};
    CHECK_OK(ckptio__obj_list(c, b, k(p, ""), on_obj, &s, NULL));
    CHECK(s.n == 3 && t_contains(s.names[0], "/d/a b+%\xc3\xbc") && s.sizes[1] == 0 &&
          t_contains(s.names[2], "/m") && s.sizes[2] == 6);
    CHECK_OK(ckptio__obj_delete(c, b, k(p, "m"), NULL));
    CHECK_OK(ckptio__obj_delete(c, b, k(p, "m"), NULL)); /* missing: success */
    CHECK_ERR(ckptio__obj_head(c, b, k(p, "m"), &h, NULL), CKPTIO_E_NOT_FOUND);
    CHECK(h.date > 0);
    CHECK_ERR(ckptio__obj_put(c, "no-such-bucket-ckptio", "k", "x", 1, NULL, NULL, NULL), -ENOENT);
    return 0;
}

/* An upload of 70 parts: a tree of composes (32 sources at most each), the object whole and in
 * order, no part left; an aborted upload leaves nothing. */
static int test_live_compose(void)
{
    GCS_LIVE(c, p, b);
    enum { N = 70, PART = 1000 };
    uint8_t *data = malloc(N * PART);
    CHECK(data);
    t_fill(data, N * PART, 7);
    char *id;
    char(*tags)[128] = calloc(N, 128);
    CHECK(tags);
    CHECK_OK(ckptio__obj_mpu_create(c, b, k(p, "big"), &id, NULL));
    for (int i = N; i-- > 0;) /* any order */
        CHECK_OK(ckptio__obj_mpu_part(c, b, k(p, "big"), id, (unsigned)i + 1, data + i * PART,
                                      i == N - 1 ? PART / 2 : PART, tags[i], NULL));
    CHECK_OK(ckptio__obj_mpu_complete(c, b, k(p, "big"), id, tags, N, NULL));
    free(id);
    uint8_t *buf;
    uint64_t len;
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "big"), 1u << 20, &buf, &len, NULL, NULL));
    CHECK(len == (N - 1) * PART + PART / 2 && !memcmp(buf, data, len));
    free(buf);
    seen s = {0};
    CHECK_OK(ckptio__obj_list(c, b, k(p, ""), on_obj, &s, NULL));
    CHECK(s.n == 1 && t_contains(s.names[0], "/big"));

    CHECK_OK(ckptio__obj_mpu_create(c, b, k(p, "gone"), &id, NULL));
    for (unsigned i = 0; i < 3; i++)
        CHECK_OK(ckptio__obj_mpu_part(c, b, k(p, "gone"), id, i + 1, data, PART, tags[i], NULL));
    CHECK_OK(ckptio__obj_mpu_abort(c, b, k(p, "gone"), id, NULL));
    free(id);
    s = (seen){0};
    CHECK_OK(ckptio__obj_list(c, b, k(p, ""), on_obj, &s, NULL));
    CHECK(s.n == 1);
    free(tags);
    free(data);
    return 0;
}

const ckptio_test tests_gcs[] = {
    {"gcs/parse_list", test_parse_list, 0, 0},
    {"gcs/json_each", test_json_each, 0, 0},
    {"gcs/token_refresh", test_token_refresh, 0, 30},
    {"gcs/refusals", test_refusals, 0, 30},
    {"gcs/unreachable", test_unreachable, 0, 30},
    {"gcs/live_objects", test_live_objects, 0, 120},
    {"gcs/live_compose", test_live_compose, 0, 120},
    {0},
};
