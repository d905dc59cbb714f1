/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI communicator: non-blocking collectives polled against each operation's deadline. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckptio_mpi.h"

/* Built into its own library (libckptio-mpi) on top of libckptio's public interface only, so
 * libckptio itself never depends on MPI. */
#define CHUNK (1u << 30) /* bytes per MPI_Ibcast: counts are ints */

typedef struct mpi_comm {
    ckptio_comm comm;
    MPI_Comm mc;
    int broken; /* 0, or the code of the failure that left an operation posted */
} mpi_comm;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(mpi_comm *m, int code)
{
    if (!m->broken) m->broken = code;
    return code;
}

/* Poll until the request completes. Sleeping between tests, up to 1 ms, keeps an idle rank
 * off the CPU while still driving MPI's progress engine. */
static int wait_req(mpi_comm *m, MPI_Request *req, double deadline)
{
    long pause = 1000;
    for (;;) {
        int flag = 0;
        if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return fail(m, -ECOMM);
        if (flag) return 0;
        if (now() >= deadline) return fail(m, -ETIMEDOUT);
        struct timespec ts = {0, pause};
        nanosleep(&ts, NULL);
        if (pause < 1000000) pause *= 2;
    }
}

static int mpi_barrier(void *ctx, double timeout)
{
    mpi_comm *m = ctx;
    if (m->broken) return m->broken;
    double deadline = now() + timeout;
    MPI_Request req;
    if (MPI_Ibarrier(m->mc, &req) != MPI_SUCCESS) return fail(m, -ECOMM);
    return wait_req(m, &req, deadline);
}

/* The buffers below belong to the posted operations, not to the caller: they are freed only
 * once their request has completed, and leaked when it has not (MPI may still use them). */
static int mpi_broadcast(void *ctx, int32_t root, ckptio_bytes *buf, double timeout)
{
    mpi_comm *m = ctx;
    if (m->broken) return m->broken;
    double deadline = now() + timeout;
    bool is_root = m->comm.rank == root;
    uint64_t *len = malloc(sizeof *len);
    if (!len) return fail(m, -ENOMEM);
    *len = is_root ? buf->len : 0;
    MPI_Request req;
    if (MPI_Ibcast(len, 1, MPI_UINT64_T, root, m->mc, &req) != MPI_SUCCESS)
        return fail(m, -ECOMM);
    int rc = wait_req(m, &req, deadline);
    if (rc < 0) return rc;
    size_t n = (size_t)*len;
    free(len);
    unsigned char *tmp = malloc(n ? n : 1);
    if (!tmp) return fail(m, -ENOMEM);
    if (is_root && n) memcpy(tmp, buf->data, n);
    for (size_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        if (MPI_Ibcast(tmp + at, count, MPI_BYTE, root, m->mc, &req) != MPI_SUCCESS)
            return fail(m, -ECOMM);
        if ((rc = wait_req(m, &req, deadline)) < 0) return rc;
    }
    if (!is_root) rc = ckptio_bytes_set(buf, tmp, n);
    free(tmp);
    return rc;
}

static int mpi_gather(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                      uint64_t *lens, double timeout)
{
    mpi_comm *m = ctx;
    if (m->broken) return m->broken;
    double deadline = now() + timeout;
    bool is_root = m->comm.rank == root;
    int32_t n = m->comm.nranks;
    if (len > INT_MAX) return fail(m, CKPTIO_E_LIMIT);
    uint64_t *mine = malloc(sizeof *mine);
    uint64_t *all = is_root ? malloc((size_t)n * sizeof *all) : NULL;
    if (!mine || (is_root && !all)) return fail(m, -ENOMEM);
    *mine = len;
    MPI_Request req;
    if (MPI_Igather(mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, root, m->mc, &req) !=
        MPI_SUCCESS)
        return fail(m, -ECOMM);
    int rc = wait_req(m, &req, deadline);
    if (rc < 0) return rc;
    free(mine);

    int *counts = NULL, *displs = NULL;
    size_t total = 0;
    if (is_root) {
        counts = malloc((size_t)n * sizeof *counts);
        displs = malloc((size_t)n * sizeof *displs);
        if (!counts || !displs) return fail(m, -ENOMEM);
        for (int32_t i = 0; i < n; i++) {
            if (all[i] > INT_MAX - total) return fail(m, CKPTIO_E_LIMIT);
            counts[i] = (int)all[i];
            displs[i] = (int)total;
            total += all[i];
        }
    }
    unsigned char *send = malloc(len ? len : 1);
    unsigned char *recv = is_root ? malloc(total ? total : 1) : NULL;
    if (!send || (is_root && !recv)) return fail(m, -ENOMEM);
    if (len) memcpy(send, data, len);
    if (MPI_Igatherv(send, (int)len, MPI_BYTE, recv, counts, displs, MPI_BYTE, root, m->mc,
                     &req) != MPI_SUCCESS)
        return fail(m, -ECOMM);
    if ((rc = wait_req(m, &req, deadline)) < 0) return rc;
    if (is_root) {
        rc = ckptio_bytes_set(out, recv, total);
        for (int32_t i = 0; i < n; i++) lens[i] = all[i];
    }
    free(send);
    free(recv);
    free(counts);
    free(displs);
    free(all);
    return rc;
}

static void mpi_release(void *ctx)
{
    mpi_comm *m = ctx;
    int finalized = 1;
    MPI_Finalized(&finalized);
    /* A broken communicator still has an operation posted: freeing it would be erroneous. */
    if (!m->broken && !finalized) MPI_Comm_free(&m->mc);
    free(m);
}

int ckptio_comm_mpi(ckptio_comm **out, MPI_Comm comm)
{
    if (!out) return CKPTIO_E_USAGE;
    *out = NULL;
    int init = 0, finalized = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&finalized);
    if (!init || finalized) return CKPTIO_E_STATE;
    mpi_comm *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    int rank = 0, size = 0;
    if (MPI_Comm_dup(comm, &m->mc) != MPI_SUCCESS) {
        free(m);
        return -ECOMM;
    }
    if (MPI_Comm_set_errhandler(m->mc, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(m->mc, &rank) != MPI_SUCCESS || MPI_Comm_size(m->mc, &size) != MPI_SUCCESS) {
        MPI_Comm_free(&m->mc);
        free(m);
        return -ECOMM;
    }
    m->comm = (ckptio_comm){.size = sizeof(ckptio_comm),
                            .rank = rank,
                            .nranks = size,
                            .ctx = m,
                            .barrier = mpi_barrier,
                            .broadcast = mpi_broadcast,
                            .gather = mpi_gather,
                            .release = mpi_release};
    *out = &m->comm;
    return 0;
}
