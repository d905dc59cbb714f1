/* SPDX-License-Identifier: Apache-2.0 */
/* The README's example: save two tensors and some metadata, then load one back and a slice. */
#include <ckptio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s\n", what, ckptio_last_error());
    return rc < 0 ? 1 : rc;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "example-ckpt";
    enum { ROWS = 1024, COLS = 512 };
    float *w = malloc(sizeof(float) * ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)i;
    uint64_t shape[2] = {ROWS, COLS}, step = 1000;

    ckptio_params p;
    ckptio_params_init(&p);
    p.overwrite = CKPTIO_ON; /* replace an older checkpoint at this path, atomically */
    ckptio_writer *wr;
    int rc = ckptio_writer_open(&wr, path, &p);
    if (rc < 0) return fail("open", rc);
    if ((rc = ckptio_writer_add(wr, "layer0.weight", CKPTIO_DT_F32, 2, shape, NULL, NULL, w,
                                sizeof(float) * ROWS * COLS)) < 0 ||
        (rc = ckptio_writer_add(wr, "step", CKPTIO_DT_U64, 0, NULL, NULL, NULL, &step, 8)) < 0 ||
        (rc = ckptio_writer_set_meta(wr, "framework", "example", 7)) < 0 ||
        (rc = ckptio_writer_commit(wr)) < 0) {
        ckptio_writer_close(wr); /* without a commit, nothing appears at path */
        return fail("save", rc);
    }
    ckptio_writer_close(wr);

    ckptio_reader *rd;
    if ((rc = ckptio_reader_open(&rd, path, NULL)) < 0) return fail("load", rc);
    /* Rows 100..109, columns 256..511: only the bytes of that box are read. */
    float slice[10][256];
    uint64_t off[2] = {100, 256}, box[2] = {10, 256};
    ckptio_region region = {.size = sizeof region, .name = "layer0.weight", .offset = off,
                            .shape = box, .dst = slice, .capacity = sizeof slice};
    if ((rc = ckptio_reader_read(rd, &region, 1)) < 0) return fail("read", rc);
    printf("slice[0][0] = %.0f (expected %d)\n", slice[0][0], 100 * COLS + 256);
    ckptio_reader_close(rd);
    free(w);
    return slice[0][0] == (float)(100 * COLS + 256) ? 0 : 1;
}
