/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's trust: each connection's two sides prove that they hold the job's key
 * (HMAC-SHA256 over fresh nonces of both), before any name or byte of a part is exchanged, and
 * the one request of the connection carries a MAC under a key of that session only. */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "peer.h"

/* The labels keep each MAC from standing in for another: a server's proof is never a client's,
 * and neither is the session's key. */
static const char LABEL_SERVER[] = "ckptio peer 2 server";
static const char LABEL_CLIENT[] = "ckptio peer 2 client";
static const char LABEL_SESSION[] = "ckptio peer 2 session";

int ckptio__peer_key_check(const unsigned char *key, size_t len, const char *fn)
{
    if (!key || len < CKPTIO_PEER_KEY_MIN || len > CKPTIO_PEER_KEY_MAX)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "%s: the job's key is required (%d to %d bytes, the same on every "
                            "rank; ckptio_peer_opts.key), got %zu bytes", fn, CKPTIO_PEER_KEY_MIN,
                            CKPTIO_PEER_KEY_MAX, key ? len : 0);
    return 0;
}

/* out = HMAC-SHA256(key, label || a || b); 0, or -EIO when libcrypto fails. */
static int mac3(const unsigned char *key, size_t klen, const char *label, const uint8_t *a,
                const uint8_t *b, uint8_t out[PEER_MAC])
{
    uint8_t msg[64 + 2 * PEER_NONCE];
    size_t ll = strlen(label);
    memcpy(msg, label, ll);
    memcpy(msg + ll, a, PEER_NONCE);
    memcpy(msg + ll + PEER_NONCE, b, PEER_NONCE);
    unsigned n = 0;
    int ok = HMAC(EVP_sha256(), key, (int)klen, msg, ll + 2 * PEER_NONCE, out, &n) && n == PEER_MAC;
    return ok ? 0 : -EIO;
}

int ckptio__peer_mac(const uint8_t session[PEER_MAC], const void *p, size_t len, uint8_t out[PEER_MAC])
{
    unsigned n = 0;
    return HMAC(EVP_sha256(), session, PEER_MAC, p, len, out, &n) && n == PEER_MAC ? 0 : -EIO;
}

bool ckptio__peer_mac_equal(const uint8_t a[PEER_MAC], const uint8_t b[PEER_MAC])
{
    return CRYPTO_memcmp(a, b, PEER_MAC) == 0;
}

static int nonce(uint8_t out[PEER_NONCE])
{
    for (size_t got = 0; got < PEER_NONCE;) {
        ssize_t n = getrandom(out + got, PEER_NONCE - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        got += (size_t)n;
    }
    return 0;
}

/* What both sides derive from the two nonces. */
static int derive(const unsigned char *key, size_t klen, const uint8_t nc[PEER_NONCE],
                  const uint8_t ns[PEER_NONCE], uint8_t server[PEER_MAC], uint8_t client[PEER_MAC],
                  uint8_t session[PEER_MAC])
{
    CKPTIO__TRY(mac3(key, klen, LABEL_SERVER, nc, ns, server));
    CKPTIO__TRY(mac3(key, klen, LABEL_CLIENT, nc, ns, client));
    return mac3(key, klen, LABEL_SESSION, nc, ns, session);
}

int ckptio__peer_client_auth(int fd, const unsigned char *key, size_t klen, const char *who,
                             uint8_t session[PEER_MAC], ckptio__msg *m)
{
    uint8_t hello[8 + PEER_NONCE], back[8 + PEER_NONCE + PEER_MAC];
    uint8_t server[PEER_MAC], client[PEER_MAC];
    ckptio__peer_put32(hello, PEER_HELLO);
    ckptio__peer_put32(hello + 4, PEER_VERSION);
    int rc = nonce(hello + 8);
    if (rc < 0) return ckptio__fail(m, rc, "cannot draw a nonce: %s", strerror(-rc));
    if ((rc = ckptio__peer_send_all(fd, hello, sizeof hello)) < 0)
        return ckptio__fail(m, rc, "%s: cannot send (%s)", who, strerror(-rc));
    rc = ckptio__peer_recv_all(fd, back, 8);
    if (rc == 0 && ckptio__peer_get32(back) != PEER_HELLO)
        return ckptio__fail(m, -EPROTO, "%s refused the authentication: it is no server of ckptio's "
                            "peer protocol %u (an older ckptio?)", who, PEER_VERSION);
    if (rc == 0 && ckptio__peer_get32(back + 4) != PEER_VERSION)
        return ckptio__fail(m, -EPROTO, "%s speaks version %u of ckptio's peer protocol, this "
                            "rank %u: run one ckptio on every rank", who, ckptio__peer_get32(back + 4), PEER_VERSION);
    if (rc == 0) rc = ckptio__peer_recv_all(fd, back + 8, sizeof back - 8);
    if (rc < 0)
        return ckptio__fail(m, rc, "%s broke off the authentication (%s): is it an older ckptio, or "
                            "no ckptio peer server?", who, rc == -EPIPE ? "connection closed" : strerror(-rc));
    if ((rc = derive(key, klen, hello + 8, back + 8, server, client, session)) < 0)
        return ckptio__fail(m, rc, "libcrypto's HMAC-SHA256 failed");
    if (!ckptio__peer_mac_equal(server, back + 8 + PEER_NONCE))
        return ckptio__fail(m, -EACCES, "%s and this rank do not hold the same job key: nothing was sent to it "
                            "(is that port another job's server, or a stranger's?)", who);
    if ((rc = ckptio__peer_send_all(fd, client, sizeof client)) < 0)
        return ckptio__fail(m, rc, "%s: cannot send (%s)", who, strerror(-rc));
    return 0;
}

int ckptio__peer_server_auth(int fd, const unsigned char *key, size_t klen, double end,
                             uint8_t session[PEER_MAC], const char **why)
{
    uint8_t hello[8 + PEER_NONCE], back[8 + PEER_NONCE + PEER_MAC];
    uint8_t client[PEER_MAC], proof[PEER_MAC];
    *why = "the connection closed or stayed silent";
    if (ckptio__peer_recv_by(fd, hello, 8, end) < 0) return -EPIPE;
    if (ckptio__peer_get32(hello) != PEER_HELLO || ckptio__peer_get32(hello + 4) != PEER_VERSION) {
        *why = "it does not begin with the authentication of ckptio's peer protocol 2";
        return -EACCES;
    }
    *why = "it began the authentication but did not finish it in time";
    if (ckptio__peer_recv_by(fd, hello + 8, PEER_NONCE, end) < 0) return -EACCES;
    ckptio__peer_put32(back, PEER_HELLO);
    ckptio__peer_put32(back + 4, PEER_VERSION);
    *why = "no nonce or no HMAC";
    if (nonce(back + 8) < 0 || derive(key, klen, hello + 8, back + 8, back + 8 + PEER_NONCE, client, session) < 0)
        return -EIO;
    if (ckptio__peer_send_all(fd, back, sizeof back) < 0) return -EPIPE;
    if (ckptio__peer_recv_by(fd, proof, sizeof proof, end) < 0) {
        /* what a client does when this server's proof fails for it: it holds another key */
        *why = "it began the authentication but gave no proof of the job's key (a client with "
               "another key hangs up here)";
        return -EACCES;
    }
    if (!ckptio__peer_mac_equal(client, proof)) {
        *why = "its proof of the job's key is wrong";
        return -EACCES;
    }
    return 0;
}

/* The request, its MAC under the session's key after it. */
int ckptio__peer_send_request(int sock, const uint8_t session[PEER_MAC], uint32_t op, const char *name)
{
    size_t len = strlen(name);
    if (len >= PEER_MAX_NAME) return -ENAMETOOLONG;
    uint8_t h[16 + PEER_MAX_NAME + PEER_MAC];
    ckptio__peer_put32(h, PEER_MAGIC);
    ckptio__peer_put32(h + 4, PEER_VERSION);
    ckptio__peer_put32(h + 8, op);
    ckptio__peer_put32(h + 12, (uint32_t)len);
    memcpy(h + 16, name, len);
    if (ckptio__peer_mac(session, h, 16 + len, h + 16 + len) < 0) return -EIO;
    return ckptio__peer_send_all(sock, h, 16 + len + PEER_MAC);
}
