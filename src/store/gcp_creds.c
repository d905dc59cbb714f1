/* SPDX-License-Identifier: Apache-2.0 */
/* Google credentials: the Application Default Credentials chain, each source turned into an
 * OAuth2 access token (a signed JWT, a refresh token, a token exchange, the metadata server),
 * cached and refreshed before it expires. */
#include "gcp_creds.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "conf_parse.h"
#include "creds.h"
#include "http.h" /* ckptio__time_iso */
#include "http_simple.h"
#include "store.h"
#include "uri.h" /* a form is a query string */

#define SOURCE_MS           10000L /* a token endpoint, STS, IAM, a subject token URL */
#define METADATA_MS         3000L  /* the metadata server: the whole request... */
#define METADATA_CONNECT_MS 1000L  /* ...and its connection, so that off Google Cloud fails fast */
#define JWT_LIFE_S          3600   /* what Google accepts at most */
#define TOKEN_MAX           8192   /* an access token, a field of a credentials file, at most */
#define HEADERS_MAX         16     /* credential_source.headers, at most */

#define TOKEN_URI     "https://oauth2.googleapis.com/token"
#define STS_URI       "https://sts.googleapis.com/v1/token"
#define METADATA_HOST "169.254.169.254"
/* Objects read, written, listed and deleted: all the store does. */
#define SCOPE_STORAGE "https://www.googleapis.com/auth/devstorage.read_write"
/* What STS grants a federated token (its scopes are those of the identity it stands for). */
#define SCOPE_CLOUD    "https://www.googleapis.com/auth/cloud-platform"
#define GRANT_JWT      "urn:ietf:params:oauth:grant-type:jwt-bearer"
#define GRANT_EXCHANGE "urn:ietf:params:oauth:grant-type:token-exchange"
#define TYPE_ACCESS    "urn:ietf:params:oauth:token-type:access_token"

/* A formatted string (malloc'd), or NULL. */
static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* ---- settings, then the environment ---- */

static const char *env(const char *a, const char *b)
{
    const char *v = getenv(a);
    if ((!v || !*v) && b) v = getenv(b);
    return v && *v ? v : NULL;
}

static int set(ckptio__gcp_conf *c, int f, const char *v, ckptio__msg *msg)
{
    if (v && !(c->v[f] = strdup(v))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    return 0;
}

int ckptio__gcp_conf_read(ckptio__gcp_conf *c, const ckptio_store_opts *o, ckptio__msg *msg)
{
    const char *file = ckptio__opt(o, "credentials_file"), *project = ckptio__opt(o, "project");
    const char *gcloud = env("CLOUDSDK_CONFIG", NULL);
    CKPTIO__TRY(set(c, CKPTIO__GCP_TOKEN, ckptio__opt(o, "token"), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_CREDS_FILE_GIVEN, file ? "1" : NULL, msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_CREDS_FILE,
                    file ? file : env("GOOGLE_APPLICATION_CREDENTIALS", NULL), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_PROJECT,
                    project ? project : env("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_EMULATOR, env("STORAGE_EMULATOR_HOST", NULL), msg));
    CKPTIO__TRY(
        set(c, CKPTIO__GCP_METADATA_HOST, env("GCE_METADATA_HOST", "GCE_METADATA_IP"), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_NO_GCE_CHECK, env("NO_GCE_CHECK", NULL), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_CA, ckptio__opt(o, "ca_bundle"), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_ENDPOINT, ckptio__opt(o, "endpoint_url"), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_TIMEOUT, env("CKPTIO_GCS_TIMEOUT", NULL), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_STALL, env("CKPTIO_GCS_STALL", NULL), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_CONNS, env("CKPTIO_GCS_CONNECTIONS", NULL), msg));
    CKPTIO__TRY(set(c, CKPTIO__GCP_FIRST_TIMEOUT, env("CKPTIO_GCS_FIRST_TIMEOUT", NULL), msg));
    /* Where gcloud auth application-default login writes (Linux and macOS). */
    char *adc = gcloud ? dupf("%s/application_default_credentials.json", gcloud)
                       : ckptio__home_path(".config/gcloud/application_default_credentials.json");
    if (!adc && (gcloud || env("HOME", NULL))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    c->v[CKPTIO__GCP_GCLOUD_FILE] = adc;
    return 0;
}

char *ckptio__gcp_conf_key(const ckptio__gcp_conf *c)
{
    return ckptio__fields_key(c->v, CKPTIO__GCP_N);
}

void ckptio__gcp_conf_wipe_key(char *key)
{
    ckptio__fields_wipe_key(key);
}

void ckptio__gcp_conf_free(ckptio__gcp_conf *c)
{
    ckptio__fields_free(c->v, CKPTIO__GCP_N);
}

/* ---- tokens ---- */

/* Whether s can go into a header as it is: one line of printable ASCII, no spaces. */
static bool header_safe(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f) return false;
    return true;
}

static ckptio__gcp_token *token_new(const char *s, int64_t expires)
{
    ckptio__gcp_token *t = calloc(1, sizeof *t);
    if (!t || !(t->token = strdup(s))) {
        free(t);
        return NULL;
    }
    t->expires = expires;
    t->refs = 1;
    return t;
}

void ckptio__gcp_token_put(ckptio__gcp_token *t)
{
    if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    OPENSSL_cleanse(t->token, strlen(t->token));
    free(t->token);
    free(t);
}

static void token_hold(void *t)
{
    __atomic_add_fetch(&((ckptio__gcp_token *)t)->refs, 1, __ATOMIC_ACQ_REL);
}

static void token_drop(void *t)
{
    ckptio__gcp_token_put(t);
}

/* ---- the provider ---- */

struct ckptio__gcp_creds {
    ckptio__gcp_conf conf;
    ckptio__cred_cache cache; /* of ckptio__gcp_token */
    bool anonymous;           /* an emulator: no token at all */
    int source;               /* the chain's step that answered: SRC_*; 0 before (atomic) */
    char source_name[512];
};

enum { SRC_NONE, SRC_SETTINGS, SRC_FILE, SRC_GCLOUD, SRC_METADATA, SRC_EMULATOR };

static int load(void *owner, void **out, int64_t *expires, ckptio__msg *msg);

static void name_source(ckptio__gcp_creds *p, int src, const char *how)
{
    /* Readers see the name only once source is set; it is written when the source changes,
     * by the one loader there is at a time. */
    if (__atomic_load_n(&p->source, __ATOMIC_RELAXED) == src) return;
    snprintf(p->source_name, sizeof p->source_name, "%s", how);
    __atomic_store_n(&p->source, src, __ATOMIC_RELEASE);
}

int ckptio__gcp_creds_new(ckptio__gcp_creds **out, const ckptio__gcp_conf *c, ckptio__msg *msg)
{
    *out = NULL;
    ckptio__gcp_creds *p = calloc(1, sizeof *p);
    if (!p) return ckptio__fail(msg, -ENOMEM, "out of memory");
    for (int i = 0; i < CKPTIO__GCP_N; i++)
        if (c->v[i] && !(p->conf.v[i] = strdup(c->v[i]))) {
            ckptio__gcp_conf_free(&p->conf);
            free(p);
            return ckptio__fail(msg, -ENOMEM, "out of memory");
        }
    const char *emu = c->v[CKPTIO__GCP_EMULATOR];
    /* As Google's libraries: credentials given to this client win over the emulator. */
    if (emu && !c->v[CKPTIO__GCP_TOKEN] && !c->v[CKPTIO__GCP_CREDS_FILE_GIVEN]) {
        char how[300];
        snprintf(how, sizeof how, "none: STORAGE_EMULATOR_HOST=%.200s (an emulator)", emu);
        p->anonymous = true;
        name_source(p, SRC_EMULATOR, how);
    }
    ckptio__cred_cache_init(&p->cache, p, load, token_hold, token_drop);
    *out = p;
    return 0;
}

void ckptio__gcp_creds_free(ckptio__gcp_creds *p)
{
    if (!p) return;
    ckptio__cred_cache_free(&p->cache);
    ckptio__gcp_conf_free(&p->conf);
    free(p);
}

void ckptio__gcp_creds_after_fork(ckptio__gcp_creds *p)
{
    ckptio__cred_cache_after_fork(&p->cache);
}

const char *ckptio__gcp_creds_project(const ckptio__gcp_creds *p)
{
    return p->conf.v[CKPTIO__GCP_PROJECT];
}

const char *ckptio__gcp_creds_source(ckptio__gcp_creds *p)
{
    return __atomic_load_n(&p->source, __ATOMIC_ACQUIRE) ? p->source_name : "";
}

/* ---- asking for a token ---- */

static void answer_free(ckptio__http_answer *a)
{
    if (a->body) OPENSSL_cleanse(a->body, strlen(a->body));
    free(a->body);
    a->body = NULL;
}

/* What an error answer says: OAuth's {"error", "error_description"}, or Google APIs'
 * {"error": {"status", "message"}}; else the start of the body. */
static void error_text(const char *body, char *out, size_t cap)
{
    size_t len = strlen(body);
    char e[128] = "", d[512] = "";
    if (ckptio__json_str(body, len, "error", e, sizeof e) == 1 ||
        ckptio__json_str(body, len, "error.status", e, sizeof e) == 1) {
        if (ckptio__json_str(body, len, "error_description", d, sizeof d) != 1)
            ckptio__json_str(body, len, "error.message", d, sizeof d);
        snprintf(out, cap, "%s%s%s", e, d[0] ? ": " : "", d);
    } else {
        snprintf(out, cap, "%.200s", body);
        for (char *c = out; *c; c++)
            if ((unsigned char)*c < 0x20) *c = ' ';
    }
}

/* A token out of a 200 answer: OAuth's {"access_token", "expires_in"} or IAM's
 * {"accessToken", "expireTime"}. 1 with *out, or < 0 naming who asked where. */
static int token_of(const ckptio__http_answer *a, bool iam, const char *who, const char *url,
                    ckptio__gcp_token **out, ckptio__msg *msg)
{
    size_t len = strlen(a->body);
    char tok[TOKEN_MAX], when[64];
    int64_t now = (int64_t)time(NULL), in = JWT_LIFE_S, expires = 0;
    int rc;
    if (a->status != 200) {
        char why[700];
        error_text(a->body, why, sizeof why);
        return ckptio__fail(
            msg, a->status == 400 || a->status == 401 || a->status == 403 ? -EACCES : -EIO,
            "%s: %s answered HTTP %ld: %s", who, url, a->status, why);
    }
    if (iam) {
        rc = ckptio__json_str(a->body, len, "accessToken", tok, sizeof tok);
        if (rc == 1 && (ckptio__json_str(a->body, len, "expireTime", when, sizeof when) != 1 ||
                        ckptio__time_iso(when, &expires) < 0))
            rc = CKPTIO_E_CORRUPT;
    } else {
        rc = ckptio__json_str(a->body, len, "access_token", tok, sizeof tok);
        /* Without expires_in, an hour (Google's usual life) rather than forever. */
        if (rc == 1 && ckptio__json_int(a->body, len, "expires_in", &in) < 0) rc = CKPTIO_E_CORRUPT;
        expires = now + CKPTIO__MIN(CKPTIO__MAX(in, 0), (int64_t)86400 * 365);
    }
    if (rc == 1 && tok[0] && header_safe(tok))
        rc = (*out = token_new(tok, expires)) ? 1 : -ENOMEM;
    else
        rc = ckptio__fail(msg, -EPROTO, "%s: %s answered no %s", who, url,
                          iam ? "accessToken and expireTime" : "access_token");
    OPENSSL_cleanse(tok, sizeof tok);
    return rc == -ENOMEM ? ckptio__fail(msg, rc, "out of memory") : rc;
}

/* POST body to url and take the token it answers. */
static int ask(const ckptio__gcp_creds *p, const char *who, const char *url,
               const char *const *headers, const char *body, bool iam, ckptio__gcp_token **out,
               ckptio__msg *msg)
{
    ckptio__http_req rq = {.method = "POST",
                           .url = url,
                           .headers = headers,
                           .body = body,
                           .ca_bundle = p->conf.v[CKPTIO__GCP_CA],
                           .timeout_ms = SOURCE_MS};
    ckptio__http_answer a;
    char err[CURL_ERROR_SIZE + 64];
    int rc = ckptio__http_simple(&rq, &a, err, sizeof err);
    if (rc < 0) return ckptio__fail(msg, rc, "%s: %s: %s", who, url, err);
    rc = token_of(&a, iam, who, url, out, msg);
    answer_free(&a);
    return rc;
}

/* A form of n pairs (malloc'd; wipe it: it holds a secret), or NULL. */
static char *form(const ckptio__kv *kv, unsigned n)
{
    return ckptio__uri_query(kv, n);
}

static void wipe(char *s)
{
    if (s) OPENSSL_cleanse(s, strlen(s));
    free(s);
}

/* ---- a credentials file ---- */

typedef struct cfile {
    const ckptio__gcp_creds *p;
    const char *label, *path; /* for messages: "GOOGLE_APPLICATION_CREDENTIALS '<path>'" */
    const char *text;
    size_t len;
    char who[1400]; /* the label, the path, the kind of credentials */
    char how[512];  /* the source's name */
} cfile;

/* A string member that must be there: 1, or < 0 naming the file and the member. */
static int need(const cfile *f, const char *path, char *out, size_t cap, ckptio__msg *msg)
{
    int rc = ckptio__json_str(f->text, f->len, path, out, cap);
    if (rc == 1 && out[0]) return 1;
    return ckptio__fail(msg, CKPTIO_E_USAGE, "%s '%s': %s \"%s\"", f->label, f->path,
                        rc == CKPTIO_E_LIMIT ? "too long a" : "no string", path);
}

/* An optional string member: its value, else dflt. */
static const char *maybe(const cfile *f, const char *path, char *out, size_t cap, const char *dflt)
{
    return ckptio__json_str(f->text, f->len, path, out, cap) == 1 && out[0] ? out : dflt;
}

/* base64url without padding (RFC 7515) of n bytes into out (4 * ((n + 2) / 3) + 1 bytes). */
static void b64url(const void *in, size_t n, char *out)
{
    int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    while (len > 0 && out[len - 1] == '=') len--;
    out[len] = 0;
    for (char *c = out; *c; c++) *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
}

static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    CKPTIO__UNUSED(buf), CKPTIO__UNUSED(size), CKPTIO__UNUSED(rwflag), CKPTIO__UNUSED(u);
    return -1; /* a key file's key is never encrypted: do not prompt on a terminal */
}

/* The RS256 signature of in by the PEM key, base64url, into *out (malloc'd). */
static int sign_rs256(const cfile *f, const char *pem, const char *in, char **out, ckptio__msg *msg)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *sig = NULL;
    size_t n = 0;
    int rc = 0;
    if (!k || EVP_PKEY_base_id(k) != EVP_PKEY_RSA)
        rc = ckptio__fail(msg, CKPTIO_E_USAGE, "%s: its private_key is no RSA key in PEM", f->who);
    else if (!md || EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, k) != 1 ||
             EVP_DigestSign(md, NULL, &n, (const unsigned char *)in, strlen(in)) != 1 ||
             !(sig = malloc(n)) ||
             EVP_DigestSign(md, sig, &n, (const unsigned char *)in, strlen(in)) != 1 ||
             !(*out = malloc(4 * ((n + 2) / 3) + 1)))
        rc = ckptio__fail(msg, -ENOMEM, "%s: cannot sign a JWT with its private_key", f->who);
    else
        b64url(sig, n, *out);
    ERR_clear_error(); /* leave no failure of ours behind for another user of libcrypto */
    free(sig);
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(k);
    BIO_free(b);
    return rc;
}

/* The JSON string body of s into out: false when it does not fit. */
static bool escaped(const char *s, char *out, size_t cap)
{
    return ckptio__json_escape(s, out, cap) < cap;
}

/* s encoded as base64url (malloc'd), or NULL. */
static char *b64url_of(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out) b64url(s, n, out);
    return out;
}

/* A service account's key: a JWT it signs (RFC 7523) traded at token_uri for a token. */
static int service_account(cfile *f, ckptio__gcp_token **out, ckptio__msg *msg)
{
    char email[320], kid[128], uri[1024], ek[300], ee[700], ea[2100];
    char *pem = malloc(TOKEN_MAX * 2), *head = NULL, *claims = NULL, *h64 = NULL, *c64 = NULL,
         *input = NULL, *sig = NULL, *jwt = NULL, *body = NULL;
    if (!pem) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = need(f, "client_email", email, sizeof email, msg);
    if (rc > 0) rc = need(f, "private_key", pem, TOKEN_MAX * 2, msg);
    const char *id = maybe(f, "private_key_id", kid, sizeof kid, NULL);
    const char *aud = maybe(f, "token_uri", uri, sizeof uri, TOKEN_URI);
    if (rc > 0) {
        snprintf(f->how, sizeof f->how, "service account '%s' (%s)", email, f->path);
        snprintf(f->who + strlen(f->who), sizeof f->who - strlen(f->who), " (service account '%s')",
                 email);
        int64_t iat = (int64_t)time(NULL);
        if (!escaped(id ? id : "", ek, sizeof ek) || !escaped(email, ee, sizeof ee) ||
            !escaped(aud, ea, sizeof ea))
            rc = ckptio__fail(msg, CKPTIO_E_USAGE,
                              "%s: its private_key_id, client_email or "
                              "token_uri holds control characters",
                              f->who);
        else if (!(head = dupf("{\"alg\":\"RS256\",\"typ\":\"JWT\"%s%s%s}", id ? ",\"kid\":\"" : "",
                               ek, id ? "\"" : "")) ||
                 !(claims = dupf("{\"iss\":\"%s\",\"scope\":\"" SCOPE_STORAGE "\",\"aud\":\"%s\","
                                 "\"iat\":%lld,\"exp\":%lld}",
                                 ee, ea, (long long)iat, (long long)(iat + JWT_LIFE_S))) ||
                 !(h64 = b64url_of(head)) || !(c64 = b64url_of(claims)) ||
                 !(input = dupf("%s.%s", h64, c64)))
            rc = ckptio__fail(msg, -ENOMEM, "out of memory");
        else
            rc = sign_rs256(f, pem, input, &sig, msg);
    }
    if (rc >= 0) jwt = dupf("%s.%s", input, sig);
    ckptio__kv kv[2] = {{"grant_type", GRANT_JWT}, {"assertion", jwt}};
    if (rc >= 0 && !(jwt && (body = form(kv, 2)))) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    const char *hs[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
    if (rc >= 0) rc = ask(f->p, f->who, aud, hs, body, false, out, msg);
    OPENSSL_cleanse(pem, TOKEN_MAX * 2);
    free(pem);
    free(head);
    free(claims);
    free(h64);
    free(c64);
    free(input);
    free(sig);
    wipe(jwt);
    wipe(body);
    return rc;
}

/* A user's refresh token (gcloud auth application-default login) traded for a token. */
static int authorized_user(cfile *f, ckptio__gcp_token **out, ckptio__msg *msg)
{
    char id[512], secret[512], refresh[TOKEN_MAX], uri[1024], *body = NULL;
    int rc = need(f, "client_id", id, sizeof id, msg);
    if (rc > 0) rc = need(f, "client_secret", secret, sizeof secret, msg);
    if (rc > 0) rc = need(f, "refresh_token", refresh, sizeof refresh, msg);
    const char *url = maybe(f, "token_uri", uri, sizeof uri, TOKEN_URI);
    snprintf(f->how, sizeof f->how, "authorized user (%s)", f->path);
    snprintf(f->who + strlen(f->who), sizeof f->who - strlen(f->who), " (authorized_user)");
    ckptio__kv kv[4] = {{"grant_type", "refresh_token"},
                        {"client_id", id},
                        {"client_secret", secret},
                        {"refresh_token", refresh}};
    if (rc > 0 && !(body = form(kv, 4))) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    const char *hs[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
    if (rc > 0) rc = ask(f->p, f->who, url, hs, body, false, out, msg);
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(refresh, sizeof refresh);
    wipe(body);
    return rc;
}

/* The subject token of an external account out of what its source gave (text, NUL-terminated):
 * the whole text (format "text", trailing white space cut) or one member (format "json"). */
static int subject_of(cfile *f, const char *from, char *text, char **out, ckptio__msg *msg)
{
    char type[16], field[256];
    const char *t = maybe(f, "credential_source.format.type", type, sizeof type, "text");
    size_t len = strlen(text);
    *out = NULL;
    if (!strcmp(t, "json")) {
        if (ckptio__json_str(f->text, f->len, "credential_source.format.subject_token_field_name",
                             field, sizeof field) != 1)
            return ckptio__fail(msg, CKPTIO_E_USAGE,
                                "%s: credential_source.format is json without "
                                "a subject_token_field_name",
                                f->who);
        char *v = malloc(len + 1); /* a decoded string is never longer than its JSON */
        if (!v) return ckptio__fail(msg, -ENOMEM, "out of memory");
        if (ckptio__json_str(text, len, field, v, len + 1) != 1 || !v[0]) {
            free(v);
            return ckptio__fail(msg, -EPROTO, "%s: %s holds no string \"%s\"", f->who, from, field);
        }
        *out = v;
        return 0;
    }
    if (strcmp(t, "text"))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s: credential_source.format.type is '%s', "
                            "neither text nor json",
                            f->who, t);
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) len--;
    if (!len) return ckptio__fail(msg, -EPROTO, "%s: %s is empty", f->who, from);
    if (!(*out = strndup(text, len))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    return 0;
}

/* credential_source.url: GET with credential_source.headers. */
static int subject_from_url(cfile *f, const char *url, char **out, ckptio__msg *msg)
{
    char *lines[HEADERS_MAX + 1] = {0}, key[256], value[4096], err[CURL_ERROR_SIZE + 64];
    int rc = 0, n = 0;
    for (int r;
         rc == 0 && (r = ckptio__json_member(f->text, f->len, "credential_source.headers",
                                             (size_t)n, key, sizeof key, value, sizeof value)) != 0;
         n++) {
        if (r < 0 || n == HEADERS_MAX || strpbrk(key, "\r\n:") || strpbrk(value, "\r\n"))
            rc = ckptio__fail(msg, CKPTIO_E_USAGE,
                              "%s: credential_source.headers must be at most "
                              "%d one-line strings",
                              f->who, HEADERS_MAX);
        else if (!(lines[n] = dupf("%s: %s", key, value)))
            rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    ckptio__http_answer a = {0};
    if (rc == 0) {
        ckptio__http_req rq = {.method = "GET",
                               .url = url,
                               .headers = (const char *const *)lines,
                               .ca_bundle = f->p->conf.v[CKPTIO__GCP_CA],
                               .timeout_ms = SOURCE_MS};
        rc = ckptio__http_simple(&rq, &a, err, sizeof err);
        if (rc < 0)
            rc = ckptio__fail(msg, rc, "%s: the subject token at %s: %s", f->who, url, err);
        else if (a.status != 200)
            rc = ckptio__fail(msg, -EIO, "%s: the subject token at %s: HTTP %ld", f->who, url,
                              a.status);
    }
    if (rc == 0) rc = subject_of(f, url, a.body, out, msg);
    answer_free(&a);
    for (int i = 0; i < HEADERS_MAX; i++) wipe(lines[i]);
    return rc;
}

/* Workload identity federation: a subject token from a file or a URL, exchanged at STS
 * (RFC 8693) for a federated token, which may then impersonate a service account. */
static int external_account(cfile *f, ckptio__gcp_token **out, ckptio__msg *msg)
{
    char aud[1024], stype[256], sts_uri[1024], imp_uri[1024], where[1024], env_id[64], project[256],
        opts[600], esc[520], id[512], secret[512], pair[1100], b64[1500];
    char *subject = NULL, *text = NULL, *body = NULL, *basic = NULL, *bearer = NULL, *json = NULL;
    ckptio__gcp_token *fed = NULL;
    snprintf(f->how, sizeof f->how, "external account (%s)", f->path);
    snprintf(f->who + strlen(f->who), sizeof f->who - strlen(f->who), " (external_account)");
    if (ckptio__json_str(f->text, f->len, "credential_source.environment_id", env_id,
                         sizeof env_id) == 1 &&
        !strncasecmp(env_id, "aws", 3))
        return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                            "%s is sourced from AWS (credential_source.environment_id '%s'), which "
                            "ckptio does not take: give the job a file- or URL-sourced "
                            "configuration (gcloud iam workload-identity-pools create-cred-config "
                            "--credential-source-file or --credential-source-url), a "
                            "service-account key, or an access token in the store's token setting",
                            f->who, env_id);
    if (ckptio__json_get(f->text, f->len, "credential_source.executable", where, sizeof where) != 0)
        return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                            "%s is sourced from an executable, which ckptio does not run: run it "
                            "yourself and give ckptio a file-sourced configuration, or an access "
                            "token in the store's token setting",
                            f->who);
    int rc = need(f, "audience", aud, sizeof aud, msg);
    if (rc > 0) rc = need(f, "subject_token_type", stype, sizeof stype, msg);
    const char *sts = maybe(f, "token_url", sts_uri, sizeof sts_uri, STS_URI);
    const char *imp = maybe(f, "service_account_impersonation_url", imp_uri, sizeof imp_uri, NULL);
    if (rc < 0) return rc;
    if (maybe(f, "credential_source.file", where, sizeof where, NULL)) {
        rc = ckptio__read_text(where, &text, msg); /* read each time: it is rotated */
        if (rc == 0)
            rc = ckptio__fail(msg, -ENOENT, "%s: its credential_source.file '%s' does not exist",
                              f->who, where);
        if (rc > 0) rc = subject_of(f, where, text, &subject, msg);
        wipe(text);
    } else if (maybe(f, "credential_source.url", where, sizeof where, NULL)) {
        rc = subject_from_url(f, where, &subject, msg);
    } else {
        rc = ckptio__fail(msg, CKPTIO_E_USAGE, "%s: its credential_source has no file and no url",
                          f->who);
    }
    if (rc < 0) return rc;
    /* A client of the pool authenticates to STS itself; else a workforce pool bills a project. */
    const char *cid = maybe(f, "client_id", id, sizeof id, NULL);
    const char *csecret = maybe(f, "client_secret", secret, sizeof secret, "");
    opts[0] = 0;
    if (!cid && maybe(f, "workforce_pool_user_project", project, sizeof project, NULL)) {
        ckptio__json_escape(project, esc, sizeof esc);
        snprintf(opts, sizeof opts, "{\"userProject\":\"%s\"}", esc);
    }
    ckptio__kv kv[7] = {{"grant_type", GRANT_EXCHANGE},
                        {"audience", aud},
                        {"scope", SCOPE_CLOUD},
                        {"requested_token_type", TYPE_ACCESS},
                        {"subject_token_type", stype},
                        {"subject_token", subject},
                        {"options", opts}};
    if (cid) {
        snprintf(pair, sizeof pair, "%s:%s", cid, csecret);
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)pair, (int)strlen(pair));
        basic = dupf("Authorization: Basic %s", b64);
        OPENSSL_cleanse(pair, sizeof pair);
        OPENSSL_cleanse(b64, sizeof b64);
    }
    const char *hs[] = {"Content-Type: application/x-www-form-urlencoded", basic, NULL};
    if (!(body = form(kv, opts[0] ? 7 : 6)) || (cid && !basic))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    else
        rc = ask(f->p, f->who, sts, hs, body, false, imp ? &fed : out, msg);
    if (rc > 0 && imp) {
        int64_t life = JWT_LIFE_S;
        ckptio__json_int(f->text, f->len, "service_account_impersonation.token_lifetime_seconds",
                         &life);
        bearer = dupf("Authorization: Bearer %s", fed->token);
        json = dupf("{\"scope\":[\"" SCOPE_STORAGE "\"],\"lifetime\":\"%llds\"}", (long long)life);
        const char *ihs[] = {"Content-Type: application/json", bearer, NULL};
        rc = bearer && json ? ask(f->p, f->who, imp, ihs, json, true, out, msg)
                            : ckptio__fail(msg, -ENOMEM, "out of memory");
        snprintf(f->how + strlen(f->how), sizeof f->how - strlen(f->how), ", impersonating");
    }
    ckptio__gcp_token_put(fed);
    OPENSSL_cleanse(secret, sizeof secret);
    wipe(subject);
    wipe(body);
    wipe(basic);
    wipe(bearer);
    free(json);
    return rc;
}

/* The credentials of a file: each kind as Google's libraries take it. */
static int from_file(cfile *f, ckptio__gcp_token **out, ckptio__msg *msg)
{
    char type[64];
    snprintf(f->who, sizeof f->who, "%s '%s'", f->label, f->path);
    int rc = ckptio__json_str(f->text, f->len, "type", type, sizeof type);
    if (rc == CKPTIO_E_CORRUPT && ckptio__json_get(f->text, f->len, "type", type, sizeof type) < 0)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "%s is not a JSON object", f->who);
    if (rc != 1)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "%s has no \"type\": it is no Google credentials "
                            "file",
                            f->who);
    if (!strcmp(type, "service_account")) return service_account(f, out, msg);
    if (!strcmp(type, "authorized_user")) return authorized_user(f, out, msg);
    if (!strcmp(type, "external_account")) return external_account(f, out, msg);
    return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                        "%s holds credentials of type '%s', which ckptio does not take (it takes "
                        "service_account, authorized_user and external_account): point it at one "
                        "of those, or pass an access token in the store's token setting (gcloud "
                        "auth print-access-token)",
                        f->who, type);
}

/* The file at path, labelled for messages; 0 when it is not there and need not be. */
static int file_source(ckptio__gcp_creds *p, const char *label, const char *path, bool required,
                       ckptio__gcp_token **out, char *how, size_t hcap, ckptio__msg *msg)
{
    char *text;
    int rc = ckptio__read_text(path, &text, msg);
    if (rc <= 0) {
        free(text);
        if (rc < 0) return ckptio__refail(msg, msg, rc, NULL, "%s: ", label);
        return required ? ckptio__fail(msg, -ENOENT, "%s '%s' does not exist", label, path) : 0;
    }
    cfile f = {.p = p, .label = label, .path = path, .text = text, .len = strlen(text)};
    rc = from_file(&f, out, msg);
    snprintf(how, hcap, "%s", f.how);
    wipe(text);
    return rc;
}

/* Compute Engine's (and GKE's) metadata server: the token of the attached service account. */
static int metadata(ckptio__gcp_creds *p, ckptio__tried *t, ckptio__gcp_token **out, char *how,
                    size_t hcap, ckptio__msg *msg)
{
    const char *off = p->conf.v[CKPTIO__GCP_NO_GCE_CHECK],
               *host = p->conf.v[CKPTIO__GCP_METADATA_HOST];
    if (off && !strcasecmp(off, "true")) {
        ckptio__tried_add(t, "metadata server (NO_GCE_CHECK=true)");
        return 0;
    }
    if (!host) host = METADATA_HOST;
    if (strlen(host) > 255 || strpbrk(host, "/?#@ \t\r\n"))
        return ckptio__fail(msg, CKPTIO_E_USAGE, "GCE_METADATA_HOST '%.300s' is not host[:port]",
                            host);
    char url[400], err[CURL_ERROR_SIZE + 64], who[300];
    snprintf(url, sizeof url,
             "http://%s/computeMetadata/v1/instance/service-accounts/default/token", host);
    const char *hs[] = {"Metadata-Flavor: Google", NULL};
    ckptio__http_req rq = {.method = "GET",
                           .url = url,
                           .headers = hs,
                           .timeout_ms = METADATA_MS,
                           .connect_ms = METADATA_CONNECT_MS,
                           .want_header = "Metadata-Flavor"};
    ckptio__http_answer a;
    int rc = ckptio__http_simple(&rq, &a, err, sizeof err);
    if (rc < 0) {
        ckptio__tried_add(t, "metadata server (%s: %s)", host, err);
        return 0; /* not on Google Cloud (or it is unreachable): the chain ends without it */
    }
    if (strcmp(a.header, "Google")) /* something else answers there (another cloud's) */
        ckptio__tried_add(t,
                          "metadata server (%s answered HTTP %ld without Metadata-Flavor: "
                          "Google: not Google's)",
                          host, a.status);
    else if (a.status == 404)
        ckptio__tried_add(t, "metadata server (%s: no service account is attached here)", host);
    else {
        snprintf(who, sizeof who, "the metadata server %s", host);
        snprintf(how, hcap, "metadata server (%s)", host);
        rc = token_of(&a, false, who, url, out, msg);
    }
    answer_free(&a);
    return rc;
}

/* Ask the source that answered before, or walk the chain: 0 with *out, or < 0. */
static int walk(ckptio__gcp_creds *p, ckptio__gcp_token **out, ckptio__msg *msg)
{
    const ckptio__gcp_conf *f = &p->conf;
    ckptio__tried t = {{0}};
    char how[512] = "";
    int rc = 0, src = __atomic_load_n(&p->source, __ATOMIC_RELAXED), at = SRC_NONE;
    const char *tok = f->v[CKPTIO__GCP_TOKEN], *file = f->v[CKPTIO__GCP_CREDS_FILE];
    const char *adc = f->v[CKPTIO__GCP_GCLOUD_FILE];
    *out = NULL;
    if (!src || src == SRC_SETTINGS) {
        at = SRC_SETTINGS;
        snprintf(how, sizeof how, "the store's settings (token)");
        if (tok && !header_safe(tok))
            rc = ckptio__fail(msg, CKPTIO_E_USAGE,
                              "the store's token setting is not one word of "
                              "printable ASCII");
        else if (tok)
            rc = (*out = token_new(tok, 0)) ? 1 : ckptio__fail(msg, -ENOMEM, "out of memory");
        else
            ckptio__tried_add(&t, "the store's settings (no token)");
    }
    if (rc == 0 && (!src || src == SRC_FILE)) {
        at = SRC_FILE;
        if (file)
            rc = file_source(p,
                             f->v[CKPTIO__GCP_CREDS_FILE_GIVEN] ? "the credentials_file setting"
                                                                : "GOOGLE_APPLICATION_CREDENTIALS",
                             file, true, out, how, sizeof how, msg);
        else
            ckptio__tried_add(&t, "a credentials file (no credentials_file setting, "
                                  "GOOGLE_APPLICATION_CREDENTIALS is not set)");
    }
    if (rc == 0 && (!src || src == SRC_GCLOUD)) {
        at = SRC_GCLOUD;
        if (adc)
            rc = file_source(p, "gcloud's application default credentials", adc, src == SRC_GCLOUD,
                             out, how, sizeof how, msg);
        if (rc == 0)
            ckptio__tried_add(&t, "gcloud's application default credentials (%s%s)",
                              adc ? "no " : "neither CLOUDSDK_CONFIG nor HOME is set",
                              adc ? adc : "");
    }
    if (rc == 0 && (!src || src == SRC_METADATA)) {
        at = SRC_METADATA;
        rc = metadata(p, &t, out, how, sizeof how, msg);
    }
    if (rc < 0) return ckptio__tried_fail(&t, msg, rc);
    if (rc == 0)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "no Google credentials: tried, in order: %s. Set "
                            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key or a "
                            "credential configuration, run gcloud auth application-default login, "
                            "run on Google Cloud with a service account attached, or pass token or "
                            "credentials_file in the store's settings",
                            t.text);
    name_source(p, at, how);
    return 0;
}

static int load(void *owner, void **out, int64_t *expires, ckptio__msg *msg)
{
    ckptio__gcp_token *t = NULL;
    CKPTIO__TRY(walk(owner, &t, msg));
    *out = t;
    *expires = t->expires;
    return 0;
}

int ckptio__gcp_creds_get(ckptio__gcp_creds *p, ckptio__gcp_token **out, ckptio__msg *msg)
{
    void *t = NULL;
    *out = NULL;
    if (p->anonymous) return 0;
    CKPTIO__TRY(ckptio__cred_cache_get(&p->cache, &t, msg));
    *out = t;
    return 0;
}

bool ckptio__gcp_creds_expired(ckptio__gcp_creds *p, const ckptio__gcp_token *t)
{
    if (p->anonymous || __atomic_load_n(&p->source, __ATOMIC_ACQUIRE) == SRC_SETTINGS) return false;
    ckptio__cred_cache_drop(&p->cache, t); /* the next get asks the source again */
    return true;
}
