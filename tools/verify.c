/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio verify`: read every stored byte of a checkpoint and check every checksum. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

int cmd_verify(int argc, char **argv)
{
    const char *dir = NULL;
    int done = cli_one_dir_arg(argc, argv, "verify", &dir);
    if (done >= 0) return done;
    if (!dir) return cli_usage_error("verify: which checkpoint? (ckptio verify DIR)");
    double t0 = cli_now();
    ckptio_reader *r = cli_open_reader("verify", dir);
    if (!r) return CLI_FAIL;
    size_t nt = ckptio_reader_num_tensors(r);
    uint64_t stored = 0, chunks = 0;
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        if (ckptio_reader_tensor(r, i, &ti) >= 0)
            stored += ti.stored_bytes, chunks += ti.num_chunks;
    }
    /* One library call does the work, so the progress line can only show that time passes. */
    cli_progress_begin(0, "verifying %s (%" PRIu64 " stored bytes)", dir, stored);
    uint64_t bad = 0;
    int rc = ckptio_reader_verify(r, &bad);
    cli_progress_end();
    double dt = cli_now() - t0;
    if (rc < 0) {
        const char *msg = ckptio_reader_errmsg(r);
        printf("FAILED %s\n", *msg ? msg : ckptio_strerror(rc));
        if (bad)
            printf("%s: %" PRIu64 " of %" PRIu64 " chunks damaged; the first is named above. "
                   "Restore the checkpoint from another copy or save it again.\n",
                   dir, bad, chunks);
        else
            printf("%s: could not read the checkpoint to the end (%s).\n", dir, ckptio_errname(rc));
        ckptio_reader_close(r);
        fflush(stdout);
        return CLI_FAIL;
    }
    char hb[32];
    cli_human(hb, sizeof hb, (double)stored);
    printf("OK %s: %zu tensors, %" PRIu64 " chunks, %" PRIu64 " bytes (%s) read and checked in "
           "%.3f s, %.2f GB/s\n",
           dir, nt, chunks, stored, hb, dt, dt > 0 ? (double)stored / dt / 1e9 : 0.0);
    ckptio_reader_close(r);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
