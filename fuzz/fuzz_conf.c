/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for what credentials and object stores' answers are read with: INI, JSON
 * (GCS listings too), XML, times, header lines. */
#include <stdlib.h>
#include <string.h>

#include "../src/store/conf_parse.h"
#include "../src/store/gcs.h"
#include "../src/store/s3_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) abort();                                                                  \
    } while (0)

/* A result that fits is a string of at most cap - 1 bytes; any result leaves out a string. */
static void check_out(int rc, const char *out, size_t cap)
{
    REQUIRE(rc == 0 || rc == 1 || rc == CKPTIO_E_LIMIT || rc == CKPTIO_E_CORRUPT);
    REQUIRE(memchr(out, 0, cap) != NULL);
    REQUIRE(rc == 1 || out[0] == 0);
}

static void ini(const char *text)
{
    static const char *const sections[] = {"default", "profile dev", "dev", "profile  dev", ""};
    static const char *const keys[] = {"region", "aws_access_key_id", "s3", "credential_process"};
    char out[64], big[4096];
    for (size_t s = 0; s < sizeof sections / sizeof *sections; s++) {
        int has = ckptio__ini_has(text, sections[s]);
        REQUIRE(has == 0 || has == 1);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            int rc = ckptio__ini_get(text, sections[s], keys[k], out, sizeof out);
            check_out(rc, out, sizeof out);
            REQUIRE(rc != CKPTIO_E_CORRUPT && (rc == 0 || has));
            /* what fits in a small buffer is the same in a large one */
            int rc2 = ckptio__ini_get(text, sections[s], keys[k], big, sizeof big);
            REQUIRE(rc2 == rc || (rc == CKPTIO_E_LIMIT && rc2 == 1));
            REQUIRE(rc != 1 || !strcmp(out, big));
            rc = ckptio__ini_sub(text, sections[s], keys[k], "addressing_style", out, sizeof out);
            check_out(rc, out, sizeof out);
            REQUIRE(rc != CKPTIO_E_CORRUPT && (rc == 0 || has));
        }
    }
}

/* raw: exactly len bytes (no NUL after them); text: the same bytes NUL-terminated. */
static void json(const char *raw, size_t len, const char *text)
{
    static const char *const paths[] = {"AccessKeyId", "Expiration", "private_key",
                                        "credential_source.format.type", "expires_in", "a.b.c",
                                        ""};
    char out[64], big[4096];
    int bad = ckptio__json_get(raw, len, "", out, sizeof out) == CKPTIO_E_CORRUPT;
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        int rc = ckptio__json_get(raw, len, paths[i], out, sizeof out);
        check_out(rc, out, sizeof out);
        /* the whole text is checked, whatever is asked of it */
        REQUIRE((rc == CKPTIO_E_CORRUPT) == bad);
        int rc2 = ckptio__json_get(raw, len, paths[i], big, sizeof big);
        check_out(rc2, big, sizeof big);
        REQUIRE(rc2 == rc || (rc == CKPTIO_E_LIMIT && rc2 == 1));
        REQUIRE(rc != 1 || !strcmp(out, big));
        int s = ckptio__json_str(raw, len, paths[i], big, sizeof big);
        check_out(s, big, sizeof big);
        int64_t v = 0;
        int n = ckptio__json_int(raw, len, paths[i], &v);
        REQUIRE(n == 0 || n == 1 || n == CKPTIO_E_CORRUPT);
        /* absent alike, refused alike */
        REQUIRE((s == 0) == (rc2 == 0) && (n == 0) == (rc2 == 0));
        REQUIRE(!bad || (s == CKPTIO_E_CORRUPT && n == CKPTIO_E_CORRUPT));
    }
    /* every member of the top object and of one nested object, in turn */
    for (size_t i = 0; i < 8; i++) {
        char key[32];
        int rc = ckptio__json_member(raw, len, i & 1 ? "credential_source" : NULL, i / 2, key,
                                     sizeof key, out, sizeof out);
        REQUIRE(rc == 0 || rc == 1 || rc == CKPTIO_E_LIMIT || rc == CKPTIO_E_CORRUPT);
        REQUIRE((rc == CKPTIO_E_CORRUPT) == bad);
        check_out(rc, key, sizeof key);
        check_out(rc, out, sizeof out);
    }
    /* escaped text is a string body that decodes back, when the text is UTF-8 */
    char esc[256], doc[300], back[256];
    size_t need = ckptio__json_escape(text, esc, sizeof esc);
    REQUIRE(strlen(esc) == CKPTIO__MIN(need, sizeof esc - 1));
    if (need < sizeof esc) {
        memcpy(doc, "{\"k\":\"", 6);
        memcpy(doc + 6, esc, need);
        memcpy(doc + 6 + need, "\"}", 2);
        int rc = ckptio__json_str(doc, need + 8, "k", back, sizeof back);
        bool utf8 = !*text || ckptio__valid_name(text, strlen(text), SIZE_MAX);
        REQUIRE(rc == (utf8 ? 1 : CKPTIO_E_CORRUPT));
        REQUIRE(!utf8 || !strcmp(back, text));
    }
}

static int list_cb(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    CKPTIO__UNUSED(size);
    CKPTIO__UNUSED(mtime);
    REQUIRE(key[0]);
    return ++*(int *)ctx > 1000 ? 1 : 0;
}

static int uploads_cb(void *ctx, const char *key, const char *upload_id, int64_t initiated)
{
    CKPTIO__UNUSED(upload_id);
    CKPTIO__UNUSED(initiated);
    REQUIRE(key);
    return ++*(int *)ctx > 1000 ? 1 : 0;
}

static int each_cb(void *ctx, const char *v, size_t n)
{
    const char *const *bounds = ctx; /* each element lies inside the text */
    REQUIRE(v >= bounds[0] && v + n <= bounds[1] && n > 0);
    return 0;
}

/* A GCS listing page (JSON), and the arrays GCS answers hold. */
static void gcs_json(const char *raw, size_t len, bool bad)
{
    char token[64];
    int count = 0;
    int rc = ckptio__gcs_parse_list(raw, len, list_cb, &count, token, sizeof token);
    REQUIRE(rc == 0 || rc == 1 || rc == CKPTIO_E_CORRUPT);
    REQUIRE(!bad || rc == CKPTIO_E_CORRUPT);
    REQUIRE(memchr(token, 0, sizeof token));
    const char *bounds[2] = {raw, raw + len};
    static const char *const paths[] = {"items", "error.errors"};
    for (size_t i = 0; i < 2; i++) {
        rc = ckptio__json_each(raw, len, paths[i], each_cb, bounds);
        REQUIRE(rc == 0 || rc == CKPTIO_E_CORRUPT);
        REQUIRE((rc == CKPTIO_E_CORRUPT) == bad);
    }
    rc = ckptio__json_each(raw, len, NULL, each_cb, bounds);
    REQUIRE(rc == 0 || rc == CKPTIO_E_CORRUPT);
}

static void xml(const char *text, size_t len)
{
    char token[256], key[256], id[256], code[64];
    bool truncated;
    int count = 0;
    int rc = ckptio__s3_parse_list(text, len, list_cb, &count, &truncated, token, sizeof token);
    REQUIRE(rc == 0 || rc == 1 || rc == CKPTIO_E_CORRUPT);
    REQUIRE(rc != 0 || memchr(token, 0, sizeof token));
    count = 0;
    rc = ckptio__s3_parse_uploads(text, len, uploads_cb, &count, &truncated, key, id, sizeof key);
    REQUIRE(rc == 0 || rc == 1 || rc == CKPTIO_E_CORRUPT);
    ckptio__s3_parse_error(text, len, code, sizeof code);
    REQUIRE(memchr(code, 0, sizeof code));
    /* every element named Key, decoded */
    const char *p = text, *end = text + len, *vb, *ve;
    for (int i = 0; i < 1000 && (p = ckptio__xml_next(p, end, "Key", &vb, &ve)); i++) {
        REQUIRE(vb >= text && vb <= ve && ve <= end && p <= end);
        int n = ckptio__xml_text(vb, ve, key, sizeof key);
        REQUIRE(n == -1 || (n >= 0 && (size_t)n < sizeof key && key[n] == 0 &&
                            strlen(key) == (size_t)n)); /* a raw NUL inside is refused */
    }
}

/* The first byte picks the reader; the rest is its input, NUL-terminated in a private copy of
 * exactly size bytes (so a sanitizer flags any read past it) where a string is read. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned pick = data[0] % 4;
    size_t n = size - 1;
    char *text = malloc(n + 1);
    REQUIRE(text);
    memcpy(text, data + 1, n);
    text[n] = 0;
    int64_t t;
    switch (pick) {
    case 0:
        ini(text);
        break;
    case 1: {
        char *raw = malloc(n ? n : 1);
        REQUIRE(raw);
        memcpy(raw, text, n);
        json(raw, n, text);
        char probe[1];
        gcs_json(raw, n, ckptio__json_get(raw, n, "x", probe, 0) == CKPTIO_E_CORRUPT);
        free(raw);
        break;
    }
    case 2:
        xml(text, n);
        break;
    default: {
        int a = ckptio__time_iso(text, &t), b = ckptio__time_http(text, &t);
        REQUIRE((a == 0 || a == CKPTIO_E_CORRUPT) && (b == 0 || b == CKPTIO_E_CORRUPT));
        /* and each line as a line of an answer's head, as libcurl hands them over */
        ckptio__obj_resp r = {0};
        for (size_t at = 0; at < n;) {
            const char *nl = memchr(data + 1 + at, '\n', n - at);
            size_t l = nl ? (size_t)(nl - (const char *)(data + 1 + at)) + 1 : n - at;
            char *line = malloc(l ? l : 1); /* exactly the line: a read past it is flagged */
            REQUIRE(line);
            memcpy(line, data + 1 + at, l);
            ckptio__http_header(line, l, &r, at & 1);
            free(line);
            REQUIRE(memchr(r.etag, 0, sizeof r.etag) && memchr(r.code, 0, sizeof r.code));
            REQUIRE(r.status >= 0 && r.status <= 999);
            at += l;
        }
        break;
    }
    }
    free(text);
    return 0;
}
