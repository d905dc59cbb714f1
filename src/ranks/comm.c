/* SPDX-License-Identifier: Apache-2.0 */
/* Communicators: checked entry points over any callback table, the single-rank one, and agree. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

/* The fields every table must cover: everything up to and including `release`. */
#define COMM_SIZE_V1 (offsetof(ckptio_comm, release) + sizeof(void (*)(void *)))

void ckptio_comm_free(ckptio_comm *c)
{
    if (c && c->size >= COMM_SIZE_V1 && c->release) c->release(c->ctx);
}

/* --- single process ------------------------------------------------------------------------ */

static int single_barrier(void *ctx, double timeout)
{
    CKPTIO__UNUSED(ctx);
    CKPTIO__UNUSED(timeout);
    return 0;
}

static int single_broadcast(void *ctx, int32_t root, ckptio_bytes *buf, double timeout)
{
    CKPTIO__UNUSED(ctx);
    CKPTIO__UNUSED(root);
    CKPTIO__UNUSED(buf);
    CKPTIO__UNUSED(timeout);
    return 0;
}

static int single_gather(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                         uint64_t *lens, double timeout)
{
    CKPTIO__UNUSED(ctx);
    CKPTIO__UNUSED(root);
    CKPTIO__UNUSED(timeout);
    CKPTIO__TRY(ckptio_bytes_set(out, data, len));
    lens[0] = len;
    return 0;
}

int ckptio_comm_single(ckptio_comm **out)
{
    if (!out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_comm_single: out is NULL");
    *out = NULL;
    ckptio_comm *c = calloc(1, sizeof *c);
    if (!c) return ckptio__fail(NULL, -ENOMEM, "ckptio_comm_single: out of memory");
    c->size = sizeof *c;
    c->rank = 0;
    c->nranks = 1;
    c->ctx = c;
    c->barrier = single_barrier;
    c->broadcast = single_broadcast;
    c->gather = single_gather;
    c->release = free;
    *out = c;
    return 0;
}

/* --- checked entry points ------------------------------------------------------------------ */

static int check_comm(const ckptio_comm *c, const char *op, double timeout)
{
    if (!c) return ckptio__fail(NULL, CKPTIO_E_USAGE, "%s: communicator is NULL", op);
    if (c->size < COMM_SIZE_V1)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "%s: communicator table has size %u, below the %zu this library "
                            "needs: set size = sizeof(ckptio_comm)",
                            op, c->size, COMM_SIZE_V1);
    if (!c->barrier || !c->broadcast || !c->gather)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "%s: communicator table lacks a barrier, broadcast or gather callback",
                            op);
    if (c->nranks < 1 || c->rank < 0 || c->rank >= c->nranks)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "%s: rank %d of %d is not a valid rank", op,
                            c->rank, c->nranks);
    if (!(timeout > 0)) /* also refuses NaN */
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "%s: timeout %g s on rank %d: pass a positive number of seconds", op,
                            timeout, c->rank);
    return 0;
}

static int check_root(const ckptio_comm *c, const char *op, int32_t root)
{
    if (root < 0 || root >= c->nranks)
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "%s: root %d is not a rank of %d", op, root,
                            c->nranks);
    return 0;
}

/* What a callback returned, as a code with a message naming the operation and the rank. */
static int comm_result(const ckptio_comm *c, const char *op, int rc, double timeout)
{
    if (rc == 0) return 0;
    if (rc > 0)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "%s on rank %d of %d: the communicator returned %d; callbacks return "
                            "0 or a negative code",
                            op, c->rank, c->nranks, rc);
    if (rc == -ETIMEDOUT)
        return ckptio__fail(NULL, rc,
                            "%s on rank %d of %d: the other ranks did not all arrive within %g s "
                            "(a rank failed, died or is slower than the timeout); the "
                            "communicator is unusable now: abort the job or build a new one",
                            op, c->rank, c->nranks, timeout);
    return ckptio__fail(NULL, rc,
                        "%s on rank %d of %d failed: %s; the communicator is unusable now: abort "
                        "the job or build a new one",
                        op, c->rank, c->nranks, ckptio_strerror(rc));
}

int ckptio_comm_barrier(const ckptio_comm *c, double timeout)
{
    CKPTIO__TRY(check_comm(c, "barrier", timeout));
    return comm_result(c, "barrier", c->barrier(c->ctx, timeout), timeout);
}

int ckptio_comm_broadcast(const ckptio_comm *c, int32_t root, ckptio_bytes *buf, double timeout)
{
    CKPTIO__TRY(check_comm(c, "broadcast", timeout));
    CKPTIO__TRY(check_root(c, "broadcast", root));
    if (!buf) return ckptio__fail(NULL, CKPTIO_E_USAGE, "broadcast: buf is NULL");
    return comm_result(c, "broadcast", c->broadcast(c->ctx, root, buf, timeout), timeout);
}

int ckptio_comm_gather(const ckptio_comm *c, int32_t root, const void *data, size_t len,
                       ckptio_bytes *out, uint64_t *lens, double timeout)
{
    CKPTIO__TRY(check_comm(c, "gather", timeout));
    CKPTIO__TRY(check_root(c, "gather", root));
    bool is_root = c->rank == root;
    if (len && !data) return ckptio__fail(NULL, CKPTIO_E_USAGE, "gather: data is NULL");
    if (is_root && (!out || !lens))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "gather: the root needs out and lens");
    if (is_root) memset(lens, 0, (size_t)c->nranks * sizeof *lens);
    int rc = c->gather(c->ctx, root, data, len, is_root ? out : NULL, is_root ? lens : NULL,
                       timeout);
    CKPTIO__TRY(comm_result(c, "gather", rc, timeout));
    if (!is_root) return 0;
    uint64_t total = 0;
    for (int32_t i = 0; i < c->nranks; i++)
        if (!ckptio__add(total, lens[i], &total)) break;
    if (total != out->len || lens[root] != len)
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "gather on rank %d of %d: the communicator's lengths add up to %llu "
                            "bytes but it returned %zu (the root's own %llu, expected %zu): fix "
                            "its gather callback",
                            c->rank, c->nranks, (unsigned long long)total, out->len,
                            (unsigned long long)lens[root], len);
    return 0;
}

/* --- agree --------------------------------------------------------------------------------- */

/* Wire format, little-endian whatever the host: gather sends [code i32][msg], broadcast sends
 * [code i32][failing rank i32][msg]. Messages are cut to one ckptio message's length so that
 * each rank sends O(1) bytes. */
static void put_i32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}

static int32_t get_i32(const unsigned char *p)
{
    uint32_t u = 0;
    for (int i = 0; i < 4; i++) u |= (uint32_t)p[i] << (8 * i);
    return (int32_t)u;
}

static double remaining(double deadline)
{
    double left = deadline - ckptio__now();
    return left > 1e-3 ? left : 1e-3; /* the callee still gets a positive timeout to fail by */
}

int ckptio_comm_agree(const ckptio_comm *c, int code, const char *msg, double timeout)
{
    CKPTIO__TRY(check_comm(c, "agree", timeout));
    if (code > 0) return ckptio__fail(NULL, CKPTIO_E_USAGE, "agree: code %d is positive", code);
    double deadline = ckptio__now() + timeout;
    const size_t max_msg = CKPTIO__MSG_LEN - 64;
    if (!msg) msg = code ? ckptio_strerror(code) : "";
    size_t mlen = CKPTIO__MIN(strlen(msg), max_msg);

    ckptio_bytes send = CKPTIO_BYTES_INIT, all = CKPTIO_BYTES_INIT, verdict = CKPTIO_BYTES_INIT;
    uint64_t *lens = NULL;
    bool exchanged = false;
    int rc = 0;
    CKPTIO__GOTO_IF(ckptio_bytes_resize(&send, 4 + mlen) < 0, -ENOMEM);
    put_i32(send.data, code);
    memcpy((unsigned char *)send.data + 4, msg, mlen);
    if (c->rank == 0) {
        lens = calloc((size_t)c->nranks, sizeof *lens);
        CKPTIO__GOTO_IF(!lens, -ENOMEM);
    }
    CKPTIO__CHECK(ckptio_comm_gather(c, 0, send.data, send.len, &all, lens, remaining(deadline)));

    if (c->rank == 0) {
        /* The first failing rank's code and message; a malformed entry counts as a failure so
         * that no rank can turn an error into success. */
        int32_t bad = -1, bad_code = 0;
        const unsigned char *p = all.data, *bad_msg = NULL;
        size_t bad_len = 0;
        for (int32_t i = 0; i < c->nranks && bad < 0; p += lens[i], i++) {
            int32_t ci = lens[i] >= 4 ? get_i32(p) : CKPTIO_E_CORRUPT;
            if (ci > 0) ci = CKPTIO_E_CORRUPT;
            if (ci == 0) continue;
            bad = i;
            bad_code = ci;
            bad_msg = lens[i] >= 4 ? p + 4 : NULL;
            bad_len = bad_msg ? CKPTIO__MIN((size_t)lens[i] - 4, max_msg) : 0;
        }
        CKPTIO__GOTO_IF(ckptio_bytes_resize(&verdict, 8 + bad_len) < 0, -ENOMEM);
        put_i32(verdict.data, bad_code);
        put_i32((unsigned char *)verdict.data + 4, bad);
        if (bad_len) memcpy((unsigned char *)verdict.data + 8, bad_msg, bad_len);
    }
    CKPTIO__CHECK(ckptio_comm_broadcast(c, 0, &verdict, remaining(deadline)));
    exchanged = true;
    if (verdict.len < 8) {
        rc = ckptio__fail(NULL, CKPTIO_E_CORRUPT,
                          "agree on rank %d of %d: the communicator delivered a %zu-byte verdict "
                          "(at least 8 expected): fix its broadcast callback",
                          c->rank, c->nranks, verdict.len);
        goto out;
    }
    rc = get_i32(verdict.data);
    if (rc > 0) rc = CKPTIO_E_CORRUPT;
    if (rc < 0) {
        ckptio_error_info *who = malloc(sizeof *who); /* the failing rank, as a value */
        int32_t bad = get_i32((unsigned char *)verdict.data + 4);
        if (who) {
            ckptio__info_none(who);
            who->rank = bad >= 0 && bad < c->nranks ? bad : CKPTIO_ERROR_NO_RANK;
        }
        ckptio__fail_info(NULL, rc, who, "rank %d of %d: %.*s", bad, c->nranks,
                          (int)(verdict.len - 8), (const char *)verdict.data + 8);
        free(who);
    }
out:
    if (rc == -ENOMEM) {
        ckptio__fail(NULL, rc, "agree on rank %d of %d: out of memory", c->rank, c->nranks);
    } else if (rc < 0 && !exchanged) {
        char why[CKPTIO__MSG_LEN];
        snprintf(why, sizeof why, "%s", ckptio_last_error());
        ckptio__fail(NULL, rc, "agree (timeout %g s) found no common result: %s", timeout, why);
    }
    ckptio_bytes_free(&send);
    ckptio_bytes_free(&all);
    ckptio_bytes_free(&verdict);
    free(lens);
    return rc;
}
