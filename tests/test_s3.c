/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the S3 client: AWS's SigV4 examples, URLs, XML, times, retries, and a live store. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/io/vfd.h"
#include "../src/store/aws_creds.h"
#include "../src/store/s3_impl.h"
#include "fake_http.h"
#include "s3_live.h"
#include "test.h"

#define MIB (1ull << 20)

/* AWS's documented SigV4 examples for S3 (the "GET /test.txt" object with a Range, a ?lifecycle
 * bucket request and a ListObjects with two parameters), all on 20130524 with the example keys. */
static int test_sigv4(void)
{
    static const char *empty =
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    char auth[CKPTIO__S3_AUTH_MAX], hex[65];
    ckptio__s3_sha256_hex("", 0, hex);
    CHECK(!strcmp(hex, empty));

    ckptio__kv h[4] = {{"x-amz-date", "20130524T000000Z"},
                          {"range", "bytes=0-9"},
                          {"host", "examplebucket.s3.amazonaws.com"},
                          {"x-amz-content-sha256", empty}};
    ckptio__s3_sig_in in = {"GET", "/test.txt", NULL, 0, h, 4, empty, "20130524T000000Z",
                            "us-east-1", "AKIAIOSFODNN7EXAMPLE",
                            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL};
    CHECK_OK(ckptio__s3_sign(&in, auth));
    printf("%s\n", auth);
    CHECK(!strcmp(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                        "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));

    ckptio__kv h3[3] = {{"host", "examplebucket.s3.amazonaws.com"},
                           {"x-amz-date", "20130524T000000Z"},
                           {"x-amz-content-sha256", empty}};
    ckptio__kv lifecycle[1] = {{"lifecycle", ""}};
    in = (ckptio__s3_sig_in){"GET", "/", lifecycle, 1, h3, 3, empty, "20130524T000000Z",
                             "us-east-1", "AKIAIOSFODNN7EXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL};
    CHECK_OK(ckptio__s3_sign(&in, auth));
    CHECK(t_contains(auth, "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"));

    ckptio__kv list[2] = {{"prefix", "J"}, {"max-keys", "2"}}; /* sorted by the signer */
    in.query = list;
    in.nq = 2;
    CHECK_OK(ckptio__s3_sign(&in, auth));
    CHECK(t_contains(auth, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));

    /* What curl's own signer gets wrong: a bare "?uploads" and a '/' inside a value. */
    ckptio__kv q[3] = {{"uploads", ""}, {"prefix", "a/b c"}, {"key-marker", "~x"}};
    char *s = ckptio__uri_query(q, 3);
    CHECK(s && !strcmp(s, "key-marker=~x&prefix=a%2Fb%20c&uploads="));
    free(s);
    s = ckptio__uri_encode("dir/a+b=c&d é", true);
    CHECK(s && !strcmp(s, "dir/a%2Bb%3Dc%26d%20%C3%A9"));
    free(s);
    return 0;
}

static int test_url(void)
{
    char *b, *k;
    CHECK(ckptio__objc_for("s3://b/k") && !ckptio__objc_for("/tmp/x"));
    CHECK(!ckptio__objc_for(NULL));
    CHECK_OK(ckptio__obj_parse(&ckptio__s3_objc, "s3://my-bucket.1/ckpt/step-10//", &b, &k, NULL));
    CHECK(!strcmp(b, "my-bucket.1") && !strcmp(k, "ckpt/step-10"));
    free(b);
    free(k);
    CHECK_OK(ckptio__obj_parse(&ckptio__s3_objc, "s3://b/k", &b, &k, NULL));
    CHECK(!strcmp(b, "b") && !strcmp(k, "k"));
    free(b);
    free(k);
    static const char *bad[] = {"s3://", "s3://b", "s3://b/", "s3:///k", "s3://b//k", "s3://b/a//c",
                                "s3://b@d/k", "s3://b c/k", "file:///x", "s3:/b/k"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ERR(ckptio__obj_parse(&ckptio__s3_objc, bad[i], &b, &k, NULL), CKPTIO_E_USAGE);
        CHECK(!b && !k);
    }
    return 0;
}

typedef struct seen {
    char keys[8][64];
    uint64_t sizes[8];
    int64_t times[8];
    unsigned n;
} seen;

static int on_key(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    seen *s = ctx;
    if (s->n >= 8) return -1;
    snprintf(s->keys[s->n], 64, "%s", key);
    s->sizes[s->n] = size;
    s->times[s->n++] = mtime;
    return 0;
}

static int on_upload(void *ctx, const char *key, const char *id, int64_t initiated)
{
    seen *s = ctx;
    if (s->n >= 8) return -1;
    snprintf(s->keys[s->n], 64, "%s|%s", key, id);
    s->times[s->n++] = initiated;
    return 0;
}

static int stop_at_second(void *ctx, const char *key, uint64_t size, int64_t mtime)
{
    (void)key, (void)size, (void)mtime;
    return ++*(int *)ctx == 2 ? 42 : 0;
}

static const char page1[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
    "<Prefix>ck/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>"
    "<IsTruncated>true</IsTruncated>"
    "<Contents><Key>ck/a&amp;b&lt;&#233;&#x41;</Key><LastModified>2009-10-12T17:50:30.000Z"
    "</LastModified><ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag><Size>434234</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>ck/manifest</Key><LastModified>2026-01-01T00:00:00Z</LastModified>"
    "<Size>0</Size></Contents>"
    "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
    "</ListBucketResult>";
static const char page2[] =
    "<ListBucketResult><Name>b</Name><Prefix>ck/</Prefix><KeyCount>1</KeyCount>"
    "<IsTruncated>false</IsTruncated><Contents><Key>ck/z</Key><Size>18446744073709551615</Size>"
    "</Contents><ContinuationToken>x</ContinuationToken></ListBucketResult>";

static int test_xml(void)
{
    seen s = {0};
    bool more = false;
    char token[256];
    CHECK_OK(ckptio__s3_parse_list(page1, strlen(page1), on_key, &s, &more, token, sizeof token));
    CHECK(more && !strcmp(token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="));
    CHECK(s.n == 2 && !strcmp(s.keys[0], "ck/a&b<\xc3\xa9" "A") && s.sizes[0] == 434234);
    CHECK(s.times[0] == 1255369830 && !strcmp(s.keys[1], "ck/manifest") && s.times[1] == 1767225600);
    CHECK_OK(ckptio__s3_parse_list(page2, strlen(page2), on_key, &s, &more, token, sizeof token));
    CHECK(!more && !token[0] && s.n == 3 && s.sizes[2] == UINT64_MAX);
    int count = 0;
    CHECK(ckptio__s3_parse_list(page1, strlen(page1), stop_at_second, &count, &more, token,
                                sizeof token) == 42);
    static const char empty[] = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
    s.n = 0;
    CHECK_OK(ckptio__s3_parse_list(empty, strlen(empty), on_key, &s, &more, token, sizeof token));
    CHECK(s.n == 0 && !more);
    static const char broken[] = "<ListBucketResult><Contents><Size>1</Size></Contents>";
    CHECK_ERR(ckptio__s3_parse_list(broken, strlen(broken), on_key, &s, &more, token, sizeof token),
              CKPTIO_E_CORRUPT);

    static const char uploads[] =
        "<ListMultipartUploadsResult><Bucket>b</Bucket><KeyMarker></KeyMarker>"
        "<UploadIdMarker/><NextKeyMarker>ck/d1</NextKeyMarker>"
        "<NextUploadIdMarker>VXBsb2FkIElE</NextUploadIdMarker><MaxUploads>2</MaxUploads>"
        "<IsTruncated>true</IsTruncated>"
        "<Upload><Key>ck/d0</Key><UploadId>abc</UploadId><Initiator><ID>x</ID></Initiator>"
        "<Initiated>2010-11-10T20:48:33.000Z</Initiated></Upload>"
        "<Upload><Key>ck/d1</Key><UploadId>VXBsb2FkIElE</UploadId>"
        "<Initiated>2010-11-10T20:49:33.000Z</Initiated></Upload></ListMultipartUploadsResult>";
    char nk[128], ni[128];
    s.n = 0;
    CHECK_OK(ckptio__s3_parse_uploads(uploads, strlen(uploads), on_upload, &s, &more, nk, ni,
                                      sizeof nk));
    CHECK(s.n == 2 && !strcmp(s.keys[0], "ck/d0|abc") && !strcmp(s.keys[1], "ck/d1|VXBsb2FkIElE"));
    CHECK(s.times[0] == 1289422113 && more && !strcmp(nk, "ck/d1") && !strcmp(ni, "VXBsb2FkIElE"));

    static const char err[] =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchBucket</Code>"
        "<Message>The specified bucket does not exist</Message><BucketName>nb</BucketName>"
        "</Error>";
    char code[64];
    ckptio__s3_parse_error(err, strlen(err), code, sizeof code);
    CHECK(!strcmp(code, "NoSuchBucket"));
    ckptio__s3_parse_error("<html>oops</html>", 17, code, sizeof code);
    CHECK(!code[0]);
    ckptio__s3_parse_error(err, 30, code, sizeof code); /* cut short */
    CHECK(!code[0]);

    /* [text, text + strlen(text)) of one string object: two equal literals need not be one. */
    char out[8];
#define XML_TEXT(text) ckptio__xml_text(text, &text[strlen(text)], out, sizeof out)
    CHECK(XML_TEXT("a&amp;b") == 3 && !strcmp(out, "a&b"));
    CHECK(XML_TEXT("&bogus;") == -1);
    CHECK(XML_TEXT("&#0;") == -1);
    CHECK(XML_TEXT("&#x1F600;&#x20AC;") == 7);
    CHECK(!strcmp(out, "\xF0\x9F\x98\x80\xE2\x82\xAC"));
    CHECK(XML_TEXT("&#xD800;") == -1);
    CHECK(XML_TEXT("&amp") == -1);
    CHECK(XML_TEXT("12345678") == -1);
#undef XML_TEXT
    return 0;
}

static int test_times(void)
{
    int64_t t = 0;
    CHECK_OK(ckptio__time_iso("2009-10-12T17:50:30.000Z", &t));
    CHECK(t == 1255369830);
    CHECK_OK(ckptio__time_iso("1970-01-01T00:00:00Z", &t));
    CHECK(t == 0);
    CHECK_OK(ckptio__time_http("Mon, 12 Oct 2009 17:50:30 GMT", &t));
    CHECK(t == 1255369830);
    CHECK_OK(ckptio__time_http("Thu, 29 Feb 2024 23:59:59 GMT", &t));
    CHECK(t == 1709251199);
    static const char *bad_iso[] = {"", "2009-10-12", "2009-13-12T00:00:00Z", "x",
                                    "2009-10-12T17:50:30+02:00"};
    for (size_t i = 0; i < sizeof bad_iso / sizeof bad_iso[0]; i++)
        CHECK_ERR(ckptio__time_iso(bad_iso[i], &t), CKPTIO_E_CORRUPT);
    static const char *bad_http[] = {"", "Mon 12 Oct 2009 17:50:30 GMT",
                                     "Mon, 12 Foo 2009 17:50:30 GMT",
                                     "Mon, 12 Oct 2009 17:50:30 PST",
                                     "Mon, 12 ctN 2009 17:50:30 GMT"};
    for (size_t i = 0; i < sizeof bad_http / sizeof bad_http[0]; i++)
        CHECK_ERR(ckptio__time_http(bad_http[i], &t), CKPTIO_E_CORRUPT);
    return 0;
}


/* ---- against a scripted server (fake_http.h) ---- */

/* Start the server and point a fresh client at it (stall 1 s, deadline timeout_s). */
static int fake_start(fake *f, const fake_reply *script, unsigned n, const char *timeout_s,
                      ckptio__objc **c)
{
    CHECK(fake_listen(f, script, n, NULL) == 0);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", f->port);
    setenv("AWS_ENDPOINT_URL", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", "ak", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "sk", 1);
    setenv("CKPTIO_S3_STALL", "1", 1);
    setenv("CKPTIO_S3_TIMEOUT", timeout_s, 1);
    CHECK_OK(ckptio__s3_client(c, NULL, NULL));
    return 0;
}

#define ERR_XML(code) "<?xml version=\"1.0\"?><Error><Code>" code "</Code></Error>"

static int test_retries(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 503, ERR_XML("SlowDown")}, {FAKE_REPLY, 500, ERR_XML("InternalError")},
        {FAKE_RESET, 0, NULL},                  {FAKE_REPLY, 409, ERR_XML("ConditionalRequestConflict")},
        {FAKE_REPLY, 400, ERR_XML("RequestTimeout")}, {FAKE_REPLY, 429, NULL},
        {FAKE_REPLY, 200, NULL},
        {FAKE_REPLY, 412, ERR_XML("PreconditionFailed")}, /* the next put: no retry */
        {FAKE_REPLY, 403, ERR_XML("SignatureDoesNotMatch")},
        {FAKE_REPLY, 404, ERR_XML("NoSuchBucket")},
        {FAKE_REPLY, 400, ERR_XML("InvalidArgument")},
    };
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, sizeof script / sizeof script[0], "30", &c)) return 1;
    ckptio__obj_resp r;
    CHECK_OK(ckptio__obj_put(c, "b", "k", "data", 4, NULL, &r, NULL));
    CHECK(f.next == 7 && !strcmp(r.etag, "\"e6\"") && r.date == 1255369830);
    CHECK(!strcmp(f.lines[0], "PUT /b/k HTTP/1.1"));
    CHECK_ERR(ckptio__obj_put(c, "b", "k", "data", 4, "*", NULL, NULL), CKPTIO_E_EXISTS);
    CHECK(f.next == 8 && t_contains(ckptio_last_error(), "s3://b/k"));
    CHECK_ERR(ckptio__obj_put(c, "b", "k", "d", 1, NULL, NULL, NULL), -EACCES);
    CHECK(t_contains(ckptio_last_error(), "403 SignatureDoesNotMatch") &&
          t_contains(ckptio_last_error(), "AWS_SECRET_ACCESS_KEY"));
    CHECK_ERR(ckptio__obj_delete(c, "nb", "k", NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "s3://nb/k") && t_contains(ckptio_last_error(), "create it"));
    CHECK_ERR(ckptio__obj_head(c, "b", "k", NULL, NULL), -EIO);
    CHECK(f.next == 11);
    return 0;
}

static int test_deadline(void)
{
    static const fake_reply script[] = {{FAKE_REPLY, 503, ERR_XML("SlowDown")}};
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, 1, "1.5", &c)) return 1;
    double t0 = ckptio__now();
    CHECK_ERR(ckptio__obj_put(c, "b", "k", "data", 4, NULL, NULL, NULL), -ETIMEDOUT);
    double dt = ckptio__now() - t0;
    printf("%s after %.2f s and %u tries\n", ckptio_last_error(), dt, f.next);
    CHECK(dt < 3 && f.next >= 3 && t_contains(ckptio_last_error(), "503 SlowDown") &&
          t_contains(ckptio_last_error(), "CKPTIO_S3_TIMEOUT"));
    return 0;
}

static int test_stall(void)
{
    static const fake_reply script[] = {{FAKE_STALL, 206, "0123456789"},
                                        {FAKE_CUT, 206, "abcdefgh"},
                                        {FAKE_REPLY, 206, "0123456789"},
                                        {FAKE_REPLY, 416, ERR_XML("InvalidRange")},
                                        {FAKE_REPLY, 206, "0123456789abc"}};
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, 5, "30", &c)) return 1;
    char buf[10];
    uint64_t got = 0;
    double t0 = ckptio__now();
    CHECK_OK(ckptio__obj_get_range(c, "b", "k/x y", 5, 10, buf, &got, NULL));
    double dt = ckptio__now() - t0;
    printf("a stalled, then cut GET came whole after %.2f s\n", dt);
    CHECK(got == 10 && !memcmp(buf, "0123456789", 10) && dt >= 1 && dt < 5 && f.next == 3);
    CHECK(!strcmp(f.lines[2], "GET /b/k/x%20y HTTP/1.1")); /* the cut one retried too */
    CHECK_OK(ckptio__obj_get_range(c, "b", "k", 50, 10, buf, &got, NULL));
    CHECK(got == 0);
    CHECK_ERR(ckptio__obj_get_range(c, "b", "k", 5, 10, buf, &got, NULL), -EPROTO); /* too much */
    return 0;
}

/* A forked child does not reuse its parent's kept-alive connections, and the parent goes on. */
static int test_fork(void)
{
    static const fake_reply script[] = {{FAKE_REPLY, 200, NULL}};
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, 1, "5", &c)) return 1;
    CHECK_OK(ckptio__obj_put(c, "b", "k", "d", 1, NULL, NULL, NULL));
    pid_t pid = fork();
    if (pid == 0) {
        ckptio__objc *cc;
        int ok = ckptio__s3_client(&cc, NULL, NULL) == 0 && cc == c;
        for (int i = 0; ok && i < 3; i++)
            ok = ckptio__obj_put(cc, "b", "k", "d", 1, NULL, NULL, NULL) == 0;
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < 3; i++) CHECK_OK(ckptio__obj_put(c, "b", "k", "d", 1, NULL, NULL, NULL));
    CHECK(f.next == 7);
    return 0;
}

static const char list1[] =
    "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/a</Key><Size>1</Size>"
    "</Contents><NextContinuationToken>t/1+2=</NextContinuationToken></ListBucketResult>";
static const char list2[] =
    "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/b</Key><Size>2</Size>"
    "</Contents><Contents><Key>p/c</Key><Size>3</Size></Contents></ListBucketResult>";
static const char up1[] =
    "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated><NextKeyMarker>p/a</NextKeyMarker>"
    "<NextUploadIdMarker>u1</NextUploadIdMarker><Upload><Key>p/a</Key><UploadId>u1</UploadId>"
    "</Upload></ListMultipartUploadsResult>";
static const char up2[] =
    "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><Key>p/b</Key>"
    "<UploadId>u2</UploadId></Upload></ListMultipartUploadsResult>";
static const char created[] =
    "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>id&amp;1</UploadId>"
    "</InitiateMultipartUploadResult>";

static int test_pages(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 200, list1}, {FAKE_REPLY, 200, list2}, {FAKE_REPLY, 200, up1},
        {FAKE_REPLY, 200, up2},   {FAKE_REPLY, 200, created},
        {FAKE_REPLY, 200, ERR_XML("InternalError")}, /* a complete that failed after its 200 */
        {FAKE_REPLY, 200, "<ListPartsResult/>"},     /* the upload is still there: retry */
        {FAKE_REPLY, 200, "<CompleteMultipartUploadResult/>"},
        {FAKE_REPLY, 200, ERR_XML("InvalidPart")}, /* after its 200, and final */
    };
    fake f;
    ckptio__objc *c;
    setenv("AWS_SESSION_TOKEN", "tok", 1);
    if (fake_start(&f, script, 9, "30", &c)) return 1;
    seen s = {0};
    CHECK_OK(ckptio__obj_list(c, "b", "p/", on_key, &s, NULL));
    CHECK(s.n == 3 && !strcmp(s.keys[2], "p/c") && s.sizes[2] == 3);
    CHECK(!strcmp(f.lines[0], "GET /b?list-type=2&prefix=p%2F HTTP/1.1"));
    CHECK(!strcmp(f.lines[1], "GET /b?continuation-token=t%2F1%2B2%3D&list-type=2&prefix=p%2F HTTP/1.1"));
    s.n = 0;
    CHECK_OK(ckptio__obj_list_uploads(c, "b", "p/", on_upload, &s, NULL));
    CHECK(s.n == 2 && !strcmp(s.keys[1], "p/b|u2"));
    CHECK(!strcmp(f.lines[3], "GET /b?key-marker=p%2Fa&prefix=p%2F&upload-id-marker=u1&uploads= HTTP/1.1"));
    char *id = NULL, etags[1][128] = {"\"e\""};
    CHECK_OK(ckptio__obj_mpu_create(c, "b", "k", &id, NULL));
    CHECK(!strcmp(id, "id&1") && !strcmp(f.lines[4], "POST /b/k?uploads= HTTP/1.1"));
    CHECK_OK(ckptio__obj_mpu_complete(c, "b", "k", id, etags, 1, NULL));
    CHECK(f.next == 8 && !strcmp(f.lines[7], "POST /b/k?uploadId=id%261 HTTP/1.1"));
    CHECK(!strcmp(f.lines[6], "GET /b/k?max-parts=1&uploadId=id%261 HTTP/1.1"));
    for (unsigned i = 0; i < 8; i++) /* each request carried and signed the session token */
        CHECK(t_contains(f.heads[i], "\r\nx-amz-security-token: tok\r\n") &&
              t_contains(f.heads[i], "SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                                     "x-amz-security-token,"));
    CHECK_ERR(ckptio__obj_mpu_complete(c, "b", "k", id, etags, 1, NULL), -EIO);
    CHECK(f.next == 9 && t_contains(ckptio_last_error(), "InvalidPart"));
    free(id);
    return 0;
}

/* A complete whose answer was lost: the retry finds the upload gone and the object there. */
static int test_complete_lost(void)
{
    static const fake_reply script[] = {
        {FAKE_RESET, 0, NULL},
        {FAKE_REPLY, 404, ERR_XML("NoSuchUpload")},
        {FAKE_ETAG, 200, "\"68083ea43d0307eecfa2b4749f19df15-2\""},
        {FAKE_RESET, 0, NULL},
        {FAKE_REPLY, 404, ERR_XML("NoSuchUpload")},
        {FAKE_ETAG, 200, "\"68083ea43d0307eecfa2b4749f19df15-3\""}, /* someone else's */
    };
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, 6, "30", &c)) return 1;
    char etags[2][128] = {"\"d41d8cd98f00b204e9800998ecf8427e\"",
                          "\"0cc175b9c0f1b6a831c399e269772661\""};
    CHECK_OK(ckptio__obj_mpu_complete(c, "b", "k", "u", etags, 2, NULL));
    CHECK(f.next == 3 && !strcmp(f.lines[2], "HEAD /b/k HTTP/1.1"));
    CHECK_ERR(ckptio__obj_mpu_complete(c, "b", "k", "u", etags, 2, NULL), CKPTIO_E_NOT_FOUND);
    CHECK(f.next == 6);
    return 0;
}

/* A store that answers the completion (or a part) of an upload that is gone with a 5xx, not
 * 404 NoSuchUpload: one ListParts says it is gone, and the call ends there, not at the
 * timeout. An upload still there is retried as before. */
static int test_upload_gone(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 500, ERR_XML("InternalError")},
        {FAKE_REPLY, 404, ERR_XML("NoSuchUpload")}, /* ListParts */
        {FAKE_REPLY, 404, NULL},                    /* HEAD: it did not complete */
        {FAKE_REPLY, 503, ERR_XML("SlowDown")},     /* a part */
        {FAKE_REPLY, 404, ERR_XML("NoSuchUpload")},
    };
    fake f;
    ckptio__objc *c;
    if (fake_start(&f, script, 5, "60", &c)) return 1;
    char etags[1][128] = {"\"d41d8cd98f00b204e9800998ecf8427e\""};
    ckptio__msg *m = calloc(1, sizeof *m); /* what the caller is told (a HEAD follows) */
    CHECK(m != NULL);
    int rc = ckptio__obj_mpu_complete(c, "b", "k", "u", etags, 1, m);
    CHECK(rc == CKPTIO_E_NOT_FOUND && t_contains(m->text, "NoSuchUpload") &&
          t_contains(m->text, "upload is gone"));
    free(m);
    CHECK(f.next == 3 && !strcmp(f.lines[1], "GET /b/k?max-parts=1&uploadId=u HTTP/1.1"));
    char etag[128];
    CHECK_ERR(ckptio__obj_mpu_part(c, "b", "k", "u", 1, "x", 1, etag, NULL), CKPTIO_E_NOT_FOUND);
    CHECK(f.next == 5);
    return 0;
}

/* Clients are made per setting and environment, read when asked for; credentials are looked
 * for at the first request, and their absence names every source tried, in order. */
static int test_client_env(void)
{
    ckptio__objc *c, *again, *other;
    const char *clear[] = {"AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                           "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                           "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                           "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_ENDPOINT_URL_S3"};
    for (size_t i = 0; i < sizeof clear / sizeof *clear; i++) unsetenv(clear[i]);
    setenv("AWS_SECRET_ACCESS_KEY", "x", 1);
    setenv("AWS_CONFIG_FILE", "/nonexistent/ckptio/config", 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/ckptio/credentials", 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/", 1);
    CHECK_OK(ckptio__s3_client(&c, NULL, NULL));
    ckptio__obj_resp r;
    CHECK_ERR(ckptio__obj_head(c, "b", "k", &r, NULL), CKPTIO_E_USAGE);
    const char *e = ckptio_last_error();
    printf("%s\n", e);
    CHECK(t_contains(e, "s3://b/k") && t_contains(e, "no AWS credentials"));
    const char *order[] = {"environment (AWS_ACCESS_KEY_ID", "web identity", "profile 'default'",
                           "container (AWS_CONTAINER_CREDENTIALS_FULL_URI",
                           "instance metadata (AWS_EC2_METADATA_DISABLED=true)"};
    const char *at = e;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const char *f = strstr(at, order[i]);
        CHECK(f != NULL);
        at = f;
    }
    setenv("AWS_ACCESS_KEY_ID", "a", 1); /* another environment: another client */
    CHECK_OK(ckptio__s3_client(&again, NULL, NULL));
    CHECK(again != c && !strcmp(ckptio__obj_endpoint(again), "http://127.0.0.1:9"));
    CHECK_OK(ckptio__s3_client(&c, NULL, NULL));
    CHECK(again == c);
    setenv("AWS_ENDPOINT_URL", "ftp://host", 1);
    CHECK_ERR(ckptio__s3_client(&other, NULL, NULL), CKPTIO_E_USAGE);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/", 1);

    /* Settings win over the environment, and each distinct setting has its client. */
    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    CHECK_ERR(ckptio_store_opts_set(o, "endpoint", "http://x"), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "endpoint_url"));
    CHECK_ERR(ckptio_store_opts_set(o, "addressing_style", "sideways"), CKPTIO_E_USAGE);
    CHECK_OK(ckptio_store_opts_set(o, "endpoint_url", "http://127.0.0.1:10"));
    CHECK_OK(ckptio__s3_client(&other, o, NULL));
    CHECK(other != c && !strcmp(ckptio__obj_endpoint(other), "http://127.0.0.1:10"));
    CHECK_OK(ckptio_store_opts_set(o, "access_key_id", "k2"));
    ckptio__objc *none;
    CHECK_ERR(ckptio__s3_client(&none, o, NULL), CKPTIO_E_USAGE); /* without its secret */
    CHECK_OK(ckptio_store_opts_set(o, "access_key_id", NULL));
    CHECK_OK(ckptio__s3_client(&again, o, NULL));
    CHECK(again == other);
    ckptio_store_opts_free(o);
    return 0;
}

static int test_live_objects(void)
{
    LIVE(c, p, b);
    uint8_t data[3000], *got = NULL;
    t_fill(data, sizeof data, 1);
    ckptio__obj_resp r;
    CHECK_OK(ckptio__obj_put(c, b, k(p, "a b+c&d"), data, sizeof data, NULL, &r, NULL));
    CHECK(r.status == 200 && r.etag[0] == '"');
    uint64_t len = 0;
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "a b+c&d"), 1 << 20, &got, &len, &r, NULL));
    CHECK(len == sizeof data && !memcmp(got, data, len) && r.mtime > 0);
    free(got);
    CHECK_ERR(ckptio__obj_get_all(c, b, k(p, "a b+c&d"), 100, &got, &len, NULL, NULL), CKPTIO_E_LIMIT);
    CHECK_OK(ckptio__obj_head(c, b, k(p, "a b+c&d"), &r, NULL));
    CHECK(r.size == sizeof data && r.date > 1700000000 && r.mtime > 1700000000);
    char etag[128];
    memcpy(etag, r.etag, sizeof etag);

    uint8_t part[1000];
    uint64_t n = 0;
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "a b+c&d"), 1000, 1000, part, &n, NULL));
    CHECK(n == 1000 && !memcmp(part, data + 1000, 1000));
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "a b+c&d"), 2500, 1000, part, &n, NULL));
    CHECK(n == 500 && !memcmp(part, data + 2500, 500));
    CHECK_OK(ckptio__obj_get_range(c, b, k(p, "a b+c&d"), 3000, 1000, part, &n, NULL));
    CHECK(n == 0);

    /* Conditional writes: what the commit relies on. */
    int rc = ckptio__obj_put(c, b, k(p, "a b+c&d"), "x", 1, "*", NULL, NULL);
    printf("If-None-Match: * on an existing object: %s\n", ckptio_errname(rc));
    CHECK_ERR(rc, CKPTIO_E_EXISTS);
    rc = ckptio__obj_put(c, b, k(p, "a b+c&d"), "x", 1, "\"0123456789abcdef0123456789abcdef\"",
                        NULL, NULL);
    printf("If-Match: <another ETag>: %s\n", ckptio_errname(rc));
    CHECK_ERR(rc, CKPTIO_E_EXISTS);
    CHECK(t_contains(ckptio_last_error(), "s3://") && t_contains(ckptio_last_error(), "412"));
    CHECK_OK(ckptio__obj_put(c, b, k(p, "a b+c&d"), "xy", 2, etag, &r, NULL));
    CHECK_OK(ckptio__obj_put(c, b, k(p, "new"), "", 0, "*", &r, NULL));
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "new"), 10, &got, &len, NULL, NULL));
    CHECK(len == 0 && got);
    free(got);

    seen s = {0};
    CHECK_OK(ckptio__obj_put(c, b, k(p, "d/1"), "1", 1, NULL, NULL, NULL));
    CHECK_OK(ckptio__obj_list(c, b, k(p, ""), on_key, &s, NULL));
    CHECK(s.n == 3 && !strcmp(s.keys[0] + strlen(p) + 1, "a b+c&d") && s.sizes[0] == 2);
    CHECK(!strcmp(s.keys[1] + strlen(p) + 1, "d/1") && !strcmp(s.keys[2] + strlen(p) + 1, "new"));
    CHECK(s.times[0] > 1700000000);
    s.n = 0;
    CHECK_OK(ckptio__obj_list(c, b, k(p, "d/"), on_key, &s, NULL));
    CHECK(s.n == 1);

    const char *names[] = {"a b+c&d", "new", "d/1"};
    for (int i = 0; i < 3; i++) CHECK_OK(ckptio__obj_delete(c, b, k(p, names[i]), NULL));
    CHECK_OK(ckptio__obj_delete(c, b, k(p, "new"), NULL)); /* already gone: fine */
    CHECK_ERR(ckptio__obj_head(c, b, k(p, "new"), &r, NULL), CKPTIO_E_NOT_FOUND);
    CHECK(r.status == 404 && r.date > 1700000000);
    CHECK_ERR(ckptio__obj_get_all(c, b, k(p, "new"), 10, &got, &len, NULL, NULL), CKPTIO_E_NOT_FOUND);
    s.n = 0;
    CHECK_OK(ckptio__obj_list(c, b, k(p, ""), on_key, &s, NULL));
    CHECK(s.n == 0);
    return 0;
}

static int count_uploads(void *ctx, const char *key, const char *id, int64_t initiated)
{
    (void)key, (void)id, (void)initiated;
    ++*(int *)ctx;
    return 0;
}

static int test_live_multipart(void)
{
    LIVE(c, p, b);
    size_t len = 6 * MIB + 123;
    uint8_t *data = t_alloc(len), *got = NULL;
    CHECK(data);
    t_fill(data, len, 7);
    char *id = NULL, etags[2][128];
    CHECK_OK(ckptio__obj_mpu_create(c, b, k(p, "big"), &id, NULL));
    int n = 0;
    CHECK_OK(ckptio__obj_list_uploads(c, b, k(p, ""), count_uploads, &n, NULL));
    CHECK(n == 1);
    CHECK_OK(ckptio__obj_mpu_part(c, b, k(p, "big"), id, 2, data + 5 * MIB, len - 5 * MIB, etags[1], NULL));
    CHECK_OK(ckptio__obj_mpu_part(c, b, k(p, "big"), id, 1, data, 5 * MIB, etags[0], NULL));
    CHECK_OK(ckptio__obj_mpu_complete(c, b, k(p, "big"), id, etags, 2, NULL));
    free(id);
    char want[128];
    ckptio__obj_resp r;
    CHECK(ckptio__s3_mpu_etag(etags, 2, want));
    CHECK_OK(ckptio__obj_head(c, b, k(p, "big"), &r, NULL));
    printf("multipart ETag %s, from the parts' %s\n", r.etag, want);
    CHECK(!strcmp(r.etag, want)); /* what a lost complete's retry relies on */
    uint64_t glen = 0;
    CHECK_OK(ckptio__obj_get_all(c, b, k(p, "big"), 64 * MIB, &got, &glen, NULL, NULL));
    CHECK(glen == len && !memcmp(got, data, len));
    free(got);
    CHECK_OK(ckptio__obj_mpu_create(c, b, k(p, "dropped"), &id, NULL));
    CHECK_OK(ckptio__obj_mpu_part(c, b, k(p, "dropped"), id, 1, data, 5 * MIB, etags[0], NULL));
    CHECK_OK(ckptio__obj_mpu_abort(c, b, k(p, "dropped"), id, NULL));
    free(id);
    n = 0;
    CHECK_OK(ckptio__obj_list_uploads(c, b, k(p, ""), count_uploads, &n, NULL));
    CHECK(n == 0);
    CHECK_ERR(ckptio__obj_head(c, b, k(p, "dropped"), NULL, NULL), CKPTIO_E_NOT_FOUND);
    CHECK_OK(ckptio__obj_delete(c, b, k(p, "big"), NULL));
    t_free(data, len);
    return 0;
}

/* Objects through the psync engine: parts uploaded in parallel, ranged reads, an abort. */
static int test_live_engine(void)
{
    LIVE(c, p, b);
    const uint64_t part = 5 * MIB, len = 2 * part + 777;
    uint8_t *data = t_alloc(len), *back = t_alloc(len + 4096);
    CHECK(data && back);
    t_fill(data, len, 3);
    ckptio__engine *e;
    CHECK_OK(ckptio__engine_open(&e, CKPTIO_BACKEND_PSYNC, 8, 4));
    int fd;
    CHECK_OK(ckptio__obj_open_write(c, b, k(p, "obj"), part, &fd, NULL));
    CHECK(ckptio__obj_is(fd) && !ckptio__obj_is(0));
    ckptio__req rq[3], *done[3];
    for (int i = 0; i < 3; i++) {
        uint64_t off = (uint64_t)i * part;
        rq[i] = (ckptio__req){.fd = fd, .op = CKPTIO__OP_WRITE, .buf = data + off, .off = off,
                              .len = CKPTIO__MIN(part, len - off)};
        CHECK_OK(ckptio__engine_submit(e, &rq[i]));
    }
    for (int got = 0; got < 3;) {
        int r = ckptio__engine_reap(e, done, 3, 1);
        CHECK_OK(r);
        got += r;
    }
    for (int i = 0; i < 3; i++) CHECK(rq[i].res == (int64_t)rq[i].len);
    CHECK_ERR(ckptio__obj_finish(fd, len + 1, NULL), CKPTIO_E_USAGE);
    CHECK_OK(ckptio__obj_finish(fd, len, NULL));
    ckptio__fd_close(fd);
    CHECK(!ckptio__obj_is(fd));

    uint64_t size = UINT64_MAX; /* unknown: asked of the store */
    CHECK_OK(ckptio__obj_open_read(c, b, k(p, "obj"), &size, &fd, NULL));
    CHECK(size == len);
    uint64_t step = 4 * MIB;
    for (int i = 0; i < 3; i++) {
        rq[i] = (ckptio__req){.fd = fd, .op = CKPTIO__OP_READ, .buf = back + i * step,
                              .off = i * step, .len = step};
        CHECK_OK(ckptio__engine_submit(e, &rq[i]));
    }
    for (int got = 0; got < 3;) {
        int r = ckptio__engine_reap(e, done, 3, 1);
        CHECK_OK(r);
        got += r;
    }
    CHECK(rq[0].res == (int64_t)step && rq[1].res == (int64_t)step);
    CHECK(rq[2].res == (int64_t)(len - 2 * step)); /* short at the end, like pread */
    CHECK(!memcmp(back, data, len));
    ckptio__fd_close(fd);

    /* Closed unfinished: the upload is aborted, nothing appears. */
    CHECK_OK(ckptio__obj_open_write(c, b, k(p, "half"), part, &fd, NULL));
    rq[0] = (ckptio__req){.fd = fd, .op = CKPTIO__OP_WRITE, .buf = data, .off = 0, .len = part};
    CHECK_OK(ckptio__engine_submit(e, &rq[0]));
    CHECK(ckptio__engine_reap(e, done, 1, 1) == 1 && rq[0].res == (int64_t)part);
    rq[0] = (ckptio__req){.fd = fd, .op = CKPTIO__OP_WRITE, .buf = data, .off = 3, .len = part};
    CHECK_OK(ckptio__engine_submit(e, &rq[0]));
    CHECK(ckptio__engine_reap(e, done, 1, 1) == 1 && rq[0].res == CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio__vfd_error(fd), "not one part"));
    ckptio__fd_close(fd);
    int n = 0;
    CHECK_OK(ckptio__obj_list_uploads(c, b, k(p, ""), count_uploads, &n, NULL));
    CHECK(n == 0);
    CHECK_ERR(ckptio__obj_head(c, b, k(p, "half"), NULL, NULL), CKPTIO_E_NOT_FOUND);
    CHECK_OK(ckptio__obj_delete(c, b, k(p, "obj"), NULL));
    ckptio__engine_close(e);
    t_free(data, len);
    t_free(back, len + 4096);
    return 0;
}

/* In a child (the client is read once per process): rc and the message of a HEAD. */
static int head_in_child(const char *bkt, char *text, size_t cap, double *secs)
{
    int pfd[2];
    if (pipe(pfd) < 0) return 1;
    double t0 = ckptio__now();
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        ckptio__objc *c;
        int rc = ckptio__s3_client(&c, NULL, NULL);
        if (rc == 0) rc = ckptio__obj_head(c, bkt, "ckptio-test/none", NULL, NULL);
        char out[CKPTIO__MSG_LEN + 16];
        int n = snprintf(out, sizeof out, "%d %s", rc, ckptio_last_error());
        if (write(pfd[1], out, (size_t)n) < 0) _exit(2);
        _exit(0);
    }
    close(pfd[1]);
    ssize_t n = read(pfd[0], text, cap - 1);
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    *secs = ckptio__now() - t0;
    text[n > 0 ? n : 0] = 0;
    printf("%s (%.1f s)\n", text, *secs);
    return atoi(text);
}

static int test_live_errors(void)
{
    char text[CKPTIO__MSG_LEN + 16];
    double secs;
    if (live_env()) return T_SKIP;
    const char *secret = getenv("AWS_SECRET_ACCESS_KEY");
    char saved[256];
    snprintf(saved, sizeof saved, "%s", secret);
    /* Children first: the client is made once per process, and a child inherits its parent's. */
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret", 1);
    int rc = head_in_child(bucket(), text, sizeof text, &secs);
    if (rc == 0 || rc == CKPTIO_E_NOT_FOUND) printf("this store does not check signatures\n");
    else CHECK(rc == -EACCES && t_contains(text, "AWS_SECRET_ACCESS_KEY"));
    setenv("AWS_SECRET_ACCESS_KEY", saved, 1);

    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9", 1); /* discard: nothing listens */
    setenv("CKPTIO_S3_TIMEOUT", "2", 1);
    CHECK(head_in_child(bucket(), text, sizeof text, &secs) == -ECONNREFUSED);
    CHECK(t_contains(text, "http://127.0.0.1:9") && t_contains(text, "AWS_ENDPOINT_URL"));
    CHECK(t_contains(text, "tries") && secs < 6);
    unsetenv("CKPTIO_S3_TIMEOUT");

    LIVE(c, p, b);
    uint8_t *buf;
    uint64_t len;
    CHECK_ERR(ckptio__obj_get_all(c, "ckptio-no-such-bucket", "k", 10, &buf, &len, NULL, NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "s3://ckptio-no-such-bucket/k") &&
          t_contains(ckptio_last_error(), "create it"));
    CHECK_ERR(ckptio__obj_get_all(c, b, k(p, "none"), 10, &buf, &len, NULL, NULL), CKPTIO_E_NOT_FOUND);
    return 0;
}

/* Credentials that live 2 to 3 seconds (a profile's credential_process, which counts its
 * runs), taken by 8 threads for 5 seconds: none fails, they are fetched again before they
 * expire, once per expiry rather than once per thread; a key the store calls expired is
 * replaced at the next get. Run under TSan by make test-sanitize. */
typedef struct creds_loop_arg {
    ckptio__aws_creds *p;
    int fails;
} creds_loop_arg;

static void *creds_loop(void *arg)
{
    creds_loop_arg *a = arg;
    double end = ckptio__now() + 5;
    while (ckptio__now() < end) {
        ckptio__aws_key *k;
        if (ckptio__aws_creds_get(a->p, &k, NULL) < 0 || strncmp(k->id, "AKIDPROC", 8) ||
            !k->token || (k->expires && k->expires < (int64_t)time(NULL))) {
            __atomic_add_fetch(&a->fails, 1, __ATOMIC_RELAXED);
            break;
        }
        ckptio__aws_key_put(k);
    }
    return NULL;
}

static int runs_of(const char *path)
{
    unsigned char *buf = NULL;
    long n = t_read_file(path, &buf), lines = 0;
    for (long i = 0; i < n; i++) lines += buf[i] == '\n';
    free(buf);
    return (int)lines;
}

static int test_creds_refresh_threads(void)
{
    char script[4096], config[4096];
    snprintf(script, sizeof script,
             "echo run >> %s\n"
             "n=$(wc -l < %s)\n"
             "exp=$(date -u -d '+3 seconds' +%%Y-%%m-%%dT%%H:%%M:%%SZ)\n"
             "printf '{\"Version\": 1, \"AccessKeyId\": \"AKIDPROC%%s\", \"SecretAccessKey\": "
             "\"s\", \"SessionToken\": \"t\", \"Expiration\": \"%%s\"}' \"$n\" \"$exp\"\n",
             t_path("runs"), t_path("runs"));
    CHECK_OK(t_write_file(t_path("proc.sh"), script, strlen(script)));
    snprintf(config, sizeof config, "[profile proc]\ncredential_process = sh %s\n", t_path("proc.sh"));
    CHECK_OK(t_write_file(t_path("config"), config, strlen(config)));
    ckptio__aws_conf conf = {0};
    conf.v[CKPTIO__AWS_CONFIG_FILE] = strdup(t_path("config"));
    conf.v[CKPTIO__AWS_CREDS_FILE] = strdup(t_path("no-credentials"));
    conf.v[CKPTIO__AWS_PROFILE] = strdup("proc");
    conf.v[CKPTIO__AWS_PROFILE_GIVEN] = strdup("1");
    ckptio__aws_creds *p;
    CHECK_OK(ckptio__aws_creds_new(&p, &conf, NULL));
    ckptio__aws_conf_free(&conf);
    creds_loop_arg a = {p, 0};
    pthread_t th[8];
    for (int i = 0; i < 8; i++) CHECK(pthread_create(&th[i], NULL, creds_loop, &a) == 0);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    int runs = runs_of(t_path("runs"));
    printf("%d runs of credential_process for 8 threads over 5 s; source: %s\n", runs,
           ckptio__aws_creds_source(p));
    CHECK(a.fails == 0);
    CHECK(runs >= 2 && runs <= 8);
    CHECK(t_contains(ckptio__aws_creds_source(p), "credential_process"));
    ckptio__aws_key *k;
    CHECK_OK(ckptio__aws_creds_get(p, &k, NULL));
    CHECK(ckptio__aws_creds_expired(p, k)); /* refreshable: the next get asks again */
    ckptio__aws_key_put(k);
    CHECK_OK(ckptio__aws_creds_get(p, &k, NULL));
    ckptio__aws_key_put(k);
    CHECK(runs_of(t_path("runs")) == runs + 1);
    ckptio__aws_creds_free(p);
    return 0;
}

const ckptio_test tests_s3[] = {
    {"s3/creds_refresh_threads", test_creds_refresh_threads, 0, 60},
    {"s3/sigv4", test_sigv4, 0, 0},
    {"s3/url", test_url, 0, 0},
    {"s3/xml", test_xml, 0, 0},
    {"s3/times", test_times, 0, 0},
    {"s3/client_env", test_client_env, 0, 0},
    {"s3/retries", test_retries, 0, 0},
    {"s3/deadline", test_deadline, 0, 0},
    {"s3/stall", test_stall, 0, 0},
    {"s3/pages", test_pages, 0, 0},
    {"s3/fork", test_fork, 0, 0},
    {"s3/complete_lost", test_complete_lost, 0, 0},
    {"s3/upload_gone", test_upload_gone, 0, 0},
    {"s3/live_objects", test_live_objects, 0, 300},
    {"s3/live_multipart", test_live_multipart, 0, 300},
    {"s3/live_engine", test_live_engine, 0, 300},
    {"s3/live_errors", test_live_errors, 0, 120},
    {0, 0, 0, 0},
};
