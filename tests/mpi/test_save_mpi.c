/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio_save_dist under mpirun: every rank saves its shard, rank 0 reads the checkpoint back. */
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

#define ROWS 64 /* per rank */
#define COLS 100

static float value(uint64_t row, uint64_t col)
{
    return (float)(row * 1000 + col) * 0.5f;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    char dir[256] = "";
    if (rank == 0) {
        const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(dir, sizeof dir, "%s/ckptio-mpi-XXXXXX", tmp);
        if (!mkdtemp(dir)) dir[0] = 0;
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    ckptio_comm *c = NULL;
    EXPECT(dir[0] && ckptio_comm_mpi(&c, MPI_COMM_WORLD) == 0);
    char path[300];
    snprintf(path, sizeof path, "%s/ckpt", dir);

    /* Shard(0) of w, b replicated, a rank-local counter. */
    uint64_t wshape[2] = {(uint64_t)nranks * ROWS, COLS}, woff[2] = {(uint64_t)rank * ROWS, 0},
             wbox[2] = {ROWS, COLS}, bshape[1] = {16}, lshape[1] = {1};
    float *w = malloc(sizeof(float) * ROWS * COLS);
    for (uint64_t r = 0; r < ROWS; r++)
        for (uint64_t k = 0; k < COLS; k++) w[r * COLS + k] = value(woff[0] + r, k);
    double b[16];
    for (int i = 0; i < 16; i++) b[i] = i * 0.25;
    int64_t mine = 100 + rank;
    ckptio_dist_item items[3] = {
        {sizeof(ckptio_dist_item), 0, "w", CKPTIO_DT_F32, 2, wshape, woff, wbox, w,
         sizeof(float) * ROWS * COLS, CKPTIO_MEM_HOST, 0},
        {sizeof(ckptio_dist_item), 0, "b", CKPTIO_DT_F64, 1, bshape, NULL, NULL, b, sizeof b,
         CKPTIO_MEM_HOST, 0},
        {sizeof(ckptio_dist_item), CKPTIO_DIST_RANK_LOCAL, "count", CKPTIO_DT_I64, 1, lshape, NULL,
         NULL, &mine, 8, CKPTIO_MEM_HOST, 0},
    };
    const char *keys[] = {"step"};
    const void *vals[] = {"7"};
    size_t lens[] = {1};
    ckptio_stats st;
    ckptio_error_info *info = calloc(1, sizeof *info);
    if (info) info->size = sizeof *info;
    EXPECT(info != NULL);
    if (c && info) {
        EXPECT(ckptio_save_dist(path, c, items, 3, keys, vals, lens, 1, NULL, 30.0, &st) == 0);
        EXPECT(st.bytes >= sizeof(float) * ROWS * COLS + 8);
    }

    /* The last rank's b differs: every rank fails the same way, the checkpoint is untouched. */
    if (c && info && nranks > 1) {
        ckptio_params p;
        ckptio_params_init(&p);
        p.overwrite = CKPTIO_ON;
        if (rank == nranks - 1) b[3] = -1;
        int rc = ckptio_save_dist(path, c, items, 3, keys, vals, lens, 1, &p, 30.0, NULL);
        EXPECT(rc == CKPTIO_E_DUPLICATE);
        EXPECT(strstr(ckptio_last_error(), "tensor 'b': ranks 0 and") != NULL);
        /* the same as values, on every rank */
        EXPECT(ckptio_last_error_info(info) == 0 && info->rank == 0 &&
               info->other_rank == nranks - 1 && strcmp(info->tensor, "b") == 0);
        b[3] = 0.75;
    }

    /* The last rank cannot make its items and refuses: every rank fails at the plan with its
     * code and number, nothing is written. */
    if (c && info) {
        ckptio_params p;
        ckptio_params_init(&p);
        p.overwrite = CKPTIO_ON;
        int rc = rank == nranks - 1
                     ? ckptio_save_dist_refuse(path, c, -ENOSPC, "no memory to stage", &p, 30.0)
                     : ckptio_save_dist(path, c, items, 3, keys, vals, lens, 1, &p, 30.0, NULL);
        EXPECT(rc == -ENOSPC);
        EXPECT(strstr(ckptio_last_error(), "no memory to stage") != NULL);
        EXPECT(ckptio_last_error_info(info) == 0 && info->rank == nranks - 1 &&
               info->flags == CKPTIO_ERROR_REFUSED);
    }

    if (rank == 0 && c && info) {
        ckptio_reader *rd = NULL;
        EXPECT(ckptio_reader_open(&rd, path, NULL) == 0);
        float *all = malloc(sizeof(float) * wshape[0] * COLS);
        uint64_t wbytes = sizeof(float) * wshape[0] * COLS;
        EXPECT(rd && ckptio_reader_read_tensor(rd, "w", all, wbytes) == 0);
        int ok = 1;
        for (uint64_t r = 0; r < wshape[0]; r++)
            for (uint64_t k = 0; k < COLS; k++) ok &= all[r * COLS + k] == value(r, k);
        EXPECT(ok);
        double bb[16];
        EXPECT(rd && ckptio_reader_read_tensor(rd, "b", bb, sizeof bb) == 0 &&
               !memcmp(bb, b, sizeof b));
        for (int r = 0; r < nranks && rd; r++) {
            char name[32];
            int64_t v = 0;
            snprintf(name, sizeof name, "count@rank%d", r);
            EXPECT(ckptio_reader_read_tensor(rd, name, &v, 8) == 0 && v == 100 + r);
        }
        EXPECT(rd && ckptio_reader_verify(rd, NULL) == 0);
        ckptio_reader_close(rd);
        free(all);
    }
    free(w);
    free(info);
    ckptio_comm_free(c);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && dir[0]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    int counts[2] = {passed, failed}, total[2] = {0, 0};
    MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi %d ranks: %d passed, %d failed\n", nranks, total[0], total[1]);
    MPI_Finalize();
    return total[1] || failed ? 1 : 0;
}
