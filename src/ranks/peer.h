/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's insides, shared by its three files: peer_wire.c (bytes on a socket, the files
 * of a part, its transactions), peer_pass.c (one pass sending a part to every destination) and
 * peer.c (the server, and the public calls). Each calls only the ones before it. */
#ifndef CKPTIO_RANKS_PEER_H
#define CKPTIO_RANKS_PEER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../commit/txn.h"
#include "../common/common.h"

/* The wire, little-endian, one request per connection:
 *   request  "CKPR" u32 version u32 op u32 name_len name
 *   PUT      request, then the part's files, then the server's reply
 *   GET      request; the server replies, then (status 0) sends the part's files
 *   files    per file: u32 path_len path u64 size bytes; a path_len of 0 ends them
 *   reply    i32 status u32 msg_len msg
 * Paths are relative to the part ("manifest", "data/000000.ckd"). What arrives goes into a
 * commit transaction of the target (a "<name>.tmp-<pid>.<n>" directory), is verified and only
 * then renamed into place: a sender or receiver that dies halfway leaves no part behind. */
#define PEER_MAGIC 0x52504b43u /* "CKPR" */
#define PEER_VERSION 1u
#define PEER_PUT 1u
#define PEER_GET 2u
#define PEER_MAX_NAME 4096u
#define PEER_CHUNK (1u << 20)
#define PEER_SERVE_TIMEOUT 120.0 /* seconds a server waits on a silent connection */

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
CKPTIO__HIDDEN int ckptio__peer_send_reply(int fd, int status, const char *msg);
CKPTIO__HIDDEN int ckptio__peer_recv_reply(int fd, const char *who, ckptio__msg *m);
CKPTIO__HIDDEN void ckptio__peer_files_free(files *f);
CKPTIO__HIDDEN int ckptio__peer_list_files(const char *dir, const char *sub, files *f, ckptio__msg *m);
CKPTIO__HIDDEN bool ckptio__peer_safe_rel(const char *rel);
CKPTIO__HIDDEN int ckptio__peer_create_in(int dirfd, const char *rel, ckptio__msg *m, const char *where);
CKPTIO__HIDDEN int ckptio__peer_begin_part(ckptio__txn *t, const char *dst, ckptio__msg *m);
CKPTIO__HIDDEN int ckptio__peer_finish_part(ckptio__txn *t, unsigned flags, const char *what, ckptio__msg *m);
CKPTIO__HIDDEN void ckptio__peer_pace(pacer *p, uint64_t n);
CKPTIO__HIDDEN void ckptio__peer_nopipe_begin(nopipe *np);
CKPTIO__HIDDEN void ckptio__peer_nopipe_end(nopipe *np);
CKPTIO__HIDDEN int ckptio__peer_write_all(int fd, const uint8_t *p, size_t n);
CKPTIO__HIDDEN int ckptio__peer_send_request(int sock, uint32_t op, const char *name);

/* peer_pass.c: the files of the part at `dir` to every sink, each file read once; < 0 (m says
 * why) only when the part itself cannot be read. */
CKPTIO__HIDDEN int ckptio__peer_send_pass(const char *dir, sink *s, size_t n, pacer *pc, ckptio__msg *m);
/* Sink s failed with rc on file `rel`: its message says where (the peer, or the file). */
CKPTIO__HIDDEN int ckptio__peer_sink_fail(sink *s, int rc, const char *rel);

#endif
