/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the peer tier's transport: pushes, fetches and copies publish whole, verified parts only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "test.h"

#define N_FLOATS (3u << 20) /* 12 MiB: several blocks */

/* The job's key of these tests, and options carrying it. */
static const unsigned char KEY[32] = "the key of the job these ranks r";
#define JOB_KEY .key = KEY, .key_len = sizeof KEY
static const ckptio_peer_opts SERVER = {JOB_KEY};

/* A checkpoint at `path` of one f32 tensor "w" filled from `seed`. */
static int make_part(const char *path, uint64_t seed)
{
    float *w = t_alloc(N_FLOATS * 4);
    CHECK(w);
    t_fill(w, N_FLOATS * 4, seed);
    ckptio_writer *wr = NULL;
    uint64_t shape[1] = {N_FLOATS};
    CHECK_OK(ckptio_writer_open(&wr, path, NULL));
    CHECK_OK(ckptio_writer_add(wr, "w", CKPTIO_DT_F32, 1, shape, NULL, NULL, w, N_FLOATS * 4));
    CHECK_OK(ckptio_writer_commit(wr));
    ckptio_writer_close(wr);
    t_free(w, N_FLOATS * 4);
    return 0;
}

/* Whether the checkpoint at `path` holds make_part(seed)'s tensor, every block verified. */
static int same_part(const char *path, uint64_t seed)
{
    float *want = t_alloc(N_FLOATS * 4), *got = t_alloc(N_FLOATS * 4);
    CHECK(want && got);
    t_fill(want, N_FLOATS * 4, seed);
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, path, NULL));
    uint64_t bad = 0;
    CHECK_OK(ckptio_reader_verify(r, &bad));
    CHECK_OK(ckptio_reader_read_tensor(r, "w", got, N_FLOATS * 4));
    ckptio_reader_close(r);
    CHECK(memcmp(want, got, N_FLOATS * 4) == 0);
    t_free(want, N_FLOATS * 4);
    t_free(got, N_FLOATS * 4);
    return 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Flip one byte in the middle of the part's data file. */
static int flip_byte(const char *part)
{
    return t_sh("f=$(ls '%s'/data/* | head -1) && printf '\\x5a' | "
                "dd of=\"$f\" bs=1 seek=5000000 conv=notrunc status=none", part);
}

/* Whether `dir` holds only `name` (no temporary directory left beside it). */
static int only(const char *dir, const char *name)
{
    return t_sh("test \"$(ls -A '%s')\" = '%s'", dir, name) == 0;
}

static int test_push_fetch_copy(void)
{
    CHECK(make_part(t_path("src"), 5) == 0);
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    int port = ckptio_peer_port(p);
    CHECK(port > 0);
    ckptio_peer_opts o = {.timeout = 20, JOB_KEY};
    uint64_t sent = 0, got = 0, copied = 0;
    mode_t umask_was = umask(0); /* a part received is owner-only, whatever the umask */
    int pushed = ckptio_peer_push(t_path("src"), "127.0.0.1", port, "7/rank3", &o, &sent);
    umask(umask_was);
    CHECK_OK(pushed);
    CHECK(t_sh("test -z \"$(find '%s' -perm /077)\"", t_path("node1/7")) == 0);
    CHECK(sent >= N_FLOATS * 4);
    CHECK(same_part(t_path("node1/7/rank3"), 5) == 0);
    CHECK(only(t_path("node1/7"), "rank3"));
    /* a second push of the same part replaces it whole */
    CHECK(make_part(t_path("src2"), 6) == 0);
    CHECK_OK(ckptio_peer_push(t_path("src2"), "127.0.0.1", port, "7/rank3", &o, NULL));
    CHECK(same_part(t_path("node1/7/rank3"), 6) == 0);
    CHECK(only(t_path("node1/7"), "rank3"));
    o.flags = CKPTIO_PEER_VERIFY;
    CHECK_OK(ckptio_peer_fetch("127.0.0.1", port, "7/rank3", t_path("node0/7/rank3"), &o, &got));
    CHECK(got == sent);
    CHECK(same_part(t_path("node0/7/rank3"), 6) == 0);
    CHECK_OK(ckptio_part_copy(t_path("node0/7/rank3"), t_path("pers/7/rank3"), &o, &copied));
    CHECK(copied == sent);
    CHECK(same_part(t_path("pers/7/rank3"), 6) == 0);
    /* to another file system (where copy_file_range may refuse: EXDEV) */
    struct stat shm;
    if (stat("/dev/shm", &shm) == 0) {
        char other[128];
        snprintf(other, sizeof other, "/dev/shm/ckptio-test-%ld/7/rank3", (long)getpid());
        CHECK_OK(ckptio_part_copy(t_path("pers/7/rank3"), other, &o, &copied));
        CHECK(copied == sent && same_part(other, 6) == 0);
        CHECK(t_sh("rm -rf /dev/shm/ckptio-test-%ld", (long)getpid()) == 0);
    }
    /* missing parts, names outside the root */
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "8/rank3", t_path("node0/8/rank3"), &o, NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "no committed part"));
    CHECK(!t_contains(ckptio_last_error(), t_path("node1")));
    CHECK(!exists(t_path("node0/8/rank3")));
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "../src", t_path("x"), &o, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "/abs", &o, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_peer_push(t_path("nothing"), "127.0.0.1", port, "1/rank0", &o, NULL),
              CKPTIO_E_NOT_CHECKPOINT);
    ckptio_peer_close(p);
    /* nobody listens any more */
    CHECK(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "9/rank0", &o, NULL) == -ECONNREFUSED);
    CHECK(t_contains(ckptio_last_error(), "cannot connect to the peer at 127.0.0.1"));
    return 0;
}

/* A part whose checksums fail is never published: not by a push (the peer says why), not by a
 * verified fetch or copy. */
static int test_corrupt_refused(void)
{
    CHECK(make_part(t_path("src"), 9) == 0);
    CHECK(flip_byte(t_path("src")) == 0);
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    int port = ckptio_peer_port(p);
    ckptio_peer_opts o = {.timeout = 20, .flags = CKPTIO_PEER_VERIFY, JOB_KEY};
    CHECK_ERR(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "2/rank0", &o, NULL), CKPTIO_E_CHECKSUM);
    CHECK(t_contains(ckptio_last_error(), "fail their checksums"));
    CHECK(t_contains(ckptio_last_error(), "part '2/rank0' not kept"));
    CHECK(!exists(t_path("node1/2/rank0")));
    CHECK(t_sh("test -z \"$(ls -A '%s')\"", t_path("node1/2")) == 0);
    /* the damaged part held by the server: a verified fetch refuses it, an unverified one
     * brings it (the load that follows checks it) */
    CHECK(t_sh("mkdir -p '%s' && cp -r '%s' '%s'", t_path("node1/3"), t_path("src"), t_path("node1/3/rank0")) == 0);
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "3/rank0", t_path("got/3/rank0"), &o, NULL), CKPTIO_E_CHECKSUM);
    CHECK(!exists(t_path("got/3/rank0")));
    CHECK_ERR(ckptio_part_copy(t_path("src"), t_path("pers/3/rank0"), &o, NULL), CKPTIO_E_CHECKSUM);
    CHECK(!exists(t_path("pers/3/rank0")));
    o.flags = 0;
    CHECK_OK(ckptio_peer_fetch("127.0.0.1", port, "3/rank0", t_path("got/3/rank0"), &o, NULL));
    ckptio_peer_close(p);
    return 0;
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? fd : -1;
}

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Wait (up to 10 s) until `dir` has no temporary directory left. */
static int settles(const char *dir)
{
    for (int i = 0; i < 1000; i++) {
        if (t_sh("! ls -A '%s' 2>/dev/null | grep -q tmp-", dir) == 0) return 1;
        usleep(10000);
    }
    return 0;
}

/* HMAC-SHA256(key, label || a || b), as the wire says (src/ranks/peer.h), written here anew. */
static void hmac3(const unsigned char *key, size_t klen, const char *label, const uint8_t *a,
                  const uint8_t *b, uint8_t out[32])
{
    uint8_t msg[128];
    size_t ll = strlen(label);
    memcpy(msg, label, ll);
    memcpy(msg + ll, a, 32);
    memcpy(msg + ll + 32, b, 32);
    unsigned n = 0;
    HMAC(EVP_sha256(), key, (int)klen, msg, ll + 64, out, &n);
}

static int read_all(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* A client's side of the authentication, by hand: 0 with the session's key once the server
 * proved it holds `key` (and was sent this side's proof), -1 otherwise. `proof` 0 sends a
 * wrong proof instead. */
static int hand_auth(int fd, const unsigned char *key, size_t klen, int proof, uint8_t session[32])
{
    uint8_t hello[40], back[72], mine[32], theirs[32];
    le32(hello, 0x41504b43u);
    le32(hello + 4, 2);
    for (int i = 0; i < 32; i++) hello[8 + i] = (uint8_t)rand();
    if (write(fd, hello, 40) != 40 || read_all(fd, back, 72) < 0) return -1;
    hmac3(key, klen, "ckptio peer 2 server", hello + 8, back + 8, theirs);
    hmac3(key, klen, "ckptio peer 2 client", hello + 8, back + 8, mine);
    hmac3(key, klen, "ckptio peer 2 session", hello + 8, back + 8, session);
    if (!proof) mine[0] ^= 1;
    if (write(fd, mine, 32) != 32) return -1;
    return memcmp(theirs, back + 40, 32) == 0 ? 0 : -1;
}

/* A request of op for `name`, its MAC under `session`. */
static int hand_request(int fd, const uint8_t session[32], uint32_t op, const char *name)
{
    uint8_t h[256];
    size_t len = strlen(name);
    le32(h, 0x52504b43u);
    le32(h + 4, 2);
    le32(h + 8, op);
    le32(h + 12, (uint32_t)len);
    memcpy(h + 16, name, len);
    unsigned n = 0;
    HMAC(EVP_sha256(), session, 32, h, 16 + len, h + 16 + len, &n);
    return write(fd, h, 48 + len) == (ssize_t)(48 + len) ? 0 : -1;
}

/* The server's reply: its status, its message in text (NUL-ended). */
static int hand_reply(int fd, char *text, size_t cap)
{
    uint8_t h[8];
    if (read_all(fd, h, 8) < 0) return 1;
    uint32_t len = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
    if (len >= cap || read_all(fd, text, len) < 0) return 1;
    text[len] = '\0';
    return (int32_t)((uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24);
}

/* A sender that dies halfway (its connection closes after part of a file): the receiver keeps
 * nothing, and removes its temporary directory. Garbage requests are refused. */
static int test_broken_transfer(void)
{
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    int port = ckptio_peer_port(p);
    int fd = dial(port);
    CHECK(fd >= 0);
    uint8_t h[64], session[32];
    CHECK(hand_auth(fd, KEY, sizeof KEY, 1, session) == 0);
    CHECK(hand_request(fd, session, 1 /* PUT */, "4/rank1") == 0);
    le32(h, 8);
    memcpy(h + 4, "manifest", 8);
    memset(h + 12, 0, 8);
    h[12 + 2] = 1; /* 65536 bytes announced */
    CHECK(write(fd, h, 20) == 20);
    char junk[1000] = {0};
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    close(fd); /* the sender dies */
    CHECK(settles(t_path("node1/4")));
    CHECK(!exists(t_path("node1/4/rank1")));
    /* a request that is not one: refused, told nothing */
    char text[256];
    fd = dial(port);
    CHECK(fd >= 0);
    CHECK(write(fd, "GET / HTTP/1.1\r\n\r\n", 18) == 18);
    shutdown(fd, SHUT_WR);
    CHECK(hand_reply(fd, text, sizeof text) == -EACCES);
    CHECK(strcmp(text, "not authenticated") == 0);
    CHECK(read(fd, h, sizeof h) <= 0);
    close(fd);
    /* a file name that climbs out */
    fd = dial(port);
    CHECK(hand_auth(fd, KEY, sizeof KEY, 1, session) == 0);
    CHECK(hand_request(fd, session, 1, "5/rank0") == 0);
    le32(h, 9);
    memcpy(h + 4, "../escape", 9);
    memset(h + 13, 0, 8); /* its size: 0 */
    CHECK(write(fd, h, 21) == 21);
    CHECK(hand_reply(fd, text, sizeof text) == CKPTIO_E_CORRUPT);
    close(fd);
    CHECK(!exists(t_path("escape")));
    CHECK(settles(t_path("node1/5")));
    CHECK(!exists(t_path("node1/5/rank0")));
    ckptio_peer_close(p);
    return 0;
}

/* A client without the job's key (none, another, or the key with one byte changed) fetches
 * nothing and publishes nothing, by the library's calls or by hand; the server tells it
 * nothing of itself, and a request recorded on one connection is refused on another. */
static int test_outsider(void)
{
    CHECK(t_sh("mkdir -p '%s'", t_path("node1/7")) == 0);
    CHECK(make_part(t_path("node1/7/rank0"), 31) == 0);
    CHECK(make_part(t_path("forged"), 32) == 0);
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    int port = ckptio_peer_port(p);
    unsigned char off[sizeof KEY];
    memcpy(off, KEY, sizeof KEY);
    off[sizeof off - 1] ^= 1;
    ckptio_peer_opts o = {.timeout = 10, .flags = CKPTIO_PEER_VERIFY, .key = off, .key_len = sizeof off};
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "7/rank0", t_path("stolen"), &o, NULL), -EACCES);
    CHECK(t_contains(ckptio_last_error(), "do not hold the same job key"));
    CHECK_ERR(ckptio_peer_push(t_path("forged"), "127.0.0.1", port, "8/rank0", &o, NULL), -EACCES);
    CHECK_ERR(ckptio_peer_push(t_path("forged"), "127.0.0.1", port, "7/rank0", &o, NULL), -EACCES);
    o.key_len = 15; /* too short to be a key */
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "7/rank0", t_path("stolen"), &o, NULL), CKPTIO_E_USAGE);
    o.key = NULL;
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "7/rank0", t_path("stolen"), &o, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_peer_push(t_path("forged"), "127.0.0.1", port, "8/rank0", &o, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_peer_push(t_path("forged"), "127.0.0.1", port, "8/rank0", NULL, NULL), CKPTIO_E_USAGE);
    /* by hand: a wrong proof, then a right one whose request is replayed on a new connection */
    uint8_t session[32], h[8];
    char text[256];
    int fd = dial(port);
    CHECK(fd >= 0 && hand_auth(fd, off, sizeof off, 1, session) < 0); /* the server's proof fails */
    CHECK(hand_reply(fd, text, sizeof text) == -EACCES && strcmp(text, "not authenticated") == 0);
    close(fd);
    fd = dial(port);
    CHECK(fd >= 0 && hand_auth(fd, KEY, sizeof KEY, 0, session) == 0);
    CHECK(hand_request(fd, session, 2 /* GET */, "7/rank0") == 0);
    CHECK(hand_reply(fd, text, sizeof text) == -EACCES && strcmp(text, "not authenticated") == 0);
    CHECK(read(fd, h, sizeof h) <= 0);
    close(fd);
    uint8_t old[32];
    fd = dial(port);
    CHECK(fd >= 0 && hand_auth(fd, KEY, sizeof KEY, 1, old) == 0);
    close(fd);
    fd = dial(port);
    CHECK(fd >= 0 && hand_auth(fd, KEY, sizeof KEY, 1, session) == 0);
    CHECK(hand_request(fd, old, 2, "7/rank0") == 0); /* the MAC of another session */
    CHECK(hand_reply(fd, text, sizeof text) == -EACCES && strcmp(text, "not authenticated") == 0);
    close(fd);
    /* an old client's request, without authentication */
    fd = dial(port);
    uint8_t req[23];
    le32(req, 0x52504b43u);
    le32(req + 4, 1);
    le32(req + 8, 2);
    le32(req + 12, 7);
    memcpy(req + 16, "7/rank0", 7);
    CHECK(fd >= 0 && write(fd, req, sizeof req) == (ssize_t)sizeof req);
    CHECK(hand_reply(fd, text, sizeof text) == -EACCES && strcmp(text, "not authenticated") == 0);
    close(fd);
    CHECK(!exists(t_path("stolen")));
    CHECK(!exists(t_path("node1/8")));
    CHECK(same_part(t_path("node1/7/rank0"), 31) == 0);
    /* a server serves 256 connections at once, no more: the others are closed (and logged);
     * once those end, it serves again */
    int held[256];
    for (int i = 0; i < 256; i++) CHECK((held[i] = dial(port)) >= 0);
    o.key = KEY;
    o.key_len = sizeof KEY;
    usleep(200000); /* the server has taken them all */
    CHECK(ckptio_peer_fetch("127.0.0.1", port, "7/rank0", t_path("crowded"), &o, NULL) < 0);
    CHECK(!exists(t_path("crowded")));
    for (int i = 0; i < 256; i++) close(held[i]);
    /* with the key, the same calls work (once the server's threads saw those close); a
     * missing part's answer names no path */
    int rc = -1;
    for (int i = 0; i < 100 && rc < 0; i++)
        if ((rc = ckptio_peer_fetch("127.0.0.1", port, "7/rank0", t_path("got"), &o, NULL)) < 0) usleep(100000);
    CHECK_OK(rc);
    CHECK(same_part(t_path("got"), 31) == 0);
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", port, "9/rank0", t_path("none"), &o, NULL), -ENOENT);
    CHECK(t_contains(ckptio_last_error(), "holds no committed part '9/rank0'"));
    CHECK(!t_contains(ckptio_last_error(), t_path("node1")));
    ckptio_peer_close(p);
    return 0;
}

typedef struct pusher {
    const char *src;
    int port;
    int rc;
} pusher;

static void *push_slowly(void *arg)
{
    pusher *u = arg;
    ckptio_peer_opts o = {.timeout = 20, .max_rate = 4u << 20, JOB_KEY}; /* 12 MiB in 3 s */
    u->rc = ckptio_peer_push(u->src, "127.0.0.1", u->port, "6/rank0", &o, NULL);
    return NULL;
}

/* The receiver closes (its process ends) in the middle of a push: the pusher fails, and no
 * part is left behind. */
static int test_close_midway(void)
{
    CHECK(make_part(t_path("src"), 11) == 0);
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    pusher u = {t_path("src"), ckptio_peer_port(p), 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, push_slowly, &u) == 0);
    int seen = 0;
    for (int i = 0; i < 500 && !seen; i++) {
        seen = t_sh("ls -A '%s' 2>/dev/null | grep -q tmp-", t_path("node1/6")) == 0;
        usleep(10000);
    }
    ckptio_peer_close(p);
    pthread_join(th, NULL);
    CHECK(seen);
    CHECK(u.rc < 0);
    CHECK(!exists(t_path("node1/6/rank0")));
    CHECK(t_sh("test -z \"$(ls -A '%s')\"", t_path("node1/6")) == 0);
    return 0;
}

/* A process that serves parts forks (a DataLoader's workers fork every epoch). A child that
 * closes the server it inherited, as a binding's finalizer does, returns at once and leaves
 * the parent's serving; a child that lives on does not keep the port: once the parent closes
 * its server, nobody listens. */
static int test_fork(void)
{
    CHECK(make_part(t_path("src"), 12) == 0);
    ckptio_peer *p = NULL;
    CHECK_OK(ckptio_peer_open(&p, t_path("node1"), "127.0.0.1", 0, &SERVER));
    int port = ckptio_peer_port(p);
    ckptio_peer_opts o = {.timeout = 10, JOB_KEY};
    CHECK_OK(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "1/rank0", &o, NULL));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        ckptio_peer_close(p);
        _exit(0);
    }
    CHECK(t_reap(pid, 10) == 0);
    CHECK_OK(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "2/rank0", &o, NULL));
    CHECK(same_part(t_path("node1/2/rank0"), 12) == 0);
    int gate[2];
    CHECK(pipe(gate) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char c;
        close(gate[1]);
        _exit(read(gate[0], &c, 1) == 0 ? 0 : 1); /* lives until the parent closes the gate */
    }
    close(gate[0]);
    CHECK_OK(ckptio_peer_push(t_path("src"), "127.0.0.1", port, "3/rank0", &o, NULL));
    ckptio_peer_close(p);
    int rc = ckptio_peer_push(t_path("src"), "127.0.0.1", port, "4/rank0", &o, NULL);
    close(gate[1]);
    CHECK(t_reap(pid, 10) == 0);
    CHECK_ERR(rc, -ECONNREFUSED);
    CHECK(!exists(t_path("node1/4/rank0")));
    return 0;
}

/* A peer that reads 1 MiB of what it is sent, then hangs up (its process dies). */
typedef struct quitter {
    int lfd;
} quitter;

static void *quit_midway(void *arg)
{
    quitter *q = arg;
    struct pollfd pf = {.fd = q->lfd, .events = POLLIN};
    int fd = poll(&pf, 1, 20000) == 1 ? accept(q->lfd, NULL, NULL) : -1; /* bounded: never hangs */
    struct timeval tv = {.tv_sec = 20};
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static char sink[1u << 16];
    for (size_t got = 0; fd >= 0 && got < (1u << 20);) {
        ssize_t n = read(fd, sink, sizeof sink);
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (fd >= 0) close(fd);
    return NULL;
}

/* One pass to two peers and two directories: every destination has the part whole, verified.
 * One that fails (nobody listens, a directory that cannot be made, a peer that refuses the
 * part) drops out; the others still get it, and the call returns the first failure. */
static int test_spread(void)
{
    CHECK(make_part(t_path("src"), 21) == 0);
    ckptio_peer *p1 = NULL, *p2 = NULL;
    CHECK_OK(ckptio_peer_open(&p1, t_path("node1"), "127.0.0.1", 0, &SERVER));
    CHECK_OK(ckptio_peer_open(&p2, t_path("node2"), "127.0.0.1", 0, &SERVER));
    int port1 = ckptio_peer_port(p1), port2 = ckptio_peer_port(p2);
    ckptio_peer_opts o = {.timeout = 20, .flags = CKPTIO_PEER_VERIFY, JOB_KEY};
    ckptio_part_dest d[4] = {
        {.size = sizeof d[0], .host = "127.0.0.1", .port = port1},
        {.size = sizeof d[0], .host = "127.0.0.1", .port = port2},
        {.size = sizeof d[0], .dst = t_path("pers/5/rank0")},
        {.size = sizeof d[0], .dst = "/dev/shm/ckptio-spread-test/5/rank0"},
    };
    size_t nd = exists("/dev/shm") ? 4 : 3;
    CHECK_OK(ckptio_part_spread(t_path("src"), "5/rank0", d, nd, &o));
    for (size_t i = 0; i < nd; i++) CHECK(d[i].rc == 0 && d[i].bytes == d[0].bytes && !d[i].errmsg[0]);
    CHECK(d[0].bytes >= N_FLOATS * 4);
    CHECK(same_part(t_path("node1/5/rank0"), 21) == 0 && same_part(t_path("node2/5/rank0"), 21) == 0);
    CHECK(same_part(t_path("pers/5/rank0"), 21) == 0);
    CHECK(only(t_path("node1/5"), "rank0") && only(t_path("pers/5"), "rank0"));
    if (nd == 4) {
        CHECK(same_part(d[3].dst, 21) == 0);
        CHECK(t_sh("rm -rf /dev/shm/ckptio-spread-test") == 0);
    }
    /* paced: the pass goes in small pieces, to both peers */
    o.max_rate = 256u << 20;
    CHECK_OK(ckptio_part_spread(t_path("src"), "6/rank0", d, 2, &o));
    CHECK(same_part(t_path("node1/6/rank0"), 21) == 0 && same_part(t_path("node2/6/rank0"), 21) == 0);
    o.max_rate = 0;

    /* nobody listens at port2 any more; a directory under a file cannot be made */
    ckptio_peer_close(p2);
    CHECK(t_sh("touch '%s'", t_path("afile")) == 0);
    d[2].dst = t_path("afile/7/rank0");
    d[3].dst = t_path("pers/7/rank0");
    CHECK_ERR(ckptio_part_spread(t_path("src"), "7/rank0", d, 4, &o), -ECONNREFUSED);
    CHECK(t_contains(ckptio_last_error(), "cannot connect to the peer at 127.0.0.1"));
    CHECK(d[0].rc == 0 && same_part(t_path("node1/7/rank0"), 21) == 0);
    CHECK(d[1].rc == -ECONNREFUSED && t_contains(d[1].errmsg, "cannot connect"));
    CHECK(d[2].rc == -ENOTDIR && t_contains(d[2].errmsg, "afile"));
    CHECK(d[3].rc == 0 && same_part(t_path("pers/7/rank0"), 21) == 0);
    CHECK(d[3].bytes == d[0].bytes);

    /* a damaged part: the peer refuses it and says why; an unverified copy takes it */
    CHECK(make_part(t_path("bad"), 22) == 0);
    CHECK(flip_byte(t_path("bad")) == 0);
    o.flags = 0;
    d[1].dst = t_path("pers/8/rank0");
    d[1].host = NULL;
    CHECK_ERR(ckptio_part_spread(t_path("bad"), "8/rank0", d, 2, &o), CKPTIO_E_CHECKSUM);
    CHECK(t_contains(ckptio_last_error(), "part '8/rank0' not kept"));
    CHECK(d[0].rc == CKPTIO_E_CHECKSUM && !exists(t_path("node1/8/rank0")));
    CHECK(d[1].rc == 0 && exists(t_path("pers/8/rank0/manifest")));

    /* a peer that hangs up midway: the directory beside it still gets the part */
    quitter q = {socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    CHECK(q.lfd >= 0 && bind(q.lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(q.lfd, 1) == 0);
    CHECK(getsockname(q.lfd, (struct sockaddr *)&a, &alen) == 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, quit_midway, &q) == 0);
    d[0].port = ntohs(a.sin_port);
    d[1].dst = t_path("pers/10/rank0");
    int rc = ckptio_part_spread(t_path("src"), "10/rank0", d, 2, &o);
    pthread_join(th, NULL);
    close(q.lfd);
    CHECK(rc < 0 && d[0].rc == rc && d[0].bytes < N_FLOATS * 4);
    CHECK(t_contains(d[0].errmsg, "127.0.0.1"));
    CHECK(d[1].rc == 0 && same_part(t_path("pers/10/rank0"), 21) == 0);
    d[0].port = port1;

    /* nothing to send: every destination says so */
    CHECK_ERR(ckptio_part_spread(t_path("nothing"), "9/rank0", d, 2, &o), CKPTIO_E_NOT_CHECKPOINT);
    CHECK(d[0].rc == CKPTIO_E_NOT_CHECKPOINT && d[1].rc == CKPTIO_E_NOT_CHECKPOINT);
    CHECK(t_contains(d[1].errmsg, "not a committed checkpoint"));
    ckptio_peer_close(p1);
    return 0;
}

static int test_misuse(void)
{
    ckptio_peer *p = (ckptio_peer *)1;
    CHECK_ERR(ckptio_peer_open(&p, NULL, NULL, 0, &SERVER), CKPTIO_E_USAGE);
    CHECK(p == NULL);
    CHECK_ERR(ckptio_peer_open(&p, t_dir(), NULL, 70000, &SERVER), CKPTIO_E_USAGE);
    CHECK(ckptio_peer_open(&p, t_dir(), "no.such.host.invalid", 0, &SERVER) < 0);
    CHECK(t_contains(ckptio_last_error(), "cannot resolve"));
    CHECK_ERR(ckptio_peer_push(NULL, "127.0.0.1", 1, "1/rank0", NULL, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_peer_fetch("127.0.0.1", 0, "1/rank0", "x", NULL, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_part_copy(NULL, "x", NULL, NULL), CKPTIO_E_USAGE);
    ckptio_part_dest d = {.size = sizeof d, .host = "127.0.0.1", .port = 1};
    CHECK_ERR(ckptio_part_spread("x", "1/rank0", &d, 0, NULL), CKPTIO_E_USAGE);
    CHECK_ERR(ckptio_part_spread("x", "../up", &d, 1, NULL), CKPTIO_E_USAGE);
    d.port = 0;
    CHECK_ERR(ckptio_part_spread("x", "1/rank0", &d, 1, NULL), CKPTIO_E_USAGE);
    d.host = NULL;
    CHECK_ERR(ckptio_part_spread("x", "1/rank0", &d, 1, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "needs a host or a dst"));
    d.dst = "s3://bucket/7/rank0";
    CHECK_ERR(ckptio_part_spread("x", NULL, &d, 1, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "ckptio_convert"));
    CHECK_ERR(ckptio_part_copy("x", "gs://bucket/7/rank0", NULL, NULL), CKPTIO_E_USAGE);
    d.size = 4;
    d.dst = "y";
    CHECK_ERR(ckptio_part_spread("x", NULL, &d, 1, NULL), CKPTIO_E_USAGE);
    CHECK(t_contains(ckptio_last_error(), "sizeof(ckptio_part_dest)"));
    CHECK(ckptio_peer_port(NULL) == CKPTIO_E_USAGE);
    ckptio_peer_close(NULL);
    return 0;
}

/* The fuzz corpus of the wire (fuzz/fuzz_peer.c says what an input holds): every seed runs
 * through both ends of a connection, within the harness's checks (no temporary part left, a
 * failure that says why) and, in the sanitizer builds, without a report. */
static int test_fuzz_corpus(void)
{
#ifdef CKPTIO_FUZZ_PEER_REPLAY
    CHECK(t_sh("TMPDIR='%s' %s %s", t_dir(), CKPTIO_FUZZ_PEER_REPLAY,
               CKPTIO_SOURCE_ROOT "/fuzz/corpus/peer") == 0);
    /* and it removed its directory */
    CHECK(t_sh("test -z \"$(ls -A '%s' | grep ckptio-fuzz-peer)\"", t_dir()) == 0);
    return 0;
#else
    return T_SKIP;
#endif
}

const ckptio_test tests_peer[] = {
    {"peer/push_fetch_copy", test_push_fetch_copy, 0, 0},
    {"peer/corrupt_refused", test_corrupt_refused, 0, 0},
    {"peer/broken_transfer", test_broken_transfer, 0, 0},
    {"peer/outsider", test_outsider, 0, 0},
    {"peer/close_midway", test_close_midway, 0, 0},
    {"peer/fork", test_fork, 0, 60},
    {"peer/spread", test_spread, 0, 60},
    {"peer/misuse", test_misuse, 0, 0},
    {"peer/fuzz_corpus", test_fuzz_corpus, 0, 0},
    {0},
};
