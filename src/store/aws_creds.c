/* SPDX-License-Identifier: Apache-2.0 */
/* AWS credentials: the chain the AWS SDKs walk, each source asked over HTTP or a process, the
 * answer cached and refreshed before it expires. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

#include "aws_creds.h"
#include "conf_parse.h"
#include "creds.h"
#include "http_simple.h"
#include "s3_impl.h"
#include "store.h"

extern char **environ;

#define ANSWER_MAX (1u << 20)    /* a credential_process's answer, at most */
#define SOURCE_MS 10000L         /* STS, the container endpoint: a try's bound */
#define IMDS_MS 2000L            /* the instance metadata service (1 s to connect) */
#define PROCESS_S 60.0           /* a credential_process's bound */
#define PROFILE_DEPTH 5          /* role_arn -> source_profile links followed, at most */

/* ---- settings, then the environment ---- */

static const struct {
    int field;
    const char *opt;       /* the setting, or NULL */
    const char *env[2];    /* the variables, in order */
} sources[] = {
    {CKPTIO__AWS_ENDPOINT, "endpoint_url", {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}},
    {CKPTIO__AWS_REGION, "region", {"AWS_REGION", "AWS_DEFAULT_REGION"}},
    {CKPTIO__AWS_CA, "ca_bundle", {"AWS_CA_BUNDLE", NULL}},
    {CKPTIO__AWS_ADDRESSING, "addressing_style", {NULL, NULL}},
    {CKPTIO__AWS_STS, "sts_endpoint_url", {"AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL"}},
    {CKPTIO__AWS_CONFIG_FILE, NULL, {"AWS_CONFIG_FILE", NULL}},
    {CKPTIO__AWS_CREDS_FILE, NULL, {"AWS_SHARED_CREDENTIALS_FILE", NULL}},
    {CKPTIO__AWS_WEB_TOKEN_FILE, NULL, {"AWS_WEB_IDENTITY_TOKEN_FILE", NULL}},
    {CKPTIO__AWS_ROLE_ARN, NULL, {"AWS_ROLE_ARN", NULL}},
    {CKPTIO__AWS_ROLE_SESSION, NULL, {"AWS_ROLE_SESSION_NAME", NULL}},
    {CKPTIO__AWS_CONT_FULL, NULL, {"AWS_CONTAINER_CREDENTIALS_FULL_URI", NULL}},
    {CKPTIO__AWS_CONT_REL, NULL, {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", NULL}},
    {CKPTIO__AWS_CONT_TOKEN, NULL, {"AWS_CONTAINER_AUTHORIZATION_TOKEN", NULL}},
    {CKPTIO__AWS_CONT_TOKEN_FILE, NULL, {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", NULL}},
    {CKPTIO__AWS_IMDS_OFF, NULL, {"AWS_EC2_METADATA_DISABLED", NULL}},
    {CKPTIO__AWS_IMDS_ENDPOINT, NULL, {"AWS_EC2_METADATA_SERVICE_ENDPOINT", NULL}},
    {CKPTIO__AWS_TIMEOUT, NULL, {"CKPTIO_S3_TIMEOUT", NULL}},
    {CKPTIO__AWS_STALL, NULL, {"CKPTIO_S3_STALL", NULL}},
    {CKPTIO__AWS_CONNS, NULL, {"CKPTIO_S3_CONNECTIONS", NULL}},
    {CKPTIO__AWS_FIRST_TIMEOUT, NULL, {"CKPTIO_S3_FIRST_TIMEOUT", NULL}},
};

static const char *env_of(const char *a, const char *b)
{
    const char *v = a ? getenv(a) : NULL;
    if ((!v || !*v) && b) v = getenv(b);
    return v && *v ? v : NULL;
}

static int put(ckptio__aws_conf *c, int f, const char *v, ckptio__msg *msg)
{
    if (!v) return 0;
    if (!(c->v[f] = strdup(v))) return ckptio__fail(msg, -ENOMEM, "out of memory");
    return 0;
}

int ckptio__aws_conf_read(ckptio__aws_conf *c, const ckptio_store_opts *o, ckptio__msg *msg)
{
    for (size_t i = 0; i < sizeof sources / sizeof *sources; i++) {
        const char *v = sources[i].opt ? ckptio__opt(o, sources[i].opt) : NULL;
        if (!v) v = env_of(sources[i].env[0], sources[i].env[1]);
        CKPTIO__TRY(put(c, sources[i].field, v, msg));
    }
    const char *id = ckptio__opt(o, "access_key_id"), *secret = ckptio__opt(o, "secret_access_key");
    const char *profile = ckptio__opt(o, "profile");
    if (!id != !secret)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "store settings: access_key_id and secret_access_key go together");
    if (id) {
        CKPTIO__TRY(put(c, CKPTIO__AWS_KEYS_GIVEN, "1", msg));
        CKPTIO__TRY(put(c, CKPTIO__AWS_KEY_ID, id, msg));
        CKPTIO__TRY(put(c, CKPTIO__AWS_SECRET, secret, msg));
        return put(c, CKPTIO__AWS_TOKEN, ckptio__opt(o, "session_token"), msg);
    }
    if (profile) { /* a profile named in the settings: the SDKs then skip the environment's keys */
        CKPTIO__TRY(put(c, CKPTIO__AWS_PROFILE_GIVEN, "1", msg));
        return put(c, CKPTIO__AWS_PROFILE, profile, msg);
    }
    CKPTIO__TRY(put(c, CKPTIO__AWS_PROFILE, env_of("AWS_PROFILE", "AWS_DEFAULT_PROFILE"), msg));
    CKPTIO__TRY(put(c, CKPTIO__AWS_KEY_ID, env_of("AWS_ACCESS_KEY_ID", NULL), msg));
    CKPTIO__TRY(put(c, CKPTIO__AWS_SECRET, env_of("AWS_SECRET_ACCESS_KEY", NULL), msg));
    return put(c, CKPTIO__AWS_TOKEN, env_of("AWS_SESSION_TOKEN", NULL), msg);
}

char *ckptio__aws_conf_key(const ckptio__aws_conf *c)
{
    return ckptio__fields_key(c->v, CKPTIO__AWS_N);
}

void ckptio__aws_conf_wipe_key(char *key)
{
    ckptio__fields_wipe_key(key);
}

void ckptio__aws_conf_free(ckptio__aws_conf *c)
{
    ckptio__fields_free(c->v, CKPTIO__AWS_N);
}

/* ---- keys ---- */

static ckptio__aws_key *key_new(const char *id, const char *secret, const char *token,
                                int64_t expires)
{
    ckptio__aws_key *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->id = strdup(id);
    k->secret = strdup(secret);
    k->token = token && *token ? strdup(token) : NULL;
    k->expires = expires;
    k->refs = 1;
    if (!k->id || !k->secret || (token && *token && !k->token)) {
        ckptio__aws_key_put(k);
        return NULL;
    }
    return k;
}

void ckptio__aws_key_put(ckptio__aws_key *k)
{
    if (!k || __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (k->secret) OPENSSL_cleanse(k->secret, strlen(k->secret));
    if (k->token) OPENSSL_cleanse(k->token, strlen(k->token));
    free(k->id);
    free(k->secret);
    free(k->token);
    free(k);
}

/* ---- the provider ---- */

struct ckptio__aws_creds {
    ckptio__aws_conf conf;
    char *config, *creds; /* the shared files' text ("" when absent) */
    char region[64];
    ckptio__cred_cache cache; /* of ckptio__aws_key */
    int source;        /* the chain's step that answered: SRC_*; 0 before (atomic) */
    char source_name[160];
};

enum { SRC_NONE, SRC_SETTINGS, SRC_ENV, SRC_WEB, SRC_PROFILE, SRC_CONTAINER, SRC_IMDS };

static int load(void *owner, void **out, int64_t *expires, ckptio__msg *msg);

static void key_hold(void *k)
{
    __atomic_add_fetch(&((ckptio__aws_key *)k)->refs, 1, __ATOMIC_ACQ_REL);
}

static void key_drop(void *k)
{
    ckptio__aws_key_put(k);
}

int ckptio__aws_creds_new(ckptio__aws_creds **out, const ckptio__aws_conf *c, ckptio__msg *msg)
{
    *out = NULL;
    ckptio__aws_creds *p = calloc(1, sizeof *p);
    if (!p) return ckptio__fail(msg, -ENOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < CKPTIO__AWS_N && rc == 0; i++)
        if (c->v[i] && !(p->conf.v[i] = strdup(c->v[i]))) rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    if (rc == 0 && !p->conf.v[CKPTIO__AWS_CONFIG_FILE])
        p->conf.v[CKPTIO__AWS_CONFIG_FILE] = ckptio__home_path(".aws/config");
    if (rc == 0 && !p->conf.v[CKPTIO__AWS_CREDS_FILE])
        p->conf.v[CKPTIO__AWS_CREDS_FILE] = ckptio__home_path(".aws/credentials");
    if (rc >= 0) rc = ckptio__read_text(p->conf.v[CKPTIO__AWS_CONFIG_FILE], &p->config, msg);
    if (rc >= 0) rc = ckptio__read_text(p->conf.v[CKPTIO__AWS_CREDS_FILE], &p->creds, msg);
    if (rc < 0) {
        ckptio__aws_conf_free(&p->conf);
        free(p->config);
        free(p->creds);
        free(p);
        return rc;
    }
    const char *region = p->conf.v[CKPTIO__AWS_REGION];
    char from_file[64];
    if (!region && ckptio__aws_profile_value(p, "region", NULL, from_file, sizeof from_file) == 1)
        region = from_file;
    snprintf(p->region, sizeof p->region, "%s", region ? region : "us-east-1");
    ckptio__cred_cache_init(&p->cache, p, load, key_hold, key_drop);
    *out = p;
    return 0;
}

void ckptio__aws_creds_free(ckptio__aws_creds *p)
{
    if (!p) return;
    ckptio__cred_cache_free(&p->cache);
    ckptio__aws_conf_free(&p->conf);
    free(p->config);
    free(p->creds);
    free(p);
}

void ckptio__aws_creds_after_fork(ckptio__aws_creds *p)
{
    ckptio__cred_cache_after_fork(&p->cache);
}

const char *ckptio__aws_creds_region(const ckptio__aws_creds *p)
{
    return p->region;
}

const char *ckptio__aws_creds_source(ckptio__aws_creds *p)
{
    return __atomic_load_n(&p->source, __ATOMIC_ACQUIRE) ? p->source_name : "";
}

static const char *profile_name(const ckptio__aws_creds *p)
{
    return p->conf.v[CKPTIO__AWS_PROFILE] ? p->conf.v[CKPTIO__AWS_PROFILE] : "default";
}

/* The config file's section of profile `name`: "default", or "profile <name>". */
static void config_section(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, strcmp(name, "default") ? "profile %s" : "%s", name);
}

/* A value of profile `name` in the config file (1 into out, 0 absent; < 0 too long). */
static int config_value(const ckptio__aws_creds *p, const char *name, const char *key,
                        const char *sub, char *out, size_t cap)
{
    char sec[300];
    config_section(name, sec, sizeof sec);
    int rc = sub ? ckptio__ini_sub(p->config, sec, key, sub, out, cap)
                 : ckptio__ini_get(p->config, sec, key, out, cap);
    if (rc == 0 && !strcmp(name, "default")) /* "[profile default]" works too */
        rc = sub ? ckptio__ini_sub(p->config, "profile default", key, sub, out, cap)
                 : ckptio__ini_get(p->config, "profile default", key, out, cap);
    return rc;
}

int ckptio__aws_profile_value(const ckptio__aws_creds *p, const char *key, const char *sub,
                              char *out, size_t cap)
{
    return config_value(p, profile_name(p), key, sub, out, cap) == 1 ? 1 : 0;
}

/* ---- HTTP for the credential sources ---- */

/* One request (ckptio__http_simple) with the client's CAs: *status and the body (malloc'd) when
 * an answer came; else < 0 with why in err. */
static int http(const ckptio__aws_creds *p, const char *method, const char *url,
                const char *const *headers, const char *form, long timeout_ms, long *status,
                char **body, char *err, size_t cap)
{
    ckptio__http_req rq = {.method = method, .url = url, .headers = headers, .body = form,
                           .ca_bundle = p->conf.v[CKPTIO__AWS_CA], .timeout_ms = timeout_ms};
    ckptio__http_answer a;
    int rc = ckptio__http_simple(&rq, &a, err, cap);
    *status = a.status;
    *body = a.body;
    return rc;
}

/* ---- the sources ----
 *
 * Each returns 1 with *out set, 0 when it is not configured here (why added to the chain's
 * `tried`), or < 0 when it is and failed (msg says why). */

typedef struct chain {
    ckptio__aws_creds *p;
    ckptio__tried tried;
} chain;

/* Credentials from a JSON answer (container, instance metadata, credential_process): the
 * token's member is "Token" or "SessionToken". */
static int from_json(const char *text, const char *what, ckptio__aws_key **out, ckptio__msg *msg)
{
    char id[256], secret[256], token[8192], exp[64] = "";
    size_t len = strlen(text);
    int a = ckptio__json_str(text, len, "AccessKeyId", id, sizeof id);
    int b = ckptio__json_str(text, len, "SecretAccessKey", secret, sizeof secret);
    int t = ckptio__json_str(text, len, "Token", token, sizeof token);
    if (t == 0) t = ckptio__json_str(text, len, "SessionToken", token, sizeof token);
    int e = ckptio__json_str(text, len, "Expiration", exp, sizeof exp);
    int rc = 0;
    int64_t expires = 0;
    if (a != 1 || b != 1 || t < 0 || e < 0)
        rc = ckptio__fail(msg, -EPROTO, "%s answered no credentials (AccessKeyId and "
                                        "SecretAccessKey in a JSON object)", what);
    else if (e == 1 && ckptio__time_iso(exp, &expires) < 0)
        rc = ckptio__fail(msg, -EPROTO, "%s answered an Expiration that is no time: '%.40s'", what, exp);
    else if (!(*out = key_new(id, secret, t == 1 ? token : NULL, expires)))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(token, sizeof token);
    return rc < 0 ? rc : 1;
}

/* The host[:port] of an http(s) URL into out. */
static int url_host(const char *url, char *out, size_t cap)
{
    const char *h = !strncmp(url, "http://", 7) ? url + 7 : !strncmp(url, "https://", 8) ? url + 8 : NULL;
    if (!h) return -1;
    size_t n = strcspn(h, "/?#");
    if (!n || n >= cap) return -1;
    memcpy(out, h, n);
    out[n] = 0;
    return 0;
}

/* An STS call (the query API, a form POSTed as the SDKs send it): AssumeRoleWithWebIdentity
 * unsigned, AssumeRole signed with `signer`. */
static int sts(chain *c, const char *action, ckptio__kv *q, unsigned nq,
               const ckptio__aws_key *signer, ckptio__aws_key **out, ckptio__msg *msg)
{
    ckptio__aws_creds *p = c->p;
    char base[512], host[300], date[20], auth[CKPTIO__S3_AUTH_MAX], err[CURL_ERROR_SIZE + 64];
    const char *ep = p->conf.v[CKPTIO__AWS_STS];
    if (ep) snprintf(base, sizeof base, "%s", ep);
    else snprintf(base, sizeof base, "https://sts.%s.amazonaws.com", p->region);
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') base[--bl] = 0;
    if (url_host(base, host, sizeof host) < 0)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "the STS endpoint '%s' is not of the form "
                                                 "http[s]://host[:port]", base);
    ckptio__kv all[8];
    unsigned n = 0;
    all[n++] = (ckptio__kv){"Action", action};
    all[n++] = (ckptio__kv){"Version", "2011-06-15"};
    for (unsigned i = 0; i < nq && n < 8; i++) all[n++] = q[i];
    char *form = ckptio__uri_query(all, n), *url = NULL;
    if (!form || asprintf(&url, "%s/", base) < 0) {
        free(form);
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    const char *ctype = "application/x-www-form-urlencoded; charset=utf-8";
    const char *hs[6] = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8", NULL};
    char lines[3][CKPTIO__S3_AUTH_MAX + 64], *tokline = NULL;
    if (signer) {
        char phash[65];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y%m%dT%H%M%SZ", &tm);
        ckptio__s3_sha256_hex(form, strlen(form), phash);
        ckptio__kv sh[5] = {{"content-type", ctype}, {"host", host},
                            {"x-amz-content-sha256", phash}, {"x-amz-date", date},
                            {"x-amz-security-token", signer->token}};
        ckptio__s3_sig_in in = {"POST", "/", NULL, 0, sh, signer->token ? 5u : 4u, phash, date,
                                p->region, signer->id, signer->secret, "sts"};
        if (ckptio__s3_sign(&in, auth) < 0 ||
            (signer->token && asprintf(&tokline, "x-amz-security-token: %s", signer->token) < 0)) {
            free(form);
            free(url);
            return ckptio__fail(msg, -ENOMEM, "cannot sign the STS request");
        }
        snprintf(lines[0], sizeof lines[0], "Authorization: %s", auth);
        snprintf(lines[1], sizeof lines[1], "x-amz-date: %s", date);
        snprintf(lines[2], sizeof lines[2], "x-amz-content-sha256: %s", phash);
        hs[1] = lines[0], hs[2] = lines[1], hs[3] = lines[2], hs[4] = tokline;
    }
    long status = 0;
    char *body;
    int rc = http(p, "POST", url, hs, form, SOURCE_MS, &status, &body, err, sizeof err);
    if (tokline) OPENSSL_cleanse(tokline, strlen(tokline));
    free(tokline);
    OPENSSL_cleanse(form, strlen(form)); /* a web identity token */
    free(form);
    free(url);
    if (rc < 0) return ckptio__fail(msg, rc, "STS %s at %s: %s", action, base, err);
    const char *e = body + strlen(body), *vb, *ve;
    if (status != 200) {
        char code[64] = "", text[256] = "";
        ckptio__s3_parse_error(body, strlen(body), code, sizeof code);
        if (ckptio__xml_next(body, e, "Message", &vb, &ve)) ckptio__xml_text(vb, ve, text, sizeof text);
        free(body);
        return ckptio__fail(msg, status == 403 ? -EACCES : -EIO, "STS %s at %s: HTTP %ld %s%s%s",
                            action, base, status, code, text[0] ? ": " : "", text);
    }
    char id[256] = "", secret[256] = "", token[8192] = "", exp[64] = "";
    const char *cb, *ce;
    bool ok = ckptio__xml_next(body, e, "Credentials", &cb, &ce) &&
              ckptio__xml_next(cb, ce, "AccessKeyId", &vb, &ve) &&
              ckptio__xml_text(vb, ve, id, sizeof id) > 0 &&
              ckptio__xml_next(cb, ce, "SecretAccessKey", &vb, &ve) &&
              ckptio__xml_text(vb, ve, secret, sizeof secret) > 0 &&
              ckptio__xml_next(cb, ce, "SessionToken", &vb, &ve) &&
              ckptio__xml_text(vb, ve, token, sizeof token) > 0 &&
              ckptio__xml_next(cb, ce, "Expiration", &vb, &ve) &&
              ckptio__xml_text(vb, ve, exp, sizeof exp) > 0;
    free(body);
    int64_t expires = 0;
    if (!ok || ckptio__time_iso(exp, &expires) < 0)
        rc = ckptio__fail(msg, -EPROTO, "STS %s at %s answered no credentials", action, base);
    else if (!(*out = key_new(id, secret, token, expires)))
        rc = ckptio__fail(msg, -ENOMEM, "out of memory");
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(token, sizeof token);
    return rc < 0 ? rc : 1;
}

static void session_name(const char *given, char *out, size_t cap)
{
    if (given && *given) snprintf(out, cap, "%s", given);
    else snprintf(out, cap, "ckptio-%d-%lld", (int)getpid(), (long long)time(NULL));
}

static int web_identity(chain *c, const char *token_file, const char *role, const char *session,
                        ckptio__aws_key **out, ckptio__msg *msg)
{
    char *tok = NULL;
    int fd = open(token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckptio__fail(msg, -errno, "web identity: cannot read the token file '%s': %s",
                            token_file, strerror(errno));
    close(fd);
    CKPTIO__TRY(ckptio__read_text(token_file, &tok, msg)); /* read again each time: it is rotated */
    size_t n = strlen(tok);
    while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) tok[--n] = 0;
    char name[128];
    session_name(session, name, sizeof name);
    ckptio__kv q[3] = {{"RoleArn", role}, {"RoleSessionName", name}, {"WebIdentityToken", tok}};
    int rc = sts(c, "AssumeRoleWithWebIdentity", q, 3, NULL, out, msg);
    OPENSSL_cleanse(tok, n);
    free(tok);
    return rc;
}

static bool loopback_host(const char *host)
{
    return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "[::1]") ||
           !strcmp(host, "169.254.170.2") || !strcmp(host, "169.254.170.23") ||
           !strcmp(host, "[fd00:ec2::23]");
}

static int container(chain *c, ckptio__aws_key **out, ckptio__msg *msg)
{
    ckptio__aws_creds *p = c->p;
    const char *full = p->conf.v[CKPTIO__AWS_CONT_FULL], *rel = p->conf.v[CKPTIO__AWS_CONT_REL];
    if (!full && !rel) {
        ckptio__tried_add(&c->tried, "container (AWS_CONTAINER_CREDENTIALS_FULL_URI and _RELATIVE_URI are not set)");
        return 0;
    }
    char url[1024], host[300], err[CURL_ERROR_SIZE + 64];
    if (rel) snprintf(url, sizeof url, "http://169.254.170.2%s%s", rel[0] == '/' ? "" : "/", rel);
    else snprintf(url, sizeof url, "%s", full);
    if (url_host(url, host, sizeof host) < 0) {
        return ckptio__fail(msg, CKPTIO_E_USAGE, "container credentials: '%s' is no http(s) URL", url);
    }
    char hname[300]; /* without the port: "127.0.0.1", "[::1]" */
    size_t hl = host[0] == '[' ? strcspn(host, "]") + 1 : strcspn(host, ":");
    snprintf(hname, sizeof hname, "%.*s", (int)hl, host);
    if (!strncmp(url, "http://", 7) && !loopback_host(hname))
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "container credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI '%s' is "
                            "plain http to a host that is not the loopback or the container "
                            "agent's address: use https",
                            url);
    char *tok = NULL, *line = NULL;
    const char *tfile = p->conf.v[CKPTIO__AWS_CONT_TOKEN_FILE];
    if (tfile) {
        CKPTIO__TRY(ckptio__read_text(tfile, &tok, msg)); /* read each time: EKS rotates it */
        size_t n = strlen(tok);
        while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r')) tok[--n] = 0;
    } else if (p->conf.v[CKPTIO__AWS_CONT_TOKEN] && !(tok = strdup(p->conf.v[CKPTIO__AWS_CONT_TOKEN]))) {
        return ckptio__fail(msg, -ENOMEM, "out of memory");
    }
    if (tok && (strpbrk(tok, "\r\n") || asprintf(&line, "Authorization: %s", tok) < 0)) line = NULL;
    const char *hs[2] = {line, NULL};
    long status = 0;
    char *body = NULL;
    int rc = tok && !line ? ckptio__fail(msg, CKPTIO_E_USAGE, "container credentials: the "
                                                              "authorization token is not one line")
                          : http(p, "GET", url, hs, NULL, SOURCE_MS, &status, &body, err, sizeof err);
    if (tok) OPENSSL_cleanse(tok, strlen(tok));
    if (line) OPENSSL_cleanse(line, strlen(line));
    free(tok);
    free(line);
    if (rc < 0) return msg->text[0] ? rc : ckptio__fail(msg, rc, "container credentials at %s: %s", url, err);
    if (status != 200) {
        rc = ckptio__fail(msg, status == 401 || status == 403 ? -EACCES : -EIO,
                          "container credentials at %s: HTTP %ld%s", url, status,
                          status == 401 || status == 403
                              ? " (check AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE])"
                              : "");
        free(body);
        return rc;
    }
    char what[1100];
    snprintf(what, sizeof what, "container credentials at %s", url);
    rc = from_json(body, what, out, msg);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    return rc;
}

static int imds(chain *c, ckptio__aws_key **out, ckptio__msg *msg)
{
    ckptio__aws_creds *p = c->p;
    const char *off = p->conf.v[CKPTIO__AWS_IMDS_OFF];
    if (off && !strcasecmp(off, "true")) {
        ckptio__tried_add(&c->tried, "instance metadata (AWS_EC2_METADATA_DISABLED=true)");
        return 0;
    }
    char base[512], url[700], err[CURL_ERROR_SIZE + 64], tokline[256] = "";
    const char *ep = p->conf.v[CKPTIO__AWS_IMDS_ENDPOINT];
    snprintf(base, sizeof base, "%s", ep ? ep : "http://169.254.169.254");
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/') base[--bl] = 0;
    long status = 0;
    char *body = NULL;
    /* IMDSv2: a session token first; an endpoint that does not know the PUT serves v1. */
    const char *ttl[2] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
    snprintf(url, sizeof url, "%s/latest/api/token", base);
    int rc = http(p, "PUT", url, ttl, NULL, IMDS_MS, &status, &body, err, sizeof err);
    if (rc < 0) {
        ckptio__tried_add(&c->tried, "instance metadata (%s: %s)", base, err);
        return 0; /* not on EC2 (or it is unreachable): the chain ends without it */
    }
    if (status == 200 && body[0] && !strpbrk(body, "\r\n"))
        snprintf(tokline, sizeof tokline, "X-aws-ec2-metadata-token: %.200s", body);
    else if (status != 403 && status != 404 && status != 405) {
        free(body);
        return ckptio__fail(msg, -EIO, "instance metadata at %s: the session token PUT answered HTTP %ld",
                            base, status);
    }
    free(body);
    const char *hs[2] = {tokline[0] ? tokline : NULL, NULL};
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
    rc = http(p, "GET", url, hs, NULL, IMDS_MS, &status, &body, err, sizeof err);
    if (rc < 0) return ckptio__fail(msg, rc, "instance metadata at %s: %s", base, err);
    char role[256];
    snprintf(role, sizeof role, "%.*s", (int)strcspn(body, "\r\n"), body);
    free(body);
    if (status == 404 || (status == 200 && !role[0])) {
        ckptio__tried_add(&c->tried, "instance metadata (%s: the instance has no role)", base);
        return 0;
    }
    if (status != 200 || strchr(role, '/'))
        return ckptio__fail(msg, -EIO, "instance metadata at %s: asking for the role answered HTTP %ld",
                            base, status);
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", base, role);
    rc = http(p, "GET", url, hs, NULL, IMDS_MS, &status, &body, err, sizeof err);
    if (rc < 0) return ckptio__fail(msg, rc, "instance metadata at %s: %s", base, err);
    char code[64] = "";
    if (status != 200 || (ckptio__json_str(body, strlen(body), "Code", code, sizeof code) == 1 &&
                          strcmp(code, "Success"))) {
        free(body);
        return ckptio__fail(msg, -EIO, "instance metadata at %s: the role '%s' answered HTTP %ld %s",
                            base, role, status, code);
    }
    char what[700];
    snprintf(what, sizeof what, "instance metadata at %s", base);
    rc = from_json(body, what, out, msg);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    return rc;
}

/* Run a profile's credential_process (through /bin/sh, with the environment) and take the JSON
 * it prints (Version 1). */
static int process(const char *cmd, const char *profile, ckptio__aws_key **out, ckptio__msg *msg)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) return ckptio__fail(msg, -errno, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    char *argv[] = {"sh", "-c", (char *)cmd, NULL};
    pid_t pid;
    int e = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (e) {
        close(fds[0]);
        return ckptio__fail(msg, -e, "profile '%s': cannot run credential_process: %s", profile, strerror(e));
    }
    char *buf = malloc(ANSWER_MAX + 1);
    size_t len = 0;
    double t0 = ckptio__now();
    bool late = false;
    while (buf && len < ANSWER_MAX) {
        double left = PROCESS_S - (ckptio__now() - t0);
        if (left <= 0) {
            late = true;
            break;
        }
        struct pollfd pf = {fds[0], POLLIN, 0};
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        ssize_t n = read(fds[0], buf + len, ANSWER_MAX - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fds[0]);
    if (late) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    int rc;
    if (!buf) return ckptio__fail(msg, -ENOMEM, "out of memory");
    buf[len] = 0;
    char ver[16] = "";
    if (late)
        rc = ckptio__fail(msg, -ETIMEDOUT, "profile '%s': credential_process ran past %.0f s", profile, PROCESS_S);
    else if (!WIFEXITED(st) || WEXITSTATUS(st))
        rc = ckptio__fail(msg, -EIO, "profile '%s': credential_process failed (exit status %d)",
                          profile, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    else if (ckptio__json_get(buf, len, "Version", ver, sizeof ver) != 1 || strcmp(ver, "1"))
        rc = ckptio__fail(msg, -EPROTO, "profile '%s': credential_process printed no JSON of "
                                        "Version 1", profile);
    else {
        char what[300];
        snprintf(what, sizeof what, "profile '%s': credential_process", profile);
        rc = from_json(buf, what, out, msg);
    }
    OPENSSL_cleanse(buf, len);
    free(buf);
    return rc;
}

static int profile_creds(chain *c, const char *name, int depth, ckptio__aws_key **out,
                         char *how, size_t hcap, ckptio__msg *msg);

/* A role assumed with credentials from source: the profile's role_arn. */
static int assume(chain *c, const char *name, const char *role, const ckptio__aws_key *src,
                  ckptio__aws_key **out, ckptio__msg *msg)
{
    char given[128] = "", dur[16] = "", ext[256] = "", sess[128];
    config_value(c->p, name, "role_session_name", NULL, given, sizeof given);
    config_value(c->p, name, "duration_seconds", NULL, dur, sizeof dur);
    config_value(c->p, name, "external_id", NULL, ext, sizeof ext);
    session_name(given, sess, sizeof sess);
    ckptio__kv q[4] = {{"RoleArn", role}, {"RoleSessionName", sess}};
    unsigned n = 2;
    if (dur[0]) q[n++] = (ckptio__kv){"DurationSeconds", dur};
    if (ext[0]) q[n++] = (ckptio__kv){"ExternalId", ext};
    return sts(c, "AssumeRole", q, n, src, out, msg);
}

static int from_env(chain *c, ckptio__aws_key **out, ckptio__msg *msg);

/* Credentials of profile `name`: its keys in the credentials file, else in the config file;
 * role_arn with source_profile, credential_source or web_identity_token_file; a
 * credential_process. how: which of them, for messages. */
static int profile_creds(chain *c, const char *name, int depth, ckptio__aws_key **out,
                         char *how, size_t hcap, ckptio__msg *msg)
{
    ckptio__aws_creds *p = c->p;
    char id[256] = "", secret[256] = "", token[4096] = "", role[512] = "", src[256] = "",
         csrc[64] = "", web[1024] = "", proc[2048] = "", sec[300];
    config_section(name, sec, sizeof sec);
    if (depth > PROFILE_DEPTH)
        return ckptio__fail(msg, CKPTIO_E_USAGE, "profile '%s': more than %d source_profile links "
                                                 "(a loop?)", name, PROFILE_DEPTH);
    bool in_creds = ckptio__ini_has(p->creds, name) == 1;
    bool in_config = ckptio__ini_has(p->config, sec) == 1 ||
                     (!strcmp(name, "default") && ckptio__ini_has(p->config, "profile default") == 1);
    if (!in_creds && !in_config) return 0;
    config_value(p, name, "role_arn", NULL, role, sizeof role);
    /* Keys in the credentials file win, except in a profile that assumes a role from them. */
    if (in_creds && ckptio__ini_get(p->creds, name, "aws_access_key_id", id, sizeof id) == 1 &&
        ckptio__ini_get(p->creds, name, "aws_secret_access_key", secret, sizeof secret) == 1 &&
        !(role[0] && depth == 0)) {
        ckptio__ini_get(p->creds, name, "aws_session_token", token, sizeof token);
        snprintf(how, hcap, "profile '%s' (%s)", name, p->conf.v[CKPTIO__AWS_CREDS_FILE]);
        *out = key_new(id, secret, token, 0);
    } else if (role[0]) {
        config_value(p, name, "source_profile", NULL, src, sizeof src);
        config_value(p, name, "credential_source", NULL, csrc, sizeof csrc);
        config_value(p, name, "web_identity_token_file", NULL, web, sizeof web);
        ckptio__aws_key *base = NULL;
        char inner[256];
        int rc;
        if (web[0]) {
            char sess[128] = "";
            config_value(p, name, "role_session_name", NULL, sess, sizeof sess);
            snprintf(how, hcap, "profile '%s' (web_identity_token_file)", name);
            return web_identity(c, web, role, sess, out, msg);
        }
        if (src[0]) {
            /* The source profile's own keys, even where it names a role of its own. */
            rc = !strcmp(src, name) ? 0 : profile_creds(c, src, depth + 1, &base, inner, sizeof inner, msg);
            if (!strcmp(src, name) && ckptio__ini_get(p->creds, name, "aws_access_key_id", id, sizeof id) == 1 &&
                ckptio__ini_get(p->creds, name, "aws_secret_access_key", secret, sizeof secret) == 1) {
                base = key_new(id, secret, NULL, 0);
                rc = base ? 1 : -ENOMEM;
            }
            if (rc == 0)
                return ckptio__fail(msg, CKPTIO_E_USAGE, "profile '%s': its source_profile '%s' "
                                                         "has no credentials", name, src);
        } else if (csrc[0]) {
            chain sub = {.p = p};
            if (!strcasecmp(csrc, "Environment")) rc = from_env(&sub, &base, msg);
            else if (!strcasecmp(csrc, "EcsContainer")) rc = container(&sub, &base, msg);
            else if (!strcasecmp(csrc, "Ec2InstanceMetadata")) rc = imds(&sub, &base, msg);
            else
                return ckptio__fail(msg, CKPTIO_E_USAGE, "profile '%s': credential_source '%s' is "
                                                         "none of Environment, EcsContainer, "
                                                         "Ec2InstanceMetadata", name, csrc);
            if (rc == 0)
                return ckptio__fail(msg, CKPTIO_E_USAGE, "profile '%s': credential_source %s: %s",
                                    name, csrc, sub.tried.text);
        } else {
            return ckptio__fail(msg, CKPTIO_E_USAGE, "profile '%s' has a role_arn but no "
                                                     "source_profile, credential_source or "
                                                     "web_identity_token_file", name);
        }
        if (rc < 0) return rc;
        rc = assume(c, name, role, base, out, msg);
        ckptio__aws_key_put(base);
        snprintf(how, hcap, "profile '%s' (role_arn)", name);
        return rc;
    } else if (config_value(p, name, "aws_access_key_id", NULL, id, sizeof id) == 1 &&
               config_value(p, name, "aws_secret_access_key", NULL, secret, sizeof secret) == 1) {
        config_value(p, name, "aws_session_token", NULL, token, sizeof token);
        snprintf(how, hcap, "profile '%s' (%s)", name, p->conf.v[CKPTIO__AWS_CONFIG_FILE]);
        *out = key_new(id, secret, token, 0);
    } else if (config_value(p, name, "credential_process", NULL, proc, sizeof proc) == 1) {
        snprintf(how, hcap, "profile '%s' (credential_process)", name);
        return process(proc, name, out, msg);
    } else if (config_value(p, name, "sso_start_url", NULL, src, sizeof src) == 1 ||
               config_value(p, name, "sso_session", NULL, src, sizeof src) == 1) {
        return ckptio__fail(msg, CKPTIO_E_UNSUPPORTED,
                            "profile '%s' signs in with IAM Identity Center (sso_*), which ckptio "
                            "does not: export the credentials (aws configure export-credentials "
                            "--profile %s --format env) or use a profile with keys or a role",
                            name, name);
    } else {
        return 0;
    }
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(token, sizeof token);
    return *out ? 1 : ckptio__fail(msg, -ENOMEM, "out of memory");
}

static int from_env(chain *c, ckptio__aws_key **out, ckptio__msg *msg)
{
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    if (!id || !*id || !secret || !*secret) {
        ckptio__tried_add(&c->tried, "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)");
        return 0;
    }
    *out = key_new(id, secret, getenv("AWS_SESSION_TOKEN"), 0);
    return *out ? 1 : ckptio__fail(msg, -ENOMEM, "out of memory");
}

/* Ask the source that answered before, or walk the chain. */
static int walk(ckptio__aws_creds *p, ckptio__aws_key **out, ckptio__msg *msg)
{
    chain c = {.p = p};
    ckptio__aws_conf *f = &p->conf;
    char how[160] = "";
    int rc = 0, src = p->source;
    *out = NULL;
    /* Static keys: the settings' (conf_read put them in the fields of the environment's, which
     * it then leaves unread), else the environment's unless the settings name a profile. */
    if (!src || src == SRC_SETTINGS || src == SRC_ENV) {
        bool given = f->v[CKPTIO__AWS_KEYS_GIVEN] != NULL;
        if (f->v[CKPTIO__AWS_KEY_ID] && f->v[CKPTIO__AWS_SECRET]) {
            *out = key_new(f->v[CKPTIO__AWS_KEY_ID], f->v[CKPTIO__AWS_SECRET], f->v[CKPTIO__AWS_TOKEN], 0);
            snprintf(how, sizeof how, "%s", given ? "the store's settings"
                                                  : "the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY");
            rc = *out ? 1 : ckptio__fail(msg, -ENOMEM, "out of memory");
            src = given ? SRC_SETTINGS : SRC_ENV;
        } else if (!src) {
            ckptio__tried_add(&c.tried, "settings (no access_key_id)");
            if (!f->v[CKPTIO__AWS_PROFILE_GIVEN])
                ckptio__tried_add(&c.tried, "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)");
        }
    }
    if (rc == 0 && (!src || src == SRC_WEB) && !f->v[CKPTIO__AWS_PROFILE_GIVEN]) {
        if (f->v[CKPTIO__AWS_WEB_TOKEN_FILE] && f->v[CKPTIO__AWS_ROLE_ARN]) {
            rc = web_identity(&c, f->v[CKPTIO__AWS_WEB_TOKEN_FILE], f->v[CKPTIO__AWS_ROLE_ARN],
                              f->v[CKPTIO__AWS_ROLE_SESSION], out, msg);
            snprintf(how, sizeof how, "web identity (%s)", f->v[CKPTIO__AWS_ROLE_ARN]);
            src = SRC_WEB;
        } else if (!src) {
            ckptio__tried_add(&c.tried, "web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are not both set)");
        }
    }
    if (rc == 0 && (!src || src == SRC_PROFILE)) {
        const char *name = profile_name(p);
        rc = profile_creds(&c, name, 0, out, how, sizeof how, msg);
        if (rc == 0 && (f->v[CKPTIO__AWS_PROFILE] || src == SRC_PROFILE)) /* a profile asked for by name must exist */
            return ckptio__fail(msg, CKPTIO_E_USAGE, "the profile '%s' has no credentials in %s or %s",
                                name, f->v[CKPTIO__AWS_CONFIG_FILE] ? f->v[CKPTIO__AWS_CONFIG_FILE] : "~/.aws/config",
                                f->v[CKPTIO__AWS_CREDS_FILE] ? f->v[CKPTIO__AWS_CREDS_FILE] : "~/.aws/credentials");
        if (rc == 0) ckptio__tried_add(&c.tried, "profile 'default' (none in %s or %s)",
                           f->v[CKPTIO__AWS_CONFIG_FILE] ? f->v[CKPTIO__AWS_CONFIG_FILE] : "no home",
                           f->v[CKPTIO__AWS_CREDS_FILE] ? f->v[CKPTIO__AWS_CREDS_FILE] : "no home");
        if (rc != 0) src = SRC_PROFILE;
    }
    if (rc == 0 && (!src || src == SRC_CONTAINER)) {
        rc = container(&c, out, msg);
        if (rc != 0) {
            src = SRC_CONTAINER;
            snprintf(how, sizeof how, "container endpoint");
        }
    }
    if (rc == 0 && (!src || src == SRC_IMDS)) {
        rc = imds(&c, out, msg);
        if (rc != 0) {
            src = SRC_IMDS;
            snprintf(how, sizeof how, "instance metadata");
        }
    }
    if (rc < 0) return ckptio__tried_fail(&c.tried, msg, rc);
    if (rc == 0)
        return ckptio__fail(msg, CKPTIO_E_USAGE,
                            "no AWS credentials: tried, in order: %s. Set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE, ~/.aws/credentials), "
                            "or run where a role is given (IRSA, a container or instance role), "
                            "or pass access_key_id / secret_access_key in the store's settings",
                            c.tried.text);
    /* Readers see the name only once source is set; a refresh that keeps the source keeps it. */
    if (__atomic_load_n(&p->source, __ATOMIC_RELAXED) != src) {
        snprintf(p->source_name, sizeof p->source_name, "%s", how);
        __atomic_store_n(&p->source, src, __ATOMIC_RELEASE);
    }
    return 0;
}

static int load(void *owner, void **out, int64_t *expires, ckptio__msg *msg)
{
    ckptio__aws_key *k = NULL;
    CKPTIO__TRY(walk(owner, &k, msg));
    *out = k;
    *expires = k->expires;
    return 0;
}

int ckptio__aws_creds_get(ckptio__aws_creds *p, ckptio__aws_key **out, ckptio__msg *msg)
{
    void *k;
    CKPTIO__TRY(ckptio__cred_cache_get(&p->cache, &k, msg));
    *out = k;
    return 0;
}

bool ckptio__aws_creds_expired(ckptio__aws_creds *p, const ckptio__aws_key *k)
{
    int src = __atomic_load_n(&p->source, __ATOMIC_ACQUIRE);
    bool again = src != SRC_SETTINGS && src != SRC_ENV;
    if (again) ckptio__cred_cache_drop(&p->cache, k); /* the next get loads anew */
    return again;
}
