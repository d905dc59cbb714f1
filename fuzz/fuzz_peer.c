/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for the peer tier's wire (src/ranks/peer.h): hostile bytes on either end of
 * one connection, the server's (ckptio__peer_serve) and a fetching client's
 * (ckptio__peer_fetch_on), are refused or served within bounds, never hang, and leave no
 * temporary part behind. Each input runs over a fresh socketpair: the library's side on a
 * thread of its own, the harness's side on the calling thread, both sockets with 2 s timeouts.
 *
 * The input: the low two bits of its first byte pick the role the fuzzer plays (bit 2: a fetch
 * verifies what it receives); the rest is what that role sends.
 *   0  a client, from the connection's first byte: the server's authentication parses it raw.
 *   1  a client that proves the job's key: the harness authenticates, then sends the request
 *      header (16 bytes) and as many name bytes as the header's name_len says (bounded by the
 *      input and by PEER_MAX_NAME), sealed with the right MAC under the session's key so that
 *      the server gets past the MAC; the rest follows as the PUT's file records.
 *   2  a server that proves the key: the harness reads the client's hello, answers it, reads
 *      the client's proof and request (a GET of 1/rank0); the rest is the reply and the files.
 *   3  a server from the first byte: after the client's hello, the rest is the server's hello
 *      and whatever follows, raw (the client's check of the server's hello).
 * The server's root holds one committed part, 1/rank0, so that a GET has something to send;
 * whatever a PUT publishes is removed after each input, so every input sees the same root. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "../src/ranks/peer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) abort();                                                                  \
    } while (0)

#define TIMEOUT_S 2 /* each socket's send and receive timeout: nothing waits longer */

/* The job's key both sides hold. */
static const unsigned char KEY[32] = "the fuzzed peer tier's job key!!";

/* Where the harness keeps its files, made by the first input. */
static struct {
    char base[PATH_MAX - 64]; /* a mkdtemp directory, removed at exit */
    char root[PATH_MAX];      /* the server's root */
    char one[PATH_MAX];       /* root/1 */
    char part[PATH_MAX];      /* root/1/rank0, the part served */
    char got[PATH_MAX];       /* where a fetch publishes (its parent) */
    char dst[PATH_MAX];       /* got/part */
    uint64_t sig;             /* the served part's files as they were written */
} g;

/* ---- the files ---- */

static uint64_t sig_acc;
static size_t sig_skip;
static bool leftover; /* a removal met a transaction's temporary directory */

static void sig_mix(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) sig_acc = (sig_acc ^ b[i]) * 0x100000001b3ull;
}

static int sig_one(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)type;
    (void)f;
    sig_mix(path + sig_skip, strlen(path + sig_skip) + 1);
    sig_mix(&st->st_ino, sizeof st->st_ino);
    sig_mix(&st->st_mode, sizeof st->st_mode);
    sig_mix(&st->st_size, sizeof st->st_size);
    sig_mix(&st->st_mtim, sizeof st->st_mtim);
    return 0;
}

/* A digest of every entry under `path` (names, inodes, sizes, times): a part replaced or
 * changed in place gives another one; a missing path gives 0. */
static uint64_t tree_sig(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return 0;
    sig_acc = 0xcbf29ce484222325ull;
    sig_skip = strlen(path);
    REQUIRE(nftw(path, sig_one, 16, FTW_PHYS) == 0);
    return sig_acc;
}

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st;
    (void)type;
    const char *name = path + f->base;
    if (strstr(name, ".tmp-") || strstr(name, ".deleting-")) leftover = true;
    if (remove(path) < 0 && errno != ENOENT) abort();
    return 0;
}

/* rm -rf path (gone already: nothing to do). */
static void remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) return;
    REQUIRE(nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

/* Remove every entry of `dir` but `keep`. */
static void prune(const char *dir, const char *keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PATH_MAX + 256];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, keep))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove_tree(path);
    }
    closedir(d);
}

/* The part the server serves: one tiny tensor, written through the public API. */
static void write_part(void)
{
    REQUIRE(mkdir(g.one, 0700) == 0 || errno == EEXIST);
    static const float w[4] = {1, 2, 3, 4};
    const uint64_t shape[1] = {4};
    ckptio_writer *wr = NULL;
    REQUIRE(ckptio_writer_open(&wr, g.part, NULL) == 0);
    REQUIRE(ckptio_writer_add(wr, "w", CKPTIO_DT_F32, 1, shape, NULL, NULL, w, sizeof w) == 0);
    REQUIRE(ckptio_writer_commit(wr) == 0);
    ckptio_writer_close(wr);
    g.sig = tree_sig(g.part);
}

static void remove_base(void)
{
    remove_tree(g.base);
}

static void setup_once(void)
{
    if (g.base[0]) return;
    const char *tmp = getenv("TMPDIR");
    snprintf(g.base, sizeof g.base, "%s/ckptio-fuzz-peer.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(g.base));
    snprintf(g.root, sizeof g.root, "%s/root", g.base);
    snprintf(g.one, sizeof g.one, "%s/root/1", g.base);
    snprintf(g.part, sizeof g.part, "%s/root/1/rank0", g.base);
    snprintf(g.got, sizeof g.got, "%s/got", g.base);
    snprintf(g.dst, sizeof g.dst, "%s/got/part", g.base);
    REQUIRE(mkdir(g.root, 0700) == 0);
    write_part();
    atexit(remove_base);
}

/* After a server's input: the root as setup left it (1/rank0 only, as written). `named` says
 * the request's name was a temporary directory's (".tmp-", ".deleting-"): a part of that name
 * may have been published, and is then no leftover. */
static void restore_root(bool named)
{
    leftover = false;
    prune(g.root, "1");
    prune(g.one, "rank0");
    if (tree_sig(g.part) != g.sig) {
        remove_tree(g.one);
        write_part();
    }
    REQUIRE(!leftover || named); /* a request's transaction outlived its connection */
}

/* ---- the harness's side of the connection ---- */

static int send_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int recv_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Send n bytes while reading whatever comes back (so that neither side blocks on a full
 * socket while the other writes too), then shut the write side and read until the library's
 * side closes, or nothing moves for TIMEOUT_S. */
static void pump(int fd, const uint8_t *p, size_t n)
{
    static uint8_t sink[1u << 16];
    bool writing = true;
    for (;;) {
        if (writing && n == 0) {
            shutdown(fd, SHUT_WR);
            writing = false;
        }
        struct pollfd pf = {.fd = fd, .events = (short)(POLLIN | (writing ? POLLOUT : 0))};
        int k = poll(&pf, 1, TIMEOUT_S * 1000);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
            if (r == 0) return; /* the library's side closed */
            if (r < 0 && errno != EAGAIN && errno != EINTR) return;
            if (r < 0 && (pf.revents & POLLERR)) return;
        }
        if (pf.revents & POLLNVAL) return;
        if (writing && (pf.revents & POLLOUT)) {
            ssize_t w = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                p += w;
                n -= (size_t)w;
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                n = 0; /* it stopped reading: what it sent back is still read */
            }
        }
    }
}

/* HMAC-SHA256(key, label || a || b), as the wire says, written here anew. */
static void hmac3(const char *label, const uint8_t a[PEER_NONCE], const uint8_t b[PEER_NONCE],
                  uint8_t out[PEER_MAC])
{
    uint8_t msg[64 + 2 * PEER_NONCE];
    size_t ll = strlen(label);
    memcpy(msg, label, ll);
    memcpy(msg + ll, a, PEER_NONCE);
    memcpy(msg + ll + PEER_NONCE, b, PEER_NONCE);
    unsigned len = 0;
    REQUIRE(HMAC(EVP_sha256(), KEY, (int)sizeof KEY, msg, ll + 2 * PEER_NONCE, out, &len) &&
            len == PEER_MAC);
}

static void session_mac(const uint8_t session[PEER_MAC], const uint8_t *p, size_t n,
                        uint8_t out[PEER_MAC])
{
    unsigned len = 0;
    REQUIRE(HMAC(EVP_sha256(), session, PEER_MAC, p, n, out, &len) && len == PEER_MAC);
}

/* Whether p begins a hello of this protocol's version. */
static bool is_hello(const uint8_t *p)
{
    return ckptio__peer_get32(p) == PEER_HELLO && ckptio__peer_get32(p + 4) == PEER_VERSION;
}

/* Mode 1: authenticate (the server must prove the key), then send the fuzzer's request with
 * the session's MAC after its name, then the rest. Returns whether the name sent holds a
 * temporary directory's marker (see restore_root). */
static bool as_client(int fd, const uint8_t *in, size_t n)
{
    uint8_t hello[8 + PEER_NONCE], back[8 + PEER_NONCE + PEER_MAC];
    uint8_t want[PEER_MAC], proof[PEER_MAC], session[PEER_MAC];
    ckptio__peer_put32(hello, PEER_HELLO);
    ckptio__peer_put32(hello + 4, PEER_VERSION);
    memset(hello + 8, 0xc1, PEER_NONCE); /* the server draws its nonce: this one may be fixed */
    if (send_full(fd, hello, sizeof hello) < 0 || recv_full(fd, back, sizeof back) < 0)
        return false;
    REQUIRE(is_hello(back));
    hmac3("ckptio peer 2 server", hello + 8, back + 8, want);
    REQUIRE(memcmp(want, back + 8 + PEER_NONCE, PEER_MAC) == 0); /* the server proves the key */
    hmac3("ckptio peer 2 client", hello + 8, back + 8, proof);
    hmac3("ckptio peer 2 session", hello + 8, back + 8, session);
    if (send_full(fd, proof, sizeof proof) < 0) return false;

    size_t head = n < 16 ? n : 16, name = 0;
    if (head == 16) {
        uint32_t said = ckptio__peer_get32(in + 12);
        name = CKPTIO__MIN((size_t)said, CKPTIO__MIN((size_t)PEER_MAX_NAME, n - 16));
    }
    size_t sealed = head + name, len = n + (head == 16 ? PEER_MAC : 0);
    uint8_t *out = malloc(len ? len : 1);
    REQUIRE(out);
    memcpy(out, in, sealed);
    if (head == 16) session_mac(session, out, sealed, out + sealed);
    memcpy(out + len - (n - sealed), in + sealed, n - sealed);
    pump(fd, out, len);
    free(out);
    return name && (memmem(in + 16, name, ".tmp-", 5) || memmem(in + 16, name, ".deleting-", 10));
}

/* Mode 2: answer the client's hello as a server holding the key, check its proof and request
 * (the library's own: both must be right), then send the fuzzer's reply and files. */
static void as_server(int fd, const uint8_t *in, size_t n)
{
    uint8_t hello[8 + PEER_NONCE], back[8 + PEER_NONCE + PEER_MAC];
    uint8_t proof[PEER_MAC], want[PEER_MAC], session[PEER_MAC];
    uint8_t req[16 + PEER_MAX_NAME + PEER_MAC];
    if (recv_full(fd, hello, sizeof hello) < 0) return;
    REQUIRE(is_hello(hello));
    ckptio__peer_put32(back, PEER_HELLO);
    ckptio__peer_put32(back + 4, PEER_VERSION);
    memset(back + 8, 0x5e, PEER_NONCE);
    hmac3("ckptio peer 2 server", hello + 8, back + 8, back + 8 + PEER_NONCE);
    if (send_full(fd, back, sizeof back) < 0 || recv_full(fd, proof, sizeof proof) < 0) return;
    hmac3("ckptio peer 2 client", hello + 8, back + 8, want);
    REQUIRE(memcmp(want, proof, PEER_MAC) == 0); /* the client proves the key */
    hmac3("ckptio peer 2 session", hello + 8, back + 8, session);
    if (recv_full(fd, req, 16) < 0) return;
    uint32_t len = ckptio__peer_get32(req + 12);
    REQUIRE(ckptio__peer_get32(req) == PEER_MAGIC && ckptio__peer_get32(req + 4) == PEER_VERSION &&
            ckptio__peer_get32(req + 8) == PEER_GET && len == 7);
    if (recv_full(fd, req + 16, len + PEER_MAC) < 0) return;
    session_mac(session, req, 16 + len, want);
    REQUIRE(memcmp(req + 16, "1/rank0", 7) == 0 && memcmp(want, req + 16 + len, PEER_MAC) == 0);
    pump(fd, in, n);
}

/* ---- the library's side ---- */

typedef struct side {
    int fd;
    unsigned flags;
    int rc;
    uint64_t bytes;
    ckptio__msg m;
} side;

static void *serve_thread(void *arg)
{
    side *s = arg;
    ckptio__peer_serve(g.root, KEY, sizeof KEY, s->fd, "the fuzzer");
    close(s->fd);
    return NULL;
}

static void *fetch_thread(void *arg)
{
    side *s = arg;
    s->rc = ckptio__peer_fetch_on(s->fd, KEY, sizeof KEY, "1/rank0", g.dst, s->flags,
                                  "the fuzzed server", &s->bytes, &s->m);
    close(s->fd);
    return NULL;
}

/* After a fetch: a failure says why and leaves nothing under got/; a success leaves the part
 * only (a verified one a checkpoint); a server that could not prove the key never succeeds. */
static void check_fetch(const side *s, unsigned mode)
{
    REQUIRE(s->rc <= 0);
    REQUIRE(s->rc == 0 || s->m.text[0]);
    REQUIRE(s->rc < 0 || mode != 3);
    DIR *d = opendir(g.got);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                REQUIRE(s->rc == 0 && !strcmp(e->d_name, "part"));
        closedir(d);
    }
    if (s->rc == 0 && (s->flags & CKPTIO_PEER_VERIFY)) REQUIRE(ckptio_is_checkpoint(g.dst) == 1);
    remove_tree(g.got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    if (size < 1) return 0;
    unsigned mode = data[0] & 3, flags = data[0] & 4 ? CKPTIO_PEER_VERIFY : 0;
    data++;
    size--;
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    struct timeval tv = {.tv_sec = TIMEOUT_S};
    for (int i = 0; i < 2; i++)
        REQUIRE(setsockopt(sv[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
                setsockopt(sv[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    side s = {.fd = sv[1], .flags = flags};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, mode < 2 ? serve_thread : fetch_thread, &s) == 0);
    int fd = sv[0];
    bool named = false;
    uint8_t hello[8 + PEER_NONCE];
    switch (mode) {
    case 0:
        pump(fd, data, size);
        break;
    case 1:
        named = as_client(fd, data, size);
        break;
    case 2:
        as_server(fd, data, size);
        break;
    default:
        if (recv_full(fd, hello, sizeof hello) == 0) pump(fd, data, size);
        break;
    }
    shutdown(fd, SHUT_RDWR); /* whatever the harness stopped at, the library's side stops waiting */
    pthread_join(th, NULL);
    close(fd);
    if (mode < 2)
        restore_root(named);
    else
        check_fetch(&s, mode);
    return 0;
}
