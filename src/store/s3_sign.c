/* SPDX-License-Identifier: Apache-2.0 */
/* SigV4 request signing for the S3 client: canonical request, string to sign, HMAC chain. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "s3_impl.h"

/* A growing string; `bad` records a failed allocation so callers check once at the end. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool bad;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->bad) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void to_hex(const unsigned char *d, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[2 * n] = 0;
}

void ckptio__s3_sha256_hex(const void *p, size_t len, char hex[65])
{
    unsigned char d[32];
    unsigned int n = 0;
    if (!EVP_Digest(p, len, d, &n, EVP_sha256(), NULL) || n != 32) memset(d, 0, sizeof d);
    to_hex(d, 32, hex);
}

bool ckptio__s3_mpu_etag(char (*etags)[128], unsigned n, char out[128])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_md5(), NULL);
    for (unsigned i = 0; ok && i < n; i++) {
        const char *e = etags[i];
        unsigned char d[16];
        ok = strlen(e) == 34 && e[0] == '"' && e[33] == '"';
        for (unsigned j = 0; ok && j < 16; j++) {
            unsigned v;
            ok = sscanf(e + 1 + 2 * j, "%2x", &v) == 1;
            d[j] = (unsigned char)v;
        }
        ok = ok && EVP_DigestUpdate(ctx, d, 16);
    }
    unsigned char md[16];
    unsigned int len = 0;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &len) && len == 16;
    EVP_MD_CTX_free(ctx);
    if (!ok) return false;
    char hex[33];
    to_hex(md, 16, hex);
    snprintf(out, 128, "\"%s-%u\"", hex, n);
    return true;
}

static void hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
    unsigned int n = 32;
    if (!HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &n))
        memset(out, 0, 32);
}

static int cmp_hdr(const void *a, const void *b)
{
    return strcmp(((const ckptio__kv *)a)->name, ((const ckptio__kv *)b)->name);
}

/* A header value as signed: leading and trailing blanks dropped, inner runs made one space. */
static void sb_trimmed(sbuf *b, const char *v)
{
    while (*v == ' ' || *v == '\t') v++;
    bool space = false;
    for (; *v; v++) {
        if (*v == ' ' || *v == '\t') {
            space = true;
            continue;
        }
        if (space) sb_add(b, " ", 1);
        space = false;
        sb_add(b, v, 1);
    }
}

int ckptio__s3_sign(const ckptio__s3_sig_in *in, char *auth)
{
    int rc = 0;
    sbuf creq = {0}, signed_h = {0};
    char *query = NULL;
    ckptio__kv *h = malloc((in->nh ? in->nh : 1) * sizeof *h);
    CKPTIO__GOTO_IF(!h, -ENOMEM);
    memcpy(h, in->headers, in->nh * sizeof *h);
    qsort(h, in->nh, sizeof *h, cmp_hdr);
    query = ckptio__uri_query(in->query, in->nq);
    CKPTIO__GOTO_IF(!query, -ENOMEM);

    sb_str(&creq, in->method);
    sb_str(&creq, "\n");
    sb_str(&creq, in->uri);
    sb_str(&creq, "\n");
    sb_str(&creq, query);
    sb_str(&creq, "\n");
    for (unsigned i = 0; i < in->nh; i++) {
        sb_str(&creq, h[i].name);
        sb_str(&creq, ":");
        sb_trimmed(&creq, h[i].value);
        sb_str(&creq, "\n");
        if (i) sb_str(&signed_h, ";");
        sb_str(&signed_h, h[i].name);
    }
    sb_str(&creq, "\n");
    sb_str(&creq, signed_h.p ? signed_h.p : "");
    sb_str(&creq, "\n");
    sb_str(&creq, in->payload_hash);
    CKPTIO__GOTO_IF(creq.bad || signed_h.bad || strlen(in->amz_date) != 16, -ENOMEM);

    char day[9], creq_hex[65], scope[128], sts[512];
    memcpy(day, in->amz_date, 8);
    day[8] = 0;
    ckptio__s3_sha256_hex(creq.p, creq.len, creq_hex);
    const char *service = in->service ? in->service : "s3";
    int n = snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", day, in->region, service);
    CKPTIO__GOTO_IF(n < 0 || (size_t)n >= sizeof scope, CKPTIO_E_LIMIT);
    n = snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", in->amz_date, scope, creq_hex);
    CKPTIO__GOTO_IF(n < 0 || (size_t)n >= sizeof sts, CKPTIO_E_LIMIT);

    /* The signing key: the secret HMACed with the day, the region, the service, the word. */
    char k0[256];
    n = snprintf(k0, sizeof k0, "AWS4%s", in->secret_key);
    CKPTIO__GOTO_IF(n < 0 || (size_t)n >= sizeof k0, CKPTIO_E_LIMIT);
    unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
    hmac(k0, (size_t)n, day, k1);
    hmac(k1, 32, in->region, k2);
    hmac(k2, 32, service, k3);
    hmac(k3, 32, "aws4_request", k4);
    hmac(k4, 32, sts, sig);
    char sig_hex[65];
    to_hex(sig, 32, sig_hex);
    n = snprintf(auth, CKPTIO__S3_AUTH_MAX,
                 "AWS4-HMAC-SHA256 Credential=%s/%s,SignedHeaders=%s,Signature=%s",
                 in->access_key, scope, signed_h.p ? signed_h.p : "", sig_hex);
    CKPTIO__GOTO_IF(n < 0 || n >= CKPTIO__S3_AUTH_MAX, CKPTIO_E_LIMIT);
out:
    free(h);
    free(query);
    free(creq.p);
    free(signed_h.p);
    return rc;
}
