/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's insides, shared by its four files: peer_wire.c (bytes on a socket, the files
 * of a part, its transactions), peer_auth.c (the authentication of a connection and its
 * request), peer_pass.c (one pass sending a part to every destination) and peer.c (the server,
 * and the public calls). Each calls only the ones before it. */
#ifndef CKPTIO_RANKS_PEER_H
#define CKPTIO_RANKS_PEER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../commit/txn.h"
#include "../common/common.h"

/* The wire, little-endian, one request per connection, after the authentication
 * (peer_auth.c; K the job's key, nc and ns 32 random bytes of the client's and the server's):
 *   client   "CKPA" u32 version nc
 *   server   "CKPA" u32 version ns HMAC(K, "ckptio peer 2 server" nc ns)
 *   client   HMAC(K, "ckptio peer 2 client" nc ns)
 * (a server that refuses sends a reply with nothing of its own in it, and closes), then
 *   request  "CKPR" u32 version u32 op u32 name_len name HMAC(S, the request's bytes before it)
 * with S = HMAC(K, "ckptio peer 2 session" nc ns), a key of this connection only: a request
 * recorded on another connection is worthless. The part's bytes themselves carry no MAC (the
 * cost would be per byte): the step record (doc/tiers.md) is what a restore checks them by.
 *   PUT      request, then the part's files, then the server's reply
 *   GET      request; the server replies, then (status 0) sends the part's files
 *   files    per file: u32 path_len path u64 size bytes; a path_len of 0 ends them
 *   reply    i32 status u32 msg_len msg
 * Paths are relative to the part ("manifest", "data/000000.ckd"). What arrives goes into a
 * commit transaction of the target (a "<name>.tmp-<pid>.<n>" directory), is verified and only
 * then renamed into place: a sender or receiver that dies halfway leaves no part behind. */
#define PEER_MAGIC 0x52504b43u /* "CKPR" */
#define PEER_HELLO 0x41504b43u /* "CKPA" */
#define PEER_VERSION 2u
#define PEER_NONCE 32
#define PEER_MAC 32
#define PEER_PUT 1u
#define PEER_GET 2u
#define PEER_MAX_NAME 4096u
#define PEER_CHUNK (1u << 20)
#define PEER_SERVE_TIMEOUT 120.0 /* seconds a server waits on a silent connection */
#define PEER_AUTH_SECONDS 10.0   /* a connection's authentication and request, at most */
#define PEER_MAX_CONNS 256       /* connections a server serves at once; more are closed */
#define PEER_MAX_REPLY 65536u    /* bytes of a reply's message */
#define PEER_MAX_CODE 100000     /* a reply's status: 0, or minus an errno or a ckptio code */

typedef struct files {
    char **rel; /* paths relative to the part */
    uint64_t *size;
    size_t n, cap;
} files;

typedef struct pacer {
    uint64_t rate; /* bytes per second; 0: no limit */
    uint64_t sent;
    double t0;
} pacer;

typedef struct nopipe {
    sigset_t old;
    bool was_pending;
} nopipe;

typedef struct sink {
    int sock;        /* a connection (>= 0), or -1 */
    ckptio__txn *t;  /* else: the files are created in t's directory */
    int out;         /* t: the file being written (-1: none) */
    int rc;          /* 0 while it takes the part; else why it stopped (m says) */
    uint64_t bytes;  /* bytes sent or written */
    const char *who; /* "the peer at host:port", or the part's path */
    ckptio__msg m;
} sink;

/* peer_wire.c */
CKPTIO__HIDDEN void ckptio__peer_put32(uint8_t *p, uint32_t v);
CKPTIO__HIDDEN void ckptio__peer_put64(uint8_t *p, uint64_t v);
CKPTIO__HIDDEN uint32_t ckptio__peer_get32(const uint8_t *p);
CKPTIO__HIDDEN uint64_t ckptio__peer_get64(const uint8_t *p);
CKPTIO__HIDDEN int ckptio__peer_set_timeout(int fd, double seconds);
CKPTIO__HIDDEN int ckptio__peer_send_all(int fd, const void *buf, size_t len);
CKPTIO__HIDDEN int ckptio__peer_recv_all(int fd, void *buf, size_t len);
/* recv_all, all of it by ckptio__now() time `end` (a client that drips bytes is cut off). */
CKPTIO__HIDDEN int ckptio__peer_recv_by(int fd, void *buf, size_t len, double end);
CKPTIO__HIDDEN int ckptio__peer_send_reply(int fd, int status, const char *msg);
CKPTIO__HIDDEN int ckptio__peer_recv_reply(int fd, const char *who, ckptio__msg *m);
CKPTIO__HIDDEN void ckptio__peer_files_free(files *f);
CKPTIO__HIDDEN int ckptio__peer_list_files(const char *dir, const char *sub, files *f, ckptio__msg *m);
CKPTIO__HIDDEN bool ckptio__peer_safe_rel(const char *rel);
CKPTIO__HIDDEN int ckptio__peer_create_in(int dirfd, const char *rel, bool private_, ckptio__msg *m,
                                          const char *where);
CKPTIO__HIDDEN int ckptio__peer_begin_part(ckptio__txn *t, const char *dst, bool private_, ckptio__msg *m);
CKPTIO__HIDDEN int ckptio__peer_finish_part(ckptio__txn *t, unsigned flags, const char *what, ckptio__msg *m);
CKPTIO__HIDDEN void ckptio__peer_pace(pacer *p, uint64_t n);
CKPTIO__HIDDEN void ckptio__peer_nopipe_begin(nopipe *np);
CKPTIO__HIDDEN void ckptio__peer_nopipe_end(nopipe *np);
CKPTIO__HIDDEN int ckptio__peer_write_all(int fd, const uint8_t *p, size_t n);

/* peer_auth.c */
/* The request, with its MAC under the session's key. */
CKPTIO__HIDDEN int ckptio__peer_send_request(int sock, const uint8_t session[PEER_MAC], uint32_t op, const char *name);
/* CKPTIO_E_USAGE (naming fn) unless key holds CKPTIO_PEER_KEY_MIN..MAX bytes. */
CKPTIO__HIDDEN int ckptio__peer_key_check(const unsigned char *key, size_t len, const char *fn);
/* The client's side of the authentication on a connected socket: 0 with the session's key, or
 * < 0 with m saying why (-EACCES: the server does not hold the key; nothing was sent to it). */
CKPTIO__HIDDEN int ckptio__peer_client_auth(int fd, const unsigned char *key, size_t klen, const char *who,
                                            uint8_t session[PEER_MAC], ckptio__msg *m);
/* The server's side, all of it by time `end`: 0 with the session's key; -EACCES for a client
 * that began and failed (or took past `end`)
 * (*why says how, for the server's log only: the client is told nothing of it); another < 0
 * for a connection that ended before it began. */
CKPTIO__HIDDEN int ckptio__peer_server_auth(int fd, const unsigned char *key, size_t klen, double end,
                                            uint8_t session[PEER_MAC], const char **why);
CKPTIO__HIDDEN int ckptio__peer_mac(const uint8_t session[PEER_MAC], const void *p, size_t len, uint8_t out[PEER_MAC]);
CKPTIO__HIDDEN bool ckptio__peer_mac_equal(const uint8_t a[PEER_MAC], const uint8_t b[PEER_MAC]);

/* peer_pass.c: the files of the part at `dir` to every sink, each file read once; < 0 (m says
 * why) only when the part itself cannot be read. */
CKPTIO__HIDDEN int ckptio__peer_send_pass(const char *dir, sink *s, size_t n, pacer *pc, ckptio__msg *m);
/* Sink s failed with rc on file `rel`: its message says where (the peer, or the file). */
CKPTIO__HIDDEN int ckptio__peer_sink_fail(sink *s, int rc, const char *rel);

/* peer.c: one connection as the server answers it (the server's threads; the fuzz target):
 * the authentication, then the request, on `fd`, for the parts under `root`; `from` names the
 * client in the server's log. */
CKPTIO__HIDDEN void ckptio__peer_serve(const char *root, const unsigned char *key, size_t klen, int fd,
                                       const char *from);
/* A fetch over the connected socket `fd` (the public call and the fuzz target): 0 once part
 * `name` is published at dst. */
CKPTIO__HIDDEN int ckptio__peer_fetch_on(int fd, const unsigned char *key, size_t klen, const char *name,
                                         const char *dst, unsigned flags, const char *who,
                                         uint64_t *bytes, ckptio__msg *m);

#endif
