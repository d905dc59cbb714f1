/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the Google credential chain (gcp_creds.c) against scripted servers on 127.0.0.1. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "../src/store/conf_parse.h"
#include "../src/store/gcp_creds.h"
#include "fake_http.h"
#include "test.h"

#define N_OF(a) (sizeof(a) / sizeof *(a))

/* No Google setting from the caller's environment; no gcloud file (HOME is the empty test
 * directory); no metadata server. */
static void env_clear(void)
{
    static const char *const vars[] = {"GOOGLE_APPLICATION_CREDENTIALS",
                                       "CLOUDSDK_CONFIG",
                                       "STORAGE_EMULATOR_HOST",
                                       "GCE_METADATA_HOST",
                                       "GCE_METADATA_IP",
                                       "GOOGLE_CLOUD_PROJECT",
                                       "CLOUDSDK_CORE_PROJECT"};
    for (size_t i = 0; i < N_OF(vars); i++) unsetenv(vars[i]);
    setenv("HOME", t_dir(), 1);
    setenv("NO_GCE_CHECK", "true", 1);
}

/* A clean environment and a scripted server. */
static int serve(fake *f, const fake_reply *script, unsigned n)
{
    env_clear();
    return fake_listen(f, script, n, NULL);
}

/* A provider made from the settings o (may be NULL) and the environment as it is now. */
static int provider(ckptio__gcp_creds **p, const ckptio_store_opts *o)
{
    ckptio__gcp_conf c = {0};
    CHECK_OK(ckptio__gcp_conf_read(&c, o, NULL));
    int rc = ckptio__gcp_creds_new(p, &c, NULL);
    ckptio__gcp_conf_free(&c);
    CHECK_OK(rc);
    return 0;
}

/* A file under the test directory, its text formatted; its path. */
static const char *write_text(const char *name, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const char *write_text(const char *name, const char *fmt, ...)
{
    static char text[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const char *path = t_path(name);
    return t_write_file(path, text, strlen(text)) == 0 ? path : NULL;
}

/* The value of `name` in a form body (up to '&'), still encoded, into out. */
static bool form_value(const char *body, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == '=') {
            snprintf(out, cap, "%.*s", (int)strcspn(p + n + 1, "&"), p + n + 1);
            return true;
        }
    return false;
}

/* ---- a service account ---- */

/* A new RSA key, and its private key in PEM as the body of a JSON string. */
static EVP_PKEY *rsa_key(char *pem_json, size_t cap)
{
    EVP_PKEY *k = EVP_RSA_gen(2048);
    BIO *b = BIO_new(BIO_s_mem());
    char *pem;
    if (!k || !b || PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) != 1 ||
        BIO_write(b, "", 1) != 1 || BIO_get_mem_data(b, &pem) <= 0 ||
        ckptio__json_escape(pem, pem_json, cap) >= cap) {
        EVP_PKEY_free(k);
        k = NULL;
    }
    BIO_free(b);
    return k;
}

#define SA_EMAIL "ckptio-test@proj-1.iam.gserviceaccount.com"

/* A service account's key file whose token_uri is the fake's. */
static const char *sa_file(const char *name, const fake *f, const char *pem_json)
{
    return write_text(name,
                      "{\"type\": \"service_account\", \"project_id\": \"proj-1\",\n"
                      " \"private_key_id\": \"kid-1\", \"private_key\": \"%s\",\n"
                      " \"client_email\": \"" SA_EMAIL "\", \"client_id\": \"1234\",\n"
                      " \"token_uri\": \"http://127.0.0.1:%d/token\"}\n",
                      pem_json, f->port);
}

/* base64url (no padding) of [in, in + n) decoded into out (NUL-terminated): its length, or -1. */
static int unb64url(const char *in, size_t n, unsigned char *out, size_t cap)
{
    char buf[4096];
    size_t i = 0, pad = (4 - n % 4) % 4;
    if (n + pad >= sizeof buf || (n + pad) / 4 * 3 + 1 > cap) return -1;
    for (; i < n; i++) buf[i] = in[i] == '-' ? '+' : in[i] == '_' ? '/' : in[i];
    while (pad-- > 0) buf[i++] = '=';
    int len = EVP_DecodeBlock(out, (const unsigned char *)buf, (int)i);
    if (len < 0) return -1;
    while (i > 0 && buf[i - 1] == '=') len--, i--;
    out[len] = 0;
    return len;
}

/* The JWT of a token request: signed by key (RS256), with the claims Google asks for. */
static int check_jwt(const char *body, EVP_PKEY *key, const char *aud)
{
    char jwt[4096], grant[128], v[256];
    CHECK(form_value(body, "grant_type", grant, sizeof grant));
    CHECK(!strcmp(grant, "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"));
    CHECK(form_value(body, "assertion", jwt, sizeof jwt)); /* base64url and dots: not encoded */
    const char *d1 = strchr(jwt, '.'), *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
    CHECK(d1 && d2 && !strchr(d2 + 1, '.'));
    unsigned char head[512], claims[1024], sig[512];
    int hl = unb64url(jwt, (size_t)(d1 - jwt), head, sizeof head);
    int cl = unb64url(d1 + 1, (size_t)(d2 - d1 - 1), claims, sizeof claims);
    int sl = unb64url(d2 + 1, strlen(d2 + 1), sig, sizeof sig);
    CHECK(hl > 0 && cl > 0 && sl == 256);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    CHECK(md && EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, key) == 1);
    int ok = EVP_DigestVerify(md, sig, (size_t)sl, (const unsigned char *)jwt, (size_t)(d2 - jwt));
    EVP_MD_CTX_free(md);
    CHECK(ok == 1);
    printf("JWT %s\n    %s\n", head, claims);
    const char *h = (const char *)head, *c = (const char *)claims;
    CHECK(ckptio__json_str(h, (size_t)hl, "alg", v, sizeof v) == 1 && !strcmp(v, "RS256"));
    CHECK(ckptio__json_str(h, (size_t)hl, "typ", v, sizeof v) == 1 && !strcmp(v, "JWT"));
    CHECK(ckptio__json_str(h, (size_t)hl, "kid", v, sizeof v) == 1 && !strcmp(v, "kid-1"));
    CHECK(ckptio__json_str(c, (size_t)cl, "iss", v, sizeof v) == 1 && !strcmp(v, SA_EMAIL));
    CHECK(ckptio__json_str(c, (size_t)cl, "aud", v, sizeof v) == 1 && !strcmp(v, aud));
    CHECK(ckptio__json_str(c, (size_t)cl, "scope", v, sizeof v) == 1);
    CHECK(!strcmp(v, "https://www.googleapis.com/auth/devstorage.read_write"));
    int64_t iat = 0, exp = 0, now = (int64_t)time(NULL);
    CHECK(ckptio__json_int(c, (size_t)cl, "iat", &iat) == 1);
    CHECK(ckptio__json_int(c, (size_t)cl, "exp", &exp) == 1);
    CHECK(exp - iat == 3600 && iat <= now && iat > now - 60);
    return 0;
}

/* A key file's JWT, signed and checked; the token it buys, cached, then asked for again before
 * it expires (a 3 s token: at 2 s); a token the store refused, replaced at the next get. */
static int test_service_account(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 200,
         "{\"access_token\": \"ya29.first\", \"expires_in\": 3, "
         "\"token_type\": \"Bearer\"}"},
        {FAKE_REPLY, 200, "{\"access_token\": \"ya29.second\", \"expires_in\": \"3599\"}"},
    };
    fake f;
    CHECK(serve(&f, script, N_OF(script)) == 0);
    char pem[8192], aud[64];
    EVP_PKEY *key = rsa_key(pem, sizeof pem);
    CHECK(key);
    const char *path = sa_file("sa.json", &f, pem);
    CHECK(path);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", path, 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    CHECK(!strcmp(ckptio__gcp_creds_source(p), "") && fake_count(&f) == 0);

    ckptio__gcp_token *t, *again;
    int64_t now = (int64_t)time(NULL);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(!strcmp(t->token, "ya29.first") && t->expires >= now + 3 && t->expires <= now + 4);
    CHECK(fake_count(&f) == 1 && !strcmp(f.lines[0], "POST /token HTTP/1.1"));
    CHECK(t_contains(f.heads[0], "\r\nContent-Type: application/x-www-form-urlencoded\r\n"));
    snprintf(aud, sizeof aud, "http://127.0.0.1:%d/token", f.port);
    if (check_jwt(f.bodies[0], key, aud)) return 1;
    const char *src = ckptio__gcp_creds_source(p);
    printf("source: %s\n", src);
    CHECK(t_contains(src, "service account '" SA_EMAIL "'") && t_contains(src, path));

    CHECK_OK(ckptio__gcp_creds_get(p, &again, NULL)); /* cached: no request */
    CHECK(again == t && fake_count(&f) == 1);
    ckptio__gcp_token_put(again);
    usleep(2100 * 1000); /* past expires - 1 s: a quarter of a 3 s life, at least 1 s */
    CHECK_OK(ckptio__gcp_creds_get(p, &again, NULL));
    CHECK(fake_count(&f) == 2 && !strcmp(again->token, "ya29.second"));
    CHECK(!strcmp(t->token, "ya29.first")); /* a holder's reference stays good */
    ckptio__gcp_token_put(t);
    if (check_jwt(f.bodies[1], key, aud)) return 1;

    CHECK(ckptio__gcp_creds_expired(p, again)); /* refused by the store: the next get asks */
    ckptio__gcp_token_put(again);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(fake_count(&f) == 3);
    ckptio__gcp_token_put(t);
    ckptio__gcp_creds_free(p);
    EVP_PKEY_free(key);
    return 0;
}

/* An OAuth error answer: the message names the file (given in the settings), the endpoint and
 * what the answer said. A key that is not one: named too. */
static int test_oauth_error(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 400,
         "{\"error\": \"invalid_grant\", \"error_description\": "
         "\"Invalid JWT Signature.\"}"},
    };
    fake f;
    CHECK(serve(&f, script, N_OF(script)) == 0);
    char pem[8192];
    EVP_PKEY *key = rsa_key(pem, sizeof pem);
    CHECK(key);
    EVP_PKEY_free(key);
    const char *path = sa_file("sa.json", &f, pem);
    CHECK(path);
    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    CHECK_OK(ckptio_store_opts_set(o, "credentials_file", path));
    ckptio__gcp_creds *p;
    CHECK(provider(&p, o) == 0);
    ckptio__gcp_token *t = NULL;
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), -EACCES);
    const char *e = ckptio_last_error();
    printf("%s\n", e);
    CHECK(!t && fake_count(&f) == 1);
    CHECK(t_contains(e, path) && t_contains(e, "credentials_file") && t_contains(e, "HTTP 400"));
    CHECK(t_contains(e, "invalid_grant: Invalid JWT Signature.") && t_contains(e, SA_EMAIL));
    ckptio__gcp_creds_free(p);

    path = write_text("bad-key.json", "{\"type\": \"service_account\", \"client_email\": \"a@b\","
                                      " \"private_key\": \"-----BEGIN PRIVATE KEY-----\\nAAAA\\n"
                                      "-----END PRIVATE KEY-----\\n\"}");
    CHECK_OK(ckptio_store_opts_set(o, "credentials_file", path));
    CHECK(provider(&p, o) == 0);
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), path) && t_contains(ckptio_last_error(), "no RSA key"));
    CHECK(fake_count(&f) == 1);
    ckptio__gcp_creds_free(p);
    ckptio_store_opts_free(o);
    return 0;
}

/* gcloud's user credentials, in CLOUDSDK_CONFIG, then under HOME: a refresh token traded. */
static int test_authorized_user(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 200,
         "{\"access_token\": \"ya29.user\", \"expires_in\": 3599, "
         "\"scope\": \"openid\", \"token_type\": \"Bearer\"}"},
    };
    fake f;
    CHECK(serve(&f, script, N_OF(script)) == 0);
    CHECK(t_sh("mkdir -p '%s/gc' '%s/.config/gcloud'", t_dir(), t_dir()) == 0);
    static const char user[] =
        "{\"account\": \"\", \"client_id\": \"cid.apps.googleusercontent.com\",\n"
        " \"client_secret\": \"s+1\", \"quota_project_id\": \"proj-1\",\n"
        " \"refresh_token\": \"1//0rt\", \"type\": \"authorized_user\",\n"
        " \"universe_domain\": \"googleapis.com\", \"token_uri\": \"http://127.0.0.1:%d/t\"}\n";
    const char *path = write_text("gc/application_default_credentials.json", user, f.port);
    CHECK(path);
    setenv("CLOUDSDK_CONFIG", t_path("gc"), 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t;
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(!strcmp(t->token, "ya29.user") && t->expires > (int64_t)time(NULL) + 3500);
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&f) == 1 && !strcmp(f.lines[0], "POST /t HTTP/1.1"));
    char v[128];
    const char *b = f.bodies[0];
    printf("%s\n", b);
    CHECK(form_value(b, "grant_type", v, sizeof v) && !strcmp(v, "refresh_token"));
    CHECK(form_value(b, "client_id", v, sizeof v) && !strcmp(v, "cid.apps.googleusercontent.com"));
    CHECK(form_value(b, "client_secret", v, sizeof v) && !strcmp(v, "s%2B1"));
    CHECK(form_value(b, "refresh_token", v, sizeof v) && !strcmp(v, "1%2F%2F0rt"));
    CHECK(t_contains(ckptio__gcp_creds_source(p), "authorized user") &&
          t_contains(ckptio__gcp_creds_source(p), path));
    ckptio__gcp_creds_free(p);

    unsetenv("CLOUDSDK_CONFIG"); /* then $HOME/.config/gcloud */
    path = write_text(".config/gcloud/application_default_credentials.json", user, f.port);
    CHECK(path);
    CHECK(provider(&p, NULL) == 0);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&f) == 2 && t_contains(ckptio__gcp_creds_source(p), path));
    ckptio__gcp_creds_free(p);
    return 0;
}

/* Workload identity federation: a subject token read from a file (JSON), exchanged at STS,
 * the federated token then impersonating a service account; and one fetched from a URL (text,
 * with the configuration's headers), exchanged without impersonation. */
static int test_external_account(void)
{
    char sa_answer[256], when[64];
    time_t later = time(NULL) + 1800;
    struct tm tm;
    gmtime_r(&later, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S.123456789Z", &tm);
    snprintf(sa_answer, sizeof sa_answer, "{\"accessToken\": \"ya29.sa\", \"expireTime\": \"%s\"}",
             when);
    const fake_reply script[] = {
        {FAKE_REPLY, 200,
         "{\"access_token\": \"fed.tok\", \"issued_token_type\": "
         "\"urn:ietf:params:oauth:token-type:access_token\", "
         "\"token_type\": \"Bearer\", \"expires_in\": 3600}"},
        {FAKE_REPLY, 200, sa_answer},
    };
    fake f;
    CHECK(serve(&f, script, N_OF(script)) == 0);
    const char *subject = write_text("oidc.json", "{\"id_token\": \"eyJh.subject.sig\"}");
    const char *path =
        write_text("wif.json",
                   "{\"type\": \"external_account\",\n"
                   " \"audience\": \"//iam.googleapis.com/projects/123/locations/global/"
                   "workloadIdentityPools/pool/providers/prov\",\n"
                   " \"subject_token_type\": \"urn:ietf:params:oauth:token-type:jwt\",\n"
                   " \"token_url\": \"http://127.0.0.1:%d/v1/token\",\n"
                   " \"service_account_impersonation_url\": \"http://127.0.0.1:%d/v1/projects/-/"
                   "serviceAccounts/sa@proj-1.iam.gserviceaccount.com:generateAccessToken\",\n"
                   " \"service_account_impersonation\": {\"token_lifetime_seconds\": 1800},\n"
                   " \"credential_source\": {\"file\": \"%s\", \"format\": {\"type\": \"json\", "
                   "\"subject_token_field_name\": \"id_token\"}}}\n",
                   f.port, f.port, subject);
    CHECK(subject && path);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", path, 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t;
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(!strcmp(t->token, "ya29.sa") && t->expires == (int64_t)later);
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&f) == 2 && !strcmp(f.lines[0], "POST /v1/token HTTP/1.1"));
    char v[256];
    const char *b = f.bodies[0];
    printf("STS: %s\nIAM: %s\n", b, f.bodies[1]);
    CHECK(form_value(b, "grant_type", v, sizeof v));
    CHECK(!strcmp(v, "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"));
    CHECK(form_value(b, "subject_token", v, sizeof v) && !strcmp(v, "eyJh.subject.sig"));
    CHECK(form_value(b, "subject_token_type", v, sizeof v));
    CHECK(!strcmp(v, "urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Ajwt"));
    CHECK(form_value(b, "requested_token_type", v, sizeof v));
    CHECK(!strcmp(v, "urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token"));
    CHECK(form_value(b, "audience", v, sizeof v));
    CHECK(!strcmp(v, "%2F%2Fiam.googleapis.com%2Fprojects%2F123%2Flocations%2Fglobal%2F"
                     "workloadIdentityPools%2Fpool%2Fproviders%2Fprov"));
    CHECK(form_value(b, "scope", v, sizeof v));
    CHECK(!strcmp(v, "https%3A%2F%2Fwww.googleapis.com%2Fauth%2Fcloud-platform"));
    CHECK(!strcmp(f.lines[1],
                  "POST /v1/projects/-/serviceAccounts/sa@proj-1.iam.gserviceaccount.com"
                  ":generateAccessToken HTTP/1.1"));
    CHECK(t_contains(f.heads[1], "\r\nAuthorization: Bearer fed.tok\r\n"));
    CHECK(t_contains(f.heads[1], "\r\nContent-Type: application/json\r\n"));
    CHECK(!strcmp(f.bodies[1],
                  "{\"scope\":[\"https://www.googleapis.com/auth/devstorage.read_write\"],"
                  "\"lifetime\":\"1800s\"}"));
    CHECK(t_contains(ckptio__gcp_creds_source(p), "external account"));
    ckptio__gcp_creds_free(p);

    static const fake_reply url_script[] = {
        {FAKE_REPLY, 200, "urn-subject-text\r\n"},
        {FAKE_REPLY, 200, "{\"access_token\": \"fed.two\", \"expires_in\": 3600}"},
    };
    fake g;
    CHECK(fake_listen(&g, url_script, N_OF(url_script), NULL) == 0);
    path = write_text("wif-url.json",
                      "{\"type\": \"external_account\", \"audience\": \"//iam.googleapis.com/x\",\n"
                      " \"subject_token_type\": \"urn:ietf:params:oauth:token-type:id_token\",\n"
                      " \"token_url\": \"http://127.0.0.1:%d/sts\",\n"
                      " \"credential_source\": {\"url\": \"http://127.0.0.1:%d/subject?x=1\",\n"
                      "   \"headers\": {\"Metadata\": \"True\", \"X-Extra\": \"a b\"}}}\n",
                      g.port, g.port);
    CHECK(path);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", path, 1);
    CHECK(provider(&p, NULL) == 0);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(!strcmp(t->token, "fed.two"));
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&g) == 2 && !strcmp(g.lines[0], "GET /subject?x=1 HTTP/1.1"));
    CHECK(t_contains(g.heads[0], "\r\nMetadata: True\r\n") &&
          t_contains(g.heads[0], "\r\nX-Extra: a b\r\n"));
    CHECK(!strcmp(g.lines[1], "POST /sts HTTP/1.1"));
    CHECK(form_value(g.bodies[1], "subject_token", v, sizeof v) && !strcmp(v, "urn-subject-text"));
    ckptio__gcp_creds_free(p);
    return 0;
}

/* What ckptio does not take is refused by name, saying what to do instead. */
static int test_refused(void)
{
    env_clear();
    struct {
        const char *text, *says;
        int rc;
    } cases[] = {
        {"{\"type\": \"external_account\", \"audience\": \"a\", \"subject_token_type\": \"t\", "
         "\"credential_source\": {\"environment_id\": \"aws1\", \"region_url\": \"http://x\"}}",
         "sourced from AWS", CKPTIO_E_UNSUPPORTED},
        {"{\"type\": \"external_account\", \"audience\": \"a\", \"subject_token_type\": \"t\", "
         "\"credential_source\": {\"executable\": {\"command\": \"/bin/true\"}}}",
         "executable", CKPTIO_E_UNSUPPORTED},
        {"{\"type\": \"impersonated_service_account\", \"source_credentials\": {}}",
         "of type 'impersonated_service_account'", CKPTIO_E_UNSUPPORTED},
        {"{\"client_email\": \"a@b\"}", "has no \"type\"", CKPTIO_E_USAGE},
        {"not json", "is not a JSON object", CKPTIO_E_USAGE},
        {"{\"type\": \"authorized_user\", \"client_id\": \"c\"}", "no string \"client_secret\"",
         CKPTIO_E_USAGE},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        const char *path = write_text("c.json", "%s", cases[i].text);
        CHECK(path);
        setenv("GOOGLE_APPLICATION_CREDENTIALS", path, 1);
        ckptio__gcp_creds *p;
        ckptio__gcp_token *t;
        CHECK(provider(&p, NULL) == 0);
        CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), cases[i].rc);
        printf("%s\n", ckptio_last_error());
        CHECK(t_contains(ckptio_last_error(), cases[i].says) &&
              t_contains(ckptio_last_error(), path));
        CHECK(t_contains(ckptio_last_error(), "GOOGLE_APPLICATION_CREDENTIALS"));
        ckptio__gcp_creds_free(p);
    }
    return 0;
}

/* The metadata server: asked with Metadata-Flavor: Google, believed only when it answers with
 * it too (GCE_METADATA_HOST, then GCE_METADATA_IP). */
static int test_metadata(void)
{
    static const fake_reply gce[] = {
        {FAKE_REPLY, 200,
         "{\"access_token\": \"ya29.gce\", \"expires_in\": 3599, "
         "\"token_type\": \"Bearer\"}"},
    };
    static const fake_reply other[] = {{FAKE_REPLY, 200, "{\"access_token\": \"x\"}"}};
    env_clear();
    unsetenv("NO_GCE_CHECK");
    fake f, g;
    CHECK(fake_listen(&f, gce, 1, "Metadata-Flavor: Google\r\n") == 0);
    CHECK(fake_listen(&g, other, 1, NULL) == 0);
    char host[64];
    snprintf(host, sizeof host, "127.0.0.1:%d", f.port);
    setenv("GCE_METADATA_HOST", host, 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t;
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(!strcmp(t->token, "ya29.gce"));
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&f) == 1);
    CHECK(!strcmp(f.lines[0],
                  "GET /computeMetadata/v1/instance/service-accounts/default/token HTTP/1.1"));
    CHECK(t_contains(f.heads[0], "\r\nMetadata-Flavor: Google\r\n"));
    CHECK(t_contains(ckptio__gcp_creds_source(p), "metadata server") &&
          t_contains(ckptio__gcp_creds_source(p), host));
    ckptio__gcp_creds_free(p);

    unsetenv("GCE_METADATA_HOST");
    snprintf(host, sizeof host, "127.0.0.1:%d", g.port);
    setenv("GCE_METADATA_IP", host, 1);
    CHECK(provider(&p, NULL) == 0);
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), CKPTIO_E_USAGE);
    printf("%s\n", ckptio_last_error());
    CHECK(fake_count(&g) == 1 &&
          t_contains(ckptio_last_error(), "without Metadata-Flavor: Google"));
    ckptio__gcp_creds_free(p);
    return 0;
}

/* An emulator: no credentials are looked for (not even a file named in the environment),
 * unless this client's settings give some. */
static int test_emulator(void)
{
    env_clear();
    setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9", 1);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", t_path("missing.json"), 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t = (ckptio__gcp_token *)1;
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(t == NULL && !ckptio__gcp_creds_expired(p, NULL));
    CHECK(t_contains(ckptio__gcp_creds_source(p), "STORAGE_EMULATOR_HOST"));
    ckptio__gcp_token_put(t);
    ckptio__gcp_creds_free(p);

    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    CHECK_OK(ckptio_store_opts_set(o, "token", "ya29.given"));
    CHECK(provider(&p, o) == 0);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(t && !strcmp(t->token, "ya29.given") && t->expires == 0);
    CHECK(!ckptio__gcp_creds_expired(p, t)); /* a given token cannot be refreshed */
    ckptio__gcp_token_put(t);
    CHECK(t_contains(ckptio__gcp_creds_source(p), "settings"));
    ckptio__gcp_creds_free(p);
    CHECK_OK(ckptio_store_opts_set(o, "token", "two words"));
    CHECK(provider(&p, o) == 0);
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), CKPTIO_E_USAGE);
    ckptio__gcp_creds_free(p);
    ckptio_store_opts_free(o);
    return 0;
}

/* Nothing anywhere: the message names every source tried, in order. */
static int test_none(void)
{
    env_clear();
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t;
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), CKPTIO_E_USAGE);
    const char *e = ckptio_last_error();
    printf("%s\n", e);
    static const char *const order[] = {"no Google credentials",
                                        "the store's settings (no token)",
                                        "GOOGLE_APPLICATION_CREDENTIALS is not set",
                                        "gcloud's application default credentials (no ",
                                        "/.config/gcloud/application_default_credentials.json",
                                        "metadata server (NO_GCE_CHECK=true)",
                                        "gcloud auth application-default login"};
    const char *at = e;
    for (size_t i = 0; i < N_OF(order); i++) {
        const char *hit = strstr(at, order[i]);
        CHECK(hit != NULL);
        at = hit;
    }
    CHECK(!strcmp(ckptio__gcp_creds_source(p), ""));
    ckptio__gcp_creds_free(p);
    return 0;
}

/* GOOGLE_APPLICATION_CREDENTIALS naming no file is an error naming it (no fallback to the next
 * source), as in Google's libraries. */
static int test_missing_file(void)
{
    env_clear();
    CHECK(t_sh("mkdir -p '%s/.config/gcloud' && echo '{}' > '%s/.config/gcloud/"
               "application_default_credentials.json'",
               t_dir(), t_dir()) == 0);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", t_path("nowhere/key.json"), 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    ckptio__gcp_token *t;
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), -ENOENT);
    printf("%s\n", ckptio_last_error());
    CHECK(t_contains(ckptio_last_error(), "GOOGLE_APPLICATION_CREDENTIALS") &&
          t_contains(ckptio_last_error(), t_path("nowhere/key.json")) &&
          t_contains(ckptio_last_error(), "does not exist"));
    ckptio__gcp_creds_free(p);

    setenv("GOOGLE_APPLICATION_CREDENTIALS", t_dir(), 1); /* there, but no file to read */
    CHECK(provider(&p, NULL) == 0);
    CHECK_ERR(ckptio__gcp_creds_get(p, &t, NULL), -EISDIR);
    printf("%s\n", ckptio_last_error());
    CHECK(t_contains(ckptio_last_error(), "GOOGLE_APPLICATION_CREDENTIALS: cannot read") &&
          t_contains(ckptio_last_error(), t_dir()));
    ckptio__gcp_creds_free(p);
    return 0;
}

/* The fields: settings first, then the environment; the settings' names are known. */
static int test_conf(void)
{
    env_clear();
    setenv("GOOGLE_APPLICATION_CREDENTIALS", "/env/key.json", 1);
    setenv("CLOUDSDK_CORE_PROJECT", "p-sdk", 1);
    setenv("CLOUDSDK_CONFIG", "/cfg", 1);
    setenv("GCE_METADATA_IP", "10.0.0.1", 1);
    ckptio__gcp_conf a = {0}, b = {0};
    CHECK_OK(ckptio__gcp_conf_read(&a, NULL, NULL));
    CHECK(!strcmp(a.v[CKPTIO__GCP_CREDS_FILE], "/env/key.json") &&
          !a.v[CKPTIO__GCP_CREDS_FILE_GIVEN]);
    CHECK(!strcmp(a.v[CKPTIO__GCP_PROJECT], "p-sdk") && !a.v[CKPTIO__GCP_TOKEN]);
    CHECK(!strcmp(a.v[CKPTIO__GCP_GCLOUD_FILE], "/cfg/application_default_credentials.json"));
    CHECK(!strcmp(a.v[CKPTIO__GCP_METADATA_HOST], "10.0.0.1"));
    CHECK(!strcmp(a.v[CKPTIO__GCP_NO_GCE_CHECK], "true") && !a.v[CKPTIO__GCP_EMULATOR]);
    setenv("GOOGLE_CLOUD_PROJECT", "p-env", 1);
    setenv("GCE_METADATA_HOST", "10.0.0.2:8080", 1);
    unsetenv("CLOUDSDK_CONFIG");

    ckptio_store_opts *o;
    CHECK_OK(ckptio_store_opts_new(&o));
    CHECK_ERR(ckptio_store_opts_set(o, "credential_file", "/x"), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "credentials_file"));
    CHECK_OK(ckptio_store_opts_set(o, "credentials_file", "/given/key.json"));
    CHECK_OK(ckptio_store_opts_set(o, "project", "p-given"));
    CHECK_OK(ckptio_store_opts_set(o, "ca_bundle", "/ca.pem"));
    CHECK_OK(ckptio__gcp_conf_read(&b, o, NULL));
    CHECK(!strcmp(b.v[CKPTIO__GCP_CREDS_FILE], "/given/key.json"));
    CHECK(!strcmp(b.v[CKPTIO__GCP_CREDS_FILE_GIVEN], "1") &&
          !strcmp(b.v[CKPTIO__GCP_PROJECT], "p-given"));
    CHECK(!strcmp(b.v[CKPTIO__GCP_CA], "/ca.pem") &&
          !strcmp(b.v[CKPTIO__GCP_METADATA_HOST], "10.0.0.2:8080"));
    char gcloud[4200];
    snprintf(gcloud, sizeof gcloud, "%s/.config/gcloud/application_default_credentials.json",
             t_dir());
    CHECK(!strcmp(b.v[CKPTIO__GCP_GCLOUD_FILE], gcloud));
    char *ka = ckptio__gcp_conf_key(&a), *kb = ckptio__gcp_conf_key(&b);
    CHECK(ka && kb && strcmp(ka, kb));
    ckptio__gcp_conf_wipe_key(ka);
    ckptio__gcp_conf_wipe_key(kb);
    ckptio__gcp_creds *p;
    CHECK_OK(ckptio__gcp_creds_new(&p, &b, NULL));
    CHECK(!strcmp(ckptio__gcp_creds_project(p), "p-given"));
    ckptio__gcp_creds_free(p);
    ckptio__gcp_conf_free(&a);
    ckptio__gcp_conf_free(&b);
    CHECK_OK(ckptio__gcp_conf_read(&a, NULL, NULL));
    CHECK(!strcmp(a.v[CKPTIO__GCP_PROJECT], "p-env")); /* GOOGLE_CLOUD_PROJECT first */
    ckptio__gcp_conf_free(&a);
    ckptio_store_opts_free(o);
    return 0;
}

/* 3-second tokens taken by 8 threads for 5 seconds: none fails or is expired, and they are
 * fetched again before they expire, once per expiry rather than once per thread. Run under
 * TSan by make test-sanitize. */
typedef struct loop_arg {
    ckptio__gcp_creds *p;
    int fails, gets;
} loop_arg;

static void *get_loop(void *arg)
{
    loop_arg *a = arg;
    double end = ckptio__now() + 5;
    while (ckptio__now() < end) {
        ckptio__gcp_token *t;
        if (ckptio__gcp_creds_get(a->p, &t, NULL) < 0 || strcmp(t->token, "ya29.short") ||
            t->expires <= (int64_t)time(NULL)) {
            __atomic_add_fetch(&a->fails, 1, __ATOMIC_RELAXED);
            break;
        }
        __atomic_add_fetch(&a->gets, 1, __ATOMIC_RELAXED);
        ckptio__gcp_token_put(t);
    }
    return NULL;
}

static int test_refresh_threads(void)
{
    static const fake_reply script[] = {
        {FAKE_REPLY, 200, "{\"access_token\": \"ya29.short\", \"expires_in\": 3}"},
    };
    fake f;
    CHECK(serve(&f, script, 1) == 0);
    const char *path = write_text("user.json",
                                  "{\"type\": \"authorized_user\", \"client_id\": \"c\", "
                                  "\"client_secret\": \"s\", \"refresh_token\": \"r\", "
                                  "\"token_uri\": \"http://127.0.0.1:%d/token\"}",
                                  f.port);
    CHECK(path);
    setenv("GOOGLE_APPLICATION_CREDENTIALS", path, 1);
    ckptio__gcp_creds *p;
    CHECK(provider(&p, NULL) == 0);
    loop_arg a = {p, 0, 0};
    pthread_t th[8];
    for (int i = 0; i < 8; i++) CHECK(pthread_create(&th[i], NULL, get_loop, &a) == 0);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    unsigned asked = fake_count(&f);
    printf("%u token requests for %d gets by 8 threads over 5 s; source: %s\n", asked, a.gets,
           ckptio__gcp_creds_source(p));
    CHECK(a.fails == 0 && a.gets > 8);
    CHECK(asked >= 2 && asked <= 8); /* one per refresh: per thread would be 8 per refresh */
    ckptio__gcp_token *t;
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    CHECK(ckptio__gcp_creds_expired(p, t));
    ckptio__gcp_token_put(t);
    CHECK_OK(ckptio__gcp_creds_get(p, &t, NULL));
    ckptio__gcp_token_put(t);
    CHECK(fake_count(&f) == asked + 1);
    ckptio__gcp_creds_free(p);
    return 0;
}

const ckptio_test tests_gcp[] = {
    {"gcp/refresh_threads", test_refresh_threads, 0, 60},
    {"gcp/conf", test_conf, 0, 0},
    {"gcp/service_account", test_service_account, 0, 0},
    {"gcp/oauth_error", test_oauth_error, 0, 0},
    {"gcp/authorized_user", test_authorized_user, 0, 0},
    {"gcp/external_account", test_external_account, 0, 0},
    {"gcp/refused", test_refused, 0, 0},
    {"gcp/metadata", test_metadata, 0, 0},
    {"gcp/emulator", test_emulator, 0, 0},
    {"gcp/none", test_none, 0, 0},
    {"gcp/missing_file", test_missing_file, 0, 0},
    {0, 0, 0, 0},
};
