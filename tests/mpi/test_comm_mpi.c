/* SPDX-License-Identifier: Apache-2.0 */
/* The MPI communicator under mpirun: the exchanges of tests/test_comm.c, agree, and a timeout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckptio_mpi.h"

static int passed, failed, rank, nranks;

#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (cond) passed++;                                                                    \
        else {                                                                                 \
            failed++;                                                                          \
            fprintf(stderr, "rank %d: %s:%d: EXPECT(%s) failed; last error: %s\n", rank,       \
                    __FILE__, __LINE__, #cond, ckptio_last_error());                           \
        }                                                                                      \
    } while (0)

/* Rank r's message in round k: lengths 0..10, some empty, bytes derived from (r, k). */
static size_t msg_len(int r, int k)
{
    return (r + k) % 3 == 0 ? 0 : (size_t)(r * 7 + k * 3) % 11;
}

static void fill(unsigned char *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 31 + (int)i * 7 + 1);
}

static void exchanges(const ckptio_comm *c)
{
    ckptio_bytes out = CKPTIO_BYTES_INIT, buf = CKPTIO_BYTES_INIT;
    uint64_t *lens = calloc((size_t)nranks, sizeof *lens);
    unsigned char mine[16], want[16];
    for (int k = 0; k < 12; k++) {
        int root = k % nranks;
        fill(mine, sizeof mine, rank * 1000 + k);
        EXPECT(ckptio_comm_gather(c, root, mine, msg_len(rank, k), &out, lens, 20.0) == 0);
        if (rank == root) {
            size_t at = 0;
            int ok = 1;
            for (int i = 0; i < nranks; i++) {
                fill(want, sizeof want, i * 1000 + k);
                ok &= lens[i] == msg_len(i, k) &&
                      (lens[i] == 0 || memcmp((unsigned char *)out.data + at, want, lens[i]) == 0);
                at += lens[i];
            }
            EXPECT(ok && at == out.len);
        }
        size_t blen = (size_t)(k * 5) % 9;
        if (rank == root) {
            ckptio_bytes_resize(&buf, blen);
            fill(buf.data, blen, 77 + k);
        } else {
            ckptio_bytes_set(&buf, "stale-bytes", 11);
        }
        EXPECT(ckptio_comm_broadcast(c, root, &buf, 20.0) == 0);
        fill(want, sizeof want, 77 + k);
        EXPECT(buf.len == blen && (blen == 0 || memcmp(buf.data, want, blen) == 0));
        EXPECT(ckptio_comm_barrier(c, 20.0) == 0);
    }
    EXPECT(ckptio_comm_agree(c, 0, NULL, 20.0) == 0);
    int first = nranks / 2, second = nranks - 1;
    char msg[64], expect[96];
    snprintf(msg, sizeof msg, "disk full under rank %d", rank);
    int code = rank == first ? -ENOSPC : rank == second ? -EIO : 0;
    EXPECT(ckptio_comm_agree(c, code, code ? msg : NULL, 20.0) == -ENOSPC);
    snprintf(expect, sizeof expect, "rank %d of %d: disk full under rank %d", first, nranks, first);
    EXPECT(strstr(ckptio_last_error(), expect) != NULL);
    ckptio_bytes_free(&out);
    ckptio_bytes_free(&buf);
    free(lens);
}

/* The last rank skips the barrier: the others get -ETIMEDOUT, and their communicator then fails
 * at once. The last rank comes late so that the posted barrier completes and MPI can finalize. */
static void missing_rank(const ckptio_comm *c)
{
    int late = nranks - 1;
    if (rank != late) {
        EXPECT(ckptio_comm_barrier(c, 1.0) == -ETIMEDOUT);
        EXPECT(ckptio_comm_agree(c, 0, NULL, 30.0) == -ETIMEDOUT);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* the others have given up */
    if (rank == late) EXPECT(ckptio_comm_barrier(c, 30.0) == 0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    ckptio_comm *c = NULL;
    EXPECT(ckptio_comm_mpi(&c, MPI_COMM_WORLD) == 0);
    if (c) {
        EXPECT(c->rank == rank && c->nranks == nranks);
        exchanges(c);
        if (nranks > 1) missing_rank(c);
    }
    ckptio_comm_free(c);
    int counts[2] = {passed, failed}, total[2] = {0, 0};
    MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi %d ranks: %d passed, %d failed\n", nranks, total[0], total[1]);
    MPI_Finalize();
    return total[1] || failed ? 1 : 0;
}
